/* SPDX-License-Identifier: MIT */
/* A free that waits for several streams (a block recorded on other streams
 * with defer_record_stream; defer_free_streams, defer_call_streams) when no
 * event can be had: as a free on one stream, the caller waits for every
 * stream's work and the memory is released (the block back in the cache)
 * or the callback run before the call returns, counted in sync_releases,
 * not refused.  Then the header's limits of defer_record_stream: 63
 * streams a block, a free's 64 streams in all, and a recorded stream
 * destroyed before the free. */
#include <string.h>

#include "helpers.h"

/* No event from now on: every creation fails, and the pool is empty (no
 * event was made yet: the scenarios below defer nothing before). */
static void no_events(void)
{
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
}

static void recorded_block(void)
{
    cudaStream_t s = stream_new(), side = stream_new(), other = stream_new();
    void *p = NULL;
    CHECK(alloc_checked(&p, 4096, s) == cudaSuccess, "a block on s");
    fake_work *mine = work_timed(s, 10000, p);
    fake_work *used = work_timed(side, 20000, p);
    CHECK(defer_record_stream(p, side) == cudaSuccess, "recorded on side");
    no_events();
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "no event: defer_free accepted (%s)",
          cudaGetErrorName(err));
    CHECK(fake_work_done(mine) && fake_work_done(used),
          "the caller waited for both streams' work");
    CHECK(has_line(said, "defer_free", "releasing synchronously", NULL),
          "said once (%s)", said);
    struct defer_stats after = stats_now();
    CHECK(after.rejected == before.rejected &&
              after.sync_releases == before.sync_releases + 1,
          "counted as a synchronous release (%llu), not rejected (%llu)",
          ULL(after.sync_releases - before.sync_releases),
          ULL(after.rejected - before.rejected));
    void *q = NULL;
    err = alloc_checked(&q, 4096, other);
    CHECK(err == cudaSuccess && q == p,
          "the block is back in the cache: another stream gets it (%s, %p)",
          cudaGetErrorName(err), q);
    fake_fail_clear();
    CHECK(defer_free(q, other) == cudaSuccess, "freed again");
    CHECK(defer_flush() == cudaSuccess, "flush");
    after = stats_now();
    CHECK(after.pending == 0 &&
              after.deferred == after.released + after.failed,
          "stats agree: deferred %llu = released %llu + failed %llu",
          ULL(after.deferred), ULL(after.released), ULL(after.failed));
}

static int calls;

static void count_call(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&calls, 1, __ATOMIC_SEQ_CST);
}

static void streams_calls(void)
{
    cudaStream_t s[2] = {stream_new(), stream_new()};
    void *p = device_alloc(64);
    fake_work *a = work_timed(s[0], 10000, p), *b = work_timed(s[1], 20000, p);
    no_events();
    stderr_capture_begin();
    cudaError_t err = defer_free_streams(p, s, 2);
    stderr_capture_end();
    CHECK(err == cudaSuccess && fake_work_done(a) && fake_work_done(b) &&
              fake_is_released(p) == 1,
          "defer_free_streams: waited for both, released (%s)",
          cudaGetErrorName(err));
    work_timed(s[1], 10000, NULL);
    stderr_capture_begin();
    err = defer_call_streams(count_call, NULL, s, 2);
    stderr_capture_end();
    CHECK(err == cudaSuccess &&
              __atomic_load_n(&calls, __ATOMIC_SEQ_CST) == 1,
          "defer_call_streams: run before the return (%s, %d calls)",
          cudaGetErrorName(err), __atomic_load_n(&calls, __ATOMIC_SEQ_CST));
    fake_fail_clear();
}

int main(void)
{
    plan_lazy();
    fork_scenario("no event: a block recorded on another stream is freed "
                  "synchronously", "", 1, 20000, recorded_block);
    fork_scenario("no event: a block recorded on another stream is freed "
                  "synchronously", "CUDEFER_EVENT_POOL=0", 1, 20000,
                  recorded_block);
    fork_scenario("no event: the *_streams calls wait and release",
                  "", 1, 20000, streams_calls);
    return 0;
}
