/* SPDX-License-Identifier: MIT */
/*
 * fake_oracle.c — the oracle: which work uses which bytes of an
 * allocation, and the checks of every release and every hand-out.
 *
 * Why byte ranges: an allocator may cut several blocks from one
 * cudaMalloc or cudaMallocAsync allocation (cudefer's block splitting).
 * Work on one block must not make handing out a DIFFERENT block of the
 * same allocation a "premature reuse", yet a block handed out over bytes
 * that pending work still uses must be one.  So each allocation keeps the
 * blocks allocators handed out of it (fake_oracle_handout_range: a newer
 * one replaces the older ones it overlaps, which the allocator must have
 * got back to hand it out), work that uses a pointer uses the block that
 * contains it (all of the allocation when no block does), and a hand-out
 * is checked against the users whose bytes overlap its own.  A release
 * gives back the whole allocation: every user counts.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_long violation_count;

/* Record a violation: count it, remember it, print it as a TAP comment. */
void fake_violation(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fake.last_violation, sizeof fake.last_violation, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&violation_count, 1);
    printf("# fake oracle: %s\n", fake.last_violation);
    fflush(stdout);
}

/* At exit: fail the process if violations were not forgiven. */
void fake_oracle_at_exit(void)
{
    long v = atomic_load(&violation_count);

    if (v > 0) {
        fflush(stdout);
        printf("# fake oracle: %ld violation(s)\n", v);
        fflush(stdout);
        _exit(1);
    }
}

/* ---- blocks ------------------------------------------------------------ */

static int overlap(struct frange a, struct frange b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

/* Index of the first block of a that ends after p (a->nblocks if none):
 * the blocks are disjoint and sorted, so their ends are sorted too. */
static size_t first_ending_after(const struct falloc *a, uintptr_t p)
{
    size_t lo = 0, hi = a->nblocks;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (a->blocks[mid].hi <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* See fake_internal.h. */
struct frange fake_alloc_block_of(const struct falloc *a, uintptr_t p)
{
    size_t i = first_ending_after(a, p);
    struct frange whole = { a->addr, a->addr + a->size };

    if (i < a->nblocks && a->blocks[i].lo <= p)
        return a->blocks[i];
    return whole;
}

/* Note that r (inside a) was handed out: it replaces the blocks it
 * overlaps.  Lock held. */
static void block_handed_out(struct falloc *a, struct frange r)
{
    size_t i = first_ending_after(a, r.lo), j = i;

    while (j < a->nblocks && a->blocks[j].lo < r.hi)
        j++;
    if (j == i) {               /* overlaps none: make room at i */
        a->blocks = fake_grow(a->blocks, a->nblocks, &a->capblocks,
                              sizeof *a->blocks);
        memmove(&a->blocks[i + 1], &a->blocks[i],
                (a->nblocks - i) * sizeof *a->blocks);
        a->nblocks++;
    } else {                    /* replaces blocks i .. j-1 */
        memmove(&a->blocks[i + 1], &a->blocks[j],
                (a->nblocks - j) * sizeof *a->blocks);
        a->nblocks -= j - i - 1;
    }
    a->blocks[i] = r;
}

/* ---- uses ---------------------------------------------------------------- */

/* Note that w uses bytes r of a (p: the pointer named, for the message;
 * order_only: see struct fuser).  Lock held. */
static void add_user(struct falloc *a, struct fake_work *w, struct frange r,
                     const void *p, int order_only)
{
    size_t i, n;

    if (a->released) {
        fake_violation("work #%llu launched on stream id %llu uses %p, which "
                       "was already released", w->id, w->stream->id, p);
        return;
    }
    if (a->nusers == a->capusers) {     /* drop users known to be done */
        for (i = n = 0; i < a->nusers; i++)
            if (!a->users[i].w->done)
                a->users[n++] = a->users[i];
        a->nusers = n;
    }
    a->users = fake_grow(a->users, a->nusers, &a->capusers, sizeof *a->users);
    a->users[a->nusers].w = w;
    a->users[a->nusers].r = r;
    a->users[a->nusers].order_only = order_only;
    a->nusers++;
}

/* See fake_internal.h. */
void fake_alloc_ordered(struct falloc *a, struct fstream *s)
{
    if (s->tail == NULL || s->tail->done)
        return;
    add_user(a, s->tail, (struct frange){a->addr, a->addr + a->size},
             (const void *)a->addr, 1);
}

/* See fake_internal.h. */
void fake_alloc_add_use(struct fake_work *w, const void *p)
{
    struct falloc *a = fake_alloc_find(p, 0);

    if (a != NULL)
        add_user(a, w, fake_alloc_block_of(a, (uintptr_t)p), p, 0);
}

/* See fake_internal.h. */
void fake_alloc_add_use_range(struct fake_work *w, struct frange r)
{
    struct falloc *a = fake_alloc_find((const void *)r.lo, 0);

    if (a != NULL)
        add_user(a, w, r, (const void *)r.lo, 0);
}

/* ---- releases ---------------------------------------------------------- */

/* See fake_internal.h. */
void fake_oracle_release(struct falloc *a, const void *p, const char *fn,
                         struct fstream *async)
{
    struct frange whole = { a->addr, a->addr + a->size };
    int64_t now = fake_now_ns(), hint = INF_NS;
    struct fgraph *x;
    size_t i;

    for (i = 0; i < a->nusers; i++) {
        struct fake_work *u = a->users[i].w;

        if (fake_work_completed(u, now, &hint))
            continue;
        if (async == NULL && a->users[i].order_only)
            continue; /* cudaFree waits for the device */
        if (async != NULL && fake_work_ordered_before(u, async, async->tail))
            continue;
        fake_violation("premature release of %p (%s): work #%llu on stream id "
                       "%llu still pending", p, fn, u->id, u->stream->id);
        break;
    }
    if (i == a->nusers && (x = fake_graph_using(whole)) != NULL)
        fake_violation("premature release of %p (%s): %s #%llu, which uses it, "
                       "can still be launched", p, fn,
                       x->exec ? "executable graph" : "graph", x->id);
    free(a->users);
    free(a->blocks);
    a->users = NULL;
    a->blocks = NULL;
    a->nusers = a->capusers = a->nblocks = a->capblocks = 0;
}

/* ---- hand-outs ------------------------------------------------------------ */

/* The reason the work of user u would be a hazard for a block handed out
 * for stream s, or NULL if none: u has completed, or is ordered before s's
 * future work (on s itself, unless s captures, or before a barrier of s
 * from cudaStreamWaitEvent).  Lock held. */
static const char *handout_hazard(struct fake_work *u, struct fstream *s,
                                  int64_t now, int64_t *hint)
{
    if (fake_work_completed(u, now, hint))
        return NULL;
    if (s->capture != NULL)     /* captured work runs wherever the graph is
                                   launched: ordered after nothing */
        return "still pending, and the stream captures";
    if (u->stream == s || fake_work_ordered_before(u, s, s->tail))
        return NULL;
    return "still pending on another stream, not ordered before the "
           "stream's later work";
}

/* Check the bytes r of a, handed out for s (ptr: r.lo as the caller gave
 * it), against the work and graphs that use bytes of r: one violation for
 * the first hazard.  Lock held. */
static void check_handout(struct falloc *a, struct frange r, const void *ptr,
                          struct fstream *s)
{
    int64_t now = fake_now_ns(), hint = INF_NS;
    struct fgraph *x;
    size_t i;

    for (i = 0; i < a->nusers; i++) {
        struct fake_work *u = a->users[i].w;
        const char *why;

        if (!overlap(a->users[i].r, r) ||
            (why = handout_hazard(u, s, now, &hint)) == NULL)
            continue;
        fake_violation("premature reuse of %p (handed out for stream id %llu, "
                       "%zu bytes): work #%llu on stream id %llu %s (it uses "
                       "[%#jx, %#jx))", ptr, s->id, (size_t)(r.hi - r.lo),
                       u->id, u->stream->id, why,
                       (uintmax_t)a->users[i].r.lo,
                       (uintmax_t)a->users[i].r.hi);
        return;
    }
    if ((x = fake_graph_using(r)) != NULL)
        fake_violation("premature reuse of %p (handed out for stream id %llu, "
                       "%zu bytes): %s #%llu, which uses it, can still be "
                       "launched", ptr, s->id, (size_t)(r.hi - r.lo),
                       x->exec ? "executable graph" : "graph", x->id);
}

/* fake_oracle_handout_range, where rest (bytes ignored) means "from ptr to
 * the end of its allocation".  Any thread; blocks only on the lock. */
static void handout(const void *ptr, size_t bytes, int rest, cudaStream_t h)
{
    struct fstream *s;
    struct falloc *a;
    uintptr_t p = (uintptr_t)ptr;

    if (ptr == NULL)
        return;
    fake_lock();
    s = fake_stream_resolve(h);
    a = fake_alloc_find(ptr, 0);
    if (s == NULL) {
        fake_violation("fake_oracle_handout: %p handed out for %p, which is "
                       "not a live stream", ptr, (void *)h);
    } else if (a == NULL) {
        fake_violation("fake_oracle_handout: %p handed out for stream id "
                       "%llu is not in any allocation of the fake", ptr,
                       s->id);
    } else if (a->released) {
        fake_violation("premature reuse of %p (handed out for stream id "
                       "%llu): its allocation was already released", ptr,
                       s->id);
    } else if (!rest && bytes == 0) {
        fake_violation("fake_oracle_handout_range: %p handed out for stream "
                       "id %llu with 0 bytes", ptr, s->id);
    } else if (!rest && bytes > a->addr + a->size - p) {
        fake_violation("block %p of %zu bytes (handed out for stream id "
                       "%llu) ends %zu bytes past the end of its allocation "
                       "%p (%zu bytes)", ptr, bytes, s->id,
                       bytes - (size_t)(a->addr + a->size - p),
                       (void *)a->addr, a->size);
    } else {
        struct frange r = { p, rest ? a->addr + a->size : p + bytes };

        check_handout(a, r, ptr, s);
        block_handed_out(a, r);
    }
    fake_unlock();
}

/* See fake_cuda.h.  Any thread; blocks only on the fake's lock. */
void fake_oracle_handout_range(const void *ptr, size_t bytes,
                               cudaStream_t stream)
{
    handout(ptr, bytes, 0, stream);
}

/* See fake_cuda.h.  Any thread; blocks only on the fake's lock. */
void fake_oracle_handout(const void *ptr, cudaStream_t stream)
{
    handout(ptr, 0, 1, stream);
}

/* ---- queries ------------------------------------------------------------- */

/* The oracle queries of the control API (fake_cuda.h).  Any thread. */
long fake_violations(void) { return atomic_load(&violation_count); }

void fake_oracle_forgive(void) { atomic_store(&violation_count, 0); }

char *fake_last_violation(char *buf, size_t len)
{
    if (len == 0)
        return buf;
    fake_lock();
    snprintf(buf, len, "%s", fake.last_violation);
    fake_unlock();
    return buf;
}
