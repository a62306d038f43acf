/* SPDX-License-Identifier: MIT */
/* How the reclaimer gives cudaMalloc memory back (Note [Releasing without a
 * drain], src/reclaimer.c): with cudaFreeAsync on its own stream, that
 * stream synchronized after every 8 such frees and at the end of the pass,
 * so the memory is back when a flush returns; with cudaFree on a device
 * without memory pools.  Each scenario runs in a child process. */
#include "helpers.h"

enum { N = 20 };

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

/* N buffers deferred behind one work item on s; returns when all are held
 * (complete, kept by the policy) so that one flush releases them. */
static void defer_behind_work(cudaStream_t s, void **p)
{
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(1 << 20);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    CHECK(count_released(p, N) == 0, "none released while the work runs");
    fake_complete(w);
}

static void s_async(void)
{
    cudaStream_t s = stream_new();
    size_t before = device_free_bytes();
    void *p[N];
    defer_behind_work(s, p);
    struct calls c0 = calls_now();
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct calls c = calls_now();
    CHECK(count_released(p, N) == N, "all released (%d of %d)",
          count_released(p, N), N);
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
    void *p[N];
    defer_behind_work(s, p);
    struct calls c0 = calls_now();
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct calls c = calls_now();
    CHECK(count_released(p, N) == N, "all released (%d of %d)",
          count_released(p, N), N);
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
    void *p[2][N];
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        defer_behind_work(stream_new(), p[d]);
    }
    cudaSetDevice(0);
    struct calls c0 = calls_now();
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
    return 0;
}
