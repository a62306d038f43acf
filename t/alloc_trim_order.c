/* SPDX-License-Identifier: MIT */
/* defer_trim and the frees of defer_alloc's blocks that reach the
 * reclaimer out of the order their events were recorded in: thread A
 * records its free's event on s and pushes last, behind the main thread's
 * later free on s, whose work still runs when A's is done.  A's block is
 * free (its work done), so the trim gives it back, as it does memory of
 * cudaMalloc's in the same race (t/requests). */
#include <pthread.h>

#include "helpers.h"

static _Thread_local bool hold_me; /* set by the thread to be held */
static volatile int in_hook, let_go;

static void hold_after_record(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)arg;
    if (r != cudaSuccess || !hold_me)
        return;
    __atomic_store_n(&in_hook, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&let_go, __ATOMIC_SEQ_CST))
        sleep_ms(1);
}

struct late_push {
    void *ptr;
    cudaStream_t s;
    cudaError_t err;
};

static void *free_held_after_record(void *arg)
{
    struct late_push *lp = arg;
    hold_me = true;
    lp->err = defer_free(lp->ptr, lp->s);
    return NULL;
}

static void scenario_trim_block_behind_later_free(void)
{
    const size_t MiB = (size_t)1 << 20;
    cudaStream_t s = stream_new();
    void *a = NULL, *b = NULL;
    CHECK(alloc_checked(&a, MiB, s) == cudaSuccess &&
              alloc_checked(&b, 2 * MiB, s) == cudaSuccess,
          "two blocks on s, each a segment of its own");
    fake_work *wa = work_held(s, a);
    struct late_push lp = {a, s, cudaErrorUnknown};
    fake_set_return_hook(FAKE_EVENT_RECORD, hold_after_record, NULL);
    pthread_t t;
    pthread_create(&t, NULL, free_held_after_record, &lp);
    CHECK(wait_flag(&in_hook, 2000), "A recorded its free's event");
    fake_work *wb = work_held(s, b); /* after A's record */
    unsigned long queries = fake_calls(FAKE_EVENT_QUERY);
    CHECK(defer_free(b, s) == cudaSuccess,
          "defer_free(b): recorded later, pushed first");
    for (int i = 0; i < 2000 && fake_calls(FAKE_EVENT_QUERY) == queries; i++)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_EVENT_QUERY) > queries,
          "b's entry taken in and queried");
    __atomic_store_n(&let_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    fake_set_return_hook(FAKE_EVENT_RECORD, NULL, NULL);
    CHECK(lp.err == cudaSuccess, "defer_free(a) after its hold");
    fake_complete(wa); /* a's work done; b's still running */
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    struct defer_stats st = stats_now();
    CHECK(st.cache_releases == 1 && st.cache_bytes == 2 * MiB,
          "the trim gave a back, whose work is done, though b's free waits "
          "before it (released %llu, cache bytes %llu)",
          ULL(st.cache_releases), ULL(st.cache_bytes));
    fake_complete(wb);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_trim(NULL) == cudaSuccess &&
              stats_now().cache_bytes == 0,
          "b given back once its work is done");
    cudaStreamDestroy(s);
}

int main(void)
{
    plan_lazy();
    fork_scenario("trim gives back a block whose free waits behind a "
                  "later one",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0", 1,
                  10000, scenario_trim_block_behind_later_free);
    return 0;
}
