/* SPDX-License-Identifier: MIT */
/* What the release policy's tests share (t/policy.c, t/policy_cap.c): a
 * scenario in a process of its own (the configuration is read once per
 * process), a stream kept busy, buffers deferred behind quick work. */
#ifndef CUDEFER_T_POLICY_TEST_H
#define CUDEFER_T_POLICY_TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/wait.h>

#include "helpers.h"

/* ---- scenario runner ------------------------------------------------------ */

/* Poll cond every millisecond, for at most ms milliseconds. */
#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

#define SCENARIO_TIMEOUT_MS 20000

/* Run fn in a child process with the CUDEFER_* settings of env; the child
 * shuts cudefer down (fn must leave no work held), checks the oracle and
 * exits with its number of failed checks. */
static inline void scenario(const char *name, const char *env, int (*fn)(void))
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(env);
        fake_reset(1);
        failed_checks = 0;
        fn();
        cudaError_t err = defer_shutdown();
        CHECK(err == cudaSuccess, "defer_shutdown at the end: %s",
              cudaGetErrorName(err));
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, SCENARIO_TIMEOUT_MS, &status);
    if (!ended)
        diag("%s: no end after %d s: killed", name, SCENARIO_TIMEOUT_MS / 1000);
    else if (WIFSIGNALED(status))
        diag("%s: killed by signal %d", name, WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        diag("%s: %d check(s) failed", name, WEXITSTATUS(status));
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s [%s]", name,
       env != NULL && *env != '\0' ? env : "defaults");
}

/* ---- helpers -------------------------------------------------------------- */

/* A stream kept busy: an entry deferred behind work that completes only at
 * busy_end, so the reclaimer always has work pending until then. */
struct busy {
    cudaStream_t s;
    void *p;
    fake_work *w;
};

static inline struct busy busy_begin(void)
{
    struct busy b;
    b.s = stream_new();
    b.p = device_alloc(512);
    b.w = work_held(b.s, b.p);
    cudaError_t err = defer_free(b.p, b.s);
    CHECK(err == cudaSuccess, "defer_free of the busy stream's buffer: %s",
          cudaGetErrorName(err));
    return b;
}

static inline void busy_end(struct busy *b)
{
    fake_complete(b->w);
}

/* n buffers of size bytes on s, each used by work that completes at once,
 * each deferred. */
static inline void defer_fast(cudaStream_t s, void **p, int n, size_t size)
{
    for (int i = 0; i < n; i++) {
        p[i] = device_alloc(size);
        work_timed(s, 0, p[i]);
        cudaError_t err = defer_free(p[i], s);
        CHECK(err == cudaSuccess, "defer_free #%d: %s", i, cudaGetErrorName(err));
    }
}

/* As count_released, by the allocations' serials: right under
 * FAKE_ADDRESS_REUSE, where a buffer released during the test gives its
 * address to a later one. */
static inline int count_serials_released(const unsigned long long *serial, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += fake_serial_released(serial[i]) == 1;
    return k;
}

#endif
