/* SPDX-License-Identifier: MIT */
/* A defer call on a capturing stream, at the call, as it sets up the entry
 * that the graph will hold (t/capture.c): a capture invalidated before the
 * call refuses it, one invalidated after it releases the entry when the
 * capture ends; a failure of any call the setup makes refuses the call,
 * names that call and leaves nothing behind; the entry's device is that of
 * its memory, else the caller's current one, the capturing stream never
 * asked. */
#include <stdint.h>
#include <string.h>

#include "helpers.h"

/* A capture invalidated before the call: refused, the caller keeps the
 * pointer.  One invalidated after the call: its graph never existed for the
 * application, so the entry is released when the capture ends. */
static void test_invalidated(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64);
    uint64_t rejected = stats_now().rejected;

    begin_capture(s);
    defer_free(q, s);
    cudaStreamSynchronize(s); /* invalidates the capture */
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorStreamCaptureInvalidated,
           "defer_free on an invalidated capture is refused");
    ok(strstr(msg, "defer_free") != NULL &&
           strstr(msg, "cudaErrorStreamCaptureInvalidated") != NULL,
       "and says so on stderr");
    is_int(stats_now().rejected - rejected, 1, "counted as rejected");
    cudaGraph_t graph;
    is_int(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated,
           "the capture ends invalidated");
    ok(wait_released(q, 10000), "what was deferred before is released");
    is_int(fake_is_released(p), 0, "the refused pointer is the caller's");
    cudaFree(p);
    cudaStreamDestroy(s);
}

/* Failures of the calls the capture path makes: refused, named, nothing
 * deferred, nothing leaked.  (A callback's device is the current one: a
 * defer_call meets cudaGetDevice; a pointer's device is its own.) */
static void test_setup_failures(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    struct {
        bool graph_call, callback;
        int call;
        const char *name;
    } cases[] = {
        {false, false, FAKE_STREAM_IS_CAPTURING, "cudaStreamIsCapturing"},
        {true, false, FAKE_STREAM_GET_CAPTURE_INFO, "cudaStreamGetCaptureInfo"},
        {false, true, FAKE_GET_DEVICE, "cudaGetDevice"},
        {true, false, FAKE_USER_OBJECT_CREATE, "cudaUserObjectCreate"},
        {true, false, FAKE_GRAPH_RETAIN_USER_OBJECT, "cudaGraphRetainUserObject"},
    };
    begin_capture(s);
    size_t objects = fake_live_user_objects();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t deferred = stats_now().deferred;
        if (cases[i].graph_call)
            fake_graph_fail((enum fake_graph_call)cases[i].call,
                            cudaErrorMemoryAllocation, 0, 1);
        else
            fake_fail((enum fake_call)cases[i].call, cudaErrorMemoryAllocation,
                      0, 1);
        stderr_capture_begin();
        cudaError_t err = cases[i].callback ? defer_call(noop_counted, NULL, s)
                                            : defer_free(p, s);
        const char *msg = stderr_capture_end();
        is_int(err, cudaErrorMemoryAllocation, "%s fails: refused",
               cases[i].name);
        ok(strstr(msg, cases[i].name) != NULL, "%s named on stderr",
           cases[i].name);
        is_int(stats_now().deferred - deferred, 0, "nothing deferred");
        ok(wait_user_objects(objects, 2000), "no user object left behind");
    }
    fake_fail_clear();
    enum cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
    is_int(st, cudaStreamCaptureStatusActive, "the capture is still valid");
    cudaGraph_t graph = end_capture(s);
    cudaGraphDestroy(graph);
    sleep_ms(10);
    defer_flush();
    is_int(fake_is_released(p), 0, "the caller still owns the pointer");
    is_int(noop_counted_calls, 0, "no callback was run");
    cudaFree(p);
    cudaStreamDestroy(s);
}

/* The device of a capture entry: that of its memory (the stream cannot be
 * asked during a capture), else, for a callback or when the pointer's
 * attributes cannot be had, the caller's current device. */
static void test_entry_device(void)
{
    cudaGetLastError(); /* the refusals above left theirs, as CUDA does */
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p1 = device_alloc(64), *q1 = device_alloc(64),
         *r1 = device_alloc(64);
    cudaSetDevice(0);
    begin_capture(s1);
    captured_work(s1, p1);
    is_int(defer_free(p1, s1), cudaSuccess,
           "defer_free on device 1's capturing stream, device 0 current");
    fake_fail(FAKE_POINTER_GET_ATTRIBUTES, cudaErrorInvalidValue, 0, 1);
    is_int(defer_free(q1, s1), cudaSuccess,
           "pointer attributes failing: the current device is used");
    fake_fail_clear();
    is_int(cudaPeekAtLastError(), cudaSuccess,
           "the failed query left the caller no error to find");
    /* The caller's own error, pending: cudefer's failed query must not
     * clear it (the caller would never hear of it). */
    is_int(cudaSetDevice(99), cudaErrorInvalidDevice,
           "the caller's cudaSetDevice(99) fails: its error pending");
    fake_fail(FAKE_POINTER_GET_ATTRIBUTES, cudaErrorInvalidValue, 0, 1);
    is_int(defer_free(r1, s1), cudaSuccess,
           "pointer attributes failing with the caller's error pending");
    fake_fail_clear();
    ok(cudaGetLastError() != cudaSuccess,
       "the caller still finds an error pending (not cleared by cudefer)");
    unsigned long ids = fake_calls(FAKE_STREAM_GET_ID),
                  devices = fake_calls(FAKE_STREAM_GET_DEVICE);
    is_int(defer_call(noop_counted, NULL, s1), cudaSuccess,
           "defer_call there too");
    ok(fake_calls(FAKE_STREAM_GET_ID) == ids &&
           fake_calls(FAKE_STREAM_GET_DEVICE) == devices,
       "the capturing stream was not asked for its device or id");
    cudaGraph_t graph = end_capture(s1);
    cudaGraphDestroy(graph);
    ok(wait_released(p1, 10000) && wait_released(q1, 10000) &&
           wait_released(r1, 10000),
       "all three released once the graph is gone");
    ok(wait_flag(&noop_counted_calls, 10000), "the callback ran");
    __atomic_store_n(&noop_counted_calls, 0, __ATOMIC_SEQ_CST);
    cudaStreamDestroy(s1);
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    test_invalidated();
    test_setup_failures();
    test_entry_device();
    captures_all_gone();
    return 0;
}
