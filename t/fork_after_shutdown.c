/* SPDX-License-Identifier: MIT */
/* A fork child made after defer_shutdown while a graph still held an entry
 * (shutdown does not wait for a graph: its destructor counts the entry
 * failed once the graph dies).  The child never releases what the parent
 * had pending, and no graph's destructor runs there (CUDA cannot be used
 * after fork): that entry counts as failed in the child, as what a child
 * forked before the shutdown abandons does (include/cudefer.h), and is not
 * counted a second time at the child's exit.  There defer_shutdown, called
 * again, returns cudaSuccess, and other calls are refused. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static void s_graph_entry_after_shutdown(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    begin_capture(s);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free into the capture");
    cudaGraph_t graph = end_capture(s);
    CHECK(defer_shutdown() == cudaSuccess, "defer_shutdown");
    struct defer_stats parent = stats_now();
    CHECK(parent.pending == 1 && parent.failed == 0,
          "the parent: the graph's entry pending (%llu), not failed (%llu)",
          ULL(parent.pending), ULL(parent.failed));
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork_flushed();
    if (pid == 0) {
        /* Its stderr to the parent, what it counts on it; then exit(),
         * so that cudefer's exit handler runs (the TAP library's makes the
         * status its own: not read; its stdout goes nowhere). */
        close(fds[0]);
        int null = open("/dev/null", O_WRONLY);
        if (dup2(fds[1], 2) < 0 || null < 0 || dup2(null, 1) < 0)
            child_end(1);
        struct defer_stats c = stats_now();
        fprintf(stderr, "child: pending %llu failed %llu deferred %llu\n",
                ULL(c.pending), ULL(c.failed), ULL(c.deferred));
        /* Shut down before the fork: a second shutdown, nothing to do. */
        fprintf(stderr, "child: defer_shutdown %d, defer_free %d\n",
                (int)defer_shutdown(), (int)defer_free(p, s));
        exit(0);
    }
    close(fds[1]);
    char text[4096];
    read_until(fds[0], now_ms() + 5000, text, sizeof text);
    close(fds[0]);
    int status;
    CHECK(wait_child(pid, 5000, &status), "the child ended");
    CHECK(strstr(text, "child: pending 0 failed 1 deferred 1\n") != NULL,
          "in the child the graph's entry counts failed, none pending "
          "(want pending 0 failed 1 deferred 1): %s", text);
    char want[96];
    snprintf(want, sizeof want, "child: defer_shutdown %d, defer_free %d\n",
             (int)cudaSuccess, (int)cudaErrorNotPermitted);
    CHECK(strstr(text, want) != NULL,
          "in the child defer_shutdown returns cudaSuccess, a free "
          "cudaErrorNotPermitted (the header): %s", text);
    CHECK(strstr(text, "entries still pending") == NULL,
          "the child's exit counts it no second time: %s", text);
    cudaGraphDestroy(graph);
    CHECK(wait_user_objects(0, 2000), "the graph's user object died");
    cudaStreamDestroy(s);
    cudaFree(p);
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    fork_scenario("a fork child after shutdown counts a graph's entry "
                  "failed, once", "", 1, 20000, s_graph_entry_after_shutdown);
    return 0;
}
