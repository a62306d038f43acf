/* SPDX-License-Identifier: MIT */
/*
 * Statistics: counters bumped by the launching threads and the reclaimer,
 * read as a snapshot by defer_stats_get.  Relaxed atomics: exact counts, no
 * ordering between them.  The fields come from the list in stats_counters.h.
 */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "stats_counters.h"
#include "thread_shard.h"

#define LATENCY_BUCKETS 40 /* bucket i: latencies below 2^i microseconds */

/* One atomic per kept counter of stats_counters.h (gauges are computed by
 * the snapshot), then the latency histogram.  Each counter on a cache line
 * of its own: the launching threads bump deferred at every call, the
 * reclaimer its counters at every pass. */
#define STATS_ATOMIC(name) _Alignas(64) _Atomic uint64_t name;
#define STATS_NOT_KEPT(name)
struct stats {
    STATS_FIELDS(STATS_ATOMIC, STATS_ATOMIC, STATS_NOT_KEPT)
    _Atomic uint64_t latency[LATENCY_BUCKETS];
};
#undef STATS_ATOMIC
#undef STATS_NOT_KEPT

extern struct stats stats;

/* deferred, and the block cache's reused and reused_same_stream, are
 * bumped by the launching threads at every call: they are counted in the
 * thread's shard (thread_shard.h); the snapshot adds the shards to the
 * kept counters of the same names. */

/* Any thread; never blocks: one more call accepted. */
static inline void stats_count_deferred(void)
{
    atomic_fetch_add_explicit(&thread_shard_mine()->deferred, 1,
                              memory_order_relaxed);
}

/* Any thread; never blocks: a cached block handed out again, on the
 * stream it was freed on or not. */
static inline void stats_count_reused(bool same_stream)
{
    struct thread_shard *mine = thread_shard_mine();
    atomic_fetch_add_explicit(&mine->reused, 1, memory_order_relaxed);
    if (same_stream)
        atomic_fetch_add_explicit(&mine->reused_same_stream, 1,
                                  memory_order_relaxed);
}

static inline void stats_add(_Atomic uint64_t *counter, uint64_t n)
{
    atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

static inline void stats_sub(_Atomic uint64_t *counter, uint64_t n)
{
    atomic_fetch_sub_explicit(counter, n, memory_order_relaxed);
}

static inline void stats_set(_Atomic uint64_t *counter, uint64_t v)
{
    atomic_store_explicit(counter, v, memory_order_relaxed);
}

/* Reclaimer only (single writer): a pass released n entries. */
void stats_record_batch(uint64_t n);

/* Reclaimer only: one release, latency_ns after its completion was seen. */
void stats_record_latency(uint64_t latency_ns);

/* Any thread: print every counter, one line, to out (CUDEFER_STATS=1). */
void stats_print(FILE *out);

#endif
