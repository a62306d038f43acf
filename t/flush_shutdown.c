/* SPDX-License-Identifier: MIT */
/* defer_flush waits for what was deferred before it (and only that);
 * defer_shutdown drains, stops, and refuses later calls clearly. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"
#include "lifecycle.h"

static int flushed;

static void test_flush_waits(void)
{
    is_int(defer_flush(), cudaSuccess, "flush with nothing deferred returns");
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fake_work *w = work_held(s, p);
    defer_free(p, s);
    unsigned long pushed = lifecycle_requests_pushed();
    pthread_t t;
    flush_in_thread(&t, &flushed);
    /* Its request is in the queue before the later entry is deferred:
     * waited for, not slept for (a loaded machine may not run the thread
     * for tens of ms). */
    for (int i = 0; i < 10000 && lifecycle_requests_pushed() == pushed; i++)
        sleep_ms(1);
    ok(lifecycle_requests_pushed() > pushed, "the flush's request is queued");
    is_int(__atomic_load_n(&flushed, __ATOMIC_SEQ_CST), 0,
           "flush blocks while an earlier entry is pending");
    /* An entry deferred after the flush began does not hold it up. */
    cudaStream_t other = stream_new();
    void *later = device_alloc(64);
    fake_work *wl = work_held(other, later);
    defer_free(later, other);
    fake_complete(w);
    bool returned = wait_flag(&flushed, 10000);
    ok(returned, "flush returns once the earlier entry is released");
    is_int(fake_is_released(p), 1, "the earlier entry is released");
    is_int(fake_is_released(later), 0, "the later entry is still held");
    if (!returned) /* it waits for the later entry: let it end */
        fake_complete(wl);
    pthread_join(t, NULL);
    if (returned)
        fake_complete(wl);
    is_int(defer_flush(), cudaSuccess, "second flush");
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
}

static cudaError_t flush_in_callback = cudaSuccess;
static cudaError_t shutdown_in_callback = cudaSuccess;

static void call_flush(void *unused)
{
    (void)unused;
    flush_in_callback = defer_flush();
    shutdown_in_callback = defer_shutdown();
}

static void test_flush_from_callback(void)
{
    stderr_capture_begin();
    defer_call(call_flush, NULL, 0);
    cudaError_t err = defer_flush();
    const char *msg = stderr_capture_end();
    is_int(err, cudaSuccess, "flush after a callback that flushes");
    is_int(flush_in_callback, cudaErrorNotPermitted,
           "defer_flush inside a callback is refused, not a deadlock");
    is_int(shutdown_in_callback, cudaErrorNotPermitted,
           "defer_shutdown inside a callback is refused");
    ok(strstr(msg, "defer_flush called from a defer_call callback") != NULL,
       "and says why");
}

static void *inner_ptr;
static cudaError_t inner_err = cudaErrorUnknown;

static void defer_from_callback(void *stream)
{
    inner_err = defer_free(inner_ptr, (cudaStream_t)stream);
}

static void test_defer_from_callback(void)
{
    cudaStream_t s = stream_new();
    inner_ptr = device_alloc(64);
    work_timed(s, 100, inner_ptr);
    defer_call(defer_from_callback, s, s);
    is_int(defer_flush(), cudaSuccess, "flush after a callback that defers");
    is_int(inner_err, cudaSuccess, "defer_free inside a callback is accepted");
    is_int(defer_flush(), cudaSuccess, "and a later flush covers it");
    is_int(fake_is_released(inner_ptr), 1, "so it is released");
    cudaStreamDestroy(s);
}

static int shut_down;
static cudaError_t shutdown_err = cudaErrorUnknown;

static void *shutdown_thread(void *unused)
{
    (void)unused;
    shutdown_err = defer_shutdown();
    __atomic_store_n(&shut_down, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void test_shutdown(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    fake_work *w = work_held(s, p);
    defer_free(p, s);
    /* Shutdown waits for the pending entry however long it takes: held
     * until the shutdown's request is queued and for a while after (its
     * wait looks at exit's abandon every 10 ms: none of those looks may
     * end it). */
    unsigned long pushed = lifecycle_requests_pushed();
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, NULL);
    for (int i = 0; i < 10000 && lifecycle_requests_pushed() == pushed; i++)
        sleep_ms(1);
    ok(lifecycle_requests_pushed() > pushed, "the shutdown's request is queued");
    bool early = wait_flag(&shut_down, 200);
    ok(!early, "shutdown blocks while the entry is pending (200 ms)");
    fake_complete(w);
    pthread_join(t, NULL);
    is_int(shutdown_err, cudaSuccess, "shutdown drains and stops");
    is_int(fake_is_released(p), 1, "the pending entry was released first");
    is_int(fake_live_events(), 0, "all events destroyed");

    void *q = device_alloc(64);
    stderr_capture_begin();
    cudaError_t err = defer_free(q, s);
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorNotPermitted, "defer_free after shutdown is refused");
    ok(strstr(msg, "defer_free called after defer_shutdown") != NULL,
       "with a message naming the problem");
    ok(strstr(msg, "the caller keeps ownership") != NULL,
       "and saying the pointer is still the caller's");
    is_int(fake_is_released(q), 0, "the caller still owns the pointer");
    stderr_capture_begin();
    is_int(defer_call(call_flush, NULL, s), cudaErrorNotPermitted,
           "defer_call after shutdown is refused");
    stderr_capture_end();
    /* A call that hands nothing over says nothing of ownership. */
    stderr_capture_begin();
    is_int(defer_flush(), cudaErrorNotPermitted, "defer_flush after shutdown too");
    msg = stderr_capture_end();
    ok(strstr(msg, "defer_flush called after defer_shutdown: refused") !=
               NULL &&
           strstr(msg, "ownership") == NULL,
       "its message names the problem, not an ownership it has none of");
    /* PyTorch's free hears no error: one line says the refusal and that
     * the memory stays allocated. */
    stderr_capture_begin();
    defer_pluggable_free(q, 64, 0, s);
    msg = stderr_capture_end();
    char want[160];
    snprintf(want, sizeof want, "cudefer: defer_pluggable_free called after "
             "defer_shutdown: refused; %p stays allocated\n", q);
    is_str(msg, want, "defer_pluggable_free after shutdown: said in one line");
    is_int(fake_is_released(q), 0, "and q stays allocated");
    is_int(defer_shutdown(), cudaSuccess, "a second shutdown is harmless");
    struct defer_stats st = stats_now();
    /* These four, and test_flush_from_callback's flush and shutdown. */
    is_int(st.rejected, 6, "the refused calls are counted");
    cudaFree(q);
    cudaStreamDestroy(s);
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_flush_waits();
    test_flush_from_callback();
    test_defer_from_callback();
    test_shutdown();
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
