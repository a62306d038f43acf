/* SPDX-License-Identifier: MIT */
/* The stats' events_in_pool counts every idle event, in the pools and in
 * each thread's cache, though a thread's take and give no longer touch a
 * counter shared by all threads: while the threads that
 * took events live (each keeps the events of its stream's lane, shared by
 * its entries: stream_lane.h, at most LANE_EVENTS), and after they exit
 * (their caches and lanes go back to the pool). */
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"
#include "stream_lane.h"

#define THREADS 4
#define FIRST 45 /* events made, back in the pool after a flush */
#define SECOND 10 /* then taken through the thread's cache (batches of 32) */
#define PER_THREAD (FIRST + SECOND)

static pthread_barrier_t first_done, second_go, freed, checked;

static void free_some(cudaStream_t s, int n)
{
    bool refused = false;
    for (int i = 0; i < n; i++) {
        void *p = device_alloc(64);
        work_timed(s, 20, p);
        refused |= defer_free(p, s) != cudaSuccess;
    }
    if (refused)
        bail("defer_free refused");
}

static void *freer(void *arg)
{
    (void)arg;
    cudaStream_t s = stream_new();
    free_some(s, FIRST);
    pthread_barrier_wait(&first_done);
    pthread_barrier_wait(&second_go); /* the events are back in the pool */
    free_some(s, SECOND);
    pthread_barrier_wait(&freed);
    pthread_barrier_wait(&checked); /* the main thread counts meanwhile */
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return NULL;
}

static void *first_free(void *arg)
{
    (void)arg;
    void *p = device_alloc(64);
    if (defer_free(p, 0) != cudaSuccess)
        bail("the first free");
    return NULL;
}

int main(void)
{
    plan_lazy();
    /* Room for every event made: none is destroyed for want of it. */
    setenv("CUDEFER_EVENT_POOL", "65536", 1);
    fake_reset(1);
    /* The device's first miss stocks its pool (event_pool.c): made first,
     * by a thread that exits (its lane lets go of its event), so the
     * threads' frees are counted apart from it. */
    pthread_t primer;
    if (pthread_create(&primer, NULL, first_free, NULL) != 0)
        bail("pthread_create");
    pthread_join(primer, NULL);
    if (defer_flush() != cudaSuccess)
        bail("flush of the first free");
    uint64_t stock = stats_now().events_created;
    pthread_barrier_init(&first_done, NULL, THREADS + 1);
    pthread_barrier_init(&second_go, NULL, THREADS + 1);
    pthread_barrier_init(&freed, NULL, THREADS + 1);
    pthread_barrier_init(&checked, NULL, THREADS + 1);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, freer, NULL) != 0)
            bail("pthread_create");
    pthread_barrier_wait(&first_done);
    is_int(defer_flush(), cudaSuccess, "flush of the first frees");
    pthread_barrier_wait(&second_go);
    pthread_barrier_wait(&freed);
    is_int(defer_flush(), cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    is_int(st.released, THREADS * PER_THREAD + 1, "every free released");
    ok(stock > 1 && st.events_created - stock <= THREADS * FIRST,
       "%llu events made for %d frees after the first stock (%llu)",
       ULL(st.events_created - stock), THREADS * PER_THREAD, ULL(stock));
    ok(st.events_in_pool <= st.events_created &&
           st.events_in_pool + THREADS * LANE_EVENTS >= st.events_created,
       "idle while the threads live: in the pool or their caches (%llu), "
       "but for those their lanes keep", ULL(st.events_in_pool));
    is_int(fake_live_events(), st.events_created, "the fake agrees");
    pthread_barrier_wait(&checked);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    st = stats_now();
    is_int(st.events_in_pool, st.events_created,
           "all idle once the threads exited (their caches went to the pool)");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(stats_now().events_in_pool, 0, "none after shutdown");
    is_int(fake_live_events(), 0, "every event destroyed");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
