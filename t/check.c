/* SPDX-License-Identifier: MIT */
/* CUDEFER_CHECK=1: a pointer deferred again while its first release is
 * pending is reported by name and dropped, so it is released once; once
 * released, deferring the same address again (after a new allocation) is
 * fine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

int main(void)
{
    plan(9);
    set_cudefer_env("CUDEFER_CHECK=1");
    fake_reset(1);
    cudaStream_t s = stream_new();
    void *p = device_alloc(256), *q = device_alloc(256);
    fake_work *w = work_held(s, p);

    is_int(defer_free(p, s), cudaSuccess, "first defer_free(p)");
    stderr_capture_begin();
    is_int(defer_free(p, s), cudaSuccess,
           "second defer_free(p) is accepted at the call (checked later)");
    void *pair[] = {q, p};
    is_int(defer_free_n(pair, 2, s), cudaSuccess,
           "defer_free_n with p again and a new q");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    const char *msg = stderr_capture_end();
    char want[64];
    snprintf(want, sizeof want, "CUDEFER_CHECK: %p", p);
    const char *first = strstr(msg, want);
    ok(first != NULL && strstr(first + 1, want) != NULL,
       "both repeats are reported, naming the pointer");
    ok(fake_is_released(p) == 1 && fake_is_released(q) == 1,
       "p released (once: the oracle checks), q released");
    struct defer_stats st = stats_now();
    is_int((long long)st.failed, 1,
           "the dropped second request counts as failed");
    void *r = device_alloc(256);
    work_timed(s, 100, r);
    defer_free(r, s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released twice or early");
    return 0;
}
