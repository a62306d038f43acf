/* SPDX-License-Identifier: MIT */
/*
 * faults.h — what the fault-injection scenarios share: the scenario table's
 * row, small helpers, and the scenarios, grouped by the part of cudefer
 * whose CUDA calls they make fail:
 *   faults_launch.c     the launching thread: start, stream identity,
 *                       recording, creating events, synchronous release
 *   faults_reclaimer.c  the reclaimer's loop: querying events, the sticky
 *                       error, its cudaSetDevice
 *   faults_release.c    releasing memory: cudaFree, cudaFreeHost, pool
 *                       memory, allocation sizes, the cap (cudaMemGetInfo)
 *   faults_teardown.c   shutdown and exit: destroying events and streams,
 *                       cudaErrorCudartUnloading
 * faults.c holds the table and runs each scenario in a child process.
 */
#ifndef CUDEFER_FAULTS_H
#define CUDEFER_FAULTS_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"


#define ONCE 1L
#define ALWAYS (-1L)

#define SCENARIO_TIMEOUT_MS 10000
#define EXIT_WORKER_TIMEOUT_MS 20000

/* Poll cond every millisecond, for at most ms milliseconds. */
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

#define EN(err) cudaGetErrorName(err)

struct scenario {
    const char *title;
    const char *env;      /* CUDEFER_* settings */
    int ndevices;
    void (*fn)(const struct scenario *sc);
    enum fake_call call;  /* the call made to fail (where fn is shared) */
    cudaError_t err;      /* ... with this error */
    long count;           /* ONCE, ALWAYS (0: not at all, a control run) */
    cudaError_t shutdown_err; /* what the final defer_shutdown returns */
    const char *variant;  /* exit scenarios: the worker to exec; else a
                             variant of fn, or NULL */
};

/* ---- helpers -------------------------------------------------------------- */

/* Lines of text that start with "cudefer: " and contain each of the
 * non-NULL strings a, b and c. */
static inline int lines_with(const char *text, const char *a, const char *b,
                      const char *c)
{
    int n = 0;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        if (len >= sizeof buf)
            len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = '\0';
        if (strncmp(buf, "cudefer: ", 9) == 0 &&
            (a == NULL || strstr(buf, a) != NULL) &&
            (b == NULL || strstr(buf, b) != NULL) &&
            (c == NULL || strstr(buf, c) != NULL))
            n++;
        if (end == NULL)
            break;
        line = end + 1;
    }
    return n;
}

/* A copy of what stderr got since stderr_capture_begin (the helper's buffer
 * is reused by the next capture). */
static inline const char *capture_end(void)
{
    static char text[2][8192];
    static int which;
    which ^= 1;
    snprintf(text[which], sizeof text[which], "%s", stderr_capture_end());
    return text[which];
}

/* p as cudefer prints it (%p); a few rotating buffers. */
static inline const char *ptr_text(const void *p)
{
    static char buf[8][32];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof buf[0], "%p", p);
    return b;
}

static inline void mark(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

static inline int flag(const int *f)
{
    return __atomic_load_n(f, __ATOMIC_ACQUIRE);
}

/* The invariant of the counters: every accepted entry is released, failed
 * or pending. */
static inline void check_stats_at(int line)
{
    struct defer_stats st = stats_now();
    check(st.released + st.failed + st.pending == st.deferred, line,
          "stats: deferred %llu != released %llu + failed %llu + pending %llu",
          ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending));
}
#define CHECK_STATS() check_stats_at(__LINE__)

/* A device buffer used by work on s that takes us microseconds. */
static inline void *busy_buffer(cudaStream_t s, size_t size, unsigned us)
{
    void *p = device_alloc(size);
    work_timed(s, us, p);
    return p;
}

static inline void *pool_alloc(cudaStream_t s, size_t size)
{
    void *p;
    cudaError_t err = cudaMallocAsync(&p, size, s);
    if (err != cudaSuccess)
        bail("cudaMallocAsync: %s", EN(err));
    return p;
}

/* The scenarios: each runs in its own child process (see run in faults.c),
 * makes sc->call fail as sc says, and CHECKs what follows. */
void s_device_count(const struct scenario *sc);
void s_stream_identity(const struct scenario *sc);
void s_record(const struct scenario *sc);
void s_record_sticky(const struct scenario *sc);
void s_create_fails(const struct scenario *sc);
void s_create_and_sync_fail(const struct scenario *sc);
void s_create_other_device(const struct scenario *sc);
void s_disable_sync_fails(const struct scenario *sc);
void s_disable_free_fails(const struct scenario *sc);
void s_disable_free_sticky(const struct scenario *sc);
void s_pool_growth_oom(const struct scenario *sc);
void s_query_fails(const struct scenario *sc);
void s_sticky(const struct scenario *sc);
void s_reclaimer_set_device(const struct scenario *sc);
void s_free_sticky(const struct scenario *sc);
void s_free_sticky_shutdown(const struct scenario *sc);
void s_sticky_thread_exit(const struct scenario *sc);
void s_free_fails(const struct scenario *sc);
void s_free_async_fails(const struct scenario *sc);
void s_malloc_free_sync_fails(const struct scenario *sc);
void s_free_async_rejected(const struct scenario *sc);
void s_free_n_first_fails(const struct scenario *sc);
void s_free_n_sticky_after_refused(const struct scenario *sc);
void s_free_stream_fails(const struct scenario *sc);
void s_entry_point_fails(const struct scenario *sc);
void s_pointer_attributes_fail(const struct scenario *sc);
void s_mem_get_info(const struct scenario *sc);
void s_mem_get_info_set_cap(const struct scenario *sc);
void s_event_destroy_at_shutdown(const struct scenario *sc);
void s_event_destroy_overflow(const struct scenario *sc);
void s_stream_destroy_at_shutdown(const struct scenario *sc);
void s_exit_unloading(const struct scenario *sc);

/* The exit scenarios' worker: this program run again as "--exit-worker
 * NAME" (faults_argv0 is its path, set by main); returns the worker's exit
 * status.  In the worker process only. */
extern const char *faults_argv0;
int run_exit_worker(const char *name);

#endif /* CUDEFER_FAULTS_H */
