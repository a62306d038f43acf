/* SPDX-License-Identifier: MIT */
/*
 * Thread shards: the one cache line of counters a launching thread writes
 * at every defer call, and the one thread-local line it reads.
 *
 * A thread counts in one of THREAD_SHARDS shards, taken in turn at its
 * first call: alone as long as there are no more threads than shards, so no
 * cache line bounces between launching threads.  A shard holds lifecycle's gate count (the defer calls under
 * way; lifecycle.c says how it pairs with the closed flag) and the
 * statistics bumped per call (stats.h).  One line for all of them: each
 * line a call touches is a miss when PyTorch's own work ran between two
 * calls (bench/cold-calls under cachegrind counts them).
 */
#ifndef CUDEFER_THREAD_SHARD_H
#define CUDEFER_THREAD_SHARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define THREAD_SHARDS 64

struct thread_shard {
    _Alignas(64) _Atomic uint64_t admitted; /* the gate: calls under way */
    /* Statistics (stats.h), added up by the snapshot: counts that only
     * grow (a gauge such as cache_free_bytes cannot be kept here: a free
     * adding to one shard and the hit on another thread subtracting from
     * its own, a snapshot reading the shards in turn could sum to less than
     * zero).  The block cache's counts are the devices' (stats.h, Note
     * [Device counters]), bumped under the device's lock. */
    _Atomic uint64_t deferred;
};

extern struct thread_shard thread_shards[THREAD_SHARDS];

/* The identity of the special stream handle (stream_identity.h) this
 * thread found last in its identity cache (stream_identity.c), kept with
 * the rest of its state: PyTorch calls on one such handle, whose look-up
 * then reads no line of that cache.  key_device -1: none. */
struct thread_special {
    const void *handle; /* the cudaStream_t */
    int key_device;     /* the current device it was looked up on */
    int device;
    unsigned long long id;
};

/* The calling thread's own state, together on one thread-local line. */
struct thread_here {
    _Alignas(64) int shard; /* its shard; -1 until its first call */
    unsigned admissions;    /* admissions it holds now (lifecycle.c) */
    unsigned releasing;     /* entries counted deferred that it releases
                             * now, on the synchronous route (submit_sync.c):
                             * exit() or fork() from a callback there leaves
                             * them running (Note [Running entries],
                             * lifecycle_hooks.c) */
    bool reclaimer;         /* it is the reclaimer thread */
    struct thread_special special; /* stream_identity.c's alone */
};

_Static_assert(sizeof(struct thread_here) == 64,
               "a thread's own state fills one cache line");

extern _Thread_local struct thread_here thread_here;

/* Any thread: takes the calling thread's shard (its first call). */
struct thread_shard *thread_shard_take(void);

/* Any thread: the calling thread's shard.  Never blocks. */
static inline struct thread_shard *thread_shard_mine(void)
{
    int shard = thread_here.shard;
    return shard >= 0 ? &thread_shards[shard] : thread_shard_take();
}

#endif
