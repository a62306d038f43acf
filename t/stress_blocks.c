/* SPDX-License-Identifier: MIT */
/*
 * stress_blocks.c — how the stress test gets, uses and frees a block of
 * defer_alloc's, with every hand-out checked; the operations built on them
 * are in stress_alloc.c (stress.h says what is shared).
 *
 * A block comes from defer_alloc or defer_pluggable_alloc on any kind of
 * stream (a created one, the per-thread stream, the legacy stream) of any
 * device.  Each hand-out is checked: the fake's oracle (no pending work of
 * another stream may still use its bytes), inside a live device allocation
 * of the stream's device (a block may be cut from a larger one), and
 * overlapping no block owned by someone else (a set of the byte ranges
 * handed out and not yet freed, across threads).  It is used by work on its
 * stream, sometimes also on a second stream recorded with
 * defer_record_stream, and freed one of the ways: on its stream (or with
 * defer_pluggable_free), on another stream of its device or on a stream of
 * another device (ordered after the work by an event, or by recording the
 * stream that used it), with defer_free_streams, or with defer_free_n
 * beside the application's cudaMalloc memory.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stress.h"

/* ---- the blocks handed out and not yet freed, across threads -------------- */

/* Blocks may be cut from one allocation (block splitting), so a block is a
 * byte range, and the live ones are sharded by the start of their
 * allocation: all that may overlap a block are in its shard. */
#define LIVE_SHARDS 64

struct live_block {
    uintptr_t lo, hi;
};

struct live_shard {
    pthread_mutex_t lock;
    struct live_block *b;
    size_t n, cap;
};

static struct live_shard live[LIVE_SHARDS];

/* See stress.h. */
void alloc_init(void)
{
    for (int i = 0; i < LIVE_SHARDS; i++)
        pthread_mutex_init(&live[i].lock, NULL);
}

/* The shard of the blocks of p's allocation (released ones are still
 * found: the fake never reuses an address; a pointer the fake never
 * allocated is its own allocation).  Any thread. */
static struct live_shard *shard_of(const void *p)
{
    void *base = NULL;
    if (fake_allocation_of(p, &base, NULL) < 0)
        base = (void *)p;
    return &live[mix64((uint64_t)(uintptr_t)base) % LIVE_SHARDS];
}

/* Any thread.  The bytes bytes at p were just handed out: false if they
 * overlap a block still live (handed out before without a free since;
 * *other gets it), else noted. */
static bool live_add(void *p, size_t bytes, struct live_block *other)
{
    struct live_shard *s = shard_of(p);
    struct live_block b = {(uintptr_t)p, (uintptr_t)p + (bytes ? bytes : 1)};
    pthread_mutex_lock(&s->lock);
    bool overlap = false;
    for (size_t i = 0; i < s->n && !overlap; i++)
        if (s->b[i].lo < b.hi && b.lo < s->b[i].hi) {
            overlap = true;
            *other = s->b[i];
        }
    if (!overlap) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 16;
            if ((s->b = realloc(s->b, s->cap * sizeof *s->b)) == NULL)
                stress_die("out of memory");
        }
        s->b[s->n++] = b;
    }
    pthread_mutex_unlock(&s->lock);
    return !overlap;
}

/* See stress.h.  A pointer that is not live is the test's mistake. */
void live_remove(void *p)
{
    struct live_shard *s = shard_of(p);
    pthread_mutex_lock(&s->lock);
    size_t i = 0;
    while (i < s->n && s->b[i].lo != (uintptr_t)p)
        i++;
    bool found = i < s->n;
    if (found)
        s->b[i] = s->b[--s->n];
    pthread_mutex_unlock(&s->lock);
    if (!found)
        stress_die("test bug: freeing block %p, which is not live", p);
}

/* ---- handing out ---------------------------------------------------------- */

/* The current device must still be the one the thread w set: after a
 * pluggable entry point (what), which must leave it as it was. */
static void device_unchanged(struct worker *w, const char *what)
{
    int now = -1;
    cuda_ok(cudaGetDevice(&now), "cudaGetDevice");
    if (now == w->cur)
        return;
    stress_fail(F_DEVICE, "thread %d: %s changed the current device from %d "
                "to %d", w->index, what, w->cur, now);
    w->cur = now;
}

/* Check the block of bytes bytes at p just handed out by what for lane l
 * (whose device is current when l is a per-thread or legacy stream):
 * the oracle's check, inside one live device allocation of l's device,
 * overlapping no block still live; counted.  Worker thread w. */
static void handout_check(struct worker *w, void *p, size_t bytes,
                          const struct lane *l, const char *what)
{
    struct cudaPointerAttributes a;
    void *base = NULL;
    size_t size = 0;
    struct live_block other;
    w->handouts++;
    fake_oracle_handout_range(p, bytes, l->h);
    int live_alloc = fake_allocation_of(p, &base, &size);
    if (live_alloc != 1 ||
        bytes > (size_t)((uintptr_t)base + size - (uintptr_t)p))
        stress_fail(F_HANDOUT, "thread %d: %s handed out %p (%zu bytes), "
                    "which is not inside a live allocation (%s)", w->index,
                    what, p, bytes, live_alloc < 0 ? "the fake never "
                    "allocated it" : live_alloc == 0 ? "its allocation was "
                    "released" : "it ends past its allocation's end");
    else if (cudaPointerGetAttributes(&a, p) != cudaSuccess ||
             a.type != cudaMemoryTypeDevice || a.device != l->dev)
        stress_fail(F_HANDOUT, "thread %d: %s handed out %p (memory type %d, "
                    "device %d) for a stream of device %d", w->index, what, p,
                    (int)a.type, a.device, l->dev);
    if (!live_add(p, bytes, &other))
        stress_fail(F_HANDOUT, "thread %d: %s handed out %p (%zu bytes), "
                    "which overlaps block %#jx (%ju bytes), handed out before "
                    "and not freed yet", w->index, what, p, bytes,
                    (uintmax_t)other.lo, (uintmax_t)(other.hi - other.lo));
}

/* See stress.h. */
void *block_get(struct worker *w, struct lane *l, size_t bytes,
                bool pluggable)
{
    void *p = NULL;
    if (pluggable) {
        if (rng_percent(&w->rng, 40))
            use_device(w, (int)rng_below(&w->rng, (uint32_t)opt.devices));
        w->pluggable++;
        p = defer_pluggable_alloc(bytes, l->dev, l->h);
        device_unchanged(w, "defer_pluggable_alloc");
    } else {
        if (l->kind != LANE_OWN)
            use_device(w, l->dev);
        cudaError_t err = defer_alloc(&p, bytes, l->h);
        if (err != cudaSuccess)
            p = NULL;
    }
    if (p == NULL) {
        stress_fail(F_REFUSED, "thread %d: %s(%zu) on a stream of kind %d "
                    "(device %d) failed", w->index, pluggable ?
                    "defer_pluggable_alloc" : "defer_alloc", bytes,
                    (int)l->kind, l->dev);
        return NULL;
    }
    if (l->kind != LANE_OWN)
        use_device(w, l->dev);
    handout_check(w, p, bytes, l,
                  pluggable ? "defer_pluggable_alloc" : "defer_alloc");
    return p;
}

/* ---- using and freeing ---------------------------------------------------- */

/* See stress.h. */
struct lane *block_use(struct worker *w, struct lane *l, void *p,
                       bool second_ok)
{
    if (l->kind != LANE_OWN)
        use_device(w, l->dev);
    unsigned works = 1 + rng_below(&w->rng, 2);
    for (unsigned i = 0; i < works; i++)
        launch(w, l, &p, 1);
    if (!second_ok || !rng_percent(&w->rng, 20))
        return NULL;
    struct lane *b = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
    if (b == l)
        return NULL;
    launch(w, b, &p, 1);
    cudaError_t err = defer_record_stream(p, b->h);
    if (err != cudaSuccess)
        stress_fail(F_REFUSED, "thread %d: defer_record_stream(%p) on a "
                    "created stream: %s", w->index, p, cudaGetErrorName(err));
    return b;
}

/* See stress.h. */
int lane_rank(const struct worker *w, const struct lane *l)
{
    if (l->kind == LANE_OWN)
        return (int)(l - w->own);
    if (l->kind == LANE_PER_THREAD)
        return opt.streams + (int)(l - w->pts);
    return -1;
}

/* See stress.h. */
struct lane *lane_on(struct worker *w, int dev, const struct lane *not,
                     bool shared_ok, int above)
{
    struct lane *c[MAX_STREAMS + 2];
    size_t n = 0;
    for (int i = 0; i < opt.streams; i++)
        if (w->own[i].dev == dev && &w->own[i] != not && i > above)
            c[n++] = &w->own[i];
    if (&w->pts[dev] != not && lane_rank(w, &w->pts[dev]) > above)
        c[n++] = &w->pts[dev];
    if (&w->legacy[dev] != not && shared_ok && -1 > above)
        c[n++] = &w->legacy[dev];
    if (n == 0) /* not was the only one */
        return (struct lane *)not;
    struct lane *l = c[rng_below(&w->rng, (uint32_t)n)];
    if (l->kind == LANE_LEGACY)
        l->h = rng_percent(&w->rng, 50) ? 0 : cudaStreamLegacy;
    return l;
}

/* See stress.h: what an application does before freeing on to what from
 * used. */
void order_after(struct worker *w, struct lane *from, struct lane *to)
{
    if (lane_rank(w, to) <= lane_rank(w, from))
        stress_die("test bug: a barrier from a lane of rank %d to one of "
                   "rank %d", lane_rank(w, from), lane_rank(w, to));
    use_device(w, from->dev);
    if (w->event[from->dev] == NULL)
        cuda_ok(cudaEventCreateWithFlags(&w->event[from->dev],
                                         cudaEventDisableTiming),
                "cudaEventCreateWithFlags");
    cuda_ok(cudaEventRecord(w->event[from->dev], from->h), "cudaEventRecord");
    use_device(w, to->dev);
    cuda_ok(cudaStreamWaitEvent(to->h, w->event[from->dev], 0),
            "cudaStreamWaitEvent");
    to->tail_known = false; /* the barrier is its tail now */
}

/* A lane of device dev (not from, if it has another) to free block p on,
 * p having been used on from.  The free waits for from through
 * defer_record_stream of from (when may_record and from is a created
 * stream: the free then waits for both; any lane, the legacy stream too
 * when shared_ok), or an event (order_after, to a lane of higher rank), or,
 * when dev has no lane above from, the thread waits for from here. */
static struct lane *free_lane(struct worker *w, void *p, struct lane *from,
                              int dev, bool may_record, bool shared_ok)
{
    struct lane *to;
    if (may_record && from->kind == LANE_OWN && rng_percent(&w->rng, 50)) {
        if ((to = lane_on(w, dev, from, shared_ok, -2)) != from) {
            cudaError_t err = defer_record_stream(p, from->h);
            if (err != cudaSuccess)
                stress_fail(F_REFUSED, "thread %d: defer_record_stream(%p) "
                            "of its own stream: %s", w->index, p,
                            cudaGetErrorName(err));
        }
        return to;
    }
    if ((to = lane_on(w, dev, from, false, lane_rank(w, from))) != from) {
        order_after(w, from, to);
        return to;
    }
    if ((to = lane_on(w, dev, from, false, -2)) != from) {
        use_device(w, from->dev);
        cuda_ok(cudaStreamSynchronize(from->h), "cudaStreamSynchronize");
    }
    return to;
}

const char *const free_way_names[NFREE_WAYS] = {
    "on its stream", "on another stream of its device",
    "on a stream of another device", "with defer_free_streams",
    "with defer_free_n"};

/* defer_free_n of f's block and sometimes plain cudaMalloc memory used on
 * `to` beside it (noted for the flush and trim checks; a recorded block
 * makes the entry wait for more than `to`). */
static cudaError_t free_n_on(struct worker *w, const struct freeing *f,
                             struct lane *to)
{
    void *ptrs[3] = {f->p, NULL, NULL};
    size_t n = 1 + rng_below(&w->rng, 3);
    if (n > 1) {
        ptrs[1] = malloc_device(random_size(w));
        launch(w, to, &ptrs[1], 1);
    }
    cudaError_t err = defer_free_n(ptrs, n, to->h);
    if (err == cudaSuccess && ptrs[1] != NULL) {
        note(w, to, ptrs[1], NULL);
        w->items[w->nitems - 1].known &= f->second == NULL;
    } else if (ptrs[1] != NULL) {
        cudaStreamSynchronize(to->h);
        cudaFree(ptrs[1]);
    }
    return err;
}

/* Free f's block the way given (or drawn; *used gets it unless NULL).
 * held: unless NULL, work is held on the free's stream first, so that the
 * free cannot complete before the caller completes *held.  Returns the
 * lane it was freed on (the first stream of defer_free_streams), or NULL
 * when it was refused (a failure).  Worker thread w; never blocks. */
struct lane *block_free(struct worker *w, const struct freeing *f,
                        enum free_way way, fake_work **held,
                        enum free_way *used)
{
    if (way == FREE_ANY)
        way = (enum free_way)rng_below(&w->rng, NFREE_WAYS);
    if (way == FREE_OTHER_DEVICE && opt.devices == 1)
        way = FREE_OTHER_STREAM;
    if (used != NULL)
        *used = way;
    struct lane *l = f->lane, *to = l;
    cudaStream_t list[4];
    size_t n = 0;
    switch (way) {
    case FREE_OTHER_STREAM:
        to = free_lane(w, f->p, l, l->dev, true, !f->unshared);
        break;
    case FREE_OTHER_DEVICE: {
        int d = (l->dev + 1 + (int)rng_below(&w->rng, (uint32_t)opt.devices - 1)) %
                opt.devices;
        to = free_lane(w, f->p, l, d, true, !f->unshared);
        break;
    }
    case FREE_STREAMS:
        if (rng_percent(&w->rng, 30))
            to = free_lane(w, f->p, l,
                           (int)rng_below(&w->rng, (uint32_t)opt.devices), true,
                           false);
        list[n++] = to->h;
        if (f->second != NULL && f->second != to && rng_percent(&w->rng, 50))
            list[n++] = f->second->h;
        for (unsigned k = rng_below(&w->rng, 3); k > 0; k--) {
            struct lane *x = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
            bool seen = false;
            for (size_t i = 0; i < n; i++)
                seen |= list[i] == x->h;
            if (!seen)
                list[n++] = x->h;
        }
        break;
    case FREE_N:
        if (rng_percent(&w->rng, 30))
            to = free_lane(w, f->p, l, l->dev, false, false);
        break;
    default:
        break;
    }
    if (to->kind != LANE_OWN)
        use_device(w, to->dev);
    if (held != NULL) {
        void *p = f->p;
        *held = fake_launch_held(to->h, &p, 1);
        to->tail = *held;
        to->tail_known = to->kind != LANE_LEGACY;
    }
    live_remove(f->p);
    cudaError_t err = cudaSuccess;
    if (way == FREE_SAME && f->pluggable) {
        /* From any current device: it names the block's. */
        if (rng_percent(&w->rng, 40))
            use_device(w, (int)rng_below(&w->rng, (uint32_t)opt.devices));
        defer_pluggable_free(f->p, f->bytes, l->dev, l->h);
        device_unchanged(w, "defer_pluggable_free");
    } else if (way == FREE_STREAMS) {
        err = defer_free_streams(f->p, list, n);
    } else if (way == FREE_N) {
        err = free_n_on(w, f, to);
    } else {
        err = defer_free(f->p, to->h);
    }
    accepted(w, err, free_way_names[way], to, f->p);
    return err == cudaSuccess ? to : NULL;
}
