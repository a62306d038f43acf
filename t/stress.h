/* SPDX-License-Identifier: MIT */
/*
 * stress.h — what the parts of the stress test share: stress.c (the
 * options, the configuration drawn from the seed, failures, the watchdog and
 * main), stress_worker.c (a thread's operations and their checks),
 * stress_blocks.c (how a block of defer_alloc's is got, used and freed,
 * checked) and stress_alloc.c (the operations on blocks).
 */
#ifndef CUDEFER_STRESS_H
#define CUDEFER_STRESS_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

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
#define MAX_KEPT 8            /* blocks a thread keeps live across operations */
#define MAX_BAND 128          /* blocks of its own size a thread tracks */
#define MAX_MISTAKEN 16       /* host pointers given to defer_free by mistake,
                                 freed after the thread's next flush */

/* ---- options and configuration (stress.c) --------------------------------- */

/* The command line; set by main before any thread starts. */
struct stress_options {
    uint64_t seed;
    unsigned long entries;
    int threads, devices, streams;
};
extern struct stress_options opt;

/* How often threads trim and flush, and cudefer's idle and poll times, as
 * drawn from the seed; set by main before any thread starts. */
struct stress_config {
    unsigned idle_us, poll_max_us;
    unsigned trim_per_100k, flush_per_100k; /* how often threads trim, flush */
    unsigned split_min;                     /* CUDEFER_SPLIT_MIN (0: off) */
    bool reuse;     /* the fake reuses addresses (fake_set_address_reuse) */
    unsigned round_divisions;               /* CUDEFER_ROUND_DIVISIONS */
};
extern struct stress_config cfg;

/* ---- the random numbers ---------------------------------------------------- */

/* splitmix64: a 64-bit counter through a bijective mixer. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
};

static inline struct rng rng_for(uint64_t seed, uint64_t stream)
{
    return (struct rng){mix64(seed ^ mix64(stream + 1))};
}

static inline uint64_t rng_next(struct rng *r)
{
    r->s += UINT64_C(0x9e3779b97f4a7c15);
    return mix64(r->s);
}

/* Uniform in [0, n). */
static inline uint32_t rng_below(struct rng *r, uint32_t n)
{
    return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

static inline bool rng_percent(struct rng *r, uint32_t pct)
{
    return rng_below(r, 100) < pct;
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
    F_HANDOUT,      /* defer_alloc handed out what it must not (not inside
                       a live device allocation of the stream's device, or
                       overlapping a block still live elsewhere) */
    F_REUSE,        /* a block freed behind held work went to another stream,
                       or its own stream did not get one back */
    F_WRONG,        /* a wrong input did not get its expected result */
    F_DEVICE,       /* a pluggable entry point changed the current device */
    NFAILURES
};

/* Bail out, saying how to replay the run.  Any thread. */
_Noreturn void stress_die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Count a failure of kind f; explain the first MAX_DIAGS; stop the run at
 * MAX_FAILURES.  Any thread. */
void stress_fail(enum failure f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

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
    cudaEvent_t ev;     /* the event defer_call recorded (the fake's word) */
    struct call *next_free;
};

/* An entry deferred since the thread's last flush check. */
struct item {
    void *p;            /* a buffer, or NULL for a callback */
    unsigned long long serial; /* the fake's allocation of p (its address
                                  may be reused once p is released) */
    struct call *call;
    fake_work *captured; /* what its event captured, if known */
    bool known;         /* captured is exact (NULL: nothing, complete at once) */
    bool verified;      /* already seen released (by a trim check) */
    bool due;           /* trim check: complete before the trim */
    bool may_wait;      /* trim check: a callback that may wait past its
                           work (call_may_wait_all) */
};

/* A block the thread keeps live across operations: lane is where it was
 * allocated and used (its blocks are freed before its stream is destroyed). */
struct kept_block {
    void *p;
    size_t bytes;
    struct lane *lane;
    bool pluggable;
};

/* A block of the thread's held-work size (stress_alloc.c) and the stream it
 * was last freed on: the lane, and its handle then (own lanes are
 * recreated with new handles). */
struct band_block {
    void *p;
    unsigned long long serial; /* its allocation (fake_allocation_serial) */
    const struct lane *lane;
    cudaStream_t h;
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
    unsigned long ops[24];         /* by enum op */
    unsigned long flushes, trims, flush_checked, trim_checked, calls;
    unsigned long trim_exempt; /* callbacks left out: may share an event,
                                  or wait behind one that does */
    cudaEvent_t pending_events[MAX_ITEMS]; /* call_may_wait_all's scratch */
    struct order *waiting_orders[MAX_ITEMS]; /* and its streams' */
    struct kept_block kept[MAX_KEPT];
    int nkept;
    struct band_block band[MAX_BAND];
    size_t nband;
    void *mistaken[MAX_MISTAKEN];
    size_t nmistaken;
    unsigned long handouts, pluggable, held_frees, wrong[8];
    _Atomic unsigned long progress;
};

extern struct worker *workers;

/* Totals across threads and callbacks. */
extern _Atomic unsigned long calls_run, nested_deferred;
/* Wrong inputs given so far: refused ones (stats' rejected, with the
 * flushes refused in callbacks) and accepted ones whose release fails
 * (stats' failed, the fake's invalid releases). */
extern _Atomic unsigned long wrong_refused, wrong_failing;
extern _Atomic int lull; /* 1 while a thread makes a quiet moment */
extern _Atomic int phase_done;
extern const char *_Atomic phase;

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000),
                          .tv_nsec = (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- the operations (stress_worker.c) -------------------------------------- */

enum op {
    OP_FREE_DEVICE, OP_FREE_HOST, OP_FREE_POOL, OP_FREE_N, OP_CALL, OP_CROSS,
    OP_NOTHING, OP_SET_DEVICE, OP_TRIM, OP_FLUSH, OP_RECYCLE, OP_LULL, OP_SPAWN,
    OP_ALLOC, OP_ALLOC_N, OP_ALLOC_HELD, OP_ALLOC_WRONG,
    NOPS
};
_Static_assert(NOPS <= 24, "struct worker counts 24 kinds of operation");

extern const char *const op_names[NOPS];

/* Set the operations' weights from cfg.  main, before the threads start. */
void set_weights(void);

/* A worker thread: its quota of operations, a final flush check, then its
 * streams and events destroyed.  arg: its struct worker. */
void *worker_main(void *arg);

/* Shared with stress_alloc.c; each is called by the worker thread w only. */
void cuda_ok(cudaError_t err, const char *what);
void use_device(struct worker *w, int dev);
size_t random_size(struct worker *w);
struct lane *pick_lane(struct worker *w);
fake_work *launch(struct worker *w, struct lane *l, void *const *uses,
                  size_t n);
void *malloc_device(size_t size);
void note(struct worker *w, const struct lane *l, void *p, struct call *c);
void accepted(struct worker *w, cudaError_t err, const char *what,
              const struct lane *l, const void *p);

/* ---- getting, using and freeing blocks (stress_blocks.c) ------------------- */

/* main, before the threads start: the set of blocks handed out and live. */
void alloc_init(void);

/* A block of at least bytes for l, from defer_pluggable_alloc (sometimes
 * called from another current device, which it must leave as it was) or
 * defer_alloc, its hand-out checked and counted.  NULL (a failure) when
 * refused.  l's device is current afterwards when l is a per-thread or
 * legacy stream.  Worker thread w; blocks only where defer_alloc does. */
void *block_get(struct worker *w, struct lane *l, size_t bytes,
                bool pluggable);

/* Work on l that uses p; sometimes (when second_ok) also work on another of
 * the thread's created streams (any device: peer access), recorded with
 * defer_record_stream.  Returns that second lane, or NULL.  Worker thread
 * w. */
struct lane *block_use(struct worker *w, struct lane *l, void *p,
                       bool second_ok);

/* The rank of lane l of thread w: its created streams 0.., then its
 * per-thread streams, the legacy stream -1.  A barrier (order_after) only
 * ever goes from a lane to one of higher rank, so the barriers pending on a
 * thread's streams never form a cycle and the legacy stream, which all
 * threads share, never has one: the fake's oracle searches every path
 * through pending barriers, and a web of them makes its checks crawl. */
int lane_rank(const struct worker *w, const struct lane *l);

/* A lane of device dev other than not, of rank above `above` (-2: any),
 * drawn: a created stream of the thread's on dev, its per-thread stream
 * or, when shared_ok, the legacy stream of dev (handle 0 or
 * cudaStreamLegacy), which all threads share; not itself when there is no
 * other.  Worker thread w. */
struct lane *lane_on(struct worker *w, int dev, const struct lane *not,
                     bool shared_ok, int above);

/* Later work on to waits for the work enqueued on from so far: an event
 * recorded on from, waited for on to, of higher rank (lane_rank).  Worker
 * thread w. */
void order_after(struct worker *w, struct lane *from, struct lane *to);

/* The owner of block p, right before it frees p outside block_free (after
 * the call another thread may get it).  Bails if p is not live. */
void live_remove(void *p);

/* The ways a block is freed (block_free).  FREE_ANY draws one. */
enum free_way {
    FREE_SAME, FREE_OTHER_STREAM, FREE_OTHER_DEVICE, FREE_STREAMS, FREE_N,
    NFREE_WAYS, FREE_ANY
};
extern const char *const free_way_names[NFREE_WAYS];

/* A block to free: bytes asked for, allocated and used on lane, also used
 * on second (recorded) unless NULL, from defer_pluggable_alloc when
 * pluggable (freed with defer_pluggable_free when freed on its stream);
 * freed only on streams no other thread uses when unshared (lane must be
 * one), so that no other thread can have it before its work is done. */
struct freeing {
    void *p;
    size_t bytes;
    struct lane *lane, *second;
    bool pluggable, unshared;
};

/* Free f's block the way given (or drawn; *used gets it unless NULL).
 * held: unless NULL, work is held on the free's stream first, so that the
 * free cannot complete before the caller completes *held.  Returns the
 * lane it was freed on (the first stream of defer_free_streams), or NULL
 * when it was refused (a failure).  Worker thread w; never blocks. */
struct lane *block_free(struct worker *w, const struct freeing *f,
                        enum free_way way, fake_work **held,
                        enum free_way *used);

/* ---- the operations on defer_alloc's blocks (stress_alloc.c) --------------- */

/* The kinds of wrong input (struct worker's wrong[] counts them). */
enum wrong_input {
    WRONG_DOUBLE_FREE, WRONG_RECORD_FREED, WRONG_RECORD_PER_THREAD,
    WRONG_INTERIOR, WRONG_HOST_TO_DEFER_FREE, WRONG_ZERO_BYTES, NWRONG
};
_Static_assert(NWRONG <= 8, "struct worker counts 8 kinds of wrong input");
extern const char *const wrong_names[NWRONG];

/* The operations: a block allocated, used and freed one of the ways (or
 * kept, or a kept one freed); several blocks and other memory freed
 * together; a block freed behind held work, then asked for on other
 * streams and on its own; a wrong input.  Worker thread w only. */
void op_alloc(struct worker *w);
void op_alloc_n(struct worker *w);
void op_alloc_held(struct worker *w);
void op_alloc_wrong(struct worker *w);

/* Lane l's stream is about to be destroyed: the thread's kept blocks used
 * on it are freed on it first.  Worker thread w only. */
void alloc_lane_closing(struct worker *w, struct lane *l);

/* After a defer_flush of the thread w: the host pointers it gave to
 * defer_free by mistake have failed their release: cudaFreeHost them. */
void alloc_after_flush(struct worker *w);

#endif /* CUDEFER_STRESS_H */
