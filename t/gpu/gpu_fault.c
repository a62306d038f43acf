/* SPDX-License-Identifier: MIT */
/*
 * gpu_fault.c: a kernel fault (an illegal address) while entries are pending.
 *
 * A sticky error ends the CUDA context for the rest of the process, so the
 * fault happens in a child process, forked before the parent touches CUDA
 * (the parent never does).  The child:
 *  - starts the reclaimer (one buffer deferred and flushed);
 *  - defers 16 buffers on a second stream behind a 3 s kernel;
 *  - defers 16 buffers behind a 200 ms kernel, launches a kernel that writes
 *    to an invalid address on the same stream, defers 16 more buffers and a
 *    callback behind it;
 *  - calls defer_flush, a second defer_flush and a defer_free, prints what
 *    they returned and the statistics on stdout, and exits with exit(0).
 * The parent captures the child's stdout and stderr separately (killing the
 * child after 60 s) and checks that the flush returned the device's error
 * within 5 s; that cudefer reported it on stderr exactly once (one
 * "reclaimer: device 0: ... failed" line, and no other line naming the
 * error but the refusals of later defer calls); that later calls return an
 * error; that nothing deferred after the fault was released or run; that
 * nothing was left pending; and that the child exited with status 0 within
 * 20 s.
 * Without a CUDA device the whole test is skipped.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
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

#define NO_DEVICE 3           /* the child's exit status: no CUDA device */
#define SETUP_FAILED 2        /* the child's exit status: setup failed */
#define CHILD_LIMIT_MS 60000  /* the child is killed after this */
#define CHILD_TOTAL_MS 20000  /* the child must have exited within this */
#define FLUSH_LIMIT_MS 5000   /* defer_flush must have returned within this */
#define N 16                  /* buffers in each group */
#define BUF_BYTES ((size_t)1 << 20)
#define MS_NS 1000000ull

/* The line cudefer writes when the reclaimer finds a device failed. */
#define FAILED_LINE "cudefer: reclaimer: device 0: "

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- the child ------------------------------------------------------------ */

#define CHILD_CHECK(call) child_check((call), #call, __LINE__)

static void child_check(cudaError_t err, const char *what, int line)
{
    if (err == cudaSuccess)
        return;
    printf("fault-child: setup failed at line %d: %s: %s (%s)\n", line, what,
           cudaGetErrorString(err), cudaGetErrorName(err));
    fflush(stdout);
    _exit(SETUP_FAILED);
}

static atomic_int callback_ran;

static void mark_ran(void *arg)
{
    (void)arg;
    atomic_store(&callback_ran, 1);
}

static void print_error(const char *key, cudaError_t err)
{
    printf("fault-child: %s=%d\n", key, (int)err);
    printf("fault-child: %s_name=%s\n", key, cudaGetErrorName(err));
}

static void fault_child(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        _exit(NO_DEVICE);

    cudaStream_t s, busy;
    void *warm, *later, *stuck[N], *before[N], *after[N];
    CHILD_CHECK(cudaSetDevice(0));
    CHILD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHILD_CHECK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
    CHILD_CHECK(cudaMalloc(&warm, BUF_BYTES));
    CHILD_CHECK(cudaMalloc(&later, BUF_BYTES));
    for (int i = 0; i < N; i++) {
        CHILD_CHECK(cudaMalloc(&stuck[i], BUF_BYTES));
        CHILD_CHECK(cudaMalloc(&before[i], BUF_BYTES));
        CHILD_CHECK(cudaMalloc(&after[i], BUF_BYTES));
    }
    /* Load the kernels, start the reclaimer. */
    CHILD_CHECK(gpu_spin(s, 1000));
    CHILD_CHECK(cudaStreamSynchronize(s));
    CHILD_CHECK(defer_free(warm, s));
    CHILD_CHECK(defer_flush());
    printf("fault-child: warm-up done\n");
    fflush(stdout);

    struct defer_stats st0, st1;
    defer_stats_get(&st0);

    int ok_stuck = 0, ok_before = 0, ok_after = 0;
    CHILD_CHECK(gpu_spin(busy, 3000 * MS_NS));
    for (int i = 0; i < N; i++)
        ok_stuck += defer_free(stuck[i], busy) == cudaSuccess;
    CHILD_CHECK(gpu_spin(s, 200 * MS_NS));
    for (int i = 0; i < N; i++)
        ok_before += defer_free(before[i], s) == cudaSuccess;
    cudaError_t launch = gpu_fault_illegal_address(s);
    for (int i = 0; i < N; i++)
        ok_after += defer_free(after[i], s) == cudaSuccess;
    cudaError_t call = defer_call(mark_ran, NULL, s);

    double t0 = now_ms();
    cudaError_t flush = defer_flush();
    double flush_ms = now_ms() - t0;
    defer_stats_get(&st1);
    cudaError_t later_free = defer_free(later, s);
    cudaError_t flush2 = defer_flush();
    cudaError_t sync = cudaDeviceSynchronize();

    printf("fault-child: ok_stuck=%d\n", ok_stuck);
    printf("fault-child: ok_before=%d\n", ok_before);
    printf("fault-child: ok_after=%d\n", ok_after);
    print_error("launch", launch);
    print_error("call", call);
    print_error("flush", flush);
    printf("fault-child: flush_ms=%.0f\n", flush_ms);
    print_error("later_free", later_free);
    print_error("flush2", flush2);
    print_error("sync", sync);
    printf("fault-child: callback_ran=%d\n", atomic_load(&callback_ran));
    printf("fault-child: deferred=%llu\n",
           (unsigned long long)(st1.deferred - st0.deferred));
    printf("fault-child: released=%llu\n",
           (unsigned long long)(st1.released - st0.released));
    printf("fault-child: failed=%llu\n",
           (unsigned long long)(st1.failed - st0.failed));
    printf("fault-child: pending=%llu\n", (unsigned long long)st1.pending);
    printf("fault-child: done\n");
    fflush(stdout);
    exit(0); /* cudefer's exit handler runs */
}

/* ---- the parent ----------------------------------------------------------- */

struct child_run {
    int status;      /* exit status; -1: killed by a signal */
    int signal;      /* the signal, if so */
    int timed_out;   /* killed by us after CHILD_LIMIT_MS */
    double ms;       /* fork to exit */
    char out[16384]; /* its stdout (truncated) */
    char err[16384]; /* its stderr (truncated) */
};

/* Read what fd has into buf (keeping at most len - 1 bytes); returns 0 at
 * end of file. */
static int drain(int fd, char *buf, size_t len, size_t *used)
{
    char scratch[4096];
    ssize_t got;
    do {
        if (*used + 1 < len)
            got = read(fd, buf + *used, len - 1 - *used);
        else
            got = read(fd, scratch, sizeof scratch);
    } while (got < 0 && errno == EINTR);
    if (got <= 0)
        return 0;
    if (*used + 1 < len)
        *used += (size_t)got;
    buf[*used] = '\0';
    return 1;
}

/* Run fn in a child, its stdout and stderr captured apart; kill it after
 * CHILD_LIMIT_MS. */
static void run_child(void (*fn)(void), struct child_run *run)
{
    int outp[2], errp[2];
    if (pipe(outp) != 0 || pipe(errp) != 0)
        sysbail("pipe");
    fflush(stdout);
    fflush(stderr);
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid < 0)
        sysbail("fork");
    if (pid == 0) {
        close(outp[0]);
        close(errp[0]);
        dup2(outp[1], STDOUT_FILENO);
        dup2(errp[1], STDERR_FILENO);
        close(outp[1]);
        close(errp[1]);
        fn();
        _exit(0);
    }
    close(outp[1]);
    close(errp[1]);
    memset(run, 0, sizeof *run);
    size_t used_out = 0, used_err = 0;
    struct pollfd fds[2] = {{.fd = outp[0], .events = POLLIN},
                            {.fd = errp[0], .events = POLLIN}};
    double killed_at = 0;
    while (fds[0].fd >= 0 || fds[1].fd >= 0) {
        double now = now_ms();
        if (!run->timed_out && now - t0 >= CHILD_LIMIT_MS) {
            kill(pid, SIGKILL);
            run->timed_out = 1;
            killed_at = now;
        }
        if (run->timed_out && now - killed_at > 5000)
            break; /* something else holds the pipes: stop reading */
        int rc = poll(fds, 2, 200);
        if (rc < 0 && errno != EINTR)
            sysbail("poll");
        for (int i = 0; i < 2 && rc > 0; i++) {
            if (fds[i].fd < 0 || fds[i].revents == 0)
                continue;
            int more = i == 0 ? drain(fds[i].fd, run->out, sizeof run->out,
                                      &used_out)
                              : drain(fds[i].fd, run->err, sizeof run->err,
                                      &used_err);
            if (!more) {
                close(fds[i].fd);
                fds[i].fd = -1;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            sysbail("waitpid");
    run->ms = now_ms() - t0;
    if (WIFEXITED(status)) {
        run->status = WEXITSTATUS(status);
    } else {
        run->status = -1;
        run->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
}

/* The value the child printed as "fault-child: key=value", or dflt. */
static long long child_int(const char *out, const char *key, long long dflt)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "fault-child: %s=", key);
    const char *p = strstr(out, pattern);
    return p != NULL ? strtoll(p + strlen(pattern), NULL, 10) : dflt;
}

/* The same for a word (an error name); "" when absent. */
static void child_word(const char *out, const char *key, char *word,
                       size_t len)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "fault-child: %s=", key);
    const char *p = strstr(out, pattern);
    size_t n = 0;
    if (p != NULL) {
        p += strlen(pattern);
        while (n + 1 < len && p[n] != '\0' && p[n] != '\n')
            n++;
        memcpy(word, p, n);
    }
    word[n] = '\0';
}

/* Lines of text that start with prefix, do not start with unless (if not
 * NULL) and contain needle. */
static int count_lines(const char *text, const char *prefix,
                       const char *unless, const char *needle)
{
    int n = 0;
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char copy[1024];
        size_t c = len < sizeof copy - 1 ? len : sizeof copy - 1;
        memcpy(copy, line, c);
        copy[c] = '\0';
        if (strncmp(copy, prefix, strlen(prefix)) == 0 &&
            (unless == NULL || strncmp(copy, unless, strlen(unless)) != 0) &&
            strstr(copy, needle) != NULL)
            n++;
        line += len + (end != NULL);
    }
    return n;
}

int main(void)
{
    static struct child_run run;

    /* The child runs before the plan: its exit() must not run the TAP
     * library's exit handler. */
    gpu_tests_serialize();
    run_child(fault_child, &run);
    if (run.status == NO_DEVICE)
        skip_all("no CUDA device");

    const char *out = run.out;
    char flush_name[128], later_name[128], flush2_name[128];
    child_word(out, "flush_name", flush_name, sizeof flush_name);
    child_word(out, "later_free_name", later_name, sizeof later_name);
    child_word(out, "flush2_name", flush2_name, sizeof flush2_name);
    long long flush = child_int(out, "flush", -1);
    long long flush_ms = child_int(out, "flush_ms", -1);

    plan(18);
    diag("the child's stdout:\n%s", out);
    diag("the child's stderr:\n%s", run.err);
    if (run.status == -1)
        diag("the child ran %.0f ms; killed by signal %d%s", run.ms,
             run.signal, run.timed_out ? " (it hung: we killed it)" : "");
    else
        diag("the child ran %.0f ms; exit status %d", run.ms, run.status);

    ok(!run.timed_out, "the child did not hang (not killed after %d s)",
       CHILD_LIMIT_MS / 1000);
    is_int(run.status, 0, "the child's exit(0) after the fault: exit "
           "status 0");
    ok(run.ms < CHILD_TOTAL_MS, "the child was done within %d s (%.0f ms)",
       CHILD_TOTAL_MS / 1000, run.ms);
    ok(strstr(out, "fault-child: done\n") != NULL,
       "the child reached its end (printed its results)");
    is_int(child_int(out, "ok_stuck", -1) + child_int(out, "ok_before", -1),
           2 * N, "%d defer_free before the fault succeed (%d behind a 3 s "
           "kernel on another stream, %d behind a 200 ms kernel)", 2 * N, N,
           N);
    is_int(child_int(out, "launch", -1), cudaSuccess,
           "the faulting kernel was launched");
    is_int(child_int(out, "ok_after", -1) + (child_int(out, "call", -1) == 0),
           N + 1, "%d defer_free and a defer_call behind it succeed", N);
    ok(flush > 0, "defer_flush returns an error: %s (%lld)", flush_name,
       flush);
    ok(flush == cudaErrorIllegalAddress || flush == cudaErrorLaunchFailure,
       "the error is cudaErrorIllegalAddress or cudaErrorLaunchFailure");
    ok(flush_ms >= 0 && flush_ms < FLUSH_LIMIT_MS,
       "defer_flush returned within %d ms (%lld ms)", FLUSH_LIMIT_MS,
       flush_ms);
    is_int(count_lines(run.err, FAILED_LINE, NULL, " failed: "), 1,
           "stderr has exactly one \"" FAILED_LINE "... failed\" line");
    is_int(count_lines(run.err, FAILED_LINE, NULL, flush_name), 1,
           "that line names the error defer_flush returned (%s)", flush_name);
    /* Refusals of the later defer calls name the error too: each answers
     * its own call.  Nothing else should (e.g. one line per failed
     * cudaFree of a held buffer). */
    is_int(count_lines(run.err, "cudefer: ", "cudefer: defer_",
                       flush_name[0] ? flush_name : "?"), 1,
           "no other cudefer line reports %s again (refusals of later "
           "defer calls aside)", flush_name);
    ok(child_int(out, "later_free", 0) != 0,
       "a later defer_free returns an error: %s", later_name);
    ok(child_int(out, "flush2", 0) != 0,
       "a second defer_flush returns an error: %s", flush2_name);
    is_int(child_int(out, "callback_ran", -1), 0,
           "the callback deferred behind the fault never ran");
    long long failed = child_int(out, "failed", -1);
    long long deferred = child_int(out, "deferred", -1);
    long long released = child_int(out, "released", -1);
    diag("stats after the flush: deferred %lld, released %lld, failed %lld",
         deferred, released, failed);
    /* The other stream's 16 count either way: released where its kernel
     * finished, and its event said so, before any call met the device's
     * error (nothing in cudefer waits for the whole device: Note
     * [Releasing without a drain]); failed where a call met it first.
     * What was deferred behind the fault never counts released. */
    ok(failed >= N + 1 && released <= 2 * N && deferred == released + failed,
       "every entry behind the fault counted failed (at least %d; %lld), at "
       "most the %d before it released (%lld), none lost", N + 1, failed,
       2 * N, released);
    is_int(child_int(out, "pending", -1), 0, "nothing is left pending after "
           "the flush");
    return 0;
}
