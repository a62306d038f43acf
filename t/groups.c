/* SPDX-License-Identifier: MIT */
/* Memory used by several streams (defer_free_streams and its host and call
 * variants): released only after the work of every stream, without the
 * streams waiting for each other; a failure on any stream defers nothing. */
#include <stdio.h>
#include <string.h>

#include "helpers.h"

static int calls;

static void count_call(void *arg)
{
    (void)arg;
    __atomic_fetch_add(&calls, 1, __ATOMIC_SEQ_CST);
}

static void test_waits_for_every_stream(void)
{
    cudaStream_t s[3] = {stream_new(), stream_new(), stream_new()};
    void *p = device_alloc(4096);
    fake_work *w[3];
    for (int i = 0; i < 3; i++)
        w[i] = work_held(s[i], p);
    is_int(defer_free_streams(p, s, 3), cudaSuccess, "defer_free_streams on 3");
    fake_complete(w[0]);
    fake_complete(w[2]);
    sleep_ms(20);
    is_int(fake_is_released(p), 0, "held while one stream's work is pending");
    fake_complete(w[1]);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(p), 1, "released once every stream is done");
    for (int i = 0; i < 3; i++)
        cudaStreamDestroy(s[i]);
}

static void test_host_and_call(void)
{
    cudaStream_t s[2] = {stream_new(), stream_new()};
    void *h = host_alloc(256);
    fake_work *a = work_held(s[0], h), *b = work_held(s[1], h);
    is_int(defer_free_host_streams(h, s, 2), cudaSuccess,
           "defer_free_host_streams");
    is_int(defer_call_streams(count_call, NULL, s, 2), cudaSuccess,
           "defer_call_streams");
    fake_complete(b);
    sleep_ms(20);
    ok(fake_is_released(h) == 0 && __atomic_load_n(&calls, __ATOMIC_SEQ_CST) == 0,
       "neither released nor called while stream 0 is busy");
    fake_complete(a);
    defer_flush();
    ok(fake_is_released(h) == 1 && calls == 1,
       "pinned buffer released and callback run once, after both");
    cudaStreamDestroy(s[0]);
    cudaStreamDestroy(s[1]);
}

static void test_failure_defers_nothing(void)
{
    cudaStream_t good = stream_new(), gone = stream_new();
    cudaStreamDestroy(gone);
    cudaStream_t s[2] = {good, gone};
    void *p = device_alloc(64);
    uint64_t deferred = stats_now().deferred;
    size_t idle = stats_now().events_in_pool;
    stderr_capture_begin();
    cudaError_t err = defer_free_streams(p, s, 2);
    const char *msg = stderr_capture_end();
    ok(err != cudaSuccess, "a bad second stream is an error (%s)",
       cudaGetErrorName(err));
    char which[64];
    snprintf(which, sizeof which, "streams[1] (%p) is not a live stream",
             (void *)gone);
    ok(has_line(msg, "defer_free_streams: ", which, NULL),
       "said in one line naming the call and which stream: its place in "
       "the array and its handle");
    uint64_t rejected = stats_now().rejected;
    cudaStream_t first_gone[3] = {good, good, gone};
    stderr_capture_begin();
    cudaError_t e2 = defer_call_streams(count_call, NULL, first_gone, 3);
    cudaError_t e3 = defer_free_host_streams(p, first_gone, 3);
    msg = stderr_capture_end();
    snprintf(which, sizeof which, "streams[2] (%p) is not a live stream",
             (void *)gone);
    ok(e2 == cudaErrorInvalidResourceHandle &&
           e3 == cudaErrorInvalidResourceHandle &&
           has_line(msg, "defer_call_streams: ", which, NULL) &&
           has_line(msg, "defer_free_host_streams: ", which, NULL) &&
           stats_now().rejected == rejected + 2,
       "defer_call_streams and defer_free_host_streams likewise, each "
       "counted once");
    is_int(stats_now().deferred - deferred, 0, "nothing deferred");
    is_int(stats_now().events_in_pool, idle, "the first stream's event went back");
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(p), 0, "the caller still owns the pointer");
    cudaFree(p);
    stderr_capture_begin();
    is_int(defer_free_streams(p, NULL, 2), cudaErrorInvalidValue, "NULL streams");
    msg = stderr_capture_end();
    ok(has_line(msg, "defer_free_streams", "streams is NULL", NULL) &&
           strstr(msg, "expected 1..64") == NULL,
       "a NULL list is said as such, not as a count out of range");
    stderr_capture_begin();
    is_int(defer_free_streams(p, s, 0), cudaErrorInvalidValue, "no streams");
    msg = stderr_capture_end();
    ok(has_line(msg, "defer_free_streams: 0 streams", "expected 1..64",
                NULL),
       "no streams: the count and the range said");
    is_int(defer_free_streams(NULL, s, 2), cudaSuccess, "NULL ptr: a no-op");
    cudaStreamDestroy(good);
}

static void test_failed_member_device(void)
{
    /* Device 1's queries fail: the group's payload on device 0 must not be
     * released (device 1 may still use the memory): it fails. */
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new();
    cudaStream_t s[2] = {s0, s1};
    void *p = device_alloc(64);
    fake_work *a = work_held(s0, p), *b = work_held(s1, p);
    is_int(defer_free_streams(p, s, 2), cudaSuccess, "across two devices");
    fake_complete(a);
    uint64_t failed = stats_now().failed;
    stderr_capture_begin();
    cudaSetDevice(1);
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, -1);
    cudaError_t f = defer_flush();
    fake_fail_clear();
    cudaSetDevice(0);
    stderr_capture_end();
    is_int(f, cudaErrorIllegalAddress, "flush returns the member device's error");
    is_int(fake_is_released(p), 0, "the payload is not released");
    is_int(stats_now().failed - failed, 1, "it counts as one failed entry");
    fake_complete(b);
    cudaFree(p);
}

/* Before test_failed_member_device, which fails device 1 for good.  The
 * header's limits: n is 1..64 for every *_streams call (65:
 * cudaErrorInvalidValue, said, nothing deferred, the caller keeps the
 * pointer); and a free of a block recorded on other streams counts those
 * too: 64 given plus one recorded is refused the same way. */
static void test_stream_count_limits(void)
{
    enum { MAX = 64 };
    cudaStream_t s[MAX + 1];
    for (int i = 0; i <= MAX; i++)
        s[i] = stream_new();
    void *p = device_alloc(64), *h = host_alloc(64);
    int before = __atomic_load_n(&calls, __ATOMIC_SEQ_CST);
    uint64_t deferred = stats_now().deferred;
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    cudaError_t e1 = defer_free_streams(p, s, MAX + 1);
    cudaError_t e2 = defer_free_host_streams(h, s, MAX + 1);
    cudaError_t e3 = defer_call_streams(count_call, NULL, s, MAX + 1);
    const char *msg = stderr_capture_end();
    ok(e1 == cudaErrorInvalidValue && e2 == cudaErrorInvalidValue &&
           e3 == cudaErrorInvalidValue,
       "65 streams: each *_streams call is cudaErrorInvalidValue");
    ok(strstr(msg, "defer_free_streams: 65 streams: refused (expected "
                   "1..64 streams)\n") != NULL &&
           strstr(msg, "defer_free_host_streams: 65 streams") != NULL &&
           strstr(msg, "defer_call_streams: 65 streams") != NULL,
       "each said in a line naming the call and the count expected");
    ok(stats_now().deferred == deferred &&
           stats_now().rejected == rejected + 3,
       "nothing deferred, three rejected");

    is_int(defer_free_streams(p, s, MAX), cudaSuccess, "64 streams: taken");
    is_int(defer_free_host_streams(h, s, MAX), cudaSuccess,
           "64 streams: taken (host)");
    is_int(defer_call_streams(count_call, NULL, s, MAX), cudaSuccess,
           "64 streams: taken (callback)");
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(h) == 1 &&
           __atomic_load_n(&calls, __ATOMIC_SEQ_CST) == before + 1,
       "released and called once");

    void *b;
    is_int(alloc_checked(&b, 4096, s[0]), cudaSuccess, "a block on stream 0");
    is_int(defer_record_stream(b, s[MAX]), cudaSuccess,
           "recorded on a 65th stream");
    deferred = stats_now().deferred;
    stderr_capture_begin();
    cudaError_t e = defer_free_streams(b, s, MAX);
    msg = stderr_capture_end();
    is_int(e, cudaErrorInvalidValue,
           "its free on 64 other streams: 65 in all, refused");
    ok(strstr(msg, "more than 64 streams: refused") != NULL,
       "said: more than 64 streams");
    ok(stats_now().deferred == deferred, "nothing deferred");
    is_int(defer_free_streams(b, s, MAX - 1), cudaSuccess,
           "on 63 of them: 64 in all, taken");
    is_int(defer_flush(), cudaSuccess, "flush: the block back in the cache");
    is_int(defer_trim(NULL), cudaSuccess,
           "trim: and back to CUDA");
    for (int i = 0; i <= MAX; i++)
        cudaStreamDestroy(s[i]);
}

/* A stream named twice in one call is one stream: one event, and counted
 * once against the 64 a free may wait for.  A block recorded on a 65th
 * stream, freed on 64 names of 63 streams: 64 in all, taken. */
static void test_stream_named_twice(void)
{
    enum { MAX = 64 };
    cudaStream_t s[MAX + 1];
    for (int i = 0; i <= MAX; i++)
        s[i] = stream_new();
    void *b;
    is_int(alloc_checked(&b, 4096, s[0]), cudaSuccess, "a block on stream 0");
    is_int(defer_record_stream(b, s[MAX]), cudaSuccess,
           "recorded on a 65th stream");
    fake_work *w = work_held(s[MAX], b);
    cudaStream_t named[MAX];
    named[0] = s[0];
    for (int i = 1; i < MAX; i++)
        named[i] = s[i - 1]; /* s[0] twice, then s[1..62] */
    uint64_t rejected = stats_now().rejected;
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    stderr_capture_begin();
    cudaError_t e = defer_free_streams(b, named, MAX);
    stderr_capture_end();
    is_int(e, cudaSuccess,
           "64 names of 63 streams and the recorded one: 64 in all, taken");
    ok(stats_now().rejected == rejected &&
           fake_calls(FAKE_EVENT_RECORD) - records == MAX,
       "nothing rejected; one event a stream (%lu)",
       fake_calls(FAKE_EVENT_RECORD) - records);
    void *again;
    is_int(alloc_checked(&again, 4096, s[0]), cudaSuccess,
           "an allocation on stream 0 while the recorded stream works");
    ok(again != b, "it is not the block (its recorded work is pending)");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");

    void *p = device_alloc(64);
    w = work_held(s[1], p);
    cudaStream_t twice[3] = {s[1], s[2], s[1]};
    records = fake_calls(FAKE_EVENT_RECORD);
    is_int(defer_free_streams(p, twice, 3), cudaSuccess,
           "a plain pointer on s1, s2, s1");
    is_int(fake_calls(FAKE_EVENT_RECORD) - records, 2, "two events");
    int before = __atomic_load_n(&calls, __ATOMIC_SEQ_CST);
    is_int(defer_call_streams(count_call, NULL, twice, 3), cudaSuccess,
           "a callback on s1, s2, s1");
    sleep_ms(20);
    ok(fake_is_released(p) == 0 &&
           __atomic_load_n(&calls, __ATOMIC_SEQ_CST) == before,
       "neither released nor called while s1 works");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 &&
           __atomic_load_n(&calls, __ATOMIC_SEQ_CST) == before + 1,
       "released, and called once");
    is_int(defer_free(again, s[0]), cudaSuccess, "the other block freed");
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(defer_trim(NULL), cudaSuccess, "trim: the blocks back to CUDA");
    for (int i = 0; i <= MAX; i++)
        cudaStreamDestroy(s[i]);
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    test_waits_for_every_stream();
    test_host_and_call();
    test_failure_defers_nothing();
    test_stream_count_limits();
    test_stream_named_twice();
    test_failed_member_device();
    struct defer_stats st = stats_now();
    ok(st.pending == 0 && st.deferred == st.released + st.failed,
       "stats agree: deferred %llu = released %llu + failed %llu",
       (unsigned long long)st.deferred, (unsigned long long)st.released,
       (unsigned long long)st.failed);
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
