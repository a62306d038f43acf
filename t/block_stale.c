/* SPDX-License-Identifier: MIT */
/* Stale blocks: a block's memory cudaFree'd behind cudefer's back and its
 * address allocated again (src/cache.c, Note [Stale blocks]).  The new
 * block is filed and counted, the old one dropped from its lists, the
 * accounting and the map (on its own device, under that device's lock),
 * reported; a dropped block an entry or a claim still names is forgotten
 * once the last of them is done, never before (the reclaimer's settle, a
 * claim's let-go). */
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "helpers.h"

static void test_stale_record(void)
{
    ok(add_block(0, ADDR(11), 512, false), "a block");
    uint64_t before = stats_now().cache_bytes;
    stderr_capture_begin();
    ok(add_block(0, ADDR(11), 1024, false), "CUDA gave its address out "
                                           "again (it was cudaFree'd)");
    const char *said = stderr_capture_end();
    ok(strstr(said, "instead of defer_free; its record is dropped\n") !=
           NULL,
       "reported, one line ending at the dropped record (it stood alone): "
       "%s", said);
    is_int(stats_now().cache_bytes, before - 512 + 1024,
           "the old record is dropped from the accounting");
    is_int(view(cache_test_find(ADDR(11))).size, 1024, "the new one counts");
    is_int(claim((char *)ADDR(11) + 768), BLOCK_INSIDE,
           "and its memory is the cache's, to its new end");
}


/* The address of a FREE block of device 1 allocated again on device 0 (it
 * was cudaFree'd behind cudefer's back): device 1's block leaves its
 * lists, the accounting and the map under device 1's lock, before device
 * 0 files its own. */
static void test_stale_other_device(void)
{
    void *p = ADDR(12);
    size_t size;
    ok(add_block(1, p, 2048, false) && give_back(p),
       "a FREE block of device 1");
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    ok(add_block(0, p, 4096, false),
       "its address allocated again on device 0");
    ok(strstr(stderr_capture_end(), "instead of defer_free") != NULL,
       "reported");
    struct cache_block *now = cache_test_find(p);
    ok(now != NULL && view(now).device == 0 && view(now).size == 4096,
       "the map holds device 0's record");
    ok(stats_now().cache_bytes == before.cache_bytes - 2048 + 4096 &&
           stats_now().cache_free_bytes == before.cache_free_bytes - 2048,
       "device 1's record left the accounting, its free bytes too");
    ok(cache_take(1, 3, 2048, &size) != p,
       "device 1 does not hand its old block out");

    /* Smaller on device 0 than it was on device 1: the rest of device 1's
     * old range is no memory of the cache's any more (device 1's segment
     * index kept it, and a free there was refused as a pointer inside a
     * block). */
    void *q = ADDR(13);
    ok(add_block(1, q, 8192, false) && give_back(q),
       "a FREE 8 KiB block of device 1");
    struct block_free_plan plan;
    cache_claim_plan((char *)q + 4096, 1, 3, &plan);
    is_int(plan.path, BLOCK_INSIDE, "inside it: the cache's memory");
    stderr_capture_begin();
    ok(add_block(0, q, 2048, false), "2 KiB at its address on device 0");
    stderr_capture_end();
    cache_claim_plan((char *)q + 4096, 1, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS,
           "a pointer past its end in device 1's old range is not the cache's");
}

/* New memory on device 0 that starts inside a FREE block of device 1's,
 * where none of device 1's blocks starts (CUDA's addresses are one space
 * for every device: device 1's allocation was cudaFree'd behind cudefer's
 * back and part of its range given to device 0): device 1's block is
 * dropped too, its range out of device 1's index, else device 1 hands it
 * out over device 0's new memory. */
static void test_stale_other_device_inside(void)
{
    char *q = ADDR(14);
    size_t size = 0;
    ok(add_block(1, q, 8192, false) && give_back(q),
       "a FREE 8 KiB block of device 1");
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    ok(add_block(0, q + 4096, 4096, false),
       "4 KiB inside its range allocated on device 0");
    const char *said = stderr_capture_end();
    ok(strstr(said, "instead of defer_free") != NULL, "said: %s", said);
    ok(stats_now().cache_bytes == before.cache_bytes - 8192 + 4096 &&
           stats_now().cache_free_bytes == before.cache_free_bytes - 8192,
       "device 1's block left the accounting, its free bytes too");
    void *got = cache_take(1, 3, 8192, &size);
    ok(got != q, "device 1 does not hand its old block out (got %p)", got);
    if (got != NULL)
        give_back(got);
    struct block_free_plan plan;
    cache_claim_plan(q, 1, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS,
           "device 1's old start is no block of the cache's any more");
    ok(give_back(q + 4096), "device 0's block given back by its own free");
}

/* A PENDING block whose own work is done but a part merged into it is
 * not, cudaFree'd behind cudefer's back and its address allocated again:
 * the block is dropped, yet the part's entry still names it (through the
 * part), so it is not freed before that entry is done (freed at once, it
 * would be used after free: ASan), and is once it is (ASan's leak check). */
static void test_stale_with_parts(void)
{
    const size_t MiB = (size_t)1 << 20;
    size_t size = 0;
    char *base = ADDR(350);
    ok(add_block(0, base, 2 * MiB, false) && give_back(base),
       "stale parts: a FREE 2 MiB segment");
    void *a = cache_take(0, 9, MiB, &size);
    void *first = cache_take(0, 9, MiB, &size);
    ok(a == base + MiB && first == base, "cut in two for stream 9");
    struct cache_block *ra = cache_test_find(a), *rf = cache_test_find(first);
    uint64_t ha = free_on(a, 9), hf = free_on(first, 9);
    cache_reclaim_event_done(rf, hf, true, 40);
    ok(view(ra).state == BLOCK_MERGED && view(ra).merged_into == rf &&
           view(rf).state == BLOCK_PENDING && view(rf).events == 0 &&
           view(rf).outstanding == 1,
       "one PENDING block, its own work done, its MERGED part's not");
    stderr_capture_begin();
    ok(add_block(0, base, 4096, false),
       "its address allocated again (it was cudaFree'd)");
    ok(strstr(stderr_capture_end(), "instead of defer_free") != NULL,
       "reported");
    struct cache_block *fresh = cache_test_find(base);
    ok(fresh != rf && view(fresh).state == BLOCK_LIVE && view(fresh).size == 4096,
       "the new block is filed");
    size_t kept = cache_test_spares(0);
    cache_reclaim_event_done(ra, ha, true, 41); /* reaches rf: not freed yet */
    ok(cache_test_find(a) == NULL && cache_test_find(base) == fresh &&
           view(fresh).state == BLOCK_LIVE,
       "the part's entry done: the new block untouched");
    is_int(cache_test_spares(0), kept + 2,
           "the part's block and the dropped one kept for reuse");
    ok(give_back(base), "which its own free gives back");

    /* The same for a block named by its own free's entry alone. */
    void *x = ADDR(360);
    ok(add_block(0, x, 4096, false), "stale entry: a block");
    struct cache_block *rx = cache_test_find(x);
    uint64_t hx = free_on(x, 9);
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    ok(view(rx).state == BLOCK_PENDING && add_block(0, x, 8192, false),
       "freed on 9, its entry pending, its address allocated again");
    stderr_capture_end();
    struct defer_stats after = stats_now();
    ok(after.cache_bytes == before.cache_bytes - 4096 + 8192 &&
           after.cache_free_bytes == before.cache_free_bytes - 4096,
       "the PENDING record left the accounting as the free bytes it was: "
       "cache_bytes %llu -> %llu, cache_free_bytes %llu -> %llu",
       (unsigned long long)before.cache_bytes,
       (unsigned long long)after.cache_bytes,
       (unsigned long long)before.cache_free_bytes,
       (unsigned long long)after.cache_free_bytes);
    kept = cache_test_spares(0);
    cache_reclaim_event_done(rx, hx, true, 42);
    is_int(cache_test_spares(0), kept + 1,
           "its entry done: the dropped block kept for reuse");
    ok(cache_test_find(x) != rx && view(cache_test_find(x)).state == BLOCK_LIVE &&
           give_back(x),
       "the new block untouched, given back by its own free");
}


/* A claimed block whose memory was cudaFree'd behind cudefer's back and
 * allocated again at its address: the new block is filed, the claim's
 * record dropped; the claim's release reports, never touches the new
 * block, and forgets the dropped record (ASan sees a leak otherwise). */
static void test_claim_of_dropped_record(void)
{
    char *p = ADDR(70);
    ok(add_block(0, p, 4096, false), "a LIVE block");
    struct block_claim c;
    ok(cache_claim(p, &c) == BLOCK_AFTER_EVENT, "claimed by a free");
    stderr_capture_begin();
    ok(add_block(0, p, 8192, false), "its address allocated again");
    stderr_capture_end();
    struct cache_block *fresh = cache_test_find(p);
    ok(fresh != c.block && view(fresh).state == BLOCK_LIVE, "filed as a new block");
    stderr_capture_begin();
    cache_reclaim_adopt(&c, "defer_free");
    ok(strstr(stderr_capture_end(), "behind cudefer's back") != NULL,
       "the claim's release reports the dropped record");
    ok(cache_test_find(p) == fresh && view(fresh).state == BLOCK_LIVE,
       "and leaves the new block its owner's");
    ok(give_back(p), "which its own free gives back");
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    ok(cache_init(2, (size_t)1 << 20, 16),
       "init for two devices, requests of 1 MiB or more cut from larger blocks");
    test_stale_record();
    test_stale_other_device();
    test_stale_other_device_inside();
    test_stale_with_parts();
    test_claim_of_dropped_record();
    cache_destroy();
    ok(!cache_active(), "destroyed: inactive");
    return 0;
}
