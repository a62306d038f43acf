/* SPDX-License-Identifier: MIT */
/* CUDEFER_CHECK=1: a pointer deferred again while its first release is
 * pending is reported by name and dropped, so it is released once; once
 * released, deferring the same address again (after a new allocation) is
 * fine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static void noop(void *arg)
{
    (void)arg;
}

static void set_flag(void *flag)
{
    __atomic_store_n((int *)flag, 1, __ATOMIC_SEQ_CST);
}

/* A callback that keeps the reclaimer until *go is set (10 s at most):
 * entries pushed meanwhile wait in its queue. */
static int held_ran, held_go;
static void hold_reclaimer(void *arg)
{
    (void)arg;
    set_flag(&held_ran);
    wait_flag(&held_go, 10000);
}

/* p pending on device 0; deferred again on device 1, which fails (the
 * reclaimer cannot make it current for a callback pushed just before)
 * before the reclaimer takes that free in; then deferred again on device
 * 0.  The last free is reported and dropped; the failure guarded against:
 * the failed device's free takes p out of the pending set it never
 * joined, the last free goes unseen and p is released twice (the oracle's
 * double release). */
static void scenario_failed_device_keeps_others(void)
{
    cudaStream_t s0 = stream_new();
    void *p = device_alloc(256);
    fake_work *w = work_held(s0, p);
    CHECK(defer_free(p, s0) == cudaSuccess, "defer_free(p) on device 0");
    /* Once a callback pushed after it runs, the reclaimer took p's free in
     * and works on device 0: only device 1's switch can fail below.  The
     * callback keeps it there until both frees on device 1 are accepted:
     * a reclaimer that failed device 1 at the first would refuse the
     * second at the call. */
    CHECK(defer_call(hold_reclaimer, NULL, stream_new()) == cudaSuccess &&
              wait_flag(&held_ran, 5000),
          "the reclaimer took p's free in");
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorDevicesUnavailable, 0, -1);
    CHECK(defer_call(noop, NULL, s1) == cudaSuccess, "a callback on device 1");
    CHECK(defer_free(p, s1) == cudaSuccess,
          "p again on device 1 (accepted at the call)");
    set_flag(&held_go);
    double deadline = now_ms() + 5000;
    while (stats_now().failed < failed + 2 && now_ms() < deadline)
        sleep_ms(1);
    fake_fail_clear();
    CHECK(stats_now().failed == failed + 2,
          "both device 1 entries failed (%llu)",
          ULL(stats_now().failed - failed));
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(defer_free(p, s0) == cudaSuccess, "p again on device 0");
    fake_complete(w);
    cudaError_t flushed = defer_flush();
    const char *msg = stderr_capture_end();
    CHECK(flushed == cudaErrorDevicesUnavailable,
          "flush returns device 1's error (%s)", cudaGetErrorName(flushed));
    char want[64];
    snprintf(want, sizeof want, "CUDEFER_CHECK: %p (device 0)", p);
    CHECK(strstr(msg, want) != NULL,
          "the second free on device 0 is reported");
    CHECK(fake_is_released(p) == 1 && fake_invalid_releases() == 0,
          "p released once (%zu invalid releases)", fake_invalid_releases());
}

int main(void)
{
    plan(10);
    fork_scenario("a failed device's free keeps a healthy one's pointer "
                  "tracked", "CUDEFER_CHECK=1 CUDEFER_MAX_DELAY_MS=0", 2,
                  20000, scenario_failed_device_keeps_others);
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
