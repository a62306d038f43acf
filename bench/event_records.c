/* SPDX-License-Identifier: MIT */
/*
 * bench-event-records: what cudaEventRecord costs the launching thread when
 * the GPU runs far behind it, by how many distinct events are pending.  W4
 * cudefer-alloc (8 threads, each {defer_alloc, 50 us kernel, defer_free} on
 * its own stream) stalled one defer_free for 53-107 ms a run, a third of
 * the run, mid-way (H100, 2026-11-26); defer_free there records one pooled
 * event per free.  This program has no cudefer: THREADS threads, each on
 * its own non-blocking stream, run ITERS x {50 us kernel, record} and time
 * each record alone:
 *   distinct  a new event for every record (created before the timed part),
 *             so every record's event stays pending while the GPU lags;
 *   create    the same, each event created just before its record (timed
 *             with it): what a pool that ran dry pays, up to ITERS x
 *             THREADS events alive;
 *   shared    one event per thread, recorded again each time;
 *   none      no record (the kernel launches alone).
 * Prints one JSON object: the records' p50/p99/max us, the index of the
 * slowest (and its thread), and the time until the GPU was done.
 * usage: bench-event-records distinct|create|shared|none [THREADS [ITERS]]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "gpu_kernels.h"

#define KERNEL_NS 50000ull
#define BUF_BYTES 4096

enum mode { DISTINCT, CREATE, SHARED, NONE };

struct worker {
    enum mode mode;
    int iters;
    cudaStream_t stream;
    void *buf;
    cudaEvent_t *events; /* iters of them (distinct), or one (shared) */
    uint64_t *record_ns; /* each record's time, in order */
    pthread_barrier_t *go;
};

/* A launching thread: ITERS x {kernel, record}, each record timed. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;

    CK(cudaSetDevice(bench_device));
    pthread_barrier_wait(w->go);
    for (int i = 0; i < w->iters; i++) {
        CK(gpu_spin_fill(w->stream, KERNEL_NS, w->buf, BUF_BYTES,
                         (unsigned char)i));
        uint64_t a = bench_now_ns();
        if (w->mode == CREATE)
            CK(cudaEventCreateWithFlags(&w->events[i], cudaEventDisableTiming));
        if (w->mode == DISTINCT || w->mode == CREATE)
            CK(cudaEventRecord(w->events[i], w->stream));
        else if (w->mode == SHARED)
            CK(cudaEventRecord(w->events[0], w->stream));
        w->record_ns[i] = bench_now_ns() - a;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"distinct", "create", "shared", "none"};
    int threads = argc > 2 ? atoi(argv[2]) : 8;
    int iters = argc > 3 ? atoi(argv[3]) : 5000;
    int m = 0;

    snprintf(bench_who, sizeof bench_who, "bench-event-records");
    while (m < 4 && (argc < 2 || strcmp(argv[1], names[m]) != 0))
        m++;
    if (m == 4 || threads < 1 || threads > 64 || iters < 1 || iters > 1000000)
        bench_die("usage: bench-event-records distinct|create|shared|none "
                  "[THREADS 1..64 [ITERS 1..1000000]]");
    enum mode mode = (enum mode)m;
    CK(cudaSetDevice(bench_device));
    CK(cudaFree(NULL));

    struct worker *ws = bench_calloc((size_t)threads, sizeof *ws);
    pthread_t *th = bench_calloc((size_t)threads, sizeof *th);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        struct worker *w = &ws[t];
        w->mode = mode;
        w->iters = iters;
        w->go = &go;
        w->record_ns = bench_calloc((size_t)iters, sizeof(uint64_t));
        CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
        CK(cudaMalloc(&w->buf, BUF_BYTES));
        int nev = mode == DISTINCT || mode == CREATE ? iters : 1;
        w->events = bench_calloc((size_t)nev, sizeof(cudaEvent_t));
        for (int e = 0; e < (mode == CREATE ? 0 : nev); e++)
            CK(cudaEventCreateWithFlags(&w->events[e], cudaEventDisableTiming));
        if (pthread_create(&th[t], NULL, worker_main, w) != 0)
            bench_die("pthread_create failed");
    }
    CK(cudaDeviceSynchronize());
    uint64_t t0 = bench_now_ns();
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    uint64_t t_enqueued = bench_now_ns();
    CK(cudaDeviceSynchronize());
    uint64_t t_done = bench_now_ns();

    size_t n = (size_t)threads * (size_t)iters, at = 0;
    uint64_t *all = bench_calloc(n, sizeof(uint64_t));
    int max_thread = 0, max_index = 0;
    for (int t = 0; t < threads; t++) {
        for (int i = 0; i < iters; i++)
            if (ws[t].record_ns[i] > ws[max_thread].record_ns[max_index]) {
                max_thread = t;
                max_index = i;
            }
        memcpy(all + at, ws[t].record_ns, (size_t)iters * sizeof(uint64_t));
        at += (size_t)iters;
    }
    bench_sort_u64(all, n);

    json_begin();
    json_str("program", "bench-event-records");
    json_str("mode", names[mode]);
    json_num("threads", threads);
    json_num("iters", iters);
    json_num("enqueued_ms", (double)(t_enqueued - t0) / 1e6);
    json_num("done_ms", (double)(t_done - t0) / 1e6);
    json_num("record_p50_us", bench_pct_us(all, n, 50));
    json_num("record_p99_us", bench_pct_us(all, n, 99));
    json_num("record_max_us", bench_pct_us(all, n, 100));
    json_num("record_max_index", max_index);
    json_num("record_max_thread", max_thread);
    json_end();

    for (int t = 0; t < threads; t++) {
        int nev = mode == DISTINCT || mode == CREATE ? iters : 1;
        for (int e = 0; e < nev; e++)
            CK(cudaEventDestroy(ws[t].events[e]));
        CK(cudaFree(ws[t].buf));
        CK(cudaStreamDestroy(ws[t].stream));
        free(ws[t].events);
        free(ws[t].record_ns);
    }
    pthread_barrier_destroy(&go);
    free(all);
    free(ws);
    free(th);
    return 0;
}
