/* SPDX-License-Identifier: MIT */
/* The steady state of defer_alloc as a training loop's allocator: a
 * synthetic step (a forward pass keeping 40 activations live, temporaries
 * freed right after their kernel, a backward pass freeing the activations
 * in reverse while allocating gradients of other sizes, an optimizer with a
 * few large temporaries) replayed on one stream, with the simulated GPU
 * about a step behind the CPU, as in PyTorch training.  After warm-up steps
 * it measures, per step, the misses (new blocks from the pool) and the
 * blocks handed back to the pool, and the pool's reserved bytes against the
 * peak of the bytes the trace itself holds live.  It pins what a miss hands
 * back to the pool (src/cache_hand_back.c) between two
 * regressions, both seen on an H100 with ResNet-50:
 *   (1) handing back EVERY free block at each miss: each miss empties the
 *       cache of blocks the next requests need, so they miss too (churn:
 *       ~400-800 misses a step, steps up to 1.19x slower);
 *   (2) handing back only what the pool lacks, from FREE blocks only: with
 *       the GPU a step behind, most cached blocks are PENDING on the stream
 *       and never go back, so the pool grows (peak 1.17x PyTorch's).
 * Measured in this replay (its three runs: the GPU a step behind, half a
 * step behind, and a step behind on the legacy stream; 164 requests a step,
 * a live peak of 112.9 MiB), src/alloc.c edited in a copy to emulate each:
 *   (1) a step behind: 0 misses a step, but the pool reserves 207.1 MiB,
 *       1.834x the live peak (with the GPU a step behind hardly any block
 *       is FREE when a miss comes, so nothing goes back); half a step
 *       behind: 33.1-33.2 misses and as many hand-backs a step, 1.807x;
 *   (2) a step behind: 0 misses, 1.834x; half a step behind: 10-11
 *       misses and as many hand-backs a step, 1.80x;
 *   (3) what the pool lacks, the oldest FREE blocks, then the oldest
 *       PENDING on the request's stream: 1.017x the live peak,
 *       but 55 misses and 55 hand-backs a step (a third of the requests)
 *       in all three runs;
 *   (4) what a miss hands back now: what the pool lacks, FREE blocks or
 *       blocks PENDING on the request's stream, the largest first (one
 *       large block covers this miss and leaves the pool slack for the
 *       next ones): 1.010x, 27 misses and 27 hand-backs a step in all
 *       three runs (best fit: 29-30; newest first: 42).
 * The hoarding bound below fails for (1) and (2); the churn bound fails
 * for (3) and holds for (4), at 27 misses a step (a miss, ~5 us on the
 * H100, where blocks are not split).  Why a
 * cache of unsplit blocks churns at all: the blocks of every size this
 * trace asks for add up to 1.83x its live peak (the gradients, workspaces
 * and optimizer temporaries have sizes no activation has), so a cache of
 * unsplit blocks whose pool holds only the live peak must turn memory of
 * one size into another every step, a miss each time.  Letting the pool
 * grow some way above the high-water of lent bytes before pending blocks go
 * back (tried in a copy) buys few misses back until it holds every size:
 * 12.5 % above it, 51 misses a step (1.127x); 25 %, 46 (1.26x); 50 %, 39
 * (1.52x); 100 %, 0 (1.834x; a step behind).
 * All of the above is with blocks never split (CUDEFER_SPLIT_MIN=0, set
 * here: this program pins the hand-back policy).  The same source built with
 * STEADY_SPLIT is t/alloc_steady_split: the replays with block splitting as
 * cudefer does by default (requests of 1 MiB or more cut from larger
 * blocks, freed neighbours merged).  Measured in 72 runs of each case
 * (two at a time on 2 cores, under load), every one 10.9 misses and 11.0
 * hand-backs a step and the pool at 1.076x the live peak.  Where a freed
 * block merges with its FREE neighbours only once its work is done, the
 * same runs spread over 1.076-1.417x (42 of 72 above 1.076x): whether a
 * large request fitted depended on which piece's work had completed first,
 * so the timing of the simulated GPU decided the pool (src/cache_segments.c,
 * Note [Merging at once]).  The bound is the 1.10x goal, which that failed
 * in 37 of the 72.
 * The fake's oracle checks every hand-out and every free. */
#include <stdint.h>

#include "replay.h"

#define KIB ((size_t)1024)
#define LAYERS 40
#define WARMUP_STEPS 3
#define MEASURED_STEPS 10
/* Kernels a step: one per layer forward and backward, one per optimizer
 * temporary. */
#define OPTIMIZER_TEMPS 4
#define KERNELS_PER_STEP (2 * LAYERS + OPTIMIZER_TEMPS)
/* The bounds of the steady state, per measured step: the pool holds
 * little beyond the live peak, and the misses stay at (4)'s 27 (the top
 * comment), below (3)'s 55. */
#ifndef STEADY_SPLIT
#define MAX_MISSES_PER_STEP 30.0
#define MAX_RELEASES_PER_STEP 30.0
#define MAX_RESERVED_RATIO 1.10
#define SPLIT_ENV "CUDEFER_SPLIT_MIN=0"
#define RUN_NAME(name) name
#else
#define MAX_MISSES_PER_STEP 15.0
#define MAX_RELEASES_PER_STEP 15.0
#define MAX_RESERVED_RATIO 1.10
#define SPLIT_ENV "CUDEFER_SPLIT_MIN=1M"
#define RUN_NAME(name) "split, " name
#endif

/* The trace's sizes in KiB, drawn once from a few distinct sizes (seeded
 * pseudo-random choices, written out so that the trace never changes):
 * each layer's activation (live from its forward kernel to its backward
 * one), its forward workspace (0: none) and its gradient temporary. */
static const unsigned activation_kib[LAYERS] = {
    6272, 4096, 8192, 4096, 2048, 6272, 6272, 8192, 4096, 256,
    392,  196,  2048, 8192, 6272, 512,  256,  2048, 196,  98,
    6272, 784,  196,  98,   8192, 2048, 1024, 512,  64,   256,
    3136, 6272, 512,  1024, 256,  512,  196,  256,  64,   4096};
static const unsigned workspace_kib[LAYERS] = {
    640, 0,    0,   0,    0,    0,   640,  0,    2500, 160,
    32,  160,  640, 2500, 0,    640, 0,    1200, 32,   160,
    0,   1200, 0,   160,  1200, 32,  160,  640,  2500, 0,
    1200, 32,  32,  2500, 0,    640, 32,   0,    0,    640};
static const unsigned gradient_kib[LAYERS] = {
    300, 7000, 300,  2900, 7000, 300,  72,   72,   1400, 1400,
    72,  136,  7000, 7000, 7000, 300,  1400, 2900, 5000, 300,
    2900, 5000, 72,  7000, 300,  600,  1400, 300,  72,   72,
    136, 136,  600,  1400, 136,  1400, 600,  7000, 7000, 300};
static const unsigned optimizer_kib[OPTIMIZER_TEMPS] = {24576, 12288, 24576,
                                                        40960};

/* A tensor of kib KiB for the trace. */
static void *take(struct replay *r, unsigned kib)
{
    return replay_take(r, kib * KIB);
}

/* The trace frees a tensor of kib KiB on its stream. */
static void give(struct replay *r, void *p, unsigned kib)
{
    replay_give(r, p, kib * KIB);
}

/* One training step, enqueued: forward, backward, optimizer. */
static void step(struct replay *r)
{
    void *act[LAYERS];
    for (int i = 0; i < LAYERS; i++) {
        act[i] = take(r, activation_kib[i]);
        void *ws = workspace_kib[i] ? take(r, workspace_kib[i]) : NULL;
        void *uses[] = {i > 0 ? act[i - 1] : NULL, act[i], ws};
        replay_kernel(r, uses, 3);
        if (ws != NULL)
            give(r, ws, workspace_kib[i]);
    }
    void *grad_out = NULL;
    unsigned grad_out_kib = 0;
    for (int i = LAYERS - 1; i >= 0; i--) {
        void *grad_in = take(r, gradient_kib[i]);
        void *uses[] = {act[i], grad_out, grad_in};
        replay_kernel(r, uses, 3);
        if (grad_out != NULL)
            give(r, grad_out, grad_out_kib);
        give(r, act[i], activation_kib[i]);
        grad_out = grad_in;
        grad_out_kib = gradient_kib[i];
    }
    give(r, grad_out, grad_out_kib);
    for (int j = 0; j < OPTIMIZER_TEMPS; j++) {
        void *t = take(r, optimizer_kib[j]);
        replay_kernel(r, &t, 1);
        give(r, t, optimizer_kib[j]);
    }
}

/* What a replay measured over its measured steps. */
struct steady {
    double misses_per_step, releases_per_step;
    uint64_t misses_max, releases_max; /* in one step */
    uint64_t reserved_start, reserved_end;
    size_t live_peak;
    double steps_behind; /* the GPU, at the steps' ends, on average */
    double enqueue_ms;   /* the CPU's time a step, waits excluded */
};

/* Measure MEASURED_STEPS steps of r, after WARMUP_STEPS - skip warm-up
 * steps. */
static struct steady measure_steps(struct replay *r, int skip)
{
    for (int k = skip; k < WARMUP_STEPS; k++)
        step(r);
    struct steady m = {.reserved_start = replay_pool_reserved()};
    struct defer_stats before = stats_now();
    uint64_t misses = 0, releases = 0;
    r->live_peak = 0;
    r->waited_ms = 0;
    unsigned behind = 0;
    double t0 = now_ms();
    for (int k = 0; k < MEASURED_STEPS; k++) {
        step(r);
        behind += replay_kernels_behind(r);
        struct replay_cache_counts c = replay_cache_since(&before);
        if (c.misses > m.misses_max)
            m.misses_max = c.misses;
        if (c.releases > m.releases_max)
            m.releases_max = c.releases;
        misses += c.misses;
        releases += c.releases;
    }
    m.enqueue_ms = (now_ms() - t0 - r->waited_ms) / MEASURED_STEPS;
    m.misses_per_step = (double)misses / MEASURED_STEPS;
    m.releases_per_step = (double)releases / MEASURED_STEPS;
    m.reserved_end = replay_pool_reserved();
    m.live_peak = r->live_peak;
    m.steps_behind = (double)behind / MEASURED_STEPS / KERNELS_PER_STEP;
    return m;
}

/* Replay the trace on stream with a launch queue of depth kernels (named
 * name in the diagnostics) and measure its steady state.  The first step
 * (all misses) also times the CPU's enqueue: kernels then run long enough
 * for the GPU to take about twice that, so that it stays behind under
 * sanitizers too.  Where the CPU slowed down after that step (a loaded CI
 * machine: the GPU then ran less than half its queue behind, the
 * precondition of the bounds), the kernels are made four times as long and the
 * steps measured again, up to MAX_REPACES times. */
#define MAX_REPACES 3
static struct steady replay_steady(cudaStream_t stream, unsigned depth,
                                   const char *name)
{
    struct replay r;
    replay_init(&r, stream, depth, 50);
    double t0 = now_ms();
    step(&r);
    double cpu_ms = now_ms() - t0 - r.waited_ms;
    replay_pace(&r, cpu_ms, KERNELS_PER_STEP);
    diag("%s: first step enqueued in %.1f ms; kernels of %u us, a step of "
         "%.1f ms on the GPU, a queue of %u kernels (%.2f step)", name, cpu_ms,
         r.kernel_us, r.kernel_us * KERNELS_PER_STEP / 1000.0, depth,
         (double)depth / KERNELS_PER_STEP);
    double want = (double)depth / KERNELS_PER_STEP;
    struct steady m = measure_steps(&r, 1);
    for (int again = 0; again < MAX_REPACES && m.steps_behind < want / 2 &&
                        r.kernel_us < REPLAY_MAX_KERNEL_US;
         again++) {
        r.kernel_us = 4 * r.kernel_us < REPLAY_MAX_KERNEL_US
                          ? 4 * r.kernel_us
                          : REPLAY_MAX_KERNEL_US;
        diag("%s: the GPU ran only %.2f step behind (the CPU took %.2f ms a "
             "step): kernels of %u us, measured again",
             name, m.steps_behind, m.enqueue_ms, r.kernel_us);
        m = measure_steps(&r, 0);
    }
    diag("%s: %.1f misses/step (%llu in the worst step), %.1f hand-backs/step "
         "(%llu in the worst step); pool reserved %.1f MiB -> %.1f MiB, live peak %.1f MiB: "
         "reserved/live-peak %.3f; the GPU %.2f step behind; %.2f ms of "
         "enqueue a step",
         name, m.misses_per_step, ULL(m.misses_max), m.releases_per_step,
         ULL(m.releases_max), m.reserved_start / 1048576.0,
         m.reserved_end / 1048576.0, m.live_peak / 1048576.0,
         (double)m.reserved_end / (double)m.live_peak, m.steps_behind,
         m.enqueue_ms);
    replay_finish(&r);
    return m;
}

/* The bounds of the steady state (see the top comment for what (1) and
 * (2) measured against them). */
static void check_steady(const struct steady *m, unsigned depth,
                         const char *name)
{
    double want = (double)depth / KERNELS_PER_STEP;
    ok(m->steps_behind >= want / 2,
       "%s: the GPU runs behind (%.2f step; its queue holds %.2f)", name,
       m->steps_behind, want);
    ok(m->misses_per_step <= MAX_MISSES_PER_STEP,
       "%s: %.1f misses a step (at most %.1f)",
       name,
       m->misses_per_step, MAX_MISSES_PER_STEP);
    ok(m->releases_per_step <= MAX_RELEASES_PER_STEP,
       "%s: %.1f blocks handed back to the pool a step (at most %.1f)",
       name, m->releases_per_step, MAX_RELEASES_PER_STEP);
    double ratio = (double)m->reserved_end / (double)m->live_peak;
    ok(ratio <= MAX_RESERVED_RATIO,
       "%s: no hoarding: the pool reserves %.3fx the trace's live peak (at "
       "most %.2fx)", name, ratio, MAX_RESERVED_RATIO);
}

/* Replay on stream from an empty cache and pool, then check. */
static void replay_and_check(cudaStream_t stream, unsigned depth,
                             const char *name)
{
    size_t trimmed = 0;
    if (defer_flush() != cudaSuccess || defer_trim(&trimmed) != cudaSuccess)
        bail("defer_flush or defer_trim failed");
    ok(replay_pool_reserved() == 0, "%s: the pool starts empty", name);
    struct steady m = replay_steady(stream, depth, name);
    check_steady(&m, depth, name);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env(SPLIT_ENV);
    fake_reset(1);
    cudaStream_t s = stream_new();
    replay_and_check(s, KERNELS_PER_STEP, RUN_NAME("a step behind"));
    replay_and_check(s, KERNELS_PER_STEP / 2, RUN_NAME("half a step behind"));
    /* PyTorch's default stream is the legacy stream 0. */
    replay_and_check(0, KERNELS_PER_STEP,
                     RUN_NAME("legacy stream, a step behind"));
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
