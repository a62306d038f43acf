/* SPDX-License-Identifier: MIT */
/* What a defer_call callback may call, and what a long one holds up.
 *
 * A callback runs on the reclaimer thread, or on the calling thread under
 * CUDEFER_DISABLE (with no event it waits for its stream on the calling
 * thread and runs on the reclaimer thread, in order).  Either way defer_flush, defer_trim and
 * defer_shutdown inside it would wait for the callback itself: they return
 * cudaErrorNotPermitted; exit() inside it must not wait for it either.
 * Each scenario runs in a child process, killed if it hangs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

static cudaError_t flush_err, trim_err, shutdown_err;
static size_t trim_bytes;
static int called;

/* The callback: every call that would wait for it. */
static void wait_calls(void *unused)
{
    (void)unused;
    trim_bytes = 99;
    flush_err = defer_flush();
    trim_err = defer_trim(&trim_bytes);
    shutdown_err = defer_shutdown();
    __atomic_store_n(&called, 1, __ATOMIC_RELEASE);
}

/* defer_call(wait_calls) must return, the three calls refused. */
static void check_wait_calls_refused(cudaStream_t s)
{
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    cudaError_t err = defer_call(wait_calls, NULL, s);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_call: %s", cudaGetErrorName(err));
    CHECK(called, "the callback ran on the calling thread");
    CHECK(flush_err == cudaErrorNotPermitted, "defer_flush in the callback: %s",
          cudaGetErrorName(flush_err));
    CHECK(trim_err == cudaErrorNotPermitted && trim_bytes == 0,
          "defer_trim in the callback: %s, %zu bytes",
          cudaGetErrorName(trim_err), trim_bytes);
    CHECK(shutdown_err == cudaErrorNotPermitted,
          "defer_shutdown in the callback: %s", cudaGetErrorName(shutdown_err));
    CHECK(strstr(msg, "defer_shutdown called from a defer_call callback") !=
              NULL,
          "the refusal is explained");
    CHECK(stats_now().rejected - rejected == 3,
          "the three refusals counted in rejected (%llu)",
          ULL(stats_now().rejected - rejected));
}

/* After the refusals the library works as before. */
static void check_still_works(cudaStream_t s)
{
    void *p = device_alloc(256);
    work_timed(s, 100, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free afterwards");
    CHECK(defer_flush() == cudaSuccess, "defer_flush afterwards");
    CHECK(fake_is_released(p) == 1, "released");
    CHECK(defer_shutdown() == cudaSuccess, "defer_shutdown afterwards");
}

static void s_disable(void)
{
    cudaStream_t s = stream_new();
    work_timed(s, 1000, NULL);
    check_wait_calls_refused(s);
    check_still_works(s);
}

static void s_no_event(void)
{
    cudaStream_t s = stream_new();
    work_timed(s, 1000, NULL);
    /* No event: every cudaEventCreate fails (the pool starts empty). */
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    check_wait_calls_refused(s);
    fake_fail_clear();
    CHECK(stats_now().sync_releases >= 1, "it was a synchronous release");
    check_still_works(s);
}

/* exit() inside a callback run on the calling thread: the exit drain must
 * not wait for that thread's own call to end. */
static double exit_called_ms;
static void *pending_ptr;

static void exit_in_callback(void *unused)
{
    (void)unused;
    exit_called_ms = now_ms();
    exit(0);
}

static void judge_exit(void)
{
    double took = now_ms() - exit_called_ms;
    struct defer_stats st = stats_now();
    diag("  exit took %.0f ms", took);
    CHECK(took < 1800, "exit waited %.0f ms for the callback's own call (its drain gives up after 2 s)", took);
    CHECK(st.leaked_at_exit == 0, "leaked_at_exit %llu", ULL(st.leaked_at_exit));
    CHECK(fake_is_released(pending_ptr) == 1,
          "the buffer deferred before was released");
    scenario_child_end();
}

static void s_exit_in_sync_callback(void)
{
    atexit(judge_exit); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new(), other = stream_new();
    pending_ptr = device_alloc(256);
    work_timed(other, 20000, pending_ptr);
    CHECK(defer_free(pending_ptr, other) == cudaSuccess, "defer_free");
    work_timed(s, 1000, NULL);
    defer_call(exit_in_callback, NULL, s);
    CHECK(false, "exit() in the callback returned");
}

/* ---- a callback run by the shutdown or exit drain defers ----------- */

static cudaStream_t drain_stream;
static void *drain_ptr;
static cudaError_t drain_err = cudaErrorUnknown;

/* Run during the drain: defers a buffer with work still running. */
static void defer_in_drain(void *unused)
{
    (void)unused;
    drain_ptr = device_alloc(256);
    work_timed(drain_stream, 20000, drain_ptr);
    drain_err = defer_free(drain_ptr, drain_stream);
}

/* A callback whose work is still running when the drain begins. */
static void defer_call_pending(void)
{
    cudaStream_t s = stream_new();
    drain_stream = stream_new();
    work_timed(s, 20000, NULL);
    CHECK(defer_call(defer_in_drain, NULL, s) == cudaSuccess, "defer_call");
}

static void s_defer_during_shutdown(void)
{
    defer_call_pending();
    stderr_capture_begin();
    cudaError_t err = defer_shutdown();
    const char *msg = stderr_capture_end();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    CHECK(drain_err == cudaSuccess, "defer_free in a callback run by the "
          "shutdown's drain: %s", cudaGetErrorName(drain_err));
    CHECK(strstr(msg, "after defer_shutdown") == NULL, "not refused");
    CHECK(fake_is_released(drain_ptr) == 1, "released before shutdown "
          "returned");
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 0, "pending %llu, failed %llu",
          ULL(st.pending), ULL(st.failed));
}

static void judge_drain_exit(void)
{
    struct defer_stats st = stats_now();
    CHECK(drain_err == cudaSuccess, "defer_free in a callback run by the "
          "exit drain: %s", cudaGetErrorName(drain_err));
    CHECK(drain_ptr != NULL && fake_is_released(drain_ptr) == 1,
          "released by the exit drain");
    CHECK(st.leaked_at_exit == 0 && st.pending == 0, "leaked_at_exit %llu, "
          "pending %llu", ULL(st.leaked_at_exit), ULL(st.pending));
    scenario_child_end();
}

static void s_defer_during_exit(void)
{
    atexit(judge_drain_exit); /* before cudefer's: runs after it */
    defer_call_pending();
    exit(0);
}

/* A callback of the exit drain that defers work which never completes:
 * exit still ends within its drain time, and counts it as leaked. */
static void defer_stuck_in_drain(void *unused)
{
    (void)unused;
    drain_ptr = device_alloc(256);
    work_held(drain_stream, drain_ptr); /* never completed */
    drain_err = defer_free(drain_ptr, drain_stream);
}

static void judge_stuck_exit(void)
{
    double took = now_ms() - exit_called_ms;
    struct defer_stats st = stats_now();
    diag("  exit took %.0f ms", took);
    CHECK(took < 10000, "exit took %.0f ms: it waited for the stuck entry "
          "beyond its drain time", took);
    CHECK(drain_err == cudaSuccess, "defer_free in the drain: %s",
          cudaGetErrorName(drain_err));
    CHECK(st.leaked_at_exit == 1, "leaked_at_exit %llu, want 1",
          ULL(st.leaked_at_exit));
    CHECK(fake_is_released(drain_ptr) == 0, "the stuck buffer is not freed");
    scenario_child_end();
}

static void s_stuck_defer_during_exit(void)
{
    atexit(judge_stuck_exit);
    cudaStream_t s = stream_new();
    drain_stream = stream_new();
    work_timed(s, 20000, NULL);
    CHECK(defer_call(defer_stuck_in_drain, NULL, s) == cudaSuccess,
          "defer_call");
    exit_called_ms = now_ms();
    exit(0);
}

/* The last CUDA error a callback finds on its thread: its own only.  The
 * reclaimer's own failures (a cudaFree that failed; a probe of a stream the
 * application destroyed) must not be left for it to find (CUDA keeps a
 * last error per thread, and PyTorch's launch checks read it). */
static cudaError_t seen_error = cudaErrorUnknown;

static void read_last_error(void *unused)
{
    (void)unused;
    seen_error = cudaPeekAtLastError();
}

static void s_clean_error(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    /* The reclaimer's cudaFreeAsync fails, then the cudaFree it falls
     * back on: two errors of its own on its thread. */
    fake_fail(FAKE_FREE_ASYNC, cudaErrorNotSupported, 0, 1);
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "a free whose release fails on the reclaimer");
    const char *said = stderr_capture_end();
    CHECK(strstr(said, "is not released") != NULL, "said (%s)", said);
    fake_fail_clear();
    CHECK(defer_call(read_last_error, NULL, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "then a callback");
    CHECK(seen_error == cudaSuccess, "the callback finds no error (%s)",
          cudaGetErrorName(seen_error));
    cudaFree(p); /* not released by cudefer: the test's own */
}

/* A callback that sets its thread's capture mode (to Global, CUDA's
 * default) and leaves it so: the mode ends with the callback.  Left in it,
 * the reclaimer's next event query, while this thread captures in the
 * global mode, was refused, which invalidated the application's capture,
 * and taken for a failed query: the device failed for good. */
static void global_mode(void *unused)
{
    (void)unused;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    cudaThreadExchangeStreamCaptureMode(&mode);
}

static void s_callback_capture_mode(void)
{
    cudaStream_t s = stream_new(), cap = stream_new(), other = stream_new();
    CHECK(defer_call(global_mode, NULL, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "a callback that sets the global capture mode ran");
    void *p = device_alloc(256);
    begin_capture(cap); /* this thread, the global mode */
    work_timed(other, 20000, p);
    stderr_capture_begin();
    CHECK(defer_free(p, other) == cudaSuccess, "defer_free on a stream that "
          "does not capture");
    sleep_ms(50); /* the reclaimer queries p's event meanwhile */
    const char *said = stderr_capture_end();
    CHECK(capture_intact(cap), "the application's capture is intact");
    CHECK(strstr(said, "device 0") == NULL, "the device did not fail: %s",
          said);
    end_capture(cap);
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1,
          "p released");
}

/* The header's limit: there is one reclaimer thread, so while a callback
 * runs nothing is released, not even memory whose work is done under the
 * eager policy (released as soon as its work completes), and a defer_flush
 * waits for the callback; once it returns, both follow.  (A mutant that
 * ran each callback on a thread of its own released p and h while the
 * callback ran, and let the flush return.) */
static int long_state; /* 1: the callback runs; 2: let it return */

static void long_callback(void *unused)
{
    (void)unused;
    __atomic_store_n(&long_state, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&long_state, __ATOMIC_ACQUIRE) != 2)
        sleep_ms(1);
}

static void s_long_callback_holds_releases(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    CHECK(defer_call(long_callback, NULL, s) == cudaSuccess, "defer_call");
    CHECK(wait_flag(&long_state, 5000), "the callback runs");
    void *p = device_alloc(4096), *h = host_alloc(64);
    CHECK(defer_free(p, s2) == cudaSuccess &&
              defer_free_host(h, s2) == cudaSuccess,
          "defer_free and defer_free_host on an idle stream");
    pthread_t t;
    int flushed = 0;
    flush_in_thread(&t, &flushed);
    sleep_ms(100);
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0,
          "nothing released while the callback runs (%d, %d)",
          fake_is_released(p), fake_is_released(h));
    CHECK(__atomic_load_n(&flushed, __ATOMIC_ACQUIRE) == 0,
          "a flush waits for the callback");
    __atomic_store_n(&long_state, 2, __ATOMIC_RELEASE);
    CHECK(wait_released(p, 5000) && wait_released(h, 5000),
          "both released once it returned");
    pthread_join(t, NULL);
    CHECK(flushed == 1, "and the flush returned cudaSuccess");
}

/* ---- fork() inside a callback on the reclaimer thread ------------------- */

/* The fork child's one thread is the reclaimer's: once the callback
 * returns there, the child must not go on as a reclaimer (it has no CUDA:
 * no CUDA call, nothing released) but end.  At the fork the child counts
 * failed what else was pending, never the callback itself, which goes on
 * there: its entry ends released when it returns, and the child's counts
 * add up (pending 0).  The child writes its counts to the parent through
 * a pipe, at its end. */
static int fork_pipe[2];             /* the child writes, the parent reads */
static _Atomic pid_t fork_child_pid; /* set by the callback in the parent */
static struct defer_stats fork_before; /* the parent's, just before fork */
static struct defer_stats fork_child_stats; /* the child's, at the fork */

static void die_on_cuda_call(enum fake_call c, cudaError_t r, void *arg)
{
    (void)r;
    (void)arg;
    fprintf(stderr, "# the fork child made %s after its callback returned\n",
            fake_call_name(c));
    child_end(3);
}

/* The child's exit handler, once its callback returned: "F R E P", failed
 * at the fork (over the parent's count before it), then released and
 * failed from the fork to the end, and pending at the end. */
static void report_fork_child(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    /* No allocation here (dprintf's stream would make one): the thread
     * sanitizer's allocator is gone for this thread, which has ended. */
    char line[128];
    int n = snprintf(line, sizeof line, "%llu %llu %llu %llu\n",
                     ULL(fork_child_stats.failed - fork_before.failed),
                     ULL(st.released - fork_child_stats.released),
                     ULL(st.failed - fork_child_stats.failed),
                     ULL(st.pending));
    if (n > 0 && write(fork_pipe[1], line, (size_t)n) != n)
        child_end(4);
    child_end(0);
}

static void fork_in_callback(void *unused)
{
    (void)unused;
    defer_stats_get(&fork_before);
    pid_t pid = fork_flushed();
    if (pid != 0) {
        atomic_store(&fork_child_pid, pid);
        return;
    }
    defer_stats_get(&fork_child_stats);
    atexit(report_fork_child);
    for (int c = 0; c < FAKE_NCALLS; c++)
        fake_set_return_hook((enum fake_call)c, die_on_cuda_call, NULL);
}

/* fork() in a callback on the reclaimer thread while `others` frees (3 at
 * most) wait for work held until the child ended: the child counts them
 * failed, never its callback. */
static void fork_in_callback_beside(unsigned others)
{
    if (pipe(fork_pipe) != 0)
        sysbail("pipe");
    cudaStream_t s = stream_new();
    void *pending[3];
    fake_work *work[3];
    for (unsigned i = 0; i < others; i++) {
        pending[i] = device_alloc(4096);
        work[i] = work_held(s, pending[i]);
        CHECK(defer_free(pending[i], s) == cudaSuccess, "defer_free");
    }
    CHECK(defer_call(fork_in_callback, NULL, stream_new()) == cudaSuccess,
          "defer_call");
    double until = now_ms() + 5000;
    while (atomic_load(&fork_child_pid) == 0 && now_ms() < until)
        sleep_ms(1);
    pid_t pid = atomic_load(&fork_child_pid);
    close(fork_pipe[1]);
    CHECK(pid > 0, "the callback forked");
    if (pid > 0) {
        char line[128] = "";
        read_until(fork_pipe[0], now_ms() + 3000, line, sizeof line);
        int status = 0;
        bool ended = wait_child(pid, 3000, &status);
        CHECK(ended, "the fork child ended once its callback returned: it "
              "ran on as a reclaimer (CUDA calls, the parent's frees "
              "released there)");
        CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the fork child made no CUDA call (status %d)", status);
        unsigned long long failed = 0, released = 0, failed_after = 0,
                           pending_end = 0;
        bool said = sscanf(line, "%llu %llu %llu %llu", &failed, &released,
                           &failed_after, &pending_end) == 4;
        CHECK(said, "the fork child wrote its counts");
        CHECK(said && failed == others,
              "the fork child counted failed the %u entries pending beside "
              "its callback, not the callback (%llu)", others, failed);
        CHECK(said && released == 1 && failed_after == 0 && pending_end == 0,
              "the fork child counted its callback's entry released when "
              "it returned, nothing else (released %llu, failed %llu, "
              "pending %llu)", released, failed_after, pending_end);
    }
    close(fork_pipe[0]);
    for (unsigned i = 0; i < others; i++)
        fake_complete(work[i]);
    CHECK(defer_flush() == cudaSuccess, "the parent flushes");
    for (unsigned i = 0; i < others; i++)
        CHECK(fake_is_released(pending[i]) == 1, "released in the parent");
}

static void s_fork_in_callback_alone(void)
{
    fork_in_callback_beside(0);
}

static void s_fork_in_callback(void)
{
    fork_in_callback_beside(1);
}

static void s_fork_in_callback_beside_3(void)
{
    fork_in_callback_beside(3);
}

/* ---- fork() inside a callback run synchronously -------------------------- */

/* The child's thread goes on with the callback, and its defer_call ends
 * it there: the entry counts once, as released (it ran), never also as
 * failed by the fork (the counts add up: pending 0, deferred = released +
 * failed).  The parent's counts are its own. */
static pid_t sync_fork_pid;

static void fork_in_sync_callback(void *unused)
{
    (void)unused;
    sync_fork_pid = fork_flushed();
}

static void s_fork_in_sync_callback(void)
{
    cudaStream_t s = stream_new();
    CHECK(defer_call(fork_in_sync_callback, NULL, s) == cudaSuccess,
          "defer_call");
    struct defer_stats st = stats_now();
    if (sync_fork_pid == 0) {
        int bad = !(st.deferred == 1 && st.released == 1 && st.failed == 0 &&
                    st.pending == 0);
        if (bad)
            fprintf(stderr, "# the fork child: deferred %llu released %llu "
                    "failed %llu pending %llu (want 1 1 0 0)\n",
                    ULL(st.deferred), ULL(st.released), ULL(st.failed),
                    ULL(st.pending));
        child_end(bad);
    }
    CHECK(sync_fork_pid > 0, "the callback forked");
    int status = 0;
    bool ended = sync_fork_pid > 0 && wait_child(sync_fork_pid, 3000, &status);
    CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the fork child counted its callback's entry once, released "
          "(status %d)", status);
    CHECK(st.deferred == 1 && st.released == 1 && st.pending == 0,
          "the parent counted it released");
}

int main(void)
{
    plan_lazy();
    fork_scenario("flush, trim and shutdown inside a callback run "
                  "synchronously (CUDEFER_DISABLE): refused, no hang",
                  "CUDEFER_DISABLE=1", 1, 15000, s_disable);
    fork_scenario("flush, trim and shutdown inside a callback with no event "
                  "(its caller waits for it): refused, no hang",
                  "", 1, 15000, s_no_event);
    fork_scenario("a callback does not find the reclaimer's own CUDA errors",
                  "", 1, 15000, s_clean_error);
    fork_scenario("a capture mode a callback sets ends with it: the "
                  "reclaimer's queries never invalidate a capture",
                  "", 1, 15000, s_callback_capture_mode);
    fork_scenario("exit inside a callback run synchronously "
                  "(CUDEFER_DISABLE): the drain does not wait for it",
                  "CUDEFER_DISABLE=1", 1, 15000, s_exit_in_sync_callback);
    fork_scenario("a callback run by the shutdown's drain may defer: accepted "
                  "and released before shutdown returns",
                  "", 1, 15000, s_defer_during_shutdown);
    fork_scenario("a callback run by the exit drain may defer: accepted and "
                  "released by the drain", "", 1, 15000, s_defer_during_exit);
    fork_scenario("a callback of the exit drain defers work that never "
                  "completes: exit ends within its drain time, counts it "
                  "leaked", "", 1, 15000, s_stuck_defer_during_exit);
    fork_scenario("a callback that runs long: nothing is released and a "
                  "flush waits until it returns",
                  "CUDEFER_POLICY=eager", 1, 15000,
                  s_long_callback_holds_releases);
    fork_scenario("fork() in a callback on the reclaimer thread: the child "
                  "ends when the callback returns, no CUDA call there",
                  "CUDEFER_POLICY=eager", 1, 20000, s_fork_in_callback);
    fork_scenario("fork() in a callback on the reclaimer thread, nothing "
                  "else pending: the child counts nothing failed",
                  "CUDEFER_POLICY=eager", 1, 20000, s_fork_in_callback_alone);
    fork_scenario("fork() in a callback on the reclaimer thread, 3 frees "
                  "pending: the child counts those 3 failed, not the "
                  "callback", "CUDEFER_POLICY=eager", 1, 20000,
                  s_fork_in_callback_beside_3);
    fork_scenario("fork() in a callback run synchronously (CUDEFER_DISABLE): "
                  "the child counts the callback's entry once, released",
                  "CUDEFER_DISABLE=1", 1, 20000, s_fork_in_sync_callback);
    return 0;
}
