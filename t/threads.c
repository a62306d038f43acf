/* SPDX-License-Identifier: MIT */
/* Many threads deferring at once on their own, per-thread and the legacy
 * streams: every entry released exactly once, never early. */
#include <pthread.h>
#include <stdlib.h>

#include "helpers.h"

#define THREADS 16
#define PER_THREAD 3000

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    cudaStream_t own = stream_new();
    int refused = 0;
    for (int i = 0; i < PER_THREAD; i++) {
        unsigned pick = rand_r(&seed) % 3;
        cudaStream_t s = pick == 0 ? own : pick == 1 ? cudaStreamPerThread : 0;
        void *p = device_alloc(64);
        work_timed(s, rand_r(&seed) % 50, p);
        refused += defer_free(p, s) != cudaSuccess;
    }
    cudaStreamDestroy(own);
    return (void *)(intptr_t)refused;
}

int main(void)
{
    plan(5);
    fake_reset(1);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    long refused = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        refused += (intptr_t)r;
    }
    is_int(refused, 0, "no defer_free refused");
    is_int(defer_flush(), cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    is_int(st.released, THREADS * PER_THREAD, "every entry released once");
    is_int(fake_live_allocations(), 0, "no allocation left");
    defer_shutdown();
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    diag("%llu queries, %llu batches, largest %llu, %llu wake-ups",
         (unsigned long long)st.event_queries, (unsigned long long)st.batches,
         (unsigned long long)st.largest_batch, (unsigned long long)st.wakeups);
    return 0;
}
