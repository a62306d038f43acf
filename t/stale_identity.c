/* SPDX-License-Identifier: MIT */
/* A thread's cached stream identity can be stale: the stream was destroyed
 * and its handle now names another stream (on another device, recording
 * then fails with cudaErrorInvalidResourceHandle).  The single-stream path
 * then looks the stream up again and retries once; the *_streams path must
 * do the same.  The stale identity is emulated by a
 * record that fails once with cudaErrorInvalidResourceHandle on a stream
 * whose identity the thread has cached, and made for real by giving a
 * destroyed stream's handle to a new stream (fake_stream_create_reusing). */
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"
#include "stream_identity.h"

static int calls;

static void count_call(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&calls, 1, __ATOMIC_SEQ_CST);
}

/* A defer_free on s makes s the thread's cached stream. */
static void cache_stream(cudaStream_t s)
{
    void *p = device_alloc(64);
    work_timed(s, 100, p);
    if (defer_free(p, s) != cudaSuccess)
        bail("defer_free");
}

/* The group's first record (on s0, from the cache) fails once, as for a
 * stale identity. */
static void test_group_retries(void)
{
    cudaStream_t s[2] = {stream_new(), stream_new()};
    void *p = device_alloc(4096), *h = host_alloc(64);
    work_timed(s[0], 1000, p);
    work_timed(s[1], 2000, p);
    uint64_t rejected = stats_now().rejected;
    cache_stream(s[0]);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 1);
    cudaError_t err = defer_free_streams(p, s, 2);
    is_int(err, cudaSuccess, "defer_free_streams: a stale cached identity is "
           "looked up again and the record retried (%s)", cudaGetErrorName(err));
    work_timed(s[0], 100, h);
    cache_stream(s[0]);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 1);
    err = defer_free_host_streams(h, s, 2);
    is_int(err, cudaSuccess, "defer_free_host_streams likewise (%s)",
           cudaGetErrorName(err));
    /* (defer_call_streams never uses the cache: t/callback_order.) */
    err = defer_call_streams(count_call, NULL, s, 2);
    is_int(err, cudaSuccess, "defer_call_streams");
    is_int(stats_now().rejected - rejected, 0, "nothing refused");
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(h) == 1 && calls == 1,
       "released after both streams, callback run once");

    /* A record that fails again after the fresh look-up is the caller's
     * error, and nothing is deferred. */
    void *r = device_alloc(64);
    cache_stream(s[0]);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorInvalidResourceHandle, 0, 2);
    stderr_capture_begin();
    err = defer_free_streams(r, s, 2);
    const char *msg = stderr_capture_end();
    fake_fail_clear();
    is_int(err, cudaErrorInvalidResourceHandle, "a record failing again is "
           "returned");
    ok(strstr(msg, "defer_free_streams") != NULL, "and reported");
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(r), 0, "the caller keeps r");
    cudaFree(r);
    cudaStreamDestroy(s[0]);
    cudaStreamDestroy(s[1]);
}

/* A stream of device 0 whose identity this thread cached, destroyed, its
 * handle now naming a new stream of device 1 (returned; the destroyed
 * one's handle in *old, if not NULL); device 0 current. */
static cudaStream_t reused_on_device_1(cudaStream_t *old)
{
    cudaStream_t s = stream_new();
    cache_stream(s);
    cudaStreamDestroy(s);
    cudaSetDevice(1);
    cudaStream_t b = fake_stream_create_reusing(s);
    cudaSetDevice(0);
    if (old != NULL)
        *old = s;
    return b;
}

/* The real thing, now that the fake can give a destroyed stream's handle
 * to a new stream (fake_stream_create_reusing): the thread cached the old
 * stream's identity, and the handle now names a stream of device 1.  The
 * free's record fails (the event is device 0's), the stream is looked up
 * again and the free goes through; nothing is released before its work. */
static void test_handle_reused_on_another_device(void)
{
    cudaStream_t s;
    cudaStream_t b = reused_on_device_1(&s);
    cudaSetDevice(1);
    void *p = device_alloc(64);
    cudaSetDevice(0);
    ok(b == s, "device 1's new stream has the destroyed stream's handle");
    fake_work *w = work_held(b, p);
    uint64_t rejected = stats_now().rejected;
    is_int(defer_free(p, b), cudaSuccess,
           "defer_free on it: the stale identity is looked up again");
    void *q = device_alloc(64);
    cudaSetDevice(1);
    void *r = device_alloc(64);
    cudaSetDevice(0);
    work_timed(b, 100, r);
    cudaStream_t streams[1] = {b};
    is_int(defer_free_streams(r, streams, 1), cudaSuccess,
           "defer_free_streams on it too");
    is_int(stats_now().rejected - rejected, 0, "nothing refused");
    is_int(fake_is_released(p), 0, "not released while its work is held");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(r) == 1,
       "released once their work on device 1 is done");
    cudaFree(q);
    cudaStreamDestroy(b);
}

/* The stale identity's record failing through the runtime (no current
 * context: the runtime's cudaEventRecord stands in for the driver's) is
 * cudefer's own business: the fresh look-up's record succeeds and the call
 * returns cudaSuccess, so the thread's last error must be as it was, not
 * the failed record's cudaErrorInvalidResourceHandle (PyTorch's launch
 * checks read it after every kernel). */
static void test_retry_leaves_last_error(void)
{
    cudaStream_t b = reused_on_device_1(NULL);
    cudaSetDevice(1);
    void *p = device_alloc(64);
    cudaSetDevice(0);
    fake_work *w = work_held(b, p);
    cudaGetLastError();
    fake_set_no_context(1);
    is_int(defer_free(p, b), cudaSuccess,
           "defer_free, runtime record on a stale identity, retried");
    cudaError_t last = cudaGetLastError();
    fake_set_no_context(0);
    is_int(last, cudaSuccess, "and no error left for cudaGetLastError (%s)",
           cudaGetErrorName(last));
    cudaStreamDestroy(b);

    cudaStream_t c = reused_on_device_1(NULL);
    cudaSetDevice(1);
    void *q = device_alloc(64);
    cudaSetDevice(0);
    fake_work *v = work_held(c, q);
    cudaStream_t streams[1] = {c};
    cudaGetLastError();
    fake_set_no_context(1);
    is_int(defer_free_streams(q, streams, 1), cudaSuccess,
           "defer_free_streams likewise");
    last = cudaGetLastError();
    fake_set_no_context(0);
    is_int(last, cudaSuccess, "and no error left for cudaGetLastError (%s)",
           cudaGetErrorName(last));
    fake_complete(w);
    fake_complete(v);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(q) == 1,
       "released once their work on device 1 is done");
    cudaStreamDestroy(c);
}

/* The handle reused on the same device: the thread's stale identity names
 * the old stream, whose work is still held; the new stream's callbacks
 * keep their order and run after the new stream's own work only. */
static void test_handle_reused_on_the_same_device(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fake_work *old = work_held(s, p);
    is_int(defer_free(p, s), cudaSuccess, "defer_free on s, its work held");
    cudaStreamDestroy(s);
    cudaStream_t b = fake_stream_create_reusing(s);
    calls = 0;
    for (int i = 0; i < 3; i++)
        is_int(defer_call(count_call, NULL, b), cudaSuccess,
               "defer_call %d on the new stream", i);
    for (int i = 0; i < 2000 && __atomic_load_n(&calls, __ATOMIC_SEQ_CST) < 3;
         i++)
        sleep_ms(1);
    is_int(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 3,
           "the new stream's callbacks ran while the old stream's work is "
           "still held: they never waited for it");
    is_int(fake_is_released(p), 0, "the old stream's free still waits");
    fake_complete(old);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(p), 1, "and is released once its work is done");
    cudaStreamDestroy(b);
}

/* The handle reused on the same device while a callback of the old stream
 * waits: a callback is looked up exactly (the thread's cached id checked
 * against the stream's), so the new stream's callbacks are not queued
 * behind the old stream's under its stale id. */
static int old_calls;

static void count_old_call(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&old_calls, 1, __ATOMIC_SEQ_CST);
}

static void test_handle_reused_behind_a_callback(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fake_work *old = work_held(s, p);
    old_calls = 0;
    is_int(defer_call(count_old_call, NULL, s), cudaSuccess,
           "defer_call on s, its work held");
    cudaStreamDestroy(s);
    cudaStream_t b = fake_stream_create_reusing(s);
    calls = 0;
    for (int i = 0; i < 3; i++)
        is_int(defer_call(count_call, NULL, b), cudaSuccess,
               "defer_call %d on the new stream (a callback of s waits)", i);
    for (int i = 0; i < 10000 && __atomic_load_n(&calls, __ATOMIC_SEQ_CST) < 3;
         i++)
        sleep_ms(1);
    is_int(__atomic_load_n(&calls, __ATOMIC_SEQ_CST), 3,
           "the new stream's callbacks ran while the old stream's callback "
           "waits: not queued behind it under the old stream's id");
    is_int(__atomic_load_n(&old_calls, __ATOMIC_SEQ_CST), 0,
           "the old stream's callback still waits for its work");
    fake_complete(old);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(__atomic_load_n(&old_calls, __ATOMIC_SEQ_CST), 1,
           "and runs once its work is done");
    cudaFree(p);
    cudaStreamDestroy(b);
}

/* An exact look-up of a handle whose cached identity went stale: the
 * check's cudaStreamGetId gives the new stream's id, which the fresh
 * look-up keeps (one cudaStreamGetDevice more, no second
 * cudaStreamGetId); the next exact look-up finds it cached. */
static void test_stale_lookup_calls(void)
{
    cudaStream_t s = stream_new();
    int device = -1;
    unsigned long long id = 0, old_id = 0;
    bool cached = true;
    const char *call = NULL;
    stream_identity_lookup(s, true, &device, &old_id, &cached, &call);
    cudaStreamDestroy(s);
    cudaStream_t b = fake_stream_create_reusing(s);
    unsigned long ids = fake_calls(FAKE_STREAM_GET_ID),
                  devices = fake_calls(FAKE_STREAM_GET_DEVICE);
    is_int(stream_identity_lookup(b, true, &device, &id, &cached, &call),
           cudaSuccess, "exact look-up of the reused handle");
    ok(!cached && id != old_id && device == 0,
       "looked up afresh: the new stream's id");
    ok(fake_calls(FAKE_STREAM_GET_ID) - ids == 1 &&
           fake_calls(FAKE_STREAM_GET_DEVICE) - devices == 1,
       "one cudaStreamGetId (%lu) and one cudaStreamGetDevice (%lu)",
       fake_calls(FAKE_STREAM_GET_ID) - ids,
       fake_calls(FAKE_STREAM_GET_DEVICE) - devices);
    ids = fake_calls(FAKE_STREAM_GET_ID);
    devices = fake_calls(FAKE_STREAM_GET_DEVICE);
    unsigned long long again = 0;
    stream_identity_lookup(b, true, &device, &again, &cached, &call);
    ok(cached && again == id && fake_calls(FAKE_STREAM_GET_ID) - ids == 1 &&
           fake_calls(FAKE_STREAM_GET_DEVICE) == devices,
       "then cached: checked with one cudaStreamGetId");
    cudaStreamDestroy(b);
}

/* A cached identity whose device has failed is not trusted: the stream is
 * looked up again before the call is refused with that device's error (a
 * destroyed stream's handle may now name a stream of a healthy device;
 * the fake never reuses handles, so the fresh look-up is what is seen). */
static void s_failed_device_looked_up_again(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p = device_alloc(64), *q = device_alloc(64);
    cudaSetDevice(0);
    fake_work *w = work_held(s1, p);
    CHECK(defer_free(p, s1) == cudaSuccess, "defer_free caches s1");
    cudaSetDevice(1);
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    stderr_capture_begin();
    cudaError_t err = defer_flush();
    fake_fail_clear();
    cudaSetDevice(0);
    CHECK(err == cudaErrorIllegalAddress, "device 1 failed: %s",
          cudaGetErrorName(err));
    unsigned long lookups = fake_calls(FAKE_STREAM_GET_DEVICE);
    for (int i = 0; i < 2; i++) {
        err = defer_free(q, s1);
        CHECK(err == cudaErrorIllegalAddress, "defer_free on s1: %s",
              cudaGetErrorName(err));
    }
    cudaStream_t streams[1] = {s1};
    err = defer_free_streams(q, streams, 1);
    stderr_capture_end();
    CHECK(err == cudaErrorIllegalAddress, "defer_free_streams on s1: %s",
          cudaGetErrorName(err));
    CHECK(fake_calls(FAKE_STREAM_GET_DEVICE) - lookups == 3,
          "each refusal looked s1 up afresh (%lu look-ups, want 3)",
          fake_calls(FAKE_STREAM_GET_DEVICE) - lookups);
    fake_complete(w);
    cudaFree(p);
    cudaFree(q);
}

/* The handle reused on a failed device: the thread cached the destroyed
 * stream's identity (device 0, healthy), and the handle now names a stream
 * of device 1, which failed.  The record fails, the stream is looked up
 * afresh, and the fresh device's error refuses the call as any later call
 * on a failed device is refused (include/cudefer.h): the caller keeps the
 * pointer, nothing is queued on the failed device to be abandoned there,
 * and the refusal is counted once. */
static void s_reused_on_failed_device(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p1 = device_alloc(64), *p = device_alloc(64);
    cudaSetDevice(0);
    cudaStream_t s = stream_new();
    cache_stream(s);
    CHECK(defer_flush() == cudaSuccess, "flush before device 1 fails");
    fake_work *w = work_held(s1, p1);
    CHECK(defer_free(p1, s1) == cudaSuccess, "defer_free on device 1");
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    stderr_capture_begin();
    cudaError_t err = defer_flush();
    fake_fail_clear();
    CHECK(err == cudaErrorIllegalAddress, "device 1 failed: %s",
          cudaGetErrorName(err));
    fake_complete(w);
    cudaStreamDestroy(s);
    cudaSetDevice(1);
    cudaStream_t b = fake_stream_create_reusing(s);
    void *h = host_alloc(64);
    cudaSetDevice(0);
    CHECK(b == s, "device 1's new stream has the destroyed stream's handle");
    uint64_t rejected = stats_now().rejected;
    uint64_t failed = stats_now().failed;
    err = defer_free(p, b);
    CHECK(err == cudaErrorIllegalAddress, "defer_free on the reused handle "
          "is refused with device 1's error: %s", cudaGetErrorName(err));
    err = defer_free_host(h, b);
    CHECK(err == cudaErrorIllegalAddress, "defer_free_host likewise: %s",
          cudaGetErrorName(err));
    defer_flush();
    const char *msg = stderr_capture_end();
    CHECK(stats_now().rejected - rejected == 2, "both refusals counted "
          "(%llu)", ULL(stats_now().rejected - rejected));
    CHECK(stats_now().failed == failed, "nothing queued on the failed "
          "device to be abandoned (failed %llu -> %llu)", ULL(failed),
          ULL(stats_now().failed));
    CHECK(strstr(msg, "nothing was deferred") != NULL, "the refusal said");
    CHECK(fake_is_released(p) == 0 && fake_is_released(h) == 0,
          "the caller keeps p and h");
    cudaFree(p);
    cudaFreeHost(h);
    cudaFree(p1);
}

int main(void)
{
    plan_lazy();
    pid_t pid = fork_flushed();
    if (pid == 0) {
        fake_reset(2);
        failed_checks = 0;
        s_failed_device_looked_up_again();
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, 15000, &status);
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "a cached identity whose device failed is looked up again before the "
       "call is refused");
    fork_scenario("a reused handle whose fresh device failed refuses the "
                  "call", "", 2, 15000, s_reused_on_failed_device);
    fake_reset(2);
    test_group_retries();
    test_handle_reused_on_another_device();
    test_handle_reused_on_the_same_device();
    test_handle_reused_behind_a_callback();
    test_stale_lookup_calls();
    test_retry_leaves_last_error();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
