/* SPDX-License-Identifier: MIT */
/* A device's first stock of events and the reserve its pool keeps for
 * lanes that hold none (src/event_pool.c).  On an H100, W6 (64 threads, 16
 * streams each, callbacks behind a gate) lost 156-209 ms at a thread's
 * first callback on a stream: the first threads' sharing lanes had taken
 * every idle event, so a later thread made its own while 63 others
 * recorded, and making an event waits for the driver's lock behind them.
 * Each scenario is a fresh process. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "event_pool.h"
#include "helpers.h"
#include "lifecycle.h"
#include "stream_lane.h"

static atomic_int ran;

static void count(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

/* The first miss makes up to 2,048 events (half of CUDEFER_EVENT_POOL),
 * on the fake's fast creation all or most of them (5 ms at most), not a
 * mere 32.  Fewer than 64 only where the call lasted its 5 ms (a thread
 * descheduled in its first batch, TSan under load: 31 and 32 seen, 2 runs
 * in 180 with 4-6 busy loops). */
static void s_first_miss_stocks(void)
{
    void *p = device_alloc(64);
    double t0 = now_ms();
    CHECK(defer_free(p, 0) == cudaSuccess, "defer_free");
    double took = now_ms() - t0;
    uint64_t idle = stats_now().events_in_pool;
    CHECK(idle >= 1 && idle <= 2048 && (idle >= 64 || took >= 5.0),
          "%llu idle events after the first miss, which took %.2f ms (64 to "
          "2,048 expected, or fewer once the stock's 5 ms were up)",
          ULL(idle), took);
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* The stock stops after 5 ms: creating takes 2 ms here (fake latency, a
 * busy wait on the clock), so 2,048 would take 4 s; the first call makes a
 * few.  Counted, not timed: a stall only makes fewer before the deadline,
 * where the call's time grows with it (596 and 828 ms for 3 events, 2 runs
 * in 8 at nice 19 beside four busy loops, against a bound of 500 ms). */
static void s_stock_deadline(void)
{
    fake_set_latency(FAKE_EVENT_CREATE, 2000000);
    void *p = device_alloc(64);
    double t0 = now_ms();
    CHECK(defer_free(p, 0) == cudaSuccess, "defer_free");
    double took = now_ms() - t0;
    uint64_t made = stats_now().events_created;
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    diag("  the first free took %.1f ms, made %llu events", took, ULL(made));
    CHECK(made >= 1 && made <= 8, "the first free made %llu events (5 ms of "
          "2 ms each, and one begun at the deadline: 4 at most; 8 allowed)",
          ULL(made));
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* The stock is no more than the pool keeps (CUDEFER_EVENT_POOL=10). */
static void s_stock_within_pool(void)
{
    void *p = device_alloc(64);
    CHECK(defer_free(p, 0) == cudaSuccess, "defer_free");
    CHECK(stats_now().events_in_pool <= 10, "%llu idle events, 10 at most",
          ULL(stats_now().events_in_pool));
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* A stock its deadline cut short (creating takes 1 ms here) keeps at
 * most half of what it made in reserve: a sharing lane still finds idle
 * events above it (with the whole 1,024 in reserve, none: under TSan the
 * default stock misses its deadline, and t/shared_events would fail). */
static void s_short_stock_small_reserve(void)
{
    cudaStream_t s = stream_new();
    fake_work *gate = work_held(s, NULL);
    fake_set_latency(FAKE_EVENT_CREATE, 1000000);
    CHECK(defer_call(count, NULL, s) == cudaSuccess, "the first callback");
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    struct defer_stats before = stats_now();
    uint64_t idle = before.events_in_pool;
    /* At least the one a stock always makes: a thread descheduled in the
     * creations' busy wait (TSan under load) makes no more in 5 ms. */
    CHECK(idle >= 1 && idle < 64, "%llu idle after a short stock", ULL(idle));
    for (int i = 0; i < 3; i++)
        CHECK(defer_call(count, NULL, s) == cudaSuccess, "callback %d", i);
    /* The reclaimer may meanwhile have made a few for the lane's want
     * (event_pool_refill): counted out (seen under TSan).
     * A snapshot reads its counters before its gauges (cudefer.h: one by
     * one), so a refill that lands in between is in events_in_pool and
     * not in events_created ("4 of 1 left, 0 made meanwhile": a stock of
     * 1 under load).  A snapshot counts once the next one saw no more
     * made: every event it found idle was counted in it. */
    struct defer_stats after = stats_now(), next = stats_now();
    while (next.events_created != after.events_created) {
        after = next;
        next = stats_now();
    }
    uint64_t made = after.events_created - before.events_created;
    CHECK(after.events_in_pool < idle + made,
          "the sharing lane took idle events (%llu of %llu left, %llu made "
          "meanwhile)", ULL(after.events_in_pool), ULL(idle), ULL(made));
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&ran) == 4, "every callback ran");
    cudaStreamDestroy(s);
}

enum { GREEDY_STREAMS = 16, GREEDY_CALLS = 64 * GREEDY_STREAMS, LATE = 8 };

static cudaStream_t late_streams[LATE];
static unsigned long late_made;

/* A thread's first callbacks on LATE held streams: how many events it
 * made itself (the fake counts each thread's cudaEventCreate calls). */
static void *late_thread(void *arg)
{
    (void)arg;
    unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
    for (int k = 0; k < LATE; k++)
        if (defer_call(count, NULL, late_streams[k]) != cudaSuccess)
            bail("defer_call");
    late_made = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    return NULL;
}

/* CUDEFER_EVENT_POOL=64: a stock of 32, a reserve of 16.  One thread's
 * callbacks on 16 held streams want up to 8 events a lane (128): they take
 * every idle event but the reserve (and what the reclaimer makes).  Then
 * another thread's first callbacks on 8 new held streams take theirs from
 * the reserve: that thread makes none.  Without the reserve the greedy
 * lanes took all, and it made its own.  A stock its deadline cut short (a
 * loaded machine: 14 of 16 seen) keeps half of what it made: the checks
 * use the reserve that stock gives, counted from the first call's own
 * creations (the stock is made on the calling thread). */
static void s_reserve_for_first_calls(void)
{
    cudaStream_t s[GREEDY_STREAMS];
    fake_work *gate[GREEDY_STREAMS], *late_gate[LATE];
    for (int k = 0; k < GREEDY_STREAMS; k++) {
        s[k] = stream_new();
        gate[k] = work_held(s[k], NULL);
    }
    unsigned long stocked = fake_thread_calls(FAKE_EVENT_CREATE);
    for (int i = 0; i < GREEDY_CALLS; i++) {
        CHECK(defer_call(count, NULL, s[i % GREEDY_STREAMS]) == cudaSuccess,
              "defer_call %d", i);
        if (i == 0) /* its own event, then the stock */
            stocked = fake_thread_calls(FAKE_EVENT_CREATE) - stocked - 1;
    }
    unsigned long reserve = stocked / 2 < 16 ? stocked / 2 : 16;
    if (reserve < 16)
        diag("the stock was cut short: %lu made, a reserve of %lu", stocked,
             reserve);
    uint64_t idle = stats_now().events_in_pool;
    CHECK(idle >= reserve,
          "%llu idle after the greedy lanes: the reserve (%lu) is kept",
          ULL(idle), reserve);
    for (int k = 0; k < LATE; k++) {
        late_streams[k] = stream_new();
        late_gate[k] = work_held(late_streams[k], NULL);
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, late_thread, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
    unsigned long own = reserve < LATE ? LATE - reserve : 0;
    CHECK(late_made <= own, "the late thread's %d first callbacks made %lu "
          "events on it (%lu at most)", LATE, late_made, own);
    CHECK(atomic_load(&ran) == 0, "none ran behind the gates");
    for (int k = 0; k < GREEDY_STREAMS; k++)
        fake_complete(gate[k]);
    for (int k = 0; k < LATE; k++)
        fake_complete(late_gate[k]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&ran) == GREEDY_CALLS + LATE, "every callback ran (%d)",
          atomic_load(&ran));
    for (int k = 0; k < GREEDY_STREAMS; k++)
        cudaStreamDestroy(s[k]);
    for (int k = 0; k < LATE; k++)
        cudaStreamDestroy(late_streams[k]);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed");
    CHECK(fake_violations() == 0, "oracle");
}

/* A lane that holds events and finds none idle asks its newest before it
 * makes one (src/stream_lane.c).  No idle event ever
 * (CUDEFER_EVENT_POOL=0) and a reclaimer that does not look (it naps 1 s):
 * 100 frees on an idle stream make one event on the calling thread, not
 * 100 (before: one each); 20 frees behind held work make one each but the
 * first (it records the idle stream's event again), asking again after
 * 1, 2, 4 ... 64 picks (400 more: a query per 64 at most), and the
 * not-ready queries leave no error on the thread; all released once done,
 * none early. */
static void s_lane_asks_its_newest(void)
{
    enum { IDLE = 100, HELD = 20, BUSY = 400 };
    cudaStream_t s = stream_new();
    unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
    for (int i = 0; i < IDLE; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free %d", i);
    }
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    CHECK(own == 1, "%d frees on an idle stream made %lu events", IDLE, own);
    fake_work *gate = work_held(s, NULL);
    own = fake_thread_calls(FAKE_EVENT_CREATE);
    unsigned long asked = fake_thread_calls(FAKE_EVENT_QUERY);
    for (int i = 0; i < HELD; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free held %d", i);
    }
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    CHECK(own == HELD - 1, "%d frees behind held work made %lu events",
          HELD, own);
    asked = fake_thread_calls(FAKE_EVENT_QUERY) - asked;
    CHECK(asked <= 14, "%lu queries of their own for %d frees behind held "
          "work (asked again after 1, 2, 4 ... picks)", asked, HELD);
    own = fake_thread_calls(FAKE_EVENT_CREATE);
    asked = fake_thread_calls(FAKE_EVENT_QUERY);
    for (int i = 0; i < BUSY; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free busy %d", i);
    }
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    asked = fake_thread_calls(FAKE_EVENT_QUERY) - asked;
    CHECK(own == BUSY && asked <= 10, "%d more frees behind it: %lu events, "
          "%lu queries (a query per 64 at most)", BUSY, own, asked);
    CHECK(cudaGetLastError() == cudaSuccess, "no error left on the thread");
    CHECK(stats_now().released < (uint64_t)(IDLE + HELD + BUSY),
          "the held frees wait");
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().released == (uint64_t)(IDLE + HELD + BUSY),
          "all released");
    cudaStreamDestroy(s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed");
    CHECK(fake_violations() == 0, "oracle");
}

/* The lane's own query runs in the relaxed capture mode: a query in the
 * thread's default (global) mode is refused while a global capture runs
 * and invalidates it.  A free behind held work, the
 * work done, a global capture begun on another stream, then a free on the
 * first stream with no idle event: it queries, and the capture stays
 * active, no error left on the thread. */
static void s_own_query_keeps_captures(void)
{
    cudaStream_t s = stream_new(), cap = stream_new();
    fake_work *w = work_held(s, NULL);
    void *p = device_alloc(64);
    uint64_t queried = stats_now().event_queries;
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free behind held work");
    /* The push wakes the reclaimer for one pass: once it has queried the
     * held work it sleeps its second; completed before that query, the
     * work would be seen done and the next free need ask nothing (seen
     * under TSan under load). */
    double t0 = now_ms();
    while (stats_now().event_queries == queried && now_ms() - t0 < 10000)
        sleep_ms(1);
    CHECK(stats_now().event_queries > queried &&
              stats_now().released == 0,
          "the reclaimer queried the held work");
    fake_complete(w);
    p = device_alloc(64); /* before the capture: cudaMalloc is unsafe */
    CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal) ==
              cudaSuccess, "cudaStreamBeginCapture");
    unsigned long asked = fake_thread_calls(FAKE_EVENT_QUERY);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free while capturing");
    CHECK(fake_thread_calls(FAKE_EVENT_QUERY) - asked == 1,
          "the free queried its newest itself");
    enum cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(cap, &st) == cudaSuccess &&
              st == cudaStreamCaptureStatusActive,
          "the capture is still active (status %d)", (int)st);
    CHECK(cudaGetLastError() == cudaSuccess, "no error left on the thread");
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(cap, &g) == cudaSuccess, "end capture");
    cudaGraphDestroy(g);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().released == 2, "both released");
    cudaStreamDestroy(s);
    cudaStreamDestroy(cap);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_violations() == 0, "oracle");
}

/* The reclaimer held between its query and its use of it (the fake's
 * return hook): 0 not armed, 1 armed, 2 holding, 3 let go. */
static atomic_int hold_state;

static void hold_reclaimer_query(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c, (void)arg;
    int armed = 1;
    if (r != cudaSuccess || !lifecycle_on_reclaimer_thread() ||
        !atomic_compare_exchange_strong(&hold_state, &armed, 2))
        return;
    while (atomic_load(&hold_state) != 3)
        sleep_ms(1);
}

/* A race, played in order: the reclaimer's query of a
 * stream's event completes and the reclaimer is held before it raises the
 * completed label to what it took in (label 1).  Meanwhile the lane's
 * thread queries the event itself twice, raising the label to 2, and
 * records it again (label 3) behind held work.  Let go, the reclaimer
 * must not lower the label: the free of label 2, whose work is done, is
 * released while the later work is still held (were the reclaimer to
 * store 1, that free would wait for the held work). */
static void s_reclaimer_never_lowers(void)
{
    cudaStream_t s = stream_new();
    unsigned long made = fake_thread_calls(FAKE_EVENT_CREATE);
    atomic_store(&hold_state, 1);
    fake_set_return_hook(FAKE_EVENT_QUERY, hold_reclaimer_query, NULL);
    void *p1 = device_alloc(64), *p2 = device_alloc(64),
         *p3 = device_alloc(64);
    CHECK(defer_free(p1, s) == cudaSuccess, "defer_free 1");
    double t0 = now_ms();
    while (atomic_load(&hold_state) != 2 && now_ms() - t0 < 5000)
        sleep_ms(1);
    CHECK(atomic_load(&hold_state) == 2, "the reclaimer queried and is held");
    CHECK(defer_free(p2, s) == cudaSuccess, "defer_free 2 (the lane asks "
          "its newest, then records it again)");
    fake_work *w = work_held(s, NULL);
    CHECK(defer_free(p3, s) == cudaSuccess, "defer_free 3, behind held "
          "work");
    CHECK(fake_thread_calls(FAKE_EVENT_CREATE) - made == 1,
          "one event for the three frees, recorded again (made %lu)",
          fake_thread_calls(FAKE_EVENT_CREATE) - made);
    atomic_store(&hold_state, 3);
    CHECK(wait_released(p2, 3000), "the free whose work is done is "
          "released while later work is held (released %llu)",
          ULL(stats_now().released));
    CHECK(!fake_is_released(p3), "the free behind held work waits");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().released == 3, "all released");
    fake_set_return_hook(FAKE_EVENT_QUERY, NULL, NULL);
    cudaStreamDestroy(s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_violations() == 0, "oracle");
}

/* The reclaimer's successful queries in a pass, and the pool's idle
 * events at its first and at its PASS_PROBE-th. */
#define PASS_FREES 600
#define PASS_PROBE 300
static atomic_int pass_queries;
static _Atomic uint64_t idle_at_first, idle_at_probe;

static void watch_reclaimer_queries(enum fake_call c, cudaError_t r,
                                    void *arg)
{
    (void)c, (void)arg;
    if (r != cudaSuccess || !lifecycle_on_reclaimer_thread())
        return;
    int n = atomic_fetch_add(&pass_queries, 1) + 1;
    if (n == 1)
        atomic_store(&idle_at_first, stats_now().events_in_pool);
    else if (n == PASS_PROBE)
        atomic_store(&idle_at_probe, stats_now().events_in_pool);
}

/* A pass that finds hundreds of entries complete gives their events back
 * to the pool as it goes (256 at a time), not only when it ends: on an
 * H100 one thread freeing on an idle stream faster than the reclaimer
 * queried an event per entry found the pool empty in 25-45% of its calls
 * (W5), and each such call queried its stream's newest event itself.
 * Here 600 frees, each with an event of its own (a busy stream's), wait
 * behind held work; once it completes, one pass queries all 600: by its
 * 300th query the pool has 256 of their events back, not none until the
 * pass ends. */
static void s_long_pass_gives_back(void)
{
    cudaStream_t s = stream_new();
    fake_work *w = work_held(s, NULL);
    void *p[PASS_FREES];
    for (int i = 0; i < PASS_FREES; i++) {
        p[i] = device_alloc(64);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free %d", i);
    }
    CHECK(stats_now().events_in_pool + PASS_FREES <=
              stats_now().events_created,
          "each free holds an event of its own (%llu made, %llu idle)",
          ULL(stats_now().events_created), ULL(stats_now().events_in_pool));
    /* Two wake-ups later a whole pass began after the last push: it took
     * every entry in (a fixed sleep could end while a stalled reclaimer
     * had taken in only some). */
    uint64_t w0 = stats_now().wakeups;
    double t0 = now_ms();
    while (stats_now().wakeups < w0 + 2 && now_ms() - t0 < 10000)
        sleep_ms(1);
    CHECK(stats_now().wakeups >= w0 + 2, "the reclaimer took the frees in");
    fake_set_return_hook(FAKE_EVENT_QUERY, watch_reclaimer_queries, NULL);
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    fake_set_return_hook(FAKE_EVENT_QUERY, NULL, NULL);
    uint64_t first = atomic_load(&idle_at_first),
             probe = atomic_load(&idle_at_probe);
    CHECK(atomic_load(&pass_queries) >= PASS_PROBE,
          "the reclaimer queried %d events", atomic_load(&pass_queries));
    CHECK(probe >= first + 256,
          "256 events back in the pool by the pass's %dth query (idle %llu "
          "at its first, %llu then)", PASS_PROBE, ULL(first), ULL(probe));
    cudaStreamDestroy(s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_violations() == 0, "oracle");
}

/* The completed label only rises: the lane's thread and the reclaimer
 * both raise it after a query of their own; the reclaimer must not store
 * what it had taken in, lowering a label the lane had raised past it
 * (entries whose work is done would wait for later work). */
static void test_completed_only_rises(void)
{
    struct shared_event ev;
    memset(&ev, 0, sizeof ev);
    stream_lane_raise_completed(&ev, 10);
    stream_lane_raise_completed(&ev, 5); /* the reclaimer's older view */
    uint64_t after_lower = atomic_load(&ev.completed);
    stream_lane_raise_completed(&ev, 12);
    ok(after_lower == 10 && atomic_load(&ev.completed) == 12,
       "an event's completed label only rises (10, then 5: %llu; then 12: "
       "%llu)", ULL(after_lower), ULL(atomic_load(&ev.completed)));
}

/* Through the runtime's calls (CUDEFER_DRIVER_CALLS=0, or a thread with no
 * current context), a creation of the first miss's stock that fails (made
 * on the launching thread, after the free's own event was made) ends the
 * stock, said once; the free is accepted, and the failed creation, which
 * the runtime leaves as the thread's last error, is cudefer's own business:
 * no error for the application's next cudaGetLastError (PyTorch's launch
 * check) to find. */
static void s_stock_failure_leaves_no_error(void)
{
    void *p = device_alloc(64);
    cudaStream_t s = stream_new();
    cudaGetLastError();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 1, 1);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    cudaError_t last = cudaGetLastError();
    CHECK(err == cudaSuccess, "defer_free accepted (%s)",
          cudaGetErrorName(err));
    CHECK(strstr(said, "fewer idle events made ahead") != NULL,
          "the stock's failed creation said (stderr: \"%s\")", said);
    CHECK(last == cudaSuccess, "no error left by the stock's failed creation "
          "(%s)", cudaGetErrorName(last));
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(p) == 1, "released");
}

int main(void)
{
    plan_lazy();
    test_completed_only_rises();
    fork_scenario("the device's first miss stocks its pool", "", 1, 30000,
                  s_first_miss_stocks);
    fork_scenario("the stock stops at its deadline when events are slow to "
                  "make", "", 1, 30000, s_stock_deadline);
    if (LANE_SHARE_CALLBACKS)
        fork_scenario("a stock cut short keeps half of it in reserve at "
                      "most", "", 1, 30000, s_short_stock_small_reserve);
    else
        skip_block(1, "callbacks share no event (LANE_SHARE_CALLBACKS 0)");
    fork_scenario("a failed creation of the stock leaves no error",
                  "CUDEFER_DRIVER_CALLS=0", 1, 30000,
                  s_stock_failure_leaves_no_error);
    fork_scenario("the stock stays within the pool", "CUDEFER_EVENT_POOL=10",
                  1, 30000, s_stock_within_pool);
    fork_scenario("a lane with no idle event at hand asks its newest before "
                  "making one",
                  "CUDEFER_EVENT_POOL=0 CUDEFER_POLL_US=1000000 "
                  "CUDEFER_POLL_MAX_US=1000000", 1, 30000,
                  s_lane_asks_its_newest);
    fork_scenario("the lane's own query leaves another stream's global "
                  "capture intact",
                  "CUDEFER_EVENT_POOL=0 CUDEFER_POLL_US=1000000 "
                  "CUDEFER_POLL_MAX_US=1000000", 1, 30000,
                  s_own_query_keeps_captures);
    fork_scenario("the reclaimer never lowers a completed label the lane "
                  "raised meanwhile", "CUDEFER_EVENT_POOL=0", 1, 30000,
                  s_reclaimer_never_lowers);
    fork_scenario("a long pass gives its events back as it goes", "", 1,
                  30000, s_long_pass_gives_back);
    if (LANE_SHARE_CALLBACKS)
        fork_scenario("sharing lanes leave the pool's reserve to lanes that "
                      "hold no event", "CUDEFER_EVENT_POOL=64", 1, 30000,
                      s_reserve_for_first_calls);
    else
        skip_block(1, "callbacks share no event (LANE_SHARE_CALLBACKS 0)");
    return 0;
}
