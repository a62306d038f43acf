/* SPDX-License-Identifier: MIT */
/*
 * bench-launch-loop: workloads W1-W4, the launch loop.  Each iteration of a
 * launching thread allocates a 1 MiB buffer, launches one kernel that spins
 * for 50 us and then writes the buffer, and releases the buffer by the
 * strategy under test; W2 adds a host sync every 32 iterations, W3 takes the
 * buffers from cudaMallocAsync, W4 runs 8 such threads on their own streams.
 * One (workload, strategy, repetition) per process; the result is one JSON
 * object on stdout (bench/README.md lists its keys).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cudefer.h"
#include "event_watcher.h"
#include "gpu_kernels.h"

#define BUF_BYTES     ((size_t)1 << 20)   /* 1 MiB buffers */
#define KERNEL_NS     50000ull            /* ~50 us gpu_spin_fill */
#define W2_SYNC_EVERY 32                  /* W2: host sync every 32 iterations */
#define W4_THREADS    8
#define LIMIT_RING    64                  /* limit: preallocated buffers per thread */
#define WARMUP_ITERS  32                  /* untimed iterations first */
#define NAIVE_POLL_US 50
/* malloc-never-free keeps every buffer: what must stay free besides them. */
#define NEVER_FREE_SPARE ((size_t)512 << 20)

enum strategy {
    S_LIMIT,          /* a ring of buffers allocated before timing, never freed */
    S_NEVER_FREE,     /* cudaMalloc every iteration, never freed: the floor of
                         any program that allocates with cudaMalloc */
    S_INLINE_FREE,    /* cudaMalloc, kernel, cudaFree */
    S_INLINE_ASYNC,   /* cudaMallocAsync, kernel, cudaFreeAsync */
    S_NAIVE,          /* cudaMalloc, kernel, naive_free */
    S_CUDEFER,        /* cudaMalloc, kernel, defer_free */
    S_CUDEFER_ALLOC,  /* defer_alloc, kernel, defer_free */
    S_NEVER_FREE_RECORD, /* malloc-never-free and a cudaEventRecord on the
                            stream each iteration: the floor of any release
                            that waits for an event, with no library */
    S_NEVER_FREE_QUERY, /* malloc-record and a thread querying each event
                           once until complete (event_watcher.h): the floor
                           of any reclaimer that polls events */
    S_N
};

static const char *const strategy_names[S_N] = {
    "limit", "malloc-never-free", "inline-cudaFree", "inline-async",
    "naive-reclaimer", "cudefer", "cudefer-alloc", "malloc-record",
    "malloc-record-query",
};

#define IS_CUDEFER(s) ((s) == S_CUDEFER || (s) == S_CUDEFER_ALLOC)
#define KEEPS_ALL(s) \
    ((s) == S_NEVER_FREE || (s) == S_NEVER_FREE_RECORD || (s) == S_NEVER_FREE_QUERY)

static const char usage[] =
    "--workload W1|W2|W3|W4 --strategy S [--label NAME] [--rep N] [--iters N]\n"
    "       | --info\n"
    "  strategies: limit, malloc-never-free, inline-cudaFree, inline-async,\n"
    "  naive-reclaimer, cudefer, cudefer-alloc, malloc-record,\n"
    "  malloc-record-query\n"
    "  (W3: limit, inline-async, cudefer)\n";

struct worker {
    enum strategy strategy;
    int pool;                 /* W3: buffers from cudaMallocAsync */
    int sync_every;           /* W2: cudaStreamSynchronize every n iterations */
    int iters;
    cudaStream_t stream;
    cudaEvent_t event;        /* malloc-record's, recorded again each time */
    void *ring[LIMIT_RING];   /* limit's buffers */
    void **kept;              /* malloc-never-free's buffers, freed after timing */
    size_t nkept;
    uint64_t *iter_ns, *call_ns;
    uint64_t t_end;
    struct naive_reclaimer *nr;
    struct event_watcher *ew; /* malloc-record-query's; lane: the thread's index */
    int lane;
    pthread_barrier_t *ready, *go;
};

/* The allocation of one iteration (limit takes its ring instead). */
static cudaError_t alloc_buf(const struct worker *w, void **p)
{
    if (w->strategy == S_INLINE_ASYNC || w->pool)
        return cudaMallocAsync(p, BUF_BYTES, w->stream);
    if (w->strategy == S_CUDEFER_ALLOC)
        return defer_alloc(p, BUF_BYTES, w->stream);
    return cudaMalloc(p, BUF_BYTES);
}

/* The release of one iteration: the call the strategy is about. */
static cudaError_t release_buf(struct worker *w, void *p)
{
    switch (w->strategy) {
    case S_LIMIT:
        return cudaSuccess;
    case S_NEVER_FREE:
        w->kept[w->nkept++] = p;
        return cudaSuccess;
    case S_NEVER_FREE_RECORD:
        w->kept[w->nkept++] = p;
        return cudaEventRecord(w->event, w->stream);
    case S_NEVER_FREE_QUERY:
        w->kept[w->nkept++] = p;
        return watcher_record(w->ew, w->lane, w->stream);
    case S_INLINE_FREE:
        return cudaFree(p);
    case S_INLINE_ASYNC:
        return cudaFreeAsync(p, w->stream);
    case S_NAIVE:
        return naive_free(w->nr, p, w->stream);
    case S_CUDEFER:
    case S_CUDEFER_ALLOC:
        return defer_free(p, w->stream);
    default:
        return cudaErrorInvalidValue;
    }
}

/* Wait until everything released so far is really released, and (cudefer)
 * empty the block cache too, so that the memory sampled from here on is what
 * the timed part holds (as inline-async's pool, trimmed by the next device
 * synchronisation). */
static void release_all(enum strategy s, struct naive_reclaimer *nr,
                        struct event_watcher *ew)
{
    if (IS_CUDEFER(s)) {
        CK(defer_flush());
        CK(defer_trim(NULL));
    } else if (s == S_NAIVE)
        naive_drain(nr);
    else if (s == S_NEVER_FREE_QUERY)
        watcher_drain(ew);
}

/* The counters and CPU time of the strategy's reclaimer, if it has one.
 * malloc-record-query's "released" are the events seen complete. */
static void snap_reclaimer(enum strategy s, struct naive_reclaimer *nr,
                           struct event_watcher *ew, struct bench_snap *snap,
                           struct bench_cpu *cpu)
{
    bench_snap_none(snap);
    *cpu = bench_cpu_none();
    if (IS_CUDEFER(s)) {
        bench_snap_cudefer(snap);
        *cpu = bench_cpu_cudefer();
    } else if (s == S_NAIVE) {
        bench_snap_naive(nr, snap);
        *cpu = bench_cpu_thread(naive_tid(nr));
    } else if (s == S_NEVER_FREE_QUERY) {
        struct watcher_stats ws;

        watcher_stats_get(ew, &ws);
        snap->deferred = (double)ws.recorded;
        snap->released = (double)ws.seen;
        snap->failed = (double)ws.failed;
        snap->queries = (double)ws.queries;
        snap->wakeups = (double)ws.passes;
        snap->pending = (double)(ws.recorded - ws.seen);
        *cpu = bench_cpu_thread(watcher_tid(ew));
    }
}

/* malloc-never-free: give back what the (untimed) warm-up or the timed part
 * kept, after the stream's work is done. */
static void free_kept(struct worker *w)
{
    size_t i;

    CK(cudaStreamSynchronize(w->stream));
    for (i = 0; i < w->nkept; i++)
        CK(cudaFree(w->kept[i]));
    w->nkept = 0;
}

/* n iterations on the worker's stream; timed ones fill iter_ns and call_ns. */
static void do_iters(struct worker *w, int n, int timed)
{
    int i;

    for (i = 0; i < n; i++) {
        uint64_t a, b, c, d;
        void *p;

        a = bench_now_ns();
        if (w->strategy == S_LIMIT)
            p = w->ring[i % LIMIT_RING];
        else
            CK(alloc_buf(w, &p));
        CK(gpu_spin_fill(w->stream, KERNEL_NS, p, BUF_BYTES, (unsigned char)i));
        b = bench_now_ns();
        CK(release_buf(w, p));
        c = bench_now_ns();
        if (w->sync_every && (i + 1) % w->sync_every == 0)
            CK(cudaStreamSynchronize(w->stream));
        d = bench_now_ns();
        if (timed) {
            w->iter_ns[i] = d - a;
            w->call_ns[i] = c - b;
        }
    }
}

/* A launching thread: warm-up, wait for the start, the timed loop. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    int r;

    CK(cudaSetDevice(bench_device));
    CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    if (w->strategy == S_LIMIT)
        for (r = 0; r < LIMIT_RING; r++)
            CK(cudaMalloc(&w->ring[r], BUF_BYTES));
    if (w->strategy == S_NEVER_FREE_RECORD)
        CK(cudaEventCreateWithFlags(&w->event, cudaEventDisableTiming));
    do_iters(w, w->iters < WARMUP_ITERS ? w->iters : WARMUP_ITERS, 0);
    CK(cudaStreamSynchronize(w->stream));
    if (KEEPS_ALL(w->strategy))
        free_kept(w);
    pthread_barrier_wait(w->ready);
    pthread_barrier_wait(w->go);
    do_iters(w, w->iters, 1);
    CK(cudaStreamSynchronize(w->stream));
    w->t_end = bench_now_ns();
    return NULL;
}

/* malloc-never-free holds every buffer to the end: refuse to start unless
 * they fit, instead of failing half-way through the timed part. */
static void check_never_free_fits(int threads, long iters)
{
    size_t fr = 0, tot = 0, need = (size_t)threads * (size_t)iters * BUF_BYTES;

    CK(cudaMemGetInfo(&fr, &tot));
    if (need + NEVER_FREE_SPARE > fr)
        bench_die("malloc-never-free keeps all %zu MiB it allocates, but only "
                  "%zu MiB of device memory are free: lower --iters",
                  need >> 20, fr >> 20);
}

static enum strategy strategy_from_name(const char *name)
{
    int s;

    for (s = 0; s < S_N; s++)
        if (strcmp(name, strategy_names[s]) == 0)
            return (enum strategy)s;
    bench_die("unknown strategy '%s'", name);
}

int main(int argc, char **argv)
{
    struct bench_args a;
    enum strategy st;
    int T, i, rc, w3, w2, max_thread = 0;
    struct worker *ws;
    pthread_t *th;
    pthread_barrier_t ready, go;
    struct naive_reclaimer *nr = NULL;
    struct event_watcher *ew = NULL;
    struct bench_sampler smp;
    struct bench_snap s0, s1;
    struct bench_cpu c0, c1;
    size_t base_free = 0, total = 0, n, at, max_index = 0;
    uint64_t t0, t_done = 0, t_rel, *iter_all, *call_all;
    double peak;

    bench_parse_args(argc, argv, "bench-launch-loop", usage, &a);
    st = strategy_from_name(a.strategy);
    if (strcmp(a.workload, "W1") != 0 && strcmp(a.workload, "W2") != 0 &&
        strcmp(a.workload, "W3") != 0 && strcmp(a.workload, "W4") != 0)
        bench_die("unknown workload '%s' (W1, W2, W3 or W4)", a.workload);
    w2 = strcmp(a.workload, "W2") == 0;
    w3 = strcmp(a.workload, "W3") == 0;
    if (w3 && st != S_LIMIT && st != S_INLINE_ASYNC && st != S_CUDEFER)
        bench_die("W3 runs limit, inline-async and cudefer, not %s", a.strategy);
    T = strcmp(a.workload, "W4") == 0 ? W4_THREADS : 1;
    n = (size_t)T * (size_t)a.iters;
    bench_cuda_init();
    if (KEEPS_ALL(st))
        check_never_free_fits(T, a.iters);

    ws = bench_calloc((size_t)T, sizeof *ws);
    th = bench_calloc((size_t)T, sizeof *th);
    if (st == S_NAIVE && naive_start(&nr, NAIVE_POLL_US) != 0)
        bench_die("naive_start failed");
    if (st == S_NEVER_FREE_QUERY && watcher_start(&ew, T, NAIVE_POLL_US) != 0)
        bench_die("watcher_start failed");
    pthread_barrier_init(&ready, NULL, (unsigned)T + 1);
    pthread_barrier_init(&go, NULL, (unsigned)T + 1);
    for (i = 0; i < T; i++) {
        ws[i].strategy = st;
        ws[i].pool = w3;
        ws[i].sync_every = w2 ? W2_SYNC_EVERY : 0;
        ws[i].iters = (int)a.iters;
        ws[i].iter_ns = bench_calloc((size_t)a.iters, sizeof(uint64_t));
        ws[i].call_ns = bench_calloc((size_t)a.iters, sizeof(uint64_t));
        if (KEEPS_ALL(st))
            ws[i].kept = bench_calloc((size_t)a.iters + WARMUP_ITERS, sizeof(void *));
        ws[i].nr = nr;
        ws[i].ew = ew;
        ws[i].lane = i;
        ws[i].ready = &ready;
        ws[i].go = &go;
        rc = pthread_create(&th[i], NULL, worker_main, &ws[i]);
        if (rc)
            bench_die("pthread_create: %s", strerror(rc));
    }
    pthread_barrier_wait(&ready);          /* all warmed up, streams idle */
    release_all(st, nr, ew);               /* warm-up memory released */
    CK(cudaDeviceSynchronize());           /* pools trimmed */
    CK(cudaMemGetInfo(&base_free, &total));
    bench_sampler_start(&smp);
    snap_reclaimer(st, nr, ew, &s0, &c0);

    t0 = bench_now_ns();
    pthread_barrier_wait(&go);
    for (i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        if (ws[i].t_end > t_done)
            t_done = ws[i].t_end;
    }
    release_all(st, nr, ew);
    t_rel = bench_now_ns();
    snap_reclaimer(st, nr, ew, &s1, &c1);
    peak = bench_sampler_stop(&smp, base_free);

    /* Where the slowest iteration was (a stall at the first iterations
     * or in the middle) and how much of it was the release call. */
    for (i = 0; i < T; i++)
        for (size_t k = 0; k < (size_t)a.iters; k++)
            if (ws[i].iter_ns[k] > ws[max_thread].iter_ns[max_index]) {
                max_thread = i;
                max_index = k;
            }
    iter_all = bench_calloc(n, sizeof(uint64_t));
    call_all = bench_calloc(n, sizeof(uint64_t));
    for (i = 0, at = 0; i < T; i++, at += (size_t)a.iters) {
        memcpy(iter_all + at, ws[i].iter_ns, (size_t)a.iters * sizeof(uint64_t));
        memcpy(call_all + at, ws[i].call_ns, (size_t)a.iters * sizeof(uint64_t));
    }
    bench_sort_u64(iter_all, n);
    bench_sort_u64(call_all, n);
    if ((IS_CUDEFER(st) || st == S_NAIVE || st == S_NEVER_FREE_QUERY) &&
        s1.released - s0.released != (double)n)
        bench_note("%.0f entries released in the timed part, %zu deferred "
                   "(sync releases %.0f, failed %.0f)", s1.released - s0.released,
                   n, s1.sync_releases - s0.sync_releases, s1.failed - s0.failed);

    json_begin();
    bench_json_head(&a);
    json_num("threads", T);
    json_num("iters", (double)a.iters);
    json_num("done_ms", (double)(t_done - t0) / 1e6);
    json_num("released_ms", (double)(t_rel - t0) / 1e6);
    json_num("iter_p50_us", bench_pct_us(iter_all, n, 50));
    json_num("iter_p99_us", bench_pct_us(iter_all, n, 99));
    json_num("iter_max_us", bench_pct_us(iter_all, n, 100));
    json_num("iter_max_index", (double)max_index);
    json_num("iter_max_call_us", (double)ws[max_thread].call_ns[max_index] / 1e3);
    /* limit and malloc-never-free make no release call */
    {
        int no_call = st == S_LIMIT || st == S_NEVER_FREE;

        json_num("call_p50_us", no_call ? NAN : bench_pct_us(call_all, n, 50));
        json_num("call_p99_us", no_call ? NAN : bench_pct_us(call_all, n, 99));
        json_num("call_max_us", no_call ? NAN : bench_pct_us(call_all, n, 100));
    }
    json_num("peak_bytes", peak);
    json_num("reclaimer_cpu_ms", bench_cpu_delta(&c0, &c1, 0));
    json_num("reclaimer_cpu_ms_stat", bench_cpu_delta(&c0, &c1, 1));
    json_num("queries_per_release",
             bench_ratio(s1.queries - s0.queries, s1.released - s0.released));
    json_num("released", s1.released - s0.released);
    json_num("failed", s1.failed - s0.failed);
    json_num("sync_releases", s1.sync_releases - s0.sync_releases);
    json_num("wakeups", s1.wakeups - s0.wakeups);
    json_num("batches", s1.batches - s0.batches);
    json_num("events_created", s1.events_created - s0.events_created);
    json_num("cache_mallocs", s1.cache_mallocs - s0.cache_mallocs);
    json_num("cache_releases", s1.cache_releases - s0.cache_releases);
    if (ew) {   /* records that found the watcher's ring full */
        struct watcher_stats wst;

        watcher_stats_get(ew, &wst);
        json_num("ring_waits", (double)wst.ring_waits);
    }
    json_num("mem_samples", (double)smp.samples);
    json_end();

    if (nr)
        naive_stop(nr);
    watcher_stop(ew);
    for (i = 0; i < T; i++) {
        if (KEEPS_ALL(st))
            free_kept(&ws[i]);
        if (st == S_NEVER_FREE_RECORD)
            CK(cudaEventDestroy(ws[i].event));
        free(ws[i].kept);
        free(ws[i].iter_ns);
        free(ws[i].call_ns);
    }
    free(iter_all);
    free(call_all);
    free(ws);
    free(th);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    return bench_finish(IS_CUDEFER(st));
}
