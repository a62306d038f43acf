/* SPDX-License-Identifier: MIT */
/* Free batches (src/free_batch.h), end to end with the reclaimer, where a
 * seal cannot be made as usual (CUDEFER_FREE_BATCH, 4 here): an event that
 * cannot be recorded makes the free wait for the legacy stream instead,
 * its batch's blocks then free at once; when that wait fails too the
 * claims go back to the batch, reusable on the legacy stream only; a
 * sticky error there fails the device; while another thread's global
 * capture bars the legacy stream, frees wait in their batch unsealed, a
 * flush, trim or shutdown that cannot seal them says so in its result, and
 * a free that joins no batch is refused; a seal that waits for the
 * legacy stream leaves a capture elsewhere intact.  Seals that can be
 * made: t/free_batch_seals.c.  The oracle checks every hand-out and
 * release. */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>

#include "free_batch.h"
#include "free_batch_test.h"
#include "helpers.h"

/* An event that cannot be recorded: the free waits for the legacy stream
 * and its batch's blocks are free at once (said, counted). */
static void test_record_fails(cudaStream_t s2)
{
    void *p[BATCH];
    fake_work *w[BATCH];
    alloc_used(p, w, BATCH, 48 * KiB);
    for (int i = 0; i < BATCH; i++)
        fake_complete(w[i]);
    uint64_t sync = stats_now().sync_releases;
    for (int i = 0; i < BATCH - 1; i++)
        defer_free(p[i], NULL);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    stderr_capture_begin();
    is_int(defer_free(p[BATCH - 1], NULL), cudaSuccess,
           "the free that fills the batch is accepted");
    const char *said = stderr_capture_end();
    fake_fail_clear();
    ok(strstr(said, "cudaEventRecord") != NULL &&
           strstr(said, "waiting for the legacy stream") != NULL,
       "the failed record is reported");
    uint64_t synced = stats_now().sync_releases - sync;
    ok(synced >= 1 && synced <= BATCH,
       "the batch's frees count as synchronous (%llu; %d unless a slow run "
       "sealed some for their age)", ULL(synced), BATCH);
    void *q = NULL;
    alloc_checked(&q, 48 * KiB, s2);
    bool mine = false;
    for (int i = 0; i < BATCH; i++)
        mine |= q == p[i];
    ok(mine, "another stream gets one of its blocks at once");
    defer_free(q, s2);
    defer_flush();
}

/* While the legacy stream is barred (another thread captures a blocking
 * stream in the global mode: cudaStreamIsCapturing on it fails), frees on
 * it are still batched and a due batch waits, since recording there would
 * invalidate that capture; a miss is refused; the first free after seals
 * everything. */
static void test_barred_legacy(cudaStream_t s2)
{
    void *p[2 * BATCH + 1], *hit = NULL, *miss = NULL;
    for (int i = 0; i < 2 * BATCH + 1; i++)
        alloc_checked(&p[i], 24 * KiB, NULL);
    unsigned long before = records();
    fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorStreamCaptureImplicit, 0,
              -1);
    bool accepted = true;
    for (int i = 0; i < 2 * BATCH; i++)
        accepted &= defer_free(p[i], NULL) == cudaSuccess;
    ok(accepted, "frees on the barred legacy stream are accepted");
    ok(records() == before && free_batch_waiting() == 2 * BATCH,
       "and wait in their batch, unsealed, past its size (%zu)",
       free_batch_waiting());
    bool theirs = false;
    cudaError_t err = alloc_checked(&hit, 24 * KiB, NULL);
    for (int i = 0; i < 2 * BATCH; i++)
        theirs |= hit == p[i];
    ok(err == cudaSuccess && theirs,
       "a request on it that hits gets one of them");
    stderr_capture_begin();
    is_int(alloc_checked(&miss, 40 << 20, NULL),
           cudaErrorStreamCaptureImplicit, "one that misses is refused");
    stderr_capture_end();
    /* Before the fix a flush or trim returned cudaSuccess here, its
     * promise (everything deferred before it released) unkept. */
    size_t waiting = free_batch_waiting();
    stderr_capture_begin();
    is_int(defer_flush(), cudaErrorStreamCaptureImplicit,
           "a flush that cannot seal them says which error");
    const char *said = stderr_capture_end();
    ok(strstr(said, "wait there until a later free or flush") != NULL,
       "and says they wait");
    size_t trimmed = 1;
    stderr_capture_begin();
    is_int(defer_trim(&trimmed), cudaErrorStreamCaptureImplicit,
           "a trim too");
    stderr_capture_end();
    ok(free_batch_waiting() == waiting && records() == before,
       "they still wait, no event recorded (%zu)", free_batch_waiting());
    fake_fail_clear();
    defer_free(p[2 * BATCH], NULL);
    is_int(records() - before, 1, "the first free after seals them all");
    is_int(free_batch_waiting(), 0, "nothing waits");
    defer_free(hit, NULL);
    void *q = NULL;
    is_int(defer_flush(), cudaSuccess, "flush");
    alloc_checked(&q, 24 * KiB, s2);
    theirs = false;
    for (int i = 0; i < 2 * BATCH + 1; i++)
        theirs |= q == p[i];
    ok(theirs, "another stream gets one once their work is done");
    defer_free(q, s2);
    defer_flush();
}

/* The seal's event cannot be recorded and even waiting for the stream
 * fails: the claims go back to the batch, their blocks still reusable on
 * the legacy stream only (not FREE, reusable by any stream while their
 * work may still run); a flush then seals them. */
/* How many times needle occurs in text. */
static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL; at++)
        n++;
    return n;
}

static void test_sync_fails(cudaStream_t s2)
{
    void *p[BATCH];
    fake_work *w[BATCH];
    alloc_used(p, w, BATCH, 56 * KiB);
    for (int i = 0; i < BATCH - 1; i++)
        defer_free(p[i], NULL);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorLaunchOutOfResources, 0, 1);
    stderr_capture_begin();
    is_int(defer_free(p[BATCH - 1], NULL), cudaSuccess,
           "the free whose seal fails twice is accepted");
    const char *said = stderr_capture_end();
    fake_fail_clear();
    ok(strstr(said, "until a later seal") != NULL, "said");
    ok(free_batch_waiting() >= 1, "its claims are back in the batch (%zu)",
       free_batch_waiting());
    void *q = NULL;
    alloc_checked(&q, 56 * KiB, s2);
    bool theirs = false;
    for (int i = 0; i < BATCH; i++)
        theirs |= q == p[i];
    ok(!theirs, "another stream gets none of their blocks (work running)");
    for (int i = 0; i < BATCH; i++)
        fake_complete(w[i]);
    /* A flush whose seal fails the same way returns the wait's error. */
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 2);
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorLaunchOutOfResources, 0, 2);
    stderr_capture_begin();
    is_int(defer_flush(), cudaErrorLaunchOutOfResources,
           "a flush whose seal fails says which error");
    said = stderr_capture_end();
    fake_fail_clear();
    /* Tried once: only another thread's claims given back meanwhile would
     * be worth a second try, and it would fail and say so again. */
    ok(count_of(said, "defer_flush: cudaEventRecord failed") == 1 &&
           count_of(said, "defer_flush: cudaStreamSynchronize failed") == 1,
       "the flush's failed seal said once: %s", said);
    ok(free_batch_waiting() >= 1, "they still wait (%zu)",
       free_batch_waiting());
    defer_free(q, s2);
    is_int(defer_flush(), cudaSuccess, "a flush seals them");
    is_int(free_batch_waiting(), 0, "nothing waits");
    struct defer_stats st = stats_now();
    ok(st.pending == 0, "every free released (pending %llu)", ULL(st.pending));
}

/* While another thread's global capture bars the legacy stream, a free
 * there that joins no batch (plain cudaMalloc memory, the block cache in
 * use) is refused at the call, with no event recorded there (it would
 * invalidate that capture); a mutation that skipped that check went
 * unseen before. */
static void scenario_barred_plain_free(void)
{
    cudaStream_t s = stream_new();
    void *b = NULL;
    CHECK(alloc_checked(&b, 4096, s) == cudaSuccess, "defer_alloc: cache in use");
    defer_free(b, s);
    void *c = NULL; /* the legacy stream's identity is known from here on */
    CHECK(alloc_checked(&c, 4096, NULL) == cudaSuccess, "defer_alloc on 0");
    CHECK(defer_free(c, NULL) == cudaSuccess, "defer_free on 0");
    defer_flush();
    void *p = device_alloc(1 << 20);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorStreamCaptureImplicit, 0, -1);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, NULL);
    stderr_capture_end();
    unsigned long recorded = fake_calls(FAKE_EVENT_RECORD) - records;
    fake_fail_clear();
    CHECK(err == cudaErrorStreamCaptureImplicit,
          "refused while the legacy stream is barred: %s",
          cudaGetErrorName(err));
    CHECK(recorded == 0, "no event recorded on the barred legacy stream (%lu)",
          recorded);
    if (err != cudaSuccess)
        CHECK(defer_free(p, NULL) == cudaSuccess, "accepted once unbarred");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1, "released");
    cudaStreamDestroy(s);
}

/* defer_shutdown while another thread's global capture bars the legacy
 * stream: the batch cannot be sealed, its records are dropped (said), and
 * shutdown says so in its result (not cudaSuccess).  The dropped frees
 * count as failed, not pending for good, and their blocks are lost to the
 * cache: they stay allocated (cudefer.h's limit). */
static void scenario_shutdown_barred(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        void *p[3];
        for (int i = 0; i < 3; i++)
            alloc_checked(&p[i], 16 * KiB, NULL);
        for (int i = 0; i < 3; i++)
            CHECK(defer_free(p[i], NULL) == cudaSuccess, "free %d", i);
        fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorStreamCaptureImplicit,
                  0, -1);
        stderr_capture_begin();
        cudaError_t err = defer_shutdown();
        const char *said = stderr_capture_end();
        fake_fail_clear();
        CHECK(err == cudaErrorStreamCaptureImplicit, "shutdown: %s",
              cudaGetErrorName(err));
        CHECK(strstr(said, "never sealed") != NULL, "said: %s", said);
        /* Every line names the call the caller made. */
        CHECK(strstr(said, "cudefer: shutdown:") == NULL &&
                  strstr(said, "cudefer: defer_shutdown: 3 blocks") != NULL,
              "the drop said as defer_shutdown's: %s", said);
        /* No free or flush comes after shutdown: none is promised. */
        CHECK(strstr(said, "until a later") == NULL,
              "no later seal promised: %s", said);
        for (int i = 0; i < 3; i++)
            CHECK(fake_is_released(p[i]) == 0, "block %d stays allocated: "
                  "lost to the cache, never released", i);
        struct defer_stats st = stats_now();
        CHECK(st.pending == 0 && st.failed == 3,
              "the dropped frees counted as failed, none pending (pending "
              "%llu, failed %llu)", ULL(st.pending), ULL(st.failed));
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "shutdown while the legacy stream is barred returns "
       "cudaErrorStreamCaptureImplicit and says what it dropped");
}

/* defer_shutdown whose seal of a free batch cannot record the batch's
 * event: as at any seal, it waits for the legacy stream instead (its work
 * here ends 20 ms on, the oracle checking that none of it is released
 * before) and the blocks are released, the shutdown successful.  Where
 * that wait fails too (wait_fails), the batch is lost to the cache, as
 * cudefer.h's limit says: shutdown returns the wait's error, drops the
 * records (said, counted as failed) and the blocks stay allocated until
 * exit.  (A mutant that dropped the batch whenever its record failed fails
 * both; one that released blocks whose wait failed, the second.) */
static void scenario_shutdown_unrecorded(bool wait_fails)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=8");
        void *p[3];
        for (int i = 0; i < 3; i++) {
            alloc_checked(&p[i], 16 * KiB, NULL);
            work_timed(NULL, 20000, p[i]);
            CHECK(defer_free(p[i], NULL) == cudaSuccess, "free %d", i);
        }
        CHECK(free_batch_waiting() == 3, "the three wait in their batch");
        const cudaError_t bad = cudaErrorLaunchOutOfResources;
        fake_fail(FAKE_EVENT_RECORD, bad, 0, -1);
        if (wait_fails)
            fake_fail(FAKE_STREAM_SYNCHRONIZE, bad, 0, -1);
        stderr_capture_begin();
        cudaError_t err = defer_shutdown();
        const char *said = stderr_capture_end();
        fake_fail_clear();
        int released = 0;
        for (int i = 0; i < 3; i++)
            released += fake_is_released(p[i]);
        struct defer_stats st = stats_now();
        CHECK(strstr(said, "cudaEventRecord") != NULL &&
                  strstr(said, "waiting for the legacy stream") != NULL,
              "the failed record and the wait said: %s", said);
        /* In the words of the call the user made. */
        CHECK(strstr(said, "cudefer: defer_shutdown: cudaEventRecord") !=
                      NULL &&
                  strstr(said, "cudefer: defer_free:") == NULL,
              "said as defer_shutdown's: %s", said);
        if (!wait_fails) {
            CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
            CHECK(released == 3, "the blocks released (%d of 3)", released);
            CHECK(st.failed == 0 && st.pending == 0 &&
                      st.sync_releases == 3,
                  "counted as synchronous releases (failed %llu, pending "
                  "%llu, sync %llu)", ULL(st.failed), ULL(st.pending),
                  ULL(st.sync_releases));
        } else {
            CHECK(err == bad, "shutdown: %s", cudaGetErrorName(err));
            CHECK(released == 0, "the blocks stay allocated (%d of 3 "
                  "released)", released);
            CHECK(strstr(said, "never sealed") != NULL, "the drop said");
            /* Tried once (nothing else seals during shutdown), and no
             * later seal promised: none comes after shutdown. */
            const char *record = strstr(said, "cudaEventRecord");
            CHECK(record != NULL &&
                      strstr(record + 1, "cudaEventRecord") == NULL,
                  "the failed record said once: %s", said);
            CHECK(strstr(said, "until a later") == NULL,
                  "no later seal promised: %s", said);
            CHECK(st.failed == 3 && st.pending == 0,
                  "counted as failed, none pending (failed %llu, pending "
                  "%llu)", ULL(st.failed), ULL(st.pending));
        }
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       wait_fails ? "shutdown whose seal can neither record nor wait: the "
                    "batch is lost to the cache, its blocks stay allocated"
                  : "shutdown whose seal cannot record the batch's event "
                    "waits for the legacy stream and releases its blocks");
}

/* BATCH + 1 blocks of 16 KiB on the legacy stream, the first BATCH - 1
 * freed: the next free fills the batch and seals it, one more is left. */
static void batch_but_one(void *p[BATCH + 1])
{
    for (int i = 0; i < BATCH + 1; i++)
        alloc_checked(&p[i], 16 * KiB, NULL);
    for (int i = 0; i < BATCH - 1; i++)
        CHECK(defer_free(p[i], NULL) == cudaSuccess, "free %d", i);
}

/* A sticky error (a kernel fault: every later call on the device fails
 * with it) meets the seal's record and the wait that replaces it: the
 * device fails, as where the reclaimer or a synchronous release meets one
 * (cudefer.h): the batch's frees are abandoned (counted as failed, not
 * pending), a later defer call on the device and defer_flush return the
 * error, and no flush waits for the stream again.  Before the fix the
 * claims went back to the batch, later frees on the legacy stream were
 * accepted into it, and every flush retried the wait and said so. */
static void scenario_sticky_seal(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=4");
        free_batch_set_age_ns(UINT64_MAX);
        void *p[BATCH + 1];
        batch_but_one(p);
        const cudaError_t bad = cudaErrorIllegalAddress;
        fake_fail(FAKE_EVENT_RECORD, bad, 0, -1);
        fake_fail(FAKE_STREAM_SYNCHRONIZE, bad, 0, -1);
        stderr_capture_begin();
        cudaError_t sealing = defer_free(p[BATCH - 1], NULL);
        cudaError_t later = defer_free(p[BATCH], NULL);
        unsigned long syncs = fake_calls(FAKE_STREAM_SYNCHRONIZE);
        cudaError_t flushed = defer_flush();
        cudaError_t again = defer_flush();
        syncs = fake_calls(FAKE_STREAM_SYNCHRONIZE) - syncs;
        const char *said = stderr_capture_end();
        CHECK(sealing == cudaSuccess, "the free whose seal fails is "
              "accepted (%s)", cudaGetErrorName(sealing));
        CHECK(has_line(said, "device 0: cudaStreamSynchronize failed",
                       "cudaErrorIllegalAddress", NULL),
              "the device's failure is said, naming device 0");
        CHECK(later == bad, "a later free on the device returns the error "
              "(%s)", cudaGetErrorName(later));
        CHECK(flushed == bad && again == bad, "flushes return it (%s, %s)",
              cudaGetErrorName(flushed), cudaGetErrorName(again));
        CHECK(syncs == 0, "no flush waits for the stream again (%lu waits)",
              syncs);
        CHECK(free_batch_waiting() == 0, "nothing waits in the batch (%zu)",
              free_batch_waiting());
        struct defer_stats st = stats_now();
        CHECK(st.pending == 0 && st.failed == BATCH,
              "the batch's frees counted as failed, none pending (pending "
              "%llu, failed %llu)", ULL(st.pending), ULL(st.failed));
        fake_fail_clear();
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a sticky error in a seal's fallback wait fails the device");
}

/* Through the runtime's calls (CUDEFER_DRIVER_CALLS=0, or a thread with
 * no current context), a seal whose record fails leaves that failure as
 * the thread's last error (the driver's call leaves none).  The free that
 * seals, and a flush that seals, wait for the legacy stream instead and
 * succeed: the failed record is cudefer's own business, said, and no error
 * for the application's next cudaGetLastError (PyTorch's launch check) to
 * find.  Nor is the capture check that bars a due batch's seal. */
static void scenario_runtime_record_fails(void)
{
    free_batch_set_age_ns(UINT64_MAX);
    void *p[BATCH + 1];
    batch_but_one(p);
    cudaGetLastError();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    stderr_capture_begin();
    cudaError_t err = defer_free(p[BATCH - 1], NULL);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    cudaError_t last = cudaGetLastError();
    CHECK(err == cudaSuccess, "the free that seals is accepted (%s)",
          cudaGetErrorName(err));
    CHECK(strstr(said, "waiting for the legacy stream") != NULL,
          "the failed record said (stderr: \"%s\")", said);
    CHECK(last == cudaSuccess, "the free leaves no error of the failed "
          "record (%s)", cudaGetErrorName(last));
    CHECK(defer_free(p[BATCH], NULL) == cudaSuccess, "one more free");
    cudaGetLastError();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    stderr_capture_begin();
    err = defer_flush();
    said = stderr_capture_end();
    fake_fail_clear();
    last = cudaGetLastError();
    CHECK(err == cudaSuccess, "the flush that seals succeeds (%s)",
          cudaGetErrorName(err));
    CHECK(strstr(said, "waiting for the legacy stream") != NULL,
          "its failed record said (stderr: \"%s\")", said);
    CHECK(last == cudaSuccess, "the flush leaves no error of the failed "
          "record (%s)", cudaGetErrorName(last));
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 0,
          "every free released (pending %llu, failed %llu)", ULL(st.pending),
          ULL(st.failed));
    /* While another thread's global capture bars the legacy stream, the
     * free that finds its batch due leaves it waiting (accepted): the
     * refused capture check is no error of the application's either. */
    void *q[BATCH];
    for (int i = 0; i < BATCH; i++)
        alloc_checked(&q[i], 16 * KiB, NULL);
    cudaGetLastError();
    fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorStreamCaptureImplicit, 0, -1);
    stderr_capture_begin();
    for (int i = 0; i < BATCH; i++)
        CHECK(defer_free(q[i], NULL) == cudaSuccess, "barred free %d", i);
    said = stderr_capture_end();
    last = cudaGetLastError();
    fake_fail_clear();
    CHECK(last == cudaSuccess, "frees on the barred legacy stream leave no "
          "error of the refused check (%s; stderr: \"%s\")",
          cudaGetErrorName(last), said);
    CHECK(defer_flush() == cudaSuccess && free_batch_waiting() == 0,
          "a flush once unbarred seals them");
}

/* The seal of a free, then of a flush, whose event cannot be recorded,
 * while cap captures (in this thread, or another thread's in the global
 * mode; caps says which): each waits for the legacy stream instead, which
 * does not capture, and releases its blocks at once, the capture left
 * intact.  A wait in the thread's own mode is refused there, and
 * invalidates that capture. */
static void seal_fails_beside(const char *caps, cudaStream_t cap)
{
    bool other = caps[0] == 'a';
    void *p[BATCH + 1];
    batch_but_one(p);
    struct held_capture held = {cap, 0, 0, 0};
    pthread_t t;
    if (other) {
        if (pthread_create(&t, NULL, hold_capture, &held) != 0)
            bail("pthread_create");
        CHECK(wait_flag(&held.begun, 10000) && held.begun == 1,
              "the other thread's capture began");
    } else if (cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal) !=
               cudaSuccess) {
        bail("cudaStreamBeginCapture");
    }
    for (int round = 0; round < 2; round++) {
        const char *call = round == 0 ? "defer_free" : "defer_flush";
        uint64_t sync = stats_now().sync_releases;
        if (round == 1)
            CHECK(defer_free(p[BATCH], NULL) == cudaSuccess, "one more free");
        fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
        stderr_capture_begin();
        cudaError_t err =
            round == 0 ? defer_free(p[BATCH - 1], NULL) : defer_flush();
        const char *said = stderr_capture_end();
        fake_fail_clear();
        uint64_t synced = stats_now().sync_releases - sync;
        CHECK(err == cudaSuccess &&
                  strstr(said, "cudaStreamSynchronize") == NULL,
              "%s whose seal waits beside %s: accepted, the wait made (%s; "
              "stderr: \"%s\")", call, caps, cudaGetErrorName(err), said);
        CHECK(synced == (round == 0 ? BATCH : 1),
              "%s beside %s: its blocks released at once (%llu of %d)", call,
              caps, ULL(synced), round == 0 ? BATCH : 1);
        CHECK(free_batch_waiting() == 0, "%s beside %s: nothing waits (%zu)",
              call, caps, free_batch_waiting());
        CHECK(capture_intact(cap), "%s left %s intact", call, caps);
    }
    if (other) {
        __atomic_store_n(&held.release, 1, __ATOMIC_SEQ_CST);
        pthread_join(t, NULL);
        CHECK(held.intact, "the other thread's capture ended well");
    } else {
        cudaGraph_t graph = NULL;
        CHECK(cudaStreamEndCapture(cap, &graph) == cudaSuccess,
              "this thread's capture ended well");
        cudaGraphDestroy(graph);
    }
}

static void scenario_seal_fails_beside_capture(void)
{
    free_batch_set_age_ns(UINT64_MAX);
    cudaStream_t cap = stream_new();
    seal_fails_beside("this thread's capture", cap);
    seal_fails_beside("another thread's global capture", cap);
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 0,
          "every free released (pending %llu, failed %llu)", ULL(st.pending),
          ULL(st.failed));
    cudaStreamDestroy(cap);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_FREE_BATCH=4 CUDEFER_MAX_DELAY_MS=0 "
                    "CUDEFER_IDLE_US=10000000");
    fake_reset(1);
    /* Batches seal when full or on demand only: a tick of the coarse
     * clock between two frees split a batch a test filled. */
    free_batch_set_age_ns(UINT64_MAX);
    scenario_shutdown_barred();
    scenario_sticky_seal();
    scenario_shutdown_unrecorded(false);
    scenario_shutdown_unrecorded(true);
    fork_scenario("barred legacy stream: a plain free is refused", "", 1,
                  10000, scenario_barred_plain_free);
    fork_scenario("a seal whose record fails through the runtime leaves no "
                  "error", "CUDEFER_FREE_BATCH=4 CUDEFER_DRIVER_CALLS=0", 1,
                  10000, scenario_runtime_record_fails);
    fork_scenario("a seal that waits for the legacy stream leaves a capture "
                  "elsewhere intact", "CUDEFER_FREE_BATCH=4", 1, 10000,
                  scenario_seal_fails_beside_capture);
    cudaStream_t s2 = stream_new();
    test_record_fails(s2);
    test_barred_legacy(s2);
    test_sync_fails(s2);
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
