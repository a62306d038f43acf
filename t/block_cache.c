/* The block cache on its own (no reclaimer): size classes and fit, the
 * states LIVE -> PENDING (reusable on its stream only) -> FREE (any stream),
 * stale hand-outs, recorded streams, double frees, expiry, accounting. */
#include <stdint.h>
#include <string.h>

#include "block_cache.h"
#include "block_map.h"
#include "helpers.h"

/* Made-up addresses: the cache never dereferences them. */
#define ADDR(n) ((void *)(uintptr_t)(UINT64_C(0x7f0000000000) + (n) * 0x100000))

static void test_rounding(void)
{
    static const struct {
        size_t bytes, rounded;
    } cases[] = {
        {1, 512},
        {512, 512},
        {513, 544},
        {1000, 1024},
        {1025, 1088},
        {(size_t)1 << 20, (size_t)1 << 20},
        {((size_t)1 << 20) + 1, ((size_t)1 << 20) + 65536},
        {((size_t)1 << 40) + 1, ((size_t)1 << 40) + 512},
    };
    int good = 1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t r = block_cache_round(cases[i].bytes);
        if (r != cases[i].rounded) {
            diag("round(%zu) = %zu; want %zu", cases[i].bytes, r,
                 cases[i].rounded);
            good = 0;
        }
    }
    ok(good, "rounding: 16 classes per power of two from 512 bytes; above "
             "2^40 to 512 bytes");
    int within = 1;
    for (size_t n = 513; n < (1u << 22); n = n * 3 / 2 + 7) {
        size_t r = block_cache_round(n);
        within &= r >= n && r - n <= n / 16;
    }
    ok(within, "a rounded request wastes at most 1/16");
}

/* Free b (ptr p) on stream id of device 0 the stream-ordered way; returns
 * the hand-out its entry would name. */
static uint64_t free_on(void *p, unsigned long long id)
{
    struct block_free_plan plan;
    block_cache_plan_free(p, 0, id, &plan);
    if (plan.path != BLOCK_STREAM_ORDERED || !block_cache_park(&plan, id)) {
        diag("free_on(%p, %llu): path %d", p, id, (int)plan.path);
        return 0;
    }
    return plan.handout;
}

static void test_stream_order(void)
{
    size_t size = 0;
    ok(block_cache_take(0, 7, 1000, &size) == NULL, "empty: nothing to take");
    ok(block_cache_add(0, ADDR(1), 1024, false), "a fresh block is filed");
    ok(block_cache_active(), "the cache is active from the first block");
    struct cache_block *b = block_map_find(ADDR(1));
    ok(b != NULL && b->state == BLOCK_LIVE, "it is LIVE");
    uint64_t h1 = free_on(ADDR(1), 7);
    ok(h1 != 0 && b->state == BLOCK_PENDING, "freed on stream 7: PENDING");
    ok(block_cache_take(0, 8, 1000, &size) == NULL,
       "another stream cannot take it before its work is done");
    ok(block_cache_take(0, 7, 1000, &size) == ADDR(1) && size == 1024,
       "its own stream takes it at once");
    is_int(stats_now().reused_same_stream, 1, "counted as a same-stream reuse");
    uint64_t h2 = free_on(ADDR(1), 7);
    ok(h2 != h1, "a new hand-out, a new id");
    block_cache_event_done(b, h1, true, 100);
    ok(b->state == BLOCK_PENDING,
       "the first free's event completing changes nothing: a stale hand-out");
    ok(block_cache_take(0, 8, 1000, &size) == NULL, "still not for stream 8");
    block_cache_event_done(b, h2, true, 200);
    ok(b->state == BLOCK_FREE && b->freed_ns == 200,
       "its own event completed: FREE");
    ok(block_cache_take(0, 8, 1000, &size) == ADDR(1), "now any stream takes it");
    is_int(b->events, 0, "no entry names it any more");
}

static void test_fit(void)
{
    size_t size;
    ok(block_cache_add(0, ADDR(2), 4096, false) && block_cache_adopt(ADDR(2)),
       "a 4096-byte block, adopted back: FREE");
    ok(block_cache_take(0, 1, 1000, &size) == NULL,
       "too big for 1000 bytes (more than 1/8 over)");
    ok(block_cache_take(0, 1, 4097, &size) == NULL, "too small for 4097");
    ok(block_cache_take(0, 1, 3700, &size) == ADDR(2) && size == 4096,
       "3700 takes it (4096 <= 3700 + 3700/8)");
    ok(block_cache_add(0, ADDR(3), 1088, false) && block_cache_add(0, ADDR(4), 1024, false),
       "two neighbours");
    block_cache_adopt(ADDR(3));
    block_cache_adopt(ADDR(4));
    ok(block_cache_take(0, 1, 1000, &size) == ADDR(4),
       "best fit: 1024 before 1088");
    ok(block_cache_take(0, 1, 1000, &size) == ADDR(3), "then 1088");
    /* An exact-size block (the out-of-memory fallback) between classes. */
    ok(block_cache_add(0, ADDR(5), 614400, false) && block_cache_adopt(ADDR(5)),
       "an exact-size block of 600 KiB");
    ok(block_cache_take(0, 1, 614401, &size) == NULL, "not for one byte more");
    ok(block_cache_take(0, 1, 614400, &size) == ADDR(5),
       "found for its own size, filed below its class");
}

static void test_double_free(void)
{
    ok(block_cache_add(0, ADDR(6), 512, false), "a block");
    free_on(ADDR(6), 3);
    struct block_free_plan plan;
    block_cache_plan_free(ADDR(6), 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_LIVE, "freed again while PENDING: not live");
    stderr_capture_begin();
    ok(block_cache_adopt(ADDR(6)), "an adopt of it is still 'ours'");
    const char *said = stderr_capture_end();
    ok(strstr(said, "freed twice") != NULL, "and reported as a double free");
    block_cache_plan_free(ADDR(99), 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS, "an unknown pointer is not ours");
    block_cache_plan_free((char *)ADDR(2) + 2048, 0, 3, &plan);
    is_int(plan.path, BLOCK_NOT_OURS, "nor is an interior pointer");
}

static void test_recorded(void)
{
    size_t size;
    ok(block_cache_add(0, ADDR(7), 2048, false), "a block");
    cudaStream_t x = (cudaStream_t)(uintptr_t)0x1234;
    is_int(block_cache_record_stream(ADDR(7), x, 9), cudaSuccess,
           "recorded on stream 9");
    is_int(block_cache_record_stream(ADDR(7), x, 9), cudaSuccess,
           "recording it twice is once");
    struct block_free_plan plan;
    block_cache_plan_free(ADDR(7), 0, 9, &plan);
    is_int(plan.path, BLOCK_STREAM_ORDERED,
           "freed on the recorded stream itself: stream-ordered");
    /* A plan claims the block (FREEING): until the free gives it back
     * (refused after all), no other free or record takes it. */
    struct block_free_plan again;
    block_cache_plan_free(ADDR(7), 0, 9, &again);
    is_int(again.path, BLOCK_NOT_LIVE, "planned: a second free is refused");
    is_int(block_cache_claim(ADDR(7)), BLOCK_NOT_LIVE,
           "so is a claim by another free path");
    stderr_capture_begin();
    is_int(block_cache_record_stream(ADDR(7), x, 10), cudaErrorInvalidValue,
           "and a record");
    stderr_capture_end();
    block_cache_unclaim(ADDR(7));
    block_cache_plan_free(ADDR(7), 0, 4, &plan);
    ok(plan.path == BLOCK_AFTER_STREAMS && plan.nstreams == 2 &&
           plan.streams[1] == x,
       "given back, then freed on another stream: waits for both");
    is_int(block_cache_recorded(ADDR(7), NULL), 1,
           "a claimed block's recorded streams are still its free's");
    block_cache_unclaim(ADDR(7));
    is_int(block_cache_claim(ADDR(99)), BLOCK_NOT_OURS,
           "claiming an unknown pointer: not ours");
    int all = 1;
    for (unsigned long long id = 100; id < 100 + BLOCK_MAX_RECORDED - 1; id++)
        all &= block_cache_record_stream(ADDR(7), x, id) == cudaSuccess;
    ok(all, "up to 63 streams recorded");
    stderr_capture_begin();
    is_int(block_cache_record_stream(ADDR(7), x, 5000), cudaErrorInvalidValue,
           "a 64th is refused");
    ok(strstr(stderr_capture_end(), "63 streams") != NULL, "saying why");
    ok(block_cache_adopt(ADDR(7)), "its work done: adopted");
    ok(block_cache_take(0, 4, 2048, &size) == ADDR(7) &&
           block_map_find(ADDR(7))->nrecorded == 0,
       "handed out again with no stream recorded");
    stderr_capture_begin();
    is_int(block_cache_record_stream(ADDR(98), x, 9), cudaErrorInvalidValue,
           "recording an unknown pointer is refused");
    stderr_capture_end();
}

static void test_devices_and_collect(void)
{
    ok(block_cache_add(1, ADDR(8), 512, false), "a block of device 1");
    struct block_free_plan plan;
    block_cache_plan_free(ADDR(8), 0, 3, &plan);
    is_int(plan.path, BLOCK_AFTER_EVENT,
           "freed on a device-0 stream: waits for its event, no stream order");
    block_cache_adopt(ADDR(8));
    size_t size;
    int never = 1;
    for (int i = 0; i < 4; i++)
        never &= block_cache_take(0, 3, 512, &size) != ADDR(8);
    ok(never, "device 0 never gets device 1's block");
    /* Expiry: blocks that became free at 10 and 20; one still named. */
    ok(block_cache_add(1, ADDR(9), 512, false) && block_cache_add(1, ADDR(10), 512, false),
       "two more");
    block_cache_adopt(ADDR(9));
    struct cache_block *named = block_map_find(ADDR(10));
    struct block_free_plan p10;
    block_cache_plan_free(ADDR(10), 1, 5, &p10);
    block_cache_park(&p10, 5);
    named->events++; /* as if a second, older entry still named it */
    block_cache_event_done(named, p10.handout, true, 1);
    uint64_t oldest = block_cache_oldest_free_ns(1);
    ok(oldest == block_map_find(ADDR(8))->freed_ns, "oldest FREE first");
    struct cache_block *out[8];
    size_t n = block_cache_collect(1, UINT64_MAX, out, 8, SIZE_MAX);
    is_int(n, 2, "collect takes the FREE blocks no entry names");
    ok(block_map_find(ADDR(8)) == NULL && block_map_find(ADDR(9)) == NULL,
       "and removes them from the map");
    ok(block_map_find(ADDR(10)) != NULL, "a block still named stays");
    for (size_t i = 0; i < n; i++)
        block_cache_forget(out[i]);
    named->events--;
    is_int(block_cache_collect(1, 0, out, 8, SIZE_MAX), 0,
           "nothing became free before time 0... ");
    n = block_cache_collect(1, UINT64_MAX, out, 8, SIZE_MAX);
    is_int(n, 1, "once unnamed it goes too");
    block_cache_forget(out[0]);
}

static void test_stale_record(void)
{
    ok(block_cache_add(0, ADDR(11), 512, false), "a block");
    uint64_t before = stats_now().cache_bytes;
    stderr_capture_begin();
    ok(block_cache_add(0, ADDR(11), 1024, false), "cudaMalloc returned its address "
                                           "again (it was cudaFree'd)");
    ok(strstr(stderr_capture_end(), "instead of defer_free") != NULL,
       "reported");
    is_int(stats_now().cache_bytes, before - 512 + 1024,
           "the old record is dropped from the accounting");
    is_int(block_map_find(ADDR(11))->size, 1024, "the new one counts");
}

/* A miss's hand-back: pool blocks FREE or PENDING on the request's stream
 * only, the largest first, no more than the bytes asked for; PENDING
 * records go once the entries naming them are done. */
static void test_collect_largest(void)
{
    struct block_free_plan plan[4];
    /* 14, 15, 16: pool blocks freed on stream 7 in this order; 17 a
     * cudaMalloc block on 7; 18 a pool block on stream 8. */
    unsigned long long streams[5] = {7, 7, 7, 7, 8};
    size_t sizes[5] = {4096, 1024, 2048, 4096, 4096};
    for (int i = 0; i < 5; i++) {
        ok(block_cache_add(0, ADDR(14 + i), sizes[i], i != 3), "block %d", i);
        block_cache_plan_free(ADDR(14 + i), 0, streams[i], &plan[i < 4 ? i : 3]);
        ok(block_cache_park(&plan[i < 4 ? i : 3], streams[i]),
           "PENDING on its stream");
    }
    /* 19: a FREE pool block, free at time >= 1; 20: a FREE cudaMalloc
     * block, the largest (its cudaFree would drain the device). */
    ok(block_cache_add(0, ADDR(19), 3072, true) && block_cache_adopt(ADDR(19)),
       "a FREE pool block");
    ok(block_cache_add(0, ADDR(20), 8192, false) && block_cache_adopt(ADDR(20)),
       "a FREE cudaMalloc block");
    struct cache_block *b14 = block_map_find(ADDR(14));
    struct cache_block *b15 = block_map_find(ADDR(15));
    struct cache_block *b16 = block_map_find(ADDR(16));
    uint64_t h14 = b14->handout, h15 = b15->handout, h16 = b16->handout;
    struct block_memory out[8];
    is_int(block_cache_collect_largest(0, 9, 0, out, 8, SIZE_MAX), 0,
           "another stream takes none of 7's, nor a block free after the "
           "time given");
    size_t n = block_cache_collect_largest(0, 7, UINT64_MAX, out, 8, 5000);
    ok(n == 2 && out[0].ptr == ADDR(14) && out[0].size == 4096 &&
           out[1].ptr == ADDR(19) && out[1].size == 3072,
       "the largest pool blocks, PENDING on the stream or FREE, until the "
       "bytes asked for are reached");
    ok(b14->state == BLOCK_GONE && block_map_find(ADDR(14)) == NULL &&
           block_map_find(ADDR(19)) == NULL,
       "GONE or forgotten, out of the map");
    ok(block_map_find(ADDR(15)) != NULL && block_map_find(ADDR(16)) != NULL,
       "the smaller ones stay");
    n = block_cache_collect_largest(0, 7, UINT64_MAX, out, 8, SIZE_MAX);
    ok(n == 2 && out[0].ptr == ADDR(16) && out[1].ptr == ADDR(15),
       "the rest of the stream's pool blocks, largest first, not its "
       "cudaMalloc block");
    ok(block_map_find(ADDR(17)) != NULL && block_map_find(ADDR(18)) != NULL &&
           block_map_find(ADDR(20)) != NULL,
       "nor another stream's, nor a FREE cudaMalloc block");
    /* Their entries complete: the records go (ASan sees a leak otherwise). */
    block_cache_event_done(b14, h14, true, 1);
    block_cache_event_done(b15, h15, true, 1);
    block_cache_event_done(b16, h16, true, 1);
    void *p = NULL;
    size_t size = 0;
    p = block_cache_take(0, 7, 4096, &size);
    ok(p == ADDR(17), "a request on 7 finds only the block left there");
}

/* Segments: a request of 1 MiB or more cut from a larger block, FREE or
 * PENDING on its own stream; neighbours merge when FREE, and at once when
 * PENDING on one stream, going FREE only once every part's work is done. */
static void test_split_merge(void)
{
    const size_t MiB = (size_t)1 << 20;
    char *base = ADDR(40);
    size_t size = 0;
    ok(block_cache_add(0, base, 4 * MiB, true) && block_cache_adopt(base),
       "a FREE 4 MiB pool segment");
    ok(block_cache_take(0, 1, 512 * 1024, &size) == NULL,
       "a request below 1 MiB is never cut from it");
    void *p = block_cache_take(0, 1, MiB, &size);
    ok(p == base + 3 * MiB && size == MiB, "1 MiB is cut from its end");
    struct cache_block *rest = block_map_find(base);
    ok(rest != NULL && rest->size == 3 * MiB && rest->state == BLOCK_FREE,
       "the rest stays FREE at the segment's start");
    struct block_memory mem[4];
    is_int(block_cache_collect_largest(0, 1, UINT64_MAX, mem, 4, SIZE_MAX), 0,
           "a piece of a segment never goes back to the pool");
    uint64_t h = free_on(p, 1);
    struct cache_block *piece = block_map_find(p);
    block_cache_event_done(piece, h, true, 5);
    ok(block_map_find(p) == NULL && rest->size == 4 * MiB &&
           rest->state == BLOCK_FREE,
       "the piece's work done, it merges back: one FREE segment again");

    /* PENDING on stream 7: two pieces cut and freed there merge at once. */
    p = block_cache_take(0, 7, 4 * MiB, &size);
    ok(p == base && size == 4 * MiB, "the whole segment for 4 MiB");
    uint64_t hw = free_on(base, 7);
    void *a = block_cache_take(0, 7, MiB, &size);
    void *b = block_cache_take(0, 7, MiB, &size);
    ok(a == base + 3 * MiB && b == base + 2 * MiB,
       "stream 7 cuts two pieces from its own PENDING segment");
    ok(block_cache_take(0, 8, MiB, &size) == NULL,
       "stream 8 cuts nothing from it before its work is done");
    struct cache_block *ra = block_map_find(a), *rb = block_map_find(b);
    uint64_t ha = free_on(a, 7), hb = free_on(b, 7);
    struct cache_block *whole = block_map_find(base);
    ok(whole == rb && whole->size == 4 * MiB &&
           whole->state == BLOCK_PENDING && block_map_find(a) == NULL,
       "freed on 7, the three parts are one PENDING block at once");
    ok(block_cache_take(0, 7, 4 * MiB, &size) == base,
       "which stream 7 takes whole");
    uint64_t hm = free_on(base, 7);
    block_cache_event_done(whole, hm, true, 6);
    ok(whole->state == BLOCK_PENDING &&
           block_cache_take(0, 8, 4 * MiB, &size) == NULL,
       "its last free's work done, other parts' not: still PENDING");
    struct cache_block *rw = rest; /* the segment's first part, MERGED */
    block_cache_event_done(ra, ha, true, 7);
    ok(whole->state == BLOCK_PENDING, "nor with one part left");
    block_cache_event_done(rw, hw, true, 8);
    ok(whole->state == BLOCK_FREE, "every part's work done: FREE");
    block_cache_event_done(rb, hb, true, 9); /* its older free's entry */
    is_int(whole->events, 0, "no entry names it any more");
    ok(block_cache_take(0, 8, 4 * MiB, &size) == base && size == 4 * MiB,
       "and stream 8 takes it");
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    ok(block_cache_init(2, (size_t)1 << 20),
       "init for two devices, requests of 1 MiB or more cut from larger blocks");
    test_rounding();
    test_stream_order();
    test_fit();
    test_double_free();
    test_recorded();
    test_devices_and_collect();
    test_stale_record();
    test_collect_largest();
    test_split_merge();
    struct defer_stats s = stats_now();
    ok(s.cache_free_bytes <= s.cache_bytes, "free bytes within the total");
    block_cache_destroy();
    ok(!block_cache_active(), "destroyed: inactive");
    return 0;
}
