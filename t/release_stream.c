/* SPDX-License-Identifier: MIT */
/* How the reclaimer gives cudaMalloc memory back (Note [Releasing without a
 * drain], src/reclaimer_frees.c): with cudaFreeAsync on its own stream, that
 * stream synchronized after every 8 such frees and at the end of the pass,
 * so the memory is back when a flush returns; with cudaFree on a device
 * without memory pools; and what a failed synchronize does.  Each scenario
 * runs in a child process. */
#include <string.h>

#include "helpers.h"

enum { N = 20 };

#define EN(err) cudaGetErrorName(err)
/* Completed entries stay held until the flush: no idle-time or age release
 * can take them before a scenario arms its failure. */
#define HELD "CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0"
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

/* The counts of the calls that give memory back, from here on. */
struct calls {
    unsigned long async, free, sync;
};

static struct calls calls_now(void)
{
    return (struct calls){fake_calls(FAKE_FREE_ASYNC), fake_calls(FAKE_FREE),
                          fake_calls(FAKE_STREAM_SYNCHRONIZE)};
}

static size_t device_free_bytes(void)
{
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return free_bytes;
}

/* n buffers of 1 MiB deferred behind one work item on s, which then
 * completes: under HELD they stay held until a flush or trim. */
static void defer_n_behind_work(cudaStream_t s, void **p, int n)
{
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < n; i++) {
        p[i] = device_alloc(1 << 20);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    CHECK(count_released(p, n) == 0, "none released while the work runs");
    fake_complete(w);
}

static void defer_behind_work(cudaStream_t s, void **p)
{
    defer_n_behind_work(s, p, N);
}

/* A flush, after which all n of p are released. */
static void flush_releases_all(void **p, int n)
{
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, n) == n, "all released (%d of %d)",
          count_released(p, n), n);
}

/* n buffers deferred on s and held (HELD), ready for a failure to arm. */
static void defer_held(cudaStream_t s, void **p, int n)
{
    defer_n_behind_work(s, p, n);
    WAIT_UNTIL(stats_now().held == (uint64_t)n, 10000);
    CHECK(stats_now().held == (uint64_t)n, "%d held (%llu)", n,
          ULL(stats_now().held));
}

static void s_async(void)
{
    cudaStream_t s = stream_new();
    size_t before = device_free_bytes();
    struct calls c0 = calls_now(); /* before: a slow run may release early */
    void *p[N];
    defer_behind_work(s, p);
    flush_releases_all(p, N);
    struct calls c = calls_now();
    CHECK(c.async - c0.async == N && c.free == c0.free,
          "%lu cudaFreeAsync calls (want %d), %lu cudaFree (want 0)",
          c.async - c0.async, N, c.free - c0.free);
    /* 20 frees: two slices of 8, and the pass's last 4 at its end (more
     * when the releases spread over several passes). */
    CHECK(c.sync - c0.sync >= 3, "the reclaimer's stream synchronized %lu "
          "times, want at least 3", c.sync - c0.sync);
    CHECK(device_free_bytes() == before, "the device's memory is back when "
          "the flush returns (%zu of %zu bytes free)", device_free_bytes(),
          before);
    struct defer_stats st = stats_now();
    CHECK(st.released == N && st.failed == 0 && st.held == 0,
          "released %llu failed %llu held %llu", ULL(st.released),
          ULL(st.failed), ULL(st.held));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static void s_no_pools(void)
{
    fake_set_memory_pools(0, 0);
    cudaStream_t s = stream_new();
    struct calls c0 = calls_now();
    void *p[N];
    defer_behind_work(s, p);
    flush_releases_all(p, N);
    struct calls c = calls_now();
    CHECK(c.free - c0.free == N && c.async == c0.async && c.sync == c0.sync,
          "%lu cudaFree calls (want %d), %lu cudaFreeAsync and %lu "
          "cudaStreamSynchronize (want 0)", c.free - c0.free, N,
          c.async - c0.async, c.sync - c0.sync);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* Two devices, one without memory pools: each device's own way. */
static void s_mixed_devices(void)
{
    fake_set_memory_pools(1, 0);
    struct calls c0 = calls_now();
    void *p[2][N];
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        defer_behind_work(stream_new(), p[d]);
    }
    cudaSetDevice(0);
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct calls c = calls_now();
    CHECK(count_released(p[0], N) == N && count_released(p[1], N) == N,
          "all released (%d and %d of %d)", count_released(p[0], N),
          count_released(p[1], N), N);
    CHECK(c.async - c0.async == N && c.free - c0.free == N,
          "device 0's with cudaFreeAsync (%lu calls), device 1's with "
          "cudaFree (%lu calls), want %d each", c.async - c0.async,
          c.free - c0.free, N);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A sticky error first met by the reclaimer's synchronize of its frees
 * (the device faulted meanwhile): the device fails, and the flush that
 * served the release returns the error, though its entries had finished. */
static void s_sync_sticky(void)
{
    enum { M = 3 };
    cudaStream_t s = stream_new();
    void *p[M];
    defer_held(s, p, M);
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorIllegalAddress, 0, -1);
    cudaError_t f = defer_flush();
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    void *q = device_alloc(4096);
    cudaError_t later = defer_free(q, s);
    CHECK(f == cudaErrorIllegalAddress, "defer_flush returns the device's "
          "error met while it ran (%s)", EN(f));
    CHECK(later == cudaErrorIllegalAddress, "the device failed (a later "
          "defer_free: %s)", EN(later));
    CHECK(strstr(msg, "device 0: cudaStreamSynchronize failed") != NULL,
          "one line names the device and the call: %s", msg);
    cudaFree(q);
}

/* A synchronize that fails without a sticky error leaves the frees to be
 * synchronized by the next pass: a later trim brings the memory back. */
static void s_sync_fails_then_trim(void)
{
    enum { M = 3 };
    cudaStream_t s = stream_new();
    size_t before = device_free_bytes();
    void *p[M];
    defer_held(s, p, M);
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorInvalidResourceHandle, 0, 1);
    CHECK(defer_flush() == cudaSuccess, "flush");
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    CHECK(strstr(msg, "cudaStreamSynchronize failed") != NULL, "said: %s",
          msg);
    CHECK(device_free_bytes() < before, "the memory is not back yet");
    CHECK(defer_trim(NULL) == cudaSuccess, "trim");
    CHECK(device_free_bytes() == before, "a later trim brings it back (%zu "
          "of %zu bytes free)", device_free_bytes(), before);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A synchronize that keeps failing is said once, not once a slice. */
static void s_sync_fails_said_once(void)
{
    cudaStream_t s = stream_new();
    void *p[N];
    defer_behind_work(s, p);
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorInvalidResourceHandle, 0, -1);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_flush() == cudaSuccess, "flush again");
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    int lines = 0;
    for (const char *q = msg; (q = strstr(q, "cudaStreamSynchronize failed"));
         q++)
        lines++;
    CHECK(lines == 1, "one line (%d): %s", lines, msg);
    CHECK(count_released(p, N) == N, "all released (%d of %d)",
          count_released(p, N), N);
}

/* cudaFreeAsync refused (not sticky), the cudaFree it falls back on meets
 * a sticky error: the device's line names cudaFree. */
static void s_fallback_sticky_named(void)
{
    cudaStream_t s = stream_new();
    void *p;
    defer_held(s, &p, 1);
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, cudaErrorNotSupported, 0, -1);
    fake_fail(FAKE_FREE, cudaErrorIllegalAddress, 0, -1);
    cudaError_t f = defer_flush();
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    CHECK(f == cudaErrorIllegalAddress, "flush: %s", EN(f));
    CHECK(strstr(msg, "device 0: cudaFree failed") != NULL,
          "the line names cudaFree, which met the error: %s", msg);
}

int main(void)
{
    plan_lazy();
    fork_scenario("cudaMalloc memory goes back with cudaFreeAsync on the "
                  "reclaimer's stream, synchronized every 8 frees and at the "
                  "pass's end: back when the flush returns", "", 1, 15000,
                  s_async);
    fork_scenario("a device without memory pools: cudaFree", "", 1, 15000,
                  s_no_pools);
    fork_scenario("two devices, one without memory pools: each its own way",
                  "", 2, 15000, s_mixed_devices);
    fork_scenario("a sticky error met by the reclaimer's synchronize of its "
                  "frees: the device fails, the flush returns it", HELD, 1,
                  15000, s_sync_sticky);
    fork_scenario("a synchronize that fails (not sticky): a later trim "
                  "synchronizes the frees again", HELD, 1, 15000,
                  s_sync_fails_then_trim);
    fork_scenario("a synchronize that keeps failing: said once", HELD, 1, 15000,
                  s_sync_fails_said_once);
    fork_scenario("cudaFreeAsync refused, its cudaFree fallback meets a sticky "
                  "error: the line names cudaFree", HELD, 1, 15000,
                  s_fallback_sticky_named);
    return 0;
}
