/* SPDX-License-Identifier: MIT */
/* Process exit that gives up on a call still admitted (src/lifecycle.c,
 * at_exit): the call blocks past the drain's limit on the calling thread,
 * exit counts what is pending as failed (leaked), and the call, ending
 * later, must not count its own release as well: released + failed never
 * exceeds deferred.  Each scenario is a child that calls exit(); an exit
 * handler registered before cudefer's (so run after it) waits for the
 * blocked call to end, then checks the counts and ends the child. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "free_batch.h"
#include "helpers.h"

static const size_t KiB = 1024;

/* The thread of the blocked call, and whether the call has returned. */
static pthread_t caller;
static atomic_int call_returned;

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

int main(void)
{
    plan(2);
    fork_scenario("exit gives up on a synchronous callback still running: "
                  "its release is not counted too",
                  "CUDEFER_DISABLE=1", 1, 20000, exit_during_sync_callback);
    fork_scenario("exit gives up on a free batch's fallback wait: its "
                  "release is not counted too",
                  "CUDEFER_FREE_BATCH=2", 1, 20000, exit_during_batch_wait);
    return 0;
}
