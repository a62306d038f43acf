/* SPDX-License-Identifier: MIT */
/*
 * gpu_multidevice.c: cudefer with two CUDA devices.
 *
 * Shows that defer_free and defer_call work on a stream of one device while
 * the calling thread's current device is the other one: every call succeeds,
 * the current device is left as it was, a callback still waits for the
 * other device's kernel, and after defer_flush all buffers are released and
 * device memory is back on both devices.  A thread with no current context
 * that frees and calls back on a device-1 stream is left with device 0's
 * context current, as a runtime call leaves it (cudefer.h's limit), and
 * cudaGetDevice still answers 0.
 * Skipped unless at least two CUDA devices are present.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "tap.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define US_NS 1000ull
#define MS_NS 1000000ull

#define DEVICES 2
#define BUFFERS 2000            /* in all, alternating between the devices */
#define BUF_BYTES (256 * KIB)
#define MEM_TOLERANCE (8 * MIB) /* see gpu_basic.c */

#define CHECK(call) check_cuda((call), #call, __LINE__)

static void check_cuda(cudaError_t err, const char *what, int line)
{
    if (err != cudaSuccess)
        bail("line %d: %s: %s", line, what, cudaGetErrorString(err));
}

static cudaStream_t streams[DEVICES];

static int current_device(void)
{
    int dev;
    CHECK(cudaGetDevice(&dev));
    return dev;
}

static size_t device_free_bytes(int dev)
{
    size_t free_b, total_b;
    int was = current_device();

    CHECK(cudaSetDevice(dev));
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(cudaSetDevice(was));
    return free_b;
}

static void noop(void *arg)
{
    (void)arg;
}

/* A stream per device, every kernel loaded, the reclaimer started. */
static void setup(void)
{
    for (int d = 0; d < DEVICES; d++) {
        void *buf;

        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&buf, BUF_BYTES));
        CHECK(gpu_spin(streams[d], US_NS));
        CHECK(gpu_spin_fill(streams[d], US_NS, buf, BUF_BYTES, 1));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaFree(buf));
    }
    CHECK(defer_call(noop, NULL, streams[0]));
    CHECK(defer_call(noop, NULL, streams[1]));
    CHECK(defer_flush());
}

/* 9 tests. */
static void test_free_on_other_device(void)
{
    size_t mem_before[DEVICES];
    struct defer_stats before, after;
    int failures = 0, moved = 0;

    for (int d = 0; d < DEVICES; d++)
        mem_before[d] = device_free_bytes(d);
    defer_stats_get(&before);

    for (int i = 0; i < BUFFERS; i++) {
        int d = i % DEVICES, other = 1 - d;
        void *buf;

        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&buf, BUF_BYTES));
        CHECK(gpu_spin_fill(streams[d], 2 * US_NS, buf, BUF_BYTES,
                            (unsigned char)i));
        CHECK(cudaSetDevice(other));
        if (defer_free(buf, streams[d]) != cudaSuccess) {
            failures++;
            CHECK(cudaSetDevice(d));
            CHECK(cudaFree(buf));
            CHECK(cudaSetDevice(other));
        }
        moved += current_device() != other;
    }

    is_int(failures, 0, "%d defer_free on a stream of the non-current "
           "device succeed", BUFFERS);
    is_int(moved, 0, "defer_free left the current device as it was");
    is_int(defer_flush(), cudaSuccess, "defer_flush returns cudaSuccess");
    defer_stats_get(&after);
    is_int((long long)(after.deferred - before.deferred), BUFFERS,
           "stats.deferred grew by %d", BUFFERS);
    is_int((long long)(after.released - before.released), BUFFERS,
           "stats.released grew by %d", BUFFERS);
    is_int((long long)after.pending, 0, "stats.pending is 0");
    is_int((long long)(after.failed - before.failed), 0,
           "stats.failed did not grow");
    for (int d = 0; d < DEVICES; d++) {
        long long missing =
            (long long)mem_before[d] - (long long)device_free_bytes(d);

        diag("device %d: %lld KiB not back", d, missing / 1024);
        ok(missing <= (long long)MEM_TOLERANCE,
           "device %d: memory back after defer_flush", d);
    }
}

struct flag_probe {
    volatile int *flag;
    atomic_int seen;
};

static void flag_probe_cb(void *arg)
{
    struct flag_probe *p = arg;

    atomic_store(&p->seen, *p->flag);
}

/* 3 tests: a callback behind a device-1 kernel, deferred from device 0. */
static void test_call_on_other_device(void)
{
    void *flag_dev;
    int *flag;
    struct flag_probe p;

    CHECK(cudaSetDevice(1));
    CHECK(cudaHostAlloc((void **)&flag, sizeof *flag,
                        cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostGetDevicePointer(&flag_dev, flag, 0));
    *flag = 0;
    p.flag = flag;
    atomic_init(&p.seen, -1);
    CHECK(gpu_spin_set_flag(streams[1], 10 * MS_NS, flag_dev, 1));
    CHECK(cudaSetDevice(0));

    is_int(defer_call(flag_probe_cb, &p, streams[1]), cudaSuccess,
           "defer_call on a device-1 stream from device 0 succeeds");
    is_int(defer_flush(), cudaSuccess, "defer_flush returns cudaSuccess");
    is_int(atomic_load(&p.seen), 1,
           "callback saw the flag the device-1 kernel wrote");
    CHECK(cudaFreeHost(flag));
}

/* What a thread with no current context saw (bare_thread). */
struct bare {
    void *buf;
    CUresult (*get_current)(CUcontext *);
    CUresult (*get_device)(CUdevice *);
    int bare_before, on_free, on_call, device_after;
    cudaError_t freed, called;
};

/* The device whose context is current; -1: none. */
static int context_device(struct bare *b)
{
    CUcontext c = NULL;
    CUdevice d = -1;
    if (b->get_current(&c) != CUDA_SUCCESS || c == NULL ||
        b->get_device(&d) != CUDA_SUCCESS)
        return -1;
    return (int)d;
}

static void *bare_thread(void *arg)
{
    struct bare *b = arg;
    b->bare_before = context_device(b) == -1;
    b->freed = defer_free(b->buf, streams[1]);
    b->on_free = context_device(b);
    b->called = defer_call(noop, NULL, streams[1]);
    b->on_call = context_device(b);
    b->device_after = -1;
    cudaGetDevice(&b->device_after);
    return NULL;
}

/* 4 tests: a thread that never chose a device frees and calls back on a
 * device-1 stream. */
static void test_bare_thread(void)
{
    struct bare b = {0};
    enum cudaDriverEntryPointQueryResult found;
    pthread_t t;

    CHECK(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent",
                                           (void **)&b.get_current, 12000,
                                           cudaEnableDefault, &found));
    CHECK(cudaGetDriverEntryPointByVersion("cuCtxGetDevice",
                                           (void **)&b.get_device, 12000,
                                           cudaEnableDefault, &found));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&b.buf, BUF_BYTES));
    CHECK(gpu_spin_fill(streams[1], 5 * MS_NS, b.buf, BUF_BYTES, 3));
    CHECK(cudaSetDevice(0));
    if (pthread_create(&t, NULL, bare_thread, &b) != 0)
        bail("pthread_create failed");
    pthread_join(t, NULL);
    ok(b.bare_before, "a new thread has no current context");
    ok(b.freed == cudaSuccess && b.called == cudaSuccess,
       "it frees and calls back on a device-1 stream (%s, %s)",
       cudaGetErrorName(b.freed), cudaGetErrorName(b.called));
    ok(b.on_free == 0 && b.on_call == 0, "leaving device 0's context "
       "current after each, as a runtime call would (%d, %d)", b.on_free,
       b.on_call);
    is_int(b.device_after, 0, "cudaGetDevice still answers 0 there");
    CHECK(defer_flush());
}

int main(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);

    if (err != cudaSuccess || count < DEVICES)
        skip_all("needs 2 CUDA devices");
    gpu_tests_serialize();

    plan(17);
    setup();
    test_free_on_other_device();  /* 9 */
    test_call_on_other_device();  /* 3 */
    test_bare_thread();           /* 4 */
    is_int(defer_shutdown(), cudaSuccess, "defer_shutdown succeeds");
    for (int d = 0; d < DEVICES; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamDestroy(streams[d]));
    }
    return 0;
}
