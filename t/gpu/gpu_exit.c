/* SPDX-License-Identifier: MIT */
/*
 * gpu_exit.c: process exit with entries pending, on a real GPU, and the cost
 * of a defer_free call.
 *
 * Each case runs in a child process (the parent never initializes CUDA, so
 * forking is safe):
 *  - exit() while buffers wait behind a 50 ms kernel: the exit drains them
 *    (CUDEFER_STATS=1 shows them released) and the process exits 0;
 *  - exit() while a buffer waits behind a 10 s kernel: exit gives up after
 *    its drain limit (about 2 s) instead of hanging, and counts the leak
 *    (how long the exit took is not checked under compute-sanitizer, which
 *    itself waits for the running kernel when the process exits:
 *    t/gpu/run-sanitizers.sh names its tool in CUDEFER_TEST_SANITIZER);
 *  - the cost of 20 000 defer_free calls on a busy stream, printed as TAP
 *    diagnostics (a measurement, not a pass/fail timing).
 * Without a CUDA device the whole test is skipped.
 */
#define _GNU_SOURCE

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "tap.h"

#define NO_DEVICE 3 /* a child's exit status: no CUDA device */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Child: exit with n buffers deferred behind a kernel of spin_ms. */
static void exit_with_pending(int n, unsigned spin_ms)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        _exit(NO_DEVICE);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        gpu_spin(s, (uint64_t)spin_ms * 1000000) != cudaSuccess)
        _exit(2);
    for (int i = 0; i < n; i++) {
        void *p;
        if (cudaMalloc(&p, 1 << 20) != cudaSuccess ||
            defer_free(p, s) != cudaSuccess)
            _exit(2);
    }
    exit(0);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Child: time 20 000 defer_free calls on a busy stream; print the result. */
static void call_cost(void)
{
    enum { N = 20000 };
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        _exit(NO_DEVICE);
    static void *bufs[N];
    static double us[N];
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        _exit(2);
    for (int i = 0; i < N; i++)
        if (cudaMalloc(&bufs[i], 256) != cudaSuccess)
            _exit(2);
    defer_free(bufs[0], s); /* starts the reclaimer */
    gpu_spin(s, 500000000ull); /* busy for the whole loop */
    for (int i = 1; i < N; i++) {
        double t0 = now_ms();
        defer_free(bufs[i], s);
        us[i] = (now_ms() - t0) * 1e3;
    }
    qsort(us + 1, N - 1, sizeof *us, compare_doubles);
    printf("defer_free on a busy stream, %d calls: p50 %.2f us, p99 %.2f us, "
           "max %.2f us\n", N - 1, us[N / 2], us[N * 99 / 100], us[N - 1]);
    fflush(stdout);
    cudaStreamSynchronize(s);
    _exit(defer_flush() == cudaSuccess ? 0 : 2);
}

/* Run fn in a child with env set, its stdout+stderr into out; returns the
 * exit status (-1 on a signal or after 30 s), and how long it took. */
static int run_child(void (*fn)(void), const char *env, char *out, size_t len,
                     double *ms)
{
    int pipefd[2];
    if (pipe(pipefd) != 0)
        sysbail("pipe");
    fflush(stdout);
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0)
        sysbail("fork");
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDOUT_FILENO);
        dup2(pipefd[1], STDERR_FILENO);
        if (env != NULL)
            putenv((char *)env);
        alarm(30);
        fn();
        _exit(0);
    }
    close(pipefd[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < len && (got = read(pipefd[0], out + used, len - 1 - used)) > 0)
        used += (size_t)got;
    out[used] = '\0';
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    *ms = now_ms() - t0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void drains(void)
{
    exit_with_pending(64, 50);
}

static void gives_up(void)
{
    exit_with_pending(1, 10000);
}

int main(void)
{
    /* Every child runs before the plan: a child's exit() must not run the
     * TAP library's exit handler. */
    char drained[4096], stuck[4096], cost[4096];
    double drained_ms, stuck_ms, cost_ms;
    gpu_tests_serialize();
    int rc_drained = run_child(drains, "CUDEFER_STATS=1", drained,
                               sizeof drained, &drained_ms);
    if (rc_drained == NO_DEVICE)
        skip_all("no CUDA device");
    int rc_stuck = run_child(gives_up, "CUDEFER_STATS=1", stuck, sizeof stuck,
                             &stuck_ms);
    int rc_cost = run_child(call_cost, NULL, cost, sizeof cost, &cost_ms);

    plan(6);
    diag("%s", drained);
    is_int(rc_drained, 0,
           "exit with 64 buffers behind a 50 ms kernel: exit status 0");
    ok(strstr(drained, "released 64 ") != NULL,
       "exit drained them: the stats line shows 64 released");
    diag("that exit took %.0f ms", drained_ms);
    diag("%s", stuck);
    is_int(rc_stuck, 0, "exit behind a 10 s kernel: exit status 0");
    const char *sanitizer = getenv("CUDEFER_TEST_SANITIZER");
    if (sanitizer != NULL && *sanitizer != '\0')
        skip("under compute-sanitizer %s, which waits for the kernel at "
             "exit itself (%.0f ms)", sanitizer, stuck_ms);
    else
        ok(stuck_ms < 9000, "exit did not wait for the 10 s kernel (%.0f ms)",
           stuck_ms);
    ok(strstr(stuck, "leaked_at_exit 1") != NULL, "and counted the leak");
    diag("%s", cost);
    is_int(rc_cost, 0, "20 000 defer_free calls on a busy stream, then a flush");
    return 0;
}
