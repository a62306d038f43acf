/* SPDX-License-Identifier: MIT */
/* The order of defer_call callbacks: callbacks deferred
 * on one stream run in the order deferred, also when one of them falls
 * back to a synchronous release (no event could be had), when a callback's
 * stream identity was cached by the thread, and when a callback deferred
 * on several streams (defer_call_streams) comes first; and, by the oracle,
 * while another thread trims. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

/* The order in which callbacks ran: each appends its number. */
static int order[16];
static int norder;
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;

static void note(void *arg)
{
    pthread_mutex_lock(&order_lock);
    if (norder < 16)
        order[norder++] = (int)(intptr_t)arg;
    pthread_mutex_unlock(&order_lock);
}

static void order_reset(void)
{
    pthread_mutex_lock(&order_lock);
    norder = 0;
    pthread_mutex_unlock(&order_lock);
}

/* "1,2,3" */
static const char *order_text(void)
{
    static char text[64];
    size_t len = 0;
    text[0] = '\0';
    pthread_mutex_lock(&order_lock);
    for (int i = 0; i < norder && len < sizeof text - 4; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%d",
                                i ? "," : "", order[i]);
    pthread_mutex_unlock(&order_lock);
    return text;
}

/* Wait until n callbacks ran, at most 2 s. */
static void wait_order(int n)
{
    for (int waited = 0; waited < 2000; waited++) {
        pthread_mutex_lock(&order_lock);
        int have = norder;
        pthread_mutex_unlock(&order_lock);
        if (have >= n)
            return;
        sleep_ms(1);
    }
}

static void *complete_later(void *w)
{
    sleep_ms(30);
    fake_complete(w);
    return NULL;
}

/* No event for the second callback: it waits for the stream on the calling
 * thread, and must still run after the first, which the reclaimer (polling
 * slowly here) has not run yet. */
static void s_sync_fallback_keeps_order(void)
{
    cudaStream_t s = stream_new();
    fake_work *w = work_held(s, NULL);
    CHECK(defer_call(note, (void *)1, s) == cudaSuccess, "defer_call 1");
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    pthread_t t;
    pthread_create(&t, NULL, complete_later, w);
    stderr_capture_begin();
    cudaError_t err = defer_call(note, (void *)2, s); /* waits for s */
    stderr_capture_end();
    pthread_join(t, NULL);
    CHECK(err == cudaSuccess, "defer_call 2 (no event): %s",
          cudaGetErrorName(err));
    CHECK(stats_now().sync_releases == 1, "it waited for the stream (%llu "
          "synchronous releases)", ULL(stats_now().sync_releases));
    err = defer_call(note, (void *)3, s);
    CHECK(err == cudaSuccess, "defer_call 3 (no event either): %s",
          cudaGetErrorName(err));
    fake_fail_clear();
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(strcmp(order_text(), "1,2,3") == 0, "callbacks ran in the order %s, "
          "want 1,2,3", order_text());
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* No event for a callback deferred on two streams: it waits for both on
 * the calling thread, and must still run after the earlier callbacks of
 * each (1 on s, 2 on s2), which the reclaimer (polling slowly here) has
 * not run yet. */
static void s_group_sync_fallback_keeps_order(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    fake_work *a = work_held(s, NULL), *b = work_held(s2, NULL);
    CHECK(defer_call(note, (void *)1, s) == cudaSuccess, "defer_call 1");
    CHECK(defer_call(note, (void *)2, s2) == cudaSuccess, "defer_call 2");
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, complete_later, a);
    pthread_create(&tb, NULL, complete_later, b);
    cudaStream_t both[2] = {s, s2};
    stderr_capture_begin();
    cudaError_t err = defer_call_streams(note, (void *)3, both, 2);
    stderr_capture_end();
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(err == cudaSuccess, "defer_call_streams 3 (no event): %s",
          cudaGetErrorName(err));
    CHECK(stats_now().sync_releases == 1, "it waited for the streams (%llu "
          "synchronous releases)", ULL(stats_now().sync_releases));
    fake_fail_clear();
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(strcmp(order_text(), "1,2,3") == 0 ||
              strcmp(order_text(), "2,1,3") == 0,
          "callbacks ran in the order %s, want 3 last", order_text());
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* Every defer_call looks its stream up afresh: a thread's cached identity
 * can name a destroyed stream whose handle now names a new one (on the
 * same device its entry would join the old stream's FIFO, out of order
 * with the other threads' callbacks on the new stream). */
static void test_callbacks_identify_afresh(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    work_timed(s, 100, p);
    is_int(defer_free(p, s), cudaSuccess, "defer_free caches s's identity");
    unsigned long ids = fake_calls(FAKE_STREAM_GET_ID);
    for (int i = 0; i < 3; i++)
        defer_call(note, (void *)(intptr_t)(i + 1), s);
    is_int(fake_calls(FAKE_STREAM_GET_ID) - ids, 3,
           "each defer_call asked for its stream's id");
    defer_flush();
    is_str(order_text(), "1,2,3", "and the callbacks ran in order");
    order_reset();
    cudaStreamDestroy(s);
}

/* defer_call_streams looks each of its streams up afresh too. */
static void test_group_callbacks_identify_afresh(void)
{
    cudaStream_t s[2] = {stream_new(), stream_new()};
    unsigned long ids = fake_calls(FAKE_STREAM_GET_ID);
    for (int i = 0; i < 2; i++)
        defer_call_streams(note, (void *)(intptr_t)(i + 1), s, 2);
    is_int(fake_calls(FAKE_STREAM_GET_ID) - ids, 4,
           "each defer_call_streams asked for each stream's id");
    defer_flush();
    is_str(order_text(), "1,2", "and the callbacks ran in order");
    order_reset();
    cudaStreamDestroy(s[0]);
    cudaStreamDestroy(s[1]);
}

/* What is ordered for a callback deferred on several streams (the
 * header's words): it runs after the callbacks deferred before it on each
 * of its streams; a callback deferred after it on some of them only (with
 * defer_call or defer_call_streams) does not wait for the other streams,
 * so it may run first. */
static void test_group_callback_order(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    fake_work *a = work_held(s, NULL), *b = work_held(s2, NULL);
    cudaStream_t both[2] = {s, s2};
    defer_call(note, (void *)1, s);
    defer_call(note, (void *)2, s2);
    defer_call_streams(note, (void *)3, both, 2);
    fake_complete(b);
    wait_order(1);
    sleep_ms(10);
    is_str(order_text(), "2", "s2's earlier callback ran; the group waits for "
           "s");
    fake_complete(a);
    defer_flush();
    is_str(order_text(), "2,1,3", "the group ran after the earlier callbacks "
           "of both its streams");
    order_reset();

    /* The documented limit: a later defer_call on s does not wait for a
     * group that still waits for s2. */
    b = work_held(s2, NULL);
    defer_call_streams(note, (void *)4, both, 2);
    defer_call(note, (void *)5, s);
    wait_order(1);
    sleep_ms(10);
    is_str(order_text(), "5", "a later callback on s alone ran while the "
           "group waits for s2 (documented in the header)");
    fake_complete(b);
    defer_flush();
    is_str(order_text(), "5,4", "then the group");
    order_reset();

    /* The same for a later group on s and s3: its part on s leaves s's
     * callbacks once the earlier group's part there is done, that group
     * still waiting for s2. */
    cudaStream_t s3 = stream_new(), s_s3[2] = {s, s3};
    b = work_held(s2, NULL);
    defer_call_streams(note, (void *)6, both, 2);
    defer_call_streams(note, (void *)7, s_s3, 2);
    wait_order(1);
    sleep_ms(10);
    is_str(order_text(), "7", "a later group on s and s3 ran while the "
           "earlier group waits for s2 (documented in the header)");
    fake_complete(b);
    defer_flush();
    is_str(order_text(), "7,6", "then the earlier group");
    order_reset();
    cudaStreamDestroy(s3);
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

/* Callbacks on several streams, deferred by several threads, while
 * another thread calls defer_trim over and over: each stream's callbacks
 * run in the order deferred and each only once the work enqueued before it
 * completed (the fake tells).  A trim polls every pending free, not only
 * each stream's oldest; callbacks must keep their order there, also when
 * a thread's later callback shares an event that completes before an
 * earlier one's (8 pending on a stream: the newest is recorded again). */
#define T_STREAMS 3
#define T_THREADS 4
#define T_CALLS 150

static struct {
    cudaStream_t s[T_STREAMS];
    pthread_mutex_t lock[T_STREAMS];   /* defer order: one at a time */
    int deferred[T_STREAMS];           /* under lock */
    fake_work *before[T_STREAMS][T_THREADS * T_CALLS]; /* under lock */
    atomic_int next[T_STREAMS];        /* the callbacks' */
    atomic_int ran, out_of_order, early, refused, trims, trims_failed;
    atomic_bool stop;
} tr;

/* Callback of stream (v >> 16), its (v & 0xffff)-th. */
static void trimmed_callback(void *arg)
{
    unsigned long v = (unsigned long)arg;
    int st = (int)(v >> 16), seq = (int)(v & 0xffff);
    if (atomic_exchange(&tr.next[st], seq + 1) != seq)
        atomic_fetch_add(&tr.out_of_order, 1);
    if (!fake_work_done(tr.before[st][seq]))
        atomic_fetch_add(&tr.early, 1);
    atomic_fetch_add(&tr.ran, 1);
}

static void *defer_calls(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    for (int i = 0; i < T_CALLS; i++) {
        r = r * 1103515245u + 12345u;
        int st = (int)((r >> 16) % T_STREAMS);
        /* Mostly short work; now and then 2 ms, behind which 8 and more
         * callbacks of a thread wait on one stream. */
        unsigned us = (r >> 8) % 16 == 0 ? 2000 : (r >> 4) % 200;
        pthread_mutex_lock(&tr.lock[st]);
        int seq = tr.deferred[st]++;
        tr.before[st][seq] = work_timed(tr.s[st], us, NULL);
        if (defer_call(trimmed_callback,
                       (void *)(((unsigned long)st << 16) |
                                (unsigned long)seq),
                       tr.s[st]) != cudaSuccess)
            atomic_fetch_add(&tr.refused, 1);
        pthread_mutex_unlock(&tr.lock[st]);
    }
    return NULL;
}

static void *trim_repeatedly(void *unused)
{
    (void)unused;
    while (!atomic_load(&tr.stop)) {
        if (defer_trim(NULL) != cudaSuccess)
            atomic_fetch_add(&tr.trims_failed, 1);
        atomic_fetch_add(&tr.trims, 1);
    }
    return NULL;
}

static void test_order_while_trimming(void)
{
    pthread_t callers[T_THREADS], trimmer;
    for (int st = 0; st < T_STREAMS; st++) {
        tr.s[st] = stream_new();
        pthread_mutex_init(&tr.lock[st], NULL);
    }
    if (pthread_create(&trimmer, NULL, trim_repeatedly, NULL) != 0)
        bail("pthread_create");
    for (int k = 0; k < T_THREADS; k++)
        if (pthread_create(&callers[k], NULL, defer_calls,
                           (void *)(uintptr_t)(k + 1)) != 0)
            bail("pthread_create");
    for (int k = 0; k < T_THREADS; k++)
        pthread_join(callers[k], NULL);
    /* Trims go on while the callbacks' work still runs. */
    for (int waited = 0; waited < 10000 &&
                         atomic_load(&tr.ran) < T_THREADS * T_CALLS;
         waited++)
        sleep_ms(1);
    atomic_store(&tr.stop, true);
    pthread_join(trimmer, NULL);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(atomic_load(&tr.refused), 0, "%d threads deferred %d callbacks "
           "each on %d streams", T_THREADS, T_CALLS, T_STREAMS);
    ok(atomic_load(&tr.trims) > 0 && atomic_load(&tr.trims_failed) == 0,
       "while another thread trimmed (%d trims, %d failed)",
       atomic_load(&tr.trims), atomic_load(&tr.trims_failed));
    is_int(atomic_load(&tr.ran), T_THREADS * T_CALLS, "every callback ran");
    is_int(atomic_load(&tr.out_of_order), 0,
           "each in its stream's order");
    is_int(atomic_load(&tr.early), 0,
           "none before the work enqueued before it completed");
    for (int st = 0; st < T_STREAMS; st++) {
        cudaStreamDestroy(tr.s[st]);
        pthread_mutex_destroy(&tr.lock[st]);
    }
}

/* The case behind that: a thread with 8 callbacks pending on a stream
 * records its newest event again for its 9th, so that event completes
 * only with the 9th's work; another thread's callback deferred between
 * them has an event of its own, complete before.  While the trims run,
 * that callback waits for the 8th (its elder in the stream's order), though
 * its own event is complete and the 8th's is not. */
static cudaStream_t shared_stream;

static void *defer_ninth(void *unused)
{
    (void)unused;
    defer_call(note, (void *)9, shared_stream);
    return NULL;
}

static void test_shared_event_while_trimming(void)
{
    shared_stream = stream_new();
    fake_work *first = work_held(shared_stream, NULL);
    for (int i = 1; i <= 8; i++) {
        work_timed(shared_stream, 10, NULL);
        defer_call(note, (void *)(intptr_t)i, shared_stream);
    }
    work_timed(shared_stream, 10, NULL);
    pthread_t other;
    if (pthread_create(&other, NULL, defer_ninth, NULL) != 0)
        bail("pthread_create");
    pthread_join(other, NULL);
    fake_work *second = work_held(shared_stream, NULL);
    defer_call(note, (void *)10, shared_stream); /* the 8th's event again */
    atomic_store(&tr.stop, false);
    pthread_t trimmer;
    if (pthread_create(&trimmer, NULL, trim_repeatedly, NULL) != 0)
        bail("pthread_create");
    fake_complete(first);
    wait_order(7);
    sleep_ms(30); /* trims pass meanwhile */
    is_str(order_text(), "1,2,3,4,5,6,7", "while trims run, the other "
           "thread's callback, its event complete, waits for the 8th, whose "
           "shared event is not");
    fake_complete(second);
    atomic_store(&tr.stop, true);
    pthread_join(trimmer, NULL);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_str(order_text(), "1,2,3,4,5,6,7,8,9,10", "then all, in order");
    order_reset();
    cudaStreamDestroy(shared_stream);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a callback with no event waits for its stream and still "
                  "runs after the earlier callbacks of the stream",
                  /* No idle event either (a device's first miss makes some
                  * ahead, into the pool: none with EVENT_POOL 0). */
                  "CUDEFER_POLL_US=200000 CUDEFER_POLL_MAX_US=400000 "
                  "CUDEFER_EVENT_POOL=0", 2, 15000,
                  s_sync_fallback_keeps_order);
    fork_scenario("a callback on two streams with no event waits for both "
                  "and still runs after the earlier callbacks of each",
                  "CUDEFER_POLL_US=200000 CUDEFER_POLL_MAX_US=400000 "
                  "CUDEFER_EVENT_POOL=0", 2, 15000,
                  s_group_sync_fallback_keeps_order);
    fake_reset(2);
    test_callbacks_identify_afresh();
    test_group_callbacks_identify_afresh();
    test_group_callback_order();
    test_order_while_trimming();
    test_shared_event_while_trimming();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
