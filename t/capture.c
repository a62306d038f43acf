/* SPDX-License-Identifier: MIT */
/* Defer calls on a stream that is being captured into a CUDA graph: no
 * event is recorded into the capture, and the entry is released only once
 * the graph and every executable graph made from it are destroyed and
 * their launches have completed.  First a few checks of the fake's
 * capture model and its oracle, on which the rest relies.  Setting up
 * such an entry at the call: t/capture_setup.c; captures under or beside
 * CUDEFER_DISABLE, other threads' captures and cudaStreamPerThread's:
 * t/capture_beside.c. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "helpers.h"

static cudaGraphExec_t instantiate(cudaGraph_t graph)
{
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    if (err != cudaSuccess)
        bail("cudaGraphInstantiate: %s", cudaGetErrorName(err));
    return exec;
}

static void destructor_counts(void *arg)
{
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* ---- the fake's model ------------------------------------------------------ */

static void test_fake_model(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    char last[512];

    begin_capture(s);
    enum cudaStreamCaptureStatus st;
    is_int(cudaStreamIsCapturing(s, &st), cudaSuccess, "fake: IsCapturing");
    is_int(st, cudaStreamCaptureStatusActive, "fake: the stream captures");
    fake_work *w = fake_launch_held(s, &p, 1);
    fake_complete(w);
    is_int(fake_work_done(w), 0, "fake: captured work never runs");
    is_int(cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported,
           "fake: cudaStreamQuery on a capturing stream is refused");
    is_int(cudaStreamIsCapturing(s, &st), cudaSuccess, "fake: IsCapturing");
    is_int(st, cudaStreamCaptureStatusInvalidated, "... and invalidates it");
    cudaGraph_t graph = NULL;
    is_int(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated,
           "fake: ending an invalidated capture");
    ok(graph == NULL, "fake: no graph from it");

    /* A release while an executable graph using p exists is a violation,
     * launched or not. */
    begin_capture(s);
    fake_launch(s, 1000, &p, 1);
    graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    is_int(cudaGraphDestroy(graph), cudaSuccess, "fake: cudaGraphDestroy");
    fake_work *l = fake_graph_launch_held(exec, s);
    ok(l != NULL, "fake: fake_graph_launch_held");
    cudaEvent_t ev;
    cudaEventCreate(&ev);
    is_int(cudaEventRecord(ev, s), cudaSuccess, "fake: record after the launch");
    is_int(cudaEventQuery(ev), cudaErrorNotReady, "fake: the launch is pending");
    fake_complete(l);
    is_int(cudaEventQuery(ev), cudaSuccess, "fake: the launch completed");
    cudaEventDestroy(ev);
    long before = fake_violations();
    cudaFree(p);
    is_int(fake_violations() - before, 1,
           "fake oracle: freeing memory of a live executable graph");
    ok(strstr(fake_last_violation(last, sizeof last), "executable graph") != NULL,
       "fake oracle: it names the executable graph");
    fake_oracle_forgive();
    cudaGraphExecDestroy(exec);

    /* An event recorded into a capture is a violation. */
    begin_capture(s);
    cudaEventCreate(&ev);
    is_int(cudaEventRecord(ev, s), cudaErrorStreamCaptureUnsupported,
           "fake: cudaEventRecord into a capture fails");
    is_int(fake_violations(), 1, "fake oracle: ... and is a violation");
    ok(strstr(fake_last_violation(last, sizeof last),
              "event recorded into a capture") != NULL,
       "fake oracle: \"event recorded into a capture\"");
    fake_oracle_forgive();
    cudaEventDestroy(ev);

    /* User objects: the destructor waits for the graph, the executable graph
     * and its launches, and runs on another thread. */
    int destroyed = 0;
    cudaUserObject_t obj;
    is_int(cudaUserObjectCreate(&obj, &destroyed, destructor_counts, 1,
                                cudaUserObjectNoDestructorSync),
           cudaSuccess, "fake: cudaUserObjectCreate");
    cudaGraph_t capturing;
    is_int(cudaStreamGetCaptureInfo(s, &st, NULL, &capturing, NULL, NULL, NULL),
           cudaSuccess, "fake: cudaStreamGetCaptureInfo");
    is_int(cudaGraphRetainUserObject(capturing, obj, 1, cudaGraphUserObjectMove),
           cudaSuccess, "fake: the capturing graph takes the reference");
    graph = end_capture(s);
    ok(graph == capturing, "fake: the graph captured into is the one returned");
    exec = instantiate(graph);
    l = fake_graph_launch_held(exec, s);
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(exec);
    sleep_ms(10);
    is_int(__atomic_load_n(&destroyed, __ATOMIC_SEQ_CST), 0,
           "fake: no destructor while a launch is pending");
    fake_complete(l);
    ok(wait_user_objects(0, 2000), "fake: the destructor ran once it completed");
    is_int(destroyed, 1, "fake: once");
    is_int(fake_live_graphs(), 0, "fake: no graph left");
    cudaStreamDestroy(s);
}

/* The fake's legacy stream while a blocking stream of its device captures
 * (CUDA documents it for cudaStreamIsCapturing and cudaStreamGetCaptureInfo):
 * its capture status is cudaErrorStreamCaptureImplicit, the capture left
 * intact; a non-blocking stream's capture, or one on another device, leaves
 * it alone. */
static void test_fake_legacy_implicit(void)
{
    cudaStream_t blocking, nonblocking = stream_new();
    if (cudaStreamCreate(&blocking) != cudaSuccess)
        bail("cudaStreamCreate");
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    begin_capture(nonblocking);
    ok(cudaStreamIsCapturing(NULL, &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusNone,
       "fake: a non-blocking stream's capture leaves the legacy stream none");
    cudaGraphDestroy(end_capture(nonblocking));
    begin_capture(blocking);
    is_int(cudaStreamIsCapturing(NULL, &st), cudaErrorStreamCaptureImplicit,
           "fake: a blocking stream's capture: the legacy stream's status is "
           "cudaErrorStreamCaptureImplicit");
    is_int(cudaStreamIsCapturing(cudaStreamLegacy, &st),
           cudaErrorStreamCaptureImplicit, "fake: ... named cudaStreamLegacy");
    is_int(cudaStreamGetCaptureInfo(NULL, &st, NULL, NULL, NULL, NULL, NULL),
           cudaErrorStreamCaptureImplicit, "fake: ... its capture info too");
    cudaGetLastError();
    cudaSetDevice(1);
    ok(cudaStreamIsCapturing(NULL, &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusNone,
       "fake: ... another device's legacy stream: none");
    cudaSetDevice(0);
    ok(cudaStreamIsCapturing(blocking, &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusActive,
       "fake: ... the capture left intact");
    cudaGraphDestroy(end_capture(blocking));
    ok(cudaStreamIsCapturing(NULL, &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusNone,
       "fake: none once it ended");
    begin_capture(cudaStreamPerThread);
    is_int(cudaStreamIsCapturing(NULL, &st), cudaErrorStreamCaptureImplicit,
           "fake: a per-thread default stream's capture is a blocking one");
    cudaGetLastError();
    cudaGraphDestroy(end_capture(cudaStreamPerThread));
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
}

/* ---- defer calls on a capturing stream ------------------------------------ */

/* The case: released only after the graph, the executable graph
 * and every launch are gone; never before. */
static void test_free_waits_for_graph(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    uint64_t deferred = stats_now().deferred, released = stats_now().released;
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);

    begin_capture(s);
    captured_work(s, p);
    is_int(defer_free(p, s), cudaSuccess, "defer_free on a capturing stream");
    is_int(fake_calls(FAKE_EVENT_RECORD) - records, 0,
           "no event recorded into the capture");
    is_int(stats_now().deferred - deferred, 1, "counted as deferred");
    cudaGraph_t graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    fake_work *l[3];
    for (int i = 0; i < 3; i++)
        l[i] = fake_graph_launch_held(exec, s);
    ok(l[0] && l[1] && l[2], "three launches");
    is_int(defer_flush(), cudaSuccess, "defer_flush does not wait for graphs");
    is_int(fake_is_released(p), 0, "held while the graph lives");
    is_int(stats_now().pending, 1, "... and pending");

    is_int(cudaGraphDestroy(graph), cudaSuccess, "graph destroyed");
    fake_complete(l[0]);
    sleep_ms(20);
    defer_flush();
    is_int(fake_is_released(p), 0, "held: the executable graph lives");

    is_int(cudaGraphExecDestroy(exec), cudaSuccess,
           "executable graph destroyed with two launches pending");
    fake_complete(l[1]);
    sleep_ms(20);
    defer_flush();
    is_int(fake_is_released(p), 0, "held: a launch is still pending");
    is_int(fake_live_user_objects(), 1, "its user object lives");

    fake_complete(l[2]);
    ok(wait_user_objects(0, 2000), "the user object dies with the last launch");
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(p), 1, "released after all that");
    is_int(stats_now().released - released, 1, "counted as released");
    cudaStreamDestroy(s);
}

static int called;
static cudaError_t stream_state_in_callback;
static cudaStream_t callback_stream;

static void on_call(void *arg)
{
    (void)arg;
    stream_state_in_callback = cudaStreamQuery(callback_stream);
    __atomic_store_n(&called, 1, __ATOMIC_SEQ_CST);
}

/* defer_call: the callback runs after the graph is gone (timed launches,
 * graph and exec destroyed at once). */
static void test_call_waits_for_graph(void)
{
    cudaStream_t s = stream_new();
    callback_stream = s;
    begin_capture(s);
    fake_launch(s, 50000, NULL, 0);
    is_int(defer_call(on_call, NULL, s), cudaSuccess,
           "defer_call on a capturing stream");
    cudaGraph_t graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    /* The launches wait behind held work until checked (their 100 ms
     * alone may pass before the check on a loaded machine). */
    fake_work *gate = work_held(s, NULL);
    for (int i = 0; i < 2; i++)
        is_int(cudaGraphLaunch(exec, s), cudaSuccess, "cudaGraphLaunch (50 ms)");
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(exec);
    is_int(__atomic_load_n(&called, __ATOMIC_SEQ_CST), 0,
           "not called while the launches run");
    fake_complete(gate);
    ok(wait_flag(&called, 10000), "called once they completed");
    is_int(stream_state_in_callback, cudaSuccess,
           "the stream's work was done when it ran");
    cudaStreamDestroy(s);
}

/* A graph never instantiated: released when it is destroyed; an executable
 * graph destroyed before its graph: held until the graph goes too. */
static void test_graph_orders(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64);

    begin_capture(s);
    captured_work(s, p);
    defer_free(p, s);
    cudaGraph_t graph = end_capture(s);
    cudaGraphDestroy(graph);
    ok(wait_released(p, 10000), "never instantiated: released once destroyed");

    begin_capture(s);
    captured_work(s, q);
    defer_free(q, s);
    graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    cudaGraphExecDestroy(exec);
    sleep_ms(20);
    defer_flush();
    is_int(fake_is_released(q), 0, "executable graph gone, graph alive: held");
    cudaGraphDestroy(graph);
    ok(wait_released(q, 10000), "released once the graph is gone too");
    cudaStreamDestroy(s);
}

/* Host memory and several pointers, on the capture path too. */
static void test_kinds(void)
{
    cudaStream_t s = stream_new();
    void *h = host_alloc(128);
    void *v[3] = {device_alloc(8), NULL, device_alloc(8)};

    begin_capture(s);
    fake_launch(s, 100, v, 3);
    is_int(defer_free_host(h, s), cudaSuccess, "defer_free_host in a capture");
    is_int(defer_free_n(v, 3, s), cudaSuccess, "defer_free_n in a capture");
    cudaGraph_t graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    cudaGraphLaunch(exec, s);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    ok(wait_released(h, 10000) && wait_released(v[0], 10000) &&
           wait_released(v[2], 10000),
       "all released after the graph");
    cudaStreamDestroy(s);
}

/* What may be called during a capture (the fake as measured on an H200): the
 * capture path calls nothing that would invalidate a capture; a thread in
 * the default mode that frees memory during another thread's Global capture
 * invalidates it, one in Relaxed mode does not. */
static void *free_on_other_thread(void *arg)
{
    void **args = arg;
    if (args[1] != NULL) {
        enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&m);
    }
    args[2] = (void *)(intptr_t)cudaFree(args[0]);
    return NULL;
}

static void test_capture_rules(void)
{
    cudaStream_t s = stream_new();
    void *a = device_alloc(64), *b = device_alloc(64);
    enum cudaStreamCaptureStatus st;
    int dev;

    begin_capture(s);
    is_int(cudaStreamGetDevice(s, &dev), cudaErrorStreamCaptureUnsupported,
           "fake: cudaStreamGetDevice on a capturing stream is refused");
    cudaStreamIsCapturing(s, &st);
    is_int(st, cudaStreamCaptureStatusInvalidated, "fake: ... and invalidates");
    cudaGraph_t graph;
    cudaStreamEndCapture(s, &graph);

    void *args[3] = {a, NULL, NULL};
    pthread_t t;
    begin_capture(s);
    pthread_create(&t, NULL, free_on_other_thread, args);
    pthread_join(t, NULL);
    is_int((intptr_t)args[2], cudaErrorStreamCaptureUnsupported,
           "fake: cudaFree on another thread during a Global capture: refused");
    cudaStreamIsCapturing(s, &st);
    is_int(st, cudaStreamCaptureStatusInvalidated, "fake: ... and invalidates");
    cudaStreamEndCapture(s, &graph);

    void *relaxed_args[3] = {a, "relaxed", NULL};
    begin_capture(s);
    pthread_create(&t, NULL, free_on_other_thread, relaxed_args);
    pthread_join(t, NULL);
    is_int((intptr_t)relaxed_args[2], cudaSuccess,
           "fake: the same in Relaxed mode is allowed");
    cudaStreamIsCapturing(s, &st);
    is_int(st, cudaStreamCaptureStatusActive, "fake: ... and harmless");
    cudaGraphDestroy(end_capture(s));
    cudaFree(b);
    cudaStreamDestroy(s);
}

/* defer_*_streams: all streams in one capture is one graph entry; a mix of
 * capturing and other streams, or two captures, is refused. */
static void test_groups(void)
{
    cudaStream_t a = stream_new(), b = stream_new(), c = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);

    begin_capture(a);
    is_int(fake_capture_join(b, a), cudaSuccess, "b joins a's capture");
    captured_work(a, p);
    captured_work(b, p);
    cudaStream_t ab[2] = {a, b};
    is_int(defer_free_streams(p, ab, 2), cudaSuccess,
           "defer_free_streams on two streams of one capture");
    is_int(defer_call_streams(noop_counted, NULL, ab, 2), cudaSuccess,
           "defer_call_streams likewise");
    is_int(fake_calls(FAKE_EVENT_RECORD) - records, 0, "no event recorded");

    cudaStream_t ac[2] = {a, c};
    stderr_capture_begin();
    is_int(defer_free_streams(q, ac, 2), cudaErrorStreamCaptureUnsupported,
           "a capturing and a plain stream: refused");
    begin_capture(c);
    is_int(defer_free_streams(q, ac, 2), cudaErrorStreamCaptureUnsupported,
           "streams of two captures: refused");
    stderr_capture_end();
    cudaGraphDestroy(end_capture(c));

    cudaGraph_t graph = end_capture(a);
    enum cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(b, &st);
    is_int(st, cudaStreamCaptureStatusNone, "b's capture ended with a's");
    cudaGraphExec_t exec = instantiate(graph);
    fake_work *l = fake_graph_launch_held(exec, a);
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(exec);
    sleep_ms(10);
    defer_flush();
    ok(fake_is_released(p) == 0 && noop_counted_calls == 0,
       "neither released nor called while the launch runs");
    fake_complete(l);
    ok(wait_released(p, 10000) && wait_flag(&noop_counted_calls, 10000),
       "released and called after it");
    is_int(fake_is_released(q), 0, "the refused pointer is the caller's");
    cudaFree(q);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaStreamDestroy(c);
}

/* ---- scenarios in child processes ----------------------------------------- */

/* defer_shutdown while a graph holds entries: shutdown does not wait for the
 * graph; when it dies, its entries are reported and counted as failed.  The
 * event the reclaimer recorded on the capture's stream once the capture
 * ended is destroyed by the shutdown, the graph still alive. */
static void s_shutdown_first(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    begin_capture(s);
    captured_work(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free refused");
    CHECK(defer_call(noop_counted, NULL, s) == cudaSuccess,
          "defer_call refused");
    cudaGraph_t graph = end_capture(s);
    cudaGraphExec_t exec = instantiate(graph);
    fake_work *l = fake_graph_launch_held(exec, s);
    CHECK(defer_shutdown() == cudaSuccess, "defer_shutdown failed");
    CHECK(stats_now().events_created > 0 && fake_live_events() == 0,
          "the stream's event destroyed by the shutdown (%llu made, %zu "
          "alive)", ULL(stats_now().events_created), fake_live_events());
    uint64_t failed = stats_now().failed;
    fake_complete(l);
    stderr_capture_begin();
    cudaGraphDestroy(graph);
    cudaGraphExecDestroy(exec);
    bool died = wait_user_objects(0, 2000);
    const char *msg = stderr_capture_end();
    CHECK(died, "the graph's user objects did not die");
    CHECK(stats_now().failed - failed == 2, "%llu more failed, want 2",
          ULL(stats_now().failed - failed));
    CHECK(stats_now().pending == 0, "%llu still pending",
          ULL(stats_now().pending));
    CHECK(strstr(msg, "defer_free") != NULL &&
              strstr(msg, "after defer_shutdown") != NULL,
          "not reported");
    CHECK(fake_is_released(p) == 0, "released after shutdown");
    CHECK(noop_counted_calls == 0, "callback run after shutdown");
    cudaFree(p);
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    /* Before any defer call here: a fork child of a process that used
     * cudefer refuses every call. */
    fork_scenario("shutdown before the graph dies: no crash, reported, "
                  "counted as failed", "", 1, 30000, s_shutdown_first);
    test_fake_model();
    test_fake_legacy_implicit();
    test_free_waits_for_graph();
    test_call_waits_for_graph();
    test_graph_orders();
    test_kinds();
    test_capture_rules();
    test_groups();
    captures_all_gone();
    return 0;
}
