/* SPDX-License-Identifier: MIT */
/* A start whose pthread_create fails (cudaErrorOperatingSystem), and what
 * every entry point does after it: the refusal is returned and said in
 * one line (the caller keeps ownership, the next call tries again),
 * nothing is deferred or released, flush and trim have nothing to do,
 * defer_configure is open again, and the next call starts cudefer for
 * good; or a defer_shutdown after it ends cudefer cleanly; or exit() ends
 * the process.  pthread_create is interposed here: while armed, the armed
 * thread's next creations fail with EAGAIN.  A fork child after a failed
 * start: t/fork_first_call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

static _Thread_local int fail_next; /* creations to fail on this thread */

int pthread_create(pthread_t *t, const pthread_attr_t *a,
                   void *(*fn)(void *), void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *,
                       void *(*)(void *), void *);
    if (real == NULL)
        real = (int (*)(pthread_t *, const pthread_attr_t *,
                        void *(*)(void *), void *))dlsym(RTLD_NEXT,
                                                         "pthread_create");
    if (fail_next > 0) {
        fail_next--;
        return EAGAIN;
    }
    return real(t, a, fn, arg);
}

/* Every entry point after a failed start, then a start that works. */
static void entry_points_after_failed_start(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(1 << 20);
    fake_work *w = work_held(s, p);

    fail_next = 1;
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *said = stderr_capture_end();
    CHECK(err == cudaErrorOperatingSystem, "defer_free: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "defer_free: cannot start the reclaimer thread",
                   "nothing was deferred (the caller keeps ownership; the "
                   "next call tries again)", NULL),
          "said in one line, the caller's ownership and the retry too: %s",
          said);
    CHECK(fail_next == 0, "pthread_create was tried");
    struct defer_stats st = stats_now();
    CHECK(st.deferred == 0 && st.pending == 0, "nothing deferred (%llu %llu)",
          ULL(st.deferred), ULL(st.pending));
    CHECK(st.rejected == 1, "one rejected (%llu)", ULL(st.rejected));

    err = defer_flush();
    CHECK(err == cudaSuccess, "defer_flush: %s", cudaGetErrorName(err));
    size_t bytes = 123;
    err = defer_trim(&bytes);
    CHECK(err == cudaSuccess && bytes == 0, "defer_trim: %s %zu",
          cudaGetErrorName(err), bytes);

    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.poll_us = 100;
    err = defer_configure(&cfg);
    CHECK(err == cudaSuccess, "defer_configure open again: %s",
          cudaGetErrorName(err));

    fail_next = 1;
    void *q = (void *)1;
    err = defer_alloc(&q, 4096, s);
    CHECK(err == cudaErrorOperatingSystem && q == NULL, "defer_alloc: %s %p",
          cudaGetErrorName(err), q);
    fail_next = 1;
    err = defer_record_stream(p, s);
    CHECK(err == cudaErrorOperatingSystem, "defer_record_stream: %s",
          cudaGetErrorName(err));
    fail_next = 1;
    err = defer_peer_access(0, 0);
    CHECK(err == cudaErrorOperatingSystem, "defer_peer_access: %s",
          cudaGetErrorName(err));
    fail_next = 1;
    int called = 0;
    err = defer_call_streams(NULL, &called, &s, 1);
    CHECK(err == cudaErrorInvalidValue, "defer_call_streams NULL fn: %s",
          cudaGetErrorName(err));
    fail_next = 1;
    stderr_capture_begin();
    defer_pluggable_free(p, 1 << 20, 0, s);
    said = stderr_capture_end();
    CHECK(!fake_is_released(p), "pluggable free after failed start left p");
    fail_next = 0;
    CHECK(!fake_is_released(p), "p never released while refused");

    /* The next call starts cudefer. */
    err = defer_free(p, s);
    CHECK(err == cudaSuccess, "defer_free now: %s", cudaGetErrorName(err));
    fake_complete(w);
    err = defer_flush();
    CHECK(err == cudaSuccess, "flush: %s", cudaGetErrorName(err));
    CHECK(fake_is_released(p), "released after the flush");
    void *b = NULL;
    err = alloc_checked(&b, 4096, s);
    CHECK(err == cudaSuccess && b != NULL, "defer_alloc: %s",
          cudaGetErrorName(err));
    CHECK(defer_free(b, s) == cudaSuccess, "free the block");
    err = defer_shutdown();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    st = stats_now();
    CHECK(st.pending == 0 && st.failed == 0, "pending %llu failed %llu",
          ULL(st.pending), ULL(st.failed));
}

/* A failed start, then defer_shutdown: success, later calls refused. */
static void shutdown_after_failed_start(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fail_next = 1;
    CHECK(defer_free(p, s) == cudaErrorOperatingSystem, "failed start");
    cudaError_t err = defer_shutdown();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    err = defer_free(p, s);
    CHECK(err == cudaErrorNotPermitted, "free after: %s",
          cudaGetErrorName(err));
    err = defer_flush();
    CHECK(err == cudaErrorNotPermitted, "flush after: %s",
          cudaGetErrorName(err));
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    err = defer_configure(&cfg);
    CHECK(err == cudaErrorNotPermitted, "configure after: %s",
          cudaGetErrorName(err));
    CHECK(defer_shutdown() == cudaSuccess, "second shutdown");
}

/* Several threads fail their start at once, then all succeed. */
static void *hammer(void *arg)
{
    cudaStream_t s = arg;
    fail_next = 1;
    void *p = device_alloc(64);
    cudaError_t err = defer_free(p, s);
    /* Either this thread's start failed, or another thread's start
     * succeeded first (then this thread's creation was never tried). */
    if (err == cudaErrorOperatingSystem) {
        fail_next = 0;
        err = defer_free(p, s);
    }
    fail_next = 0;
    CHECK(err == cudaSuccess, "hammer: %s", cudaGetErrorName(err));
    return NULL;
}

static void concurrent_failed_starts(void)
{
    cudaStream_t s = stream_new();
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, hammer, s);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    CHECK(st.deferred == 8 && st.pending == 0, "deferred %llu pending %llu",
          ULL(st.deferred), ULL(st.pending));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A failed start, then exit(): no hang, exit status kept. */
static void exit_after_failed_start(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        void *p = device_alloc(64);
        fail_next = 1;
        if (defer_free(p, 0) != cudaErrorOperatingSystem)
            _exit(3);
        exit(7);
    }
    int status;
    CHECK(wait_child(pid, 10000, &status), "child ended");
    /* tap's exit handler replaces the status 7 (no tests in that child):
     * an exit, not a signal or a hang, is what is checked. */
    CHECK(WIFEXITED(status), "status %d", status);
}

int main(void)
{
    plan_lazy();
    fork_scenario("exit after a failed start", "", 1, 20000,
                  exit_after_failed_start);
    fork_scenario("entry points after a failed pthread_create", "", 1, 20000,
                  entry_points_after_failed_start);
    fork_scenario("defer_shutdown after a failed start", "", 1, 20000,
                  shutdown_after_failed_start);
    fork_scenario("threads failing their start at once", "", 1, 20000,
                  concurrent_failed_starts);
    return 0;
}
