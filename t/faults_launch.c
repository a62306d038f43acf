/* SPDX-License-Identifier: MIT */
/*
 * faults_launch.c — fault injection into the calls cudefer's launching
 * thread makes: cudaGetDeviceCount at start, cudaStreamGetDevice and
 * cudaStreamGetId, cudaEventRecord, creating events (and the device switch
 * it may need), the synchronous release of CUDEFER_DISABLE, and the event
 * pool running out of memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faults.h"

/* ---- start: cudaGetDeviceCount ---------------------------------------------- */

void s_device_count(const struct scenario *sc)
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

void s_stream_identity(const struct scenario *sc)
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

void s_record(const struct scenario *sc)
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
void s_create_fails(const struct scenario *sc)
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
void s_create_and_sync_fail(const struct scenario *sc)
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
void s_create_other_device(const struct scenario *sc)
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
void s_disable_sync_fails(const struct scenario *sc)
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

/* CUDEFER_DISABLE: the caller's own cudaFree on device 1 meets a sticky
 * error (a kernel fault surfacing there), made with device 1 current (the
 * stream's, as the reclaimer releases) while the caller's is 0.  The
 * error is the device's, not the pointer's: device 1 fails, said once
 * with its number; a flush returns the error and a later call on device 1
 * is refused with it, even where the runtime would let it through
 * (injected once); device 0 carries on, and is the caller's again. */
/* A kernel faults while the device has nothing pending: the reclaimer
 * makes no call there to meet it.  The next defer_free's own call (its
 * cudaEventRecord, or with no event its cudaStreamSynchronize) meets the
 * sticky error: refused with it, and the device fails (one line naming
 * it), so that defer_flush and later calls return it, as cudefer.h says
 * of a kernel fault.  The device was left as it was: defer_flush
 * answered cudaSuccess. */
static void nothing(void *unused)
{
    (void)unused;
}

void s_record_sticky(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64);
    /* A callback, not a free: the reclaimer then makes no wait for its
     * frees, which would meet the failure armed below. */
    CHECK(defer_call(nothing, NULL, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "a first callback, flushed: nothing pending");
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, sc->count);
    if (sc->call == FAKE_STREAM_SYNCHRONIZE) /* no event: the wait */
        fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    cudaError_t first = defer_free(p, s);
    cudaError_t flushed = defer_flush();
    cudaError_t later = defer_free(q, s);
    fake_fail_clear();
    const char *msg = capture_end();
    CHECK(first == bad, "defer_free refused with %s (%s)", EN(bad),
          EN(first));
    CHECK(flushed == bad, "defer_flush returns %s (%s)", EN(bad),
          EN(flushed));
    CHECK(later == bad, "a later defer_free is refused with it (%s)",
          EN(later));
    CHECK(lines_with(msg, "device 0", fake_call_name(sc->call), EN(bad)) ==
              1,
          "one line names device 0, %s and %s: %s", fake_call_name(sc->call),
          EN(bad), msg);
    CHECK(fake_is_released(p) == 0 && fake_is_released(q) == 0,
          "neither released");
    cudaFree(p);
    cudaFree(q);
}

void s_disable_free_sticky(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *p = busy_buffer(s1, 64, 1000), *q = device_alloc(64);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    cudaStream_t s0 = stream_new();
    void *r = busy_buffer(s0, 64, 1000);
    stderr_capture_begin();
    fake_fail(FAKE_FREE, bad, 0, sc->count);
    unsigned long sets = fake_thread_calls(FAKE_SET_DEVICE);
    cudaError_t first = defer_free(p, s1);
    sets = fake_thread_calls(FAKE_SET_DEVICE) - sets;
    fake_fail_clear();
    cudaError_t flushed = defer_flush();
    cudaError_t later = defer_free(q, s1);
    cudaError_t other = defer_free(r, s0);
    const char *msg = capture_end();
    CHECK(first == cudaSuccess, "the failing defer_free was accepted (%s)",
          EN(first));
    CHECK(lines_with(msg, "device 1: cudaFree failed", EN(bad), NULL) == 1,
          "one line names device 1, cudaFree and %s", EN(bad));
    CHECK(flushed == bad, "flush returns %s (%s)", EN(bad), EN(flushed));
    CHECK(later == bad && fake_is_released(q) == 0,
          "a later defer_free on device 1 is refused with it (%s)",
          EN(later));
    CHECK(other == cudaSuccess && fake_is_released(r) == 1,
          "device 0 carries on (%s)", EN(other));
    int current = -1;
    CHECK(cudaGetDevice(&current) == cudaSuccess && current == 0,
          "the caller's device is current again (%d)", current);
    CHECK(sets == 2, "the release switched to device 1, its stream's, and "
          "back (%lu cudaSetDevice calls)", sets);
    struct defer_stats st = stats_now();
    CHECK(st.failed == 1 && st.released == 1 && st.rejected == 1,
          "failed %llu released %llu rejected %llu, want 1, 1, 1",
          ULL(st.failed), ULL(st.released), ULL(st.rejected));
    cudaFree(p);
    cudaFree(q);
}

/* CUDEFER_DISABLE: the caller's own cudaFree fails; on the last device's
 * stream (device 1 of two), the message names that device. */
void s_disable_free_fails(const struct scenario *sc)
{
    enum { N = 3 };
    const cudaError_t bad = sc->err;
    int fails = sc->count == ONCE ? 1 : N, device = sc->ndevices - 1;
    char named[32];
    snprintf(named, sizeof named, "(device %d)", device);
    CHECK(cudaSetDevice(device) == cudaSuccess, "cudaSetDevice(%d)", device);
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
                      1 && lines_with(msg, ptr_text(p[i]), named, NULL) == 1,
                  "the failed cudaFree of #%d is named with its pointer, "
                  "%s and %s", i, named, EN(bad));
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
 * event creation fails; every call is still accepted (synchronously).  Each
 * entry is on a stream of its own: entries of one stream share events
 * (stream_lane.h), so only new streams make the pool grow. */
void s_pool_growth_oom(const struct scenario *sc)
{
    enum { K = 40, M = 24 };
    int syncs = sc->count == ONCE ? 1 : M;
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, K, sc->count);
    cudaStream_t sa[K], sb[M];
    fake_work *gate[K];
    void *a[K], *b[M];
    for (int i = 0; i < K; i++) {
        sa[i] = stream_new();
        gate[i] = work_held(sa[i], NULL);
        a[i] = busy_buffer(sa[i], 256, 0); /* after the gate */
        CHECK(defer_free(a[i], sa[i]) == cudaSuccess, "defer_free a#%d", i);
    }
    CHECK(stats_now().events_created == K, "%llu events created for the "
          "entries in flight, want %d", ULL(stats_now().events_created), K);
    stderr_capture_begin();
    int sync_ok = 0, err_ok = 0;
    for (int i = 0; i < M; i++) {
        sb[i] = stream_new();
        b[i] = device_alloc(256);
        fake_work *w = work_timed(sb[i], 200, b[i]);
        err_ok += defer_free(b[i], sb[i]) == cudaSuccess;
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
    for (int i = 0; i < K; i++)
        fake_complete(gate[i]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    for (int i = 0; i < K; i++)
        cudaStreamDestroy(sa[i]);
    for (int i = 0; i < M; i++)
        cudaStreamDestroy(sb[i]);
    CHECK(count_released(a, K) == K && count_released(b, M) == M,
          "everything released after the flush (%d of %d, %d of %d)",
          count_released(a, K), K, count_released(b, M), M);
    st = stats_now();
    CHECK(st.deferred == K + M && st.released == K + M && st.failed == 0,
          "deferred %llu released %llu failed %llu, want %d, %d, 0",
          ULL(st.deferred), ULL(st.released), ULL(st.failed), K + M, K + M);
    CHECK_STATS();
}
