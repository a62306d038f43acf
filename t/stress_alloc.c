/* SPDX-License-Identifier: MIT */
/*
 * stress_alloc.c — the stress test's operations on defer_alloc's blocks
 * (how one is got, used and freed, checked, is in stress_blocks.c): a block
 * allocated, used and freed one of the ways, or kept live across
 * operations (the test owns those still kept at the end); several blocks
 * from streams of any device freed together with defer_free_n beside the
 * application's cudaMalloc memory and pinned memory given to
 * defer_free_host; a block freed on its stream behind held work, which must
 * go back to that stream at once and to no other; and wrong inputs at a low
 * rate, each with its expected result.  See stress.c for the whole test.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stress.h"

_Atomic unsigned long wrong_refused, wrong_failing;

const char *const wrong_names[NWRONG] = {
    "double free", "record on a freed block", "record cudaStreamPerThread",
    "interior pointer", "host pointer to defer_free", "zero bytes"};

/* ---- the operations --------------------------------------------------------- */

/* Free a kept block (sometimes used once more), or allocate one, use it and
 * free it a random way, or keep it. */
void op_alloc(struct worker *w)
{
    if (w->nkept > 0 && rng_percent(&w->rng, 35)) {
        int i = (int)rng_below(&w->rng, (uint32_t)w->nkept);
        struct kept_block k = w->kept[i];
        w->kept[i] = w->kept[--w->nkept];
        if (k.lane->kind != LANE_OWN)
            use_device(w, k.lane->dev);
        if (rng_percent(&w->rng, 50))
            launch(w, k.lane, &k.p, 1);
        struct freeing f = {k.p, k.bytes, k.lane, NULL, k.pluggable, false};
        block_free(w, &f, FREE_ANY, NULL, NULL);
        return;
    }
    struct lane *l = pick_lane(w);
    size_t bytes = random_size(w);
    bool pluggable = rng_percent(&w->rng, 25);
    void *p = block_get(w, l, bytes, pluggable);
    if (p == NULL)
        return;
    struct lane *second = block_use(w, l, p, true);
    if (second == NULL && w->nkept < MAX_KEPT && rng_percent(&w->rng, 10)) {
        w->kept[w->nkept++] = (struct kept_block){p, bytes, l, pluggable};
        return;
    }
    struct freeing f = {p, bytes, l, second, pluggable, false};
    block_free(w, &f, FREE_ANY, NULL, NULL);
}

void alloc_lane_closing(struct worker *w, struct lane *l)
{
    for (int i = 0; i < w->nkept;) {
        if (w->kept[i].lane != l) {
            i++;
            continue;
        }
        struct freeing f = {w->kept[i].p, w->kept[i].bytes, l, NULL,
                            w->kept[i].pluggable, false};
        w->kept[i] = w->kept[--w->nkept];
        block_free(w, &f, FREE_SAME, NULL, NULL);
    }
}

/* Several blocks (some from a created stream of any device, ordered before
 * the free), the application's cudaMalloc memory and NULLs, freed together
 * with defer_free_n (on their stream or one ordered after it); a block
 * sometimes recorded on another stream; pinned memory used by the same work
 * given to defer_free_host. */
void op_alloc_n(struct worker *w)
{
    struct lane *l = pick_lane(w), *o = NULL, *to = l;
    int rank = lane_rank(w, l); /* o must be below l, to above */
    void *p[MAX_N], *host = NULL;
    bool block[MAX_N];
    size_t n = 2 + rng_below(&w->rng, MAX_N - 1), live_ptrs = 0, nblocks = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rng_below(&w->rng, 100);
        block[i] = r < 70;
        if (r >= 55 && r < 70 && rank <= 0)
            r = 0; /* no created stream below l */
        if (r < 55) {
            p[i] = block_get(w, l, random_size(w), rng_percent(&w->rng, 20));
        } else if (r < 70) {
            if (o == NULL)
                o = &w->own[rng_below(&w->rng, (uint32_t)(rank < opt.streams
                                                        ? rank : opt.streams))];
            p[i] = block_get(w, o, random_size(w), rng_percent(&w->rng, 20));
            if (p[i] != NULL)
                launch(w, o, &p[i], 1);
        } else {
            p[i] = r < 88 ? malloc_device(random_size(w)) : NULL;
        }
        live_ptrs += p[i] != NULL;
        nblocks += block[i] && p[i] != NULL;
    }
    if (l->kind != LANE_OWN)
        use_device(w, l->dev);
    launch(w, l, p, n);
    if (rng_percent(&w->rng, 30))
        launch(w, l, p, (n + 1) / 2);
    bool grouped = false, any_device = false;
    if (rng_percent(&w->rng, 20)) { /* a block also used on another stream */
        /* A created stream of this thread, or a third of the time the
         * legacy stream of a device (recorded with that device current);
         * the free then runs with any device current, as PyTorch's may:
         * it must wait for that device's legacy stream (cache_users_enter). */
        bool legacy = rng_percent(&w->rng, 33);
        struct lane *b =
            legacy ? &w->legacy[rng_below(&w->rng, (uint32_t)opt.devices)]
                   : &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
        for (size_t i = 0; i < n && !grouped && b != l; i++) {
            if (!block[i] || p[i] == NULL)
                continue;
            if (legacy)
                use_device(w, b->dev);
            launch(w, b, &p[i], 1);
            cudaError_t err = defer_record_stream(p[i], b->h);
            if (err != cudaSuccess)
                stress_fail(F_REFUSED, "thread %d: defer_record_stream(%p): %s",
                            w->index, p[i], cudaGetErrorName(err));
            grouped = true;
        }
        if (legacy) /* l's own device again: its launches below use it */
            use_device(w, l->dev);
        any_device = legacy;
    }
    if (rng_percent(&w->rng, 30)) {
        cudaError_t err = cudaMallocHost(&host, random_size(w));
        if (err != cudaSuccess)
            stress_die("cudaMallocHost: %s", cudaGetErrorName(err));
        launch(w, l, &host, 1);
    }
    if (o != NULL)
        order_after(w, o, l);
    if (rng_percent(&w->rng, 20)) { /* freed on a stream ordered after l */
        to = lane_on(w, (int)rng_below(&w->rng, (uint32_t)opt.devices), l,
                     false, rank);
        if (to != l)
            order_after(w, l, to);
    }
    if (to->kind != LANE_OWN)
        use_device(w, to->dev);
    else if (any_device) /* a created stream's free: any device current */
        use_device(w, (int)rng_below(&w->rng, (uint32_t)opt.devices));
    for (size_t i = 0; i < n; i++)
        if (block[i] && p[i] != NULL)
            live_remove(p[i]);
    cudaError_t err = defer_free_n(p, n, to->h);
    if (err != cudaSuccess)
        stress_fail(F_REFUSED, "thread %d: defer_free_n(%zu pointers, %zu "
                    "blocks): %s", w->index, n, nblocks,
                    cudaGetErrorName(err));
    else if (live_ptrs > 0)
        w->deferred++;
    for (size_t i = 0; i < n && err == cudaSuccess; i++)
        if (!block[i] && p[i] != NULL) {
            note(w, to, p[i], NULL);
            w->items[w->nitems - 1].known &= !grouped;
        }
    if (host == NULL)
        return;
    err = defer_free_host(host, to->h);
    accepted(w, err, "defer_free_host (beside blocks)", to, host);
    if (err == cudaSuccess) {
        note(w, to, host, NULL);
    } else {
        cudaStreamSynchronize(to->h);
        cudaFreeHost(host);
    }
}

/* ---- a block freed behind held work ----------------------------------------- */

/* The size of the thread's held-work blocks: a size class of its own band,
 * 16 bands from 2 MiB to 28 MiB, 4 classes apart (so a request of one can
 * take no block of another: at most 1/8 above it) and far above what the
 * other operations ask for.  Every block of the band has that size. */
static size_t band_size(const struct worker *w)
{
    int j = w->index % 16;
    size_t base = (size_t)1 << (21 + j / 4);
    return base + (size_t)(j % 4) * 4 * (base / 16);
}

static struct band_block *band_find(struct worker *w, const void *p)
{
    for (size_t i = 0; i < w->nband; i++)
        if (w->band[i].p == p)
            return &w->band[i];
    return NULL;
}

/* A band block p was freed on l (the thread owns p until then).  Not
 * noted with block splitting, where op_alloc_held does not look. */
static void band_freed(struct worker *w, void *p, const struct lane *l)
{
    if (cfg.split_min != 0)
        return;
    struct band_block *b = band_find(w, p);
    if (b == NULL && w->nband == MAX_BAND) { /* forget the released ones */
        size_t kept = 0;
        for (size_t i = 0; i < w->nband; i++)
            if (fake_serial_released(w->band[i].serial) != 1)
                w->band[kept++] = w->band[i]; /* by identity: the address
                                                 may be another's by now */
        w->nband = kept;
        if (kept == MAX_BAND)
            stress_die("test limit: thread %d has %d blocks of its own size",
                       w->index, MAX_BAND);
    }
    if (b == NULL)
        b = &w->band[w->nband++];
    /* Its allocation is live (the cache holds the block behind the
     * thread's own work): the serial is exact. */
    *b = (struct band_block){p, fake_allocation_serial(p), l, l->h};
}

/* A block freed on a stream only this thread uses (a created one, or its
 * per-thread stream) while work held there still uses it: requests of its
 * size on other streams of its device must not get any of its bytes; a
 * request on its own stream must get a block freed on that stream (it, or
 * an older one), no fresh one and none of another stream.  With block
 * splitting that last check is left to the oracle: the block may have
 * merged with its neighbours freed on the stream, and the request then
 * gets a piece of that, or of free memory of any stream (whose work is
 * done), or a fresh block when it is too small to be cut. */
void op_alloc_held(struct worker *w)
{
    struct lane *l = rng_percent(&w->rng, 70)
        ? &w->own[rng_below(&w->rng, (uint32_t)opt.streams)]
        : &w->pts[rng_below(&w->rng, (uint32_t)opt.devices)];
    size_t size = band_size(w);
    void *p = block_get(w, l, size, false);
    if (p == NULL)
        return;
    block_use(w, l, p, false);
    fake_work *held = NULL;
    struct freeing f = {p, size, l, NULL, rng_percent(&w->rng, 30), false};
    if (block_free(w, &f, FREE_SAME, &held, NULL) == NULL) {
        fake_complete(held); /* launched before the free */
        return;
    }
    band_freed(w, p, l);
    w->held_frees++;
    struct freeing others[2];
    unsigned nothers = 1 + rng_below(&w->rng, 2);
    for (unsigned i = 0; i < nothers; i++) {
        struct lane *o = lane_on(w, l->dev, l, true, -2);
        bool pluggable = rng_percent(&w->rng, 20);
        void *q = block_get(w, o, size, pluggable);
        if (q != NULL && (char *)q < (char *)p + size &&
            (char *)p < (char *)q + size)
            stress_fail(F_REUSE, "thread %d: block %p, freed on a stream "
                        "behind held work, was handed to another stream of "
                        "device %d (as %p)", w->index, p, l->dev, q);
        others[i] = (struct freeing){q, size, o, NULL, pluggable, false};
        if (q != NULL)
            block_use(w, o, q, false);
    }
    void *q = block_get(w, l, size, false);
    if (q != NULL && cfg.split_min == 0) {
        struct band_block *b = band_find(w, q);
        if (b == NULL || b->lane != l || b->h != l->h ||
            b->serial != fake_allocation_serial(q)) /* not a new one there */
            stress_fail(F_REUSE, "thread %d: a request on the stream where "
                        "block %p waits behind held work got %p, which was "
                        "not freed on that stream", w->index, p, q);
    }
    if (q != NULL)
        block_use(w, l, q, false); /* runs after the held work */
    fake_complete(held);
    if (q != NULL) {
        f.p = q;
        f.pluggable = false;
        if (block_free(w, &f, FREE_SAME, NULL, NULL) != NULL)
            band_freed(w, q, l);
    }
    for (unsigned i = 0; i < nothers; i++)
        if (others[i].p != NULL &&
            block_free(w, &others[i], FREE_SAME, NULL, NULL) != NULL)
            band_freed(w, others[i].p, others[i].lane);
}

/* ---- wrong inputs ------------------------------------------------------------ */

/* A refusal with want was expected of what, given p (freed how, when not
 * NULL; a defer call of one entry when entry). */
static void expect_refused_with(struct worker *w, cudaError_t err,
                                cudaError_t want, const char *what,
                                const void *p, const char *how, bool entry)
{
    if (err == want) {
        atomic_fetch_add(&wrong_refused, 1);
        return;
    }
    stress_fail(F_WRONG, "thread %d: %s %p%s%s returned %s, not %s",
                w->index, what, p, how != NULL ? ", freed " : "",
                how != NULL ? how : "", cudaGetErrorName(err),
                cudaGetErrorName(want));
    if (err == cudaSuccess && entry)
        w->deferred++; /* an entry after all: the counters agree */
}

/* A refusal with cudaErrorInvalidValue (not the caller's to give). */
static void expect_refused(struct worker *w, cudaError_t err, const char *what,
                           const void *p, const char *how, bool entry)
{
    expect_refused_with(w, err, cudaErrorInvalidValue, what, p, how, entry);
}

/* A freed block given again to defer_free (twice), or to
 * defer_record_stream, after any way of freeing it (used on a second
 * stream or not).  The block is freed on streams no other thread uses
 * (l must be one), and work held on the free's stream keeps it from
 * completing: no other thread can have it by then, so a second free is a
 * double free (not another owner's free). */
static void wrong_after_free(struct worker *w, struct lane *l, bool twice)
{
    void *p = block_get(w, l, random_size(w), rng_percent(&w->rng, 25));
    if (p == NULL)
        return;
    struct lane *second = block_use(w, l, p, true);
    fake_work *held = NULL;
    enum free_way way;
    struct freeing f = {p, 0, l, second, false, true};
    struct lane *to = block_free(w, &f, FREE_ANY, &held, &way);
    const char *how = free_way_names[way];
    if (to != NULL && twice) {
        struct lane *x = rng_percent(&w->rng, 50) ? to : l;
        if (x->kind != LANE_OWN)
            use_device(w, x->dev);
        expect_refused(w, defer_free(p, x->h), "a second defer_free of block",
                       p, how, true);
    } else if (to != NULL) {
        struct lane *b = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
        expect_refused(w, defer_record_stream(p, b->h),
                       "defer_record_stream of block", p, how, false);
    }
    if (held != NULL)
        fake_complete(held);
}

/* An interior pointer of a block: defer_record_stream refuses it, and so
 * does defer_free at the call (it lies in the block cache's memory where
 * no block starts; or, with block splitting, a part merged into the block
 * is still filed there, a second free of it: MERGED in src/cache.h); then
 * the block is freed. */
static void wrong_interior(struct worker *w, struct lane *l)
{
    size_t bytes = 1024 + random_size(w);
    void *p = block_get(w, l, bytes, false);
    if (p == NULL)
        return;
    block_use(w, l, p, false);
    char *inside = (char *)p + 256 * (1 + rng_below(&w->rng,
                                                    (uint32_t)(bytes - 1) / 256));
    struct lane *b = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
    expect_refused(w, defer_record_stream(inside, b->h),
                   "defer_record_stream of interior pointer", inside, NULL,
                   false);
    if (l->kind != LANE_OWN)
        use_device(w, l->dev);
    expect_refused(w, defer_free(inside, l->h), "defer_free of interior pointer",
                   inside, NULL, true);
    struct freeing f = {p, bytes, l, NULL, false, false};
    block_free(w, &f, FREE_ANY, NULL, NULL);
}

/* Pinned memory given to defer_free by mistake: accepted, its release fails
 * (reported); the thread frees it after its next flush. */
static void wrong_host(struct worker *w, struct lane *l)
{
    void *h = NULL;
    cudaError_t err = cudaMallocHost(&h, random_size(w));
    if (err != cudaSuccess)
        stress_die("cudaMallocHost: %s", cudaGetErrorName(err));
    launch(w, l, &h, 1);
    atomic_fetch_add(&wrong_failing, 1);
    err = defer_free(h, l->h);
    if (err == cudaSuccess) {
        w->deferred++;
        w->mistaken[w->nmistaken++] = h;
        return;
    }
    atomic_fetch_sub(&wrong_failing, 1);
    stress_fail(F_WRONG, "thread %d: defer_free of host pointer %p returned "
                "%s, not cudaSuccess", w->index, h, cudaGetErrorName(err));
    cudaStreamSynchronize(l->h);
    cudaFreeHost(h);
}

void op_alloc_wrong(struct worker *w)
{
    enum wrong_input k = (enum wrong_input)rng_below(&w->rng, NWRONG);
    if (k == WRONG_HOST_TO_DEFER_FREE && w->nmistaken == MAX_MISTAKEN)
        k = WRONG_ZERO_BYTES;
    w->wrong[k]++;
    struct lane *l = pick_lane(w);
    if ((k == WRONG_DOUBLE_FREE || k == WRONG_RECORD_FREED) &&
        l->kind == LANE_LEGACY)
        l = &w->pts[l->dev]; /* a stream no other thread uses */
    switch (k) {
    case WRONG_DOUBLE_FREE:
        wrong_after_free(w, l, true);
        break;
    case WRONG_RECORD_FREED:
        wrong_after_free(w, l, false);
        break;
    case WRONG_RECORD_PER_THREAD: {
        void *p = block_get(w, l, random_size(w), false);
        if (p == NULL)
            break;
        block_use(w, l, p, false);
        expect_refused_with(w, defer_record_stream(p, cudaStreamPerThread),
                            cudaErrorNotSupported,
                            "defer_record_stream(cudaStreamPerThread) of "
                            "block", p, NULL, false);
        struct freeing f = {p, 0, l, NULL, false, false};
        block_free(w, &f, FREE_ANY, NULL, NULL);
        break;
    }
    case WRONG_INTERIOR:
        wrong_interior(w, l);
        break;
    case WRONG_HOST_TO_DEFER_FREE:
        wrong_host(w, l);
        break;
    case WRONG_ZERO_BYTES: {
        void *p = &w->rng;
        cudaError_t err = defer_alloc(&p, 0, l->h);
        if (err != cudaSuccess || p != NULL)
            stress_fail(F_WRONG, "thread %d: defer_alloc of 0 bytes returned "
                        "%s and %p, not cudaSuccess and NULL", w->index,
                        cudaGetErrorName(err), p);
        break;
    }
    case NWRONG:
        break;
    }
}

void alloc_after_flush(struct worker *w)
{
    for (size_t i = 0; i < w->nmistaken; i++)
        cuda_ok(cudaFreeHost(w->mistaken[i]), "cudaFreeHost");
    w->nmistaken = 0;
}

