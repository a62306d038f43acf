/* SPDX-License-Identifier: MIT */
/* The block cache on its own (no reclaimer), through src/cache.h: fit
 * (rounding: t/block_rounding), the states LIVE -> PENDING (reusable on its
 * stream only) -> FREE (any stream), stale hand-outs, double frees,
 * split and merge, expiry, accounting (stale blocks: t/block_stale; the
 * streams recorded on a block: t/block_users). */
#include <stdint.h>
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "helpers.h"

static void test_stream_order(void)
{
    size_t size = 0;
    ok(cache_take(0, 7, 1000, &size) == NULL, "empty: nothing to take");
    ok(add_block(0, ADDR(1), 1024, false), "a fresh block is filed");
    ok(cache_active(), "the cache is active from the first block");
    struct cache_block *b = cache_test_find(ADDR(1));
    ok(b != NULL && view(b).state == BLOCK_LIVE, "it is LIVE");
    uint64_t h1 = free_on(ADDR(1), 7);
    ok(h1 != 0 && view(b).state == BLOCK_PENDING, "freed on stream 7: PENDING");
    ok(cache_take(0, 8, 1000, &size) == NULL,
       "another stream cannot take it before its work is done");
    ok(cache_take(0, 7, 1000, &size) == ADDR(1) && size == 1024,
       "its own stream takes it at once");
    is_int(stats_now().reused_same_stream, 1, "counted as a same-stream reuse");
    uint64_t h2 = free_on(ADDR(1), 7);
    ok(h2 != h1, "a new hand-out, a new id");
    cache_reclaim_event_done(b, h1, true, 100);
    ok(view(b).state == BLOCK_PENDING,
       "the first free's event completing changes nothing: a stale hand-out");
    ok(cache_take(0, 8, 1000, &size) == NULL, "still not for stream 8");
    cache_reclaim_event_done(b, h2, true, 200);
    ok(view(b).state == BLOCK_FREE && view(b).freed_ns == 200,
       "its own event completed: FREE");
    ok(cache_take(0, 8, 1000, &size) == ADDR(1), "now any stream takes it");
    is_int(view(b).events, 0, "no entry names it any more");
}

static void test_fit(void)
{
    size_t size;
    ok(add_block(0, ADDR(2), 4096, false) && give_back(ADDR(2)),
       "a 4096-byte block, adopted back: FREE");
    ok(cache_take(0, 1, 1000, &size) == NULL,
       "too big for 1000 bytes (more than 1/8 over)");
    ok(cache_take(0, 1, 4097, &size) == NULL, "too small for 4097");
    ok(cache_take(0, 1, 3700, &size) == ADDR(2) && size == 4096,
       "3700 takes it (4096 <= 3700 + 3700/8)");
    ok(add_block(0, ADDR(3), 1088, false) && add_block(0, ADDR(4), 1024, false),
       "two neighbours");
    give_back(ADDR(3));
    give_back(ADDR(4));
    ok(cache_take(0, 1, 1000, &size) == ADDR(4),
       "best fit: 1024 before 1088");
    ok(cache_take(0, 1, 1000, &size) == ADDR(3), "then 1088");
    /* An exact-size block (the out-of-memory fallback) between classes. */
    ok(add_block(0, ADDR(5), 614400, false) && give_back(ADDR(5)),
       "an exact-size block of 600 KiB");
    ok(cache_take(0, 1, 614401, &size) == NULL, "not for one byte more");
    ok(cache_take(0, 1, 614400, &size) == ADDR(5),
       "found for its own size, filed below its class");
}

static void test_double_free(void)
{
    ok(add_block(0, ADDR(6), 512, false), "a block");
    free_on(ADDR(6), 3);
    struct block_free_plan plan;
    cache_claim_plan(ADDR(6), 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_LIVE, "freed again while PENDING: not live");
    stderr_capture_begin();
    ok(cache_reclaim_unclaimed_is_block(ADDR(6)),
       "a release no free claimed must not cudaFree it");
    const char *said = stderr_capture_end();
    ok(strstr(said, "freed twice") != NULL, "and reported as a double free");
    cache_claim_plan(ADDR(99), 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS, "an unknown pointer is not ours");
    cache_claim_plan((char *)ADDR(2) + 2048, 0, 3, &plan);
    is_int(plan.path, BLOCK_INSIDE,
           "an interior pointer of a live block lies in the cache's memory: "
           "refused");
    ok(plan.block == NULL && cache_claim_inside_live((char *)ADDR(2) + 2048) &&
           view(cache_test_find(ADDR(2))).state == BLOCK_LIVE,
       "inside a live block, which stays its owner's");
    is_int(claim((char *)ADDR(2) + 2048), BLOCK_INSIDE,
           "so does any other free path");
    cache_claim_plan((char *)ADDR(2) + 4096, 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS, "the address past its end is not ours");
}

static void test_devices(void)
{
    ok(add_block(1, ADDR(8), 512, false), "a block of device 1");
    struct block_free_plan plan;
    cache_claim_plan(ADDR(8), 0, 3, &plan);
    is_int(plan.path, BLOCK_AFTER_EVENT,
           "freed on a device-0 stream: waits for its event, no stream order");
    struct block_claim claim = {plan.block, plan.handout};
    ok(plan.device == 1 && cache_claim_ptr(&claim) == ADDR(8),
       "the plan says the block's device; the claim, its address");
    int device = -1;
    ok(cache_device_of(ADDR(8), &device) && device == 1 &&
           !cache_device_of((char *)ADDR(8) + 512, &device) &&
           !cache_device_of(ADDR(99), &device),
       "the device of a block's start; none past it nor elsewhere");
    cache_reclaim_adopt(&(struct block_claim){plan.block, plan.handout},
                        "defer_free");
    size_t size;
    int never = 1;
    for (int i = 0; i < 4; i++)
        never &= cache_take(0, 3, 512, &size) != ADDR(8);
    ok(never, "device 0 never gets device 1's block");
    ok(cache_take(1, 3, 512, &size) == ADDR(8), "device 1 does");
}

/* Segments: a request of 1 MiB or more cut from a larger block, FREE or
 * PENDING on its own stream; neighbours merge when FREE, and at once when
 * PENDING on one stream, going FREE only once every part's work is done. */
static void test_split_merge(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(40);
    size_t size = 0;
    ok(add_block(0, base, 4 * MiB, true) && give_back(base),
       "a FREE 4 MiB pool segment");
    ok(cache_take(0, 1, 512 * 1024, &size) == NULL,
       "a request below 1 MiB is never cut from it");
    void *p = cache_take(0, 1, MiB, &size);
    ok(p == base + 3 * MiB && size == MiB, "1 MiB is cut from its end");
    struct cache_block *rest = cache_test_find(base);
    ok(rest != NULL && view(rest).size == 3 * MiB && view(rest).state == BLOCK_FREE,
       "the rest stays FREE at the segment's start");
    struct block_memory mem[4];
    is_int(cache_reclaim_for_miss(0, 1, UINT64_MAX, mem, 4, SIZE_MAX), 0,
           "a piece of a segment never goes back to the pool");
    uint64_t h = free_on(p, 1);
    struct cache_block *piece = cache_test_find(p);
    cache_reclaim_event_done(piece, h, true, 5);
    ok(cache_test_find(p) == NULL && view(rest).size == 4 * MiB &&
           view(rest).state == BLOCK_FREE,
       "the piece's work done, it merges back: one FREE segment again");
    struct block_free_plan late;
    cache_claim_plan(p, 0, 1, &late);
    ok(late.path == BLOCK_INSIDE && late.block == NULL &&
           !cache_claim_inside_live(p),
       "freed again now, the piece is no block any more but lies in the "
       "cache's free memory: refused as a second free (it was taken for "
       "other memory, whose cudaFree failed)");
    is_int(claim(p), BLOCK_INSIDE, "by any free path");
    ok(view(rest).state == BLOCK_FREE && view(rest).size == 4 * MiB,
       "the segment unchanged");

    /* PENDING on stream 7: two pieces cut and freed there merge at once. */
    p = cache_take(0, 7, 4 * MiB, &size);
    ok(p == base && size == 4 * MiB, "the whole segment for 4 MiB");
    uint64_t hw = free_on(base, 7);
    void *a = cache_take(0, 7, MiB, &size);
    void *b = cache_take(0, 7, MiB, &size);
    ok(a == base + 3 * MiB && b == base + 2 * MiB,
       "stream 7 cuts two pieces from its own PENDING segment");
    ok(cache_take(0, 8, MiB, &size) == NULL,
       "stream 8 cuts nothing from it before its work is done");
    struct cache_block *ra = cache_test_find(a), *rb = cache_test_find(b);
    uint64_t ha = free_on(a, 7), hb = free_on(b, 7);
    struct cache_block *whole = cache_test_find(base);
    ok(whole == rest && view(whole).size == 4 * MiB &&
           view(whole).state == BLOCK_PENDING,
       "freed on 7, the three parts are one PENDING block at once, the "
       "first part's record");
    ok(view(ra).state == BLOCK_MERGED && cache_test_find(a) == ra &&
           view(rb).state == BLOCK_MERGED && cache_test_find(b) == rb,
       "the parts it absorbed are MERGED, still filed under their addresses");
    struct block_free_plan again;
    cache_claim_plan(b, 0, 7, &again);
    is_int(again.path, BLOCK_NOT_LIVE,
           "so a part freed again meanwhile is refused as a second free");
    is_int(claim(a), BLOCK_NOT_LIVE, "by any free path");
    ok(cache_take(0, 7, 4 * MiB, &size) == base,
       "which stream 7 takes whole");
    uint64_t hm = free_on(base, 7);
    cache_reclaim_event_done(whole, hm, true, 6);
    ok(view(whole).state == BLOCK_PENDING &&
           cache_take(0, 8, 4 * MiB, &size) == NULL,
       "its last free's work done, other parts' not: still PENDING");
    cache_reclaim_event_done(ra, ha, true, 7);
    ok(view(whole).state == BLOCK_PENDING && cache_test_find(a) == NULL,
       "nor with one part done (its record unfiled)");
    cache_reclaim_event_done(whole, hw, true, 8); /* its older free's entry */
    ok(view(whole).state == BLOCK_PENDING, "nor with the segment's first free's");
    cache_reclaim_event_done(rb, hb, true, 9);
    ok(view(whole).state == BLOCK_FREE && cache_test_find(b) == NULL,
       "every part's work done: FREE");
    is_int(view(whole).events, 0, "no entry names it any more");
    ok(cache_take(0, 8, 4 * MiB, &size) == base && size == 4 * MiB,
       "and stream 8 takes it");
}

/* A block freed on a stream next to a FREE piece of its segment joins it
 * at once, PENDING on that stream: a request there of their combined size
 * takes it whole, another stream only once the freed block's work is done
 * (src/cache_segments.c, Note [Merging at once]). */
static void test_merge_with_free(void)
{
    const size_t MiB = (size_t)1 << 20;
    size_t size = 0;
    /* A FREE left neighbour absorbs the freed block. */
    char *base = ADDR(300);
    ok(add_block(0, base, 4 * MiB, true) && give_back(base),
       "merge with free: a FREE 4 MiB pool segment");
    void *p = cache_take(0, 7, 2 * MiB, &size);
    struct cache_block *rest = cache_test_find(base), *piece = cache_test_find(p);
    ok(p == base + 2 * MiB && view(rest).state == BLOCK_FREE,
       "2 MiB cut for stream 7, the rest FREE");
    uint64_t hp = free_on(p, 7);
    ok(view(rest).state == BLOCK_PENDING && view(rest).size == 4 * MiB &&
           view(piece).state == BLOCK_MERGED,
       "the piece freed on 7 (work running) joins the FREE rest: one "
       "PENDING 4 MiB block");
    ok(cache_take(0, 8, 4 * MiB, &size) == NULL,
       "stream 8 cannot take it before the piece's work is done");
    ok(cache_take(0, 7, 4 * MiB, &size) == base && size == 4 * MiB,
       "stream 7 takes the whole segment at once");
    uint64_t hw = free_on(base, 7);
    cache_reclaim_event_done(rest, hw, true, 10);
    ok(view(rest).state == BLOCK_PENDING &&
           cache_take(0, 8, 4 * MiB, &size) == NULL,
       "its own free's work done, the piece's not: still PENDING");
    cache_reclaim_event_done(piece, hp, true, 11);
    ok(view(rest).state == BLOCK_FREE && cache_test_find(p) == NULL,
       "the piece's work done too: FREE, the piece's record gone");
    ok(cache_take(0, 8, 4 * MiB, &size) == base, "stream 8 takes it");

    /* A FREE right neighbour is absorbed by the freed block. */
    char *two = ADDR(310);
    ok(add_block(0, two, 4 * MiB, true) && give_back(two),
       "another FREE 4 MiB pool segment");
    void *q = cache_take(0, 7, 2 * MiB, &size);
    void *r = cache_take(0, 7, 2 * MiB, &size);
    ok(q == two + 2 * MiB && r == two, "cut in two for stream 7");
    uint64_t hq = free_on(q, 7);
    cache_reclaim_event_done(cache_test_find(q), hq, true, 12);
    ok(view(cache_test_find(q)).state == BLOCK_FREE, "the right half's work done: "
                                               "FREE beside its live left half");
    struct cache_block *left = cache_test_find(r);
    uint64_t hr = free_on(r, 7);
    ok(view(left).state == BLOCK_PENDING && view(left).size == 4 * MiB &&
           cache_test_find(q) == NULL,
       "the left half freed on 7 absorbs it: one PENDING 4 MiB block");
    ok(cache_take(0, 8, 4 * MiB, &size) == NULL,
       "not for stream 8 yet");
    cache_reclaim_event_done(left, hr, true, 13);
    ok(view(left).state == BLOCK_FREE &&
           cache_take(0, 8, 4 * MiB, &size) == two,
       "its work done: FREE, and stream 8 takes it whole");
    is_int(view(left).events + view(rest).events, 0, "no entry names either");
}

/* Neighbours PENDING on different streams never merge, whichever is freed
 * first: the merged block would be reusable at once on the stream of the
 * one that absorbs the other, while the other stream's work still uses
 * the absorbed memory.  (This guards each stream comparison of
 * cache_segments_merge_pending, which t/stress only meets by chance.) */
static void test_pending_neighbours_apart(void)
{
    const size_t MiB = (size_t)1 << 20;
    size_t size = 0;
    /* The left half freed last: it must not absorb its right neighbour. */
    char *one = ADDR(320);
    ok(add_block(0, one, 6 * MiB, true) && give_back(one),
       "apart: a FREE 6 MiB pool segment");
    void *right = cache_take(0, 7, 3 * MiB, &size);
    void *left = cache_take(0, 8, 3 * MiB, &size);
    ok(right == one + 3 * MiB && left == one,
       "cut in two: the right half for stream 7, the left for 8");
    uint64_t hr = free_on(right, 7), hl = free_on(left, 8);
    struct cache_block *rr = cache_test_find(right), *rl = cache_test_find(left);
    ok(rr != NULL && view(rr).state == BLOCK_PENDING && view(rr).size == 3 * MiB &&
           view(rl).state == BLOCK_PENDING && view(rl).size == 3 * MiB,
       "freed on 7, then the left half on 8: two PENDING halves, the right "
       "one not absorbed");
    ok(cache_take(0, 7, 6 * MiB, &size) != one &&
           cache_take(0, 8, 6 * MiB, &size) != one,
       "neither stream gets the whole segment while the other's work runs");
    cache_reclaim_event_done(rr, hr, true, 20);
    cache_reclaim_event_done(rl, hl, true, 21);
    ok(view(rl).state == BLOCK_FREE && view(rl).size == 6 * MiB &&
           cache_test_find(right) == NULL,
       "both halves' work done: one FREE segment again");
    ok(cache_take(0, 9, 6 * MiB, &size) == one, "stream 9 takes it");

    /* The right half freed last: its left neighbour must not absorb it. */
    char *two = ADDR(330);
    ok(add_block(0, two, 6 * MiB, true) && give_back(two),
       "apart: another FREE 6 MiB pool segment");
    right = cache_take(0, 7, 3 * MiB, &size);
    left = cache_take(0, 8, 3 * MiB, &size);
    ok(right == two + 3 * MiB && left == two, "cut in two again");
    hl = free_on(left, 8);
    hr = free_on(right, 7);
    rr = cache_test_find(right);
    rl = cache_test_find(left);
    ok(rr != NULL && view(rr).state == BLOCK_PENDING && view(rr).size == 3 * MiB &&
           view(rl).state == BLOCK_PENDING && view(rl).size == 3 * MiB,
       "freed on 8, then the right half on 7: the left one does not absorb "
       "it");
    ok(cache_take(0, 7, 6 * MiB, &size) != two &&
           cache_take(0, 8, 6 * MiB, &size) != two,
       "neither stream gets the whole segment while the other's work runs");
    cache_reclaim_event_done(rl, hl, true, 22);
    cache_reclaim_event_done(rr, hr, true, 23);
    ok(view(rl).state == BLOCK_FREE && view(rl).size == 6 * MiB &&
           cache_test_find(right) == NULL,
       "both halves' work done: one FREE segment again");
    ok(cache_take(0, 9, 6 * MiB, &size) == two, "stream 9 takes it");
}

/* A chain of MERGED blocks (a absorbed by m, m by the block at the
 * segment's start) whose middle part's work is done first: m waits for
 * what it absorbed before it tells the block it was merged into, so the
 * block stays PENDING until a's work is done too.  (The other tests'
 * chains complete innermost first, where letting a MERGED part with parts
 * of its own go at once would pass.) */
static void test_merged_chain_middle_first(void)
{
    const size_t MiB = (size_t)1 << 20;
    size_t size = 0;
    char *base = ADDR(340);
    ok(add_block(0, base, 3 * MiB, true) && give_back(base),
       "chain: a FREE 3 MiB pool segment");
    void *a = cache_take(0, 9, MiB, &size);
    void *m = cache_take(0, 9, MiB, &size);
    void *first = cache_take(0, 9, MiB, &size);
    ok(a == base + 2 * MiB && m == base + MiB && first == base,
       "cut in three for stream 9");
    struct cache_block *ra = cache_test_find(a), *rm = cache_test_find(m),
                       *whole = cache_test_find(base);
    uint64_t hf = free_on(first, 9), ha = free_on(a, 9), hm = free_on(m, 9);
    ok(view(ra).state == BLOCK_MERGED && view(ra).merged_into == rm &&
           view(rm).state == BLOCK_MERGED && view(rm).merged_into == whole &&
           view(whole).state == BLOCK_PENDING && view(whole).size == 3 * MiB,
       "freed on 9, the middle last: a MERGED into m, m into the first");
    cache_reclaim_event_done(rm, hm, true, 30);
    cache_reclaim_event_done(whole, hf, true, 31);
    ok(view(whole).state == BLOCK_PENDING && view(rm).state == BLOCK_MERGED &&
           cache_test_find(m) == rm,
       "the middle's and the first's work done, a's not: still PENDING, m "
       "still waiting for a");
    ok(cache_take(0, 8, 3 * MiB, &size) != base,
       "stream 8 does not get it while a's work runs");
    cache_reclaim_event_done(ra, ha, true, 32);
    ok(view(whole).state == BLOCK_FREE && view(whole).size == 3 * MiB &&
           view(whole).outstanding == 0 && cache_test_find(a) == NULL &&
           cache_test_find(m) == NULL,
       "a's work done too: FREE, both parts' records gone");
    ok(cache_take(0, 8, 3 * MiB, &size) == base, "stream 8 takes it");
}

/* A whole FREE segment on the age list that a request is cut from is a
 * piece from then on: expiry and trims (cache_reclaim_expired) must not hand
 * its memory back while the piece cut from it is the application's.  The
 * rest must leave the age list: refiled before it is linked to the piece,
 * it would still be whole there, and its allocation released under the
 * piece. */
static void test_cut_segment_stays(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(60);
    size_t size = 0;
    struct cache_block *out[4];
    ok(add_block(1, base, 4 * MiB, false) && give_back(base),
       "a FREE 4 MiB segment of device 1, on the age list");
    void *p = cache_take(1, 1, 2 * MiB, &size);
    ok(p == base + 2 * MiB, "2 MiB cut from its end, LIVE");
    struct block_free_plan plan;
    cache_claim_plan((char *)p + MiB, 0, 1, &plan);
    ok(plan.path == BLOCK_INSIDE && cache_claim_inside_live((char *)p + MiB) &&
           view(cache_test_find(p)).state == BLOCK_LIVE,
       "an interior pointer of the live piece (another device's stream) is "
       "refused; the piece stays its owner's");
    is_int(claim((char *)p + 512), BLOCK_INSIDE, "by any free path");
    ok(!cache_claim_inside_live(base + MiB) &&
           claim(base + MiB) == BLOCK_INSIDE,
       "as is one inside the FREE rest");
    size_t n = cache_reclaim_expired(1, UINT64_MAX, out, 4, SIZE_MAX);
    is_int(n, 0, "collecting everything FREE takes nothing: the rest is a "
                 "piece now");
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
    is_int(cache_reclaim_oldest_free_ns(1), UINT64_MAX,
           "no FREE block on the age list");
    ok(cache_test_find(base) != NULL && cache_test_find(p) != NULL,
       "both parts still filed");
    uint64_t h = free_on_device(p, 1, 1);
    cache_reclaim_event_done(cache_test_find(p), h, true, 3);
    n = cache_reclaim_expired(1, UINT64_MAX, out, 4, SIZE_MAX);
    ok(n == 1 && view(out[0]).ptr == base && view(out[0]).size == 4 * MiB,
       "the piece back and merged, the whole segment goes");
    for (size_t i = 0; i < n; i++)
        cache_forget(out[i]);
    is_int(claim((char *)p + MiB), BLOCK_NOT_OURS,
           "handed back, its memory is no longer the cache's");
}

/* A MERGED block's address is cut again before its entry is done: the
 * piece is filed there, the MERGED block keeps waiting for its entry. */
static void test_cut_at_merged(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(50);
    size_t size = 0;
    ok(add_block(0, base, 2 * MiB, false) && give_back(base),
       "a FREE 2 MiB segment");
    void *a = cache_take(0, 9, MiB, &size);
    void *rest = cache_take(0, 9, MiB, &size);
    ok(a == base + MiB && rest == base, "cut in two for stream 9");
    uint64_t hr = free_on(rest, 9), ha = free_on(a, 9);
    struct cache_block *ra = cache_test_find(a), *whole = cache_test_find(base);
    ok(view(ra).state == BLOCK_MERGED && view(whole).size == 2 * MiB,
       "freed on 9: one PENDING block, a MERGED in it");
    void *again = cache_take(0, 9, MiB, &size);
    ok(again == a && cache_test_find(a) != ra &&
           view(cache_test_find(a)).state == BLOCK_LIVE,
       "stream 9 cuts 1 MiB at a's address again: the new piece is filed "
       "there");
    cache_reclaim_event_done(ra, ha, true, 10);
    ok(cache_test_find(a) != NULL && view(cache_test_find(a)).state == BLOCK_LIVE,
       "a's old entry done: the new piece stays filed");
    cache_reclaim_event_done(whole, hr, true, 11);
    ok(view(whole).state == BLOCK_FREE && view(whole).size == MiB,
       "the rest FREE once all its work is done");
}

/* A release that finds a block nobody's free claimed (its pointer was no
 * block when deferred: an interior one, or a part freed again after it
 * merged) never hands that block, another owner's, out again. */
static void test_adopt_unclaimed(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(56);
    size_t size = 0;
    ok(add_block(0, base, 2 * MiB, false), "a LIVE segment");
    stderr_capture_begin();
    ok(cache_reclaim_unclaimed_is_block(base) &&
           view(cache_test_find(base)).state == BLOCK_LIVE,
       "a release of it that no free claimed: not to be cudaFree'd, and "
       "still LIVE");
    ok(strstr(stderr_capture_end(), "another owner holds") != NULL,
       "reported");
    ok(give_back(base), "its owner's free");
    void *piece = cache_take(0, 9, 3 * MiB / 2, &size);
    ok(piece == base + MiB / 2, "a piece cut from it");
    ok(!cache_reclaim_unclaimed_is_block(piece) &&
           view(cache_test_find(piece)).state == BLOCK_LIVE,
       "a release of the piece no free claimed: left to cudaFree, which "
       "refuses an interior pointer; still LIVE");
    struct block_claim owner;
    ok(cache_claim(piece, &owner) == BLOCK_AFTER_EVENT &&
           owner.block == cache_test_find(piece) && view(owner.block).events == 1,
       "its owner's free claims it (FREEING), the claim naming it");
    ok(!cache_reclaim_unclaimed_is_block(piece) &&
           view(cache_test_find(piece)).state == BLOCK_FREEING,
       "a release no free claimed (an interior pointer deferred before the "
       "piece was cut) leaves the owner's claimed block alone, not FREE "
       "while the owner's work runs");
    cache_reclaim_adopt(&owner, "defer_free");
    ok(cache_test_find(piece) == NULL && view(cache_test_find(base)).size == 2 * MiB,
       "its owner's release: FREE, merged back into the segment");
}

/* A batched free's plan parks its block in the same hold (only on the
 * stream-ordered path), and a batch's claims complete in one call, across
 * a run of each device's claims. */
static void test_parked_plan_and_claims_done(void)
{
    size_t size;
    struct block_claim claims[4];
    void *p[4] = {ADDR(80), ADDR(81), ADDR(82), ADDR(83)};
    int device[4] = {0, 0, 1, 0};
    unsigned long long stream[4] = {40, 40, 50, 41};
    for (int i = 0; i < 4; i++) {
        struct block_free_plan plan;
        ok(add_block(device[i], p[i], 24576, false), "block %d", i);
        cache_claim_plan_parked(p[i], device[i], stream[i], &plan);
        ok(plan.path == BLOCK_STREAM_ORDERED && plan.parked &&
               view(plan.block).state == BLOCK_PENDING,
           "block %d: freed on its device's stream, parked: PENDING", i);
        ok(!cache_claim_park(&plan, stream[i]),
           "block %d: a second park finds it parked already", i);
        claims[i] = (struct block_claim){plan.block, plan.handout};
    }
    ok(cache_take(0, 40, 24576, &size) == p[1] &&
           cache_take(0, 40, 24576, &size) == p[0],
       "both of device 0's on stream 40 are its own stream's at once");
    void *other_free = cache_take(0, 40, 24576, &size);
    ok(other_free != p[3], "stream 41's is not (its work is not done)");
    if (other_free != NULL) /* a FREE one an earlier test left */
        ok(give_back(other_free), "which goes back");
    void *q = ADDR(84);
    struct block_free_plan other;
    ok(add_block(1, q, 24576, false), "a block of device 1");
    cache_claim_plan_parked(q, 0, 40, &other);
    ok(other.path == BLOCK_AFTER_EVENT && !other.parked &&
           view(other.block).state == BLOCK_FREEING,
       "freed on another device's stream: claimed, not parked");
    struct block_claim oc = {other.block, other.handout};
    cache_reclaim_adopt(&oc, "defer_free");
    /* p[0] and p[1] were handed out again: their claims are stale. */
    cache_reclaim_claims_done(claims, 4, true, 77);
    struct cache_block *b2 = cache_test_find(p[2]), *b3 = cache_test_find(p[3]);
    ok(view(b2).state == BLOCK_FREE && view(b2).freed_ns == 77 &&
           view(b3).state == BLOCK_FREE && view(b3).freed_ns == 77,
       "claims over devices 0, 0, 1, 0 done at once: device 1's and the "
       "last one FREE");
    ok(view(cache_test_find(p[0])).state == BLOCK_LIVE &&
           view(cache_test_find(p[1])).state == BLOCK_LIVE,
       "the handed-out ones stay their new owners' (stale hand-outs)");
    is_int(view(cache_test_find(p[0])).events + view(cache_test_find(p[1])).events +
               view(b2).events + view(b3).events,
           0, "every claim's event reference dropped");
    ok(give_back(p[0]) && give_back(p[1]), "the two taken back");

    /* A chain of merged blocks, and one block named twice in a batch
     * (freed, taken again on its stream, freed again).  Pieces of 64 MiB:
     * larger than any FREE block earlier tests left, so they are cut from
     * this segment. */
    const size_t mib = (size_t)1 << 20, piece = 64 * mib;
    struct block_claim twice[2], chain[3];
    struct block_free_plan plan;
    void *seg = ADDR(1000);
    ok(add_block(0, seg, 4 * piece, false), "a 256 MiB segment");
    cache_claim_plan_parked(seg, 0, 61, &plan);
    chain[2] = (struct block_claim){plan.block, plan.handout};
    void *a = cache_take(0, 61, piece, &size);
    void *b = cache_take(0, 61, piece, &size);
    ok(a == (char *)seg + 3 * piece && b == (char *)seg + 2 * piece,
       "two pieces cut from its end on its own stream");
    if (a != (char *)seg + 3 * piece)
        diag("cut at %p and %p, segment at %p", a, b, seg);
    cache_claim_plan_parked(a, 0, 61, &plan);
    chain[0] = (struct block_claim){plan.block, plan.handout};
    cache_claim_plan_parked(b, 0, 61, &plan);
    chain[1] = (struct block_claim){plan.block, plan.handout};
    ok(plan.size == piece, "the plan keeps the piece's own size");
    ok(cache_test_find(a) == NULL ||
           view(cache_test_find(a)).state == BLOCK_MERGED,
       "the pieces merged into the rest at once (a chain of records)");
    cache_reclaim_claims_done(chain, 3, true, 79);
    struct cache_block *whole = cache_test_find(seg);
    ok(view(whole).state == BLOCK_FREE && view(whole).size == 4 * piece &&
           view(whole).events == 0 && view(whole).outstanding == 0 &&
           view(whole).whole,
       "the chain's claims done in one call: one whole FREE segment");
    void *x = ADDR(100);
    ok(add_block(0, x, 3 * mib, false), "a 3 MiB block");
    cache_claim_plan_parked(x, 0, 60, &plan);
    twice[0] = (struct block_claim){plan.block, plan.handout};
    ok(cache_take(0, 60, 3 * mib, &size) == x, "taken again on 60");
    cache_claim_plan_parked(x, 0, 60, &plan);
    twice[1] = (struct block_claim){plan.block, plan.handout};
    cache_reclaim_claims_done(twice, 2, true, 78);
    struct cache_block *xb = cache_test_find(x);
    ok(view(xb).state == BLOCK_FREE && view(xb).events == 0,
       "named twice in one batch: FREE once, no reference left");
}

/* A free's plan given the block's device as its caller knew it
 * (cache_claim_plan_on): the look-up under that device's lock decides, so
 * a wrong device or a pointer that is no block plans as without it. */
static void test_plan_with_device(void)
{
    ok(add_block(1, ADDR(600), 512, false) && add_block(0, ADDR(601), 512, false),
       "a block on device 1, one on device 0");
    struct block_free_plan plan;
    cache_claim_plan_on(ADDR(600), 0, 1, 3, false, &plan);
    ok(plan.path == BLOCK_STREAM_ORDERED && plan.device == 1 &&
           plan.block == cache_test_find(ADDR(600)),
       "said on device 0, the block of device 1 is found and claimed "
       "(path %d)",
       (int)plan.path);
    cache_claim_plan_on(ADDR(600), 1, 1, 3, false, &plan);
    is_int(plan.path, BLOCK_NOT_LIVE, "claimed: a second free is refused");
    cache_claim_plan_on(ADDR(601), 0, 0, 4, true, &plan);
    ok(plan.path == BLOCK_STREAM_ORDERED && plan.parked &&
           view(cache_test_find(ADDR(601))).state == BLOCK_PENDING,
       "said on its own device: claimed and parked");
    cache_claim_plan_on(ADDR(602), 0, 0, 4, true, &plan);
    ok(plan.path == BLOCK_NOT_OURS && plan.block == NULL,
       "a pointer that is no block is not ours, device given or not");
    cache_claim_plan_on((char *)ADDR(601) + 256, 0, 0, 4, false, &plan);
    is_int(plan.path, BLOCK_INSIDE, "nor is one inside a block");
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    ok(cache_init(2, (size_t)1 << 20, 16),
       "init for two devices, requests of 1 MiB or more cut from larger blocks");
    test_stream_order();
    test_fit();
    test_double_free();
    test_devices();
    test_split_merge();
    test_merge_with_free();
    test_pending_neighbours_apart();
    test_merged_chain_middle_first();
    test_cut_segment_stays();
    test_cut_at_merged();
    test_adopt_unclaimed();
    test_parked_plan_and_claims_done();
    test_plan_with_device();
    struct defer_stats s = stats_now();
    ok(s.cache_free_bytes <= s.cache_bytes, "free bytes within the total");
    cache_destroy();
    ok(!cache_active(), "destroyed: inactive");
    return 0;
}
