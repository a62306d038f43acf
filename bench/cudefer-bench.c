/*
 * cudefer-bench: every release strategy on the same workloads, in one
 * invocation, reported as ratios to the no-free limit of the same run.
 *
 * The parent never touches CUDA.  It runs every (workload, strategy,
 * repetition) in a fresh child process (fork + exec of this program with
 * "--child WORKLOAD KIND REP LABEL ..."), with the strategy's CUDEFER_*
 * variables set, and reads the child's result as JSON lines on a pipe (the
 * child's stdout).  A child that fails says why on stderr and exits non-zero;
 * the parent reports it and goes on.  Repetitions are interleaved: rep 0 of
 * every (workload, strategy), then rep 1, ...
 *
 * See bench/README.md for the workloads, the options and the columns.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "naive_reclaimer.h"

extern char **environ;

/* ------------------------------------------------------------------------ */
/* Parameters of the workloads                                              */

#define BUF_BYTES        ((size_t)1 << 20)   /* W1-W5: 1 MiB buffers */
#define KERNEL_NS        50000ull            /* ~50 us gpu_spin_fill */
#define W2_SYNC_EVERY    32                  /* W2: host sync every 32 iters */
#define W4_THREADS       8
#define LIMIT_RING       64                  /* limit: preallocated buffers per thread */
#define WARMUP_ITERS     32                  /* untimed iterations first */
#define NAIVE_POLL_US    50
#define SAMPLER_US       1000                /* cudaMemGetInfo every ~1 ms */
#define W5_BUSY_NS       200000000ull        /* W5 busy: 200 ms gpu_spin first */
#define W6_STREAMS       1024
#define W6_THREADS       64
#define W6_GATE_NS       20000000000ull      /* gate kernel gives up after 20 s */
#define W6_STALL_NS      300000000ull        /* no enqueue progress for 300 ms */

#define DEF_ITERS        5000
#define DEF_W5_CALLS     20000
#define DEF_W6_ENTRIES   1000000
#define QUICK_ITERS      500
#define QUICK_W5_CALLS   2000
#define QUICK_W6_ENTRIES 65536
#define DEF_REPS         3
#define DEF_TIMEOUT_S    120

enum kind { K_LIMIT, K_INLINE_FREE, K_INLINE_ASYNC, K_NAIVE, K_CUDEFER,
             K_CUDEFER_ALLOC, K_N };
static const char *const kind_names[K_N] = {
    "limit", "inline-cudaFree", "inline-async", "naive-reclaimer", "cudefer",
    "cudefer-alloc",
};
/* cudefer-alloc: W1 with defer_alloc in place of cudaMalloc, defer_free. */
#define IS_CUDEFER(k) ((k) == K_CUDEFER || (k) == K_CUDEFER_ALLOC)
#define KM(k) (1u << (k))
#define KM_ALL (KM(K_LIMIT) | KM(K_INLINE_FREE) | KM(K_INLINE_ASYNC) | \
                KM(K_NAIVE) | KM(K_CUDEFER) | KM(K_CUDEFER_ALLOC))

enum wl { W1, W2, W3, W4, W5, W6, W_N };
static const struct wl_desc {
    const char *name;
    const char *title;
    unsigned kinds;          /* strategies that apply */
} wls[W_N] = {
    { "W1", "steady: 1 thread, 1 stream, {cudaMalloc 1 MiB, 50 us kernel, release} per iteration, no host sync",
      KM_ALL },
    { "W2", "bursty: W1 with cudaStreamSynchronize every 32 iterations",
      KM_ALL },
    { "W3", "pool: W1 with cudaMallocAsync allocations (cudefer: defer_free of pool memory)",
      KM(K_LIMIT) | KM(K_INLINE_ASYNC) | KM(K_CUDEFER) },
    { "W4", "threads: 8 launching threads, each W1 on its own stream",
      KM_ALL },
    { "W5", "call cost: the release call alone, 1 MiB buffers",
      KM(K_INLINE_FREE) | KM(K_INLINE_ASYNC) | KM(K_NAIVE) | KM(K_CUDEFER) },
    { "W6", "scale: defer_call (trivial callback) over 1024 streams from 64 threads, streams held back by a gate kernel",
      KM(K_CUDEFER) },
};

struct opts {
    int iters;
    int reps;
    int w5_calls;
    int w6_entries;
    int timeout_s;
};

/* ------------------------------------------------------------------------ */
/* Small utilities                                                          */

static char g_who[200] = "cudefer-bench";
static int g_device;

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    char msg[600];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", g_who, msg);
    fflush(stderr);
    _exit(1);
}

#define CK(call)                                                            \
    do {                                                                    \
        cudaError_t ck_rc_ = (call);                                        \
        if (ck_rc_ != cudaSuccess)                                          \
            die("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,            \
                cudaGetErrorName(ck_rc_), cudaGetErrorString(ck_rc_));      \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p)
        die("out of memory (%zu x %zu bytes)", n, sz);
    return p;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = { (time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array of nanoseconds, in us. */
static double pct_us(const uint64_t *sorted, size_t n, unsigned p)
{
    size_t rank;

    if (n == 0)
        return NAN;
    rank = (size_t)(((unsigned long long)p * n + 99) / 100);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return (double)sorted[rank - 1] / 1000.0;
}

static double mean_us(const uint64_t *v, size_t n)
{
    long double s = 0;
    size_t i;

    if (n == 0)
        return NAN;
    for (i = 0; i < n; i++)
        s += v[i];
    return (double)(s / n / 1000.0L);
}

/* Read a small /proc file into buf (NUL-terminated).  Returns its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n, got = 0;

    if (fd < 0)
        return -1;
    while ((size_t)got + 1 < cap) {
        n = read(fd, buf + got, cap - 1 - (size_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += n;
    }
    close(fd);
    buf[got] = '\0';
    return got;
}

/* Resident set size of this process, from /proc/self/statm. */
static double rss_bytes(void)
{
    char buf[256];
    unsigned long size, resident;

    if (read_small("/proc/self/statm", buf, sizeof buf) <= 0 ||
        sscanf(buf, "%lu %lu", &size, &resident) != 2)
        return NAN;
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

/* ------------------------------------------------------------------------ */
/* Reclaimer CPU time                                                       */

struct cpu {
    double clock_ms;   /* thread CPU clock (sum_exec_runtime, ns resolution) */
    double stat_ms;    /* utime + stime of /proc/self/task/TID/stat (ticks) */
    int threads;
};

static void task_cpu(pid_t tid, double *clock_ms, double *stat_ms)
{
    /* The CPU clock of thread tid of this process, as the kernel defines it
     * (glibc's pthread_getcpuclockid builds the same id). */
    clockid_t cid = (clockid_t)(int)((~(unsigned)tid << 3) | 6u);
    struct timespec ts;
    char path[64], buf[1024];
    unsigned long ut, st;
    const char *p;

    if (clock_gettime(cid, &ts) == 0)
        *clock_ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
    else
        *clock_ms = NAN;

    *stat_ms = NAN;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return;
    p = strrchr(buf, ')');
    if (!p)
        return;
    /* fields 3..15: state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
               &ut, &st) == 2)
        *stat_ms = (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static struct cpu reclaimer_cpu(enum kind k, struct naive_reclaimer *nr)
{
    struct cpu c = { 0, 0, 0 };
    DIR *d;
    struct dirent *de;

    if (k == K_NAIVE) {
        task_cpu(naive_tid(nr), &c.clock_ms, &c.stat_ms);
        c.threads = 1;
        return c;
    }
    if (!IS_CUDEFER(k)) {
        c.clock_ms = c.stat_ms = NAN;
        return c;
    }
    d = opendir("/proc/self/task");
    if (!d) {
        c.clock_ms = c.stat_ms = NAN;
        return c;
    }
    while ((de = readdir(d)) != NULL) {
        char path[300], comm[64];
        double cm, sm;
        size_t len;

        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        if (read_small(path, comm, sizeof comm) <= 0)
            continue;
        len = strlen(comm);
        while (len && (comm[len - 1] == '\n' || comm[len - 1] == ' '))
            comm[--len] = '\0';
        if (strncmp(comm, "cudefer-reclaim", 15) != 0)
            continue;
        task_cpu((pid_t)atoi(de->d_name), &cm, &sm);
        c.clock_ms += cm;
        c.stat_ms += sm;
        c.threads++;
    }
    closedir(d);
    if (c.threads == 0) {
        static int warned;
        if (!warned++)
            fprintf(stderr, "%s: no thread named \"cudefer-reclaim\" in "
                    "/proc/self/task: reclaimer CPU not measured\n", g_who);
        c.clock_ms = c.stat_ms = NAN;
    }
    return c;
}

static double cpu_delta(const struct cpu *a, const struct cpu *b, int stat)
{
    if (a->threads == 0 || b->threads != a->threads)
        return NAN;
    return stat ? b->stat_ms - a->stat_ms : b->clock_ms - a->clock_ms;
}

/* ------------------------------------------------------------------------ */
/* Reclaimer counters (cudefer's stats or the naive reclaimer's)            */

struct snap {
    double deferred, released, failed, queries, wakeups, batches,
        sync_releases, pending, events_created, rejected;
};

static void snap_get(enum kind k, struct naive_reclaimer *nr, struct snap *s)
{
    memset(s, 0, sizeof *s);
    if (IS_CUDEFER(k)) {
        struct defer_stats st;
        memset(&st, 0, sizeof st);
        defer_stats_get(&st);
        s->deferred = (double)st.deferred;
        s->released = (double)st.released;
        s->failed = (double)st.failed;
        s->queries = (double)st.event_queries;
        s->wakeups = (double)st.wakeups;
        s->batches = (double)st.batches;
        s->sync_releases = (double)st.sync_releases;
        s->pending = (double)st.pending;
        s->events_created = (double)st.events_created;
        s->rejected = (double)st.rejected;
    } else if (k == K_NAIVE) {
        struct naive_stats st;
        naive_stats_get(nr, &st);
        s->deferred = (double)st.deferred;
        s->released = (double)st.released;
        s->failed = (double)st.failed;
        s->queries = (double)st.event_queries;
        s->wakeups = (double)st.polls;
        s->batches = NAN;
        s->sync_releases = NAN;
        s->pending = (double)(st.deferred - st.released - st.failed);
        s->events_created = (double)st.deferred;
        s->rejected = NAN;
    } else {
        s->deferred = s->released = s->failed = s->queries = s->wakeups =
            s->batches = s->sync_releases = s->pending = s->events_created =
                s->rejected = NAN;
    }
}

static double ratio_or_nan(double num, double den)
{
    if (isnan(num) || isnan(den) || den <= 0)
        return NAN;
    return num / den;
}

/* ------------------------------------------------------------------------ */
/* JSON writer (flat objects)                                               */

struct jw {
    char *buf;
    size_t len, cap;
    int first;
};

static void jw_raw(struct jw *j, const char *s)
{
    size_t n = strlen(s);
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 1024;
        while (j->len + n + 1 > cap)
            cap *= 2;
        j->buf = realloc(j->buf, cap);
        if (!j->buf)
            die("out of memory");
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n + 1);
    j->len += n;
}

static void jw_begin(struct jw *j)
{
    j->len = 0;
    j->first = 1;
    jw_raw(j, "{");
}

static void jw_end(struct jw *j)
{
    jw_raw(j, "}");
}

static void jw_qstr(struct jw *j, const char *s)
{
    char tmp[8];
    jw_raw(j, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            tmp[2] = '\0';
        } else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
        } else {
            tmp[0] = (char)c;
            tmp[1] = '\0';
        }
        jw_raw(j, tmp);
    }
    jw_raw(j, "\"");
}

static void jw_key(struct jw *j, const char *k)
{
    if (!j->first)
        jw_raw(j, ",");
    j->first = 0;
    jw_qstr(j, k);
    jw_raw(j, ":");
}

static void jw_str(struct jw *j, const char *k, const char *v)
{
    jw_key(j, k);
    jw_qstr(j, v);
}

static void jw_num(struct jw *j, const char *k, double v)
{
    char tmp[64];
    jw_key(j, k);
    if (isnan(v) || isinf(v)) {
        jw_raw(j, "null");
        return;
    }
    if (v > -9e15 && v < 9e15 && (double)(long long)v == v)
        snprintf(tmp, sizeof tmp, "%.0f", v);
    else
        snprintf(tmp, sizeof tmp, "%.6g", v);
    jw_raw(j, tmp);
}

/* Print one result line on stdout (the pipe to the parent). */
static void jw_emit(struct jw *j)
{
    jw_end(j);
    fputs(j->buf, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Device-memory sampler                                                    */

struct sampler {
    pthread_t th;
    atomic_int stop;
    size_t min_free;
    uint64_t samples;
};

static void *sampler_main(void *arg)
{
    struct sampler *s = arg;

    pthread_setname_np(pthread_self(), "bench-sampler");
    if (cudaSetDevice(g_device) != cudaSuccess)
        return NULL;
    for (;;) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
            if (fr < s->min_free)
                s->min_free = fr;
            s->samples++;
        }
        if (atomic_load(&s->stop))
            break;
        sleep_us(SAMPLER_US);
    }
    return NULL;
}

static void sampler_start(struct sampler *s)
{
    int rc;
    s->min_free = SIZE_MAX;
    s->samples = 0;
    atomic_store(&s->stop, 0);
    rc = pthread_create(&s->th, NULL, sampler_main, s);
    if (rc)
        die("pthread_create: %s", strerror(rc));
}

static void sampler_stop(struct sampler *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->th, NULL);
}

/* ------------------------------------------------------------------------ */
/* Allocation and release per strategy                                      */

static cudaError_t alloc_buf(enum kind k, int pool, void **p, cudaStream_t s)
{
    if (k == K_INLINE_ASYNC || pool)
        return cudaMallocAsync(p, BUF_BYTES, s);
    if (k == K_CUDEFER_ALLOC)
        return defer_alloc(p, BUF_BYTES, s);
    return cudaMalloc(p, BUF_BYTES);
}

static cudaError_t release_buf(enum kind k, struct naive_reclaimer *nr,
                               void *p, cudaStream_t s)
{
    switch (k) {
    case K_LIMIT:
        return cudaSuccess;
    case K_INLINE_FREE:
        return cudaFree(p);
    case K_INLINE_ASYNC:
        return cudaFreeAsync(p, s);
    case K_NAIVE:
        return naive_free(nr, p, s);
    case K_CUDEFER:
    case K_CUDEFER_ALLOC:
        return defer_free(p, s);
    default:
        return cudaErrorInvalidValue;
    }
}

/* Wait until everything released so far is really released. */
static void release_all(enum kind k, struct naive_reclaimer *nr)
{
    if (IS_CUDEFER(k))
        CK(defer_flush());
    else if (k == K_NAIVE)
        naive_drain(nr);
}

/* ------------------------------------------------------------------------ */
/* W1-W4: the launch loop                                                   */

struct worker {
    enum kind kind;
    int pool;
    int sync_every;
    int iters;
    cudaStream_t stream;
    void *ring[LIMIT_RING];
    uint64_t *iter_ns, *call_ns;
    uint64_t t_end;
    struct naive_reclaimer *nr;
    pthread_barrier_t *ready, *go;
};

static void do_iters(struct worker *w, int n, int timed)
{
    int i;

    for (i = 0; i < n; i++) {
        uint64_t a, b, c, d;
        void *p;

        a = now_ns();
        if (w->kind == K_LIMIT)
            p = w->ring[i % LIMIT_RING];
        else
            CK(alloc_buf(w->kind, w->pool, &p, w->stream));
        CK(gpu_spin_fill(w->stream, KERNEL_NS, p, BUF_BYTES, (unsigned char)i));
        b = now_ns();
        CK(release_buf(w->kind, w->nr, p, w->stream));
        c = now_ns();
        if (w->sync_every && (i + 1) % w->sync_every == 0)
            CK(cudaStreamSynchronize(w->stream));
        d = now_ns();
        if (timed) {
            w->iter_ns[i] = d - a;
            w->call_ns[i] = c - b;
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    int r;

    CK(cudaSetDevice(g_device));
    CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    if (w->kind == K_LIMIT)
        for (r = 0; r < LIMIT_RING; r++)
            CK(cudaMalloc(&w->ring[r], BUF_BYTES));
    do_iters(w, w->iters < WARMUP_ITERS ? w->iters : WARMUP_ITERS, 0);
    CK(cudaStreamSynchronize(w->stream));
    pthread_barrier_wait(w->ready);
    pthread_barrier_wait(w->go);
    do_iters(w, w->iters, 1);
    CK(cudaStreamSynchronize(w->stream));
    w->t_end = now_ns();
    return NULL;
}

static void run_loops(enum wl wl, enum kind k, int rep, const char *label,
                      const struct opts *o)
{
    int T = wl == W4 ? W4_THREADS : 1;
    struct worker *ws = xcalloc((size_t)T, sizeof *ws);
    pthread_t *th = xcalloc((size_t)T, sizeof *th);
    pthread_barrier_t ready, go;
    struct naive_reclaimer *nr = NULL;
    struct sampler smp;
    struct snap s0, s1;
    struct cpu c0, c1;
    size_t base_free = 0, total = 0, n = (size_t)T * (size_t)o->iters, at;
    uint64_t t0, t_done = 0, t_rel, *iter_all, *call_all;
    double peak;
    struct jw j = { 0 };
    int i, rc;

    if (k == K_NAIVE && naive_start(&nr, NAIVE_POLL_US) != 0)
        die("naive_start failed");
    pthread_barrier_init(&ready, NULL, (unsigned)T + 1);
    pthread_barrier_init(&go, NULL, (unsigned)T + 1);
    for (i = 0; i < T; i++) {
        ws[i].kind = k;
        ws[i].pool = wl == W3;
        ws[i].sync_every = wl == W2 ? W2_SYNC_EVERY : 0;
        ws[i].iters = o->iters;
        ws[i].iter_ns = xcalloc((size_t)o->iters, sizeof(uint64_t));
        ws[i].call_ns = xcalloc((size_t)o->iters, sizeof(uint64_t));
        ws[i].nr = nr;
        ws[i].ready = &ready;
        ws[i].go = &go;
        rc = pthread_create(&th[i], NULL, worker_main, &ws[i]);
        if (rc)
            die("pthread_create: %s", strerror(rc));
    }
    pthread_barrier_wait(&ready);          /* all warmed up, streams idle */
    release_all(k, nr);                    /* warm-up memory released */
    CK(cudaDeviceSynchronize());           /* pools trimmed */
    CK(cudaMemGetInfo(&base_free, &total));
    sampler_start(&smp);
    snap_get(k, nr, &s0);
    c0 = reclaimer_cpu(k, nr);

    t0 = now_ns();
    pthread_barrier_wait(&go);
    for (i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        if (ws[i].t_end > t_done)
            t_done = ws[i].t_end;
    }
    release_all(k, nr);
    t_rel = now_ns();

    snap_get(k, nr, &s1);
    c1 = reclaimer_cpu(k, nr);
    sampler_stop(&smp);
    peak = (smp.samples && smp.min_free < base_free)
               ? (double)(base_free - smp.min_free) : 0.0;

    iter_all = xmalloc(n * sizeof(uint64_t));
    call_all = xmalloc(n * sizeof(uint64_t));
    for (i = 0, at = 0; i < T; i++, at += (size_t)o->iters) {
        memcpy(iter_all + at, ws[i].iter_ns, (size_t)o->iters * sizeof(uint64_t));
        memcpy(call_all + at, ws[i].call_ns, (size_t)o->iters * sizeof(uint64_t));
    }
    qsort(iter_all, n, sizeof(uint64_t), cmp_u64);
    qsort(call_all, n, sizeof(uint64_t), cmp_u64);

    if ((IS_CUDEFER(k) || k == K_NAIVE) && s1.released - s0.released != (double)n)
        fprintf(stderr, "%s: note: %.0f entries released in the timed part, "
                "%zu deferred (sync releases %.0f, failed %.0f)\n", g_who,
                s1.released - s0.released, n,
                s1.sync_releases - s0.sync_releases, s1.failed - s0.failed);

    jw_begin(&j);
    jw_str(&j, "workload", wls[wl].name);
    jw_str(&j, "strategy", label);
    jw_str(&j, "kind", kind_names[k]);
    jw_num(&j, "rep", rep);
    jw_num(&j, "threads", T);
    jw_num(&j, "iters", o->iters);
    jw_num(&j, "done_ms", (double)(t_done - t0) / 1e6);
    jw_num(&j, "released_ms", (double)(t_rel - t0) / 1e6);
    jw_num(&j, "iter_p50_us", pct_us(iter_all, n, 50));
    jw_num(&j, "iter_p99_us", pct_us(iter_all, n, 99));
    jw_num(&j, "iter_max_us", pct_us(iter_all, n, 100));
    jw_num(&j, "call_p50_us", k == K_LIMIT ? NAN : pct_us(call_all, n, 50));
    jw_num(&j, "call_p99_us", k == K_LIMIT ? NAN : pct_us(call_all, n, 99));
    jw_num(&j, "call_max_us", k == K_LIMIT ? NAN : pct_us(call_all, n, 100));
    jw_num(&j, "peak_bytes", peak);
    jw_num(&j, "reclaimer_cpu_ms", cpu_delta(&c0, &c1, 0));
    jw_num(&j, "reclaimer_cpu_ms_stat", cpu_delta(&c0, &c1, 1));
    jw_num(&j, "queries_per_release",
           ratio_or_nan(s1.queries - s0.queries, s1.released - s0.released));
    jw_num(&j, "released", s1.released - s0.released);
    jw_num(&j, "failed", s1.failed - s0.failed);
    jw_num(&j, "sync_releases", s1.sync_releases - s0.sync_releases);
    jw_num(&j, "wakeups", s1.wakeups - s0.wakeups);
    jw_num(&j, "batches", s1.batches - s0.batches);
    jw_num(&j, "mem_samples", (double)smp.samples);
    jw_emit(&j);
    free(j.buf);

    if (nr)
        naive_stop(nr);
    for (i = 0; i < T; i++) {
        free(ws[i].iter_ns);
        free(ws[i].call_ns);
    }
    free(iter_all);
    free(call_all);
    free(ws);
    free(th);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
}

/* ------------------------------------------------------------------------ */
/* W5: the release call alone                                               */

static void run_w5(enum kind k, int rep, const char *label, const struct opts *o)
{
    size_t N = (size_t)o->w5_calls, n, i;
    void **ptrs = xcalloc(N, sizeof(void *));
    uint64_t *lat = xcalloc(N, sizeof(uint64_t));
    struct naive_reclaimer *nr = NULL;
    cudaStream_t s;
    int phase;

    if (k == K_NAIVE && naive_start(&nr, NAIVE_POLL_US) != 0)
        die("naive_start failed");
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* warm-up: the same calls, untimed */
    for (i = 0; i < 64; i++) {
        void *p;
        CK(alloc_buf(k, 0, &p, s));
        CK(release_buf(k, nr, p, s));
    }
    CK(cudaStreamSynchronize(s));
    release_all(k, nr);

    for (phase = 0; phase < 2; phase++) {
        struct snap s0, s1;
        struct cpu c0, c1;
        struct jw j = { 0 };
        double held = NAN;

        for (n = 0; n < N; n++) {
            cudaError_t rc = alloc_buf(k, 0, &ptrs[n], s);
            if (rc == cudaErrorMemoryAllocation) {
                cudaGetLastError();
                fprintf(stderr, "%s: note: out of device memory after %zu "
                        "buffers; timing %zu calls\n", g_who, n, n);
                break;
            }
            CK(rc);
        }
        if (n < 100)
            die("only %zu buffers could be allocated", n);
        CK(cudaStreamSynchronize(s));
        CK(cudaDeviceSynchronize());
        if (phase == 1)
            CK(gpu_spin(s, W5_BUSY_NS));
        snap_get(k, nr, &s0);
        c0 = reclaimer_cpu(k, nr);
        for (i = 0; i < n; i++) {
            uint64_t a = now_ns();
            cudaError_t rc = release_buf(k, nr, ptrs[i], s);
            uint64_t b = now_ns();
            if (rc != cudaSuccess)
                die("release call %zu: %s", i, cudaGetErrorString(rc));
            lat[i] = b - a;
        }
        if (phase == 1) {
            cudaError_t q = cudaStreamQuery(s);
            cudaGetLastError();    /* a not-ready query must not linger */
            held = q == cudaErrorNotReady ? 1.0 : 0.0;
        }
        CK(cudaStreamSynchronize(s));
        release_all(k, nr);
        snap_get(k, nr, &s1);
        c1 = reclaimer_cpu(k, nr);
        qsort(lat, n, sizeof(uint64_t), cmp_u64);

        jw_begin(&j);
        jw_str(&j, "workload", phase ? "W5-busy" : "W5-idle");
        jw_str(&j, "strategy", label);
        jw_str(&j, "kind", kind_names[k]);
        jw_num(&j, "rep", rep);
        jw_num(&j, "calls", (double)n);
        jw_num(&j, "buf_bytes", (double)BUF_BYTES);
        jw_num(&j, "call_p50_us", pct_us(lat, n, 50));
        jw_num(&j, "call_p99_us", pct_us(lat, n, 99));
        jw_num(&j, "call_max_us", pct_us(lat, n, 100));
        jw_num(&j, "call_mean_us", mean_us(lat, n));
        jw_num(&j, "busy_ms", phase ? (double)W5_BUSY_NS / 1e6 : NAN);
        jw_num(&j, "busy_held", held);
        jw_num(&j, "reclaimer_cpu_ms", cpu_delta(&c0, &c1, 0));
        jw_num(&j, "reclaimer_cpu_ms_stat", cpu_delta(&c0, &c1, 1));
        jw_num(&j, "queries_per_release",
               ratio_or_nan(s1.queries - s0.queries, s1.released - s0.released));
        jw_num(&j, "released", s1.released - s0.released);
        jw_num(&j, "sync_releases", s1.sync_releases - s0.sync_releases);
        jw_emit(&j);
        free(j.buf);
    }
    if (nr)
        naive_stop(nr);
    CK(cudaStreamDestroy(s));
    free(ptrs);
    free(lat);
}

/* ------------------------------------------------------------------------ */
/* W6: one million deferred callbacks over 1024 streams from 64 threads     */

static atomic_ulong w6_calls_run;

static void w6_cb(void *arg)
{
    (void)arg;
    atomic_fetch_add_explicit(&w6_calls_run, 1, memory_order_relaxed);
}

struct w6_thr {
    _Alignas(64) atomic_ulong progress;
    cudaStream_t *streams;
    int nstreams;
    uint64_t n;
    uint32_t *lat;
    uint64_t t_end;
    pthread_barrier_t *ready, *go;
    atomic_int *finished;
};

static void *w6_main(void *arg)
{
    struct w6_thr *t = arg;
    uint64_t j;

    CK(cudaSetDevice(g_device));
    pthread_barrier_wait(t->ready);
    pthread_barrier_wait(t->go);
    for (j = 0; j < t->n; j++) {
        cudaStream_t s = t->streams[j % (uint64_t)t->nstreams];
        uint64_t a = now_ns();
        cudaError_t rc = defer_call(w6_cb, NULL, s);
        uint64_t d = now_ns() - a;
        if (rc != cudaSuccess)
            die("defer_call: %s", cudaGetErrorString(rc));
        t->lat[j] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        atomic_store_explicit(&t->progress, j + 1, memory_order_relaxed);
    }
    t->t_end = now_ns();
    atomic_fetch_add(t->finished, 1);
    return NULL;
}

static void run_w6(enum kind k, int rep, const char *label, const struct opts *o)
{
    const int S = W6_STREAMS, T = W6_THREADS, per = W6_STREAMS / W6_THREADS;
    const uint64_t E = (uint64_t)o->w6_entries;
    cudaStream_t *streams = xcalloc((size_t)S, sizeof *streams);
    cudaStream_t gate;
    cudaEvent_t gate_ev;
    volatile int *flag_h;
    int *flag_d;
    struct w6_thr *ts;
    pthread_t *th = xcalloc((size_t)T, sizeof *th);
    pthread_barrier_t ready, go;
    atomic_int finished;
    struct snap s0, sp, s2;
    struct cpu c0, cp = { NAN, NAN, 0 }, c2;
    double rss0, rss_peak = NAN;
    uint64_t t0, t_enq = 0, t_open, t_drained, last_prog = 0, last_change,
        stalled_at = 0, i, at, *lat_all;
    int gate_open = 0, stalled = 0, gate_timed_out = 0, rc, t;
    size_t tsz = ((sizeof(struct w6_thr) * (size_t)T + 63) / 64) * 64;
    struct jw j = { 0 };

    if (k != K_CUDEFER)
        die("W6 runs cudefer only");
    memset(&sp, 0, sizeof sp);
    sp.pending = NAN;
    for (t = 0; t < S; t++)
        CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&gate, cudaStreamNonBlocking));
    CK(cudaHostAlloc((void **)&flag_h, sizeof(int), cudaHostAllocMapped));
    *flag_h = 0;
    CK(cudaHostGetDevicePointer((void **)&flag_d, (void *)flag_h, 0));

    /* warm the library and its per-stream state: one entry per stream */
    for (t = 0; t < S; t++)
        CK(defer_call(w6_cb, NULL, streams[t]));
    CK(defer_flush());
    atomic_store(&w6_calls_run, 0);

    /* close the gate: every stream waits for a kernel that spins on flag */
    CK(gpu_wait_flag(gate, flag_d, W6_GATE_NS));
    CK(cudaEventCreateWithFlags(&gate_ev, cudaEventDisableTiming));
    CK(cudaEventRecord(gate_ev, gate));
    for (t = 0; t < S; t++)
        CK(cudaStreamWaitEvent(streams[t], gate_ev, 0));

    ts = aligned_alloc(64, tsz);
    if (!ts)
        die("out of memory");
    memset(ts, 0, tsz);
    atomic_init(&finished, 0);
    pthread_barrier_init(&ready, NULL, (unsigned)T + 1);
    pthread_barrier_init(&go, NULL, (unsigned)T + 1);
    for (t = 0; t < T; t++) {
        atomic_init(&ts[t].progress, 0);
        ts[t].streams = streams + (size_t)t * (size_t)per;
        ts[t].nstreams = per;
        ts[t].n = E / (uint64_t)T + ((uint64_t)t < E % (uint64_t)T ? 1 : 0);
        ts[t].lat = xmalloc(ts[t].n * sizeof(uint32_t) + 4);
        memset(ts[t].lat, 0, ts[t].n * sizeof(uint32_t) + 4); /* touch: not the library's RSS */
        ts[t].ready = &ready;
        ts[t].go = &go;
        ts[t].finished = &finished;
        rc = pthread_create(&th[t], NULL, w6_main, &ts[t]);
        if (rc)
            die("pthread_create: %s", strerror(rc));
    }
    pthread_barrier_wait(&ready);
    sleep_us(20000);   /* let the threads settle into the barrier */
    rss0 = rss_bytes();
    snap_get(k, NULL, &s0);
    c0 = reclaimer_cpu(k, NULL);

    t0 = now_ns();
    last_change = t0;
    pthread_barrier_wait(&go);
    while (atomic_load(&finished) < T) {
        uint64_t prog = 0, tn;
        sleep_us(2000);
        for (t = 0; t < T; t++)
            prog += atomic_load_explicit(&ts[t].progress, memory_order_relaxed);
        tn = now_ns();
        if (prog != last_prog) {
            last_prog = prog;
            last_change = tn;
        } else if (!gate_open && tn - last_change > W6_STALL_NS) {
            rss_peak = rss_bytes();
            snap_get(k, NULL, &sp);
            cp = reclaimer_cpu(k, NULL);
            stalled = 1;
            stalled_at = prog;
            fprintf(stderr, "%s: note: enqueue made no progress for %llu ms "
                    "at %" PRIu64 " of %" PRIu64 " entries; opening the gate\n",
                    g_who, (unsigned long long)(W6_STALL_NS / 1000000u),
                    prog, E);
            __atomic_store_n(flag_h, 1, __ATOMIC_SEQ_CST);
            gate_open = 1;
        }
    }
    for (t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        if (ts[t].t_end > t_enq)
            t_enq = ts[t].t_end;
    }
    if (!gate_open) {
        cudaError_t q;
        rss_peak = rss_bytes();
        snap_get(k, NULL, &sp);
        cp = reclaimer_cpu(k, NULL);
        q = cudaStreamQuery(gate);
        cudaGetLastError();
        gate_timed_out = q == cudaSuccess;   /* gate opened by its timeout */
        if (gate_timed_out)
            fprintf(stderr, "%s: note: the gate kernel timed out before the "
                    "enqueue ended\n", g_who);
    }
    t_open = now_ns();
    __atomic_store_n(flag_h, 1, __ATOMIC_SEQ_CST);
    CK(defer_flush());
    t_drained = now_ns();
    snap_get(k, NULL, &s2);
    c2 = reclaimer_cpu(k, NULL);
    CK(cudaStreamSynchronize(gate));
    if (atomic_load(&w6_calls_run) != E)
        fprintf(stderr, "%s: note: %lu of %" PRIu64 " callbacks ran\n", g_who,
                (unsigned long)atomic_load(&w6_calls_run), E);

    lat_all = xmalloc((size_t)E * sizeof(uint64_t) + 8);
    for (t = 0, at = 0; t < T; t++)
        for (i = 0; i < ts[t].n; i++)
            lat_all[at++] = ts[t].lat[i];
    qsort(lat_all, (size_t)at, sizeof(uint64_t), cmp_u64);

    {
        double cpu_all = cpu_delta(&c0, &c2, 0);
        double batches = s2.batches - s0.batches;
        double wakeups = s2.wakeups - s0.wakeups;
        double released = s2.released - s0.released;
        double pend = sp.pending;
        double enq_s = (double)(t_enq - t0) / 1e9;

        jw_begin(&j);
        jw_str(&j, "workload", "W6");
        jw_str(&j, "strategy", label);
        jw_str(&j, "kind", kind_names[k]);
        jw_num(&j, "rep", rep);
        jw_num(&j, "entries", (double)E);
        jw_num(&j, "streams", S);
        jw_num(&j, "threads", T);
        jw_num(&j, "enqueue_ms", enq_s * 1e3);
        jw_num(&j, "enqueue_calls_per_s", enq_s > 0 ? (double)E / enq_s : NAN);
        jw_num(&j, "call_p50_us", pct_us(lat_all, (size_t)at, 50));
        jw_num(&j, "call_p99_us", pct_us(lat_all, (size_t)at, 99));
        jw_num(&j, "call_max_us", pct_us(lat_all, (size_t)at, 100));
        jw_num(&j, "reclaimer_cpu_ms", cpu_all);
        jw_num(&j, "reclaimer_cpu_ms_stat", cpu_delta(&c0, &c2, 1));
        jw_num(&j, "reclaimer_cpu_enqueue_ms", cpu_delta(&c0, &cp, 0));
        jw_num(&j, "reclaimer_cpu_drain_ms", cpu_delta(&cp, &c2, 0));
        jw_num(&j, "batches", batches);
        jw_num(&j, "wakeups", wakeups);
        jw_num(&j, "pass_us", ratio_or_nan(cpu_all * 1e3, batches));
        jw_num(&j, "wakeup_us", ratio_or_nan(cpu_all * 1e3, wakeups));
        jw_num(&j, "queries_per_release",
               ratio_or_nan(s2.queries - s0.queries, released));
        jw_num(&j, "released", released);
        jw_num(&j, "failed", s2.failed - s0.failed);
        jw_num(&j, "sync_releases", s2.sync_releases - s0.sync_releases);
        jw_num(&j, "events_created", s2.events_created - s0.events_created);
        jw_num(&j, "pending_at_peak", pend);
        jw_num(&j, "rss_delta_bytes", rss_peak - rss0);
        jw_num(&j, "bytes_per_entry", ratio_or_nan(rss_peak - rss0, pend));
        jw_num(&j, "drain_ms", (double)(t_drained - t_open) / 1e6);
        jw_num(&j, "gate_stalled", stalled);
        jw_num(&j, "gate_stalled_at", stalled ? (double)stalled_at : NAN);
        jw_num(&j, "gate_timed_out", gate_timed_out);
        jw_emit(&j);
        free(j.buf);
    }

    for (t = 0; t < T; t++)
        free(ts[t].lat);
    free(lat_all);
    free(ts);
    free(th);
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    cudaEventDestroy(gate_ev);
    for (t = 0; t < S; t++)
        cudaStreamDestroy(streams[t]);
    cudaStreamDestroy(gate);
    cudaFreeHost((void *)flag_h);
    free(streams);
}

/* ------------------------------------------------------------------------ */
/* Child entry points                                                       */

static int kind_from_name(const char *s)
{
    int k;
    for (k = 0; k < K_N; k++)
        if (strcmp(s, kind_names[k]) == 0)
            return k;
    return -1;
}

static int wl_from_name(const char *s)
{
    int w;
    for (w = 0; w < W_N; w++)
        if (strcmp(s, wls[w].name) == 0)
            return w;
    return -1;
}

static void cuda_init(void)
{
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 1)
        die("no CUDA device");
    g_device = 0;
    CK(cudaSetDevice(g_device));
    CK(cudaFree(NULL));
}

static int child_info(void)
{
    struct cudaDeviceProp prop;
    int rt = 0, drv = 0;
    char cc[16];
    struct jw j = { 0 };

    snprintf(g_who, sizeof g_who, "cudefer-bench [info]");
    alarm(60);
    cuda_init();
    CK(cudaGetDeviceProperties(&prop, g_device));
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    snprintf(cc, sizeof cc, "%d.%d", prop.major, prop.minor);
    jw_begin(&j);
    jw_str(&j, "info", "device");
    jw_str(&j, "device", prop.name);
    jw_str(&j, "cc", cc);
    jw_num(&j, "sms", prop.multiProcessorCount);
    jw_num(&j, "mem_bytes", (double)prop.totalGlobalMem);
    jw_num(&j, "runtime", rt);
    jw_num(&j, "driver", drv);
    jw_str(&j, "cudefer_version", defer_version() ? defer_version() : "?");
    jw_emit(&j);
    free(j.buf);
    return 0;
}

static int child_main(const char *wlname, const char *kindname, int rep,
                      const char *label, const struct opts *o)
{
    int w = wl_from_name(wlname), k = kind_from_name(kindname);
    int status = 0;

    snprintf(g_who, sizeof g_who, "cudefer-bench [%s %s rep %d]", wlname,
             label, rep);
    if (w < 0)
        die("unknown workload %s", wlname);
    if (k < 0)
        die("unknown strategy kind %s", kindname);
    if (!(wls[w].kinds & KM(k)))
        die("strategy %s does not apply to %s", kindname, wlname);
    alarm((unsigned)o->timeout_s);
    cuda_init();

    switch (w) {
    case W1:
    case W2:
    case W3:
    case W4:
        run_loops((enum wl)w, (enum kind)k, rep, label, o);
        break;
    case W5:
        run_w5((enum kind)k, rep, label, o);
        break;
    case W6:
        run_w6((enum kind)k, rep, label, o);
        break;
    default:
        die("unknown workload");
    }

    if (IS_CUDEFER(k)) {
        cudaError_t rc = defer_shutdown();
        if (rc != cudaSuccess) {
            fprintf(stderr, "%s: defer_shutdown: %s\n", g_who,
                    cudaGetErrorString(rc));
            status = 3;
        }
    }
    CK(cudaDeviceSynchronize());
    return status;
}

/* ------------------------------------------------------------------------ */
/* Parent: JSON line parser (flat objects written by the children)          */

#define MAXK 64
#define MAXS 8

struct rec {
    int nk, ns;
    char key[MAXK][40];
    double val[MAXK];
    char skey[MAXS][40];
    char sval[MAXS][160];
};

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

static const char *parse_jstr(const char *p, char *out, size_t cap)
{
    size_t n = 0;

    if (*p != '"')
        return NULL;
    p++;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            c = *p++;
            if (c == '\0')
                return NULL;
            if (c == 'n') {
                c = '\n';
            } else if (c == 't') {
                c = '\t';
            } else if (c == 'u') {
                unsigned v = 0;
                int d;
                for (d = 0; d < 4; d++) {
                    if (!isxdigit((unsigned char)p[d]))
                        return NULL;
                    v = v * 16 + (unsigned)(isdigit((unsigned char)p[d])
                                                ? p[d] - '0'
                                                : (tolower((unsigned char)p[d]) - 'a' + 10));
                }
                p += 4;
                c = v < 128 ? (char)v : '?';
            }
        }
        if (n + 1 < cap)
            out[n++] = c;
    }
    if (*p != '"')
        return NULL;
    if (cap)
        out[n] = '\0';
    return p + 1;
}

/* Returns 0 and fills r, or -1 if line is not a flat JSON object. */
static int parse_obj(const char *line, struct rec *r)
{
    const char *p = skip_ws(line);

    memset(r, 0, sizeof *r);
    if (*p != '{')
        return -1;
    p = skip_ws(p + 1);
    if (*p == '}')
        return 0;
    for (;;) {
        char key[40], sval[160];
        p = parse_jstr(p, key, sizeof key);
        if (!p)
            return -1;
        p = skip_ws(p);
        if (*p != ':')
            return -1;
        p = skip_ws(p + 1);
        if (*p == '"') {
            p = parse_jstr(p, sval, sizeof sval);
            if (!p)
                return -1;
            if (r->ns < MAXS) {
                snprintf(r->skey[r->ns], sizeof r->skey[0], "%s", key);
                snprintf(r->sval[r->ns], sizeof r->sval[0], "%s", sval);
                r->ns++;
            }
        } else {
            double v;
            if (strncmp(p, "null", 4) == 0) {
                v = NAN;
                p += 4;
            } else if (strncmp(p, "true", 4) == 0) {
                v = 1;
                p += 4;
            } else if (strncmp(p, "false", 5) == 0) {
                v = 0;
                p += 5;
            } else {
                char *end;
                v = strtod(p, &end);
                if (end == p)
                    return -1;
                p = end;
            }
            if (r->nk < MAXK) {
                snprintf(r->key[r->nk], sizeof r->key[0], "%s", key);
                r->val[r->nk] = v;
                r->nk++;
            }
        }
        p = skip_ws(p);
        if (*p == ',') {
            p = skip_ws(p + 1);
            continue;
        }
        if (*p == '}')
            return 0;
        return -1;
    }
}

static double rec_num(const struct rec *r, const char *k)
{
    int i;
    for (i = 0; i < r->nk; i++)
        if (strcmp(r->key[i], k) == 0)
            return r->val[i];
    return NAN;
}

static int rec_has(const struct rec *r, const char *k)
{
    int i;
    for (i = 0; i < r->nk; i++)
        if (strcmp(r->key[i], k) == 0)
            return 1;
    return 0;
}

static const char *rec_str(const struct rec *r, const char *k)
{
    int i;
    for (i = 0; i < r->ns; i++)
        if (strcmp(r->skey[i], k) == 0)
            return r->sval[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Parent: strategies, rows, child runs                                     */

#define MAX_STRATS 32
#define MAX_ENV 16

struct strategy {
    char name[64];
    enum kind kind;
    char env_text[512];              /* "A=1,B=2" as given */
    int nenv;
    char env_key[MAX_ENV][64];
    char env_val[MAX_ENV][256];
};

struct row {
    int wl;                          /* enum wl */
    char wlname[16];                 /* "W1" ... "W5-idle", "W5-busy", "W6" */
    int strat;
    struct rec *recs;
    int *rec_rep;
    int nrecs, cap;
    int failed;                      /* repetitions without a result */
    int exit_warn;                   /* results whose child exited non-zero */
    int got_this_rep;
};

static struct strategy strats[MAX_STRATS];
static int nstrats;
static struct row *rows;
static int nrows, caprows;

static int valid_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._+-", *s))
            return 0;
    return 1;
}

static int valid_env_key(const char *s)
{
    if (!isalpha((unsigned char)*s) && *s != '_')
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return 0;
    return 1;
}

static void add_strategy(const char *name, enum kind k)
{
    struct strategy *s;
    if (nstrats >= MAX_STRATS) {
        fprintf(stderr, "cudefer-bench: too many strategies\n");
        exit(2);
    }
    s = &strats[nstrats++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = k;
}

/* "name=ENV=VAL[,ENV=VAL...]" */
static void add_variant(const char *spec)
{
    char buf[1024], *eq, *item, *save = NULL;
    struct strategy *s;
    int i;

    if (strlen(spec) >= sizeof buf) {
        fprintf(stderr, "cudefer-bench: --variant too long\n");
        exit(2);
    }
    snprintf(buf, sizeof buf, "%s", spec);
    eq = strchr(buf, '=');
    if (!eq) {
        fprintf(stderr, "cudefer-bench: --variant '%s': expected NAME=ENV=VAL[,ENV=VAL...]\n", spec);
        exit(2);
    }
    *eq = '\0';
    if (!valid_name(buf) || strlen(buf) >= sizeof s->name) {
        fprintf(stderr, "cudefer-bench: --variant '%s': bad name '%s' (letters, digits, . _ + -)\n", spec, buf);
        exit(2);
    }
    for (i = 0; i < nstrats; i++)
        if (strcmp(strats[i].name, buf) == 0) {
            fprintf(stderr, "cudefer-bench: --variant '%s': name '%s' already used\n", spec, buf);
            exit(2);
        }
    for (i = 0; i < K_N; i++)
        if (strcmp(kind_names[i], buf) == 0) {
            fprintf(stderr, "cudefer-bench: --variant '%s': '%s' is a built-in strategy\n", spec, buf);
            exit(2);
        }
    add_strategy(buf, K_CUDEFER);
    s = &strats[nstrats - 1];
    snprintf(s->env_text, sizeof s->env_text, "%s", eq + 1);
    for (item = strtok_r(eq + 1, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *e2 = strchr(item, '=');
        if (!e2 || e2 == item) {
            fprintf(stderr, "cudefer-bench: --variant '%s': '%s' is not ENV=VAL\n", spec, item);
            exit(2);
        }
        *e2 = '\0';
        if (!valid_env_key(item) || strlen(item) >= sizeof s->env_key[0] ||
            strlen(e2 + 1) >= sizeof s->env_val[0] || s->nenv >= MAX_ENV) {
            fprintf(stderr, "cudefer-bench: --variant '%s': bad assignment '%s'\n", spec, item);
            exit(2);
        }
        snprintf(s->env_key[s->nenv], sizeof s->env_key[0], "%s", item);
        snprintf(s->env_val[s->nenv], sizeof s->env_val[0], "%s", e2 + 1);
        s->nenv++;
    }
    if (s->nenv == 0) {
        fprintf(stderr, "cudefer-bench: --variant '%s': no ENV=VAL given\n", spec);
        exit(2);
    }
}

static struct row *find_row(const char *wlname, const char *strat)
{
    int i;
    for (i = 0; i < nrows; i++)
        if (strcmp(rows[i].wlname, wlname) == 0 &&
            strcmp(strats[rows[i].strat].name, strat) == 0)
            return &rows[i];
    return NULL;
}

static void add_row(int wl, const char *wlname, int strat)
{
    struct row *r;
    if (nrows == caprows) {
        caprows = caprows ? caprows * 2 : 32;
        rows = realloc(rows, (size_t)caprows * sizeof *rows);
        if (!rows) {
            fprintf(stderr, "cudefer-bench: out of memory\n");
            exit(2);
        }
    }
    r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    r->wl = wl;
    snprintf(r->wlname, sizeof r->wlname, "%s", wlname);
    r->strat = strat;
}

static void row_add_rec(struct row *r, const struct rec *rc, int rep)
{
    if (r->nrecs == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 4;
        r->recs = realloc(r->recs, (size_t)r->cap * sizeof *r->recs);
        r->rec_rep = realloc(r->rec_rep, (size_t)r->cap * sizeof *r->rec_rep);
        if (!r->recs || !r->rec_rep) {
            fprintf(stderr, "cudefer-bench: out of memory\n");
            exit(2);
        }
    }
    r->recs[r->nrecs] = *rc;
    r->rec_rep[r->nrecs] = rep;
    r->nrecs++;
}

static char g_exe[PATH_MAX];

/* Fork + exec argv with the strategy's environment; collect its stdout.
 * Returns the wait status (or -1 if it could not be started). */
static int run_child(char *const argv[], const struct strategy *st,
                     int timeout_s, char **out, int *timed_out)
{
    int fds[2], status = 0;
    pid_t pid;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    uint64_t deadline = now_ns() + (uint64_t)timeout_s * 1000000000ull;
    int killed = 0;

    *out = NULL;
    *timed_out = 0;
    if (!buf)
        return -1;
    if (pipe2(fds, O_CLOEXEC) != 0) {
        perror("cudefer-bench: pipe");
        free(buf);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        perror("cudefer-bench: fork");
        close(fds[0]);
        close(fds[1]);
        free(buf);
        return -1;
    }
    if (pid == 0) {
        /* child: stdout -> pipe; environment: no CUDEFER_* but the variant's */
        char **names;
        size_t ne = 0, i;
        int e;

        if (dup2(fds[1], STDOUT_FILENO) < 0)
            _exit(127);
        for (i = 0; environ[i]; i++)
            ne++;
        names = calloc(ne + 1, sizeof *names);
        if (!names)
            _exit(127);
        for (i = 0, e = 0; environ[i]; i++)
            if (strncmp(environ[i], "CUDEFER_", 8) == 0) {
                const char *eq = strchr(environ[i], '=');
                names[e++] = strndup(environ[i],
                                     eq ? (size_t)(eq - environ[i]) : strlen(environ[i]));
            }
        for (i = 0; i < (size_t)e; i++)
            if (names[i])
                unsetenv(names[i]);
        for (e = 0; e < st->nenv; e++)
            setenv(st->env_key[e], st->env_val[e], 1);
        execv(g_exe, argv);
        fprintf(stderr, "cudefer-bench: exec %s: %s\n", g_exe, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        struct pollfd pfd = { fds[0], POLLIN, 0 };
        uint64_t now = now_ns();
        int wait_ms = killed ? 5000
                             : (now >= deadline ? 0 : (int)((deadline - now) / 1000000u) + 1);
        int pr = poll(&pfd, 1, wait_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            if (killed)
                break;      /* someone else holds the pipe open: give up */
            fprintf(stderr, "cudefer-bench: child %d ran past %d s: killed\n",
                    (int)pid, timeout_s);
            kill(pid, SIGKILL);
            killed = 1;
            *timed_out = 1;
            continue;
        }
        if (pr < 0)
            break;
        if (len + 2048 > cap) {
            char *nb;
            cap *= 2;
            nb = realloc(buf, cap);
            if (!nb)
                break;
            buf = nb;
        }
        {
            ssize_t n = read(fds[0], buf + len, cap - len - 1);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            len += (size_t)n;
        }
    }
    close(fds[0]);
    buf[len] = '\0';
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *out = buf;
    return status;
}

static void describe_status(int status, int timed_out, char *buf, size_t cap)
{
    if (timed_out)
        snprintf(buf, cap, "timed out");
    else if (status < 0)
        snprintf(buf, cap, "could not start");
    else if (WIFEXITED(status))
        snprintf(buf, cap, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, cap, "status %d", status);
}

/* ------------------------------------------------------------------------ */
/* Parent: aggregation and output                                           */

struct agg {
    double med, min, max;
    int n;
};

static struct agg agg_of(double *v, int n)
{
    struct agg a = { NAN, NAN, NAN, 0 };
    int i, m = 0;
    for (i = 0; i < n; i++)
        if (!isnan(v[i]))
            v[m++] = v[i];
    if (m == 0)
        return a;
    qsort(v, (size_t)m, sizeof(double), cmp_dbl);
    a.n = m;
    a.min = v[0];
    a.max = v[m - 1];
    a.med = (m % 2) ? v[m / 2] : (v[m / 2 - 1] + v[m / 2]) / 2.0;
    return a;
}

static struct agg row_key(const struct row *r, const char *key)
{
    double v[256];
    int i, n = 0;
    for (i = 0; i < r->nrecs && n < 256; i++)
        v[n++] = rec_num(&r->recs[i], key);
    return agg_of(v, n);
}

static const struct row *limit_row(const struct row *r)
{
    int i;
    for (i = 0; i < nrows; i++)
        if (strcmp(rows[i].wlname, r->wlname) == 0 &&
            strats[rows[i].strat].kind == K_LIMIT)
            return &rows[i];
    return NULL;
}

/* ratio of key ("done_ms" or "released_ms") to limit's done_ms, per rep */
static struct agg row_ratio(const struct row *r, const char *key)
{
    const struct row *lr;
    double v[256], lmed;
    int i, n = 0;
    struct agg none = { NAN, NAN, NAN, 0 };

    if (r->wl > W4)
        return none;
    lr = limit_row(r);
    if (!lr || lr->nrecs == 0)
        return none;
    lmed = row_key(lr, "done_ms").med;
    for (i = 0; i < r->nrecs && n < 256; i++) {
        double lim = lmed;
        int k;
        for (k = 0; k < lr->nrecs; k++)
            if (lr->rec_rep[k] == r->rec_rep[i]) {
                double d = rec_num(&lr->recs[k], "done_ms");
                if (!isnan(d))
                    lim = d;
                break;
            }
        v[n++] = ratio_or_nan(rec_num(&r->recs[i], key), lim);
    }
    return agg_of(v, n);
}

struct runinfo {
    char device[160];
    char cuda[96];
    char cudefer_version[64];
    double runtime, driver;
    char date[32];
};

static const char *const required_keys[] = {
    "iter_p50_us", "iter_p99_us", "iter_max_us", "call_p50_us", "call_p99_us",
    "peak_bytes", "reclaimer_cpu_ms", "queries_per_release",
};
#define NREQ (sizeof required_keys / sizeof required_keys[0])

static void write_row_json(FILE *f, const struct row *r, const struct runinfo *ri,
                           const struct opts *o)
{
    struct jw j = { 0 };
    struct agg d = row_ratio(r, "done_ms"), rl = row_ratio(r, "released_ms");
    const struct strategy *st = &strats[r->strat];
    size_t q;
    int i;

    jw_begin(&j);
    jw_str(&j, "workload", r->wlname);
    jw_str(&j, "strategy", st->name);
    jw_str(&j, "kind", kind_names[st->kind]);
    jw_str(&j, "env", st->env_text);
    jw_num(&j, "reps", r->nrecs);
    jw_num(&j, "reps_failed", r->failed);
    jw_num(&j, "reps_exit_nonzero", r->exit_warn);
    jw_num(&j, "ratio_done", d.med);
    jw_num(&j, "ratio_done_min", d.min);
    jw_num(&j, "ratio_done_max", d.max);
    jw_num(&j, "ratio_released", rl.med);
    jw_num(&j, "ratio_released_min", rl.min);
    jw_num(&j, "ratio_released_max", rl.max);
    for (q = 0; q < NREQ; q++)
        jw_num(&j, required_keys[q], row_key(r, required_keys[q]).med);
    if (r->nrecs > 0) {
        const struct rec *f0 = &r->recs[0];
        for (i = 0; i < f0->nk; i++) {
            int skip = strcmp(f0->key[i], "rep") == 0;
            for (q = 0; q < NREQ && !skip; q++)
                if (strcmp(f0->key[i], required_keys[q]) == 0)
                    skip = 1;
            if (!skip)
                jw_num(&j, f0->key[i], row_key(r, f0->key[i]).med);
        }
    }
    jw_num(&j, "iters_requested", o->iters);
    jw_str(&j, "device", ri->device);
    jw_str(&j, "cuda", ri->cuda);
    jw_num(&j, "cuda_runtime", ri->runtime);
    jw_num(&j, "cuda_driver", ri->driver);
    jw_str(&j, "cudefer_version", ri->cudefer_version);
    jw_str(&j, "date", ri->date);
    jw_end(&j);
    fprintf(f, "%s\n", j.buf);
    free(j.buf);
}

static const char *fmtv(char *b, size_t cap, double v, int prec)
{
    if (isnan(v))
        snprintf(b, cap, "-");
    else
        snprintf(b, cap, "%.*f", prec, v);
    return b;
}

static const char *fmt_agg3(char *b, size_t cap, struct agg a)
{
    if (isnan(a.med))
        snprintf(b, cap, "-");
    else
        snprintf(b, cap, "%.3f [%.3f-%.3f]", a.med, a.min, a.max);
    return b;
}

static const char *fmt_trip(char *b, size_t cap, double x, double y, double z, int prec)
{
    char t1[32], t2[32], t3[32];
    if (isnan(x) && isnan(y) && isnan(z))
        snprintf(b, cap, "-");
    else if (isnan(z))
        snprintf(b, cap, "%s/%s", fmtv(t1, sizeof t1, x, prec), fmtv(t2, sizeof t2, y, prec));
    else
        snprintf(b, cap, "%s/%s/%s", fmtv(t1, sizeof t1, x, prec),
                 fmtv(t2, sizeof t2, y, prec), fmtv(t3, sizeof t3, z, prec));
    return b;
}

static const char *fmt_reps(char *b, size_t cap, const struct row *r)
{
    if (r->failed)
        snprintf(b, cap, "%d (%d FAILED)", r->nrecs, r->failed);
    else
        snprintf(b, cap, "%d", r->nrecs);
    return b;
}

static void print_table(const struct runinfo *ri, const struct opts *o,
                        const int *wl_sel, int total_failures)
{
    int w, i, sw = 16;
    char a[128], b[128], c[128], d[128], e[128], f[128], g[128], h[128], x[128];

    for (i = 0; i < nstrats; i++)
        if ((int)strlen(strats[i].name) > sw)
            sw = (int)strlen(strats[i].name);

    printf("\ncudefer-bench: %s, %s, cudefer %s, %s\n", ri->device, ri->cuda,
           ri->cudefer_version, ri->date);
    printf("ratios: median [min-max] over repetitions, each to the 'limit' "
           "(preallocated, never freed) of the same repetition; other columns: "
           "median over repetitions\n");

    for (w = 0; w < W_N; w++) {
        if (!wl_sel[w])
            continue;
        printf("\n== %s %s\n", wls[w].name, wls[w].title);
        if (w <= W4) {
            const struct row *lim = NULL;
            for (i = 0; i < nrows; i++)
                if (rows[i].wl == w && strats[rows[i].strat].kind == K_LIMIT)
                    lim = &rows[i];
            if (lim)
                printf("   %d x %d iterations; limit: all GPU work done in %s ms\n",
                       w == W4 ? W4_THREADS : 1, o->iters,
                       fmtv(a, sizeof a, row_key(lim, "done_ms").med, 1));
            printf("%-*s  %-22s  %-22s  %-20s  %-13s  %8s  %11s  %6s  %s\n", sw,
                   "strategy", "done x [min-max]", "released x [min-max]",
                   "iter p50/p99/max us", "call p50/p99", "peak MiB",
                   "recl CPU ms", "q/rel", "reps");
            for (i = 0; i < nrows; i++) {
                const struct row *r = &rows[i];
                if (r->wl != w)
                    continue;
                printf("%-*s  %-22s  %-22s  %-20s  %-13s  %8s  %11s  %6s  %s\n", sw,
                       strats[r->strat].name,
                       fmt_agg3(a, sizeof a, row_ratio(r, "done_ms")),
                       fmt_agg3(b, sizeof b, row_ratio(r, "released_ms")),
                       fmt_trip(c, sizeof c, row_key(r, "iter_p50_us").med,
                                row_key(r, "iter_p99_us").med,
                                row_key(r, "iter_max_us").med, 1),
                       fmt_trip(d, sizeof d, row_key(r, "call_p50_us").med,
                                row_key(r, "call_p99_us").med, NAN, 1),
                       fmtv(e, sizeof e, row_key(r, "peak_bytes").med / 1048576.0, 1),
                       fmtv(f, sizeof f, row_key(r, "reclaimer_cpu_ms").med, 1),
                       fmtv(g, sizeof g, row_key(r, "queries_per_release").med, 2),
                       fmt_reps(x, sizeof x, r));
            }
        } else if (w == W5) {
            printf("   %d release calls per phase, each timed alone; busy: a %.0f ms "
                   "gpu_spin queued first ('held' = still running after the last call)\n",
                   o->w5_calls, (double)W5_BUSY_NS / 1e6);
            printf("%-*s  %-22s  %-22s  %5s  %-15s  %-11s  %s\n", sw, "strategy",
                   "idle p50/p99/max us", "busy p50/p99/max us", "held",
                   "recl CPU ms i/b", "q/rel i/b", "reps i/b");
            for (i = 0; i < nstrats; i++) {
                const struct row *ri_ = NULL, *rb = NULL;
                char y[128];
                int k2;
                for (k2 = 0; k2 < nrows; k2++) {
                    if (rows[k2].strat != i || rows[k2].wl != W5)
                        continue;
                    if (strcmp(rows[k2].wlname, "W5-idle") == 0)
                        ri_ = &rows[k2];
                    else
                        rb = &rows[k2];
                }
                if (!ri_ || !rb)
                    continue;
                snprintf(g, sizeof g, "%s/%s",
                         fmtv(a, sizeof a, row_key(ri_, "reclaimer_cpu_ms").med, 1),
                         fmtv(b, sizeof b, row_key(rb, "reclaimer_cpu_ms").med, 1));
                snprintf(h, sizeof h, "%s/%s",
                         fmtv(a, sizeof a, row_key(ri_, "queries_per_release").med, 2),
                         fmtv(b, sizeof b, row_key(rb, "queries_per_release").med, 2));
                printf("%-*s  %-22s  %-22s  %5s  %-15s  %-11s  %s/%s\n", sw,
                       strats[i].name,
                       fmt_trip(c, sizeof c, row_key(ri_, "call_p50_us").med,
                                row_key(ri_, "call_p99_us").med,
                                row_key(ri_, "call_max_us").med, 2),
                       fmt_trip(d, sizeof d, row_key(rb, "call_p50_us").med,
                                row_key(rb, "call_p99_us").med,
                                row_key(rb, "call_max_us").med, 2),
                       fmtv(e, sizeof e, row_key(rb, "busy_held").min, 0), g, h,
                       fmt_reps(x, sizeof x, ri_), fmt_reps(y, sizeof y, rb));
            }
        } else {
            printf("   %d defer_call entries; RSS and pending read while all streams "
                   "are held back\n", o->w6_entries);
            printf("%-*s  %9s  %-20s  %11s  %9s  %9s  %6s  %11s  %9s  %s\n", sw,
                   "strategy", "Mcalls/s", "call p50/p99/max us", "recl CPU ms",
                   "batches", "us/batch", "q/rel", "bytes/entry", "drain ms",
                   "reps");
            for (i = 0; i < nrows; i++) {
                const struct row *r = &rows[i];
                char y[128];
                if (r->wl != W6)
                    continue;
                printf("%-*s  %9s  %-20s  %11s  %9s  %9s  %6s  %11s  %9s  %s%s\n", sw,
                       strats[r->strat].name,
                       fmtv(a, sizeof a, row_key(r, "enqueue_calls_per_s").med / 1e6, 3),
                       fmt_trip(b, sizeof b, row_key(r, "call_p50_us").med,
                                row_key(r, "call_p99_us").med,
                                row_key(r, "call_max_us").med, 2),
                       fmtv(c, sizeof c, row_key(r, "reclaimer_cpu_ms").med, 1),
                       fmtv(d, sizeof d, row_key(r, "batches").med, 0),
                       fmtv(e, sizeof e, row_key(r, "pass_us").med, 1),
                       fmtv(f, sizeof f, row_key(r, "queries_per_release").med, 2),
                       fmtv(g, sizeof g, row_key(r, "bytes_per_entry").med, 1),
                       fmtv(h, sizeof h, row_key(r, "drain_ms").med, 1),
                       fmt_reps(y, sizeof y, r),
                       row_key(r, "gate_stalled").max > 0 ? "  (enqueue stalled: gate opened early)" : "");
            }
        }
    }
    if (total_failures)
        printf("\n%d child run(s) FAILED: see the messages on stderr above\n",
               total_failures);
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: cudefer-bench [options]\n"
        "  --workloads W1,W2,...  workloads to run (default W1,W2,W3,W4,W5,W6)\n"
        "  --strategies a,b,...   built-in strategies to run (default all:\n"
        "                         limit,inline-cudaFree,inline-async,naive-reclaimer,cudefer,cudefer-alloc;\n"
        "                         limit is always run)\n"
        "  --variant NAME=ENV=VAL[,ENV=VAL...]\n"
        "                         also run cudefer with these environment settings\n"
        "                         (repeatable)\n"
        "  --reps N               repetitions, each in fresh processes (default %d)\n"
        "  --iters N              iterations of W1-W4, per thread (default %d)\n"
        "  --w5-calls N           release calls per W5 phase (default %d)\n"
        "  --w6-entries N         W6 entries (default %d)\n"
        "  --quick                smoke run: iters %d, W5 %d calls, W6 %d entries,\n"
        "                         1 repetition (each unless given explicitly)\n"
        "  --json FILE            write the JSON lines there (default: stdout,\n"
        "                         before the table)\n"
        "  --timeout S            kill a child after S seconds (default %d)\n",
        DEF_REPS, DEF_ITERS, DEF_W5_CALLS, DEF_W6_ENTRIES, QUICK_ITERS,
        QUICK_W5_CALLS, QUICK_W6_ENTRIES, DEF_TIMEOUT_S);
}

static int parse_int(const char *opt, const char *s, int lo, int hi)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cudefer-bench: %s: '%s' is not a number in [%d, %d]\n",
                opt, s, lo, hi);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    struct opts o = { DEF_ITERS, DEF_REPS, DEF_W5_CALLS, DEF_W6_ENTRIES, DEF_TIMEOUT_S };
    int set_iters = 0, set_w5 = 0, set_w6 = 0, set_reps = 0, quick = 0;
    const char *json_path = NULL, *wl_list = NULL, *strat_list = NULL;
    const char *child_wl = NULL, *child_kind = NULL, *child_label = NULL;
    int child_rep = 0, child_info_mode = 0;
    int wl_sel[W_N] = { 0 };
    struct runinfo ri;
    FILE *jf = NULL;
    int i, w, rep, total_failures = 0;
    int builtin_sel[K_N] = { 0 };
    const char *variants[MAX_STRATS];
    int nvariants = 0;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEED_ARG()                                                            \
        do {                                                                  \
            if (i + 1 >= argc) {                                              \
                fprintf(stderr, "cudefer-bench: %s needs an argument\n", a); \
                exit(2);                                                      \
            }                                                                 \
        } while (0)
        if (strcmp(a, "--child") == 0) {
            if (i + 4 >= argc) {
                fprintf(stderr, "cudefer-bench: --child WORKLOAD KIND REP LABEL\n");
                exit(2);
            }
            child_wl = argv[++i];
            child_kind = argv[++i];
            child_rep = parse_int("--child REP", argv[++i], 0, 1000000);
            child_label = argv[++i];
        } else if (strcmp(a, "--child-info") == 0) {
            child_info_mode = 1;
        } else if (strcmp(a, "--workloads") == 0) {
            NEED_ARG();
            wl_list = argv[++i];
        } else if (strcmp(a, "--strategies") == 0) {
            NEED_ARG();
            strat_list = argv[++i];
        } else if (strcmp(a, "--variant") == 0) {
            NEED_ARG();
            if (nvariants >= MAX_STRATS) {
                fprintf(stderr, "cudefer-bench: too many --variant\n");
                exit(2);
            }
            variants[nvariants++] = argv[++i];
        } else if (strcmp(a, "--reps") == 0) {
            NEED_ARG();
            o.reps = parse_int(a, argv[++i], 1, 100);
            set_reps = 1;
        } else if (strcmp(a, "--iters") == 0) {
            NEED_ARG();
            o.iters = parse_int(a, argv[++i], 1, 10000000);
            set_iters = 1;
        } else if (strcmp(a, "--w5-calls") == 0) {
            NEED_ARG();
            o.w5_calls = parse_int(a, argv[++i], 100, 10000000);
            set_w5 = 1;
        } else if (strcmp(a, "--w6-entries") == 0) {
            NEED_ARG();
            o.w6_entries = parse_int(a, argv[++i], W6_THREADS, 100000000);
            set_w6 = 1;
        } else if (strcmp(a, "--timeout") == 0) {
            NEED_ARG();
            o.timeout_s = parse_int(a, argv[++i], 5, 86400);
        } else if (strcmp(a, "--json") == 0) {
            NEED_ARG();
            json_path = argv[++i];
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "cudefer-bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NEED_ARG
    }
    if (quick) {
        if (!set_iters)
            o.iters = QUICK_ITERS;
        if (!set_w5)
            o.w5_calls = QUICK_W5_CALLS;
        if (!set_w6)
            o.w6_entries = QUICK_W6_ENTRIES;
        if (!set_reps)
            o.reps = 1;
    }

    if (child_info_mode)
        return child_info();
    if (child_wl)
        return child_main(child_wl, child_kind, child_rep, child_label, &o);

    /* ---------------- parent: never initializes CUDA ---------------- */
    signal(SIGPIPE, SIG_IGN);
    {
        ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
        if (n <= 0) {
            snprintf(g_exe, sizeof g_exe, "%s", argv[0]);
        } else {
            g_exe[n] = '\0';
        }
    }

    /* workloads */
    if (!wl_list) {
        for (w = 0; w < W_N; w++)
            wl_sel[w] = 1;
    } else {
        char buf[256], *tok, *save = NULL;
        snprintf(buf, sizeof buf, "%s", wl_list);
        for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int x = wl_from_name(tok);
            if (x < 0) {
                fprintf(stderr, "cudefer-bench: unknown workload '%s' (W1..W6)\n", tok);
                return 2;
            }
            wl_sel[x] = 1;
        }
    }

    /* strategies: built-ins, then variants in the order given */
    if (!strat_list) {
        for (i = 0; i < K_N; i++)
            builtin_sel[i] = 1;
    } else {
        char buf[512], *tok, *save = NULL;
        snprintf(buf, sizeof buf, "%s", strat_list);
        for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int x = kind_from_name(tok);
            if (x < 0) {
                fprintf(stderr, "cudefer-bench: unknown strategy '%s'\n", tok);
                return 2;
            }
            builtin_sel[x] = 1;
        }
        builtin_sel[K_LIMIT] = 1;
    }
    for (i = 0; i < K_N; i++)
        if (builtin_sel[i])
            add_strategy(kind_names[i], (enum kind)i);
    for (i = 0; i < nvariants; i++)
        add_variant(variants[i]);

    for (i = 0; environ[i]; i++)
        if (strncmp(environ[i], "CUDEFER_", 8) == 0)
            fprintf(stderr, "cudefer-bench: note: %s is ignored (children get "
                    "only their variant's CUDEFER_* settings; use --variant)\n",
                    environ[i]);

    if (json_path) {
        jf = fopen(json_path, "w");
        if (!jf) {
            fprintf(stderr, "cudefer-bench: %s: %s\n", json_path, strerror(errno));
            return 2;
        }
    }

    /* rows, in table order */
    for (w = 0; w < W_N; w++) {
        int s;
        if (!wl_sel[w])
            continue;
        for (s = 0; s < nstrats; s++) {
            if (!(wls[w].kinds & KM(strats[s].kind)))
                continue;
            if (w == W5) {
                add_row(w, "W5-idle", s);
                add_row(w, "W5-busy", s);
            } else {
                add_row(w, wls[w].name, s);
            }
        }
    }

    /* run info, from a child */
    memset(&ri, 0, sizeof ri);
    snprintf(ri.device, sizeof ri.device, "unknown device");
    snprintf(ri.cuda, sizeof ri.cuda, "unknown");
    snprintf(ri.cudefer_version, sizeof ri.cudefer_version, "?");
    ri.runtime = ri.driver = NAN;
    {
        time_t tt = time(NULL);
        struct tm tm;
        gmtime_r(&tt, &tm);
        strftime(ri.date, sizeof ri.date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    {
        char *cargv[] = { g_exe, (char *)"--child-info", NULL };
        struct strategy none;
        char *out = NULL, *line, *save = NULL, why[96];
        int to, st, got = 0;

        memset(&none, 0, sizeof none);
        st = run_child(cargv, &none, 60, &out, &to);
        for (line = out ? strtok_r(out, "\n", &save) : NULL; line;
             line = strtok_r(NULL, "\n", &save)) {
            struct rec r;
            const char *v;
            if (parse_obj(line, &r) != 0 || !rec_str(&r, "info"))
                continue;
            if ((v = rec_str(&r, "device")))
                snprintf(ri.device, sizeof ri.device, "%s", v);
            if ((v = rec_str(&r, "cudefer_version")))
                snprintf(ri.cudefer_version, sizeof ri.cudefer_version, "%s", v);
            ri.runtime = rec_num(&r, "runtime");
            ri.driver = rec_num(&r, "driver");
            snprintf(ri.cuda, sizeof ri.cuda, "runtime %d.%d, driver %d.%d",
                     (int)ri.runtime / 1000, ((int)ri.runtime % 1000) / 10,
                     (int)ri.driver / 1000, ((int)ri.driver % 1000) / 10);
            got = 1;
        }
        free(out);
        describe_status(st, to, why, sizeof why);
        if (!got || st != 0)
            fprintf(stderr, "cudefer-bench: device info child failed (%s)\n", why);
        else
            fprintf(stderr, "cudefer-bench: %s, %s, cudefer %s\n", ri.device,
                    ri.cuda, ri.cudefer_version);
    }

    /* the runs: rep 0 of everything, then rep 1, ... */
    for (rep = 0; rep < o.reps; rep++) {
        for (w = 0; w < W_N; w++) {
            int s;
            if (!wl_sel[w])
                continue;
            for (s = 0; s < nstrats; s++) {
                char repbuf[16], itbuf[16], w5buf[16], w6buf[16], tobuf[16];
                char *cargv[20], *out = NULL, *line, *save = NULL, why[96];
                int ac = 0, to, st, accepted = 0, k;
                uint64_t t_start;
                const struct strategy *sp = &strats[s];

                if (!(wls[w].kinds & KM(sp->kind)))
                    continue;
                snprintf(repbuf, sizeof repbuf, "%d", rep);
                snprintf(itbuf, sizeof itbuf, "%d", o.iters);
                snprintf(w5buf, sizeof w5buf, "%d", o.w5_calls);
                snprintf(w6buf, sizeof w6buf, "%d", o.w6_entries);
                snprintf(tobuf, sizeof tobuf, "%d", o.timeout_s);
                cargv[ac++] = g_exe;
                cargv[ac++] = (char *)"--child";
                cargv[ac++] = (char *)wls[w].name;
                cargv[ac++] = (char *)kind_names[sp->kind];
                cargv[ac++] = repbuf;
                cargv[ac++] = (char *)sp->name;
                cargv[ac++] = (char *)"--iters";
                cargv[ac++] = itbuf;
                cargv[ac++] = (char *)"--w5-calls";
                cargv[ac++] = w5buf;
                cargv[ac++] = (char *)"--w6-entries";
                cargv[ac++] = w6buf;
                cargv[ac++] = (char *)"--timeout";
                cargv[ac++] = tobuf;
                cargv[ac] = NULL;

                for (k = 0; k < nrows; k++)
                    rows[k].got_this_rep = 0;
                t_start = now_ns();
                st = run_child(cargv, sp, o.timeout_s + 15, &out, &to);
                for (line = out ? strtok_r(out, "\n", &save) : NULL; line;
                     line = strtok_r(NULL, "\n", &save)) {
                    struct rec r;
                    const char *rw, *rs;
                    struct row *row;
                    if (line[0] != '{')
                        continue;
                    if (parse_obj(line, &r) != 0) {
                        fprintf(stderr, "cudefer-bench: unreadable line from child: %.200s\n", line);
                        continue;
                    }
                    rw = rec_str(&r, "workload");
                    rs = rec_str(&r, "strategy");
                    row = (rw && rs) ? find_row(rw, rs) : NULL;
                    if (!row || row->wl != w || row->got_this_rep) {
                        fprintf(stderr, "cudefer-bench: unexpected line from child: %.200s\n", line);
                        continue;
                    }
                    if (!rec_has(&r, "rep"))
                        continue;
                    row_add_rec(row, &r, rep);
                    row->got_this_rep = 1;
                    if (st != 0)
                        row->exit_warn++;
                    accepted++;
                }
                free(out);
                describe_status(st, to, why, sizeof why);
                for (k = 0; k < nrows; k++)
                    if (rows[k].wl == w && rows[k].strat == s && !rows[k].got_this_rep) {
                        rows[k].failed++;
                        total_failures++;
                    }
                fprintf(stderr, "[rep %d/%d] %-3s %-20s %s%s%s (%.1f s)\n", rep + 1,
                        o.reps, wls[w].name, sp->name,
                        accepted ? "ok" : "FAILED: ",
                        accepted ? (st == 0 ? "" : ", but the child then failed: ")
                                 : (st == 0 ? "no result" : ""),
                        accepted && st == 0 ? "" : why,
                        (double)(now_ns() - t_start) / 1e9);
            }
        }
    }

    /* JSON lines, then the table (the last thing on stdout) */
    for (i = 0; i < nrows; i++)
        write_row_json(jf ? jf : stdout, &rows[i], &ri, &o);
    if (jf) {
        if (fclose(jf) != 0) {
            fprintf(stderr, "cudefer-bench: writing %s: %s\n", json_path, strerror(errno));
            total_failures++;
        } else {
            fprintf(stderr, "cudefer-bench: JSON lines written to %s\n", json_path);
        }
    }
    fflush(stdout);
    fflush(stderr);
    print_table(&ri, &o, wl_sel, total_failures);
    return total_failures ? 1 : 0;
}
