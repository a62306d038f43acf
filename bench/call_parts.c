/* SPDX-License-Identifier: MIT */
/*
 * bench-call-parts: the parts of the launching thread's call.  Each part is one call, timed alone, --calls times in a row on one
 * stream, after 64 untimed calls: the CUDA calls a defer call may make
 * (cudaStreamIsCapturing, cudaStreamGetDevice, cudaStreamGetId,
 * cudaGetDevice, cudaEventCreateWithFlags (what a call pays when no pooled
 * event is idle, as in W6), cudaEventRecord of a pooled event; the driver
 * API's own capture check, current device, event creation and record, to
 * tell the runtime wrappers' share (drv_*); and a thread's own query of its
 * stream's newest event as the library makes it when it finds no idle
 * event (own_query: the relaxed capture mode, cudaEventQuery, the mode
 * back; on a busy stream the not-ready error cleared too)), the clock alone
 * (the floor of every timing), defer_free of a cudaMalloc buffer (W5's
 * call), defer_call, and round robin over 16 streams (W6's pattern, one
 * thread) cudaEventRecord and defer_call; then the allocator pairs, each
 * pair timed as a whole and by halves: defer_alloc + defer_free against
 * cudaMallocAsync + cudaFreeAsync, 1 MiB.  Every part runs on a created
 * (non-blocking) stream and on stream 0 (the legacy stream: what PyTorch
 * passes).
 *   idle  the stream has no work;
 *   busy  a 2 s gpu_spin is queued on the stream first (held: still running
 *         after the last part, so every part saw a busy stream).
 * The library's own work is estimated from the medians: defer_free's p50
 * minus those of the two calls it makes, plus the clock's (each median
 * holds one clock reading; the difference holds none): the driver's
 * cuStreamIsCapturing and cuEventRecord, which cudefer makes by default
 * (src/cuda.h), or the runtime's under CUDEFER_DRIVER_CALLS=0.  One
 * (mode, repetition) per process, one JSON object on stdout: keys
 * STREAM_PART_p50_us / _p99_us / _mean_us, STREAM is created or legacy.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "bench_common.h"
#include "cudefer.h"
#include "gpu_kernels.h"

#define BUF_BYTES    ((size_t)1 << 20)
#define BUSY_NS      2000000000ull  /* busy: a 2 s gpu_spin first */
#define WARMUP_CALLS 64
#define EVENTS       4096           /* recorded in turn, as a pool would */
#define RR_STREAMS   16             /* W6: each thread's streams */

static const char usage[] =
    "--workload W5-parts --strategy idle|busy [--label NAME] [--rep N]\n"
    "       [--calls N] | --info\n";

/* One stream under test and what its parts need. */
struct bench_stream {
    const char *name;      /* "created" or "legacy" */
    cudaStream_t stream;
    cudaStream_t rr[RR_STREAMS]; /* the round robin (created streams) */
    cudaEvent_t *events;   /* EVENTS, for cudaEventRecord */
    cudaEvent_t *made;     /* calls + WARMUP_CALLS, by cudaEventCreate */
    void **bufs;           /* calls + WARMUP_CALLS cudaMalloc buffers */
};

/* What a part does once: call number i; returns the call's status. */
typedef cudaError_t (*part_fn)(struct bench_stream *s, size_t i);

static cudaError_t part_clock(struct bench_stream *s, size_t i)
{
    (void)s, (void)i;
    return cudaSuccess;
}

static cudaError_t part_is_capturing(struct bench_stream *s, size_t i)
{
    enum cudaStreamCaptureStatus st;
    (void)i;
    return cudaStreamIsCapturing(s->stream, &st);
}

static cudaError_t part_stream_get_device(struct bench_stream *s, size_t i)
{
    int d;
    (void)i;
    return cudaStreamGetDevice(s->stream, &d);
}

static cudaError_t part_stream_get_id(struct bench_stream *s, size_t i)
{
    unsigned long long id;
    (void)i;
    return cudaStreamGetId(s->stream, &id);
}

static cudaError_t part_get_device(struct bench_stream *s, size_t i)
{
    int d;
    (void)s, (void)i;
    return cudaGetDevice(&d);
}

static cudaError_t part_event_create(struct bench_stream *s, size_t i)
{
    return cudaEventCreateWithFlags(&s->made[i], cudaEventDisableTiming);
}

static cudaError_t part_event_record(struct bench_stream *s, size_t i)
{
    return cudaEventRecord(s->events[i % EVENTS], s->stream);
}

/* As stream_lane.c's newest_done_now: an event recorded earlier on the
 * stream (complete when it is idle, not when it is busy). */
static cudaError_t part_own_query(struct bench_stream *s, size_t i)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess)
        return err;
    cudaError_t q = cudaEventQuery(s->events[i % EVENTS]);
    if ((err = cudaThreadExchangeStreamCaptureMode(&mode)) != cudaSuccess)
        return err;
    if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
        cudaGetLastError();
    return q == cudaErrorNotReady ? cudaSuccess : q;
}

/* The driver API's own versions of the capture check, the current
 * device, the event creation and the record (cudaGetDriverEntryPoint,
 * the runtime's default stream semantics): what the runtime's wrappers
 * add to each. */
typedef CUresult (*cu_is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*cu_ctx_get_device_fn)(CUdevice *);
typedef CUresult (*cu_event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*cu_event_record_fn)(CUevent, CUstream);
static cu_is_capturing_fn cu_is_capturing;
static cu_ctx_get_device_fn cu_ctx_get_device;
static cu_event_create_fn cu_event_create;
static cu_event_record_fn cu_event_record;

static void *driver_entry(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st;
    CK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault,
                                        &st));
    if (st != cudaDriverEntryPointSuccess || fn == NULL)
        bench_die("no driver entry point %s", name);
    return fn;
}

static void driver_entries(void)
{
    cu_is_capturing = (cu_is_capturing_fn)driver_entry("cuStreamIsCapturing");
    cu_ctx_get_device = (cu_ctx_get_device_fn)driver_entry("cuCtxGetDevice");
    cu_event_create = (cu_event_create_fn)driver_entry("cuEventCreate");
    cu_event_record = (cu_event_record_fn)driver_entry("cuEventRecord");
}

static cudaError_t driver_status(CUresult r)
{
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

static cudaError_t part_drv_is_capturing(struct bench_stream *s, size_t i)
{
    CUstreamCaptureStatus st;
    (void)i;
    return driver_status(cu_is_capturing((CUstream)s->stream, &st));
}

static cudaError_t part_drv_get_device(struct bench_stream *s, size_t i)
{
    CUdevice d;
    (void)s, (void)i;
    return driver_status(cu_ctx_get_device(&d));
}

static cudaError_t part_drv_event_create(struct bench_stream *s, size_t i)
{
    return driver_status(cu_event_create((CUevent *)&s->made[i],
                                         CU_EVENT_DISABLE_TIMING));
}

static cudaError_t part_drv_event_record(struct bench_stream *s, size_t i)
{
    return driver_status(cu_event_record((CUevent)s->events[i % EVENTS],
                                         (CUstream)s->stream));
}

static cudaError_t part_defer_free(struct bench_stream *s, size_t i)
{
    return defer_free(s->bufs[i], s->stream);
}

static void noop(void *arg)
{
    (void)arg;
}

static cudaError_t part_defer_call(struct bench_stream *s, size_t i)
{
    (void)i;
    return defer_call(noop, NULL, s->stream);
}

static cudaError_t part_event_record_rr(struct bench_stream *s, size_t i)
{
    return cudaEventRecord(s->events[i % EVENTS], s->rr[i % RR_STREAMS]);
}

static cudaError_t part_defer_call_rr(struct bench_stream *s, size_t i)
{
    return defer_call(noop, NULL, s->rr[i % RR_STREAMS]);
}

/* Write STREAM_PART_p50_us, _p99_us and _mean_us of n sorted timings; the
 * p50 in us is returned. */
static double put(const char *stream, const char *part, uint64_t *lat,
                  size_t n)
{
    char key[128];
    bench_sort_u64(lat, n);
    snprintf(key, sizeof key, "%s_%s_p50_us", stream, part);
    json_num(key, bench_pct_us(lat, n, 50));
    snprintf(key, sizeof key, "%s_%s_p99_us", stream, part);
    json_num(key, bench_pct_us(lat, n, 99));
    snprintf(key, sizeof key, "%s_%s_mean_us", stream, part);
    json_num(key, bench_mean_us(lat, n));
    return bench_pct_us(lat, n, 50);
}

/* Run part n times, each call timed alone (after warm-up calls numbered
 * from n on), and write its keys; its p50 in us. */
static double time_part(struct bench_stream *s, const char *part, part_fn fn,
                        uint64_t *lat, size_t n)
{
    for (size_t i = 0; i < WARMUP_CALLS; i++) {
        cudaError_t rc = fn(s, n + i);
        if (rc != cudaSuccess)
            bench_die("%s %s (warm-up): %s", s->name, part,
                      cudaGetErrorString(rc));
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t a = bench_now_ns();
        cudaError_t rc = fn(s, i);
        lat[i] = bench_now_ns() - a;
        if (rc != cudaSuccess)
            bench_die("%s %s: %s", s->name, part, cudaGetErrorString(rc));
    }
    return put(s->name, part, lat, n);
}

/* The allocator pairs: n times {allocate 1 MiB, free it} on s's stream,
 * timed by halves; cudefer's (defer_alloc, defer_free) or the stream-ordered
 * allocator's (cudaMallocAsync, cudaFreeAsync). */
static void time_pair(struct bench_stream *s, int library, uint64_t *lat,
                      size_t n)
{
    const char *names[3] = {library ? "pair_defer" : "pair_async",
                            library ? "pair_defer_alloc" : "pair_malloc_async",
                            library ? "pair_defer_free" : "pair_free_async"};
    uint64_t *alloc_lat = bench_calloc(n, sizeof *alloc_lat);
    uint64_t *free_lat = bench_calloc(n, sizeof *free_lat);
    for (size_t i = 0; i < n + WARMUP_CALLS; i++) {
        void *p = NULL;
        uint64_t a = bench_now_ns();
        cudaError_t rc = library ? defer_alloc(&p, BUF_BYTES, s->stream)
                                 : cudaMallocAsync(&p, BUF_BYTES, s->stream);
        uint64_t b = bench_now_ns();
        if (rc == cudaSuccess)
            rc = library ? defer_free(p, s->stream) : cudaFreeAsync(p, s->stream);
        uint64_t c = bench_now_ns();
        if (rc != cudaSuccess)
            bench_die("%s %s: %s", s->name, names[0], cudaGetErrorString(rc));
        if (i < WARMUP_CALLS)
            continue;
        lat[i - WARMUP_CALLS] = c - a;
        alloc_lat[i - WARMUP_CALLS] = b - a;
        free_lat[i - WARMUP_CALLS] = c - b;
    }
    put(s->name, names[0], lat, n);
    put(s->name, names[1], alloc_lat, n);
    put(s->name, names[2], free_lat, n);
    free(alloc_lat);
    free(free_lat);
}

/* Every part on s; its buffers are allocated before (and, busy, the spin
 * queued after) so that no allocation falls inside a timed part. */
static void run_stream(struct bench_stream *s, int busy, size_t n,
                       uint64_t *lat, double *held)
{
    size_t nbufs = n + WARMUP_CALLS;
    s->events = bench_calloc(EVENTS, sizeof *s->events);
    s->bufs = bench_calloc(nbufs, sizeof *s->bufs);
    s->made = bench_calloc(nbufs, sizeof *s->made);
    for (size_t i = 0; i < EVENTS; i++)
        CK(cudaEventCreateWithFlags(&s->events[i], cudaEventDisableTiming));
    for (size_t i = 0; i < RR_STREAMS; i++)
        CK(cudaStreamCreateWithFlags(&s->rr[i], cudaStreamNonBlocking));
    for (size_t i = 0; i < nbufs; i++)
        CK(cudaMalloc(&s->bufs[i], BUF_BYTES));
    CK(cudaDeviceSynchronize());
    if (busy) {
        CK(gpu_spin(s->stream, BUSY_NS));
        for (size_t i = 0; i < RR_STREAMS; i++)
            CK(gpu_spin(s->rr[i], BUSY_NS));
    }

    double clock = time_part(s, "clock", part_clock, lat, n);
    double capturing = time_part(s, "is_capturing", part_is_capturing, lat, n);
    const char *drv = getenv("CUDEFER_DRIVER_CALLS");
    bool driver = drv == NULL || strcmp(drv, "0") != 0;
    time_part(s, "stream_get_device", part_stream_get_device, lat, n);
    time_part(s, "stream_get_id", part_stream_get_id, lat, n);
    time_part(s, "get_device", part_get_device, lat, n);
    time_part(s, "event_create", part_event_create, lat, n);
    double record = time_part(s, "event_record", part_event_record, lat, n);
    double drv_capturing =
        time_part(s, "drv_is_capturing", part_drv_is_capturing, lat, n);
    time_part(s, "drv_get_device", part_drv_get_device, lat, n);
    for (size_t i = 0; i < n + WARMUP_CALLS; i++) /* made again below */
        CK(cudaEventDestroy(s->made[i]));
    time_part(s, "drv_event_create", part_drv_event_create, lat, n);
    double drv_record =
        time_part(s, "drv_event_record", part_drv_event_record, lat, n);
    time_part(s, "own_query", part_own_query, lat, n);
    double freeing = time_part(s, "defer_free", part_defer_free, lat, n);
    time_part(s, "defer_call", part_defer_call, lat, n);
    time_part(s, "event_record_rr16", part_event_record_rr, lat, n);
    time_part(s, "defer_call_rr16", part_defer_call_rr, lat, n);
    time_pair(s, 1, lat, n);
    time_pair(s, 0, lat, n);
    char key[128];
    snprintf(key, sizeof key, "%s_defer_free_own_p50_us", s->name);
    json_num(key, freeing + clock - (driver ? drv_capturing + drv_record
                                            : capturing + record));

    if (busy) { /* was every part timed against a busy stream? */
        cudaError_t q = cudaStreamQuery(s->stream);
        cudaGetLastError(); /* a not-ready query must not linger */
        if (q != cudaErrorNotReady)
            *held = 0.0;
    }
    CK(cudaDeviceSynchronize());
    CK(defer_flush());
    for (size_t i = 0; i < EVENTS; i++)
        CK(cudaEventDestroy(s->events[i]));
    for (size_t i = 0; i < nbufs; i++)
        CK(cudaEventDestroy(s->made[i]));
    free(s->made);
    for (size_t i = 0; i < RR_STREAMS; i++)
        CK(cudaStreamDestroy(s->rr[i]));
    free(s->events);
    free(s->bufs); /* every buffer went to defer_free */
}

int main(int argc, char **argv)
{
    struct bench_args a;
    bench_parse_args(argc, argv, "bench-call-parts", usage, &a);
    if (strcmp(a.workload, "W5-parts") != 0)
        bench_die("unknown workload '%s' (W5-parts)", a.workload);
    if (strcmp(a.strategy, "idle") != 0 && strcmp(a.strategy, "busy") != 0)
        bench_die("W5-parts runs idle or busy, not %s", a.strategy);
    int busy = strcmp(a.strategy, "busy") == 0;
    size_t n = (size_t)a.calls;
    bench_cuda_init();
    driver_entries();
    uint64_t *lat = bench_calloc(n, sizeof *lat);
    struct bench_stream created = {.name = "created"};
    struct bench_stream legacy = {.name = "legacy", .stream = 0};
    CK(cudaStreamCreateWithFlags(&created.stream, cudaStreamNonBlocking));
    double held = busy ? 1.0 : NAN;

    json_begin();
    bench_json_head(&a);
    json_num("calls", (double)n);
    json_num("buf_bytes", (double)BUF_BYTES);
    run_stream(&created, busy, n, lat, &held);
    run_stream(&legacy, busy, n, lat, &held);
    json_num("busy_held", held);
    json_end();

    CK(cudaStreamDestroy(created.stream));
    free(lat);
    return bench_finish(1);
}
