/* SPDX-License-Identifier: MIT */
/* How many idle events a device keeps (include/cudefer.h's event_pool_max,
 * Note [Idle bound] in event_pool.c): CUDEFER_EVENT_POOL (N) in its pool,
 * plus up to min(EVENT_POOL_CACHE_MAX, N) in the cache of each live thread
 * that defers on it; N once those threads have exited; none with N = 0.
 * Counted by the stats (events_in_pool: the pool and the caches) and by
 * the fake (events made and not destroyed, the lanes' included).
 *
 * Each thread frees on a stream of its own behind work long enough that
 * its lane holds LANE_EVENTS pending events (stream_lane.h) and later
 * frees take events of their own; after a flush, one more free lets its
 * lane let go of the completed ones but its newest, into the thread's
 * cache, while the reclaimer gave the others to the pool. */
#include <pthread.h>
#include <stdlib.h>

#include "event_pool.h"
#include "helpers.h"
#include "stream_lane.h"

#define THREADS 4
#define FREES (LANE_EVENTS + 4) /* the last 4 take events of their own */
#define WORK_US 20000           /* each free's work: the lane's stay pending */

static pthread_barrier_t deferred, flushed, freed_again, counted;

static void free_behind_work(cudaStream_t s)
{
    void *p = device_alloc(64);
    work_timed(s, WORK_US, p);
    if (defer_free(p, s) != cudaSuccess)
        bail("defer_free refused");
}

static void *freer(void *arg)
{
    (void)arg;
    cudaStream_t s = stream_new();
    for (int i = 0; i < FREES; i++)
        free_behind_work(s);
    pthread_barrier_wait(&deferred);
    pthread_barrier_wait(&flushed);
    free_behind_work(s); /* the lane lets go of its completed events */
    pthread_barrier_wait(&freed_again);
    pthread_barrier_wait(&counted); /* the main thread counts meanwhile */
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return NULL;
}

static void bound_held(void)
{
    const char *env = getenv("CUDEFER_EVENT_POOL");
    size_t n = env != NULL ? strtoul(env, NULL, 10) : 0;
    size_t per_thread = n < EVENT_POOL_CACHE_MAX ? n : EVENT_POOL_CACHE_MAX;
    size_t bound = n + THREADS * per_thread;
    pthread_barrier_init(&deferred, NULL, THREADS + 1);
    pthread_barrier_init(&flushed, NULL, THREADS + 1);
    pthread_barrier_init(&freed_again, NULL, THREADS + 1);
    pthread_barrier_init(&counted, NULL, THREADS + 1);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, freer, NULL) != 0)
            bail("pthread_create");
    pthread_barrier_wait(&deferred);
    CHECK(defer_flush() == cudaSuccess, "flush of the frees");
    pthread_barrier_wait(&flushed);
    pthread_barrier_wait(&freed_again);
    CHECK(defer_flush() == cudaSuccess, "flush of the last frees");
    struct defer_stats st = stats_now();
    size_t live = fake_live_events();
    diag("N = %zu: %llu idle, %zu live while the threads live", n,
         ULL(st.events_in_pool), live);
    CHECK(st.released == THREADS * (FREES + 1), "every free released: %llu",
          ULL(st.released));
    CHECK(st.events_in_pool <= bound,
          "idle while the threads live: %llu, at most N + %d x %zu = %zu",
          ULL(st.events_in_pool), THREADS, per_thread, bound);
    /* The workload reaches past the pool's own N: the caches' part of the
     * bound is needed (each cache got up to LANE_EVENTS - 1). */
    CHECK(n == 0 || st.events_in_pool > n,
          "idle while the threads live: %llu, more than N = %zu",
          ULL(st.events_in_pool), n);
    CHECK(n > 0 || st.events_in_pool == 0,
          "idle while the threads live: %llu, none with N = 0",
          ULL(st.events_in_pool));
    CHECK(live <= st.events_in_pool + THREADS * LANE_EVENTS,
          "live events: %zu, the idle ones (%llu) and at most %d a lane",
          live, ULL(st.events_in_pool), LANE_EVENTS);
    pthread_barrier_wait(&counted);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    /* Their caches and lanes went to the pool; what did not fit was
     * destroyed. */
    st = stats_now();
    live = fake_live_events();
    CHECK(live <= n, "live events once the threads exited: %zu, at most %zu",
          live, n);
    CHECK(st.events_in_pool == live,
          "every live event idle once the threads exited: %llu of %zu",
          ULL(st.events_in_pool), live);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed at shutdown: %zu",
          fake_live_events());
}

int main(void)
{
    plan_lazy();
    /* 8: each cache keeps the LANE_EVENTS - 1 = 7 its lane lets go of;
     * 4: no more than 4 of them (it drains to the pool at the fifth). */
    fork_scenario("idle events kept", "CUDEFER_EVENT_POOL=8", 1, 30000,
                  bound_held);
    fork_scenario("idle events kept", "CUDEFER_EVENT_POOL=4", 1, 30000,
                  bound_held);
    fork_scenario("no idle event kept", "CUDEFER_EVENT_POOL=0", 1, 30000,
                  bound_held);
    return 0;
}
