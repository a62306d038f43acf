/* SPDX-License-Identifier: MIT */
/*
 * fake_internal.h — what the parts of the fake CUDA runtime share; not for
 * tests (they include fake_cuda.h).
 *
 * The fake is one model split by concept, each file naming what it
 * simulates:
 *   fake_control.c  the state, its lock and reset; call accounting, failure
 *                   injection and latencies (the test control API)
 *   fake_device.c   devices, versions, error strings
 *   fake_stream.c   streams, simulated work and events, on the simulated
 *                   clock
 *   fake_memory.c   device, pool and pinned memory
 *   fake_oracle.c   the oracle: which work uses which bytes of an
 *                   allocation, and the checks of every release and
 *                   hand-out
 *   fake_graph.c    stream capture, graphs, executable graphs, user objects
 *   fake_driver.c   the driver entry points and the per-thread default
 *                   stream (_ptsz) entry points
 *
 * All state lives in `fake`, guarded by fake.lock; blocking calls wait on
 * fake.cond (CLOCK_MONOTONIC).  Registries are dynamic arrays reachable from
 * `fake` (LeakSanitizer sees them) and are freed only by fake_reset.
 * Functions marked "Lock held" must be called with fake.lock taken (between
 * fake_enter/fake_lock and fake_leave/fake_unlock); none of them blocks
 * except fake_work_wait, which waits on fake.cond.
 *
 * Work completion is computed lazily: the stream part walks a stream from
 * its first pending item and marks items done, in order, as far as their
 * conditions hold now; done items keep their completion time so that later
 * timed items start at max(previous completion, launch time).
 */
#ifndef CUDEFER_FAKE_INTERNAL_H
#define CUDEFER_FAKE_INTERNAL_H

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
/* The fake defines the _ptsz entry points itself (fake_driver.c). */
#error "compile the fake without CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#include "fake_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stddef.h>

#define INF_NS        INT64_MAX
#define HANDLE_STRIDE 16u                           /* handle = BASE + id*16 */
#define ADDR_BASE     ((uintptr_t)0x7f0000000000u)  /* first fake address */
#define MAX_WAIT_NS   ((int64_t)50000000)           /* re-check blocked waits */

/* W_CAPTURED: launched on a capturing stream; part of a graph, never run. */
enum work_kind { W_TIMED, W_HELD, W_BARRIER, W_CAPTURED };
enum alloc_kind { A_DEVICE, A_POOL, A_HOST };
enum stream_kind { S_USER, S_LEGACY, S_PER_THREAD };
enum uobj_state { U_LIVE, U_RUNNING, U_DONE };

/* Calls counted and injectable: enum fake_call, then enum fake_graph_call. */
#define NCALLS (FAKE_NCALLS + FAKE_GRAPH_NCALLS)
#define GCALL(c) (FAKE_NCALLS + (int)(c))

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
    unsigned long long reported_id; /* cudaStreamGetId's (fake_set_stream_id) */
    int dev;
    enum stream_kind kind;
    int nonblocking;              /* created with cudaStreamNonBlocking */
    int destroyed;
    struct fstream *reused_by;    /* destroyed: the stream its handle now
                                     names (fake_stream_create_reusing) */
    int evaluating;               /* recursion guard for eval_stream */
    unsigned long long walk_id;   /* the last fake_work_ordered_before walk
                                     that reached it, and ... */
    const struct fake_work *walk_next; /* ... the first pending item that
                                     walk has not scanned yet */
    struct fake_work *head, *tail;
    struct fake_work *first_pending;  /* items before it are done */
    int64_t last_done_ns;         /* completion time of the last done item */
    struct fgraph *capture;       /* the graph it captures into; NULL: none */
    size_t unmapping[FAKE_MAX_DEVICES]; /* bytes of cudaMalloc memory per
                                     device freed here with cudaFreeAsync:
                                     used until this stream is synchronized,
                                     as CUDA does (fake_unmap_settle) */
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

/* Bytes [lo, hi) of the fake's address space. */
struct frange { uintptr_t lo, hi; };

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
    struct frange *uses;          /* the bytes its work uses */
    size_t nuses, capuses;
    struct uref *refs;            /* user object references it owns */
    size_t nrefs, caprefs;
    int holding;                  /* exec destroyed, launches pending: its
                                     references go when they complete */
    struct fake_work **launches;  /* exec: its launches (pruned when done) */
    size_t nlaunches, caplaunches;
};

/* A question of fake_work_ordered_before's walk: is u before item upto of
 * stream s? */
struct fwalk { struct fstream *s; const struct fake_work *upto; };

struct fevent {
    int dev;
    int destroyed;
    struct fake_work *cap;        /* last work captured by record; NULL: none */
};

/* Work that uses the bytes r of an allocation. */
/* A use of bytes r by work w.  order_only: w is not a use but the work an
 * async allocation was ordered after on its stream (fake_alloc_ordered):
 * another stream may touch the memory only once w is done or ordered
 * before it; cudaFree, which waits for the device, ignores it. */
struct fuser { struct fake_work *w; struct frange r; int order_only; };

struct falloc {
    uintptr_t addr;
    size_t size;
    int dev;
    enum alloc_kind kind;
    int own_pool;                 /* from cudaMallocFromPoolAsync */
    int released;
    unsigned long long serial;    /* 1, 2, ... since fake_reset */
    struct fake_work *freed_after; /* cudaFreeAsync: when its free ran: its
                                      own item (fake_set_free_async_us),
                                      else its stream's last work then
                                      (NULL: none); for address reuse and
                                      the pool's use (fake.pool_frees) */
    struct fuser *users;          /* work that uses it (pruned when done) */
    size_t nusers, capusers;
    struct frange *blocks;        /* the blocks allocators handed out of it
                                     (fake_oracle_handout_range): sorted,
                                     disjoint, a newer one replacing those
                                     it overlaps */
    size_t nblocks, capblocks;
};

/* Memory of a pool (cudaMallocFromPoolAsync) given back with cudaFreeAsync
 * whose free has not run yet on its stream: its bytes stay in the pool's
 * use (pool_used) until `until` completed, unless a later allocation from
 * the pool on that very stream takes them (stream order). */
struct fpool_free {
    struct fake_work *until;      /* the free's item, or the work before it */
    struct fstream *stream;       /* the stream of the cudaFreeAsync */
    int dev;
    size_t bytes;                 /* not yet taken by such an allocation */
};

struct injection { long skip, count; cudaError_t err; };

/* The whole simulated machine (defined in fake_control.c). */
struct fake_state {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned gen;                 /* bumped by each reset (thread state) */
    int ndev;
    size_t devmem[FAKE_MAX_DEVICES], devused[FAKE_MAX_DEVICES];
    int no_pools[FAKE_MAX_DEVICES]; /* fake_set_memory_pools(dev, 0) */
    /* Pools of cudaMemPoolCreate (one per device): bytes allocated from
     * them and not freed (a cudaFreeAsync counts once its free ran:
     * pool_frees), and what they reserved (the most they were ever used
     * since the last trim, rounded up to pool_granularity: the release
     * threshold is kept). */
    size_t pool_used[FAKE_MAX_DEVICES], pool_reserved[FAKE_MAX_DEVICES];
    /* Bit p of pool_access[d]: cudaMemPoolSetAccess let device p use
     * device d's pool. */
    unsigned pool_access[FAKE_MAX_DEVICES];
    size_t pool_granularity; /* 1 unless fake_set_pool_granularity */
    struct fpool_free *pool_frees; /* not yet run, oldest first */
    size_t npool_frees, cappool_frees;
    unsigned free_async_us;  /* 0 unless fake_set_free_async_us */
    int reuse_addresses;     /* 0 unless fake_set_address_reuse */
    size_t reuse_offset;     /* 0 unless fake_set_reuse_inside: one reuse */
    size_t addresses_reused;
    unsigned char *released_by_serial; /* [serial]: 1 once released */
    size_t nserials, capserials;       /* serials given: nserials - 1 */
    int touched[FAKE_MAX_DEVICES], app_touched[FAKE_MAX_DEVICES];
    struct fstream *legacy[FAKE_MAX_DEVICES];
    struct fstream **streams;     /* index = id - stream_base */
    size_t nstreams, capstreams;
    unsigned long long stream_base;
    struct fevent *events;        /* index = id - event_base */
    size_t nevents, capevents, live_events;
    unsigned long long event_base;
    struct fake_work **works;     /* all work, for freeing at reset */
    struct fwalk *walk;           /* fake_work_ordered_before's stack
                                     (scratch; kept for the next walk) */
    size_t capwalk;
    unsigned long long walk_id;   /* walks so far (never reset: streams'
                                     walk_id starts at 0, none) */
    size_t nworks, capworks;
    struct falloc *allocs;        /* sorted by addr (new addresses grow; a
                                     reused one keeps its record's place) */
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
};
extern struct fake_state fake;

/* Per-thread state; stale (and cleared by fake_lock) when gen != fake.gen. */
/* How many of its latest allocations a thread remembers
 * (fake_my_allocation_serial). */
#define FAKE_RECENT_ALLOCS 256

struct fake_thread_state {
    unsigned gen;
    int dev;                                /* the current device */
    struct fstream *pts[FAKE_MAX_DEVICES];  /* per-thread default streams */
    int in_destructor;                      /* running a user object's */
    enum cudaStreamCaptureMode mode;        /* its capture mode */
    cudaError_t last_error;                 /* cudaGetLastError's */
    struct { uintptr_t addr; unsigned long long serial; }
        recent[FAKE_RECENT_ALLOCS];
    unsigned nrecent;                       /* allocations it made */
    cudaEvent_t last_recorded; /* fake_take_last_recorded's, or NULL */
    unsigned long calls[NCALLS];            /* fake_thread_calls' */
    int call_begun; /* 1 + the call fake_enter began, 0 after fake_leave */
};
extern _Thread_local struct fake_thread_state fake_thread;

/* ---- fake_control.c ---------------------------------------------------- */

/* Print "fake_cuda: msg" and abort (out of memory, misuse).  Anyone. */
_Noreturn void fake_die(const char *msg);

/* Make room for one more element in the dynamic array arr of n elements
 * of elem bytes (capacity *cap); returns the (moved) array, dies when out
 * of memory.  Lock held. */
void *fake_grow(void *arr, size_t n, size_t *cap, size_t elem);

/* Take the lock (initialising the fake lazily) and bring the calling
 * thread's state up to date with the last reset; blocks on the lock. */
void fake_lock(void);
void fake_unlock(void);

/* Start a cudart call of kind c (an enum fake_call, or GCALL of an enum
 * fake_graph_call): emulate its latency, take the lock, count it and apply
 * failure injection.  On an injected error the lock is released and the
 * error returned; otherwise cudaSuccess, lock held.  Every cudart call. */
cudaError_t fake_enter(int c);

/* Finish a call: release the lock, return r. */
cudaError_t fake_leave(cudaError_t r);

#define ENTER(c) do { cudaError_t e_ = fake_enter(c); \
                      if (e_ != cudaSuccess) return e_; } while (0)

/* ---- fake_device.c ----------------------------------------------------- */

/* Note that the calling thread used device dev.  Lock held. */
void fake_touch(int dev);

/* ---- fake_stream.c ----------------------------------------------------- */

/* The simulated clock: now on CLOCK_MONOTONIC, in nanoseconds.  Anyone. */
int64_t fake_now_ns(void);

/* A new stream of kind on dev, registered.  Lock held. */
struct fstream *fake_stream_new(int dev, enum stream_kind kind);

/* The stream a handle names for the calling thread (0 and cudaStreamLegacy:
 * the current device's legacy stream; cudaStreamPerThread: the thread's
 * own, created on first use), or NULL if the handle is not a live stream.
 * Unknown handles are never dereferenced.  Lock held. */
struct fstream *fake_stream_resolve(cudaStream_t h);

/* Append a new work item of kind to s (launched now).  Lock held. */
struct fake_work *fake_work_new(struct fstream *s, enum work_kind kind);

/* 1 if w (NULL: nothing) has completed by now; *hint is lowered to when
 * the first pending item of a stream looked at would complete, if known.
 * Lock held. */
int fake_work_completed(struct fake_work *w, int64_t now, int64_t *hint);

/* Block (lock held, released while waiting) until the n items in ws have
 * completed. */
void fake_work_wait(struct fake_work *const *ws, size_t n);

/* 1 if pending work u is ordered before item upto of stream x: on the
 * same stream, or (transitively) before a pending cudaStreamWaitEvent
 * barrier of x that precedes upto; 0 if not (or upto is NULL).  Time
 * linear in the pending items of the streams it reaches.  Lock held
 * (writes the streams' walk marks and fake.walk). */
int fake_work_ordered_before(const struct fake_work *u, struct fstream *x,
                             const struct fake_work *upto);

/* ---- fake_memory.c ------------------------------------------------------ */

/* The allocation containing p (exact: starting at p), released ones
 * included, or NULL.  Lock held. */
struct falloc *fake_alloc_find(const void *p, int exact);

/* ---- fake_oracle.c ------------------------------------------------------ */

/* Record a violation: count it, remember it, print it as a TAP comment
 * "# fake oracle: ...".  Lock held (fake.last_violation). */
void fake_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Registered with atexit: prints the count and ends the process with
 * status 1 if violations were not forgiven. */
void fake_oracle_at_exit(void);

/* The bytes that a use of p means: the block handed out of its allocation
 * a that contains p, or all of a when none does.  Lock held. */
struct frange fake_alloc_block_of(const struct falloc *a, uintptr_t p);

/* An async allocation a made on s: usable on s at once, elsewhere only
 * after s's work enqueued so far (its memory may be what that work freed
 * with cudaFreeAsync).  Lock held. */
void fake_alloc_ordered(struct falloc *a, struct fstream *s);

/* Note that work w uses the block containing p (fake_alloc_block_of), if p
 * is in an allocation; using a released one is a violation.  Lock held. */
void fake_alloc_add_use(struct fake_work *w, const void *p);

/* Same for the bytes r (a graph's launch: what its capture used).  Lock
 * held. */
void fake_alloc_add_use_range(struct fake_work *w, struct frange r);

/* The oracle's check of releasing allocation a (p, by fn; async: the
 * stream of a cudaFreeAsync, else NULL): a violation when work or a graph
 * may still use any of it.  Forgets a's users and blocks.  Lock held. */
void fake_oracle_release(struct falloc *a, const void *p, const char *fn,
                         struct fstream *async);

/* ---- fake_graph.c ------------------------------------------------------ */

/* A graph or executable graph, not destroyed, that uses bytes of r (it
 * can still be launched), or NULL.  Lock held. */
struct fgraph *fake_graph_using(struct frange r);

/* Work of kind (us: its duration if timed) launched on capturing stream s:
 * added to its graph with the allocations it uses, never run.  Returns a
 * work item that never completes.  Lock held. */
struct fake_work *fake_capture_work(struct fstream *s, enum work_kind kind,
                                    unsigned us, void *const *uses,
                                    size_t nuses);

/* A call that may not be made on capturing stream s was: its capture is
 * invalidated (as CUDA does); returns cudaErrorStreamCaptureUnsupported.
 * Lock held. */
cudaError_t fake_capture_invalidate(struct fstream *s);

/* A "potentially unsafe" call (see fake_cuda.h, THE MODEL) by the calling
 * thread: cudaSuccess if allowed; else the captures it conflicts with are
 * invalidated and cudaErrorStreamCaptureUnsupported returned.  Lock held. */
cudaError_t fake_capture_unsafe_call(void);

#define UNSAFE_CALL() do { cudaError_t u_ = fake_capture_unsafe_call(); \
        if (u_ != cudaSuccess) return fake_leave(u_); } while (0)

/* The capture status of s: None, Active or Invalidated.  Lock held. */
enum cudaStreamCaptureStatus fake_capture_status(const struct fstream *s);

/* Whether s is a legacy stream while a blocking stream of its device (one
 * not created with cudaStreamNonBlocking, or a per-thread default stream)
 * captures, in any thread and mode: its capture status is then
 * cudaErrorStreamCaptureImplicit.  Lock held. */
int fake_capture_implicit(const struct fstream *s);

/* References to user objects may have dropped: make sure the destructor
 * thread runs, and wake it.  Lock held. */
void fake_uobj_kick(void);

/* cudaMalloc memory freed on s with cudaFreeAsync leaves the devices' use
 * (fake.devused) now: s was synchronized (or destroyed, or its device).
 * Lock held. */
void fake_unmap_settle(struct fstream *s);

#endif /* CUDEFER_FAKE_INTERNAL_H */
