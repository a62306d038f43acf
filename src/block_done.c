/* Block done: the block cache once work is done (see the header).  The
 * launching threads' side, and the state both share, are in block_cache.c
 * and block_bins.h. */
#include "block_done.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block_bins.h"
#include "block_map.h"
#include "block_records.h"
#include "block_segments.h"
#include "clock.h"
#include "report.h"

/* The most claims the reclaimer completes in one hold of a device's lock
 * (block_done_claims). */
#define CLAIMS_PER_HOLD 8

/* How long the reclaimer waits, spinning, before a hold while launching
 * threads wait for the lock: one slow to be scheduled (its CPU busy) is
 * not waited for longer.  A spin, not sched_yield: a yield to a busy
 * thread on the reclaimer's own CPU took 1.4 ms (a review, 2026-11-26),
 * 64 of them 90 ms a hold. */
#define WAITER_WAIT_NS 50000u

/* Lock held, after an entry naming b (or a part merged into it) is done:
 * a PENDING b whose work and parts' work are all done goes FREE, a FREE
 * one no entry names merges with its neighbours, and a GONE or dropped one
 * no entry names joins *forget (through lru_next; b's record may be
 * retired). */
static void settle(struct device_cache *c, struct cache_block *b,
                   uint64_t now, struct cache_block **forget)
{
    if (b->outstanding > 0)
        return;
    if (b->state == BLOCK_PENDING && b->ready)
        block_cache_make_free(c, b, now);
    else if (b->state == BLOCK_FREE && b->events == 0)
        block_segments_merge_free(c, b);
    else if ((b->state == BLOCK_GONE && b->events == 0) ||
             block_dropped_unnamed(b)) { /* t/block_stale: these leaked */
        b->lru_next = *forget;
        *forget = b;
    }
}

/* Lock held: the event of an entry naming b (hand-out handout) is done.
 * Records no entry names any more join *forget (through lru_next). */
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
        block_map_remove(b); /* unless a piece took its address */
        b->lru_next = *forget;
        *forget = b;
        b = b->merged_into;
        b->outstanding--;
    }
    if (b->state != BLOCK_MERGED)
        settle(c, b, now, forget);
}

/* Before a hold of c's lock in a run of work (the reclaimer's): the
 * threads already waiting for it (cache_lock) go first.  The unlock that
 * ended the last hold woke one; each takes the lock and lets it go in turn
 * while this thread spins (WAITER_WAIT_NS at most).  Never waits for a
 * thread that has not asked for the lock yet.  (Also on a launching thread
 * that completes claims itself, free_batch.c: a slow path already.) */
static void let_waiters_in(struct device_cache *c)
{
    if (atomic_load_explicit(&c->waiting, memory_order_relaxed) == 0)
        return;
    uint64_t until = now_ns() + WAITER_WAIT_NS;
    while (atomic_load_explicit(&c->waiting, memory_order_relaxed) > 0 &&
           now_ns() < until)
        cpu_relax();
}

void block_done_claims(const struct block_claim *claims, size_t n, bool ok,
                       uint64_t now)
{
    (void)ok; /* a failed device's blocks are never handed out again: its
                 defer_alloc calls fail first */
    for (size_t i = 0; i < n;) {
        struct cache_block *forget = NULL;
        /* One lock hold for a run of one device's claims (a free batch's
         * are all one device's), CLAIMS_PER_HOLD at most: the launching
         * threads contend with the reclaimer for it once a few blocks, not
         * once a block, and wait for it no longer than a few blocks take
         * (a whole batch of 32 held it 6-12 us,
         * bench/results/2026-11-26-h100-call-tails.txt), since those
         * already waiting go first (let_waiters_in). */
        struct device_cache *c = block_cache_device(claims[i].block->device);
        size_t end = i + CLAIMS_PER_HOLD < n ? i + CLAIMS_PER_HOLD : n;
        let_waiters_in(c);
        cache_lock(c);
        do {
            event_done_locked(c, claims[i].block, claims[i].handout, now,
                              &forget);
            i++;
        } while (i < end && block_cache_device(claims[i].block->device) == c);
        /* Records of c's blocks: kept for c's next cuts. */
        while (forget != NULL) {
            struct cache_block *next = forget->lru_next;
            block_records_retire(c, forget);
            forget = next;
        }
        pthread_mutex_unlock(&c->lock);
    }
}

void block_done_event(struct cache_block *b, uint64_t handout, bool ok,
                      uint64_t now)
{
    struct block_claim claim = {b, handout};
    block_done_claims(&claim, 1, ok, now);
}

void block_done_adopt(const struct block_claim *claim)
{
    struct cache_block *b = claim->block;
    struct device_cache *c = block_cache_device(b->device);
    cache_lock(c);
    /* The claim's record, FREEING since its free was accepted, unless the
     * record was dropped (block_stale.h: handout 0). */
    bool mine = b->state == BLOCK_FREEING && b->handout == claim->handout;
    void *ptr = b->ptr;
    int device = b->device;
    bool forget = block_claim_let_go(b);
    if (mine) /* events dropped first: a FREE block no entry names merges */
        block_cache_make_free(c, b, now_ns());
    pthread_mutex_unlock(&c->lock);
    if (forget)
        block_cache_forget(b);
    if (!mine)
        report("release: %p (device %d) was a block of cudefer's whose "
               "memory was freed with cudaFree behind cudefer's back while "
               "its defer_free waited: the release is ignored", ptr, device);
}

bool block_done_unclaimed_is_block(void *ptr)
{
    if (!block_cache_active())
        return false;
    struct device_cache *c;
    struct cache_block *b = block_cache_find_locked(ptr, &c);
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
