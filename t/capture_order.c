/* SPDX-License-Identifier: MIT */
/* A defer call on a capturing stream waits for the graph (t/capture.c) and
 * also for the work enqueued on the stream before the capture began: that
 * work may still use the memory when the graph dies, e.g. when the graph
 * was never launched on that stream.  Also what the reclaimer does on a
 * dead graph's stream (its event, its calls failing, a death inside a
 * poll), and a graph dead at the shutdown or dying while exit drains:
 * released by the drain, not dropped. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

/* Device memory at *p, used by held work on s (returned) and freed with
 * defer_free in a capture that s begins: the capture's entry, which waits
 * for that work once the graph is gone. */
static fake_work *free_in_capture(cudaStream_t s, void **p)
{
    *p = device_alloc(256);
    fake_work *w = work_held(s, *p);
    begin_capture(s);
    CHECK(defer_free(*p, s) == cudaSuccess, "defer_free in a capture");
    return w;
}

static int called;
static void mark(void *arg)
{
    (void)arg;
    __atomic_store_n(&called, 1, __ATOMIC_RELEASE);
}

/* The case: work before the capture uses p; the graph is never
 * launched and dies at once. */
static void test_free_waits_for_work_before_capture(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    fake_work *before = work_held(s, p);
    begin_capture(s);
    fake_launch(s, 100, &p, 1);
    is_int(defer_free(p, s), cudaSuccess, "defer_free on a capturing stream");
    cudaGraphDestroy(end_capture(s));
    ok(wait_user_objects(0, 2000), "the graph is gone");
    defer_flush();
    sleep_ms(20);
    is_int(fake_is_released(p), 0, "held: the work enqueued before the "
           "capture still runs");
    fake_complete(before);
    ok(wait_released(p, 10000), "released once that work completed");
    cudaStreamDestroy(s);
}

static void test_call_waits_for_work_before_capture(void)
{
    cudaStream_t s = stream_new();
    fake_work *before = work_held(s, NULL);
    begin_capture(s);
    is_int(defer_call(mark, NULL, s), cudaSuccess, "defer_call in a capture");
    cudaGraphDestroy(end_capture(s));
    ok(wait_user_objects(0, 2000), "the graph is gone");
    sleep_ms(20);
    is_int(__atomic_load_n(&called, __ATOMIC_ACQUIRE), 0,
           "not called: the work enqueued before the capture still runs");
    fake_complete(before);
    ok(wait_flag(&called, 10000), "called once it completed");
    cudaStreamDestroy(s);
}

/* Two streams in one capture: the second one's earlier work counts too. */
static void test_group_waits_for_every_stream(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = device_alloc(256);
    fake_work *before = work_held(s2, p);
    begin_capture(s);
    is_int(fake_capture_join(s2, s), cudaSuccess, "s2 joins the capture");
    cudaStream_t both[2] = {s, s2};
    is_int(defer_free_streams(p, both, 2), cudaSuccess,
           "defer_free_streams on two capturing streams");
    cudaGraph_t graph = NULL;
    is_int(cudaStreamEndCapture(s, &graph), cudaSuccess, "end the capture");
    cudaGraphDestroy(graph);
    ok(wait_user_objects(0, 2000), "the graph is gone");
    sleep_ms(20);
    is_int(fake_is_released(p), 0, "held: s2's earlier work still runs");
    fake_complete(before);
    ok(wait_released(p, 10000), "released once it completed");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

/* The graph launched and kept: the entry waits for the graph as before,
 * the earlier work long done. */
static void test_graph_still_waited_for(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    work_timed(s, 100, p);
    begin_capture(s);
    fake_launch(s, 100, &p, 1);
    defer_free(p, s);
    cudaGraph_t graph = end_capture(s);
    cudaGraphExec_t exec = NULL;
    cudaGraphInstantiate(&exec, graph, 0);
    fake_work *l = fake_graph_launch_held(exec, s);
    sleep_ms(20);
    defer_flush();
    is_int(fake_is_released(p), 0, "held while the graph lives");
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(exec);
    fake_complete(l);
    ok(wait_released(p, 10000), "released once the graph is gone");
    cudaStreamDestroy(s);
}

/* The stream destroyed right after its capture ended: cudefer may not
 * have seen the end (then it cannot wait for the stream's earlier work:
 * the entry fails, reported, never released), or it recorded its event
 * first (then the entry waits for that work).  Never released early. */
static void test_stream_destroyed_after_capture(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *before = work_held(s, p);
    uint64_t failed = stats_now().failed;
    begin_capture(s);
    fake_launch(s, 100, &p, 1);
    defer_free(p, s);
    cudaGraph_t graph = end_capture(s);
    stderr_capture_begin();
    cudaStreamDestroy(s);
    cudaGraphDestroy(graph);
    ok(wait_user_objects(0, 2000), "the graph is gone");
    sleep_ms(20);
    is_int(fake_is_released(p), 0, "not released while the earlier work "
           "runs");
    fake_complete(before);
    for (int i = 0; i < 2000 && fake_is_released(p) == 0 &&
                    stats_now().failed == failed;
         i++)
        sleep_ms(1);
    const char *msg = stderr_capture_end();
    if (fake_is_released(p) == 1) {
        diag("  the end of the capture was seen before the stream went");
        ok(true, "released after the earlier work");
    } else {
        ok(stats_now().failed == failed + 1 &&
               strstr(msg, "was destroyed") != NULL,
           "not released: counted as failed and reported");
        cudaFree(p);
    }
}

/* ---- a graph dead before defer_shutdown ---------------------------------- */

static void *complete_later(void *w)
{
    sleep_ms(100);
    fake_complete(w);
    return NULL;
}

/* Its stream's work from before the capture still runs at the shutdown:
 * the drain waits for it, as for any entry's event, and releases the
 * entry (not given up and failed). */
static void s_dead_graph_at_shutdown(void)
{
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    sleep_ms(20); /* the reclaimer saw the end: its event is recorded */
    pthread_t t;
    pthread_create(&t, NULL, complete_later, w);
    cudaError_t err = defer_shutdown();
    pthread_join(t, NULL);
    struct defer_stats st = stats_now();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    CHECK(fake_is_released(p) == 1 && st.failed == 0,
          "released by the shutdown's drain (failed %llu)", ULL(st.failed));
}

/* The reclaimer held in its cudaMemPoolTrimTo, which only the shutdown's
 * pass makes here (no trim is asked for), after that pass polled the
 * graphs' streams: 1 arms, 2 while held, 3 lets it go. */
static _Atomic int stop_hold;

static void hold_stopping_pass(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)r;
    (void)arg;
    hold_reclaimer_in_call(&stop_hold, 1, 2);
}

static void *shutdown_thread(void *err)
{
    *(cudaError_t *)err = defer_shutdown();
    return NULL;
}

/* The capture ends and its graph dies while the shutdown's last pass is
 * under way, after that pass saw the stream still capturing.  Where the
 * stream's work from before the capture still runs (running), the drain
 * waits for it and releases the entry, as it does for a graph dead before
 * the shutdown, rather than give it up as not done at shutdown; where that
 * work is done, the stop's own look finds the entry complete, and the
 * drain releases it before the reclaimer ends, not left for good. */
static void graph_dies_in_stopping_pass(bool running)
{
    cudaStream_t s0 = stream_new();
    void *block = NULL;
    CHECK(defer_alloc(&block, 256, s0) == cudaSuccess &&
              defer_free(block, s0) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "a block of defer_alloc's back in the cache: the shutdown trims "
          "its pool");
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    if (!running)
        fake_complete(w);
    atomic_store(&stop_hold, 1);
    fake_set_return_hook(FAKE_MEM_POOL_TRIM, hold_stopping_pass, NULL);
    pthread_t t;
    cudaError_t err = cudaErrorUnknown;
    pthread_create(&t, NULL, shutdown_thread, &err);
    for (double until = now_ms() + 10000;
         atomic_load(&stop_hold) != 2 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&stop_hold) == 2,
          "the shutdown's pass reached the pool's trim");
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    atomic_store(&stop_hold, 3);
    if (running) {
        sleep_ms(50); /* the pass ends: the reclaimer records after w */
        CHECK(fake_is_released(p) == 0, "not released while w runs");
        fake_complete(w);
    }
    pthread_join(t, NULL);
    const char *said = stderr_capture_end();
    fake_set_return_hook(FAKE_MEM_POOL_TRIM, NULL, NULL);
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    CHECK(fake_is_released(p) == 1 && stats_now().failed == failed,
          "released by the shutdown's drain once w completed, not failed "
          "(failed %llu, stderr: \"%s\")",
          ULL(stats_now().failed - failed), said);
}

static void s_graph_dies_in_stopping_pass(void)
{
    graph_dies_in_stopping_pass(true);
}

static void s_graph_dies_in_stopping_pass_work_done(void)
{
    graph_dies_in_stopping_pass(false);
}

/* A graph that dies while the reclaimer queries its stream's earlier
 * work, settled in that same pass: the idle reclaimer sleeps after (before
 * the fix the death stayed news, and it woke 900 times a second). */
static cudaGraph_t racing_graph;
static _Atomic int race_armed;

static void destroy_in_query(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)arg;
    int armed = 1;
    if (r != cudaSuccess || !atomic_compare_exchange_strong(&race_armed,
                                                            &armed, 0))
        return;
    cudaGraphDestroy(racing_graph);
    wait_user_objects(0, 2000);
}

static void s_death_during_poll(void)
{
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    racing_graph = end_capture(s);
    sleep_ms(20); /* its origin event recorded, pending behind w */
    fake_set_return_hook(FAKE_EVENT_QUERY, destroy_in_query, NULL);
    atomic_store(&race_armed, 1);
    fake_complete(w);
    CHECK(wait_released(p, 5000), "released once the graph died");
    fake_set_return_hook(FAKE_EVENT_QUERY, NULL, NULL);
    CHECK(atomic_load(&race_armed) == 0, "the graph died inside a query");
    sleep_ms(100);
    uint64_t before = stats_now().wakeups;
    sleep_ms(500);
    uint64_t woke = stats_now().wakeups - before;
    CHECK(woke < 20, "the idle reclaimer sleeps: %llu wake-ups in 500 ms",
          ULL(woke));
}

/* ---- the reclaimer's calls on a dead graph's stream ----------------------- */

/* How many times what occurs in text. */
static int lines_containing(const char *text, const char *what)
{
    int n = 0;
    for (const char *at = text; (at = strstr(at, what)) != NULL;
         at += strlen(what))
        n++;
    return n;
}

/* A call of the reclaimer's for a dead graph's entry at p (its work w
 * held) fails with want, stderr captured since the injection: the entry
 * is counted failed (failed: the count before), the device fails, said in
 * a line naming it (device, "device N") and the call, a flush returns
 * want, and p is never released, even once w completes.  Ends the capture
 * and the injection, and shuts cudefer down. */
static void check_device_failed(uint64_t failed, const char *device,
                                const char *call, cudaError_t want, void *p,
                                fake_work *w)
{
    for (double until = now_ms() + 10000;
         stats_now().failed == failed && now_ms() < until;)
        sleep_ms(1);
    cudaError_t err = defer_flush();
    const char *said = stderr_capture_end();
    fake_fail_clear();
    CHECK(stats_now().failed == failed + 1, "the entry counted failed (%llu)",
          ULL(stats_now().failed - failed));
    CHECK(has_line(said, device, call, NULL),
          "said, naming the device and the call (stderr: \"%s\")", said);
    CHECK(err == want, "the flush: %s", cudaGetErrorName(err));
    fake_complete(w);
    sleep_ms(20);
    CHECK(fake_is_released(p) == 0, "never released");
    stderr_capture_begin();
    defer_shutdown();
    stderr_capture_end();
}

/* The event the reclaimer records on a dead graph's stream once its
 * capture ended cannot be made (cudaEventCreateWithFlags fails, pass
 * after pass): said once, naming the call and the error, while the entry
 * waits; never released while the work before the capture runs, and
 * released once an event can be made and that work is done. */
static void s_origin_event_create_fails(void)
{
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    unsigned long creates = fake_calls(FAKE_EVENT_CREATE);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    for (double until = now_ms() + 10000;
         fake_calls(FAKE_EVENT_CREATE) < creates + 3 && now_ms() < until;)
        sleep_ms(1);
    const char *said = stderr_capture_end();
    CHECK(fake_calls(FAKE_EVENT_CREATE) >= creates + 3,
          "the reclaimer tried to make the event, pass after pass (%lu)",
          fake_calls(FAKE_EVENT_CREATE) - creates);
    CHECK(lines_containing(said, "cudaEventCreateWithFlags failed") == 1 &&
              strstr(said, "cudaErrorMemoryAllocation") != NULL,
          "said once, naming the call and the error (stderr: \"%s\")", said);
    CHECK(fake_is_released(p) == 0, "not released: w runs");
    fake_fail_clear();
    sleep_ms(20); /* an event now, recorded after w */
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
}

/* A free of *p captured on a new stream behind work w (returned, held),
 * the graph then destroyed: returns once the reclaimer recorded the event
 * it queries for the work before the capture. */
static fake_work *dead_graph_recorded(void **p)
{
    cudaStream_t s = stream_new();
    fake_work *w = free_in_capture(s, p);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    for (double until = now_ms() + 10000;
         fake_calls(FAKE_EVENT_RECORD) == records && now_ms() < until;)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_EVENT_RECORD) > records,
          "the reclaimer recorded an event after the capture");
    return w;
}

/* The query of the event recorded on a dead graph's stream after its
 * capture fails: what a failed query of any entry's event is
 * (reclaimer_poll.c): never completion, so the device fails, said once
 * naming the device and the call, and a flush returns the error; the
 * entry is counted failed, never released. */
static void s_origin_query_fails(void)
{
    void *p;
    fake_work *w = dead_graph_recorded(&p);
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, cudaErrorInvalidResourceHandle, 0, 1);
    check_device_failed(failed, "device 0", "cudaEventQuery",
                        cudaErrorInvalidResourceHandle, p, w);
    cudaFree(p);
}

/* The query of the event recorded on a dead graph's stream after its
 * capture meets a capture's error (cudaErrorCapturedEvent: a capture the
 * stream began between the reclaimer's look and its record took the
 * record, which the real runtime captures where the fake refuses it): no
 * completion, nor the device's failure; the event is recorded again once
 * the stream no longer captures, and the entry is released only once the
 * work before the capture is done. */
static void s_origin_query_captured(void)
{
    void *p;
    fake_work *w = dead_graph_recorded(&p);
    unsigned long queries = fake_calls(FAKE_EVENT_QUERY);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    fake_fail(FAKE_EVENT_QUERY, cudaErrorCapturedEvent, 0, 1);
    for (double until = now_ms() + 10000;
         fake_calls(FAKE_EVENT_RECORD) == records && now_ms() < until;)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_EVENT_QUERY) > queries &&
              fake_calls(FAKE_EVENT_RECORD) > records,
          "the query met the capture's error, and the event was recorded "
          "again (queries %lu, records %lu)",
          fake_calls(FAKE_EVENT_QUERY) - queries,
          fake_calls(FAKE_EVENT_RECORD) - records);
    sleep_ms(20);
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
    cudaError_t err = defer_flush();
    CHECK(err == cudaSuccess, "no device failed: flush %s",
          cudaGetErrorName(err));
}

/* The record of the event on a dead graph's stream, once its capture
 * ended, meets a capture's error (a capture the stream began after the
 * reclaimer's look took it; the fake would count that record a violation,
 * so the error is injected): the stream lives, so the record is made again
 * on a later pass, not taken for a stream gone; the entry is released
 * once the work before the capture is done, nothing failed or said. */
static void s_origin_record_captured(void)
{
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorStreamCaptureUnsupported, 0, 1);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    for (double until = now_ms() + 2000;
         fake_calls(FAKE_EVENT_RECORD) < records + 2 && now_ms() < until;)
        sleep_ms(1);
    fake_fail_clear();
    CHECK(fake_calls(FAKE_EVENT_RECORD) >= records + 2,
          "the refused record was made again (records %lu)",
          fake_calls(FAKE_EVENT_RECORD) - records);
    sleep_ms(20);
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
    const char *said = stderr_capture_end();
    CHECK(stats_now().failed == failed && strstr(said, "cudefer") == NULL,
          "nothing failed or said (failed %llu, stderr: \"%s\")",
          ULL(stats_now().failed - failed), said);
}

/* The reclaimer's cudaSetDevice to the device of a dead graph's stream
 * (device 1, the reclaimer on device 0) fails: what any failed switch of
 * the reclaimer's is (reclaimer_use_device): that device fails, said once
 * naming the device and the call, a flush returns the error; the entry is
 * counted failed, never released. */
static void s_origin_set_device_fails(void)
{
    cudaStream_t s0 = stream_new();
    void *q = device_alloc(256);
    CHECK(cudaSetDevice(1) == cudaSuccess, "device 1");
    cudaStream_t s = stream_new();
    void *p;
    fake_work *w = free_in_capture(s, &p);
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    CHECK(defer_free(q, s0) == cudaSuccess && defer_flush() == cudaSuccess,
          "a free on device 0, flushed: the reclaimer's device is 0");
    uint64_t failed = stats_now().failed;
    unsigned long sets = fake_calls(FAKE_SET_DEVICE);
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorDevicesUnavailable, 0, 1);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    check_device_failed(failed, "device 1", "cudaSetDevice",
                        cudaErrorDevicesUnavailable, p, w);
    CHECK(fake_calls(FAKE_SET_DEVICE) > sets, "the reclaimer switched");
}

/* The event the reclaimer makes for a captured entry's stream, and its
 * queries, count in events_created and event_queries as every event and
 * query of cudefer's do: the test makes and queries none, so the counters
 * match the calls CUDA saw (before: one event and its queries short). */
static void s_origin_event_counted(void)
{
    cudaStream_t s = stream_new();
    void *p;
    fake_work *before = free_in_capture(s, &p);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    sleep_ms(20); /* its stream's event recorded and queried, not ready */
    fake_complete(before);
    CHECK(wait_released(p, 10000), "released");
    CHECK(defer_flush() == cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    unsigned long created = fake_calls(FAKE_EVENT_CREATE),
                  queried = fake_calls(FAKE_EVENT_QUERY);
    CHECK(st.events_created == created,
          "events_created %llu, CUDA made %lu", ULL(st.events_created),
          created);
    CHECK(st.event_queries == queried, "event_queries %llu, CUDA saw %lu",
          ULL(st.event_queries), queried);
}

/* ---- a graph that dies while exit drains -------------------------------- */

static cudaGraph_t exit_graph;
static void *exit_ptr;

/* Run by the exit drain: destroy the graph and wait for its user object's
 * destructor, so the entry reaches cudefer during the drain. */
static void destroy_graph_in_drain(void *unused)
{
    (void)unused;
    cudaGraphDestroy(exit_graph);
    for (int i = 0; i < 2000 && fake_live_user_objects() > 0; i++)
        sleep_ms(1);
}

static void judge_exit(void)
{
    CHECK(fake_is_released(exit_ptr) == 1, "the graph's entry was released "
          "by the exit drain");
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0, "pending %llu", ULL(st.pending));
    scenario_child_end();
}

static void s_graph_dies_in_exit_drain(void)
{
    atexit(judge_exit); /* before cudefer's: runs after it */
    cudaStream_t s = stream_new(), other = stream_new();
    exit_ptr = device_alloc(256);
    begin_capture(s);
    fake_launch(s, 100, &exit_ptr, 1);
    CHECK(defer_free(exit_ptr, s) == cudaSuccess, "defer_free in a capture");
    exit_graph = end_capture(s);
    work_timed(other, 20000, NULL);
    CHECK(defer_call(destroy_graph_in_drain, NULL, other) == cudaSuccess,
          "defer_call");
    exit(0);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a graph that dies while exit drains: its entry is released",
                  "", 1, 15000, s_graph_dies_in_exit_drain);
    fork_scenario("a graph dead before shutdown, its stream's earlier work "
                  "running: the shutdown waits and releases it",
                  "", 1, 15000, s_dead_graph_at_shutdown);
    fork_scenario("a graph that dies during the shutdown's last pass, its "
                  "stream's earlier work running: the shutdown waits and "
                  "releases it",
                  "", 1, 15000, s_graph_dies_in_stopping_pass);
    fork_scenario(
        "a graph that dies during the shutdown's last pass, its "
        "stream's earlier work done: the drain releases it before the "
        "reclaimer ends",
        "", 1, 15000, s_graph_dies_in_stopping_pass_work_done);
    fork_scenario("a graph that dies during the poll that settles it: the "
                  "reclaimer sleeps after",
                  "", 1, 15000, s_death_during_poll);
    fork_scenario(
        "a dead graph's stream: the reclaimer cannot make its event: "
        "said once, released once it can",
        "", 1, 15000, s_origin_event_create_fails);
    fork_scenario("a dead graph's stream: the query of its event fails: the "
                  "device fails, said",
                  "", 1, 15000, s_origin_query_fails);
    fork_scenario("a dead graph's stream: the query of its event meets a "
                  "capture's error: recorded again, released after the work",
                  "", 1, 15000, s_origin_query_captured);
    fork_scenario("a dead graph's stream: the record of its event meets a "
                  "capture's error: recorded again, released after the work",
                  "", 1, 15000, s_origin_record_captured);
    fork_scenario("a dead graph's stream on device 1: the reclaimer's "
                  "cudaSetDevice to it fails: the device fails, said",
                  "", 2, 30000, s_origin_set_device_fails);
    fork_scenario("a dead graph's stream: its event and queries counted", "",
                  1, 15000, s_origin_event_counted);
    fake_reset(2);
    test_free_waits_for_work_before_capture();
    test_call_waits_for_work_before_capture();
    test_group_waits_for_every_stream();
    test_graph_still_waited_for();
    test_stream_destroyed_after_capture();
    is_int(defer_flush(), cudaSuccess, "flush");
    struct defer_stats st = stats_now();
    ok(st.pending == 0 && st.deferred == st.released + st.failed,
       "stats agree: deferred %llu = released %llu + failed %llu",
       ULL(st.deferred), ULL(st.released), ULL(st.failed));
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early");
    return 0;
}
