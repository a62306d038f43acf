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
    unsigned long c0 = fake_calls(FAKE_EVENT_CREATE);
    for (int i = 0; i < N; i++) {
        w[i] = work_held(s, p[i]);
        if (defer_free(p[i], s) != cudaSuccess)
            bail("defer_free #%d refused", i);
    }
    unsigned long made = fake_calls(FAKE_EVENT_CREATE) - c0;
    ok(made <= LANE_EVENTS, "%d frees of blocks behind a held stream: %lu "
       "events created, at most %d", N, made, LANE_EVENTS);

    /* The first LANE_EVENTS - 1 frees have events of their own; from the
     * LANE_EVENTS-th on they share the newest, recorded again by the
     * last free.  Half the work done: those with their own event go to
     * another stream, the sharing ones (though some of their work is done
     * too) wait for the last record. */
    uint64_t r0 = stats_now().released;
    for (int i = 0; i < N / 2; i++)
        fake_complete(w[i]);
    for (int k = 0; k < 5000 && stats_now().released < r0 + LANE_EVENTS - 1;
         k++)
        sleep_ms(1);
    sleep_ms(20); /* time for more, were there any */
    wait_stats_settled(1000);
    is_int((int)(stats_now().released - r0), LANE_EVENTS - 1,
           "the reclaimer took back the frees whose own event completed, "
           "not those sharing a pending one");
    int mine = take_on(other, got, p, N);
    is_int(mine, LANE_EVENTS - 1, "and another stream got those blocks");
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

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_frees_share_behind_a_held_stream();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_events(), 0, "every event destroyed");
    is_int(fake_violations(), 0, "oracle: nothing handed out or released "
           "before its work was done");
    return 0;
}
