/* SPDX-License-Identifier: MIT */
/* The block cache against a model: a seeded random walk over its
 * interface (a take, a new block on a miss, a free ordered on a stream,
 * a claim adopted after its event, an event done in stream order, the
 * expiry, a miss's hand-back) on one device and three streams, every
 * request of 512 bytes or more cut from a larger block where one is free.
 * After every step: no hand-out overlaps a live block or memory that left
 * the cache; no block goes to a stream while an entry of another stream
 * over its memory is pending, unless that stream is ordered after it
 * (cudaFreeAsync's rule: a free on another stream follows the allocation);
 * nothing leaves while live or named by a pending entry; cache_bytes and
 * live_bytes are the model's.  At the end every segment leaves whole and
 * the cache holds nothing.  Arguments: the seed (1) and the steps (8000).
 * Not covered: stale blocks, recorded users, devices, threads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "helpers.h"

/* The most live blocks, entries and segments the model keeps. */
enum { MAXB = 4096, MAXE = 65536, MAXS = 4096, NSTREAMS = 3 };

/* Streams are 1 .. NSTREAMS (0 unused); an order is a vector clock over
 * them: entry seq of stream s is ordered before whatever holds a clock
 * whose [s] is at least seq. */
#define NS (NSTREAMS + 1)

/* A block handed out. */
struct live {
    uintptr_t p;
    size_t size;
    int stream;  /* the request's */
    int vc[NS];  /* its stream's order when it was handed out */
};

/* A free: parked on its stream, or claimed and adopted once done. */
struct ent {
    uintptr_t p;
    size_t size;
    int stream;
    bool done;                 /* its event completed */
    bool adopt;                /* claimed (waits for its event), else parked */
    struct cache_block *block; /* parked: the block and its hand-out */
    uint64_t handout;
    struct block_claim claim;  /* claimed */
    int seq;                   /* its number on its stream, from 1 */
    int vc[NS];                /* what it is ordered after */
};

/* vstream[t][s]: stream t is ordered after entries 1 .. that of s. */
static int vstream[NS][NS];
static int seqs[NS]; /* entries made on each stream */

/* A segment made on a miss; gone once it left the cache. */
struct seg {
    uintptr_t p;
    size_t size;
    bool gone;
};

static struct live lv[MAXB];
static int nlive;
static struct ent en[MAXE];
static int nent;
static struct seg sg[MAXS];
static int nseg;
static uintptr_t next_addr = UINT64_C(0x7e0000000000);
static uint64_t added_bytes, left_bytes;
static int violations;
static uint64_t clock_ns = 1;

#define BAD(...) do { if (violations++ < 20) diag(__VA_ARGS__); } while (0)

static bool overlap(uintptr_t a, size_t as, uintptr_t b, size_t bs)
{
    return a < b + bs && b < a + as;
}

static void check_counters(const char *step)
{
    struct defer_device_stats d;
    defer_device_stats_get(0, &d);
    uint64_t live = 0;
    for (int i = 0; i < nlive; i++)
        live += lv[i].size;
    for (int i = 0; i < nent; i++)
        if (en[i].adopt && !en[i].done)
            live += en[i].size; /* claimed, FREEING */
    if (d.cache_bytes != added_bytes - left_bytes)
        BAD("%s: cache_bytes %llu, model %llu", step,
            (unsigned long long)d.cache_bytes,
            (unsigned long long)(added_bytes - left_bytes));
    if (d.live_bytes != live)
        BAD("%s: live_bytes %llu, model %llu", step,
            (unsigned long long)d.live_bytes, (unsigned long long)live);
}

static void do_take(void)
{
    int stream = rand() % NSTREAMS + 1;
    size_t bytes = (size_t)(rand() % 64 + 1) * 512 - (rand() % 2) * 100;
    size_t size = 0;
    void *p = cache_take(0, (unsigned long long)stream, bytes, &size);
    if (nlive >= MAXB)
        return;
    if (p == NULL) {
        size = cache_round(bytes);
        p = (void *)next_addr;
        next_addr += (size + 0xfffff) & ~(uintptr_t)0xfffff;
        if (!add_block(0, p, size, true))
            bail("add_block");
        sg[nseg++] = (struct seg){(uintptr_t)p, size, false};
        added_bytes += size;
    } else {
        uintptr_t q = (uintptr_t)p;
        if (size < bytes)
            BAD("take: %zu bytes for a request of %zu", size, bytes);
        for (int i = 0; i < nlive; i++)
            if (overlap(q, size, lv[i].p, lv[i].size))
                BAD("take: %p+%zu overlaps live %p+%zu", p, size,
                    (void *)lv[i].p, lv[i].size);
        bool inseg = false;
        for (int i = 0; i < nseg; i++)
            if (overlap(q, size, sg[i].p, sg[i].size)) {
                if (sg[i].gone)
                    BAD("take: %p overlaps a segment that left", p);
                else if (q >= sg[i].p && q + size <= sg[i].p + sg[i].size)
                    inseg = true;
            }
        if (!inseg)
            BAD("take: %p+%zu in no segment", p, size);
        for (int i = 0; i < nent; i++)
            if (!en[i].done && en[i].stream != stream &&
                vstream[stream][en[i].stream] < en[i].seq &&
                overlap(q, size, en[i].p, en[i].size))
            {
                BAD("take on stream %d: %p+%zu while entry %d of stream %d "
                    "over %p+%zu is pending", stream, p, size, i,
                    en[i].stream, (void *)en[i].p, en[i].size);
                for (int j = 0; j < nent; j++)
                    if (overlap(q, size, en[j].p, en[j].size))
                        diag("  entry %d: %p+%zu stream %d seq %d %s %s", j,
                             (void *)en[j].p, en[j].size, en[j].stream,
                             en[j].seq, en[j].adopt ? "adopt" : "park",
                             en[j].done ? "done" : "pending");
            }
    }
    struct live *l = &lv[nlive++];
    l->p = (uintptr_t)p;
    l->size = size;
    l->stream = stream;
    /* Stream order: a free on another stream must follow the allocation
     * (cudaFreeAsync's rule): that stream then waits for what this one
     * was ordered after. */
    memcpy(l->vc, vstream[stream], sizeof l->vc);
}

static void do_free(void)
{
    if (nlive == 0 || nent >= MAXE)
        return;
    int k = rand() % nlive;
    struct live l = lv[k];
    lv[k] = lv[--nlive];
    struct ent *e = &en[nent];
    memset(e, 0, sizeof *e);
    e->p = l.p;
    e->size = l.size;
    int r = rand() % 4;
    e->stream = r == 0 ? rand() % NSTREAMS + 1 : l.stream;
    for (int t = 0; t < NS; t++)
        if (vstream[e->stream][t] < l.vc[t])
            vstream[e->stream][t] = l.vc[t];
    e->seq = ++seqs[e->stream];
    vstream[e->stream][e->stream] = e->seq;
    memcpy(e->vc, vstream[e->stream], sizeof e->vc);
    if (r == 3) { /* a path that waits for its event, adopted after */
        e->adopt = true;
        if (cache_claim((void *)l.p, &e->claim) != BLOCK_AFTER_EVENT)
            BAD("claim of live %p refused", (void *)l.p);
    } else {
        struct block_free_plan plan;
        if (!park_free((void *)l.p, 0, (unsigned long long)e->stream, &plan))
            BAD("park of live %p refused (path %d)", (void *)l.p, plan.path);
        e->block = plan.block;
        e->handout = plan.handout;
    }
    nent++;
}

/* Whether entry i may complete: its stream's earlier entries and its deps
 * done. */
static bool may_complete(int i)
{
    if (en[i].done)
        return false;
    for (int j = 0; j < nent; j++)
        if (j != i && !en[j].done && en[j].seq <= en[i].vc[en[j].stream])
            return false;
    return true;
}

static void do_complete(void)
{
    int cand[64], n = 0;
    for (int i = 0; i < nent && n < 64; i++)
        if (may_complete(i))
            cand[n++] = i;
    if (n == 0)
        return;
    int i = cand[rand() % n];
    clock_ns += 10;
    if (en[i].adopt)
        cache_reclaim_adopt(&en[i].claim, "defer_free");
    else
        cache_reclaim_event_done(en[i].block, en[i].handout, true, clock_ns);
    en[i].done = true;
}

static void left_segment(uintptr_t p, size_t size, int stream, const char *how)
{
    bool found = false;
    for (int i = 0; i < nseg; i++)
        if (sg[i].p == p && !sg[i].gone) {
            if (sg[i].size != size)
                BAD("%s: %p leaves as %zu bytes, made as %zu", how,
                    (void *)p, size, sg[i].size);
            sg[i].gone = true;
            found = true;
        }
    if (!found)
        BAD("%s: %p is no segment in the cache", how, (void *)p);
    for (int i = 0; i < nlive; i++)
        if (overlap(p, size, lv[i].p, lv[i].size))
            BAD("%s: %p+%zu leaves under live %p", how, (void *)p, size,
                (void *)lv[i].p);
    for (int i = 0; i < nent; i++)
        if (!en[i].done &&
            (stream < 0 || (en[i].stream != stream &&
                            vstream[stream][en[i].stream] < en[i].seq)) &&
            overlap(p, size, en[i].p, en[i].size))
            BAD("%s: %p+%zu leaves while entry %d (stream %d) is pending",
                how, (void *)p, size, i, en[i].stream);
    left_bytes += size;
}

static void do_expire(void)
{
    struct cache_block *out[64];
    size_t n = cache_reclaim_expired(0, UINT64_MAX, out, 64, SIZE_MAX);
    for (size_t i = 0; i < n; i++) {
        struct block_view v = view(out[i]);
        left_segment((uintptr_t)v.ptr, v.size, -1, "expiry");
        cache_forget(out[i]);
    }
}

static void do_miss(void)
{
    int stream = rand() % NSTREAMS + 1;
    struct block_memory out[64];
    size_t n = cache_reclaim_for_miss(0, (unsigned long long)stream,
                                      UINT64_MAX, out, 64,
                                      (size_t)(rand() % 65536 + 512));
    for (size_t i = 0; i < n; i++)
        left_segment((uintptr_t)out[i].ptr, out[i].size, stream, "hand-back");
}

int main(int argc, char **argv)
{
    plan_lazy();
    fake_reset(1);
    unsigned seed = argc > 1 ? (unsigned)atoi(argv[1]) : 1;
    int steps = argc > 2 ? atoi(argv[2]) : 8000;
    srand(seed);
    ok(cache_init(1, 512, 16), "init");
    for (int s = 0; s < steps && violations == 0; s++) {
        int r = rand() % 100;
        const char *what;
        if (r < 35) { do_take(); what = "take"; }
        else if (r < 65) { do_free(); what = "free"; }
        else if (r < 95) { do_complete(); what = "complete"; }
        else if (r < 98) { do_expire(); what = "expire"; }
        else { do_miss(); what = "miss"; }
        check_counters(what);
        if (violations)
            diag("seed %u, step %d (%s)", seed, s, what);
    }
    /* Drain: free everything, complete everything, expire everything. */
    while (nlive > 0)
        do_free();
    for (int guard = 0; guard < MAXE * 2; guard++) {
        bool any = false;
        for (int i = 0; i < nent; i++)
            any |= !en[i].done;
        if (!any)
            break;
        do_complete();
    }
    check_counters("drain");
    do_expire();
    do_expire();
    for (int i = 0; i < 200; i++)
        do_expire();
    int stuck = 0;
    for (int i = 0; i < nseg; i++)
        if (!sg[i].gone) {
            if (stuck++ < 5) {
                struct cache_block *b = cache_test_find((void *)sg[i].p);
                if (b != NULL) {
                    struct block_view v = view(b);
                    diag("segment %p (%zu) never left: block size %zu "
                         "state %d events %u outstanding %u whole %d",
                         (void *)sg[i].p, sg[i].size, v.size, (int)v.state,
                         v.events, v.outstanding, (int)v.whole);
                } else {
                    diag("segment %p (%zu) never left, no block at its start",
                         (void *)sg[i].p, sg[i].size);
                }
            }
        }
    is_int(stuck, 0, "every segment left the cache whole once all is done");
    check_counters("end");
    struct defer_device_stats d;
    defer_device_stats_get(0, &d);
    ok(d.cache_bytes == 0 && d.cache_free_bytes == 0,
       "cache_bytes %llu, cache_free_bytes %llu at the end",
       (unsigned long long)d.cache_bytes,
       (unsigned long long)d.cache_free_bytes);
    is_int(violations, 0, "no violation (seed %u, %d steps, %d entries)",
           seed, steps, nent);
    cache_destroy();
    return 0;
}
