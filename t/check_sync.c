/* SPDX-License-Identifier: MIT */
/* CUDEFER_CHECK=1 and the synchronous route: a pointer deferred again while
 * its first release is pending, in a call that could have no event (so it
 * waits for its stream and would release on the calling thread), is
 * reported and dropped as on every other route: released once, never while
 * its first free's work is pending; a block of defer_alloc's freed so goes
 * back to the cache, as without CUDEFER_CHECK. */
#include <stdio.h>
#include <string.h>

#include "helpers.h"

/* p pending on s; freed again on an idle stream s2 with no event to be
 * had, alone (defer_free) or beside a fresh q (defer_free_n: q is
 * released).  Guarded against: the calling thread releases p at once,
 * under s's pending work (premature release), and the reclaimer releases
 * it again once that work is done (double release). */
static void sync_free_of_pending(bool beside_q)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = device_alloc(256), *q = beside_q ? device_alloc(256) : NULL;
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free(p, s)");
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    void *pair[] = {q, p};
    cudaError_t err = beside_q ? defer_free_n(pair, 2, s2) : defer_free(p, s2);
    fake_fail_clear();
    CHECK(err == cudaSuccess, "p again on s2, no event (%s)",
          cudaGetErrorName(err));
    CHECK(stats_now().sync_releases == 1,
          "it waited for s2 (%llu synchronous releases)",
          ULL(stats_now().sync_releases));
    CHECK(fake_is_released(p) == 0,
          "p not released while s's work is pending");
    fake_complete(w);
    cudaError_t flushed = defer_flush();
    const char *msg = stderr_capture_end();
    CHECK(flushed == cudaSuccess, "flush (%s)", cudaGetErrorName(flushed));
    char want[64];
    snprintf(want, sizeof want, "CUDEFER_CHECK: %p", p);
    CHECK(strstr(msg, want) != NULL, "the second free of p is reported");
    CHECK(fake_is_released(p) == 1 && (q == NULL || fake_is_released(q) == 1),
          "p released once, q released");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static void scenario_sync_free_of_pending(void)
{
    sync_free_of_pending(false);
}

static void scenario_sync_free_n_of_pending(void)
{
    sync_free_of_pending(true);
}

/* A free with no event of a pointer not pending is released by the time
 * the call returns, as without CUDEFER_CHECK, though the policy holds
 * what completes (batched). */
static void scenario_sync_free_released_at_return(void)
{
    cudaStream_t s = stream_new();
    void *q = device_alloc(256);
    work_timed(s, 1000, q);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    cudaError_t err = defer_free(q, s);
    fake_fail_clear();
    stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_free(q), no event (%s)",
          cudaGetErrorName(err));
    CHECK(fake_is_released(q) == 1, "q released when the call returned");
    CHECK(stats_now().sync_releases == 1 && stats_now().released == 1,
          "one synchronous release, counted released (%llu, %llu)",
          ULL(stats_now().sync_releases), ULL(stats_now().released));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A block of defer_alloc's freed on its own stream with no event to be
 * had waits for the stream and goes back to the cache, FREE: no longer
 * live, handed to another stream's request.  Under CUDEFER_CHECK it was
 * queued as a block's entry, whose end only settles a parked block: the
 * block, claimed but never parked, stayed freeing for good. */
static void scenario_sync_free_of_block(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = NULL, *q = NULL;
    CHECK(alloc_checked(&p, 1 << 20, s) == cudaSuccess, "defer_alloc");
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    cudaError_t err = defer_free(p, s);
    fake_fail_clear();
    stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_free(p, s), no event (%s)",
          cudaGetErrorName(err));
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct defer_device_stats d;
    CHECK(defer_device_stats_get(0, &d) == cudaSuccess, "device 0's stats");
    CHECK(d.live_bytes == 0 && d.cache_free_bytes == 1 << 20,
          "p is free in the cache (live_bytes %llu, cache_free_bytes %llu)",
          ULL(d.live_bytes), ULL(d.cache_free_bytes));
    CHECK(alloc_checked(&q, 1 << 20, s2) == cudaSuccess && q == p,
          "s2's request gets p back (p %p, q %p)", p, q);
    CHECK(defer_free(q, s2) == cudaSuccess, "defer_free(q, s2)");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

int main(void)
{
    plan(5);
    fork_scenario("a pending pointer freed again with no event is dropped",
                  "CUDEFER_CHECK=1 CUDEFER_EVENT_POOL=0", 1, 20000,
                  scenario_sync_free_of_pending);
    fork_scenario("defer_free_n of a pending pointer with no event drops it",
                  "CUDEFER_CHECK=1 CUDEFER_EVENT_POOL=0", 1, 20000,
                  scenario_sync_free_n_of_pending);
    fork_scenario("a free with no event is released at its return",
                  "CUDEFER_CHECK=1 CUDEFER_EVENT_POOL=0 "
                  "CUDEFER_POLICY=batched",
                  1, 20000, scenario_sync_free_released_at_return);
    fork_scenario("a block freed with no event goes back to the cache",
                  "CUDEFER_EVENT_POOL=0", 1, 20000,
                  scenario_sync_free_of_block);
    fork_scenario("a block freed with no event goes back to the cache",
                  "CUDEFER_CHECK=1 CUDEFER_EVENT_POOL=0", 1, 20000,
                  scenario_sync_free_of_block);
    return 0;
}
