/* SPDX-License-Identifier: MIT */
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
#include "fake_selftest.h"

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

void test_exit_behaviour(void)
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
    SECTION(test_wait_lattice);
    SECTION(test_allocations);
    SECTION(test_oracle);
    SECTION(test_handout);
    SECTION(test_handout_ranges);
    SECTION(test_pools);
    SECTION(test_pool_frees);
    SECTION(test_malloc_free_async);
    SECTION(test_address_reuse);
    SECTION(test_injection);
    SECTION(test_misc);
    SECTION(test_reset);
    SECTION(test_concurrency);
    SECTION(test_thread_accessors);
    SECTION(test_fork);
    return 0;
}
