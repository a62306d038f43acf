/* SPDX-License-Identifier: MIT */
/* Held memory of a device that fails (a sticky error) while none of its
 * entries is pending: the frees the release policy holds (completed
 * cudaMalloc memory) can never be released there, so they are abandoned
 * with the device as its pending entries are (cudefer.h: counted as
 * failed), at the reclaimer's next pass, not when the policy would next
 * have released them (here: never, as the program is not quiet for 10 s
 * and CUDEFER_MAX_DELAY_MS=0).  Each scenario fails its device on a
 * launching thread, so that no failed query of the reclaimer's abandons
 * them on the way. */
#include <stdint.h>
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

/* Poll cond every millisecond, for at most ms milliseconds. */
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

/* n frees of 1 MiB each deferred on a new stream of the current device
 * (p gets them), completed and held by the policy; holds: the check's
 * words. */
static void hold(void **p, int n, const char *holds)
{
    cudaStream_t s = stream_new();
    for (int i = 0; i < n; i++) {
        p[i] = device_alloc(MiB);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    WAIT_UNTIL(stats_now().held == (uint64_t)n, 10000);
    CHECK(stats_now().held == (uint64_t)n, "%s", holds);
}

/* Device 0 fails on this thread with bad, none of its entries pending: a
 * defer_free that gets no event (CUDEFER_EVENT_POOL=0, event creation
 * failing) releases synchronously, and its cudaFree meets bad.  What was
 * said on stderr meanwhile. */
static const char *fail_device_0(cudaError_t bad)
{
    cudaStream_t s2 = stream_new();
    void *q = device_alloc(MiB);
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_FREE, bad, 0, 1);
    stderr_capture_begin();
    CHECK(defer_free(q, s2) == cudaSuccess, "q released synchronously");
    const char *said = stderr_capture_end();
    fake_fail_clear();
    return said;
}

/* Device 0's held frees, then device 0 failed with no entry of its
 * pending (fail_device_0). */
static void scenario_held_on_failed_device(void)
{
    enum { N = 3 };
    const cudaError_t bad = cudaErrorIllegalAddress;
    void *p[N];
    hold(p, N, "the 3 frees are held");
    const char *said = fail_device_0(bad);
    CHECK(has_line(said, "device 0: cudaFree failed",
                   "cudaErrorIllegalAddress", NULL),
          "device 0 failed, said (stderr: \"%s\")", said);
    WAIT_UNTIL(stats_now().held == 0 && stats_now().failed == N + 1, 2000);
    CHECK(wait_stats_settled(2000), "statistics settled");
    struct defer_stats st = stats_now();
    CHECK(st.held == 0 && st.held_bytes == 0,
          "nothing held on the failed device: held %llu (%llu bytes)",
          ULL(st.held), ULL(st.held_bytes));
    CHECK(st.failed == N + 1 && st.released == 0 && st.pending == 0,
          "q's release and the %d held frees counted as failed: failed %llu "
          "released %llu pending %llu", N, ULL(st.failed), ULL(st.released),
          ULL(st.pending));
    struct defer_device_stats d0 = {0};
    cudaError_t got = defer_device_stats_get(0, &d0);
    CHECK(got == cudaSuccess && d0.held_bytes == 0,
          "device 0 holds no bytes (%llu; %s)", ULL(d0.held_bytes),
          cudaGetErrorName(got));
    CHECK(count_released(p, N) == 0, "the held memory is never released");
    CHECK(defer_flush() == bad && defer_shutdown() == bad,
          "flush and shutdown: device 0's error");
    CHECK(count_released(p, N) == 0 && stats_now().failed == N + 1,
          "nothing released or counted again at shutdown");
}

/* Held frees of device 0, while device 1 has work pending (so the program
 * is not quiet): device 0 fails on a launching thread, and only device 1
 * has entries for the reclaimer to poll, all healthy.  Device 0's held
 * frees are abandoned all the same; device 1 goes on. */
static void scenario_held_other_device_busy(void)
{
    enum { N = 2 };
    const cudaError_t bad = cudaErrorIllegalAddress;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *busy = device_alloc(MiB);
    fake_work *w = work_held(s1, busy);
    CHECK(defer_free(busy, s1) == cudaSuccess, "device 1's free waits");
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    void *p[N];
    hold(p, N, "device 0's 2 frees are held");
    fail_device_0(bad);
    WAIT_UNTIL(stats_now().held == 0 && stats_now().failed == N + 1, 2000);
    struct defer_stats st = stats_now();
    CHECK(st.held == 0 && st.failed == N + 1 && st.pending == 1,
          "device 0's held frees abandoned, device 1's pending: held %llu "
          "failed %llu pending %llu", ULL(st.held), ULL(st.failed),
          ULL(st.pending));
    fake_complete(w);
    CHECK(cudaSetDevice(1) == cudaSuccess && defer_flush() == bad,
          "flush: device 0's error");
    CHECK(wait_released(busy, 2000) && count_released(p, N) == 0,
          "device 1's free released, device 0's held memory never");
    CHECK(defer_shutdown() == bad, "shutdown: device 0's error");
}

int main(void)
{
    plan_lazy();
    fork_scenario("held frees of a device that fails with nothing pending: "
                  "abandoned, counted as failed",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0 "
                  "CUDEFER_EVENT_POOL=0", 1, 20000,
                  scenario_held_on_failed_device);
    fork_scenario("held frees of a device that fails while another device "
                  "is busy: abandoned, the other goes on",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0 "
                  "CUDEFER_EVENT_POOL=0", 2, 20000,
                  scenario_held_other_device_busy);
    return 0;
}
