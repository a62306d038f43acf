/* Block leave: which blocks leave the cache for the pool or for CUDA (see
 * the header): the reclaimer's expired and trimmed ones, oldest first, and
 * a missed request's hand-back, the largest first. */
#include "block_leave.h"

#include <pthread.h>
#include <stdlib.h>

#include "block_bins.h"
#include "block_map.h"
#include "block_records.h"
#include "block_segments.h"
#include "stats.h"

/* Lock held.  A whole segment's block b, unlinked from its list, leaves
 * the cache for the pool: out of the block map and the segment index, out
 * of the byte counts.  Returns its size. */
static size_t leave_cache(struct device_cache *c, struct cache_block *b)
{
    block_map_remove(b);
    block_segments_unfile(c, b->ptr);
    stats_sub(&stats.cache_free_bytes, b->size);
    stats_sub(&stats.cache_bytes, b->size);
    return b->size;
}

size_t block_leave_expired(int device, uint64_t freed_before_ns,
                           struct cache_block **out, size_t max,
                           size_t max_bytes)
{
    struct device_cache *c = block_cache_device(device);
    if (c == NULL)
        return 0;
    size_t n = 0, bytes = 0;
    cache_lock(c);
    struct cache_block *b = c->lru.oldest;
    while (b != NULL && n < max && bytes < max_bytes &&
           b->freed_ns <= freed_before_ns) {
        struct cache_block *next = b->lru_next;
        /* Not while an old entry (or a merged part's) still names it. */
        if (b->events == 0 && b->outstanding == 0) {
            free_unlink(c, b);
            bytes += leave_cache(c, b); /* whole: on the age list */
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

size_t block_leave_for_miss(int device, unsigned long long stream_id,
                            uint64_t freed_before_ns, struct block_memory *out,
                            size_t max, size_t max_bytes)
{
    struct device_cache *c = block_cache_device(device);
    if (c == NULL)
        return 0;
    size_t n = 0, bytes = 0;
    struct cache_block *forget = NULL; /* FREE records, through lru_next */
    cache_lock(c);
    while (n < max && bytes < max_bytes) {
        struct stream_bins *own = block_cache_stream_bins(c, stream_id);
        struct cache_block *b = largest_to_hand_back(&c->free, freed_before_ns);
        struct cache_block *p = largest_to_hand_back(
            own != NULL ? &own->bins : NULL, freed_before_ns);
        if (b == NULL || (p != NULL && p->size > b->size))
            b = p; /* size for size, a FREE block first */
        if (b == NULL)
            break;
        if (b->state == BLOCK_PENDING) {
            /* Its record waits for its entry (the reclaimer forgets it). */
            block_cache_stream_unlink(c, b);
            b->state = BLOCK_GONE;
        } else {
            free_unlink(c, b);
            b->lru_next = forget;
            forget = b;
        }
        bytes += leave_cache(c, b); /* whole (may_hand_back) */
        /* Copied now: a GONE record may be freed once the lock is left. */
        out[n++] = (struct block_memory){b->ptr, b->size};
    }
    while (forget != NULL) { /* kept for c's next cuts */
        struct cache_block *next = forget->lru_next;
        block_records_retire(c, forget);
        forget = next;
    }
    pthread_mutex_unlock(&c->lock);
    return n;
}

uint64_t block_leave_oldest_free_ns(int device)
{
    struct device_cache *c = block_cache_device(device);
    if (c == NULL)
        return UINT64_MAX;
    /* As block_leave_expired walks the age list: it stops at the first
     * block freed after its time, named or not (the list is not strictly
     * by time: a block made whole again joins its tail with its pieces'
     * time), so the first block it can take goes at the latest time seen
     * up to it. */
    uint64_t t = 0;
    cache_lock(c);
    struct cache_block *b = c->lru.oldest;
    for (; b != NULL; b = b->lru_next) {
        if (b->freed_ns > t)
            t = b->freed_ns;
        if (b->events == 0 && b->outstanding == 0)
            break;
    }
    pthread_mutex_unlock(&c->lock);
    return b != NULL ? t : UINT64_MAX;
}
