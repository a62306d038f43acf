/* SPDX-License-Identifier: MIT */
/*
 * faults_teardown.c — fault injection at shutdown and exit:
 * cudaEventDestroy and cudaStreamDestroy, and every call failing with
 * cudaErrorCudartUnloading while the process exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faults.h"

/* ---- reclaimer: cudaEventDestroy, cudaStreamDestroy ------------------------ */

void s_event_destroy_at_shutdown(const struct scenario *sc)
{
    enum { N = 5 };
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(s, 256, 100);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    CHECK(defer_flush() == cudaSuccess && count_released(p, N) == N,
          "released");
    size_t live = fake_live_events();
    CHECK(live >= 1, "idle events to destroy (%zu)", live);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, sc->count);
    double t0 = now_ms();
    cudaError_t err = defer_shutdown();
    double ms = now_ms() - t0;
    const char *msg = capture_end();
    CHECK(err == cudaSuccess, "defer_shutdown: %s", EN(err));
    CHECK(ms < 10000, "took %.0f ms (a shutdown that hung on the failure would not end)", ms);
    int lines = lines_with(msg, "cudaEventDestroy failed", EN(bad), NULL);
    CHECK(sc->count == ONCE ? lines == 1 : lines >= 1,
          "stderr names cudaEventDestroy and %s (%d lines for %zu events)",
          EN(bad), lines, live);
    stderr_capture_begin();
    err = defer_free(p[0], s);
    capture_end();
    CHECK(err == cudaErrorNotPermitted, "refused after shutdown (%s)", EN(err));
    CHECK_STATS();
}

/* CUDEFER_EVENT_POOL=0: every event given back is destroyed.  A stream's
 * completed events are given back by its next call (stream_lane.h).  The
 * frees wait behind held work, so each finds the stream busy and takes an
 * event of its own however slowly the test runs (on an idle stream a lane
 * records its one event again, and nothing would be given back). */
void s_event_destroy_overflow(const struct scenario *sc)
{
    enum { N = 6 };
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p[N];
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_DESTROY, bad, 0, sc->count);
    fake_work *hold = fake_launch_held(s, NULL, 0);
    for (int i = 0; i < N; i++) {
        p[i] = busy_buffer(s, 256, 100);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
    }
    fake_complete(hold);
    cudaError_t f = defer_flush();
    void *q = busy_buffer(s, 256, 100);
    cudaError_t fq = defer_free(q, s);
    cudaError_t f2 = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    CHECK(f == cudaSuccess && count_released(p, N) == N, "flush %s, released "
          "%d of %d", EN(f), count_released(p, N), N);
    CHECK(fq == cudaSuccess && f2 == cudaSuccess && fake_is_released(q) == 1,
          "a later entry is deferred (%s) and released", EN(fq));
    struct defer_stats st = stats_now();
    CHECK(st.released == N + 1 && st.failed == 0, "released %llu failed %llu",
          ULL(st.released), ULL(st.failed));
    CHECK(fake_calls(FAKE_EVENT_DESTROY) >= 1, "events were destroyed (%lu)",
          fake_calls(FAKE_EVENT_DESTROY));
    int lines = lines_with(msg, "cudaEventDestroy failed", EN(bad), NULL);
    CHECK(sc->count == ONCE ? lines == 1 : lines >= 1,
          "stderr names cudaEventDestroy and %s (%d lines)", EN(bad), lines);
    void *r = busy_buffer(s, 256, 100);
    CHECK(defer_free(r, s) == cudaSuccess, "later entries still get events");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(r) == 1,
          "and are released");
    CHECK_STATS();
}

void s_stream_destroy_at_shutdown(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    cudaStream_t s = stream_new();
    void *p = pool_alloc(s, 4096);
    work_timed(s, 100, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free (pool memory)");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1 &&
              fake_calls(FAKE_FREE_ASYNC) == 1,
          "released with cudaFreeAsync on the reclaimer's stream");
    stderr_capture_begin();
    fake_fail(FAKE_STREAM_DESTROY, bad, 0, sc->count);
    double t0 = now_ms();
    cudaError_t err = defer_shutdown();
    double ms = now_ms() - t0;
    const char *msg = capture_end();
    CHECK(err == cudaSuccess, "defer_shutdown: %s", EN(err));
    CHECK(ms < 10000, "took %.0f ms (a shutdown that hung on the failure would not end)", ms);
    CHECK(fake_calls(FAKE_STREAM_DESTROY) >= 1, "the stream's destruction "
          "was tried");
    CHECK(lines_with(msg, "cudaStreamDestroy failed", EN(bad), NULL) == 1,
          "one line names cudaStreamDestroy and %s", EN(bad));
    CHECK_STATS();
}

/* ---- process exit: cudaErrorCudartUnloading --------------------------------- */

/* Workers: a fresh image of this program ("--exit-worker NAME"), so that
 * exit() runs only cudefer's, the fake's and the worker's exit handlers. */

static void *worker_ptrs[16];
static int worker_nptrs;

static void *worker_note(void *p)
{
    worker_ptrs[worker_nptrs++] = p;
    return p;
}

/* Registered before cudefer starts: runs after cudefer's exit handler. */
static void worker_after_cudefer(void)
{
    fprintf(stderr, "worker: after cudefer's exit handler: %d of %d "
            "released\n", count_released(worker_ptrs, worker_nptrs),
            worker_nptrs);
}

static void worker_defer(int host, void *p, cudaStream_t s)
{
    cudaError_t err = host ? defer_free_host(p, s) : defer_free(p, s);
    if (err != cudaSuccess)
        fprintf(stderr, "worker: defer refused: %s\n", EN(err));
}

static void worker_wait_held(uint64_t n)
{
    WAIT_UNTIL(stats_now().held == n, 10000);
    if (stats_now().held != n)
        fprintf(stderr, "worker: held %llu, want %llu\n",
                ULL(stats_now().held), ULL(n));
}

/* A pool buffer released at once: the reclaimer now has its own stream. */
static void worker_pool_released(cudaStream_t s)
{
    void *p = pool_alloc(s, 4096);
    work_timed(s, 0, p);
    worker_defer(0, p, s);
    if (!wait_released(p, 2000))
        fprintf(stderr, "worker: pool buffer not released\n");
}

static void worker_fail_everything(void)
{
    for (int c = 0; c < FAKE_NCALLS; c++)
        fake_fail((enum fake_call)c, cudaErrorCudartUnloading, 0, ALWAYS);
}

/* Entries pending (work that never completes) and held; every event query
 * at exit says the runtime is unloading; with every_call, every call. */
static _Noreturn void worker_pending(bool every_call)
{
    atexit(worker_after_cudefer);
    cudaStream_t sa = stream_new(), sb = stream_new();
    if (every_call)
        worker_pool_released(sb);
    void *busy = worker_note(device_alloc(512));
    work_held(sa, busy);
    worker_defer(0, busy, sa);
    for (int i = 0; i < 3; i++)
        worker_defer(0, worker_note(busy_buffer(sb, 1024, 0)), sb);
    void *h = worker_note(host_alloc(1024));
    work_timed(sb, 0, h);
    worker_defer(1, h, sb);
    worker_wait_held(4);
    if (every_call)
        worker_fail_everything();
    else
        fake_fail(FAKE_EVENT_QUERY, cudaErrorCudartUnloading, 0, ALWAYS);
    exit(0);
}

/* Only completed entries, held (no quiet-time or age release): the exit
 * drain releases them while every call says the runtime is unloading. */
static _Noreturn void worker_held_only(void)
{
    atexit(worker_after_cudefer);
    cudaStream_t s = stream_new();
    worker_pool_released(s);
    for (int i = 0; i < 3; i++)
        worker_defer(0, worker_note(busy_buffer(s, 1024, 0)), s);
    void *h = worker_note(host_alloc(1024));
    work_timed(s, 0, h);
    worker_defer(1, h, s);
    worker_wait_held(4);
    worker_fail_everything();
    exit(0);
}

int run_exit_worker(const char *name)
{
    fake_reset(1);
    if (strcmp(name, "query") == 0)
        worker_pending(false);
    if (strcmp(name, "pending") == 0)
        worker_pending(true);
    if (strcmp(name, "held") == 0)
        worker_held_only();
    fprintf(stderr, "worker: no worker %s\n", name);
    return 100;
}

struct worker_result {
    bool ended;
    int status;
    double ms;
    char err[16384];
};

/* Fork and exec the worker, its stderr to a pipe read here; at most
 * timeout_ms. */
static void exec_worker(const char *argv0, const char *name, unsigned timeout_ms,
                        struct worker_result *w)
{
    int fds[2];
    if (pipe(fds) != 0)
        sysbail("pipe");
    double t0 = now_ms(), deadline = t0 + timeout_ms;
    pid_t pid = fork_flushed();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        execl("/proc/self/exe", argv0, "--exit-worker", name, (char *)NULL);
        fprintf(stderr, "exec /proc/self/exe: %s\n", strerror(errno));
        _exit(101);
    }
    close(fds[1]);
    read_until(fds[0], deadline, w->err, sizeof w->err);
    close(fds[0]);
    double left = deadline - now_ms();
    w->ended = wait_child(pid, left > 0 ? left : 0, &w->status);
    w->ms = now_ms() - t0;
}

/* The value of counter name on the "cudefer: stats:" line; -1 if none. */
static long long stat_field(const char *text, const char *name)
{
    const char *line = strstr(text, "cudefer: stats:");
    if (line == NULL)
        return -1;
    char key[64];
    snprintf(key, sizeof key, " %s ", name);
    const char *end = strchr(line, '\n');
    const char *at = strstr(line, key);
    if (at == NULL || (end != NULL && at > end))
        return -1;
    return strtoll(at + strlen(key), NULL, 10);
}

const char *faults_argv0;

void s_exit_unloading(const struct scenario *sc)
{
    struct worker_result *w = calloc(1, sizeof *w);
    if (w == NULL)
        sysbail("calloc");
    exec_worker(faults_argv0, sc->variant, EXIT_WORKER_TIMEOUT_MS, w);
    bool good = w->ended && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
    if (!w->ended)
        CHECK(false, "the worker did not end within %d ms: killed",
              EXIT_WORKER_TIMEOUT_MS);
    else if (WIFSIGNALED(w->status))
        CHECK(false, "the worker was killed by signal %d", WTERMSIG(w->status));
    else
        CHECK(good, "the worker's exit status: %d (1: oracle violation)",
              WEXITSTATUS(w->status));
    diag("  exit worker %s ended after %.0f ms; its stderr:\n%s", sc->variant,
         w->ms, w->err);
    CHECK(w->ms < 10000, "the process ended within 10 s (%.0f ms)", w->ms);
    CHECK(strstr(w->err, "worker: after cudefer's exit handler") != NULL,
          "cudefer's exit handler returned");
    CHECK(strstr(w->err, "worker: defer refused") == NULL &&
              strstr(w->err, "worker: held") == NULL &&
              strstr(w->err, "worker: pool buffer") == NULL,
          "the worker's set-up went as planned");
    int lines = lines_with(w->err, NULL, NULL, NULL);
    int stats_lines = lines_with(w->err, "cudefer: stats:", NULL, NULL);
    CHECK(stats_lines == 1, "the statistics are printed (CUDEFER_STATS=1)");
    CHECK(lines == stats_lines, "no other cudefer message: the unloading "
          "runtime is not reported (%d other lines)", lines - stats_lines);
    long long deferred = stat_field(w->err, "deferred"),
              released = stat_field(w->err, "released"),
              failed = stat_field(w->err, "failed"),
              pending = stat_field(w->err, "pending"),
              leaked = stat_field(w->err, "leaked_at_exit");
    CHECK(deferred >= 5 && released + failed + pending == deferred,
          "stats: deferred %lld = released %lld + failed %lld + pending %lld",
          deferred, released, failed, pending);
    CHECK(pending == 0 && leaked == 0, "the drain stopped at once: pending "
          "%lld, leaked_at_exit %lld", pending, leaked);
    free(w);
}
