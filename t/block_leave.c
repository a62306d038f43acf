/* SPDX-License-Identifier: MIT */
/* The blocks that leave the block cache (src/cache_reclaim.c), on their
 * own (no reclaimer), through src/cache.h: expiry oldest first, never a
 * block an entry still names; a miss's hand-back of upstream blocks, the
 * largest first, and what stays filed of a piece merged into one. */
#include <stdint.h>
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "helpers.h"

/* Expiry on device 1: FREE blocks no entry names, oldest first. */
static void test_expiry(void)
{
    ok(add_block(1, ADDR(8), 512, false) && give_back(ADDR(8)),
       "a FREE block of device 1");
    /* Two more: one FREE, one still named by an older entry. */
    ok(add_block(1, ADDR(9), 512, false) && add_block(1, ADDR(10), 512, false),
       "two more");
    give_back(ADDR(9));
    struct cache_block *named = cache_test_find(ADDR(10));
    struct block_free_plan p10;
    cache_claim_plan(ADDR(10), 1, 5, &p10);
    cache_claim_park(&p10, 5);
    cache_test_add_events(named,
                          1); /* as if a second, older entry still named it */
    cache_reclaim_event_done(named, p10.handout, true, 1);
    uint64_t oldest = cache_reclaim_oldest_free_ns(1);
    ok(oldest == view(cache_test_find(ADDR(8))).freed_ns, "oldest FREE first");
    struct cache_block *out[8];
    size_t n = cache_reclaim_expired(1, UINT64_MAX, out, 8, SIZE_MAX);
    is_int(n, 2, "collect takes the FREE blocks no entry names");
    ok(cache_test_find(ADDR(8)) == NULL && cache_test_find(ADDR(9)) == NULL,
       "and removes them from the map");
    ok(cache_test_find(ADDR(10)) != NULL, "a block still named stays");
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
    cache_test_add_events(named, -1);
    is_int(cache_reclaim_expired(1, 0, out, 8, SIZE_MAX), 0,
           "nothing became free before time 0... ");
    n = cache_reclaim_expired(1, UINT64_MAX, out, 8, SIZE_MAX);
    is_int(n, 1, "once unnamed it goes too");
    cache_forget(out[0]);
}

/* A miss's hand-back: pool blocks FREE or PENDING on the request's stream
 * only, the largest first, no more than the bytes asked for; PENDING
 * ones go once the entries naming them are done. */
static void test_collect_largest(void)
{
    struct block_free_plan plan[4];
    /* 14, 15, 16: pool blocks freed on stream 7 in this order; 17 a
     * cudaMalloc block on 7; 18 a pool block on stream 8. */
    unsigned long long streams[5] = {7, 7, 7, 7, 8};
    size_t sizes[5] = {4096, 1024, 2048, 4096, 4096};
    for (int i = 0; i < 5; i++) {
        ok(add_block(0, ADDR(14 + i), sizes[i], i != 3), "block %d", i);
        cache_claim_plan(ADDR(14 + i), 0, streams[i], &plan[i < 4 ? i : 3]);
        ok(cache_claim_park(&plan[i < 4 ? i : 3], streams[i]),
           "PENDING on its stream");
    }
    /* 19: a FREE pool block, free at time >= 1; 20: a FREE cudaMalloc
     * block, the largest (its cudaFree would drain the device). */
    ok(add_block(0, ADDR(19), 3072, true) && give_back(ADDR(19)),
       "a FREE pool block");
    ok(add_block(0, ADDR(20), 8192, false) && give_back(ADDR(20)),
       "a FREE cudaMalloc block");
    struct cache_block *b14 = cache_test_find(ADDR(14));
    struct cache_block *b15 = cache_test_find(ADDR(15));
    struct cache_block *b16 = cache_test_find(ADDR(16));
    uint64_t h14 = view(b14).handout, h15 = view(b15).handout, h16 = view(b16).handout;
    struct block_memory out[8];
    is_int(cache_reclaim_for_miss(0, 9, 0, out, 8, SIZE_MAX), 0,
           "another stream takes none of 7's, nor a block free after the "
           "time given");
    size_t n = cache_reclaim_for_miss(0, 7, UINT64_MAX, out, 8, 5000);
    ok(n == 2 && out[0].ptr == ADDR(14) && out[0].size == 4096 &&
           out[1].ptr == ADDR(19) && out[1].size == 3072,
       "the largest pool blocks, PENDING on the stream or FREE, until the "
       "bytes asked for are reached");
    ok(view(b14).state == BLOCK_GONE && cache_test_find(ADDR(14)) == NULL &&
           cache_test_find(ADDR(19)) == NULL,
       "GONE or forgotten, out of the map");
    ok(cache_test_find(ADDR(15)) != NULL && cache_test_find(ADDR(16)) != NULL,
       "the smaller ones stay");
    n = cache_reclaim_for_miss(0, 7, UINT64_MAX, out, 8, SIZE_MAX);
    ok(n == 2 && out[0].ptr == ADDR(16) && out[1].ptr == ADDR(15),
       "the rest of the stream's pool blocks, largest first, not its "
       "cudaMalloc block");
    ok(cache_test_find(ADDR(17)) != NULL && cache_test_find(ADDR(18)) != NULL &&
           cache_test_find(ADDR(20)) != NULL,
       "nor another stream's, nor a FREE cudaMalloc block");
    ok(claim((char *)ADDR(14) + 512) == BLOCK_NOT_OURS &&
           claim((char *)ADDR(19) + 512) == BLOCK_NOT_OURS &&
           claim((char *)ADDR(17) + 512) == BLOCK_INSIDE,
       "the memory handed back is no longer the cache's; the rest is");
    /* Their entries complete: the blocks go (ASan sees a leak otherwise). */
    cache_reclaim_event_done(b14, h14, true, 1);
    cache_reclaim_event_done(b15, h15, true, 1);
    cache_reclaim_event_done(b16, h16, true, 1);
    void *p = NULL;
    size_t size = 0;
    p = cache_take(0, 7, 4096, &size);
    ok(p == ADDR(17), "a request on 7 finds only the block left there");
}

/* A miss on stream 7 hands a whole PENDING pool segment back while a
 * piece MERGED into it still waits for its entry: the MERGED block stays
 * filed under its address, which the pool gives out again at once (on the
 * same stream).  The new block there is no stale block: no report of a
 * cudaFree behind cudefer's back, its bytes counted once (taken for a
 * stale one, cache_bytes and the pool's held bytes would be 1 MiB
 * short). */
static void test_handback_with_merged_piece(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(40);
    size_t size;
    ok(add_block(0, base, 4 * MiB, true), "a 4 MiB pool segment, LIVE");
    uint64_t hs = free_on(base, 7);
    void *p = cache_take(0, 7, MiB, &size);
    ok(p == base + 3 * MiB, "1 MiB cut on stream 7 from its PENDING self");
    struct cache_block *rp = cache_test_find(p), *seg = cache_test_find(base);
    uint64_t hp = free_on(p, 7);
    ok(view(rp).state == BLOCK_MERGED && view(seg).size == 4 * MiB &&
           view(seg).outstanding == 1,
       "freed on 7: MERGED back, the segment whole and PENDING");
    struct block_memory mem[4];
    uint64_t bytes0 = stats_now().cache_bytes;
    is_int(cache_reclaim_for_miss(0, 7, UINT64_MAX, mem, 4, SIZE_MAX), 1,
           "a miss on 7 hands the whole PENDING segment back to the pool");
    stderr_capture_begin();
    ok(add_block(0, p, 2 * MiB, true), "a new pool block at p's address");
    const char *said = stderr_capture_end();
    ok(strstr(said, "instead of defer_free") == NULL,
       "no report of a cudaFree behind cudefer's back");
    is_int(stats_now().cache_bytes, bytes0 - 4 * MiB + 2 * MiB,
           "cache_bytes: the segment left, the new block counted once");
    struct cache_block *fresh = cache_test_find(p);
    cache_reclaim_event_done(rp, hp, true, 10);
    cache_reclaim_event_done(seg, hs, true, 11);
    ok(cache_test_find(p) == fresh && view(fresh).state == BLOCK_LIVE,
       "the entries done: the new block stays filed, LIVE");
    is_int(stats_now().cache_bytes, bytes0 - 2 * MiB,
           "cache_bytes still right");
    struct block_claim c;
    ok(cache_claim(p, &c) == BLOCK_AFTER_EVENT, "freed");
    cache_reclaim_adopt(&c, "defer_free");
    struct cache_block *out[8];
    size_t n = cache_reclaim_expired(0, UINT64_MAX, out, 8, SIZE_MAX);
    bool left = cache_test_find(p) == NULL;
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
    ok(left, "and leaves the cache");
}

/* As above, but the pool gives the whole segment's address out again: the
 * new block covers the address of the piece MERGED into the segment
 * handed back, which stays filed there until its entry is done.  A free at
 * that address meanwhile is refused as a second free of the piece (never
 * taken for the new block's, nor claiming anything); once the piece's
 * entry is done, nothing is filed there, and the same free is an interior
 * pointer of the new block. */
static void test_merged_piece_inside_new_block(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(120);
    size_t size;
    ok(add_block(0, base, 4 * MiB, true), "a 4 MiB pool segment, LIVE");
    uint64_t hs = free_on(base, 7);
    void *p = cache_take(0, 7, MiB, &size);
    struct cache_block *rp = cache_test_find(p), *seg = cache_test_find(base);
    uint64_t hp = free_on(p, 7);
    ok(p == base + 3 * MiB && view(rp).state == BLOCK_MERGED,
       "a piece cut on 7 and freed on 7: MERGED back");
    struct block_memory mem[4];
    is_int(cache_reclaim_for_miss(0, 7, UINT64_MAX, mem, 4, SIZE_MAX), 1,
           "a miss on 7 hands the whole segment back to the pool");
    stderr_capture_begin();
    ok(add_block(0, base, 4 * MiB, true),
       "the pool gives its address out again, whole");
    ok(strstr(stderr_capture_end(), "instead of defer_free") == NULL,
       "no stale block said");
    struct cache_block *fresh = cache_test_find(base);
    struct block_claim c;
    ok(cache_claim(p, &c) == BLOCK_NOT_LIVE && c.block == NULL &&
           view(fresh).state == BLOCK_LIVE && view(fresh).events == 0,
       "a free at the piece's address: refused as freed twice, the new "
       "block untouched");
    cache_reclaim_event_done(rp, hp, true, 10);
    cache_reclaim_event_done(seg, hs, true, 11);
    ok(cache_test_find(p) == NULL && claim(p) == BLOCK_INSIDE &&
           cache_claim_inside_live(p),
       "the piece's entry done: an interior pointer of the new block");
    ok(give_back(base), "the new block freed");
    struct cache_block *out[8];
    size_t n = cache_reclaim_expired(0, UINT64_MAX, out, 8, SIZE_MAX);
    bool left = cache_test_find(base) == NULL;
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
    ok(left, "and leaves the cache");
}

/* A miss's hand-back skips a FREE pool block an older entry still names
 * (as expiry does, test_expiry): the pool would lend its memory again
 * while that entry's work may still use it.  (This guards events == 0 in
 * may_hand_back.) */
static void test_handback_skips_named(void)
{
    ok(add_block(0, ADDR(60), 8192, true) && give_back(ADDR(60)),
       "a FREE pool block");
    struct cache_block *named = cache_test_find(ADDR(60));
    cache_test_add_events(named, 1); /* as if an older entry still named it */
    struct block_memory out[4];
    is_int(cache_reclaim_for_miss(0, 7, UINT64_MAX, out, 4, SIZE_MAX), 0,
           "a miss does not hand back a block an entry still names");
    ok(cache_test_find(ADDR(60)) == named && view(named).state == BLOCK_FREE,
       "it stays FREE in the cache");
    cache_test_add_events(named, -1);
    size_t n = cache_reclaim_for_miss(0, 7, UINT64_MAX, out, 4, SIZE_MAX);
    ok(n == 1 && out[0].ptr == ADDR(60) && out[0].size == 8192,
       "once unnamed, it goes back to the pool");
    ok(cache_test_find(ADDR(60)) == NULL, "out of the map");
}

/* A PENDING segment with a piece MERGED into it whose entry still waits
 * is taken again on its stream, then freed by a path that waits for its
 * event and adopted: FREE while the piece's entry, whose work may use
 * part of it, is not done (outstanding).  Expiry leaves it until that
 * entry is done.  (This guards outstanding == 0 in
 * cache_reclaim_expired: without it the block would go to cudaFree or the
 * pool then.) */
static void test_expiry_waits_for_merged_piece(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(80);
    size_t size;
    ok(add_block(0, base, 4 * MiB, true), "a 4 MiB pool segment, LIVE");
    uint64_t hs = free_on(base, 7);
    void *p = cache_take(0, 7, MiB, &size);
    struct cache_block *rp = cache_test_find(p), *seg = cache_test_find(base);
    uint64_t hp = free_on(p, 7);
    ok(view(rp).state == BLOCK_MERGED && view(seg).outstanding == 1,
       "a piece MERGED back into the PENDING segment, its entry waiting");
    cache_reclaim_event_done(seg, hs, true, 10); /* the segment's own entry */
    void *again = cache_take(0, 7, 4 * MiB, &size);
    ok(again == base && view(seg).state == BLOCK_LIVE,
       "the segment taken again on its stream");
    ok(give_back(base) && view(seg).state == BLOCK_FREE && view(seg).outstanding == 1,
       "freed and adopted: FREE, the piece's entry still waiting");
    struct cache_block *out[8];
    is_int(cache_reclaim_expired(0, UINT64_MAX, out, 8, SIZE_MAX), 0,
           "expiry leaves it while the piece's entry waits");
    cache_reclaim_event_done(rp, hp, true, 11);
    size_t n = cache_reclaim_expired(0, UINT64_MAX, out, 8, SIZE_MAX);
    ok(n == 1 && out[0] == seg, "once done, it expires");
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
}

/* cache_reclaim_release's fail: counts the sticky errors handed to it. */
static int fails;
static const char *failed_call;
static cudaError_t failed_err;

static void count_fail(int device, const char *call, cudaError_t err)
{
    (void)device;
    fails++;
    failed_call = call;
    failed_err = err;
}

/* The release of what expires, with real (fake) memory: a cudaMalloc
 * segment goes with cudaFree, its bytes leaving the device; an upstream
 * one goes back to the pool on the stream given, its bytes leaving only
 * with the pool's trim; a sticky error is handed to the caller's fail, any
 * other reported; either way the block is forgotten and counted in
 * cache_release_failures, not in cache_releases. */
static void test_release(void)
{
    const size_t MiB = (size_t)1 << 20;
    ok(cache_upstream_init(2), "the upstream pools");
    uint64_t releases = stats_now().cache_releases;
    uint64_t failures = stats_now().cache_release_failures;
    void *p = device_alloc(MiB);
    ok(add_block(0, p, MiB, false) && give_back(p), "a FREE cudaMalloc segment");
    is_int(cache_reclaim_release(0, UINT64_MAX, NULL, count_fail, NULL), MiB,
           "released: its bytes left the device");
    ok(fake_is_released(p) && cache_test_find(p) == NULL &&
           stats_now().cache_releases == releases + 1 && fails == 0,
       "with cudaFree, forgotten, counted");

    cudaStream_t s = stream_new();
    void *q = NULL;
    bool upstream = false;
    ok(cache_upstream_malloc("defer_alloc", 0, MiB, s, &q,
                             &upstream) == cudaSuccess &&
           upstream && add_block(0, q, MiB, true) && give_back(q),
       "a FREE segment from the upstream pool");
    unsigned long async = fake_calls(FAKE_FREE_ASYNC);
    is_int(cache_reclaim_release(0, UINT64_MAX, s, count_fail, NULL), 0,
           "released: its bytes stay with the pool until a trim");
    ok(fake_calls(FAKE_FREE_ASYNC) == async + 1 && cache_test_find(q) == NULL &&
           stats_now().cache_releases == releases + 2,
       "back to the pool with cudaFreeAsync, forgotten, counted");

    void *r = device_alloc(MiB);
    ok(add_block(0, r, MiB, false) && give_back(r), "another FREE segment");
    fake_fail(FAKE_FREE, cudaErrorIllegalAddress, 0, 1);
    is_int(cache_reclaim_release(0, UINT64_MAX, NULL, count_fail, NULL), 0,
           "a sticky error: nothing released");
    ok(fails == 1 && failed_err == cudaErrorIllegalAddress &&
           strcmp(failed_call, "cudaFree") == 0 && cache_test_find(r) == NULL,
       "handed to fail with the call by name; the block forgotten");
    ok(stats_now().cache_releases == releases + 2 &&
           stats_now().cache_release_failures == failures + 1,
       "counted as a failed release, not as released");
    cudaFree(r);

    void *x = device_alloc(MiB);
    ok(add_block(0, x, MiB, false) && give_back(x), "one more FREE segment");
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    cache_reclaim_release(0, UINT64_MAX, NULL, count_fail, NULL);
    const char *said = stderr_capture_end();
    ok(fails == 1 && strstr(said, "is not released") != NULL &&
           cache_test_find(x) == NULL,
       "another error is reported, not handed to fail; the block forgotten");
    ok(stats_now().cache_releases == releases + 2 &&
           stats_now().cache_release_failures == failures + 2,
       "counted as a failed release, not as released");
    fake_fail_clear();
    cudaFree(x);
    cudaStreamDestroy(s);
    cache_upstream_destroy();
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    ok(cache_init(2, (size_t)1 << 20, 16), "init for two devices");
    test_release(); /* first: the fake's addresses meet no made-up one */
    test_expiry();
    test_collect_largest();
    test_handback_with_merged_piece();
    test_merged_piece_inside_new_block();
    test_handback_skips_named();
    test_expiry_waits_for_merged_piece();
    cache_destroy();
    return 0;
}
