/* SPDX-License-Identifier: MIT */
/* The gate counts submissions in per-thread shards:
 * with more threads than shards (some share one), defer_shutdown must still
 * wait for every submission under way and refuse every later one.  80
 * threads free in a loop, each event record slowed to 200 us so that many
 * submissions are under way when shutdown closes the gate: every free that
 * was accepted is released by shutdown's drain, every refused pointer is
 * still the caller's. */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "thread_shard.h"

#define THREADS 80 /* more than THREAD_SHARDS (64) */
#define PER_THREAD 200

struct freer {
    pthread_t thread;
    cudaStream_t stream;
    void *ptrs[PER_THREAD];
    cudaError_t err[PER_THREAD];
    int made;
};

static struct freer freers[THREADS];
static atomic_int started;

static void *freer_main(void *arg)
{
    struct freer *f = arg;
    atomic_fetch_add(&started, 1);
    for (f->made = 0; f->made < PER_THREAD; f->made++) {
        int i = f->made;
        work_timed(f->stream, 50, f->ptrs[i]);
        f->err[i] = defer_free(f->ptrs[i], f->stream);
        if (f->err[i] != cudaSuccess) {
            f->made++;
            break;
        }
    }
    return NULL;
}

/* Every shard counts, the last one too: a free under way on the thread
 * whose shard is the last (THREAD_SHARDS - 1), held inside its event
 * record, keeps defer_shutdown waiting until it ends; then it is released
 * by the drain.  Threads take shards in turn: one at a time until one has
 * the last. */
static _Thread_local bool blocker;
static atomic_int held, release_it, shut_down;
static cudaError_t last_err = cudaErrorUnknown, shut_err = cudaErrorUnknown;
static cudaStream_t last_stream;
static void *last_ptr;

static void hold_record(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (!blocker)
        return;
    atomic_store(&held, 1);
    while (!atomic_load(&release_it))
        sleep_ms(1);
}

static void *shard_taker(void *arg)
{
    atomic_int *shard = arg;
    thread_shard_mine();
    int mine = thread_here.shard;
    if (mine == THREAD_SHARDS - 1)
        blocker = true;
    atomic_store(shard, mine);
    if (mine == THREAD_SHARDS - 1) {
        last_err = defer_free(last_ptr, last_stream);
    }
    return NULL;
}

static void *shutdown_main(void *arg)
{
    (void)arg;
    shut_err = defer_shutdown();
    atomic_store(&shut_down, 1);
    return NULL;
}

static void s_last_shard_counts(void)
{
    void *first = device_alloc(64);
    CHECK(defer_free(first, 0) == cudaSuccess, "defer_free starts cudefer");
    last_stream = stream_new();
    last_ptr = device_alloc(64);
    work_timed(last_stream, 50, last_ptr);
    fake_set_return_hook(FAKE_EVENT_RECORD, hold_record, NULL);
    pthread_t blocking;
    atomic_int shard = -1;
    for (int i = 0; i <= THREAD_SHARDS; i++) {
        atomic_store(&shard, -1);
        if (pthread_create(&blocking, NULL, shard_taker, &shard))
            bail("pthread_create");
        while (atomic_load(&shard) < 0)
            sleep_ms(1);
        if (atomic_load(&shard) == THREAD_SHARDS - 1)
            break;
        pthread_join(blocking, NULL);
    }
    CHECK(atomic_load(&shard) == THREAD_SHARDS - 1,
          "a thread took the last shard (%d)", atomic_load(&shard));
    for (int i = 0; i < 30000 && !atomic_load(&held); i++)
        sleep_ms(1);
    CHECK(atomic_load(&held), "its defer_free is held in its event record");
    pthread_t shutter;
    if (pthread_create(&shutter, NULL, shutdown_main, NULL))
        bail("pthread_create");
    /* Never returns while the free is under way: any wait shows it. */
    for (int i = 0; i < 200 && !atomic_load(&shut_down); i++)
        sleep_ms(1);
    CHECK(!atomic_load(&shut_down),
          "defer_shutdown waits for the free under way in the last shard");
    atomic_store(&release_it, 1);
    pthread_join(blocking, NULL);
    pthread_join(shutter, NULL);
    fake_set_return_hook(FAKE_EVENT_RECORD, NULL, NULL);
    CHECK(last_err == cudaSuccess, "the held free was accepted (%d)",
          (int)last_err);
    CHECK(shut_err == cudaSuccess, "defer_shutdown (%d)", (int)shut_err);
    CHECK(fake_is_released(last_ptr) == 1,
          "the held free was released by shutdown's drain");
    CHECK(fake_is_released(first) == 1, "the first free too");
    cudaStreamDestroy(last_stream);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a free under way in the last shard holds defer_shutdown",
                  "", 1, 60000, s_last_shard_counts);
    fake_reset(1);
    for (int t = 0; t < THREADS; t++) {
        freers[t].stream = stream_new();
        for (int i = 0; i < PER_THREAD; i++)
            freers[t].ptrs[i] = device_alloc(64);
    }
    /* Start the reclaimer first, so the racers only race the shutdown. */
    void *first = device_alloc(64);
    is_int(defer_free(first, 0), cudaSuccess, "defer_free starts cudefer");
    fake_set_latency(FAKE_EVENT_RECORD, 200000);
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&freers[t].thread, NULL, freer_main, &freers[t]))
            bail("pthread_create");
    while (atomic_load(&started) < THREADS)
        sleep_ms(1);
    sleep_ms(50);
    stderr_capture_begin();
    cudaError_t err = defer_shutdown();
    for (int t = 0; t < THREADS; t++)
        pthread_join(freers[t].thread, NULL);
    stderr_capture_end();
    fake_set_latency(FAKE_EVENT_RECORD, 0);
    is_int(err, cudaSuccess, "defer_shutdown while %d threads free", THREADS);
    int accepted = 0, refused = 0, lost = 0, taken = 0, other = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < freers[t].made; i++) {
            struct freer *f = &freers[t];
            if (f->err[i] == cudaSuccess) {
                accepted++;
                lost += fake_is_released(f->ptrs[i]) != 1;
            } else if (f->err[i] == cudaErrorNotPermitted) {
                refused++;
                taken += fake_is_released(f->ptrs[i]) != 0;
            } else {
                other++;
            }
        }
    diag("%d frees accepted, %d refused", accepted, refused);
    ok(accepted > 0 && refused > 0, "some frees were accepted, the later ones "
       "refused (%d, %d)", accepted, refused);
    is_int(other, 0, "no other error");
    is_int(lost, 0, "every accepted free was released by shutdown's drain");
    is_int(taken, 0, "every refused pointer is still the caller's");
    for (int t = 0; t < THREADS; t++) {
        struct freer *f = &freers[t];
        cudaStreamSynchronize(f->stream);
        for (int i = 0; i < PER_THREAD; i++)
            if (i >= f->made || f->err[i] != cudaSuccess)
                cudaFree(f->ptrs[i]);
        cudaStreamDestroy(f->stream);
    }
    is_int(fake_is_released(first), 1, "the first free too");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
