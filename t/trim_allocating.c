/* SPDX-License-Identifier: MIT */
/* defer_trim while other threads allocate from cudefer's memory pool
 * without pause (src/cache_upstream.c, trim_lock): the pool allocations
 * share a lock that the trim's measure takes alone, and a trim waiting
 * for it must not wait until the allocations stop.  Two threads take new
 * blocks in turn, each holding its cudaMallocFromPoolAsync until the
 * other is inside its own (a millisecond at least, 50 at most): some
 * allocation is under way at every moment.  The trim must end within
 * their 50 ms hand-over, long before the threads stop (3 s). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define RUN_MS 3000
#define MAX_BLOCKS 4000

/* Allocating threads inside their held cudaMallocFromPoolAsync now. */
static atomic_int inside;
static atomic_int stop;
static _Thread_local bool allocator;

/* The return hook of the pool allocation, on an allocating thread: held a
 * millisecond, then until the other thread is inside its own, or 50 ms
 * (the other cannot get in: the trim comes first). */
static void hold_allocation(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (!allocator)
        return;
    atomic_fetch_add(&inside, 1);
    sleep_ms(1);
    for (int i = 0; i < 50 && atomic_load(&inside) < 2 && !atomic_load(&stop);
         i++)
        sleep_ms(1);
    atomic_fetch_sub(&inside, 1);
}

struct grower {
    cudaStream_t s;
    void *p[MAX_BLOCKS];
    int n;
    cudaError_t err;
};

static void *grow(void *arg)
{
    struct grower *g = arg;
    allocator = true;
    while (!atomic_load(&stop) && g->n < MAX_BLOCKS) {
        g->err = alloc_checked(&g->p[g->n], 2 * MiB, g->s);
        if (g->err != cudaSuccess)
            break;
        g->n++;
    }
    return NULL;
}

static void *stop_later(void *arg)
{
    (void)arg;
    sleep_ms(RUN_MS);
    atomic_store(&stop, 1);
    return NULL;
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    fake_set_device_memory(0, (size_t)1 << 40);
    void *first = NULL;
    cudaStream_t s = stream_new();
    is_int(alloc_checked(&first, 2 * MiB, s), cudaSuccess,
           "cudefer started, its pool made");
    fake_set_return_hook(FAKE_MALLOC_ASYNC, hold_allocation, NULL);
    struct grower g[2] = {{.s = stream_new()}, {.s = stream_new()}};
    pthread_t t[2], stopper;
    pthread_create(&stopper, NULL, stop_later, NULL);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, grow, &g[i]);
    for (int i = 0; i < 2000 && fake_calls(FAKE_MALLOC_ASYNC) < 20; i++)
        sleep_ms(1);
    ok(fake_calls(FAKE_MALLOC_ASYNC) >= 20, "the threads allocate");
    double t0 = now_ms();
    size_t released = 0;
    is_int(defer_trim(&released), cudaSuccess, "trim");
    double took = now_ms() - t0;
    bool still = !atomic_load(&stop);
    ok(took < 1000 && still,
       "the trim ends in %.0f ms, while the threads still allocate (%s)",
       took, still ? "they do" : "they had stopped");
    pthread_join(stopper, NULL);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        is_int(g[i].err, cudaSuccess, "thread %d: %d blocks", i, g[i].n);
    }
    fake_set_return_hook(FAKE_MALLOC_ASYNC, NULL, NULL);
    int refused = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < g[i].n; k++)
            refused += defer_free(g[i].p[k], g[i].s) != cudaSuccess;
    is_int(refused, 0, "their blocks freed");
    is_int(defer_free(first, s), cudaSuccess, "the first block freed");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released twice or early");
    return 0;
}
