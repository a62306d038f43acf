/* SPDX-License-Identifier: MIT */
/* The block cache's reclaimer side (cache.h says which file holds what):
 * a claim's work done, a release's adoption, the blocks that leave the
 * cache and their release, and the spare block structs kept for reuse.
 * Mostly the reclaimer's; a launching thread completes claims in a free
 * batch's fallback, adopts in a synchronous release and hands segments
 * back on a miss.  Each call holds a device's lock only while it works and
 * makes no CUDA call under it. */
#include "cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_block.h"
#include "cuda.h"
#include "clock.h"
#include "report.h"
#include "stats.h"

/* ---- a claim's work done ------------------------------------------------ */

/*
 * Note [Letting waiters in]
 *
 * The reclaimer completes claims in runs (an entry's, a free batch's 32),
 * while launching threads take the same device lock for every hit and
 * free.  So it takes the lock once for up to CLAIMS_PER_HOLD claims of one
 * device: the launching threads contend with it once a few blocks, not
 * once a block, and wait no longer than a few blocks take.  And before
 * each hold it lets in the threads already waiting for the lock: one asleep
 * on the lock is woken by the unlock, but was otherwise scheduled only
 * after the reclaimer, still running, had taken the lock again, and waited
 * for the rest of the run.  A thread that finds the lock held counts
 * itself in c->waiting (cache_lock); before a hold the reclaimer spins
 * while that count is not 0, WAITER_WAIT_NS at most, so that a waiter slow
 * to be scheduled (its CPU busy) delays it no longer.  A spin, not
 * sched_yield: a yield to a busy thread on the reclaimer's own CPU gives
 * it a time slice, over a millisecond.  It never waits for a thread that
 * has not asked for the lock yet.  (A launching thread that completes
 * claims itself, free_batch.c, does the same: a slow path already.)
 */

/* The most claims completed in one hold of a device's lock. */
#define CLAIMS_PER_HOLD 8

/* The longest wait, spinning, for the threads already waiting before a
 * hold. */
#define WAITER_WAIT_NS 50000u

/* Any thread, under the device's lock, after an entry naming b (or a part
 * merged into it) is done: a PENDING b whose work and parts' work are all done
 * goes FREE, a FREE one nothing names merges with its neighbours, and a GONE
 * or dropped one nothing names joins *forget (through lru_next; b may be
 * retired). */
static void settle(struct device_cache *c, struct cache_block *b,
                   uint64_t now, struct cache_block **forget)
{
    if (b->outstanding > 0)
        return;
    if (b->state == BLOCK_PENDING && b->ready)
        cache_make_free(c, b, now);
    else if (b->state == BLOCK_FREE && b->events == 0)
        cache_segments_merge_free(c, b);
    else if ((b->state == BLOCK_GONE && b->events == 0) ||
             block_dropped_unnamed(b)) {
        b->lru_next = *forget;
        *forget = b;
    }
}

/* Any thread, under the device's lock: the event of an entry naming b
 * (hand-out handout) is done.  Blocks nothing names any more join *forget
 * (through lru_next). */
static void event_done_locked(struct device_cache *c, struct cache_block *b,
                              uint64_t handout, uint64_t now,
                              struct cache_block **forget)
{
    b->events--;
    if (b->state == BLOCK_PENDING && b->handout == handout)
        b->ready = true; /* its own work is done */
    /* A MERGED part is done once its entries and its own parts are: tell
     * the block it was merged into, and so on up. */
    while (b->state == BLOCK_MERGED && b->events == 0 &&
           b->outstanding == 0) {
        cache_map_remove(b); /* unless a piece took its address */
        b->lru_next = *forget;
        *forget = b;
        b = b->merged_into;
        b->outstanding--;
    }
    if (b->state != BLOCK_MERGED)
        settle(c, b, now, forget);
}

/* Before a hold of c's lock in a run of work: the threads already waiting
 * for it go first (Note [Letting waiters in]). */
static void let_waiters_in(struct device_cache *c)
{
    if (atomic_load_explicit(&c->waiting, memory_order_relaxed) == 0)
        return;
    uint64_t until = now_ns() + WAITER_WAIT_NS;
    while (atomic_load_explicit(&c->waiting, memory_order_relaxed) > 0 &&
           now_ns() < until)
        cpu_relax();
}

void cache_reclaim_claims_done(const struct block_claim *claims, size_t n,
                               bool ok, uint64_t now)
{
    (void)ok; /* a failed device's blocks are never handed out again: its
                 defer_alloc calls fail first */
    for (size_t i = 0; i < n;) {
        struct cache_block *forget = NULL;
        /* One hold for a run of one device's claims (a free batch's are all
         * one device's), CLAIMS_PER_HOLD at most. */
        struct device_cache *c = cache_device(claims[i].block->device);
        size_t end = i + CLAIMS_PER_HOLD < n ? i + CLAIMS_PER_HOLD : n;
        let_waiters_in(c);
        cache_lock(c);
        do {
            event_done_locked(c, claims[i].block, claims[i].handout, now,
                              &forget);
            i++;
        } while (i < end && cache_device(claims[i].block->device) == c);
        /* c's blocks: kept for c's next pieces. */
        while (forget != NULL) {
            struct cache_block *next = forget->lru_next;
            cache_reclaim_retire(c, forget);
            forget = next;
        }
        pthread_mutex_unlock(&c->lock);
    }
}

void cache_reclaim_event_done(struct cache_block *b, uint64_t handout,
                              bool ok, uint64_t now)
{
    struct block_claim claim = {b, handout};
    cache_reclaim_claims_done(&claim, 1, ok, now);
}

void cache_reclaim_adopt(const struct block_claim *claim, const char *what)
{
    struct cache_block *b = claim->block;
    struct device_cache *c = cache_device(b->device);
    cache_lock(c);
    /* The claim's block, FREEING since its free was accepted, unless it
     * was dropped (Note [Stale blocks]: hand-out 0). */
    bool mine = b->state == BLOCK_FREEING && b->handout == claim->handout;
    void *ptr = b->ptr;
    int device = b->device;
    bool forget = block_claim_let_go(b);
    if (mine) /* events dropped first: a FREE block nothing names merges */
        cache_make_free(c, b, now_ns());
    pthread_mutex_unlock(&c->lock);
    if (forget)
        cache_forget(b);
    if (!mine)
        report("release: %p (device %d) was a block of cudefer's whose "
               "memory was freed with cudaFree behind cudefer's back while "
               "its %s waited: the release is ignored", ptr, device, what);
}

bool cache_reclaim_unclaimed_is_block(void *ptr)
{
    if (!cache_active())
        return false;
    struct device_cache *c;
    struct cache_block *b = cache_find_locked(ptr, &c);
    if (b == NULL)
        return false;
    /* Every free claims the blocks it frees (a second one is refused), so
     * the block here now is another owner's, or free, or being freed by its
     * own free: never touched.  A piece is left to cudaFree, which refuses
     * it as the interior pointer it was; a whole segment must not be
     * cudaFree'd under the cache. */
    enum block_state state = b->state;
    bool piece = state == BLOCK_MERGED || !is_whole(b); /* MERGED: unlinked */
    int device = b->device;
    pthread_mutex_unlock(&c->lock);
    if (piece)
        return false;
    report("release: %p (device %d) is a block of cudefer's that no free "
           "claimed (%s; freed twice?): the release is ignored", ptr, device,
           state == BLOCK_LIVE      ? "another owner holds it"
           : state == BLOCK_FREEING ? "its owner's free waits for its work"
                                    : "it is free");
    return true;
}

/* ---- blocks that leave the cache ---------------------------------------- */

/* Any thread, under the device's lock.  A whole segment's block b, unlinked
 * from its list, leaves the cache: out of the address map and the segment
 * index, out of the byte counts.  Returns its size. */
static size_t leave_cache(struct device_cache *c, struct cache_block *b)
{
    cache_map_remove(b);
    cache_segments_unfile(c, b->ptr);
    stats_device_left(b->device, b->size, true);
    return b->size;
}

size_t cache_reclaim_expired(int device, uint64_t freed_before_ns,
                             struct cache_block **out, size_t max,
                             size_t max_bytes)
{
    struct device_cache *c = cache_device(device);
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

/* A release of b that failed with err, not sticky: said, naming call. */
static void report_not_released(const struct cache_block *b,
                                const char *call, cudaError_t err)
{
    char detail[96];
    snprintf(detail, sizeof detail, "; block %p (device %d) is not released",
             b->ptr, b->device);
    cuda_report_failure("release", call, err, detail);
}

size_t cache_reclaim_release(int device, uint64_t freed_before_ns,
                             cudaStream_t stream,
                             void (*fail)(int device, const char *call,
                                          cudaError_t err),
                             bool (*stop)(void))
{
    struct cache_block *batch[64];
    uint64_t released = 0, failures = 0;
    size_t bytes = 0, n;
    size_t tried = 0;
    bool stopped = false;
    while (!stopped && (n = cache_reclaim_expired(device, freed_before_ns,
                                                  batch, 64, SIZE_MAX)) > 0) {
        for (size_t i = 0; i < n; i++) {
            if (tried++ > 0 && stop != NULL && stop()) {
                stopped = true;
                break;
            }
            /* Upstream segments go back to the pool at no cost; others (no
             * pool could be made) drain the device. */
            struct cache_block *b = batch[i];
            const char *call = "cudaFree";
            cudaError_t err =
                !b->upstream ? cuda_free(b->ptr)
                : stream != NULL
                    ? cache_upstream_free("release", device, b->ptr, b->size,
                                          stream, &call)
                    : cache_upstream_free_sync(device, b->ptr, b->size);
            if (err == cudaSuccess) {
                released++;
                /* An upstream segment's bytes leave the device only when
                 * the pool's reserve shrinks (cache_upstream_trim, counted
                 * there once). */
                if (!b->upstream)
                    bytes += b->size;
            } else {
                /* Out of the cache, its memory not given back: a failed
                 * release, never a released one. */
                failures++;
                if (cuda_error_is_sticky(err))
                    fail(device, call, err);
                else
                    report_not_released(b, call, err);
            }
            cache_forget(b);
        }
    }
    stats_device_count_releases(device, released);
    stats_device_count_release_failures(device, failures);
    return bytes;
}

/* Any thread, under the device's lock.  Whether b, FREE or PENDING on the
 * stream of a request that missed, may go back upstream for it: a whole
 * upstream segment, and when FREE, one nothing names that was free at or
 * before freed_before_ns. */
static bool may_hand_back(const struct cache_block *b, uint64_t freed_before_ns)
{
    return b->upstream && is_whole(b) &&
           (b->state == BLOCK_PENDING ||
            (b->events == 0 && b->outstanding == 0 &&
             b->freed_ns <= freed_before_ns));
}

/* Any thread, under the device's lock.  The largest block of s (NULL: none)
 * that may go back; of equal sizes, the oldest filed. */
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

size_t cache_reclaim_for_miss(int device, unsigned long long stream_id,
                              uint64_t freed_before_ns,
                              struct block_memory *out, size_t max,
                              size_t max_bytes)
{
    struct device_cache *c = cache_device(device);
    if (c == NULL)
        return 0;
    size_t n = 0, bytes = 0;
    struct cache_block *forget = NULL; /* FREE blocks, through lru_next */
    cache_lock(c);
    while (n < max && bytes < max_bytes) {
        struct stream_bins *own = cache_stream_bins(c, stream_id);
        struct cache_block *b = largest_to_hand_back(&c->free, freed_before_ns);
        struct cache_block *p = largest_to_hand_back(
            own != NULL ? &own->bins : NULL, freed_before_ns);
        if (b == NULL || (p != NULL && p->size > b->size))
            b = p; /* size for size, a FREE block first */
        if (b == NULL)
            break;
        if (b->state == BLOCK_PENDING) {
            /* It waits for its entry (the reclaimer forgets it). */
            cache_stream_unlink(c, b);
            b->state = BLOCK_GONE;
        } else {
            free_unlink(c, b);
            b->lru_next = forget;
            forget = b;
        }
        bytes += leave_cache(c, b); /* whole (may_hand_back) */
        /* Copied now: a GONE block may be freed once the lock is left. */
        out[n++] = (struct block_memory){b->ptr, b->size};
    }
    while (forget != NULL) { /* kept for c's next pieces */
        struct cache_block *next = forget->lru_next;
        cache_reclaim_retire(c, forget);
        forget = next;
    }
    pthread_mutex_unlock(&c->lock);
    return n;
}

uint64_t cache_reclaim_oldest_free_ns(int device)
{
    struct device_cache *c = cache_device(device);
    if (c == NULL)
        return UINT64_MAX;
    /* As cache_reclaim_expired walks the age list: it stops at the first
     * block freed after its time, named or not (the list is not strictly
     * by time: a segment made whole again joins its tail with its pieces'
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

/* ---- spare block structs ------------------------------------------------ */

/*
 * Note [Spare blocks]
 *
 * A request cut from a larger block needs a new struct, and a merge frees
 * one: in the PyTorch LM's trace, one request in four of each.  The cut
 * happens on a launching thread and most structs are let go by the
 * reclaimer (a merged piece whose entry completed), so malloc's per-thread
 * caches never matched them up: each calloc took the arena's slow path
 * (19 cache lines missed a cut on average), and the reclaimer's free()
 * took the launching thread's arena lock.  So a device keeps the structs
 * its merges retire, up to SPARE_BLOCKS_KEPT, under its lock, and a cut
 * takes one back, as warm as the lines it is written through.  A spare
 * links to the next through lru_next and holds the depth of the stack it
 * tops in size, so that neither push nor pop touches a line of the
 * device's but its lock's.  Beyond SPARE_BLOCKS_KEPT a retired struct goes
 * to the device's surplus, which the reclaimer frees outside the lock
 * (nothing is freed under it: Note [Locks]).
 *
 * A struct keeps its device for good (blocks never move between devices)
 * and its users array (hidden by nusers 0).  A RETIRED struct is read by
 * no thread until it is reused: cache_find_locked asks the map again under
 * the lock.
 */

/* b zeroed but for its device and its users array, which stay: b is this
 * device's for good, and so is the array. */
static void reset(struct cache_block *b)
{
    struct block_user *users = b->users;
    char *at = (char *)b;
    size_t dev = offsetof(struct cache_block, device);
    size_t after = dev + sizeof b->device;
    memset(at, 0, dev);
    memset(at + after, 0, sizeof *b - after);
    b->users = users;
}

struct cache_block *cache_reclaim_reuse(struct device_cache *c)
{
    struct cache_block *b = c->spare_blocks;
    if (b == NULL)
        return calloc(1, sizeof *b);
    c->spare_blocks = b->lru_next;
    reset(b);
    return b;
}

void cache_reclaim_retire(struct device_cache *c, struct cache_block *b)
{
    b->state = BLOCK_RETIRED;
    b->handout = 0;
    b->nusers = 0;
    size_t depth = cache_reclaim_spares_kept(c);
    if (depth >= SPARE_BLOCKS_KEPT) {
        b->lru_next = atomic_load_explicit(&c->surplus_blocks,
                                           memory_order_relaxed);
        atomic_store_explicit(&c->surplus_blocks, b, memory_order_relaxed);
        return;
    }
    b->lru_next = c->spare_blocks;
    b->size = depth + 1;
    c->spare_blocks = b;
}

size_t cache_reclaim_spares_kept(const struct device_cache *c)
{
    return c->spare_blocks != NULL ? c->spare_blocks->size : 0;
}

static size_t free_list(struct cache_block *b)
{
    size_t n = 0;
    for (struct cache_block *next; b != NULL; b = next, n++) {
        next = b->lru_next;
        free(b->users);
        free(b);
    }
    return n;
}

size_t cache_reclaim_collect_spares(struct device_cache *c)
{
    if (atomic_load_explicit(&c->surplus_blocks, memory_order_relaxed) ==
        NULL)
        return 0;
    cache_lock(c);
    struct cache_block *list = atomic_exchange_explicit(
        &c->surplus_blocks, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&c->lock);
    return free_list(list);
}

void cache_reclaim_collect(void)
{
    struct device_cache *c;
    for (int d = 0; (c = cache_device(d)) != NULL; d++)
        cache_reclaim_collect_spares(c);
}

void cache_reclaim_free_spares(struct device_cache *c)
{
    free_list(c->spare_blocks);
    c->spare_blocks = NULL;
    free_list(atomic_exchange_explicit(&c->surplus_blocks, NULL,
                                       memory_order_relaxed));
}
