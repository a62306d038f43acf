/* SPDX-License-Identifier: MIT */
/*
 * bench-scale: workload W6, many entries from many threads.  64 threads make
 * 1,000,000 calls over 1024 streams (16 streams per thread, round robin)
 * while every stream waits behind a gate kernel, so every entry is still
 * pending when the memory is read; then the gate opens and the entries
 * drain.
 *   cudefer     each call is defer_call(trivial callback, stream).
 *   no-library  the bound: each call is cudaEventRecord on the same stream
 *               (one event per stream, created beforehand and recorded again
 *               each time), so it is the driver's cost of the event record
 *               that any deferred release needs, with no library around it.
 * Three more strategies, not in run.py's default table, split cudefer's cost
 * into its parts on a GPU (run one directly, e.g.
 * bench/bench-scale --workload W6 --strategy no-library-create):
 *   no-library-create  each call is cudaEventCreateWithFlags of a new event
 *               and cudaEventRecord of it: one event per pending call, as
 *               cudefer needs while every entry waits behind the gate
 *               (bytes_per_entry is then the driver's cost of an event);
 *   no-library-calls   each call is every CUDA call a defer_call makes when
 *               no pooled event is idle (cudaStreamIsCapturing,
 *               cudaStreamGetId, cudaGetDevice, cudaEventCreateWithFlags,
 *               cudaEventRecord), with no library around them;
 *   cudefer-warm  cudefer after a warm-up of as many calls as the run makes
 *               (flushed), so that with CUDEFER_EVENT_POOL at least that
 *               large the timed calls create no event (events_created says
 *               whether they did).
 * If the enqueue makes no progress for 300 ms (the driver's queue is full),
 * the gate opens early and the memory of that moment is reported.  One
 * (strategy, repetition) per process, one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "cudefer.h"
#include "gpu_kernels.h"

#define STREAMS  1024
#define THREADS  64
#define GATE_NS  20000000000ull     /* the gate kernel gives up after 20 s */
#define STALL_NS 300000000ull       /* no enqueue progress for 300 ms */

static const char usage[] =
    "--workload W6 --strategy cudefer|no-library|no-library-create|\n"
    "       no-library-calls|cudefer-warm [--label NAME] [--rep N]\n"
    "       [--entries N] | --info\n";

/* What a call is (see the top of the file). */
enum call_kind {
    CALL_DEFER,          /* cudefer, cudefer-warm */
    CALL_RECORD,         /* no-library */
    CALL_CREATE_RECORD,  /* no-library-create */
    CALL_LIBRARY_CALLS,  /* no-library-calls */
};

static atomic_ulong callbacks_run;

static void count_callback(void *arg)
{
    (void)arg;
    atomic_fetch_add_explicit(&callbacks_run, 1, memory_order_relaxed);
}

struct producer {
    _Alignas(64) atomic_ulong progress;
    enum call_kind kind;
    cudaStream_t *streams;
    cudaEvent_t *events;         /* no-library: one per stream */
    cudaEvent_t *made;           /* create and calls: one per call */
    int nstreams;
    uint64_t n;
    uint32_t *lat;               /* ns per call, saturated */
    uint64_t t_end;
    uint64_t max_ns, max_j, max_at; /* the slowest call: its index, start */
    uint64_t over_1ms;           /* calls that took 1 ms or more */
    pthread_barrier_t *ready, *go;
    atomic_int *finished;
};

/* The CUDA calls a defer_call makes when no pooled event is idle, with no
 * library: the capture check, the stream's identity (exact, as for a
 * callback), the current device and a new event, recorded. */
static cudaError_t library_calls(cudaStream_t s, cudaEvent_t *made)
{
    enum cudaStreamCaptureStatus capturing;
    unsigned long long id;
    int device;
    cudaError_t rc;

    if ((rc = cudaStreamIsCapturing(s, &capturing)) != cudaSuccess ||
        (rc = cudaStreamGetId(s, &id)) != cudaSuccess ||
        (rc = cudaGetDevice(&device)) != cudaSuccess ||
        (rc = cudaEventCreateWithFlags(made, cudaEventDisableTiming)) !=
            cudaSuccess)
        return rc;
    return cudaEventRecord(*made, s);
}

/* One call of kind k on stream k_stream (number j of its thread). */
static cudaError_t one_call(struct producer *t, int k, uint64_t j)
{
    switch (t->kind) {
    case CALL_DEFER:
        return defer_call(count_callback, NULL, t->streams[k]);
    case CALL_RECORD:
        return cudaEventRecord(t->events[k], t->streams[k]);
    case CALL_CREATE_RECORD: {
        cudaError_t rc = cudaEventCreateWithFlags(&t->made[j],
                                                  cudaEventDisableTiming);
        return rc != cudaSuccess ? rc
                                 : cudaEventRecord(t->made[j], t->streams[k]);
    }
    case CALL_LIBRARY_CALLS:
        return library_calls(t->streams[k], &t->made[j]);
    }
    return cudaErrorInvalidValue;
}

/* A producer thread: n calls, each timed, progress published for the
 * stall watch. */
static void *producer_main(void *arg)
{
    struct producer *t = arg;
    uint64_t j;

    CK(cudaSetDevice(bench_device));
    pthread_barrier_wait(t->ready);
    pthread_barrier_wait(t->go);
    for (j = 0; j < t->n; j++) {
        int k = (int)(j % (uint64_t)t->nstreams);
        uint64_t a = bench_now_ns(), d;
        cudaError_t rc = one_call(t, k, j);

        d = bench_now_ns() - a;
        if (rc != cudaSuccess)
            bench_die("%s: %s", t->kind == CALL_DEFER ? "defer_call" : "CUDA call",
                      cudaGetErrorString(rc));
        t->lat[j] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        t->over_1ms += d >= 1000000;
        if (d > t->max_ns) {
            t->max_ns = d;
            t->max_j = j;
            t->max_at = a;
        }
        atomic_store_explicit(&t->progress, j + 1, memory_order_relaxed);
    }
    t->t_end = bench_now_ns();
    atomic_fetch_add(t->finished, 1);
    return NULL;
}

/* Close the gate: every stream waits (through gate_ev) for a kernel on
 * gate that spins until *flag is set (or GATE_NS passes). */
static void close_gate(cudaStream_t gate, cudaEvent_t gate_ev, int *flag_d,
                       cudaStream_t *streams)
{
    int t;

    CK(gpu_wait_flag(gate, flag_d, GATE_NS));
    CK(cudaEventRecord(gate_ev, gate));
    for (t = 0; t < STREAMS; t++)
        CK(cudaStreamWaitEvent(streams[t], gate_ev, 0));
}

/* What is read at the moment every entry is pending (or the enqueue
 * stalled): counters, reclaimer CPU, RSS. */
struct moment {
    struct bench_snap snap;
    struct bench_cpu cpu;
    double rss;
    uint64_t calls;              /* calls made by then */
};

static void read_moment(int use_library, struct moment *m, uint64_t calls)
{
    m->rss = bench_rss_bytes();
    m->calls = calls;
    if (use_library) {
        bench_snap_cudefer(&m->snap);
        m->cpu = bench_cpu_cudefer();
    } else {
        bench_snap_none(&m->snap);
        m->cpu = bench_cpu_none();
    }
}

int main(int argc, char **argv)
{
    struct bench_args a;
    const int per = STREAMS / THREADS;
    cudaStream_t *streams = bench_calloc(STREAMS, sizeof *streams);
    cudaEvent_t *events = bench_calloc(STREAMS, sizeof *events);
    pthread_t *th = bench_calloc(THREADS, sizeof *th);
    size_t tsz = ((sizeof(struct producer) * THREADS + 63) / 64) * 64;
    struct producer *ts;
    cudaStream_t gate;
    cudaEvent_t gate_ev;
    volatile int *flag_h;
    int *flag_d;
    pthread_barrier_t ready, go;
    atomic_int finished;
    struct moment m0, mp, m2;
    uint64_t E, t0, t_enq = 0, t_open, t_drained, last_prog = 0, last_change,
        i, at, *lat_all;
    int lib, warm, gate_open = 0, stalled = 0, gate_timed_out = 0, rc, t;
    enum call_kind kind;

    bench_parse_args(argc, argv, "bench-scale", usage, &a);
    if (strcmp(a.workload, "W6") != 0)
        bench_die("unknown workload '%s' (W6)", a.workload);
    if (strcmp(a.strategy, "cudefer") == 0 || strcmp(a.strategy, "cudefer-warm") == 0)
        kind = CALL_DEFER;
    else if (strcmp(a.strategy, "no-library") == 0)
        kind = CALL_RECORD;
    else if (strcmp(a.strategy, "no-library-create") == 0)
        kind = CALL_CREATE_RECORD;
    else if (strcmp(a.strategy, "no-library-calls") == 0)
        kind = CALL_LIBRARY_CALLS;
    else
        bench_die("W6 runs cudefer, no-library, no-library-create, "
                  "no-library-calls and cudefer-warm, not %s", a.strategy);
    lib = kind == CALL_DEFER;
    warm = strcmp(a.strategy, "cudefer-warm") == 0;
    bench_cuda_init();
    E = (uint64_t)a.entries;
    for (t = 0; t < STREAMS; t++) {
        CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
        if (!lib)
            CK(cudaEventCreateWithFlags(&events[t], cudaEventDisableTiming));
    }
    CK(cudaStreamCreateWithFlags(&gate, cudaStreamNonBlocking));
    CK(cudaHostAlloc((void **)&flag_h, sizeof(int), cudaHostAllocMapped));
    *flag_h = 0;
    CK(cudaHostGetDevicePointer((void **)&flag_d, (void *)flag_h, 0));
    CK(cudaEventCreateWithFlags(&gate_ev, cudaEventDisableTiming));

    /* warm up the per-stream state: one call per stream */
    for (t = 0; t < STREAMS; t++)
        CK(lib ? defer_call(count_callback, NULL, streams[t])
               : cudaEventRecord(events[t], streams[t]));
    /* cudefer-warm: as many events as the run will take, all pending at
     * once behind the gate (so none is reused), then back in the pool (if
     * CUDEFER_EVENT_POOL lets it keep them) */
    if (warm) {
        close_gate(gate, gate_ev, flag_d, streams);
        for (i = 0; i < E; i++)
            CK(defer_call(count_callback, NULL, streams[i % STREAMS]));
        __atomic_store_n(flag_h, 1, __ATOMIC_SEQ_CST);
        CK(defer_flush());
        CK(cudaStreamSynchronize(gate));
        __atomic_store_n(flag_h, 0, __ATOMIC_SEQ_CST);
    }
    if (lib)
        CK(defer_flush());
    CK(cudaDeviceSynchronize());
    if (warm) {
        struct defer_stats st;

        defer_stats_get(&st);
        if (st.events_in_pool < E)
            bench_note("cudefer-warm: %llu idle events for %" PRIu64 " calls "
                       "(CUDEFER_EVENT_POOL too small?)",
                       (unsigned long long)st.events_in_pool, E);
    }
    atomic_store(&callbacks_run, 0);

    /* close the gate: every stream waits for a kernel that spins on flag */
    close_gate(gate, gate_ev, flag_d, streams);

    ts = aligned_alloc(64, tsz);
    if (!ts)
        bench_die("out of memory");
    memset(ts, 0, tsz);
    atomic_init(&finished, 0);
    pthread_barrier_init(&ready, NULL, THREADS + 1);
    pthread_barrier_init(&go, NULL, THREADS + 1);
    for (t = 0; t < THREADS; t++) {
        atomic_init(&ts[t].progress, 0);
        ts[t].kind = kind;
        ts[t].streams = streams + (size_t)t * (size_t)per;
        ts[t].events = events + (size_t)t * (size_t)per;
        ts[t].nstreams = per;
        ts[t].n = E / THREADS + ((uint64_t)t < E % THREADS ? 1 : 0);
        /* touched now, so that it is not counted as the library's RSS */
        ts[t].lat = bench_calloc(ts[t].n + 1, sizeof(uint32_t));
        memset(ts[t].lat, 0, (ts[t].n + 1) * sizeof(uint32_t));
        if (kind == CALL_CREATE_RECORD || kind == CALL_LIBRARY_CALLS) {
            ts[t].made = bench_calloc(ts[t].n + 1, sizeof(cudaEvent_t));
            memset(ts[t].made, 0, (ts[t].n + 1) * sizeof(cudaEvent_t));
        }
        ts[t].ready = &ready;
        ts[t].go = &go;
        ts[t].finished = &finished;
        rc = pthread_create(&th[t], NULL, producer_main, &ts[t]);
        if (rc)
            bench_die("pthread_create: %s", strerror(rc));
    }
    pthread_barrier_wait(&ready);
    bench_sleep_us(20000);   /* let the threads settle into the barrier */
    read_moment(lib, &m0, 0);
    memset(&mp, 0, sizeof mp);
    mp.rss = NAN;
    bench_snap_none(&mp.snap);
    mp.cpu = bench_cpu_none();

    t0 = bench_now_ns();
    last_change = t0;
    pthread_barrier_wait(&go);
    while (atomic_load(&finished) < THREADS) {
        uint64_t prog = 0, tn;

        bench_sleep_us(2000);
        for (t = 0; t < THREADS; t++)
            prog += atomic_load_explicit(&ts[t].progress, memory_order_relaxed);
        tn = bench_now_ns();
        if (prog != last_prog) {
            last_prog = prog;
            last_change = tn;
        } else if (!gate_open && tn - last_change > STALL_NS) {
            read_moment(lib, &mp, prog);
            stalled = 1;
            bench_note("enqueue made no progress for %llu ms at %" PRIu64 " of %"
                       PRIu64 " entries; opening the gate",
                       (unsigned long long)(STALL_NS / 1000000u), prog, E);
            __atomic_store_n(flag_h, 1, __ATOMIC_SEQ_CST);
            gate_open = 1;
        }
    }
    for (t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        if (ts[t].t_end > t_enq)
            t_enq = ts[t].t_end;
    }
    if (!gate_open) {
        cudaError_t q;

        read_moment(lib, &mp, E);
        q = cudaStreamQuery(gate);
        cudaGetLastError();
        gate_timed_out = q == cudaSuccess;   /* the gate opened by its timeout */
        if (gate_timed_out)
            bench_note("the gate kernel timed out before the enqueue ended");
    }
    t_open = bench_now_ns();
    __atomic_store_n(flag_h, 1, __ATOMIC_SEQ_CST);
    if (lib)
        CK(defer_flush());
    else
        CK(cudaDeviceSynchronize());
    t_drained = bench_now_ns();
    read_moment(lib, &m2, E);
    CK(cudaStreamSynchronize(gate));
    if (lib && atomic_load(&callbacks_run) != E)
        bench_note("%lu of %" PRIu64 " callbacks ran",
                   (unsigned long)atomic_load(&callbacks_run), E);

    lat_all = bench_calloc((size_t)E + 1, sizeof(uint64_t));
    for (t = 0, at = 0; t < THREADS; t++)
        for (i = 0; i < ts[t].n; i++)
            lat_all[at++] = ts[t].lat[i];
    bench_sort_u64(lat_all, (size_t)at);

    {
        double cpu_all = bench_cpu_delta(&m0.cpu, &m2.cpu, 0);
        double batches = m2.snap.batches - m0.snap.batches;
        double wakeups = m2.snap.wakeups - m0.snap.wakeups;
        double released = m2.snap.released - m0.snap.released;
        /* without the library, every call made so far is pending */
        double pend = lib ? mp.snap.pending : (double)mp.calls;
        double enq_s = (double)(t_enq - t0) / 1e9;

        json_begin();
        bench_json_head(&a);
        json_num("entries", (double)E);
        json_num("streams", STREAMS);
        json_num("threads", THREADS);
        json_num("enqueue_ms", enq_s * 1e3);
        json_num("enqueue_calls_per_s", enq_s > 0 ? (double)E / enq_s : NAN);
        json_num("call_p50_us", bench_pct_us(lat_all, (size_t)at, 50));
        json_num("call_p99_us", bench_pct_us(lat_all, (size_t)at, 99));
        json_num("call_max_us", bench_pct_us(lat_all, (size_t)at, 100));
        /* Where the slowest call came: its thread's call number (a thread's
         * first nstreams calls each start a stream) and its start after
         * the go; and how many calls took a millisecond or more. */
        {
            int slow = 0;
            uint64_t over = 0;
            for (t = 0; t < THREADS; t++) {
                over += ts[t].over_1ms;
                if (ts[t].max_ns > ts[slow].max_ns)
                    slow = t;
            }
            json_num("call_max_index", (double)ts[slow].max_j);
            json_num("call_max_at_ms",
                     (double)(ts[slow].max_at - t0) / 1e6);
            json_num("calls_over_1ms", (double)over);
        }
        json_num("reclaimer_cpu_ms", cpu_all);
        json_num("reclaimer_cpu_ms_stat", bench_cpu_delta(&m0.cpu, &m2.cpu, 1));
        json_num("reclaimer_cpu_enqueue_ms", bench_cpu_delta(&m0.cpu, &mp.cpu, 0));
        json_num("reclaimer_cpu_drain_ms", bench_cpu_delta(&mp.cpu, &m2.cpu, 0));
        json_num("batches", batches);
        json_num("wakeups", wakeups);
        json_num("pass_us", bench_ratio(cpu_all * 1e3, batches));
        json_num("wakeup_us", bench_ratio(cpu_all * 1e3, wakeups));
        json_num("queries_per_release",
                 bench_ratio(m2.snap.queries - m0.snap.queries, released));
        json_num("released", released);
        json_num("failed", m2.snap.failed - m0.snap.failed);
        json_num("sync_releases", m2.snap.sync_releases - m0.snap.sync_releases);
        json_num("events_created", m2.snap.events_created - m0.snap.events_created);
        json_num("pending_at_peak", pend);
        json_num("rss_delta_bytes", mp.rss - m0.rss);
        json_num("bytes_per_entry", bench_ratio(mp.rss - m0.rss, pend));
        json_num("drain_ms", (double)(t_drained - t_open) / 1e6);
        json_num("gate_stalled", stalled);
        json_num("gate_stalled_at", stalled ? (double)mp.calls : NAN);
        json_num("gate_timed_out", gate_timed_out);
        json_end();
    }

    for (t = 0; t < THREADS; t++) {
        for (i = 0; ts[t].made != NULL && i < ts[t].n; i++)
            if (ts[t].made[i] != NULL)
                cudaEventDestroy(ts[t].made[i]);
        free(ts[t].made);
        free(ts[t].lat);
    }
    free(lat_all);
    free(ts);
    free(th);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    cudaEventDestroy(gate_ev);
    for (t = 0; t < STREAMS; t++) {
        if (!lib)
            cudaEventDestroy(events[t]);
        cudaStreamDestroy(streams[t]);
    }
    cudaStreamDestroy(gate);
    cudaFreeHost((void *)flag_h);
    free(streams);
    free(events);
    return bench_finish(lib);
}
