/*
 * fake_selftest.c — tests of the fake CUDA runtime (t/fake) and of the TAP
 * producer (t/tap) themselves.
 *
 * Tests that provoke oracle violations on purpose call fake_oracle_forgive()
 * so that the process exits cleanly.  The exit-time behaviour of the oracle
 * and of tap.c is tested by re-running this program in a child mode
 * (argv[1] = "--child-...") and checking its output and exit status.
 */
#define _GNU_SOURCE

#include <cuda.h>

#include "fake_cuda.h"
#include "tap.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The per-thread-default-stream entry points are not declared by
 * cuda_runtime_api.h unless CUDA_API_PER_THREAD_DEFAULT_STREAM is set. */
cudaError_t cudaStreamGetId_ptsz(cudaStream_t, unsigned long long *);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);

#define GiB ((size_t)1 << 30)

/* ---- Helpers ---------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Run fn(arg) on a new thread and join it. */
static void *on_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    void *ret;

    if (pthread_create(&t, NULL, fn, arg) != 0)
        sysbail("pthread_create");
    pthread_join(t, &ret);
    return ret;
}

static unsigned long long stream_id(cudaStream_t s)
{
    unsigned long long id = 0;

    if (cudaStreamGetId(s, &id) != cudaSuccess)
        return 0;
    return id;
}

/* The last violation message contains what. */
static int last_violation_has(const char *what)
{
    char buf[512];

    fake_last_violation(buf, sizeof buf);
    return strstr(buf, what) != NULL;
}

/* A thread that calls fake_complete(w) after ms milliseconds. */
struct completer { pthread_t t; fake_work *w; unsigned ms; };

static void *completer_main(void *arg)
{
    struct completer *c = arg;

    sleep_ms(c->ms);
    fake_complete(c->w);
    return NULL;
}

static void complete_later(struct completer *c, fake_work *w, unsigned ms)
{
    c->w = w;
    c->ms = ms;
    if (pthread_create(&c->t, NULL, completer_main, c) != 0)
        sysbail("pthread_create");
}

/* ---- Child modes: exit-time behaviour --------------------------------- */

static int child_main(const char *mode)
{
    if (strcmp(mode, "--child-violation") == 0 ||
        strcmp(mode, "--child-forgiven") == 0) {
        void *p;
        fake_work *w;

        fake_reset(1);
        cudaMalloc(&p, 64);
        w = fake_launch_held(0, &p, 1);
        cudaFree(p);
        fake_complete(w);
        if (strcmp(mode, "--child-forgiven") == 0)
            fake_oracle_forgive();
        return 0;
    }
    if (strcmp(mode, "--child-tap-fail") == 0) {
        plan(2);
        ok(1, "fine");
        ok(0, "broken");
        return 0;
    }
    if (strcmp(mode, "--child-tap-short") == 0) {
        plan(3);
        ok(1, "only one");
        return 0;
    }
    if (strcmp(mode, "--child-tap-lazy") == 0) {
        plan_lazy();
        ok(1, "one");
        diag("line %s\nline two", "one");
        is_int(2, 2, "two");
        skip("three %d", 3);
        return 0;
    }
    if (strcmp(mode, "--child-skip-all") == 0)
        skip_all("no %s here", "GPU");
    if (strcmp(mode, "--child-bail") == 0) {
        plan(5);
        bail("boom %d", 42);
    }
    return 99;
}

/* Run this program in a child mode; return its exit status (-1 if it did
 * not exit normally) and its stdout in out. */
static int run_child(const char *mode, char *out, size_t outlen)
{
    int fd[2], status;
    size_t n = 0;
    ssize_t r;
    pid_t pid;

    fflush(stdout);
    if (pipe(fd) != 0)
        sysbail("pipe");
    pid = fork();
    if (pid < 0)
        sysbail("fork");
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl("/proc/self/exe", "fake_selftest", mode, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    while (n + 1 < outlen && (r = read(fd[0], out + n, outlen - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    if (waitpid(pid, &status, 0) != pid)
        sysbail("waitpid");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_exit_behaviour(void)
{
    char out[4096];

    diag("exit-time behaviour (child processes)");
    is_int(run_child("--child-violation", out, sizeof out), 1,
           "unforgiven violation: exit status 1");
    ok(strstr(out, "# fake oracle: premature release") != NULL,
       "violation printed when it happens");
    ok(strstr(out, "# fake oracle: 1 violation(s)") != NULL,
       "violation count printed at exit");
    is_int(run_child("--child-forgiven", out, sizeof out), 0,
           "forgiven violation: exit status 0");

    is_int(run_child("--child-tap-fail", out, sizeof out), 1,
           "tap: a failed test makes the exit status 1");
    ok(strstr(out, "1..2\nok 1 - fine\nnot ok 2 - broken\n") != NULL,
       "tap: plan and results");
    ok(strstr(out, "# Looks like you failed 1 test of 2") != NULL,
       "tap: failure summary");
    is_int(run_child("--child-tap-short", out, sizeof out), 1,
           "tap: unmet plan makes the exit status 1");
    ok(strstr(out, "# Looks like you planned 3 tests but ran 1") != NULL,
       "tap: plan mismatch reported");
    is_int(run_child("--child-tap-lazy", out, sizeof out), 0,
           "tap: lazy plan, all passed: exit status 0");
    is_str(out, "ok 1 - one\n# line one\n# line two\nok 2 - two\n"
           "ok 3 # skip three 3\n1..3\n",
           "tap: lazy plan output");
    is_int(run_child("--child-skip-all", out, sizeof out), 0,
           "tap: skip_all exits 0");
    is_str(out, "1..0 # SKIP no GPU here\n", "tap: skip_all output");
    is_int(run_child("--child-bail", out, sizeof out), 255,
           "tap: bail exits 255");
    ok(strstr(out, "Bail out! boom 42\n") != NULL, "tap: bail output");
}

/* ---- Devices ---------------------------------------------------------- */

static void *get_device_main(void *arg)
{
    int *dev = arg;

    cudaGetDevice(dev);
    return NULL;
}

static void test_devices(void)
{
    int n = -1, d = -1;

    diag("devices");
    fake_reset(4);
    is_int(cudaGetDeviceCount(&n), cudaSuccess, "cudaGetDeviceCount");
    is_int(n, 4, "4 devices after fake_reset(4)");
    cudaGetDevice(&d);
    is_int(d, 0, "current device defaults to 0");
    ok(!fake_device_touched(3), "device 3 not touched yet");
    is_int(cudaSetDevice(3), cudaSuccess, "cudaSetDevice(3)");
    cudaGetDevice(&d);
    is_int(d, 3, "current device is 3");
    ok(fake_device_touched(3) && fake_device_touched_by_app(3),
       "setting device 3 touched it");
    ok(!fake_device_touched_by_app(2), "device 2 untouched");
    is_int(cudaSetDevice(4), cudaErrorInvalidDevice, "device 4 is invalid");
    is_int(cudaSetDevice(-1), cudaErrorInvalidDevice, "device -1 is invalid");
    cudaGetDevice(&d);
    is_int(d, 3, "failed cudaSetDevice left the current device");
    d = -1;
    on_thread(get_device_main, &d);
    is_int(d, 0, "another thread's current device is 0 (thread-local)");
    is_int(cudaGetDeviceCount(NULL), cudaErrorInvalidValue,
           "cudaGetDeviceCount(NULL)");
    ok(!fake_device_touched(-1) && !fake_device_touched(99),
       "out-of-range devices are never touched");
    fake_reset(2);
    cudaGetDevice(&d);
    is_int(d, 0, "fake_reset makes the current device 0 again");
    ok(!fake_device_touched(1), "fake_reset clears touched devices");
}

/* ---- Streams ---------------------------------------------------------- */

struct ids { unsigned long long legacy0, per_thread, per_thread2; };

static void *ids_main(void *arg)
{
    struct ids *ids = arg;

    ids->legacy0 = stream_id(0);
    ids->per_thread = stream_id(cudaStreamPerThread);
    ids->per_thread2 = stream_id(cudaStreamPerThread);
    return NULL;
}

static void test_streams(void)
{
    cudaStream_t s1, s2, s3, bogus = (cudaStream_t)(uintptr_t)0xdeadbeef0;
    unsigned long long id0, idl, id1, idpt, idpt1, id;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
    struct ids other;
    cudaEvent_t e;
    void *p;
    int d = -1;

    diag("streams");
    fake_reset(2);
    is_int(cudaStreamCreate(&s1), cudaSuccess, "cudaStreamCreate");
    is_int(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess,
           "cudaStreamCreateWithFlags");
    ok(s1 != s2 && stream_id(s1) != stream_id(s2) && stream_id(s1) != 0,
       "distinct streams, distinct ids");
    ok((uintptr_t)s1 > 2 && (uintptr_t)s2 > 2, "handles are not special");
    is_int(cudaStreamGetDevice(s1, &d), cudaSuccess, "cudaStreamGetDevice");
    is_int(d, 0, "stream on device 0");
    cudaSetDevice(1);
    is_int(cudaStreamCreateWithPriority(&s3, 0, -1), cudaSuccess,
           "cudaStreamCreateWithPriority on device 1");
    cudaStreamGetDevice(s3, &d);
    is_int(d, 1, "stream created on the current device (1)");
    is_int(cudaStreamGetDevice(s1, &d), cudaSuccess, "device of s1 from dev 1");
    is_int(d, 0, "s1 is still on device 0");

    id1 = stream_id(0);
    idpt1 = stream_id(cudaStreamPerThread);
    cudaSetDevice(0);
    id0 = stream_id(0);
    idl = stream_id(cudaStreamLegacy);
    idpt = stream_id(cudaStreamPerThread);
    ok(id0 != 0 && id0 == idl, "0 and cudaStreamLegacy are the same stream");
    ok(id1 != 0 && id1 != id0, "legacy stream differs per device");
    cudaStreamGetDevice(0, &d);
    is_int(d, 0, "legacy stream of the current device");
    ok(idpt != 0 && idpt != id0 && idpt != id1, "per-thread stream is not legacy");
    ok(idpt1 != idpt, "per-thread stream differs per device");
    is_int((long long)stream_id(cudaStreamPerThread), (long long)idpt,
           "per-thread stream is stable");
    on_thread(ids_main, &other);
    is_int((long long)other.legacy0, (long long)id0,
           "legacy stream shared by all threads");
    ok(other.per_thread != 0 && other.per_thread != idpt &&
       other.per_thread != idpt1, "per-thread stream differs per thread");
    is_int((long long)other.per_thread2, (long long)other.per_thread,
           "per-thread stream stable within that thread");
    is_int(cudaStreamGetId_ptsz(0, &id), cudaSuccess, "cudaStreamGetId_ptsz");
    is_int((long long)id, (long long)idpt, "_ptsz: stream 0 is per-thread");

    is_int(cudaStreamIsCapturing(s1, &cs), cudaSuccess, "cudaStreamIsCapturing");
    is_int(cs, cudaStreamCaptureStatusNone, "never capturing");
    is_int(cudaStreamQuery(s1), cudaSuccess, "idle stream: query success");
    is_int(cudaStreamSynchronize(s1), cudaSuccess, "idle stream: sync");
    is_int(cudaStreamGetId(s1, NULL), cudaErrorInvalidValue, "GetId(NULL)");

    is_int(cudaStreamDestroy(s2), cudaSuccess, "cudaStreamDestroy");
    cudaEventCreate(&e);
    is_int(cudaStreamQuery(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamQuery");
    is_int(cudaStreamSynchronize(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamSynchronize");
    is_int(cudaStreamGetId(s2, &id), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamGetId");
    is_int(cudaStreamGetDevice(s2, &d), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamGetDevice");
    is_int(cudaStreamIsCapturing(s2, &cs), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamIsCapturing");
    is_int(cudaEventRecord(e, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventRecord");
    is_int(cudaStreamWaitEvent(s2, e, 0), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamWaitEvent");
    is_int(cudaMallocAsync(&p, 16, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaMallocAsync");
    is_int(cudaFreeAsync(NULL, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaFreeAsync");
    is_int(cudaStreamDestroy(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamDestroy again");
    ok(fake_launch(s2, 1, NULL, 0) == NULL, "destroyed: fake_launch NULL");
    is_int(cudaStreamQuery(bogus), cudaErrorInvalidResourceHandle,
           "made-up handle: invalid");
    is_int(cudaStreamQuery((cudaStream_t)(uintptr_t)0x10),
           cudaErrorInvalidResourceHandle, "small made-up handle: invalid");
    ok(fake_launch(bogus, 1, NULL, 0) == NULL, "made-up: fake_launch NULL");
    is_int(cudaStreamDestroy(0), cudaErrorInvalidResourceHandle,
           "cannot destroy the legacy stream");
    is_int(cudaStreamDestroy(cudaStreamPerThread),
           cudaErrorInvalidResourceHandle, "cannot destroy per-thread stream");
    cudaEventDestroy(e);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s3);
}

/* ---- Work ordering ---------------------------------------------------- */

static void test_work(void)
{
    cudaStream_t s, t;
    fake_work *w1, *w2, *w3, *h, *w4, *other;

    diag("work ordering");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    w1 = fake_launch(s, 30000, NULL, 0);
    w2 = fake_launch_held(s, NULL, 0);
    w3 = fake_launch(s, 20000, NULL, 0);
    ok(w1 && w2 && w3, "fake_launch / fake_launch_held");
    ok(fake_work_id(w2) == fake_work_id(w1) + 1 &&
       fake_work_id(w3) == fake_work_id(w2) + 1, "work ids are sequential");
    ok(!fake_work_done(w1) && !fake_work_done(w2) && !fake_work_done(w3),
       "nothing done at launch");
    is_int(cudaStreamQuery(s), cudaErrorNotReady, "busy stream: NotReady");
    other = fake_launch(t, 0, NULL, 0);
    ok(fake_work_done(other), "zero-length work on another stream is done");
    sleep_ms(60);
    ok(fake_work_done(w1), "timed work done after its duration");
    ok(!fake_work_done(w2), "held work not done");
    ok(!fake_work_done(w3), "later timed work waits for held work");
    fake_complete(w1);
    ok(!fake_work_done(w2), "fake_complete of timed work: no effect");
    fake_complete(w2);
    ok(fake_work_done(w2), "held work done once completed");
    ok(!fake_work_done(w3), "next work starts only at the release");
    sleep_ms(40);
    ok(fake_work_done(w3), "and completes its duration later");
    is_int(cudaStreamQuery(s), cudaSuccess, "idle again: query success");
    fake_complete(w2);
    ok(fake_work_done(w2), "completing twice is harmless");

    h = fake_launch_held(s, NULL, 0);
    w4 = fake_launch(s, 20000, NULL, 0);
    sleep_ms(30);
    fake_complete(h);
    ok(!fake_work_done(w4), "timed work starts when the held work completes");
    sleep_ms(40);
    ok(fake_work_done(w4), "... and is done its duration after");

    h = fake_launch_held(s, NULL, 0);
    other = fake_launch(t, 0, NULL, 0);
    ok(fake_work_done(other), "held work on s does not block stream t");
    cudaStreamDestroy(s);
    ok(!fake_work_done(h), "work on a destroyed stream stays pending");
    fake_complete(h);
    ok(fake_work_done(h), "... and still completes");
    ok(!fake_work_done(NULL), "fake_work_done(NULL) is 0");
    cudaStreamDestroy(t);
}

/* ---- Events ----------------------------------------------------------- */

static void test_events(void)
{
    cudaStream_t s, s2, s_dev1;
    cudaEvent_t e, e2, e_dev1;
    fake_work *h, *w, *b;
    struct completer c;
    double t0;

    diag("events");
    fake_reset(2);
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    is_int(cudaEventCreate(&e), cudaSuccess, "cudaEventCreate");
    is_int(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming), cudaSuccess,
           "cudaEventCreateWithFlags");
    ok(e != e2, "distinct events");
    is_int((long long)fake_live_events(), 2, "2 live events");
    is_int(cudaEventQuery(e), cudaSuccess, "never recorded: success");
    is_int(cudaEventRecord(e, s), cudaSuccess, "record on an idle stream");
    is_int(cudaEventQuery(e), cudaSuccess, "... is complete");

    h = fake_launch_held(s, NULL, 0);
    is_int(cudaEventRecord(e, s), cudaSuccess, "record after held work");
    w = fake_launch(s, 0, NULL, 0);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "... NotReady");
    is_int(cudaEventRecordWithFlags(e2, s2, 0), cudaSuccess,
           "cudaEventRecordWithFlags on idle s2");
    is_int(cudaEventQuery(e2), cudaSuccess, "... complete");
    fake_complete(h);
    is_int(cudaEventQuery(e), cudaSuccess, "complete once the work is");
    ok(fake_work_done(w), "work after it done too");

    h = fake_launch_held(s, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "recorded on held work");
    cudaEventRecord(e, s2);
    is_int(cudaEventQuery(e), cudaSuccess, "re-record overwrites the capture");
    cudaEventRecord(e, s);
    fake_launch(s, 0, NULL, 0);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchFailure, 0, 1);
    cudaEventRecord(e2, s);
    is_int(cudaEventQuery(e2), cudaSuccess, "failed record left e2 as it was");

    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaEventSynchronize(e), cudaSuccess, "cudaEventSynchronize");
    ok(now_ms() - t0 >= 25, "... blocked until the work completed (%.1f ms)",
       now_ms() - t0);
    pthread_join(c.t, NULL);
    is_int(cudaEventSynchronize(e), cudaSuccess, "sync on a complete event");

    h = fake_launch_held(s, NULL, 0);
    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaStreamSynchronize(s), cudaSuccess, "cudaStreamSynchronize");
    ok(now_ms() - t0 >= 25, "... blocked until the work completed");
    pthread_join(c.t, NULL);

    fake_launch(s2, 20000, NULL, 0);
    h = fake_launch_held(0, NULL, 0);
    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaDeviceSynchronize(), cudaSuccess, "cudaDeviceSynchronize");
    ok(now_ms() - t0 >= 25, "... waited for the legacy stream's held work");
    is_int(cudaStreamQuery(s2), cudaSuccess, "... and for the other streams");
    pthread_join(c.t, NULL);

    t0 = now_ms();
    fake_launch(s, 30000, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaEventSynchronize(e), cudaSuccess, "sync on timed work");
    ok(now_ms() - t0 >= 29, "... took its duration (%.1f ms)", now_ms() - t0);

    /* Device mismatch */
    cudaSetDevice(1);
    cudaStreamCreate(&s_dev1);
    cudaEventCreate(&e_dev1);
    is_int(cudaEventRecord(e, s_dev1), cudaErrorInvalidResourceHandle,
           "event of device 0 on a stream of device 1");
    is_int(cudaEventRecord(e, 0), cudaErrorInvalidResourceHandle,
           "event of device 0 on device 1's legacy stream");
    is_int(cudaEventRecord(e_dev1, 0), cudaSuccess,
           "event of device 1 on device 1's legacy stream");
    is_int(cudaEventRecord_ptsz(e_dev1, 0), cudaSuccess,
           "cudaEventRecord_ptsz on the per-thread stream");
    is_int(cudaEventRecord(e, s), cudaSuccess,
           "event of device 0 on a device-0 stream, from device 1");
    cudaSetDevice(0);

    /* cudaStreamWaitEvent */
    h = fake_launch_held(s, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaStreamWaitEvent(s2, e, 0), cudaSuccess, "cudaStreamWaitEvent");
    w = fake_launch(s2, 0, NULL, 0);
    cudaEventRecord(e2, s2);
    b = fake_launch(s, 0, NULL, 0);
    ok(!fake_work_done(w), "work after the wait is blocked");
    is_int(cudaEventQuery(e2), cudaErrorNotReady,
           "event after the wait is not ready");
    is_int(cudaStreamWaitEvent(s_dev1, e, 0), cudaSuccess,
           "waiting on another device's event is allowed");
    fake_complete(h);
    ok(fake_work_done(w) && fake_work_done(b), "released with the event");
    is_int(cudaEventQuery(e2), cudaSuccess, "... event ready too");
    h = fake_launch_held(s, NULL, 0);
    cudaStreamWaitEvent(s2, e, 0);       /* e's capture is complete */
    ok(fake_work_done(fake_launch(s2, 0, NULL, 0)),
       "waiting on a complete event does not block");
    fake_complete(h);
    {
        cudaEvent_t fresh;

        cudaEventCreate(&fresh);
        cudaStreamWaitEvent(s2, fresh, 0);
        ok(fake_work_done(fake_launch(s2, 0, NULL, 0)),
           "waiting on a never-recorded event is a no-op");
        cudaEventDestroy(fresh);
    }

    /* Destroyed and made-up events */
    is_int(cudaEventDestroy(e2), cudaSuccess, "cudaEventDestroy");
    is_int(cudaEventQuery(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventQuery");
    is_int(cudaEventRecord(e2, s), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventRecord");
    is_int(cudaEventSynchronize(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventSynchronize");
    is_int(cudaStreamWaitEvent(s, e2, 0), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamWaitEvent");
    is_int(cudaEventDestroy(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventDestroy");
    is_int(cudaEventQuery((cudaEvent_t)(uintptr_t)0x1234560),
           cudaErrorInvalidResourceHandle, "made-up event: invalid");
    is_int(cudaEventQuery(NULL), cudaErrorInvalidResourceHandle,
           "NULL event: invalid");
    is_int(cudaEventCreate(NULL), cudaErrorInvalidValue, "cudaEventCreate(NULL)");
    is_int((long long)fake_live_events(), 2, "2 live events left");
    cudaEventDestroy(e);
    cudaEventDestroy(e_dev1);
    is_int((long long)fake_live_events(), 0, "0 live events left");
}

/* ---- Allocations ------------------------------------------------------ */

static void test_allocations(void)
{
    void *a, *b, *h, *big, *pool, *zero = &zero, *again;
    size_t fr = 0, tot = 0;
    struct cudaPointerAttributes at;
    cudaStream_t s1;
    int local;

    diag("allocations");
    fake_reset(2);
    is_int(cudaMalloc(&a, 1000), cudaSuccess, "cudaMalloc");
    is_int(cudaMalloc(&b, 5000), cudaSuccess, "cudaMalloc again");
    ok(a != NULL && b != NULL && a != b, "distinct non-NULL addresses");
    ok((uintptr_t)a % 4096 == 0 && (uintptr_t)b % 4096 == 0, "page aligned");
    is_int(cudaMallocHost(&h, 100), cudaSuccess, "cudaMallocHost");
    is_int((long long)fake_live_allocations(), 3, "3 live allocations");
    is_int(cudaMemGetInfo(&fr, &tot), cudaSuccess, "cudaMemGetInfo");
    is_hex(tot, 80 * GiB, "80 GiB total");
    is_hex(fr, 80 * GiB - 6000, "free = total - device allocations");
    is_int(cudaMalloc(&zero, 0), cudaSuccess, "cudaMalloc of 0 bytes");
    ok(zero == NULL, "... gives NULL");
    is_int(cudaMalloc(NULL, 8), cudaErrorInvalidValue, "cudaMalloc(NULL)");

    is_int(cudaPointerGetAttributes(&at, a), cudaSuccess,
           "cudaPointerGetAttributes(device)");
    ok(at.type == cudaMemoryTypeDevice && at.device == 0 &&
       at.devicePointer == a, "device memory on device 0");
    cudaPointerGetAttributes(&at, (char *)b + 4999);
    ok(at.type == cudaMemoryTypeDevice, "interior pointer is found");
    cudaPointerGetAttributes(&at, (char *)b + 5000);
    ok(at.type == cudaMemoryTypeUnregistered, "one past the end is not");
    cudaPointerGetAttributes(&at, h);
    ok(at.type == cudaMemoryTypeHost && at.hostPointer == h, "host memory");
    is_int(cudaPointerGetAttributes(&at, &local), cudaSuccess,
           "unknown pointer: cudaSuccess");
    ok(at.type == cudaMemoryTypeUnregistered, "... unregistered");

    is_int(fake_is_released(a), 0, "fake_is_released: live");
    is_int(fake_is_released(&local), -1, "fake_is_released: unknown");
    is_int(cudaFree(NULL), cudaSuccess, "cudaFree(NULL)");
    is_int(cudaFreeHost(NULL), cudaSuccess, "cudaFreeHost(NULL)");
    is_int(cudaFree(h), cudaErrorInvalidValue, "cudaFree of host memory");
    is_int(cudaFreeHost(a), cudaErrorInvalidValue, "cudaFreeHost of device memory");
    is_int(cudaFree(&local), cudaErrorInvalidValue, "cudaFree of unknown");
    is_int(cudaFree((char *)a + 8), cudaErrorInvalidValue,
           "cudaFree of an interior pointer");
    is_int((long long)fake_invalid_releases(), 4, "4 invalid releases");
    is_int((long long)fake_live_allocations(), 3, "... nothing released");
    is_int(fake_violations(), 0, "... and no violations");
    is_int(cudaFree(a), cudaSuccess, "cudaFree");
    is_int(cudaFreeHost(h), cudaSuccess, "cudaFreeHost");
    is_int(fake_is_released(a), 1, "fake_is_released: released");
    cudaPointerGetAttributes(&at, a);
    ok(at.type == cudaMemoryTypeUnregistered, "released: unregistered");
    cudaMalloc(&again, 1000);
    ok((uintptr_t)again > (uintptr_t)b, "addresses are never reused");
    cudaFree(again);
    cudaFree(b);

    fake_set_device_memory(1, 1 << 20);
    cudaSetDevice(1);
    cudaMemGetInfo(&fr, &tot);
    is_hex(tot, 1 << 20, "fake_set_device_memory");
    is_int(cudaMalloc(&big, 2 << 20), cudaErrorMemoryAllocation,
           "cudaMalloc beyond the device's memory");
    is_int(cudaMalloc(&a, 600 << 10), cudaSuccess, "600 KiB fits");
    is_int(cudaMalloc(&b, 600 << 10), cudaErrorMemoryAllocation,
           "another 600 KiB does not");
    cudaStreamCreate(&s1);
    is_int(cudaMallocAsync(&pool, 100 << 10, s1), cudaSuccess,
           "cudaMallocAsync");
    cudaPointerGetAttributes(&at, pool);
    ok(at.type == cudaMemoryTypeDevice && at.device == 1,
       "pool memory on the stream's device");
    cudaMemGetInfo(&fr, &tot);
    is_hex(fr, (1 << 20) - (700 << 10), "pool memory counts as used");
    cudaFree(a);
    is_int(cudaMalloc(&b, 600 << 10), cudaSuccess, "fits after a free");
    is_int(cudaFree(pool), cudaSuccess, "cudaFree of pool memory");
    is_int(cudaMalloc(&a, 300 << 10), cudaSuccess, "300 KiB more fits");
    fake_set_device_memory(1, 100 << 10);
    cudaMemGetInfo(&fr, &tot);
    is_hex(fr, 0, "memory shrunk below use: 0 free");
    is_int(cudaMalloc(&pool, 1), cudaErrorMemoryAllocation,
           "... and no allocation fits");
    cudaFree(a);
    cudaFree(b);
    cudaSetDevice(0);
    cudaMemGetInfo(&fr, &tot);
    is_hex(tot, 80 * GiB, "device 0 keeps its memory");
    is_int(cudaHostAlloc(&h, 64, cudaHostAllocPortable), cudaSuccess,
           "cudaHostAlloc");
    cudaFreeHost(h);
    is_int((long long)fake_live_allocations(), 0, "all released");
    cudaMalloc(&a, 1);
    cudaMallocHost(&h, 1);
    is_int((long long)fake_live_allocations(), 2,
           "never-freed allocations are counted");
    cudaStreamDestroy(s1);
}

/* ---- Oracle ----------------------------------------------------------- */

struct reclaim_probe { int dev; cudaError_t r; };

static void *reclaimer_main(void *arg)
{
    struct reclaim_probe *p = arg;

    pthread_setname_np(pthread_self(), FAKE_RECLAIMER_THREAD_NAME);
    p->r = cudaSetDevice(p->dev);
    return NULL;
}

static void test_oracle(void)
{
    cudaStream_t s, t;
    cudaEvent_t e;
    void *p, *q, *h, *uses[2];
    fake_work *w, *w2;
    struct reclaim_probe probe;
    char msg[128];

    diag("oracle (violations below are on purpose)");
    fake_reset(3);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    cudaEventCreate(&e);

    cudaMalloc(&p, 256);
    w = fake_launch_held(s, &p, 1);
    is_int(cudaFree(p), cudaSuccess, "premature cudaFree still succeeds");
    is_int(fake_violations(), 1, "premature release is a violation");
    snprintf(msg, sizeof msg, "work #%llu", fake_work_id(w));
    ok(last_violation_has("premature release") && last_violation_has(msg),
       "message names the pending work");
    is_int(fake_is_released(p), 1, "... the pointer is released");
    fake_oracle_forgive();
    is_int(fake_violations(), 0, "fake_oracle_forgive");
    fake_complete(w);

    is_int(cudaFree(p), cudaErrorInvalidValue, "double cudaFree fails");
    is_int(fake_violations(), 1, "double release is a violation");
    ok(last_violation_has("double release"), "... with a clear message");
    fake_oracle_forgive();

    cudaMalloc(&p, 256);
    cudaMalloc(&q, 256);
    uses[0] = (char *)p + 100;  /* interior pointer names p */
    uses[1] = q;
    w = fake_launch(s, 1000, uses, 2);
    sleep_ms(5);
    cudaFree(p);
    cudaFree(q);
    is_int(fake_violations(), 0, "release after the work completed: fine");

    cudaMallocHost(&h, 64);
    w = fake_launch_held(t, &h, 1);
    cudaFreeHost(h);
    is_int(fake_violations(), 1, "premature cudaFreeHost is a violation");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    w2 = fake_launch(t, 0, &p, 1);
    ok(fake_work_done(w2), "done users don't matter");
    is_int(cudaFreeAsync(p, s), cudaSuccess, "cudaFreeAsync on the same stream");
    is_int(fake_violations(), 0, "... ordered after the use: fine");
    fake_launch(s, 0, &p, 1);
    is_int(fake_violations(), 1, "launching work that uses a released pointer");
    ok(last_violation_has("already released"), "... is a violation");
    fake_oracle_forgive();
    is_int(cudaFreeAsync(p, s), cudaErrorInvalidValue, "double cudaFreeAsync");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    cudaFreeAsync(p, t);
    is_int(fake_violations(), 1, "cudaFreeAsync on an unordered stream");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(t, e, 0);
    cudaFreeAsync(p, t);
    is_int(fake_violations(), 0,
           "cudaFreeAsync ordered through cudaStreamWaitEvent: fine");
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    fake_fail(FAKE_FREE, cudaErrorLaunchFailure, 0, 1);
    is_int(cudaFree(p), cudaErrorLaunchFailure, "injected cudaFree failure");
    is_int(fake_violations(), 0, "... is not checked by the oracle");
    is_int(fake_is_released(p), 0, "... and leaves the allocation live");
    fake_complete(w);
    cudaFree(p);
    is_int(fake_violations(), 0, "release after completion: fine");

    /* The reclaimer must not create contexts on unused devices. */
    cudaSetDevice(1);
    cudaSetDevice(0);
    probe.dev = 1;
    on_thread(reclaimer_main, &probe);
    is_int(probe.r, cudaSuccess, "reclaimer sets a device the app used");
    is_int(fake_violations(), 0, "... no violation");
    probe.dev = 2;
    on_thread(reclaimer_main, &probe);
    is_int(probe.r, cudaSuccess, "reclaimer sets a device the app never used");
    is_int(fake_violations(), 1, "... is a violation");
    ok(last_violation_has("reclaimer"), "... with a clear message");
    ok(fake_device_touched(2) && !fake_device_touched_by_app(2),
       "touched, but not by the app");
    fake_oracle_forgive();

    is_int((long long)fake_invalid_releases(), 0,
           "violations are not invalid releases");
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
}

/* fake_oracle_handout: a block handed out for a stream must be free of work
 * on other streams that is pending and not ordered before the stream. */
static void test_handout(void)
{
    cudaStream_t s, t, u, c;
    cudaEvent_t e, f;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *p, *q, *uses[1];
    fake_work *w, *w2;
    char msg[160];
    int local;

    diag("oracle: handouts (violations below are on purpose)");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    cudaStreamCreate(&u);
    cudaStreamCreate(&c);
    cudaEventCreate(&e);
    cudaEventCreate(&f);
    cudaMalloc(&p, 4096);

    w = fake_launch_held(t, &p, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "handout for s while work on t still uses the block: a violation");
    snprintf(msg, sizeof msg, "work #%llu on stream id %llu",
             fake_work_id(w), stream_id(t));
    ok(last_violation_has("premature reuse") && last_violation_has(msg),
       "... premature reuse, naming the work and its stream");
    snprintf(msg, sizeof msg, "handed out for stream id %llu", stream_id(s));
    ok(last_violation_has(msg), "... and the stream it was handed out for");
    fake_oracle_forgive();
    fake_oracle_handout(p, t);
    is_int(fake_violations(), 0,
           "handout for the stream the work is pending on: fine (stream "
           "order)");
    fake_complete(w);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0,
           "handout for another stream once the work completed: fine");

    uses[0] = (char *)p + 2048;
    w = fake_launch_held(t, uses, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "work on one part of the allocation counts for all of it (limit)");
    fake_oracle_forgive();
    cudaEventRecord(e, t);
    cudaStreamWaitEvent(u, e, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "a wait by a third stream does not order the work before s");
    fake_oracle_forgive();
    cudaStreamWaitEvent(s, e, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0,
           "after s waited on an event recorded after the work: fine");
    w2 = fake_launch_held(t, &p, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "... but not for work enqueued on t after that event");
    fake_oracle_forgive();
    cudaEventRecord(e, t);
    cudaStreamWaitEvent(u, e, 0);
    cudaEventRecord(f, u);
    cudaStreamWaitEvent(s, f, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0, "ordered through a chain of waits: fine");
    fake_complete(w);
    fake_complete(w2);

    w = fake_launch_held(0, &p, 1);
    fake_oracle_handout(p, 0);
    fake_oracle_handout(p, cudaStreamLegacy);
    is_int(fake_violations(), 0,
           "pending on the legacy stream, handed out for 0 or "
           "cudaStreamLegacy: the same stream");
    fake_oracle_handout(p, cudaStreamPerThread);
    is_int(fake_violations(), 1,
           "... for the per-thread stream: another stream, a violation");
    fake_oracle_forgive();
    fake_complete(w);

    w = fake_launch_held(c, &p, 1);
    cudaStreamBeginCapture(c, cudaStreamCaptureModeRelaxed);
    fake_oracle_handout(p, c);
    is_int(fake_violations(), 1,
           "handout for a capturing stream with its own work pending: a "
           "violation");
    ok(last_violation_has("captures"), "... saying the stream captures");
    fake_oracle_forgive();
    fake_complete(w);
    fake_oracle_handout(p, c);
    is_int(fake_violations(), 0, "... fine once that work completed");
    fake_launch(c, 10, &p, 1);
    cudaStreamEndCapture(c, &graph);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "handout while a graph that uses the block exists: a violation");
    ok(last_violation_has("graph"), "... naming the graph");
    fake_oracle_forgive();
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1, "... or an executable graph");
    ok(last_violation_has("executable graph"), "... naming it");
    fake_oracle_forgive();
    cudaGraphExecDestroy(exec);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0, "fine once the graphs are destroyed");

    cudaFree(p);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1, "handout of released memory: a violation");
    ok(last_violation_has("already released"), "... saying so");
    fake_oracle_forgive();
    fake_oracle_handout(NULL, s);
    is_int(fake_violations(), 0, "handout of NULL: nothing checked");
    fake_oracle_handout(&local, s);
    is_int(fake_violations(), 1,
           "handout of a pointer the fake never allocated: a violation");
    fake_oracle_forgive();
    cudaMalloc(&q, 64);
    fake_oracle_handout(q, (cudaStream_t)(uintptr_t)0x1230);
    is_int(fake_violations(), 1, "handout for an invalid stream: a violation");
    ok(last_violation_has("not a live stream"), "... saying so");
    fake_oracle_forgive();
    cudaFree(q);
    cudaEventDestroy(e);
    cudaEventDestroy(f);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
    cudaStreamDestroy(u);
    cudaStreamDestroy(c);
}

/* ---- Failure injection ------------------------------------------------ */

/* The driver's cuPointerGetAttributes (through the runtime's entry-point
 * query) on a fresh allocation: cudaSuccess, or the injected error. */
static cudaError_t cu_range_size_of_new_alloc(void)
{
    CUresult (*get)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    void *fn = NULL, *p = NULL;
    size_t size = 0;
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_RANGE_SIZE;
    void *data = &size;
    CUresult r;

    cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, 0,
                                     NULL);
    get = (CUresult (*)(unsigned, CUpointer_attribute *, void **,
                        CUdeviceptr))fn;
    cudaMalloc(&p, 100);
    r = get(1, &attr, &data, (CUdeviceptr)(uintptr_t)p);
    cudaFree(p);
    if (r != CUDA_SUCCESS)
        return cudaErrorIllegalAddress; /* what the test injects */
    return size == 100 ? cudaSuccess : cudaErrorUnknown;
}

/* Make one call of kind c with valid arguments; return its result. */
static cudaError_t call_one(enum fake_call c, cudaStream_t s, cudaEvent_t e)
{
    void *p = NULL;
    int i = 0;
    unsigned long long id;
    size_t f, t;
    enum cudaStreamCaptureStatus cs;
    struct cudaPointerAttributes at;
    cudaStream_t ns;
    cudaEvent_t ne;
    cudaError_t r;

    switch (c) {
    case FAKE_EVENT_CREATE:
        r = cudaEventCreate(&ne);
        if (r == cudaSuccess)
            cudaEventDestroy(ne);
        return r;
    case FAKE_EVENT_RECORD: return cudaEventRecord(e, s);
    case FAKE_EVENT_QUERY: return cudaEventQuery(e);
    case FAKE_EVENT_DESTROY:
        cudaEventCreate(&ne);
        r = cudaEventDestroy(ne);
        if (r != cudaSuccess)
            cudaEventDestroy(ne);
        return r;
    case FAKE_EVENT_SYNCHRONIZE: return cudaEventSynchronize(e);
    case FAKE_FREE:
        cudaMalloc(&p, 8);
        r = cudaFree(p);
        if (r != cudaSuccess)
            cudaFree(p);
        return r;
    case FAKE_FREE_HOST:
        cudaMallocHost(&p, 8);
        r = cudaFreeHost(p);
        if (r != cudaSuccess)
            cudaFreeHost(p);
        return r;
    case FAKE_FREE_ASYNC:
        cudaMalloc(&p, 8);
        r = cudaFreeAsync(p, s);
        if (r != cudaSuccess)
            cudaFree(p);
        return r;
    case FAKE_SET_DEVICE: return cudaSetDevice(0);
    case FAKE_GET_DEVICE: return cudaGetDevice(&i);
    case FAKE_GET_DEVICE_COUNT: return cudaGetDeviceCount(&i);
    case FAKE_STREAM_GET_DEVICE: return cudaStreamGetDevice(s, &i);
    case FAKE_STREAM_GET_ID: return cudaStreamGetId(s, &id);
    case FAKE_STREAM_CREATE:
        r = cudaStreamCreate(&ns);
        if (r == cudaSuccess)
            cudaStreamDestroy(ns);
        return r;
    case FAKE_STREAM_DESTROY:
        cudaStreamCreate(&ns);
        r = cudaStreamDestroy(ns);
        if (r != cudaSuccess)
            cudaStreamDestroy(ns);
        return r;
    case FAKE_STREAM_SYNCHRONIZE: return cudaStreamSynchronize(s);
    case FAKE_STREAM_IS_CAPTURING: return cudaStreamIsCapturing(s, &cs);
    case FAKE_POINTER_GET_ATTRIBUTES: return cudaPointerGetAttributes(&at, &i);
    case FAKE_MEM_GET_INFO: return cudaMemGetInfo(&f, &t);
    case FAKE_DRIVER_ENTRY_POINT:
        return cudaGetDriverEntryPointByVersion("cuPointerGetAttributes",
                                                &p, 12000, 0, NULL);
    case FAKE_CU_POINTER_GET_ATTRIBUTES:
        return cu_range_size_of_new_alloc();
    case FAKE_MALLOC:
        r = cudaMalloc(&p, 8);
        cudaFree(p);
        return r;
    case FAKE_MALLOC_HOST:
        r = cudaMallocHost(&p, 8);
        cudaFreeHost(p);
        return r;
    case FAKE_MALLOC_ASYNC:
        r = cudaMallocAsync(&p, 8, s);
        cudaFree(p);
        return r;
    case FAKE_STREAM_QUERY: return cudaStreamQuery(s);
    case FAKE_STREAM_WAIT_EVENT: return cudaStreamWaitEvent(s, e, 0);
    case FAKE_DEVICE_SYNCHRONIZE: return cudaDeviceSynchronize();
    case FAKE_DEVICE_GET_ATTRIBUTE:
        return cudaDeviceGetAttribute(&i, cudaDevAttrWarpSize, 0);
    case FAKE_DRIVER_GET_VERSION: return cudaDriverGetVersion(&i);
    case FAKE_RUNTIME_GET_VERSION: return cudaRuntimeGetVersion(&i);
    case FAKE_NCALLS: break;
    }
    return cudaErrorUnknown;
}

static void test_injection(void)
{
    cudaStream_t s, ns = NULL;
    cudaEvent_t e, ne = NULL;
    void *p;
    fake_work *h;
    int c, i, all_fail;
    unsigned long before;
    double t0;

    diag("failure injection");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaEventCreate(&e);

    for (c = 0; c < FAKE_NCALLS; c++) {
        cudaError_t r1, r2;

        ok(strncmp(fake_call_name((enum fake_call)c), "cu", 2) == 0,
           "fake_call_name(%d) = %s", c, fake_call_name((enum fake_call)c));
        before = fake_calls((enum fake_call)c);
        fake_fail((enum fake_call)c, cudaErrorIllegalAddress, 0, 1);
        r1 = call_one((enum fake_call)c, s, e);
        r2 = call_one((enum fake_call)c, s, e);
        ok(r1 == cudaErrorIllegalAddress && r2 == cudaSuccess,
           "%s: fails once, then succeeds (%d, %d)",
           fake_call_name((enum fake_call)c), (int)r1, (int)r2);
        /* + the retry call_one makes to clean up after a failed release */
        is_int((long long)(fake_calls((enum fake_call)c) - before),
               2 + (c == FAKE_EVENT_DESTROY || c == FAKE_FREE ||
                    c == FAKE_FREE_HOST || c == FAKE_STREAM_DESTROY),
               "%s: calls counted, failed ones included",
               fake_call_name((enum fake_call)c));
    }
    is_str(fake_call_name(FAKE_EVENT_QUERY), "cudaEventQuery",
           "fake_call_name(FAKE_EVENT_QUERY)");
    is_str(fake_call_name(FAKE_NCALLS), "?", "fake_call_name out of range");
    is_int((long long)fake_live_allocations(), 0, "no allocations leaked");
    is_int((long long)fake_live_events(), 1, "no events leaked");
    is_int(fake_violations(), 0, "no violations");

    fake_fail(FAKE_EVENT_QUERY, cudaErrorLaunchFailure, 0, -1);
    for (i = 0, all_fail = 1; i < 5; i++)
        all_fail &= cudaEventQuery(e) == cudaErrorLaunchFailure;
    ok(all_fail, "count -1: fails every time");
    fake_fail_clear();
    is_int(cudaEventQuery(e), cudaSuccess, "fake_fail_clear");

    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 2, 2);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "skip 2: first call succeeds");
    cudaFree(p);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "skip 2: second call succeeds");
    cudaFree(p);
    is_int(cudaMalloc(&p, 8), cudaErrorMemoryAllocation, "third fails");
    is_int(cudaMalloc(&p, 8), cudaErrorMemoryAllocation, "fourth fails");
    is_int(cudaMalloc(&p, 8), cudaSuccess, "fifth succeeds");
    cudaFree(p);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, 1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, 0);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "count 0 disarms");
    cudaFree(p);

    /* No side effects */
    fake_fail(FAKE_EVENT_CREATE, cudaErrorUnknown, 0, 1);
    cudaEventCreate(&ne);
    ok(ne == NULL, "failed cudaEventCreate writes nothing");
    is_int((long long)fake_live_events(), 1, "... creates nothing");
    fake_fail(FAKE_STREAM_CREATE, cudaErrorUnknown, 0, 1);
    cudaStreamCreateWithFlags(&ns, cudaStreamNonBlocking);
    ok(ns == NULL, "failed cudaStreamCreateWithFlags writes nothing");
    h = fake_launch_held(s, NULL, 0);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorUnknown, 0, 1);
    is_int(cudaEventRecord(e, s), cudaErrorUnknown, "failed record");
    is_int(cudaEventQuery(e), cudaSuccess, "... left the event as it was");
    fake_fail(FAKE_EVENT_SYNCHRONIZE, cudaErrorIllegalAddress, 0, 1);
    cudaEventRecord(e, s);
    is_int(cudaEventSynchronize(e), cudaErrorIllegalAddress,
           "failed cudaEventSynchronize returns at once");
    fake_fail(FAKE_EVENT_DESTROY, cudaErrorUnknown, 0, 1);
    cudaEventDestroy(e);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "failed destroy: event lives");
    fake_complete(h);
    cudaMallocHost(&p, 8);
    fake_fail(FAKE_FREE_HOST, cudaErrorUnknown, 0, 1);
    cudaFreeHost(p);
    is_int(fake_is_released(p), 0, "failed cudaFreeHost: allocation lives");
    cudaFreeHost(p);

    fake_set_latency(FAKE_EVENT_QUERY, 3000000);
    t0 = now_ms();
    cudaEventQuery(e);
    ok(now_ms() - t0 >= 3, "fake_set_latency: call took %.2f ms",
       now_ms() - t0);
    fake_set_latency(FAKE_EVENT_QUERY, 0);

    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, -1);
    fake_set_latency(FAKE_EVENT_QUERY, 1000000000);
    fake_reset(1);
    is_int(cudaGetDeviceCount(&i), cudaSuccess, "fake_reset clears injections");
    is_int((long long)fake_calls(FAKE_GET_DEVICE_COUNT), 1,
           "... and call counts");
    t0 = now_ms();
    cudaEventQuery(NULL);
    ok(now_ms() - t0 < 500, "... and latencies");
}

/* ---- Error strings, versions, attributes ------------------------------ */

static void test_misc(void)
{
    int v = 0;

    diag("error strings, versions, attributes");
    is_str(cudaGetErrorString(cudaErrorIllegalAddress),
           "an illegal memory access was encountered", "IllegalAddress text");
    is_str(cudaGetErrorName(cudaErrorIllegalAddress),
           "cudaErrorIllegalAddress", "IllegalAddress name");
    is_str(cudaGetErrorString(cudaSuccess), "no error", "Success text");
    is_str(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady",
           "NotReady name");
    is_str(cudaGetErrorName(cudaErrorCudartUnloading),
           "cudaErrorCudartUnloading", "CudartUnloading name");
    is_str(cudaGetErrorString(cudaErrorInvalidResourceHandle),
           "invalid resource handle", "InvalidResourceHandle text");
    is_str(cudaGetErrorString((cudaError_t)12345), "unrecognized error code",
           "unknown code text");
    is_str(cudaGetErrorName((cudaError_t)12345), "unrecognized error code",
           "unknown code name");
    is_int(cudaGetLastError(), cudaSuccess, "cudaGetLastError");
    is_int(cudaPeekAtLastError(), cudaSuccess, "cudaPeekAtLastError");
    cudaDriverGetVersion(&v);
    is_int(v, 13000, "driver version");
    cudaRuntimeGetVersion(&v);
    is_int(v, 13000, "runtime version");
    cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0);
    is_int(v, 9, "compute capability major");
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxTexture1DWidth, 0);
    is_int(v, 0, "unknown attribute: 0");
    is_int(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 7),
           cudaErrorInvalidDevice, "attribute of a bad device");
}

/* ---- Reset ------------------------------------------------------------ */

static void test_reset(void)
{
    cudaStream_t s;
    cudaEvent_t e;
    void *p, *q;
    unsigned long long old_id;

    diag("fake_reset");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaEventCreate(&e);
    cudaMalloc(&p, 8);
    old_id = stream_id(s);
    fake_reset(1);
    is_int(cudaStreamQuery(s), cudaErrorInvalidResourceHandle,
           "old stream handles are stale");
    is_int(cudaEventQuery(e), cudaErrorInvalidResourceHandle,
           "old event handles are stale");
    is_int(fake_is_released(p), -1, "old pointers are unknown");
    is_int((long long)fake_live_allocations(), 0, "no live allocations");
    is_int((long long)fake_live_events(), 0, "no live events");
    ok(stream_id(0) > old_id, "stream ids are never reused");
    cudaMalloc(&q, 8);
    ok((uintptr_t)q > (uintptr_t)p, "addresses are never reused");
    cudaFree(q);
}

/* ---- Concurrency ------------------------------------------------------ */

#define NPRODUCERS 8
#define PER_PRODUCER 300

struct pending { void *p; cudaEvent_t e; int host; };

static struct {
    pthread_mutex_t lock;
    struct pending q[NPRODUCERS * PER_PRODUCER];
    size_t head, tail;
    int producers_left;
} rq = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Application thread: allocate, launch work using it, defer the release to
 * the reclaimer (record an event, queue it) — the cudefer pattern. */
static void *producer_main(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg, fails = 0;
    cudaStream_t own;
    int i;

    cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
    for (i = 0; i < PER_PRODUCER; i++) {
        struct pending pe;
        cudaStream_t s = (i % 3 == 0) ? own
                       : (i % 3 == 1) ? cudaStreamPerThread : 0;

        pe.host = (i % 5 == 0);
        if (pe.host)
            fails += cudaMallocHost(&pe.p, 64) != cudaSuccess;
        else
            fails += cudaMalloc(&pe.p, 64) != cudaSuccess;
        fake_launch(s, (unsigned)(rand_r(&seed) % 200), &pe.p, 1);
        fails += cudaEventCreateWithFlags(&pe.e, cudaEventDisableTiming)
                 != cudaSuccess;
        fails += cudaEventRecord(pe.e, s) != cudaSuccess;
        pthread_mutex_lock(&rq.lock);
        rq.q[rq.tail++] = pe;
        pthread_mutex_unlock(&rq.lock);
    }
    ok(fails == 0, "producer %u: all calls succeeded",
       (unsigned)(uintptr_t)arg);
    cudaStreamSynchronize(own);
    cudaStreamDestroy(own);
    pthread_mutex_lock(&rq.lock);
    rq.producers_left--;
    pthread_mutex_unlock(&rq.lock);
    return NULL;
}

/* Reclaimer thread: poll the oldest entries' events, release when done. */
static void *consumer_main(void *arg)
{
    size_t released = 0, polls = 0;

    (void)arg;
    pthread_setname_np(pthread_self(), FAKE_RECLAIMER_THREAD_NAME);
    cudaSetDevice(0);
    for (;;) {
        struct pending pe;
        int have, left;

        pthread_mutex_lock(&rq.lock);
        have = rq.head < rq.tail;
        if (have)
            pe = rq.q[rq.head];
        left = rq.producers_left;
        pthread_mutex_unlock(&rq.lock);
        if (!have) {
            if (left == 0)
                break;
            sched_yield();
            continue;
        }
        polls++;
        if (cudaEventQuery(pe.e) == cudaErrorNotReady) {
            sched_yield();
            continue;
        }
        if (pe.host)
            cudaFreeHost(pe.p);
        else
            cudaFree(pe.p);
        cudaEventDestroy(pe.e);
        released++;
        pthread_mutex_lock(&rq.lock);
        rq.head++;
        pthread_mutex_unlock(&rq.lock);
    }
    ok(released == NPRODUCERS * PER_PRODUCER,
       "reclaimer released %zu entries (%zu polls)", released, polls);
    return NULL;
}

static void test_concurrency(void)
{
    pthread_t prod[NPRODUCERS], cons;
    int i;

    diag("concurrency: %d producers, one reclaimer", NPRODUCERS);
    fake_reset(1);
    cudaSetDevice(0);   /* the app uses device 0 before the reclaimer */
    rq.producers_left = NPRODUCERS;
    for (i = 0; i < NPRODUCERS; i++)
        if (pthread_create(&prod[i], NULL, producer_main,
                           (void *)(uintptr_t)(i + 1)) != 0)
            sysbail("pthread_create");
    if (pthread_create(&cons, NULL, consumer_main, NULL) != 0)
        sysbail("pthread_create");
    for (i = 0; i < NPRODUCERS; i++)
        pthread_join(prod[i], NULL);
    pthread_join(cons, NULL);
    is_int(fake_violations(), 0, "no violations");
    is_int((long long)fake_live_allocations(), 0, "everything released");
    is_int((long long)fake_live_events(), 0, "every event destroyed");
    is_int((long long)fake_invalid_releases(), 0, "no invalid releases");
}

/* ---- fork ------------------------------------------------------------- */

static atomic_int hammer_stop;

static void *hammer_main(void *arg)
{
    cudaEvent_t e = arg;

    while (!atomic_load(&hammer_stop))
        cudaEventQuery(e);
    return NULL;
}

/* A fork while another thread is inside the fake leaves the child a usable
 * fake (the lock is held across fork). */
static void test_fork(void)
{
    pthread_t t;
    cudaEvent_t e;
    int i, good = 0, status, n;

    diag("fork while another thread uses the fake");
    fake_reset(1);
    cudaEventCreate(&e);
    if (pthread_create(&t, NULL, hammer_main, e) != 0)
        sysbail("pthread_create");
    for (i = 0; i < 20; i++) {
        pid_t pid;

        fflush(stdout);
        pid = fork();
        if (pid < 0)
            sysbail("fork");
        if (pid == 0) {
            void *p;

            alarm(10);      /* a deadlock ends as a failure, not a hang */
            _exit(cudaGetDeviceCount(&n) == cudaSuccess && n == 1 &&
                  cudaMalloc(&p, 8) == cudaSuccess &&
                  cudaFree(p) == cudaSuccess ? 0 : 1);
        }
        if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0)
            good++;
    }
    atomic_store(&hammer_stop, 1);
    pthread_join(t, NULL);
    is_int(good, 20, "20 forked children could use the fake");
    cudaEventDestroy(e);
}

/* Run a group of tests; fake_reset clears violations, so check after each
 * group that it left none it did not expect. */
#define SECTION(fn) (fn(), is_int(fake_violations(), 0, \
                                 #fn ": no unexpected violations"))

int main(int argc, char **argv)
{
    int n = 0;

    if (argc > 1)
        return child_main(argv[1]);
    plan_lazy();
    is_int(cudaGetDeviceCount(&n), cudaSuccess,
           "cudaGetDeviceCount before any fake_reset");
    is_int(n, 1, "lazy default: one device");
    SECTION(test_exit_behaviour);
    SECTION(test_devices);
    SECTION(test_streams);
    SECTION(test_work);
    SECTION(test_events);
    SECTION(test_allocations);
    SECTION(test_oracle);
    SECTION(test_handout);
    SECTION(test_injection);
    SECTION(test_misc);
    SECTION(test_reset);
    SECTION(test_concurrency);
    SECTION(test_fork);
    return 0;
}
