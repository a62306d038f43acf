/* SPDX-License-Identifier: MIT */
/* The block cache's counters (src/stats.h, Note [Device counters]), called
 * directly as the cache calls them under a device's lock: defer_stats'
 * cache_bytes, cache_free_bytes, cache_mallocs, cache_releases, reused and
 * reused_same_stream are the sums over the devices' slots and the overflow
 * slot of the devices from DEFER_STATS_MAX_DEVICES on, which the fake
 * runtime cannot make (it has 16 devices at most).  Checked: a hit, a free
 * and a new block on a device with a slot write that slot and nothing else
 * (no process-wide counter); random steps on devices 0 .. 99 against a
 * model, each device with a slot and the global sums exact; threads acting
 * for different devices past the slots at once lose no count in the
 * overflow slot they share (a load and store there would). */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cudefer.h"
#include "stats.h"
#include "tap.h"

#define ULL(x) ((unsigned long long)(x))
#define DEVICES 100 /* 0 .. 63 with slots, 64 .. 99 in the overflow slot */

/* What one device's counters should read. */
struct model {
    uint64_t bytes, free_bytes, mallocs, releases, allocs, reused,
        reused_same_stream;
};

static struct model model[DEVICES];

/* Every counter's current values (the slots and the process-wide ones). */
struct all_counters {
    struct stats_device slots[DEFER_STATS_MAX_DEVICES + 1];
    struct stats global;
};

static void all_counters(struct all_counters *a)
{
    memcpy(a->slots, stats_devices, sizeof a->slots);
    memcpy(&a->global, &stats, sizeof a->global);
}

/* The slots that differ between a and b, as a bit mask of the first 64
 * and a flag for the overflow slot; *global: the process-wide counters
 * differ. */
static uint64_t slots_changed(const struct all_counters *a,
                              const struct all_counters *b, bool *overflow,
                              bool *global)
{
    uint64_t mask = 0;
    for (int i = 0; i < DEFER_STATS_MAX_DEVICES; i++)
        if (memcmp(&a->slots[i], &b->slots[i], sizeof a->slots[i]) != 0)
            mask |= UINT64_C(1) << i;
    *overflow = memcmp(&a->slots[DEFER_STATS_MAX_DEVICES],
                       &b->slots[DEFER_STATS_MAX_DEVICES],
                       sizeof a->slots[0]) != 0;
    *global = memcmp(&a->global, &b->global, sizeof a->global) != 0;
    return mask;
}

/* The steps the cache takes, each on device and in the model. */
static void step_new(int device, uint64_t size)
{
    stats_device_count_mallocs(device, 1);
    stats_device_new(device, size);
    model[device].mallocs++;
    model[device].bytes += size;
    model[device].allocs++;
}

static void step_free(int device, uint64_t size)
{
    stats_device_freed(device, size);
    model[device].free_bytes += size;
}

static void step_hit(int device, uint64_t size, bool same_stream)
{
    stats_device_hit(device, size, same_stream);
    model[device].free_bytes -= size;
    model[device].allocs++;
    model[device].reused++;
    model[device].reused_same_stream += same_stream;
}

static void step_release(int device, uint64_t size)
{
    stats_device_left(device, size, true);
    stats_device_count_releases(device, 1);
    model[device].bytes -= size;
    model[device].free_bytes -= size;
    model[device].releases++;
}

static void only_its_slot(void)
{
    struct all_counters before, after;
    bool overflow, global;
    all_counters(&before);
    step_new(3, 4096);
    step_free(3, 4096);
    step_hit(3, 4096, true);
    all_counters(&after);
    uint64_t mask = slots_changed(&before, &after, &overflow, &global);
    is_hex(mask, UINT64_C(1) << 3,
           "device 3's new block, free and hit write its slot alone");
    ok(!overflow, "... not the overflow slot");
    ok(!global, "... nor any process-wide counter");

    all_counters(&before);
    step_new(70, 1000);
    step_free(70, 1000);
    step_hit(70, 1000, false);
    all_counters(&after);
    mask = slots_changed(&before, &after, &overflow, &global);
    is_hex(mask, 0, "device 70's write no device's slot");
    ok(overflow, "... but the overflow slot");
    ok(!global, "... and no process-wide counter");
}

/* defer_stats and each device's counters agree with the model (step says
 * after what). */
static void expect_model(const char *step)
{
    struct model sum = {0};
    bool devices_right = true;
    for (int d = 0; d < DEVICES; d++) {
        const struct model *m = &model[d];
        sum.bytes += m->bytes;
        sum.free_bytes += m->free_bytes;
        sum.mallocs += m->mallocs;
        sum.releases += m->releases;
        sum.reused += m->reused;
        sum.reused_same_stream += m->reused_same_stream;
        if (d >= DEFER_STATS_MAX_DEVICES)
            continue;
        struct defer_device_stats s;
        if (defer_device_stats_get(d, &s) != cudaSuccess ||
            s.cache_bytes != m->bytes || s.cache_free_bytes != m->free_bytes ||
            s.live_bytes != m->bytes - m->free_bytes ||
            s.cache_mallocs != m->mallocs || s.cache_releases != m->releases ||
            s.allocs != m->allocs || s.reused != m->reused) {
            diag("device %d: bytes %llu (expected %llu), free %llu (%llu), "
                 "mallocs %llu (%llu), releases %llu (%llu), allocs %llu "
                 "(%llu), reused %llu (%llu)", d, ULL(s.cache_bytes),
                 ULL(m->bytes), ULL(s.cache_free_bytes), ULL(m->free_bytes),
                 ULL(s.cache_mallocs), ULL(m->mallocs),
                 ULL(s.cache_releases), ULL(m->releases), ULL(s.allocs),
                 ULL(m->allocs), ULL(s.reused), ULL(m->reused));
            devices_right = false;
        }
    }
    ok(devices_right, "%s: each device with a slot reads its own counts",
       step);
    struct defer_stats g;
    defer_stats_get(&g);
    ok(g.cache_bytes == sum.bytes && g.cache_free_bytes == sum.free_bytes &&
           g.cache_mallocs == sum.mallocs &&
           g.cache_releases == sum.releases && g.reused == sum.reused &&
           g.reused_same_stream == sum.reused_same_stream,
       "%s: defer_stats' cache_bytes %llu, cache_free_bytes %llu, "
       "cache_mallocs %llu, cache_releases %llu, reused %llu, "
       "reused_same_stream %llu are the sums over all %d devices (%llu, "
       "%llu, %llu, %llu, %llu, %llu)", step, ULL(g.cache_bytes),
       ULL(g.cache_free_bytes), ULL(g.cache_mallocs), ULL(g.cache_releases),
       ULL(g.reused), ULL(g.reused_same_stream), DEVICES, ULL(sum.bytes),
       ULL(sum.free_bytes), ULL(sum.mallocs), ULL(sum.releases),
       ULL(sum.reused), ULL(sum.reused_same_stream));
}

/* Per device, the blocks of the random steps: live, or free. */
#define BLOCKS 8
struct blocks {
    uint64_t size[BLOCKS];
    int state[BLOCKS]; /* 0: none, 1: live, 2: free */
};

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Steps as the cache makes them, on random devices and blocks: a new
 * block, a free, a hit, a release of a free block. */
static void random_steps(void)
{
    static struct blocks blocks[DEVICES];
    for (int i = 0; i < 20000; i++) {
        int d = (int)(next_random() % DEVICES);
        int k = (int)(next_random() % BLOCKS);
        struct blocks *b = &blocks[d];
        if (b->state[k] == 0) {
            b->size[k] = 512 * (1 + next_random() % 4096);
            step_new(d, b->size[k]);
            b->state[k] = 1;
        } else if (b->state[k] == 1) {
            step_free(d, b->size[k]);
            b->state[k] = 2;
        } else if (next_random() % 2) {
            step_hit(d, b->size[k], next_random() % 2);
            b->state[k] = 1;
        } else {
            step_release(d, b->size[k]);
            b->state[k] = 0;
        }
    }
    expect_model("20,000 random steps on devices 0 .. 99");
}

/* Each thread acts for one device past the slots: all of them write the
 * overflow slot at once, each with its own device's lock (none here: one
 * thread a device). */
#define THREADS 4
#define ROUNDS 100000

static void *overflow_writer(void *arg)
{
    int device = DEFER_STATS_MAX_DEVICES + 10 + (int)(intptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        stats_device_new(device, 512);
        stats_device_freed(device, 512);
        stats_device_hit(device, 512, i % 2 == 0);
        stats_device_freed(device, 512);
        stats_device_left(device, 512, true);
    }
    return NULL;
}

static void overflow_shared(void)
{
    struct defer_stats before, after;
    defer_stats_get(&before);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, overflow_writer, (void *)(intptr_t)i))
            bail("pthread_create");
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    defer_stats_get(&after);
    uint64_t n = (uint64_t)THREADS * ROUNDS;
    is_int((long long)(after.reused - before.reused), (long long)n,
           "%d threads for devices past the slots: every hit counted in "
           "reused", THREADS);
    is_int((long long)(after.reused_same_stream - before.reused_same_stream),
           (long long)(n / 2), "... half of them on their stream");
    is_int((long long)(after.cache_bytes - before.cache_bytes), 0,
           "... cache_bytes back where it was");
    is_int((long long)(after.cache_free_bytes - before.cache_free_bytes), 0,
           "... and cache_free_bytes");
    uint64_t allocs = 2 * n; /* the threads' hand-outs */
    for (int d = DEFER_STATS_MAX_DEVICES; d < DEVICES; d++)
        allocs += model[d].allocs;
    is_int((long long)atomic_load(
               &stats_devices[DEFER_STATS_MAX_DEVICES].allocs),
           (long long)allocs,
           "... and the overflow slot's allocs every hand-out past the "
           "slots");
}

/* latency_p50_us: the upper bound of the bucket that holds the median
 * (bucket i: latencies below 2^i us; 8us is in [8, 16)), no more than
 * latency_max_us; a median on a bucket's last latency (half the count
 * exactly) is that bucket's.  Latencies recorded directly, as the
 * reclaimer records them: nothing else here records any. */
static void latency_median(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    is_int((long long)st.latency_p50_us, 0, "no latency: latency_p50_us 0");
    for (int i = 0; i < 3; i++)
        stats_record_latency(10 * 1000); /* 10us: [8, 16) */
    stats_record_latency(8 * 1000);      /* 8us: [8, 16) too */
    for (int i = 0; i < 3; i++)
        stats_record_latency(1000 * 1000); /* 1000us: [512, 1024) */
    defer_stats_get(&st);
    is_int((long long)st.latency_max_us, 1000, "latency_max_us 1000");
    is_int((long long)st.latency_p50_us, 16,
           "4 of 7 latencies in [8us, 16us): latency_p50_us 16");
    stats_record_latency(1000 * 1000);
    defer_stats_get(&st);
    is_int((long long)st.latency_p50_us, 16,
           "4 of 8 in [8us, 16us): the median's bucket is still theirs: 16");
    stats_record_latency(3000 * 1000); /* [2048, 4096) */
    defer_stats_get(&st);
    is_int((long long)st.latency_p50_us, 1024,
           "4 of 9 below 16us, 8 below 1024us: latency_p50_us 1024");
}

int main(void)
{
    plan_lazy();
    latency_median();
    expect_model("before any count");
    only_its_slot();
    expect_model("after devices 3 and 70");
    random_steps();
    overflow_shared();
    return 0;
}
