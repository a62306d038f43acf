/* SPDX-License-Identifier: MIT */
/*
 * faults_release.c — fault injection into releasing memory: cudaFree and
 * cudaFreeHost (once, persistently, sticky), pool memory (cudaFreeAsync
 * and its stream), the allocation sizes (the driver entry point and
 * cuPointerGetAttributes) and the cap (cudaMemGetInfo).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include "faults.h"

/* ---- reclaimer: cudaFree, cudaFreeHost ------------------------------------ */

/* A sticky error from cudaFree, or from the reclaimer's cudaFreeAsync of
 * cudaMalloc memory (a kernel fault surfacing there), is the device's: it
 * fails like a failed query, said once, not once per pointer, and no
 * cudaFree follows a failed cudaFreeAsync. */
void s_free_sticky(const struct scenario *sc)
{
    enum { N = 4 };
    const cudaError_t bad = sc->err;
    const char *call = sc->call == FAKE_FREE_ASYNC ? "cudaFreeAsync" : "cudaFree";
    char device_line[64], pointer_line[64];
    snprintf(device_line, sizeof device_line, "device 0: %s failed", call);
    snprintf(pointer_line, sizeof pointer_line, "release: %s failed", call);
    unsigned long frees = fake_calls(FAKE_FREE);
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
    WAIT_UNTIL(stats_now().held == N, 10000);
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
    CHECK(lines_with(msg, device_line, EN(bad), NULL) == 1,
          "one line names the device, %s and %s", call, EN(bad));
    CHECK(lines_with(msg, pointer_line, NULL, NULL) == 0, "no line per pointer");
    CHECK(sc->call != FAKE_FREE_ASYNC || fake_calls(FAKE_FREE) == frees,
          "no cudaFree after the sticky cudaFreeAsync (%lu)",
          fake_calls(FAKE_FREE) - frees);
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

/* After a sticky error the device's events cannot be destroyed either:
 * shutdown forgets them without a line of their own (the device's failure
 * was said once, on the GPU at the first cudaFree; t/gpu/gpu_fault). */
void s_free_sticky_shutdown(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512), *p = device_alloc(1024);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    work_timed(sb, 0, p);
    CHECK(defer_free(p, sb) == cudaSuccess, "defer_free");
    WAIT_UNTIL(stats_now().held == 1, 10000);
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, ALWAYS);
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, ALWAYS); /* as on a GPU */
    defer_trim(NULL); /* the cudaFree fails: the device with it */
    fake_complete(w);
    cudaError_t err = defer_shutdown();
    const char *msg = capture_end();
    CHECK(err == bad, "shutdown returns %s (%s)", EN(bad), EN(err));
    CHECK(lines_with(msg, "device 0: cudaFree failed", EN(bad), NULL) == 1,
          "one line names the device, cudaFree and %s", EN(bad));
    CHECK(lines_with(msg, "cudaEventDestroy", EN(bad), NULL) == 0,
          "no line for the events shutdown cannot destroy");
    cudaFree(busy);
    cudaFree(p);
}

/* A thread that deferred on the device before it failed exits after: its
 * lanes let their events go into a full pool (CUDEFER_EVENT_POOL=0), and a
 * failed device's events are forgotten, not destroyed (which would fail and
 * say the sticky error again). */
struct exiting_thread {
    cudaStream_t s;
    void *p;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stage; /* 1: deferred; 2: may exit */
};

static void *defer_then_exit(void *arg)
{
    struct exiting_thread *t = arg;
    work_timed(t->s, 0, t->p);
    CHECK(defer_free(t->p, t->s) == cudaSuccess, "the thread's defer_free");
    pthread_mutex_lock(&t->lock);
    t->stage = 1;
    pthread_cond_broadcast(&t->cond);
    while (t->stage != 2)
        pthread_cond_wait(&t->cond, &t->lock);
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

void s_sticky_thread_exit(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    struct exiting_thread t = {.s = stream_new(), .p = device_alloc(1024),
                               .lock = PTHREAD_MUTEX_INITIALIZER,
                               .cond = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, defer_then_exit, &t) == 0, "thread");
    pthread_mutex_lock(&t.lock);
    while (t.stage != 1)
        pthread_cond_wait(&t.cond, &t.lock);
    pthread_mutex_unlock(&t.lock);
    WAIT_UNTIL(stats_now().held == 1, 10000);
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, ALWAYS);
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, ALWAYS); /* as on a GPU */
    defer_trim(NULL); /* the cudaFree fails: the device with it */
    pthread_mutex_lock(&t.lock);
    t.stage = 2;
    pthread_cond_broadcast(&t.cond);
    pthread_mutex_unlock(&t.lock);
    pthread_join(th, NULL); /* its lanes let go of their events */
    const char *msg = capture_end();
    CHECK(lines_with(msg, "device 0: cudaFree failed", EN(bad), NULL) == 1,
          "one line names the device, cudaFree and %s", EN(bad));
    CHECK(lines_with(msg, "cudaEventDestroy", EN(bad), NULL) == 0,
          "no line for the events the exiting thread let go");
    cudaFree(t.p);
}

void s_free_fails(const struct scenario *sc)
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
    WAIT_UNTIL(stats_now().held == N, 10000);
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

/* A free on *sb of two pointers p (1 and 2 KiB) in one defer_free_n,
 * completed and held, while another free (of 512 bytes) waits on a stream
 * of its own for the work returned, so that the program is not quiet. */
static fake_work *free_two_held(void *p[2], cudaStream_t *sb)
{
    cudaStream_t sa = stream_new();
    *sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    p[0] = device_alloc(1024);
    p[1] = device_alloc(2048);
    work_timed(*sb, 0, p[0]);
    work_timed(*sb, 0, p[1]);
    CHECK(defer_free_n(p, 2, *sb) == cudaSuccess, "defer_free_n of two");
    WAIT_UNTIL(stats_now().held == 1, 10000);
    CHECK(stats_now().held == 1, "held %llu, want 1", ULL(stats_now().held));
    return w;
}

/* A defer_free_n whose first pointer's cudaFree fails and whose last one's
 * works failed: counted failed, not released, its pointer named.  (The
 * entry's error is its first pointer's: a mutant that kept the last one's
 * error lost the failure, counting the entry released.) */
void s_free_n_first_fails(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t sb;
    void *p[2];
    fake_work *w = free_two_held(p, &sb);
    stderr_capture_begin();
    fake_fail(sc->call, bad, 0, ONCE); /* the first pointer's cudaFree */
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    const char *msg = capture_end();
    fake_fail_clear();
    struct defer_stats st = stats_now();
    CHECK(st.failed == 1 && st.released == 0,
          "the entry failed: failed %llu released %llu, want 1 and 0",
          ULL(st.failed), ULL(st.released));
    CHECK(fake_is_released(p[0]) == 0 && fake_is_released(p[1]) == 1,
          "the first not released, the second released");
    CHECK(lines_with(msg, "cudaFree failed", EN(bad), ptr_text(p[0])) == 1,
          "one line names cudaFree, %s and the first pointer", EN(bad));
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    cudaFree(p[0]);
    CHECK(fake_live_allocations() == 0, "nothing else left (%zu)",
          fake_live_allocations());
    CHECK_STATS();
}

/* A defer_free_n whose first pointer's cudaFree is refused as an invalid
 * value (the application freed it behind cudefer's back) and whose second
 * meets a sticky error: the sticky error is the device's whatever came
 * before it in the entry, so the device fails (said once, in the device's
 * line), and a flush and later calls return it. */
void s_free_n_sticky_after_refused(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t sb;
    void *p[2];
    fake_work *w = free_two_held(p, &sb);
    CHECK(cudaFree(p[0]) == cudaSuccess, "the first freed behind cudefer");
    stderr_capture_begin();
    fake_fail(sc->call, bad, 1, ONCE); /* the second pointer's cudaFree */
    defer_trim(NULL);
    fake_oracle_forgive(); /* the first pointer's release, provoked */
    fake_complete(w); /* a flush need not wait for it, failed or not */
    cudaError_t f = defer_flush();
    void *q = device_alloc(64);
    cudaError_t later = defer_free(q, sb);
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(f == bad, "flush returns %s (%s)", EN(bad), EN(f));
    CHECK(later == bad, "a later defer_free returns it (%s)", EN(later));
    CHECK(lines_with(msg, "device 0: cudaFree failed", EN(bad), NULL) == 1,
          "one line names the device, cudaFree and %s", EN(bad));
    CHECK(stats_now().failed >= 1, "the entry counted failed");
    cudaFree(q);
}

/* ---- reclaimer: pool memory (cudaFreeAsync, its stream) ------------------- */

/* A flush that returned f released all n of p, and nothing failed. */
static void check_flushed_all_released(cudaError_t f, void *const *p, int n)
{
    CHECK(f == cudaSuccess, "flush: %s", EN(f));
    CHECK(count_released(p, n) == n, "all released (%d of %d)",
          count_released(p, n), n);
    struct defer_stats st = stats_now();
    CHECK(st.released == (uint64_t)n && st.failed == 0,
          "released %llu failed %llu", ULL(st.released), ULL(st.failed));
}

/* The stream the frees went to cannot be synchronized (not a sticky
 * error): said in one line, and the memory is counted released (CUDA has
 * it; it comes back when a later synchronize succeeds). */
void s_malloc_free_sync_fails(const struct scenario *sc)
{
    enum { N = 3 };
    cudaStream_t s = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(4096);
        work_timed(s, 0, p[i]);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    WAIT_UNTIL(stats_now().held == N, 10000);
    stderr_capture_begin();
    fake_fail(sc->call, sc->err, 0, sc->count);
    cudaError_t f = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    check_flushed_all_released(f, p, N);
    CHECK(lines_with(msg, "cudaStreamSynchronize failed", EN(sc->err), NULL) == 1,
          "one line names cudaStreamSynchronize and %s: %s", EN(sc->err), msg);
}

/* cudaFreeAsync fails (not sticky): cudaFree instead, released, nothing
 * failed.  Pool memory's fallback is said, a line a pointer; variant
 * "malloc", memory from cudaMalloc, falls back silently: it is cudaFree's
 * memory anyway (Note [Releasing without a drain]). */
void s_free_async_fails(const struct scenario *sc)
{
    enum { N = 3 };
    const cudaError_t bad = sc->err;
    bool pool = sc->variant == NULL;
    int fails = sc->count == ONCE ? 1 : N, said = pool ? fails : 0;
    cudaStream_t s = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = pool ? pool_alloc(s, 4096) : device_alloc(4096);
        work_timed(s, 0, p[i]);
    }
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long asyncs = fake_calls(FAKE_FREE_ASYNC);
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, bad, 0, sc->count);
    for (int i = 0; i < N; i++)
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    cudaError_t f = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    check_flushed_all_released(f, p, N);
    CHECK(fake_calls(FAKE_FREE_ASYNC) - asyncs == N, "%lu cudaFreeAsync "
          "calls, want %d", fake_calls(FAKE_FREE_ASYNC) - asyncs, N);
    CHECK(fake_calls(FAKE_FREE) - frees == (unsigned long)fails,
          "%lu cudaFree calls, want %d", fake_calls(FAKE_FREE) - frees, fails);
    for (int i = 0; i < said; i++)
        CHECK(lines_with(msg, "cudaFreeAsync failed", EN(bad), ptr_text(p[i])) ==
                  1, "a line names cudaFreeAsync, %s and #%d's pointer",
              EN(bad), i);
    CHECK(lines_with(msg, "cudaFreeAsync failed", NULL, NULL) == said,
          "%d lines, want %d", lines_with(msg, "cudaFreeAsync failed", NULL,
                                          NULL), said);
    CHECK(lines_with(msg, "cudaFree failed", NULL, NULL) == 0,
          "the fallback cudaFree worked");
    CHECK_STATS();
}

/* cudaFreeAsync rejects the pointer (cudaErrorInvalidValue: an interior
 * pointer, say): cudaFree would reject it too, so it is not tried (a
 * mutant that tried it said two lines and made a call for nothing); the
 * entry failed, one line names it. */
void s_free_async_rejected(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p = pool_alloc(s, 4096);
    work_timed(s, 0, p);
    unsigned long frees = fake_calls(FAKE_FREE);
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, bad, 0, ONCE);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(fake_calls(FAKE_FREE) == frees, "no cudaFree tried (%lu)",
          fake_calls(FAKE_FREE) - frees);
    struct defer_stats st = stats_now();
    CHECK(st.failed == 1 && st.released == 0, "failed %llu released %llu",
          ULL(st.failed), ULL(st.released));
    CHECK(fake_is_released(p) == 0, "not released");
    CHECK(lines_with(msg, "cudaFreeAsync failed", EN(bad), ptr_text(p)) == 1,
          "a line names cudaFreeAsync, %s and the pointer", EN(bad));
    CHECK(lines_with(msg, "cudaFree failed", NULL, NULL) == 0 &&
              lines_with(msg, "with cudaFree instead", NULL, NULL) == 0,
          "no fallback said");
    cudaFree(p);
    CHECK_STATS();
}

/* The reclaimer cannot create its stream: cudaFree instead. */
void s_free_stream_fails(const struct scenario *sc)
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

/* The entry point cannot be had: nothing is known of any allocation.
 * Looked up first at the start (once: cuPointerGetAttributes fails and the
 * launching thread's driver calls are had; always: the runtime makes those
 * calls, and no driver call is answered). */
void s_entry_point_fails(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    unsigned long driver = fake_driver_calls();
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
    WAIT_UNTIL(stats_now().held == N, 10000);
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
    /* Device memory of either kind goes back with cudaFreeAsync on the
     * reclaimer's stream (Note [Releasing without a drain]): whether it
     * came from a pool needs no telling. */
    CHECK(fake_calls(FAKE_FREE_ASYNC) == N, "device and pool memory with "
          "cudaFreeAsync: %lu calls, want %d", fake_calls(FAKE_FREE_ASYNC), N);
    CHECK(fake_calls(FAKE_FREE) == frees, "none with cudaFree (%lu calls)",
          fake_calls(FAKE_FREE) - frees);
    CHECK(lines_with(msg, "cudaGetDriverEntryPointByVersion", EN(bad), NULL) ==
              1, "one line names cudaGetDriverEntryPointByVersion and %s",
          EN(bad));
    diag("  cudaGetDriverEntryPointByVersion called %lu time(s)",
         fake_calls(FAKE_DRIVER_ENTRY_POINT));
    driver = fake_driver_calls() - driver;
    CHECK(sc->count == ONCE ? driver > 0 : driver == 0,
          "%lu driver calls answered (want %s)", driver,
          sc->count == ONCE ? "some" : "none");
    CHECK_STATS();
}

/* cuPointerGetAttributes fails: that entry's size and pool are unknown. */
void s_pointer_attributes_fail(const struct scenario *sc)
{
    enum { N = 5 };
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    WAIT_UNTIL(fake_calls(FAKE_CU_POINTER_GET_ATTRIBUTES) >= 1, 10000);
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
                   (!once || fake_is_released(p[1]) == 1), 10000);
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
    CHECK(fake_calls(FAKE_FREE_ASYNC) == N && fake_calls(FAKE_FREE) == 0,
          "cudaFreeAsync for every device buffer, known as pool memory or "
          "not (%lu calls, want %d), cudaFree for none (%lu)",
          fake_calls(FAKE_FREE_ASYNC), N, fake_calls(FAKE_FREE));
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

/* The cap scenarios' frees: a buffer freed behind work held on one stream
 * (*w, kept busy so the program is never quiet), then n buffers of size
 * bytes freed on another once their own work is done; returns once each
 * is released or held and the counters settled. */
static void free_behind_held(fake_work **w, void **busy, void **p, int n,
                             size_t size)
{
    cudaStream_t sa = stream_new(), sb = stream_new();
    *busy = device_alloc(512);
    *w = work_held(sa, *busy);
    CHECK(defer_free(*busy, sa) == cudaSuccess, "defer_free (busy)");
    for (int i = 0; i < n; i++) {
        p[i] = busy_buffer(sb, size, 0);
        CHECK(defer_free(p[i], sb) == cudaSuccess, "defer_free #%d", i);
    }
    WAIT_UNTIL(count_released(p, n) + (int)stats_now().held == n, 10000);
    wait_stats_settled(10000);
}

/* The end of free_behind_held's scenario: w completes, and a flush
 * releases everything. */
static void flush_all(fake_work *w, void *busy, void **p, int n)
{
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, n) == n && fake_is_released(busy) == 1,
          "all released by the flush (%d of %d)", count_released(p, n), n);
    CHECK_STATS();
}

/* A 4 MiB device: its cap is 1 MiB, unless cudaMemGetInfo fails (count 0:
 * the control run, where it works).  Failed once, the cap assumes 80 GiB
 * until the reclaimer asks again (every RELEASE_POLICY_CAP_REFRESH_NS,
 * 10 ms, while it holds memory): a run that got past that before the
 * counters settled (a loaded machine: 10 runs in 20 at nice 15 beside two
 * busy loops) has learned the 1 MiB cap, and is checked for that instead.
 * Whether it asked again is read after the counters, so that counters read
 * with one call made are those of the assumed cap.  The buffers are told
 * apart by address: a release while they are still being made must not
 * give a later one a released address (FAKE_ADDRESS_REUSE), which would
 * name two of them. */
void s_mem_get_info(const struct scenario *sc)
{
    enum { N = 12, SIZE = 256 << 10 };
    fake_set_address_reuse(0);
    fake_set_device_memory(0, (size_t)4 << 20);
    stderr_capture_begin();
    if (sc->count != 0)
        fake_fail(FAKE_MEM_GET_INFO, sc->err, 0, sc->count);
    fake_work *w;
    void *busy, *p[N];
    free_behind_held(&w, &busy, p, N, SIZE);
    struct defer_stats st = stats_now();
    unsigned long asked = fake_calls(FAKE_MEM_GET_INFO);
    if (sc->count == ONCE && asked > 1) {
        diag("  cudaMemGetInfo asked %lu times before the counters settled: "
             "the cap was learned again", asked);
        WAIT_UNTIL(stats_now().cap_releases > 0 &&
                       stats_now().held_bytes <= (1 << 20), 10000);
        wait_stats_settled(10000);
        st = stats_now();
    }
    const char *msg = capture_end();
    fake_fail_clear();
    if (sc->count == ONCE && asked > 1) {
        CHECK(st.cap_releases > 0 && st.held_bytes <= (1 << 20),
              "asked again, the 1 MiB cap releases (cap_releases %llu, "
              "held_bytes %llu)", ULL(st.cap_releases), ULL(st.held_bytes));
        CHECK(lines_with(msg, "cudaMemGetInfo failed", EN(sc->err), NULL) == 1,
              "one line names cudaMemGetInfo and %s", EN(sc->err));
    } else if (sc->count != 0) {
        CHECK(st.held == N && st.held_bytes == (uint64_t)N * SIZE &&
                  st.cap_releases == 0,
              "the cap is the floor, 512 MiB (80 GiB assumed, none of it "
              "used): all held (%llu, %llu bytes), no cap release (%llu)",
              ULL(st.held), ULL(st.held_bytes), ULL(st.cap_releases));
        CHECK(lines_with(msg, "cudaMemGetInfo failed", EN(sc->err), NULL) == 1,
              "one line names cudaMemGetInfo and %s", EN(sc->err));
    } else {
        CHECK(st.cap_releases > 0 && st.held_bytes <= (1 << 20),
              "control: the 1 MiB cap releases (cap_releases %llu, held_bytes "
              "%llu)", ULL(st.cap_releases), ULL(st.held_bytes));
        CHECK(lines_with(msg, NULL, NULL, NULL) == 0, "control: nothing on "
              "stderr");
    }
    flush_all(w, busy, p, N);
}

/* A cap set by CUDEFER_MAX_PENDING (1 MiB here) does not follow the
 * device's use: cudaMemGetInfo, failing for good, is never asked, and no
 * line says that a cap assumes 80 GiB of device memory.  The 1 MiB cap
 * releases as it would with the query working. */
void s_mem_get_info_set_cap(const struct scenario *sc)
{
    enum { N = 12, SIZE = 256 << 10 };
    fake_set_address_reuse(0);
    stderr_capture_begin();
    fake_fail(FAKE_MEM_GET_INFO, sc->err, 0, sc->count);
    fake_work *w;
    void *busy, *p[N];
    free_behind_held(&w, &busy, p, N, SIZE);
    struct defer_stats st = stats_now();
    unsigned long asked = fake_calls(FAKE_MEM_GET_INFO);
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(st.cap_releases > 0 && st.held_bytes <= (1 << 20),
          "the set 1 MiB cap releases (cap_releases %llu, held_bytes %llu)",
          ULL(st.cap_releases), ULL(st.held_bytes));
    CHECK(asked == 0, "cudaMemGetInfo not asked (%lu calls)", asked);
    CHECK(lines_with(msg, "cudaMemGetInfo", NULL, NULL) == 0,
          "no line names cudaMemGetInfo (%d): %s",
          lines_with(msg, "cudaMemGetInfo", NULL, NULL), msg);
    flush_all(w, busy, p, N);
}
