/* SPDX-License-Identifier: MIT */
/* Helpers shared by the block cache's unit tests (t/block_cache.c,
 * t/block_stale.c, t/block_leave.c, ...), which reach the cache through its
 * interface, src/cache.h, and see a block's fields through its tests-only
 * view: made-up addresses, the two claim paths and a stream-ordered free. */
#ifndef CUDEFER_T_BLOCK_TEST_H
#define CUDEFER_T_BLOCK_TEST_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "tap.h"

/* Made-up addresses: the cache never dereferences them. */
#define ADDR(n) ((void *)(uintptr_t)(UINT64_C(0x7f0000000000) + (n) * 0x100000))

/* New memory filed as a block, as defer_alloc's miss files it (a stale
 * block it replaces is said in defer_alloc's words). */
static inline bool add_block(int device, void *ptr, size_t size,
                             bool upstream)
{
    return cache_add("defer_alloc", device, ptr, size, upstream);
}

/* block's fields (cache_test_view). */
static inline struct block_view view(const struct cache_block *block)
{
    return cache_test_view(block);
}

/* A LIVE block at p freed by a path that waits for its event (claimed),
 * its work done (adopted): FREE.  True when so. */
static inline bool give_back(void *p)
{
    struct block_claim claim;
    if (cache_claim(p, &claim) != BLOCK_AFTER_EVENT ||
        claim.block != cache_test_find(p))
        return false;
    cache_reclaim_adopt(&claim, "defer_free");
    return cache_test_find(p) != NULL;
}

/* Free p on stream id of device the stream-ordered way: planned and
 * parked, PENDING on that stream (*plan: its block and hand-out).  True
 * when so. */
static inline bool park_free(void *p, int device, unsigned long long id,
                             struct block_free_plan *plan)
{
    cache_claim_plan(p, device, id, plan);
    return plan->path == BLOCK_STREAM_ORDERED && cache_claim_park(plan, id);
}

/* A free of p on stream id of device the stream-ordered way, parked
 * PENDING; its hand-out (0, said, when it took another path). */
static inline uint64_t free_on_device(void *p, int device,
                                      unsigned long long id)
{
    struct block_free_plan plan;
    if (!park_free(p, device, id, &plan)) {
        diag("free_on_device(%p, %d, %llu): path %d", p, device, id,
             (int)plan.path);
        return 0;
    }
    return plan.handout;
}

/* The same on device 0. */
static inline uint64_t free_on(void *p, unsigned long long id)
{
    return free_on_device(p, 0, id);
}

/* A claim by a free path that waits for more than one event; its path. */
static inline enum block_free_path claim(void *p)
{
    struct block_claim c;
    enum block_free_path path = cache_claim(p, &c);
    if (c.block != NULL)
        cache_claim_undo(&c);
    return path;
}

#endif
