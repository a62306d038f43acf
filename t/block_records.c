/* Block records kept for reuse (src/block_records.h): on a device cache of
 * its own, a retired record is BLOCK_RETIRED and comes back zeroed but for
 * its device and its recorded array, last in first out, up to
 * BLOCK_RECORDS_KEPT; more go to the surplus, which only
 * block_records_collect frees (nothing is freed under the lock); ASan's
 * leak check sees the rest.  Then through the block cache: the records a
 * cut takes are the ones merges retired, from FREE neighbours and from
 * MERGED parts whose work completed; and a free that found a record in the
 * map just before it was retired and reused for another block does not
 * free that other block. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_bins.h"
#include "block_cache.h"
#include "block_done.h"
#include "block_map.h"
#include "block_records.h"
#include "block_test.h"
#include "helpers.h"

/* A record as a block leaves it: every byte set, streams recorded. */
static struct cache_block *used_record(void)
{
    struct cache_block *b = malloc(sizeof *b);
    if (b == NULL)
        bail("malloc");
    memset(b, 0xa5, sizeof *b);
    b->recorded = malloc(4 * sizeof *b->recorded);
    if (b->recorded == NULL)
        bail("malloc");
    return b;
}

/* Zeroed as calloc's but for what a record keeps: its device and its
 * recorded array (hidden: nrecorded 0). */
static bool zeroed(const struct cache_block *b)
{
    struct cache_block zero = {0};
    zero.device = b->device;
    zero.recorded = b->recorded;
    return memcmp(b, &zero, sizeof *b) == 0;
}

static void free_record(struct cache_block *b)
{
    free(b->recorded);
    free(b);
}

static size_t surplus(const struct device_cache *c)
{
    size_t n = 0;
    for (struct cache_block *b = atomic_load(&c->surplus_records); b != NULL;
         b = b->lru_next)
        n++;
    return n;
}

static void test_kept(void)
{
    struct device_cache c = {0};
    is_int((int)block_records_kept(&c), 0, "a new device keeps no record");
    struct cache_block *fresh = block_records_new(&c);
    ok(fresh != NULL && zeroed(fresh), "with none kept: a zeroed new record");
    free(fresh);

    struct cache_block *a = used_record(), *b = used_record();
    struct block_user *arrays[2] = {a->recorded, b->recorded};
    int device = a->device;
    block_records_retire(&c, a);
    block_records_retire(&c, b);
    is_int((int)block_records_kept(&c), 2, "two retired: two kept");
    ok(a->state == BLOCK_RETIRED && b->state == BLOCK_RETIRED &&
           a->handout == 0 && a->nrecorded == 0,
       "retired: BLOCK_RETIRED, no hand-out, no recorded stream");
    struct cache_block *first = block_records_new(&c);
    struct cache_block *second = block_records_new(&c);
    ok(first == b && second == a, "given out again last in, first out");
    ok(zeroed(first) && zeroed(second), "zeroed, as calloc's, but for");
    ok(second->device == device && second->recorded == arrays[0] &&
           first->recorded == arrays[1],
       "the device and the recorded array they keep");
    is_int((int)block_records_kept(&c), 0, "none kept after");
    free_record(first);
    free_record(second);

    int all_kept = 1;
    for (int i = 0; i < BLOCK_RECORDS_KEPT + 50; i++) {
        block_records_retire(&c, used_record());
        all_kept &= (int)block_records_kept(&c) ==
                    (i < BLOCK_RECORDS_KEPT ? i + 1 : BLOCK_RECORDS_KEPT);
    }
    ok(all_kept, "kept up to BLOCK_RECORDS_KEPT");
    is_int((int)surplus(&c), 50, "the 50 beyond wait in the surplus");
    is_int((int)block_records_collect(&c), 50, "collect frees those 50");
    ok(surplus(&c) == 0 && block_records_kept(&c) == BLOCK_RECORDS_KEPT,
       "none left in the surplus; the kept ones stay");
    is_int((int)block_records_collect(&c), 0, "nothing more to collect");
    int given = 0;
    struct cache_block *r;
    while (block_records_kept(&c) > 0 && (r = block_records_new(&c)) != NULL) {
        given += zeroed(r);
        free_record(r);
    }
    is_int(given, BLOCK_RECORDS_KEPT, "each kept record given out once");
    for (int i = 0; i < BLOCK_RECORDS_KEPT + 10; i++)
        block_records_retire(&c, used_record());
    block_records_free_all(&c);
    ok(surplus(&c) == 0, "free_all: the surplus too");
    is_int((int)block_records_kept(&c), 0, "free_all: none kept (and none "
                                           "leaked: ASan's leak check)");
}

/* Through the cache: cuts take the records merges retired. */
static void test_cache_reuses(void)
{
    const size_t MiB = (size_t)1 << 20;
    struct device_cache *c = block_cache_device(0);
    char *base = ADDR(40);
    size_t size;
    ok(block_cache_add(0, base, 4 * MiB, true) && give_back(base),
       "a FREE 4 MiB segment");
    size_t before = block_records_kept(c);
    void *p = block_cache_take(0, 1, MiB, &size);
    struct cache_block *piece = block_map_find(p);
    ok(p == base + 3 * MiB && piece != NULL, "a cut: a record for the piece");
    struct block_free_plan plan;
    ok(park_free(p, 0, 1, &plan), "the piece freed on stream 1");
    block_done_event(plan.block, plan.handout, true, 5);
    ok(block_map_find(p) == NULL, "its work done, the piece merged back");
    is_int((int)block_records_kept(c), (int)before + 1,
           "its record is kept by the device");
    void *q = block_cache_take(0, 1, MiB, &size);
    ok(q == p && block_map_find(q) == piece &&
           (int)block_records_kept(c) == (int)before,
       "the next cut takes that record again");

    /* Two pieces freed on stream 7 merge PENDING into the rest (MERGED
     * parts): their records are retired once their work completed. */
    ok(park_free(q, 0, 1, &plan), "freed again");
    block_done_event(plan.block, plan.handout, true, 6);
    void *whole = block_cache_take(0, 7, 4 * MiB, &size);
    struct block_free_plan w, pa, pb;
    ok(whole == base && park_free(whole, 0, 7, &w),
       "the whole segment taken and freed on stream 7");
    void *a = block_cache_take(0, 7, MiB, &size);
    void *b = block_cache_take(0, 7, MiB, &size);
    ok(park_free(a, 0, 7, &pa) && park_free(b, 0, 7, &pb) &&
           pa.block->state == BLOCK_MERGED && pb.block->state == BLOCK_MERGED,
       "two pieces freed on their stream: MERGED into the segment");
    before = block_records_kept(c);
    struct block_claim done[3] = {{w.block, w.handout},
                                  {pa.block, pa.handout},
                                  {pb.block, pb.handout}};
    block_done_claims(done, 3, true, 7);
    is_int((int)block_records_kept(c), (int)before + 2,
           "their work done: both MERGED records kept by the device");
    ok(block_map_find(base)->state == BLOCK_FREE &&
           block_map_find(base)->size == 4 * MiB,
       "and the segment is one FREE block again");
}

/* The race of a double free with a merge: the second free finds the
 * piece's record in the map; before it takes the lock (the hook), the
 * first free's work completes, the piece merges back (its record retired)
 * and a cut takes the record for a block at another address, another
 * owner's. */
static struct block_free_plan first_free;
static void *other_owner;

static void retire_and_reuse(void)
{
    block_cache_set_find_hook(NULL);
    size_t size;
    block_done_event(first_free.block, first_free.handout, true, 9);
    other_owner = block_cache_take(0, 1, 2 * ((size_t)1 << 20), &size);
}

static void test_found_then_retired(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(80);
    size_t size;
    ok(block_cache_add(0, base, 4 * MiB, true) && give_back(base),
       "another FREE 4 MiB segment");
    void *p = block_cache_take(0, 1, MiB, &size);
    struct cache_block *record = block_map_find(p);
    ok(p == base + 3 * MiB && park_free(p, 0, 1, &first_free),
       "a piece cut and freed on stream 1");
    block_cache_set_find_hook(retire_and_reuse);
    struct block_free_plan second;
    block_cache_plan_free(p, 0, 1, &second);
    struct cache_block *now = block_map_find(other_owner);
    ok(other_owner == base + 2 * MiB && now == record,
       "meanwhile its record went to another owner's block");
    ok(second.path == BLOCK_INSIDE && second.block == NULL,
       "the second free is refused: its pointer lies inside that block "
       "(path %d)", (int)second.path);
    ok(now != NULL && now->state == BLOCK_LIVE,
       "the other owner's block stays LIVE (not claimed by that free)");
    struct block_free_plan last;
    ok(park_free(other_owner, 0, 1, &last), "its owner frees it");
    block_done_event(last.block, last.handout, true, 10);
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_kept();
    ok(block_cache_init(1, (size_t)1 << 20, 16), "a cache for one device");
    test_cache_reuses();
    test_found_then_retired();
    block_cache_destroy();
    ok(!block_cache_active(), "destroyed with records kept (ASan: no leak)");
    return 0;
}
