/* SPDX-License-Identifier: MIT */
/* What a thread's lane records for a new entry (stream_lane.h), where the
 * other tests of lanes see no difference in what is released or run:
 *
 *  - On an idle stream the lane records its newest event again once the
 *    reclaimer saw every record of it complete: one event for many frees,
 *    none made or taken from the pool after the first, no query of the
 *    thread's own.
 *  - The same while an entry of that event has not finished (the
 *    reclaimer runs an earlier callback of it): the completed label
 *    suffices, no query of the thread's own.
 *  - A lane's own query backs off for the record it found not complete,
 *    not for a later record of the same event: that one is asked at once.
 *  - While a flush waits, a sharing lane that holds fewer than LANE_EVENTS
 *    events and finds none idle does not record its pending newest again:
 *    the flush would wait for work deferred after it began.
 *  - A sharing lane that finds no idle event first has the thread's other
 *    lanes let go of their completed events (a sweep), on the first such
 *    miss after a take: else a new stream's callbacks share one event
 *    while a stream the thread left keeps its completed ones.
 *
 * Each scenario runs in a child process of its own (a fresh library, its
 * event pool as CUDEFER_EVENT_POOL says). */
#include <stdatomic.h>

#include "helpers.h"

#include "event_pool.h"
#include "lifecycle.h"
#include "stream_lane.h"

static atomic_int ran;
static int gate_entered; /* read with wait_flag */
static atomic_int gate_open;

static void count_run(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

/* A callback that holds the reclaimer until gate_open. */
static void wait_gate(void *arg)
{
    (void)arg;
    __atomic_store_n(&gate_entered, 1, __ATOMIC_SEQ_CST);
    while (!atomic_load(&gate_open))
        sleep_ms(1);
    atomic_fetch_add(&ran, 1);
}

/* Returns once the reclaimer has begun two passes since the call (each
 * queries the held head of a stream's entries): whatever was pushed before
 * the call is taken in. */
static void wait_two_queries(void)
{
    uint64_t q = stats_now().event_queries;
    for (double until = now_ms() + 10000;
         stats_now().event_queries < q + 2 && now_ms() < until;)
        sleep_ms(1);
    CHECK(stats_now().event_queries >= q + 2, "the reclaimer queried");
}

static void end_checks(void)
{
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed (%zu alive)",
          fake_live_events());
}

/* No pool (CUDEFER_EVENT_POOL=0: an event let go of is destroyed), frees
 * on an idle stream, each flushed (released, its event seen complete)
 * before the next: the lane keeps its newest and records it again. */
static void s_idle_stream_keeps_its_event(void)
{
    enum { N = 20 };
    cudaStream_t s = stream_new();
    unsigned long made = fake_thread_calls(FAKE_EVENT_CREATE),
                  asked = fake_thread_calls(FAKE_EVENT_QUERY);
    for (int i = 0; i < N; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free %d", i);
        CHECK(defer_flush() == cudaSuccess && fake_is_released(p),
              "free %d released by the flush", i);
    }
    made = fake_thread_calls(FAKE_EVENT_CREATE) - made;
    asked = fake_thread_calls(FAKE_EVENT_QUERY) - asked;
    CHECK(made == 1 && asked == 0,
          "%d frees on an idle stream: %lu events made, %lu queries of the "
          "thread's own (1 and 0 expected)", N, made, asked);
    cudaStreamDestroy(s);
    end_checks();
}

/* No pool; a callbacks' lane behind held work fills its LANE_EVENTS
 * events (each made: none idle), and the next two callbacks share the
 * newest, whose first callback holds the reclaimer once the work is done.
 * The reclaimer's query saw every record of that event complete, two of
 * its callbacks not yet run: the next callback records it again without
 * a query of the thread's own. */
static void s_newest_seen_complete_while_running(void)
{
    cudaStream_t s = stream_new();
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < LANE_EVENTS + 2; i++)
        CHECK(defer_call(i == LANE_EVENTS - 1 ? wait_gate : count_run, NULL,
                         s) == cudaSuccess,
              "defer_call %d", i);
    wait_two_queries();
    fake_complete(w);
    CHECK(wait_flag(&gate_entered, 10000),
          "the newest event's first callback runs");
    unsigned long made = fake_thread_calls(FAKE_EVENT_CREATE),
                  asked = fake_thread_calls(FAKE_EVENT_QUERY);
    CHECK(defer_call(count_run, NULL, s) == cudaSuccess, "defer_call");
    made = fake_thread_calls(FAKE_EVENT_CREATE) - made;
    asked = fake_thread_calls(FAKE_EVENT_QUERY) - asked;
    CHECK(made == 0 && asked == 0,
          "a callback after the newest was seen complete: %lu events made, "
          "%lu queries of the thread's own (0 and 0 expected)", made, asked);
    atomic_store(&gate_open, 1);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&ran) == LANE_EVENTS + 3, "every callback ran (%d)",
          atomic_load(&ran));
    cudaStreamDestroy(s);
    end_checks();
}

/* No pool; frees behind held work fill the lane, and the next free finds
 * the newest's record not complete (the lane then waits a pick before it
 * asks that record again).  The work done and seen complete, the next
 * free records the newest again (a later record of it), and, the
 * reclaimer held in a callback meanwhile, the free after it asks that
 * record at once: it is complete (the stream idle), so no event is made. */
static void s_later_record_asked_at_once(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < LANE_EVENTS + 1; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free %d", i);
    }
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_call(wait_gate, NULL, s2) == cudaSuccess &&
              wait_flag(&gate_entered, 10000),
          "the reclaimer held in a callback");
    void *p = device_alloc(64);
    CHECK(defer_free(p, s) == cudaSuccess, "the newest recorded again");
    unsigned long made = fake_thread_calls(FAKE_EVENT_CREATE),
                  asked = fake_thread_calls(FAKE_EVENT_QUERY);
    p = device_alloc(64);
    CHECK(defer_free(p, s) == cudaSuccess, "the free after it");
    made = fake_thread_calls(FAKE_EVENT_CREATE) - made;
    asked = fake_thread_calls(FAKE_EVENT_QUERY) - asked;
    CHECK(made == 0 && asked == 1,
          "the free after it: %lu events made, %lu queries of the thread's "
          "own (0 and 1 expected)", made, asked);
    atomic_store(&gate_open, 1);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().pending == 0 && stats_now().failed == 0,
          "all released (pending %llu, failed %llu)",
          ULL(stats_now().pending), ULL(stats_now().failed));
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    end_checks();
}

/* One idle event at most (CUDEFER_EVENT_POOL=1: the first call's miss
 * stocks it, the second callback takes it): two callbacks behind held
 * work hold the lane's two events; a flush waits for them; a callback then
 * deferred behind more held work finds no idle event and must not record
 * the pending newest again.  The flush returns once the work before it is
 * done. */
static void s_flush_waits_no_idle_event(void)
{
    enum { BEFORE = 2 };
    cudaStream_t s = stream_new();
    fake_work *w[BEFORE];
    for (int i = 0; i < BEFORE; i++) {
        w[i] = work_held(s, NULL);
        CHECK(defer_call(count_run, NULL, s) == cudaSuccess, "defer_call %d",
              i);
    }
    unsigned long pushed = lifecycle_requests_pushed();
    int flushed = 0;
    pthread_t flusher;
    flush_in_thread(&flusher, &flushed);
    for (double until = now_ms() + 10000;
         lifecycle_requests_pushed() == pushed && now_ms() < until;)
        sleep_ms(1);
    CHECK(lifecycle_requests_pushed() > pushed, "the flush waits");
    fake_work *after = work_held(s, NULL);
    CHECK(defer_call(count_run, NULL, s) == cudaSuccess,
          "a callback deferred while the flush waits, behind held work");
    for (int i = 0; i < BEFORE; i++)
        fake_complete(w[i]);
    CHECK(wait_flag(&flushed, 5000) && __atomic_load_n(&flushed,
                                                       __ATOMIC_SEQ_CST) == 1,
          "the flush returned once the work before it was done, not "
          "waiting for the later work");
    CHECK(atomic_load(&ran) == BEFORE, "the callbacks before it ran (%d)",
          atomic_load(&ran));
    fake_complete(after);
    pthread_join(flusher, NULL);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&ran) == BEFORE + 1, "the later one ran too");
    cudaStreamDestroy(s);
    end_checks();
}

/* Returns once the pool has an idle event again (the reclaimer's refill,
 * asked for by a miss). */
static void wait_refill(void)
{
    for (double until = now_ms() + 10000;
         stats_now().events_in_pool == 0 && now_ms() < until;)
        sleep_ms(1);
    CHECK(stats_now().events_in_pool > 0, "the reclaimer refilled the pool");
}

/* A return hook on event creation: while holding_creates, the reclaimer
 * (any thread but the scenario's) waits after it made an event, before it
 * gives it to the pool. */
static pthread_t scenario_thread;
static atomic_int holding_creates;

static void hold_reclaimer_creates(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c, (void)r, (void)arg;
    while (!pthread_equal(pthread_self(), scenario_thread) &&
           atomic_load(&holding_creates))
        sleep_ms(1);
}

/* One idle event at most (CUDEFER_EVENT_POOL=1).  Stream a's lane, behind
 * held work: its first callback makes an event (the miss stocks the
 * pool), the second takes the stocked one, the third finds none (a miss:
 * it records the newest again, and the reclaimer refills), the fourth
 * takes the refilled one.  The reclaimer's creations are held during the
 * third pick: it tries twice (before and after its sweep), and a refill
 * landing between would make it a take.  A second ask may then bring a
 * second refill, late: once the reclaimer has made two more passes, the
 * scenario holds whatever the pool kept (given back before shutdown).
 * Its work done and seen complete, a's lane keeps three completed events
 * (a lane lets go of them at its next entry), and the pool is empty.
 * Then stream b: a callback behind held work w1 (an event made: none
 * idle), and one behind held work w2, whose pick finds no idle event, the
 * first miss since a's take: the sweep has a's lane let go of its
 * completed events, and the callback takes one.  So the first callback
 * runs once w1 completes, w2 still held; sharing b's event, it would wait
 * for w2. */
static void s_first_miss_after_take_sweeps(void)
{
    cudaStream_t a = stream_new(), b = stream_new();
    fake_work *wa = work_held(a, NULL);
    scenario_thread = pthread_self();
    fake_set_return_hook(FAKE_EVENT_CREATE, hold_reclaimer_creates, NULL);
    for (int i = 0; i < 4; i++) {
        if (i == 1) /* the first pick's ask, if any, answered */
            wait_two_queries();
        atomic_store(&holding_creates, i == 2);
        if (i == 3)
            wait_refill();
        CHECK(defer_call(count_run, NULL, a) == cudaSuccess, "on a: %d", i);
    }
    wait_two_queries(); /* every refill asked for is made */
    struct shared_event *kept[4];
    int nkept = 0;
    while (nkept < 4 && (kept[nkept] = event_pool_take_pooled_event(0)))
        nkept++;
    fake_complete(wa);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().events_in_pool == 0, "no idle event (%llu)",
          ULL(stats_now().events_in_pool));
    fake_work *w1 = work_held(b, NULL);
    CHECK(defer_call(count_run, NULL, b) == cudaSuccess, "on b, behind w1");
    fake_work *w2 = work_held(b, NULL);
    CHECK(defer_call(count_run, NULL, b) == cudaSuccess, "on b, behind w2");
    fake_complete(w1);
    for (double until = now_ms() + 2000;
         atomic_load(&ran) < 5 && now_ms() < until;)
        sleep_ms(1);
    CHECK(atomic_load(&ran) == 5,
          "the callback behind w1 ran, w2 still held (%d of 5 ran)",
          atomic_load(&ran));
    fake_complete(w2);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&ran) == 6, "every callback ran (%d)",
          atomic_load(&ran));
    while (nkept > 0)
        event_pool_give_event(kept[--nkept]);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    end_checks();
}

int main(void)
{
    plan_lazy();
    fork_scenario("frees on an idle stream, each released before the next: "
                  "one event, recorded again, no query of the thread's own",
                  "CUDEFER_EVENT_POOL=0", 1, 30000,
                  s_idle_stream_keeps_its_event);
    fork_scenario("frees after a record found not complete: a later record "
                  "of that event is asked at once",
                  "CUDEFER_EVENT_POOL=0", 1, 30000,
                  s_later_record_asked_at_once);
    if (LANE_SHARE_CALLBACKS) {
        fork_scenario("a callback after its lane's newest event was seen "
                      "complete, while a callback of it runs: recorded "
                      "again, no query of the thread's own",
                      "CUDEFER_EVENT_POOL=0", 1, 30000,
                      s_newest_seen_complete_while_running);
        fork_scenario("a flush waits, a lane holding fewer than LANE_EVENTS "
                      "events finds none idle: its pending newest is not "
                      "recorded again", "CUDEFER_EVENT_POOL=1", 1, 30000,
                      s_flush_waits_no_idle_event);
        fork_scenario("the first miss after a take sweeps the thread's other "
                      "lanes for completed events", "CUDEFER_EVENT_POOL=1", 1,
                      30000, s_first_miss_after_take_sweeps);
    } else {
        skip_block(3, "callbacks share no event (LANE_SHARE_CALLBACKS 0)");
    }
    return 0;
}
