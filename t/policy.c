/* SPDX-License-Identifier: MIT */
/* The release policy, one scenario per process (the configuration is read
 * once per process): completed memory is held while the application is
 * busy and released in batches when it is quiet, too old, or on
 * flush/trim (over the cap: t/policy_cap.c); pool memory and the eager policy release at once; the
 * reclaimer backs off while it waits and sleeps when there is nothing. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "policy_test.h"

/* ---- 1. batched: held while busy, released when quiet --------------------- */

static int s_batched_holds_while_busy(void)
{
    enum { N = 8 };
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    void *p[N];
    uint64_t bytes = 0;
    for (int i = 0; i < N; i++) {
        size_t size = 1024 * (size_t)(i + 1);
        p[i] = device_alloc(size);
        work_timed(sb, 100, p[i]);
        CHECK(defer_free(p[i], sb) == cudaSuccess, "defer_free #%d", i);
        bytes += size;
    }
    WAIT_UNTIL(stats_now().held == N, 10000);
    sleep_ms(50);
    struct defer_stats st = stats_now();
    CHECK(count_released(p, N) == 0,
          "B's buffers are held while A's work is pending (%d of %d released)",
          count_released(p, N), N);
    CHECK(st.held == N, "stats.held %llu, want %d", ULL(st.held), N);
    CHECK(st.held_bytes == bytes, "stats.held_bytes %llu, want %llu",
          ULL(st.held_bytes), ULL(bytes));
    CHECK(st.idle_releases + st.cap_releases + st.age_releases +
                  st.demand_releases == 0,
          "nothing released by the policy yet (idle %llu cap %llu age %llu "
          "demand %llu)", ULL(st.idle_releases), ULL(st.cap_releases),
          ULL(st.age_releases), ULL(st.demand_releases));

    double t0 = now_ms();
    busy_end(&a);
    WAIT_UNTIL(count_released(p, N) == N && fake_is_released(a.p) == 1, 10000);
    double dt = now_ms() - t0;
    CHECK(count_released(p, N) == N && fake_is_released(a.p) == 1,
          "everything released once the application is quiet (%d of %d, "
          "busy buffer %d)", count_released(p, N), N, fake_is_released(a.p));
    CHECK(dt < 5000, "released %.1f ms after the last work completed "
          "(idle time 2 ms)", dt);
    WAIT_UNTIL(stats_now().idle_releases == N + 1, 10000);
    st = stats_now();
    CHECK(st.idle_releases == N + 1, "stats.idle_releases %llu, want %d",
          ULL(st.idle_releases), N + 1);
    CHECK(st.cap_releases + st.age_releases + st.demand_releases == 0,
          "no other reason (cap %llu age %llu demand %llu)",
          ULL(st.cap_releases), ULL(st.age_releases), ULL(st.demand_releases));
    CHECK(st.held == 0 && st.held_bytes == 0, "nothing held (%llu, %llu bytes)",
          ULL(st.held), ULL(st.held_bytes));
    return failed_checks;
}

/* ---- 2. age --------------------------------------------------------------- */

static int s_age(void)
{
    enum { N = 3 };
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    void *p[N];
    double t0 = now_ms();
    defer_fast(sb, p, N, 4096);
    double first = -1;
    while (now_ms() - t0 < 2000 && count_released(p, N) < N) {
        if (first < 0 && count_released(p, N) > 0)
            first = now_ms() - t0;
        sleep_ms(1);
    }
    if (first < 0 && count_released(p, N) > 0)
        first = now_ms() - t0;
    double all = now_ms() - t0;
    CHECK(count_released(p, N) == N, "released within 2 s (%d of %d)",
          count_released(p, N), N);
    CHECK(first >= 40, "not released before about 50 ms (first after %.1f ms)",
          first);
    diag("  age: first release after %.1f ms, all after %.1f ms", first, all);
    WAIT_UNTIL(stats_now().age_releases == N, 10000);
    struct defer_stats st = stats_now();
    CHECK(st.age_releases == N, "stats.age_releases %llu, want %d",
          ULL(st.age_releases), N);
    CHECK(st.idle_releases + st.cap_releases + st.demand_releases == 0,
          "no other reason (idle %llu cap %llu demand %llu)",
          ULL(st.idle_releases), ULL(st.cap_releases), ULL(st.demand_releases));
    CHECK(fake_is_released(a.p) == 0, "the busy buffer is not released");
    busy_end(&a);
    CHECK(wait_released(a.p, 10000), "the busy buffer is released after");
    return failed_checks;
}

/* ---- 3. pool memory ------------------------------------------------------- */

static int s_pool(void)
{
    enum { N = 4 };
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    void *p[N];
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long async_frees = fake_calls(FAKE_FREE_ASYNC);
    for (int i = 0; i < N; i++) {
        cudaError_t err = cudaMallocAsync(&p[i], 4096, sb);
        if (err != cudaSuccess)
            bail("cudaMallocAsync: %s", cudaGetErrorName(err));
        work_timed(sb, 0, p[i]);
        err = defer_free(p[i], sb);
        CHECK(err == cudaSuccess, "defer_free of pool memory #%d: %s", i,
              cudaGetErrorName(err));
    }
    uint64_t max_held = 0;
    double t0 = now_ms();
    while (count_released(p, N) < N && now_ms() - t0 < 10000) {
        uint64_t h = stats_now().held;
        if (h > max_held)
            max_held = h;
        sleep_ms(1);
    }
    CHECK(count_released(p, N) == N,
          "pool memory released while busy (%d of %d; with no age limit, "
          "cudaMalloc memory would be held until the busy stream is done)",
          count_released(p, N), N);
    sleep_ms(5);
    struct defer_stats st = stats_now();
    CHECK(fake_calls(FAKE_FREE_ASYNC) - async_frees == N,
          "with cudaFreeAsync (%lu calls, want %d)",
          fake_calls(FAKE_FREE_ASYNC) - async_frees, N);
    CHECK(fake_calls(FAKE_FREE) == frees, "not with cudaFree (%lu calls)",
          fake_calls(FAKE_FREE) - frees);
    CHECK(max_held == 0 && st.held == 0 && st.held_bytes == 0,
          "never held (max held seen %llu, now %llu, %llu bytes)",
          ULL(max_held), ULL(st.held), ULL(st.held_bytes));
    CHECK(fake_is_released(a.p) == 0, "the busy buffer is not released");
    busy_end(&a);
    CHECK(wait_released(a.p, 10000), "the busy buffer is released after");
    return failed_checks;
}

/* ---- 3b. pool memory freed with a block of the cache ----------------------- */

/* defer_free_n of a defer_alloc block and pool memory: the block goes back
 * to the cache, and the pool memory is still pool memory, released at once
 * with cudaFreeAsync, never held (nor counted in held_bytes). */
static int s_pool_with_block(void)
{
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    void *ptrs[2];
    cudaError_t err = defer_alloc(&ptrs[0], 4096, sb);
    if (err != cudaSuccess)
        bail("defer_alloc: %s", cudaGetErrorName(err));
    err = cudaMallocAsync(&ptrs[1], 4096, sb);
    if (err != cudaSuccess)
        bail("cudaMallocAsync: %s", cudaGetErrorName(err));
    work_timed(sb, 0, ptrs[1]);
    unsigned long frees = fake_calls(FAKE_FREE);
    err = defer_free_n(ptrs, 2, sb);
    CHECK(err == cudaSuccess, "defer_free_n of a block and pool memory: %s",
          cudaGetErrorName(err));
    uint64_t max_held = 0, max_held_bytes = 0;
    double t0 = now_ms();
    while (fake_is_released(ptrs[1]) != 1 && now_ms() - t0 < 2000) {
        struct defer_stats st = stats_now();
        if (st.held > max_held)
            max_held = st.held;
        if (st.held_bytes > max_held_bytes)
            max_held_bytes = st.held_bytes;
        sleep_ms(1);
    }
    CHECK(fake_is_released(ptrs[1]) == 1,
          "the pool memory is released while busy (with no age limit, "
          "held memory waits for the busy stream)");
    CHECK(max_held == 0 && max_held_bytes == 0,
          "the pool memory is never held (max held seen %llu, %llu bytes)",
          ULL(max_held), ULL(max_held_bytes));
    CHECK(fake_calls(FAKE_FREE) == frees, "not with cudaFree (%lu calls)",
          fake_calls(FAKE_FREE) - frees);
    busy_end(&a);
    CHECK(wait_released(a.p, 10000), "the busy buffer is released after");
    return failed_checks;
}

/* ---- 4. eager ------------------------------------------------------------- */

static int s_eager(void)
{
    enum { N = 4 };
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    void *p[N + 1];
    defer_fast(sb, p, N, 4096);
    p[N] = host_alloc(4096);
    work_timed(sb, 0, p[N]);
    CHECK(defer_free_host(p[N], sb) == cudaSuccess, "defer_free_host");
    uint64_t max_held = 0;
    double t0 = now_ms();
    while (count_released(p, N + 1) < N + 1 && now_ms() - t0 < 10000) {
        uint64_t h = stats_now().held;
        if (h > max_held)
            max_held = h;
        sleep_ms(1);
    }
    CHECK(count_released(p, N + 1) == N + 1,
          "released while another stream is busy (%d of %d; with no age "
          "limit, the batched policy would hold it until then)",
          count_released(p, N + 1), N + 1);
    struct defer_stats st = stats_now();
    CHECK(max_held == 0 && st.held == 0, "never held (max seen %llu, now %llu)",
          ULL(max_held), ULL(st.held));
    CHECK(fake_is_released(a.p) == 0, "the busy buffer is not released");
    busy_end(&a);
    CHECK(wait_released(a.p, 10000), "the busy buffer is released after");
    return failed_checks;
}

/* ---- 5. trim -------------------------------------------------------------- */

static int s_trim(void)
{
    size_t bytes = 12345;
    cudaError_t err = defer_trim(&bytes);
    CHECK(err == cudaSuccess, "trim before any defer call: %s",
          cudaGetErrorName(err));
    CHECK(bytes == 0, "trim before any defer call: %zu bytes", bytes);
    CHECK(defer_trim(NULL) == cudaSuccess, "trim(NULL) before any defer call");

    struct busy a = busy_begin();
    /* Another entry whose work is pending, to be trimmed later. */
    cudaStream_t sp = stream_new();
    void *pending = device_alloc(777);
    fake_work *wp = work_held(sp, pending);
    CHECK(defer_free(pending, sp) == cudaSuccess, "defer_free (pending)");
    /* Completed entries: device and pinned memory. */
    cudaStream_t sb = stream_new();
    void *p[3] = {device_alloc(1000), device_alloc(2000), host_alloc(3000)};
    for (int i = 0; i < 3; i++)
        work_timed(sb, 0, p[i]);
    CHECK(defer_free(p[0], sb) == cudaSuccess, "defer_free");
    CHECK(defer_free(p[1], sb) == cudaSuccess, "defer_free");
    CHECK(defer_free_host(p[2], sb) == cudaSuccess, "defer_free_host");
    WAIT_UNTIL(stats_now().held == 3, 10000);
    struct defer_stats st = stats_now();
    CHECK(st.held == 3 && st.held_bytes == 6000, "3 entries held (%llu), "
          "6000 bytes (%llu)", ULL(st.held), ULL(st.held_bytes));
    uint64_t demand = st.demand_releases;

    bytes = 0;
    err = defer_trim(&bytes);
    CHECK(err == cudaSuccess, "trim: %s", cudaGetErrorName(err));
    CHECK(bytes == 6000, "trim released %zu bytes, want 6000", bytes);
    CHECK(count_released(p, 3) == 3, "the held entries are released by the "
          "time trim returns (%d of 3)", count_released(p, 3));
    CHECK(fake_is_released(a.p) == 0 && fake_is_released(pending) == 0,
          "entries whose work is pending are not released");
    st = stats_now();
    CHECK(st.demand_releases - demand == 3, "demand_releases grew by %llu, "
          "want 3", ULL(st.demand_releases - demand));
    CHECK(st.held == 0 && st.held_bytes == 0, "nothing held after trim");

    bytes = 12345;
    err = defer_trim(&bytes);
    CHECK(err == cudaSuccess && bytes == 0,
          "trim with nothing held: %s, %zu bytes", cudaGetErrorName(err), bytes);

    fake_complete(wp);
    WAIT_UNTIL(stats_now().held == 1, 10000);
    CHECK(stats_now().held == 1, "the completed entry is held while busy");
    bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess && bytes == 777,
          "trim after its work completed: %zu bytes, want 777", bytes);
    CHECK(fake_is_released(pending) == 1, "and released it");

    busy_end(&a);
    CHECK(defer_flush() == cudaSuccess, "flush");
    bytes = 12345;
    CHECK(defer_trim(&bytes) == cudaSuccess && bytes == 0,
          "trim after a flush: %zu bytes", bytes);
    CHECK(fake_live_allocations() == 0, "no allocation left (%zu)",
          fake_live_allocations());
    return failed_checks;
}

/* ---- 6. flush ------------------------------------------------------------- */

enum { FLUSH_N = 3 };
static struct busy flush_busy;
static void *flush_p[FLUSH_N];
static int flush_held_released_early;
static int flush_busy_completed;

/* After ~30 ms, note whether the flush released the held entries while the
 * busy work was still pending, then complete it. */
static void *flush_helper(void *unused)
{
    (void)unused;
    sleep_ms(30);
    WAIT_UNTIL(count_released(flush_p, FLUSH_N) == FLUSH_N, 10000);
    __atomic_store_n(&flush_held_released_early,
                     count_released(flush_p, FLUSH_N) == FLUSH_N &&
                         fake_is_released(flush_busy.p) == 0,
                     __ATOMIC_SEQ_CST);
    __atomic_store_n(&flush_busy_completed, 1, __ATOMIC_SEQ_CST);
    busy_end(&flush_busy);
    return NULL;
}

static int s_flush(void)
{
    flush_busy = busy_begin();
    cudaStream_t sb = stream_new();
    defer_fast(sb, flush_p, FLUSH_N, 4096);
    WAIT_UNTIL(stats_now().held == FLUSH_N, 10000);
    CHECK(stats_now().held == FLUSH_N, "%d entries held before the flush (%llu)",
          FLUSH_N, ULL(stats_now().held));
    CHECK(count_released(flush_p, FLUSH_N) == 0, "none released before");
    uint64_t demand = stats_now().demand_releases;
    pthread_t t;
    pthread_create(&t, NULL, flush_helper, NULL);
    cudaError_t err = defer_flush();
    int completed = __atomic_load_n(&flush_busy_completed, __ATOMIC_SEQ_CST);
    CHECK(err == cudaSuccess, "flush: %s", cudaGetErrorName(err));
    CHECK(completed, "flush waited for the busy entry deferred before it");
    CHECK(count_released(flush_p, FLUSH_N) == FLUSH_N &&
              fake_is_released(flush_busy.p) == 1,
          "everything deferred before the flush is released when it returns");
    pthread_join(t, NULL);
    CHECK(flush_held_released_early,
          "the held entries were released at once, while the flush still "
          "waited for the busy work");
    struct defer_stats st = stats_now();
    CHECK(st.demand_releases - demand == FLUSH_N + 1,
          "demand_releases grew by %llu, want %d",
          ULL(st.demand_releases - demand), FLUSH_N + 1);
    CHECK(st.held == 0, "nothing held after the flush (%llu)", ULL(st.held));
    return failed_checks;
}

/* ---- 7. an idle batch yields to the application -------------------------- */

static int s_idle_batch_yields(void)
{
    enum { N = 200 };
    struct busy a = busy_begin();
    cudaStream_t sb = stream_new();
    static void *p[N];
    defer_fast(sb, p, N, 256);
    WAIT_UNTIL(stats_now().held == N, 10000);
    CHECK(stats_now().held == N, "%d entries held (%llu)", N,
          ULL(stats_now().held));
    fake_set_latency(FAKE_FREE_ASYNC, 5000000); /* 5 ms a release: 1 s */
    busy_end(&a); /* quiet: the idle batch starts */
    CHECK(wait_released(p[0], 10000), "the idle batch started");
    sleep_ms(10);
    /* The application is back. */
    cudaStream_t sc = stream_new();
    void *n = device_alloc(64);
    fake_work *wn = work_held(sc, n);
    CHECK(defer_free(n, sc) == cudaSuccess, "defer_free while the batch runs");
    int at_push = count_released(p, N);
    /* Without the yield, the batch would release 60 more by then.  Counted
     * from the push, not from the batch's start: a stall of this thread
     * before the push must not look like a batch that did not yield. */
    sleep_ms(300);
    struct defer_stats st = stats_now();
    int released = count_released(p, N);
    CHECK(st.held > 0 && released < N, "the batch stopped early: %llu still "
          "held", ULL(st.held));
    CHECK(released - at_push <= 5, "the batch stopped at the push: %d of %d "
          "released then, %d 300 ms later", at_push, N, released);
    sleep_ms(50);
    CHECK(count_released(p, N) == released,
          "and stays stopped while the new work is pending (%d, then %d)",
          released, count_released(p, N));
    fake_set_latency(FAKE_FREE_ASYNC, 0);
    fake_complete(wn);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, N) == N && fake_is_released(n) == 1 &&
              fake_is_released(a.p) == 1,
          "all released after the flush (%d of %d)", count_released(p, N), N);
    return failed_checks;
}

/* ---- 8. CUDEFER_DISABLE --------------------------------------------------- */

static pthread_t disable_caller;
static int disable_call_on_caller;

static void disable_cb(void *arg)
{
    *(int *)arg = 1;
    disable_call_on_caller = pthread_equal(pthread_self(), disable_caller);
}

static int s_disable(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    fake_work *w = work_timed(s, 2000, p);
    cudaError_t err = defer_free(p, s);
    CHECK(err == cudaSuccess, "defer_free: %s", cudaGetErrorName(err));
    CHECK(fake_work_done(w), "defer_free waited for the stream's work");
    CHECK(fake_is_released(p) == 1, "and released the buffer at once");
    struct defer_stats st = stats_now();
    CHECK(st.sync_releases == 1, "sync_releases %llu, want 1",
          ULL(st.sync_releases));
    CHECK(st.deferred == 1 && st.released == 1 && st.pending == 0,
          "deferred %llu released %llu pending %llu", ULL(st.deferred),
          ULL(st.released), ULL(st.pending));

    void *h = host_alloc(4096);
    w = work_timed(s, 2000, h);
    CHECK(defer_free_host(h, s) == cudaSuccess, "defer_free_host");
    CHECK(fake_work_done(w) && fake_is_released(h) == 1,
          "defer_free_host waited and released at once");

    int ran = 0;
    disable_caller = pthread_self();
    w = work_timed(s, 2000, NULL);
    CHECK(defer_call(disable_cb, &ran, s) == cudaSuccess, "defer_call");
    CHECK(fake_work_done(w) && ran, "the callback ran after the work, before "
          "defer_call returned");
    CHECK(disable_call_on_caller, "on the calling thread");
    CHECK(stats_now().sync_releases == 3, "sync_releases %llu, want 3",
          ULL(stats_now().sync_releases));
    return failed_checks;
}

/* ---- 9. no wake-ups when idle -------------------------------------------- */

static int s_idle_no_wakeups(void)
{
    enum { N = 4 };
    cudaStream_t s = stream_new();
    void *p[N];
    defer_fast(s, p, N, 4096);
    WAIT_UNTIL(count_released(p, N) == N, 10000);
    CHECK(count_released(p, N) == N, "released by the policy (%d of %d)",
          count_released(p, N), N);
    sleep_ms(100);
    struct defer_stats before = stats_now();
    sleep_ms(300);
    struct defer_stats after = stats_now();
    CHECK(after.wakeups == before.wakeups, "%llu wake-ups in 300 quiet ms",
          ULL(after.wakeups - before.wakeups));
    CHECK(after.event_queries == before.event_queries,
          "%llu event queries in 300 quiet ms",
          ULL(after.event_queries - before.event_queries));
    return failed_checks;
}

/* ---- 10. polling backs off ------------------------------------------------ */

static int s_adaptive_polling(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    fake_work *w = work_held(s, p);
    struct defer_stats before = stats_now();
    double t0 = now_ms();
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    sleep_ms(300);
    struct defer_stats after = stats_now();
    /* Bounded by the window as measured (a sleep may overrun on a loaded
     * machine): under one query and one wake-up a ms (5 ms polls at most,
     * CUDEFER_POLL_MAX_US; 50 us polls without back-off make 20 a ms). */
    double ms = now_ms() - t0;
    uint64_t queries = after.event_queries - before.event_queries;
    uint64_t wakeups = after.wakeups - before.wakeups;
    diag("  polling: %llu event queries, %llu wake-ups in %.0f ms",
         ULL(queries), ULL(wakeups), ms);
    CHECK(queries > 0, "the pending entry is polled");
    CHECK(queries < ms, "%llu event queries in %.0f ms (50 us polls without "
          "back-off would make 20 a ms)", ULL(queries), ms);
    CHECK(wakeups < ms, "%llu wake-ups in %.0f ms", ULL(wakeups), ms);
    CHECK(fake_is_released(p) == 0, "not released while its work is pending");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released after its work completes");
    return failed_checks;
}

int main(void)
{
    plan_lazy();
    scenario("batched: held while another stream is busy, released when quiet",
             "CUDEFER_IDLE_US=2000 CUDEFER_MAX_DELAY_MS=0",
             s_batched_holds_while_busy);
    scenario("age: released after max_delay_ms while busy",
             "CUDEFER_MAX_DELAY_MS=50", s_age);
    scenario("pool memory: released at once with cudaFreeAsync, never held",
             "CUDEFER_MAX_DELAY_MS=0", s_pool);
    scenario("pool memory freed with a block: released at once, never held",
             "CUDEFER_MAX_DELAY_MS=0", s_pool_with_block);
    scenario("eager: released at once while busy",
             "CUDEFER_POLICY=eager CUDEFER_MAX_DELAY_MS=0", s_eager);
    scenario("trim: releases what completed, reports its bytes",
             "CUDEFER_MAX_DELAY_MS=0", s_trim);
    scenario("flush: releases held entries at once, waits for pending ones",
             "CUDEFER_MAX_DELAY_MS=0", s_flush);
    scenario("idle batch: stops when the application is back",
             "CUDEFER_IDLE_US=1000 CUDEFER_MAX_DELAY_MS=0", s_idle_batch_yields);
    scenario("CUDEFER_DISABLE: every call waits and releases at once",
             "CUDEFER_DISABLE=1", s_disable);
    scenario("idle: no wake-ups once everything is released", "",
             s_idle_no_wakeups);
    scenario("adaptive polling: backs off while nothing completes",
             "CUDEFER_POLL_US=50 CUDEFER_POLL_MAX_US=5000", s_adaptive_polling);
    return 0;
}
