/* SPDX-License-Identifier: MIT */
/* The reclaimer's poll of streams whose work is held back: a
 * stream's head that stays incomplete is queried less and less often,
 * so entries waiting behind a closed gate cost at most 3 event queries
 * each, the wait included; a head that completes after a long wait is still
 * seen within 1/16 of that wait; a flush looks at once. */
#include <stdatomic.h>

#include "helpers.h"

#define STREAMS 64
#define PER_ROUND 20
#define ROUNDS 10
#define ROUND_MS 200 /* the gate stays closed ROUNDS x ROUND_MS = 2 s */

static atomic_int ran[STREAMS];
static atomic_int out_of_order;

/* A callback of stream arg's k-th call, as a packed pair. */
static void count_in_order(void *arg)
{
    unsigned long v = (unsigned long)arg;
    int s = (int)(v >> 20), k = (int)(v & 0xfffff);
    if (atomic_fetch_add(&ran[s], 1) != k)
        atomic_fetch_add(&out_of_order, 1);
}

/* W6 in small: 64 streams held by a gate while 12800 callbacks arrive over
 * 2 s, then the gate opens. */
static void test_gate_queries(void)
{
    cudaStream_t s[STREAMS];
    fake_work *gate[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        s[i] = stream_new();
        gate[i] = fake_launch_held(s[i], NULL, 0);
    }
    unsigned long q0 = fake_calls(FAKE_EVENT_QUERY);
    int calls = 0;
    bool refused = false;
    for (int r = 0; r < ROUNDS; r++) {
        for (int k = 0; k < PER_ROUND; k++)
            for (int i = 0; i < STREAMS; i++) {
                unsigned long v = ((unsigned long)i << 20) |
                                  (unsigned long)(r * PER_ROUND + k);
                refused |= defer_call(count_in_order, (void *)v, s[i]) !=
                           cudaSuccess;
                calls++;
            }
        sleep_ms(ROUND_MS);
    }
    ok(!refused, "%d callbacks deferred behind the gate", calls);
    unsigned long waiting = fake_calls(FAKE_EVENT_QUERY) - q0;
    int early = 0;
    for (int i = 0; i < STREAMS; i++)
        early += atomic_load(&ran[i]);
    is_int(early, 0, "none ran while the gate was closed");
    for (int i = 0; i < STREAMS; i++)
        fake_complete(gate[i]);
    is_int(defer_flush(), cudaSuccess, "flush once the gate opened");
    unsigned long all = fake_calls(FAKE_EVENT_QUERY) - q0;
    int done = 0;
    for (int i = 0; i < STREAMS; i++)
        done += atomic_load(&ran[i]);
    is_int(done, calls, "every callback ran");
    is_int(atomic_load(&out_of_order), 0, "in order on each stream");
    diag("%lu event queries while the gate was closed, %lu in all: %.2f per "
         "entry", waiting, all, (double)all / calls);
    ok(all <= 3ul * (unsigned long)calls,
       "at most 3 event queries per entry, the 2 s wait included (%.2f)",
       (double)all / calls);
    for (int i = 0; i < STREAMS; i++)
        cudaStreamDestroy(s[i]);
}

static atomic_int flag_a, flag_b;

static void set_flag(void *arg)
{
    atomic_store((atomic_int *)arg, 1);
}

/* Two heads wait 3.2 s (their back-off then reaches 200 ms, 1/16 of it):
 * one completes and is seen within that; the other completes and a flush
 * sees it at once.  The bounds leave room for a loaded machine: 300 ms of
 * slack on the first (a back-off that doubled without the cap, 2 s by
 * then, is seen ~900 ms late); 100 ms on the flush, which is normally at
 * once (the reclaimer naps poll_max_us, 1 ms, between passes), where one
 * that waited for the stream's next poll took 0-200 ms. */
static void test_late_completion(void)
{
    cudaStream_t a = stream_new(), b = stream_new();
    fake_work *wa = fake_launch_held(a, NULL, 0);
    fake_work *wb = fake_launch_held(b, NULL, 0);
    ok(defer_call(set_flag, &flag_a, a) == cudaSuccess &&
       defer_call(set_flag, &flag_b, b) == cudaSuccess,
       "a callback behind held work on each of two streams");
    sleep_ms(3200);
    ok(!atomic_load(&flag_a) && !atomic_load(&flag_b), "neither ran yet");
    double t0 = now_ms();
    fake_complete(wa);
    bool seen = wait_flag((volatile int *)&flag_a, 10000);
    double late = now_ms() - t0;
    ok(seen && late < 200 + 1 + 300,
       "completed after 3.2 s, seen %.1f ms later (at most 1/16 of the wait, "
       "201 ms, plus 300 ms of slack)", late);
    fake_complete(wb);
    t0 = now_ms();
    is_int(defer_flush(), cudaSuccess, "flush");
    double flushed = now_ms() - t0;
    ok(atomic_load(&flag_b) && flushed < 100,
       "a flush looks at once: returned in %.1f ms with the callback run "
       "(its stream had backed off to about 200 ms)", flushed);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_gate_queries();
    test_late_completion();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
