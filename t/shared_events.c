/* SPDX-License-Identifier: MIT */
/* Consecutive callbacks of a stream share events (stream_lane.h:
 * W6's cost on an H100 was the driver's event creation, one event per
 * pending entry).  Behind a held stream a thread's callbacks take at most
 * LANE_EVENTS events and cost a few queries in all; yet none runs before
 * its own work, whether the work of one event's entries completes one by
 * one, several threads defer on one stream, or a destroyed stream's handle
 * names a new stream (a stale identity must never share an event across
 * two streams).  Frees never share: a trim releases each as soon as its
 * own work is done. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "helpers.h"
#include "lifecycle.h"
#include "stream_lane.h"

#define STREAMS 16
#define PER_STREAM 200

static atomic_int ran[STREAMS];
static atomic_int out_of_order;

/* A callback of stream (or thread) arg's k-th call, as a packed pair. */
static void count_in_order(void *arg)
{
    unsigned long v = (unsigned long)arg;
    int s = (int)(v >> 20), k = (int)(v & 0xfffff);
    if (atomic_fetch_add(&ran[s], 1) != k)
        atomic_fetch_add(&out_of_order, 1);
}

static void reset_counts(void)
{
    for (int i = 0; i < STREAMS; i++)
        atomic_store(&ran[i], 0);
    atomic_store(&out_of_order, 0);
}

/* 16 streams behind held gates, 200 callbacks each: a few events per
 * stream, and once the gates open a few queries per stream (about one per
 * event, not one per entry; the wait costs what t/poll_backoff says). */
static void test_held_streams(void)
{
    reset_counts();
    cudaStream_t s[STREAMS];
    fake_work *gate[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        s[i] = stream_new();
        gate[i] = work_held(s[i], NULL);
    }
    uint64_t created = stats_now().events_created;
    unsigned long q0 = fake_calls(FAKE_EVENT_QUERY);
    unsigned long c0 = fake_calls(FAKE_EVENT_CREATE);
    bool refused = false;
    for (int k = 0; k < PER_STREAM; k++)
        for (int i = 0; i < STREAMS; i++)
            refused |= defer_call(count_in_order,
                                  (void *)(((unsigned long)i << 20) |
                                           (unsigned long)k),
                                  s[i]) != cudaSuccess;
    ok(!refused, "%d callbacks deferred behind the gates",
       STREAMS * PER_STREAM);
    uint64_t made = stats_now().events_created - created;
    if (LANE_SHARE_CALLBACKS) {
        ok(made <= STREAMS * LANE_EVENTS,
           "%llu events for %d pending entries (at most %d per stream)",
           ULL(made), STREAMS * PER_STREAM, LANE_EVENTS);
        ok(fake_calls(FAKE_EVENT_CREATE) - c0 <= STREAMS * LANE_EVENTS,
           "the fake saw %lu cudaEventCreate calls",
           fake_calls(FAKE_EVENT_CREATE) - c0);
    } else {
        skip_block(2, "callbacks share no event (LANE_SHARE_CALLBACKS 0)");
    }
    sleep_ms(50);
    int early = 0;
    for (int i = 0; i < STREAMS; i++)
        early += atomic_load(&ran[i]);
    is_int(early, 0, "none ran while the gates were closed");
    /* Counted from once every gate is open: a stall of this thread in the
     * loop lets the reclaimer poll heads still closed. */
    for (int i = 0; i < STREAMS; i++)
        fake_complete(gate[i]);
    unsigned long q_open = fake_calls(FAKE_EVENT_QUERY);
    is_int(defer_flush(), cudaSuccess, "flush once the gates opened");
    int all = 0;
    for (int i = 0; i < STREAMS; i++)
        all += atomic_load(&ran[i]);
    is_int(all, STREAMS * PER_STREAM, "every callback ran");
    is_int(atomic_load(&out_of_order), 0, "in order on each stream");
    unsigned long waiting = q_open - q0;
    unsigned long after = fake_calls(FAKE_EVENT_QUERY) - q_open;
    if (LANE_SHARE_CALLBACKS)
        ok(after <= 2 * STREAMS * LANE_EVENTS,
           "%lu queries for %d entries once the gates opened (at most 2 per "
           "event, not one per entry; %lu while they waited)", after,
           STREAMS * PER_STREAM, waiting);
    else
        skip("callbacks share no event (LANE_SHARE_CALLBACKS 0): %lu "
             "queries once the gates opened, %lu while they waited", after,
             waiting);
    for (int i = 0; i < STREAMS; i++)
        cudaStreamDestroy(s[i]);
}

#define N_OWN 100

static fake_work *own_work[N_OWN];
static atomic_int own_ran[N_OWN], own_early;

/* Callback i: its work must have completed. */
static void check_own_work(void *arg)
{
    int i = (int)(unsigned long)arg;
    if (!fake_work_done(own_work[i]))
        atomic_fetch_add(&own_early, 1);
    atomic_fetch_add(&own_ran[i], 1);
}

/* Callbacks after work held one by one behind a gate: completing the work
 * of the first ones runs no later one, though they share an event; the
 * first LANE_EVENTS - 1, with an event each, run as their work completes;
 * the others once the newest record of their event completed. */
static void test_no_early_release(void)
{
    cudaStream_t s = stream_new();
    fake_work *gate = work_held(s, NULL);
    for (int i = 0; i < N_OWN; i++) {
        own_work[i] = work_held(s, NULL);
        if (defer_call(check_own_work, (void *)(unsigned long)i, s) !=
            cudaSuccess)
            bail("defer_call #%d refused", i);
    }
    fake_complete(gate);
    for (int i = 0; i < N_OWN / 2; i++)
        fake_complete(own_work[i]);
    bool own = true;
    for (int i = 0; i < LANE_EVENTS - 1; i++)
        for (int k = 0; k < 2000 && atomic_load(&own_ran[i]) == 0; k++)
            sleep_ms(1);
    for (int i = 0; i < LANE_EVENTS - 1; i++)
        own &= atomic_load(&own_ran[i]) == 1;
    ok(own, "the first %d callbacks (an event each) ran after their work",
       LANE_EVENTS - 1);
    sleep_ms(50);
    int late = 0;
    for (int i = N_OWN / 2; i < N_OWN; i++)
        late += atomic_load(&own_ran[i]);
    is_int(late, 0, "none whose work is still held");
    is_int(atomic_load(&own_early), 0, "none before its own work");
    for (int i = N_OWN / 2; i < N_OWN; i++)
        fake_complete(own_work[i]);
    is_int(defer_flush(), cudaSuccess, "flush");
    int ran_once = 0;
    for (int i = 0; i < N_OWN; i++)
        ran_once += atomic_load(&own_ran[i]) == 1;
    is_int(ran_once, N_OWN, "all ran once, after their work");
    is_int(atomic_load(&own_early), 0, "none early");
    cudaStreamDestroy(s);
}

#define THREADS 4
#define PER_THREAD 300

struct thread_arg {
    int index;
    cudaStream_t s;
    pthread_barrier_t *go;
    void **ptrs;
};

/* Alternate callbacks (in order per thread) and frees of memory that work
 * after the gate uses. */
static void *defer_many(void *arg)
{
    struct thread_arg *t = arg;
    pthread_barrier_wait(t->go);
    for (int k = 0; k < PER_THREAD; k++) {
        if (k % 2 == 0) {
            unsigned long v = ((unsigned long)t->index << 20) |
                              (unsigned long)(k / 2);
            if (defer_call(count_in_order, (void *)v, t->s) != cudaSuccess)
                bail("defer_call refused");
        } else {
            void *p = t->ptrs[k / 2];
            if (defer_free(p, t->s) != cudaSuccess)
                bail("defer_free refused");
        }
    }
    return NULL;
}

/* Several threads on one stream (a created one, then the legacy stream):
 * each has its own lane, so their records never share an event; at most
 * LANE_EVENTS events per thread, nothing early, each thread's callbacks
 * in order. */
static void test_threads_one_stream(cudaStream_t s, const char *name)
{
    reset_counts();
    fake_work *gate = work_held(s, NULL);
    void *ptrs[THREADS][PER_THREAD / 2];
    for (int t = 0; t < THREADS; t++)
        for (int k = 0; k < PER_THREAD / 2; k++) {
            ptrs[t][k] = device_alloc(64);
            work_timed(s, 0, ptrs[t][k]);
        }
    uint64_t created = stats_now().events_created;
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, THREADS);
    pthread_t th[THREADS];
    struct thread_arg args[THREADS];
    for (int t = 0; t < THREADS; t++) {
        args[t] = (struct thread_arg){.index = t, .s = s, .go = &go,
                                      .ptrs = ptrs[t]};
        if (pthread_create(&th[t], NULL, defer_many, &args[t]) != 0)
            bail("pthread_create");
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&go);
    uint64_t made = stats_now().events_created - created;
    ok(made <= THREADS * LANE_EVENTS + THREADS * PER_THREAD / 2,
       "%s: %llu events for %d entries of %d threads (the callbacks at most "
       "%d per thread, the frees one each)", name, ULL(made),
       THREADS * PER_THREAD, THREADS, LANE_EVENTS);
    int released = 0, early = 0;
    for (int t = 0; t < THREADS; t++) {
        early += atomic_load(&ran[t]);
        for (int k = 0; k < PER_THREAD / 2; k++)
            released += fake_is_released(ptrs[t][k]) == 1;
    }
    ok(early == 0 && released == 0, "%s: nothing ran or was released behind "
       "the gate (%d, %d)", name, early, released);
    fake_complete(gate);
    is_int(defer_flush(), cudaSuccess, "%s: flush", name);
    int all = 0;
    released = 0;
    for (int t = 0; t < THREADS; t++) {
        all += atomic_load(&ran[t]);
        for (int k = 0; k < PER_THREAD / 2; k++)
            released += fake_is_released(ptrs[t][k]) == 1;
    }
    is_int(all, THREADS * PER_THREAD / 2, "%s: every callback ran", name);
    is_int(released, THREADS * PER_THREAD / 2, "%s: every free released",
           name);
    is_int(atomic_load(&out_of_order), 0, "%s: each thread's callbacks in "
           "order", name);
}

#define OLD (LANE_EVENTS + 2)

static fake_work *old_work[OLD];
static atomic_int old_early, old_ran, new_ran;

static void check_old_work(void *arg)
{
    int i = (int)(unsigned long)arg;
    if (old_work[i] != NULL && !fake_work_done(old_work[i]))
        atomic_fetch_add(&old_early, 1);
    atomic_fetch_add(&old_ran, 1);
}

static void count_new(void *arg)
{
    (void)arg;
    atomic_fetch_add(&new_ran, 1);
}

/* A destroyed stream's handle now names a new stream of the same device,
 * while the old stream's callbacks wait, the last ones on a shared event
 * (the lane is full), each behind work of its own.  A callback on the new
 * stream must not record the old stream's shared event (its completion
 * would then say nothing of the old stream's work): callbacks look their
 * stream up exactly.  Then the old stream's gate opens: its callbacks whose
 * work is still held must wait. */
static void test_stale_handle_shares_nothing(void)
{
    cudaStream_t s = stream_new();
    fake_work *gate = work_held(s, NULL);
    cudaEvent_t ev[OLD]; /* the event each callback was filed on */
    (void)fake_take_last_recorded();
    for (int i = 0; i < OLD; i++) {
        if (i >= LANE_EVENTS - 1)
            old_work[i] = work_held(s, NULL);
        if (defer_call(check_old_work, (void *)(unsigned long)i, s) !=
            cudaSuccess)
            bail("defer_call on s refused");
        ev[i] = fake_take_last_recorded();
    }
    /* Those whose event's newest record is before the first held work of
     * their own run once the gate opens: LANE_EVENTS - 1 when the lane
     * found an idle event each time; more share when it found none above
     * the pool's reserve (a stock its deadline cut short). */
    int free_to_run = 0;
    for (int i = 0; i < OLD; i++) {
        int newest = i;
        for (int j = i + 1; j < OLD; j++)
            if (ev[j] == ev[i])
                newest = j;
        free_to_run += newest < LANE_EVENTS - 1;
    }
    if (free_to_run != LANE_EVENTS - 1)
        diag("the lane shared sooner: %d callbacks free to run",
             free_to_run);
    cudaStreamDestroy(s);
    cudaStream_t b = fake_stream_create_reusing(s);
    work_timed(b, 100, NULL);
    is_int(defer_call(count_new, NULL, b), cudaSuccess,
           "defer_call on the new stream with s's handle");
    fake_complete(gate);
    for (int k = 0; k < 2000 && atomic_load(&new_ran) == 0; k++)
        sleep_ms(1);
    is_int(atomic_load(&new_ran), 1, "the new stream's callback ran after its "
           "own work");
    for (int k = 0; k < 2000 && atomic_load(&old_ran) < free_to_run; k++)
        sleep_ms(1);
    sleep_ms(50);
    is_int(atomic_load(&old_ran), free_to_run,
           "the old stream's ran as far as its work is done");
    is_int(atomic_load(&old_early), 0, "none before its work");
    for (int i = LANE_EVENTS - 1; i < OLD; i++)
        fake_complete(old_work[i]);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(atomic_load(&old_ran), OLD, "all of the old stream's ran");
    is_int(atomic_load(&old_early), 0, "none early");
    cudaStreamDestroy(b);
}

/* Frees never share (a trim releases a free as soon as its own work is
 * done): behind a held stream each pending free has an event of its own. */
static void test_frees_do_not_share(void)
{
    enum { N = 3 * LANE_EVENTS };
    cudaStream_t s = stream_new();
    void *p[N];
    fake_work *w[N];
    uint64_t created = stats_now().events_created;
    size_t idle = stats_now().events_in_pool;
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(64);
        w[i] = work_held(s, p[i]);
        if (defer_free(p[i], s) != cudaSuccess)
            bail("defer_free #%d refused", i);
    }
    uint64_t made = stats_now().events_created - created;
    ok(made + idle >= N, "%d pending frees: an event each (%llu made, %zu "
       "were idle)", N, ULL(made), idle);
    for (int i = 0; i < N / 2; i++)
        fake_complete(w[i]);
    size_t released = 0;
    is_int(defer_trim(&released), cudaSuccess, "trim");
    int done = 0, early = 0;
    for (int i = 0; i < N; i++) {
        done += i < N / 2 && fake_is_released(p[i]) == 1;
        early += i >= N / 2 && fake_is_released(p[i]) == 1;
    }
    is_int(done, N / 2, "the trim released every free whose work is done");
    is_int(early, 0, "and none other");
    for (int i = N / 2; i < N; i++)
        fake_complete(w[i]);
    is_int(defer_flush(), cudaSuccess, "flush");
    cudaStreamDestroy(s);
}

/* The k-th callback of stream slot 0, for count_in_order. */
static void *slot0(int k)
{
    return (void *)(unsigned long)k;
}

/* A free deferred between two callbacks that share an event (their lane
 * is full): once the free's own work is done a trim releases it, though
 * the callback before it waits for the shared event's newest record, that
 * of the callback after it, whose work is still held (a stream's memory
 * and its callbacks wait in FIFOs apart: stream_table.h).  The callbacks
 * whose events are their own run on that trim; those on the shared event
 * do not, though their work is done (include/cudefer.h's limit), and run,
 * in order, once the newest record completes: a flush then returns with no
 * later work launched. */
static void test_free_behind_shared_callback(void)
{
    enum { SHARING = LANE_EVENTS + 1 }; /* callbacks before the free */
    reset_counts();
    cudaStream_t s = stream_new();
    fake_work *w[SHARING];
    for (int i = 0; i < SHARING; i++) {
        w[i] = work_held(s, NULL);
        if (defer_call(count_in_order, slot0(i), s) != cudaSuccess)
            bail("defer_call #%d refused", i);
    }
    void *p = device_alloc(64);
    fake_work *wp = work_held(s, p);
    is_int(defer_free(p, s), cudaSuccess, "defer_free between callbacks");
    fake_work *last = work_held(s, NULL);
    is_int(defer_call(count_in_order, slot0(SHARING), s), cudaSuccess,
           "a callback after it, on the full lane");
    for (int i = 0; i < SHARING; i++)
        fake_complete(w[i]);
    fake_complete(wp);
    is_int(defer_trim(NULL), cudaSuccess, "trim");
    is_int(fake_is_released(p), 1, "the trim released the free whose work "
           "is done, behind callbacks waiting for a shared event");
    /* With sharing, the 8th and 9th callbacks share the 8th event, whose
     * newest record (the 10th callback's) is behind held work. */
    int want = LANE_SHARE_CALLBACKS ? LANE_EVENTS - 1 : SHARING;
    is_int(atomic_load(&ran[0]), want, "the trim ran the callbacks whose "
           "event completed, not those sharing a pending one");
    sleep_ms(30);
    is_int(atomic_load(&ran[0]), want, "and they still wait");
    fake_complete(last);
    is_int(defer_flush(), cudaSuccess, "flush once the last callback's work "
           "is done (no later work)");
    is_int(atomic_load(&ran[0]), SHARING + 1, "every callback ran");
    is_int(atomic_load(&out_of_order), 0, "in order");
    cudaStreamDestroy(s);
}

static int flush_returned;

/* A flush waits for callbacks that share an event until the event's
 * newest record completes, but never for work deferred after it began:
 * while it waits no lane records a pending event again.  The lane is full
 * and its newest event shared; a flush waits; then the same thread defers
 * a callback behind work held until the flush returned.  Sharing the
 * pending event would make the flush wait for that work: a deadlock here,
 * the flush returning only once every callback before it ran. */
static void test_flush_stops_sharing(void)
{
    enum { BEFORE = LANE_EVENTS + 1 };
    reset_counts();
    cudaStream_t s = stream_new();
    fake_work *w[BEFORE];
    for (int i = 0; i < BEFORE; i++) {
        w[i] = work_held(s, NULL);
        if (defer_call(count_in_order, slot0(i), s) != cudaSuccess)
            bail("defer_call #%d refused", i);
    }
    unsigned long pushed = lifecycle_requests_pushed();
    pthread_t flusher;
    flush_in_thread(&flusher, &flush_returned);
    /* The flush waits (its request queued, the lanes told before): waited
     * for, not slept for (a loaded machine may not run the thread for
     * tens of ms). */
    for (int i = 0; i < 10000 && lifecycle_requests_pushed() == pushed; i++)
        sleep_ms(1);
    ok(lifecycle_requests_pushed() > pushed, "the flush waits");
    fake_work *after = work_held(s, NULL);
    is_int(defer_call(count_in_order, slot0(BEFORE), s), cudaSuccess,
           "a callback deferred while the flush waits, behind held work");
    for (int i = 0; i < BEFORE; i++)
        fake_complete(w[i]);
    ok(wait_flag(&flush_returned, 10000) &&
           __atomic_load_n(&flush_returned, __ATOMIC_SEQ_CST) == 1,
       "the flush returned once the work "
       "before it was done, not waiting for the later work");
    is_int(atomic_load(&ran[0]), BEFORE, "every callback before it ran");
    fake_complete(after);
    pthread_join(flusher, NULL);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(atomic_load(&ran[0]), BEFORE + 1, "the later one ran too");
    is_int(atomic_load(&out_of_order), 0, "in order");
    cudaStreamDestroy(s);
}

static atomic_int slow_ran;

static void count_slow(void *arg)
{
    (void)arg;
    atomic_fetch_add(&slow_ran, 1);
}

/* On a GPU, creating an event waits for the driver's lock behind every
 * launch or record that waits for room in its queue: W6's slowest calls on
 * an H100, 78-105 ms, were that wait.  So a callbacks' lane that holds an
 * event makes none on the launching thread, as a blocks' lane
 * (t/block_events): it takes an idle one, or records its newest again while
 * the reclaimer makes more.  A fresh process (the device's first stock,
 * 32 events with CUDEFER_EVENT_POOL=64, 16 of them its reserve for lanes
 * that hold none); each of 8 held streams gets its lane's first event, then
 * 3 x LANE_EVENTS callbacks each: the calling thread makes no event (the
 * fake counts its cudaEventCreate calls), the reclaimer makes the missing
 * ones (slowly: 20 ms each, fake latency), and every callback runs once
 * its gate opens. */
static void s_callbacks_make_no_event(void)
{
    enum { HELD = 8, PER = 3 * LANE_EVENTS, SLOW_NS = 20000000 };
    cudaStream_t s[HELD];
    fake_work *gate[HELD];
    for (int k = 0; k < HELD; k++) {
        s[k] = stream_new();
        gate[k] = work_held(s[k], NULL);
        CHECK(defer_call(count_slow, NULL, s[k]) == cudaSuccess,
              "the first defer_call on stream %d", k);
    }
    fake_set_latency(FAKE_EVENT_CREATE, SLOW_NS);
    uint64_t made = stats_now().events_created;
    unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
    for (int i = 0; i < PER; i++)
        for (int k = 0; k < HELD; k++)
            CHECK(defer_call(count_slow, NULL, s[k]) == cudaSuccess,
                  "defer_call %d on stream %d", i, k);
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    CHECK(own == 0, "%d callbacks on %d held streams: %lu events made on the "
          "calling thread", HELD * PER, HELD, own);
    for (int i = 0; i < 2000 && stats_now().events_created == made; i++)
        sleep_ms(1);
    CHECK(stats_now().events_created > made, "the reclaimer made more");
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    CHECK(atomic_load(&slow_ran) == 0, "none ran behind the gates");
    for (int k = 0; k < HELD; k++)
        fake_complete(gate[k]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&slow_ran) == HELD * (PER + 1),
          "every callback ran (%d)", atomic_load(&slow_ran));
    for (int k = 0; k < HELD; k++)
        cudaStreamDestroy(s[k]);
}

/* The limit of a sharing lane that finds no idle event (stream_lane.h,
 * include/cudefer.h): it records its newest again at most LANE_REUSE_MAX
 * times, then makes an event on the calling thread.  A fresh process with
 * CUDEFER_EVENT_POOL=1 (the device's first miss stocks one event); two
 * callbacks on a held stream take an event each, then creating turns slow
 * (1.5 s, fake latency), so the reclaimer's refill, asked for at the third
 * call, is still making its event when the lane reaches the bound: no
 * call before it makes an event on the calling thread (the fake counts
 * that thread's cudaEventCreate calls), the one at it makes its own. */
static void s_reuse_bound(void)
{
    enum { SLOW_NS = 1500000000, N = LANE_REUSE_MAX + 8 };
    cudaStream_t s = stream_new();
    fake_work *gate = work_held(s, NULL);
    for (int i = 0; i < 2; i++)
        CHECK(defer_call(count_slow, NULL, s) == cudaSuccess,
              "defer_call %d", i);
    fake_set_latency(FAKE_EVENT_CREATE, SLOW_NS);
    double start = now_ms();
    bool late = false; /* the bound reached after the refill could end */
    int made = 0, first_made = -1;
    for (int i = 0; i < N; i++) {
        if (i == LANE_REUSE_MAX - 1)
            late = now_ms() - start > SLOW_NS / 1e6 * 0.8;
        unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
        CHECK(defer_call(count_slow, NULL, s) == cudaSuccess,
              "defer_call %d", i + 2);
        if (fake_thread_calls(FAKE_EVENT_CREATE) != own) {
            made++;
            first_made = first_made < 0 ? i : first_made;
        }
    }
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    /* The second callback's event got label 1; calls 0..MAX-2 here record
     * it again up to label MAX; call MAX-1 makes one.  On a machine so
     * loaded that the calls before the bound outlast the refill's slow
     * creation, the refilled event may be taken at the bound instead. */
    if (late && made == 0)
        diag("the bound came after %.0f ms: the refill may have ended",
             SLOW_NS / 1e6 * 0.8);
    else
        CHECK(made == 1 && first_made == LANE_REUSE_MAX - 1,
          "%d calls made an event, the first at call %d of the records "
          "again (one expected, at %d)", made, first_made,
          LANE_REUSE_MAX - 1);
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&slow_ran) == N + 2, "every callback ran (%d)",
          atomic_load(&slow_ran));
    cudaStreamDestroy(s);
}

/* LANE_REUSE_MAX counts the records of the newest event not yet seen
 * complete, not every record of it: else a lane whose one event was
 * recorded LANE_REUSE_MAX times on an idle stream (each call finding the
 * last completed) would make an event on the calling thread at its first
 * miss on a busy stream, after one shared record.  Here the
 * pool's one idle event goes to another stream first; then two callbacks
 * on the busy stream share, and the calling thread makes no event (the
 * fake counts its cudaEventCreate calls). */
static void s_reuse_bound_counts_idle_records(void)
{
    enum { SLOW_NS = 20000000 };
    cudaStream_t s = stream_new(), s2 = stream_new();
    for (int i = 0; i < LANE_REUSE_MAX; i++) {
        CHECK(defer_call(count_slow, NULL, s) == cudaSuccess, "call %d", i);
        CHECK(defer_flush() == cudaSuccess, "flush %d", i);
    }
    /* The pool's one idle event (stocked at the first miss) goes to s2. */
    fake_work *g2 = work_held(s2, NULL);
    CHECK(defer_call(count_slow, NULL, s2) == cudaSuccess, "s2");
    fake_work *gate = work_held(s, NULL);
    fake_set_latency(FAKE_EVENT_CREATE, SLOW_NS);
    unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
    CHECK(defer_call(count_slow, NULL, s) == cudaSuccess, "busy 1");
    CHECK(defer_call(count_slow, NULL, s) == cudaSuccess, "busy 2");
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    CHECK(own == 0, "two callbacks on a busy stream whose lane holds an "
          "event: %lu events made on the calling thread", own);
    fake_complete(gate);
    fake_complete(g2);
    CHECK(defer_flush() == cudaSuccess, "flush");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

int main(void)
{
    plan_lazy();
    if (LANE_SHARE_CALLBACKS) {
        fork_scenario("callbacks on held streams make no event on the "
                      "launching thread", "CUDEFER_EVENT_POOL=64", 1, 30000,
                      s_callbacks_make_no_event);
        fork_scenario("a lane that finds no idle event records its newest "
                      "at most LANE_REUSE_MAX times", "CUDEFER_EVENT_POOL=1",
                      1, 60000, s_reuse_bound);
        fork_scenario("LANE_REUSE_MAX counts records not seen complete, not "
                      "those made while the stream was idle",
                      "CUDEFER_EVENT_POOL=1", 1, 60000,
                      s_reuse_bound_counts_idle_records);
    } else {
        skip_block(3, "callbacks share no event (LANE_SHARE_CALLBACKS 0)");
    }
    fake_reset(1);
    test_stale_handle_shares_nothing();
    test_held_streams();
    test_no_early_release();
    cudaStream_t s = stream_new();
    test_threads_one_stream(s, "created stream");
    cudaStreamDestroy(s);
    test_threads_one_stream(cudaStreamLegacy, "legacy stream");
    test_frees_do_not_share();
    test_free_behind_shared_callback();
    test_flush_stops_sharing();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_events(), 0, "every event destroyed");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
