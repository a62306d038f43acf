/* SPDX-License-Identifier: MIT */
/* What process exit leaves pending once its drain ended in time
 * (src/lifecycle_hooks.c): the entries of a graph still alive, which the
 * drain does not wait for, count in leaked_at_exit and failed, once (the
 * graph destroyed after exit counts nothing more); an entry the exiting
 * thread is itself releasing on the synchronous route (exit() from a
 * callback run under CUDEFER_DISABLE) is running, not leaked; so is the
 * callback that calls exit() on the reclaimer thread, where no drain can
 * run, and what else is pending counts as leaked at once.  Each
 * scenario is a child that calls exit(); an exit handler registered before
 * cudefer's (so run after it) checks.  Exit giving up on a stuck call:
 * t/exit_abandon.c, t/exit_shutdown.c. */
#include <stdlib.h>

#include "helpers.h"

static struct defer_stats before_exit;
static cudaGraph_t graph;
static void say(const char *when, const struct defer_stats *st)
{
    diag("  %s: deferred %llu released %llu failed %llu pending %llu "
         "leaked_at_exit %llu",
         when, ULL(st->deferred), ULL(st->released), ULL(st->failed),
         ULL(st->pending), ULL(st->leaked_at_exit));
}

/* After cudefer's exit handler: the graph's `held` entries (and `running`
 * more, the exiting thread's own) are what exit left; destroying the graph
 * then counts nothing more. */
static void check_left(uint64_t held, uint64_t running)
{
    struct defer_stats st = stats_now();
    say("after exit", &st);
    CHECK(st.leaked_at_exit == held,
          "leaked_at_exit %llu: want the graph's %llu entries",
          ULL(st.leaked_at_exit), ULL(held));
    CHECK(st.failed - before_exit.failed == held,
          "failed counts the graph's %llu entries: %llu more",
          ULL(held), ULL(st.failed - before_exit.failed));
    CHECK(st.pending == running,
          "pending %llu after exit (want %llu: the exiting thread's own)",
          ULL(st.pending), ULL(running));
    cudaGraphDestroy(graph);
    CHECK(wait_user_objects(0, 2000), "the graph's user objects died");
    struct defer_stats after = stats_now();
    say("graph destroyed", &after);
    CHECK(after.failed == st.failed && after.released == st.released &&
              after.leaked_at_exit == st.leaked_at_exit,
          "the graph destroyed after exit counts nothing more: failed %llu "
          "-> %llu, released %llu -> %llu",
          ULL(st.failed), ULL(after.failed), ULL(st.released),
          ULL(after.released));
    CHECK(noop_counted_calls == 0, "the graph's callback did not run");
    scenario_child_end();
}

/* A free and a callback captured into a graph on s, the graph kept. */
static void capture_two(cudaStream_t s)
{
    void *p = device_alloc(64);
    begin_capture(s);
    captured_work(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free in the capture");
    CHECK(defer_call(noop_counted, NULL, s) == cudaSuccess,
          "defer_call in the capture");
    graph = end_capture(s);
}

/* ---- a graph still alive at exit ---------------------------------------- */

static void check_graph_alive(void)
{
    check_left(2, 0);
}

static void s_graph_alive(void)
{
    atexit(check_graph_alive); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new();
    void *q = device_alloc(64);
    CHECK(defer_free(q, s) == cudaSuccess, "a plain free");
    CHECK(defer_flush() == cudaSuccess, "flush");
    capture_two(s);
    before_exit = stats_now();
    say("before exit", &before_exit);
    CHECK(before_exit.pending == 2 && before_exit.leaked_at_exit == 0,
          "the graph's 2 entries pending before exit (%llu)",
          ULL(before_exit.pending));
    exit(0);
}

/* ---- a graph still alive at exit after defer_shutdown ------------------- */

static void s_graph_alive_after_shutdown(void)
{
    atexit(check_graph_alive); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new();
    capture_two(s);
    CHECK(defer_shutdown() == cudaSuccess, "defer_shutdown");
    before_exit = stats_now();
    say("before exit", &before_exit);
    CHECK(before_exit.pending == 2 && before_exit.leaked_at_exit == 0,
          "the graph's 2 entries pending before exit (%llu)",
          ULL(before_exit.pending));
    exit(0);
}

/* ---- and exit() from a synchronous callback ----------------------------- */

static void check_exit_in_callback(void)
{
    check_left(2, 1);
}

static void exit_in_callback(void *arg)
{
    (void)arg;
    before_exit = stats_now();
    say("in the callback", &before_exit);
    exit(0);
}

static void s_exit_in_sync_callback(void)
{
    atexit(check_exit_in_callback); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new();
    capture_two(s);
    CHECK(defer_call(exit_in_callback, NULL, s) == cudaSuccess,
          "defer_call");
    CHECK(false, "exit() in the callback returned");
}

/* ---- and exit() from a callback on the reclaimer thread ----------------- */

static void *held_ptr;

static void check_exit_on_reclaimer(void)
{
    CHECK(fake_is_released(held_ptr) == 0, "the free whose work runs is "
          "not released");
    check_left(3, 1);
}

static void s_exit_on_reclaimer(void)
{
    atexit(check_exit_on_reclaimer); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new(), other = stream_new();
    held_ptr = device_alloc(64);
    work_held(other, held_ptr);
    CHECK(defer_free(held_ptr, other) == cudaSuccess, "a free, work held");
    capture_two(s);
    CHECK(defer_call(exit_in_callback, NULL, stream_new()) == cudaSuccess,
          "defer_call");
    sleep_ms(10000);
    CHECK(false, "exit() in the callback did not end the process");
    scenario_child_end();
}

int main(void)
{
    plan(4);
    fork_scenario("exit while a graph holds entries: leaked_at_exit and "
                  "failed count them, once",
                  "", 1, 30000, s_graph_alive);
    fork_scenario("exit after defer_shutdown while a graph holds entries: "
                  "leaked_at_exit and failed count them, once",
                  "", 1, 30000, s_graph_alive_after_shutdown);
    fork_scenario("exit() from a synchronous callback while a graph holds "
                  "entries: the graph's counted leaked, the callback's own "
                  "entry not",
                  "CUDEFER_DISABLE=1", 1, 30000, s_exit_in_sync_callback);
    fork_scenario("exit() from a callback on the reclaimer thread while a "
                  "graph and a free hold entries: both counted leaked, the "
                  "callback's own entry not",
                  "", 1, 30000, s_exit_on_reclaimer);
    return 0;
}
