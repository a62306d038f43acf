/* SPDX-License-Identifier: MIT */
/* fork() while another thread holds one of cudefer's locks: the child must
 * not inherit them locked.  Here the thread that
 * starts the reclaimer is stopped inside the start, holding the lifecycle
 * and configuration locks: CUDEFER_VERBOSE=1 prints the configuration to a
 * pipe that is full and not read.  A fork child then calls defer_configure
 * and defer_shutdown: each must return, the shutdown refused (the child of
 * a start under way has no reclaimer, as a running library's).  And a thread
 * reads the statistics (the event pool's registry lock) while the parent
 * forks again and again: no child may hang in cudefer's fork handler. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static cudaStream_t stream;
static void *starter_ptr;

static void *starter(void *unused)
{
    (void)unused;
    if (defer_free(starter_ptr, stream) != cudaSuccess)
        CHECK(false, "the starter's defer_free was refused");
    return NULL;
}

/* The fork child.  The starter holds stderr's stdio lock too (it is
 * blocked writing), and the child inherits that lock: cudefer's lines do
 * not take it.  Its stderr is the full pipe: /dev/null instead.  A child
 * of a start under way is refused (its calls print why); each call must
 * return.  _exit with the result. */
static void child_calls(void)
{
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0)
        dup2(null, STDERR_FILENO);
    unsetenv("CUDEFER_VERBOSE");
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    defer_configure(&cfg); /* returns: the configuration lock is usable */
    /* Takes the lifecycle lock, and starts no thread (ThreadSanitizer does
     * not support starting one in the fork child of a threaded process). */
    cudaError_t err = defer_shutdown(); /* the lifecycle lock is usable */
    _exit(err == cudaErrorNotPermitted ? 0 : 1);
}

static void s_fork_during_start(void)
{
    stream = stream_new();
    starter_ptr = device_alloc(64);
    work_timed(stream, 100, starter_ptr);
    /* stderr: a pipe filled to the brim, so the start's print blocks. */
    int fds[2];
    if (pipe(fds) != 0)
        sysbail("pipe");
    int saved = dup(STDERR_FILENO);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    char junk[4096];
    memset(junk, 'x', sizeof junk);
    while (write(fds[1], junk, sizeof junk) > 0) {
    }
    fcntl(fds[1], F_SETFL, 0);
    dup2(fds[1], STDERR_FILENO);
    pthread_t t;
    pthread_create(&t, NULL, starter, NULL);
    sleep_ms(100); /* the starter now blocks in the start's print */

    fflush(stdout); /* not stderr: its lock is the starter's */
    pid_t pid = fork();
    if (pid < 0)
        sysbail("fork");
    if (pid == 0)
        child_calls();
    int status = 0;
    bool ended = wait_child(pid, 30000, &status);

    /* Let the starter finish: read the pipe until it is done. */
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    for (int i = 0; i < 2000 && fake_is_released(starter_ptr) != 1; i++) {
        while (read(fds[0], junk, sizeof junk) > 0) {
        }
        defer_flush();
        sleep_ms(1);
    }
    dup2(saved, STDERR_FILENO);
    pthread_join(t, NULL);
    CHECK(ended, "the fork child hung on a lock held at the fork (killed "
          "after 5 s)");
    CHECK(!ended || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
          "the fork child's status %d", status);
    CHECK(defer_shutdown() == cudaSuccess, "the parent shuts down");
    CHECK(fake_is_released(starter_ptr) == 1, "the parent released its "
          "buffer");
}

static atomic_int stop_reading;

static void *stats_reader(void *unused)
{
    (void)unused;
    struct defer_stats s;
    while (!atomic_load(&stop_reading))
        defer_stats_get(&s);
    return NULL;
}

static void *idle_thread(void *arg)
{
    /* A defer_free registers this thread's event cache: the registry the
     * statistics walk gets longer. */
    cudaStream_t s = arg;
    void *p = device_alloc(64);
    work_timed(s, 100, p);
    defer_free(p, s);
    while (!atomic_load(&stop_reading))
        sleep_ms(1);
    return NULL;
}

static void s_fork_while_reading_stats(void)
{
    stream = stream_new();
    void *p = device_alloc(64);
    work_timed(stream, 100, p);
    CHECK(defer_free(p, stream) == cudaSuccess, "the library runs");
    pthread_t idle[8], reader;
    for (int i = 0; i < 8; i++)
        pthread_create(&idle[i], NULL, idle_thread, stream);
    sleep_ms(20);
    pthread_create(&reader, NULL, stats_reader, NULL);
    int hung = 0, forks = 0;
    for (; forks < 200 && !hung; forks++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
            sysbail("fork");
        if (pid == 0)
            _exit(0); /* cudefer's fork handler ran before fork returned */
        int status = 0;
        if (!wait_child(pid, 30000, &status))
            hung = 1;
    }
    atomic_store(&stop_reading, 1);
    pthread_join(reader, NULL);
    for (int i = 0; i < 8; i++)
        pthread_join(idle[i], NULL);
    CHECK(!hung, "a fork child hung in cudefer's fork handler (fork %d of "
          "200, while a thread read the statistics)", forks);
    CHECK(defer_shutdown() == cudaSuccess, "the parent shuts down");
}

int main(void)
{
    plan_lazy();
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_VERBOSE=1");
        fake_reset(1);
        failed_checks = 0;
        s_fork_during_start();
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, 30000, &status);
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "fork while a thread holds the lifecycle and configuration locks: the "
       "child's defer_configure and defer_shutdown return");
    pid = fork_flushed();
    if (pid == 0) {
        fake_reset(1);
        failed_checks = 0;
        s_fork_while_reading_stats();
        scenario_child_end();
    }
    ended = wait_child(pid, 120000, &status);
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "fork, 200 times, while another thread reads the statistics: no "
       "child hangs");
    return 0;
}
