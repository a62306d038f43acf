/* SPDX-License-Identifier: MIT */
/* A seeded test of defer_alloc on a device that fills up: a 48 MiB fake
 * device, its pool reserving in 2 MiB granules, released addresses given
 * out again.  t/stress runs on the fake's 80 GiB devices and never runs
 * out, so it never reaches what only a full device does: a miss handing
 * cached pool blocks back to the pool (free ones, and ones pending on the
 * request's stream, merged pieces of which may still wait for their
 * work), the trim and retry of a request that ran out of memory, and the
 * out-of-memory result itself.
 *
 * One thread allocates blocks of random sizes (whole MiB to 6 MiB, small
 * multiples of 512, anything to 3 MiB) with defer_alloc or
 * defer_pluggable_alloc_status on the legacy stream or created ones,
 * sometimes behind held work, and frees them every way: on their stream,
 * after defer_record_stream with held work on the recorded stream, on
 * another stream after an event wait, two at once with defer_free_n, with
 * defer_pluggable_free; held work completes in random order, trims come
 * between.  Each knob set (block splitting, rounding, no memory pools,
 * free batches on the legacy stream) runs in a child of its own: one TAP
 * result each.
 *
 * Checked as it goes: every block 512-aligned and inside a live
 * allocation of the device, overlapping no other live block; the oracle
 * checks every hand-out and release (fake_cuda.h); out of memory only
 * after a trim (with pools, seen as the pool's) and when the memory pinned
 * by live blocks and by frees that may still be pending, with the
 * request, could not fit; and now and then, after an
 * out of memory, the device emptied (held work completed, every block
 * freed, a trim): no byte left cached, and the same request succeeds.
 * At the end a flush leaves every cached byte free, a trim none, and no
 * allocation is left.  Each set must also have run out of memory, and
 * with pools have handed blocks back on a miss: a change that stops the
 * test from reaching those paths fails it.
 *
 *   t/alloc_small_device [--seed S] [--only K] [--steps N]
 *
 * The seed is printed first (a new one each run unless --seed); it fixes
 * each set's sequence of operations (not the reclaimer's timing), so a
 * failure prints the command that replays its set (--only K).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define DEVICE_MEMORY ((size_t)48 << 20)
#define GRANULE ((size_t)2 << 20)
#define NSLOTS 48      /* live blocks at most */
#define NSTREAMS 5     /* the legacy stream and 4 created ones */
#define MAX_OUTSTANDING 512 /* held work not yet completed */
#define DEFAULT_STEPS 2000

struct knob_set {
    const char *title;
    const char *env;
    bool no_pools;      /* fake_set_memory_pools(0, 0): cudaMalloc blocks */
    unsigned legacy_pct; /* requests on the legacy stream, else any */
};

static const struct knob_set sets[] = {
    {"defaults", "", false, 0},
    {"splitting from 512 bytes", "CUDEFER_SPLIT_MIN=512", false, 0},
    {"one size class per power of two", "CUDEFER_ROUND_DIVISIONS=1", false, 0},
    {"256 size classes per power of two", "CUDEFER_ROUND_DIVISIONS=256", false,
     0},
    {"no memory pools: cudaMalloc blocks", "", true, 0},
    {"no memory pools, splitting from 512 bytes", "CUDEFER_SPLIT_MIN=512",
     true, 0},
    {"free batches of 4, mostly the legacy stream", "CUDEFER_FREE_BATCH=4",
     false, 70},
    {"the legacy stream only", "", false, 100},
};
#define NSETS ((int)(sizeof sets / sizeof sets[0]))

static uint64_t seed;
static unsigned long steps = DEFAULT_STEPS;
static const struct knob_set *cur; /* the set the child runs */
static int cur_index;

/* ---- random numbers: splitmix64, one sequence per set ----------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t rng_state;

static uint32_t below(uint32_t n)
{
    rng_state += UINT64_C(0x9e3779b97f4a7c15);
    return (uint32_t)(((mix64(rng_state) >> 32) * n) >> 32);
}

static bool percent(uint32_t pct)
{
    return below(100) < pct;
}

/* ---- the run's state (the child's) ---------------------------------------- */

struct slot {
    void *p;        /* NULL: empty */
    size_t bytes;   /* asked for */
    int s;          /* the stream it was allocated on */
};

/* A free that may still be pending, and with it its allocation (cut
 * blocks: a segment goes back whole, only once no piece is live or
 * pending). */
struct freed {
    void *p;
    size_t bytes;
    unsigned long long serial; /* its allocation's */
    void *base;
    size_t size;
    unsigned mask;  /* the streams it was freed, recorded or allocated on */
};

static cudaStream_t st[NSTREAMS];
static struct slot slots[NSLOTS];
static fake_work **held_all;      /* every held work launched, by id - 1 */
static size_t nheld_all, cap_held_all, low_held; /* below: all done */
static fake_work *outstanding[MAX_OUTSTANDING]; /* not yet completed */
static size_t noutstanding;
/* Per stream: how many held works were launched before its latest free or
 * record.  A block freed on a created stream may share its event with the
 * thread's later frees there (stream_lane.h), so it may stay pending until
 * the work before any of them is done: the latest one bounds them all. */
static size_t last_free_held[NSTREAMS];
static struct freed *freed;
static size_t nfreed, cap_freed;
static cudaEvent_t ev;

static struct {
    unsigned long allocs, oom, retried, retried_ok, handbacks, drains,
        frees, completed, trims, pinned_max;
} count;

static struct defer_device_stats dstats(void)
{
    struct defer_device_stats d;
    memset(&d, 0, sizeof d);
    CHECK(defer_device_stats_get(0, &d) == cudaSuccess,
          "defer_device_stats_get");
    return d;
}

static int pick_stream(void)
{
    if (cur->legacy_pct > 0 && percent(cur->legacy_pct))
        return 0;
    return (int)below(NSTREAMS);
}

/* Whole MiB to 6 MiB, multiples of 512 to 20 KiB, or anything to 3 MiB. */
static size_t random_size(void)
{
    if (below(4) == 0)
        return (size_t)(below(6) + 1) << 20;
    if (below(3) == 0)
        return (size_t)512 * (below(40) + 1);
    return (size_t)below(3u << 20) + 1;
}

static void hold(int s, void *p)
{
    if (noutstanding == MAX_OUTSTANDING)
        return;
    fake_work *w = work_held(st[s], p);
    if (nheld_all == cap_held_all) {
        cap_held_all = cap_held_all ? 2 * cap_held_all : 1024;
        held_all = realloc(held_all, cap_held_all * sizeof *held_all);
        if (held_all == NULL)
            sysbail("realloc");
    }
    held_all[nheld_all++] = w;
    outstanding[noutstanding++] = w;
}

/* How many held works, oldest first, are done: every held work launched
 * before a free with a later one still pending may hold that free up. */
static size_t held_done_prefix(void)
{
    while (low_held < nheld_all && fake_work_done(held_all[low_held]))
        low_held++;
    return low_held;
}

static void complete_one(void)
{
    size_t k = below((uint32_t)noutstanding);
    fake_complete(outstanding[k]);
    outstanding[k] = outstanding[--noutstanding];
    count.completed++;
}

static void complete_all(void)
{
    while (noutstanding > 0)
        complete_one();
}

/* ---- frees ------------------------------------------------------------------ */

/* Block p of bytes is being freed, mask its streams: noted, pinned_bytes
 * says while it may be pending. */
static void note_free(void *p, size_t bytes, unsigned mask)
{
    for (int x = 0; x < NSTREAMS; x++)
        if (mask & (1u << x))
            last_free_held[x] = nheld_all;
    if (nfreed == cap_freed) {
        cap_freed = cap_freed ? 2 * cap_freed : 256;
        freed = realloc(freed, cap_freed * sizeof *freed);
        if (freed == NULL)
            sysbail("realloc");
    }
    struct freed *f = &freed[nfreed++];
    *f = (struct freed){p, bytes, fake_allocation_serial(p), NULL, 0, mask};
    fake_allocation_of(p, &f->base, &f->size);
    count.frees++;
}

/* Block i is being freed, mask its streams: noted, its slot emptied. */
static void freeing(int i, unsigned mask)
{
    note_free(slots[i].p, slots[i].bytes, mask);
    slots[i].p = NULL;
}

/* Free block i one of the ways. */
static void free_block(int i)
{
    void *p = slots[i].p;
    size_t bytes = slots[i].bytes;
    int s = slots[i].s, t = (int)below(NSTREAMS), j;
    cudaError_t err = cudaSuccess;
    switch (below(6)) {
    case 0: /* used on another created stream too, recorded there */
        if (t != s && t != 0) {
            err = defer_record_stream(p, st[t]);
            CHECK(err == cudaSuccess, "defer_record_stream(%p): %s", p,
                  cudaGetErrorName(err));
            if (percent(50))
                hold(t, p);
        }
        freeing(i, 1u << s | 1u << t);
        err = defer_free(p, st[s]);
        break;
    case 1: /* freed on a stream that waits for its own through an event */
        CHECK(cudaEventRecord(ev, st[s]) == cudaSuccess &&
              cudaStreamWaitEvent(st[t], ev, 0) == cudaSuccess,
              "an event wait");
        if (percent(50))
            hold(t, p);
        freeing(i, 1u << s | 1u << t);
        err = defer_free(p, st[t]);
        break;
    case 2: /* with another block of its stream, in one call */
        j = (int)below(NSLOTS);
        if (j != i && slots[j].p != NULL && slots[j].s == s) {
            void *two[2] = {p, slots[j].p};
            freeing(i, 1u << s);
            freeing(j, 1u << s);
            err = defer_free_n(two, 2, st[s]);
        } else {
            freeing(i, 1u << s);
            err = defer_free(p, st[s]);
        }
        break;
    case 3: /* PyTorch's way: no error returned (one would be said) */
        freeing(i, 1u << s);
        defer_pluggable_free(p, percent(50) ? bytes : 0, 0, st[s]);
        break;
    default:
        freeing(i, 1u << s);
        err = defer_free(p, st[s]);
    }
    CHECK(err == cudaSuccess, "a free of %p: %s", p, cudaGetErrorName(err));
}

/* ---- out of memory ------------------------------------------------------------ */

/* The bytes of the allocations that cudefer could not have given back:
 * those holding a live block, or a block whose free may still wait for
 * held work: any launched before the latest free or record on one of its
 * streams and not done, or on the legacy stream any at all (its free batch
 * records its event when sealed, by the out of memory's trim at the
 * latest, and the legacy stream waits for the other streams' work).  More
 * than is pinned, never less: the check may miss an out of memory that
 * should not be, never blame one that may.  Frees whose allocation went
 * are forgotten. */
static size_t pinned_bytes(void)
{
    size_t done = held_done_prefix(), kept = 0, n = 0, total = 0;
    struct { void *base; size_t size; } *seen =
        malloc((nfreed + NSLOTS) * sizeof *seen);
    if (seen == NULL)
        sysbail("malloc");
    for (size_t k = 0; k < nfreed; k++) {
        struct freed *f = &freed[k];
        if (fake_serial_released(f->serial) == 1)
            continue;
        freed[kept++] = *f;
        size_t before = f->mask & 1u ? nheld_all : 0;
        for (int x = 0; x < NSTREAMS; x++)
            if ((f->mask & (1u << x)) && last_free_held[x] > before)
                before = last_free_held[x];
        if (done >= before)
            continue;
        seen[n].base = f->base;
        seen[n++].size = f->size;
    }
    nfreed = kept;
    for (int i = 0; i < NSLOTS; i++) {
        if (slots[i].p == NULL)
            continue;
        seen[n].base = NULL;
        fake_allocation_of(slots[i].p, &seen[n].base, &seen[n].size);
        n++;
    }
    /* Each allocation once, at the largest size seen for its address (an
     * old one's, reused by a smaller one, counts more: never less). */
    for (size_t a = 0; a < n; a++) {
        bool first = true;
        size_t size = seen[a].size;
        for (size_t b = 0; b < n; b++) {
            if (seen[b].base != seen[a].base)
                continue;
            if (b < a)
                first = false;
            if (seen[b].size > size)
                size = seen[b].size;
        }
        if (first)
            total += size;
    }
    free(seen);
    return total;
}

/* After an out of memory for bytes on stream s: every held work completed,
 * every block freed on its stream, a trim: nothing may stay cached, and
 * the same request must succeed on the emptied device. */
static void empty_and_retry(size_t bytes, int s)
{
    complete_all();
    for (int i = 0; i < NSLOTS; i++)
        if (slots[i].p != NULL) {
            void *p = slots[i].p;
            freeing(i, 1u << slots[i].s);
            CHECK(defer_free(p, st[slots[i].s]) == cudaSuccess,
                  "a free of %p to empty the device", p);
        }
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    struct defer_device_stats d = dstats();
    CHECK(d.cache_bytes == 0 && d.live_bytes == 0,
          "with no block live and no work pending, a trim leaves nothing "
          "cached: %llu bytes, %llu live", ULL(d.cache_bytes),
          ULL(d.live_bytes));
    void *p = NULL;
    cudaError_t err = alloc_checked(&p, bytes, st[s]);
    CHECK(err == cudaSuccess && p != NULL, "after out of memory for %zu "
          "bytes on stream %d, the same request on the emptied device: %s",
          bytes, s, cudaGetErrorName(err));
    if (err == cudaSuccess && p != NULL) {
        note_free(p, bytes, 1u << s);
        CHECK(defer_free(p, st[s]) == cudaSuccess, "its free");
    }
    count.drains++;
}

/* ---- allocation ------------------------------------------------------------- */

/* A block for slot i, checked; out of memory, checked too. */
static void allocate(int i)
{
    size_t bytes = random_size();
    int s = pick_stream();
    bool pluggable = percent(25);
    unsigned long mallocs = fake_thread_calls(FAKE_MALLOC) +
                            fake_thread_calls(FAKE_MALLOC_ASYNC);
    unsigned long frees = fake_thread_calls(FAKE_FREE_ASYNC) +
                          fake_thread_calls(FAKE_FREE);
    unsigned long pool_trims = fake_calls(FAKE_MEM_POOL_TRIM);
    void *p = NULL;
    cudaError_t err;
    if (pluggable) {
        err = defer_pluggable_alloc_status(&p, bytes, 0, st[s]);
        if (err == cudaSuccess && p != NULL)
            fake_oracle_handout_range(p, bytes, st[s]);
    } else {
        err = alloc_checked(&p, bytes, st[s]);
    }
    /* On this thread, a miss's only frees are its hand-back to the pool
     * (the reclaimer makes the trim's); two tries of a new block are the
     * trim and retry of an out of memory. */
    mallocs = fake_thread_calls(FAKE_MALLOC) +
              fake_thread_calls(FAKE_MALLOC_ASYNC) - mallocs;
    count.handbacks += fake_thread_calls(FAKE_FREE_ASYNC) +
                       fake_thread_calls(FAKE_FREE) - frees;
    count.retried += mallocs >= 2;
    if (err == cudaErrorMemoryAllocation) {
        CHECK(p == NULL, "out of memory leaves NULL, not %p", p);
        /* Its trim is seen in the pool's (the trim of a set without pools
         * has none to make). */
        CHECK(cur->no_pools ||
              fake_calls(FAKE_MEM_POOL_TRIM) > pool_trims,
              "out of memory for %zu bytes on stream %d with no trim of "
              "the pool first", bytes, s);
        size_t pinned = pinned_bytes(), exact = (bytes + 511) & ~(size_t)511;
        if (pinned > count.pinned_max)
            count.pinned_max = pinned;
        CHECK(pinned + exact > DEVICE_MEMORY, "out of memory for %zu bytes "
              "on stream %d, with only %zu bytes of the %zu pinned", bytes,
              s, pinned, DEVICE_MEMORY);
        /* The first time, then one in 16. */
        if (count.oom++ == 0 || percent(6))
            empty_and_retry(bytes, s);
        return;
    }
    if (!CHECK(err == cudaSuccess && p != NULL, "%s(%zu bytes, stream %d): "
               "%s, %p", pluggable ? "defer_pluggable_alloc_status"
               : "defer_alloc", bytes, s, cudaGetErrorName(err), p))
        return;
    count.allocs++;
    count.retried_ok += mallocs >= 2;
    void *base = NULL;
    size_t size = 0;
    CHECK((uintptr_t)p % 512 == 0, "block %p not 512-aligned", p);
    CHECK(fake_allocation_of(p, &base, &size) == 1 &&
          (char *)p + bytes <= (char *)base + size,
          "block %p of %zu bytes in no live allocation (%p, %zu bytes)", p,
          bytes, base, size);
    for (int j = 0; j < NSLOTS; j++)
        if (slots[j].p != NULL)
            CHECK((char *)p + bytes <= (char *)slots[j].p ||
                  (char *)slots[j].p + slots[j].bytes <= (char *)p,
                  "block %p of %zu bytes overlaps live block %p of %zu",
                  p, bytes, slots[j].p, slots[j].bytes);
    /* A new hand-out over a noted free: that free was done. */
    for (size_t k = 0; k < nfreed;)
        if ((char *)p < (char *)freed[k].p + freed[k].bytes &&
            (char *)freed[k].p < (char *)p + bytes)
            freed[k] = freed[--nfreed];
        else
            k++;
    slots[i] = (struct slot){p, bytes, s};
    if (percent(50))
        hold(s, p);
}

/* ---- a knob set's run, in a child ---------------------------------------- */

static void run_set(void)
{
    rng_state = mix64(seed ^ mix64((uint64_t)cur_index + 1));
    fake_set_device_memory(0, DEVICE_MEMORY);
    fake_set_pool_granularity(GRANULE);
    fake_set_address_reuse(1);
    if (cur->no_pools)
        fake_set_memory_pools(0, 0);
    st[0] = 0;
    for (int x = 1; x < NSTREAMS; x++)
        st[x] = stream_new();
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        bail("cudaEventCreateWithFlags");
    for (unsigned long step = 0; step < steps; step++) {
        int i = (int)below(NSLOTS);
        uint32_t op = below(12);
        if (slots[i].p == NULL) {
            allocate(i);
        } else if (op < 6) {
            free_block(i);
        } else if (op < 9 && noutstanding > 0) {
            complete_one();
        } else if (op < 10 && below(8) == 0) {
            CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
            count.trims++;
        }
    }
    complete_all();
    for (int i = 0; i < NSLOTS; i++)
        if (slots[i].p != NULL) {
            void *p = slots[i].p;
            int s = slots[i].s;
            freeing(i, 1u << s);
            CHECK(defer_free(p, st[s]) == cudaSuccess, "a free of %p", p);
        }
    CHECK(defer_flush() == cudaSuccess, "defer_flush");
    struct defer_device_stats d = dstats();
    CHECK(d.cache_bytes == d.cache_free_bytes && d.live_bytes == 0,
          "flushed: every cached byte free (%llu of %llu), none live (%llu)",
          ULL(d.cache_free_bytes), ULL(d.cache_bytes), ULL(d.live_bytes));
    CHECK(defer_trim(NULL) == cudaSuccess, "defer_trim");
    d = dstats();
    CHECK(d.cache_bytes == 0, "trimmed: %llu bytes still cached",
          ULL(d.cache_bytes));
    CHECK(fake_live_allocations() == 0, "trimmed: %zu allocations left",
          fake_live_allocations());
    diag("%s: %lu blocks, %lu out of memory (%lu emptied), %lu retried "
         "after a trim (%lu got a block), %lu handed back on a miss; %lu "
         "frees, %lu held works, %lu trims; at most %lu bytes pinned",
         cur->title, count.allocs, count.oom, count.drains, count.retried,
         count.retried_ok, count.handbacks, count.frees, count.completed,
         count.trims, count.pinned_max);
    /* What the device's size is for: without these, the paths above were
     * not run, and the test no longer tests them. */
    CHECK(count.oom > 0 && count.retried > 0, "ran out of memory (%lu), "
          "tried again after a trim (%lu)", count.oom, count.retried);
    CHECK(cur->no_pools || count.handbacks > 0,
          "a miss handed blocks back to the pool (%lu)", count.handbacks);
    defer_shutdown();
}

/* ---- main ------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr, "usage: t/alloc_small_device [--seed S] [--only K "
                    "(0..%d)] [--steps N]\n", NSETS - 1);
    exit(2);
}

static uint64_t number(const char *text, uint64_t max)
{
    char *end;
    errno = 0;
    if (text == NULL || text[0] < '0' || text[0] > '9')
        usage();
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    bool seeded = false;
    int only = -1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--seed") == 0)
            seed = number(v, UINT64_MAX), seeded = true;
        else if (strcmp(a, "--only") == 0)
            only = (int)number(v, (uint64_t)NSETS - 1);
        else if (strcmp(a, "--steps") == 0)
            steps = (unsigned long)number(v, UINT64_C(1) << 32);
        else
            usage();
    }
    if (!seeded) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (uint32_t)mix64((uint64_t)time(NULL) ^
                               ((uint64_t)getpid() << 32) ^
                               (uint64_t)ts.tv_nsec);
    }
    char extra[64] = "";
    if (steps != DEFAULT_STEPS)
        snprintf(extra, sizeof extra, " --steps %lu", steps);
    diag("seed %" PRIu64 " (replay: t/alloc_small_device --seed %" PRIu64
         "%s)", seed, seed, extra);
    plan_lazy();
    for (int k = 0; k < NSETS; k++) {
        if (only >= 0 && k != only)
            continue;
        cur = &sets[k];
        cur_index = k;
        unsigned long failed = tap_failures();
        fork_scenario(cur->title, cur->env, 1, 120000, run_set);
        if (tap_failures() != failed)
            diag("FAILED with seed %" PRIu64 ": replay with "
                 "t/alloc_small_device --seed %" PRIu64 " --only %d%s", seed,
                 seed, k, extra);
    }
    return 0;
}
