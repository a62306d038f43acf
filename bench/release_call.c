/* SPDX-License-Identifier: MIT */
/*
 * bench-release-call: workload W5, the cost of the release call alone.
 * N buffers of 1 MiB are allocated first; then each release call (cudaFree,
 * cudaFreeAsync, naive_free or defer_free) is timed by itself.  W5-idle: the
 * stream is idle.  W5-busy: a 200 ms kernel is queued first, so the calls
 * see a busy stream; its process runs the idle phase first, untimed, so
 * that it finds the library in the state the idle phase leaves (as when both
 * phases ran in one process).  W5-idle-primed (a diagnostic, not in
 * run.py's table): the idle phase after an untimed one, so that it finds
 * the library's pools of entries and events as a first phase leaves them
 * (whether the events a cold phase makes on the calling thread are what
 * sets defer_free's 99th percentile).  W5-busy-trim (a diagnostic too):
 * W5-busy (cudefer only), then one defer_trim(NULL) timed while the kernel still runs,
 * every free behind it (busy_trim_*: the cost of the trim's walk behind
 * incomplete stream heads; its queries count in queries_per_release).  One
 * phase per process, one JSON object.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_common.h"
#include "cudefer.h"
#include "gpu_kernels.h"

#define BUF_BYTES     ((size_t)1 << 20)
#define BUSY_NS       200000000ull   /* W5-busy: a 200 ms gpu_spin first */
#define WARMUP_CALLS  64
#define NAIVE_POLL_US 50
#define SLOW_NS       2000        /* a slow call, for the gaps between them */
#define MAX_GAP       256

enum strategy { S_INLINE_FREE, S_INLINE_ASYNC, S_NAIVE, S_CUDEFER, S_N };

static const char *const strategy_names[S_N] = {
    "inline-cudaFree", "inline-async", "naive-reclaimer", "cudefer",
};

static const char usage[] =
    "--workload W5-idle|W5-busy|W5-idle-primed|W5-busy-trim --strategy S\n"
    "       [--label NAME] [--rep N] [--calls N] | --info\n"
    "  strategies: inline-cudaFree, inline-async, naive-reclaimer, cudefer\n";

struct run {
    enum strategy strategy;
    struct naive_reclaimer *nr;
    cudaStream_t stream;
    void **ptrs;
    uint64_t *lat;
};

/* W5-busy, cudefer: a defer_trim(NULL) while every free waits behind the
 * kernel, timed.  Its pass queries the entries behind each incomplete
 * stream head (one query an event) and finds nothing to release: the cost
 * of that walk.  held_after: whether the kernel still ran when it
 * returned (else the trim released what the kernel's end freed). */
struct busy_trim {
    double ms, queries, released, held_after;
};
static const struct busy_trim NO_TRIM = { NAN, NAN, NAN, NAN };

/* Main thread, W5-busy-trim (cudefer only).  Blocks for the trim. */
static struct busy_trim trim_behind_busy(struct run *r)
{
    struct busy_trim t;
    struct defer_stats a, b;
    uint64_t t0, t1;
    cudaError_t q;

    defer_stats_get(&a);
    t0 = bench_now_ns();
    CK(defer_trim(NULL));
    t1 = bench_now_ns();
    defer_stats_get(&b);
    q = cudaStreamQuery(r->stream);
    cudaGetLastError();    /* a not-ready query must not linger */
    t.ms = (double)(t1 - t0) / 1e6;
    t.queries = (double)(b.event_queries - a.event_queries);
    t.released = (double)(b.released - a.released);
    t.held_after = q == cudaErrorNotReady ? 1.0 : 0.0;
    return t;
}

static cudaError_t alloc_buf(struct run *r, void **p)
{
    if (r->strategy == S_INLINE_ASYNC)
        return cudaMallocAsync(p, BUF_BYTES, r->stream);
    return cudaMalloc(p, BUF_BYTES);
}

static cudaError_t release_buf(struct run *r, void *p)
{
    switch (r->strategy) {
    case S_INLINE_FREE:
        return cudaFree(p);
    case S_INLINE_ASYNC:
        return cudaFreeAsync(p, r->stream);
    case S_NAIVE:
        return naive_free(r->nr, p, r->stream);
    case S_CUDEFER:
        return defer_free(p, r->stream);
    default:
        return cudaErrorInvalidValue;
    }
}

static void release_all(struct run *r)
{
    if (r->strategy == S_CUDEFER)
        CK(defer_flush());
    else if (r->strategy == S_NAIVE)
        naive_drain(r->nr);
}

static void snap(struct run *r, struct bench_snap *s, struct bench_cpu *c)
{
    if (r->strategy == S_CUDEFER) {
        bench_snap_cudefer(s);
        *c = bench_cpu_cudefer();
    } else if (r->strategy == S_NAIVE) {
        bench_snap_naive(r->nr, s);
        *c = bench_cpu_thread(naive_tid(r->nr));
    } else {
        bench_snap_none(s);
        *c = bench_cpu_none();
    }
}

/* Allocate up to want buffers (fewer when the device is full); the count. */
static size_t allocate(struct run *r, size_t want)
{
    size_t n;

    for (n = 0; n < want; n++) {
        cudaError_t rc = alloc_buf(r, &r->ptrs[n]);

        if (rc == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            bench_note("out of device memory after %zu buffers; timing %zu calls",
                       n, n);
            break;
        }
        CK(rc);
    }
    if (n < 100)
        bench_die("only %zu buffers could be allocated", n);
    CK(cudaStreamSynchronize(r->stream));
    CK(cudaDeviceSynchronize());
    return n;
}

/* Release n buffers, each call timed alone, into r->lat. */
static void release_timed(struct run *r, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        uint64_t a = bench_now_ns();
        cudaError_t rc = release_buf(r, r->ptrs[i]);
        uint64_t b = bench_now_ns();

        if (rc != cudaSuccess)
            bench_die("release call %zu: %s", i, cudaGetErrorString(rc));
        r->lat[i] = b - a;
    }
}

/* The slow calls (over SLOW_NS) of lat (in call order, n calls): how many,
 * and the most frequent distance between consecutive ones (in calls, up
 * to MAX_GAP) with its share of the gaps: a periodic cost (a refill every
 * k calls) shows as one distance. */
struct slow_calls {
    size_t count;
    unsigned gap_mode;
    double gap_mode_share;
};

static struct slow_calls slow_calls_of(const uint64_t *lat, size_t n)
{
    static size_t gaps[MAX_GAP + 1];
    struct slow_calls s = {0};
    size_t last = SIZE_MAX, ngaps = 0, i;

    memset(gaps, 0, sizeof gaps);
    for (i = 0; i < n; i++) {
        if (lat[i] <= SLOW_NS)
            continue;
        s.count++;
        if (last != SIZE_MAX) {
            gaps[i - last > MAX_GAP ? MAX_GAP : i - last]++;
            ngaps++;
        }
        last = i;
    }
    for (i = 1; i < MAX_GAP; i++)
        if (gaps[i] > gaps[s.gap_mode])
            s.gap_mode = (unsigned)i;
    s.gap_mode_share = ngaps ? (double)gaps[s.gap_mode] / (double)ngaps : NAN;
    return s;
}

static struct rusage thread_usage(void)
{
    struct rusage u;

    if (getrusage(RUSAGE_THREAD, &u) != 0)
        memset(&u, 0, sizeof u);
    return u;
}

int main(int argc, char **argv)
{
    struct bench_args a;
    struct run r;
    struct bench_snap s0, s1, s_calls;
    struct bench_cpu c_calls;
    struct bench_cpu c0, c1;
    double held = NAN;
    struct busy_trim trim = NO_TRIM;
    struct rusage u0, u1;
    uint64_t first_ns = 0;
    struct slow_calls slow;
    size_t n, i;
    int busy, primed, trim_busy, s;

    bench_parse_args(argc, argv, "bench-release-call", usage, &a);
    memset(&r, 0, sizeof r);
    r.strategy = S_N;
    for (s = 0; s < S_N; s++)
        if (strcmp(a.strategy, strategy_names[s]) == 0)
            r.strategy = (enum strategy)s;
    if (r.strategy == S_N)
        bench_die("unknown strategy '%s' for W5", a.strategy);
    trim_busy = strcmp(a.workload, "W5-busy-trim") == 0;
    if (strcmp(a.workload, "W5-idle") != 0 && strcmp(a.workload, "W5-busy") != 0 &&
        strcmp(a.workload, "W5-idle-primed") != 0 && !trim_busy)
        bench_die("unknown workload '%s' (W5-idle, W5-busy, W5-idle-primed or "
                  "W5-busy-trim)", a.workload);
    if (trim_busy && r.strategy != S_CUDEFER)
        bench_die("W5-busy-trim times defer_trim: strategy cudefer only, not %s",
                  a.strategy);
    busy = trim_busy || strcmp(a.workload, "W5-busy") == 0;
    primed = busy || strcmp(a.workload, "W5-idle-primed") == 0;
    bench_cuda_init();
    r.ptrs = bench_calloc((size_t)a.calls, sizeof(void *));
    r.lat = bench_calloc((size_t)a.calls, sizeof(uint64_t));
    if (r.strategy == S_NAIVE && naive_start(&r.nr, NAIVE_POLL_US) != 0)
        bench_die("naive_start failed");
    CK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));

    /* warm-up: the same calls, untimed but the first (for cudefer: the
     * library's start and the device's first stock of events) */
    for (i = 0; i < WARMUP_CALLS; i++) {
        void *p;
        uint64_t t0;

        CK(alloc_buf(&r, &p));
        t0 = bench_now_ns();
        CK(release_buf(&r, p));
        if (i == 0)
            first_ns = bench_now_ns() - t0;
    }
    CK(cudaStreamSynchronize(r.stream));
    release_all(&r);
    if (primed) {   /* the idle phase, untimed */
        n = allocate(&r, (size_t)a.calls);
        release_timed(&r, n);
        CK(cudaStreamSynchronize(r.stream));
        release_all(&r);
    }

    n = allocate(&r, (size_t)a.calls);
    if (busy)
        CK(gpu_spin(r.stream, BUSY_NS));
    snap(&r, &s0, &c0);
    u0 = thread_usage();
    release_timed(&r, n);
    u1 = thread_usage();
    snap(&r, &s_calls, &c_calls);
    if (busy) {
        cudaError_t q = cudaStreamQuery(r.stream);

        cudaGetLastError();    /* a not-ready query must not linger */
        held = q == cudaErrorNotReady ? 1.0 : 0.0;
        if (trim_busy)
            trim = trim_behind_busy(&r);
    }
    CK(cudaStreamSynchronize(r.stream));
    release_all(&r);
    snap(&r, &s1, &c1);
    slow = slow_calls_of(r.lat, n);
    bench_sort_u64(r.lat, n);

    json_begin();
    bench_json_head(&a);
    json_num("calls", (double)n);
    json_num("first_call_us", (double)first_ns / 1e3);
    json_num("buf_bytes", (double)BUF_BYTES);
    json_num("call_p50_us", bench_pct_us(r.lat, n, 50));
    json_num("call_p90_us", bench_pct_us(r.lat, n, 90));
    json_num("call_p95_us", bench_pct_us(r.lat, n, 95));
    json_num("call_p98_us", bench_pct_us(r.lat, n, 98));
    json_num("call_p99_us", bench_pct_us(r.lat, n, 99));
    json_num("call_max_us", bench_pct_us(r.lat, n, 100));
    json_num("call_mean_us", bench_mean_us(r.lat, n));
    json_num("busy_ms", busy ? (double)BUSY_NS / 1e6 : NAN);
    json_num("busy_held", held);
    json_num("busy_trim_ms", trim.ms);
    json_num("busy_trim_queries", trim.queries);
    json_num("busy_trim_released", trim.released);
    json_num("busy_trim_held_after", trim.held_after);
    json_num("reclaimer_cpu_ms", bench_cpu_delta(&c0, &c1, 0));
    json_num("reclaimer_cpu_ms_stat", bench_cpu_delta(&c0, &c1, 1));
    json_num("queries_per_release",
             bench_ratio(s1.queries - s0.queries, s1.released - s0.released));
    json_num("released", s1.released - s0.released);
    json_num("sync_releases", s1.sync_releases - s0.sync_releases);
    /* While the timed calls ran: events the library made (on the calling
     * thread or its reclaimer), releases, and the reclaimer's CPU. */
    json_num("events_created_calls",
             s_calls.events_created - s0.events_created);
    json_num("released_calls", s_calls.released - s0.released);
    json_num("reclaimer_cpu_calls_ms", bench_cpu_delta(&c0, &c_calls, 0));
    /* The calling thread during the timed calls: page faults and context
     * switches (getrusage RUSAGE_THREAD), and the calls over SLOW_NS. */
    json_num("calls_minor_faults", (double)(u1.ru_minflt - u0.ru_minflt));
    json_num("calls_major_faults", (double)(u1.ru_majflt - u0.ru_majflt));
    json_num("calls_vol_switches", (double)(u1.ru_nvcsw - u0.ru_nvcsw));
    json_num("calls_invol_switches", (double)(u1.ru_nivcsw - u0.ru_nivcsw));
    json_num("slow_calls", (double)slow.count);
    json_num("slow_gap_mode", (double)slow.gap_mode);
    json_num("slow_gap_mode_share", slow.gap_mode_share);
    json_end();

    if (r.nr)
        naive_stop(r.nr);
    CK(cudaStreamDestroy(r.stream));
    free(r.ptrs);
    free(r.lat);
    return bench_finish(r.strategy == S_CUDEFER);
}
