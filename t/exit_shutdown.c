/* SPDX-License-Identifier: MIT */
/* Process exit beside a defer_shutdown on another thread, and a callback
 * of exit's drain that defers (t/exit_test.h: what the tests of exit's
 * give-up share).  Exit gives up on a shutdown that holds the library's
 * lock for the whole drain, as on its own drain, the shutdown returning
 * cudaErrorCudartUnloading; it leaves one that is past its join to end
 * the library; and a free accepted during the drain counts in nothing once
 * exit gave up.  Each scenario is a child that calls exit(); an exit
 * handler registered before cudefer's (so run after it) checks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "exit_test.h"

/* The free behind the stuck callback. */
static void *later_free;

/* ---- exit while defer_shutdown waits on another thread ------------------ */

static atomic_int shutdown_result = -1; /* -1: not returned yet */

static void *shutdown_thread(void *unused)
{
    (void)unused;
    /* Holds the lifecycle's lock through its drain. */
    atomic_store(&shutdown_result, (int)defer_shutdown());
    return NULL;
}

/* Runs after cudefer's exit handler, which could not take the lock the
 * shutdown holds while it waits for the stuck callback: exit must give up
 * all the same, as when its own drain outlasts its limit.  Once the
 * callback returned, nothing more is released and no CUDA call is made
 * (the free after the callback included), and both entries are counted
 * leaked, none left pending. */
static void check_exit_during_shutdown(void)
{
    const char *said = stderr_capture_end();
    unsigned long made = calls_after_abandon(300);
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending),
         ULL(st.leaked_at_exit));
    CHECK(made == 0, "no CUDA call after exit gave up: %lu made", made);
    CHECK(fake_is_released(later_free) == 0,
          "the free behind the stuck callback was not released after exit");
    CHECK(st.leaked_at_exit == 2 && st.pending == 0 &&
              st.released + st.failed == st.deferred,
          "the callback and the free left unreleased, counted once");
    CHECK(has_line(said, "exit: 2 entries still pending", "left unreleased",
                   NULL),
          "exit said so: %s", said);
    CHECK(atomic_load(&shutdown_result) == cudaErrorCudartUnloading,
          "the shutdown returned cudaErrorCudartUnloading (%d)",
          atomic_load(&shutdown_result));
    scenario_child_end();
}

static void exit_during_shutdown(void)
{
    atexit(check_exit_during_shutdown); /* before cudefer's: run after it */
    cudaStream_t s = stream_new();
    later_free = device_alloc(KiB);
    if (defer_call(stuck_callback, NULL, s) != cudaSuccess ||
        defer_free(later_free, s) != cudaSuccess)
        bail("defer");
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, NULL);
    pthread_detach(t);
    sleep_ms(100); /* the shutdown waits for the stuck callback */
    stderr_capture_begin();
    exit(0);
}

/* ---- exit while a shutdown on another thread is past its join ---------- */

static atomic_int in_stop;

/* Between the shutdown's join and its stop: longer than exit's drain. */
static void slow_stop(void)
{
    atomic_store(&in_stop, 1);
    sleep_ms(2500);
}

/* Runs after cudefer's exit handler, which could not take the lock the
 * shutdown holds: that shutdown had joined the reclaimer and ends the
 * library itself, so exit must leave it be, not give up on it too (both
 * would count what is left, and exit would say a shutdown was not waited
 * for that then finished). */
static void check_exit_after_shutdown_joined(void)
{
    const char *said = stderr_capture_end();
    for (int i = 0; i < 3000 && atomic_load(&shutdown_result) == -1; i++)
        sleep_ms(1);
    struct defer_stats st;
    defer_stats_get(&st);
    CHECK(!has_line(said, "exit:", "under way", NULL),
          "exit did not give up on a shutdown past its join: %s", said);
    CHECK(atomic_load(&shutdown_result) == cudaSuccess,
          "the shutdown finished: %d", atomic_load(&shutdown_result));
    CHECK(st.leaked_at_exit == 0 && st.pending == 0 &&
              st.released + st.failed == st.deferred,
          "counted once: deferred %llu released %llu failed %llu leaked "
          "%llu", ULL(st.deferred), ULL(st.released), ULL(st.failed),
          ULL(st.leaked_at_exit));
    scenario_child_end();
}

static void exit_after_shutdown_joined(void)
{
    atexit(check_exit_after_shutdown_joined); /* runs after cudefer's */
    cudaStream_t s = stream_new();
    void *p = device_alloc(KiB);
    work_timed(s, 100, p);
    if (defer_free(p, s) != cudaSuccess)
        bail("defer_free");
    lifecycle_test_set_stop_hook(slow_stop);
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, NULL);
    pthread_detach(t);
    while (!atomic_load(&in_stop))
        sleep_ms(1);
    stderr_capture_begin();
    exit(0);
}

/* ---- a callback of the drain defers while exit gives up ---------------- */

static atomic_int exiting, record_held;
static void *drain_free;


/* Run by exit's drain: defers a free, whose record outlasts the drain. */
static void defer_in_drain(void *unused)
{
    (void)unused;
    for (int i = 0; i < 5000 && !atomic_load(&exiting); i++)
        sleep_ms(1);
    sleep_ms(50); /* exit's drain has begun */
    defer_free(drain_free, stream_new());
}

/* Runs after cudefer's exit handler, once the callback's defer_free
 * returned: exit counted what was pending then (the callback) failed, and
 * the free it accepted meanwhile must count in nothing, as a synchronous
 * free's does: not left pending for good. */
static void check_drain_defer_counted(void)
{
    wait_stuck_callback(200);
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending),
         ULL(st.leaked_at_exit));
    CHECK(st.pending == 0 && st.released + st.failed == st.deferred,
          "nothing pending for good: released %llu + failed %llu, deferred "
          "%llu", ULL(st.released), ULL(st.failed), ULL(st.deferred));
    scenario_child_end();
}

static void exit_while_drain_callback_defers(void)
{
    atexit(check_drain_defer_counted); /* before cudefer's: run after it */
    drain_free = device_alloc(KiB);
    /* The reclaimer's first cudaEventRecord (the drain callback's
     * defer_free) returns only after exit gave up. */
    fake_set_return_hook(FAKE_EVENT_RECORD, hold_first_on_reclaimer,
                         &record_held);
    if (defer_call(defer_in_drain, NULL, stream_new()) != cudaSuccess)
        bail("defer_call");
    sleep_ms(50); /* the reclaimer runs the callback, which waits */
    atomic_store(&exiting, 1);
    exit(0);
}

int main(void)
{
    plan(3);
    fork_scenario("exit while defer_shutdown waits on another thread for a "
                  "stuck callback: exit gives up, nothing released after",
                  "CUDEFER_POLICY=eager", 1, 20000, exit_during_shutdown);
    fork_scenario("exit while defer_shutdown on another thread is past its "
                  "join: the shutdown ends the library, exit leaves it be",
                  "", 1, 20000, exit_after_shutdown_joined);
    fork_scenario("exit gives up while a callback of its drain defers: "
                  "that free counts in nothing, not pending for good",
                  "CUDEFER_POLICY=eager", 1, 20000,
                  exit_while_drain_callback_defers);
    return 0;
}
