/* SPDX-License-Identifier: MIT */
/* The block cache's devices (cache.h says which file holds what): the
 * per-device state and its streams' bins, start and shutdown; take and
 * add; the look-ups under a device's lock and a free's parking, which
 * cache_claim.c and cache_users.c build on; the tests' view.  Stale
 * blocks are cache_stale.c's.
 * The reclaimer side is cache_reclaim.c. */
#define _GNU_SOURCE /* PTHREAD_MUTEX_ADAPTIVE_NP */
#include "cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "cache_block.h"
#include "report.h"
#include "stats.h"

_Static_assert(BLOCK_MAX_USERS <= UINT8_MAX, "nusers is a uint8_t");
_Static_assert(offsetof(struct cache_block, lru_prev) == 64 &&
                   offsetof(struct cache_block, users) == 128,
               "a block's hot fields fill its first 64 bytes, the age "
               "list, segment and counts the next 64");

/* Where pthread_mutex_t is larger than glibc's 40 bytes on x86-64 (48 on
 * aarch64), the recent stream's id spills onto the next line. */
_Static_assert(sizeof(pthread_mutex_t) > 40 ||
                   offsetof(struct device_cache, recent_id) +
                           sizeof(unsigned long long) <=
                       64,
               "a device's lock, hand-out counter and recent stream share "
               "one cache line");

/* ---- per-device state --------------------------------------------------- */

/* What every call reads, on one cache line, written only at start,
 * shutdown and the first block. */
static _Alignas(64) struct {
    struct device_cache *caches;
    int ncaches;
    size_t split_min; /* requests below it are never cut (0: none is) */
    int round_shift; /* new blocks: 2^this sizes per power of two */
    _Atomic bool active;
    _Atomic bool one_device; /* ncaches == 1, for callers not admitted */
    /* Tests: runs between the address map's look-up and the lock (NULL:
     * none); here, so that a free reads no other line for it. */
    void (*_Atomic find_hook)(void);
    /* Tests: runs in cache_device_of's look-up, the map's lock held. */
    void (*_Atomic map_hook)(void);
} set = {.round_shift = STEPS_SHIFT}; /* the default until init */

size_t cache_round(size_t bytes)
{
    return block_round_up(bytes, set.round_shift);
}

static struct device_cache *cache_of(int device)
{
    return &set.caches[device];
}

struct device_cache *cache_device(int device)
{
    return device >= 0 && device < set.ncaches ? cache_of(device) : NULL;
}

static struct stream_bins **stream_slot(struct device_cache *c,
                                        unsigned long long id)
{
    struct stream_bins **link = &c->streams[id % STREAM_BUCKETS];
    while (*link != NULL && (*link)->stream_id != id)
        link = &(*link)->next;
    return link;
}

/* Any thread, under the device's lock.  The bins of stream id, or NULL: the
 * recent ones, else from the buckets (then recent). */
static struct stream_bins *stream_find(struct device_cache *c,
                                       unsigned long long id)
{
    struct stream_bins *s = c->recent;
    if (s != NULL && c->recent_id == id)
        return s;
    if ((s = *stream_slot(c, id)) != NULL) {
        c->recent = s;
        c->recent_id = id;
    }
    return s;
}

/* Any thread, under the device's lock.  The bins of stream id, made if needed;
 * NULL when out of memory. */
static struct stream_bins *stream_bins_get(struct device_cache *c,
                                           unsigned long long id)
{
    struct stream_bins *s = stream_find(c, id);
    if (s != NULL)
        return s;
    if ((s = c->spare_bins) != NULL) {
        c->spare_bins = s->next;
        c->nspare_bins--;
    } else if ((s = block_zalloc(sizeof *s)) == NULL) {
        return NULL;
    }
    s->stream_id = id;
    struct stream_bins **bucket = &c->streams[id % STREAM_BUCKETS];
    s->next = *bucket; /* first: no walk to the bucket's end */
    *bucket = s;
    c->recent = s;
    c->recent_id = id;
    return s;
}

struct stream_bins *cache_stream_bins(struct device_cache *c,
                                      unsigned long long id)
{
    return stream_find(c, id);
}

void cache_stream_unlink(struct device_cache *c, struct cache_block *b)
{
    struct stream_bins *s = b->stream;
    b->stream = NULL;
    if (s == NULL)
        return;
    bins_unlink(&s->bins, b);
    if (!bins_empty(&s->bins))
        return;
    *stream_slot(c, s->stream_id) = s->next;
    if (c->recent == s)
        c->recent = NULL;
    if (c->nspare_bins < MAX_SPARE_BINS) {
        s->next = c->spare_bins;
        c->spare_bins = s;
        c->nspare_bins++;
    } else {
        free(s);
    }
}

void cache_make_free(struct device_cache *c, struct cache_block *b,
                     uint64_t now)
{
    if (b->state == BLOCK_PENDING)
        cache_stream_unlink(c, b);
    else { /* LIVE or FREEING: it was the application's until now */
        stats_device_freed(b->device, b->size);
    }
    b->state = BLOCK_FREE;
    b->nusers = 0;
    b->freed_ns = now;
    b->ready = false;
    free_link(c, b);
    cache_segments_merge_free(c, b);
}

/* ---- lifecycle ---------------------------------------------------------- */

bool cache_init(int ndevices, size_t split_min_bytes, unsigned round_divisions)
{
    set.split_min = split_min_bytes;
    assert(round_divisions >= 1 && round_divisions <= 256 &&
           (round_divisions & (round_divisions - 1)) == 0); /* config.c */
    set.round_shift = __builtin_ctz(round_divisions);
    set.caches = block_zalloc((size_t)(ndevices > 0 ? ndevices : 1) *
                              sizeof *set.caches);
    if (set.caches == NULL)
        return false;
    /* Adaptive: a launching thread that finds the reclaimer in a short
     * hold spins instead of sleeping in the kernel and being woken (a
     * fifth of the futex calls of alloc/free pairs). */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    for (int d = 0; d < ndevices; d++) {
        pthread_mutex_init(&set.caches[d].lock, &attr);
        set.caches[d].next_handout = 1;
    }
    pthread_mutexattr_destroy(&attr);
    set.ncaches = ndevices;
    atomic_store_explicit(&set.one_device, ndevices == 1,
                          memory_order_relaxed);
    return true;
}

static void forget_all_blocks(void)
{
    cache_map_clear(cache_forget);
    for (int d = 0; d < set.ncaches; d++) {
        struct device_cache *c = &set.caches[d];
        for (int i = 0; i < STREAM_BUCKETS; i++)
            for (struct stream_bins *s = c->streams[i], *next; s; s = next) {
                next = s->next;
                free(s);
            }
        for (struct stream_bins *s = c->spare_bins, *next; s; s = next) {
            next = s->next;
            free(s);
        }
        cache_reclaim_free_spares(c);
        pthread_mutex_destroy(&c->lock);
    }
    for (int d = 0; d < set.ncaches; d++)
        cache_segments_index_free(&set.caches[d]);
    free(set.caches);
    set.caches = NULL;
    set.ncaches = 0;
    atomic_store_explicit(&set.one_device, false, memory_order_relaxed);
    atomic_store(&set.active, false);
}

void cache_destroy(void)
{
    forget_all_blocks();
}

void cache_fork_child(void)
{
    /* The child has no CUDA: its blocks are of no use.  Other threads may
     * have held the locks at the fork, so nothing here takes one. */
    cache_map_reset();
    set.caches = NULL; /* the parent's blocks stay allocated in the child */
    set.ncaches = 0;
    atomic_store_explicit(&set.one_device, false, memory_order_relaxed);
    atomic_store(&set.active, false);
}

bool cache_active(void)
{
    return atomic_load_explicit(&set.active, memory_order_acquire);
}

/* ---- take and add ------------------------------------------------------- */

void *cache_take(int device, unsigned long long stream_id, size_t bytes,
                 size_t *size)
{
    if (device < 0 || device >= set.ncaches || !cache_active())
        return NULL;
    struct block_fit fit = block_fit_of(bytes, set.round_shift);
    struct device_cache *c = cache_of(device);
    cache_lock(c);
    struct stream_bins *own = stream_find(c, stream_id);
    struct cache_block *b = NULL;
    /* Size for size, the stream's own pending block first: it keeps the
     * stream's memory warm and leaves FREE blocks for other streams. */
    for (int bin = fit.lo; b == NULL &&
                       (bin = bins_next_either(c, own, bin, fit.hi)) >= 0;
         bin++) {
        if (own != NULL &&
            (b = bins_fit(&own->bins, bin, fit.min, fit.max)) != NULL)
            break;
        b = bins_fit(&c->free, bin, fit.min, fit.max);
    }
    bool same_stream = false;
    if (b != NULL) {
        same_stream = b->state == BLOCK_PENDING;
        if (same_stream)
            cache_stream_unlink(c, b);
        else
            free_unlink(c, b);
    } else if (set.split_min > 0 && fit.min >= set.split_min) {
        /* None fits: cut the request from a larger block (its size rounded
         * to 512 only: the rest stays for others). */
        size_t piece = (fit.min + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
        b = cache_segments_split(c, own, fit.lo, piece, &same_stream);
    }
    if (b != NULL) {
        b->state = BLOCK_LIVE;
        b->ready = false;
        b->nusers = 0;
        b->handout = c->next_handout++;
        *size = b->size;
        stats_device_hit(device, b->size, same_stream);
    }
    pthread_mutex_unlock(&c->lock);
    return b != NULL ? b->ptr : NULL;
}

bool cache_add(const char *what, int device, void *ptr, size_t size,
               bool upstream)
{
    if (device < 0 || device >= set.ncaches)
        return false;
    struct cache_block *b = calloc(1, sizeof *b);
    if (b == NULL)
        return false;
    b->ptr = ptr;
    b->size = size;
    b->device = device;
    b->bin = block_bin_of(size);
    b->upstream = upstream;
    b->state = BLOCK_LIVE;
    struct device_cache *c = cache_of(device);
    struct cache_block *stale = NULL;
    cache_stale_before_filing(what, device, ptr, size);
    /* Filed, inserted and the block it replaces looked at in one hold (the
     * cache's lock, then the map's, as everywhere).  A piece MERGED into a
     * segment that a miss handed back upstream while the piece's entry was
     * pending is no block any more (its memory was counted in that
     * segment's, and upstream may give the address out again at once): its
     * entry forgets it, and the reclaimer may free it as soon as the lock
     * is let go, so it is not touched after. */
    cache_lock(c);
    b->handout = c->next_handout++;
    struct cache_stale dropped = {.what = what, .ptr = ptr};
    cache_stale_overlapped_locked(c, device, size, &dropped);
    bool filed = cache_segments_file(c, ptr, size);
    bool inserted = filed && cache_map_insert(b, &stale);
    if (filed && !inserted)
        cache_segments_unfile(c, ptr);
    bool merged = stale != NULL && stale->state == BLOCK_MERGED;
    /* A stale block (of this device: cache_map_insert replaces no other)
     * is dropped in the same hold: let go first, a merge could retire it
     * before the drop. */
    if (stale != NULL && !merged) /* set only when inserted */
        cache_stale_drop_locked(c, stale, &dropped);
    if (inserted) /* counted in the hold that makes it a block */
        stats_device_new(device, size);
    pthread_mutex_unlock(&c->lock);
    cache_stale_said(&dropped); /* said, then forgotten when unnamed */
    if (!inserted) {
        free(b);
        return false;
    }
    if (!atomic_load_explicit(&set.active, memory_order_relaxed))
        /* Written once: the line every call reads stays clean. */
        atomic_store_explicit(&set.active, true, memory_order_release);
    return true;
}

bool cache_one_device(void)
{
    return atomic_load_explicit(&set.one_device, memory_order_relaxed);
}

bool cache_device_of(const void *ptr, int *device)
{
    return cache_map_find_device_held(
               ptr, device,
               atomic_load_explicit(&set.map_hook, memory_order_relaxed)) !=
           NULL;
}

void cache_forget(struct cache_block *b)
{
    free(b->users);
    free(b);
}

/* ---- look-ups and parking --------------------------------------------- */

bool cache_inside_segment(const void *ptr, bool *live)
{
    for (int d = 0; d < set.ncaches; d++) {
        struct device_cache *c = cache_of(d);
        struct cache_block *b;
        cache_lock(c);
        bool in = cache_segments_holds(c, ptr, &b);
        *live = b != NULL && b->state == BLOCK_LIVE;
        pthread_mutex_unlock(&c->lock);
        if (in)
            return true;
    }
    return false;
}

void cache_park_locked(struct device_cache *c, struct cache_block *b,
                       unsigned long long stream_id)
{
    b->state = BLOCK_PENDING; /* the claim's event is its entry's now */
    /* Without bins for the stream (out of memory) it waits for its event
     * like any other block. */
    struct stream_bins *s = stream_bins_get(c, stream_id);
    b->stream = s;
    if (s != NULL)
        bins_push(&s->bins, b);
    stats_device_freed(b->device, b->size);
    cache_segments_merge_pending(c, b);
}

struct cache_block *cache_find_locked_on(const void *ptr, int device,
                                         struct device_cache **cache)
{
    if (set.ncaches == 1) {
        /* One device: its lock is taken first, and the block looked up
         * once, under it, without the map's shard lock (Note [Locks]):
         * a free's hot path saves a look-up and a lock pair. */
        void (*hook)(void) = atomic_load_explicit(&set.find_hook,
                                                  memory_order_relaxed);
        if (hook != NULL)
            hook();
        struct device_cache *c = cache_of(0);
        cache_lock(c);
        struct cache_block *b = cache_map_find_held(ptr);
        if (b != NULL) {
            *cache = c;
            return b;
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    /* The device first, then, under its lock (which every removal from
     * the map and every retirement takes), the block again: a block found
     * before the lock may be gone, even freed, by then. */
    for (;;) {
        int now;
        if ((device < 0 || device >= set.ncaches) &&
            cache_map_find_device(ptr, &device) == NULL)
            return NULL;
        void (*hook)(void) = atomic_load_explicit(&set.find_hook,
                                                  memory_order_relaxed);
        if (hook != NULL)
            hook();
        struct device_cache *c = cache_of(device);
        cache_lock(c);
        struct cache_block *b = cache_map_find_device(ptr, &now);
        if (b != NULL && now == device) {
            *cache = c;
            return b;
        }
        pthread_mutex_unlock(&c->lock);
        if (b == NULL)
            return NULL;
        device = -1;
    }
}

struct cache_block *cache_find_locked(const void *ptr,
                                      struct device_cache **cache)
{
    return cache_find_locked_on(ptr, -1, cache);
}

/* ---- tests only --------------------------------------------------------- */

struct cache_block *cache_test_find(const void *ptr)
{
    return cache_map_find(ptr);
}

struct block_view cache_test_view(const struct cache_block *b)
{
    return (struct block_view){
        .ptr = b->ptr,
        .size = b->size,
        .device = b->device,
        .state = b->state,
        .handout = b->handout,
        .freed_ns = b->freed_ns,
        .events = b->events,
        .outstanding = b->outstanding,
        .merged_into = b->merged_into,
        .nusers = b->nusers,
        .whole = is_whole(b),
    };
}

void cache_test_add_events(struct cache_block *b, int delta)
{
    b->events += (uint32_t)delta;
}

size_t cache_test_spares(int device)
{
    return cache_reclaim_spares_kept(cache_of(device));
}

void cache_test_lock(int device)
{
    cache_lock(cache_of(device));
}

void cache_test_unlock(int device)
{
    pthread_mutex_unlock(&cache_of(device)->lock);
}

unsigned cache_test_waiting(int device)
{
    return atomic_load(&cache_of(device)->waiting);
}

void cache_test_set_waiting(int device, unsigned n)
{
    atomic_store(&cache_of(device)->waiting, n);
}

void cache_test_set_map_hook(void (*hook)(void))
{
    atomic_store(&set.map_hook, hook);
}

void cache_test_set_find_hook(void (*hook)(void))
{
    atomic_store(&set.find_hook, hook);
}
