/* SPDX-License-Identifier: MIT */
/* Blocks of the cache freed on their stream share events as callbacks do
 * (stream_lane.h: LANE_SHARE_BLOCKS).  On an H100, W4 cudefer-alloc (8
 * threads, each freeing on its own stream behind the GPU) created 6,600 to
 * 7,800 events in a run, an event per pending free, and one free a run
 * stalled for milliseconds in the driver.  Behind a held stream a thread's
 * frees of blocks now take at most LANE_EVENTS events.  The price, stated
 * in cudefer.h: a block sharing an event goes to another stream only once
 * the newest record of that event completed, not as soon as its own work
 * is done; never before its own work (the oracle), and at once on its own
 * stream.  Frees of other memory never share (t/shared_events). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "stream_lane.h"

enum { N = 3 * LANE_EVENTS, BYTES = 4096 };

static bool is_one_of(void *q, void *const *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] == q)
            return true;
    return false;
}

/* How many of n requests on stream s got one of the blocks p[0..n). */
static int take_on(cudaStream_t s, void **got, void *const *p, int n)
{
    int mine = 0;
    for (int i = 0; i < n; i++) {
        if (defer_alloc(&got[i], BYTES, s) != cudaSuccess)
            bail("defer_alloc #%d on the other stream refused", i);
        mine += is_one_of(got[i], p, n);
    }
    return mine;
}

static void give_back(cudaStream_t s, void *const *got, int n)
{
    for (int i = 0; i < n; i++)
        if (defer_free(got[i], s) != cudaSuccess)
            bail("defer_free of the other stream's block #%d refused", i);
}

static void test_frees_share_behind_a_held_stream(void)
{
    cudaStream_t s = stream_new(), other = stream_new();
    void *p[N], *got[N];
    fake_work *w[N];
    for (int i = 0; i < N; i++)
        if (defer_alloc(&p[i], BYTES, s) != cudaSuccess)
            bail("defer_alloc #%d refused", i);
    struct defer_stats before = stats_now();
    cudaEvent_t ev[N];
    (void)fake_take_last_recorded();
    for (int i = 0; i < N; i++) {
        w[i] = work_held(s, p[i]);
        if (defer_free(p[i], s) != cudaSuccess)
            bail("defer_free #%d refused", i);
        ev[i] = fake_take_last_recorded(); /* the event it was filed on */
    }
    struct defer_stats after = stats_now();
    /* Taken: the idle ones before, and those made since, less those idle
     * now (a device's first miss makes a batch ahead: event_pool.h). */
    long taken = (long)before.events_in_pool - (long)after.events_in_pool +
                 (long)(after.events_created - before.events_created);
    ok(taken <= LANE_EVENTS, "%d frees of blocks behind a held stream took "
       "%ld events, at most %d", N, taken, LANE_EVENTS);

    /* The first LANE_EVENTS - 1 frees have events of their own; from the
     * LANE_EVENTS-th on they share the newest, recorded again by the
     * last free.  Half the work done: those with their own event go to
     * another stream, the sharing ones (though some of their work is done
     * too) wait for the last record.  Which free got which event is read
     * from the fake, not assumed: a lane that finds no idle event above
     * the pool's reserve shares sooner (a stock its deadline cut short on
     * a loaded machine). */
    int done = 0; /* frees whose event's newest record is in the done half */
    for (int i = 0; i < N; i++) {
        int newest = i;
        for (int j = i + 1; j < N; j++)
            if (ev[j] == ev[i])
                newest = j;
        done += newest < N / 2;
    }
    if (done != LANE_EVENTS - 1)
        diag("the lane shared sooner: %d frees with a done event", done);
    ok(done >= 1, "a free's event is done with the first half of the work");
    uint64_t r0 = stats_now().released;
    for (int i = 0; i < N / 2; i++)
        fake_complete(w[i]);
    for (int k = 0; k < 5000 && stats_now().released < r0 + (uint64_t)done;
         k++)
        sleep_ms(1);
    sleep_ms(20); /* time for more, were there any */
    wait_stats_settled(1000);
    is_int((int)(stats_now().released - r0), done,
           "the reclaimer took back the frees whose own event completed, "
           "not those sharing a pending one");
    int mine = take_on(other, got, p, N);
    is_int(mine, done, "and another stream got those blocks");
    give_back(other, got, N);

    /* All done: the cache holds the N blocks and the N - mine made for
     * the other stream's requests; 2N requests take every one of them. */
    for (int i = N / 2; i < N; i++)
        fake_complete(w[i]);
    is_int(defer_flush(), cudaSuccess, "flush once all the work is done");
    void *again[2 * N];
    int found = 0;
    for (int i = 0; i < 2 * N; i++) {
        if (defer_alloc(&again[i], BYTES, other) != cudaSuccess)
            bail("defer_alloc #%d refused", i);
        found += is_one_of(again[i], p, N);
    }
    is_int(found, N, "then another stream got every one of them");
    give_back(other, again, 2 * N);
    is_int(defer_flush(), cudaSuccess, "flush");
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
}

/* On a GPU, creating an event waits for the driver's lock behind every
 * launch that waits for room in its queue: 15-220 ms on an H100 in W4.
 * So a thread whose lane
 * holds an event never makes one: it takes an idle one, or records its
 * newest again while the reclaimer makes more.  Here creating takes 20 ms
 * (fake latency); 8 held streams, 3 x LANE_EVENTS frees of blocks each,
 * need more events than the device's first stock (32 with
 * CUDEFER_EVENT_POOL=64, 16 of them its reserve): the calling thread makes
 * none (the fake counts its cudaEventCreate calls), and the reclaimer makes
 * the missing ones.  A stock cut short leaves some streams' first frees
 * to make their own: the check allows those and no more. */
static void s_no_event_made_on_the_launching_thread(void)
{
    enum { STREAMS = 8, PER = 3 * LANE_EVENTS, SLOW_NS = 20000000 };
    cudaStream_t s[STREAMS];
    void *p[STREAMS][PER];
    fake_work *w[STREAMS][PER];
    void *first = device_alloc(64); /* the first miss stocks the pool */
    unsigned long stocked = fake_thread_calls(FAKE_EVENT_CREATE);
    CHECK(defer_free(first, 0) == cudaSuccess, "the first free");
    /* Less its own event.  A stock its deadline cut short (a loaded
     * machine) may leave a stream's first free none to take: it makes
     * its own, the stock's documented price. */
    stocked = fake_thread_calls(FAKE_EVENT_CREATE) - stocked - 1;
    unsigned long may_make = stocked < STREAMS ? STREAMS - stocked : 0;
    if (may_make > 0)
        diag("the stock was cut short: %lu made", stocked);
    for (int k = 0; k < STREAMS; k++) {
        s[k] = stream_new();
        for (int i = 0; i < PER; i++)
            CHECK(defer_alloc(&p[k][i], BYTES, s[k]) == cudaSuccess,
                  "defer_alloc");
    }
    fake_set_latency(FAKE_EVENT_CREATE, SLOW_NS);
    unsigned long own = fake_thread_calls(FAKE_EVENT_CREATE);
    for (int i = 0; i < PER; i++)
        for (int k = 0; k < STREAMS; k++) {
            w[k][i] = work_held(s[k], p[k][i]);
            CHECK(defer_free(p[k][i], s[k]) == cudaSuccess, "defer_free");
        }
    own = fake_thread_calls(FAKE_EVENT_CREATE) - own;
    CHECK(own <= may_make, "%d frees of blocks on %d held streams, events "
          "slow to make: %lu made on the calling thread (%lu at most)",
          STREAMS * PER, STREAMS, own, may_make);
    uint64_t made = stats_now().events_created;
    for (int i = 0; i < 2000 && stats_now().events_created == made; i++)
        sleep_ms(1);
    CHECK(stats_now().events_created > made, "the reclaimer made more");
    fake_set_latency(FAKE_EVENT_CREATE, 0);
    for (int k = 0; k < STREAMS; k++)
        for (int i = 0; i < PER; i++)
            fake_complete(w[k][i]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    for (int k = 0; k < STREAMS; k++)
        cudaStreamDestroy(s[k]);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_violations() == 0, "oracle");
}

/* A plain free does not wait behind blocks sharing a pending event (they
 * wait in a FIFO of their own: stream_table.h): defer_trim releases it as
 * soon as its own work is done (include/cudefer.h).  t/stress found it:
 * in one memory FIFO, a block whose shared event's newest record was
 * pending held back the frees after it. */
static void test_plain_free_not_behind_shared_blocks(void)
{
    enum { SHARING = LANE_EVENTS + 1 };
    cudaStream_t s = stream_new();
    void *p[SHARING + 1];
    fake_work *w[SHARING + 1];
    for (int i = 0; i <= SHARING; i++)
        if (defer_alloc(&p[i], BYTES, s) != cudaSuccess)
            bail("defer_alloc #%d refused", i);
    for (int i = 0; i < SHARING; i++) {
        w[i] = work_held(s, p[i]);
        if (defer_free(p[i], s) != cudaSuccess)
            bail("defer_free #%d refused", i);
    }
    void *plain = device_alloc(BYTES);
    fake_work *wp = work_held(s, plain);
    is_int(defer_free(plain, s), cudaSuccess, "a plain free after them");
    w[SHARING] = work_held(s, p[SHARING]);
    is_int(defer_free(p[SHARING], s), cudaSuccess,
           "a block after it: the shared event's newest record");
    for (int i = 0; i < SHARING; i++)
        fake_complete(w[i]);
    fake_complete(wp);
    is_int(defer_trim(NULL), cudaSuccess, "trim");
    is_int(fake_is_released(plain), 1, "the trim released the plain free, "
           "behind blocks waiting for a shared event's newest record");
    fake_complete(w[SHARING]);
    is_int(defer_flush(), cudaSuccess, "flush");
    cudaStreamDestroy(s);
}

/* With CUDEFER_EVENT_POOL=0 no event is ever idle: a blocks' lane makes
 * its events as a callbacks' lane does, else it would share its first one
 * for good (behind a stream that never goes idle no block would go back,
 * and a trim would get nothing).  Each free's work completes
 * just after the next free: most blocks go to another stream. */
static void s_pool0_blocks_go_back(void)
{
    enum { M = 60 };
    cudaStream_t s = stream_new(), other = stream_new();
    void *p[M], *got[M];
    fake_work *w[M];
    for (int i = 0; i < M; i++)
        CHECK(defer_alloc(&p[i], BYTES, s) == cudaSuccess, "defer_alloc");
    for (int i = 0; i < M; i++) {
        w[i] = work_held(s, p[i]);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
        if (i > 0)
            fake_complete(w[i - 1]);
        sleep_ms(1); /* the reclaimer sees it */
    }
    sleep_ms(50);
    int mine = 0;
    for (int i = 0; i < M; i++) {
        CHECK(defer_alloc(&got[i], BYTES, other) == cudaSuccess, "take");
        mine += is_one_of(got[i], p, M);
    }
    CHECK(mine >= M / 2, "%d of %d blocks whose work was done went to "
          "another stream", mine, M - 1);
    fake_complete(w[M - 1]);
    for (int i = 0; i < M; i++)
        CHECK(defer_free(got[i], other) == cudaSuccess, "give back");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* The reclaimer cannot make events (each creation fails after the first
 * five): it says so once, not at every pass that a lane's want sends it
 * to try again (not 295 identical lines for 300 frees). */
static void s_refill_failure_reported_once(void)
{
    enum { M = 200 }; /* under LANE_REUSE_MAX: no free makes one itself */
    cudaStream_t s = stream_new();
    static void *p[M];
    static fake_work *w[M];
    for (int i = 0; i < M; i++)
        CHECK(defer_alloc(&p[i], BYTES, s) == cudaSuccess, "defer_alloc");
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 5, -1);
    stderr_capture_begin();
    for (int i = 0; i < M; i++) {
        w[i] = work_held(s, p[i]);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free #%d", i);
        if (i % 10 == 0)
            sleep_ms(1); /* reclaimer passes, each asked to make more */
    }
    const char *said = stderr_capture_end();
    int lines = 0;
    for (const char *at = said; (at = strstr(at, "fewer idle events")) != NULL;
         at++)
        lines++;
    CHECK(lines == 1, "the failure to make events said %d times", lines);
    fake_fail_clear();
    for (int i = 0; i < M; i++)
        fake_complete(w[i]);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_live_events() == 0, "every event destroyed");
}

int main(void)
{
    plan_lazy();
    fork_scenario("blocks freed behind a busy stream go back with no idle "
                  "event",
                  "CUDEFER_EVENT_POOL=0", 1, 30000, s_pool0_blocks_go_back);
    fork_scenario("a reclaimer that cannot make events says so once",
                  "CUDEFER_EVENT_POOL=4", 1, 30000,
                  s_refill_failure_reported_once);
    fork_scenario("blocks freed behind held streams, events slow to make: "
                  "none made on the calling thread, the reclaimer makes them",
                  "CUDEFER_EVENT_POOL=64", 1, 60000,
                  s_no_event_made_on_the_launching_thread);
    /* A stock of 32 and a reserve of 16 (event_pool.c): the first frees'
     * lanes find idle events above the reserve however slowly the stock
     * is made (the default's 2,048 may take past its 5 ms deadline under
     * a sanitizer, leaving the reserve alone). */
    setenv("CUDEFER_EVENT_POOL", "64", 1);
    fake_reset(1);
    test_frees_share_behind_a_held_stream();
    test_plain_free_not_behind_shared_blocks();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_events(), 0, "every event destroyed");
    is_int(fake_violations(), 0, "oracle: nothing handed out or released "
           "before its work was done");
    return 0;
}
