/* SPDX-License-Identifier: MIT */
/* A program built with nvcc --default-stream per-thread (which defines
 * CUDA_API_PER_THREAD_DEFAULT_STREAM before the CUDA headers) means its
 * per-thread default stream by stream 0.  cudefer, built apart, took 0 for
 * the legacy stream: the event then did not follow the caller's work (on a
 * GPU the legacy stream waits for the per-thread stream, so it was a
 * device-wide barrier; the fake, which has no implicit synchronisation,
 * shows the difference as a premature release).
 *
 * This file is compiled as such a program.  It calls no CUDA runtime
 * function that the macro renames (the fake has no _ptsz variants): only
 * the fake's control API, the helpers (compiled without the macro) and
 * cudefer's calls. */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include "cudefer.h"

#include "helpers.h"

int main(void)
{
    plan_lazy();
    fake_reset(1);
    void *p = device_alloc(256), *h = host_alloc(64), *q = device_alloc(64);
    /* The program's work on "stream 0": its per-thread stream. */
    fake_work *w = fake_launch_held(cudaStreamPerThread, &p, 1);
    fake_work *wh = fake_launch_held(cudaStreamPerThread, &h, 1);
    fake_work *wq = fake_launch_held(cudaStreamPerThread, &q, 1);
    is_int(defer_free(p, 0), cudaSuccess, "defer_free(p, 0)");
    is_int(defer_free_host(h, 0), cudaSuccess, "defer_free_host(h, 0)");
    void *both[1] = {q};
    is_int(defer_free_n(both, 1, 0), cudaSuccess, "defer_free_n(.., 0)");
    sleep_ms(20);
    is_int(fake_is_released(p), 0, "held while the per-thread stream's work "
           "runs: stream 0 is the caller's per-thread stream");
    ok(fake_is_released(h) == 0 && fake_is_released(q) == 0,
       "likewise for defer_free_host and defer_free_n");
    fake_complete(w);
    fake_complete(wh);
    fake_complete(wq);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(h) == 1 &&
           fake_is_released(q) == 1,
       "released once it completed");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released early");
    fake_oracle_forgive(); /* reported above; the exit status stays TAP's */
    return 0;
}
