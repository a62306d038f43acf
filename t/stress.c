/* A seeded stress test: many threads defer on many streams of several
 * devices (their own streams, created and destroyed as they go, their
 * per-thread streams, the legacy streams, short-lived threads' streams),
 * behind work of random durations, a random mix of defer_free (device and
 * pool memory, sometimes on a stream that only waits for the work through an
 * event), defer_free_host, defer_free_n, defer_call, defer_flush and
 * defer_trim, with quiet moments, under a release configuration drawn from
 * the seed.  The fake runtime's oracle checks every release (never while
 * work that uses the memory is pending, never twice); this program checks
 * that each flush released everything its thread deferred before it, that
 * each trim released every entry whose work had completed, that every
 * callback ran exactly once, in stream order, never early, and that nothing
 * is left and the counters agree at the end.
 *
 *   t/stress [--entries N] [--seed S] [--threads T] [--devices D]
 *            [--streams K]
 *
 * make check runs it with the defaults (100 000 entries, a new seed each
 * run); make stress with 1 000 000.  The seed is printed first; it fixes
 * the configuration and each thread's sequence of operations (not how the
 * threads interleave), so a failure is replayed with the command it prints.
 * A hang (no progress for a minute) bails out with that command too.
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

#include "helpers.h"

#define DEFAULT_ENTRIES 100000UL
#define DEFAULT_THREADS 8
#define DEFAULT_DEVICES 4
#define DEFAULT_STREAMS 4
#define MAX_THREADS 64
#define MAX_STREAMS 64
#define MAX_N 8               /* pointers in one defer_free_n */
#define MAX_ITEMS 16384       /* bookkeeping per thread between flushes */
#define MAX_PER_OP 16         /* items one operation may add */
#define MAX_HELPER_ENTRIES 12 /* entries of a short-lived thread */
_Static_assert(MAX_N <= MAX_PER_OP && MAX_HELPER_ENTRIES <= MAX_PER_OP,
               "an operation adds at most MAX_PER_OP items");
#define MAX_DURATION_US 200   /* of one simulated work item */
#define STALL_S 60            /* no progress this long: a hang */
#define MAX_DIAGS 20          /* failure messages printed, in all */
#define MAX_FAILURES 1000     /* then the run stops: the library is broken */

/* ---- options and the run's identity --------------------------------------- */

static struct {
    uint64_t seed;
    unsigned long entries;
    int threads, devices, streams;
} opt = {0, DEFAULT_ENTRIES, DEFAULT_THREADS, DEFAULT_DEVICES,
         DEFAULT_STREAMS};

static char replay[256]; /* the command that replays this run */

static void make_replay(void)
{
    int n = snprintf(replay, sizeof replay, "t/stress --seed %" PRIu64
                     " --entries %lu", opt.seed, opt.entries);
    if (opt.threads != DEFAULT_THREADS)
        n += snprintf(replay + n, sizeof replay - (size_t)n, " --threads %d",
                      opt.threads);
    if (opt.devices != DEFAULT_DEVICES)
        n += snprintf(replay + n, sizeof replay - (size_t)n, " --devices %d",
                      opt.devices);
    if (opt.streams != DEFAULT_STREAMS)
        snprintf(replay + n, sizeof replay - (size_t)n, " --streams %d",
                 opt.streams);
}

static void usage(void)
{
    fprintf(stderr, "usage: t/stress [--entries N] [--seed S] [--threads T "
                    "(1..%d)] [--devices D (1..%d)] [--streams K (1..%d)]\n",
            MAX_THREADS, FAKE_MAX_DEVICES, MAX_STREAMS);
    exit(2);
}

static uint64_t number(const char *text, uint64_t min, uint64_t max)
{
    char *end;
    errno = 0;
    if (text == NULL || text[0] < '0' || text[0] > '9')
        usage();
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        usage();
    return v;
}

/* ---- the random numbers ---------------------------------------------------- */

/* splitmix64: a 64-bit counter through a bijective mixer. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
};

static struct rng rng_for(uint64_t seed, uint64_t stream)
{
    return (struct rng){mix64(seed ^ mix64(stream + 1))};
}

static uint64_t rng_next(struct rng *r)
{
    r->s += UINT64_C(0x9e3779b97f4a7c15);
    return mix64(r->s);
}

/* Uniform in [0, n). */
static uint32_t rng_below(struct rng *r, uint32_t n)
{
    return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

static bool rng_percent(struct rng *r, uint32_t pct)
{
    return rng_below(r, 100) < pct;
}

/* ---- the release configuration, drawn from the seed ------------------------ */

static char config_env[512];
static struct {
    unsigned idle_us, poll_max_us;
    unsigned trim_per_100k, flush_per_100k; /* how often threads trim, flush */
} cfg;

static void choose_config(void)
{
    struct rng r = rng_for(opt.seed, UINT64_C(0xc0f16));
    bool eager = rng_percent(&r, 25);
    /* 64k .. 4M, so that cap releases happen; sometimes the default. */
    uint64_t max_pending = rng_percent(&r, 15) ? 0 : (UINT64_C(64) << 10)
                                                      << rng_below(&r, 7);
    unsigned idle_us = rng_percent(&r, 20) ? 0 : rng_below(&r, 5001);
    unsigned max_delay_ms = rng_percent(&r, 20) ? 0 : 1 + rng_below(&r, 20);
    unsigned poll_us = 1 + rng_below(&r, 100);
    unsigned poll_max_us = poll_us * (1 + rng_below(&r, 20));
    static const unsigned pools[] = {0, 1, 64, 4096};
    unsigned event_pool = pools[rng_below(&r, 4)];
    bool check = rng_percent(&r, 30);
    /* Frequent trims and flushes release most entries on demand; rare ones
     * leave them to the policy (cap, idle time, age). */
    cfg.trim_per_100k = rng_percent(&r, 20) ? 0 : 10 + rng_below(&r, 391);
    cfg.flush_per_100k = 5 + rng_below(&r, 96);
    cfg.idle_us = idle_us;
    cfg.poll_max_us = poll_max_us;
    snprintf(config_env, sizeof config_env,
             "CUDEFER_POLICY=%s CUDEFER_MAX_PENDING=%" PRIu64
             " CUDEFER_IDLE_US=%u CUDEFER_MAX_DELAY_MS=%u CUDEFER_POLL_US=%u "
             "CUDEFER_POLL_MAX_US=%u CUDEFER_EVENT_POOL=%u CUDEFER_CHECK=%d",
             eager ? "eager" : "batched", max_pending, idle_us, max_delay_ms,
             poll_us, poll_max_us, event_pool, check);
}

/* ---- failures: counted, the first few explained ---------------------------- */

/* Bail out, saying how to replay the run. */
static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag("FAILED with seed %" PRIu64 ": replay with %s", opt.seed, replay);
    bail("%s", msg);
}

enum failure {
    F_REFUSED,      /* a defer call returned an error */
    F_FLUSH_ERROR,  /* defer_flush or defer_trim returned an error */
    F_FLUSH_LEFT,   /* an entry not released after its thread's flush */
    F_TRIM_LEFT,    /* a completed entry not released after a trim */
    F_CALL_TWICE,   /* a callback ran more than once */
    F_CALL_EARLY,   /* a callback ran before its work completed */
    F_CALL_ORDER,   /* callbacks of one stream ran out of order */
    F_IN_CALLBACK,  /* defer_free in a callback refused, or defer_flush not */
    F_CUDA,         /* a CUDA call of the test itself failed */
    NFAILURES
};

static _Atomic unsigned long failures[NFAILURES];
static _Atomic int diags_left = MAX_DIAGS;

static void fail(enum failure f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail(enum failure f, const char *fmt, ...)
{
    static _Atomic unsigned long total;
    atomic_fetch_add(&failures[f], 1);
    if (atomic_fetch_add(&total, 1) + 1 == MAX_FAILURES)
        die("%d failures: stopped (the first are above)", MAX_FAILURES);
    if (atomic_fetch_sub(&diags_left, 1) <= 0)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag("FAILURE: %s", msg);
}

/* ---- per-thread state ------------------------------------------------------ */

/* Where callbacks of one stream (as one thread sees it) check their order. */
struct order {
    _Atomic uint64_t last; /* seq of the last callback run */
    struct order *next;    /* the thread's list, for freeing */
};

/* A stream a thread defers on.  tail is the last work it enqueued there:
 * on a stream only this thread uses (its own, its per-thread stream) that is
 * what an event recorded now captures, unless a cudaStreamWaitEvent barrier
 * came after it (tail_known false). */
enum lane_kind { LANE_OWN, LANE_PER_THREAD, LANE_LEGACY };

struct lane {
    enum lane_kind kind;
    cudaStream_t h;
    int dev;
    fake_work *tail;
    bool tail_known;
    struct order *order;
};

/* A defer_call's argument. */
struct call {
    _Atomic int ran;
    fake_work *waited;  /* work the callback must find completed, or NULL */
    struct order *order;
    uint64_t seq;
    int set_device;     /* -1, or switch the reclaimer's device there */
    void *nested;       /* a buffer the callback defers itself, or NULL */
    int nested_device;
    bool try_flush;     /* call defer_flush (must be refused) */
    struct call *next_free;
};

/* An entry deferred since the thread's last flush check. */
struct item {
    void *p;            /* a buffer, or NULL for a callback */
    struct call *call;
    fake_work *captured; /* what its event captured, if known */
    bool known;         /* captured is exact (NULL: nothing, complete at once) */
    bool verified;      /* already seen released (by a trim check) */
    bool due;           /* trim check: complete before the trim */
};

struct worker {
    int index;
    pthread_t thread;
    struct rng rng;
    unsigned long quota, deferred; /* entries to make, made */
    int cur;                       /* current device */
    struct lane own[MAX_STREAMS];
    struct lane pts[FAKE_MAX_DEVICES], legacy[FAKE_MAX_DEVICES];
    cudaEvent_t event[FAKE_MAX_DEVICES];
    struct order *orders;
    uint64_t seq;
    struct call *free_calls;
    struct item items[MAX_ITEMS];
    size_t nitems;
    unsigned long ops[16];         /* by enum op */
    unsigned long flushes, trims, flush_checked, trim_checked, calls;
    _Atomic unsigned long progress;
};

static struct worker *workers;

/* Totals across threads and callbacks. */
static _Atomic unsigned long calls_run, nested_deferred;
static _Atomic int lull; /* 1 while a thread makes a quiet moment */
static _Atomic int phase_done;
static const char *_Atomic phase = "start";

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000),
                          .tv_nsec = (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void cuda_ok(cudaError_t err, const char *what)
{
    if (err != cudaSuccess)
        fail(F_CUDA, "%s: %s", what, cudaGetErrorName(err));
}

static struct order *order_new(struct worker *w)
{
    struct order *o = calloc(1, sizeof *o);
    if (o == NULL)
        die("out of memory");
    o->next = w->orders;
    w->orders = o;
    return o;
}

static void use_device(struct worker *w, int dev)
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

static size_t random_size(struct worker *w)
{
    unsigned bits = 4 + rng_below(&w->rng, 15); /* 16 B .. 512 KiB */
    return ((size_t)1 << bits) + rng_below(&w->rng, 1u << bits);
}

/* A stream to defer on: one of the thread's own streams (usually with its
 * device made current, as real code does), or the per-thread or legacy
 * stream of a random device (made current: that is what they name). */
static struct lane *pick_lane(struct worker *w)
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
static fake_work *launch(struct worker *w, struct lane *l, void *const *uses,
                         size_t n)
{
    fake_work *x = fake_launch(l->h, duration_us(w), uses, n);
    if (x == NULL)
        die("fake_launch on an invalid stream (thread %d, lane kind %d)",
             w->index, (int)l->kind);
    l->tail = x;
    l->tail_known = l->kind != LANE_LEGACY;
    return x;
}

static void *malloc_device(size_t size)
{
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, size);
    if (err != cudaSuccess)
        die("cudaMalloc(%zu): %s", size, cudaGetErrorName(err));
    return p;
}

/* Remember an entry just deferred on l, for the flush and trim checks. */
static void note(struct worker *w, const struct lane *l, void *p,
                 struct call *c)
{
    struct item *it = &w->items[w->nitems++];
    it->p = p;
    it->call = c;
    it->captured = l->tail;
    it->known = l->tail_known;
    it->verified = false;
    it->due = false;
}

static void accepted(struct worker *w, cudaError_t err, const char *what,
                     const struct lane *l, const void *p)
{
    if (err == cudaSuccess) {
        w->deferred++;
        return;
    }
    fail(F_REFUSED, "thread %d: %s(%p) on a stream of kind %d (device %d): %s",
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
        die("cudaMallocHost: %s", cudaGetErrorName(err));
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
        die("cudaMallocAsync: %s", cudaGetErrorName(err));
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
        fail(F_REFUSED, "thread %d: defer_free_n(%zu pointers, %zu live): %s",
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
        fail(F_CALL_TWICE, "callback %p (seq %" PRIu64 ") ran again", arg,
             c->seq);
        return;
    }
    if (c->waited != NULL && !fake_work_done(c->waited))
        fail(F_CALL_EARLY, "callback (seq %" PRIu64 ") ran before work #%llu "
             "completed", c->seq, fake_work_id(c->waited));
    uint64_t prev = atomic_exchange(&c->order->last, c->seq);
    if (prev >= c->seq)
        fail(F_CALL_ORDER, "callback seq %" PRIu64 " ran after seq %" PRIu64
             " of the same stream", c->seq, prev);
    if (c->set_device >= 0)
        cuda_ok(cudaSetDevice(c->set_device), "cudaSetDevice in a callback");
    if (c->nested != NULL) {
        cuda_ok(cudaSetDevice(c->nested_device), "cudaSetDevice in a callback");
        cudaError_t err = defer_free(c->nested, cudaStreamPerThread);
        if (err == cudaSuccess)
            atomic_fetch_add(&nested_deferred, 1);
        else
            fail(F_IN_CALLBACK, "defer_free(%p) in a callback: %s", c->nested,
                 cudaGetErrorName(err));
    }
    if (c->try_flush) {
        cudaError_t err = defer_flush();
        if (err != cudaErrorNotPermitted)
            fail(F_IN_CALLBACK, "defer_flush in a callback returned %s, not "
                 "cudaErrorNotPermitted", cudaGetErrorName(err));
    }
}

static struct call *call_new(struct worker *w)
{
    struct call *c = w->free_calls;
    if (c != NULL)
        w->free_calls = c->next_free;
    else if ((c = malloc(sizeof *c)) == NULL)
        die("out of memory");
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
    cudaError_t err = defer_call(on_call, c, l->h);
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
    if (w->own[k].dev == b->dev && &w->own[k] != b)
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
        fail(F_REFUSED, "thread %d: a call with nothing to defer failed",
             w->index);
}

static void op_set_device(struct worker *w)
{
    use_device(w, (int)rng_below(&w->rng, (uint32_t)opt.devices));
}

/* defer_flush, then everything this thread deferred before it must be
 * released, every callback run once. */
static void flush_check(struct worker *w)
{
    cudaError_t err = defer_flush();
    w->flushes++;
    if (err != cudaSuccess)
        fail(F_FLUSH_ERROR, "thread %d: defer_flush: %s", w->index,
             cudaGetErrorName(err));
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        if (it->call != NULL) {
            int ran = atomic_load(&it->call->ran);
            if (ran == 1)
                call_recycle(w, it->call);
            else if (ran == 0) /* kept: it may still run */
                fail(F_FLUSH_LEFT, "thread %d: callback seq %" PRIu64
                     " had not run when defer_flush returned", w->index,
                     it->call->seq);
        } else if (fake_is_released(it->p) != 1) {
            fail(F_FLUSH_LEFT, "thread %d: %p not released when defer_flush "
                 "returned (work #%llu)", w->index, it->p,
                 fake_work_id(it->captured));
        }
    }
    w->flush_checked += w->nitems;
    w->nitems = 0;
}

/* defer_trim releases every entry whose work completed before it: those of
 * streams only this thread uses, where the captured work is known. */
static void trim_check(struct worker *w)
{
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        it->due = !it->verified && it->known &&
                  (it->captured == NULL || fake_work_done(it->captured));
    }
    size_t bytes = 0;
    cudaError_t err = defer_trim(&bytes);
    w->trims++;
    if (err != cudaSuccess)
        fail(F_FLUSH_ERROR, "thread %d: defer_trim: %s", w->index,
             cudaGetErrorName(err));
    for (size_t i = 0; i < w->nitems; i++) {
        struct item *it = &w->items[i];
        if (!it->due)
            continue;
        w->trim_checked++;
        bool done = it->call != NULL ? atomic_load(&it->call->ran) >= 1
                                     : fake_is_released(it->p) == 1;
        if (done)
            it->verified = true;
        else
            fail(F_TRIM_LEFT, "thread %d: %s %p still pending after "
                 "defer_trim, though its work #%llu had completed before",
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
            die("allocation in a short-lived thread: %s", cudaGetErrorName(err));
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
        die("pthread_create");
    pthread_join(t, NULL);
}

enum op {
    OP_FREE_DEVICE, OP_FREE_HOST, OP_FREE_POOL, OP_FREE_N, OP_CALL, OP_CROSS,
    OP_NOTHING, OP_SET_DEVICE, OP_TRIM, OP_FLUSH, OP_RECYCLE, OP_LULL, OP_SPAWN,
    NOPS
};
_Static_assert(NOPS <= 16, "struct worker counts 16 kinds of operation");

static const char *const op_names[NOPS] = {
    "free", "free_host", "free_pool", "free_n", "call", "cross", "nothing",
    "set_device", "trim", "flush", "recycle_stream", "lull", "spawn"};

/* Weights out of 100 000; trim and flush from the seed, set_device what is
 * left (see set_weights). */
static uint32_t op_weights[NOPS] = {
    [OP_FREE_DEVICE] = 30000, [OP_FREE_HOST] = 12000, [OP_FREE_POOL] = 12000,
    [OP_FREE_N] = 8000, [OP_CALL] = 20000, [OP_CROSS] = 5000,
    [OP_NOTHING] = 1000, [OP_RECYCLE] = 150, [OP_LULL] = 25,
    [OP_SPAWN] = 100};

static void set_weights(void)
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

static void *worker_main(void *arg)
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

/* ---- the watchdog ---------------------------------------------------------- */

static unsigned long progress_now(void)
{
    unsigned long n = 0;
    for (int i = 0; i < opt.threads; i++)
        n += atomic_load_explicit(&workers[i].progress, memory_order_relaxed);
    return n;
}

static void *watchdog_main(void *unused)
{
    (void)unused;
    /* About 200 times what a run takes on 2 cores: only a broken run (one
     * that crawls, e.g. on 50 ms timeouts) gets there. */
    int64_t deadline = mono_ns() + (int64_t)(120 + opt.entries / 2000) * 1000000000;
    unsigned long last = progress_now();
    const char *last_phase = atomic_load(&phase);
    int still = 0;
    while (!atomic_load(&phase_done)) {
        sleep_ns(100000000);
        if (mono_ns() > deadline)
            die("still running after %lu s (phase \"%s\"): far too slow",
                120 + opt.entries / 2000, atomic_load(&phase));
        unsigned long now = progress_now();
        const char *ph = atomic_load(&phase);
        if (now != last || ph != last_phase) {
            last = now;
            last_phase = ph;
            still = 0;
            continue;
        }
        if (++still < STALL_S * 10)
            continue;
        struct defer_stats st = stats_now();
        diag("no progress for %d s in phase \"%s\": a hang? deferred %llu "
             "released %llu pending %llu held %llu failed %llu", STALL_S, ph,
             ULL(st.deferred), ULL(st.released), ULL(st.pending),
             ULL(st.held), ULL(st.failed));
        for (int i = 0; i < opt.threads; i++)
            diag("thread %d: %lu of %lu entries, %lu items since its last flush",
                 i, workers[i].deferred, workers[i].quota, workers[i].nitems);
        die("no progress for %d s: a hang", STALL_S);
    }
    return NULL;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    bool seeded = false;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--entries") == 0)
            opt.entries = (unsigned long)number(v, 1, UINT64_C(1) << 40);
        else if (strcmp(a, "--seed") == 0)
            opt.seed = number(v, 0, UINT64_MAX), seeded = true;
        else if (strcmp(a, "--threads") == 0)
            opt.threads = (int)number(v, 1, MAX_THREADS);
        else if (strcmp(a, "--devices") == 0)
            opt.devices = (int)number(v, 1, FAKE_MAX_DEVICES);
        else if (strcmp(a, "--streams") == 0)
            opt.streams = (int)number(v, 1, MAX_STREAMS);
        else
            usage();
    }
    if (!seeded)
        opt.seed = (uint32_t)mix64((uint64_t)time(NULL) ^
                                   ((uint64_t)getpid() << 32) ^
                                   (uint64_t)mono_ns());
    make_replay();
    diag("seed %" PRIu64 " (replay: %s)", opt.seed, replay);
    choose_config();
    set_weights();
    diag("%lu entries, %d threads, %d devices, %d streams per thread; %u trims "
         "and %u flushes per 100 000 operations; %s", opt.entries, opt.threads,
         opt.devices, opt.streams, cfg.trim_per_100k, cfg.flush_per_100k,
         config_env);
    set_cudefer_env(config_env);
    diag("expected on stderr: one \"defer_flush called from a defer_call "
         "callback: refused\"");
    plan(16);

    fake_reset(opt.devices);
    workers = calloc((size_t)opt.threads, sizeof *workers);
    if (workers == NULL)
        die("out of memory");
    for (int i = 0; i < opt.threads; i++) {
        workers[i].index = i;
        workers[i].rng = rng_for(opt.seed, (uint64_t)i);
        workers[i].quota = opt.entries / (unsigned long)opt.threads +
                           ((unsigned long)i < opt.entries % (unsigned long)opt.threads);
    }
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, watchdog_main, NULL) != 0)
        die("pthread_create");

    double t0 = now_ms();
    atomic_store(&phase, "threads");
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0)
            die("pthread_create");
    for (int i = 0; i < opt.threads; i++)
        pthread_join(workers[i].thread, NULL);
    double t_threads = now_ms() - t0;

    atomic_store(&phase, "final defer_flush");
    cudaError_t flush_err = defer_flush();
    double t_flush = now_ms() - t0;

    unsigned long made = 0, flushes = 0, trims = 0, flush_checked = 0,
                  trim_checked = 0, calls = 0, ops[NOPS] = {0};
    for (int i = 0; i < opt.threads; i++) {
        struct worker *w = &workers[i];
        made += w->deferred;
        flushes += w->flushes;
        trims += w->trims;
        flush_checked += w->flush_checked;
        trim_checked += w->trim_checked;
        calls += w->calls;
        for (int k = 0; k < NOPS; k++)
            ops[k] += w->ops[k];
    }
    unsigned long nested = atomic_load(&nested_deferred);

    is_int(failures[F_REFUSED], 0, "every defer call accepted (%lu entries "
           "from %d threads, %lu from callbacks)", made, opt.threads, nested);
    is_int(failures[F_CUDA], 0, "the test's own CUDA calls succeeded");
    is_int(failures[F_FLUSH_ERROR], 0, "every defer_flush and defer_trim "
           "returned cudaSuccess (%lu flushes, %lu trims)", flushes, trims);
    is_int(failures[F_FLUSH_LEFT], 0, "each flush released everything its "
           "thread deferred before it (%lu entries checked)", flush_checked);
    is_int(failures[F_TRIM_LEFT], 0, "each trim released every entry whose "
           "work had completed (%lu entries checked)", trim_checked);
    ok(failures[F_CALL_TWICE] == 0 && atomic_load(&calls_run) == calls,
       "every callback ran exactly once (%lu deferred, %lu runs, %lu twice)",
       calls, atomic_load(&calls_run), failures[F_CALL_TWICE]);
    is_int(failures[F_CALL_EARLY], 0, "no callback ran before its work "
           "completed");
    is_int(failures[F_CALL_ORDER], 0, "the callbacks of each stream ran in "
           "order");
    is_int(failures[F_IN_CALLBACK], 0, "in a callback, defer_free is "
           "accepted and defer_flush refused");
    is_int(flush_err, cudaSuccess, "the final defer_flush");
    is_int(fake_live_allocations(), 0, "every allocation released");
    struct defer_stats st = stats_now();
    ok(st.deferred == made + nested && st.released == st.deferred &&
           st.pending == 0 && st.failed == 0 && st.rejected == 0,
       "statistics agree: deferred %llu (want %lu), released %llu, pending "
       "%llu, failed %llu, rejected %llu", ULL(st.deferred), made + nested,
       ULL(st.released), ULL(st.pending), ULL(st.failed), ULL(st.rejected));
    char last[256];
    ok(fake_violations() == 0, "oracle: no premature or double release "
       "(%ld violations; the last: %s)", fake_violations(),
       fake_last_violation(last, sizeof last));

    atomic_store(&phase, "defer_shutdown");
    is_int(defer_shutdown(), cudaSuccess, "defer_shutdown");
    is_int(fake_live_events(), 0, "no CUDA event left after shutdown");
    is_int(fake_violations(), 0, "oracle: still no violation after shutdown");
    atomic_store(&phase_done, 1);
    pthread_join(watchdog, NULL);

    double t_end = now_ms() - t0;
    diag("%.0f ms: threads %.0f, final flush %.0f, shutdown %.0f; %.0f "
         "entries/s", t_end, t_threads, t_flush - t_threads, t_end - t_flush,
         (double)(made + nested) / (t_threads / 1000.0));
    char buf[512];
    int n = 0;
    for (int k = 0; k < NOPS; k++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s %lu",
                      k ? ", " : "", op_names[k], ops[k]);
    diag("operations: %s", buf);
    diag("releases: idle %llu, cap %llu, age %llu, demand %llu; %llu batches "
         "(largest %llu), %llu event queries, %llu wake-ups, %llu events "
         "created, latency p50 %llu us max %llu us, %llu sync releases",
         ULL(st.idle_releases), ULL(st.cap_releases), ULL(st.age_releases),
         ULL(st.demand_releases), ULL(st.batches), ULL(st.largest_batch),
         ULL(st.event_queries), ULL(st.wakeups), ULL(st.events_created),
         ULL(st.latency_p50_us), ULL(st.latency_max_us),
         ULL(st.sync_releases));
    if (tap_failures() > 0 || fake_violations() != 0)
        diag("FAILED with seed %" PRIu64 ": replay with %s", opt.seed, replay);
    else
        diag("seed %" PRIu64 " passed", opt.seed);

    for (int i = 0; i < opt.threads; i++) {
        struct worker *w = &workers[i];
        while (w->free_calls != NULL) {
            struct call *c = w->free_calls;
            w->free_calls = c->next_free;
            free(c);
        }
        while (w->orders != NULL) {
            struct order *o = w->orders;
            w->orders = o->next;
            free(o);
        }
    }
    free(workers);
    return 0;
}
