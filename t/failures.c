/* SPDX-License-Identifier: MIT */
/* Failures of the runtime: the caller gets the error and keeps its pointer,
 * or the entry is released safely anyway; nothing is ever released early,
 * and every failure is named on stderr and counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static void test_record_fails(cudaStream_t s)
{
    void *p = device_alloc(64);
    uint64_t deferred = stats_now().deferred;
    /* Twice: a failed record on a known stream is retried once, in case
     * the stream's handle was reused. */
    fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 2);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidResourceHandle, "a failed record is returned");
    ok(strstr(msg, "cudaEventRecord failed") != NULL, "and named on stderr");
    is_int(stats_now().deferred - deferred, 0, "nothing was queued");
    is_int(fake_is_released(p), 0, "the caller still owns the pointer");
    is_int(defer_free(p, s), cudaSuccess, "the next try succeeds");
    defer_flush();
    is_int(fake_is_released(p), 1, "and releases it");
}

static void test_destroyed_stream(void)
{
    cudaStream_t gone = stream_new();
    cudaStreamDestroy(gone);
    void *p = device_alloc(64);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, gone);
    const char *msg = stderr_capture_end();
    ok(err != cudaSuccess, "a destroyed stream is an error (%s)",
       cudaGetErrorName(err));
    /* Said in the caller's words: its stream, not only the CUDA call that
     * found the handle invalid. */
    ok(strstr(msg, "defer_free: a stream given is not a live stream") !=
           NULL,
       "the line says the stream is the problem (stderr: \"%s\")", msg);
    is_int(fake_is_released(p), 0, "the caller still owns the pointer");
    void *q = NULL;
    stderr_capture_begin();
    err = defer_alloc(&q, 64, gone);
    msg = stderr_capture_end();
    ok(err != cudaSuccess &&
           strstr(msg, "defer_alloc: a stream given is not a live "
                       "stream") != NULL,
       "and defer_alloc's too (stderr: \"%s\")", msg);
    cudaFree(p);
}

static void test_event_create_fails(cudaStream_t s)
{
    /* Take every idle event with entries held, one on each of as many new
     * streams (entries of one stream share events), so the next defer_free
     * on a new stream must create an event.  Until none is idle: a lane
     * let go of (a thread keeps 64) may give an earlier stream's event
     * back meanwhile. */
    (void)s;
    defer_flush();
    size_t cap = stats_now().events_in_pool + 256, idle = 0;
    uint64_t created = stats_now().events_created;
    cudaStream_t *hs = calloc(cap, sizeof *hs);
    fake_work **gate = calloc(cap, sizeof *gate);
    void **hold = calloc(cap, sizeof *hold);
    for (; idle < cap && stats_now().events_in_pool > 0; idle++) {
        hs[idle] = stream_new();
        gate[idle] = work_held(hs[idle], NULL);
        hold[idle] = device_alloc(64);
        work_timed(hs[idle], 0, hold[idle]);
        defer_free(hold[idle], hs[idle]);
    }
    is_int(stats_now().events_created, created,
           "the held entries took the idle events");
    is_int(stats_now().events_in_pool, 0, "none is idle");
    s = stream_new();
    void *p = device_alloc(64);
    fake_work *w = work_timed(s, 2000, p);
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, 1);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *msg = stderr_capture_end();
    is_int(err, cudaSuccess, "no event: accepted anyway");
    ok(fake_work_done(w), "the caller waited for the stream's work");
    is_int(fake_is_released(p), 1, "and released the pointer synchronously");
    ok(strstr(msg, "releasing synchronously") != NULL, "saying so on stderr");
    is_int(stats_now().sync_releases, 1, "counted as a synchronous release");
    for (size_t i = 0; i < idle; i++)
        fake_complete(gate[i]);
    is_int(defer_flush(), cudaSuccess, "the held entries drain");
    for (size_t i = 0; i < idle; i++)
        cudaStreamDestroy(hs[i]);
    cudaStreamDestroy(s);
    free(hold);
    free(gate);
    free(hs);
}

static void test_free_fails(cudaStream_t s)
{
    void *p = device_alloc(64);
    uint64_t failed = stats_now().failed;
    /* Both ways the reclaimer has: cudaFreeAsync, then cudaFree. */
    fake_fail(FAKE_FREE_ASYNC, cudaErrorNotSupported, 0, 1);
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    defer_free(p, s);
    defer_flush();
    const char *msg = stderr_capture_end();
    is_int(stats_now().failed - failed, 1, "a failed cudaFree is counted");
    ok(strstr(msg, "cudaFree failed") != NULL, "and named on stderr");
    is_int(fake_is_released(p), 0, "the pointer was not released");
    cudaFree(p);
}

/* ptr deferred with defer_free (defer_free_host when host) on s, taken at
 * the call, its release refused by CUDA: after a flush, stderr holds the
 * one line want, one failure is counted and no batch. */
static void refused_release(const char *what, void *ptr, bool host,
                            cudaStream_t s, const char *want)
{
    uint64_t failed = stats_now().failed, batches = stats_now().batches;
    stderr_capture_begin();
    cudaError_t err = host ? defer_free_host(ptr, s) : defer_free(ptr, s);
    defer_flush();
    const char *msg = stderr_capture_end();
    is_int(err, cudaSuccess, "%s: accepted at the call", what);
    is_int(stats_now().failed - failed, 1, "%s: its release fails, counted",
           what);
    /* batches: passes that released something (a failed release is not
     * one). */
    is_int(stats_now().batches - batches, 0, "%s: in no batch", what);
    is_str(msg, want, "%s: said in one line", what);
}

/* Memory CUDA never allocated (a made-up address, malloc's): before the
 * fix, two lines, the first the driver's ("cuPointerGetAttributes(0x1)
 * failed: CUDA_ERROR_INVALID_VALUE; its size and pool are unknown..."),
 * the second cudaFree's error. */
static void test_not_cuda_memory_to_defer_free(cudaStream_t s)
{
    char want[512];
    void *made_up = (void *)0x1;
    snprintf(want, sizeof want, "cudefer: defer_free(%p): not memory CUDA "
             "allocated (a host pointer, a freed or made-up address): "
             "cudaFreeAsync refused it, so it is not released (counted in "
             "failed)\n", made_up);
    refused_release("a made-up address", made_up, false, s, want);
    void *heap = malloc(64);
    if (heap == NULL)
        sysbail("malloc");
    snprintf(want, sizeof want, "cudefer: defer_free(%p): not memory CUDA "
             "allocated (a host pointer, a freed or made-up address): "
             "cudaFreeAsync refused it, so it is not released (counted in "
             "failed)\n", heap);
    refused_release("malloc's memory", heap, false, s, want);
    free(heap);
    snprintf(want, sizeof want, "cudefer: defer_free_host(%p): not memory "
             "CUDA allocated (a host pointer, a freed or made-up address): "
             "cudaFreeHost refused it, so it is not released (counted in "
             "failed)\n", made_up);
    refused_release("a made-up address to defer_free_host", made_up, true, s,
                    want);
}

/* A made-up address deferred through each call that frees but defer_free
 * and defer_free_host, its release refused by CUDA: the one line names
 * the call the application made (before, defer_free(PTR) for all, since
 * the entry did not record its call). */
enum free_call { BY_FREE_N, BY_FREE_STREAMS, BY_FREE_HOST_STREAMS,
                 BY_PLUGGABLE_FREE };

static void refused_release_by(enum free_call by, cudaStream_t s)
{
    static const char *const names[] = {
        "defer_free_n", "defer_free_streams", "defer_free_host_streams",
        "defer_pluggable_free"};
    void *made_up = (void *)0x1;
    char want[512];
    snprintf(want, sizeof want, "cudefer: %s%s%p%s: not memory CUDA "
             "allocated (a host pointer, a freed or made-up address): %s "
             "refused it, so it is not released (counted in failed)\n",
             names[by], by == BY_FREE_N ? ": " : "(", made_up,
             by == BY_FREE_N ? "" : ")",
             by == BY_FREE_HOST_STREAMS ? "cudaFreeHost" : "cudaFreeAsync");
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    cudaError_t err = cudaSuccess;
    switch (by) {
    case BY_FREE_N:
        err = defer_free_n(&made_up, 1, s);
        break;
    case BY_FREE_STREAMS:
        err = defer_free_streams(made_up, &s, 1);
        break;
    case BY_FREE_HOST_STREAMS:
        err = defer_free_host_streams(made_up, &s, 1);
        break;
    case BY_PLUGGABLE_FREE:
        defer_pluggable_free(made_up, 64, 0, s);
        break;
    }
    defer_flush();
    const char *msg = stderr_capture_end();
    is_int(err, cudaSuccess, "%s: accepted at the call", names[by]);
    is_int(stats_now().failed - failed, 1, "%s: its release fails, counted",
           names[by]);
    is_str(msg, want, "%s: said in one line naming it", names[by]);
}

static void test_host_pointer_to_defer_free(cudaStream_t s)
{
    void *h = host_alloc(64);
    char want[512];
    snprintf(want, sizeof want, "cudefer: defer_free(%p): pinned host "
             "memory, which defer_free_host releases: cudaFreeAsync refused it, so "
             "it is not released (counted in failed)\n", h);
    refused_release("pinned host memory to defer_free", h, false, s, want);
    is_int(fake_is_released(h), 0, "the host buffer is left alone");
    cudaFreeHost(h);
}

static void test_device_pointer_to_defer_free_host(cudaStream_t s)
{
    void *d = device_alloc(64);
    char want[512];
    snprintf(want, sizeof want, "cudefer: defer_free_host(%p): device "
             "memory, which defer_free releases: cudaFreeHost refused it, so "
             "it is not released (counted in failed)\n", d);
    refused_release("device memory to defer_free_host", d, true, s, want);
    is_int(fake_is_released(d), 0, "the device buffer is left alone");
    cudaFree(d);
}

static void test_interior_pointer_to_defer_free(cudaStream_t s)
{
    char *d = device_alloc(4096);
    char want[512];
    snprintf(want, sizeof want, "cudefer: defer_free(%p): points 512 bytes "
             "inside the allocation at %p, not at its start: cudaFreeAsync "
             "refused it, so it is not released (counted in failed)\n",
             (void *)(d + 512), (void *)d);
    refused_release("a pointer inside device memory", d + 512, false, s,
                    want);
    is_int(fake_is_released(d), 0, "the allocation is left alone");
    cudaFree(d);
}

static void test_sticky_query_error(cudaStream_t s)
{
    void *p = device_alloc(64);
    fake_work *w = work_held(s, p);
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    stderr_capture_begin();
    defer_free(p, s);
    cudaError_t flush_err = defer_flush();
    const char *msg = stderr_capture_end();
    is_int(flush_err, cudaErrorIllegalAddress, "flush returns the sticky error");
    is_int(fake_is_released(p), 0, "a failed query is never taken as completion");
    ok(strstr(msg, "cudaEventQuery failed") != NULL &&
       strstr(msg, "illegal memory access") != NULL,
       "reported with the CUDA error string");
    void *q = device_alloc(64);
    stderr_capture_begin();
    is_int(defer_free(q, s), cudaErrorIllegalAddress,
           "later defer calls on the device return the error");
    stderr_capture_end();
    is_int(fake_is_released(q), 0, "and leave the pointer to the caller");
    struct defer_stats st = stats_now();
    is_int(st.pending, 0, "the abandoned entry is not pending");
    fake_fail_clear();
    fake_complete(w);
    cudaFree(p);
    cudaFree(q);
}

/* A device that fails in the pass that serves a trim: the trim returns
 * its error, as a flush does, not cudaSuccess (a device failed before the
 * trim was taken in is not the only one that counts).  The reclaimer polls
 * once a second, so the failure comes in the trim's own pass. */
static void trim_sees_failure(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    sleep_ms(100); /* taken in and polled once: not ready */
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    stderr_capture_begin();
    size_t bytes = 1;
    cudaError_t err = defer_trim(&bytes);
    stderr_capture_end();
    CHECK(err == cudaErrorIllegalAddress, "the trim returns %s",
          cudaGetErrorName(err));
    CHECK(fake_is_released(p) == 0, "nothing released");
    fake_fail_clear();
    fake_complete(w);
}

/* A refused release on the synchronous route (CUDEFER_DISABLE: released
 * on the calling thread) names the call made, as the reclaimer's does. */
static void sync_release_names_the_call(void)
{
    cudaStream_t s = stream_new();
    void *made_up = (void *)0x1;
    stderr_capture_begin();
    cudaError_t err = defer_free_streams(made_up, &s, 1);
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_free_streams: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "cudefer: defer_free_streams(0x1): not memory CUDA "
                   "allocated", "cudaFree refused it", NULL),
          "said naming defer_free_streams (stderr: \"%s\")", said);
}

/* A block's defer_record_stream on a device that failed since it was
 * handed out: the device's sticky error, as every later call on it
 * returns, and nothing recorded (not recorded with cudaSuccess). */
static void record_stream_after_failure(void)
{
    cudaStream_t s = stream_new(), other = stream_new();
    void *b = NULL;
    CHECK(defer_alloc(&b, 4096, s) == cudaSuccess, "a block");
    void *p = device_alloc(64);
    fake_work *w = work_held(s, p);
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    stderr_capture_begin();
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(defer_flush() == cudaErrorIllegalAddress, "the device fails");
    uint64_t rejected = stats_now().rejected;
    cudaError_t err = defer_record_stream(b, other);
    stderr_capture_end();
    CHECK(err == cudaErrorIllegalAddress,
          "defer_record_stream on the failed device: %s",
          cudaGetErrorName(err));
    CHECK(stats_now().rejected - rejected == 1, "counted as rejected");
    fake_fail_clear();
    fake_complete(w);
}

/* A start that fails under a call that hands nothing over (an allocation)
 * says the call's error and that the next call tries again, never that
 * "the caller keeps ownership" (of nothing), as its refusal after
 * defer_shutdown does not. */
static void alloc_start_fails(void)
{
    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, 1);
    void *p = NULL;
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, 64, NULL);
    const char *said = stderr_capture_end();
    CHECK(err == cudaErrorNoDevice, "the start's error: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "defer_alloc: cudaGetDeviceCount failed",
                   "the next call tries again", NULL),
          "said in one line naming the call: %s", said);
    CHECK(strstr(said, "ownership") == NULL && strstr(said, "deferred") == NULL,
          "no word of ownership or of deferring for an allocation: %s",
          said);
    fake_fail_clear();
}

static void test_start_fails(void)
{
    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, 1);
    void *p = device_alloc(64);
    is_int(defer_free(p, 0), cudaErrorNoDevice,
           "start-up failure is returned to the caller");
    is_int(defer_free(p, 0), cudaSuccess, "the next call starts the reclaimer");
    is_int(defer_flush(), cudaSuccess, "flush");
}

int main(void)
{
    plan_lazy();
    fork_scenario("a device failing in a trim's pass is the trim's error",
                  "CUDEFER_POLL_US=1s CUDEFER_POLL_MAX_US=1s", 1, 20000,
                  trim_sees_failure);
    fork_scenario("CUDEFER_DISABLE: a refused release names the call made",
                  "CUDEFER_DISABLE=1", 1, 20000, sync_release_names_the_call);
    fork_scenario("defer_record_stream on a failed device: its error", "", 1,
                  20000, record_stream_after_failure);
    fork_scenario("defer_alloc whose start fails says so without words of "
                  "ownership", "", 1, 20000, alloc_start_fails);
    fake_reset(1);
    test_start_fails();
    cudaStream_t s = stream_new();
    test_record_fails(s);
    test_destroyed_stream();
    test_event_create_fails(s);
    test_free_fails(s);
    test_not_cuda_memory_to_defer_free(s);
    refused_release_by(BY_FREE_N, s);
    refused_release_by(BY_FREE_STREAMS, s);
    refused_release_by(BY_FREE_HOST_STREAMS, s);
    refused_release_by(BY_PLUGGABLE_FREE, s);
    test_host_pointer_to_defer_free(s);
    test_device_pointer_to_defer_free_host(s);
    test_interior_pointer_to_defer_free(s);
    test_sticky_query_error(s);
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
