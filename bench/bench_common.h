/* SPDX-License-Identifier: MIT */
/*
 * bench_common: what every benchmark program shares.  Each program runs one
 * (workload, strategy, repetition) in its own process and prints ONE JSON
 * object on stdout; bench/run.py starts them, reads that line and does the
 * statistics.  Here: messages and exit on error, the clock, percentiles,
 * resident memory, the reclaimer's CPU time and counters, the device-memory
 * sampler, the JSON writer (no parser: C never reads JSON) and the command
 * line every program takes.
 */
#ifndef CUDEFER_BENCH_COMMON_H
#define CUDEFER_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <pthread.h>
#include <stdatomic.h>
#include <cuda_runtime_api.h>

#include "naive_reclaimer.h"

/* ---- messages ----------------------------------------------------------- */

/* "bench-launch-loop [W1 cudefer rep 0]": the prefix of every message. */
extern char bench_who[200];
/* The device every program uses (0). */
extern int bench_device;

/* Print "WHO: message" on stderr and exit with status 1.  Any thread. */
void bench_die(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));

/* A note on stderr ("WHO: note: message"); bench/run.py shows it. */
void bench_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Exit through bench_die when a CUDA call fails, naming the call. */
#define CK(call)                                                            \
    do {                                                                    \
        cudaError_t ck_rc_ = (call);                                        \
        if (ck_rc_ != cudaSuccess)                                          \
            bench_die("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,      \
                      cudaGetErrorName(ck_rc_), cudaGetErrorString(ck_rc_)); \
    } while (0)

/* calloc that never returns NULL (dies instead); zeroed memory. */
void *bench_calloc(size_t n, size_t size);

/* ---- time and numbers --------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds.  Any thread; never blocks. */
uint64_t bench_now_ns(void);
/* Sleep us microseconds (restarted after a signal). */
void bench_sleep_us(unsigned us);
/* Sort n nanosecond values in place (for bench_pct_us). */
void bench_sort_u64(uint64_t *v, size_t n);
/* Nearest-rank percentile p (0..100) of sorted nanoseconds, in us;
 * NaN when n is 0. */
double bench_pct_us(const uint64_t *sorted, size_t n, unsigned p);
/* Mean of n nanosecond values, in us; NaN when n is 0. */
double bench_mean_us(const uint64_t *v, size_t n);
/* num / den, or NaN when either is NaN or den <= 0. */
double bench_ratio(double num, double den);
/* Resident set size of this process in bytes (/proc/self/statm), or NaN. */
double bench_rss_bytes(void);

/* ---- the reclaimer: CPU time and counters ------------------------------- */

struct bench_cpu {
    double clock_ms;   /* thread CPU clock (ns resolution) */
    double stat_ms;    /* utime + stime of /proc/self/task/TID/stat (ticks) */
    int threads;       /* 0: not measured */
};

/* CPU time of cudefer's reclaimer threads (named "cudefer-reclaim").
 * threads is 0 (and the times NaN) when there is none; says so once. */
struct bench_cpu bench_cpu_cudefer(void);
/* CPU time of thread tid of this process (a bench's own reclaimer). */
struct bench_cpu bench_cpu_thread(pid_t tid);
/* A "not measured" value (NaN times), for strategies without a reclaimer. */
struct bench_cpu bench_cpu_none(void);
/* b - a in ms (stat: from the tick counts), or NaN unless both measured the
 * same threads. */
double bench_cpu_delta(const struct bench_cpu *a, const struct bench_cpu *b,
                       int stat);

/* The reclaimer's counters as doubles (NaN where a strategy has none). */
struct bench_snap {
    double deferred, released, failed, queries, wakeups, batches,
        sync_releases, pending, events_created, rejected, cache_mallocs,
        cache_releases;
};

/* Counters of cudefer (defer_stats_get). */
void bench_snap_cudefer(struct bench_snap *s);
/* Counters of the naive reclaimer. */
void bench_snap_naive(struct naive_reclaimer *nr, struct bench_snap *s);
/* All NaN: a strategy with no reclaimer. */
void bench_snap_none(struct bench_snap *s);

/* ---- device memory in use ----------------------------------------------- */

/* A thread that reads cudaMemGetInfo about every millisecond. */
struct bench_sampler {
    pthread_t thread;
    atomic_int stop;
    size_t min_free;
    uint64_t samples;
};

/* Start sampling (on bench_device).  Dies if the thread cannot start. */
void bench_sampler_start(struct bench_sampler *s);
/* Stop and join; returns the peak in bytes above base_free (0 if none). */
double bench_sampler_stop(struct bench_sampler *s, size_t base_free);

/* ---- the one JSON object on stdout -------------------------------------- */

/* Start the object.  One object per process; not thread-safe. */
void json_begin(void);
/* A string member (escaped). */
void json_str(const char *key, const char *value);
/* A number member; NaN and infinities are written as null. */
void json_num(const char *key, double value);
/* Close the object and print it as one line on stdout. */
void json_end(void);

/* ---- the command line --------------------------------------------------- */

struct bench_args {
    const char *workload;  /* --workload W1 */
    const char *strategy;  /* --strategy cudefer (a built-in strategy) */
    const char *label;     /* --label NAME: the row's name (a variant's) */
    int rep;               /* --rep N: only written into the result */
    long iters;            /* --iters N (W1-W4) */
    long calls;            /* --calls N (W5) */
    long entries;          /* --entries N (W6) */
};

/* Parse the options every program takes (usage names this program's
 * workloads and strategies).  --info prints the device and versions as one
 * JSON object and exits; --help prints usage and exits; bad input exits
 * with status 2 and a message.  Sets bench_who; touches no CUDA. */
void bench_parse_args(int argc, char **argv, const char *program,
                      const char *usage, struct bench_args *a);

/* Initialize CUDA on bench_device (0); dies without a device.  Main thread,
 * after the arguments were checked. */
void bench_cuda_init(void);

/* Members every result starts with: workload, strategy, kind, rep. */
void bench_json_head(const struct bench_args *a);

/* End of a run: defer_shutdown when the strategy used cudefer, then a device
 * synchronize.  Returns the exit status (3 when defer_shutdown failed). */
int bench_finish(int used_cudefer);

#endif
