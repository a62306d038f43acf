/* SPDX-License-Identifier: MIT */
/* What flush and trim promise their callers, and the wake-up a push
 * owes a sleeping reclaimer, in the cases a mutation test showed the
 * suite blind to (each scenario fails under its mutant of src/):
 *   - a trim releases every completed entry while other threads defer
 *     (a demand batch does not yield to the application as an idle one);
 *   - a flush waits for every entry taken in before it, however many
 *     taken in after it finish first (the barrier is strict);
 *   - a device that fails, with any error, while a flush waits is that
 *     flush's error;
 *   - an entry pushed while the reclaimer heads for its sleep (holding
 *     no lock yet) is seen: the reclaimer checks the queue under its wake
 *     lock;
 *   - a trim releases a completed free that reached the reclaimer behind
 *     another thread's later free on the same stream (two threads' records
 *     and pushes need not come in the same order), and gives back a block
 *     of defer_alloc's in the same race.
 * Each scenario is a fresh process. */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "reclaimer_state.h"

/* ---- trim while others defer ----------------------------------------- */

#define N 64

static volatile int stop_pushing;
static void noop(void *arg) { (void)arg; }

static void *pusher(void *arg)
{
    cudaStream_t s = arg;
    while (!__atomic_load_n(&stop_pushing, __ATOMIC_SEQ_CST))
        defer_call(noop, NULL, s);
    return NULL;
}

static void scenario_trim_while_pushing(void)
{
    cudaStream_t s = stream_new(), other = stream_new();
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(1 << 20);
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free %d", i);
    }
    /* Held once the reclaimer has taken them in: "settled" alone can pass
     * before it has (two snapshots of nothing agree), as on a loaded host
     * running make check -j16. */
    double deadline = now_ms() + 10000;
    while (stats_now().held < N && now_ms() < deadline)
        sleep_ms(1);
    CHECK(wait_stats_settled(2000), "settled");
    CHECK(stats_now().held == N, "all %d held (held %llu)", N,
          ULL(stats_now().held));
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, pusher, other);
    sleep_ms(10);
    size_t bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess, "defer_trim");
    int released = count_released(p, N);
    __atomic_store_n(&stop_pushing, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK(released == N, "trim released all %d completed entries (%d; %zu "
          "bytes)", N, released, bytes);
    CHECK(bytes == (size_t)N << 20, "trim's bytes: %zu", bytes);
    defer_flush();
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
}

/* ---- the flush's barrier ---------------------------------------------- */

static void scenario_later_entry_first(void)
{
    cudaStream_t slow = stream_new(), fast = stream_new();
    void *a = device_alloc(4096), *b = device_alloc(4096);
    fake_work *w = work_held(slow, a);
    CHECK(defer_free(a, slow) == cudaSuccess, "defer_free(a, slow)");
    sleep_ms(20); /* a is taken in, pending */
    pthread_t t;
    int done = 0;
    flush_in_thread(&t, &done);
    sleep_ms(20); /* the flush is taken in: its barrier is after a */
    CHECK(defer_free(b, fast) == cudaSuccess, "defer_free(b, fast)");
    CHECK(wait_released(b, 2000), "b (after the flush, no work) released");
    sleep_ms(30);
    CHECK(__atomic_load_n(&done, __ATOMIC_SEQ_CST) == 0,
          "flush still waits for a (got %d)", done);
    CHECK(fake_is_released(a) == 0, "a not released while its work runs");
    fake_complete(w);
    CHECK(wait_flag(&done, 2000) && done == 1, "flush returns once a is done");
    CHECK(fake_is_released(a) == 1, "a released when flush returned");
    pthread_join(t, NULL);
    cudaStreamDestroy(slow);
    cudaStreamDestroy(fast);
}

/* ---- a device failing while a flush waits ------------------------------ */

static void scenario_fail_during_flush(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    pthread_t t;
    int done = 0;
    flush_in_thread(&t, &done);
    sleep_ms(20);
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, cudaErrorInvalidResourceHandle, 0, -1);
    CHECK(wait_flag(&done, 2000), "flush returns");
    stderr_capture_end();
    fake_fail_clear();
    CHECK(done == -1, "flush returned an error (done %d)", done);
    pthread_join(t, NULL);
    fake_complete(w);
}

/* ---- a push while the reclaimer goes to sleep ------------------------- */

static volatile int started, locked, ran;
static void gate_cb(void *arg)
{
    (void)arg;
    __atomic_store_n(&started, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&locked, __ATOMIC_SEQ_CST))
        ;
}
static void mark(void *arg) { (void)arg; __atomic_store_n(&ran, 1, __ATOMIC_SEQ_CST); }

static void scenario_push_while_going_to_sleep(void)
{
    cudaStream_t s = stream_new();
    CHECK(defer_call(gate_cb, NULL, s) == cudaSuccess, "defer_call gate");
    CHECK(wait_flag(&started, 2000), "gate callback runs");
    pthread_mutex_lock(&rs.wake_lock);
    __atomic_store_n(&locked, 1, __ATOMIC_SEQ_CST);
    sleep_ms(30); /* the reclaimer ends its pass and waits for wake_lock */
    CHECK(defer_call(mark, NULL, s) == cudaSuccess, "defer_call mark");
    sleep_ms(5);
    pthread_mutex_unlock(&rs.wake_lock);
    CHECK(wait_flag(&ran, 1000), "the call pushed meanwhile runs, no later "
                                 "call needed");
    defer_flush();
    cudaStreamDestroy(s);
}

/* ---- a completed free behind a later one ------------------------------ */

/* Thread A records its free's event, then is held (the return hook) while
 * the main thread records and pushes a later free on the same stream; A's
 * push comes last, so its entry waits behind a later one. */
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

/* Starts fn(arg) on a thread of its own, which holds after its event
 * record (hold_after_record); returns once it holds. */
static pthread_t start_held_after_record(void *(*fn)(void *), void *arg)
{
    fake_set_return_hook(FAKE_EVENT_RECORD, hold_after_record, NULL);
    pthread_t t;
    pthread_create(&t, NULL, fn, arg);
    CHECK(wait_flag(&in_hook, 2000), "the held thread recorded its event");
    return t;
}

/* Once the reclaimer queried an event after the queries count (the
 * main thread's later entry, pushed first, taken in), lets thread t push
 * and waits for it. */
static void let_go_after_taken_in(pthread_t t, unsigned long queries)
{
    for (int i = 0; i < 2000 && fake_calls(FAKE_EVENT_QUERY) == queries; i++)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_EVENT_QUERY) > queries, "the later entry taken in "
                                                  "and queried");
    __atomic_store_n(&let_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    fake_set_return_hook(FAKE_EVENT_RECORD, NULL, NULL);
}

struct late_push { void *ptr; cudaStream_t s; cudaError_t err; };
static void *free_held_after_record(void *arg)
{
    struct late_push *lp = arg;
    hold_me = true;
    lp->err = defer_free(lp->ptr, lp->s);
    return NULL;
}

/* Thread A defers a, with work held on s, and is held after its record;
 * the main thread defers b behind later work on s, pushed first; then A
 * pushes, and a's work completes.  Returns b's work, still running. */
static fake_work *free_behind_later_free(void *a, void *b, cudaStream_t s)
{
    fake_work *wa = work_held(s, a);
    struct late_push lp = {a, s, cudaErrorUnknown};
    pthread_t t = start_held_after_record(free_held_after_record, &lp);
    fake_work *wb = work_held(s, b); /* after A's record */
    unsigned long queries = fake_calls(FAKE_EVENT_QUERY);
    CHECK(defer_free(b, s) == cudaSuccess, "defer_free(b): recorded later, "
                                           "pushed first");
    let_go_after_taken_in(t, queries);
    CHECK(lp.err == cudaSuccess, "defer_free(a) after its hold");
    fake_complete(wa); /* a's work done; b's still running */
    return wb;
}

static void scenario_trim_behind_later_free(void)
{
    cudaStream_t s = stream_new();
    void *a = device_alloc(1 << 20), *b = device_alloc(2 << 20);
    fake_work *wb = free_behind_later_free(a, b, s);
    size_t bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess, "defer_trim");
    CHECK(fake_is_released(a) == 1, "trim released a, whose work is done, "
                                    "though b waits before it");
    CHECK(fake_is_released(b) == 0, "b not released while its work runs");
    CHECK(bytes == 1 << 20, "trim's bytes: %zu (a's 1 MiB)", bytes);
    fake_complete(wb);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(b) == 1, "b released after its work");
    cudaStreamDestroy(s);
}

/* The same race with blocks of defer_alloc's (their frees have FIFOs of
 * their own): a's block, its work done, goes back at the trim. */
static void scenario_trim_block_behind_later_free(void)
{
    const size_t MiB = (size_t)1 << 20;
    cudaStream_t s = stream_new();
    void *a = NULL, *b = NULL;
    CHECK(alloc_checked(&a, MiB, s) == cudaSuccess &&
              alloc_checked(&b, 2 * MiB, s) == cudaSuccess,
          "two blocks on s, each a segment of its own");
    fake_work *wb = free_behind_later_free(a, b, s);
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    struct defer_stats st = stats_now();
    CHECK(st.cache_releases == 1 && st.cache_bytes == 2 * MiB,
          "the trim gave a back, whose work is done, though b's free waits "
          "before it (released %llu, cache bytes %llu)",
          ULL(st.cache_releases), ULL(st.cache_bytes));
    fake_complete(wb);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_trim(NULL) == cudaSuccess && stats_now().cache_bytes == 0,
          "b given back once its work is done");
    cudaStreamDestroy(s);
}

/* The same race with callbacks: A's defer_call records first and pushes
 * last, behind B's, whose work still runs when A's is done.  A trim runs
 * no callback ahead of one before it on its stream (cudefer.h: callbacks
 * of one stream run in order): only FIFOs of frees complete behind their
 * head (a mutant that let a trim do so for callbacks ran A first). */
static char order[3];
static _Atomic int nran;
static void note_run(void *arg)
{
    order[atomic_fetch_add(&nran, 1)] = *(const char *)arg;
}

struct late_call { cudaStream_t s; cudaError_t err; };
static void *call_held_after_record(void *arg)
{
    struct late_call *lc = arg;
    hold_me = true;
    lc->err = defer_call(note_run, "A", lc->s);
    return NULL;
}

static void scenario_trim_keeps_callback_order(void)
{
    cudaStream_t s = stream_new();
    fake_work *wa = work_held(s, NULL);
    struct late_call lc = {s, cudaErrorUnknown};
    pthread_t t = start_held_after_record(call_held_after_record, &lc);
    fake_work *wb = work_held(s, NULL); /* after A's record */
    unsigned long queries = fake_calls(FAKE_EVENT_QUERY);
    CHECK(defer_call(note_run, "B", s) == cudaSuccess,
          "defer_call(B): recorded later, pushed first");
    let_go_after_taken_in(t, queries);
    CHECK(lc.err == cudaSuccess, "defer_call(A) after its hold");
    fake_complete(wa); /* A's work done; B's still running */
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    CHECK(atomic_load(&nran) == 0, "no callback ran ahead of B (%d ran)",
          atomic_load(&nran));
    fake_complete(wb);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(atomic_load(&nran) == 2 && order[0] == 'B' && order[1] == 'A',
          "both ran, B first (%d: %.2s)", atomic_load(&nran), order);
    cudaStreamDestroy(s);
}

int main(void)
{
    plan_lazy();
    fork_scenario("trim releases all held memory while others defer",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0 "
                  "CUDEFER_MAX_PENDING=1T",
                  1, 20000, scenario_trim_while_pushing);
    fork_scenario("flush ignores entries deferred after it",
                  "CUDEFER_POLICY=eager", 1, 10000, scenario_later_entry_first);
    fork_scenario("flush ignores entries deferred after it", "", 1, 10000,
                  scenario_later_entry_first);
    fork_scenario("a device failing (not sticky) during a flush is its error",
                  "", 1, 10000, scenario_fail_during_flush);
    fork_scenario("an entry pushed while the reclaimer goes to sleep runs",
                  "CUDEFER_POLL_US=1 CUDEFER_POLL_MAX_US=1", 1, 10000,
                  scenario_push_while_going_to_sleep);
    fork_scenario("trim releases a completed free behind a later one",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0 "
                  "CUDEFER_MAX_PENDING=1T",
                  1, 10000, scenario_trim_behind_later_free);
    fork_scenario("trim gives back a block whose free waits behind a "
                  "later one",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0", 1,
                  10000, scenario_trim_block_behind_later_free);
    fork_scenario("trim runs no callback ahead of an earlier one",
                  "CUDEFER_IDLE_US=10000000 CUDEFER_MAX_DELAY_MS=0", 1, 10000,
                  scenario_trim_keeps_callback_order);
    return 0;
}
