/* Block cache: size classes, per-stream and per-device bins (their lists
 * in block_bins.h), hand-out and return of blocks (see the header). */
#include "block_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "block_bins.h"
#include "block_map.h"
#include "block_pool.h"
#include "clock.h"
#include "report.h"
#include "stats.h"

/* ---- size classes ------------------------------------------------------- */

/* The smallest class of at least bytes, and its size in *class_bytes; the
 * overflow bin (bytes rounded to 512) above 2^40. */
static int class_of(size_t bytes, size_t *class_bytes)
{
    if (bytes <= MIN_BLOCK) {
        *class_bytes = MIN_BLOCK;
        return 0;
    }
    if (bytes > ((size_t)1 << MAX_SHIFT)) {
        *class_bytes = (bytes + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
        return OVERFLOW_BIN;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes */
    size_t base = (size_t)1 << k, step_bytes = base / STEPS;
    size_t step = (bytes - base + step_bytes - 1) / step_bytes; /* 1..STEPS */
    *class_bytes = base + step * step_bytes;
    return (k - MIN_SHIFT) * STEPS + (int)step;
}

/* The bin a block of size bytes (>= 512) is filed in: the largest class not
 * above its size, so every block in a bin above a request's is big enough. */
static int bin_of(size_t bytes)
{
    size_t class_bytes;
    int c = class_of(bytes, &class_bytes);
    return class_bytes > bytes && c != OVERFLOW_BIN ? c - 1 : c;
}

size_t block_cache_round(size_t bytes)
{
    size_t class_bytes;
    class_of(bytes, &class_bytes);
    return class_bytes;
}

/* ---- per-device state --------------------------------------------------- */

/* The blocks PENDING on one stream of a device, by size and, through their
 * lru links, in the order they were freed. */
struct stream_bins {
    unsigned long long stream_id;
    struct stream_bins *next;
    struct bins bins;
    struct order_list order;
};

#define STREAM_BUCKETS 64
#define MAX_SPARE 4
/* The least a block keeps when a request is cut from it. */
#define SPLIT_MIN_REST MIN_BLOCK

struct device_cache {
    pthread_mutex_t lock;
    struct bins free;                             /* FREE blocks */
    struct stream_bins *streams[STREAM_BUCKETS]; /* streams with PENDING */
    struct stream_bins *spare;                    /* emptied, for reuse */
    int nspare;
    struct order_list lru; /* FREE, oldest first */
};

static struct device_cache *caches;
static int ncaches;
static size_t split_min; /* requests below it are never cut (0: none is) */
static _Atomic bool active;
static _Atomic uint64_t next_handout = 1;


static struct device_cache *cache_of(int device)
{
    return &caches[device];
}

static struct stream_bins **stream_slot(struct device_cache *c,
                                        unsigned long long id)
{
    struct stream_bins **link = &c->streams[id % STREAM_BUCKETS];
    while (*link != NULL && (*link)->stream_id != id)
        link = &(*link)->next;
    return link;
}

/* Lock held.  The bins of stream id, made if needed; NULL when out of
 * memory. */
static struct stream_bins *stream_bins_get(struct device_cache *c,
                                           unsigned long long id)
{
    struct stream_bins **link = stream_slot(c, id);
    if (*link != NULL)
        return *link;
    struct stream_bins *s = c->spare;
    if (s != NULL) {
        c->spare = s->next;
        c->nspare--;
    } else if ((s = calloc(1, sizeof *s)) == NULL) {
        return NULL;
    }
    s->stream_id = id;
    s->next = NULL;
    s->order.oldest = s->order.newest = NULL;
    *link = s;
    return s;
}

/* Lock held.  Unlinks PENDING b from its stream's bins; an emptied stream
 * leaves the table. */
static void stream_unlink(struct device_cache *c, struct cache_block *b)
{
    struct stream_bins *s = b->stream;
    b->stream = NULL;
    if (s == NULL)
        return;
    bins_unlink(&s->bins, b);
    order_unlink(&s->order, b);
    if (s->bins.count > 0)
        return;
    *stream_slot(c, s->stream_id) = s->next;
    if (c->nspare < MAX_SPARE) {
        s->next = c->spare;
        c->spare = s;
        c->nspare++;
    } else {
        free(s);
    }
}

/* ---- segments: splitting and merging ------------------------------------ */

/* Whether b is a whole segment (one allocation of cudefer's, uncut). */
static bool is_whole(const struct cache_block *b)
{
    return b->seg_prev == NULL && b->seg_next == NULL;
}

/* Lock held.  FREE b leaves the free bins, and the age list if on it. */
static void free_unlink(struct device_cache *c, struct cache_block *b)
{
    bins_unlink(&c->free, b);
    if (b->in_lru) {
        order_unlink(&c->lru, b);
        b->in_lru = false;
    }
}

/* Lock held.  FREE b joins the free bins, and when it is a whole segment
 * the age list (only whole segments expire: pieces cannot be released). */
static void free_link(struct device_cache *c, struct cache_block *b)
{
    bins_push(&c->free, b);
    if (is_whole(b)) {
        order_append(&c->lru, b);
        b->in_lru = true;
    }
}

/* Lock held.  FREE keep absorbs FREE gone, its right neighbour that no
 * entry names; gone's record is freed. */
static void absorb(struct device_cache *c, struct cache_block *keep,
                   struct cache_block *gone)
{
    free_unlink(c, keep);
    free_unlink(c, gone);
    keep->size += gone->size;
    keep->bin = bin_of(keep->size);
    keep->seg_next = gone->seg_next;
    if (keep->seg_next != NULL)
        keep->seg_next->seg_prev = keep;
    if (gone->freed_ns > keep->freed_ns)
        keep->freed_ns = gone->freed_ns;
    block_map_remove(gone);
    block_cache_forget(gone);
    free_link(c, keep);
}

/* Lock held.  FREE b merges with its FREE neighbours in its segment, so
 * that memory cut for one size serves any size again and a segment all
 * free is whole (and may go back to the pool).  A record an entry still
 * names is never absorbed (its entry would find it gone).  Returns the
 * merged block: b's record may be freed. */
static struct cache_block *merge_free(struct device_cache *c,
                                      struct cache_block *b)
{
    struct cache_block *right = b->seg_next, *left = b->seg_prev;
    if (right != NULL && right->state == BLOCK_FREE && right->events == 0 &&
        right->outstanding == 0)
        absorb(c, b, right);
    if (left != NULL && left->state == BLOCK_FREE && b->events == 0 &&
        b->outstanding == 0) {
        absorb(c, left, b);
        b = left;
    }
    return b;
}

/* Lock held.  b, just PENDING on its stream, absorbs its neighbours
 * PENDING on the same stream, so that a program whose GPU runs a step
 * behind finds its freed memory in one piece again at once (a request on
 * that stream may use it all: its work runs after theirs).  An absorbed
 * record is MERGED: it waits for its entry and for the parts it absorbed
 * itself, then b may go FREE (other streams wait for every part's work). */
static void merge_pending(struct device_cache *c, struct cache_block *b)
{
    for (int left = 0; left < 2; left++) {
        struct cache_block *n = left ? b->seg_prev : b->seg_next;
        struct stream_bins *s = b->stream;
        if (s == NULL || n == NULL || n->state != BLOCK_PENDING ||
            n->stream != s)
            continue;
        stream_unlink(c, n); /* first: s stays while b is in it */
        bins_unlink(&s->bins, b);
        block_map_remove(n);
        if (left) { /* b now starts where n did */
            block_map_remove(b);
            b->ptr = n->ptr;
            b->seg_prev = n->seg_prev;
            if (b->seg_prev != NULL)
                b->seg_prev->seg_next = b;
            struct cache_block *stale;
            block_map_insert(b, &stale); /* no record is there: n's left */
        } else {
            b->seg_next = n->seg_next;
            if (b->seg_next != NULL)
                b->seg_next->seg_prev = b;
        }
        b->size += n->size;
        b->bin = bin_of(b->size);
        bins_push(&s->bins, b);
        n->seg_prev = n->seg_next = NULL;
        n->state = BLOCK_MERGED;
        n->merged_into = b;
        b->outstanding++;
    }
}

/* Lock held.  b's work is done: FREE, filed for any stream, merged with
 * its free neighbours (b's record may be freed). */
static void make_free(struct device_cache *c, struct cache_block *b,
                      uint64_t now)
{
    if (b->state == BLOCK_PENDING)
        stream_unlink(c, b);
    else /* LIVE: it was the application's until now */
        stats_add(&stats.cache_free_bytes, b->size);
    b->state = BLOCK_FREE;
    b->nrecorded = 0;
    b->freed_ns = now;
    b->ready = false;
    free_link(c, b);
    merge_free(c, b);
}

/* Whether a request of piece bytes (a multiple of 512) may be cut from b:
 * sizes and addresses stay multiples of 512 and the rest is a block. */
static bool may_split(const struct cache_block *b, size_t piece)
{
    return b->size >= piece + SPLIT_MIN_REST && b->size % MIN_BLOCK == 0 &&
           (uintptr_t)b->ptr % MIN_BLOCK == 0;
}

/* Lock held.  The smallest block to cut piece bytes from, FREE or PENDING
 * on the request's stream (own; size for size the stream's own first), in
 * the bins from lo up; NULL when none. */
static struct cache_block *split_candidate(struct device_cache *c,
                                           struct stream_bins *own, int lo,
                                           size_t piece)
{
    for (int bin = lo; bin < NBINS; bin++) {
        int next_own = own != NULL ? bins_next(&own->bins, bin, NBINS - 1)
                                   : -1;
        int next_free = bins_next(&c->free, bin, NBINS - 1);
        if (next_own < 0 && next_free < 0)
            return NULL;
        bin = next_own < 0 ? next_free
              : next_free < 0 ? next_own
              : next_own < next_free ? next_own : next_free;
        struct cache_block *best = NULL;
        const struct bins *lists[2] = {own != NULL ? &own->bins : NULL,
                                       &c->free};
        for (int i = 0; i < 2; i++)
            for (struct cache_block *b = lists[i] ? lists[i]->head[bin] : NULL;
                 b != NULL; b = b->next)
                if (may_split(b, piece) &&
                    (best == NULL || b->size < best->size))
                    best = b;
        if (best != NULL)
            return best;
    }
    return NULL;
}

/* Lock held.  Cuts piece bytes off the end of b (FREE, or PENDING on the
 * request's stream), which keeps the rest with its state, its entries and
 * its hand-out (its event covers the piece's earlier work too); returns
 * the piece's new record, in no list, or NULL (nothing changed) when none
 * could be made. */
static struct cache_block *split_off(struct device_cache *c,
                                     struct cache_block *b, size_t piece)
{
    struct cache_block *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->ptr = (char *)b->ptr + (b->size - piece);
    p->size = piece;
    p->device = b->device;
    p->bin = bin_of(piece);
    p->pool = b->pool;
    struct cache_block *stale = NULL;
    /* Nothing is filed inside a segment (a record there would be memory
     * freed behind cudefer's back): never replace one. */
    if (block_map_find(p->ptr) != NULL || !block_map_insert(p, &stale)) {
        free(p);
        return NULL;
    }
    struct bins *bins = b->state == BLOCK_FREE ? &c->free : &b->stream->bins;
    if (b->state == BLOCK_FREE)
        free_unlink(c, b);
    else
        bins_unlink(bins, b);
    b->size -= piece;
    b->bin = bin_of(b->size);
    if (b->state == BLOCK_FREE)
        free_link(c, b); /* a piece now: off the age list */
    else
        bins_push(bins, b);
    p->seg_prev = b;
    p->seg_next = b->seg_next;
    if (p->seg_next != NULL)
        p->seg_next->seg_prev = p;
    b->seg_next = p;
    return p;
}

/* ---- lifecycle ---------------------------------------------------------- */

bool block_cache_init(int ndevices, size_t split_min_bytes)
{
    split_min = split_min_bytes;
    caches = calloc((size_t)(ndevices > 0 ? ndevices : 1), sizeof *caches);
    if (caches == NULL)
        return false;
    for (int d = 0; d < ndevices; d++)
        pthread_mutex_init(&caches[d].lock, NULL);
    ncaches = ndevices;
    return true;
}

static void forget_all_records(void)
{
    block_map_clear(block_cache_forget);
    for (int d = 0; d < ncaches; d++) {
        struct device_cache *c = &caches[d];
        for (int i = 0; i < STREAM_BUCKETS; i++)
            for (struct stream_bins *s = c->streams[i], *next; s; s = next) {
                next = s->next;
                free(s);
            }
        for (struct stream_bins *s = c->spare, *next; s; s = next) {
            next = s->next;
            free(s);
        }
        pthread_mutex_destroy(&c->lock);
    }
    free(caches);
    caches = NULL;
    ncaches = 0;
    atomic_store(&active, false);
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
    caches = NULL; /* the parent's records stay allocated in the child */
    ncaches = 0;
    atomic_store(&active, false);
}

bool block_cache_active(void)
{
    return atomic_load_explicit(&active, memory_order_acquire);
}

/* ---- the launching threads ---------------------------------------------- */

void *block_cache_take(int device, unsigned long long stream_id, size_t bytes,
                       size_t *size)
{
    if (device < 0 || device >= ncaches || !block_cache_active())
        return NULL;
    /* At most 1/8 above what a fresh block for the request would get. */
    size_t min = bytes < MIN_BLOCK ? MIN_BLOCK : bytes;
    size_t fresh = block_cache_round(min), max = fresh + fresh / 8, max_class;
    int lo = bin_of(min), hi = class_of(max, &max_class);
    struct device_cache *c = cache_of(device);
    pthread_mutex_lock(&c->lock);
    struct stream_bins *own = *stream_slot(c, stream_id);
    struct cache_block *b = NULL;
    /* Size for size, the stream's own pending block first: it keeps the
     * stream's memory warm and leaves FREE blocks for other streams. */
    for (int bin = lo; b == NULL && bin <= hi; bin++) {
        int next_own = own != NULL ? bins_next(&own->bins, bin, hi) : -1;
        int next_free = bins_next(&c->free, bin, hi);
        if (next_own < 0 && next_free < 0)
            break;
        bin = next_own < 0 ? next_free
              : next_free < 0 ? next_own
              : next_own < next_free ? next_own : next_free;
        if (own != NULL && (b = bins_fit(&own->bins, bin, min, max)) != NULL)
            break;
        b = bins_fit(&c->free, bin, min, max);
    }
    bool same_stream = false;
    if (b != NULL) {
        same_stream = b->state == BLOCK_PENDING;
        if (same_stream)
            stream_unlink(c, b);
        else
            free_unlink(c, b);
    } else if (split_min > 0 && min >= split_min) {
        /* None fits: cut the request from a larger block (its size rounded
         * to 512 only: the rest stays for others). */
        size_t piece = (min + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
        struct cache_block *whole = split_candidate(c, own, lo, piece);
        if (whole != NULL &&
            (b = split_off(c, whole, piece)) != NULL)
            same_stream = whole->state == BLOCK_PENDING;
    }
    if (b != NULL) {
        b->state = BLOCK_LIVE;
        b->ready = false;
        b->nrecorded = 0;
        b->handout = atomic_fetch_add(&next_handout, 1);
        *size = b->size;
        stats_sub(&stats.cache_free_bytes, b->size);
        stats_add(&stats.reused, 1);
        if (same_stream)
            stats_add(&stats.reused_same_stream, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return b != NULL ? b->ptr : NULL;
}

/* A record found under a fresh block's address: its memory was freed with
 * cudaFree behind cudefer's back.  Drop it from every list. */
static void drop_stale(struct cache_block *stale)
{
    report("defer_alloc: cudaMalloc returned %p, which cudefer still counted "
           "as its block of %zu bytes: that block was freed with cudaFree "
           "instead of defer_free; its record is dropped", stale->ptr,
           stale->size);
    struct device_cache *c = cache_of(stale->device);
    pthread_mutex_lock(&c->lock);
    if (stale->state == BLOCK_PENDING)
        stream_unlink(c, stale);
    else if (stale->state == BLOCK_FREE)
        free_unlink(c, stale);
    /* Out of its segment: its neighbours' memory went with it, but they
     * are no longer linked to a record that is going. */
    if (stale->seg_prev != NULL)
        stale->seg_prev->seg_next = stale->seg_next;
    if (stale->seg_next != NULL)
        stale->seg_next->seg_prev = stale->seg_prev;
    stale->seg_prev = stale->seg_next = NULL;
    if (stale->state == BLOCK_PENDING || stale->state == BLOCK_FREE)
        stats_sub(&stats.cache_free_bytes, stale->size);
    stats_sub(&stats.cache_bytes, stale->size);
    bool named = stale->events > 0 || stale->outstanding > 0;
    if (stale->pool) /* its memory went back behind cudefer's back too */
        block_pool_forget(stale->device, stale->size);
    stale->state = BLOCK_LIVE;
    stale->handout = 0; /* no entry's hand-out matches it any more */
    pthread_mutex_unlock(&c->lock);
    if (!named) /* else an entry still points to it: a small leak */
        block_cache_forget(stale);
}

bool block_cache_add(int device, void *ptr, size_t size, bool pool)
{
    if (device < 0 || device >= ncaches)
        return false;
    struct cache_block *b = calloc(1, sizeof *b);
    if (b == NULL)
        return false;
    b->ptr = ptr;
    b->size = size;
    b->device = device;
    b->bin = bin_of(size);
    b->pool = pool;
    b->state = BLOCK_LIVE;
    b->handout = atomic_fetch_add(&next_handout, 1);
    struct cache_block *stale = NULL;
    if (!block_map_insert(b, &stale)) {
        free(b);
        return false;
    }
    if (stale != NULL)
        drop_stale(stale);
    stats_add(&stats.cache_bytes, size);
    atomic_store_explicit(&active, true, memory_order_release);
    return true;
}

void block_cache_plan_free(void *ptr, int stream_device,
                           unsigned long long stream_id,
                           struct block_free_plan *plan)
{
    plan->path = BLOCK_NOT_OURS;
    plan->block = NULL;
    plan->nstreams = 0;
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    plan->block = b;
    plan->handout = b->handout;
    if (b->state != BLOCK_LIVE) {
        plan->path = BLOCK_NOT_LIVE;
    } else {
        b->state = BLOCK_FREEING; /* this free's: a second one is refused */
        plan->nstreams = 1; /* streams[0]: the caller's */
        for (uint32_t i = 0; i < b->nrecorded; i++)
            if (b->recorded_ids[i] != stream_id)
                plan->streams[plan->nstreams++] = b->recorded[i];
    }
    if (plan->path == BLOCK_NOT_LIVE) {
        /* said */
    } else if (plan->nstreams > 1) {
        plan->path = BLOCK_AFTER_STREAMS;
    } else {
        plan->path = b->device == stream_device ? BLOCK_STREAM_ORDERED
                                                : BLOCK_AFTER_EVENT;
    }
    pthread_mutex_unlock(&c->lock);
}

enum block_free_path block_cache_claim(void *ptr)
{
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return BLOCK_NOT_OURS;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    bool live = b->state == BLOCK_LIVE;
    if (live)
        b->state = BLOCK_FREEING;
    pthread_mutex_unlock(&c->lock);
    return live ? BLOCK_AFTER_EVENT : BLOCK_NOT_LIVE;
}

void block_cache_unclaim(void *ptr)
{
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    if (b->state == BLOCK_FREEING)
        b->state = BLOCK_LIVE;
    pthread_mutex_unlock(&c->lock);
}

bool block_cache_park(const struct block_free_plan *plan,
                      unsigned long long stream_id)
{
    struct cache_block *b = plan->block;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    bool mine = b->state == BLOCK_FREEING && b->handout == plan->handout;
    if (mine) {
        b->state = BLOCK_PENDING;
        b->events++;
        /* Without bins for the stream (out of memory) it waits for its
         * event like any other block. */
        struct stream_bins *s = stream_bins_get(c, stream_id);
        b->stream = s;
        if (s != NULL) {
            bins_push(&s->bins, b);
            order_append(&s->order, b);
        }
        stats_add(&stats.cache_free_bytes, b->size);
        merge_pending(c, b);
    }
    pthread_mutex_unlock(&c->lock);
    return mine;
}

cudaError_t block_cache_record_stream(void *ptr, cudaStream_t stream,
                                      unsigned long long stream_id)
{
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return cudaErrorInvalidValue;
    struct device_cache *c = cache_of(b->device);
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&c->lock);
    bool known = false;
    for (uint32_t i = 0; i < b->nrecorded && !known; i++)
        known = b->recorded_ids[i] == stream_id;
    if (b->state != BLOCK_LIVE) {
        err = cudaErrorInvalidValue;
    } else if (known) {
        /* once is enough */
    } else if (b->nrecorded == BLOCK_MAX_RECORDED) {
        err = cudaErrorInvalidValue;
    } else {
        /* Arrays of the largest size at once: a block rarely has any. */
        if (b->recorded == NULL) {
            b->recorded = malloc(BLOCK_MAX_RECORDED * sizeof *b->recorded);
            b->recorded_ids = malloc(BLOCK_MAX_RECORDED *
                                     sizeof *b->recorded_ids);
        }
        if (b->recorded == NULL || b->recorded_ids == NULL) {
            err = cudaErrorMemoryAllocation;
        } else {
            b->recorded[b->nrecorded] = stream;
            b->recorded_ids[b->nrecorded++] = stream_id;
        }
    }
    bool full = b->nrecorded == BLOCK_MAX_RECORDED && !known;
    pthread_mutex_unlock(&c->lock);
    if (err == cudaErrorInvalidValue)
        report("defer_record_stream: %p %s: nothing recorded", ptr,
               full ? "is already recorded on 63 streams (the most)"
                    : "is no live block of cudefer's (already freed?)");
    return err;
}

size_t block_cache_recorded(const void *ptr, cudaStream_t *out)
{
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return 0;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    size_t n = b->state == BLOCK_LIVE || b->state == BLOCK_FREEING
                   ? b->nrecorded
                   : 0;
    if (out != NULL && n > 0)
        memcpy(out, b->recorded, n * sizeof *out);
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* ---- the reclaimer ------------------------------------------------------ */

/* Lock held, after an entry naming b (or a part merged into it) is done:
 * a PENDING b whose work and parts' work are all done goes FREE, a FREE
 * one no entry names merges with its neighbours, and a GONE one no entry
 * names is *forget's (b's record may be freed). */
static void settle(struct device_cache *c, struct cache_block *b,
                   uint64_t now, struct cache_block **forget)
{
    if (b->outstanding > 0)
        return;
    if (b->state == BLOCK_PENDING && b->ready)
        make_free(c, b, now);
    else if (b->state == BLOCK_FREE && b->events == 0)
        merge_free(c, b);
    else if (b->state == BLOCK_GONE && b->events == 0)
        *forget = b;
}

void block_cache_event_done(struct cache_block *b, uint64_t handout, bool ok,
                            uint64_t now)
{
    (void)ok; /* a failed device's blocks are never handed out again: its
                 defer_alloc calls fail first */
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    b->events--;
    struct cache_block *forget[1] = {NULL};
    struct cache_block *done = NULL; /* MERGED records, via lru_next */
    if (b->state == BLOCK_MERGED) {
        /* Its part is done once its entries and its own parts are: tell
         * the block it was merged into, and so on up. */
        while (b->state == BLOCK_MERGED && b->events == 0 &&
               b->outstanding == 0) {
            struct cache_block *into = b->merged_into;
            b->lru_next = done;
            done = b;
            into->outstanding--;
            b = into;
        }
        if (b->state != BLOCK_MERGED)
            settle(c, b, now, &forget[0]);
    } else if (b->state == BLOCK_PENDING && b->handout == handout) {
        b->ready = true; /* its own work is done */
        settle(c, b, now, &forget[0]);
    } else {
        settle(c, b, now, &forget[0]);
    }
    pthread_mutex_unlock(&c->lock);
    while (done != NULL) {
        struct cache_block *next = done->lru_next;
        block_cache_forget(done);
        done = next;
    }
    if (forget[0] != NULL) /* no entry names it any more */
        block_cache_forget(forget[0]);
}

bool block_cache_adopt(void *ptr)
{
    if (!block_cache_active())
        return false;
    struct cache_block *b = block_map_find(ptr);
    if (b == NULL)
        return false;
    struct device_cache *c = cache_of(b->device);
    pthread_mutex_lock(&c->lock);
    /* FREEING: the work of the free that claimed it is done.  LIVE: a
     * release no free claimed (every free path claims; such a block still
     * comes back rather than being cudaFree'd). */
    bool live = b->state == BLOCK_FREEING || b->state == BLOCK_LIVE;
    if (live)
        make_free(c, b, now_ns());
    pthread_mutex_unlock(&c->lock);
    if (!live)
        report("release: %p (device %d) is a block of cudefer's that was "
               "already free: freed twice; the second free is ignored", ptr,
               b->device);
    return true;
}

size_t block_cache_collect(int device, uint64_t freed_before_ns,
                           struct cache_block **out, size_t max,
                           size_t max_bytes)
{
    if (device < 0 || device >= ncaches)
        return 0;
    struct device_cache *c = cache_of(device);
    size_t n = 0, bytes = 0;
    pthread_mutex_lock(&c->lock);
    struct cache_block *b = c->lru.oldest;
    while (b != NULL && n < max && bytes < max_bytes &&
           b->freed_ns <= freed_before_ns) {
        struct cache_block *next = b->lru_next;
        /* Not while an old entry (or a merged part's) still names it. */
        if (b->events == 0 && b->outstanding == 0) {
            free_unlink(c, b);
            block_map_remove(b);
            stats_sub(&stats.cache_free_bytes, b->size);
            stats_sub(&stats.cache_bytes, b->size);
            bytes += b->size;
            out[n++] = b;
        }
        b = next;
    }
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* Lock held.  Whether b, FREE or PENDING on the stream of a request that
 * missed, may go back to the pool for it: a whole pool segment, and when
 * FREE, one no entry names that was free at or before freed_before_ns. */
static bool may_hand_back(const struct cache_block *b, uint64_t freed_before_ns)
{
    return b->pool && is_whole(b) &&
           (b->state == BLOCK_PENDING ||
            (b->events == 0 && b->outstanding == 0 &&
             b->freed_ns <= freed_before_ns));
}

/* Lock held.  The largest block of s (NULL: none) that may go back; of
 * equal sizes, the oldest filed. */
static struct cache_block *largest_to_hand_back(const struct bins *s,
                                                uint64_t freed_before_ns)
{
    if (s == NULL)
        return NULL;
    for (int bin = NBINS - 1; (bin = bins_prev(s, bin)) >= 0; bin--) {
        struct cache_block *best = NULL;
        for (struct cache_block *b = s->head[bin]; b != NULL; b = b->next)
            if (may_hand_back(b, freed_before_ns) &&
                (best == NULL || b->size >= best->size))
                best = b;
        if (best != NULL)
            return best;
    }
    return NULL;
}

size_t block_cache_collect_largest(int device, unsigned long long stream_id,
                                   uint64_t freed_before_ns,
                                   struct block_memory *out, size_t max,
                                   size_t max_bytes)
{
    if (device < 0 || device >= ncaches)
        return 0;
    struct device_cache *c = cache_of(device);
    size_t n = 0, bytes = 0;
    struct cache_block *forget = NULL; /* FREE records, through lru_next */
    pthread_mutex_lock(&c->lock);
    while (n < max && bytes < max_bytes) {
        struct stream_bins *own = *stream_slot(c, stream_id);
        struct cache_block *b = largest_to_hand_back(&c->free, freed_before_ns);
        struct cache_block *p = largest_to_hand_back(
            own != NULL ? &own->bins : NULL, freed_before_ns);
        if (b == NULL || (p != NULL && p->size > b->size))
            b = p; /* size for size, a FREE block first */
        if (b == NULL)
            break;
        if (b->state == BLOCK_PENDING) {
            /* Its record waits for its entry (the reclaimer forgets it). */
            stream_unlink(c, b);
            b->state = BLOCK_GONE;
        } else {
            free_unlink(c, b);
            b->lru_next = forget;
            forget = b;
        }
        block_map_remove(b);
        stats_sub(&stats.cache_free_bytes, b->size);
        stats_sub(&stats.cache_bytes, b->size);
        bytes += b->size;
        /* Copied now: a GONE record may be freed once the lock is left. */
        out[n++] = (struct block_memory){b->ptr, b->size};
    }
    pthread_mutex_unlock(&c->lock);
    while (forget != NULL) {
        struct cache_block *next = forget->lru_next;
        block_cache_forget(forget);
        forget = next;
    }
    return n;
}

void block_cache_forget(struct cache_block *b)
{
    free(b->recorded);
    free(b->recorded_ids);
    free(b);
}

uint64_t block_cache_oldest_free_ns(int device)
{
    if (device < 0 || device >= ncaches)
        return UINT64_MAX;
    struct device_cache *c = cache_of(device);
    pthread_mutex_lock(&c->lock);
    uint64_t t = c->lru.oldest != NULL ? c->lru.oldest->freed_ns : UINT64_MAX;
    pthread_mutex_unlock(&c->lock);
    return t;
}
