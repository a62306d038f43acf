/*
 * fake_cuda.c — a fake CUDA runtime for GPU-less tests; see fake_cuda.h.
 *
 * All state lives in `g`, guarded by g.lock; blocking calls wait on g.cond
 * (CLOCK_MONOTONIC).  Registries are dynamic arrays reachable from `g`
 * (LeakSanitizer sees them) and are freed only by fake_reset.
 *
 * Work completion is computed lazily: eval_stream() walks a stream from its
 * first pending item and marks items done, in order, as far as their
 * conditions hold now; done items keep their completion time so that later
 * timed items start at max(previous completion, launch time).
 */
#define _GNU_SOURCE

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "compile fake_cuda.c without CUDA_API_PER_THREAD_DEFAULT_STREAM (it defines the _ptsz entry points itself)"
#endif

#include <cuda.h>

#include "fake_cuda.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define INF_NS        INT64_MAX
#define STREAM_BASE   ((uintptr_t)0x5a0000000000u)  /* handle = BASE + id*16 */
#define EVENT_BASE    ((uintptr_t)0x5e0000000000u)
#define GRAPH_BASE    ((uintptr_t)0x6a0000000000u)
#define EXEC_BASE     ((uintptr_t)0x6c0000000000u)
#define UOBJ_BASE     ((uintptr_t)0x6e0000000000u)
#define HANDLE_STRIDE 16u
#define ADDR_BASE     ((uintptr_t)0x7f0000000000u)  /* first fake address */
#define PAGE          ((uintptr_t)4096u)
#define MAX_ALLOC     ((size_t)1 << 46)             /* larger: out of memory */
#define MAX_WAIT_NS   ((int64_t)50000000)           /* re-check blocked waits */

/* W_CAPTURED: launched on a capturing stream; part of a graph, never run. */
enum work_kind { W_TIMED, W_HELD, W_BARRIER, W_CAPTURED };
enum alloc_kind { A_DEVICE, A_POOL, A_HOST };
enum stream_kind { S_USER, S_LEGACY, S_PER_THREAD };
enum uobj_state { U_LIVE, U_RUNNING, U_DONE };

/* Calls counted and injectable: enum fake_call, then enum fake_graph_call. */
#define NCALLS (FAKE_NCALLS + FAKE_GRAPH_NCALLS)
#define GCALL(c) (FAKE_NCALLS + (int)(c))

struct fstream;
struct fgraph;

struct fake_work {
    struct fake_work *next;       /* next item on the same stream */
    struct fstream *stream;
    unsigned long long id;        /* 1, 2, ... since fake_reset */
    enum work_kind kind;
    int64_t launch_ns, duration_ns;
    int released;                 /* W_HELD: fake_complete called */
    int64_t release_ns;
    struct fake_work *wait_for;   /* W_BARRIER: an event's captured work */
    int done;                     /* cached: completed (by done_ns) */
    int64_t done_ns;
};

struct fstream {
    unsigned long long id;
    int dev;
    enum stream_kind kind;
    int destroyed;
    int evaluating;               /* recursion guard for eval_stream */
    struct fake_work *head, *tail;
    struct fake_work *first_pending;  /* items before it are done */
    int64_t last_done_ns;         /* completion time of the last done item */
    struct fgraph *capture;       /* the graph it captures into; NULL: none */
};

/* A user object: a destructor and its references. */
struct fuobj {
    unsigned long long id;
    void *ptr;
    cudaHostFn_t fn;
    unsigned long own;            /* references the application owns */
    unsigned long refs;           /* all references: own + graphs' */
    enum uobj_state state;
};

struct uref { struct fuobj *o; unsigned long count; };

/* A graph (made by a capture) or an executable graph (exec = 1). */
struct fgraph {
    unsigned long long id;
    int exec;
    int destroyed;
    int capturing, invalidated;   /* graph: being captured into */
    enum cudaStreamCaptureMode mode; /* ... the capture's */
    pthread_t thread;             /* ... by the thread that began it */
    unsigned long long capture_id;
    struct fstream *origin;       /* the stream whose capture made it */
    int64_t duration_ns;          /* the captured timed work, in all */
    uintptr_t *uses;              /* allocations (start addresses) it uses */
    size_t nuses, capuses;
    struct uref *refs;            /* user object references it owns */
    size_t nrefs, caprefs;
    int holding;                  /* exec destroyed, launches pending: its
                                     references go when they complete */
    struct fake_work **launches;  /* exec: its launches (pruned when done) */
    size_t nlaunches, caplaunches;
};

struct fevent {
    int dev;
    int destroyed;
    struct fake_work *cap;        /* last work captured by record; NULL: none */
};

struct falloc {
    uintptr_t addr;
    size_t size;
    int dev;
    enum alloc_kind kind;
    int released;
    struct fake_work **users;     /* work that uses it (pruned when done) */
    size_t nusers, capusers;
};

struct injection { long skip, count; cudaError_t err; };

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned gen;                 /* bumped by each reset (thread state) */
    int ndev;
    size_t devmem[FAKE_MAX_DEVICES], devused[FAKE_MAX_DEVICES];
    int touched[FAKE_MAX_DEVICES], app_touched[FAKE_MAX_DEVICES];
    struct fstream *legacy[FAKE_MAX_DEVICES];
    struct fstream **streams;     /* index = id - stream_base */
    size_t nstreams, capstreams;
    unsigned long long stream_base;
    struct fevent *events;        /* index = id - event_base */
    size_t nevents, capevents, live_events;
    unsigned long long event_base;
    struct fake_work **works;     /* all work, for freeing at reset */
    size_t nworks, capworks;
    struct falloc *allocs;        /* sorted by addr (addresses only grow) */
    size_t nallocs, capallocs, live_allocs, invalid_releases;
    struct fgraph **graphs, **execs; /* index = id - graph_base, exec_base */
    size_t ngraphs, capgraphs, nexecs, capexecs;
    unsigned long long graph_base, exec_base;
    struct fuobj **uobjs;         /* index = id - uobj_base */
    size_t nuobjs, capuobjs, live_uobjs;
    unsigned long long uobj_base;
    int uobj_thread;              /* the destructor thread runs */
    struct injection inj[NCALLS];
    unsigned long calls[NCALLS];
    char last_violation[512];
    /* Never reset, so that no id or address is ever reused: */
    unsigned long long next_stream_id, next_event_id;
    unsigned long long next_graph_id, next_exec_id, next_uobj_id;
    unsigned long long next_capture_id;
    uintptr_t next_addr;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER, .next_stream_id = 1,
        .next_event_id = 1, .next_graph_id = 1, .next_exec_id = 1,
        .next_uobj_id = 1, .next_capture_id = 1, .next_addr = ADDR_BASE };

static atomic_long g_violations;
static _Atomic unsigned g_latency[NCALLS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Per-thread state; stale (and cleared) when t_gen != g.gen. */
static _Thread_local unsigned t_gen;
static _Thread_local int t_dev;
static _Thread_local struct fstream *t_pts[FAKE_MAX_DEVICES];
static _Thread_local int t_in_destructor; /* running a user object's */
static _Thread_local enum cudaStreamCaptureMode t_mode; /* its capture mode */

/* ---- Helpers ---------------------------------------------------------- */

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void die(const char *msg)
{
    fprintf(stderr, "fake_cuda: %s\n", msg);
    abort();
}

/* Make room for one more element in a dynamic array. */
static void *grow(void *arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return arr;
    *cap = *cap ? *cap * 2 : 16;
    arr = realloc(arr, *cap * elem);
    if (arr == NULL)
        die("out of memory");
    return arr;
}

/* Record a violation: count it, remember it, print it as a TAP comment. */
static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(g.last_violation, sizeof g.last_violation, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&g_violations, 1);
    printf("# fake oracle: %s\n", g.last_violation);
    fflush(stdout);
}

/* At exit: fail the process if violations were not forgiven. */
static void at_exit(void)
{
    long v = atomic_load(&g_violations);

    if (v > 0) {
        fflush(stdout);
        printf("# fake oracle: %ld violation(s)\n", v);
        fflush(stdout);
        _exit(1);
    }
}

/* 1 if the calling thread is cudefer's reclaimer (by its name). */
static int is_reclaimer(void)
{
    char name[32] = "";

    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0)
        return 0;
    return strcmp(name, FAKE_RECLAIMER_THREAD_NAME) == 0;
}

/* Note that the calling thread used device dev. */
static void touch(int dev)
{
    g.touched[dev] = 1;
    if (!g.app_touched[dev] && !is_reclaimer())
        g.app_touched[dev] = 1;
}

/* ---- Streams and work ------------------------------------------------- */

static struct fstream *new_stream(int dev, enum stream_kind kind)
{
    struct fstream *s = calloc(1, sizeof *s);

    if (s == NULL)
        die("out of memory");
    s->id = g.next_stream_id++;
    s->dev = dev;
    s->kind = kind;
    g.streams = grow(g.streams, g.nstreams, &g.capstreams, sizeof *g.streams);
    g.streams[g.nstreams++] = s;
    return s;
}

static cudaStream_t stream_handle(const struct fstream *s)
{
    return (cudaStream_t)(STREAM_BASE + (uintptr_t)s->id * HANDLE_STRIDE);
}

/* The stream a handle names for the calling thread, or NULL if the handle
 * is not a live stream.  Unknown handles are never dereferenced. */
static struct fstream *resolve(cudaStream_t h)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;
    struct fstream *s;

    if (h == 0 || h == cudaStreamLegacy) {
        touch(t_dev);
        return g.legacy[t_dev];
    }
    if (h == cudaStreamPerThread) {
        touch(t_dev);
        if (t_pts[t_dev] == NULL)
            t_pts[t_dev] = new_stream(t_dev, S_PER_THREAD);
        return t_pts[t_dev];
    }
    if (v < STREAM_BASE || (v - STREAM_BASE) % HANDLE_STRIDE != 0)
        return NULL;
    id = (v - STREAM_BASE) / HANDLE_STRIDE;
    if (id < g.stream_base || id - g.stream_base >= g.nstreams)
        return NULL;
    s = g.streams[id - g.stream_base];
    return (s->kind == S_USER && !s->destroyed) ? s : NULL;
}

/* Append a new work item to s. */
static struct fake_work *new_work(struct fstream *s, enum work_kind kind)
{
    struct fake_work *w = calloc(1, sizeof *w);

    if (w == NULL)
        die("out of memory");
    g.works = grow(g.works, g.nworks, &g.capworks, sizeof *g.works);
    g.works[g.nworks++] = w;
    w->id = g.nworks;
    w->stream = s;
    w->kind = kind;
    w->launch_ns = now_ns();
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    if (s->first_pending == NULL)
        s->first_pending = w;
    return w;
}

/* Mark done, in order, the items of s that have completed by now.  *hint
 * is lowered to when the first pending item would complete, if known. */
static void eval_stream(struct fstream *s, int64_t now, int64_t *hint)
{
    struct fake_work *w;
    int64_t t;

    if (s->evaluating)
        return;
    s->evaluating = 1;
    for (w = s->first_pending; w != NULL; w = w->next) {
        int64_t prev = s->last_done_ns;

        if (w->kind == W_TIMED) {
            t = max64(prev, w->launch_ns) + w->duration_ns;
            if (t > now) {
                if (t < *hint)
                    *hint = t;
                break;
            }
        } else if (w->kind == W_HELD) {
            if (!w->released)
                break;
            t = max64(prev, w->release_ns);
        } else {
            struct fake_work *x = w->wait_for;

            if (!x->done)
                eval_stream(x->stream, now, hint);
            if (!x->done)
                break;
            t = max64(prev, x->done_ns);
        }
        w->done = 1;
        w->done_ns = t;
        s->last_done_ns = t;
        s->first_pending = w->next;
    }
    s->evaluating = 0;
}

/* 1 if w (NULL: nothing) has completed by now. */
static int work_done(struct fake_work *w, int64_t now, int64_t *hint)
{
    if (w == NULL || w->done)
        return 1;
    eval_stream(w->stream, now, hint);
    return w->done;
}

/* Block (lock held) until the n items in ws have completed. */
static void wait_work(struct fake_work *const *ws, size_t n)
{
    for (;;) {
        int64_t now = now_ns(), hint = INF_NS, until;
        struct timespec ts;
        size_t i, left = 0;

        for (i = 0; i < n; i++)
            left += !work_done(ws[i], now, &hint);
        if (left == 0)
            return;
        until = hint - now < MAX_WAIT_NS ? hint : now + MAX_WAIT_NS;
        ts.tv_sec = (time_t)(until / 1000000000);
        ts.tv_nsec = (long)(until % 1000000000);
        pthread_cond_timedwait(&g.cond, &g.lock, &ts);
    }
}

/* 1 if pending work u is ordered before item upto of stream x: on the
 * same stream, or (transitively) before a pending cudaStreamWaitEvent
 * barrier of x that precedes upto. */
static int ordered_before(const struct fake_work *u, const struct fstream *x,
                          const struct fake_work *upto, int depth)
{
    const struct fake_work *w;

    if (upto == NULL || depth > 64)
        return 0;
    if (u->stream == x)
        return u->id <= upto->id;
    for (w = x->first_pending; w != NULL && w->id <= upto->id; w = w->next)
        if (w->kind == W_BARRIER && !w->wait_for->done &&
            ordered_before(u, w->wait_for->stream, w->wait_for, depth + 1))
            return 1;
    return 0;
}

/* ---- Allocations ------------------------------------------------------ */

/* The allocation containing p (exact: starting at p), or NULL. */
static struct falloc *find_alloc(const void *p, int exact)
{
    uintptr_t v = (uintptr_t)p;
    size_t lo = 0, hi = g.nallocs;

    while (lo < hi) {           /* first allocation with addr > v */
        size_t mid = lo + (hi - lo) / 2;

        if (g.allocs[mid].addr <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    {
        struct falloc *a = &g.allocs[lo - 1];

        if (exact ? a->addr == v : v - a->addr < a->size)
            return a;
    }
    return NULL;
}

/* Register a new allocation; returns its address. */
static void *add_alloc(size_t size, int dev, enum alloc_kind kind)
{
    struct falloc *a;

    g.allocs = grow(g.allocs, g.nallocs, &g.capallocs, sizeof *g.allocs);
    a = &g.allocs[g.nallocs++];
    memset(a, 0, sizeof *a);
    a->addr = g.next_addr;
    a->size = size;
    a->dev = dev;
    a->kind = kind;
    g.next_addr += (size + PAGE - 1) / PAGE * PAGE + PAGE;  /* + a gap */
    g.live_allocs++;
    if (kind != A_HOST)
        g.devused[dev] += size;
    return (void *)a->addr;
}

/* Note that w uses the allocation containing p (if any). */
static void add_use(struct fake_work *w, const void *p)
{
    struct falloc *a = find_alloc(p, 0);
    size_t i, n;

    if (a == NULL)
        return;
    if (a->released) {
        violation("work #%llu launched on stream id %llu uses %p, which was "
                  "already released", w->id, w->stream->id, p);
        return;
    }
    if (a->nusers == a->capusers) {     /* drop users known to be done */
        for (i = n = 0; i < a->nusers; i++)
            if (!a->users[i]->done)
                a->users[n++] = a->users[i];
        a->nusers = n;
    }
    a->users = grow(a->users, a->nusers, &a->capusers, sizeof *a->users);
    a->users[a->nusers++] = w;
}

/* A graph or executable graph, not destroyed, that uses the allocation at
 * addr (it can still be launched), or NULL. */
static struct fgraph *graph_using(uintptr_t addr)
{
    struct fgraph **lists[2] = { g.graphs, g.execs };
    size_t counts[2] = { g.ngraphs, g.nexecs };

    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++) {
            struct fgraph *x = lists[l][i];

            if (x->destroyed)
                continue;
            for (size_t k = 0; k < x->nuses; k++)
                if (x->uses[k] == addr)
                    return x;
        }
    return NULL;
}

/* Release p for function fn (host: cudaFreeHost; async: the stream of a
 * cudaFreeAsync), with the oracle's checks.  Lock held. */
static cudaError_t release(const char *fn, void *p, int host,
                           struct fstream *async)
{
    struct falloc *a;
    struct fgraph *x;
    int64_t now = now_ns(), hint = INF_NS;
    size_t i;

    if (p == NULL)
        return cudaSuccess;
    a = find_alloc(p, 1);
    if (a == NULL) {
        g.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    if (a->released) {
        violation("double release of %p (%s)", p, fn);
        return cudaErrorInvalidValue;
    }
    if ((a->kind == A_HOST) != host) {
        g.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    for (i = 0; i < a->nusers; i++) {
        struct fake_work *u = a->users[i];

        if (work_done(u, now, &hint))
            continue;
        if (async != NULL && ordered_before(u, async, async->tail, 0))
            continue;
        violation("premature release of %p (%s): work #%llu on stream id "
                  "%llu still pending", p, fn, u->id, u->stream->id);
        break;
    }
    if (i == a->nusers && (x = graph_using(a->addr)) != NULL)
        violation("premature release of %p (%s): %s #%llu, which uses it, "
                  "can still be launched", p, fn,
                  x->exec ? "executable graph" : "graph", x->id);
    a->released = 1;
    free(a->users);
    a->users = NULL;
    a->nusers = a->capusers = 0;
    g.live_allocs--;
    if (a->kind != A_HOST)
        g.devused[a->dev] -= a->size;
    return cudaSuccess;
}

/* ---- Locking, reset, call accounting ---------------------------------- */

/* Throw away all state and create ndev devices.  Lock held. */
static void reset_locked(int ndev)
{
    size_t i;
    int d;

    if (ndev < 1 || ndev > FAKE_MAX_DEVICES)
        die("fake_reset: ndevices must be 1..16");
    for (i = 0; i < g.nstreams; i++)
        free(g.streams[i]);
    for (i = 0; i < g.nworks; i++)
        free(g.works[i]);
    for (i = 0; i < g.nallocs; i++)
        free(g.allocs[i].users);
    for (i = 0; i < g.ngraphs + g.nexecs; i++) {
        struct fgraph *x = i < g.ngraphs ? g.graphs[i] : g.execs[i - g.ngraphs];

        free(x->uses);
        free(x->refs);
        free(x->launches);
        free(x);
    }
    for (i = 0; i < g.nuobjs; i++)
        free(g.uobjs[i]);
    free(g.graphs);
    free(g.execs);
    free(g.uobjs);
    g.graphs = g.execs = NULL;
    g.uobjs = NULL;
    g.ngraphs = g.capgraphs = g.nexecs = g.capexecs = 0;
    g.nuobjs = g.capuobjs = g.live_uobjs = 0;
    g.graph_base = g.next_graph_id;
    g.exec_base = g.next_exec_id;
    g.uobj_base = g.next_uobj_id;
    free(g.streams);
    free(g.works);
    free(g.allocs);
    free(g.events);
    g.streams = NULL;
    g.works = NULL;
    g.allocs = NULL;
    g.events = NULL;
    g.nstreams = g.capstreams = g.nworks = g.capworks = 0;
    g.nallocs = g.capallocs = g.nevents = g.capevents = 0;
    g.live_allocs = g.invalid_releases = g.live_events = 0;
    g.stream_base = g.next_stream_id;
    g.event_base = g.next_event_id;
    g.gen++;
    g.ndev = ndev;
    memset(g.touched, 0, sizeof g.touched);
    memset(g.app_touched, 0, sizeof g.app_touched);
    memset(g.devused, 0, sizeof g.devused);
    memset(g.inj, 0, sizeof g.inj);
    memset(g.calls, 0, sizeof g.calls);
    memset(g.legacy, 0, sizeof g.legacy);
    g.last_violation[0] = '\0';
    for (d = 0; d < FAKE_MAX_DEVICES; d++)
        g.devmem[d] = FAKE_DEFAULT_DEVICE_MEMORY;
    for (d = 0; d < ndev; d++)
        g.legacy[d] = new_stream(d, S_LEGACY);
    for (i = 0; i < NCALLS; i++)
        atomic_store(&g_latency[i], 0);
    atomic_store(&g_violations, 0);
    pthread_cond_broadcast(&g.cond);
}

static void init_cond(void)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g.cond, &ca);
    pthread_condattr_destroy(&ca);
}

/* fork() while another thread (the reclaimer) holds the lock must not leave
 * the child with a lock nobody will release: hold it across the fork. */
static void fork_prepare(void) { pthread_mutex_lock(&g.lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g.lock); }
static void fork_child(void)
{
    init_cond();                /* its waiters do not exist in the child */
    g.uobj_thread = 0;          /* nor does the destructor thread */
    pthread_mutex_unlock(&g.lock);
}

static void init_once(void)
{
    init_cond();
    if (atexit(at_exit) != 0 ||
        pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
        die("cannot register exit or fork handlers");
    reset_locked(1);
}

/* Take the lock (initialising lazily) and bring the thread's state up to
 * date with the last reset. */
static void lock(void)
{
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g.lock);
    if (t_gen != g.gen) {
        t_gen = g.gen;
        t_dev = 0;
        t_mode = cudaStreamCaptureModeGlobal;
        memset(t_pts, 0, sizeof t_pts);
    }
}

static void unlock(void) { pthread_mutex_unlock(&g.lock); }

static const char *call_name(int c);

/* Start a cudart call of kind c (an enum fake_call, or GCALL of an enum
 * fake_graph_call): emulate its latency, take the lock, count it and apply
 * failure injection.  On an injected error the lock is released and the
 * error returned; otherwise cudaSuccess, lock held. */
static cudaError_t enter(int c)
{
    unsigned lat = atomic_load(&g_latency[c]);
    struct injection *in;

    if (lat != 0) {
        int64_t end = now_ns() + lat;

        while (now_ns() < end)
            ;
    }
    lock();
    if (t_in_destructor)
        violation("a user object's destructor called %s (destructors may "
                  "not call CUDA)", call_name(c));
    g.calls[c]++;
    in = &g.inj[c];
    if (in->count != 0) {
        if (in->skip > 0) {
            in->skip--;
        } else {
            cudaError_t err = in->err;

            if (in->count > 0)
                in->count--;
            unlock();
            return err;
        }
    }
    return cudaSuccess;
}

/* Finish a call: release the lock, return r. */
static cudaError_t leave(cudaError_t r)
{
    unlock();
    return r;
}

#define ENTER(c) do { cudaError_t e_ = enter(c); \
                      if (e_ != cudaSuccess) return e_; } while (0)

/* ---- Control API ------------------------------------------------------ */

void fake_reset(int ndevices)
{
    lock();
    reset_locked(ndevices);
    t_gen = g.gen;
    t_dev = 0;
    t_mode = cudaStreamCaptureModeGlobal;
    memset(t_pts, 0, sizeof t_pts);
    unlock();
}

void fake_set_device_memory(int dev, size_t bytes)
{
    lock();
    if (dev >= 0 && dev < FAKE_MAX_DEVICES)
        g.devmem[dev] = bytes;
    unlock();
}

int fake_device_touched(int dev)
{
    int r;

    lock();
    r = dev >= 0 && dev < g.ndev && g.touched[dev];
    unlock();
    return r;
}

int fake_device_touched_by_app(int dev)
{
    int r;

    lock();
    r = dev >= 0 && dev < g.ndev && g.app_touched[dev];
    unlock();
    return r;
}

static struct fake_work *capture_work(struct fstream *s, enum work_kind kind,
                                      unsigned us, void *const *uses,
                                      size_t nuses);

/* Common part of fake_launch and fake_launch_held. */
static fake_work *launch(cudaStream_t h, enum work_kind kind, unsigned us,
                         void *const *uses, size_t nuses)
{
    struct fstream *s;
    struct fake_work *w = NULL;
    size_t i;

    lock();
    s = resolve(h);
    if (s != NULL && s->capture != NULL) {
        w = capture_work(s, kind, us, uses, nuses);
    } else if (s != NULL) {
        w = new_work(s, kind);
        w->duration_ns = (int64_t)us * 1000;
        for (i = 0; uses != NULL && i < nuses; i++)
            add_use(w, uses[i]);
    }
    unlock();
    return w;
}

fake_work *fake_launch(cudaStream_t s, unsigned duration_us,
                       void *const *uses, size_t nuses)
{
    return launch(s, W_TIMED, duration_us, uses, nuses);
}

fake_work *fake_launch_held(cudaStream_t s, void *const *uses, size_t nuses)
{
    return launch(s, W_HELD, 0, uses, nuses);
}

void fake_complete(fake_work *w)
{
    lock();
    if (w != NULL && w->kind == W_HELD && !w->released) {
        w->released = 1;
        w->release_ns = now_ns();
        pthread_cond_broadcast(&g.cond);
    }
    unlock();
}

int fake_work_done(const fake_work *w)
{
    int64_t hint = INF_NS;
    int r;

    if (w == NULL)
        return 0;
    lock();
    r = work_done((struct fake_work *)w, now_ns(), &hint);
    unlock();
    return r;
}

unsigned long long fake_work_id(const fake_work *w)
{
    return w ? w->id : 0;
}

long fake_violations(void) { return atomic_load(&g_violations); }

void fake_oracle_forgive(void) { atomic_store(&g_violations, 0); }

char *fake_last_violation(char *buf, size_t len)
{
    if (len == 0)
        return buf;
    lock();
    snprintf(buf, len, "%s", g.last_violation);
    unlock();
    return buf;
}

size_t fake_live_allocations(void)
{
    size_t n;

    lock();
    n = g.live_allocs;
    unlock();
    return n;
}

size_t fake_invalid_releases(void)
{
    size_t n;

    lock();
    n = g.invalid_releases;
    unlock();
    return n;
}

int fake_is_released(const void *p)
{
    struct falloc *a;
    int r;

    lock();
    a = find_alloc(p, 1);
    r = a ? a->released : -1;
    unlock();
    return r;
}

size_t fake_live_events(void)
{
    size_t n;

    lock();
    n = g.live_events;
    unlock();
    return n;
}

void fake_fail(enum fake_call c, cudaError_t err, long skip, long count)
{
    if ((unsigned)c >= FAKE_NCALLS)
        return;
    lock();
    g.inj[c].err = err;
    g.inj[c].skip = skip > 0 ? skip : 0;
    g.inj[c].count = count;
    unlock();
}

void fake_fail_clear(void)
{
    lock();
    memset(g.inj, 0, sizeof g.inj);
    unlock();
}

unsigned long fake_calls(enum fake_call c)
{
    unsigned long n = 0;

    lock();
    if ((unsigned)c < FAKE_NCALLS)
        n = g.calls[c];
    unlock();
    return n;
}

const char *fake_graph_call_name(enum fake_graph_call c)
{
    static const char *const names[FAKE_GRAPH_NCALLS] = {
        [FAKE_STREAM_BEGIN_CAPTURE] = "cudaStreamBeginCapture",
        [FAKE_STREAM_END_CAPTURE] = "cudaStreamEndCapture",
        [FAKE_STREAM_GET_CAPTURE_INFO] = "cudaStreamGetCaptureInfo",
        [FAKE_GRAPH_INSTANTIATE] = "cudaGraphInstantiate",
        [FAKE_GRAPH_LAUNCH] = "cudaGraphLaunch",
        [FAKE_GRAPH_DESTROY] = "cudaGraphDestroy",
        [FAKE_GRAPH_EXEC_DESTROY] = "cudaGraphExecDestroy",
        [FAKE_USER_OBJECT_CREATE] = "cudaUserObjectCreate",
        [FAKE_USER_OBJECT_RELEASE] = "cudaUserObjectRelease",
        [FAKE_GRAPH_RETAIN_USER_OBJECT] = "cudaGraphRetainUserObject",
        [FAKE_THREAD_EXCHANGE_CAPTURE_MODE] =
            "cudaThreadExchangeStreamCaptureMode",
    };

    return (unsigned)c < FAKE_GRAPH_NCALLS && names[c] ? names[c] : "?";
}

void fake_graph_fail(enum fake_graph_call c, cudaError_t err, long skip,
                     long count)
{
    if ((unsigned)c >= FAKE_GRAPH_NCALLS)
        return;
    lock();
    g.inj[GCALL(c)].err = err;
    g.inj[GCALL(c)].skip = skip > 0 ? skip : 0;
    g.inj[GCALL(c)].count = count;
    unlock();
}

unsigned long fake_graph_calls(enum fake_graph_call c)
{
    unsigned long n = 0;

    lock();
    if ((unsigned)c < FAKE_GRAPH_NCALLS)
        n = g.calls[GCALL(c)];
    unlock();
    return n;
}

/* The name of call c of either enum (see enter). */
static const char *call_name(int c)
{
    return c < FAKE_NCALLS ? fake_call_name((enum fake_call)c)
                           : fake_graph_call_name((enum fake_graph_call)(c - FAKE_NCALLS));
}

const char *fake_call_name(enum fake_call c)
{
    static const char *const names[FAKE_NCALLS] = {
        [FAKE_EVENT_CREATE] = "cudaEventCreate",
        [FAKE_EVENT_RECORD] = "cudaEventRecord",
        [FAKE_EVENT_QUERY] = "cudaEventQuery",
        [FAKE_EVENT_DESTROY] = "cudaEventDestroy",
        [FAKE_EVENT_SYNCHRONIZE] = "cudaEventSynchronize",
        [FAKE_FREE] = "cudaFree",
        [FAKE_FREE_HOST] = "cudaFreeHost",
        [FAKE_FREE_ASYNC] = "cudaFreeAsync",
        [FAKE_SET_DEVICE] = "cudaSetDevice",
        [FAKE_GET_DEVICE] = "cudaGetDevice",
        [FAKE_GET_DEVICE_COUNT] = "cudaGetDeviceCount",
        [FAKE_STREAM_GET_DEVICE] = "cudaStreamGetDevice",
        [FAKE_STREAM_GET_ID] = "cudaStreamGetId",
        [FAKE_STREAM_CREATE] = "cudaStreamCreate",
        [FAKE_STREAM_DESTROY] = "cudaStreamDestroy",
        [FAKE_STREAM_SYNCHRONIZE] = "cudaStreamSynchronize",
        [FAKE_STREAM_IS_CAPTURING] = "cudaStreamIsCapturing",
        [FAKE_POINTER_GET_ATTRIBUTES] = "cudaPointerGetAttributes",
        [FAKE_MEM_GET_INFO] = "cudaMemGetInfo",
        [FAKE_MALLOC] = "cudaMalloc",
        [FAKE_MALLOC_HOST] = "cudaMallocHost",
        [FAKE_MALLOC_ASYNC] = "cudaMallocAsync",
        [FAKE_STREAM_QUERY] = "cudaStreamQuery",
        [FAKE_STREAM_WAIT_EVENT] = "cudaStreamWaitEvent",
        [FAKE_DEVICE_SYNCHRONIZE] = "cudaDeviceSynchronize",
        [FAKE_DRIVER_ENTRY_POINT] = "cudaGetDriverEntryPointByVersion",
        [FAKE_CU_POINTER_GET_ATTRIBUTES] = "cuPointerGetAttributes",
        [FAKE_DEVICE_GET_ATTRIBUTE] = "cudaDeviceGetAttribute",
        [FAKE_DRIVER_GET_VERSION] = "cudaDriverGetVersion",
        [FAKE_RUNTIME_GET_VERSION] = "cudaRuntimeGetVersion",
    };

    return (unsigned)c < FAKE_NCALLS && names[c] ? names[c] : "?";
}

void fake_set_latency(enum fake_call c, unsigned ns)
{
    if ((unsigned)c < FAKE_NCALLS)
        atomic_store(&g_latency[c], ns);
}

/* ---- cudart: devices -------------------------------------------------- */

/* Number of fake devices. */
cudaError_t cudaGetDeviceCount(int *count)
{
    ENTER(FAKE_GET_DEVICE_COUNT);
    if (count == NULL)
        return leave(cudaErrorInvalidValue);
    *count = g.ndev;
    return leave(cudaSuccess);
}

/* The calling thread's current device. */
cudaError_t cudaGetDevice(int *device)
{
    ENTER(FAKE_GET_DEVICE);
    if (device == NULL)
        return leave(cudaErrorInvalidValue);
    *device = t_dev;
    return leave(cudaSuccess);
}

/* Set the calling thread's current device.  The reclaimer setting a device
 * the application never used is a violation (it would create a context). */
cudaError_t cudaSetDevice(int device)
{
    ENTER(FAKE_SET_DEVICE);
    if (device < 0 || device >= g.ndev)
        return leave(cudaErrorInvalidDevice);
    if (is_reclaimer()) {
        if (!g.app_touched[device])
            violation("reclaimer thread set device %d, which the application "
                      "never used (would create a context there)", device);
        g.touched[device] = 1;
    } else {
        touch(device);
    }
    t_dev = device;
    return leave(cudaSuccess);
}

/* Wait for all work on all streams of the current device. */
cudaError_t cudaDeviceSynchronize(void)
{
    struct fake_work **tails;
    size_t i, n = 0;

    ENTER(FAKE_DEVICE_SYNCHRONIZE);
    touch(t_dev);
    {   /* refused during any capture on the device, whatever the modes */
        int refused = 0;

        for (i = 0; i < g.ngraphs; i++)
            if (g.graphs[i]->capturing && !g.graphs[i]->invalidated &&
                g.graphs[i]->origin->dev == t_dev)
                g.graphs[i]->invalidated = refused = 1;
        if (refused)
            return leave(cudaErrorStreamCaptureUnsupported);
    }
    tails = malloc((g.nstreams + 1) * sizeof *tails);
    if (tails == NULL)
        die("out of memory");
    for (i = 0; i < g.nstreams; i++)
        if (g.streams[i]->dev == t_dev && g.streams[i]->tail != NULL)
            tails[n++] = g.streams[i]->tail;
    wait_work(tails, n);
    free(tails);
    return leave(cudaSuccess);
}

/* Plausible attributes of an H100-like device; 0 for the others. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr,
                                   int device)
{
    ENTER(FAKE_DEVICE_GET_ATTRIBUTE);
    if (value == NULL)
        return leave(cudaErrorInvalidValue);
    if (device < 0 || device >= g.ndev)
        return leave(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrPciBusId: *value = device + 1; break;
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrHostRegisterSupported:
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    default: *value = 0; break;
    }
    return leave(cudaSuccess);
}

/* 13000 (CUDA 13.0). */
cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    ENTER(FAKE_DRIVER_GET_VERSION);
    if (driverVersion == NULL)
        return leave(cudaErrorInvalidValue);
    *driverVersion = 13000;
    return leave(cudaSuccess);
}

/* 13000 (CUDA 13.0). */
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    ENTER(FAKE_RUNTIME_GET_VERSION);
    if (runtimeVersion == NULL)
        return leave(cudaErrorInvalidValue);
    *runtimeVersion = 13000;
    return leave(cudaSuccess);
}

/* The fake has no sticky errors. */
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

static const struct { cudaError_t code; const char *name, *text; } errtab[] = {
#define E(code, text) { code, #code, text }
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorInsufficientDriver,
      "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorDevicesUnavailable,
      "CUDA-capable device(s) is/are busy or unavailable"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorLaunchFailure, "unspecified launch failure"),
    E(cudaErrorNotPermitted, "operation not permitted"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorStreamCaptureUnsupported,
      "operation not permitted when stream is capturing"),
    E(cudaErrorStreamCaptureInvalidated,
      "operation failed due to a previous error during capture"),
    E(cudaErrorStreamCaptureUnmatched,
      "capture was not initiated in this stream"),
    E(cudaErrorStreamCaptureImplicit,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(cudaErrorIllegalState,
      "the operation cannot be performed in the present state"),
    E(cudaErrorUnknown, "unknown error"),
#undef E
};

/* Message of err, as CUDA words it. */
const char *cudaGetErrorString(cudaError_t error)
{
    size_t i;

    for (i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error)
            return errtab[i].text;
    return "unrecognized error code";
}

/* Enumerator name of err ("cudaErrorNotReady"). */
const char *cudaGetErrorName(cudaError_t error)
{
    size_t i;

    for (i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error)
            return errtab[i].name;
    return "unrecognized error code";
}

/* ---- cudart: streams -------------------------------------------------- */

/* Create a stream on the current device (flags and priority ignored). */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream,
                                         unsigned int flags, int priority)
{
    (void)flags;
    (void)priority;
    ENTER(FAKE_STREAM_CREATE);
    if (pStream == NULL)
        return leave(cudaErrorInvalidValue);
    touch(t_dev);
    *pStream = stream_handle(new_stream(t_dev, S_USER));
    return leave(cudaSuccess);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
                                      unsigned int flags)
{
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithPriority(pStream, 0, 0);
}

/* Destroy a user stream; its pending work still completes. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_DESTROY);
    if (stream == 0 || stream == cudaStreamLegacy ||
        stream == cudaStreamPerThread || (s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    s->destroyed = 1;
    return leave(cudaSuccess);
}

/* A call that may not be made on a capturing stream was: the capture is
 * invalidated (as CUDA does).  Lock held. */
static cudaError_t invalidate_capture(struct fstream *s)
{
    s->capture->invalidated = 1;
    return cudaErrorStreamCaptureUnsupported;
}

/* A "potentially unsafe" call (see THE MODEL) by the calling thread:
 * cudaSuccess if allowed; else the captures it conflicts with are
 * invalidated and it is refused.  Lock held. */
static cudaError_t unsafe_call(void)
{
    int refused = 0;
    size_t i;

    if (t_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    for (i = 0; i < g.ngraphs; i++) {
        struct fgraph *x = g.graphs[i];
        int own;

        if (!x->capturing || x->invalidated)
            continue;
        own = pthread_equal(x->thread, pthread_self());
        if ((own && x->mode != cudaStreamCaptureModeRelaxed) ||
            (!own && x->mode == cudaStreamCaptureModeGlobal &&
             t_mode == cudaStreamCaptureModeGlobal)) {
            x->invalidated = 1;
            refused = 1;
        }
    }
    return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

#define UNSAFE_CALL() do { cudaError_t u_ = unsafe_call(); \
                           if (u_ != cudaSuccess) return leave(u_); } while (0)

/* Block until all work enqueued on stream so far has completed. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    struct fstream *s;
    struct fake_work *tail;

    ENTER(FAKE_STREAM_SYNCHRONIZE);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)
        return leave(invalidate_capture(s));
    UNSAFE_CALL();
    tail = s->tail;
    wait_work(&tail, 1);
    return leave(cudaSuccess);
}

/* cudaSuccess if all work on stream has completed, else NotReady. */
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    struct fstream *s;
    int64_t hint = INF_NS;

    ENTER(FAKE_STREAM_QUERY);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)
        return leave(invalidate_capture(s));
    UNSAFE_CALL();
    return leave(work_done(s->tail, now_ns(), &hint) ? cudaSuccess
                                                     : cudaErrorNotReady);
}

/* The stream's unique id (never reused, not even after fake_reset). */
cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_GET_ID);
    if (streamId == NULL)
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(hStream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* whatever the thread's mode */
        return leave(invalidate_capture(s));
    *streamId = s->id;
    return leave(cudaSuccess);
}

/* The device of the stream. */
cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_GET_DEVICE);
    if (device == NULL)
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(hStream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* whatever the thread's mode */
        return leave(invalidate_capture(s));
    *device = s->dev;
    return leave(cudaSuccess);
}

/* The capture status of s.  Lock held. */
static enum cudaStreamCaptureStatus capture_status(const struct fstream *s)
{
    if (s->capture == NULL)
        return cudaStreamCaptureStatusNone;
    return s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
}

/* None, Active, or Invalidated (see cudaStreamBeginCapture). */
cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_IS_CAPTURING);
    if (pCaptureStatus == NULL)
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    *pCaptureStatus = capture_status(s);
    return leave(cudaSuccess);
}

/* ---- cudart: events --------------------------------------------------- */

/* The live event a handle names, or NULL. */
static struct fevent *find_event(cudaEvent_t h)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;

    if (v < EVENT_BASE || (v - EVENT_BASE) % HANDLE_STRIDE != 0)
        return NULL;
    id = (v - EVENT_BASE) / HANDLE_STRIDE;
    if (id < g.event_base || id - g.event_base >= g.nevents)
        return NULL;
    return g.events[id - g.event_base].destroyed
               ? NULL : &g.events[id - g.event_base];
}

/* Make later work on stream wait for event's captured work (a no-op for
 * an event never recorded or already complete). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags)
{
    struct fstream *s;
    struct fevent *e;
    int64_t hint = INF_NS;

    (void)flags;
    ENTER(FAKE_STREAM_WAIT_EVENT);
    if ((e = find_event(event)) == NULL || (s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* not modeled: see fake_capture_join */
        return leave(cudaErrorNotSupported);
    if (!work_done(e->cap, now_ns(), &hint))
        new_work(s, W_BARRIER)->wait_for = e->cap;
    return leave(cudaSuccess);
}

/* Create an event on the current device (flags ignored). */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    struct fevent *e;
    unsigned long long id;

    (void)flags;
    ENTER(FAKE_EVENT_CREATE);
    if (event == NULL)
        return leave(cudaErrorInvalidValue);
    touch(t_dev);
    g.events = grow(g.events, g.nevents, &g.capevents, sizeof *g.events);
    e = &g.events[g.nevents++];
    memset(e, 0, sizeof *e);
    e->dev = t_dev;
    id = g.next_event_id++;
    g.live_events++;
    *event = (cudaEvent_t)(EVENT_BASE + (uintptr_t)id * HANDLE_STRIDE);
    return leave(cudaSuccess);
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

/* Destroy an event. */
cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    struct fevent *e;

    ENTER(FAKE_EVENT_DESTROY);
    if ((e = find_event(event)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    e->destroyed = 1;
    g.live_events--;
    return leave(cudaSuccess);
}

/* Capture the work enqueued on stream so far.  The event and the stream
 * must belong to the same device. */
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                     unsigned int flags)
{
    struct fevent *e;
    struct fstream *s;

    (void)flags;
    ENTER(FAKE_EVENT_RECORD);
    if ((e = find_event(event)) == NULL || (s = resolve(stream)) == NULL ||
        e->dev != s->dev)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL) {
        violation("event recorded into a capture: cudaEventRecord on stream "
                  "id %llu, which captures into graph #%llu", s->id,
                  s->capture->id);
        return leave(cudaErrorStreamCaptureUnsupported);
    }
    e->cap = s->tail;
    return leave(cudaSuccess);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return cudaEventRecordWithFlags(event, stream, 0);
}

/* cudaSuccess if the captured work has completed (or the event was never
 * recorded), else cudaErrorNotReady. */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    struct fevent *e;
    int64_t hint = INF_NS;

    ENTER(FAKE_EVENT_QUERY);
    if ((e = find_event(event)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    UNSAFE_CALL();
    return leave(work_done(e->cap, now_ns(), &hint) ? cudaSuccess
                                                    : cudaErrorNotReady);
}

/* Block until the captured work has completed. */
cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    struct fevent *e;
    struct fake_work *cap;

    ENTER(FAKE_EVENT_SYNCHRONIZE);
    if ((e = find_event(event)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    UNSAFE_CALL();
    cap = e->cap;
    wait_work(&cap, 1);
    return leave(cudaSuccess);
}

/* ---- cudart: memory --------------------------------------------------- */

/* Device allocation on dev if it fits.  Lock held. */
static cudaError_t device_alloc(void **p, size_t size, int dev,
                                enum alloc_kind kind)
{
    if (p == NULL)
        return cudaErrorInvalidValue;
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    if (size > MAX_ALLOC || g.devused[dev] > g.devmem[dev] ||
        size > g.devmem[dev] - g.devused[dev])
        return cudaErrorMemoryAllocation;
    *p = add_alloc(size, dev, kind);
    return cudaSuccess;
}

/* Allocate device memory on the current device. */
cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    ENTER(FAKE_MALLOC);
    UNSAFE_CALL();
    touch(t_dev);
    return leave(device_alloc(devPtr, size, t_dev, A_DEVICE));
}

/* Allocate pool memory on the stream's device. */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_MALLOC_ASYNC);
    if ((s = resolve(hStream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return leave(invalidate_capture(s));
    return leave(device_alloc(devPtr, size, s->dev, A_POOL));
}

/* Allocate pinned host memory (a fake address too: never dereference). */
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    ENTER(FAKE_MALLOC_HOST);
    if (pHost == NULL)
        return leave(cudaErrorInvalidValue);
    UNSAFE_CALL();
    if (size > MAX_ALLOC)
        return leave(cudaErrorMemoryAllocation);
    touch(t_dev);
    *pHost = size ? add_alloc(size, t_dev, A_HOST) : NULL;
    return leave(cudaSuccess);
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, 0);
}

/* Release device or pool memory (oracle-checked). */
cudaError_t cudaFree(void *devPtr)
{
    ENTER(FAKE_FREE);
    UNSAFE_CALL();
    return leave(release("cudaFree", devPtr, 0, NULL));
}

/* Release pinned host memory (oracle-checked). */
cudaError_t cudaFreeHost(void *ptr)
{
    ENTER(FAKE_FREE_HOST);
    UNSAFE_CALL();
    return leave(release("cudaFreeHost", ptr, 1, NULL));
}

/* Release device memory in stream order: work ordered before the free on
 * hStream may still be pending. */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_FREE_ASYNC);
    if ((s = resolve(hStream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return leave(invalidate_capture(s));
    UNSAFE_CALL();
    return leave(release("cudaFreeAsync", devPtr, 0, s));
}

/* Free and total memory of the current device. */
cudaError_t cudaMemGetInfo(size_t *freeMem, size_t *totalMem)
{
    ENTER(FAKE_MEM_GET_INFO);
    if (freeMem == NULL || totalMem == NULL)
        return leave(cudaErrorInvalidValue);
    touch(t_dev);
    *totalMem = g.devmem[t_dev];
    *freeMem = g.devmem[t_dev] > g.devused[t_dev]
                ? g.devmem[t_dev] - g.devused[t_dev] : 0;
    return leave(cudaSuccess);
}

/* Device or host attributes of a live allocation; an unknown or released
 * pointer is cudaMemoryTypeUnregistered (cudaSuccess, as CUDA 11+). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                     const void *ptr)
{
    struct falloc *a;

    ENTER(FAKE_POINTER_GET_ATTRIBUTES);
    if (attributes == NULL)
        return leave(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    a = find_alloc(ptr, 0);
    if (a == NULL || a->released) {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
        attributes->hostPointer = (void *)ptr;
    } else if (a->kind == A_HOST) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = a->dev;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
    } else {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = a->dev;
        attributes->devicePointer = (void *)ptr;
    }
    return leave(cudaSuccess);
}

/* ---- cudart: graphs and user objects -----------------------------------
 * A capture builds a graph (struct fgraph); instantiating copies it into an
 * executable graph, user object references included.  Destructors run on
 * the fake's own thread (uobj_main), outside the lock. */

static void kick(void);

static struct fgraph *new_graph(int exec)
{
    struct fgraph *x = calloc(1, sizeof *x);

    if (x == NULL)
        die("out of memory");
    x->exec = exec;
    if (exec) {
        x->id = g.next_exec_id++;
        g.execs = grow(g.execs, g.nexecs, &g.capexecs, sizeof *g.execs);
        g.execs[g.nexecs++] = x;
    } else {
        x->id = g.next_graph_id++;
        g.graphs = grow(g.graphs, g.ngraphs, &g.capgraphs, sizeof *g.graphs);
        g.graphs[g.ngraphs++] = x;
    }
    return x;
}

static void *graph_handle(const struct fgraph *x)
{
    return (void *)((x->exec ? EXEC_BASE : GRAPH_BASE) +
                    (uintptr_t)x->id * HANDLE_STRIDE);
}

/* The index into a registry (of n, the first with id first) that handle h
 * of base names; -1 if none.  Unknown handles are never dereferenced. */
static long handle_index(const void *h, uintptr_t base,
                         unsigned long long first, size_t n)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;

    if (v < base || (v - base) % HANDLE_STRIDE != 0)
        return -1;
    id = (v - base) / HANDLE_STRIDE;
    if (id < first || id - first >= n)
        return -1;
    return (long)(id - first);
}

/* The live graph (exec = 0) or executable graph h names, or NULL. */
static struct fgraph *find_graph(const void *h, int exec)
{
    long i = exec ? handle_index(h, EXEC_BASE, g.exec_base, g.nexecs)
                  : handle_index(h, GRAPH_BASE, g.graph_base, g.ngraphs);
    struct fgraph *x;

    if (i < 0)
        return NULL;
    x = exec ? g.execs[i] : g.graphs[i];
    return x->destroyed ? NULL : x;
}

/* The user object h names, if its destructor has not run, or NULL. */
static struct fuobj *find_uobj(cudaUserObject_t h)
{
    long i = handle_index(h, UOBJ_BASE, g.uobj_base, g.nuobjs);

    return i < 0 || g.uobjs[i]->state != U_LIVE ? NULL : g.uobjs[i];
}

/* Work launched on capturing stream s: added to its graph, never run.
 * Lock held. */
static struct fake_work *capture_work(struct fstream *s, enum work_kind kind,
                                      unsigned us, void *const *uses,
                                      size_t nuses)
{
    struct fgraph *x = s->capture;
    struct fake_work *w = calloc(1, sizeof *w);
    size_t i, k;

    if (w == NULL)
        die("out of memory");
    g.works = grow(g.works, g.nworks, &g.capworks, sizeof *g.works);
    g.works[g.nworks++] = w;
    w->id = g.nworks;
    w->stream = s;
    w->kind = W_CAPTURED;
    w->launch_ns = now_ns();
    if (kind == W_TIMED)
        x->duration_ns += (int64_t)us * 1000;
    for (i = 0; uses != NULL && i < nuses; i++) {
        struct falloc *a = find_alloc(uses[i], 0);

        if (a == NULL)
            continue;
        if (a->released) {
            violation("work #%llu captured on stream id %llu uses %p, which "
                      "was already released", w->id, s->id, uses[i]);
            continue;
        }
        for (k = 0; k < x->nuses && x->uses[k] != a->addr; k++)
            ;
        if (k < x->nuses)
            continue;
        x->uses = grow(x->uses, x->nuses, &x->capuses, sizeof *x->uses);
        x->uses[x->nuses++] = a->addr;
    }
    return w;
}

/* Give x count references to o (taken from nobody: the caller moves its
 * own first if it moves them).  Lock held. */
static void add_ref(struct fgraph *x, struct fuobj *o, unsigned long count)
{
    size_t i;

    o->refs += count;
    for (i = 0; i < x->nrefs; i++)
        if (x->refs[i].o == o) {
            x->refs[i].count += count;
            return;
        }
    x->refs = grow(x->refs, x->nrefs, &x->caprefs, sizeof *x->refs);
    x->refs[x->nrefs].o = o;
    x->refs[x->nrefs].count = count;
    x->nrefs++;
}

/* Drop every user object reference x owns.  Lock held. */
static void drop_refs(struct fgraph *x)
{
    size_t i;

    for (i = 0; i < x->nrefs; i++)
        x->refs[i].o->refs -= x->refs[i].count;
    x->nrefs = 0;
    kick();
}

/* 1 if every launch of executable graph x has completed (those that have
 * are forgotten).  Lock held. */
static int launches_done(struct fgraph *x, int64_t now, int64_t *hint)
{
    size_t i, n = 0;

    for (i = 0; i < x->nlaunches; i++)
        if (!work_done(x->launches[i], now, hint))
            x->launches[n++] = x->launches[i];
    x->nlaunches = n;
    return n == 0;
}

/* After dropping the references of destroyed executable graphs whose
 * launches have all completed: a user object with no reference left whose
 * destructor has not run, or NULL.  *holding: an executable graph still
 * waits for its launches.  Lock held. */
static struct fuobj *due_uobj(int *holding)
{
    int64_t now = now_ns(), hint = INF_NS;
    size_t i;

    *holding = 0;
    for (i = 0; i < g.nexecs; i++) {
        struct fgraph *x = g.execs[i];

        if (!x->holding)
            continue;
        if (launches_done(x, now, &hint)) {
            x->holding = 0;
            drop_refs(x);
        } else {
            *holding = 1;
        }
    }
    for (i = 0; i < g.nuobjs; i++)
        if (g.uobjs[i]->state == U_LIVE && g.uobjs[i]->refs == 0)
            return g.uobjs[i];
    return NULL;
}

/* The destructor thread: runs each due destructor outside the lock, and
 * polls (every millisecond) while an executable graph waits for its
 * launches. */
static void *uobj_main(void *unused)
{
    (void)unused;
    pthread_setname_np(pthread_self(), "fake-cuda-uobj");
    lock();
    for (;;) {
        int holding;
        struct fuobj *o = due_uobj(&holding);

        if (o != NULL) {
            cudaHostFn_t fn = o->fn;
            void *ptr = o->ptr;
            unsigned gen = g.gen;

            o->state = U_RUNNING;
            unlock();
            t_in_destructor = 1;
            fn(ptr);
            t_in_destructor = 0;
            lock();
            if (g.gen == gen) {  /* o is gone after a fake_reset */
                o->state = U_DONE;
                g.live_uobjs--;
            }
            pthread_cond_broadcast(&g.cond);
            continue;
        }
        {
            int64_t until = now_ns() + (holding ? 1000000 : MAX_WAIT_NS);
            struct timespec ts;

            ts.tv_sec = (time_t)(until / 1000000000);
            ts.tv_nsec = (long)(until % 1000000000);
            pthread_cond_timedwait(&g.cond, &g.lock, &ts);
        }
    }
    return NULL;
}

/* References may have dropped: make sure the destructor thread runs, and
 * wake it.  Lock held. */
static void kick(void)
{
    if (!g.uobj_thread) {
        pthread_t t;
        pthread_attr_t attr;
        sigset_t all, old;

        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&t, &attr, uobj_main, NULL) != 0)
            die("cannot start the destructor thread");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        g.uobj_thread = 1;
    }
    pthread_cond_broadcast(&g.cond);
}

/* Start capturing stream into a new graph (mode: any valid one). */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                   enum cudaStreamCaptureMode mode)
{
    struct fstream *s;
    struct fgraph *x;

    ENTER(GCALL(FAKE_STREAM_BEGIN_CAPTURE));
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if (s->kind == S_LEGACY)
        return leave(cudaErrorStreamCaptureUnsupported);
    if (s->capture != NULL)
        return leave(cudaErrorIllegalState);
    x = new_graph(0);
    x->capturing = 1;
    x->mode = mode;
    x->thread = pthread_self();
    x->capture_id = g.next_capture_id++;
    x->origin = s;
    s->capture = x;
    return leave(cudaSuccess);
}

/* End the capture begun on stream (and on the streams that joined it):
 * the graph, or NULL and cudaErrorStreamCaptureInvalidated (the graph is
 * destroyed) if the capture was invalidated. */
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    struct fstream *s;
    struct fgraph *x;
    size_t i;

    ENTER(GCALL(FAKE_STREAM_END_CAPTURE));
    if (pGraph == NULL)
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    if ((x = s->capture) == NULL)
        return leave(cudaErrorIllegalState);
    if (x->origin != s)
        return leave(cudaErrorStreamCaptureUnmatched);
    for (i = 0; i < g.nstreams; i++)
        if (g.streams[i]->capture == x)
            g.streams[i]->capture = NULL;
    x->capturing = 0;
    if (x->invalidated) {
        x->destroyed = 1;
        drop_refs(x);
        *pGraph = NULL;
        return leave(cudaErrorStreamCaptureInvalidated);
    }
    *pGraph = (cudaGraph_t)graph_handle(x);
    return leave(cudaSuccess);
}

/* The capture status of stream and, while it is active, the capture's id
 * and graph (no dependency nodes: the fake's graphs have none). */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
    enum cudaStreamCaptureStatus *captureStatus_out,
    unsigned long long *id_out, cudaGraph_t *graph_out,
    const cudaGraphNode_t **dependencies_out,
    const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    struct fstream *s;

    ENTER(GCALL(FAKE_STREAM_GET_CAPTURE_INFO));
    if (captureStatus_out == NULL ||
        (edgeData_out != NULL && dependencies_out == NULL))
        return leave(cudaErrorInvalidValue);
    if ((s = resolve(stream)) == NULL)
        return leave(cudaErrorInvalidResourceHandle);
    *captureStatus_out = capture_status(s);
    if (*captureStatus_out != cudaStreamCaptureStatusActive)
        return leave(cudaSuccess);
    if (id_out != NULL)
        *id_out = s->capture->capture_id;
    if (graph_out != NULL)
        *graph_out = (cudaGraph_t)graph_handle(s->capture);
    if (dependencies_out != NULL)
        *dependencies_out = NULL;
    if (edgeData_out != NULL)
        *edgeData_out = NULL;
    if (numDependencies_out != NULL)
        *numDependencies_out = 0;
    return leave(cudaSuccess);
}

/* An executable graph of graph (flags ignored): its work, its allocations
 * and a reference to each of its user objects. */
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec,
                                          cudaGraph_t graph,
                                          unsigned long long flags)
{
    struct fgraph *x, *e;
    size_t i;

    (void)flags;
    ENTER(GCALL(FAKE_GRAPH_INSTANTIATE));
    if (pGraphExec == NULL || (x = find_graph(graph, 0)) == NULL)
        return leave(cudaErrorInvalidValue);
    if (x->capturing)
        return leave(cudaErrorStreamCaptureUnsupported);
    e = new_graph(1);
    e->duration_ns = x->duration_ns;
    for (i = 0; i < x->nuses; i++) {
        e->uses = grow(e->uses, e->nuses, &e->capuses, sizeof *e->uses);
        e->uses[e->nuses++] = x->uses[i];
    }
    for (i = 0; i < x->nrefs; i++)
        add_ref(e, x->refs[i].o, x->refs[i].count);
    *pGraphExec = (cudaGraphExec_t)graph_handle(e);
    return leave(cudaSuccess);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec,
                                 cudaGraph_t graph, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

/* Enqueue executable graph h on stream as one work item of kind; NULL with
 * *err if not.  Lock held. */
static struct fake_work *launch_graph(cudaGraphExec_t h, cudaStream_t stream,
                                      enum work_kind kind, cudaError_t *err)
{
    struct fgraph *x;
    struct fstream *s;
    struct fake_work *w;
    size_t i;

    if ((x = find_graph(h, 1)) == NULL) {
        *err = cudaErrorInvalidValue;
        return NULL;
    }
    if ((s = resolve(stream)) == NULL) {
        *err = cudaErrorInvalidResourceHandle;
        return NULL;
    }
    if (s->capture != NULL) {   /* child graph nodes are not modeled */
        *err = cudaErrorNotSupported;
        return NULL;
    }
    w = new_work(s, kind);
    if (kind == W_TIMED)
        w->duration_ns = x->duration_ns;
    for (i = 0; i < x->nuses; i++)
        add_use(w, (void *)x->uses[i]);
    if (x->nlaunches == x->caplaunches) {
        int64_t hint = INF_NS;

        launches_done(x, now_ns(), &hint);     /* prune */
    }
    x->launches = grow(x->launches, x->nlaunches, &x->caplaunches,
                       sizeof *x->launches);
    x->launches[x->nlaunches++] = w;
    *err = cudaSuccess;
    return w;
}

/* Enqueue the graph's work on stream, as one timed item. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    cudaError_t err;

    ENTER(GCALL(FAKE_GRAPH_LAUNCH));
    launch_graph(graphExec, stream, W_TIMED, &err);
    return leave(err);
}

fake_work *fake_graph_launch_held(cudaGraphExec_t exec, cudaStream_t s)
{
    cudaError_t err;
    struct fake_work *w;

    if (enter(GCALL(FAKE_GRAPH_LAUNCH)) != cudaSuccess)
        return NULL;
    w = launch_graph(exec, s, W_HELD, &err);
    unlock();
    return w;
}

/* Destroy a graph: its references to user objects go. */
cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    struct fgraph *x;

    ENTER(GCALL(FAKE_GRAPH_DESTROY));
    if ((x = find_graph(graph, 0)) == NULL)
        return leave(cudaErrorInvalidValue);
    if (x->capturing)
        return leave(cudaErrorIllegalState);
    x->destroyed = 1;
    drop_refs(x);
    return leave(cudaSuccess);
}

/* Destroy an executable graph: its references to user objects go once
 * every launch of it has completed. */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    struct fgraph *x;
    int64_t hint = INF_NS;

    ENTER(GCALL(FAKE_GRAPH_EXEC_DESTROY));
    if ((x = find_graph(graphExec, 1)) == NULL)
        return leave(cudaErrorInvalidValue);
    x->destroyed = 1;
    if (launches_done(x, now_ns(), &hint)) {
        drop_refs(x);
    } else {
        x->holding = 1;
        kick();
    }
    return leave(cudaSuccess);
}

/* A user object with initialRefcount references owned by the caller;
 * flags must be cudaUserObjectNoDestructorSync. */
cudaError_t cudaUserObjectCreate(cudaUserObject_t *object_out, void *ptr,
                                 cudaHostFn_t destroy,
                                 unsigned int initialRefcount,
                                 unsigned int flags)
{
    struct fuobj *o;

    ENTER(GCALL(FAKE_USER_OBJECT_CREATE));
    if (object_out == NULL || destroy == NULL || initialRefcount == 0 ||
        initialRefcount > INT32_MAX || flags != cudaUserObjectNoDestructorSync)
        return leave(cudaErrorInvalidValue);
    if ((o = calloc(1, sizeof *o)) == NULL)
        die("out of memory");
    o->id = g.next_uobj_id++;
    o->ptr = ptr;
    o->fn = destroy;
    o->own = o->refs = initialRefcount;
    o->state = U_LIVE;
    g.uobjs = grow(g.uobjs, g.nuobjs, &g.capuobjs, sizeof *g.uobjs);
    g.uobjs[g.nuobjs++] = o;
    g.live_uobjs++;
    kick();
    *object_out = (cudaUserObject_t)(UOBJ_BASE +
                                     (uintptr_t)o->id * HANDLE_STRIDE);
    return leave(cudaSuccess);
}

/* Release count of the caller's references. */
cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count)
{
    struct fuobj *o;

    ENTER(GCALL(FAKE_USER_OBJECT_RELEASE));
    if ((o = find_uobj(object)) == NULL || count == 0 || count > INT32_MAX)
        return leave(cudaErrorInvalidValue);
    if (count > o->own) {
        violation("cudaUserObjectRelease of %u references to user object "
                  "#%llu: the application owns %lu", count, o->id, o->own);
        return leave(cudaErrorInvalidValue);
    }
    o->own -= count;
    o->refs -= count;
    kick();
    return leave(cudaSuccess);
}

/* Give graph count references to object: new ones, or (with
 * cudaGraphUserObjectMove) count of the caller's. */
cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph,
                                      cudaUserObject_t object,
                                      unsigned int count, unsigned int flags)
{
    struct fgraph *x;
    struct fuobj *o;

    ENTER(GCALL(FAKE_GRAPH_RETAIN_USER_OBJECT));
    if ((x = find_graph(graph, 0)) == NULL || (o = find_uobj(object)) == NULL ||
        count == 0 || count > INT32_MAX ||
        (flags & ~(unsigned)cudaGraphUserObjectMove) != 0)
        return leave(cudaErrorInvalidValue);
    if (flags & cudaGraphUserObjectMove) {
        if (count > o->own)
            return leave(cudaErrorInvalidValue);
        o->own -= count;
        o->refs -= count;
    }
    add_ref(x, o, count);
    return leave(cudaSuccess);
}

/* Swap the calling thread's capture mode with *mode. */
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    enum cudaStreamCaptureMode old;

    ENTER(GCALL(FAKE_THREAD_EXCHANGE_CAPTURE_MODE));
    if (mode == NULL || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        return leave(cudaErrorInvalidValue);
    old = t_mode;
    t_mode = *mode;
    *mode = old;
    return leave(cudaSuccess);
}

cudaError_t fake_capture_join(cudaStream_t h, cudaStream_t capturing)
{
    struct fstream *s, *c;
    cudaError_t err = cudaSuccess;

    lock();
    if ((s = resolve(h)) == NULL || (c = resolve(capturing)) == NULL)
        err = cudaErrorInvalidResourceHandle;
    else if (c->capture == NULL || s->capture != NULL)
        err = cudaErrorIllegalState;
    else
        s->capture = c->capture;
    unlock();
    return err;
}

size_t fake_live_user_objects(void)
{
    size_t n;

    lock();
    n = g.live_uobjs;
    unlock();
    return n;
}

size_t fake_live_graphs(void)
{
    size_t i, n = 0;

    lock();
    for (i = 0; i < g.ngraphs; i++)
        n += !g.graphs[i]->destroyed;
    for (i = 0; i < g.nexecs; i++)
        n += !g.execs[i]->destroyed;
    unlock();
    return n;
}

/* ---- Driver entry points ------------------------------------------------
 * cudefer asks the runtime for the driver's cuPointerGetAttributes (to learn
 * an allocation's size and whether it came from a memory pool); the fake
 * hands out its own version. */

/* Stands in for a pool handle: non-NULL for pool allocations. */
#define FAKE_POOL_HANDLE(dev) ((void *)(uintptr_t)(0x9000 + (dev)))

static CUresult fake_cuPointerGetAttributes(unsigned int n,
                                            CUpointer_attribute *attrs,
                                            void **data, CUdeviceptr ptr)
{
    struct falloc *a;

    if (enter(FAKE_CU_POINTER_GET_ATTRIBUTES) != cudaSuccess)
        return CUDA_ERROR_INVALID_VALUE;
    a = find_alloc((const void *)(uintptr_t)ptr, 0);
    if (a == NULL || a->released) {
        unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned int i = 0; i < n; i++) {
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = a->size;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = (CUdeviceptr)a->addr;
            break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            *(void **)data[i] = a->kind == A_POOL ? FAKE_POOL_HANDLE(a->dev) : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] = a->kind == A_HOST ? CU_MEMORYTYPE_HOST
                                                         : CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = a->dev;
            break;
        default:
            unlock();
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    unlock();
    return CUDA_SUCCESS;
}

/* Only "cuPointerGetAttributes" is known; anything else is not found. */
cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion,
    unsigned long long flags, enum cudaDriverEntryPointQueryResult *status)
{
    (void)cudaVersion;
    (void)flags;
    ENTER(FAKE_DRIVER_ENTRY_POINT);
    if (symbol == NULL || funcPtr == NULL)
        return leave(cudaErrorInvalidValue);
    if (strcmp(symbol, "cuPointerGetAttributes") != 0) {
        *funcPtr = NULL;
        if (status != NULL)
            *status = cudaDriverEntryPointSymbolNotFound;
        return leave(cudaErrorSymbolNotFound);
    }
    *funcPtr = (void *)fake_cuPointerGetAttributes;
    if (status != NULL)
        *status = cudaDriverEntryPointSuccess;
    return leave(cudaSuccess);
}

/* ---- Per-thread-default-stream entry points ----------------------------
 * Code compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM calls these; there
 * stream 0 means the per-thread stream. */

#define PTDS(h) ((h) == 0 ? cudaStreamPerThread : (h))

cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t, cudaStream_t, unsigned);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t);
cudaError_t cudaStreamGetId_ptsz(cudaStream_t, unsigned long long *);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t, int *);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t,
                                       enum cudaStreamCaptureStatus *);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t, cudaEvent_t, unsigned);
cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t,
                                        enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t *);
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t,
    enum cudaStreamCaptureStatus *, unsigned long long *, cudaGraph_t *,
    const cudaGraphNode_t **, const cudaGraphEdgeData **, size_t *);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t, cudaStream_t);

cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s)
{ return cudaEventRecordWithFlags(e, PTDS(s), 0); }
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s,
                                          unsigned f)
{ return cudaEventRecordWithFlags(e, PTDS(s), f); }
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s)
{ return cudaStreamQuery(PTDS(s)); }
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s)
{ return cudaStreamSynchronize(PTDS(s)); }
cudaError_t cudaStreamGetId_ptsz(cudaStream_t s, unsigned long long *id)
{ return cudaStreamGetId(PTDS(s), id); }
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int *dev)
{ return cudaStreamGetDevice(PTDS(s), dev); }
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s,
                                       enum cudaStreamCaptureStatus *st)
{ return cudaStreamIsCapturing(PTDS(s), st); }
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned f)
{ return cudaStreamWaitEvent(PTDS(s), e, f); }
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{ return cudaMallocAsync(p, n, PTDS(s)); }
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{ return cudaFreeAsync(p, PTDS(s)); }
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                        enum cudaStreamCaptureMode m)
{ return cudaStreamBeginCapture(PTDS(s), m); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *gr)
{ return cudaStreamEndCapture(PTDS(s), gr); }
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s,
    enum cudaStreamCaptureStatus *st, unsigned long long *id, cudaGraph_t *gr,
    const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges, size_t *n)
{ return cudaStreamGetCaptureInfo(PTDS(s), st, id, gr, deps, edges, n); }
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t x, cudaStream_t s)
{ return cudaGraphLaunch(x, PTDS(s)); }
