/* Fault injection: every CUDA runtime call cudefer makes fails, once and
 * persistently, one scenario per process (the configuration is read once
 * per process, and a failed device stays failed).  Each scenario checks
 * that nothing crashes or hangs, that nothing is released early or twice
 * (the fake's oracle), that the caller gets the error or the entry is
 * released synchronously (or abandoned, or retried) as documented, that the
 * statistics count it, and that one line on stderr names the call and the
 * CUDA error.
 *
 * The calls, and who makes them:
 *   launching thread: cudaGetDeviceCount (start), cudaStreamGetDevice,
 *     cudaStreamGetId, cudaGetDevice + cudaSetDevice (creating an event for
 *     another device), cudaEventCreateWithFlags (empty pool),
 *     cudaEventRecord, cudaStreamSynchronize (synchronous release),
 *     cudaFree/cudaFreeHost (synchronous release);
 *   reclaimer: cudaSetDevice, cudaMemGetInfo, cudaGetDriverEntryPointByVersion
 *     and cuPointerGetAttributes, cudaEventQuery, cudaFree, cudaFreeHost,
 *     cudaFreeAsync, cudaStreamCreateWithFlags, cudaEventSynchronize (only
 *     out of memory: not covered, see main), cudaEventDestroy,
 *     cudaStreamDestroy;
 *   process exit: any of the reclaimer's, failing with
 *     cudaErrorCudartUnloading.
 *
 * fake_fail counts calls of a kind across all threads, so each scenario arms
 * an injection at a moment when only the thread it aims at can make that
 * call. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define ONCE 1L
#define ALWAYS (-1L)

#define SCENARIO_TIMEOUT_MS 10000
#define EXIT_WORKER_TIMEOUT_MS 6000

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
static int lines_with(const char *text, const char *a, const char *b,
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
static const char *capture_end(void)
{
    static char text[2][8192];
    static int which;
    which ^= 1;
    snprintf(text[which], sizeof text[which], "%s", stderr_capture_end());
    return text[which];
}

/* p as cudefer prints it (%p); a few rotating buffers. */
static const char *ptr_text(const void *p)
{
    static char buf[8][32];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof buf[0], "%p", p);
    return b;
}

static void mark(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

static int flag(const int *f)
{
    return __atomic_load_n(f, __ATOMIC_ACQUIRE);
}

/* The invariant of the counters: every accepted entry is released, failed
 * or pending. */
static void check_stats_at(int line)
{
    struct defer_stats st = stats_now();
    check(st.released + st.failed + st.pending == st.deferred, line,
          "stats: deferred %llu != released %llu + failed %llu + pending %llu",
          ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending));
}
#define CHECK_STATS() check_stats_at(__LINE__)

/* A device buffer used by work on s that takes us microseconds. */
static void *busy_buffer(cudaStream_t s, size_t size, unsigned us)
{
    void *p = device_alloc(size);
    work_timed(s, us, p);
    return p;
}

static int count_released(void *const *p, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += fake_is_released(p[i]) == 1;
    return k;
}

static void *pool_alloc(cudaStream_t s, size_t size)
{
    void *p;
    cudaError_t err = cudaMallocAsync(&p, size, s);
    if (err != cudaSuccess)
        bail("cudaMallocAsync: %s", EN(err));
    return p;
}

/* ---- start: cudaGetDeviceCount ---------------------------------------------- */

static void s_device_count(const struct scenario *sc)
{
    int tries = sc->count == ONCE ? 1 : 3;
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    stderr_capture_begin();
    fake_fail(FAKE_GET_DEVICE_COUNT, sc->err, 0, sc->count);
    for (int i = 0; i < tries; i++) {
        cudaError_t err = defer_free(p, s);
        CHECK(err == sc->err, "defer_free #%d while cudaGetDeviceCount fails: "
              "%s, want %s", i, EN(err), EN(sc->err));
    }
    const char *msg = capture_end();
    struct defer_stats st = stats_now();
    CHECK(fake_is_released(p) == 0, "the caller keeps the pointer");
    CHECK(st.deferred == 0, "nothing deferred (%llu)", ULL(st.deferred));
    CHECK(st.rejected == (uint64_t)tries, "each refused call counted in "
          "rejected (%llu, want %d)", ULL(st.rejected), tries);
    CHECK(lines_with(msg, "cudaGetDeviceCount", EN(sc->err), NULL) >= 1,
          "stderr names cudaGetDeviceCount and %s", EN(sc->err));
    fake_fail_clear();
    work_timed(s, 1000, p);
    cudaError_t err = defer_free(p, s);
    CHECK(err == cudaSuccess, "the next call starts the library: %s", EN(err));
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1, "and the pointer is released");
    CHECK_STATS();
}

/* ---- launching thread: cudaStreamGetDevice, cudaStreamGetId --------------- */

static void s_stream_identity(const struct scenario *sc)
{
    const char *call = fake_call_name(sc->call);
    int tries = sc->count == ONCE ? 1 : 3;
    cudaStream_t s = stream_new();
    void *p = device_alloc(64), *h = host_alloc(64);
    int ran = 0;
    cudaError_t e[3] = {cudaSuccess, cudaSuccess, cudaSuccess};
    stderr_capture_begin();
    fake_fail(sc->call, sc->err, 0, sc->count);
    e[0] = defer_free(p, s); /* a stream never seen: looked up */
    if (tries > 1) {
        e[1] = defer_free_host(h, 0); /* the legacy stream: always looked up */
        e[2] = defer_call(mark, &ran, s);
    }
    const char *msg = capture_end();
    for (int i = 0; i < tries; i++)
        CHECK(e[i] == sc->err, "defer call #%d while %s fails: %s, want %s", i,
              call, EN(e[i]), EN(sc->err));
    struct defer_stats st = stats_now();
    CHECK(st.rejected == (uint64_t)tries, "rejected %llu, want %d",
          ULL(st.rejected), tries);
    CHECK(st.deferred == 0, "nothing queued (deferred %llu)", ULL(st.deferred));
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0,
          "the caller keeps its pointers");
    char failed[64];
    snprintf(failed, sizeof failed, "%s failed", call);
    CHECK(lines_with(msg, failed, EN(sc->err), NULL) == tries,
          "each refusal names %s and %s on stderr (%d lines, want %d)", call,
          EN(sc->err), lines_with(msg, failed, EN(sc->err), NULL), tries);
    fake_fail_clear();
    work_timed(s, 500, p);
    work_timed(s, 500, h);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free once the call works");
    CHECK(defer_free_host(h, s) == cudaSuccess, "defer_free_host");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1 && fake_is_released(h) == 1, "released");
    CHECK(!flag(&ran), "the refused callback never runs");
    CHECK_STATS();
}

/* ---- launching thread: cudaEventRecord ------------------------------------ */

static void s_record(const struct scenario *sc)
{
    const cudaError_t bad = sc->err; /* not cudaErrorInvalidResourceHandle */
    int tries = sc->count == ONCE ? 1 : 3;
    cudaStream_t s = stream_new();
    void *p0 = busy_buffer(s, 64, 0);
    CHECK(defer_free(p0, s) == cudaSuccess, "defer_free (the stream is now "
          "known)");
    size_t events = fake_live_events();
    void *p = device_alloc(64), *h = host_alloc(64);
    int ran = 0;
    cudaError_t e[3] = {cudaSuccess, cudaSuccess, cudaSuccess};
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_RECORD, bad, 0, sc->count);
    e[0] = defer_free(p, s);
    if (tries > 1) {
        e[1] = defer_free_host(h, s);
        e[2] = defer_call(mark, &ran, 0);
    }
    const char *msg = capture_end();
    for (int i = 0; i < tries; i++)
        CHECK(e[i] == bad, "defer call #%d while cudaEventRecord fails: %s, "
              "want %s", i, EN(e[i]), EN(bad));
    struct defer_stats st = stats_now();
    CHECK(st.rejected == (uint64_t)tries, "rejected %llu, want %d",
          ULL(st.rejected), tries);
    CHECK(st.deferred == 1, "nothing more queued (deferred %llu, want 1)",
          ULL(st.deferred));
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0,
          "the caller keeps its pointers");
    CHECK(lines_with(msg, "cudaEventRecord failed", EN(bad), NULL) == tries,
          "each refusal names cudaEventRecord and %s (%d lines, want %d)",
          EN(bad), lines_with(msg, "cudaEventRecord failed", EN(bad), NULL),
          tries);
    CHECK(fake_live_events() <= events + 1, "the events of the failed records "
          "are reused, not leaked (%zu live, %zu before)", fake_live_events(),
          events);
    fake_fail_clear();

    if (sc->count == ONCE) {
        /* On a known stream, an invalid handle may mean the handle was
         * reused: the stream is looked up again and the record retried. */
        work_timed(s, 500, p);
        unsigned long records = fake_calls(FAKE_EVENT_RECORD);
        stderr_capture_begin();
        fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 1);
        cudaError_t err = defer_free(p, s);
        capture_end();
        CHECK(err == cudaSuccess, "one invalid-handle error on a known stream: "
              "retried after a fresh lookup (%s)", EN(err));
        CHECK(fake_calls(FAKE_EVENT_RECORD) - records == 2,
              "recorded twice (%lu)", fake_calls(FAKE_EVENT_RECORD) - records);
        /* Twice: the retry fails too, the error is the caller's. */
        uint64_t rejected = stats_now().rejected;
        stderr_capture_begin();
        fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 2);
        err = defer_free_host(h, s);
        msg = capture_end();
        CHECK(err == cudaErrorInvalidResourceHandle, "two invalid-handle "
              "errors: returned (%s)", EN(err));
        CHECK(stats_now().rejected - rejected == 1, "counted in rejected");
        CHECK(lines_with(msg, "cudaEventRecord failed",
                         "cudaErrorInvalidResourceHandle", NULL) == 1,
              "and named on stderr");
        CHECK(fake_is_released(h) == 0, "the caller keeps the pointer");
        fake_fail_clear();
    }

    if (sc->count != ONCE) {
        work_timed(s, 500, p);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free once record works");
    }
    work_timed(s, 500, h);
    CHECK(defer_free_host(h, s) == cudaSuccess, "defer_free_host");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1 && fake_is_released(h) == 1 &&
              fake_is_released(p0) == 1, "all released");
    CHECK(!flag(&ran), "the refused callback never runs");
    CHECK_STATS();
}

/* ---- launching thread: creating an event ---------------------------------- */

/* The name cudefer should print for the failing call. */
static const char *create_call_name(enum fake_call c)
{
    return c == FAKE_EVENT_CREATE ? "cudaEventCreateWithFlags"
                                  : fake_call_name(c);
}

/* cudaEventCreateWithFlags or cudaGetDevice fails while an event is created
 * (a fresh process: the pool is empty): the call waits for the stream and
 * releases at once. */
static void s_create_fails(const struct scenario *sc)
{
    const char *call = create_call_name(sc->call);
    int tries = sc->count == ONCE ? 1 : 3;
    cudaStream_t s = stream_new();
    void *p = device_alloc(64), *h = host_alloc(64);
    int ran = 0;
    fake_work *w[3];
    cudaError_t e[3] = {cudaSuccess, cudaSuccess, cudaSuccess};
    int done[3] = {1, 1, 1}, freed[3] = {1, 1, 1};
    stderr_capture_begin();
    fake_fail(sc->call, sc->err, 0, sc->count);
    w[0] = work_timed(s, 3000, p);
    e[0] = defer_free(p, s);
    done[0] = fake_work_done(w[0]);
    freed[0] = fake_is_released(p) == 1;
    if (tries > 1) {
        w[1] = work_timed(s, 3000, h);
        e[1] = defer_free_host(h, s);
        done[1] = fake_work_done(w[1]);
        freed[1] = fake_is_released(h) == 1;
        w[2] = work_timed(s, 3000, NULL);
        e[2] = defer_call(mark, &ran, s);
        done[2] = fake_work_done(w[2]);
        freed[2] = flag(&ran);
    }
    const char *msg = capture_end();
    for (int i = 0; i < tries; i++) {
        CHECK(e[i] == cudaSuccess, "defer call #%d without an event: accepted "
              "(%s)", i, EN(e[i]));
        CHECK(done[i], "defer call #%d waited for the stream's work", i);
        CHECK(freed[i], "defer call #%d released (or ran) at once", i);
    }
    struct defer_stats st = stats_now();
    CHECK(st.sync_releases == (uint64_t)tries, "sync_releases %llu, want %d",
          ULL(st.sync_releases), tries);
    CHECK(st.deferred == (uint64_t)tries && st.released == (uint64_t)tries,
          "deferred %llu released %llu, want %d", ULL(st.deferred),
          ULL(st.released), tries);
    int lines = lines_with(msg, call, EN(sc->err), "releasing synchronously");
    CHECK(lines == tries, "each names %s, %s and the synchronous release on "
          "stderr (%d lines, want %d)", call, EN(sc->err), lines, tries);
    fake_fail_clear();
    /* The next call gets an event and defers as usual. */
    void *q = device_alloc(64);
    fake_work *wq = work_held(s, q);
    CHECK(defer_free(q, s) == cudaSuccess, "defer_free once events can be had");
    CHECK(stats_now().sync_releases == (uint64_t)tries, "deferred, not "
          "released synchronously");
    sleep_ms(5);
    CHECK(fake_is_released(q) == 0, "not released before its work is done");
    fake_complete(wq);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(q) == 1, "released");
    CHECK_STATS();
}

/* No event, and waiting for the stream fails too: the error is the
 * caller's. */
static void s_create_and_sync_fail(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    int tries = sc->count == ONCE ? 1 : 2;
    cudaStream_t s = stream_new();
    void *p = busy_buffer(s, 64, 1000), *h = host_alloc(64);
    work_timed(s, 1000, h);
    cudaError_t e[2] = {cudaSuccess, cudaSuccess};
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, sc->count);
    fake_fail(FAKE_STREAM_SYNCHRONIZE, bad, 0, sc->count);
    e[0] = defer_free(p, s);
    if (tries > 1)
        e[1] = defer_free_host(h, s);
    const char *msg = capture_end();
    for (int i = 0; i < tries; i++)
        CHECK(e[i] == bad, "defer call #%d: %s, want %s", i, EN(e[i]), EN(bad));
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0,
          "the caller keeps its pointers");
    struct defer_stats st = stats_now();
    CHECK(st.rejected == (uint64_t)tries, "rejected %llu, want %d",
          ULL(st.rejected), tries);
    CHECK(st.deferred == 0 && st.sync_releases == 0, "nothing deferred "
          "(deferred %llu, sync_releases %llu)", ULL(st.deferred),
          ULL(st.sync_releases));
    CHECK(lines_with(msg, "cudaStreamSynchronize failed", EN(bad), NULL) ==
              tries, "each names cudaStreamSynchronize and %s", EN(bad));
    fake_fail_clear();
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free once it works");
    CHECK(defer_free_host(h, s) == cudaSuccess, "defer_free_host");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1 && fake_is_released(h) == 1, "released");
    CHECK_STATS();
}

/* Two devices: the caller is on device 0, the stream on device 1, so the
 * event is created with device 1 made current and device 0 restored. */
static void s_create_other_device(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    int tries = sc->count == ONCE ? 1 : 2;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *p[3] = {device_alloc(64), device_alloc(64), device_alloc(64)};
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    fake_work *w[2];
    cudaError_t e[2] = {cudaSuccess, cudaSuccess};
    int done[2] = {1, 1}, freed[2] = {1, 1};
    size_t events = fake_live_events();
    /* skip 0: the switch to device 1 fails; skip 1 (variant "back"): the
     * switch back to device 0 fails, after the event was created. */
    bool back = sc->variant != NULL && strcmp(sc->variant, "back") == 0;
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, bad, back ? 1 : 0, sc->count);
    for (int i = 0; i < tries; i++) {
        w[i] = work_timed(s1, 3000, p[i]);
        e[i] = defer_free(p[i], s1);
        done[i] = fake_work_done(w[i]);
        freed[i] = fake_is_released(p[i]) == 1;
    }
    const char *msg = capture_end();
    int current = -1;
    cudaGetDevice(&current);
    fake_fail_clear();
    for (int i = 0; i < tries; i++) {
        CHECK(e[i] == cudaSuccess, "defer_free #%d: %s", i, EN(e[i]));
        CHECK(done[i] && freed[i], "defer_free #%d waited for the stream and "
              "released at once (work done %d, released %d)", i, done[i],
              freed[i]);
    }
    if (back)
        diag("  the caller's current device after the failed switch back: %d",
             current);
    else
        CHECK(current == 0, "the caller's current device is still 0 (%d)",
              current);
    CHECK(fake_live_events() == events, "no event left behind (%zu live, %zu "
          "before)", fake_live_events(), events);
    struct defer_stats st = stats_now();
    CHECK(st.sync_releases == (uint64_t)tries, "sync_releases %llu, want %d",
          ULL(st.sync_releases), tries);
    int lines = lines_with(msg, "cudaSetDevice", EN(bad),
                           "releasing synchronously");
    CHECK(lines == tries, "each names cudaSetDevice, %s and the synchronous "
          "release (%d lines, want %d)", EN(bad), lines, tries);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    /* Then events for device 1 are created and used as usual. */
    fake_work *wq = work_held(s1, p[2]);
    CHECK(defer_free(p[2], s1) == cudaSuccess, "defer_free on device 1");
    CHECK(stats_now().sync_releases == (uint64_t)tries, "deferred as usual");
    sleep_ms(5);
    CHECK(fake_is_released(p[2]) == 0, "not released before its work is done");
    fake_complete(wq);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p[2]) == 1, "released");
    CHECK_STATS();
}

/* CUDEFER_DISABLE: every call waits for its stream; that wait fails. */
static void s_disable_sync_fails(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    int tries = sc->count == ONCE ? 1 : 3;
    cudaStream_t s = stream_new();
    void *p = busy_buffer(s, 64, 1000), *h = host_alloc(64);
    int ran = 0;
    cudaError_t e[3] = {cudaSuccess, cudaSuccess, cudaSuccess};
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_SYNCHRONIZE, bad, 0, sc->count);
    e[0] = defer_free(p, s);
    if (tries > 1) {
        e[1] = defer_free_host(h, s);
        e[2] = defer_call(mark, &ran, s);
    }
    const char *msg = capture_end();
    for (int i = 0; i < tries; i++)
        CHECK(e[i] == bad, "defer call #%d: %s, want %s", i, EN(e[i]), EN(bad));
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0 && !flag(&ran),
          "nothing released, no callback run");
    struct defer_stats st = stats_now();
    CHECK(st.rejected == (uint64_t)tries && st.deferred == 0,
          "rejected %llu (want %d), deferred %llu", ULL(st.rejected), tries,
          ULL(st.deferred));
    CHECK(lines_with(msg, "cudaStreamSynchronize failed", EN(bad), NULL) ==
              tries, "each names cudaStreamSynchronize and %s", EN(bad));
    fake_fail_clear();
    CHECK(defer_free(p, s) == cudaSuccess && fake_is_released(p) == 1,
          "defer_free releases at once when the wait works");
    CHECK(defer_free_host(h, s) == cudaSuccess && fake_is_released(h) == 1,
          "defer_free_host too");
    CHECK(stats_now().sync_releases == 2, "sync_releases %llu, want 2",
          ULL(stats_now().sync_releases));
    CHECK_STATS();
}

/* CUDEFER_DISABLE: the caller's own cudaFree fails. */
static void s_disable_free_fails(const struct scenario *sc)
{
    enum { N = 3 };
    const cudaError_t bad = sc->err;
    int fails = sc->count == ONCE ? 1 : N;
    cudaStream_t s = stream_new();
    void *p[N];
    cudaError_t e[N];
    stderr_capture_begin();
    fake_fail(FAKE_FREE, bad, 0, sc->count);
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(s, 64, 1000);
        e[i] = defer_free(p[i], s);
    }
    const char *msg = capture_end();
    fake_fail_clear();
    for (int i = 0; i < N; i++) {
        CHECK(e[i] == cudaSuccess, "defer_free #%d: accepted (%s)", i,
              EN(e[i]));
        CHECK(fake_is_released(p[i]) == (i >= fails), "#%d released: %d", i,
              fake_is_released(p[i]));
        if (i < fails)
            CHECK(lines_with(msg, "cudaFree failed", EN(bad), ptr_text(p[i])) ==
                      1, "the failed cudaFree of #%d is named with its "
                      "pointer and %s", i, EN(bad));
    }
    struct defer_stats st = stats_now();
    CHECK(st.failed == (uint64_t)fails && st.released == (uint64_t)(N - fails),
          "failed %llu released %llu, want %d and %d", ULL(st.failed),
          ULL(st.released), fails, N - fails);
    CHECK(st.sync_releases == N, "sync_releases %llu", ULL(st.sync_releases));
    for (int i = 0; i < fails; i++)
        cudaFree(p[i]);
    CHECK(fake_live_allocations() == 0, "nothing else left (%zu)",
          fake_live_allocations());
    CHECK_STATS();
}

/* Out of memory while the event pool grows: many entries in flight, then
 * event creation fails; every call is still accepted (synchronously). */
static void s_pool_growth_oom(const struct scenario *sc)
{
    enum { K = 40, M = 24 };
    int syncs = sc->count == ONCE ? 1 : M;
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, K, sc->count);
    cudaStream_t sa = stream_new(), sb = stream_new();
    fake_work *gate = work_held(sa, NULL);
    void *a[K], *b[M];
    for (int i = 0; i < K; i++) {
        a[i] = busy_buffer(sa, 256, 0); /* after the gate */
        CHECK(defer_free(a[i], sa) == cudaSuccess, "defer_free a#%d", i);
    }
    CHECK(stats_now().events_created == K, "%llu events created for the "
          "entries in flight, want %d", ULL(stats_now().events_created), K);
    stderr_capture_begin();
    int sync_ok = 0, err_ok = 0;
    for (int i = 0; i < M; i++) {
        b[i] = device_alloc(256);
        fake_work *w = work_timed(sb, 200, b[i]);
        err_ok += defer_free(b[i], sb) == cudaSuccess;
        if (i < syncs)
            sync_ok += fake_work_done(w) && fake_is_released(b[i]) == 1;
    }
    const char *msg = capture_end();
    CHECK(err_ok == M, "every defer_free accepted (%d of %d)", err_ok, M);
    CHECK(sync_ok == syncs, "those without an event waited and released at "
          "once (%d of %d)", sync_ok, syncs);
    struct defer_stats st = stats_now();
    CHECK(st.sync_releases == (uint64_t)syncs, "sync_releases %llu, want %d",
          ULL(st.sync_releases), syncs);
    CHECK(st.events_created == (uint64_t)(K + M - syncs),
          "events_created %llu, want %d", ULL(st.events_created),
          K + M - syncs);
    int lines = lines_with(msg, "cudaEventCreateWithFlags failed",
                           "cudaErrorMemoryAllocation",
                           "releasing synchronously");
    CHECK(lines == syncs, "each named on stderr (%d lines, want %d)", lines,
          syncs);
    CHECK(count_released(a, K) == 0, "the entries in flight wait for their "
          "work (%d released)", count_released(a, K));
    fake_fail_clear();
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(a, K) == K && count_released(b, M) == M,
          "everything released after the flush (%d of %d, %d of %d)",
          count_released(a, K), K, count_released(b, M), M);
    st = stats_now();
    CHECK(st.deferred == K + M && st.released == K + M && st.failed == 0,
          "deferred %llu released %llu failed %llu, want %d, %d, 0",
          ULL(st.deferred), ULL(st.released), ULL(st.failed), K + M, K + M);
    CHECK_STATS();
}

/* ---- reclaimer: cudaEventQuery -------------------------------------------- */

/* Two devices.  Device 0 has entries pending and entries held when its
 * event query fails; device 1 is used afterwards.  Once: device 1 carries
 * on.  Persistently: device 1 fails too, when its entry is polled. */
static void s_query_fails(const struct scenario *sc)
{
    /* Entries of device 0: a buffer and pinned memory pending behind held
     * work, a callback after them, HELD buffers completed and held.  Its
     * pointers: those, and one refused later. */
    enum { HELD = 5, DEV0 = HELD + 3, NPTRS = HELD + 3 };
    const cudaError_t bad = sc->err;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *p1 = device_alloc(4096);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *dev0[NPTRS];
    int ran = 0;
    dev0[0] = device_alloc(512);
    fake_work *w = work_held(sa, dev0[0]);
    dev0[1] = host_alloc(512);
    work_timed(sa, 0, dev0[1]);
    CHECK(defer_free(dev0[0], sa) == cudaSuccess, "defer_free (pending)");
    CHECK(defer_free_host(dev0[1], sa) == cudaSuccess, "defer_free_host "
          "(pending)");
    CHECK(defer_call(mark, &ran, sa) == cudaSuccess, "defer_call (pending)");
    for (int i = 0; i < HELD; i++) {
        dev0[2 + i] = busy_buffer(sb, 1024, 0);
        CHECK(defer_free(dev0[2 + i], sb) == cudaSuccess, "defer_free (held)");
    }
    void *late = dev0[NPTRS - 1] = device_alloc(64);
    WAIT_UNTIL(stats_now().held == HELD, 2000);
    CHECK(stats_now().held == HELD, "%d entries held (%llu)", HELD,
          ULL(stats_now().held));

    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, bad, 0, sc->count);
    WAIT_UNTIL(stats_now().failed == DEV0, 2000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t flush_err = defer_flush();
    cudaError_t late_err = defer_free(late, sb);
    const char *msg = capture_end();
    struct defer_stats st = stats_now();
    CHECK(st.failed == DEV0 && st.released == 0 && st.pending == 0 &&
              st.held == 0,
          "device 0's pending and held entries abandoned: failed %llu (want "
          "%d) released %llu pending %llu held %llu", ULL(st.failed), DEV0,
          ULL(st.released), ULL(st.pending), ULL(st.held));
    CHECK(failed_at_once == DEV0, "abandoned when the query failed, before "
          "any flush (failed %llu)", ULL(failed_at_once));
    CHECK(flush_err == bad, "defer_flush returns %s (%s)", EN(bad),
          EN(flush_err));
    CHECK(late_err == bad, "a later defer_free on device 0 returns %s (%s)",
          EN(bad), EN(late_err));
    CHECK(st.rejected == 1, "and is counted in rejected (%llu)",
          ULL(st.rejected));
    int lines = lines_with(msg, "cudaEventQuery failed", EN(bad), NULL);
    CHECK(lines == 1 && lines_with(msg, "device 0", "cudaEventQuery failed",
                                   EN(bad)) == 1,
          "one line names device 0, cudaEventQuery and %s (%d lines)",
          EN(bad), lines);
    CHECK(lines_with(msg, "defer_free", EN(bad), NULL) == 1,
          "the refused defer_free names the error");
    CHECK(count_released(dev0, NPTRS) == 0 && !flag(&ran),
          "nothing of device 0 released (%d), no callback run",
          count_released(dev0, NPTRS));

    /* Device 1. */
    work_timed(s1, 1000, p1);
    stderr_capture_begin();
    cudaError_t e1 = defer_free(p1, s1);
    cudaError_t flush1 = defer_flush();
    msg = capture_end();
    CHECK(e1 == cudaSuccess, "device 1 still accepts entries (%s)", EN(e1));
    CHECK(flush1 == bad, "defer_flush still returns device 0's error (%s)",
          EN(flush1));
    if (sc->count == ONCE) {
        CHECK(fake_is_released(p1) == 1, "device 1's entry is released");
        CHECK(lines_with(msg, "cudaEventQuery failed", NULL, NULL) == 0,
              "no other failure reported");
    } else {
        CHECK(fake_is_released(p1) == 0, "device 1's entry is abandoned too");
        CHECK(lines_with(msg, "device 1", "cudaEventQuery failed", EN(bad)) == 1,
              "in one line naming device 1");
        CHECK(stats_now().failed == DEV0 + 1, "failed %llu, want %d",
              ULL(stats_now().failed), DEV0 + 1);
    }

    /* The work completes: what was abandoned stays unreleased. */
    fake_fail_clear();
    fake_complete(w);
    sleep_ms(20);
    CHECK(defer_flush() == bad, "the error is sticky");
    CHECK(count_released(dev0, NPTRS) == 0 && !flag(&ran),
          "device 0's entries are never released (%d)",
          count_released(dev0, NPTRS));
    CHECK_STATS();
}

/* A sticky error: after a fault every query fails; many entries on many
 * streams, all abandoned in one message; every call after it returns it. */
static void s_sticky(const struct scenario *sc)
{
    enum { STREAMS = 5, PER = 8, HELD = 10, N = STREAMS * PER + 3 + HELD };
    const cudaError_t bad = sc->err;
    void *all[N];
    int n = 0;
    fake_work *gates[STREAMS];
    cudaStream_t s[STREAMS];
    for (int k = 0; k < STREAMS; k++) {
        s[k] = stream_new();
        gates[k] = work_held(s[k], NULL);
        for (int i = 0; i < PER; i++) {
            all[n] = busy_buffer(s[k], 128, 0);
            CHECK(defer_free(all[n], s[k]) == cudaSuccess, "defer_free");
            n++;
        }
    }
    void *three[3];
    for (int i = 0; i < 3; i++)
        three[i] = all[n++] = busy_buffer(s[0], 128, 0);
    CHECK(defer_free_n(three, 3, s[0]) == cudaSuccess, "defer_free_n");
    cudaStream_t sh = stream_new();
    for (int i = 0; i < HELD; i++) {
        all[n] = busy_buffer(sh, 128, 0);
        CHECK(defer_free(all[n], sh) == cudaSuccess, "defer_free (held)");
        n++;
    }
    const uint64_t entries = STREAMS * PER + 1 + HELD;
    WAIT_UNTIL(stats_now().held == HELD, 2000);
    CHECK(stats_now().held == HELD, "%d entries held (%llu)", HELD,
          ULL(stats_now().held));

    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, bad, 0, ALWAYS);
    WAIT_UNTIL(stats_now().failed == entries, 2000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t f1 = defer_flush(), f2 = defer_flush();
    size_t bytes = 99;
    cudaError_t t = defer_trim(&bytes);
    void *q = device_alloc(64), *h = host_alloc(64);
    int ran = 0;
    cudaError_t e[4] = {defer_free(q, s[1]), defer_free_host(h, s[2]),
                        defer_free_n(&q, 1, sh), defer_call(mark, &ran, s[3])};
    const char *msg = capture_end();
    struct defer_stats st = stats_now();
    CHECK(st.failed == entries && st.pending == 0 && st.released == 0 &&
              st.held == 0, "all %llu entries abandoned: failed %llu pending "
          "%llu released %llu held %llu", ULL(entries), ULL(st.failed),
          ULL(st.pending), ULL(st.released), ULL(st.held));
    CHECK(failed_at_once == entries, "abandoned at once, before any flush "
          "(failed %llu)", ULL(failed_at_once));
    CHECK(lines_with(msg, "cudaEventQuery failed", EN(bad), NULL) == 1,
          "one line for them all (%d)",
          lines_with(msg, "cudaEventQuery failed", EN(bad), NULL));
    CHECK(f1 == bad && f2 == bad, "every flush returns %s (%s, %s)", EN(bad),
          EN(f1), EN(f2));
    CHECK(t == bad && bytes == 0, "defer_trim returns it too (%s, %zu bytes)",
          EN(t), bytes);
    for (int i = 0; i < 4; i++)
        CHECK(e[i] == bad, "defer call #%d after the fault: %s, want %s", i,
              EN(e[i]), EN(bad));
    CHECK(st.rejected == 4, "rejected %llu, want 4", ULL(st.rejected));
    CHECK(fake_is_released(q) == 0 && fake_is_released(h) == 0 && !flag(&ran),
          "the refused pointers stay the caller's");
    CHECK(count_released(all, n) == 0, "nothing released (%d)",
          count_released(all, n));
    fake_fail_clear();
    for (int k = 0; k < STREAMS; k++)
        fake_complete(gates[k]);
    sleep_ms(20);
    CHECK(defer_flush() == bad, "still failed after the work completes");
    CHECK(count_released(all, n) == 0, "and still nothing released (%d)",
          count_released(all, n));
    CHECK_STATS();
}

/* ---- reclaimer: cudaSetDevice --------------------------------------------- */

/* Two devices.  The reclaimer works on device 1 first, then fails to switch
 * to device 0: device 0 fails; device 1 carries on (no switch needed, even
 * while every cudaSetDevice fails). */
static void s_reclaimer_set_device(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *a1 = busy_buffer(s1, 64, 0), *b1 = device_alloc(64);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(defer_free(a1, s1) == cudaSuccess, "defer_free on device 1");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(a1) == 1,
          "released (the reclaimer is on device 1)");
    cudaStream_t s0 = stream_new();
    void *p0 = device_alloc(64), *h0 = host_alloc(64), *q0 = device_alloc(64);
    fake_work *w0 = work_held(s0, p0);
    work_timed(s0, 0, h0);
    int ran = 0;

    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, bad, 0, sc->count);
    /* The first entry is accepted (device 0 cannot fail before the
     * reclaimer has an entry for it); the next ones are accepted, or, once
     * the reclaimer has failed the device, refused with its error. */
    cudaError_t e[3] = {defer_free(p0, s0), defer_free_host(h0, s0),
                        defer_call(mark, &ran, s0)};
    uint64_t accepted = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(e[i] == cudaSuccess || (i > 0 && e[i] == bad), "defer call #%d "
              "on device 0: %s", i, EN(e[i]));
        accepted += e[i] == cudaSuccess;
    }
    WAIT_UNTIL(stats_now().failed == accepted, 2000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t f0 = defer_flush();
    cudaError_t eq = defer_free(q0, s0);
    work_timed(s1, 1000, b1);
    cudaError_t eb = defer_free(b1, s1);
    cudaError_t f1 = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    struct defer_stats st = stats_now();
    CHECK(st.failed == accepted && failed_at_once == accepted,
          "device 0's %llu entries abandoned at once (failed %llu, before the "
          "flush %llu)", ULL(accepted), ULL(st.failed), ULL(failed_at_once));
    CHECK(fake_is_released(p0) == 0 && fake_is_released(h0) == 0 && !flag(&ran),
          "not released, no callback run");
    CHECK(lines_with(msg, "device 0", "cudaSetDevice failed", EN(bad)) == 1 &&
              lines_with(msg, "cudaSetDevice", NULL, NULL) == 1,
          "one line names device 0, cudaSetDevice and %s", EN(bad));
    CHECK(f0 == bad, "defer_flush returns %s (%s)", EN(bad), EN(f0));
    CHECK(eq == bad && fake_is_released(q0) == 0, "a later defer_free on "
          "device 0 returns it (%s), the caller keeps the pointer", EN(eq));
    CHECK(st.rejected == 3 - accepted + 1, "rejected %llu, want %llu",
          ULL(st.rejected), ULL(3 - accepted + 1));
    CHECK(eb == cudaSuccess, "device 1 still accepts entries (%s)", EN(eb));
    CHECK(fake_is_released(b1) == 1, "and releases them");
    CHECK(f1 == bad, "the next flush still returns %s (%s)", EN(bad), EN(f1));
    CHECK(st.released == 2, "released %llu, want 2", ULL(st.released));
    fake_complete(w0);
    CHECK_STATS();
}

/* ---- reclaimer: cudaFree, cudaFreeHost ------------------------------------ */

/* A sticky error from cudaFree (a kernel fault surfacing there) is the
 * device's: it fails like a failed query, said once, not once per pointer. */
static void s_free_sticky(const struct scenario *sc)
{
    enum { N = 4 };
    const cudaError_t bad = sc->err;
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(1024);
        work_timed(sb, 0, p[i]);
        CHECK(defer_free(p[i], sb) == cudaSuccess, "defer #%d", i);
    }
    WAIT_UNTIL(stats_now().held == N, 2000);
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, sc->count);
    defer_trim(NULL); /* the first cudaFree fails: the device with it */
    cudaError_t f = defer_flush();
    void *q = device_alloc(64);
    cudaError_t later = defer_free(q, sb);
    const char *msg = capture_end();
    fake_fail_clear();
    struct defer_stats st = stats_now();
    CHECK(f == bad, "flush returns %s (%s)", EN(bad), EN(f));
    CHECK(later == bad, "a later defer_free returns it (%s)", EN(later));
    CHECK(lines_with(msg, "device 0: cudaFree failed", EN(bad), NULL) == 1,
          "one line names the device, cudaFree and %s", EN(bad));
    CHECK(lines_with(msg, "release: cudaFree failed", NULL, NULL) == 0,
          "no line per pointer");
    CHECK(st.failed == N + 1 && st.released == 0 && st.pending == 0,
          "all %d entries failed (failed %llu released %llu pending %llu)",
          N + 1, ULL(st.failed), ULL(st.released), ULL(st.pending));
    for (int i = 0; i < N; i++)
        CHECK(fake_is_released(p[i]) == 0, "#%d not released", i);
    fake_complete(w);
    cudaFree(q);
    cudaFree(busy);
    for (int i = 0; i < N; i++)
        cudaFree(p[i]);
}

static void s_free_fails(const struct scenario *sc)
{
    enum { N = 4 };
    const cudaError_t bad = sc->err;
    bool host = sc->call == FAKE_FREE_HOST;
    const char *failed = host ? "cudaFreeHost failed" : "cudaFree failed";
    int fails = sc->count == ONCE ? 1 : N;
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = host ? host_alloc(1024) : device_alloc(1024);
        work_timed(sb, 0, p[i]);
        cudaError_t err = host ? defer_free_host(p[i], sb) : defer_free(p[i], sb);
        CHECK(err == cudaSuccess, "defer #%d", i);
    }
    WAIT_UNTIL(stats_now().held == N, 2000);
    CHECK(stats_now().held == N, "held %llu, want %d", ULL(stats_now().held), N);
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, sc->count);
    size_t bytes = 0;
    cudaError_t t = defer_trim(&bytes); /* releases the held entries now */
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(t == cudaSuccess, "defer_trim: %s", EN(t));
    struct defer_stats st = stats_now();
    if (sc->variant != NULL) { /* "accounting" */
        CHECK(bytes == (size_t)(N - fails) * 1024, "defer_trim reports %zu "
              "bytes released, want %d (the failed releases freed nothing)",
              bytes, (N - fails) * 1024);
        CHECK(st.demand_releases == (uint64_t)(N - fails),
              "demand_releases %llu, want %d (only what was released)",
              ULL(st.demand_releases), N - fails);
    }
    CHECK(st.failed == (uint64_t)fails && st.released == (uint64_t)(N - fails),
          "failed %llu released %llu, want %d and %d", ULL(st.failed),
          ULL(st.released), fails, N - fails);
    for (int i = 0; i < N; i++) {
        CHECK(fake_is_released(p[i]) == (i >= fails), "#%d released: %d", i,
              fake_is_released(p[i]));
        if (i < fails)
            CHECK(lines_with(msg, failed, EN(bad), ptr_text(p[i])) == 1,
                  "one line names %s, %s and #%d's pointer", failed, EN(bad),
                  i);
    }
    CHECK(lines_with(msg, failed, NULL, NULL) == fails, "%d lines, want %d",
          lines_with(msg, failed, NULL, NULL), fails);
    /* Later entries carry on. */
    void *q = host ? host_alloc(64) : device_alloc(64);
    work_timed(sb, 0, q);
    CHECK((host ? defer_free_host(q, sb) : defer_free(q, sb)) == cudaSuccess,
          "a later entry is accepted");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(q) == 1 && fake_is_released(busy) == 1,
          "and released");
    for (int i = 0; i < fails; i++)
        host ? cudaFreeHost(p[i]) : cudaFree(p[i]);
    CHECK(fake_live_allocations() == 0, "nothing else left (%zu)",
          fake_live_allocations());
    CHECK_STATS();
}

/* ---- reclaimer: pool memory (cudaFreeAsync, its stream) ------------------- */

/* cudaFreeAsync fails: cudaFree instead. */
static void s_free_async_fails(const struct scenario *sc)
{
    enum { N = 3 };
    const cudaError_t bad = sc->err;
    int fails = sc->count == ONCE ? 1 : N;
    cudaStream_t s = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = pool_alloc(s, 4096);
        work_timed(s, 0, p[i]);
    }
    unsigned long frees = fake_calls(FAKE_FREE);
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, bad, 0, sc->count);
    for (int i = 0; i < N; i++)
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    cudaError_t f = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(f == cudaSuccess, "flush: %s", EN(f));
    CHECK(count_released(p, N) == N, "all released (%d of %d)",
          count_released(p, N), N);
    struct defer_stats st = stats_now();
    CHECK(st.released == N && st.failed == 0, "released %llu failed %llu",
          ULL(st.released), ULL(st.failed));
    CHECK(fake_calls(FAKE_FREE) - frees == (unsigned long)fails,
          "%lu cudaFree calls, want %d", fake_calls(FAKE_FREE) - frees, fails);
    for (int i = 0; i < fails; i++)
        CHECK(lines_with(msg, "cudaFreeAsync failed", EN(bad), ptr_text(p[i])) ==
                  1, "a line names cudaFreeAsync, %s and #%d's pointer",
              EN(bad), i);
    CHECK(lines_with(msg, "cudaFreeAsync failed", NULL, NULL) == fails,
          "%d lines, want %d", lines_with(msg, "cudaFreeAsync failed", NULL,
                                          NULL), fails);
    CHECK(lines_with(msg, "cudaFree failed", NULL, NULL) == 0,
          "the fallback cudaFree worked");
    CHECK_STATS();
}

/* The reclaimer cannot create its stream: cudaFree instead. */
static void s_free_stream_fails(const struct scenario *sc)
{
    enum { N = 3 };
    const cudaError_t bad = sc->err;
    int fails = sc->count == ONCE ? 1 : N;
    cudaStream_t s = stream_new(); /* before the injection: the app's own */
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = pool_alloc(s, 4096);
        work_timed(s, 0, p[i]);
    }
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long async_frees = fake_calls(FAKE_FREE_ASYNC);
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_CREATE, bad, 0, sc->count);
    for (int i = 0; i < N; i++)
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    cudaError_t f = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(f == cudaSuccess, "flush: %s", EN(f));
    CHECK(count_released(p, N) == N, "all released (%d of %d)",
          count_released(p, N), N);
    CHECK(fake_calls(FAKE_FREE) - frees == (unsigned long)fails &&
              fake_calls(FAKE_FREE_ASYNC) - async_frees ==
                  (unsigned long)(N - fails),
          "%lu with cudaFree (want %d), %lu with cudaFreeAsync (want %d)",
          fake_calls(FAKE_FREE) - frees, fails,
          fake_calls(FAKE_FREE_ASYNC) - async_frees, N - fails);
    struct defer_stats st = stats_now();
    CHECK(st.released == N && st.failed == 0, "released %llu failed %llu",
          ULL(st.released), ULL(st.failed));
    int lines = lines_with(msg, "cudaStreamCreateWithFlags failed", EN(bad),
                           NULL);
    CHECK(sc->count == ONCE ? lines == 1 : lines >= 1,
          "stderr names cudaStreamCreateWithFlags and %s (%d lines)", EN(bad),
          lines);
    CHECK_STATS();
}

/* ---- reclaimer: allocation sizes (driver entry point, attributes) --------- */

/* The entry point cannot be had: nothing is known of any allocation. */
static void s_entry_point_fails(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    stderr_capture_begin();
    fake_fail(FAKE_DRIVER_ENTRY_POINT, bad, 0, sc->count);
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    enum { N = 5 };
    void *p[N] = {device_alloc(1000), device_alloc(2000), host_alloc(3000),
                  pool_alloc(sb, 4096), pool_alloc(sb, 4096)};
    for (int i = 0; i < N; i++) {
        work_timed(sb, 0, p[i]);
        cudaError_t err = i == 2 ? defer_free_host(p[i], sb)
                                 : defer_free(p[i], sb);
        CHECK(err == cudaSuccess, "defer #%d", i);
    }
    WAIT_UNTIL(stats_now().held == N, 2000);
    struct defer_stats st = stats_now();
    CHECK(st.held == N && st.held_bytes == 0, "all %d held, their bytes "
          "unknown (held %llu, held_bytes %llu)", N, ULL(st.held),
          ULL(st.held_bytes));
    CHECK(count_released(p, N) == 0, "none released while busy (%d)",
          count_released(p, N));
    unsigned long frees = fake_calls(FAKE_FREE);
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(count_released(p, N) == N && fake_is_released(busy) == 1,
          "all released (%d of %d)", count_released(p, N), N);
    CHECK(fake_calls(FAKE_FREE_ASYNC) == 0, "pool memory not with "
          "cudaFreeAsync (%lu calls)", fake_calls(FAKE_FREE_ASYNC));
    CHECK(fake_calls(FAKE_FREE) - frees == N, "with cudaFree: %lu calls, want "
          "%d", fake_calls(FAKE_FREE) - frees, N);
    CHECK(lines_with(msg, "cudaGetDriverEntryPointByVersion", EN(bad), NULL) ==
              1, "one line names cudaGetDriverEntryPointByVersion and %s",
          EN(bad));
    diag("  cudaGetDriverEntryPointByVersion called %lu time(s)",
         fake_calls(FAKE_DRIVER_ENTRY_POINT));
    CHECK_STATS();
}

/* cuPointerGetAttributes fails: that entry's size and pool are unknown. */
static void s_pointer_attributes_fail(const struct scenario *sc)
{
    enum { N = 5 };
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    WAIT_UNTIL(fake_calls(FAKE_CU_POINTER_GET_ATTRIBUTES) >= 1, 2000);
    CHECK(fake_calls(FAKE_CU_POINTER_GET_ATTRIBUTES) >= 1, "the busy entry "
          "was sized up");
    /* Two pool buffers first (the first is the one the "once" injection
     * hits), then device and pinned memory of known sizes. */
    void *p[N] = {pool_alloc(sb, 4096), pool_alloc(sb, 4096), device_alloc(1000),
                  device_alloc(2000), host_alloc(3000)};
    for (int i = 0; i < N; i++)
        work_timed(sb, 0, p[i]);
    /* The fake's cuPointerGetAttributes returns CUDA_ERROR_INVALID_VALUE. */
    stderr_capture_begin();
    fake_fail(FAKE_CU_POINTER_GET_ATTRIBUTES, cudaErrorInvalidValue, 0,
              sc->count);
    for (int i = 0; i < N; i++) {
        cudaError_t err = i == 4 ? defer_free_host(p[i], sb)
                                 : defer_free(p[i], sb);
        CHECK(err == cudaSuccess, "defer #%d", i);
    }
    bool once = sc->count == ONCE;
    uint64_t want_held = once ? N - 1 : N, want_bytes = once ? 6000 : 0;
    WAIT_UNTIL(stats_now().held == want_held &&
                   (!once || fake_is_released(p[1]) == 1), 2000);
    struct defer_stats st = stats_now();
    const char *msg = capture_end();
    CHECK(st.held == want_held && st.held_bytes == want_bytes,
          "held %llu (want %llu), held_bytes %llu (want %llu)", ULL(st.held),
          ULL(want_held), ULL(st.held_bytes), ULL(want_bytes));
    CHECK(fake_is_released(p[0]) == 0, "the pool buffer of unknown kind is "
          "held like device memory");
    CHECK(fake_is_released(p[1]) == (once ? 1 : 0), "the other pool buffer %s",
          once ? "is released at once" : "too");
    fake_fail_clear();
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, N) == N && fake_is_released(busy) == 1,
          "all released (%d of %d)", count_released(p, N), N);
    CHECK(fake_calls(FAKE_FREE_ASYNC) == (once ? 1u : 0u), "cudaFreeAsync "
          "only for the pool buffer known as such (%lu calls)",
          fake_calls(FAKE_FREE_ASYNC));
    int lines = lines_with(msg, "cuPointerGetAttributes", "failed", NULL);
    bool with_error = lines_with(msg, "cuPointerGetAttributes",
                                 "CUDA_ERROR_INVALID_VALUE", NULL) +
                          lines_with(msg, "cuPointerGetAttributes",
                                     "invalid argument", NULL) +
                          lines_with(msg, "cuPointerGetAttributes", "error 1",
                                     NULL) >
                      0;
    CHECK(lines >= 1 && with_error, "stderr names cuPointerGetAttributes and "
          "its error (CUDA_ERROR_INVALID_VALUE) (%d lines)", lines);
    CHECK_STATS();
}

/* ---- reclaimer: cudaMemGetInfo (the cap) ----------------------------------- */

/* A 4 MiB device: its cap is 1 MiB, unless cudaMemGetInfo fails (count 0:
 * the control run, where it works). */
static void s_mem_get_info(const struct scenario *sc)
{
    enum { N = 12, SIZE = 256 << 10 };
    fake_set_device_memory(0, (size_t)4 << 20);
    stderr_capture_begin();
    if (sc->count != 0)
        fake_fail(FAKE_MEM_GET_INFO, sc->err, 0, sc->count);
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(sb, SIZE, 0);
        CHECK(defer_free(p[i], sb) == cudaSuccess, "defer_free #%d", i);
    }
    WAIT_UNTIL(count_released(p, N) + (int)stats_now().held == N, 2000);
    sleep_ms(10);
    struct defer_stats st = stats_now();
    const char *msg = capture_end();
    fake_fail_clear();
    if (sc->count != 0) {
        CHECK(st.held == N && st.held_bytes == (uint64_t)N * SIZE &&
                  st.cap_releases == 0,
              "the cap is 20 GiB: all held (%llu, %llu bytes), no cap release "
              "(%llu)", ULL(st.held), ULL(st.held_bytes), ULL(st.cap_releases));
        CHECK(lines_with(msg, "cudaMemGetInfo failed", EN(sc->err), NULL) == 1,
              "one line names cudaMemGetInfo and %s", EN(sc->err));
    } else {
        CHECK(st.cap_releases > 0 && st.held_bytes <= (1 << 20),
              "control: the 1 MiB cap releases (cap_releases %llu, held_bytes "
              "%llu)", ULL(st.cap_releases), ULL(st.held_bytes));
        CHECK(lines_with(msg, NULL, NULL, NULL) == 0, "control: nothing on "
              "stderr");
    }
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, N) == N && fake_is_released(busy) == 1,
          "all released by the flush (%d of %d)", count_released(p, N), N);
    CHECK_STATS();
}

/* ---- reclaimer: cudaEventDestroy, cudaStreamDestroy ------------------------ */

static void s_event_destroy_at_shutdown(const struct scenario *sc)
{
    enum { N = 5 };
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(s, 256, 100);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    CHECK(defer_flush() == cudaSuccess && count_released(p, N) == N,
          "released");
    size_t live = fake_live_events();
    CHECK(live >= 1, "idle events to destroy (%zu)", live);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, sc->count);
    double t0 = now_ms();
    cudaError_t err = defer_shutdown();
    double ms = now_ms() - t0;
    const char *msg = capture_end();
    CHECK(err == cudaSuccess, "defer_shutdown: %s", EN(err));
    CHECK(ms < 2000, "took %.0f ms", ms);
    int lines = lines_with(msg, "cudaEventDestroy failed", EN(bad), NULL);
    CHECK(sc->count == ONCE ? lines == 1 : lines >= 1,
          "stderr names cudaEventDestroy and %s (%d lines for %zu events)",
          EN(bad), lines, live);
    stderr_capture_begin();
    err = defer_free(p[0], s);
    capture_end();
    CHECK(err == cudaErrorNotPermitted, "refused after shutdown (%s)", EN(err));
    CHECK_STATS();
}

/* CUDEFER_EVENT_POOL=0: every finished entry's event is destroyed. */
static void s_event_destroy_overflow(const struct scenario *sc)
{
    enum { N = 6 };
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p[N];
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, sc->count);
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(s, 256, 100);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    cudaError_t f = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(f == cudaSuccess && count_released(p, N) == N, "flush %s, released "
          "%d of %d", EN(f), count_released(p, N), N);
    struct defer_stats st = stats_now();
    CHECK(st.released == N && st.failed == 0, "released %llu failed %llu",
          ULL(st.released), ULL(st.failed));
    CHECK(fake_calls(FAKE_EVENT_DESTROY) >= 1, "events were destroyed (%lu)",
          fake_calls(FAKE_EVENT_DESTROY));
    int lines = lines_with(msg, "cudaEventDestroy failed", EN(bad), NULL);
    CHECK(sc->count == ONCE ? lines == 1 : lines >= 1,
          "stderr names cudaEventDestroy and %s (%d lines)", EN(bad), lines);
    void *q = busy_buffer(s, 256, 100);
    CHECK(defer_free(q, s) == cudaSuccess, "later entries get new events");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(q) == 1,
          "and are released");
    CHECK_STATS();
}

static void s_stream_destroy_at_shutdown(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p = pool_alloc(s, 4096);
    work_timed(s, 100, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free (pool memory)");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1 &&
              fake_calls(FAKE_FREE_ASYNC) == 1,
          "released with cudaFreeAsync on the reclaimer's stream");
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_DESTROY, bad, 0, sc->count);
    double t0 = now_ms();
    cudaError_t err = defer_shutdown();
    double ms = now_ms() - t0;
    const char *msg = capture_end();
    CHECK(err == cudaSuccess, "defer_shutdown: %s", EN(err));
    CHECK(ms < 2000, "took %.0f ms", ms);
    CHECK(fake_calls(FAKE_STREAM_DESTROY) >= 1, "the stream's destruction "
          "was tried");
    CHECK(lines_with(msg, "cudaStreamDestroy failed", EN(bad), NULL) == 1,
          "one line names cudaStreamDestroy and %s", EN(bad));
    CHECK_STATS();
}

/* ---- process exit: cudaErrorCudartUnloading --------------------------------- */

/* Workers: a fresh image of this program ("--exit-worker NAME"), so that
 * exit() runs only cudefer's, the fake's and the worker's exit handlers. */

static void *worker_ptrs[16];
static int worker_nptrs;

static void *worker_note(void *p)
{
    worker_ptrs[worker_nptrs++] = p;
    return p;
}

/* Registered before cudefer starts: runs after cudefer's exit handler. */
static void worker_after_cudefer(void)
{
    fprintf(stderr, "worker: after cudefer's exit handler: %d of %d "
            "released\n", count_released(worker_ptrs, worker_nptrs),
            worker_nptrs);
}

static void worker_defer(int host, void *p, cudaStream_t s)
{
    cudaError_t err = host ? defer_free_host(p, s) : defer_free(p, s);
    if (err != cudaSuccess)
        fprintf(stderr, "worker: defer refused: %s\n", EN(err));
}

static void worker_wait_held(uint64_t n)
{
    WAIT_UNTIL(stats_now().held == n, 2000);
    if (stats_now().held != n)
        fprintf(stderr, "worker: held %llu, want %llu\n",
                ULL(stats_now().held), ULL(n));
}

/* A pool buffer released at once: the reclaimer now has its own stream. */
static void worker_pool_released(cudaStream_t s)
{
    void *p = pool_alloc(s, 4096);
    work_timed(s, 0, p);
    worker_defer(0, p, s);
    if (!wait_released(p, 2000))
        fprintf(stderr, "worker: pool buffer not released\n");
}

static void worker_fail_everything(void)
{
    for (int c = 0; c < FAKE_NCALLS; c++)
        fake_fail((enum fake_call)c, cudaErrorCudartUnloading, 0, ALWAYS);
}

/* Entries pending (work that never completes) and held; every event query
 * at exit says the runtime is unloading; with every_call, every call. */
static _Noreturn void worker_pending(bool every_call)
{
    atexit(worker_after_cudefer);
    cudaStream_t sa = stream_new(), sb = stream_new();
    if (every_call)
        worker_pool_released(sb);
    void *busy = worker_note(device_alloc(512));
    work_held(sa, busy);
    worker_defer(0, busy, sa);
    for (int i = 0; i < 3; i++)
        worker_defer(0, worker_note(busy_buffer(sb, 1024, 0)), sb);
    void *h = worker_note(host_alloc(1024));
    work_timed(sb, 0, h);
    worker_defer(1, h, sb);
    worker_wait_held(4);
    if (every_call)
        worker_fail_everything();
    else
        fake_fail(FAKE_EVENT_QUERY, cudaErrorCudartUnloading, 0, ALWAYS);
    exit(0);
}

/* Only completed entries, held (no quiet-time or age release): the exit
 * drain releases them while every call says the runtime is unloading. */
static _Noreturn void worker_held_only(void)
{
    atexit(worker_after_cudefer);
    cudaStream_t s = stream_new();
    worker_pool_released(s);
    for (int i = 0; i < 3; i++)
        worker_defer(0, worker_note(busy_buffer(s, 1024, 0)), s);
    void *h = worker_note(host_alloc(1024));
    work_timed(s, 0, h);
    worker_defer(1, h, s);
    worker_wait_held(4);
    worker_fail_everything();
    exit(0);
}

static int run_exit_worker(const char *name)
{
    fake_reset(1);
    if (strcmp(name, "query") == 0)
        worker_pending(false);
    if (strcmp(name, "pending") == 0)
        worker_pending(true);
    if (strcmp(name, "held") == 0)
        worker_held_only();
    fprintf(stderr, "worker: no worker %s\n", name);
    return 100;
}

struct worker_result {
    bool ended;
    int status;
    double ms;
    char err[16384];
};

/* Fork and exec the worker, its stderr to a pipe read here; at most
 * timeout_ms. */
static void exec_worker(const char *argv0, const char *name, unsigned timeout_ms,
                        struct worker_result *w)
{
    int fds[2];
    if (pipe(fds) != 0)
        sysbail("pipe");
    double t0 = now_ms(), deadline = t0 + timeout_ms;
    pid_t pid = fork_flushed();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        execl("/proc/self/exe", argv0, "--exit-worker", name, (char *)NULL);
        fprintf(stderr, "exec /proc/self/exe: %s\n", strerror(errno));
        _exit(101);
    }
    close(fds[1]);
    read_until(fds[0], deadline, w->err, sizeof w->err);
    close(fds[0]);
    double left = deadline - now_ms();
    w->ended = wait_child(pid, left > 0 ? left : 0, &w->status);
    w->ms = now_ms() - t0;
}

/* The value of counter name on the "cudefer: stats:" line; -1 if none. */
static long long stat_field(const char *text, const char *name)
{
    const char *line = strstr(text, "cudefer: stats:");
    if (line == NULL)
        return -1;
    char key[64];
    snprintf(key, sizeof key, " %s ", name);
    const char *end = strchr(line, '\n');
    const char *at = strstr(line, key);
    if (at == NULL || (end != NULL && at > end))
        return -1;
    return strtoll(at + strlen(key), NULL, 10);
}

static const char *program;

static void s_exit_unloading(const struct scenario *sc)
{
    struct worker_result *w = calloc(1, sizeof *w);
    if (w == NULL)
        sysbail("calloc");
    exec_worker(program, sc->variant, EXIT_WORKER_TIMEOUT_MS, w);
    bool good = w->ended && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
    if (!w->ended)
        CHECK(false, "the worker did not end within %d ms: killed",
              EXIT_WORKER_TIMEOUT_MS);
    else if (WIFSIGNALED(w->status))
        CHECK(false, "the worker was killed by signal %d", WTERMSIG(w->status));
    else
        CHECK(good, "the worker's exit status: %d (1: oracle violation)",
              WEXITSTATUS(w->status));
    diag("  exit worker %s ended after %.0f ms; its stderr:\n%s", sc->variant,
         w->ms, w->err);
    CHECK(w->ms < 3000, "the process ended within 3 s (%.0f ms)", w->ms);
    CHECK(strstr(w->err, "worker: after cudefer's exit handler") != NULL,
          "cudefer's exit handler returned");
    CHECK(strstr(w->err, "worker: defer refused") == NULL &&
              strstr(w->err, "worker: held") == NULL &&
              strstr(w->err, "worker: pool buffer") == NULL,
          "the worker's set-up went as planned");
    int lines = lines_with(w->err, NULL, NULL, NULL);
    int stats_lines = lines_with(w->err, "cudefer: stats:", NULL, NULL);
    CHECK(stats_lines == 1, "the statistics are printed (CUDEFER_STATS=1)");
    CHECK(lines == stats_lines, "no other cudefer message: the unloading "
          "runtime is not reported (%d other lines)", lines - stats_lines);
    long long deferred = stat_field(w->err, "deferred"),
              released = stat_field(w->err, "released"),
              failed = stat_field(w->err, "failed"),
              pending = stat_field(w->err, "pending"),
              leaked = stat_field(w->err, "leaked_at_exit");
    CHECK(deferred >= 5 && released + failed + pending == deferred,
          "stats: deferred %lld = released %lld + failed %lld + pending %lld",
          deferred, released, failed, pending);
    CHECK(pending == 0 && leaked == 0, "the drain stopped at once: pending "
          "%lld, leaked_at_exit %lld", pending, leaked);
    free(w);
}

/* ---- the scenarios ---------------------------------------------------------- */

#define NONE FAKE_NCALLS

static const struct scenario scenarios[] = {
    /* start */
    {"cudaGetDeviceCount fails once at start: returned, the next call starts",
     "", 1, s_device_count, FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, ONCE,
     cudaSuccess, NULL},
    {"cudaGetDeviceCount fails persistently: every call returns it", "", 1,
     s_device_count, FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, ALWAYS,
     cudaSuccess, NULL},
    /* launching thread */
    {"cudaStreamGetDevice fails once: returned, caller keeps the pointer", "",
     1, s_stream_identity, FAKE_STREAM_GET_DEVICE, cudaErrorContextIsDestroyed,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamGetDevice fails persistently", "", 1, s_stream_identity,
     FAKE_STREAM_GET_DEVICE, cudaErrorContextIsDestroyed, ALWAYS, cudaSuccess,
     NULL},
    {"cudaStreamGetId fails once: returned, caller keeps the pointer", "", 1,
     s_stream_identity, FAKE_STREAM_GET_ID, cudaErrorInvalidResourceHandle,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamGetId fails persistently", "", 1, s_stream_identity,
     FAKE_STREAM_GET_ID, cudaErrorInvalidResourceHandle, ALWAYS, cudaSuccess,
     NULL},
    {"cudaEventRecord fails once: returned; an invalid handle is retried once",
     "", 1, s_record, FAKE_EVENT_RECORD, cudaErrorLaunchFailure, ONCE,
     cudaSuccess, NULL},
    {"cudaEventRecord fails persistently", "", 1, s_record, FAKE_EVENT_RECORD,
     cudaErrorLaunchFailure, ALWAYS, cudaSuccess, NULL},
    {"cudaEventCreateWithFlags fails once: waits and releases synchronously",
     "", 1, s_create_fails, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, ONCE,
     cudaSuccess, NULL},
    {"cudaEventCreateWithFlags fails persistently: every call synchronous", "",
     1, s_create_fails, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, ALWAYS,
     cudaSuccess, NULL},
    {"cudaEventCreateWithFlags and cudaStreamSynchronize fail once: returned",
     "", 1, s_create_and_sync_fail, FAKE_EVENT_CREATE, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaEventCreateWithFlags and cudaStreamSynchronize fail persistently", "",
     1, s_create_and_sync_fail, FAKE_EVENT_CREATE, cudaErrorLaunchFailure,
     ALWAYS, cudaSuccess, NULL},
    {"cudaGetDevice fails once while creating an event: synchronous", "", 1,
     s_create_fails, FAKE_GET_DEVICE, cudaErrorInitializationError, ONCE,
     cudaSuccess, NULL},
    {"cudaGetDevice fails persistently while creating events", "", 1,
     s_create_fails, FAKE_GET_DEVICE, cudaErrorInitializationError, ALWAYS,
     cudaSuccess, NULL},
    {"cudaSetDevice to the stream's device fails once while creating an event",
     "", 2, s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ONCE, cudaSuccess, NULL},
    {"cudaSetDevice to the stream's device fails persistently", "", 2,
     s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ALWAYS, cudaSuccess, NULL},
    {"cudaSetDevice back to the caller's device fails once after creating",
     "", 2, s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ONCE, cudaSuccess, "back"},
    {"out of memory during event-pool growth, once: that call synchronous",
     "", 1, s_pool_growth_oom, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation,
     ONCE, cudaSuccess, NULL},
    {"out of memory during event-pool growth, persistently: all synchronous",
     "", 1, s_pool_growth_oom, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation,
     ALWAYS, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: cudaStreamSynchronize fails once: returned",
     "CUDEFER_DISABLE=1", 1, s_disable_sync_fails, FAKE_STREAM_SYNCHRONIZE,
     cudaErrorLaunchFailure, ONCE, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: cudaStreamSynchronize fails persistently",
     "CUDEFER_DISABLE=1", 1, s_disable_sync_fails, FAKE_STREAM_SYNCHRONIZE,
     cudaErrorLaunchFailure, ALWAYS, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree fails once: counted, reported",
     "CUDEFER_DISABLE=1", 1, s_disable_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree fails persistently",
     "CUDEFER_DISABLE=1", 1, s_disable_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    /* reclaimer */
    {"cudaEventQuery fails once: device 0 abandoned, device 1 carries on",
     "CUDEFER_MAX_DELAY_MS=0", 2, s_query_fails, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ONCE, cudaErrorIllegalAddress, NULL},
    {"cudaEventQuery fails persistently: each device abandoned, one line each",
     "CUDEFER_MAX_DELAY_MS=0", 2, s_query_fails, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"sticky error: every query fails after a fault, 51 entries, one line",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_sticky, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"reclaimer's cudaSetDevice fails once: device 0 fails, device 1 carries on",
     "", 2, s_reclaimer_set_device, FAKE_SET_DEVICE,
     cudaErrorDevicesUnavailable, ONCE, cudaErrorDevicesUnavailable, NULL},
    {"reclaimer's cudaSetDevice fails persistently", "", 2,
     s_reclaimer_set_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ALWAYS, cudaErrorDevicesUnavailable, NULL},
    {"cudaFree fails once: counted, named with the pointer, not released",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"cudaFree fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE, cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    {"cudaFree fails once: defer_trim's bytes and demand_releases count "
     "only what was released", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE, cudaErrorInvalidValue, ONCE, cudaSuccess, "accounting"},
    {"cudaFreeHost fails once", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE_HOST, cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"cudaFreeHost fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_free_fails, FAKE_FREE_HOST, cudaErrorInvalidValue, ALWAYS, cudaSuccess,
     NULL},
    {"cudaFree fails with a sticky error: the device fails, one line",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_free_sticky, FAKE_FREE,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"cudaFreeAsync fails once: cudaFree instead, released", "", 1,
     s_free_async_fails, FAKE_FREE_ASYNC, cudaErrorNotSupported, ONCE,
     cudaSuccess, NULL},
    {"cudaFreeAsync fails persistently: cudaFree instead", "", 1,
     s_free_async_fails, FAKE_FREE_ASYNC, cudaErrorNotSupported, ALWAYS,
     cudaSuccess, NULL},
    {"reclaimer's cudaStreamCreateWithFlags fails once: cudaFree instead", "",
     1, s_free_stream_fails, FAKE_STREAM_CREATE, cudaErrorMemoryAllocation,
     ONCE, cudaSuccess, NULL},
    {"reclaimer's cudaStreamCreateWithFlags fails persistently", "", 1,
     s_free_stream_fails, FAKE_STREAM_CREATE, cudaErrorMemoryAllocation, ALWAYS,
     cudaSuccess, NULL},
    {"cudaGetDriverEntryPointByVersion fails (asked once): sizes unknown",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_entry_point_fails, FAKE_DRIVER_ENTRY_POINT,
     cudaErrorInsufficientDriver, ONCE, cudaSuccess, NULL},
    {"cudaGetDriverEntryPointByVersion fails persistently",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_entry_point_fails, FAKE_DRIVER_ENTRY_POINT,
     cudaErrorInsufficientDriver, ALWAYS, cudaSuccess, NULL},
    {"cuPointerGetAttributes fails once: that entry's size and pool unknown",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_pointer_attributes_fail,
     FAKE_CU_POINTER_GET_ATTRIBUTES, cudaErrorInvalidValue, ONCE, cudaSuccess,
     NULL},
    {"cuPointerGetAttributes fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_pointer_attributes_fail, FAKE_CU_POINTER_GET_ATTRIBUTES,
     cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    {"cudaMemGetInfo works (control): a 4 MiB device's cap is 1 MiB",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_mem_get_info, FAKE_MEM_GET_INFO,
     cudaErrorInitializationError, 0, cudaSuccess, NULL},
    {"cudaMemGetInfo fails once: the cap assumes 80 GiB",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_mem_get_info, FAKE_MEM_GET_INFO,
     cudaErrorInitializationError, ONCE, cudaSuccess, NULL},
    {"cudaMemGetInfo fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_mem_get_info, FAKE_MEM_GET_INFO, cudaErrorInitializationError, ALWAYS,
     cudaSuccess, NULL},
    {"cudaEventDestroy fails once at shutdown: shutdown succeeds", "", 1,
     s_event_destroy_at_shutdown, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaEventDestroy fails persistently at shutdown", "", 1,
     s_event_destroy_at_shutdown, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ALWAYS, cudaSuccess, NULL},
    {"cudaEventDestroy fails once on pool overflow", "CUDEFER_EVENT_POOL=0", 1,
     s_event_destroy_overflow, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaEventDestroy fails persistently on pool overflow",
     "CUDEFER_EVENT_POOL=0", 1, s_event_destroy_overflow, FAKE_EVENT_DESTROY,
     cudaErrorLaunchFailure, ALWAYS, cudaSuccess, NULL},
    {"cudaStreamDestroy fails once at shutdown: shutdown succeeds", "", 1,
     s_stream_destroy_at_shutdown, FAKE_STREAM_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamDestroy fails persistently at shutdown", "", 1,
     s_stream_destroy_at_shutdown, FAKE_STREAM_DESTROY, cudaErrorLaunchFailure,
     ALWAYS, cudaSuccess, NULL},
    /* exit */
    {"exit: cudaEventQuery says cudaErrorCudartUnloading: quiet, quick",
     "CUDEFER_STATS=1", 1, s_exit_unloading, NONE, cudaErrorCudartUnloading,
     ALWAYS, cudaSuccess, "query"},
    {"exit: every call says cudaErrorCudartUnloading, entries pending",
     "CUDEFER_STATS=1", 1, s_exit_unloading, NONE, cudaErrorCudartUnloading,
     ALWAYS, cudaSuccess, "pending"},
    {"exit: every call says cudaErrorCudartUnloading, entries held only",
     "CUDEFER_STATS=1 CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0", 1,
     s_exit_unloading, NONE, cudaErrorCudartUnloading, ALWAYS, cudaSuccess,
     "held"},
};
#define NSCENARIOS (sizeof scenarios / sizeof *scenarios)

/* Run a scenario in a child process: fresh configuration and fake; the
 * child shuts cudefer down, checks the counters and the oracle, and exits
 * with its number of failed checks. */
static void run(const struct scenario *sc)
{
    double t0 = now_ms();
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(sc->env);
        fake_reset(sc->ndevices);
        failed_checks = 0;
        sc->fn(sc);
        fake_fail_clear();
        cudaError_t err = defer_shutdown();
        CHECK(err == sc->shutdown_err, "defer_shutdown at the end: %s, want %s",
              EN(err), EN(sc->shutdown_err));
        struct defer_stats st = stats_now();
        CHECK(st.pending == 0 && st.deferred == st.released + st.failed,
              "after shutdown: deferred %llu, released %llu, failed %llu, "
              "pending %llu", ULL(st.deferred), ULL(st.released),
              ULL(st.failed), ULL(st.pending));
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, SCENARIO_TIMEOUT_MS, &status);
    if (!ended)
        diag("no end after %d s: killed (a hang)", SCENARIO_TIMEOUT_MS / 1000);
    else if (WIFSIGNALED(status))
        diag("killed by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        diag("%d check(s) failed", WEXITSTATUS(status));
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "%s [%s] (%.0f ms)", sc->title, *sc->env != '\0' ? sc->env : "defaults",
       now_ms() - t0);
}

int main(int argc, char **argv)
{
    program = argv[0];
    if (argc == 3 && strcmp(argv[1], "--exit-worker") == 0)
        return run_exit_worker(argv[2]);
    plan_lazy();
    for (size_t i = 0; i < NSCENARIOS; i++)
        run(&scenarios[i]);
    /* cudaEventSynchronize is called only when the reclaimer cannot grow a
     * stream's FIFO (malloc fails); the fake cannot make malloc fail. */
    skip("cudaEventSynchronize: reached only when the reclaimer is out of "
         "memory, which the fake cannot provoke");
    return 0;
}
