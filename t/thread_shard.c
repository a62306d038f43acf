/* SPDX-License-Identifier: MIT */
/* Thread shards (src/thread_shard.h): each thread counts in one shard of
 * its own while there are no more threads than shards, keeps it for good,
 * and the statistics add up across threads: blocks freed on one thread and
 * handed out again on another count as reused, and cache_free_bytes (a
 * gauge, kept per device, never in shards: a shard's difference could make
 * a snapshot read less than zero) comes back to where it was. */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "thread_shard.h"

#define THREADS 80 /* more than THREAD_SHARDS */
#define BLOCKS 8
#define BLOCK_BYTES ((size_t)1 << 20)

static struct thread_shard *first[THREADS], *again[THREADS];
static atomic_int arrived;

static void *take_shard(void *arg)
{
    int t = (int)(intptr_t)arg;
    first[t] = thread_shard_mine();
    atomic_fetch_add(&arrived, 1);
    while (atomic_load(&arrived) < THREADS) /* all alive at once */
        sleep_ms(1);
    again[t] = thread_shard_mine();
    return NULL;
}

static void shards_taken_in_turn(void)
{
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&threads[t], NULL, take_shard, (void *)(intptr_t)t))
            bail("pthread_create");
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    int kept = 0, inside = 0;
    bool used[THREAD_SHARDS] = {false};
    for (int t = 0; t < THREADS; t++) {
        kept += first[t] == again[t];
        ptrdiff_t i = first[t] - thread_shards;
        if (i >= 0 && i < THREAD_SHARDS) {
            inside++;
            used[i] = true;
        }
    }
    int distinct = 0;
    for (int i = 0; i < THREAD_SHARDS; i++)
        distinct += used[i];
    is_int(kept, THREADS, "every thread keeps its shard");
    is_int(inside, THREADS, "every shard is one of thread_shards");
    is_int(distinct, THREAD_SHARDS,
           "%d threads alive at once use all %d shards (taken in turn)",
           THREADS, THREAD_SHARDS);
}

struct taker {
    cudaStream_t stream;
    void *got[BLOCKS];
    cudaError_t err[BLOCKS];
};

static void *take_blocks(void *arg)
{
    struct taker *k = arg;
    for (int i = 0; i < BLOCKS; i++)
        k->err[i] = alloc_checked(&k->got[i], BLOCK_BYTES, k->stream);
    return NULL;
}

static void counts_add_up_across_threads(void)
{
    cudaStream_t s = stream_new();
    void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        if (alloc_checked(&blocks[i], BLOCK_BYTES, s) != cudaSuccess)
            bail("defer_alloc");
    struct defer_stats before, parked, after;
    defer_stats_get(&before);
    fake_work *w = work_held(s, blocks[0]);
    for (int i = 0; i < BLOCKS; i++)
        is_int(defer_free(blocks[i], s), cudaSuccess, "free block %d on s", i);
    defer_stats_get(&parked);
    is_int((long long)(parked.cache_free_bytes - before.cache_free_bytes),
           (long long)(BLOCKS * BLOCK_BYTES), "the freed blocks count as free bytes");
    /* Another thread takes them back on s (stream order: at once), the
     * device's counters counting the hits and subtracting the bytes. */
    struct taker k = {.stream = s};
    pthread_t t;
    if (pthread_create(&t, NULL, take_blocks, &k))
        bail("pthread_create");
    pthread_join(t, NULL);
    int hits = 0;
    for (int i = 0; i < BLOCKS; i++)
        hits += k.err[i] == cudaSuccess;
    is_int(hits, BLOCKS, "the other thread got %d blocks", BLOCKS);
    defer_stats_get(&after);
    is_int((long long)(after.reused - before.reused), BLOCKS,
           "reused counts the other thread's hits");
    is_int((long long)(after.reused_same_stream - before.reused_same_stream),
           BLOCKS,
           "all on the same stream");
    is_int((long long)after.cache_free_bytes,
           (long long)before.cache_free_bytes,
           "free bytes back where they were");
    fake_complete(w);
    for (int i = 0; i < BLOCKS; i++)
        defer_free(k.got[i], s);
    is_int(defer_flush(), cudaSuccess, "defer_flush");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    shards_taken_in_turn();
    counts_add_up_across_threads();
    is_int(defer_shutdown(), cudaSuccess, "defer_shutdown");
    is_int(fake_violations(), 0, "oracle: nothing reused early");
    return 0;
}
