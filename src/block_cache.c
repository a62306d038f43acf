/* Block cache: hand-out and return of blocks (see the header), over the
 * size classes, bins and per-device state of block_bins.h and the
 * segments of block_segments.h: the state, the launching threads' side
 * (take, add, plan, claim, park).  Entries done are block_done.c's. */
#define _GNU_SOURCE /* PTHREAD_MUTEX_ADAPTIVE_NP */
#include "block_cache.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "block_bins.h"
#include "block_map.h"
#include "block_records.h"
#include "block_segments.h"
#include "block_stale.h"
#include "stats.h"

_Static_assert(BLOCK_MAX_RECORDED <= UINT8_MAX, "nrecorded is a uint8_t");
_Static_assert(offsetof(struct cache_block, lru_prev) == 64 &&
                   offsetof(struct cache_block, recorded) == 128,
               "a block's hot fields fill its first 64 bytes, the age "
               "list, segment and counts the next 64");

/* Where pthread_mutex_t is larger than glibc's 40 bytes on x86-64 (48 on
 * aarch64), the kept records' pointer spills onto the next line. */
_Static_assert(sizeof(pthread_mutex_t) > 40 ||
                   offsetof(struct device_cache, spare_records) +
                           sizeof(void *) <=
                       64,
               "a device's lock, hand-out counter, recent stream and kept "
               "records share one cache line");

/* ---- per-device state --------------------------------------------------- */

/* What every call reads, on one cache line, written only at start,
 * shutdown and the first block. */
static _Alignas(64) struct {
    struct device_cache *caches;
    int ncaches;
    size_t split_min; /* requests below it are never cut (0: none is) */
    int round_shift; /* new blocks: 2^this sizes per power of two */
    _Atomic bool active;
    /* Tests: runs between the block map's look-up and the lock (NULL:
     * none); here, so that a free reads no other line for it. */
    void (*_Atomic find_hook)(void);
} set = {.round_shift = STEPS_SHIFT}; /* the default until init */

size_t block_cache_round(size_t bytes)
{
    return block_round_up(bytes, set.round_shift); /* block_bins.h */
}

static struct device_cache *cache_of(int device)
{
    return &set.caches[device];
}

struct device_cache *block_cache_device(int device)
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

/* Lock held.  The bins of stream id, or NULL: the recent ones, else
 * from the buckets (then recent). */
static struct stream_bins *stream_find(struct device_cache *c,
                                       unsigned long long id)
{
    struct stream_bins *s = c->recent;
    if (s != NULL && s->stream_id == id)
        return s;
    if ((s = *stream_slot(c, id)) != NULL)
        c->recent = s;
    return s;
}

/* Lock held.  The bins of stream id, made if needed; NULL when out of
 * memory. */
static struct stream_bins *stream_bins_get(struct device_cache *c,
                                           unsigned long long id)
{
    struct stream_bins *s = stream_find(c, id);
    if (s != NULL)
        return s;
    if ((s = c->spare) != NULL) {
        c->spare = s->next;
        c->nspare--;
    } else if ((s = block_zalloc(sizeof *s)) == NULL) {
        return NULL;
    }
    s->stream_id = id;
    s->order.oldest = s->order.newest = NULL;
    struct stream_bins **bucket = &c->streams[id % STREAM_BUCKETS];
    s->next = *bucket; /* first: no walk to the bucket's end */
    *bucket = s;
    c->recent = s;
    return s;
}

struct stream_bins *block_cache_stream_bins(struct device_cache *c,
                                            unsigned long long id)
{
    return stream_find(c, id);
}

void block_cache_stream_unlink(struct device_cache *c, struct cache_block *b)
{
    struct stream_bins *s = b->stream;
    b->stream = NULL;
    if (s == NULL)
        return;
    bins_unlink(&s->bins, b);
    order_unlink(&s->order, b);
    if (!bins_empty(&s->bins))
        return;
    *stream_slot(c, s->stream_id) = s->next;
    if (c->recent == s)
        c->recent = NULL;
    if (c->nspare < MAX_SPARE) {
        s->next = c->spare;
        c->spare = s;
        c->nspare++;
    } else {
        free(s);
    }
}

void block_cache_make_free(struct device_cache *c, struct cache_block *b,
                           uint64_t now)
{
    if (b->state == BLOCK_PENDING)
        block_cache_stream_unlink(c, b);
    else /* LIVE: it was the application's until now */
        stats_add(&stats.cache_free_bytes, b->size);
    b->state = BLOCK_FREE;
    b->nrecorded = 0;
    b->freed_ns = now;
    b->ready = false;
    free_link(c, b);
    block_segments_merge_free(c, b);
}

/* ---- lifecycle ---------------------------------------------------------- */

bool block_cache_init(int ndevices, size_t split_min_bytes,
                      unsigned round_divisions)
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
     * hold spins instead of sleeping in the kernel and being woken (fake
     * runtime, alloc/free pairs: a fifth of the futex calls). */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    for (int d = 0; d < ndevices; d++) {
        pthread_mutex_init(&set.caches[d].lock, &attr);
        set.caches[d].next_handout = 1;
    }
    pthread_mutexattr_destroy(&attr);
    set.ncaches = ndevices;
    return true;
}

static void forget_all_records(void)
{
    block_map_clear(block_cache_forget);
    for (int d = 0; d < set.ncaches; d++) {
        struct device_cache *c = &set.caches[d];
        for (int i = 0; i < STREAM_BUCKETS; i++)
            for (struct stream_bins *s = c->streams[i], *next; s; s = next) {
                next = s->next;
                free(s);
            }
        for (struct stream_bins *s = c->spare, *next; s; s = next) {
            next = s->next;
            free(s);
        }
        block_records_free_all(c);
        pthread_mutex_destroy(&c->lock);
    }
    for (int d = 0; d < set.ncaches; d++)
        block_segments_index_free(&set.caches[d]);
    free(set.caches);
    set.caches = NULL;
    set.ncaches = 0;
    atomic_store(&set.active, false);
}

void block_cache_destroy(void)
{
    forget_all_records();
}

void block_cache_fork_child(void)
{
    /* The child has no CUDA: its records are of no use.  Other threads may
     * have held the locks at the fork, so nothing here takes one. */
    block_map_reset();
    set.caches = NULL; /* the parent's records stay allocated in the child */
    set.ncaches = 0;
    atomic_store(&set.active, false);
}

bool block_cache_active(void)
{
    return atomic_load_explicit(&set.active, memory_order_acquire);
}

/* ---- the launching threads ---------------------------------------------- */

void *block_cache_take(int device, unsigned long long stream_id, size_t bytes,
                       size_t *size)
{
    if (device < 0 || device >= set.ncaches || !block_cache_active())
        return NULL;
    /* At most 1/8 above what a fresh block for the request would get. */
    size_t min = bytes < MIN_BLOCK ? MIN_BLOCK : bytes;
    size_t fresh = block_cache_round(min), max = fresh + fresh / 8, max_class;
    int lo = block_bin_of(min), hi = block_class_of(max, &max_class);
    struct device_cache *c = cache_of(device);
    cache_lock(c);
    struct stream_bins *own = stream_find(c, stream_id);
    struct cache_block *b = NULL;
    /* Size for size, the stream's own pending block first: it keeps the
     * stream's memory warm and leaves FREE blocks for other streams. */
    for (int bin = lo; b == NULL &&
                       (bin = bins_next_either(c, own, bin, hi)) >= 0;
         bin++) {
        if (own != NULL && (b = bins_fit(&own->bins, bin, min, max)) != NULL)
            break;
        b = bins_fit(&c->free, bin, min, max);
    }
    bool same_stream = false;
    if (b != NULL) {
        same_stream = b->state == BLOCK_PENDING;
        if (same_stream)
            block_cache_stream_unlink(c, b);
        else
            free_unlink(c, b);
    } else if (set.split_min > 0 && min >= set.split_min) {
        /* None fits: cut the request from a larger block (its size rounded
         * to 512 only: the rest stays for others). */
        size_t piece = (min + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
        b = block_segments_split(c, own, lo, piece, &same_stream);
    }
    if (b != NULL) {
        b->state = BLOCK_LIVE;
        b->ready = false;
        b->nrecorded = 0;
        b->handout = c->next_handout++;
        *size = b->size;
        stats_sub(&stats.cache_free_bytes, b->size);
        stats_count_reused(same_stream);
    }
    pthread_mutex_unlock(&c->lock);
    return b != NULL ? b->ptr : NULL;
}

bool block_cache_add(int device, void *ptr, size_t size, bool pool)
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
    b->pool = pool;
    b->state = BLOCK_LIVE;
    struct device_cache *c = cache_of(device);
    struct cache_block *stale = NULL;
    block_stale_evict_other(ptr, device);
    /* Filed, inserted and the record it replaces looked at in one hold
     * (the cache's lock, then the map's, as everywhere): a piece MERGED
     * into a block a miss handed back to the pool while the piece's entry
     * was pending is no block any more (its memory was counted in that
     * block's, and the pool may give the address out again at once): its
     * entry forgets it, and the reclaimer may free it as soon as the lock
     * is let go, so it is not touched after. */
    cache_lock(c);
    b->handout = c->next_handout++;
    bool filed = block_segments_file(c, ptr, size);
    bool inserted = filed && block_map_insert(b, &stale);
    if (filed && !inserted)
        block_segments_unfile(c, ptr);
    bool merged = stale != NULL && stale->state == BLOCK_MERGED;
    /* A stale record (of this device: block_map_insert replaces no other)
     * is dropped in the same hold: let go first, a merge could retire it
     * (block_records.h) before the drop. */
    bool here = stale != NULL && !merged; /* set only when inserted */
    size_t stale_size = here ? stale->size : 0;
    bool stale_named = here && block_stale_drop_locked(c, stale);
    pthread_mutex_unlock(&c->lock);
    if (!inserted) {
        free(b);
        return false;
    }
    if (here) {
        block_stale_report(ptr, stale_size);
        if (!stale_named) /* else the last entry naming it forgets it */
            block_cache_forget(stale);
    }
    stats_add(&stats.cache_bytes, size);
    if (!atomic_load_explicit(&set.active, memory_order_relaxed))
        /* Written once: the line every call reads stays clean. */
        atomic_store_explicit(&set.active, true, memory_order_release);
    return true;
}

/* Any thread, once the exact look-up of ptr missed (never before: a live
 * block's free must not pay for it).  Whether ptr lies in a segment of any
 * device's cache; then *live says whether the block holding it is the
 * application's.  Takes each device's mutex in turn. */
static bool inside_segment(const void *ptr, bool *live)
{
    for (int d = 0; d < set.ncaches; d++) {
        struct device_cache *c = cache_of(d);
        struct cache_block *b;
        cache_lock(c);
        bool in = block_segments_holds(c, ptr, &b);
        *live = b != NULL && b->state == BLOCK_LIVE;
        pthread_mutex_unlock(&c->lock);
        if (in)
            return true;
    }
    return false;
}

bool block_cache_inside_live(const void *ptr)
{
    bool live = false;
    return inside_segment(ptr, &live) && live;
}

/* Lock held: b, claimed (FREEING) by a free on stream_id, becomes PENDING
 * on that stream, named by the free's entry or batch. */
static void park_locked(struct device_cache *c, struct cache_block *b,
                        unsigned long long stream_id)
{
    b->state = BLOCK_PENDING; /* the claim's event is its entry's now */
    /* Without bins for the stream (out of memory) it waits for its event
     * like any other block. */
    struct stream_bins *s = stream_bins_get(c, stream_id);
    b->stream = s;
    if (s != NULL) {
        bins_push(&s->bins, b);
        order_append(&s->order, b);
    }
    stats_add(&stats.cache_free_bytes, b->size);
    block_segments_merge_pending(c, b);
}

void block_cache_collect_records(void)
{
    for (int d = 0; d < set.ncaches; d++)
        block_records_collect(&set.caches[d]);
}

void block_cache_set_find_hook(void (*hook)(void))
{
    atomic_store(&set.find_hook, hook);
}

struct cache_block *block_cache_find_locked(const void *ptr,
                                            struct device_cache **cache)
{
    /* The device first, then, under its lock (which every removal from
     * the map and every retirement takes), the record again: a record
     * found before the lock may be gone, even freed, by then. */
    for (;;) {
        int device, now;
        if (block_map_find_device(ptr, &device) == NULL)
            return NULL;
        void (*hook)(void) = atomic_load_explicit(&set.find_hook,
                                                  memory_order_relaxed);
        if (hook != NULL)
            hook();
        struct device_cache *c = cache_of(device);
        cache_lock(c);
        struct cache_block *b = block_map_find_device(ptr, &now);
        if (b != NULL && now == device) {
            *cache = c;
            return b;
        }
        pthread_mutex_unlock(&c->lock);
        if (b == NULL)
            return NULL;
    }
}

/* block_cache_plan_free's work; park: a BLOCK_STREAM_ORDERED block is
 * parked in the same lock hold (plan->parked). */
static void plan_free(void *ptr, int stream_device,
                      unsigned long long stream_id, bool park,
                      struct block_free_plan *plan)
{
    plan->path = BLOCK_NOT_OURS;
    plan->block = NULL;
    plan->nstreams = 0;
    plan->parked = false;
    struct device_cache *c;
    struct cache_block *b = block_cache_find_locked(ptr, &c);
    if (b == NULL) {
        bool live;
        if (inside_segment(ptr, &live))
            plan->path = BLOCK_INSIDE;
        return;
    }
    plan->block = b;
    plan->handout = b->handout;
    plan->size = b->size; /* parked, it may grow by merging at once */
    if (b->state != BLOCK_LIVE) {
        plan->path = BLOCK_NOT_LIVE;
    } else {
        b->state = BLOCK_FREEING; /* this free's: a second one is refused */
        b->events++;              /* the claim names it */
        plan->nstreams = 1; /* the caller's */
        for (uint32_t i = 0; i < b->nrecorded; i++)
            if (b->recorded[i].id != stream_id ||
                b->recorded[i].device != stream_device)
                plan->nstreams++;
    }
    if (plan->path == BLOCK_NOT_LIVE) {
        /* said */
    } else if (plan->nstreams > 1) {
        plan->path = BLOCK_AFTER_STREAMS;
    } else {
        plan->path = b->device == stream_device ? BLOCK_STREAM_ORDERED
                                                : BLOCK_AFTER_EVENT;
    }
    if (park && plan->path == BLOCK_STREAM_ORDERED) {
        park_locked(c, b, stream_id);
        plan->parked = true;
    }
    pthread_mutex_unlock(&c->lock);
}

void block_cache_plan_free(void *ptr, int stream_device,
                           unsigned long long stream_id,
                           struct block_free_plan *plan)
{
    plan_free(ptr, stream_device, stream_id, false, plan);
}

void block_cache_plan_free_parked(void *ptr, int stream_device,
                                  unsigned long long stream_id,
                                  struct block_free_plan *plan)
{
    plan_free(ptr, stream_device, stream_id, true, plan);
}

enum block_free_path block_cache_claim(void *ptr, struct block_claim *claim)
{
    claim->block = NULL;
    claim->handout = 0;
    struct device_cache *c;
    struct cache_block *b = block_cache_find_locked(ptr, &c);
    bool inside_live;
    if (b == NULL)
        return inside_segment(ptr, &inside_live) ? BLOCK_INSIDE
                                                 : BLOCK_NOT_OURS;
    bool live = b->state == BLOCK_LIVE;
    if (live) {
        b->state = BLOCK_FREEING;
        b->events++; /* the claim names it */
        claim->block = b;
        claim->handout = b->handout;
    }
    pthread_mutex_unlock(&c->lock);
    return live ? BLOCK_AFTER_EVENT : BLOCK_NOT_LIVE;
}

void block_cache_unclaim(const struct block_claim *claim)
{
    struct cache_block *b = claim->block;
    if (b == NULL)
        return;
    struct device_cache *c = cache_of(b->device);
    cache_lock(c);
    if (b->state == BLOCK_FREEING && b->handout == claim->handout)
        b->state = BLOCK_LIVE;
    bool forget = block_claim_let_go(b);
    pthread_mutex_unlock(&c->lock);
    if (forget)
        block_cache_forget(b);
}

bool block_cache_park(const struct block_free_plan *plan,
                      unsigned long long stream_id)
{
    struct cache_block *b = plan->block;
    struct device_cache *c = cache_of(b->device);
    cache_lock(c);
    bool mine = b->state == BLOCK_FREEING && b->handout == plan->handout;
    if (mine)
        park_locked(c, b, stream_id);
    pthread_mutex_unlock(&c->lock);
    return mine;
}

void block_cache_forget(struct cache_block *b)
{
    free(b->recorded);
    free(b);
}
