/* SPDX-License-Identifier: MIT */
/* A capture next to the other route and other threads: under
 * CUDEFER_DISABLE a capturing stream still takes the capture path; what a
 * capture refuses or takes, by default and under CUDEFER_DISABLE alike, in
 * the same words, the capture left intact; a synchronous release
 * (CUDEFER_DISABLE) on streams that do not capture, beside this thread's or
 * another thread's capture; the reclaimer at work beside another thread's
 * global capture; and a capture of cudaStreamPerThread, which refuses defer
 * calls.  How a graph holds what is deferred into its capture is
 * t/capture.c's. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

/* ---- scenarios in child processes ----------------------------------------- */

/* CUDEFER_DISABLE: a capturing stream cannot be synchronized, so the
 * capture path is taken anyway. */
static void s_disable(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    begin_capture(s);
    captured_work(s, p);
    unsigned long syncs = fake_calls(FAKE_STREAM_SYNCHRONIZE);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free refused");
    CHECK(fake_calls(FAKE_STREAM_SYNCHRONIZE) == syncs,
          "the capturing stream was synchronized");
    CHECK(stats_now().sync_releases == 0, "released synchronously");
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess,
          "the capture was invalidated");
    CHECK(fake_is_released(p) == 0, "released during the capture");
    cudaGraphDestroy(graph);
    CHECK(wait_released(p, 10000), "not released after the graph");
}

/* Whether said is one line that begins "cudefer: <call>: <words>". */
static bool said_alike(const char *said, const char *call, const char *words)
{
    char want[320];
    snprintf(want, sizeof want, "cudefer: %s: %s", call, words);
    return strstr(said, want) == said &&
           strchr(said, '\n') == said + strlen(said) - 1;
}

/* Run by default and under CUDEFER_DISABLE, to the same checks: what the
 * deferred route refuses about a capture is refused alike, in the same
 * words, before any call that would invalidate the capture (no stream
 * synchronized, no event recorded); what it takes into a capture is the
 * graph's, released once the graph is gone. */
static void s_capture_alike(void)
{
    cudaStream_t s = stream_new(), side = stream_new(), cap = stream_new();
    const char *const calls[] = {"defer_free", "defer_free_n",
                                 "defer_free_streams"};
    char words[200];
    void *c = NULL, *b = NULL;
    CHECK(alloc_checked(&c, 512, s) == cudaSuccess &&
              alloc_checked(&b, 1024, s) == cudaSuccess,
          "defer_alloc");
    CHECK(defer_record_stream(c, side) == cudaSuccess, "record_stream");
    void *one[1] = {c};
    /* Allocated before any capture: cudaMalloc would invalidate one. */
    void *p = device_alloc(64), *q = device_alloc(64), *r = device_alloc(64),
         *h = host_alloc(64);
    unsigned long syncs = fake_calls(FAKE_STREAM_SYNCHRONIZE),
                  records = fake_calls(FAKE_EVENT_RECORD);

    /* The recorded stream captures, the free's own stream not. */
    begin_capture(side);
    snprintf(words, sizeof words,
             "stream %p, which its block was recorded on "
             "(defer_record_stream), is capturing into a graph, whose work "
             "a free cannot wait for: refused; free the block once that "
             "capture ends", (void *)side);
    for (int i = 0; i < 3; i++) {
        stderr_capture_begin();
        cudaError_t err = i == 0   ? defer_free(c, s)
                          : i == 1 ? defer_free_n(one, 1, s)
                                   : defer_free_streams(c, &s, 1);
        const char *said = stderr_capture_end();
        CHECK(err == cudaErrorStreamCaptureUnsupported &&
                  said_alike(said, calls[i], words),
              "%s with the recorded stream capturing: refused in the "
              "deferred route's words (%s: %s)", calls[i],
              cudaGetErrorName(err), said);
        CHECK(capture_intact(side),
              "%s left the recorded stream's capture intact", calls[i]);
    }
    cudaGraphDestroy(end_capture(side));

    /* Freed into a capture, recorded on a stream that does not capture. */
    begin_capture(cap);
    for (int i = 0; i < 3; i++) {
        stderr_capture_begin();
        cudaError_t err = i == 0   ? defer_free(c, cap)
                          : i == 1 ? defer_free_n(one, 1, cap)
                                   : defer_free_streams(c, &cap, 1);
        const char *said = stderr_capture_end();
        CHECK(err == cudaErrorStreamCaptureUnsupported &&
                  said_alike(said, calls[i],
                             "a block recorded on other streams "
                             "(defer_record_stream) cannot be freed into a "
                             "graph capture, which would not wait for them: "
                             "refused"),
              "%s of a recorded block into a capture: refused in the "
              "deferred route's words (%s: %s)", calls[i],
              cudaGetErrorName(err), said);
    }

    /* A capturing stream among streams that do not capture, first or
     * not. */
    cudaStream_t mixes[2][2] = {{cap, s}, {s, cap}};
    const char *const group_calls[] = {"defer_free_streams",
                                       "defer_call_streams",
                                       "defer_free_host_streams"};
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < 3; i++) {
            stderr_capture_begin();
            cudaError_t err =
                i == 0   ? defer_free_streams(p, mixes[m], 2)
                : i == 1 ? defer_call_streams(noop_counted, NULL, mixes[m], 2)
                         : defer_free_host_streams(h, mixes[m], 2);
            const char *said = stderr_capture_end();
            CHECK(err == cudaErrorStreamCaptureUnsupported &&
                      said_alike(said, group_calls[i],
                                 "stream capture (some of the streams "
                                 "capture, some do not) failed"),
                  "%s, a capturing stream %s: refused in the deferred "
                  "route's words (%s: %s)", group_calls[i],
                  m == 0 ? "first" : "second", cudaGetErrorName(err), said);
        }
    CHECK(capture_intact(cap), "the refusals left the capture intact");
    CHECK(fake_calls(FAKE_STREAM_SYNCHRONIZE) == syncs &&
              fake_calls(FAKE_EVENT_RECORD) == records,
          "no refusal synchronized a stream (%lu) or recorded an event (%lu)",
          fake_calls(FAKE_STREAM_SYNCHRONIZE) - syncs,
          fake_calls(FAKE_EVENT_RECORD) - records);

    /* Into the capture: the graph's, whatever the route. */
    captured_work(cap, p);
    void *two[2] = {q, r};
    int called = __atomic_load_n(&noop_counted_calls, __ATOMIC_SEQ_CST);
    CHECK(defer_free(p, cap) == cudaSuccess, "defer_free into a capture");
    CHECK(defer_free_n(two, 2, cap) == cudaSuccess,
          "defer_free_n into a capture");
    CHECK(defer_free(b, cap) == cudaSuccess,
          "defer_free of a block into a capture");
    CHECK(defer_free_host(h, cap) == cudaSuccess,
          "defer_free_host into a capture");
    CHECK(defer_call(noop_counted, NULL, cap) == cudaSuccess,
          "defer_call into a capture");
    CHECK(capture_intact(cap), "the capture is intact");
    CHECK(fake_calls(FAKE_STREAM_SYNCHRONIZE) == syncs &&
              stats_now().sync_releases == 0,
          "nothing waited for or released at the call");
    sleep_ms(20);
    CHECK(fake_is_released(p) == 0 && fake_is_released(q) == 0 &&
              fake_is_released(h) == 0 &&
              __atomic_load_n(&noop_counted_calls, __ATOMIC_SEQ_CST) == called,
          "nothing released or called while the graph lives");
    cudaGraphDestroy(end_capture(cap));
    CHECK(wait_released(p, 10000) && wait_released(q, 10000) &&
              wait_released(r, 10000) && wait_released(h, 10000),
          "released once the graph is gone");
    CHECK(wait_flag(&noop_counted_calls, 10000), "the callback ran");

    /* The captures over, the recorded block is freed as any is. */
    CHECK(defer_free(c, s) == cudaSuccess, "the recorded block freed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    cudaStreamDestroy(s);
    cudaStreamDestroy(side);
    cudaStreamDestroy(cap);
}

/* Each synchronous call, on streams that do not capture, while a capture
 * runs elsewhere (caps: what is capturing): accepted, released (or
 * called) before it returns, the capture intact.  The deferred route
 * records an event there, which no capture forbids. */
static void sync_calls_beside(const char *caps, cudaStream_t cap)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64), *r = device_alloc(64),
         *h = host_alloc(64), *b = NULL;
    CHECK(alloc_checked(&b, 1024, s) == cudaSuccess, "defer_alloc");
    work_timed(s, 2000, p);
    struct held_capture other = {cap, 0, 0, 0};
    pthread_t t;
    if (caps[0] == 'a') { /* another thread's */
        if (pthread_create(&t, NULL, hold_capture, &other) != 0)
            bail("pthread_create");
        CHECK(wait_flag(&other.begun, 10000) && other.begun == 1,
              "the other thread's capture began");
    } else {
        begin_capture(cap);
    }
    void *two[2] = {q, r};
    cudaStream_t both[2] = {s, s2};
    const char *const calls[] = {"defer_free", "defer_free_n",
                                 "defer_free_streams", "defer_free_host",
                                 "defer_free of a block", "defer_call"};
    int called = __atomic_load_n(&noop_counted_calls, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 6; i++) {
        stderr_capture_begin();
        cudaError_t err = i == 0   ? defer_free(p, s)
                          : i == 1 ? defer_free_n(two, 1, s)
                          : i == 2 ? defer_free_streams(r, both, 2)
                          : i == 3 ? defer_free_host(h, s)
                          : i == 4 ? defer_free(b, s)
                                   : defer_call(noop_counted, NULL, s);
        const char *said = stderr_capture_end();
        bool done = i == 0   ? fake_is_released(p) == 1
                    : i == 1 ? fake_is_released(q) == 1
                    : i == 2 ? fake_is_released(r) == 1
                    : i == 3 ? fake_is_released(h) == 1
                    : i == 4 ? true
                             : __atomic_load_n(&noop_counted_calls,
                                               __ATOMIC_SEQ_CST) == called + 1;
        CHECK(err == cudaSuccess && done && *said == '\0',
              "%s beside %s: accepted, done at once (%s, %s)", calls[i], caps,
              cudaGetErrorName(err), said);
        CHECK(caps[0] == 'a' || capture_intact(cap),
              "%s left %s intact", calls[i], caps);
    }
    if (caps[0] == 'a') {
        __atomic_store_n(&other.release, 1, __ATOMIC_SEQ_CST);
        pthread_join(t, NULL);
        CHECK(other.intact, "the other thread's capture was left intact");
    } else {
        cudaGraphDestroy(end_capture(cap));
    }
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

/* CUDEFER_DISABLE: a synchronous release on streams that do not capture,
 * while this thread or another captures another stream, leaves that
 * capture intact. */
static void s_disable_beside_capture(void)
{
    cudaStream_t cap = stream_new();
    sync_calls_beside("this thread's capture", cap);
    sync_calls_beside("another thread's global capture", cap);
    CHECK(stats_now().sync_releases >= 12, "%llu synchronous releases",
          ULL(stats_now().sync_releases));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    cudaStreamDestroy(cap);
}
/* The reclaimer polls and frees while another thread captures in the global
 * mode: that must neither fail the reclaimer nor invalidate the capture. */
static void test_global_capture_elsewhere(void)
{
    cudaStream_t other = stream_new(), cap = stream_new();
    void *p = device_alloc(256);
    work_timed(other, 20000, p); /* completes while the capture runs */
    is_int(defer_free(p, other), cudaSuccess, "defer_free on a plain stream");
    begin_capture(cap);
    sleep_ms(60); /* the reclaimer queries (and could free) meanwhile */
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(cap, &status);
    is_int(status, cudaStreamCaptureStatusActive,
           "another thread's global capture is still active");
    cudaGraph_t g = NULL;
    is_int(cudaStreamEndCapture(cap, &g), cudaSuccess, "and ends well");
    cudaGraphDestroy(g);
    is_int(defer_flush(), cudaSuccess, "flush: the device did not fail");
    is_int(fake_is_released(p), 1, "the buffer was released");
    cudaStreamDestroy(other);
    cudaStreamDestroy(cap);
}

/* The limit in cudefer.h: a capture of cudaStreamPerThread refuses defer
 * calls, the capture intact, the caller keeping the pointer.  The reclaimer
 * could not wait for the work this thread enqueued on it before the
 * capture: p must not be released while that work runs. */
static void test_per_thread_capture(void)
{
    cudaStream_t s = cudaStreamPerThread;
    void *p = device_alloc(4096);
    fake_work *before = work_held(s, p);
    begin_capture(s);
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    is_int(defer_free(p, s), cudaErrorStreamCaptureUnsupported,
           "defer_free into a capture of cudaStreamPerThread: refused");
    const char *said = stderr_capture_end();
    ok(strstr(said, "a capture of cudaStreamPerThread") != NULL &&
           stats_now().rejected == rejected + 1,
       "said, counted in rejected");
    enum cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
    is_int(st, cudaStreamCaptureStatusActive, "the capture is intact");
    cudaGraphDestroy(end_capture(s));
    is_int(fake_is_released(p), 0, "the caller keeps the pointer");
    fake_complete(before);
    cudaFree(p);
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    /* Before any defer call here: a fork child of a process that used
     * cudefer refuses every call. */
    fork_scenario("CUDEFER_DISABLE: a capturing stream takes the capture path",
                  "CUDEFER_DISABLE=1", 1, 30000, s_disable);
    fork_scenario("what a capture refuses or takes, in the same words, the "
                  "capture intact", "", 1, 30000, s_capture_alike);
    fork_scenario("what a capture refuses or takes, in the same words, the "
                  "capture intact", "CUDEFER_DISABLE=1", 1, 30000,
                  s_capture_alike);
    fork_scenario("CUDEFER_DISABLE: a release on other streams leaves a "
                  "capture intact", "CUDEFER_DISABLE=1", 1, 30000,
                  s_disable_beside_capture);
    test_global_capture_elsewhere();
    test_per_thread_capture();
    captures_all_gone();
    return 0;
}
