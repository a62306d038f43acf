/* Entries with their events, pooled per device and cached per thread: see
 * event_pool.h. */
#include "event_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "release.h"
#include "report.h"
#include "stats.h"

/* Per-thread cache: devices beyond CACHED_DEVICES use the pool directly. */
#define CACHED_DEVICES 16
#define BATCH 32 /* entries moved between a cache and a pool at once */

struct pool {
    pthread_mutex_t lock; /* guards head and count only */
    struct entry *head;   /* chained by fifo_next */
    size_t count;
};

/* A thread's cache.  Only its thread writes count (plain stores, relaxed):
 * the idle count reads it, so a take moves no cache line shared with other
 * threads (issue 13, item 4). */
struct thread_cache {
    struct entry *head[CACHED_DEVICES];
    _Atomic size_t count[CACHED_DEVICES];
    struct thread_cache *next, **prev; /* in the registry */
};

static struct pool *pools;
static int pool_count;
static size_t pool_max_idle;
static _Atomic size_t idle_total; /* in the pools (the caches hold more) */

/* Every thread cache, so shutdown can empty them. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_cache *registry;
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;
static _Thread_local struct thread_cache cache;
static _Thread_local bool cache_registered;

/* ---- pools ----------------------------------------------------------------- */

/* Push a chain of entries onto device's pool; returns the entries that did
 * not fit (the pool is bounded), chained. */
static struct entry *pool_push(int device, struct entry *first)
{
    struct pool *p = &pools[device];
    size_t room, kept = 0;
    struct entry *last = NULL, *rest = first;
    pthread_mutex_lock(&p->lock);
    room = pool_max_idle > p->count ? pool_max_idle - p->count : 0;
    while (rest != NULL && kept < room) {
        last = rest;
        rest = rest->fifo_next;
        kept++;
    }
    if (last != NULL) {
        last->fifo_next = p->head;
        p->head = first;
        p->count += kept;
    }
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_add_explicit(&idle_total, kept, memory_order_relaxed);
    return rest;
}

/* Pop up to n entries from device's pool, chained; *got says how many. */
static struct entry *pool_pop(int device, size_t n, size_t *got)
{
    struct pool *p = &pools[device];
    struct entry *first, *last = NULL;
    size_t k = 0;
    pthread_mutex_lock(&p->lock);
    first = p->head;
    for (struct entry *e = first; e != NULL && k < n; e = e->fifo_next) {
        last = e;
        k++;
    }
    if (last != NULL) {
        p->head = last->fifo_next;
        last->fifo_next = NULL;
        p->count -= k;
    } else {
        first = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    atomic_fetch_sub_explicit(&idle_total, k, memory_order_relaxed);
    *got = k;
    return first;
}

/* Free a chain of entries and destroy their events (unless the events'
 * device cannot be used any more: then they are only forgotten). */
static void free_chain(struct entry *e, bool destroy_events)
{
    while (e != NULL) {
        struct entry *next = e->fifo_next;
        static _Atomic bool reported; /* once: thousands may follow */
        cudaError_t err =
            destroy_events ? cudaEventDestroy(e->event) : cudaSuccess;
        if (err != cudaSuccess && !atomic_exchange(&reported, true))
            report_cuda("event pool", "cudaEventDestroy", err,
                        "; such events are forgotten (reported once)");
        release_forget_pointers(e);
        free(e);
        e = next;
    }
}

/* Free a chain of entries and destroy their events. */
static void destroy_chain(struct entry *e)
{
    free_chain(e, true);
}

cudaError_t event_pool_init(int ndevices, size_t max_idle)
{
    pools = calloc((size_t)ndevices, sizeof *pools);
    if (pools == NULL)
        return cudaErrorMemoryAllocation;
    for (int d = 0; d < ndevices; d++)
        pthread_mutex_init(&pools[d].lock, NULL);
    pool_count = ndevices;
    pool_max_idle = max_idle;
    atomic_store(&idle_total, 0);
    return cudaSuccess;
}

/* ---- thread caches ------------------------------------------------------- */

/* The owning thread (or anyone, once the owner is gone): set a count. */
static void set_count(struct thread_cache *tc, int device, size_t n)
{
    atomic_store_explicit(&tc->count[device], n, memory_order_relaxed);
}

static size_t count_of(struct thread_cache *tc, int device)
{
    return atomic_load_explicit(&tc->count[device], memory_order_relaxed);
}

/* Thread exit: the cache goes back to the pools. */
static void cache_at_thread_exit(void *c)
{
    struct thread_cache *tc = c;
    pthread_mutex_lock(&registry_lock);
    if (tc->prev == NULL) { /* emptied and unlinked by shutdown */
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
        destroy_chain(pool_push(d, tc->head[d]));
        tc->head[d] = NULL;
        set_count(tc, d, 0);
    }
    if (tc->prev != NULL) {
        *tc->prev = tc->next;
        if (tc->next != NULL)
            tc->next->prev = tc->prev;
        tc->prev = NULL;
    }
    pthread_mutex_unlock(&registry_lock);
}

static void make_cache_key(void)
{
    pthread_key_create(&cache_key, cache_at_thread_exit);
}

static void register_cache(void)
{
    pthread_once(&cache_key_once, make_cache_key);
    pthread_setspecific(cache_key, &cache);
    pthread_mutex_lock(&registry_lock);
    cache.next = registry;
    if (registry != NULL)
        registry->prev = &cache.next;
    cache.prev = &registry;
    registry = &cache;
    pthread_mutex_unlock(&registry_lock);
    cache_registered = true;
}

/* Create an entry with an event on device, restoring the current device.
 * On failure NULL, with the error and the call that failed. */
static struct entry *create_entry(int device, cudaError_t *err,
                                  const char **call)
{
    struct entry *e = calloc(1, sizeof *e);
    int current;
    if (e == NULL) {
        *err = cudaErrorMemoryAllocation;
        *call = "calloc";
        return NULL;
    }
    if ((*err = cudaGetDevice(&current)) != cudaSuccess) {
        *call = "cudaGetDevice";
        goto fail;
    }
    if (current != device && (*err = cudaSetDevice(device)) != cudaSuccess) {
        *call = "cudaSetDevice";
        goto fail;
    }
    *err = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
    *call = "cudaEventCreateWithFlags";
    if (current != device) {
        cudaError_t back = cudaSetDevice(current);
        if (*err == cudaSuccess && back != cudaSuccess) {
            cudaEventDestroy(e->event);
            *err = back;
            *call = "cudaSetDevice (back to the caller's device)";
        }
    }
    if (*err != cudaSuccess)
        goto fail;
    stats_add(&stats.events_created, 1);
    e->device = device;
    e->ptrs = &e->one_ptr;
    return e;
fail:
    free(e);
    return NULL;
}

struct entry *event_pool_take(int device, cudaError_t *err,
                              const char **call)
{
    if (device >= CACHED_DEVICES) {
        size_t got;
        struct entry *e = pool_pop(device, 1, &got);
        return e != NULL ? e : create_entry(device, err, call);
    }
    if (!cache_registered)
        register_cache();
    if (cache.head[device] == NULL) {
        size_t got;
        cache.head[device] = pool_pop(device, BATCH, &got);
        set_count(&cache, device, got);
        if (got == 0)
            return create_entry(device, err, call);
    }
    struct entry *e = cache.head[device];
    cache.head[device] = e->fifo_next;
    set_count(&cache, device, count_of(&cache, device) - 1);
    e->fifo_next = NULL;
    return e;
}

void event_pool_give_unused(struct entry *e)
{
    int d = e->device;
    e->fifo_next = NULL;
    if (d >= CACHED_DEVICES || !cache_registered) {
        destroy_chain(pool_push(d, e));
        return;
    }
    e->fifo_next = cache.head[d];
    cache.head[d] = e;
    set_count(&cache, d, count_of(&cache, d) + 1);
}

void event_pool_give_chain(int device, struct entry *first)
{
    destroy_chain(pool_push(device, first));
}

void event_pool_destroy_all(void)
{
    pthread_mutex_lock(&registry_lock);
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next) {
        for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
            if (tc->head[d] != NULL)
                free_chain(tc->head[d], cudaSetDevice(d) == cudaSuccess);
            tc->head[d] = NULL;
            set_count(tc, d, 0);
        }
        tc->prev = NULL; /* unlinked: its thread's exit leaves the list be */
    }
    registry = NULL;
    pthread_mutex_unlock(&registry_lock);
    for (int d = 0; d < pool_count; d++) {
        if (pools[d].head != NULL)
            free_chain(pools[d].head, cudaSetDevice(d) == cudaSuccess);
        pthread_mutex_destroy(&pools[d].lock);
    }
    event_pool_abandon();
}

void event_pool_after_fork(void)
{
    /* Another thread may have held these locks at the fork: they are reset.
     * The pools stay as they are (reachable, never used again). */
    pthread_mutex_init(&registry_lock, NULL);
    for (int d = 0; d < pool_count; d++)
        pthread_mutex_init(&pools[d].lock, NULL);
    /* The other threads are gone; their caches (still mapped) go to the
     * pools, so nothing is lost track of. */
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next)
        for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
            struct entry *e = tc->head[d];
            while (e != NULL) {
                struct entry *next = e->fifo_next;
                e->fifo_next = pools[d].head;
                pools[d].head = e;
                pools[d].count++;
                atomic_fetch_add_explicit(&idle_total, 1,
                                          memory_order_relaxed);
                e = next;
            }
            tc->head[d] = NULL;
            set_count(tc, d, 0);
        }
}

void event_pool_abandon(void)
{
    free(pools);
    pools = NULL;
    pool_count = 0;
    atomic_store(&idle_total, 0);
    registry = NULL;
    cache_registered = false;
    for (int d = 0; d < CACHED_DEVICES; d++) {
        cache.head[d] = NULL;
        set_count(&cache, d, 0);
    }
}

size_t event_pool_idle_count(void)
{
    size_t n = atomic_load_explicit(&idle_total, memory_order_relaxed);
    if (pthread_mutex_trylock(&registry_lock) != 0)
        return n; /* defer_stats_get never blocks */
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next)
        for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++)
            n += count_of(tc, d);
    pthread_mutex_unlock(&registry_lock);
    return n;
}
