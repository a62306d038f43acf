/* Stale block records: a fresh allocation's address that cudefer still
 * counted as its block, whose memory was freed with cudaFree behind
 * cudefer's back (see the header). */
#include "block_stale.h"

#include <pthread.h>

#include "block_map.h"
#include "block_pool.h"
#include "block_segments.h"
#include "report.h"
#include "stats.h"

bool block_stale_drop_locked(struct device_cache *c,
                             struct cache_block *stale)
{
    if (stale->state == BLOCK_PENDING)
        block_cache_stream_unlink(c, stale);
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
    if (stale->pool) /* its memory went back behind cudefer's back too */
        block_pool_forget(stale->device, stale->size);
    stale->state = BLOCK_LIVE;
    stale->handout = 0; /* no entry's hand-out matches it any more */
    return stale->events > 0 || stale->outstanding > 0;
}

void block_stale_report(const void *ptr, size_t size)
{
    report("defer_alloc: cudaMalloc returned %p, which cudefer still counted "
           "as its block of %zu bytes: that block was freed with cudaFree "
           "instead of defer_free; its record is dropped", ptr, size);
}

void block_stale_evict_other(const void *ptr, int device)
{
    struct device_cache *o;
    struct cache_block *x = block_cache_find_locked(ptr, &o);
    if (x == NULL)
        return;
    if (x->device == device) { /* the caller's own hold drops it */
        pthread_mutex_unlock(&o->lock);
        return;
    }
    /* A MERGED piece is no block of its own (its bytes are counted in the
     * block that absorbed it): only unfiled; its entries forget it. */
    bool merged = x->state == BLOCK_MERGED;
    size_t size = x->size;
    bool named = merged || block_stale_drop_locked(o, x);
    /* Its range too (a block of this device's at ptr replaces the range
     * when it is filed; this one is of another device): a free in what is
     * left of it would be refused as a pointer inside a block. */
    if (!merged)
        block_segments_unfile(o, ptr);
    block_map_remove(x);
    pthread_mutex_unlock(&o->lock);
    if (merged)
        return;
    block_stale_report(ptr, size);
    if (!named) /* else the last entry naming it forgets it (a claim
                   let go, or the reclaimer: block_done.c, settle) */
        block_cache_forget(x);
}
