/* SPDX-License-Identifier: MIT */
/* Helpers for the fake-runtime tests (see helpers.h). */
#define _GNU_SOURCE
#include "helpers.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void *device_alloc(size_t bytes)
{
    void *p;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMalloc: %s", cudaGetErrorString(err));
    return p;
}

void *host_alloc(size_t bytes)
{
    void *p;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMallocHost: %s", cudaGetErrorString(err));
    return p;
}

cudaStream_t stream_new(void)
{
    cudaStream_t s;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess)
        bail("cudaStreamCreate: %s", cudaGetErrorString(err));
    return s;
}

/* See helpers.h. */
cudaError_t alloc_checked(void **p, size_t bytes, cudaStream_t s)
{
    cudaError_t err = defer_alloc(p, bytes, s);

    if (err == cudaSuccess && p != NULL && *p != NULL)
        fake_oracle_handout_range(*p, bytes, s);
    return err;
}

fake_work *work_held(cudaStream_t s, void *p)
{
    fake_work *w = fake_launch_held(s, &p, p != NULL);
    if (w == NULL)
        bail("fake_launch_held on an invalid stream");
    return w;
}

fake_work *work_timed(cudaStream_t s, unsigned us, void *p)
{
    fake_work *w = fake_launch(s, us, &p, p != NULL);
    if (w == NULL)
        bail("fake_launch on an invalid stream");
    return w;
}

void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

bool wait_released(const void *p, unsigned timeout_ms)
{
    for (unsigned waited = 0; fake_is_released(p) != 1; waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

int count_released(void *const *p, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += fake_is_released(p[i]) == 1;
    return k;
}

bool wait_flag(const volatile int *flag, unsigned timeout_ms)
{
    for (unsigned waited = 0; !__atomic_load_n(flag, __ATOMIC_ACQUIRE); waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

static void *flush_main(void *arg)
{
    cudaError_t err = defer_flush();
    __atomic_store_n((int *)arg, err == cudaSuccess ? 1 : -1,
                     __ATOMIC_SEQ_CST);
    return NULL;
}

void flush_in_thread(pthread_t *t, int *done)
{
    __atomic_store_n(done, 0, __ATOMIC_SEQ_CST);
    if (pthread_create(t, NULL, flush_main, done) != 0)
        bail("pthread_create");
}

bool wait_stats_settled(unsigned timeout_ms)
{
    double end = now_ms() + timeout_ms;
    struct defer_stats a = stats_now();
    do {
        sleep_ms(5);
        struct defer_stats b = stats_now();
        if (a.held == b.held && a.held_bytes == b.held_bytes &&
            a.released == b.released && a.failed == b.failed &&
            a.cap_releases == b.cap_releases &&
            a.idle_releases == b.idle_releases &&
            a.age_releases == b.age_releases &&
            a.demand_releases == b.demand_releases)
            return true;
        a = b;
    } while (now_ms() < end);
    return false;
}

struct defer_stats stats_now(void)
{
    struct defer_stats s;
    defer_stats_get(&s);
    return s;
}

static int saved_stderr = -1;
static FILE *capture;

void stderr_capture_begin(void)
{
    fflush(stderr);
    capture = tmpfile();
    if (capture == NULL)
        sysbail("tmpfile");
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(capture), STDERR_FILENO);
}

const char *stderr_capture_end(void)
{
    static char text[8192];
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    rewind(capture);
    size_t n = fread(text, 1, sizeof text - 1, capture);
    text[n] = '\0';
    fclose(capture);
    if (n > 0)
        diag("stderr: %s", text);
    return text;
}

/* A line of text containing a and b (b may be NULL) and not starting with
 * unless (may be NULL); true if there is one. */
bool has_line(const char *text, const char *a, const char *b,
                     const char *unless)
{
    for (const char *line = text; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        if (len >= sizeof buf)
            len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = '\0';
        if (strstr(buf, a) != NULL && (b == NULL || strstr(buf, b) != NULL) &&
            (unless == NULL || strncmp(buf, unless, strlen(unless)) != 0))
            return true;
        if (end == NULL)
            break;
        line = end + 1;
    }
    return false;
}

/* ---- scenarios run in child processes ------------------------------------ */

int failed_checks;

bool check(bool cond, int line, const char *fmt, ...)
{
    if (cond)
        return true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag("  line %d: check failed: %s", line, msg);
    failed_checks++;
    return false;
}

pid_t fork_flushed(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        sysbail("fork");
    return pid;
}

void child_end(int failures)
{
    fflush(stdout);
    fflush(stderr);
    _exit(failures > 100 ? 100 : failures);
}

void scenario_child_end(void)
{
    long v = fake_violations();
    char last[256];
    CHECK(v == 0, "oracle: %ld violation(s), the last: %s", v,
          fake_last_violation(last, sizeof last));
    child_end(failed_checks);
}

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void set_cudefer_env(const char *env)
{
    extern char **environ;
    for (bool again = true; again;) {
        again = false;
        for (char **e = environ; e != NULL && *e != NULL; e++) {
            if (strncasecmp(*e, "CUDEFER_", 8) != 0)
                continue;
            char name[256];
            size_t len = strcspn(*e, "=");
            if (len >= sizeof name)
                len = sizeof name - 1;
            memcpy(name, *e, len);
            name[len] = '\0';
            unsetenv(name);
            again = true; /* environ changed: start over */
            break;
        }
    }
    char *copy = strdup(env != NULL ? env : ""), *save = NULL;
    if (copy == NULL)
        sysbail("strdup");
    for (char *tok = strtok_r(copy, " ", &save); tok != NULL;
         tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL)
            bail("scenario environment: no '=' in %s", tok);
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
    free(copy);
}

bool wait_child(pid_t pid, double timeout_ms, int *status)
{
    double deadline = now_ms() + timeout_ms;
    for (;;) {
        pid_t got = waitpid(pid, status, WNOHANG);
        if (got == pid)
            return true;
        if (got < 0 && errno != EINTR)
            sysbail("waitpid");
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
            }
            return false;
        }
        sleep_ms(2);
    }
}

void fork_scenario(const char *title, const char *env, int ndevices,
                   unsigned timeout_ms, void (*fn)(void))
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(env);
        fake_reset(ndevices);
        failed_checks = 0;
        fn();
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, timeout_ms, &status);
    if (!ended)
        diag("no end after %u ms: killed (a hang)", timeout_ms);
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s [%s]",
       title, env != NULL && *env != '\0' ? env : "defaults");
}

bool hold_reclaimer_in_call(_Atomic int *state, int armed, int held)
{
    char name[16] = "";
    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 ||
        strcmp(name, FAKE_RECLAIMER_THREAD_NAME) != 0 ||
        !atomic_compare_exchange_strong(state, &armed, held))
        return false;
    while (atomic_load(state) == held)
        sleep_ms(1);
    return true;
}

size_t read_until(int fd, double deadline_ms, char *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        double left = deadline_ms - now_ms();
        if (left <= 0)
            break;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)left + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        char chunk[4096];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* end of file: the writer is gone */
        size_t take = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
        memcpy(buf + len, chunk, take);
        len += take;
    }
    buf[len] = '\0';
    return len;
}

bool wait_user_objects(size_t n, unsigned timeout_ms)
{
    for (unsigned waited = 0; fake_live_user_objects() > n; waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

int noop_counted_calls;

void noop_counted(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&noop_counted_calls, 1, __ATOMIC_SEQ_CST);
}

void begin_capture(cudaStream_t s)
{
    cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (err != cudaSuccess)
        bail("cudaStreamBeginCapture: %s", cudaGetErrorName(err));
}

cudaGraph_t end_capture(cudaStream_t s)
{
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(s, &graph);
    if (err != cudaSuccess)
        bail("cudaStreamEndCapture: %s", cudaGetErrorName(err));
    return graph;
}

void captured_work(cudaStream_t s, void *p)
{
    if (fake_launch(s, 200, &p, 1) == NULL)
        bail("fake_launch on an invalid stream");
}

void captures_all_gone(void)
{
    ok(wait_user_objects(0, 2000), "no user object left");
    is_int(fake_live_graphs(), 0, "no graph left");
    is_int(defer_flush(), cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    ok(st.pending == 0 && st.deferred == st.released + st.failed,
       "stats agree: deferred %llu = released %llu + failed %llu",
       ULL(st.deferred), ULL(st.released), ULL(st.failed));
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
}

bool capture_intact(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusActive;
}

void *hold_capture(void *arg)
{
    struct held_capture *c = arg;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal) !=
        cudaSuccess) {
        __atomic_store_n(&c->begun, -1, __ATOMIC_SEQ_CST);
        return NULL;
    }
    __atomic_store_n(&c->begun, 1, __ATOMIC_SEQ_CST);
    wait_flag(&c->release, 30000);
    cudaGraph_t graph = NULL;
    c->intact = capture_intact(c->stream) &&
                cudaStreamEndCapture(c->stream, &graph) == cudaSuccess;
    cudaGraphDestroy(graph);
    return NULL;
}
