/* SPDX-License-Identifier: MIT */
/* A block of defer_alloc's freed on another device's stream, whose device
 * then fails (a sticky error): the free is abandoned, as every pending
 * entry of a failed device is (cudefer.h: counted as failed, said in the
 * device's one line), though the block's own device is healthy.  Its block
 * is never handed out again nor released, not even once the work that
 * used it ends or at shutdown: the failed device's work is not known to be
 * over, and an abandoned free's memory stays the application's (live in
 * the block's device's counts), as a plain pointer's stays allocated. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

/* Poll cond every millisecond, for at most ms milliseconds. */
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

static void scenario_block_freed_on_failed_device(void)
{
    const cudaError_t bad = cudaErrorIllegalAddress;
    cudaStream_t s0 = stream_new();
    void *b = NULL, *c = NULL;
    CHECK(alloc_checked(&b, MiB, s0) == cudaSuccess, "1 MiB on device 0");
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    fake_work *w = work_held(s1, b);
    CHECK(defer_free(b, s1) == cudaSuccess, "freed on device 1's stream");
    fake_fail(FAKE_EVENT_QUERY, bad, 0, 1);
    WAIT_UNTIL(stats_now().failed == 1, 10000);
    fake_fail_clear();
    struct defer_stats st = stats_now();
    CHECK(st.failed == 1 && st.pending == 0, "the free is abandoned with "
          "device 1: failed %llu pending %llu", ULL(st.failed),
          ULL(st.pending));
    fake_complete(w);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    struct defer_device_stats d0;
    CHECK(defer_device_stats_get(0, &d0) == cudaSuccess, "device 0's stats");
    CHECK(d0.live_bytes == MiB && d0.cache_free_bytes == 0,
          "device 0 counts the block live (%llu), not free (%llu)",
          ULL(d0.live_bytes), ULL(d0.cache_free_bytes));
    CHECK(alloc_checked(&c, MiB, s0) == cudaSuccess && c != b,
          "a request on device 0 never gets the abandoned block");
    CHECK(defer_free(c, s0) == cudaSuccess, "freed");
    CHECK(defer_flush() == bad, "flush: device 1's error");
    CHECK(defer_trim(NULL) == bad && defer_shutdown() == bad,
          "trim and shutdown: device 1's error");
    CHECK(fake_is_released(b) == 0, "the abandoned block is never released");
    CHECK(fake_is_released(c) == 1, "device 0's other block is");
    cudaStreamDestroy(s0);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a block freed on another device's stream, that device "
                  "failing", "", 2, 20000,
                  scenario_block_freed_on_failed_device);
    return 0;
}
