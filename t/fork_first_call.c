/* SPDX-License-Identifier: MIT */
/* fork() racing the process's first defer call.  glibc runs in a fork
 * child only the atfork handlers registered when fork() began, and drops
 * its atfork lock around each prepare handler; a handler that cudefer
 * registered in its first call could therefore miss a fork() that began
 * before it, and the child would inherit a running library with no
 * reclaimer thread: defer_shutdown (or a flush, a trim) there waited for
 * ever.  Each child here must find its calls refused, never hang.
 *
 * First deterministically: a prepare handler of the program's own holds
 * fork() open until another thread's first defer call has started the
 * library.  Then many rounds of a first call and a fork() at once. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define ROUNDS 150

static atomic_int in_prepare, first_done;
static cudaStream_t stream;

/* The program's own prepare handler: fork() waits here (2 s at most) for
 * the first call, made meanwhile on another thread. */
static void slow_prepare(void)
{
    if (atomic_load(&first_done) < 0)
        return; /* not this test's fork */
    atomic_store(&in_prepare, 1);
    double until = now_ms() + 2000;
    while (!atomic_load(&first_done) && now_ms() < until)
        sleep_ms(1);
}

/* The first defer calls of the process: an allocation, its free. */
static void first_calls(void)
{
    void *p = NULL;
    CHECK(defer_alloc(&p, 4096, stream) == cudaSuccess && p != NULL,
          "the first defer_alloc");
    CHECK(defer_free(p, stream) == cudaSuccess, "its defer_free");
}

static void *first_caller_in_prepare(void *unused)
{
    (void)unused;
    double until = now_ms() + 5000;
    while (!atomic_load(&in_prepare) && now_ms() < until)
        sleep_ms(1);
    first_calls();
    atomic_store(&first_done, 1);
    return NULL;
}

/* In a fork child: defer_shutdown returns (refused where the parent had
 * started the library or was starting it), and a defer_alloc after it is
 * refused without starting anything.  Ends the child. */
static _Noreturn void child_calls(bool parent_started)
{
    cudaError_t err = defer_shutdown();
    if (parent_started)
        CHECK(err == cudaErrorNotPermitted,
              "the child of a started library: defer_shutdown refused (%s)",
              cudaGetErrorName(err));
    void *p = NULL;
    err = defer_alloc(&p, 4096, stream);
    CHECK(err == cudaErrorNotPermitted && p == NULL,
          "the child: defer_alloc refused (%s)", cudaGetErrorName(err));
    child_end(failed_checks);
}

/* Fork, the child running child_calls; the parent waits for it (5 s). */
static void fork_and_wait(bool parent_started_known)
{
    pid_t pid = fork_flushed();
    if (pid == 0)
        child_calls(parent_started_known && atomic_load(&first_done) == 1);
    int status = 0;
    bool ended = wait_child(pid, 5000, &status);
    CHECK(ended, "the fork child ended (it hung in a defer call)");
    CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the fork child's checks passed");
}

/* Deterministic: fork() is held in the program's prepare handler while
 * another thread makes the process's first defer calls. */
static void scenario_first_call_inside_fork(void)
{
    stream = stream_new();
    atomic_store(&first_done, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, first_caller_in_prepare, NULL) != 0)
        sysbail("pthread_create");
    fork_and_wait(true);
    pthread_join(t, NULL);
    CHECK(atomic_load(&first_done) == 1, "the first calls were made");
}

static void *first_caller(void *unused)
{
    (void)unused;
    first_calls();
    return NULL;
}

/* One round: a first call on one thread, fork() at once on another. */
static void scenario_round(void)
{
    stream = stream_new();
    pthread_t t;
    if (pthread_create(&t, NULL, first_caller, NULL) != 0)
        sysbail("pthread_create");
    fork_and_wait(false);
    pthread_join(t, NULL);
}

/* A fork child made after a first call whose start failed (here its
 * cudaGetDeviceCount; a failed pthread_create comes after that call, CUDA
 * then up in the parent) refuses, as a child of a started library does:
 * it started cudefer, and so used CUDA after fork. */
static void scenario_after_failed_start(void)
{
    stream = stream_new();
    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, 1);
    stderr_capture_begin();
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 4096, stream);
    stderr_capture_end();
    fake_fail_clear();
    CHECK(err == cudaErrorNoDevice, "the first call's start failed (%s)",
          cudaGetErrorName(err));
    unsigned long counts = fake_calls(FAKE_GET_DEVICE_COUNT);
    pid_t pid = fork_flushed();
    if (pid == 0) {
        CHECK(fake_calls(FAKE_GET_DEVICE_COUNT) == counts,
              "the child asked CUDA nothing");
        child_calls(true);
    }
    int status = 0;
    bool ended = wait_child(pid, 5000, &status);
    CHECK(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the fork child's calls were refused, no start tried there");
}

int main(void)
{
    plan_lazy();
    atomic_store(&first_done, -1);
    /* The fake registers its fork handlers first: prepare handlers run in
     * the reverse order, so this one runs before the fake's takes its lock
     * (which would hold the first call up until fork() is over). */
    fake_reset(1);
    if (pthread_atfork(slow_prepare, NULL, NULL) != 0)
        bail("pthread_atfork");
    fork_scenario("a fork child after a failed start refuses, starts "
                  "nothing", "", 1, 20000, scenario_after_failed_start);
    fork_scenario("fork() held open while another thread's first defer call "
                  "starts the library: the child refuses, never hangs",
                  "", 1, 20000, scenario_first_call_inside_fork);
    atomic_store(&first_done, -1);
    int hung = 0;
    double start = now_ms();
    for (int i = 0; i < ROUNDS; i++) {
        pid_t pid = fork_flushed();
        if (pid == 0) {
            fake_reset(1);
            failed_checks = 0;
            scenario_round();
            scenario_child_end();
        }
        int status = 0;
        if (!wait_child(pid, 20000, &status) || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            hung++;
    }
    is_int(hung, 0, "%d rounds of a first defer call racing fork(): every "
           "child refused or started cleanly, none hung (%.0f ms)",
           ROUNDS, now_ms() - start);
    return 0;
}
