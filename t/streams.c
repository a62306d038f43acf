/* SPDX-License-Identifier: MIT */
/* Several streams: each is its own FIFO, so a stalled stream holds back only
 * its own entries; per-thread streams of two threads are two FIFOs; the
 * legacy stream works from any thread. */
#include <pthread.h>

#include "helpers.h"

static void test_independent_streams(void)
{
    cudaStream_t slow = stream_new(), fast = stream_new();
    void *a = device_alloc(64), *b = device_alloc(64);
    fake_work *w = work_held(slow, a);
    defer_free(a, slow);
    work_timed(fast, 100, b);
    defer_free(b, fast);
    ok(wait_released(b, 10000), "the fast stream's entry is released");
    is_int(fake_is_released(a), 0, "the stalled stream's entry is held");
    fake_complete(w);
    ok(wait_released(a, 10000), "released once the stalled stream moves");
    cudaStreamDestroy(slow);
    cudaStreamDestroy(fast);
}

struct per_thread_arg {
    void *ptr;
    fake_work *work; /* held: NULL means timed */
};

static void *defer_on_per_thread_stream(void *argp)
{
    struct per_thread_arg *arg = argp;
    void *p = arg->ptr;
    if (arg->work != NULL)
        arg->work = work_held(cudaStreamPerThread, p);
    else
        work_timed(cudaStreamPerThread, 100, p);
    ok(defer_free(p, cudaStreamPerThread) == cudaSuccess,
       "defer_free on cudaStreamPerThread");
    return NULL;
}

static void test_per_thread_streams(void)
{
    struct per_thread_arg held = {device_alloc(64), (fake_work *)1};
    struct per_thread_arg timed = {device_alloc(64), NULL};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, defer_on_per_thread_stream, &held);
    pthread_join(t1, NULL);
    pthread_create(&t2, NULL, defer_on_per_thread_stream, &timed);
    pthread_join(t2, NULL);
    ok(wait_released(timed.ptr, 10000),
       "thread 2's per-thread stream is not behind thread 1's");
    is_int(fake_is_released(held.ptr), 0, "thread 1's entry still held");
    fake_complete(held.work);
    ok(wait_released(held.ptr, 10000), "thread 1's entry released after");
}

static void *defer_on_legacy(void *p)
{
    work_timed(0, 200, p);
    ok(defer_free(p, 0) == cudaSuccess, "defer_free on the legacy stream");
    return NULL;
}

static void test_legacy_from_threads(void)
{
    enum { N = 4 };
    pthread_t t[N];
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(64);
        pthread_create(&t[i], NULL, defer_on_legacy, p[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    is_int(defer_flush(), cudaSuccess, "flush");
    int all = 1;
    for (int i = 0; i < N; i++)
        all &= fake_is_released(p[i]) == 1;
    ok(all, "all legacy-stream entries released");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_independent_streams();
    test_per_thread_streams();
    test_legacy_from_threads();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
