/* SPDX-License-Identifier: MIT */
/* A block of defer_alloc's freed on another device's stream, whose device
 * then fails (a sticky error): the free is abandoned, as every pending
 * entry of a failed device is (cudefer.h: counted as failed, said in the
 * device's one line), though the block's own device is healthy.  Its block
 * is never handed out again nor released, not even once the work that
 * used it ends or at shutdown: the failed device's work is not known to be
 * over, and an abandoned free's memory stays the application's (live in
 * the block's device's counts), as a plain pointer's stays allocated.  So
 * too for a free that waits for streams of both devices (defer_free_streams,
 * or defer_pluggable_free of a block recorded on the other device's stream
 * with defer_record_stream): one failed device abandons it whole. */
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

/* Poll cond every millisecond, for at most ms milliseconds. */
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

/* Device 1 failed with bad, abandoning the free of device 0's block b
 * (1 MiB, allocated on s0): device 0 counts b live, never hands it out
 * again nor releases it, and goes on serving and releasing other blocks;
 * flush, trim and shutdown return device 1's error. */
static void device_0_goes_on(void *b, cudaStream_t s0, cudaError_t bad)
{
    void *c = NULL;
    struct defer_device_stats d0 = {0};
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
}

static void scenario_block_freed_on_failed_device(void)
{
    const cudaError_t bad = cudaErrorIllegalAddress;
    cudaStream_t s0 = stream_new();
    void *b = NULL;
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
    device_0_goes_on(b, s0, bad);
    cudaStreamDestroy(s0);
}

/* Blocks freed on the legacy streams of two devices wait in their free
 * batches; a flush seals both, and device 0's check of its legacy stream
 * (cudaStreamIsCapturing) meets a sticky error: device 0 fails there.  Its
 * batch's block is abandoned as every pending entry of a failed device is
 * (counted as failed, never handed out again), the error said as what it
 * is, and device 1's batch is sealed and released as before.  Before the
 * fix the check took any error for another thread's capture: said as
 * cudaErrorStreamCaptureImplicit, the device not failed, and the block left
 * in its batch, pending after the flush. */
static void scenario_batch_check_fails_sticky(void)
{
    const cudaError_t bad = cudaErrorIllegalAddress;
    void *b0 = NULL, *b1 = NULL;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    CHECK(defer_alloc(&b1, MiB, 0) == cudaSuccess &&
              defer_free(b1, 0) == cudaSuccess,
          "a block of device 1 freed on its legacy stream");
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(defer_alloc(&b0, MiB, 0) == cudaSuccess &&
              defer_free(b0, 0) == cudaSuccess,
          "a block of device 0 freed on its legacy stream");
    fake_fail(FAKE_STREAM_IS_CAPTURING, bad, 0, 1); /* device 0's, first */
    stderr_capture_begin();
    cudaError_t err = defer_flush();
    const char *said = stderr_capture_end();
    fake_fail_clear();
    CHECK(err == bad, "flush: device 0's error (%d)", (int)err);
    CHECK(strstr(said, "CaptureImplicit") == NULL &&
              strstr(said, "cudaErrorIllegalAddress") != NULL,
          "the error said as it is (stderr: \"%s\")", said);
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 1 && st.released == 1,
          "device 0's block abandoned, device 1's released: pending %llu "
          "failed %llu released %llu", ULL(st.pending), ULL(st.failed),
          ULL(st.released));
    void *c = NULL;
    CHECK(defer_alloc(&c, MiB, 0) == bad, "device 0 failed");
    CHECK(cudaSetDevice(1) == cudaSuccess &&
              defer_alloc(&c, MiB, 0) == cudaSuccess && c == b1,
          "device 1 works on, its block reused");
    CHECK(defer_free(c, 0) == cudaSuccess, "freed");
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(defer_shutdown() == bad, "shutdown: device 0's error");
    CHECK(fake_is_released(b0) == 0, "the abandoned block is never released");
}

/* What a block whose free waits for streams of two devices (payload on
 * device 0's s0, which has no work, and a part on device 1's s1) comes to
 * when device 1 fails once s0's part is done: the free is abandoned as in
 * scenario_block_freed_on_failed_device (counted as failed, said in device
 * 1's one line), its block kept live in device 0's counts, never handed
 * out again nor released, and device 0 goes on.  free_on_both frees b on
 * s0 and s1. */
static void block_free_on_two_devices(void (*free_on_both)(void *b,
                                                           cudaStream_t s0,
                                                           cudaStream_t s1))
{
    const cudaError_t bad = cudaErrorIllegalAddress;
    cudaStream_t s0 = stream_new();
    void *b = NULL;
    CHECK(alloc_checked(&b, MiB, s0) == cudaSuccess, "1 MiB on device 0");
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    fake_work *w = work_held(s1, b);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    free_on_both(b, s0, s1);
    /* Three queries more: s0's part (taken in by the reclaimer's second
     * pass at the latest, one query a stream a pass) was seen done, so the
     * failed one is s1's. */
    unsigned long queries = fake_calls(FAKE_EVENT_QUERY);
    WAIT_UNTIL(fake_calls(FAKE_EVENT_QUERY) >= queries + 3, 10000);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, bad, 0, 1);
    WAIT_UNTIL(stats_now().failed == 1, 10000);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    CHECK(has_line(said, "device 1: cudaEventQuery failed",
                   "cudaErrorIllegalAddress", NULL),
          "device 1's failure said (stderr: \"%s\")", said);
    struct defer_stats st = stats_now();
    CHECK(st.failed == 1 && st.pending == 0 && st.released == 0,
          "the free is abandoned with device 1: failed %llu pending %llu "
          "released %llu", ULL(st.failed), ULL(st.pending), ULL(st.released));
    fake_complete(w);
    device_0_goes_on(b, s0, bad);
    CHECK(stats_now().failed == 1, "counted as failed once");
    cudaStreamDestroy(s0);
}

static void free_streams_on_both(void *b, cudaStream_t s0, cudaStream_t s1)
{
    cudaStream_t both[2] = {s0, s1};
    CHECK(defer_free_streams(b, both, 2) == cudaSuccess,
          "defer_free_streams on s0 and s1");
}

static void scenario_free_streams_one_device_fails(void)
{
    block_free_on_two_devices(free_streams_on_both);
}

/* As PyTorch frees a block another stream used: recorded on s1
 * (defer_record_stream), freed on its allocation's stream s0. */
static void pluggable_free_on_both(void *b, cudaStream_t s0, cudaStream_t s1)
{
    CHECK(defer_record_stream(b, s1) == cudaSuccess, "recorded on s1");
    stderr_capture_begin();
    defer_pluggable_free(b, MiB, 0, s0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0' && stats_now().deferred == 1,
          "defer_pluggable_free on s0 accepted, nothing said (stderr: "
          "\"%s\")", said);
}

static void scenario_pluggable_free_one_device_fails(void)
{
    block_free_on_two_devices(pluggable_free_on_both);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a free batch's check of the legacy stream meets a sticky "
                  "error", "", 2, 20000, scenario_batch_check_fails_sticky);
    fork_scenario("a block freed on another device's stream, that device "
                  "failing", "", 2, 20000,
                  scenario_block_freed_on_failed_device);
    fork_scenario("a block freed by defer_free_streams on two devices' "
                  "streams, one device failing", "", 2, 20000,
                  scenario_free_streams_one_device_fails);
    fork_scenario("a block recorded on another device's stream, freed by "
                  "defer_pluggable_free, that device failing", "", 2, 20000,
                  scenario_pluggable_free_one_device_fails);
    return 0;
}
