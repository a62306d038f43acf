/* SPDX-License-Identifier: MIT */
/* How long the events a thread's stream lanes hold live (stream_lane.h):
 * every one is let go of, and destroyed at shutdown, whatever ended the
 * lane, and none is destroyed where its device cannot take it.
 *
 *  - A thread whose pthread-key destructor (one made after cudefer's, so
 *    run after cudefer's own at the thread's exit) defers once more: the
 *    lane and cache that call fills must be let go of too (else their
 *    events stay alive past shutdown, never destroyed).
 *  - After a sticky error shutdown forgets the failed device's events, the
 *    lanes' ones included, with CUDEFER_EVENT_POOL=0 (a full pool: what the
 *    lanes let go of would overflow it and be destroyed, saying the
 *    device's error once more).
 *  - defer_call_streams refused after recording two parts on one stream
 *    (its two handles, 0 and cudaStreamLegacy: a handle given twice is
 *    one part): the lane forgets both records (else it waits for them for
 *    good, full, and shares one event among all later callbacks).
 *  - A refused group's labels, given again to later entries, are not
 *    complete by a lane's query of the refused records.
 *  - A thread with lanes forks and exits in the child: its lanes let go
 *    into the pools without a CUDA call (none may be made after fork).
 *
 * Each scenario runs in a child process of its own (a fresh library). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"
#include "stream_lane.h"

/* Lines of text that start with "cudefer: " and contain what. */
static int lines_naming(const char *text, const char *what)
{
    int n = 0;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        if (len > 9 && strncmp(line, "cudefer: ", 9) == 0) {
            char buf[1024];
            if (len >= sizeof buf)
                len = sizeof buf - 1;
            memcpy(buf, line, len);
            buf[len] = '\0';
            n += strstr(buf, what) != NULL;
        }
        if (end == NULL)
            break;
        line = end + 1;
    }
    return n;
}

static atomic_int late_ran;

static void count_late(void *arg)
{
    (void)arg;
    atomic_fetch_add(&late_ran, 1);
}

static pthread_key_t late_key;
static cudaStream_t late_stream;
static atomic_int late_deferred;

/* The thread's last pthread-key destructor: one more callback, on a stream
 * whose work is held, so its event is pending in a fresh lane. */
static void defer_at_exit(void *unused)
{
    (void)unused;
    if (defer_call(count_late, NULL, late_stream) == cudaSuccess)
        atomic_fetch_add(&late_deferred, 1);
}

static void *thread_deferring_at_exit(void *unused)
{
    (void)unused;
    pthread_setspecific(late_key, (void *)1);
    CHECK(defer_call(count_late, NULL, late_stream) == cudaSuccess,
          "defer_call in the thread");
    return NULL;
}

static void s_defer_in_late_key_destructor(void)
{
    late_stream = stream_new();
    /* cudefer's key first (its thread cache registers on the first call),
     * so the test's key is destroyed after it at the thread's exit. */
    CHECK(defer_call(count_late, NULL, late_stream) == cudaSuccess,
          "defer_call in the main thread");
    CHECK(defer_flush() == cudaSuccess, "flush");
    if (pthread_key_create(&late_key, defer_at_exit) != 0)
        bail("pthread_key_create");
    fake_work *gate = work_held(late_stream, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, thread_deferring_at_exit, NULL) != 0)
        bail("pthread_create");
    pthread_join(th, NULL);
    CHECK(atomic_load(&late_deferred) == 1,
          "the key destructor's defer_call was taken");
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&late_ran) == 3, "every callback ran (%d of 3)",
          atomic_load(&late_ran));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0,
          "every event destroyed at shutdown (%zu alive: the lane and cache "
          "of the late defer_call were never let go of)",
          fake_live_events());
}

/* A sticky error on device 0 (a cudaFree fails with it), with the lanes of
 * two streams each holding an event, and the event pool kept empty
 * (CUDEFER_EVENT_POOL=0): shutdown must destroy none of the device's
 * events (each would fail and say the error again). */
static void s_sticky_shutdown_empty_pool(void)
{
    const cudaError_t bad = cudaErrorIllegalAddress;
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *busy = device_alloc(512), *p = device_alloc(1024);
    fake_work *w = work_held(sa, busy);
    CHECK(defer_free(busy, sa) == cudaSuccess, "defer_free (busy)");
    work_timed(sb, 0, p);
    CHECK(defer_free(p, sb) == cudaSuccess, "defer_free");
    for (int k = 0; k < 2000 && stats_now().held != 1; k++)
        sleep_ms(1);
    CHECK(stats_now().held == 1, "the completed free is held");
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, bad, 0, -1);
    defer_trim(NULL); /* the release fails: the device with it */
    fake_complete(w);
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, -1); /* as on a GPU */
    cudaError_t err = defer_shutdown();
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    CHECK(err == bad, "shutdown returns the device's error (%s)",
          cudaGetErrorName(err));
    CHECK(lines_naming(msg, "cudaFreeAsync failed") == 1,
          "one line says the cudaFreeAsync failed");
    CHECK(lines_naming(msg, "cudaEventDestroy") == 0,
          "no line for the events shutdown cannot destroy, the lanes' "
          "included");
}

static unsigned long destroys_before_exit;

/* The fork child's end: its only thread, the forking one, has exited (its
 * lanes and cache let go of; the process then exits, running this), and no
 * event was destroyed.  No thread is started in the child (TSan does not
 * support that after a multi-threaded fork). */
static void check_at_exit(void)
{
    unsigned long destroyed =
        fake_calls(FAKE_EVENT_DESTROY) - destroys_before_exit;
    CHECK(destroyed == 0, "the fork child destroyed %lu events as its "
          "forking thread exited (CUDA cannot be used after fork)",
          destroyed);
    child_end(failed_checks);
}

/* A thread with lanes on two streams (their events complete, the pool
 * keeps 1: CUDEFER_EVENT_POOL=1) forks; in the child it exits, and its
 * lanes let go of their events into a full pool: no CUDA call may destroy
 * the one that does not fit. */
static void *thread_forking(void *unused)
{
    (void)unused;
    cudaStream_t s[2] = {stream_new(), stream_new()};
    for (int i = 0; i < 2; i++)
        CHECK(defer_call(count_late, NULL, s[i]) == cudaSuccess,
              "defer_call on stream %d", i);
    CHECK(defer_flush() == cudaSuccess, "flush");
    pid_t pid = fork_flushed();
    if (pid == 0) {
        failed_checks = 0;
        destroys_before_exit = fake_calls(FAKE_EVENT_DESTROY);
        atexit(check_at_exit);
        pthread_exit(NULL); /* the last thread: the process exits */
    }
    int status = 0;
    bool ended = wait_child(pid, 30000, &status);
    CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the fork child's exiting thread made no CUDA call");
    return NULL;
}

static void s_fork_child_thread_exit(void)
{
    pthread_t th;
    if (pthread_create(&th, NULL, thread_forking, NULL) != 0)
        bail("pthread_create");
    pthread_join(th, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static atomic_int step_ran;

static void count_step(void *arg)
{
    (void)arg;
    atomic_fetch_add(&step_ran, 1);
}

/* defer_call_streams on the legacy stream twice over (0 and
 * cudaStreamLegacy, two handles of one stream: one lane) and on another
 * stream, its third record failing: the first two parts each took an
 * event of the thread's lane for the legacy stream (the second a fresh
 * one, the first's record being pending), and both are discarded.
 * Neither event may stay in the lane as if a record of it were pending:
 * nothing would ever complete it, and with LANE_EVENTS - 1 such events
 * the lane is full for good, every later callback sharing its newest
 * event, so a thread that keeps deferring behind its work runs none of
 * them (each records that event again after the newest work) until it
 * stops. */
static void s_failed_groups_leave_no_stale_event(void)
{
    cudaStream_t s = 0; /* the lane the refused groups leave behind */
    cudaStream_t thrice[3] = {s, cudaStreamLegacy, stream_new()};
    stderr_capture_begin();
    for (int i = 0; i < LANE_EVENTS; i++) {
        fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 2, 1);
        CHECK(defer_call_streams(count_step, NULL, thrice, 3) != cudaSuccess,
              "defer_call_streams #%d refused (its third record failed)", i);
        fake_fail_clear();
    }
    stderr_capture_end();
    CHECK(atomic_load(&step_ran) == 0, "no refused callback ran");
    /* Each callback's own work is held until the next one is deferred. */
    enum { STEPS = 40 };
    fake_work *prev = work_held(s, NULL);
    CHECK(defer_call(count_step, NULL, s) == cudaSuccess, "defer_call #0");
    for (int i = 1; i < STEPS; i++) {
        fake_work *w = work_held(s, NULL);
        CHECK(defer_call(count_step, NULL, s) == cudaSuccess,
              "defer_call #%d", i);
        fake_complete(prev);
        prev = w;
        sleep_ms(5);
    }
    /* Waited for while the last work is still held (a slow reclaimer may
     * lag the loop above; with the bug none of them ever runs). */
    for (int i = 0; i < 10000 && atomic_load(&step_ran) < STEPS / 2; i++)
        sleep_ms(1);
    int ran = atomic_load(&step_ran);
    CHECK(ran >= STEPS / 2, "%d of the %d callbacks whose work is done ran "
          "while the thread kept deferring (0: they all shared one event, "
          "recorded again behind each new work)", ran, STEPS - 1);
    fake_complete(prev);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&step_ran) == STEPS, "every callback ran (%d of %d)",
          atomic_load(&step_ran), STEPS);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed (%zu alive)",
          fake_live_events());
}

/* Refused groups whose parts' picks sweep the thread's lanes (take_idle,
 * CUDEFER_EVENT_POOL=1 or 2 so idle events run out) between a part's
 * commit and its uncommit (a sweep must not let go of a slot whose label
 * is still to be uncommitted).  Random groups over
 * 4 streams, held and completed work interleaved, a record failing at
 * random.  Then every accepted callback runs, callbacks run as their work
 * completes, and no event outlives shutdown. */
static atomic_int acc_ran;
static void count_acc(void *arg)
{
    (void)arg;
    atomic_fetch_add(&acc_ran, 1);
}

static void s_sweeps_inside_refused_groups(void)
{
    enum { NS = 4, ROUNDS = 3000 };
    cudaStream_t st[NS];
    fake_work *held[NS] = {0};
    for (int k = 0; k < NS; k++)
        st[k] = stream_new();
    unsigned r = 12345;
    int accepted = 0;
    stderr_capture_begin();
    for (int i = 0; i < ROUNDS; i++) {
        r = r * 1103515245u + 12345u;
        int k = (r >> 8) % NS;
        if (held[k] != NULL && (r >> 12) % 3 == 0) {
            fake_complete(held[k]);
            held[k] = NULL;
        } else if (held[k] == NULL && (r >> 14) % 2 == 0) {
            held[k] = work_held(st[k], NULL);
        }
        cudaStream_t g[6];
        int n = 2 + (int)((r >> 16) % 5);
        for (int j = 0; j < n; j++) {
            r = r * 1103515245u + 12345u;
            g[j] = st[(r >> 8) % NS];
        }
        if ((r >> 20) % 2 == 0) {
            fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported,
                      (int)((r >> 22) % (unsigned)n), 1);
            (void)defer_call_streams(count_acc, NULL, g, (size_t)n);
            fake_fail_clear();
        } else {
            CHECK(defer_call(count_acc, NULL, g[0]) == cudaSuccess, "call");
            accepted++;
        }
    }
    stderr_capture_end();
    for (int k = 0; k < NS; k++)
        if (held[k] != NULL)
            fake_complete(held[k]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    int ran0 = atomic_load(&acc_ran);
    CHECK(ran0 >= accepted, "accepted callbacks ran (%d of >= %d)", ran0,
          accepted);
    /* Each step's work held until the next is deferred, on every stream. */
    enum { STEPS = 40 };
    for (int k = 0; k < NS; k++) {
        int before = atomic_load(&acc_ran);
        fake_work *prev = work_held(st[k], NULL);
        CHECK(defer_call(count_acc, NULL, st[k]) == cudaSuccess, "step 0");
        for (int i = 1; i < STEPS; i++) {
            fake_work *w = work_held(st[k], NULL);
            CHECK(defer_call(count_acc, NULL, st[k]) == cudaSuccess, "step");
            fake_complete(prev);
            prev = w;
            sleep_ms(2);
        }
        for (int i = 0;
             i < 5000 && atomic_load(&acc_ran) - before < STEPS / 2; i++)
            sleep_ms(1);
        CHECK(atomic_load(&acc_ran) - before >= STEPS / 2,
              "stream %d: %d of %d ran while deferring", k,
              atomic_load(&acc_ran) - before, STEPS - 1);
        fake_complete(prev);
    }
    CHECK(defer_flush() == cudaSuccess, "flush 2");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed (%zu alive)",
          fake_live_events());
}

/* A refused group's records on one stream: with no idle event
 * (CUDEFER_EVENT_POOL=0) a later part's pick asks its lane's newest
 * itself, and its query, seeing the earlier part's record done, raises the
 * event's completed label to that record's.  The group refused, the next
 * free and callback recorded behind held work must not count as complete
 * already: a label names one record for good, never a later one (before,
 * the refused labels were taken back and given again, and that free was
 * released, that callback run, while their work was pending). */
static atomic_int label_ran;

static void count_label(void *arg)
{
    (void)arg;
    atomic_fetch_add(&label_ran, 1);
}

static void s_refused_labels_are_not_completed(void)
{
    cudaStream_t s = 0; /* two parts on its lane, as above */
    cudaStream_t thrice[3] = {s, cudaStreamLegacy, stream_new()};
    void *first = device_alloc(256);
    /* The lane's event, recorded once, its entry done. */
    CHECK(defer_free(first, s) == cudaSuccess, "first free");
    CHECK(defer_flush() == cudaSuccess, "first flush");
    void *refused = device_alloc(256);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 2, 1);
    CHECK(defer_free_streams(refused, thrice, 3) != cudaSuccess,
          "defer_free_streams refused (its third record failed)");
    fake_fail_clear();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 2, 1);
    CHECK(defer_call_streams(count_label, NULL, thrice, 3) != cudaSuccess,
          "defer_call_streams refused (its third record failed)");
    fake_fail_clear();
    stderr_capture_end();
    /* The next free and callback behind work that is held. */
    void *p = device_alloc(256);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "free behind held work");
    CHECK(defer_call(count_label, NULL, s) == cudaSuccess,
          "callback behind held work");
    sleep_ms(100);
    CHECK(fake_is_released(p) == 0,
          "the free behind held work is not released before its work "
          "completes");
    CHECK(atomic_load(&label_ran) == 0,
          "the callback behind held work does not run before its work "
          "completes");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1, "released once its work completed");
    CHECK(atomic_load(&label_ran) == 1, "the callback ran once");
    CHECK(cudaFree(refused) == cudaSuccess, "the refused free's memory");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed (%zu alive)",
          fake_live_events());
}

static void run(void (*scenario)(void), const char *env, const char *what)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(env);
        fake_reset(1);
        failed_checks = 0;
        scenario();
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, 60000, &status);
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", what);
}

int main(void)
{
    plan_lazy();
    run(s_defer_in_late_key_destructor, NULL,
        "a thread that defers again in a late key destructor: its lane's "
        "events are let go of and destroyed at shutdown");
    run(s_sticky_shutdown_empty_pool,
        "CUDEFER_MAX_DELAY_MS=0 CUDEFER_EVENT_POOL=0",
        "after a sticky error, with no event pool, shutdown destroys none "
        "of the failed device's events, the lanes' included");
    run(s_fork_child_thread_exit, "CUDEFER_EVENT_POOL=1",
        "a forking thread with lanes exits in the fork child: its events go "
        "back to the pools, none destroyed (no CUDA call after fork)");
    run(s_failed_groups_leave_no_stale_event, NULL,
        "refused defer_call_streams on one stream twice leave no event in "
        "the lane waiting for a record nobody takes in: later callbacks run "
        "as their work completes");
    run(s_refused_labels_are_not_completed, "CUDEFER_EVENT_POOL=0",
        "records of a refused group that the lane's own query saw done "
        "complete no later entry recorded behind held work");
    run(s_sweeps_inside_refused_groups, "CUDEFER_EVENT_POOL=1",
        "sweeps of the lanes between a refused group's parts: every "
        "accepted callback runs, as its work completes, no event left");
    run(s_sweeps_inside_refused_groups, "CUDEFER_EVENT_POOL=2",
        "the same with two idle events at most");
    return 0;
}
