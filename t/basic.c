/* SPDX-License-Identifier: MIT */
/* The core promise on one stream: nothing is released before the work that
 * uses it completes, everything is released after, in batches, and the
 * reclaimer sleeps when idle. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "helpers.h"

static void test_null(void)
{
    is_int(defer_free(NULL, 0), cudaSuccess, "defer_free(NULL) is a no-op");
    is_int(defer_free_host(NULL, 0), cudaSuccess, "defer_free_host(NULL) is a no-op");
    is_int(stats_now().deferred, 0, "nothing was deferred");
}

static void test_order_within_stream(void)
{
    cudaStream_t s = stream_new();
    void *a = device_alloc(1024), *b = device_alloc(1024);
    fake_work *wa = work_held(s, a);
    is_int(defer_free(a, s), cudaSuccess, "defer_free(a) accepted");
    fake_work *wb = work_held(s, b);
    is_int(defer_free(b, s), cudaSuccess, "defer_free(b) accepted");
    sleep_ms(20);
    ok(fake_is_released(a) == 0 && fake_is_released(b) == 0,
       "nothing released while its work is pending");
    fake_complete(wa);
    ok(wait_released(a, 10000), "a released once its work completed");
    sleep_ms(10);
    is_int(fake_is_released(b), 0, "b still held: its work is pending");
    fake_complete(wb);
    ok(wait_released(b, 10000), "b released once its work completed");
    cudaStreamDestroy(s);
}

static void test_host(void)
{
    cudaStream_t s = stream_new();
    void *h = host_alloc(4096);
    fake_work *w = work_held(s, h);
    is_int(defer_free_host(h, s), cudaSuccess, "defer_free_host accepted");
    sleep_ms(10);
    is_int(fake_is_released(h), 0, "pinned buffer held while in use");
    fake_complete(w);
    ok(wait_released(h, 10000), "pinned buffer released with cudaFreeHost");
    cudaStreamDestroy(s);
}

#define NCALLS 5
static int call_order[NCALLS];
static int calls_done;
static int called_on_reclaimer;

static int signals_blocked_in_callback;

static void record_call(void *arg)
{
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, NULL, &mask);
    signals_blocked_in_callback += sigismember(&mask, SIGINT) == 1 &&
                                   sigismember(&mask, SIGTERM) == 1 &&
                                   sigismember(&mask, SIGCHLD) == 1;
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    called_on_reclaimer += strcmp(name, "cudefer-reclaim") == 0;
    call_order[__atomic_fetch_add(&calls_done, 1, __ATOMIC_SEQ_CST)] = (int)(intptr_t)arg;
}

static void test_call_order(void)
{
    cudaStream_t s = stream_new();
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < NCALLS; i++)
        defer_call(record_call, (void *)(intptr_t)i, s);
    sleep_ms(10);
    is_int(__atomic_load_n(&calls_done, __ATOMIC_SEQ_CST), 0,
           "no callback before its work completes");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush after the callbacks");
    is_int(calls_done, NCALLS, "every callback ran once");
    int in_order = 1;
    for (int i = 0; i < NCALLS; i++)
        in_order &= call_order[i] == i;
    ok(in_order, "callbacks of one stream run in the order deferred");
    is_int(called_on_reclaimer, NCALLS, "callbacks run on cudefer-reclaim");
    is_int(signals_blocked_in_callback, NCALLS,
           "with signals masked (they go to the application's threads)");
    is_int(defer_call(NULL, NULL, s), cudaErrorInvalidValue,
           "defer_call(NULL fn) is an invalid value");
    cudaStreamDestroy(s);
}

#define NBATCH 100
static void test_batch(void)
{
    cudaStream_t s = stream_new();
    void *p[NBATCH];
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < NBATCH; i++) {
        p[i] = device_alloc(256);
        fake_launch(s, 0, &p[i], 1);
        defer_free(p[i], s);
    }
    sleep_ms(20); /* the reclaimer takes them all in */
    uint64_t batches = stats_now().batches;
    fake_complete(w);
    defer_flush();
    int all = 1;
    for (int i = 0; i < NBATCH; i++)
        all &= fake_is_released(p[i]) == 1;
    ok(all, "all %d entries released", NBATCH);
    struct defer_stats st = stats_now();
    is_int(st.batches - batches, 1, "released as one batch");
    ok(st.largest_batch >= NBATCH, "largest batch %llu >= %d",
       (unsigned long long)st.largest_batch, NBATCH);
    cudaStreamDestroy(s);
}

static void test_idle_sleep(void)
{
    defer_flush();
    sleep_ms(20);
    uint64_t before = stats_now().wakeups;
    sleep_ms(300);
    is_int(stats_now().wakeups - before, 0,
           "no wake-ups while nothing is pending");
}

static void test_stats(void)
{
    struct defer_stats st = stats_now();
    is_int(st.pending, 0, "nothing pending");
    is_int(st.failed, 0, "nothing failed");
    is_int(st.deferred, st.released, "deferred == released");
    ok(st.event_queries >= st.deferred, "%llu event queries for %llu entries",
       (unsigned long long)st.event_queries, (unsigned long long)st.deferred);
    ok(st.events_in_pool > 0, "events return to the pool (%llu idle)",
       (unsigned long long)st.events_in_pool);
    is_int(fake_live_allocations(), 0, "no allocation left");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_null();
    test_order_within_stream();
    test_host();
    test_call_order();
    test_batch();
    test_idle_sleep();
    test_stats();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_events(), 0, "every event destroyed at shutdown");
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
