/* SPDX-License-Identifier: MIT */
/* Free batches (src/free_batch.h) against flushes that run beside other
 * threads' seals: a flush waits for a seal that took earlier frees' claims
 * and has not pushed them yet, waits for no seal begun after it looked,
 * and seals once more where a seal gave its claims back.  Age sealing is
 * off (free_batch_set_age_ns), so only a full batch seals: a tick of the
 * coarse clock between two frees cannot split a batch these tests fill.
 * Another thread's first free on the legacy stream asks the stream who it
 * is and takes the unbatched path, so each thread frees once before. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>

#include "free_batch.h"
#include "helpers.h"

#define BATCH 4
#define KiB ((size_t)1024)

/* Frees first (unbatched: the thread learns the legacy stream's
 * identity), says so, then frees p when told: it fills the batch. */
struct sealer {
    void *first, *p;
    cudaError_t err;
    _Atomic int stage; /* 1: first freed; 2: go on */
};

static void *seal_when_told(void *arg)
{
    struct sealer *z = arg;
    defer_free(z->first, NULL);
    atomic_store(&z->stage, 1);
    while (atomic_load(&z->stage) != 2)
        sleep_ms(1);
    z->err = defer_free(z->p, NULL);
    return NULL;
}

/* BATCH blocks and a thread holding the last, whose first free was
 * flushed; this thread's BATCH - 1 frees wait in the batch.  Returns the
 * released count before those frees. */
static uint64_t start_sealer(struct sealer *z, pthread_t *t, void **p)
{
    void *first = NULL;
    alloc_checked(&first, 72 * KiB, NULL);
    for (int i = 0; i < BATCH; i++)
        alloc_checked(&p[i], 72 * KiB, NULL);
    *z = (struct sealer){.first = first, .p = p[BATCH - 1]};
    pthread_create(t, NULL, seal_when_told, z);
    while (atomic_load(&z->stage) != 1)
        sleep_ms(1);
    if (defer_flush() != cudaSuccess)
        bail("defer_flush failed");
    uint64_t released = stats_now().released;
    for (int i = 0; i < BATCH - 1; i++)
        defer_free(p[i], NULL);
    if (free_batch_waiting() != BATCH - 1)
        bail("%zu claims wait, not %d", free_batch_waiting(), BATCH - 1);
    return released;
}

/* Tells the sealer to fill the batch, and waits (not sleeps: on a loaded
 * machine the thread may not run for tens of ms; a sleep of 30 ms failed
 * on CI) until its seal took it. */
static void let_seal(struct sealer *z)
{
    atomic_store(&z->stage, 2);
    double t0 = now_ms();
    while (free_batch_waiting() != 0 && now_ms() - t0 < 10000)
        sleep_ms(1);
    ok(free_batch_waiting() == 0, "the other thread's seal took the batch");
}

/* A flush that begins while another thread's seal has taken the batch (this
 * thread's frees' claims in it) and is in its 100 ms cudaEventRecord waits
 * for the push: this thread's frees are released when it returns (before
 * the fix the flush found the batch empty and returned first).  Should
 * this thread be late past the record, the flush begins after the push:
 * the check still holds. */
static void test_flush_waits_for_seal(void)
{
    void *p[BATCH];
    struct sealer z;
    pthread_t t;
    uint64_t released = start_sealer(&z, &t, p);
    fake_set_latency(FAKE_EVENT_RECORD, 100000000); /* 100 ms */
    let_seal(&z);
    is_int(defer_flush(), cudaSuccess, "flush while another thread seals");
    ok(stats_now().released >= released + BATCH,
       "this thread's frees are released when it returns (%llu of %d)",
       ULL(stats_now().released - released), BATCH);
    pthread_join(t, NULL);
    fake_set_latency(FAKE_EVENT_RECORD, 0);
    is_int(z.err, cudaSuccess, "the sealing free was accepted");
}

/* The other thread's seal can neither record its event nor wait for the
 * stream: it gives the claims (this thread's frees among them) back to the
 * batch while the flush waits for it.  The flush seals once more: it
 * returns with nothing left in the batch and every free released (before
 * the fix it returned cudaSuccess with 4 claims back in the batch and 4
 * frees pending). */
static void test_flush_reseals_given_back(void)
{
    void *p[BATCH];
    struct sealer z;
    pthread_t t;
    uint64_t released = start_sealer(&z, &t, p);
    fake_set_latency(FAKE_EVENT_RECORD, 100000000);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorLaunchOutOfResources, 0, 1);
    stderr_capture_begin();
    let_seal(&z);
    cudaError_t err = defer_flush();
    pthread_join(t, NULL);
    const char *said = stderr_capture_end();
    fake_set_latency(FAKE_EVENT_RECORD, 0);
    fake_fail_clear();
    is_int(err, cudaSuccess, "the flush succeeds");
    ok(strstr(said, "until a later seal") != NULL, "the failed seal said so");
    ok(free_batch_waiting() == 0 && stats_now().released >= released + BATCH,
       "nothing left in the batch (%zu), every free released (%llu of %d)",
       free_batch_waiting(), ULL(stats_now().released - released), BATCH);
}

/* A seal's take reads the flushes' generation, and a flush F1 turns it
 * before the take counts its claims (the take stalled there by the test
 * hook): F1 needs nothing of it (its scan came first), but a flush F2 after
 * the frees whose claims the take holds must wait for their seal.  The
 * failure guarded against: the count goes to the generation F1 had closed,
 * F2 waits on the other and returns with those frees unpushed. */
static _Atomic int stall; /* 1: armed; 2: a take stalls; 3: go on */

static void stall_take(void)
{
    int armed = 1;
    if (!atomic_compare_exchange_strong(&stall, &armed, 2))
        return;
    while (atomic_load(&stall) != 3)
        sleep_ms(1);
}

static int flushed;

static void test_take_across_a_turn(void)
{
    void *p[BATCH], *first = NULL, *x0 = NULL;
    pthread_t t, f1;
    alloc_checked(&first, 72 * KiB, NULL);
    alloc_checked(&x0, 72 * KiB, NULL);
    for (int i = 0; i < BATCH; i++)
        alloc_checked(&p[i], 72 * KiB, NULL);
    struct sealer z = {.first = first, .p = p[BATCH - 1]};
    pthread_create(&t, NULL, seal_when_told, &z);
    while (atomic_load(&z.stage) != 1)
        sleep_ms(1);
    if (defer_flush() != cudaSuccess)
        bail("defer_flush failed");
    defer_free(x0, NULL); /* F1 seals this one: 1 s in its record */
    fake_set_latency(FAKE_EVENT_RECORD, 1000000000);
    flush_in_thread(&f1, &flushed);
    for (int i = 0; i < 10000 && free_batch_waiting() != 0; i++)
        sleep_ms(1);
    uint64_t released = stats_now().released;
    for (int i = 0; i < BATCH - 1; i++) /* after F1's scan */
        defer_free(p[i], NULL);
    atomic_store(&stall, 1);
    free_batch_set_take_hook(stall_take);
    atomic_store(&z.stage, 2); /* the sealer fills the batch */
    for (int i = 0; i < 10000 && atomic_load(&stall) != 2; i++)
        sleep_ms(1);
    ok(atomic_load(&stall) == 2 &&
           __atomic_load_n(&flushed, __ATOMIC_SEQ_CST) == 0,
       "the sealer's take stalls after reading the generation, F1 still in "
       "its record");
    ok(wait_flag(&flushed, 10000) &&
           __atomic_load_n(&flushed, __ATOMIC_SEQ_CST) == 1,
       "F1 turned the generation and returned");
    fake_set_latency(FAKE_EVENT_RECORD, 200000000); /* the sealer's: 200 ms */
    atomic_store(&stall, 3);
    is_int(defer_flush(), cudaSuccess, "F2");
    ok(stats_now().released >= released + BATCH,
       "F2 returns with the frees that returned before it released (%llu of "
       "%d)", ULL(stats_now().released - released), BATCH);
    pthread_join(t, NULL);
    pthread_join(f1, NULL);
    free_batch_set_take_hook(NULL);
    fake_set_latency(FAKE_EVENT_RECORD, 0);
}

/* Four threads free on the legacy stream without pause (batches of 2, so
 * they seal by turns, and every record takes 20 ms: a seal of theirs is
 * nearly always in flight).  A flush waits for the seals under way when
 * it looked only, not for later ones: it returns while they still free
 * (not until they stop, here after 10 s). */
#define CHURNERS 4
static _Atomic int churn_stop, churning;

static void *churn(void *arg)
{
    (void)arg;
    void *first = NULL;
    alloc_checked(&first, 4 * KiB, NULL);
    defer_free(first, NULL); /* unbatched: learns the stream */
    atomic_fetch_add(&churning, 1);
    while (!atomic_load(&churn_stop)) {
        void *p = NULL;
        alloc_checked(&p, 4 * KiB, NULL);
        defer_free(p, NULL);
    }
    return NULL;
}

static void *stop_churn_later(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10000 && !atomic_load(&churn_stop); i++)
        sleep_ms(1);
    atomic_store(&churn_stop, 1);
    return NULL;
}

static void scenario_flush_not_starved(void)
{
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env("CUDEFER_FREE_BATCH=2 CUDEFER_MAX_DELAY_MS=0 "
                        "CUDEFER_IDLE_US=10000000");
        free_batch_set_age_ns(UINT64_MAX);
        void *warm = NULL;
        alloc_checked(&warm, 4 * KiB, NULL);
        defer_free(warm, NULL);
        CHECK(defer_flush() == cudaSuccess, "first flush");
        fake_set_latency(FAKE_EVENT_RECORD, 20000000); /* 20 ms */
        pthread_t t[CHURNERS], stopper;
        for (int i = 0; i < CHURNERS; i++)
            pthread_create(&t[i], NULL, churn, NULL);
        while (atomic_load(&churning) < CHURNERS)
            sleep_ms(1);
        sleep_ms(50);
        pthread_create(&stopper, NULL, stop_churn_later, NULL);
        double t0 = now_ms();
        cudaError_t err = defer_flush();
        double took = now_ms() - t0;
        int stopped = atomic_load(&churn_stop);
        atomic_store(&churn_stop, 1);
        for (int i = 0; i < CHURNERS; i++)
            pthread_join(t[i], NULL);
        pthread_join(stopper, NULL);
        fake_set_latency(FAKE_EVENT_RECORD, 0);
        diag("the flush took %.0f ms", took);
        CHECK(err == cudaSuccess, "the flush succeeds");
        CHECK(!stopped, "the flush returned while the other threads still "
                        "freed (after %.0f ms; they are stopped after 10 s)",
              took);
        CHECK(defer_shutdown() == cudaSuccess, "shutdown");
        CHECK(fake_violations() == 0, "oracle");
        scenario_child_end();
    }
    int status;
    ok(wait_child(pid, 60000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a flush beside four threads that free without pause returns "
       "while they do");
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_FREE_BATCH=4 CUDEFER_MAX_DELAY_MS=0 "
                    "CUDEFER_IDLE_US=10000000");
    fake_reset(1);
    scenario_flush_not_starved(); /* forks: before this process's first call */
    free_batch_set_age_ns(UINT64_MAX);
    test_flush_waits_for_seal();
    test_flush_reseals_given_back();
    test_take_across_a_turn();
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
