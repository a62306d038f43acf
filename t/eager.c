/* SPDX-License-Identifier: MIT */
/* CUDEFER_POLICY=eager: entries are still sized, so a
 * trim says what its pass released (make_device_unique retries on that),
 * and pool memory is still freed with cudaFreeAsync, not cudaFree (a device
 * drain each). */
#include "helpers.h"

int main(void)
{
    plan(5);
    /* A reclaimer that naps a whole second between polls: the trim below is
     * served by the pass that sees the work complete. */
    set_cudefer_env("CUDEFER_POLICY=eager CUDEFER_POLL_US=1s "
                    "CUDEFER_POLL_MAX_US=1s");
    fake_reset(1);
    cudaStream_t s = stream_new();
    void *p = device_alloc(1 << 20);
    fake_work *w = work_held(s, p);
    defer_free(p, s);
    for (int i = 0; i < 2000 && stats_now().event_queries == 0; i++)
        sleep_ms(1); /* taken in and polled once: not ready */
    fake_complete(w);
    size_t bytes = 0;
    is_int(defer_trim(&bytes), cudaSuccess, "defer_trim");
    ok(bytes >= (1 << 20), "eager: the trim reports the %zu bytes its pass "
                           "released", bytes);
    void *q = NULL;
    is_int(cudaMallocAsync(&q, 4096, s), cudaSuccess, "pool memory");
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long async = fake_calls(FAKE_FREE_ASYNC);
    defer_free(q, s);
    defer_flush();
    ok(fake_calls(FAKE_FREE_ASYNC) - async == 1 && fake_calls(FAKE_FREE) == frees,
       "eager: pool memory freed with cudaFreeAsync");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    return 0;
}
