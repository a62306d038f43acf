/* SPDX-License-Identifier: MIT */
/* Spare block structs kept for reuse (src/cache_reclaim.c, Note [Spare
 * blocks]).  First white-box, on a device cache of its own (so this test
 * includes the private src/cache_block.h): a retired struct is
 * BLOCK_RETIRED and comes back zeroed but for its device and its users
 * array, last in first out, up to SPARE_BLOCKS_KEPT; more go to the
 * surplus, which only cache_reclaim_collect_spares frees (nothing is freed
 * under the lock); ASan's leak check sees the rest.  Then through the
 * cache's interface: the structs a cut takes are the ones merges retired,
 * from FREE neighbours and from MERGED parts whose work completed; and a
 * free that found a block in the map just before it was retired and reused
 * for another block does not free that other block. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "cache_block.h"
#include "helpers.h"

/* A struct as a block leaves it: every byte set, users recorded. */
static struct cache_block *used_block(void)
{
    struct cache_block *b = malloc(sizeof *b);
    if (b == NULL)
        bail("malloc");
    memset(b, 0xa5, sizeof *b);
    b->users = malloc(4 * sizeof *b->users);
    if (b->users == NULL)
        bail("malloc");
    return b;
}

/* Zeroed as calloc's but for what a struct keeps: its device and its
 * users array (hidden: nusers 0). */
static bool zeroed(const struct cache_block *b)
{
    struct cache_block zero = {0};
    zero.device = b->device;
    zero.users = b->users;
    return memcmp(b, &zero, sizeof *b) == 0;
}

static void free_block(struct cache_block *b)
{
    free(b->users);
    free(b);
}

static size_t surplus(const struct device_cache *c)
{
    size_t n = 0;
    for (struct cache_block *b = atomic_load(&c->surplus_blocks); b != NULL;
         b = b->lru_next)
        n++;
    return n;
}

static void test_kept(void)
{
    struct device_cache c = {0};
    is_int((int)cache_reclaim_spares_kept(&c), 0, "a new device keeps no struct");
    struct cache_block *fresh = cache_reclaim_reuse(&c);
    ok(fresh != NULL && zeroed(fresh), "with none kept: a zeroed new struct");
    free(fresh);

    struct cache_block *a = used_block(), *b = used_block();
    struct block_user *arrays[2] = {a->users, b->users};
    int device = a->device;
    cache_reclaim_retire(&c, a);
    cache_reclaim_retire(&c, b);
    is_int((int)cache_reclaim_spares_kept(&c), 2, "two retired: two kept");
    ok(a->state == BLOCK_RETIRED && b->state == BLOCK_RETIRED &&
           a->handout == 0 && a->nusers == 0,
       "retired: BLOCK_RETIRED, no hand-out, no user");
    struct cache_block *first = cache_reclaim_reuse(&c);
    struct cache_block *second = cache_reclaim_reuse(&c);
    ok(first == b && second == a, "given out again last in, first out");
    ok(zeroed(first) && zeroed(second), "zeroed, as calloc's, but for");
    ok(second->device == device && second->users == arrays[0] &&
           first->users == arrays[1],
       "the device and the users array they keep");
    is_int((int)cache_reclaim_spares_kept(&c), 0, "none kept after");
    free_block(first);
    free_block(second);

    int all_kept = 1;
    for (int i = 0; i < SPARE_BLOCKS_KEPT + 50; i++) {
        cache_reclaim_retire(&c, used_block());
        all_kept &= (int)cache_reclaim_spares_kept(&c) ==
                    (i < SPARE_BLOCKS_KEPT ? i + 1 : SPARE_BLOCKS_KEPT);
    }
    ok(all_kept, "kept up to SPARE_BLOCKS_KEPT");
    is_int((int)surplus(&c), 50, "the 50 beyond wait in the surplus");
    is_int((int)cache_reclaim_collect_spares(&c), 50, "collect frees those 50");
    ok(surplus(&c) == 0 && cache_reclaim_spares_kept(&c) == SPARE_BLOCKS_KEPT,
       "none left in the surplus; the kept ones stay");
    is_int((int)cache_reclaim_collect_spares(&c), 0, "nothing more to collect");
    int given = 0;
    struct cache_block *r;
    while (cache_reclaim_spares_kept(&c) > 0 && (r = cache_reclaim_reuse(&c)) != NULL) {
        given += zeroed(r);
        free_block(r);
    }
    is_int(given, SPARE_BLOCKS_KEPT, "each kept struct given out once");
    for (int i = 0; i < SPARE_BLOCKS_KEPT + 10; i++)
        cache_reclaim_retire(&c, used_block());
    cache_reclaim_free_spares(&c);
    ok(surplus(&c) == 0, "free_all: the surplus too");
    is_int((int)cache_reclaim_spares_kept(&c), 0, "free_all: none kept (and none "
                                           "leaked: ASan's leak check)");
}

/* Through the cache: cuts take the structs merges retired. */
static void test_cache_reuses(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(40);
    size_t size;
    ok(add_block(0, base, 4 * MiB, true) && give_back(base),
       "a FREE 4 MiB segment");
    size_t before = cache_test_spares(0);
    void *p = cache_take(0, 1, MiB, &size);
    struct cache_block *piece = cache_test_find(p);
    ok(p == base + 3 * MiB && piece != NULL, "a cut: a struct for the piece");
    struct block_free_plan plan;
    ok(park_free(p, 0, 1, &plan), "the piece freed on stream 1");
    cache_reclaim_event_done(plan.block, plan.handout, true, 5);
    ok(cache_test_find(p) == NULL, "its work done, the piece merged back");
    is_int((int)cache_test_spares(0), (int)before + 1,
           "its struct is kept by the device");
    void *q = cache_take(0, 1, MiB, &size);
    ok(q == p && cache_test_find(q) == piece &&
           (int)cache_test_spares(0) == (int)before,
       "the next cut takes that struct again");

    /* Two pieces freed on stream 7 merge PENDING into the rest (MERGED
     * parts): their structs are retired once their work completed. */
    ok(park_free(q, 0, 1, &plan), "freed again");
    cache_reclaim_event_done(plan.block, plan.handout, true, 6);
    void *whole = cache_take(0, 7, 4 * MiB, &size);
    struct block_free_plan w, pa, pb;
    ok(whole == base && park_free(whole, 0, 7, &w),
       "the whole segment taken and freed on stream 7");
    void *a = cache_take(0, 7, MiB, &size);
    void *b = cache_take(0, 7, MiB, &size);
    ok(park_free(a, 0, 7, &pa) && park_free(b, 0, 7, &pb) &&
           view(pa.block).state == BLOCK_MERGED && view(pb.block).state == BLOCK_MERGED,
       "two pieces freed on their stream: MERGED into the segment");
    before = cache_test_spares(0);
    struct block_claim done[3] = {{w.block, w.handout},
                                  {pa.block, pa.handout},
                                  {pb.block, pb.handout}};
    cache_reclaim_claims_done(done, 3, true, 7);
    is_int((int)cache_test_spares(0), (int)before + 2,
           "their work done: both MERGED structs kept by the device");
    ok(view(cache_test_find(base)).state == BLOCK_FREE &&
           view(cache_test_find(base)).size == 4 * MiB,
       "and the segment is one FREE block again");
}

/* The race of a double free with a merge: the second free finds the
 * piece's struct in the map; before it takes the lock (the hook), the
 * first free's work completes, the piece merges back (its struct retired)
 * and a cut takes the struct for a block at another address, another
 * owner's.  With several devices the look-up before the lock finds the
 * struct and the one under it finds it gone; with one, the only look-up is
 * made under the lock, after the hook: the same answer either way. */
static struct block_free_plan first_free;
static void *other_owner;

static void retire_and_reuse(void)
{
    cache_test_set_find_hook(NULL);
    size_t size;
    cache_reclaim_event_done(first_free.block, first_free.handout, true, 9);
    other_owner = cache_take(0, 1, 2 * ((size_t)1 << 20), &size);
}

static void test_found_then_retired(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(80);
    size_t size;
    ok(add_block(0, base, 4 * MiB, true) && give_back(base),
       "another FREE 4 MiB segment");
    void *p = cache_take(0, 1, MiB, &size);
    struct cache_block *found = cache_test_find(p);
    ok(p == base + 3 * MiB && park_free(p, 0, 1, &first_free),
       "a piece cut and freed on stream 1");
    cache_test_set_find_hook(retire_and_reuse);
    struct block_free_plan second;
    cache_claim_plan(p, 0, 1, &second);
    struct cache_block *now = cache_test_find(other_owner);
    ok(other_owner == base + 2 * MiB && now == found,
       "meanwhile its struct went to another owner's block");
    ok(second.path == BLOCK_INSIDE && second.block == NULL,
       "the second free is refused: its pointer lies inside that block "
       "(path %d)", (int)second.path);
    ok(now != NULL && view(now).state == BLOCK_LIVE,
       "the other owner's block stays LIVE (not claimed by that free)");
    struct block_free_plan last;
    ok(park_free(other_owner, 0, 1, &last), "its owner frees it");
    cache_reclaim_event_done(last.block, last.handout, true, 10);
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_kept();
    ok(cache_init(1, (size_t)1 << 20, 16), "a cache for one device");
    test_cache_reuses();
    test_found_then_retired();
    cache_destroy();
    ok(!cache_active(), "destroyed with structs kept (ASan: no leak)");
    /* Again with two devices: the look-up before the device's lock, and
     * the one under it. */
    fake_reset(2);
    ok(cache_init(2, (size_t)1 << 20, 16), "a cache for two devices");
    test_found_then_retired();
    cache_destroy();
    ok(!cache_active(), "destroyed again");
    return 0;
}
