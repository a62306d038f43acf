/* Per-device pools of idle CUDA events: see event_pool.h. */
#include "event_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "stats.h"

struct pool {
    pthread_mutex_t lock; /* guards idle and count only */
    cudaEvent_t *idle;
    size_t count;
};

static struct pool *pools;
static int pool_count;
static size_t pool_max_idle;
static _Atomic size_t idle_total;

cudaError_t event_pool_init(int ndevices, size_t max_idle)
{
    pools = calloc((size_t)ndevices, sizeof *pools);
    if (pools == NULL)
        return cudaErrorMemoryAllocation;
    for (int d = 0; d < ndevices; d++) {
        pools[d].idle = malloc(max_idle * sizeof *pools[d].idle);
        if (pools[d].idle == NULL) {
            while (d-- > 0)
                free(pools[d].idle);
            free(pools);
            pools = NULL;
            return cudaErrorMemoryAllocation;
        }
        pthread_mutex_init(&pools[d].lock, NULL);
    }
    pool_count = ndevices;
    pool_max_idle = max_idle;
    atomic_store(&idle_total, 0);
    return cudaSuccess;
}

/* Create an event on device from any thread, restoring its current device. */
static cudaError_t create_on_device(int device, cudaEvent_t *event)
{
    int current;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess)
        return err;
    if (current != device && (err = cudaSetDevice(device)) != cudaSuccess)
        return err;
    err = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
    if (current != device) {
        cudaError_t back = cudaSetDevice(current);
        if (err == cudaSuccess && back != cudaSuccess) {
            cudaEventDestroy(*event);
            err = back;
        }
    }
    if (err == cudaSuccess)
        stats_add(&stats.events_created, 1);
    return err;
}

cudaError_t event_pool_take(int device, cudaEvent_t *event)
{
    struct pool *p = &pools[device];
    pthread_mutex_lock(&p->lock);
    if (p->count > 0) {
        *event = p->idle[--p->count];
        pthread_mutex_unlock(&p->lock);
        atomic_fetch_sub_explicit(&idle_total, 1, memory_order_relaxed);
        return cudaSuccess;
    }
    pthread_mutex_unlock(&p->lock);
    return create_on_device(device, event);
}

void event_pool_give(int device, cudaEvent_t *events, size_t n)
{
    struct pool *p = &pools[device];
    size_t kept;
    pthread_mutex_lock(&p->lock);
    kept = pool_max_idle - p->count;
    if (kept > n)
        kept = n;
    for (size_t i = 0; i < kept; i++)
        p->idle[p->count++] = events[i];
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_add_explicit(&idle_total, kept, memory_order_relaxed);
    for (size_t i = kept; i < n; i++)
        cudaEventDestroy(events[i]);
}

void event_pool_destroy_all(void)
{
    for (int d = 0; d < pool_count; d++) {
        struct pool *p = &pools[d];
        if (p->count > 0 && cudaSetDevice(d) == cudaSuccess)
            for (size_t i = 0; i < p->count; i++)
                cudaEventDestroy(p->idle[i]);
        pthread_mutex_destroy(&p->lock);
    }
    event_pool_abandon();
}

void event_pool_abandon(void)
{
    for (int d = 0; d < pool_count; d++)
        free(pools[d].idle);
    free(pools);
    pools = NULL;
    pool_count = 0;
    atomic_store(&idle_total, 0);
}

size_t event_pool_idle_count(void)
{
    return atomic_load_explicit(&idle_total, memory_order_relaxed);
}
