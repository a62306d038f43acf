/* SPDX-License-Identifier: MIT */
/* Entries and shared events, pooled per device and cached per thread: see
 * event_pool.h. */
#include "event_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "clock.h"
#include "cuda.h"
#include "entry_slab.h"
#include "pool_stack.h"
#include "release.h"
#include "report.h"
#include "stats.h"
#include "stream_lane.h"

/* Per-thread cache: devices beyond CACHED_DEVICES use the pool directly. */
#define CACHED_DEVICES 16
#define BATCH EVENT_POOL_BATCH /* event_pool.h */
#define REFILL 4 /* events the reclaimer makes a pass for a lane's want */
/* A device's first miss makes STOCK events (at most half of what a pool
 * keeps, CUDEFER_EVENT_POOL, but a BATCH at least, the pool's bound
 * permitting), until STOCK_NS have passed; a pool keeps
 * RESERVE of its idle events (at most a quarter) for lanes that hold none.
 * Why: on an H100 (W6: 64 threads, 16 streams each, callbacks behind a
 * gate) the sharing lanes of the first threads took every idle event (8 a
 * lane), and a later thread's first callback on a stream made its event
 * while 63 threads recorded: 87-349 ms, for the driver's lock taken for
 * writing waits behind them.  With the stock and the reserve the slowest
 * call took 6-24 ms, calls/s as without them (a stock of 4,096 or a
 * reserve of 256 measured the same).
 * Made before the device is busy, an event costs 0.2-0.3 us: the first
 * miss takes about 1-2 ms. */
#define STOCK 2048
#define STOCK_NS 5000000ull
#ifndef EVENT_POOL_RESERVE /* to measure its effect: CPPFLAGS=-D... */
#define EVENT_POOL_RESERVE 1024
#endif
#define RESERVE EVENT_POOL_RESERVE

enum kind { KIND_ENTRY, KIND_EVENT, KINDS };

struct pool {
    struct pool_stack items; /* the idle items, in batches */
    _Atomic bool wanted; /* events: a lane found none idle (refill) */
    _Atomic bool stocked; /* events: made ahead at the first miss (stock) */
    /* Events: idle ones kept for lanes that hold none: pool_reserve, but
     * no more than half of what the stock made (a stock its deadline cut
     * short, on a busy device or under a sanitizer, would else be all
     * reserve, and sharing lanes would find none). */
    _Atomic size_t reserve;
};

/* A thread's cache.  Only its thread writes count (plain stores, relaxed):
 * the idle count reads it, so a take moves no cache line shared with other
 * threads.  Its items are not counted against the pool's bound (Note [Idle
 * bound]). */
struct thread_cache {
    struct pool_link *head[KINDS][CACHED_DEVICES];
    _Atomic size_t count[KINDS][CACHED_DEVICES];
    struct lane_table lanes;
    struct thread_cache *next, **prev; /* in the registry */
};

static struct pool *pools[KINDS];
static int pool_count;
static size_t pool_max_idle;
static size_t pool_reserve; /* the most a pool keeps for lanes with none */
static bool (*device_failed)(int device); /* event_pool_init's */
static _Atomic size_t idle_events; /* in the pools (the caches hold more) */

/* Every thread cache, so shutdown can empty them. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_cache *registry;
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;
static _Thread_local struct thread_cache cache;
static _Thread_local bool cache_registered;

static struct entry *entry_of_link(struct pool_link *l)
{
    return (struct entry *)((char *)l - offsetof(struct entry, link));
}

static struct shared_event *event_of_link(struct pool_link *l)
{
    return (struct shared_event *)((char *)l -
                                   offsetof(struct shared_event, link));
}

/* ---- pools ----------------------------------------------------------------- */

/* Push a chain of items of kind k onto device's pool; returns the items that
 * did not fit (the pool is bounded), as batches (pool_stack.h). */
static struct pool_link *pool_push(enum kind k, int device,
                                   struct pool_link *first)
{
    size_t kept;
    struct pool_link *rest = pool_stack_push(&pools[k][device].items, first,
                                             BATCH, pool_max_idle, &kept);
    if (k == KIND_EVENT)
        atomic_fetch_add_explicit(&idle_events, kept, memory_order_relaxed);
    return rest;
}

/* Pop a batch of at most n items of kind k from device's pool (or one item,
 * when the top batch is larger or would leave fewer than keep), chained;
 * *got says how many. */
static struct pool_link *pool_pop(enum kind k, int device, size_t n,
                                  size_t keep, size_t *got)
{
    struct pool_link *first =
        pool_stack_pop(&pools[k][device].items, n, keep, got);
    if (k == KIND_EVENT)
        atomic_fetch_sub_explicit(&idle_events, *got, memory_order_relaxed);
    return first;
}

/* Free a chain of items of kind k; events are destroyed too (unless their
 * device cannot be used any more: then they are only forgotten). */
static void free_chain(enum kind k, struct pool_link *l, bool destroy_events)
{
    while (l != NULL) {
        struct pool_link *next = l->next;
        if (k == KIND_ENTRY) {
            struct entry *e = entry_of_link(l);
            release_forget_pointers(e);
            entry_slab_free(e);
        } else {
            struct shared_event *ev = event_of_link(l);
            static _Atomic bool reported; /* once: thousands may follow */
            cudaError_t err =
                destroy_events && !device_failed(ev->device)
                    ? cuda_event_destroy(ev->event)
                    : cudaSuccess;
            if (err != cudaSuccess && !atomic_exchange(&reported, true))
                cuda_report_failure("event pool", "cudaEventDestroy", err,
                                    "; such events are forgotten (reported "
                                    "once)");
            free(ev);
        }
        l = next;
    }
}

/* Free batches of items of kind k (as free_chain). */
static void free_batches(enum kind k, struct pool_link *b, bool destroy_events)
{
    while (b != NULL) {
        struct pool_link *next = pool_stack_next_batch(b);
        free_chain(k, b, destroy_events);
        b = next;
    }
}

/* Give a chain back to device's pool; what does not fit is freed. */
static void give_to_pool(enum kind k, int device, struct pool_link *first)
{
    if (first != NULL)
        free_batches(k, pool_push(k, device, first), true);
}

cudaError_t event_pool_init(int ndevices, size_t max_idle,
                            bool (*failed)(int device))
{
    device_failed = failed;
    for (int k = 0; k < KINDS; k++) {
        pools[k] = calloc((size_t)ndevices, sizeof *pools[k]);
        if (pools[k] == NULL) {
            free(pools[KIND_ENTRY]);
            pools[KIND_ENTRY] = NULL;
            return cudaErrorMemoryAllocation;
        }
        for (int d = 0; d < ndevices; d++)
            pool_stack_init(&pools[k][d].items);
    }
    pool_count = ndevices;
    pool_max_idle = max_idle;
    pool_reserve = max_idle / 4 < RESERVE ? max_idle / 4 : RESERVE;
    atomic_store(&idle_events, 0);
    return cudaSuccess;
}

/* ---- thread caches ------------------------------------------------------- */

/* The owning thread (or anyone, once the owner is gone): set a count. */
static void set_count(struct thread_cache *tc, enum kind k, int device,
                      size_t n)
{
    atomic_store_explicit(&tc->count[k][device], n, memory_order_relaxed);
}

static size_t count_of(struct thread_cache *tc, enum kind k, int device)
{
    return atomic_load_explicit(&tc->count[k][device], memory_order_relaxed);
}

/* Registry lock held: empty tc's caches into the pools and unlink it. */
static void retire_cache_locked(struct thread_cache *tc)
{
    for (int k = 0; k < KINDS; k++)
        for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
            give_to_pool((enum kind)k, d, tc->head[k][d]);
            tc->head[k][d] = NULL;
            set_count(tc, (enum kind)k, d, 0);
        }
    if (tc->prev != NULL) {
        *tc->prev = tc->next;
        if (tc->next != NULL)
            tc->next->prev = tc->prev;
        tc->prev = NULL;
    }
}

/* Thread exit: the lanes let go of their events (those whose entries are
 * all done come back to this cache), and the cache goes back to the pools.
 * Under the registry lock, which shutdown's letting go takes too.  The
 * thread is unregistered: a later pthread-key destructor of its that
 * defers again registers it again, and so gets this destructor called in
 * the next round (else that call's lane and cache were never let go of:
 * their events outlived shutdown; t/lane_lifetimes). */
static void cache_at_thread_exit(void *c)
{
    struct thread_cache *tc = c;
    pthread_mutex_lock(&registry_lock);
    if (tc->prev != NULL) { /* else emptied and unlinked by shutdown */
        stream_lane_let_go_all(&tc->lanes);
        retire_cache_locked(tc);
    }
    pthread_mutex_unlock(&registry_lock);
    cache_registered = false; /* tc is this thread's cache */
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

/* Who takes an event: a lane that holds none (or a free that never
 * shares), which may take the pool's reserve, or a sharing lane that holds
 * one, which may not (it can record its newest again). */
enum taker { TAKER_NEEDS, TAKER_SPARE };

/* Pop up to n items of kind k for who from device's pool: above the
 * reserve (events), else one of the reserve for a taker that needs it. */
static struct pool_link *pool_pop_for(enum kind k, int device, size_t n,
                                      enum taker who, size_t *got)
{
    size_t keep = k == KIND_EVENT ? atomic_load_explicit(
                                         &pools[k][device].reserve,
                                         memory_order_relaxed)
                                   : 0;
    struct pool_link *l = pool_pop(k, device, n, keep, got);
    if (l == NULL && keep > 0 && who == TAKER_NEEDS)
        l = pool_pop(k, device, 1, 0, got);
    return l;
}

/* Take one item of kind k for device: from the thread's cache, refilled
 * from the pool (pool_pop_for); NULL when there is none to take. */
static struct pool_link *take(enum kind k, int device, enum taker who)
{
    size_t got;
    if (device >= CACHED_DEVICES)
        return pool_pop_for(k, device, 1, who, &got);
    if (!cache_registered)
        register_cache();
    struct pool_link *l = cache.head[k][device];
    if (l == NULL) {
        l = pool_pop_for(k, device, BATCH, who, &got);
        set_count(&cache, k, device, got);
        if (l == NULL)
            return NULL;
    }
    cache.head[k][device] = l->next;
    set_count(&cache, k, device, count_of(&cache, k, device) - 1);
    l->next = NULL;
    return l;
}

/* Note [Idle bound]
 * A device's pool keeps at most CUDEFER_EVENT_POOL idle items of each kind
 * (pool_max_idle); each thread's cache keeps up to EVENT_POOL_CACHE_MAX
 * more of each kind for the device, and no more than the pool may (give).
 * So a device keeps at most CUDEFER_EVENT_POOL idle events (and entries),
 * plus min(EVENT_POOL_CACHE_MAX, CUDEFER_EVENT_POOL) for each live thread
 * that defers on it: as README.md, include/cudefer.h and cudefer(7) say,
 * and t/event_pool_bound measures.  Once a thread exits, its cache goes to
 * the pool, and what does not fit is freed; with CUDEFER_EVENT_POOL=0
 * nothing is kept idle anywhere.
 *
 * Why the caches are not counted against CUDEFER_EVENT_POOL: a give into a
 * cache would have to know the device's total, a count every thread's take
 * and give writes (the shared cache line the caches exist to spare).  To
 * keep take and give thread-local, each cache would have to take room for
 * its items from the pool's bound ahead, a batch at a time under the
 * pool's lock; but that room stays taken while the cache is empty (its
 * events in the thread's lanes, or the thread gone quiet), two batches a
 * thread: with the default 4,096, W6's 64 threads could hold all of it,
 * the pool would then destroy every event the reclaimer gives back, and
 * the launching threads would make events, each waiting for the driver's
 * lock (stream_lane.h). */

/* Give one item of kind k back to the thread's cache (or the pool).  A
 * cache holds at most EVENT_POOL_CACHE_MAX, and no more than a pool may
 * (lanes give their completed events back here: a thread's cache must not
 * keep what CUDEFER_EVENT_POOL says to destroy, and with 0 keeps none);
 * beyond that it goes to the pool.  Note [Idle bound]. */
static void give(enum kind k, int device, struct pool_link *l)
{
    l->next = NULL;
    if (device >= CACHED_DEVICES || !cache_registered) {
        give_to_pool(k, device, l);
        return;
    }
    l->next = cache.head[k][device];
    size_t n = count_of(&cache, k, device) + 1;
    if (n > EVENT_POOL_CACHE_MAX || n > pool_max_idle) {
        cache.head[k][device] = NULL;
        set_count(&cache, k, device, 0);
        give_to_pool(k, device, l);
        return;
    }
    cache.head[k][device] = l;
    set_count(&cache, k, device, n);
}

/* ---- entries ------------------------------------------------------------- */

/* A slab's first entry for the calling thread; the others go to its cache
 * (give: what the cache cannot keep goes to the pool, what the pool cannot
 * keep is freed).  No more than a pool keeps, and the one taken: with a
 * pool below ENTRY_SLAB_MIN - 1, one entry, calloc'ed (entry_slab.h).
 * NULL when the system refused the memory. */
static struct entry *entries_from_new_slab(int device)
{
    size_t n;
    size_t max = pool_max_idle < ENTRY_SLAB_ENTRIES ? pool_max_idle + 1
                                                    : ENTRY_SLAB_ENTRIES;
    struct entry *e = entry_slab_make(max, &n);
    if (e == NULL)
        return NULL;
    for (size_t i = 1; i < n; i++) {
        e[i].device = device;
        e[i].pooled = true;
        give(KIND_ENTRY, device, &e[i].link);
    }
    return e;
}

struct entry *event_pool_take_entry(int device, cudaError_t *err,
                                    const char **call)
{
    struct pool_link *l = take(KIND_ENTRY, device, TAKER_NEEDS);
    struct entry *e = l != NULL ? entry_of_link(l)
                                : entries_from_new_slab(device);
    if (e == NULL) {
        *err = cudaErrorMemoryAllocation;
        *call = "mmap";
        return NULL;
    }
    e->device = device;
    e->pooled = true;
    e->ptrs = &e->one_ptr;
    return e;
}

void event_pool_give_unused(struct entry *e)
{
    give(KIND_ENTRY, e->device, &e->link);
}

/* ---- events -------------------------------------------------------------- */

/* Create an event on device, restoring the current device.  On failure
 * NULL, with the error and the call that failed. */
static struct shared_event *create_event(int device, cudaError_t *err,
                                         const char **call)
{
    struct shared_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL) {
        *err = cudaErrorMemoryAllocation;
        *call = "calloc";
        return NULL;
    }
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    if ((*err = cuda_switch_device(&sw, device, call)) != cudaSuccess)
        goto fail;
    *err = cuda_event_create(&ev->event);
    *call = "cudaEventCreateWithFlags";
    cudaError_t back = cuda_switch_back(
        &sw, *err == cudaSuccess ? NULL : "event creation");
    if (*err == cudaSuccess && back != cudaSuccess) {
        cuda_event_destroy(ev->event);
        *err = back;
        *call = "cudaSetDevice (back to the caller's device)";
    }
    if (*err != cudaSuccess)
        goto fail;
    stats_add(&stats.events_created, 1);
    ev->device = device;
    return ev;
fail:
    free(ev);
    return NULL;
}

/* An event taken for a new use: nothing referenced, recorded or seen. */
static struct shared_event *blank(struct shared_event *ev)
{
    ev->taken = 0;
    atomic_store_explicit(&ev->completed, 0, memory_order_relaxed);
    atomic_store_explicit(&ev->refs, 0, memory_order_relaxed);
    return ev;
}

/* Make up to n events of device into its pool, as much as it has room for
 * (CUDEFER_EVENT_POOL), until the monotonic clock passes until (each
 * creation may wait for the driver's lock: the first is always made);
 * returns how many.  A failure ends the batch, said once per process (each
 * pass of the reclaimer may meet it again). */
static size_t make_ahead(int device, size_t n, uint64_t until)
{
    size_t idle = pool_stack_count(&pools[KIND_EVENT][device].items);
    size_t room = pool_max_idle > idle ? pool_max_idle - idle : 0, made = 0;
    struct pool_link *chain = NULL;
    for (; made < n && made < room && (made == 0 || now_ns() < until);
         made++) {
        cudaError_t err;
        const char *call;
        struct shared_event *ev = create_event(device, &err, &call);
        if (ev == NULL) { /* the next take that finds none asks again */
            /* Made ahead, on a launching thread inside its defer call (the
             * stock) or on the reclaimer: the failure (a runtime call's,
             * where the driver's was not made) is no error of the
             * application's next cudaGetLastError to find. */
            cuda_forget_failure_left(err);
            static _Atomic bool reported;
            if (!atomic_exchange(&reported, true))
                cuda_report_failure("event pool", call, err,
                                    "; fewer idle events made ahead (reported "
                                    "once)");
            break;
        }
        ev->link.next = chain;
        chain = &ev->link;
    }
    if (chain != NULL)
        give_to_pool(KIND_EVENT, device, chain);
    return made;
}

/* device's first miss: STOCK more events into its pool (at most half of
 * what it keeps, a BATCH at least, no more than it has room for), made
 * now on the calling thread in batches that other threads may take at
 * once, for STOCK_NS at most: a device's first defer calls usually come
 * before its streams run far behind, when an event costs 0.2-0.3 us (an
 * H100), and then a thread's first entry on each stream finds one idle
 * (see RESERVE).  A program whose first call comes while other threads
 * keep the device's queues full pays the driver's wait (stream_lane.h) for
 * the first of these creations, and the deadline stops the rest. */
static void stock(int device)
{
    if (device >= pool_count ||
        atomic_exchange(&pools[KIND_EVENT][device].stocked, true))
        return;
    size_t want = pool_max_idle / 2 < STOCK ? pool_max_idle / 2 : STOCK;
    uint64_t until = now_ns() + STOCK_NS;
    if (want < BATCH)
        want = BATCH;
    size_t made = 0;
    while (made < want && now_ns() < until) {
        size_t n = make_ahead(device,
                              want - made < BATCH ? want - made : BATCH,
                              until);
        if (n == 0)
            break; /* the pool is full, or a creation failed */
        made += n;
    }
    atomic_store_explicit(&pools[KIND_EVENT][device].reserve,
                          pool_reserve < made / 2 ? pool_reserve : made / 2,
                          memory_order_relaxed);
}

struct shared_event *event_pool_take_pooled_event(int device)
{
    struct pool_link *l = take(KIND_EVENT, device, TAKER_NEEDS);
    return l != NULL ? blank(event_of_link(l)) : NULL;
}

struct shared_event *event_pool_make_event(int device, cudaError_t *err,
                                           const char **call)
{
    struct shared_event *ev = create_event(device, err, call);
    if (ev == NULL)
        return NULL;
    stock(device);
    return blank(ev);
}

bool event_pool_keeps_idle(void)
{
    return pool_max_idle > 0;
}

struct shared_event *event_pool_take_idle_event(int device)
{
    struct pool_link *l = take(KIND_EVENT, device, TAKER_SPARE);
    if (l == NULL) {
        atomic_store_explicit(&pools[KIND_EVENT][device].wanted, true,
                              memory_order_relaxed);
        return NULL;
    }
    return blank(event_of_link(l));
}

size_t event_pool_refill(void)
{
    size_t made = 0;
    for (int d = 0; d < pool_count; d++)
        if (atomic_load_explicit(&pools[KIND_EVENT][d].wanted,
                                 memory_order_relaxed) &&
            atomic_exchange(&pools[KIND_EVENT][d].wanted, false) &&
            !device_failed(d))
            made += make_ahead(d, REFILL, UINT64_MAX);
    return made;
}

void event_pool_give_event(struct shared_event *ev)
{
    give(KIND_EVENT, ev->device, &ev->link);
}

void event_pool_give_chain(int device, struct pool_link *entries,
                           struct pool_link *events)
{
    if (entries != NULL)
        give_to_pool(KIND_ENTRY, device, entries);
    if (events != NULL)
        give_to_pool(KIND_EVENT, device, events);
}

struct lane_table *event_pool_lanes(void)
{
    if (!cache_registered)
        register_cache();
    return &cache.lanes;
}

/* ---- shutdown, fork, statistics ----------------------------------------- */

void event_pool_destroy_all(void)
{
    /* Every entry is done: the lanes' events come back to the pools as they
     * let go (this thread has no cache).  Their threads are outside cudefer
     * (the gate is closed), so their lanes can be emptied from here. */
    pthread_mutex_lock(&registry_lock);
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next)
        stream_lane_let_go_all(&tc->lanes);
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next) {
        for (int k = 0; k < KINDS; k++)
            for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
                if (tc->head[k][d] != NULL)
                    free_chain((enum kind)k, tc->head[k][d],
                               cuda_set_device(d) == cudaSuccess);
                tc->head[k][d] = NULL;
                set_count(tc, (enum kind)k, d, 0);
            }
        tc->prev = NULL; /* unlinked: its thread's exit leaves the list be */
    }
    registry = NULL;
    pthread_mutex_unlock(&registry_lock);
    for (int k = 0; k < KINDS; k++)
        for (int d = 0; d < pool_count; d++) {
            struct pool_link *b = pool_stack_take_all(&pools[k][d].items);
            if (b != NULL)
                free_batches((enum kind)k, b,
                             cuda_set_device(d) == cudaSuccess);
            pthread_mutex_destroy(&pools[k][d].items.lock);
        }
    event_pool_abandon();
}

void event_pool_after_fork(void)
{
    /* Another thread may have held these locks at the fork: they are reset.
     * The pools stay as they are (reachable, never used again). */
    pthread_mutex_init(&registry_lock, NULL);
    for (int k = 0; k < KINDS; k++)
        for (int d = 0; d < pool_count; d++)
            pool_stack_init(&pools[k][d].items);
    /* Nothing overflows a pool here: what does not fit is destroyed, a CUDA
     * call, and a thread exiting in the child gives its lanes' events and
     * its cache back (t/lane_lifetimes). */
    pool_max_idle = SIZE_MAX;
    /* The other threads are gone; their caches (still mapped) go to the
     * pools, so nothing is lost track of. */
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next)
        for (int k = 0; k < KINDS; k++)
            for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++) {
                if (tc->head[k][d] != NULL) /* all fit: no maximum */
                    pool_push((enum kind)k, d, tc->head[k][d]);
                tc->head[k][d] = NULL;
                set_count(tc, (enum kind)k, d, 0);
            }
}

void event_pool_abandon(void)
{
    /* First: a fork child of this moment (event_pool_after_fork) walks
     * pool_count pools. */
    pool_count = 0;
    for (int k = 0; k < KINDS; k++) {
        free(pools[k]);
        pools[k] = NULL;
    }
    atomic_store(&idle_events, 0);
    registry = NULL;
    cache_registered = false;
    for (int k = 0; k < KINDS; k++)
        for (int d = 0; d < CACHED_DEVICES; d++) {
            cache.head[k][d] = NULL;
            set_count(&cache, (enum kind)k, d, 0);
        }
}

size_t event_pool_idle_count(void)
{
    size_t n = atomic_load_explicit(&idle_events, memory_order_relaxed);
    if (pthread_mutex_trylock(&registry_lock) != 0)
        return n; /* defer_stats_get never blocks */
    for (struct thread_cache *tc = registry; tc != NULL; tc = tc->next)
        for (int d = 0; d < CACHED_DEVICES && d < pool_count; d++)
            n += count_of(tc, KIND_EVENT, d);
    pthread_mutex_unlock(&registry_lock);
    return n;
}
