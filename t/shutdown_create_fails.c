/* SPDX-License-Identifier: MIT */
/* defer_flush and defer_shutdown after callbacks deferred while event
 * creation fails for good, with the eager policy and a reclaimer that
 * polls once a second, in a program that never called defer_alloc (its
 * block map empty): a plain free released by a trim, then a callback
 * behind held work, then creation failing, the work completed and 40 more
 * callbacks on the stream.  Every callback is accepted and runs once,
 * shutdown ends cleanly and the counters add up.  The later callbacks take
 * the events their stream's lane holds or shares (stream_lane.h), so the
 * failure reaches only the reclaimer's refill of the pool. */
#include <stdatomic.h>

#include "helpers.h"

#define EXTRA_CALLS 40

static atomic_int ran;

static void count_run(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

static void calls_while_create_fails(void)
{
    cudaStream_t s = stream_new();
    /* A plain free behind held work, released by a trim. */
    void *p = device_alloc(1 << 20);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free of 1 MiB");
    fake_complete(w);
    size_t trimmed = 0;
    CHECK(defer_trim(&trimmed) == cudaSuccess, "defer_trim");
    CHECK(fake_is_released(p) == 1, "the 1 MiB buffer is released");
    /* A callback behind held work, with an event; then none can be had. */
    w = work_held(s, NULL);
    CHECK(defer_call(count_run, NULL, s) == cudaSuccess, "defer_call behind "
          "held work");
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    fake_complete(w);
    int accepted = 1;
    stderr_capture_begin();
    for (int i = 0; i < EXTRA_CALLS; i++)
        accepted += defer_call(count_run, NULL, s) == cudaSuccess;
    stderr_capture_end();
    fake_fail_clear();
    CHECK(accepted == EXTRA_CALLS + 1, "%d of %d callbacks accepted",
          accepted, EXTRA_CALLS + 1);
    CHECK(defer_flush() == cudaSuccess, "defer_flush");
    CHECK(atomic_load(&ran) == accepted, "%d of %d callbacks ran",
          atomic_load(&ran), accepted);
    CHECK(defer_shutdown() == cudaSuccess, "defer_shutdown");
    CHECK(atomic_load(&ran) == accepted, "each callback ran once (%d of %d)",
          atomic_load(&ran), accepted);
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.deferred == st.released + st.failed,
          "after shutdown: deferred %llu, released %llu, failed %llu, "
          "pending %llu", ULL(st.deferred), ULL(st.released), ULL(st.failed),
          ULL(st.pending));
}

int main(void)
{
    plan_lazy();
    fork_scenario("callbacks while event creation fails, then a flush and "
                  "defer_shutdown (no defer_alloc ever)",
                  "CUDEFER_POLICY=eager CUDEFER_POLL_US=1s "
                  "CUDEFER_POLL_MAX_US=1s",
                  1, 20000, calls_while_create_fails);
    return 0;
}
