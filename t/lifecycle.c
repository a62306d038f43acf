/* SPDX-License-Identifier: MIT */
/* The library's lifecycle, one scenario per process: fork with entries
 * pending (the child refuses every call and never frees what the parent
 * owns), process exit (drains what completes, never hangs, counts what is
 * left), exit from another thread or from a callback (calls after
 * shutdown: t/after_shutdown.c).
 *
 * Each scenario runs in a fresh image of this program (fork, then exec with
 * "--scenario NAME"), so that a process calling exit() runs only cudefer's
 * and the fake's exit handlers, never the TAP trailer of the parent. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

/* ---- workers: processes forked by a scenario ------------------------------ */

struct worker {
    bool ended;      /* within the time limit (else killed) */
    int status;      /* waitpid status */
    double ms;       /* how long it ran */
    char err[16384]; /* what it wrote to stderr */
};

/* A worker is a fork child of a process whose other threads (the reclaimer,
 * a churning thread) vanish in the fork: what they held only on their
 * stacks looks leaked to LeakSanitizer, which says so itself ("False leaks
 * are possible").  Its exit check is skipped in workers (this is the hook
 * LeakSanitizer asks, when the program is built with it). */
static bool in_worker;
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
    return in_worker;
}

/* Fork a worker that runs fn with its stderr going to a pipe read here; fn
 * exits the process itself or returns its number of failed checks.  Waits
 * at most timeout_ms for it. */
static void run_worker(int (*fn)(void), unsigned timeout_ms, struct worker *w)
{
    int fds[2];
    if (pipe(fds) != 0)
        sysbail("pipe");
    double t0 = now_ms(), deadline = t0 + timeout_ms;
    pid_t pid = fork_flushed();
    if (pid == 0) {
        in_worker = true;
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        failed_checks = 0;
        child_end(fn());
    }
    close(fds[1]);
    read_until(fds[0], deadline, w->err, sizeof w->err);
    close(fds[0]);
    double left = deadline - now_ms();
    w->ended = wait_child(pid, left > 0 ? left : 0, &w->status);
    w->ms = now_ms() - t0;
}

/* Check that the worker ended in time with status 0; otherwise say how it
 * ended and show its stderr. */
static bool worker_ok(const struct worker *w, const char *what)
{
    bool good = w->ended && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
    if (!w->ended)
        CHECK(false, "%s: no end after %.0f ms: killed", what, w->ms);
    else if (WIFSIGNALED(w->status))
        CHECK(false, "%s: killed by signal %d", what, WTERMSIG(w->status));
    else if (WEXITSTATUS(w->status) != 0)
        CHECK(false, "%s: exit status %d", what, WEXITSTATUS(w->status));
    if (!good && w->err[0] != '\0')
        diag("  its stderr:\n%s", w->err);
    return good;
}

/* The value of a counter on the "cudefer: stats:" line of text; -1 if there
 * is no such line or counter. */
static long long stat_field(const char *text, const char *name)
{
    const char *line = strstr(text, "cudefer: stats:");
    if (line == NULL)
        return -1;
    const char *end = strchr(line, '\n');
    size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
    char buf[2048], key[64];
    if (len >= sizeof buf)
        len = sizeof buf - 1;
    memcpy(buf, line, len);
    buf[len] = '\0';
    snprintf(key, sizeof key, " %s ", name);
    const char *at = strstr(buf, key);
    if (at == NULL)
        return -1;
    return strtoll(at + strlen(key), NULL, 10);
}

/* Check the counters of the worker's stats line. */
#define CHECK_STAT(w, name, want)                                              \
    CHECK(stat_field((w)->err, name) == (want),                                \
          "stats line: %s %lld, want %lld", name, stat_field((w)->err, name),  \
          (long long)(want))

/* ---- 1. fork with entries pending ----------------------------------------- */

static cudaStream_t fk_s;
static void *fk_p;
static int fk_cb_ran;

static void fk_cb(void *arg)
{
    (void)arg;
    fk_cb_ran = 1;
}

/* In the fork child: every call is refused, nothing is freed. */
static int child_after_fork(void)
{
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 1,
          "the entry pending at fork is abandoned in the child (pending %llu, "
          "failed %llu)", ULL(st.pending), ULL(st.failed));
    void *q = device_alloc(64), *h = host_alloc(64);
    cudaError_t err = defer_free(q, fk_s);
    CHECK(err == cudaErrorNotPermitted, "defer_free in the child: %s",
          cudaGetErrorName(err));
    err = defer_free_host(h, fk_s);
    CHECK(err == cudaErrorNotPermitted, "defer_free_host in the child: %s",
          cudaGetErrorName(err));
    void *both[2] = {q, h};
    err = defer_free_n(both, 2, fk_s);
    CHECK(err == cudaErrorNotPermitted, "defer_free_n in the child: %s",
          cudaGetErrorName(err));
    err = defer_call(fk_cb, NULL, fk_s);
    CHECK(err == cudaErrorNotPermitted, "defer_call in the child: %s",
          cudaGetErrorName(err));
    err = defer_flush();
    CHECK(err == cudaErrorNotPermitted, "defer_flush in the child: %s",
          cudaGetErrorName(err));
    size_t bytes = 99;
    err = defer_trim(&bytes);
    CHECK(err == cudaErrorNotPermitted && bytes == 0,
          "defer_trim in the child: %s, %zu bytes", cudaGetErrorName(err), bytes);
    /* PyTorch's entry points, on the legacy stream, where they would make
     * the device current: refused before any CUDA call (the child cannot
     * use CUDA), not after asking for the current device. */
    unsigned long calls = fake_calls(FAKE_GET_DEVICE) +
                          fake_calls(FAKE_SET_DEVICE) + fake_driver_calls();
    void *got = &got;
    err = defer_pluggable_alloc_status(&got, 4096, 0, NULL);
    CHECK(err == cudaErrorNotPermitted && got == NULL,
          "defer_pluggable_alloc_status in the child: %s",
          cudaGetErrorName(err));
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(4096, 0, NULL);
    const char *said = stderr_capture_end();
    CHECK(none == NULL, "defer_pluggable_alloc in the child: NULL");
    CHECK(has_line(said, "defer_pluggable_alloc called in a forked child: "
                         "refused",
                   "; returning NULL for 4096 bytes on device 0", NULL) &&
              strchr(said, '\n') == strrchr(said, '\n'),
          "said in one line, the NULL too: %s", said);
    defer_pluggable_free(q, 64, 0, NULL);
    calls = fake_calls(FAKE_GET_DEVICE) + fake_calls(FAKE_SET_DEVICE) +
            fake_driver_calls() - calls;
    CHECK(calls == 0, "no CUDA call before their refusals (%lu)", calls);
    err = defer_shutdown();
    diag("  in the fork child, defer_shutdown returns %s", cudaGetErrorName(err));
    sleep_ms(20);
    CHECK(fake_is_released(q) == 0 && fake_is_released(h) == 0,
          "the refused pointers stay with the caller");
    CHECK(fake_is_released(fk_p) == 0,
          "the entry pending at fork is never freed in the child");
    CHECK(!fk_cb_ran, "the refused callback never runs");
    long v = fake_violations();
    CHECK(v == 0, "oracle in the child: %ld violation(s)", v);
    return failed_checks;
}

static int s_fork_pending(void)
{
    fk_s = stream_new();
    fk_p = device_alloc(4096);
    fake_work *w = work_held(fk_s, fk_p);
    CHECK(defer_free(fk_p, fk_s) == cudaSuccess, "defer_free");
    sleep_ms(10); /* the reclaimer takes it in */
    struct worker wk;
    run_worker(child_after_fork, 10000, &wk);
    worker_ok(&wk, "the fork child");
    CHECK(has_line(wk.err, "defer_free ", "fork", NULL),
          "the child's refused defer_free names the fork; stderr:\n%s", wk.err);
    CHECK(has_line(wk.err, "defer_flush", "fork", NULL),
          "the child's refused defer_flush names the fork");
    CHECK(fake_is_released(fk_p) == 0, "still pending in the parent");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush in the parent");
    CHECK(fake_is_released(fk_p) == 1, "released by the parent");
    void *r = device_alloc(64);
    work_timed(fk_s, 0, r);
    CHECK(defer_free(r, fk_s) == cudaSuccess, "the parent defers after the fork");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(r) == 1,
          "and releases");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    return failed_checks;
}

/* ---- 2. fork, then exit in the child -------------------------------------- */

static int child_exit(void)
{
    exit(0);
}

static int child_refused_then_exit(void)
{
    void *q = device_alloc(64);
    if (defer_free(q, fk_s) != cudaErrorNotPermitted) {
        fprintf(stderr, "worker: defer_free was not refused\n");
        exit(3);
    }
    exit(0);
}

static int churn_stop;

/* Keep the reclaimer busy while the scenario forks. */
static void *churn(void *unused)
{
    (void)unused;
    cudaStream_t s = stream_new();
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < 20; i++) {
            void *p = device_alloc(64);
            work_timed(s, 20, p);
            if (defer_free(p, s) != cudaSuccess)
                CHECK(false, "churn: defer_free refused");
        }
        sleep_ms(1);
    }
    return NULL;
}

static int s_fork_exit(void)
{
    fk_s = stream_new();
    fk_p = device_alloc(4096);
    fake_work *w = work_held(fk_s, fk_p);
    CHECK(defer_free(fk_p, fk_s) == cudaSuccess, "defer_free");
    sleep_ms(10);
    struct worker wk;
    run_worker(child_exit, 10000, &wk);
    worker_ok(&wk, "a fork child calling exit(0)");
    diag("  fork child's exit took %.1f ms", wk.ms);
    run_worker(child_refused_then_exit, 10000, &wk);
    worker_ok(&wk, "a fork child refused a defer_free, then exit(0)");

    /* Fork while the reclaimer (and a launching thread) are busy. */
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    for (int i = 0; i < 20; i++) {
        run_worker(i % 2 ? child_exit : child_refused_then_exit, 10000, &wk);
        if (!worker_ok(&wk, "a fork child of a busy process, exit(0)")) {
            diag("  (fork #%d)", i);
            break;
        }
        sleep_ms(2);
    }
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);

    CHECK(fake_is_released(fk_p) == 0, "still pending in the parent");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush in the parent");
    CHECK(fake_is_released(fk_p) == 1, "released by the parent");
    CHECK(fake_live_allocations() == 0, "no allocation left in the parent "
          "(%zu)", fake_live_allocations());
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    return failed_checks;
}

/* ---- 3. exit drains what completes ---------------------------------------- */

static void say_live_allocations(void)
{
    fprintf(stderr, "worker: live allocations at exit: %zu\n",
            fake_live_allocations());
}

static void note_callback(void *arg)
{
    (void)arg;
    fprintf(stderr, "worker: callback ran\n");
}

static int worker_exit_drains(void)
{
    /* Registered before cudefer starts: runs after cudefer's handler. */
    atexit(say_live_allocations);
    cudaStream_t s = stream_new();
    for (int i = 0; i < 5; i++) {
        void *p = device_alloc(4096);
        work_timed(s, 10000, p); /* one after the other: 10 ms .. 50 ms */
        if (defer_free(p, s) != cudaSuccess)
            fprintf(stderr, "worker: defer_free refused\n");
    }
    void *h = host_alloc(4096);
    work_timed(s, 1000, h);
    if (defer_free_host(h, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_free_host refused\n");
    if (defer_call(note_callback, NULL, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_call refused\n");
    exit(0);
}

static int s_exit_drains(void)
{
    struct worker wk;
    run_worker(worker_exit_drains, 10000, &wk);
    worker_ok(&wk, "exit(0) with 7 entries pending");
    diag("  exit took %.1f ms", wk.ms);
    CHECK(stat_field(wk.err, "deferred") >= 0, "a stats line is printed at "
          "exit; stderr:\n%s", wk.err);
    CHECK_STAT(&wk, "deferred", 7);
    CHECK_STAT(&wk, "released", 7);
    CHECK_STAT(&wk, "pending", 0);
    CHECK_STAT(&wk, "failed", 0);
    CHECK_STAT(&wk, "leaked_at_exit", 0);
    CHECK(strstr(wk.err, "worker: callback ran") != NULL,
          "the callback ran before the process ended");
    CHECK(strstr(wk.err, "worker: live allocations at exit: 0") != NULL,
          "every buffer was released at exit");
    CHECK(!has_line(wk.err, "pending", NULL, "cudefer: stats:"),
          "no message about entries left pending");
    return failed_checks;
}

/* ---- 4. exit with work that never completes ------------------------------- */

static void *stuck_p, *done_q;

static void say_stuck(void)
{
    fprintf(stderr, "worker: completed %d, stuck %d\n",
            fake_is_released(done_q), fake_is_released(stuck_p));
}

static int worker_exit_stuck(void)
{
    atexit(say_stuck);
    cudaStream_t s1 = stream_new(), s2 = stream_new();
    stuck_p = device_alloc(4096);
    work_held(s1, stuck_p); /* never completed */
    if (defer_free(stuck_p, s1) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    done_q = device_alloc(4096);
    work_timed(s2, 1000, done_q);
    if (defer_free(done_q, s2) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    exit(0);
}

static int s_exit_stuck(void)
{
    struct worker wk;
    run_worker(worker_exit_stuck, 10000, &wk);
    worker_ok(&wk, "exit(0) with work that never completes");
    diag("  exit took %.1f ms", wk.ms);
    CHECK(has_line(wk.err, "cudefer: ", "pending", "cudefer: stats:"),
          "a message about the entry left pending; stderr:\n%s", wk.err);
    CHECK_STAT(&wk, "leaked_at_exit", 1);
    CHECK_STAT(&wk, "released", 1);
    /* Abandoned: counted in failed, as a fork child counts them (pending
     * 1, failed 0 before). */
    CHECK_STAT(&wk, "failed", 1);
    CHECK_STAT(&wk, "pending", 0);
    CHECK(strstr(wk.err, "worker: completed 1, stuck 0") != NULL,
          "the completed buffer was released, the stuck one was not");
    return failed_checks;
}

/* Exit with work that completes only after the drain gave up: the entry
 * is counted as failed (leaked) and is then never released, so the counts
 * still add up once it completes (the reclaimer, left running, must not
 * release it all the same: released 1 and failed 1 of 1 deferred). */
static void say_stats_later(void)
{
    sleep_ms(1500); /* the work completes 500 ms after the drain ended */
    struct defer_stats st;
    defer_stats_get(&st);
    fprintf(stderr, "worker: later: deferred %llu released %llu failed %llu "
            "freed %d\n", ULL(st.deferred), ULL(st.released),
            ULL(st.failed), fake_is_released(stuck_p));
}

static int worker_exit_late(void)
{
    atexit(say_stats_later);
    cudaStream_t s = stream_new();
    stuck_p = device_alloc(4096);
    work_timed(s, 2500000, stuck_p); /* the drain gives up after 2 s */
    if (defer_free(stuck_p, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    exit(0);
}

static int s_exit_late(void)
{
    struct worker wk;
    run_worker(worker_exit_late, 10000, &wk);
    worker_ok(&wk, "exit(0) with work that completes after the drain");
    CHECK_STAT(&wk, "leaked_at_exit", 1);
    CHECK_STAT(&wk, "failed", 1);
    const char *later = strstr(wk.err, "worker: later:");
    static const char want[] = "worker: later: deferred 1 released 0 "
                               "failed 1 freed 0\n";
    CHECK(later != NULL && strncmp(later, want, sizeof want - 1) == 0,
          "the leaked entry is never released, its counts add up: %s",
          later != NULL ? later : wk.err);
    return failed_checks;
}

/* ---- 5. exit from another thread, exit from a callback -------------------- */

static void *exit_from_thread(void *unused)
{
    (void)unused;
    sleep_ms(20);
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    work_timed(s, 5000, p);
    if (defer_free(p, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    exit(0);
}

static int worker_exit_other_thread(void)
{
    atexit(say_live_allocations);
    cudaStream_t s = stream_new();
    for (int i = 0; i < 3; i++) {
        void *p = device_alloc(64);
        work_timed(s, 5000, p);
        if (defer_free(p, s) != cudaSuccess)
            fprintf(stderr, "worker: defer_free refused\n");
    }
    pthread_t t;
    pthread_create(&t, NULL, exit_from_thread, NULL);
    pthread_join(t, NULL); /* blocked: the other thread ends the process */
    fprintf(stderr, "worker: pthread_join returned\n");
    return 1;
}

static int s_exit_other_thread(void)
{
    struct worker wk;
    run_worker(worker_exit_other_thread, 10000, &wk);
    worker_ok(&wk, "exit(0) from a second thread, main thread in pthread_join");
    CHECK_STAT(&wk, "deferred", 4);
    CHECK_STAT(&wk, "released", 4);
    CHECK_STAT(&wk, "leaked_at_exit", 0);
    CHECK(strstr(wk.err, "worker: live allocations at exit: 0") != NULL,
          "every buffer was released at exit; stderr:\n%s", wk.err);
    return failed_checks;
}

static void *exit_later(void *unused)
{
    (void)unused;
    sleep_ms(50);
    exit(0);
}

/* The main thread waits inside the library (a flush, or a synchronous
 * defer_free under CUDEFER_DISABLE) for work that never completes. */
static int worker_exit_while_blocked(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    work_held(s, p);
    pthread_t t;
    const char *disable = getenv("CUDEFER_DISABLE");
    if (disable != NULL && strcmp(disable, "1") == 0) {
        pthread_create(&t, NULL, exit_later, NULL);
        defer_free(p, s); /* waits for the stream */
    } else {
        if (defer_free(p, s) != cudaSuccess)
            fprintf(stderr, "worker: defer_free refused\n");
        pthread_create(&t, NULL, exit_later, NULL);
        defer_flush();
    }
    fprintf(stderr, "worker: the blocked call returned\n");
    sleep_ms(60000); /* the worker is killed long before */
    return 1;
}

static int s_exit_while_flush_blocked(void)
{
    struct worker wk;
    run_worker(worker_exit_while_blocked, 10000, &wk);
    worker_ok(&wk, "exit(0) from a second thread, main thread in defer_flush "
              "on work that never completes");
    diag("  exit took %.1f ms", wk.ms);
    CHECK(stat_field(wk.err, "leaked_at_exit") == 1,
          "stats line: leaked_at_exit %lld, want 1; stderr:\n%s",
          stat_field(wk.err, "leaked_at_exit"), wk.err);
    return failed_checks;
}

static int s_exit_while_sync_blocked(void)
{
    struct worker wk;
    run_worker(worker_exit_while_blocked, 10000, &wk);
    worker_ok(&wk, "exit(0) from a second thread, main thread in a "
              "synchronous defer_free (CUDEFER_DISABLE) on work that never "
              "completes");
    diag("  exit took %.1f ms", wk.ms);
    return failed_checks;
}

static void exit_in_callback(void *arg)
{
    (void)arg;
    exit(0);
}

static int worker_exit_in_callback(void)
{
    atexit(say_live_allocations);
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = device_alloc(64);
    work_timed(s, 1000, p);
    if (defer_free(p, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    /* Another entry, still pending when the callback exits. */
    void *q = device_alloc(64);
    work_held(s2, q);
    if (defer_free(q, s2) != cudaSuccess)
        fprintf(stderr, "worker: defer_free refused\n");
    work_timed(s, 1000, NULL);
    if (defer_call(exit_in_callback, NULL, s) != cudaSuccess)
        fprintf(stderr, "worker: defer_call refused\n");
    defer_flush(); /* the callback ends the process meanwhile */
    fprintf(stderr, "worker: defer_flush returned\n");
    sleep_ms(60000); /* the worker is killed long before */
    return 1;
}

static int s_exit_in_callback(void)
{
    struct worker wk;
    run_worker(worker_exit_in_callback, 10000, &wk);
    worker_ok(&wk, "exit(0) inside a defer_call callback, main thread in "
              "defer_flush");
    diag("  exit took %.1f ms", wk.ms);
    /* On the reclaimer thread, exit must not wait for the reclaimer (itself)
     * to drain: that could only end at the drain limit. */
    CHECK(wk.ms < 1800, "exit from the callback took %.0f ms: it waited for "
          "itself", wk.ms);
    CHECK(stat_field(wk.err, "deferred") == 3,
          "stats line: deferred %lld, want 3; stderr:\n%s",
          stat_field(wk.err, "deferred"), wk.err);
    return failed_checks;
}

/* ---- the runner ----------------------------------------------------------- */

static const struct scenario {
    const char *key, *title, *env;
    int (*fn)(void);
} scenarios[] = {
    {"fork-pending", "fork with an entry pending: the child refuses, frees "
     "nothing; the parent releases it once", "", s_fork_pending},
    {"fork-exit", "fork, then exit(0) in the child: no hang, status 0",
     "CUDEFER_STATS=1", s_fork_exit},
    {"exit-drains", "exit with entries pending: drained, stats printed",
     "CUDEFER_STATS=1", s_exit_drains},
    {"exit-stuck", "exit with work that never completes: gives up, counts "
     "the leak", "CUDEFER_STATS=1", s_exit_stuck},
    {"exit-late", "exit with work that completes after the drain: left "
     "unreleased, counted once", "CUDEFER_STATS=1", s_exit_late},
    {"exit-other-thread", "exit from a second thread while main is blocked",
     "CUDEFER_STATS=1", s_exit_other_thread},
    {"exit-while-flushing", "exit from a second thread while main waits in "
     "defer_flush for work that never completes", "CUDEFER_STATS=1",
     s_exit_while_flush_blocked},
    {"exit-while-sync", "exit from a second thread while main waits in a "
     "synchronous defer_free for work that never completes",
     "CUDEFER_DISABLE=1", s_exit_while_sync_blocked},
    {"exit-in-callback", "exit inside a defer_call callback",
     "CUDEFER_STATS=1", s_exit_in_callback},
};
#define NSCENARIOS (sizeof scenarios / sizeof *scenarios)

#define SCENARIO_TIMEOUT_MS 30000

/* In the scenario's own process image. */
static int run_scenario(const char *key)
{
    for (size_t i = 0; i < NSCENARIOS; i++) {
        if (strcmp(scenarios[i].key, key) != 0)
            continue;
        fake_reset(1);
        failed_checks = 0;
        scenarios[i].fn();
        scenario_child_end();
    }
    diag("no scenario %s", key);
    _exit(100);
}

static void scenario(const char *argv0, const struct scenario *sc)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(sc->env);
        execl("/proc/self/exe", argv0, "--scenario", sc->key, (char *)NULL);
        printf("# exec /proc/self/exe: %s\n", strerror(errno));
        fflush(stdout);
        _exit(101);
    }
    int status = 0;
    bool ended = wait_child(pid, SCENARIO_TIMEOUT_MS, &status);
    if (!ended)
        diag("%s: no end after %d s: killed", sc->key,
             SCENARIO_TIMEOUT_MS / 1000);
    else if (WIFSIGNALED(status))
        diag("%s: killed by signal %d", sc->key, WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        diag("%s: exit status %d", sc->key, WEXITSTATUS(status));
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s [%s]",
       sc->title, *sc->env != '\0' ? sc->env : "defaults");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--scenario") == 0)
        return run_scenario(argv[2]);
    plan_lazy();
    for (size_t i = 0; i < NSCENARIOS; i++)
        scenario(argv[0], &scenarios[i]);
    return 0;
}
