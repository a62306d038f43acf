/* SPDX-License-Identifier: MIT */
/* Free batches (src/free_batch.h), end to end with the reclaimer, where
 * every seal can be made: blocks of defer_alloc's freed on the legacy
 * stream share one event per batch (CUDEFER_FREE_BATCH, 4 here), are
 * reusable on the legacy stream at once and by no other stream before
 * their batch's event completed; a batch is sealed when full, at the first
 * free once its oldest claim is 1 ms old, and by defer_flush, defer_trim
 * and shutdown, each device's on its own legacy stream; its blocks count
 * one by one as released; created streams, a callback's free and
 * CUDEFER_FREE_BATCH=1 record an event per free.  Seals that cannot be
 * made: t/free_batch_fallback.c.  The oracle checks every hand-out and
 * release. */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>

#include "free_batch.h"
#include "free_batch_test.h"
#include "helpers.h"

/* Two full batches: one event each, and the blocks go back to the legacy
 * stream at once, to another stream only once their work is done. */
static void test_full_batches(cudaStream_t s2)
{
    void *p[2 * BATCH];
    fake_work *w[2 * BATCH];
    alloc_used(p, w, 2 * BATCH, 64 * KiB);
    unsigned long before = records();
    uint64_t deferred = stats_now().deferred;
    double t0 = now_ms();
    for (int i = 0; i < 2 * BATCH; i++)
        is_int(defer_free(p[i], NULL), cudaSuccess, "free %d on stream 0", i);
    double took = now_ms() - t0;
    if (took < 1.0) /* else a batch may have been sealed for its age */
        is_int(records() - before, 2, "%d frees on the legacy stream record "
                                      "2 events (a batch of %d each)",
               2 * BATCH, BATCH);
    else
        ok(records() - before >= 2 && records() - before < 2 * BATCH,
           "%d frees record fewer events than frees (%lu; a slow run, "
           "%.1f ms: batches sealed for their age too)",
           2 * BATCH, records() - before, took);
    ok(stats_now().deferred == deferred + 2 * BATCH, "each free is counted");
    void *again = NULL;
    alloc_checked(&again, 64 * KiB, NULL);
    bool mine = false;
    for (int i = 0; i < 2 * BATCH; i++)
        mine |= again == p[i];
    ok(mine, "a request on the legacy stream reuses one at once (their work "
             "still runs)");
    void *other = NULL;
    alloc_checked(&other, 64 * KiB, s2);
    bool theirs = false;
    for (int i = 0; i < 2 * BATCH; i++)
        theirs |= other == p[i];
    ok(!theirs, "another stream's request gets none of them");
    for (int i = 0; i < 2 * BATCH; i++)
        fake_complete(w[i]);
    defer_free(other, s2);
    defer_free(again, NULL);
    is_int(defer_flush(), cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    ok(st.pending == 0 && st.deferred == st.released,
       "after the flush every free is released (%llu of %llu)",
       ULL(st.released), ULL(st.deferred));
}


/* One block in a batch that never fills: no event yet, so another stream
 * cannot have it, even with its work done; defer_flush seals the batch and
 * waits for it, after which any stream can. */
static void test_flush_seals(cudaStream_t s2)
{
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 96 * KiB, NULL);
    unsigned long before = records();
    defer_free(p, NULL);
    is_int(records() - before, 0, "a lone free on the legacy stream records "
                                  "no event");
    is_int(free_batch_waiting(), 1, "its claim waits in the batch");
    alloc_checked(&q, 96 * KiB, s2);
    ok(q != p, "another stream does not get it before its batch is sealed");
    is_int(defer_flush(), cudaSuccess, "defer_flush");
    is_int(records() - before, 1, "seals the batch with one event");
    is_int(free_batch_waiting(), 0, "nothing waits in a batch after it");
    void *r = NULL;
    alloc_checked(&r, 96 * KiB, s2);
    ok(r == p, "then another stream gets the block");
    defer_free(q, s2);
    defer_free(r, s2);
    defer_flush();
}


/* A sealed batch's blocks go to another stream only once the work before
 * its event completed, as the oracle sees it.  Work held on the legacy
 * stream uses a batch of blocks freed there; the free that fills the
 * batch seals it; while the work is held, a request of the same size on a
 * non-blocking stream must get a block no pending work uses.  A seal that
 * pushed its entry without recording the event was caught only by the
 * tests that count records: the reclaimer found the unrecorded event
 * complete and the block went to the other stream under the held work. */
static void test_sealed_batch_waits_for_work(void)
{
    cudaStream_t nb;
    if (cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking) != cudaSuccess)
        bail("cudaStreamCreateWithFlags");
    void *p[BATCH];
    for (int i = 0; i < BATCH; i++)
        alloc_checked(&p[i], 72 * KiB, NULL);
    fake_work *held = fake_launch_held(NULL, p, BATCH);
    for (int i = 0; i < BATCH; i++)
        defer_free(p[i], NULL);
    is_int(free_batch_waiting(), 0, "the free that fills the batch seals it");
    sleep_ms(50); /* the reclaimer polls the batch's event meanwhile */
    long violations = fake_violations();
    void *q = NULL;
    is_int(alloc_checked(&q, 72 * KiB, nb), cudaSuccess,
           "the same size asked for on a non-blocking stream");
    is_int(fake_violations() - violations, 0,
           "oracle: it gets no block the held work on the legacy stream "
           "still uses");
    bool theirs = false;
    for (int i = 0; i < BATCH; i++)
        theirs |= q == p[i];
    ok(!theirs, "none of the batch's blocks");
    fake_complete(held);
    is_int(defer_flush(), cudaSuccess, "flush, the held work done");
    void *r = NULL;
    alloc_checked(&r, 72 * KiB, nb);
    theirs = false;
    for (int i = 0; i < BATCH; i++)
        theirs |= r == p[i];
    ok(theirs, "then the non-blocking stream gets one of them");
    defer_free(q, nb);
    defer_free(r, nb);
    defer_flush();
    cudaStreamDestroy(nb);
}


/* A batch whose oldest claim is older than 1 ms is sealed by the next
 * free on the legacy stream; both blocks are then covered. */
static void test_age_seals(void)
{
    free_batch_set_age_ns(FREE_BATCH_AGE_NS);
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 128 * KiB, NULL);
    alloc_checked(&q, 160 * KiB, NULL);
    unsigned long before = records();
    uint64_t released = stats_now().released;
    defer_free(p, NULL);
    sleep_ms(25); /* 1 ms as the coarse clock tells (ticks of 1 to 10 ms) */
    defer_free(q, NULL);
    is_int(records() - before, 1, "the free after 1 ms seals the batch");
    is_int(free_batch_waiting(), 0, "with both claims");
    double deadline = now_ms() + 10000;
    while (stats_now().released < released + 2 && now_ms() < deadline)
        sleep_ms(1);
    ok(stats_now().released >= released + 2,
       "both are released once the event completed, with no flush");
    free_batch_set_age_ns(UINT64_MAX);
}


/* defer_trim seals the batches, and a block whose work is done goes back
 * to CUDA in that very trim. */
static void test_trim_seals(void)
{
    void *p = NULL;
    alloc_checked(&p, 8 << 20, NULL); /* a whole segment of its own */
    defer_free(p, NULL);
    is_int(free_batch_waiting(), 1, "a claim waits in the batch");
    size_t trimmed = 0;
    is_int(defer_trim(&trimmed), cudaSuccess, "defer_trim");
    is_int(free_batch_waiting(), 0, "sealed it");
    ok(fake_is_released(p) == 1, "and released the block, its work done");
}


/* Frees on a created stream are not batched: an event each. */
static void test_created_stream_records(cudaStream_t s2)
{
    void *p[3];
    for (int i = 0; i < 3; i++)
        alloc_checked(&p[i], 32 * KiB, s2);
    unsigned long before = records();
    for (int i = 0; i < 3; i++)
        defer_free(p[i], s2);
    is_int(records() - before, 3, "3 frees on a created stream record 3 "
                                  "events");
    is_int(free_batch_waiting(), 0, "and wait in no batch");
    defer_flush();
}


/* The legacy stream's calls: a hit and a batched free make no CUDA call
 * on the stream (no capture check: the legacy stream cannot capture), and
 * through the pluggable entry points none at all: not even cudaGetDevice,
 * since neither needs its device current. */
static void test_legacy_calls(void)
{
    void *p = defer_pluggable_alloc(200 * KiB, 0, NULL);
    defer_pluggable_free(p, 200 * KiB, 0, NULL); /* the next one is a hit */
    unsigned long capturing = fake_calls(FAKE_STREAM_IS_CAPTURING);
    unsigned long devices = fake_calls(FAKE_GET_DEVICE);
    unsigned long before = records();
    void *q = defer_pluggable_alloc(200 * KiB, 0, NULL);
    ok(q == p, "a hit on the legacy stream");
    defer_pluggable_free(q, 200 * KiB, 0, NULL);
    ok(fake_calls(FAKE_STREAM_IS_CAPTURING) == capturing,
       "the hit and the batched free ask for no capture status");
    ok(fake_calls(FAKE_GET_DEVICE) - devices == 0 && records() == before,
       "no cudaGetDevice, no event (%lu, %lu)",
       fake_calls(FAKE_GET_DEVICE) - devices, records() - before);
    defer_flush();
}


/* In a scenario child: defer_shutdown seals what waits and releases
 * every free (nothing reported dropped, nothing pending). */
static void check_shutdown_releases_all(void)
{
    stderr_capture_begin();
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    const char *said = stderr_capture_end();
    CHECK(strstr(said, "never sealed") == NULL, "nothing dropped");
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.released == st.deferred,
          "every free released by the shutdown (%llu of %llu)",
          ULL(st.released), ULL(st.deferred));
}


/* A callback's free on the legacy stream (on the reclaimer thread) is not
 * batched: shutdown's drain, which sealed the batches before it began,
 * would otherwise end with it unsealed and its block lost. */
struct late_free {
    void *p;
    unsigned long records_before, records_after;
};

static void free_in_callback(void *arg)
{
    struct late_free *l = arg;
    l->records_before = records();
    defer_free(l->p, NULL);
    l->records_after = records();
}

static void scenario_callback_free(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        static struct late_free l;
        alloc_checked(&l.p, 16 * KiB, NULL);
        fake_work *w = work_held(NULL, l.p);
        CHECK(defer_call(free_in_callback, &l, NULL) == cudaSuccess, "call");
        fake_complete(w);
        check_shutdown_releases_all();
        CHECK(l.records_after - l.records_before == 1,
              "the callback's free recorded its own event (%lu)",
              l.records_after - l.records_before);
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a callback's free on stream 0 during shutdown's drain is released");
}


/* largest_batch counts entries released in a pass as released counts
 * them: a free batch's blocks each (its 8 blocks, counted 8 in released,
 * are not 1 in largest_batch). */
static void scenario_batch_counts_blocks(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        void *p[8];
        for (int i = 0; i < 8; i++)
            alloc_checked(&p[i], 16 * KiB, NULL);
        for (int i = 0; i < 8; i++)
            CHECK(defer_free(p[i], NULL) == cudaSuccess, "free %d", i);
        CHECK(defer_flush() == cudaSuccess, "flush");
        struct defer_stats st = stats_now();
        CHECK(st.released == 8 && st.largest_batch == 8 && st.batches == 1,
              "released %llu, largest batch %llu, batches %llu; want 8, 8, "
              "1", ULL(st.released), ULL(st.largest_batch),
              ULL(st.batches));
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a free batch of 8 blocks is a batch of 8 released");
}


/* Two devices' batches sealed by one trim from a thread whose device is
 * the second: each batch's event goes on its own device's legacy stream.
 * Before the fix the second device's was recorded on the first's (the
 * device switched to for the first was taken for the caller's), so its
 * block went FREE, and the trim released it, while its work still ran. */
static void scenario_two_devices(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        fake_reset(2);
        void *a = NULL, *b = NULL;
        cudaSetDevice(0);
        alloc_checked(&a, 64 * KiB, NULL);
        fake_work *wa = work_held(NULL, a);
        defer_free(a, NULL);
        cudaSetDevice(1);
        alloc_checked(&b, 8 << 20, NULL);
        fake_work *wb = work_held(NULL, b);
        defer_free(b, NULL);
        CHECK(free_batch_waiting() == 2, "two claims wait (%zu)",
              free_batch_waiting());
        fake_complete(wa); /* device 0's work done, device 1's not */
        size_t trimmed = 0;
        CHECK(defer_trim(&trimmed) == cudaSuccess, "trim from device 1");
        CHECK(fake_is_released(b) == 0,
              "device 1's block, its work running, is not released");
        int dev = -1;
        cudaGetDevice(&dev);
        CHECK(dev == 1, "the caller's device is 1 again (%d)", dev);
        fake_complete(wb);
        CHECK(defer_shutdown() == cudaSuccess, "shutdown");
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a trim seals each device's batch on that device's legacy stream");
}


/* The limit in cudefer.h: a thread that never made a device current (its
 * device is 0 by default) flushes while device 1's batch holds claims; the
 * flush seals it on device 1 and makes device 0 current again, which
 * touches device 0 (with CUDA 12 or later, creates its primary context).
 * Checked so that a change of it shows here. */
static void *free_on_device1(void *unused)
{
    (void)unused;
    cudaSetDevice(1);
    void *p[3];
    for (int i = 0; i < 3; i++)
        alloc_checked(&p[i], 4 * KiB, NULL);
    for (int i = 0; i < 3; i++)
        defer_free(p[i], NULL); /* batched */
    return NULL;
}

static void scenario_flush_from_no_device(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        fake_reset(2);
        pthread_t t;
        pthread_create(&t, NULL, free_on_device1, NULL);
        pthread_join(t, NULL);
        CHECK(free_batch_waiting() == 3, "device 1's batch holds 3 claims");
        CHECK(!fake_device_touched(0), "device 0 untouched before the flush");
        CHECK(defer_flush() == cudaSuccess, "flush from a thread on no device");
        CHECK(free_batch_waiting() == 0, "sealed");
        CHECK(fake_device_touched(0), "the limit: device 0 touched by the "
                                      "switch back");
        CHECK(defer_shutdown() == cudaSuccess, "shutdown");
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a flush from a thread on no device seals device 1's batch and "
       "touches device 0 (the limit in cudefer.h)");
}


/* In a child: CUDEFER_FREE_BATCH=env; frees n blocks on the legacy stream
 * and says how many events they recorded; then shutdown with a claim
 * waiting must seal it (no report of claims dropped, nothing pending). */
static void scenario(const char *env, int n, unsigned long least,
                     unsigned long most, const char *want_said)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(env);
        stderr_capture_begin();
        void *p[8];
        for (int i = 0; i < n; i++)
            alloc_checked(&p[i], 16 * KiB, NULL);
        const char *said = stderr_capture_end();
        CHECK(want_said == NULL || strstr(said, want_said) != NULL,
              "said \"%s\"", want_said);
        unsigned long before = records();
        for (int i = 0; i < n; i++)
            defer_free(p[i], NULL);
        unsigned long made = records() - before;
        CHECK(made >= least && made <= most, "%lu events, want %lu..%lu",
              made, least, most);
        check_shutdown_releases_all();
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "%s: %d frees on stream 0 record %lu..%lu events; shutdown seals "
       "the rest", env, n, least, most);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_FREE_BATCH=4 CUDEFER_MAX_DELAY_MS=0 "
                    "CUDEFER_IDLE_US=10000000");
    fake_reset(1);
    /* Batches seal when full or on demand only (test_age_seals excepted):
     * a tick of the coarse clock between two frees split a batch a test
     * filled. */
    free_batch_set_age_ns(UINT64_MAX);
    /* Batched: no event. */
    scenario("CUDEFER_FREE_BATCH=1", 3, 3, 3, NULL);
    scenario("CUDEFER_FREE_BATCH=8", 5, 0, 0, NULL);
    scenario("CUDEFER_FREE_BATCH=0", 5, 0, 0,
             "CUDEFER_FREE_BATCH=\"0\" is out of range: expected 1..4096 "
             "(a whole number); using the default 32");
    scenario("CUDEFER_FREE_BATCH=lots", 5, 0, 0,
             "CUDEFER_FREE_BATCH=\"lots\" is not a number: expected "
             "1..4096");
    scenario_callback_free();
    scenario_batch_counts_blocks();
    scenario_two_devices();
    scenario_flush_from_no_device();
    cudaStream_t s2 = stream_new();
    test_full_batches(s2);
    test_flush_seals(s2);
    test_sealed_batch_waits_for_work();
    test_age_seals();
    test_trim_seals();
    test_created_stream_records(s2);
    test_legacy_calls();
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
