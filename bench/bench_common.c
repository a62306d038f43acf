/* SPDX-License-Identifier: MIT */
/* What every benchmark program shares: see bench_common.h. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudefer.h"

#define SAMPLER_US 1000   /* cudaMemGetInfo every ~1 ms */

char bench_who[200] = "bench";
int bench_device;

/* ---- messages ----------------------------------------------------------- */

/* Any thread; never returns.  _exit: other threads may hold CUDA state that
 * atexit handlers would wait on. */
void bench_die(const char *fmt, ...)
{
    char msg[600];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", bench_who, msg);
    fflush(stderr);
    _exit(1);
}

/* Any thread; never blocks on the GPU. */
void bench_note(const char *fmt, ...)
{
    char msg[600];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: note: %s\n", bench_who, msg);
}

/* Any thread; dies when out of memory. */
void *bench_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);

    if (!p)
        bench_die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

/* ---- time and numbers --------------------------------------------------- */

/* Any thread; never blocks. */
uint64_t bench_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Any thread; blocks us microseconds. */
void bench_sleep_us(unsigned us)
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

/* Any thread, on its own array. */
void bench_sort_u64(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
}

/* Pure function. */
double bench_pct_us(const uint64_t *sorted, size_t n, unsigned p)
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

/* Pure function. */
double bench_mean_us(const uint64_t *v, size_t n)
{
    long double sum = 0;
    size_t i;

    if (n == 0)
        return NAN;
    for (i = 0; i < n; i++)
        sum += v[i];
    return (double)(sum / n / 1000.0L);
}

/* Pure function. */
double bench_ratio(double num, double den)
{
    if (isnan(num) || isnan(den) || den <= 0)
        return NAN;
    return num / den;
}

/* Read a small /proc file into buf (NUL-terminated); its length or -1. */
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

/* Any thread; reads /proc. */
double bench_rss_bytes(void)
{
    char buf[256];
    unsigned long size, resident;

    if (read_small("/proc/self/statm", buf, sizeof buf) <= 0 ||
        sscanf(buf, "%lu %lu", &size, &resident) != 2)
        return NAN;
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

/* ---- the reclaimer: CPU time and counters ------------------------------- */

/* CPU time of thread tid of this process: its CPU clock (the id glibc's
 * pthread_getcpuclockid builds) and utime + stime from /proc. */
static void task_cpu(pid_t tid, double *clock_ms, double *stat_ms)
{
    clockid_t cid = (clockid_t)(int)((~(unsigned)tid << 3) | 6u);
    struct timespec ts;
    char path[64], buf[1024];
    unsigned long ut, st;
    const char *p;

    *clock_ms = NAN;
    if (clock_gettime(cid, &ts) == 0)
        *clock_ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
    *stat_ms = NAN;
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    if (read_small(path, buf, sizeof buf) <= 0 || !(p = strrchr(buf, ')')))
        return;
    /* fields 3..15: state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
               &ut, &st) == 2)
        *stat_ms = (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* Pure value. */
struct bench_cpu bench_cpu_none(void)
{
    struct bench_cpu c = { NAN, NAN, 0 };

    return c;
}

/* Any thread; reads /proc/self/task. */
struct bench_cpu bench_cpu_cudefer(void)
{
    static int warned;
    struct bench_cpu c = { 0, 0, 0 };
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;

    if (!d)
        return bench_cpu_none();
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
        if (!warned++)
            bench_note("no thread named \"cudefer-reclaim\" in /proc/self/task: "
                       "reclaimer CPU not measured");
        return bench_cpu_none();
    }
    return c;
}

/* Any thread. */
struct bench_cpu bench_cpu_thread(pid_t tid)
{
    struct bench_cpu c = { 0, 0, 1 };

    task_cpu(tid, &c.clock_ms, &c.stat_ms);
    return c;
}

/* Pure function. */
double bench_cpu_delta(const struct bench_cpu *a, const struct bench_cpu *b,
                       int stat)
{
    if (a->threads == 0 || b->threads != a->threads)
        return NAN;
    return stat ? b->stat_ms - a->stat_ms : b->clock_ms - a->clock_ms;
}

/* Any thread; defer_stats_get takes the library's stats lock briefly. */
void bench_snap_cudefer(struct bench_snap *s)
{
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
    s->cache_mallocs = (double)st.cache_mallocs;
    s->cache_releases = (double)st.cache_releases;
}

/* Any thread; takes the naive reclaimer's mutex. */
void bench_snap_naive(struct naive_reclaimer *nr, struct bench_snap *s)
{
    struct naive_stats st;

    naive_stats_get(nr, &st);
    bench_snap_none(s);
    s->deferred = (double)st.deferred;
    s->released = (double)st.released;
    s->failed = (double)st.failed;
    s->queries = (double)st.event_queries;
    s->wakeups = (double)st.polls;
    s->pending = (double)(st.deferred - st.released - st.failed);
    s->events_created = (double)st.deferred;
}

/* Pure. */
void bench_snap_none(struct bench_snap *s)
{
    s->deferred = s->released = s->failed = s->queries = s->wakeups =
        s->batches = s->sync_releases = s->pending = s->events_created =
            s->rejected = s->cache_mallocs = s->cache_releases = NAN;
}

/* ---- device memory in use ----------------------------------------------- */

static void *sampler_main(void *arg)
{
    struct bench_sampler *s = arg;

    pthread_setname_np(pthread_self(), "bench-sampler");
    if (cudaSetDevice(bench_device) != cudaSuccess)
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
        bench_sleep_us(SAMPLER_US);
    }
    return NULL;
}

/* The measuring thread; dies if the sampler cannot start. */
void bench_sampler_start(struct bench_sampler *s)
{
    int rc;

    s->min_free = SIZE_MAX;
    s->samples = 0;
    atomic_store(&s->stop, 0);
    rc = pthread_create(&s->thread, NULL, sampler_main, s);
    if (rc)
        bench_die("pthread_create: %s", strerror(rc));
}

/* The thread that started it; blocks until the sampler's last sample. */
double bench_sampler_stop(struct bench_sampler *s, size_t base_free)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    if (s->samples == 0 || s->min_free >= base_free)
        return 0.0;
    return (double)(base_free - s->min_free);
}

/* ---- the one JSON object on stdout -------------------------------------- */

static char json_buf[16384];
static size_t json_len;
static int json_first;

static void json_raw(const char *s)
{
    size_t n = strlen(s);

    if (json_len + n + 1 > sizeof json_buf)
        bench_die("JSON result longer than %zu bytes", sizeof json_buf);
    memcpy(json_buf + json_len, s, n + 1);
    json_len += n;
}

static void json_quoted(const char *s)
{
    char tmp[8];

    json_raw("\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\')
            snprintf(tmp, sizeof tmp, "\\%c", c);
        else if (c < 0x20)
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
        else
            snprintf(tmp, sizeof tmp, "%c", c);
        json_raw(tmp);
    }
    json_raw("\"");
}

static void json_key(const char *key)
{
    if (!json_first)
        json_raw(",");
    json_first = 0;
    json_quoted(key);
    json_raw(":");
}

/* Main thread only (one object per process). */
void json_begin(void)
{
    json_len = 0;
    json_first = 1;
    json_raw("{");
}

/* Main thread only. */
void json_str(const char *key, const char *value)
{
    json_key(key);
    json_quoted(value);
}

/* Main thread only; integers exactly, the rest with 6 significant digits. */
void json_num(const char *key, double value)
{
    char tmp[64];

    json_key(key);
    if (isnan(value) || isinf(value)) {
        json_raw("null");
        return;
    }
    if (value > -9e15 && value < 9e15 && (double)(long long)value == value)
        snprintf(tmp, sizeof tmp, "%.0f", value);
    else
        snprintf(tmp, sizeof tmp, "%.6g", value);
    json_raw(tmp);
}

/* Main thread only: the whole line at once, so a reader sees all or none. */
void json_end(void)
{
    json_raw("}\n");
    fputs(json_buf, stdout);
    fflush(stdout);
}

/* ---- the command line --------------------------------------------------- */

static long parse_long(const char *program, const char *opt, const char *s,
                       long lo, long hi)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s: '%s' is not a number in [%ld, %ld]\n",
                program, opt, s, lo, hi);
        exit(2);
    }
    return v;
}

/* Main thread; errors here are the run's, not a workload's. */
void bench_cuda_init(void)
{
    int n = 0;

    CK(cudaGetDeviceCount(&n));
    if (n < 1)
        bench_die("no CUDA device");
    bench_device = 0;
    CK(cudaSetDevice(bench_device));
    CK(cudaFree(NULL));
}

/* --info: the device and the versions, for run.py's records. */
static void print_info(void)
{
    struct cudaDeviceProp prop;
    int rt = 0, drv = 0, n = 0;
    char cc[16];

    bench_cuda_init();
    CK(cudaGetDeviceCount(&n));
    CK(cudaGetDeviceProperties(&prop, bench_device));
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    snprintf(cc, sizeof cc, "%d.%d", prop.major, prop.minor);
    json_begin();
    json_str("info", "device");
    json_str("device", prop.name);
    json_str("cc", cc);
    json_num("sms", prop.multiProcessorCount);
    json_num("mem_bytes", (double)prop.totalGlobalMem);
    json_num("gpus", n);
    json_num("cuda_runtime", rt);
    json_num("cuda_driver", drv);
    json_str("cudefer_version", defer_version() ? defer_version() : "?");
    json_end();
}

/* Main thread, first thing in main; exits on --info, --help or bad input. */
void bench_parse_args(int argc, char **argv, const char *program,
                      const char *usage, struct bench_args *a)
{
    int i;

    memset(a, 0, sizeof *a);
    a->iters = 5000;
    a->calls = 20000;
    a->entries = 1000000;
    snprintf(bench_who, sizeof bench_who, "%s", program);
    for (i = 1; i < argc; i++) {
        const char *o = argv[i];

        if (strcmp(o, "--info") == 0) {
            print_info();
            exit(0);
        }
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            printf("usage: %s %s", program, usage);
            exit(0);
        }
        if (i + 1 >= argc || strncmp(o, "--", 2) != 0) {
            fprintf(stderr, "%s: unknown option or missing value: '%s'\n"
                    "usage: %s %s", program, o, program, usage);
            exit(2);
        }
        if (strcmp(o, "--workload") == 0)
            a->workload = argv[++i];
        else if (strcmp(o, "--strategy") == 0)
            a->strategy = argv[++i];
        else if (strcmp(o, "--label") == 0)
            a->label = argv[++i];
        else if (strcmp(o, "--rep") == 0)
            a->rep = (int)parse_long(program, o, argv[++i], 0, 1000000);
        else if (strcmp(o, "--iters") == 0)
            a->iters = parse_long(program, o, argv[++i], 1, 10000000);
        else if (strcmp(o, "--calls") == 0)
            a->calls = parse_long(program, o, argv[++i], 100, 10000000);
        else if (strcmp(o, "--entries") == 0)
            a->entries = parse_long(program, o, argv[++i], 64, 100000000);
        else {
            fprintf(stderr, "%s: unknown option '%s'\nusage: %s %s", program,
                    o, program, usage);
            exit(2);
        }
    }
    if (!a->workload || !a->strategy) {
        fprintf(stderr, "%s: --workload and --strategy are needed\nusage: %s %s",
                program, program, usage);
        exit(2);
    }
    if (!a->label)
        a->label = a->strategy;
    snprintf(bench_who, sizeof bench_who, "%s [%s %s rep %d]", program,
             a->workload, a->label, a->rep);
}

/* Main thread, after json_begin. */
void bench_json_head(const struct bench_args *a)
{
    json_str("workload", a->workload);
    json_str("strategy", a->label);
    json_str("kind", a->strategy);
    json_num("rep", a->rep);
}

/* Main thread, at the end; blocks until the device is idle. */
int bench_finish(int used_cudefer)
{
    int status = 0;

    if (used_cudefer) {
        cudaError_t rc = defer_shutdown();

        if (rc != cudaSuccess) {
            fprintf(stderr, "%s: defer_shutdown: %s\n", bench_who,
                    cudaGetErrorString(rc));
            status = 3;
        }
    }
    CK(cudaDeviceSynchronize());
    return status;
}
