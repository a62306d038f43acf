/* SPDX-License-Identifier: MIT */
/*
 * gpu_soak: at least 10^7 entries of W1-like traffic through cudefer with the
 * default (batched) release policy, on device 0.  Not part of make check:
 * build it with "make soak", run it with "t/gpu/gpu_soak [options]".
 *
 * What it shows: the device memory cudefer holds (stats.held_bytes) stays
 * under the cap the whole time, the cap is actually reached (batches are
 * released because of it), and after the final defer_flush every entry is
 * released, none failed, and device memory is back where it started.
 *
 * The traffic.  THREADS threads (8), each with its own non-blocking stream,
 * loop over {allocate, kernel that writes the buffer, defer_free}, like the
 * benchmark's W1 (bench/cudefer-bench.c), until the entries are done or the
 * time limit is reached:
 *   - one iteration in DEVICE_EVERY (64) allocates 1 MiB with cudaMalloc and
 *     runs a 50 us kernel on it (W1 itself).  These are the entries the
 *     release policy holds: completed, they wait for a quiet moment, for the
 *     cap or for their age, and are released with cudaFree in batches;
 *   - the others allocate 4 KiB with cudaMallocAsync and run a short kernel
 *     (KERNEL_US, 10 us).  cudefer releases pool memory with cudaFreeAsync as
 *     soon as its work completes, without holding it.
 * Why the mix: cudaMalloc costs ~30 us and cudaFree ~20 us under a driver
 * lock that every thread shares, so 10^7 cudaMalloc entries would take
 * 500 s or more; pool entries cost ~1 us each.  The cudaMalloc entries
 * (156 250 of 1 MiB, 152 GiB in all, more than the device has) still go
 * through the cap hundreds of times: CUDEFER_MAX_PENDING is set to CAP
 * (1 GiB) before the first defer call, so every ~0.5 GiB of such traffic
 * ends in a cap batch.
 *
 * Backlog.  Nothing in cudefer makes a caller wait, so a host that defers
 * faster than the reclaimer releases would grow the backlog without bound.
 * Every 256 iterations a thread looks at stats.pending and naps while it
 * exceeds MAX_BACKLOG entries (262 144); the summary says how often.
 *
 * Measurements.  A monitor thread reads defer_stats_get() every 1 ms (the
 * maximum of held_bytes, held and pending) and cudaMemGetInfo every 100 ms
 * (device memory in use by the soak: the free memory at the start minus the
 * free memory now; informational: it also counts buffers still in use by
 * kernels, pool memory and allocator rounding).  A progress line is printed
 * every 10 s.
 *
 * Checks (each printed as "ok - ..." or "FAIL - ..."):
 *   - at least ENTRIES entries were deferred (not stopped by the time limit);
 *   - no CUDA or cudefer call of the traffic failed;
 *   - max held_bytes <= cap + 1 MiB (one buffer);
 *   - the cap was reached: stats.cap_releases grew;
 *   - the final defer_flush returned cudaSuccess;
 *   - after it: released == deferred, failed == 0, rejected == 0,
 *     pending == 0, held_bytes == 0;
 *   - device memory is back (within 64 MiB) after the flush and a trim of
 *     the memory pool.
 * The last line is "soak: PASS" (exit status 0) or "soak: FAIL ..." (1).
 * Exit status 2: setup failed or the watchdog fired (not done --watchdog
 * seconds after the time limit: the threads, the final flush or the checks
 * hang); 77: no CUDA device.
 *
 * Options: --entries N (10000000; 1e7 is accepted), --seconds S (time limit
 * of the traffic, 300), --threads T (8), --device-every K (64; 0: pool
 * entries only), --kernel-us U (10), --cap SIZE (1G; k/M/G/T are powers of
 * 1024), --max-backlog N (262144), --watchdog S (120).
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

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"

#define KIB ((uint64_t)1024)
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)
#define BIG_BYTES ((size_t)MIB)       /* cudaMalloc entries (W1) */
#define SMALL_BYTES ((size_t)(4 * KIB)) /* cudaMallocAsync entries */
#define BIG_KERNEL_NS 50000ull        /* W1's 50 us kernel */
#define MEM_TOLERANCE (64 * MIB)      /* device memory allowed missing at the end */
#define MAX_THREADS 64
#define PROGRESS_EVERY_MS 10000

enum phase { PH_WARMUP, PH_TRAFFIC, PH_JOIN, PH_FLUSH, PH_CHECK, PH_DONE };
static const char *const phase_names[] = {
    "warm-up", "traffic", "joining the threads", "final defer_flush",
    "checks", "done",
};

static struct {
    /* options */
    uint64_t target;
    double seconds;
    int threads;
    uint64_t device_every;
    uint64_t kernel_ns;
    uint64_t cap;
    uint64_t max_backlog;
    double watchdog;           /* seconds after the time limit */
    /* shared state */
    _Atomic uint64_t claimed;  /* iteration numbers handed out */
    atomic_int stop;           /* the threads stop (time limit, error) */
    atomic_int time_limited;   /* stopped by the time limit */
    atomic_int running;        /* traffic threads still running */
    atomic_int phase;
    atomic_int monitor_stop;
    pthread_mutex_t error_lock;
    uint64_t errors;
    char first_error[512];
    double t0_ms;
    size_t baseline_free;
    /* the monitor's maxima */
    _Atomic uint64_t max_held_bytes, max_held, max_pending;
    _Atomic int64_t max_used;
} g = {.error_lock = PTHREAD_MUTEX_INITIALIZER};

struct worker {
    pthread_t thread;
    int id;
    cudaStream_t stream;
    _Atomic uint64_t done;   /* entries deferred */
    uint64_t big;            /* of which cudaMalloc ones */
    uint64_t trims;          /* allocation failures answered by defer_trim
                                or defer_flush */
    uint64_t naps;           /* backlog naps */
};

static struct worker workers[MAX_THREADS];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void nap_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (double)MIB;
}

static void setup_check(cudaError_t err, const char *what, int line)
{
    if (err == cudaSuccess)
        return;
    printf("soak: FAIL - setup: line %d: %s: %s (%s)\n", line, what,
           cudaGetErrorString(err), cudaGetErrorName(err));
    fflush(stdout);
    _exit(2);
}
#define SETUP(call) setup_check((call), #call, __LINE__)

/* A call of the traffic failed: remember the first, stop everything. */
static void traffic_error(int thread, const char *what, cudaError_t err)
{
    pthread_mutex_lock(&g.error_lock);
    if (g.errors++ == 0)
        snprintf(g.first_error, sizeof g.first_error,
                 "thread %d: %s: %s (%s)", thread, what,
                 cudaGetErrorString(err), cudaGetErrorName(err));
    pthread_mutex_unlock(&g.error_lock);
    atomic_store(&g.stop, 1);
}

/* ---- the traffic ------------------------------------------------------------ */

static void wait_for_backlog(struct worker *w)
{
    struct defer_stats st;
    for (;;) {
        defer_stats_get(&st);
        if (st.pending <= g.max_backlog || atomic_load(&g.stop))
            return;
        w->naps++;
        nap_us(100);
    }
}

/* Allocate; on out-of-memory, what an application does: defer_trim and
 * try again, then defer_flush and try a last time.  Clears the thread's
 * last error on the way. */
static cudaError_t allocate(struct worker *w, void **p, bool big)
{
    for (int attempt = 0;; attempt++) {
        cudaError_t err = big ? cudaMalloc(p, BIG_BYTES)
                              : cudaMallocAsync(p, SMALL_BYTES, w->stream);
        if (err != cudaErrorMemoryAllocation || attempt == 2)
            return err;
        (void)cudaGetLastError();
        w->trims++;
        if (attempt == 0)
            defer_trim(NULL);
        else
            defer_flush();
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    cudaError_t err = cudaSetDevice(0);
    if (err != cudaSuccess)
        traffic_error(w->id, "cudaSetDevice", err);
    for (uint64_t n = 0; !atomic_load_explicit(&g.stop, memory_order_relaxed);
         n++) {
        uint64_t i = atomic_fetch_add_explicit(&g.claimed, 1,
                                               memory_order_relaxed);
        if (i >= g.target)
            break;
        if ((n & 255) == 0)
            wait_for_backlog(w);
        bool big = g.device_every != 0 && i % g.device_every == 0;
        void *p = NULL;
        if ((err = allocate(w, &p, big)) != cudaSuccess) {
            traffic_error(w->id, big ? "cudaMalloc" : "cudaMallocAsync", err);
            break;
        }
        err = gpu_spin_fill(w->stream, big ? BIG_KERNEL_NS : g.kernel_ns, p,
                            big ? BIG_BYTES : SMALL_BYTES, (unsigned char)i);
        if (err != cudaSuccess) {
            traffic_error(w->id, "kernel launch", err);
            break;
        }
        if ((err = defer_free(p, w->stream)) != cudaSuccess) {
            traffic_error(w->id, "defer_free", err); /* p stays ours: leaked */
            break;
        }
        w->big += big;
        atomic_store_explicit(&w->done, atomic_load_explicit(&w->done, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    }
    atomic_fetch_sub(&g.running, 1);
    return NULL;
}

static uint64_t entries_done(void)
{
    uint64_t n = 0;
    for (int t = 0; t < g.threads; t++)
        n += atomic_load_explicit(&workers[t].done, memory_order_relaxed);
    return n;
}

/* ---- the monitor and the watchdog ----------------------------------------- */

static void raise_max_u(_Atomic uint64_t *max, uint64_t v)
{
    if (v > atomic_load(max))
        atomic_store(max, v);
}

static int64_t device_used(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        return 0;
    return (int64_t)g.baseline_free - (int64_t)free_b;
}

static void *monitor_main(void *arg)
{
    (void)arg;
    (void)cudaSetDevice(0);
    uint64_t ticks = 0, last_done = 0;
    double last_progress = now_ms();
    int64_t used = 0;
    while (!atomic_load(&g.monitor_stop)) {
        struct defer_stats st;
        defer_stats_get(&st);
        raise_max_u(&g.max_held_bytes, st.held_bytes);
        raise_max_u(&g.max_held, st.held);
        raise_max_u(&g.max_pending, st.pending);
        if (ticks++ % 100 == 0) {
            used = device_used();
            if (used > atomic_load(&g.max_used))
                atomic_store(&g.max_used, used);
        }
        double now = now_ms();
        if (now - last_progress >= PROGRESS_EVERY_MS) {
            uint64_t done = entries_done();
            printf("soak: t=%5.1fs entries %10" PRIu64 " (%.0fk/s) pending %7"
                   PRIu64 " held %6.1f MiB (max %6.1f) cap releases so far "
                   "%" PRIu64 " entries, device in use %.0f MiB\n",
                   (now - g.t0_ms) / 1e3, done,
                   (double)(done - last_done) / (now - last_progress),
                   st.pending, mib(st.held_bytes), mib(g.max_held_bytes),
                   st.cap_releases, (double)used / (double)MIB);
            fflush(stdout);
            last_done = done;
            last_progress = now;
        }
        nap_us(1000);
    }
    return NULL;
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    double deadline = now_ms() + (g.seconds + g.watchdog) * 1e3;
    while (atomic_load(&g.phase) != PH_DONE) {
        if (now_ms() > deadline) {
            printf("soak: FAIL - watchdog: still in phase \"%s\" %.0f s after "
                   "the start (entries %" PRIu64 ")\n",
                   phase_names[atomic_load(&g.phase)],
                   (now_ms() - g.t0_ms) / 1e3, entries_done());
            fflush(stdout);
            _exit(2);
        }
        nap_us(200000);
    }
    return NULL;
}

/* ---- options ---------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gpu_soak [--entries N] [--seconds S] [--threads T] "
            "[--device-every K]\n"
            "                [--kernel-us U] [--cap SIZE] [--max-backlog N] "
            "[--watchdog S]\n"
            "defaults: --entries 10000000 --seconds 300 --threads 8 "
            "--device-every 64\n"
            "          --kernel-us 10 --cap 1G --max-backlog 262144 "
            "--watchdog 120\n");
}

static bool parse_number(const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max))
        return false;
    *out = v;
    return true;
}

static bool parse_size(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return false;
    uint64_t scale = 1;
    switch (*end) {
    case 'k': case 'K': scale = KIB; end++; break;
    case 'm': case 'M': scale = MIB; end++; break;
    case 'g': case 'G': scale = GIB; end++; break;
    case 't': case 'T': scale = 1024 * GIB; end++; break;
    default: break;
    }
    if (*end != '\0' || v == 0 || v > UINT64_MAX / scale)
        return false;
    *out = v * scale;
    return true;
}

static void parse_options(int argc, char **argv)
{
    g.target = 10000000;
    g.seconds = 300;
    g.threads = 8;
    g.device_every = 64;
    g.kernel_ns = 10000;
    g.cap = GIB;
    g.max_backlog = 262144;
    g.watchdog = 120;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        double v = 0;
        bool good = val != NULL;
        if (!good) {
        } else if (strcmp(opt, "--entries") == 0) {
            good = parse_number(val, 1, 1e12, &v);
            g.target = (uint64_t)v;
        } else if (strcmp(opt, "--seconds") == 0) {
            good = parse_number(val, 1, 86400, &g.seconds);
        } else if (strcmp(opt, "--threads") == 0) {
            good = parse_number(val, 1, MAX_THREADS, &v);
            g.threads = (int)v;
        } else if (strcmp(opt, "--device-every") == 0) {
            good = parse_number(val, 0, 1e12, &v);
            g.device_every = (uint64_t)v;
        } else if (strcmp(opt, "--kernel-us") == 0) {
            good = parse_number(val, 0, 1e6, &v);
            g.kernel_ns = (uint64_t)(v * 1000);
        } else if (strcmp(opt, "--cap") == 0) {
            good = parse_size(val, &g.cap);
        } else if (strcmp(opt, "--watchdog") == 0) {
            good = parse_number(val, 1, 86400, &g.watchdog);
        } else if (strcmp(opt, "--max-backlog") == 0) {
            good = parse_number(val, 1, 1e12, &v);
            g.max_backlog = (uint64_t)v;
        } else {
            good = false;
        }
        if (!good) {
            fprintf(stderr, "gpu_soak: bad option or value: %s %s\n", opt,
                    val ? val : "");
            usage(stderr);
            exit(2);
        }
        i++;
    }
}

/* ---- main ------------------------------------------------------------------- */

static int failures;

static void check(bool good, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s - ", good ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !good;
}

static void warm_up(cudaMemPool_t pool)
{
    for (int t = 0; t < g.threads; t++) {
        void *big, *small;
        cudaStream_t s = workers[t].stream;
        SETUP(cudaMalloc(&big, BIG_BYTES));
        SETUP(cudaMallocAsync(&small, SMALL_BYTES, s));
        SETUP(gpu_spin_fill(s, 1000, big, BIG_BYTES, 1));
        SETUP(gpu_spin_fill(s, 1000, small, SMALL_BYTES, 1));
        SETUP(defer_free(big, s));
        SETUP(defer_free(small, s));
    }
    SETUP(defer_flush());
    SETUP(cudaDeviceSynchronize());
    SETUP(cudaMemPoolTrimTo(pool, 0));
}

int main(int argc, char **argv)
{
    parse_options(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* The cap, before the first defer call; the configuration in force is
     * printed on stderr at start-up. */
    char cap_text[32];
    snprintf(cap_text, sizeof cap_text, "%" PRIu64, g.cap);
    setenv("CUDEFER_MAX_PENDING", cap_text, 1);
    setenv("CUDEFER_VERBOSE", "1", 0);
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, "CUDEFER_", 8) == 0 &&
            strncmp(*e, "CUDEFER_MAX_PENDING=", 20) != 0 &&
            strncmp(*e, "CUDEFER_VERBOSE=", 16) != 0)
            printf("soak: note: %s is set (the soak is meant for the "
                   "defaults)\n", *e);

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("soak: SKIP no CUDA device\n");
        return 77;
    }
    SETUP(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    SETUP(cudaGetDeviceProperties(&prop, 0));
    cudaMemPool_t pool;
    SETUP(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX; /* keep pool memory between syncs */
    SETUP(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                  &threshold));
    for (int t = 0; t < g.threads; t++) {
        workers[t].id = t;
        SETUP(cudaStreamCreateWithFlags(&workers[t].stream,
                                        cudaStreamNonBlocking));
    }
    printf("soak: cudefer %s on %s (%.0f GiB), %d threads, %" PRIu64
           " entries, time limit %.0f s\n", defer_version(), prop.name,
           (double)prop.totalGlobalMem / (double)GIB, g.threads, g.target,
           g.seconds);
    if (g.device_every != 0)
        printf("soak: 1 in %" PRIu64 " iterations: cudaMalloc 1 MiB + 50 us "
               "kernel; the others: cudaMallocAsync 4 KiB + %.0f us kernel\n",
               g.device_every, g.kernel_ns / 1e3);
    else
        printf("soak: every iteration: cudaMallocAsync 4 KiB + %.0f us kernel\n",
               g.kernel_ns / 1e3);
    printf("soak: cap (CUDEFER_MAX_PENDING) %.0f MiB, backlog limit %" PRIu64
           " entries\n", mib(g.cap), g.max_backlog);

    g.t0_ms = now_ms();
    pthread_t watchdog, monitor;
    atomic_store(&g.phase, PH_WARMUP);
    if (pthread_create(&watchdog, NULL, watchdog_main, NULL) != 0) {
        printf("soak: FAIL - setup: pthread_create failed\n");
        return 2;
    }
    warm_up(pool);
    size_t total_b;
    SETUP(cudaMemGetInfo(&g.baseline_free, &total_b));
    struct defer_stats s0, s1;
    defer_stats_get(&s0);

    /* The traffic. */
    atomic_store(&g.phase, PH_TRAFFIC);
    double t0 = now_ms();
    atomic_store(&g.running, g.threads);
    if (pthread_create(&monitor, NULL, monitor_main, NULL) != 0) {
        printf("soak: FAIL - setup: pthread_create failed\n");
        return 2;
    }
    for (int t = 0; t < g.threads; t++)
        if (pthread_create(&workers[t].thread, NULL, worker_main,
                           &workers[t]) != 0) {
            printf("soak: FAIL - setup: pthread_create failed\n");
            return 2;
        }
    while (atomic_load(&g.running) > 0) {
        if (!atomic_load(&g.stop) && now_ms() - t0 >= g.seconds * 1e3) {
            atomic_store(&g.time_limited, 1);
            atomic_store(&g.stop, 1);
        }
        nap_us(10000);
    }
    atomic_store(&g.phase, PH_JOIN);
    for (int t = 0; t < g.threads; t++)
        pthread_join(workers[t].thread, NULL);
    double traffic_ms = now_ms() - t0;

    /* The final flush, with the monitor still watching. */
    atomic_store(&g.phase, PH_FLUSH);
    double f0 = now_ms();
    cudaError_t flush = defer_flush();
    double flush_ms = now_ms() - f0;
    double all_ms = now_ms() - t0;
    defer_stats_get(&s1);
    atomic_store(&g.monitor_stop, 1);
    pthread_join(monitor, NULL);

    atomic_store(&g.phase, PH_CHECK);
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t trim = cudaMemPoolTrimTo(pool, 0);
    int64_t missing = device_used();

    uint64_t done = entries_done(), big = 0, trims = 0, naps = 0;
    for (int t = 0; t < g.threads; t++) {
        big += workers[t].big;
        trims += workers[t].trims;
        naps += workers[t].naps;
    }
    uint64_t deferred = s1.deferred - s0.deferred;
    uint64_t released = s1.released - s0.released;
    uint64_t failed = s1.failed - s0.failed;
    uint64_t rejected = s1.rejected - s0.rejected;

    printf("soak: entries %" PRIu64 " in %.1f s (%.0fk/s), %.1f s with the "
           "final flush; %" PRIu64 " cudaMalloc 1 MiB, %" PRIu64
           " cudaMallocAsync 4 KiB\n", done, traffic_ms / 1e3,
           (double)done / traffic_ms, all_ms / 1e3, big, done - big);
    printf("soak: cap %.1f MiB; max held %.1f MiB (%" PRIu64 " entries); max "
           "pending %" PRIu64 " entries; backlog naps %" PRIu64
           "; allocation failures retried after defer_trim/defer_flush %" PRIu64 "\n",
           mib(g.cap), mib(g.max_held_bytes), (uint64_t)g.max_held,
           (uint64_t)g.max_pending, naps, trims);
    printf("soak: device memory in use by the soak, sampled every 100 ms: max "
           "%.0f MiB\n", (double)g.max_used / (double)MIB);
    printf("soak: releases by reason: cap %" PRIu64 ", idle %" PRIu64
           ", age %" PRIu64 ", demand %" PRIu64 " (pool memory and callbacks "
           "are released at once and counted in none)\n",
           s1.cap_releases - s0.cap_releases, s1.idle_releases - s0.idle_releases,
           s1.age_releases - s0.age_releases,
           s1.demand_releases - s0.demand_releases);
    printf("soak: release latency after completion: p50 <= %" PRIu64
           " us, max %" PRIu64 " us; batches %" PRIu64 ", largest %" PRIu64
           "; events created %" PRIu64 "; event queries %" PRIu64
           "; wake-ups %" PRIu64 "; sync releases %" PRIu64 "\n",
           s1.latency_p50_us, s1.latency_max_us, s1.batches - s0.batches,
           s1.largest_batch, s1.events_created,
           s1.event_queries - s0.event_queries, s1.wakeups - s0.wakeups,
           s1.sync_releases - s0.sync_releases);
    printf("soak: final defer_flush: %s, %.0f ms; then deferred %" PRIu64
           ", released %" PRIu64 ", failed %" PRIu64 ", rejected %" PRIu64
           ", pending %" PRIu64 ", held %" PRIu64 " (%" PRIu64 " bytes)\n",
           cudaGetErrorName(flush), flush_ms, deferred, released, failed,
           rejected, s1.pending, s1.held, s1.held_bytes);
    printf("soak: device memory not back after the flush and a pool trim: "
           "%.1f MiB (cudaDeviceSynchronize %s, cudaMemPoolTrimTo %s)\n",
           (double)missing / (double)MIB, cudaGetErrorName(sync),
           cudaGetErrorName(trim));

    check(done >= g.target && !atomic_load(&g.time_limited) &&
              deferred == done,
          "%" PRIu64 " entries deferred (target %" PRIu64 ")%s", deferred,
          g.target,
          atomic_load(&g.time_limited) ? ", stopped by the time limit" : "");
    check(g.errors == 0, "no call of the traffic failed%s%s",
          g.errors ? ": " : "", g.errors ? g.first_error : "");
    check(g.max_held_bytes <= g.cap + BIG_BYTES,
          "max held_bytes %.1f MiB <= cap %.1f MiB + one buffer",
          mib(g.max_held_bytes), mib(g.cap));
    check(g.device_every == 0 || s1.cap_releases > s0.cap_releases,
          "the cap was reached: %" PRIu64 " entries released because of it",
          s1.cap_releases - s0.cap_releases);
    check(flush == cudaSuccess, "the final defer_flush returned %s",
          cudaGetErrorName(flush));
    check(released == deferred && failed == 0 && rejected == 0,
          "every entry released: released %" PRIu64 " == deferred %" PRIu64
          ", failed %" PRIu64 ", rejected %" PRIu64, released, deferred,
          failed, rejected);
    check(s1.pending == 0 && s1.held == 0 && s1.held_bytes == 0,
          "nothing pending or held after the flush (pending %" PRIu64
          ", held %" PRIu64 ")", s1.pending, s1.held);
    check(sync == cudaSuccess && trim == cudaSuccess &&
              missing <= (int64_t)MEM_TOLERANCE,
          "device memory back after the flush: %.1f MiB missing (<= %.0f)",
          (double)missing / (double)MIB, mib(MEM_TOLERANCE));

    atomic_store(&g.phase, PH_DONE);
    if (failures != 0) {
        printf("soak: FAIL (%d checks failed)\n", failures);
        return 1;
    }
    printf("soak: PASS\n");
    return 0;
}
