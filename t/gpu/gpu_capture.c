/* SPDX-License-Identifier: MIT */
/*
 * gpu_capture.c: defer calls inside a CUDA graph capture, on a real GPU.
 *
 * A kernel that writes a 256 MiB device buffer is captured together with
 * defer_free(buffer) and a defer_call; the graph is instantiated and
 * launched 5 times (about 20 ms each), synchronized, launched 5 times more;
 * then the graph and the executable graph are destroyed, the latter while
 * those launches are still running.
 * Shows that:
 *  - the defer calls on the capturing stream succeed and add no node to the
 *    graph (no event was recorded into the capture): it has one node;
 *  - nothing is released while the graph, the executable graph or any
 *    launch lives: the statistics, the callback's flag, the pointer's
 *    attributes and the device's free memory all say so;
 *  - every launch wrote the buffer (it was valid memory throughout);
 *  - once both are destroyed and the launches are done, the buffer is
 *    released and its memory comes back, and the callback runs, with every
 *    launch complete when it runs;
 *  - a graph that is destroyed without ever being instantiated releases
 *    its entry, and one whose executable graph dies first holds it until
 *    the graph dies too.
 * The user objects' destructors run asynchronously, on a CUDA thread, after
 * the work is synchronized: releases are waited for with a deadline.
 * Without a CUDA device the whole test is skipped.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "tap.h"

#define MIB ((size_t)1 << 20)
#define BUF_BYTES (256 * MIB)
#define MEM_TOLERANCE (8 * MIB) /* allocator granularity, pools, streams */
#define LAUNCHES 5
#define SPIN_NS 20000000ull     /* each launch: 20 ms, then the fill */
#define FILL 0x5a
#define RELEASE_DEADLINE_MS 5000

#define CHECK(call) check_cuda((call), #call, __LINE__)

static void check_cuda(cudaError_t err, const char *what, int line)
{
    if (err != cudaSuccess)
        bail("line %d: %s: %s", line, what, cudaGetErrorString(err));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static struct defer_stats stats_now(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    return st;
}

static size_t device_free_bytes(void)
{
    size_t free_b, total_b;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

/* 1 if p is still a live device allocation. */
static int is_device_memory(const void *p)
{
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return at.type == cudaMemoryTypeDevice;
}

/* defer_flush until released has grown by n, at most RELEASE_DEADLINE_MS
 * (the destructors run on a CUDA thread, some time after the work is
 * synchronized).  Returns how long it took, or -1. */
static double wait_released(uint64_t released_before, uint64_t n)
{
    double t0 = now_ms();
    for (;;) {
        CHECK(defer_flush());
        if (stats_now().released - released_before >= n)
            return now_ms() - t0;
        if (now_ms() - t0 > RELEASE_DEADLINE_MS)
            return -1;
        sleep_ms(1);
    }
}

/* What the callback saw. */
static atomic_int called;
static cudaError_t launches_state; /* cudaEventQuery of `launched` */
static cudaEvent_t launched;       /* recorded after the last launch */

static void on_graph_gone(void *arg)
{
    (void)arg;
    launches_state = cudaEventQuery(launched);
    atomic_store(&called, 1);
}

static size_t graph_nodes(cudaGraph_t graph)
{
    size_t n = 0;
    CHECK(cudaGraphGetNodes(graph, NULL, &n));
    return n;
}

/* The case. */
static void test_released_after_graph(cudaStream_t s)
{
    void *buf;
    CHECK(cudaMalloc(&buf, BUF_BYTES));
    CHECK(cudaMemset(buf, 0, BUF_BYTES));
    CHECK(cudaDeviceSynchronize());
    struct defer_stats before = stats_now();

    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(gpu_spin_fill(s, SPIN_NS, buf, BUF_BYTES, FILL));
    cudaError_t free_err = defer_free(buf, s);
    cudaError_t call_err = defer_call(on_graph_gone, NULL, s);
    enum cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing(s, &status));
    cudaError_t end_err = cudaStreamEndCapture(s, &graph);
    is_int(free_err, cudaSuccess, "defer_free on the capturing stream");
    is_int(call_err, cudaSuccess, "defer_call on the capturing stream");
    is_int(status, cudaStreamCaptureStatusActive,
           "the capture was not invalidated by them");
    is_int(end_err, cudaSuccess, "cudaStreamEndCapture");
    if (end_err != cudaSuccess)
        bail("no graph: cannot go on");
    is_int((long long)graph_nodes(graph), 1,
           "the graph has only the kernel's node: no event was recorded "
           "into the capture");
    struct defer_stats st = stats_now();
    is_int((long long)(st.deferred - before.deferred), 2, "2 entries deferred");

    /* Launched and synchronized with both alive: held, and the buffer was
     * valid memory for every launch. */
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < LAUNCHES; i++)
        CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    unsigned char *host = malloc(BUF_BYTES);
    if (host == NULL)
        bail("malloc");
    CHECK(cudaMemcpy(host, buf, BUF_BYTES, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < BUF_BYTES; i++)
        bad += host[i] != FILL;
    free(host);
    is_int((long long)bad, 0, "%d launches filled the buffer", LAUNCHES);
    CHECK(defer_flush());
    ok(stats_now().released == before.released && !atomic_load(&called) &&
           is_device_memory(buf),
       "launches done, graph and executable graph alive: nothing released");

    /* Launched again; the graph destroyed, then the executable graph with
     * the launches in flight. */
    size_t free_before = device_free_bytes();
    for (int i = 0; i < LAUNCHES; i++)
        CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(launched, s));
    CHECK(cudaGraphDestroy(graph));
    CHECK(defer_flush());
    ok(stats_now().released == before.released && !atomic_load(&called) &&
           is_device_memory(buf),
       "graph destroyed, executable graph alive: nothing released");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(defer_flush());
    ok(stats_now().released == before.released && !atomic_load(&called) &&
           is_device_memory(buf),
       "executable graph destroyed too: nothing released while the launches "
       "run");
    ok(cudaEventQuery(launched) == cudaErrorNotReady,
       "(the launches were still running then)");
    CHECK(cudaStreamSynchronize(s));

    double waited = wait_released(before.released, 2);
    ok(waited >= 0, "both released once the launches completed (%.1f ms after "
                    "the stream synchronized)", waited);
    ok(atomic_load(&called), "the callback ran");
    is_int(launches_state, cudaSuccess,
           "every launch had completed when it ran");
    ok(!is_device_memory(buf), "the buffer is no longer device memory");
    size_t free_after = device_free_bytes();
    ok(free_after + MEM_TOLERANCE >= free_before + BUF_BYTES,
       "device memory came back (%zu MiB more free)",
       (free_after - free_before) / MIB);
    st = stats_now();
    ok(st.pending == 0 && st.failed == before.failed,
       "nothing pending, nothing failed");
}

/* A graph destroyed without an executable graph; then an executable graph
 * destroyed before its graph. */
static void test_graph_orders(cudaStream_t s)
{
    void *a, *b;
    CHECK(cudaMalloc(&a, MIB));
    CHECK(cudaMalloc(&b, MIB));
    struct defer_stats before = stats_now();

    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(gpu_spin_fill(s, 0, a, MIB, 1));
    is_int(defer_free(a, s), cudaSuccess, "defer_free in a second capture");
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphDestroy(graph));
    ok(wait_released(before.released, 1) >= 0,
       "a graph never instantiated: released once destroyed");

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(gpu_spin_fill(s, 0, b, MIB, 2));
    is_int(defer_free(b, s), cudaSuccess, "defer_free in a third capture");
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(exec));
    sleep_ms(100);
    CHECK(defer_flush());
    ok(stats_now().released == before.released + 1 && is_device_memory(b),
       "its executable graph destroyed, the graph alive: held");
    CHECK(cudaGraphDestroy(graph));
    ok(wait_released(before.released + 1, 1) >= 0,
       "released once the graph is destroyed too");
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        skip_all("no CUDA device");
    gpu_tests_serialize();
    plan_lazy();
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&launched, cudaEventDisableTiming));

    /* Start the reclaimer outside any capture, as an application would
     * have by the time it captures. */
    void *warm;
    CHECK(cudaMalloc(&warm, MIB));
    CHECK(defer_free(warm, s));
    CHECK(defer_flush());

    test_released_after_graph(s);
    test_graph_orders(s);

    CHECK(defer_flush());
    struct defer_stats st = stats_now();
    ok(st.pending == 0 && st.deferred == st.released + st.failed &&
           st.failed == 0,
       "stats agree: deferred %llu = released %llu, none failed",
       (unsigned long long)st.deferred, (unsigned long long)st.released);
    CHECK(cudaEventDestroy(launched));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
