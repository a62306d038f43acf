/*
 * stress.h — what the two halves of the stress test share: stress.c (the
 * options, the configuration drawn from the seed, failures, the watchdog and
 * main) and stress_worker.c (a thread's operations and their checks).
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

extern struct worker *workers;

/* Totals across threads and callbacks. */
extern _Atomic unsigned long calls_run, nested_deferred;
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
    NOPS
};
_Static_assert(NOPS <= 16, "struct worker counts 16 kinds of operation");

extern const char *const op_names[NOPS];

/* Set the operations' weights from cfg.  main, before the threads start. */
void set_weights(void);

/* A worker thread: its quota of operations, a final flush check, then its
 * streams and events destroyed.  arg: its struct worker. */
void *worker_main(void *arg);

#endif /* CUDEFER_STRESS_H */
