/* SPDX-License-Identifier: MIT */
/* defer_shutdown and process exit racing threads that make their first
 * defer call while another thread starts the reclaimer.
 * The starter's cudaGetDeviceCount is slowed down, so the other threads
 * queue up behind the start; the starter then shuts down (or exits) at
 * once.  Neither may wait for the threads queued behind it: shutdown must
 * return, exit must drain without giving up.  Each scenario runs in a
 * child process, killed if it hangs. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define RACERS 31
#define START_LATENCY_NS 200000000u /* cudaGetDeviceCount: 200 ms */

struct racer {
    pthread_t thread;
    cudaStream_t stream;
    void *ptr;
    cudaError_t err;
};

static struct racer racers[RACERS];
static cudaStream_t starter_stream;
static void *starter_ptr;
static cudaError_t starter_err, shutdown_err;
static double exit_called_ms;

static void *racer_main(void *arg)
{
    struct racer *r = arg;
    r->err = defer_free(r->ptr, r->stream);
    return NULL;
}

/* Start the reclaimer (slowly), then shut it down at once. */
static void *starter_then_shutdown(void *unused)
{
    (void)unused;
    starter_err = defer_free(starter_ptr, starter_stream);
    shutdown_err = defer_shutdown();
    return NULL;
}

/* Start the reclaimer (slowly), then end the process at once. */
static void *starter_then_exit(void *unused)
{
    (void)unused;
    starter_err = defer_free(starter_ptr, starter_stream);
    exit_called_ms = now_ms();
    exit(0);
}

/* Streams and buffers with short work each; the start is slowed down. */
static void prepare(void)
{
    starter_stream = stream_new();
    starter_ptr = device_alloc(256);
    work_timed(starter_stream, 100, starter_ptr);
    for (int i = 0; i < RACERS; i++) {
        racers[i].stream = stream_new();
        racers[i].ptr = device_alloc(256);
        work_timed(racers[i].stream, 100, racers[i].ptr);
    }
    fake_set_latency(FAKE_GET_DEVICE_COUNT, START_LATENCY_NS);
}

/* Start the racers once the starter is inside the (slow) start; detached
 * when the process will exit under them (not joined: no thread leak). */
static void start_racers(bool detached)
{
    sleep_ms(30);
    for (int i = 0; i < RACERS; i++) {
        pthread_create(&racers[i].thread, NULL, racer_main, &racers[i]);
        if (detached)
            pthread_detach(racers[i].thread);
    }
}

static void s_shutdown(void)
{
    prepare();
    pthread_t starter;
    pthread_create(&starter, NULL, starter_then_shutdown, NULL);
    start_racers(false);
    pthread_join(starter, NULL);
    for (int i = 0; i < RACERS; i++)
        pthread_join(racers[i].thread, NULL);
    CHECK(starter_err == cudaSuccess, "the starter's defer_free: %s",
          cudaGetErrorName(starter_err));
    CHECK(shutdown_err == cudaSuccess, "defer_shutdown: %s",
          cudaGetErrorName(shutdown_err));
    CHECK(fake_is_released(starter_ptr) == 1, "the starter's buffer released");
    int accepted = 0, refused = 0;
    for (int i = 0; i < RACERS; i++) {
        if (racers[i].err == cudaSuccess) {
            accepted++;
            CHECK(fake_is_released(racers[i].ptr) == 1,
                  "racer %d: accepted before the shutdown, so released by it",
                  i);
        } else if (racers[i].err == cudaErrorNotPermitted) {
            refused++;
            CHECK(fake_is_released(racers[i].ptr) == 0,
                  "racer %d: refused, the caller keeps its buffer", i);
            cudaFree(racers[i].ptr);
        } else {
            CHECK(false, "racer %d: %s", i, cudaGetErrorName(racers[i].err));
        }
    }
    diag("  %d racers accepted before the shutdown, %d refused after it",
         accepted, refused);
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed == 0 && st.leaked_at_exit == 0,
          "pending %llu, failed %llu", ULL(st.pending), ULL(st.failed));
    CHECK(fake_live_allocations() == 0, "%zu allocations left",
          fake_live_allocations());
}

/* Runs after cudefer's exit handler (registered before cudefer starts):
 * judges the exit and ends the process with the number of failed checks. */
static void judge_exit(void)
{
    double took = now_ms() - exit_called_ms;
    struct defer_stats st = stats_now();
    diag("  exit took %.0f ms", took);
    CHECK(took < 1800, "exit waited %.0f ms (it gives up after 2 s: it "
          "waited for the threads queued behind the start)", took);
    CHECK(st.leaked_at_exit == 0, "leaked_at_exit %llu",
          ULL(st.leaked_at_exit));
    CHECK(fake_is_released(starter_ptr) == 1,
          "the starter's buffer released at exit");
    scenario_child_end();
}

static void s_exit(void)
{
    prepare();
    atexit(judge_exit);
    pthread_t starter;
    pthread_create(&starter, NULL, starter_then_exit, NULL);
    start_racers(true);
    pthread_join(starter, NULL); /* never returns: the starter exits */
    CHECK(false, "the starter's exit() returned");
}

int main(void)
{
    plan_lazy();
    for (int round = 0; round < 3; round++)
        fork_scenario("defer_shutdown right after a slow start, with "
                      "first-time callers queued behind the start: returns, "
                      "no hang",
                      "", 1, 15000, s_shutdown);
    for (int round = 0; round < 2; round++)
        fork_scenario("exit right after a slow start, with first-time callers "
                      "queued behind the start: drains at once",
                      "", 1, 15000, s_exit);
    return 0;
}
