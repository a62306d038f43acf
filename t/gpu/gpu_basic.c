/* SPDX-License-Identifier: MIT */
/*
 * gpu_basic.c: cudefer on a real GPU.
 *
 * Shows that:
 *  - a deferred callback never runs before the stream's earlier work, and the
 *    caller of defer_call does not wait for that work;
 *  - callbacks of one stream run in order, on the reclaimer thread, and
 *    defer_flush inside a callback is refused;
 *  - a deferred buffer is held while a kernel still uses it;
 *  - 10 000 device buffers and a few hundred pinned host buffers deferred in
 *    bulk are all released by defer_flush, and device memory comes back;
 *  - cudaStreamPerThread and the legacy stream work from 8 threads at once;
 *  - a thread whose first CUDA call is a defer call (no current context)
 *    works on a created stream and on the legacy stream;
 *  - NULL arguments and calls after defer_shutdown behave as documented
 *    (after shutdown the caller still owns the pointer).
 * Without a CUDA device the whole test is skipped.
 *
 * CUDEFER_TEST_SCALE (a fraction, 0.001 .. 1; default 1) scales the bulk
 * counts (10 000 device buffers, 256 pinned buffers, 8 x 500 thread
 * iterations) down, for runs under compute-sanitizer.  make check unsets it.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "tap.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define US_NS 1000ull
#define MS_NS 1000000ull

/* How much device memory may still be missing after a flush: allocator
 * granularity, event pools, per-thread streams.  Every test that checks
 * memory releases far more than this. */
#define MEM_TOLERANCE (8 * MIB)

#define CHECK(call) check_cuda((call), #call, __LINE__)

/* CUDEFER_TEST_SCALE, read by main. */
static double test_scale = 1.0;

/* n scaled by CUDEFER_TEST_SCALE, at least 1. */
static int scaled(int n)
{
    int m = (int)(n * test_scale + 0.5);
    return m < 1 ? 1 : m;
}

static void read_test_scale(void)
{
    const char *text = getenv("CUDEFER_TEST_SCALE");
    char *end;
    double v;

    if (text == NULL || *text == '\0')
        return;
    v = strtod(text, &end);
    if (end == text || *end != '\0' || !(v >= 0.001 && v <= 1.0))
        bail("CUDEFER_TEST_SCALE=\"%s\": expected a fraction 0.001 .. 1",
             text);
    test_scale = v;
}

static void check_cuda(cudaError_t err, const char *what, int line)
{
    if (err != cudaSuccess)
        bail("line %d: %s: %s", line, what, cudaGetErrorString(err));
}

/* ---- small helpers ---------------------------------------------------- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static size_t device_free_bytes(void)
{
    size_t free_b, total_b;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

static void *device_alloc(size_t bytes)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

/* Pinned host memory the GPU can write; *dev receives its device address. */
static void *host_alloc_mapped(size_t bytes, void **dev)
{
    void *h = NULL;
    CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(dev, h, 0));
    return h;
}

static struct defer_stats stats_now(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    return st;
}

static long long delta(uint64_t after, uint64_t before)
{
    return (long long)(after - before);
}

/* Four tests: n more accepted, n more released, none pending, none failed. */
static void check_all_released(const struct defer_stats *before, uint64_t n,
                               const char *what)
{
    struct defer_stats after = stats_now();

    is_int(delta(after.deferred, before->deferred), (long long)n,
           "%s: stats.deferred grew by %llu", what, (unsigned long long)n);
    is_int(delta(after.released, before->released), (long long)n,
           "%s: stats.released grew by %llu", what, (unsigned long long)n);
    is_int((long long)after.pending, 0, "%s: stats.pending is 0", what);
    is_int(delta(after.failed, before->failed), 0,
           "%s: stats.failed did not grow", what);
    diag("%s: batches +%lld, largest batch %llu, events created %llu, "
         "sync releases +%lld", what, delta(after.batches, before->batches),
         (unsigned long long)after.largest_batch,
         (unsigned long long)after.events_created,
         delta(after.sync_releases, before->sync_releases));
}

/* One test: free device memory is back to (near) before. */
static void check_memory_back(size_t before, const char *what)
{
    long long missing = (long long)before - (long long)device_free_bytes();

    diag("%s: %lld KiB of device memory not back", what, missing / 1024);
    ok(missing <= (long long)MEM_TOLERANCE,
       "%s: device memory back after defer_flush", what);
}

/* One test: defer_flush succeeds; the time it took goes to diag. */
static void flush_ok(const char *what)
{
    double t0 = now_us();
    cudaError_t err = defer_flush();

    diag("%s: defer_flush took %.0f us", what, now_us() - t0);
    is_int(err, cudaSuccess, "%s: defer_flush returns cudaSuccess", what);
}

static void noop(void *arg)
{
    (void)arg;
}

/* Load every kernel (lazy module loading allocates device memory) and start
 * the reclaimer, so that later memory baselines are not disturbed. */
static void warm_up(cudaStream_t s)
{
    void *flag_dev;
    int *flag = host_alloc_mapped(sizeof *flag, &flag_dev);
    void *buf = device_alloc(64 * KIB);

    CHECK(gpu_spin(s, US_NS));
    CHECK(gpu_spin_fill(s, US_NS, buf, 64 * KIB, 1));
    CHECK(gpu_spin_set_flag(s, US_NS, flag_dev, 1));
    CHECK(gpu_spin(cudaStreamPerThread, US_NS));
    CHECK(gpu_spin(0, US_NS));
    CHECK(cudaDeviceSynchronize());
    CHECK(defer_free(buf, s));
    CHECK(defer_call(noop, NULL, s));
    CHECK(defer_flush());
    CHECK(cudaFreeHost(flag));
}

/* ---- tests ------------------------------------------------------------ */

static void test_version(void)
{
    const char *v = defer_version();

    ok(v != NULL && v[0] != '\0', "defer_version returns a version string");
    diag("cudefer version %s", v ? v : "(null)");
}

struct flag_probe {
    volatile int *flag;     /* written 1 by the kernel */
    pthread_t caller;
    atomic_int runs;
    atomic_int seen;        /* *flag as the callback saw it */
    atomic_int on_caller;   /* callback ran on the caller's thread */
};

static void flag_probe_cb(void *arg)
{
    struct flag_probe *p = arg;

    atomic_store(&p->seen, *p->flag);
    atomic_store(&p->on_caller, pthread_equal(pthread_self(), p->caller));
    atomic_fetch_add(&p->runs, 1);
}

/* 7 tests. */
static void test_callback_waits_for_stream(cudaStream_t s)
{
    void *flag_dev;
    int *flag = host_alloc_mapped(sizeof *flag, &flag_dev);
    struct flag_probe p = { .flag = flag, .caller = pthread_self() };
    double t0, took;
    int flag_then, runs_then;
    cudaError_t err;

    *flag = 0;
    CHECK(gpu_spin_set_flag(s, 10 * MS_NS, flag_dev, 1));
    t0 = now_us();
    err = defer_call(flag_probe_cb, &p, s);
    took = now_us() - t0;
    flag_then = *p.flag;
    runs_then = atomic_load(&p.runs);
    diag("defer_call behind a 10 ms kernel returned after %.1f us", took);

    is_int(err, cudaSuccess, "defer_call behind a 10 ms kernel succeeds");
    is_int(flag_then, 0, "caller did not wait: flag not yet set when "
           "defer_call returned");
    is_int(runs_then, 0, "callback not run while the kernel still spins");
    flush_ok("flag callback");
    is_int(atomic_load(&p.runs), 1, "callback ran exactly once");
    is_int(atomic_load(&p.seen), 1, "callback saw the flag the kernel wrote");
    ok(!atomic_load(&p.on_caller), "callback ran on another thread than "
       "the caller");
    CHECK(cudaFreeHost(flag));
}

#define ORDER_CALLS 16

struct order_log {
    atomic_int count;
    int order[ORDER_CALLS];
    atomic_int flush_in_cb;  /* what defer_flush returned inside a callback */
};

struct order_slot {
    struct order_log *log;
    int index;
};

static void order_cb(void *arg)
{
    struct order_slot *slot = arg;
    int n = atomic_fetch_add(&slot->log->count, 1);

    if (n < ORDER_CALLS)
        slot->log->order[n] = slot->index;
}

static void flush_inside_cb(void *arg)
{
    struct order_log *log = arg;

    atomic_store(&log->flush_in_cb, (int)defer_flush());
}

static int order_is_ascending(const struct order_log *log)
{
    for (int i = 0; i < ORDER_CALLS; i++)
        if (log->order[i] != i)
            return 0;
    return 1;
}

/* 5 tests. */
static void test_callback_order(cudaStream_t s)
{
    struct order_log log = { .flush_in_cb = -1 };
    struct order_slot slots[ORDER_CALLS];
    int failures = 0;

    for (int i = 0; i < ORDER_CALLS; i++) {
        slots[i] = (struct order_slot){ .log = &log, .index = i };
        CHECK(gpu_spin(s, 200 * US_NS));
        failures += defer_call(order_cb, &slots[i], s) != cudaSuccess;
    }
    failures += defer_call(flush_inside_cb, &log, s) != cudaSuccess;

    is_int(failures, 0, "%d defer_call on one stream succeed",
           ORDER_CALLS + 1);
    flush_ok("ordered callbacks");
    is_int(atomic_load(&log.count), ORDER_CALLS, "all %d callbacks ran",
           ORDER_CALLS);
    ok(order_is_ascending(&log), "callbacks of one stream ran in the order "
       "they were deferred");
    is_int(atomic_load(&log.flush_in_cb), cudaErrorNotPermitted,
           "defer_flush inside a callback returns cudaErrorNotPermitted");
}

/* 9 tests. */
static void test_free_not_early(cudaStream_t s)
{
    const size_t bytes = 64 * MIB;
    size_t mem_before = device_free_bytes();
    void *buf = device_alloc(bytes);
    struct defer_stats before, during;
    long long held;
    cudaError_t err;

    CHECK(gpu_spin_fill(s, 20 * MS_NS, buf, bytes, 7));
    before = stats_now();
    err = defer_free(buf, s);
    during = stats_now();
    held = (long long)mem_before - (long long)device_free_bytes();

    is_int(err, cudaSuccess, "defer_free behind a 20 ms kernel succeeds");
    diag("right after defer_free: deferred +%lld, released +%lld, "
         "pending %llu", delta(during.deferred, before.deferred),
         delta(during.released, before.released),
         (unsigned long long)during.pending);
    ok(during.deferred == before.deferred + 1 &&
       during.released == before.released,
       "buffer accepted but not released while the kernel still runs");
    ok(held >= (long long)(bytes - MEM_TOLERANCE), "its %zu MiB are still "
       "held while the kernel runs (%lld KiB held)", bytes / MIB,
       held / 1024);
    flush_ok("64 MiB buffer");
    check_all_released(&before, 1, "64 MiB buffer");
    check_memory_back(mem_before, "64 MiB buffer");
}

#define MANY_BUFFERS scaled(10000)
#define MANY_BYTES (64 * KIB)

/* 7 tests. */
static void test_many_device_buffers(cudaStream_t s)
{
    size_t mem_before = device_free_bytes();
    struct defer_stats before = stats_now();
    int failures = 0;
    double t0 = now_us();
    char what[64];

    snprintf(what, sizeof what, "%d device buffers", MANY_BUFFERS);
    for (int i = 0; i < MANY_BUFFERS; i++) {
        void *buf = device_alloc(MANY_BYTES);

        CHECK(gpu_spin_fill(s, 1 * US_NS, buf, MANY_BYTES,
                            (unsigned char)i));
        if (defer_free(buf, s) != cudaSuccess) {
            failures++;
            CHECK(cudaFree(buf));
        }
    }
    diag("%d x {cudaMalloc, kernel, defer_free} took %.0f us", MANY_BUFFERS,
         now_us() - t0);

    is_int(failures, 0, "%d defer_free of device buffers succeed",
           MANY_BUFFERS);
    flush_ok(what);
    check_all_released(&before, MANY_BUFFERS, what);
    check_memory_back(mem_before, what);
}

#define HOST_BUFFERS scaled(256)
#define HOST_BYTES (256 * KIB)

/* 6 tests. */
static void test_host_buffers(cudaStream_t s)
{
    struct defer_stats before = stats_now();
    int failures = 0;

    for (int i = 0; i < HOST_BUFFERS; i++) {
        void *dev;
        void *host = host_alloc_mapped(HOST_BYTES, &dev);

        CHECK(gpu_spin_fill(s, 10 * US_NS, dev, HOST_BYTES,
                            (unsigned char)i));
        if (defer_free_host(host, s) != cudaSuccess) {
            failures++;
            CHECK(cudaFreeHost(host));
        }
    }

    is_int(failures, 0, "%d defer_free_host of pinned buffers succeed",
           HOST_BUFFERS);
    flush_ok("pinned host buffers");
    check_all_released(&before, HOST_BUFFERS, "pinned host buffers");
}

#define THREADS 8
#define THREAD_ITERS scaled(500)
#define THREAD_BYTES (256 * KIB)

struct worker {
    pthread_t thread;
    cudaStream_t stream;  /* cudaStreamPerThread or 0 (legacy) */
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;

    for (int i = 0; i < THREAD_ITERS; i++) {
        void *buf = device_alloc(THREAD_BYTES);

        CHECK(gpu_spin_fill(w->stream, 2 * US_NS, buf, THREAD_BYTES,
                            (unsigned char)i));
        if (defer_free(buf, w->stream) != cudaSuccess) {
            w->failures++;
            CHECK(cudaFree(buf));
        }
    }
    return NULL;
}

/* 7 tests. */
static void test_default_streams_from_threads(void)
{
    struct worker workers[THREADS];
    size_t mem_before = device_free_bytes();
    struct defer_stats before = stats_now();
    int failures = 0;

    for (int i = 0; i < THREADS; i++) {
        workers[i] = (struct worker){
            .stream = i % 2 ? cudaStreamPerThread : (cudaStream_t)0,
        };
        if (pthread_create(&workers[i].thread, NULL, worker_main,
                           &workers[i]) != 0)
            bail("pthread_create failed");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(workers[i].thread, NULL);
        failures += workers[i].failures;
    }

    is_int(failures, 0, "%d threads x %d defer_free on cudaStreamPerThread "
           "and the legacy stream succeed", THREADS, THREAD_ITERS);
    flush_ok("default streams");
    check_all_released(&before, THREADS * THREAD_ITERS, "default streams");
    check_memory_back(mem_before, "default streams");
}

struct first_caller {
    void *on_created, *on_legacy;
    cudaStream_t created;
    cudaError_t err_created, err_legacy;
};

/* A thread that has made no CUDA call: its first is a defer_free on a
 * created stream, then one on the legacy stream.  It has no current
 * context: where the driver's calls answer so, the runtime's are made,
 * which make device 0's primary context current, as the thread's own
 * first runtime call would; nothing here tells which answered. */
static void *first_caller_main(void *arg)
{
    struct first_caller *f = arg;
    f->err_created = defer_free(f->on_created, f->created);
    f->err_legacy = defer_free(f->on_legacy, 0);
    return NULL;
}

/* 7 tests. */
static void test_first_call_on_fresh_thread(cudaStream_t s)
{
    const size_t bytes = 16 * MIB;
    struct first_caller f = {.on_created = device_alloc(bytes),
                             .on_legacy = device_alloc(bytes), .created = s};
    CHECK(gpu_spin_fill(s, 200 * MS_NS, f.on_created, bytes, 3));
    CHECK(gpu_spin_fill(0, 200 * MS_NS, f.on_legacy, bytes, 4));
    struct defer_stats before = stats_now();
    pthread_t t;
    if (pthread_create(&t, NULL, first_caller_main, &f) != 0)
        bail("pthread_create failed");
    pthread_join(t, NULL);
    struct defer_stats during = stats_now();
    ok(f.err_created == cudaSuccess && f.err_legacy == cudaSuccess,
       "a fresh thread's first CUDA calls, defer_free on a created stream and "
       "on the legacy stream, succeed (%s, %s)",
       cudaGetErrorName(f.err_created), cudaGetErrorName(f.err_legacy));
    ok(during.released == before.released,
       "neither released while the 200 ms kernels run");
    flush_ok("a fresh thread's frees");
    check_all_released(&before, 2, "a fresh thread's frees");
}

/* 4 tests. */
static void test_null_arguments(cudaStream_t s)
{
    struct defer_stats before = stats_now();

    is_int(defer_free(NULL, s), cudaSuccess, "defer_free(NULL) succeeds");
    is_int(defer_free_host(NULL, s), cudaSuccess,
           "defer_free_host(NULL) succeeds");
    is_int(delta(stats_now().deferred, before.deferred), 0,
           "NULL pointers queue nothing");
    is_int(defer_call(NULL, NULL, s), cudaErrorInvalidValue,
           "defer_call(NULL fn) returns cudaErrorInvalidValue");
}

/* 9 tests. */
static void test_shutdown(cudaStream_t s)
{
    void *buf = device_alloc(MIB);
    void *dev;
    void *host = host_alloc_mapped(64 * KIB, &dev);
    struct defer_stats before;

    is_int(defer_shutdown(), cudaSuccess, "defer_shutdown succeeds");
    is_int(defer_shutdown(), cudaSuccess, "a second defer_shutdown succeeds");

    before = stats_now();
    is_int(defer_free(buf, s), cudaErrorNotPermitted,
           "defer_free after shutdown returns cudaErrorNotPermitted");
    is_int(cudaFree(buf), cudaSuccess, "the caller still owns that buffer: "
           "cudaFree succeeds");
    is_int(defer_free_host(host, s), cudaErrorNotPermitted,
           "defer_free_host after shutdown returns cudaErrorNotPermitted");
    is_int(cudaFreeHost(host), cudaSuccess, "the caller still owns that "
           "host buffer: cudaFreeHost succeeds");
    is_int(defer_call(noop, NULL, s), cudaErrorNotPermitted,
           "defer_call after shutdown returns cudaErrorNotPermitted");
    is_int(delta(stats_now().rejected, before.rejected), 3,
           "the three refused calls are counted in stats.rejected");
    is_int(defer_flush(), cudaErrorNotPermitted,
           "defer_flush after shutdown returns cudaErrorNotPermitted");
}

int main(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    cudaStream_t s;

    if (err != cudaSuccess || count == 0)
        skip_all("no CUDA device");
    gpu_tests_serialize();
    read_test_scale();

    plan(62);
    if (test_scale != 1.0)
        diag("CUDEFER_TEST_SCALE=%g: %d device buffers, %d pinned buffers, "
             "%d iterations per thread", test_scale, MANY_BUFFERS,
             HOST_BUFFERS, THREAD_ITERS);
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    warm_up(s);

    test_version();                     /* 1 */
    test_callback_waits_for_stream(s);  /* 7 */
    test_callback_order(s);             /* 5 */
    test_free_not_early(s);             /* 9 */
    test_many_device_buffers(s);        /* 7 */
    test_host_buffers(s);               /* 6 */
    test_default_streams_from_threads(); /* 7 */
    test_first_call_on_fresh_thread(s); /* 7 */
    test_null_arguments(s);             /* 4 */
    test_shutdown(s);                   /* 9 */

    CHECK(cudaStreamDestroy(s));
    return 0;
}
