/* SPDX-License-Identifier: MIT */
/* Replaying a training loop's allocations on the fake runtime: defer_alloc
 * and defer_free on one stream, simulated kernels using the blocks, and a
 * launch queue that makes the simulated GPU run behind the CPU as it does
 * in PyTorch training (the CPU waits, as CUDA's launch queue makes it,
 * once depth kernels are queued, so the GPU runs depth kernels behind
 * when it is the slower).  Shared by t/alloc_steady (a synthetic step) and
 * bench/replay-trace (a step recorded from PyTorch, bench/torch_shims.c).
 * Every hand-out is checked by the fake's oracle (alloc_checked).  One
 * thread uses a replay. */
#ifndef CUDEFER_TEST_REPLAY_H
#define CUDEFER_TEST_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helpers.h"

/* The longest simulated kernel replay_pace makes (us). */
#define REPLAY_MAX_KERNEL_US 20000u

/* One replay: its stream, how long each simulated kernel runs, the launch
 * queue, and the bytes the replay holds live (now and at most since the
 * caller last reset live_peak). */
struct replay {
    cudaStream_t stream;
    /* Through PyTorch's entry points (defer_pluggable_alloc_status and
     * defer_pluggable_free, device 0, the size said), as
     * python/cudefer/torch_allocator.cpp calls them; else defer_alloc and
     * defer_free.  Set after replay_init. */
    bool pluggable;
    unsigned kernel_us;
    unsigned depth;
    cudaEvent_t *queued; /* ring: after each of the last depth kernels */
    unsigned long long launched;
    double waited_ms; /* the CPU waiting for the queue */
    size_t live, live_peak;
};

/* Set up a replay on stream with a queue of depth kernels (>= 1) of
 * kernel_us each.  Bails when CUDA refuses an event. */
void replay_init(struct replay *r, cudaStream_t stream, unsigned depth,
                 unsigned kernel_us);

/* Wait for the stream, then destroy the queue's events.  Blocks until the
 * replay's kernels are done. */
void replay_finish(struct replay *r);

/* A block of bytes from defer_alloc (or the pluggable allocation) for the
 * replay's stream (checked by the oracle), counted live; bails when
 * refused. */
void *replay_take(struct replay *r, size_t bytes);

/* defer_free (or defer_pluggable_free) of the replay's block p of bytes on
 * its stream; bails when refused. */
void replay_give(struct replay *r, void *p, size_t bytes);

/* A simulated kernel on the stream using the n blocks of uses (NULLs are
 * ignored by the fake), once the queue has room: blocks the CPU while
 * depth kernels are queued (the time adds to waited_ms). */
void replay_kernel(struct replay *r, void *const *uses, size_t n);

/* Kernels queued and not yet done (of the last depth).  Never blocks. */
unsigned replay_kernels_behind(const struct replay *r);

/* Make the kernels long enough that the GPU takes twice the CPU's time:
 * cpu_ms, the CPU's time to enqueue kernels kernels, waits excluded.  Never
 * shortens them; at most 20 ms each.  Call once timed on a first pass (so
 * that the GPU stays behind under sanitizers too). */
void replay_pace(struct replay *r, double cpu_ms, unsigned long long kernels);

/* The bytes cudefer's pool on device 0 reserves now (fake_mem_pool's
 * ReservedMemCurrent).  Any thread; bails when the fake refuses. */
uint64_t replay_pool_reserved(void);

/* What the block cache did between two reads of cudefer's statistics:
 * misses (new blocks from the pool, cache_mallocs) and blocks handed back to
 * the pool (cache_releases). */
struct replay_cache_counts {
    uint64_t misses, releases;
};

/* The counts since *since, which becomes now.  Never blocks on the GPU. */
struct replay_cache_counts replay_cache_since(struct defer_stats *since);

#endif
