/* SPDX-License-Identifier: MIT */
/*
 * stress_worker.c — a stress-test thread: the operations it draws from its
 * seeded sequence (defer_free of device, pinned and pool memory, defer_free_n,
 * defer_call, cross-stream frees, trims, flushes, quiet moments, short-lived
 * threads; the operations on defer_alloc's blocks are in stress_alloc.c),
 * the bookkeeping of what it deferred, and the checks that each flush and
 * trim released what it must and that callbacks ran once, in order, never
 * early.  See stress.c for the whole test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* LANE_EVENTS and LANE_SHARE_CALLBACKS, from the library's header, whose
 * struct lane is not the test's: taken in under another name. */
#define lane cudefer_stream_lane
#include "stream_lane.h"
#undef lane
#include "stress.h"


/* A CUDA call of the test's own failed: a failure.  Anyone. */
void cuda_ok(cudaError_t err, const char *what)
{
    if (err != cudaSuccess)
        stress_fail(F_CUDA, "%s: %s", what, cudaGetErrorName(err));
}

static struct order *order_new(struct worker *w)
{
    struct order *o = calloc(1, sizeof *o);
    if (o == NULL)
        stress_die("out of memory");
    o->next = w->orders;
    w->orders = o;
    return o;
}

/* Make dev the thread's current device.  Worker thread w. */
void use_device(struct worker *w, int dev)
{
    if (w->cur == dev)
        return;
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    w->cur = dev;
}

static void own_stream_new(struct worker *w, struct lane *l, int dev)
{
    use_device(w, dev);
    l->kind = LANE_OWN;
    l->dev = dev;
    l->tail = NULL;
    l->tail_known = true;
    l->order = order_new(w);
    cuda_ok(cudaStreamCreateWithFlags(&l->h, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
}

/* ---- the operations -------------------------------------------------------- */

static unsigned duration_us(struct worker *w)
{
    return rng_percent(&w->rng, 25) ? 0 : 1 + rng_below(&w->rng, MAX_DURATION_US);
}

/* 16 B .. 512 KiB, from w's sequence. */
size_t random_size(struct worker *w)
{
    unsigned bits = 4 + rng_below(&w->rng, 15); /* 16 B .. 512 KiB */
    return ((size_t)1 << bits) + rng_below(&w->rng, 1u << bits);
}

/* A stream to defer on: one of the thread's own streams (usually with its
 * device made current, as real code does), or the per-thread or legacy
 * stream of a random device (made current: that is what they name). */
struct lane *pick_lane(struct worker *w)
{
    uint32_t r = rng_below(&w->rng, 100);
    if (r < 58) {
        struct lane *l = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
        if (rng_percent(&w->rng, 85))
            use_device(w, l->dev);
        return l;
    }
    int d = (int)rng_below(&w->rng, (uint32_t)opt.devices);
    use_device(w, d);
    if (r < 88)
        return &w->pts[d];
    struct lane *l = &w->legacy[d];
    l->h = rng_percent(&w->rng, 50) ? 0 : cudaStreamLegacy;
    return l;
}

/* Work on l that uses the n allocations in uses. */
fake_work *launch(struct worker *w, struct lane *l, void *const *uses,
                  size_t n)
{
    fake_work *x = fake_launch(l->h, duration_us(w), uses, n);
    if (x == NULL)
        stress_die("fake_launch on an invalid stream (thread %d, lane kind %d)",
                   w->index, (int)l->kind);
    l->tail = x;
    l->tail_known = l->kind != LANE_LEGACY;
    return x;
}

/* cudaMalloc, or bail.  Anyone. */
void *malloc_device(size_t size)
{
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, size);
    if (err != cudaSuccess)
        stress_die("cudaMalloc(%zu): %s", size, cudaGetErrorName(err));
    return p;
}

/* Remember an entry just deferred on l, for the flush and trim checks. */
void note(struct worker *w, const struct lane *l, void *p, struct call *c)
{
    struct item *it = &w->items[w->nitems++];
    it->p = p;
    it->serial = p != NULL ? fake_my_allocation_serial(p) : 0;
    it->call = c;
    it->captured = l->tail;
    it->known = l->tail_known;
    it->verified = false;
    it->due = false;
}

/* A defer call of one entry returned err: counted, or a failure. */
void accepted(struct worker *w, cudaError_t err, const char *what,
              const struct lane *l, const void *p)
{
    if (err == cudaSuccess) {
        w->deferred++;
        return;
    }
    stress_fail(F_REFUSED,
                "thread %d: %s(%p) on a stream of kind %d (device %d): %s",
                w->index, what, p, (int)l->kind, l->dev, cudaGetErrorName(err));
}

/* A refused buffer is still the caller's: wait for its work and free it, as
 * an application would (if cudefer kept it after all, the oracle sees a
 * double release). */
static void free_refused(const struct lane *l, void *const *p, size_t n,
                         bool host)
{
    cudaStreamSynchronize(l->h);
    for (size_t i = 0; i < n; i++)
        if (p[i] != NULL)
            (void)(host ? cudaFreeHost(p[i]) : cudaFree(p[i]));
}

static void op_free_device(struct worker *w)
{
    struct lane *l = pick_lane(w);
    void *p = malloc_device(random_size(w));
    unsigned works = 1 + rng_below(&w->rng, 2);
    for (unsigned i = 0; i < works; i++)
        launch(w, l, &p, 1);
    cudaError_t err = defer_free(p, l->h);
    accepted(w, err, "defer_free", l, p);
    if (err == cudaSuccess)
        note(w, l, p, NULL);
    else
        free_refused(l, &p, 1, false);
}

static void op_free_host(struct worker *w)
{
    struct lane *l = pick_lane(w);
    void *p = NULL;
    cudaError_t err = cudaMallocHost(&p, random_size(w));
    if (err != cudaSuccess)
        stress_die("cudaMallocHost: %s", cudaGetErrorName(err));
    launch(w, l, &p, 1);
    err = defer_free_host(p, l->h);
    accepted(w, err, "defer_free_host", l, p);
    if (err == cudaSuccess)
        note(w, l, p, NULL);
    else
        free_refused(l, &p, 1, true);
}

static void op_free_pool(struct worker *w)
{
    struct lane *l = pick_lane(w);
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, random_size(w), l->h);
    if (err != cudaSuccess)
        stress_die("cudaMallocAsync: %s", cudaGetErrorName(err));
    launch(w, l, &p, 1);
    err = defer_free(p, l->h);
    accepted(w, err, "defer_free (pool)", l, p);
    if (err == cudaSuccess)
        note(w, l, p, NULL);
    else
        free_refused(l, &p, 1, false);
}

static void op_free_n(struct worker *w)
{
    struct lane *l = pick_lane(w);
    void *p[MAX_N];
    size_t n = 1 + rng_below(&w->rng, MAX_N), live = 0;
    for (size_t i = 0; i < n; i++) {
        p[i] = rng_percent(&w->rng, 12) ? NULL : malloc_device(random_size(w));
        live += p[i] != NULL;
    }
    /* One work using them all, sometimes another using the first half. */
    launch(w, l, p, n);
    if (rng_percent(&w->rng, 30))
        launch(w, l, p, (n + 1) / 2);
    cudaError_t err = defer_free_n(p, n, l->h);
    if (err != cudaSuccess) {
        stress_fail(F_REFUSED,
                    "thread %d: defer_free_n(%zu pointers, %zu live): %s",
                    w->index, n, live, cudaGetErrorName(err));
        free_refused(l, p, n, false);
        return;
    }
    if (live == 0)
        return; /* nothing to defer: no entry */
    w->deferred++;
    for (size_t i = 0; i < n; i++)
        if (p[i] != NULL)
            note(w, l, p[i], NULL);
}

/* The callback: it ran once, after its work, in order; it may switch the
 * reclaimer's device, defer a buffer itself, or try a (refused) flush. */
static void on_call(void *arg)
{
    struct call *c = arg;
    atomic_fetch_add(&calls_run, 1);
    if (atomic_fetch_add(&c->ran, 1) != 0) {
        stress_fail(F_CALL_TWICE,
                    "callback %p (seq %" PRIu64 ") ran again", arg,
                    c->seq);
        return;
    }
    if (c->waited != NULL && !fake_work_done(c->waited))
        stress_fail(F_CALL_EARLY,
                    "callback (seq %" PRIu64 ") ran before work #%llu "
                    "completed", c->seq, fake_work_id(c->waited));
    uint64_t prev = atomic_exchange(&c->order->last, c->seq);
    if (prev >= c->seq)
        stress_fail(F_CALL_ORDER,
                    "callback seq %" PRIu64 " ran after seq %" PRIu64
                    " of the same stream", c->seq, prev);
    if (c->set_device >= 0)
        cuda_ok(cudaSetDevice(c->set_device), "cudaSetDevice in a callback");
    if (c->nested != NULL) {
        cuda_ok(cudaSetDevice(c->nested_device), "cudaSetDevice in a callback");
        cudaError_t err = defer_free(c->nested, cudaStreamPerThread);
        if (err == cudaSuccess)
            atomic_fetch_add(&nested_deferred, 1);
        else
            stress_fail(F_IN_CALLBACK,
                        "defer_free(%p) in a callback: %s", c->nested,
                        cudaGetErrorName(err));
    }
    if (c->try_flush) {
        cudaError_t err = defer_flush();
        if (err != cudaErrorNotPermitted)
            stress_fail(F_IN_CALLBACK,
                        "defer_flush in a callback returned %s, not "
                        "cudaErrorNotPermitted", cudaGetErrorName(err));
        else /* a refusal: counted in rejected */
            atomic_fetch_add(&wrong_refused, 1);
    }
}

static struct call *call_new(struct worker *w)
{
    struct call *c = w->free_calls;
    if (c != NULL)
        w->free_calls = c->next_free;
    else if ((c = malloc(sizeof *c)) == NULL)
        stress_die("out of memory");
    memset(c, 0, sizeof *c);
    atomic_init(&c->ran, 0);
    return c;
}

static void call_recycle(struct worker *w, struct call *c)
{
    c->next_free = w->free_calls;
    w->free_calls = c;
}

static void op_call(struct worker *w)
{
    struct lane *l = pick_lane(w);
    struct call *c = call_new(w);
    c->set_device = rng_percent(&w->rng, 10) ? w->cur : -1;
    c->nested = NULL;
    if (rng_percent(&w->rng, 12)) {
        c->nested = malloc_device(random_size(w));
        c->nested_device = w->cur;
        launch(w, l, &c->nested, 1);
    } else if (rng_percent(&w->rng, 70)) {
        launch(w, l, NULL, 0);
    }
    /* The work it must wait for: what the event captures on a stream of
     * this thread's own, else at least the thread's last work there. */
    c->waited = l->tail;
    c->order = l->order;
    c->seq = ++w->seq;
    c->try_flush = w->index == 0 && w->calls == 0;
    w->calls++;
    (void)fake_take_last_recorded();
    cudaError_t err = defer_call(on_call, c, l->h);
    c->ev = err == cudaSuccess ? fake_take_last_recorded() : NULL;
    accepted(w, err, "defer_call", l, c);
    if (err == cudaSuccess) {
        note(w, l, NULL, c);
    } else {
        free_refused(l, &c->nested, 1, false);
        call_recycle(w, c);
    }
}

/* A buffer used by work on one stream, freed on another that waits for it
 * with an event: only the event recorded by defer_free knows. */
static void op_cross(struct worker *w)
{
    struct lane *b = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
    use_device(w, b->dev);
    void *p = malloc_device(random_size(w));
    launch(w, b, &p, 1);
    struct lane *s = &w->pts[b->dev];
    uint32_t k = rng_below(&w->rng, (uint32_t)opt.streams);
    if (w->own[k].dev == b->dev && &w->own[k] > b) /* of higher rank */
        s = &w->own[k];
    if (w->event[b->dev] == NULL)
        cuda_ok(cudaEventCreateWithFlags(&w->event[b->dev],
                                         cudaEventDisableTiming),
                "cudaEventCreateWithFlags");
    cuda_ok(cudaEventRecord(w->event[b->dev], b->h), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(s->h, w->event[b->dev], 0),
            "cudaStreamWaitEvent");
    s->tail_known = false; /* the barrier is its tail now */
    if (rng_percent(&w->rng, 50))
        launch(w, s, &p, 1);
    cudaError_t err = defer_free(p, s->h);
    accepted(w, err, "defer_free (cross-stream)", s, p);
    if (err == cudaSuccess)
        note(w, s, p, NULL);
    else
        free_refused(s, &p, 1, false);
}

/* Calls that defer nothing. */
static void op_nothing(struct worker *w)
{
    struct lane *l = pick_lane(w);
    void *none[2] = {NULL, NULL};
    if (defer_free(NULL, l->h) != cudaSuccess ||
        defer_free_host(NULL, l->h) != cudaSuccess ||
        defer_free_n(none, 0, l->h) != cudaSuccess ||
        defer_free_n(none, 2, l->h) != cudaSuccess)
        stress_fail(F_REFUSED, "thread %d: a call with nothing to defer failed",
                    w->index);
}

static void op_set_device(struct worker *w)
{
    use_device(w, (int)rng_below(&w->rng, (uint32_t)opt.devices));
}

/* defer_flush, then everything this thread deferred before it must be
 * released, every callback run once.  (Blocks of defer_alloc's go back to
 * the cache, not to cudaFree: stress_alloc.c checks them as they come
 * back.) */
static void flush_check(struct worker *w)
{
    /* A wrong input's failing release (another thread's, maybe) is no
     * error of the flush: only a failed device's would be. */
    cudaError_t err = defer_flush();
    w->flushes++;
    if (err == cudaSuccess)
        alloc_after_flush(w);
    else
        stress_fail(F_FLUSH_ERROR, "thread %d: defer_flush: %s", w->index,
                    cudaGetErrorName(err));
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        if (it->call != NULL) {
            int ran = atomic_load(&it->call->ran);
            if (ran == 1)
                call_recycle(w, it->call);
            else if (ran == 0) /* kept: it may still run */
                stress_fail(F_FLUSH_LEFT, "thread %d: callback seq %" PRIu64
                            " had not run when defer_flush returned", w->index,
                            it->call->seq);
        } else if (fake_serial_released(it->serial) != 1) {
            stress_fail(F_FLUSH_LEFT,
                        "thread %d: %p not released when defer_flush "
                        "returned (work #%llu)", w->index, it->p,
                        fake_work_id(it->captured));
        }
    }
    w->flush_checked += w->nitems;
    w->nitems = 0;
}

/* Whether the record made after it item's work may be pending. */
static bool record_may_be_pending(const struct item *it)
{
    return !it->known ||
           (it->captured != NULL && !fake_work_done(it->captured));
}

/* Marks the callbacks that may wait past their own work (due false): a
 * callback that shares an event runs once the event's newest record
 * completes (include/cudefer.h: a thread's callbacks on a stream record its
 * lane's newest event again when 8 are pending or no idle event is at
 * hand), the record of a later callback of this thread on the same stream.
 * The fake says which event each defer_call recorded (struct call's ev), so
 * a callback is exempt from the trim check exactly while a later item
 * recorded its event again and that record may be pending.  Memory entries
 * are never exempt: they wait in FIFOs apart from callbacks.  One pass,
 * newest first, collecting the events with a record that may be pending
 * (a thread has at most LANE_EVENTS a stream it defers on).  Then, oldest
 * first: callbacks run in order per stream, so one behind such a callback
 * on its stream may wait as long (one with an event of its own, taken
 * while its lane was full and a flush waited, behind one whose event a
 * later callback recorded again: before, about one run in 20-50 of
 * 300,000 entries, two at a time, failed so, each stuck callback's event
 * complete and an earlier callback of its stream waiting). */
static void call_may_wait_all(struct worker *w)
{
    if (!LANE_SHARE_CALLBACKS)
        return;
    size_t n = 0;
    for (size_t i = w->nitems; i-- > 0;) {
        struct item *it = &w->items[i];
        it->may_wait = false;
        cudaEvent_t ev = it->call != NULL ? it->call->ev : NULL;
        if (ev == NULL)
            continue;
        bool later = false;
        for (size_t k = 0; k < n && !later; k++)
            later = w->pending_events[k] == ev;
        it->may_wait = later;
        if (it->due && later) {
            it->due = false;
            w->trim_exempt++;
        }
        if (!later && record_may_be_pending(it))
            w->pending_events[n++] = ev; /* at most one per item */
    }
    size_t m = 0; /* streams with a callback that may wait */
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        if (it->call == NULL)
            continue;
        bool behind = false;
        for (size_t k = 0; k < m && !behind; k++)
            behind = w->waiting_orders[k] == it->call->order;
        if (behind && it->due) {
            it->due = false;
            w->trim_exempt++;
        }
        if (!behind && it->may_wait)
            w->waiting_orders[m++] = it->call->order;
    }
}

/* defer_trim releases every entry whose work completed before it: those of
 * streams only this thread uses, where the captured work is known; but for
 * callbacks that may share an event (call_may_wait_all). */
static void trim_check(struct worker *w)
{
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        it->due = !it->verified && !record_may_be_pending(it);
    }
    call_may_wait_all(w);
    size_t bytes = 0;
    cudaError_t err = defer_trim(&bytes);
    w->trims++;
    if (err != cudaSuccess)
        stress_fail(F_FLUSH_ERROR, "thread %d: defer_trim: %s", w->index,
                    cudaGetErrorName(err));
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        if (!it->due)
            continue;
        w->trim_checked++;
        bool done = it->call != NULL ? atomic_load(&it->call->ran) >= 1
                                     : fake_serial_released(it->serial) == 1;
        if (done)
            it->verified = true;
        else
            stress_fail(F_TRIM_LEFT, "thread %d: %s %p still pending after "
                        "defer_trim, though its work #%llu had completed "
                        "before",
                        w->index, it->call != NULL ? "callback" : "buffer",
                        it->call != NULL ? (void *)it->call : it->p,
                        fake_work_id(it->captured));
    }
}

/* Destroy one of the thread's streams (its work and entries still
 * complete) and create another in its place. */
static void op_recycle_stream(struct worker *w)
{
    struct lane *l = &w->own[rng_below(&w->rng, (uint32_t)opt.streams)];
    alloc_lane_closing(w, l);
    cuda_ok(cudaStreamDestroy(l->h), "cudaStreamDestroy");
    own_stream_new(w, l, (int)rng_below(&w->rng, (uint32_t)opt.devices));
}

/* A quiet moment: every other thread pauses (before its next operation),
 * this one waits until all work has completed, then lets the reclaimer see
 * the application quiet for longer than the idle time, so that idle-time
 * releases happen (and are cut short when the threads are back). */
static void op_lull(struct worker *w)
{
    int64_t quiet_ns = 1000 * ((int64_t)cfg.idle_us + cfg.poll_max_us + 500 +
                               rng_below(&w->rng, 3000));
    int idle = 0;
    if (!atomic_compare_exchange_strong(&lull, &idle, 1))
        return; /* another thread's lull is under way */
    sleep_ns(200000);
    for (int d = 0; d < opt.devices; d++) {
        use_device(w, d);
        cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    sleep_ns(quiet_ns);
    atomic_store(&lull, 0);
}

/* A short-lived thread: a few entries on its per-thread stream, then it
 * exits at once, with its entries pending (and its cached events in
 * cudefer's per-thread cache).  Its parent waits for it, so they count as
 * the parent's for the flush and trim checks. */
struct helper {
    struct worker *w;
    int dev;
    unsigned n;
};

static void *helper_main(void *arg)
{
    struct helper *h = arg;
    struct worker *w = h->w; /* blocked in pthread_join meanwhile */
    cuda_ok(cudaSetDevice(h->dev), "cudaSetDevice");
    struct lane l = {.kind = LANE_PER_THREAD, .h = cudaStreamPerThread,
                     .dev = h->dev, .tail_known = true, .order = order_new(w)};
    for (unsigned i = 0; i < h->n; i++) {
        void *p = NULL;
        bool host = rng_percent(&w->rng, 25);
        cudaError_t err = host ? cudaMallocHost(&p, random_size(w))
                               : cudaMalloc(&p, random_size(w));
        if (err != cudaSuccess)
            stress_die("allocation in a short-lived thread: %s",
                       cudaGetErrorName(err));
        launch(w, &l, &p, 1);
        err = host ? defer_free_host(p, l.h) : defer_free(p, l.h);
        accepted(w, err, "defer_free (short-lived thread)", &l, p);
        if (err == cudaSuccess)
            note(w, &l, p, NULL);
        else
            free_refused(&l, &p, 1, host);
    }
    return NULL;
}

static void op_spawn(struct worker *w)
{
    struct helper h = {w, (int)rng_below(&w->rng, (uint32_t)opt.devices),
                       1 + rng_below(&w->rng, MAX_HELPER_ENTRIES)};
    pthread_t t;
    if (pthread_create(&t, NULL, helper_main, &h) != 0)
        stress_die("pthread_create");
    pthread_join(t, NULL);
}

const char *const op_names[NOPS] = {
    "free", "free_host", "free_pool", "free_n", "call", "cross", "nothing",
    "set_device", "trim", "flush", "recycle_stream", "lull", "spawn", "alloc",
    "alloc_n", "alloc_held", "alloc_wrong"};

/* Weights out of 100 000; trim and flush from the seed, set_device what is
 * left (see set_weights).  Wrong inputs are rare (each is reported on
 * stderr). */
static uint32_t op_weights[NOPS] = {
    [OP_FREE_DEVICE] = 25000, [OP_FREE_HOST] = 10000, [OP_FREE_POOL] = 10000,
    [OP_FREE_N] = 7000, [OP_CALL] = 18000, [OP_CROSS] = 5000,
    [OP_NOTHING] = 1000, [OP_RECYCLE] = 150, [OP_LULL] = 25,
    [OP_SPAWN] = 100, [OP_ALLOC] = 8000, [OP_ALLOC_N] = 2500,
    [OP_ALLOC_HELD] = 1000, [OP_ALLOC_WRONG] = 120};

void set_weights(void)
{
    op_weights[OP_TRIM] = cfg.trim_per_100k;
    op_weights[OP_FLUSH] = cfg.flush_per_100k;
    op_weights[OP_SET_DEVICE] = 0;
    uint32_t sum = 0;
    for (int i = 0; i < NOPS; i++)
        sum += op_weights[i];
    op_weights[OP_SET_DEVICE] = 100000 - sum;
}

static enum op pick_op(struct worker *w)
{
    uint32_t r = rng_below(&w->rng, 100000);
    for (int i = 0; i < NOPS; i++) {
        if (r < op_weights[i])
            return (enum op)i;
        r -= op_weights[i];
    }
    return OP_SET_DEVICE;
}

void *worker_main(void *arg)
{
    struct worker *w = arg;
    w->cur = 0;
    for (int d = 0; d < opt.devices; d++) {
        w->pts[d] = (struct lane){.kind = LANE_PER_THREAD, .h = cudaStreamPerThread,
                                  .dev = d, .tail_known = true,
                                  .order = order_new(w)};
        w->legacy[d] = (struct lane){.kind = LANE_LEGACY, .h = 0, .dev = d,
                                     .order = order_new(w)};
    }
    for (int i = 0; i < opt.streams; i++)
        own_stream_new(w, &w->own[i], (w->index + i) % opt.devices);

    while (w->deferred < w->quota) {
        while (atomic_load_explicit(&lull, memory_order_relaxed))
            sleep_ns(100000);
        if (w->nitems + MAX_PER_OP > MAX_ITEMS) { /* bookkeeping full */
            flush_check(w);
            atomic_fetch_add_explicit(&w->progress, 1, memory_order_relaxed);
            continue;
        }
        enum op op = pick_op(w);
        w->ops[op]++;
        switch (op) {
        case OP_FREE_DEVICE: op_free_device(w); break;
        case OP_FREE_HOST: op_free_host(w); break;
        case OP_FREE_POOL: op_free_pool(w); break;
        case OP_FREE_N: op_free_n(w); break;
        case OP_CALL: op_call(w); break;
        case OP_CROSS: op_cross(w); break;
        case OP_NOTHING: op_nothing(w); break;
        case OP_SET_DEVICE: op_set_device(w); break;
        case OP_TRIM: trim_check(w); break;
        case OP_FLUSH: flush_check(w); break;
        case OP_RECYCLE: op_recycle_stream(w); break;
        case OP_LULL: op_lull(w); break;
        case OP_SPAWN: op_spawn(w); break;
        case OP_ALLOC: op_alloc(w); break;
        case OP_ALLOC_N: op_alloc_n(w); break;
        case OP_ALLOC_HELD: op_alloc_held(w); break;
        case OP_ALLOC_WRONG: op_alloc_wrong(w); break;
        case NOPS: break;
        }
        atomic_fetch_add_explicit(&w->progress, 1, memory_order_relaxed);
    }
    flush_check(w);
    atomic_fetch_add_explicit(&w->progress, 1, memory_order_relaxed);

    for (int i = 0; i < opt.streams; i++)
        cuda_ok(cudaStreamDestroy(w->own[i].h), "cudaStreamDestroy");
    for (int d = 0; d < opt.devices; d++)
        if (w->event[d] != NULL)
            cuda_ok(cudaEventDestroy(w->event[d]), "cudaEventDestroy");
    return NULL;
}
