/* SPDX-License-Identifier: MIT */
/* The least an event-polling reclaimer must do: see event_watcher.h. */
#define _GNU_SOURCE
#include "event_watcher.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Events a lane may have recorded and not yet seen complete.  W4's GPU runs
 * far ahead of its cudaMalloc-bound threads, so a ring this deep was never
 * full there; in W1 it was, 3 times in one run (ring_waits says so). */
#define WATCH_RING 1024

/* One launching thread's ring, on cache lines of its own: the lane's thread
 * writes recorded, the watcher seen. */
struct watch_lane {
    alignas(64) _Atomic uint64_t recorded;
    alignas(64) _Atomic uint64_t seen;
    _Atomic uint64_t ring_waits;
    cudaEvent_t ring[WATCH_RING];
};

struct event_watcher {
    struct watch_lane *lanes;
    int nlanes;
    int device;
    unsigned poll_us;
    atomic_int stop;
    _Atomic pid_t tid;
    _Atomic uint64_t queries, passes, failed;
    pthread_t thread;
};

/* The watching thread.  Queries each lane's next unseen events in order
 * until one is not ready, then sleeps poll_us: a pass straight after one
 * that saw events complete would mostly find the next still running (1.9
 * queries an event in W4, 2026-11-27-h100-w4-query-floor.txt), where
 * cudefer's reclaimer makes 1.02.  Leaves once stopped with nothing
 * recorded left unseen. */
static void *watcher_main(void *arg)
{
    struct event_watcher *w = arg;
    struct timespec nap = { 0, (long)w->poll_us * 1000L };

    pthread_setname_np(pthread_self(), "event-watcher");
    atomic_store(&w->tid, (pid_t)syscall(SYS_gettid));
    cudaSetDevice(w->device);
    for (;;) {
        int stop = atomic_load(&w->stop), l;
        uint64_t behind = 0;

        for (l = 0; l < w->nlanes; l++) {
            struct watch_lane *ln = &w->lanes[l];
            uint64_t seen = atomic_load_explicit(&ln->seen, memory_order_relaxed);
            uint64_t rec = atomic_load_explicit(&ln->recorded, memory_order_acquire);

            while (seen < rec) {
                cudaError_t q = cudaEventQuery(ln->ring[seen % WATCH_RING]);

                atomic_fetch_add_explicit(&w->queries, 1, memory_order_relaxed);
                if (q == cudaErrorNotReady)
                    break;
                if (q != cudaSuccess) {
                    fprintf(stderr, "event_watcher: cudaEventQuery: %s\n",
                            cudaGetErrorString(q));
                    atomic_fetch_add_explicit(&w->failed, 1, memory_order_relaxed);
                }
                seen++;
            }
            atomic_store_explicit(&ln->seen, seen, memory_order_release);
            behind += rec - seen;
        }
        atomic_fetch_add_explicit(&w->passes, 1, memory_order_relaxed);
        if (stop && behind == 0)
            return NULL;
        nanosleep(&nap, NULL);
    }
}

/* Main thread, the device current.  See event_watcher.h. */
int watcher_start(struct event_watcher **out, int lanes, unsigned poll_us)
{
    struct event_watcher *w = calloc(1, sizeof *w);
    int l, k, rc;

    *out = NULL;
    if (!w || !(w->lanes = aligned_alloc(64, (size_t)lanes * sizeof *w->lanes))) {
        fprintf(stderr, "event_watcher: out of memory\n");
        free(w);
        return -1;
    }
    memset(w->lanes, 0, (size_t)lanes * sizeof *w->lanes);
    w->nlanes = lanes;
    w->poll_us = poll_us ? poll_us : 1;
    if (cudaGetDevice(&w->device) != cudaSuccess)
        w->device = 0;
    for (l = 0; l < lanes; l++)
        for (k = 0; k < WATCH_RING; k++) {
            cudaError_t e = cudaEventCreateWithFlags(&w->lanes[l].ring[k],
                                                     cudaEventDisableTiming);
            if (e != cudaSuccess) {
                fprintf(stderr, "event_watcher: cudaEventCreate: %s\n",
                        cudaGetErrorString(e));
                w->nlanes = l;
                while (k-- > 0)
                    cudaEventDestroy(w->lanes[l].ring[k]);
                goto fail;
            }
        }
    rc = pthread_create(&w->thread, NULL, watcher_main, w);
    if (rc) {
        fprintf(stderr, "event_watcher: pthread_create: %s\n", strerror(rc));
        goto fail;
    }
    while (atomic_load(&w->tid) == 0)
        sched_yield();
    *out = w;
    return 0;
fail:
    for (l = 0; l < w->nlanes; l++)
        for (k = 0; k < WATCH_RING; k++)
            cudaEventDestroy(w->lanes[l].ring[k]);
    free(w->lanes);
    free(w);
    return -1;
}

/* Lane lane's thread only.  Never blocks but to yield while the ring is full
 * (the watcher then sees one complete and frees a slot). */
cudaError_t watcher_record(struct event_watcher *w, int lane,
                           cudaStream_t stream)
{
    struct watch_lane *ln = &w->lanes[lane];
    uint64_t r = atomic_load_explicit(&ln->recorded, memory_order_relaxed);
    cudaError_t rc;

    if (r - atomic_load_explicit(&ln->seen, memory_order_acquire) >= WATCH_RING) {
        atomic_fetch_add_explicit(&ln->ring_waits, 1, memory_order_relaxed);
        while (r - atomic_load_explicit(&ln->seen, memory_order_acquire) >= WATCH_RING)
            sched_yield();
    }
    rc = cudaEventRecord(ln->ring[r % WATCH_RING], stream);
    if (rc == cudaSuccess)
        atomic_store_explicit(&ln->recorded, r + 1, memory_order_release);
    return rc;
}

/* Any thread; polls every 50 us. */
void watcher_drain(struct event_watcher *w)
{
    struct timespec nap = { 0, 50000L };
    int l;

    for (l = 0; l < w->nlanes; l++) {
        uint64_t target = atomic_load(&w->lanes[l].recorded);

        while (atomic_load(&w->lanes[l].seen) < target)
            nanosleep(&nap, NULL);
    }
}

/* Any thread. */
void watcher_stats_get(struct event_watcher *w, struct watcher_stats *out)
{
    int l;

    memset(out, 0, sizeof *out);
    for (l = 0; l < w->nlanes; l++) {
        out->recorded += atomic_load(&w->lanes[l].recorded);
        out->seen += atomic_load(&w->lanes[l].seen);
        out->ring_waits += atomic_load(&w->lanes[l].ring_waits);
    }
    out->failed = atomic_load(&w->failed);
    out->queries = atomic_load(&w->queries);
    out->passes = atomic_load(&w->passes);
}

/* Any thread. */
pid_t watcher_tid(struct event_watcher *w)
{
    return atomic_load(&w->tid);
}

/* Main thread, lanes joined.  Blocks until the watcher saw everything. */
void watcher_stop(struct event_watcher *w)
{
    int l, k;

    if (!w)
        return;
    atomic_store(&w->stop, 1);
    pthread_join(w->thread, NULL);
    for (l = 0; l < w->nlanes; l++)
        for (k = 0; k < WATCH_RING; k++)
            cudaEventDestroy(w->lanes[l].ring[k]);
    free(w->lanes);
    free(w);
}
