/* SPDX-License-Identifier: MIT */
/* Process exit that gives up on a call still admitted
 * (src/lifecycle_hooks.c, lifecycle_hooks_exit): the call blocks past the
 * drain's limit on the calling thread, exit counts what is pending as
 * failed (leaked), and the call, ending later, must not count its own
 * release as well: released + failed never exceeds deferred.  Each
 * scenario is a child that calls exit(); an exit handler registered before
 * cudefer's (so run after it) waits for the blocked call to end, then
 * checks the counts and ends the child.
 * Then the frees the policy holds while the reclaimer is stuck in a
 * callback: exit abandons them with the rest, so none reads held after;
 * and what follows that callback in the reclaimer's pass, which exit
 * abandoned too, is neither run nor released once the callback returns,
 * and the rest of that pass makes no CUDA call (a trim's release of the
 * cache's free block not made).  So too with a cudaFree under way: the
 * other pointers of its defer_free_n, or the other segments of a trim, are
 * not freed after it.
 * Last, exit's own seal of a free batch whose event cannot be recorded
 * while the legacy stream's work never ends: exit must not wait for it.
 * Exit beside a defer_shutdown on another thread, and a callback of the
 * drain that defers: t/exit_shutdown.c. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "exit_test.h"
#include "free_batch.h"

/* The thread of the blocked call. */
static pthread_t caller;

/* Runs after cudefer's exit handler: the blocked call ends (it outlasts
 * the drain by half a second), then the counts are checked. */
static void check_counts_later(void)
{
    for (int i = 0; i < 5000 && !atomic_load(&call_returned); i++)
        sleep_ms(1);
    CHECK(atomic_load(&call_returned), "the blocked call returned");
    if (atomic_load(&call_returned))
        pthread_join(caller, NULL); /* ThreadSanitizer: no thread leaked */
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed),
         ULL(st.leaked_at_exit));
    CHECK(st.leaked_at_exit >= 1, "exit gave the call's entries up (leaked "
          "%llu)", ULL(st.leaked_at_exit));
    CHECK(st.released + st.failed == st.deferred,
          "counted once: released %llu + failed %llu, deferred %llu",
          ULL(st.released), ULL(st.failed), ULL(st.deferred));
    scenario_child_end(); /* no other exit handler: the parent's TAP's */
}

/* ---- a callback run on the calling thread (CUDEFER_DISABLE) ------------- */

static void slow_callback(void *arg)
{
    (void)arg;
    sleep_ms(2500); /* the drain gives up after 2 s */
}

static void *call_slowly(void *arg)
{
    cudaStream_t s = arg;
    if (defer_call(slow_callback, NULL, s) != cudaSuccess)
        CHECK(false, "defer_call refused");
    atomic_store(&call_returned, 1);
    return NULL;
}

static void exit_during_sync_callback(void)
{
    atexit(check_counts_later); /* before cudefer's: run after it */
    cudaStream_t s = stream_new();
    defer_flush(); /* cudefer started, its exit handler registered */
    pthread_create(&caller, NULL, call_slowly, s);
    sleep_ms(100); /* the callback is running */
    exit(0);
}

/* ---- a synchronous free still waiting for its stream (CUDEFER_DISABLE) -- */

/* Runs after cudefer's exit handler: the free, whose wait outlasted the
 * drain, ended after exit counted what was pending; whatever it counts
 * then must still add up, and nothing may read pending for good. */
static void check_nothing_left_pending(void)
{
    for (int i = 0; i < 5000 && !atomic_load(&call_returned); i++)
        sleep_ms(1);
    CHECK(atomic_load(&call_returned), "the blocked free returned");
    if (atomic_load(&call_returned))
        pthread_join(caller, NULL);
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending),
         ULL(st.leaked_at_exit));
    CHECK(st.released + st.failed == st.deferred && st.pending == 0,
          "counted once or not at all: released %llu + failed %llu, "
          "deferred %llu, pending %llu",
          ULL(st.released), ULL(st.failed), ULL(st.deferred),
          ULL(st.pending));
    /* Nothing was pending at exit (the free not yet counted): exit says
     * it did not wait for a call, not that 0 entries were left. */
    const char *said = stderr_capture_end();
    CHECK(has_line(said, "exit: a defer call on another thread still under "
                         "way after 2000 ms", "not waited for",
                   NULL) &&
              strstr(said, "0 entries") == NULL,
          "said in one line, in exit's words: %s", said);
    scenario_child_end();
}

static void *free_after_wait(void *arg)
{
    if (defer_free(arg, NULL) != cudaSuccess)
        CHECK(false, "defer_free refused");
    atomic_store(&call_returned, 1);
    return NULL;
}

static void exit_during_sync_free(void)
{
    atexit(check_nothing_left_pending); /* before cudefer's: run after it */
    defer_flush(); /* cudefer started, its exit handler registered */
    void *p = device_alloc(48 * KiB);
    work_timed(NULL, 2500000, p); /* outlasts the drain */
    pthread_create(&caller, NULL, free_after_wait, p);
    sleep_ms(100); /* the free waits for the legacy stream */
    stderr_capture_begin();
    exit(0);
}

/* ---- a free batch's fallback wait (no event could be recorded) ---------- */

static void *free_on_legacy(void *unused)
{
    (void)unused;
    void *p[2];
    for (int i = 0; i < 2; i++)
        if (defer_alloc(&p[i], 48 * KiB, NULL) != cudaSuccess)
            bail("defer_alloc");
    work_timed(NULL, 2500000, p[1]); /* outlasts the drain */
    /* The second free fills the batch (of 2), whose event cannot be
     * recorded: it waits for the legacy stream's work. */
    if (defer_free(p[0], NULL) != cudaSuccess)
        CHECK(false, "defer_free refused");
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    if (defer_free(p[1], NULL) != cudaSuccess)
        CHECK(false, "defer_free refused");
    atomic_store(&call_returned, 1);
    return NULL;
}

static void exit_during_batch_wait(void)
{
    atexit(check_counts_later);
    defer_flush(); /* cudefer started, its exit handler registered */
    free_batch_set_age_ns(UINT64_MAX); /* sealed when full only */
    pthread_create(&caller, NULL, free_on_legacy, NULL);
    sleep_ms(100); /* the free waits for the legacy stream */
    exit(0);
}

/* ---- the policy holds completed frees while the reclaimer is stuck ------ */

/* Runs after cudefer's exit handler, once the stuck callback has returned
 * and the reclaimer's pass has ended: exit counted the held frees among
 * what it left unreleased (failed), so none reads held any more, of the
 * process or of the device, however that pass ended. */
static void check_nothing_held(void)
{
    wait_stuck_callback(200);
    struct defer_stats st;
    defer_stats_get(&st);
    struct defer_device_stats d0;
    defer_device_stats_get(0, &d0);
    diag("  deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu held %llu held_bytes %llu device 0's "
         "held_bytes %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending),
         ULL(st.leaked_at_exit), ULL(st.held), ULL(st.held_bytes),
         ULL(d0.held_bytes));
    CHECK(st.leaked_at_exit == 5 && st.pending == 0 &&
              st.released + st.failed == st.deferred,
          "the 3 held frees, the stuck one and the callback left "
          "unreleased, counted once");
    CHECK(st.held == 0 && st.held_bytes == 0 && d0.held_bytes == 0,
          "nothing reads held: held %llu, held_bytes %llu, device 0's "
          "held_bytes %llu", ULL(st.held), ULL(st.held_bytes),
          ULL(d0.held_bytes));
    scenario_child_end();
}

static void exit_while_held(void)
{
    atexit(check_nothing_held); /* before cudefer's: run after it */
    /* Work that never completes keeps the program busy: the policy holds
     * what completes (no idle release; CUDEFER_MAX_DELAY_MS=0: no age). */
    cudaStream_t busy = stream_new(), s = stream_new(), s2 = stream_new();
    void *stuck = device_alloc(KiB);
    work_held(busy, stuck);
    if (defer_free(stuck, busy) != cudaSuccess)
        bail("defer_free");
    for (int i = 0; i < 3; i++)
        if (defer_free(device_alloc(KiB), s) != cudaSuccess)
            bail("defer_free");
    for (int i = 0; i < 5000 && stats_now().held < 3; i++)
        sleep_ms(1);
    CHECK(stats_now().held == 3, "the policy holds 3 frees");
    /* The reclaimer runs the callback (no work before it on s2) and is
     * stuck in it past exit's drain. */
    if (defer_call(stuck_callback, NULL, s2) != cudaSuccess)
        bail("defer_call");
    sleep_ms(100);
    exit(0);
}

/* ---- what follows the stuck callback in the reclaimer's pass ------------- */

static atomic_int later_ran;
static void *later_free;

/* Runs after cudefer's exit handler, once the stuck callback returned and
 * the reclaimer's pass ended: exit said the callback and the free after it
 * are left unreleased (counted failed), so neither runs nor is released. */
static void check_nothing_after(void)
{
    wait_stuck_callback(200);
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed),
         ULL(st.leaked_at_exit));
    CHECK(st.leaked_at_exit == 3, "the 2 callbacks and the free left "
          "unreleased (%llu)", ULL(st.leaked_at_exit));
    CHECK(!atomic_load(&later_ran), "the callback after it never ran");
    CHECK(fake_is_released(later_free) == 0, "the free after it never "
          "released");
    scenario_child_end();
}

static void later_callback(void *arg)
{
    (void)arg;
    atomic_store(&later_ran, 1);
}

static void exit_then_nothing_released(void)
{
    atexit(check_nothing_after); /* before cudefer's: run after it */
    cudaStream_t s = stream_new();
    later_free = device_alloc(KiB);
    if (defer_call(stuck_callback, NULL, s) != cudaSuccess ||
        defer_call(later_callback, NULL, s) != cudaSuccess ||
        defer_free(later_free, s) != cudaSuccess)
        bail("defer");
    sleep_ms(100); /* the reclaimer is stuck in the first callback */
    exit(0);
}

/* ---- the rest of the pass: the cache's expiry and every CUDA call ------- */

static void *trimmed_block;

/* Runs after cudefer's exit handler, which gave up while the reclaimer was
 * stuck in a callback: once the callback returned and the pass that ran it
 * ended, the reclaimer made no CUDA call (no device asked for, no stream
 * synchronized) and freed nothing, though a trim taken in that pass asks
 * for the cache's free block: the process and the CUDA runtime are
 * ending. */
static void check_no_cuda_after(void)
{
    size_t live = fake_live_allocations();
    unsigned long made = calls_after_abandon(300);
    CHECK(made == 0, "no CUDA call after exit gave up: %lu made", made);
    CHECK(fake_is_released(trimmed_block) == 0 &&
              fake_live_allocations() == live,
          "nothing freed after exit gave up: the trimmed block %s, %zu "
          "allocations live of %zu", fake_is_released(trimmed_block)
              ? "released" : "kept", fake_live_allocations(), live);
    scenario_child_end();
}

static void busy_callback(void *arg)
{
    (void)arg;
    sleep_ms(200); /* the stuck callback and the trim arrive meanwhile */
}

static void *trim_forever(void *unused)
{
    (void)unused;
    defer_trim(NULL); /* its pass abandoned: returns once exit gave up */
    return NULL;
}

static void exit_then_no_cuda_calls(void)
{
    atexit(check_no_cuda_after); /* before cudefer's: run after it */
    cudaStream_t s = stream_new(), s2 = stream_new();
    if (alloc_checked(&trimmed_block, 4096, s) != cudaSuccess)
        bail("defer_alloc");
    /* Free in the cache from now: a trim releases it. */
    if (defer_free(trimmed_block, s) != cudaSuccess ||
        defer_flush() != cudaSuccess)
        bail("defer_free");
    /* While the reclaimer runs the busy callback, the stuck callback and a
     * trim arrive: the next pass takes both in, runs the stuck one, and
     * then (exit gave up meanwhile) would release the cache's free blocks
     * for the trim. */
    if (defer_call(busy_callback, NULL, s) != cudaSuccess)
        bail("defer_call");
    sleep_ms(50);
    if (defer_call(stuck_callback, NULL, s2) != cudaSuccess)
        bail("defer_call");
    pthread_t trimmer;
    pthread_create(&trimmer, NULL, trim_forever, NULL);
    pthread_detach(trimmer);
    sleep_ms(300); /* the reclaimer is stuck in the second callback */
    exit(0);
}

/* ---- exit's seal of a batch whose event cannot be recorded -------------- */

/* Runs after cudefer's exit handler, which must have returned: the
 * batch's frees are left unreleased (their work never ends), counted as
 * exit counts what its drain gives up on, and said in exit's words. */
static void check_left_unreleased(void)
{
    const char *said = stderr_capture_end();
    fake_fail_clear();
    struct defer_stats st;
    defer_stats_get(&st);
    diag("  deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu",
         ULL(st.deferred), ULL(st.released), ULL(st.failed), ULL(st.pending),
         ULL(st.leaked_at_exit));
    CHECK(st.leaked_at_exit == 2 && st.failed == 2 && st.pending == 0,
          "the batch's 2 frees counted leaked and failed, none pending");
    CHECK(has_line(said, "exit: 2 entries still pending", "left unreleased",
                   NULL),
          "said in one line, in exit's words: %s", said);
    CHECK(strstr(said, "waiting for the legacy stream") == NULL,
          "and no wait for the stream is announced: %s", said);
    scenario_child_end(); /* the oracle: nothing released under work */
}

static void exit_with_unsealable_batch(void)
{
    atexit(check_left_unreleased); /* before cudefer's: run after it */
    free_batch_set_age_ns(UINT64_MAX); /* sealed on demand only */
    void *p[2];
    for (int i = 0; i < 2; i++) {
        if (defer_alloc(&p[i], 48 * KiB, NULL) != cudaSuccess)
            bail("defer_alloc");
        work_held(NULL, p[i]); /* never completes */
    }
    for (int i = 0; i < 2; i++)
        if (defer_free(p[i], NULL) != cudaSuccess)
            bail("defer_free");
    CHECK(free_batch_waiting() == 2, "both frees wait in the batch (%zu)",
          free_batch_waiting());
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, -1);
    stderr_capture_begin();
    exit(0);
}

/* ---- a release loop under way: one entry's pointers, a trim's segments -- */

/* The reclaimer's first cudaFree (or cudaFreeAsync) returns only after
 * exit gave up (its drain: 2 s); the rest of that loop is what is
 * checked. */
static atomic_int frees_held;
static void *loop_ptrs[3];

static void hold_reclaimer_frees(void)
{
    fake_set_return_hook(FAKE_FREE, hold_first_on_reclaimer, &frees_held);
    fake_set_return_hook(FAKE_FREE_ASYNC, hold_first_on_reclaimer,
                         &frees_held);
}

/* Runs after cudefer's exit handler: of the loop's three pointers, the
 * one whose free was under way is released, the other two are not, and no
 * CUDA call follows the held one. */
static void check_loop_cut(void)
{
    unsigned long made = calls_after_abandon(300);
    int released = 0;
    for (int i = 0; i < 3; i++)
        released += fake_is_released(loop_ptrs[i]) != 0;
    CHECK(released == 1, "the free under way ended, the loop's other two "
          "were not freed after exit gave up (%d of 3 released)", released);
    CHECK(made == 0, "no CUDA call after exit gave up: %lu made", made);
    scenario_child_end();
}

static void exit_in_free_n_loop(void)
{
    atexit(check_loop_cut); /* before cudefer's: run after it */
    cudaStream_t s = stream_new();
    for (int i = 0; i < 3; i++)
        loop_ptrs[i] = device_alloc(KiB);
    hold_reclaimer_frees();
    if (defer_free_n(loop_ptrs, 3, s) != cudaSuccess)
        bail("defer_free_n");
    sleep_ms(300); /* the reclaimer is held in the first pointer's free */
    exit(0);
}

static void *trim_held(void *unused)
{
    (void)unused;
    defer_trim(NULL); /* its release is held: returns once exit gave up */
    return NULL;
}

static void exit_in_trim_loop(void)
{
    atexit(check_loop_cut); /* before cudefer's: run after it */
    /* No pools: the cache's segments are cudaMalloc's, each released with
     * its own cudaFree. */
    fake_set_memory_pools(0, 0);
    cudaStream_t s = stream_new();
    for (int i = 0; i < 3; i++)
        if (defer_alloc(&loop_ptrs[i], 8 * KiB * KiB, s) != cudaSuccess)
            bail("defer_alloc");
    for (int i = 0; i < 3; i++)
        if (defer_free(loop_ptrs[i], s) != cudaSuccess)
            bail("defer_free");
    if (defer_flush() != cudaSuccess)
        bail("defer_flush");
    hold_reclaimer_frees();
    pthread_t trimmer;
    pthread_create(&trimmer, NULL, trim_held, NULL);
    pthread_detach(trimmer);
    sleep_ms(300); /* the reclaimer is held in the first segment's free */
    exit(0);
}

/* ---- a call waiting for the reclaimer when exit gives up ---------------- */

static _Atomic cudaError_t waiter_err;
static atomic_int waiter_returned;
static pthread_t waiter;
static cudaStream_t waiter_stream;

/* Runs after cudefer's exit handler: the waiting call returns, and says
 * that exit gave up (cudaErrorCudartUnloading), within 1 s of the moment
 * its answer became due (its stream's work or the stuck callback done). */
static void check_waiter_returned(void)
{
    for (int i = 0; i < 3000 && !atomic_load(&waiter_returned); i++)
        sleep_ms(1);
    CHECK(atomic_load(&waiter_returned), "the waiting call returned");
    if (atomic_load(&waiter_returned)) {
        pthread_join(waiter, NULL);
        CHECK(atomic_load(&waiter_err) == cudaErrorCudartUnloading,
              "it returned %s, want cudaErrorCudartUnloading",
              cudaGetErrorName(atomic_load(&waiter_err)));
    }
    scenario_child_end();
}

static void nothing(void *arg)
{
    (void)arg;
}

/* 0: defer_flush; 1: defer_call; 2: defer_free of arg. */
static int waiter_kind;

static void *wait_for_reclaimer(void *arg)
{
    cudaError_t err = waiter_kind == 0   ? defer_flush()
                      : waiter_kind == 1 ? defer_call(nothing, NULL,
                                                      waiter_stream)
                                         : defer_free(arg, waiter_stream);
    atomic_store(&waiter_err, err);
    atomic_store(&waiter_returned, 1);
    return NULL;
}

/* A defer_flush waits behind a callback stuck past the drain. */
static void exit_during_flush(void)
{
    atexit(check_waiter_returned); /* before cudefer's: run after it */
    waiter_kind = 0;
    if (defer_call(stuck_callback, NULL, stream_new()) != cudaSuccess)
        bail("defer_call");
    sleep_ms(50); /* the reclaimer runs it */
    pthread_create(&waiter, NULL, wait_for_reclaimer, NULL);
    sleep_ms(100); /* the flush waits */
    exit(0);
}

/* With no event to be had, a defer_call (kind 1), or a defer_free under
 * CUDEFER_CHECK (kind 2), waits for its stream, whose work outlasts the
 * drain, then hands its entry to the reclaimer and waits for it. */
static void exit_during_synced_wait(int kind)
{
    atexit(check_waiter_returned); /* before cudefer's: run after it */
    waiter_kind = kind;
    waiter_stream = stream_new();
    if (defer_flush() != cudaSuccess) /* started: exit's handler is set */
        bail("defer_flush");
    void *p = device_alloc(64);
    work_timed(waiter_stream, 2500000, p); /* outlasts the drain */
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    pthread_create(&waiter, NULL, wait_for_reclaimer, p);
    sleep_ms(200); /* it waits for its stream */
    exit(0);
}

static void exit_during_synced_call(void)
{
    exit_during_synced_wait(1);
}

static void exit_during_synced_free(void)
{
    exit_during_synced_wait(2);
}

int main(void)
{
    plan(12);
    fork_scenario("exit gives up on a synchronous callback still running: "
                  "its release is not counted too",
                  "CUDEFER_DISABLE=1", 1, 20000, exit_during_sync_callback);
    fork_scenario("exit gives up on a synchronous free still waiting for "
                  "its stream: counted once, never left pending",
                  "CUDEFER_DISABLE=1", 1, 20000, exit_during_sync_free);
    fork_scenario("exit gives up on a free batch's fallback wait: its "
                  "release is not counted too",
                  "CUDEFER_FREE_BATCH=2", 1, 20000, exit_during_batch_wait);
    fork_scenario("exit gives up while the policy holds completed frees: "
                  "they are abandoned, not held",
                  "CUDEFER_MAX_DELAY_MS=0", 1, 20000, exit_while_held);
    fork_scenario("exit gives up while the reclaimer is stuck in a callback: "
                  "what follows it in the pass is neither run nor released",
                  "CUDEFER_POLICY=eager", 1, 20000,
                  exit_then_nothing_released);
    fork_scenario("exit gives up while the reclaimer is stuck in a callback: "
                  "the rest of its pass makes no CUDA call, frees nothing",
                  "CUDEFER_POLICY=eager", 1, 20000,
                  exit_then_no_cuda_calls);
    /* Killed after 10 s: exit waited for the stream without a deadline. */
    fork_scenario("exit whose seal cannot record the batch's event leaves "
                  "its frees unreleased, waiting for nothing",
                  "CUDEFER_FREE_BATCH=8", 1, 10000,
                  exit_with_unsealable_batch);
    fork_scenario("exit gives up while the reclaimer frees a defer_free_n's "
                  "pointers: the rest are not freed, no CUDA call follows",
                  "CUDEFER_POLICY=eager", 1, 20000, exit_in_free_n_loop);
    fork_scenario("exit gives up while a trim frees the cache's segments: "
                  "the rest are not freed, no CUDA call follows",
                  "CUDEFER_POLICY=eager", 1, 20000, exit_in_trim_loop);
    fork_scenario("exit gives up while a defer_flush waits: it returns "
                  "cudaErrorCudartUnloading", "", 1, 20000,
                  exit_during_flush);
    fork_scenario("exit gives up while a defer_call with no event waits: it "
                  "returns cudaErrorCudartUnloading", "CUDEFER_EVENT_POOL=0",
                  1, 20000, exit_during_synced_call);
    fork_scenario("exit gives up while a checked defer_free with no event "
                  "waits: it returns cudaErrorCudartUnloading",
                  "CUDEFER_CHECK=1 CUDEFER_EVENT_POOL=0", 1, 20000,
                  exit_during_synced_free);
    return 0;
}
