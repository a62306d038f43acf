/* SPDX-License-Identifier: MIT */
/* A dead graph's stream that changes while the reclaimer, held by a hook
 * inside its own cudaStreamIsCapturing (or cudaStreamGetDevice) call,
 * looks at it: the stream captures again (the entry still waits for the
 * work before the first capture, nothing is recorded into the new
 * capture, and the entry fails at shutdown rather than be released under
 * it), or is destroyed and its handle taken by a new stream (cudefer.h's
 * limits). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "helpers.h"

/* ---- the stream captures again when its graph dies ------------------------ */

/* The reclaimer held inside one cudaStreamIsCapturing call of its own:
 * 1 arms, 2 while held, 3 lets it go. */
static _Atomic int hold_state;

static void hold_reclaimer(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)r;
    (void)arg;
    hold_reclaimer_in_call(&hold_state, 1, 2);
}

/* p freed in a capture of s begun now, with hook on the reclaimer's
 * cudaStreamIsCapturing (hold_reclaimer, or one that holds as it does):
 * returns once the reclaimer is held in its look at s (hold_state 2). */
static void free_in_capture_held(cudaStream_t s, void *p,
                                 fake_return_hook hook)
{
    atomic_store(&hold_state, 1);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, hook, NULL);
    begin_capture(s);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free in a capture");
    for (double until = now_ms() + 10000;
         atomic_load(&hold_state) != 2 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&hold_state) == 2, "the reclaimer looked at s");
}

/* cudaStreamIsCapturing calls of other threads than this one. */
static unsigned long others_is_capturing(void)
{
    return fake_calls(FAKE_STREAM_IS_CAPTURING) -
           fake_thread_calls(FAKE_STREAM_IS_CAPTURING);
}

/* Work w on s uses p; p is freed in a capture of s.  While the reclaimer
 * is held in its look at s (still capturing), the capture ends, s begins
 * another (relaxed: it bars nobody's calls) and the first graph dies; then
 * the reclaimer goes on.  So it never saw s between the two captures: the
 * origin is still capturing, no event recorded after w.  Returns w; s
 * still captures. */
static fake_work *capture_again_before_death(cudaStream_t s, void *p)
{
    fake_work *w = work_held(s, p);
    free_in_capture_held(s, p, hold_reclaimer);
    cudaGraph_t first = end_capture(s);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) ==
              cudaSuccess,
          "s captures again");
    cudaGraphDestroy(first);
    CHECK(wait_user_objects(0, 2000), "the first graph is gone");
    atomic_store(&hold_state, 3);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, NULL, NULL);
    return w;
}

/* The graph is dead, its origin stream captures again: the entry waits
 * (for the capture to end, then for the work before the first capture),
 * not released as if the origin had settled.  (A mutation test that
 * counted only origins with an event recorded as open survived the
 * suite.) */
static void s_dead_graph_stream_captures_again(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *w = capture_again_before_death(s, p);
    unsigned long calls = others_is_capturing();
    for (double until = now_ms() + 10000; fake_is_released(p) == 0 &&
                                          others_is_capturing() < calls + 2 &&
                                          now_ms() < until;)
        sleep_ms(1);
    CHECK(others_is_capturing() >= calls + 2 || fake_is_released(p) != 0,
          "the reclaimer looked again");
    CHECK(fake_is_released(p) == 0,
          "not released: s captures again, and w still runs");
    cudaGraph_t second = end_capture(s);
    cudaGraphDestroy(second);
    sleep_ms(20); /* the reclaimer sees the capture end: an event after w */
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
}

/* The same at shutdown: the origin is still capturing, so the work before
 * the first capture cannot be waited for; the entry fails (said), its
 * memory never released.  (A mutation test that pushed it as complete,
 * released under w, survived the suite.) */
static void s_dead_graph_capturing_at_shutdown(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *w = capture_again_before_death(s, p);
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    defer_shutdown();
    const char *said = stderr_capture_end();
    CHECK(fake_is_released(p) == 0, "not released at shutdown: w runs");
    CHECK(stats_now().failed == failed + 1 &&
              strstr(said, "capturing again at shutdown") != NULL,
          "counted as failed and said (failed %llu)",
          ULL(stats_now().failed - failed));
    cudaGraphDestroy(end_capture(s));
    fake_complete(w);
}

static _Atomic int shutdown_done;

static void *shutdown_thread(void *unused)
{
    (void)unused;
    defer_shutdown();
    atomic_store(&shutdown_done, 1);
    return NULL;
}

/* Two streams in one capture, the reclaimer held in its look at s: the
 * capture ends, the graph dies and s2 is left as `lost` says (destroyed,
 * or capturing again); at shutdown s has its event recorded after its
 * work from before the capture, that work still running.  The entry
 * cannot be released whatever s's work does, so it fails at once, said
 * with `why`: the shutdown does not wait for s's work first. */
static void dead_graph_second_stream_at_shutdown(bool lost, const char *why)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = device_alloc(256);
    fake_work *w = work_held(s, p);
    atomic_store(&hold_state, 1);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, hold_reclaimer, NULL);
    begin_capture(s);
    CHECK(fake_capture_join(s2, s) == cudaSuccess, "s2 joins the capture");
    cudaStream_t both[2] = {s, s2};
    CHECK(defer_free_streams(p, both, 2) == cudaSuccess,
          "defer_free_streams in the capture");
    for (double until = now_ms() + 10000;
         atomic_load(&hold_state) != 2 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&hold_state) == 2, "the reclaimer looked at s");
    cudaGraph_t first = end_capture(s);
    if (!lost)
        CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeRelaxed) ==
                  cudaSuccess,
              "s2 captures again");
    cudaGraphDestroy(first);
    CHECK(wait_user_objects(0, 2000), "the first graph is gone");
    if (lost)
        cudaStreamDestroy(s2);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    atomic_store(&hold_state, 3);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, NULL, NULL);
    for (double until = now_ms() + 10000;
         fake_calls(FAKE_EVENT_RECORD) == records && now_ms() < until;)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_EVENT_RECORD) > records,
          "the reclaimer recorded an event on s, after w");
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, NULL);
    for (double until = now_ms() + 3000;
         !atomic_load(&shutdown_done) && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&shutdown_done),
          "the shutdown returned while w runs (it would wait for w, whose "
          "entry fails anyway)");
    fake_complete(w);
    pthread_join(t, NULL);
    const char *said = stderr_capture_end();
    CHECK(fake_is_released(p) == 0, "not released at shutdown");
    CHECK(stats_now().failed == failed + 1 && strstr(said, why) != NULL,
          "counted as failed and said (failed %llu)",
          ULL(stats_now().failed - failed));
    if (lost)
        cudaFree(p);
    else
        cudaGraphDestroy(end_capture(s2));
}

static void s_dead_graph_one_stream_capturing_at_shutdown(void)
{
    dead_graph_second_stream_at_shutdown(false, "capturing again at shutdown");
}

static void s_dead_graph_one_stream_lost_at_shutdown(void)
{
    dead_graph_second_stream_at_shutdown(true, "was destroyed");
}

/* The reclaimer held in its look at s while s captures (hold_state 2);
 * set to 3, its next look (s no longer captures then) waits in the hook
 * (4) until the test began a new capture of s (5): that capture begins
 * between the reclaimer's check and its next call on s. */
static void capture_after_check(enum fake_call c, cudaError_t r, void *arg)
{
    if (!hold_reclaimer_in_call(&hold_state, 3, 4))
        hold_reclaimer(c, r, arg);
}

/* A dead graph's stream begins another capture right after the reclaimer
 * saw the first one end, before it asked the stream's device: that is a
 * stream still there, capturing again, not one destroyed.  The entry
 * waits for that capture to end and then for the work from before the
 * first one, as it does when the reclaimer sees the new capture at once;
 * never failed as "destroyed" and left unreleased. */
static void s_captures_again_after_check(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *w = work_held(s, p);
    free_in_capture_held(s, p, capture_after_check);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    atomic_store(&hold_state, 3);
    for (double until = now_ms() + 10000;
         atomic_load(&hold_state) != 4 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&hold_state) == 4,
          "the reclaimer saw s not capturing");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) ==
              cudaSuccess,
          "s captures again");
    atomic_store(&hold_state, 5);
    sleep_ms(50); /* the reclaimer goes on with s */
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, NULL, NULL);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &st);
    CHECK(st == cudaStreamCaptureStatusInvalidated,
          "the limit cudefer.h states: the reclaimer's look at the stream's "
          "device invalidated the new capture (status %d)", (int)st);
    cudaGraph_t second = NULL;
    cudaStreamEndCapture(s, &second);
    if (second != NULL)
        cudaGraphDestroy(second);
    sleep_ms(20); /* the reclaimer sees the capture end: an event after w */
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
    const char *said = stderr_capture_end();
    CHECK(stats_now().failed == failed && strstr(said, "destroyed") == NULL,
          "nothing failed or said (failed %llu, stderr: \"%s\")",
          ULL(stats_now().failed - failed), said);
}

/* The reclaimer held in its look at s while s captures (hold_state 2);
 * set to 3, its next look finds s not capturing, and its cudaStreamGetDevice
 * call on s, once it returned, waits in the hook (4) until the test began a
 * new capture of s (5). */
static void capture_after_device(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)r;
    (void)arg;
    hold_reclaimer_in_call(&hold_state, 3, 4);
}

/* A dead graph's stream begins another capture after the reclaimer saw the
 * first one end and asked the stream's device, before it records the
 * event after the work from before the first capture: it looks again
 * right before the record, so no event is recorded into the new capture
 * (the fake's oracle counts one) and that capture stays intact.  The entry
 * waits for it to end, then for that work. */
static void s_captures_again_before_record(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *w = work_held(s, p);
    free_in_capture_held(s, p, hold_reclaimer);
    fake_set_return_hook(FAKE_STREAM_GET_DEVICE, capture_after_device, NULL);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    atomic_store(&hold_state, 3);
    for (double until = now_ms() + 10000;
         atomic_load(&hold_state) != 4 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&hold_state) == 4,
          "the reclaimer asked the device of s, not capturing");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) ==
              cudaSuccess,
          "s captures again");
    unsigned long looks = others_is_capturing(),
                  records = fake_calls(FAKE_EVENT_RECORD);
    atomic_store(&hold_state, 5);
    /* The reclaimer goes on with s: its next call on s, a look or a
     * record. */
    for (double until = now_ms() + 10000;
         others_is_capturing() == looks &&
         fake_calls(FAKE_EVENT_RECORD) == records && now_ms() < until;)
        sleep_ms(1);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, NULL, NULL);
    fake_set_return_hook(FAKE_STREAM_GET_DEVICE, NULL, NULL);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &st);
    CHECK(st == cudaStreamCaptureStatusActive,
          "the new capture is intact (status %d)", (int)st);
    CHECK(fake_violations() == 0, "no event recorded into the new capture");
    cudaGraphDestroy(end_capture(s));
    sleep_ms(20); /* the reclaimer sees the capture end: an event after w */
    CHECK(fake_is_released(p) == 0, "not released while w runs");
    fake_complete(w);
    CHECK(wait_released(p, 10000), "released once w completed");
}

/* ---- the capture's stream destroyed, its handle taken ------------------- */

/* cudefer.h's limits: a stream of the capture destroyed before the
 * reclaimer saw the capture end leaves ptr never released (reported,
 * counted as failed); but where a new stream took its handle before the
 * reclaimer looked again (within a poll interval), it is taken for that new
 * stream.  The reclaimer is held in its look at s while s captures; then
 * the capture ends, the graph dies, s is destroyed with its work from
 * before the capture still running (old) and, with reuse, a new stream b
 * takes its handle, with held work of its own (mine).  With reuse, p waits
 * for b's work, not for old: it is released once mine completes, old
 * still running, nothing failed.  Without, the entry fails, said.  (Code
 * that told the new stream from the destroyed one, say by an id taken at
 * the capture, would fail the entry with reuse too, and this test with
 * it: the limit would then go from the header.) */
static void destroyed_origin(bool reuse)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *old = work_held(s, NULL), *mine = NULL;
    free_in_capture_held(s, p, hold_reclaimer);
    cudaGraphDestroy(end_capture(s));
    CHECK(wait_user_objects(0, 2000), "the graph is gone");
    cudaStreamDestroy(s);
    if (reuse) {
        CHECK(fake_stream_create_reusing(s) == s, "b has s's handle");
        mine = work_held(s, NULL);
    }
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    atomic_store(&hold_state, 3);
    fake_set_return_hook(FAKE_STREAM_IS_CAPTURING, NULL, NULL);
    if (reuse) {
        sleep_ms(50);
        CHECK(fake_is_released(p) == 0, "not released while b's work runs");
        fake_complete(mine);
        CHECK(wait_released(p, 10000) && !fake_work_done(old),
              "released once b's work is done, the old stream's still "
              "running");
    } else {
        for (double until = now_ms() + 10000;
             stats_now().failed == failed && now_ms() < until;)
            sleep_ms(1);
    }
    const char *said = stderr_capture_end();
    if (reuse) {
        CHECK(stats_now().failed == failed && strstr(said, "destroyed") == NULL,
              "nothing failed or said (failed %llu)",
              ULL(stats_now().failed - failed));
    } else {
        CHECK(stats_now().failed == failed + 1 &&
                  strstr(said, "was destroyed") != NULL &&
                  fake_is_released(p) == 0,
              "never released: counted as failed and said");
        cudaFree(p);
    }
    fake_complete(old);
}

static void s_destroyed_origin(void)
{
    destroyed_origin(false);
}

static void s_destroyed_origin_handle_taken(void)
{
    destroyed_origin(true);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a dead graph whose stream captures again: its entry "
                  "waits for the work before the first capture",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_dead_graph_stream_captures_again);
    fork_scenario("a dead graph whose stream captures again at shutdown: "
                  "failed, not released",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_dead_graph_capturing_at_shutdown);
    fork_scenario("a dead graph, one stream's earlier work running, the "
                  "other capturing again at shutdown: failed at once, not "
                  "waited for", "CUDEFER_POLICY=eager", 1, 30000,
                  s_dead_graph_one_stream_capturing_at_shutdown);
    fork_scenario("a dead graph, one stream's earlier work running, the "
                  "other destroyed before cudefer saw the capture end: "
                  "failed at once at shutdown, not waited for",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_dead_graph_one_stream_lost_at_shutdown);
    fork_scenario("a dead graph's stream captures again between the "
                  "reclaimer's check and its look at the stream's device: "
                  "waited for, not failed as destroyed",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_captures_again_after_check);
    fork_scenario("a dead graph's stream captures again between the "
                  "reclaimer's look at the stream's device and its record: "
                  "nothing recorded into that capture, waited for",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_captures_again_before_record);
    fork_scenario("a capture's stream destroyed before the reclaimer saw "
                  "the capture end: never released, failed, said",
                  "CUDEFER_POLICY=eager", 1, 30000, s_destroyed_origin);
    fork_scenario("... and its handle taken by a new stream before the "
                  "reclaimer looked: taken for that stream",
                  "CUDEFER_POLICY=eager", 1, 30000,
                  s_destroyed_origin_handle_taken);
    return 0;
}
