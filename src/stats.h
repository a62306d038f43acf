/*
 * Statistics: counters bumped by the launching threads and the reclaimer,
 * read as a snapshot by defer_stats_get.  Relaxed atomics: exact counts, no
 * ordering between them.  The fields come from the list in stats_counters.h.
 */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "stats_counters.h"

#define LATENCY_BUCKETS 40 /* bucket i: latencies below 2^i microseconds */

/* One atomic per kept counter of stats_counters.h (gauges are computed by
 * the snapshot), then the latency histogram.  Each counter on a cache line
 * of its own: the launching threads bump deferred at every call, the
 * reclaimer its counters at every pass (issue 13, item 4). */
#define STATS_ATOMIC(name) _Alignas(64) _Atomic uint64_t name;
#define STATS_NOT_KEPT(name)
struct stats {
    STATS_FIELDS(STATS_ATOMIC, STATS_ATOMIC, STATS_NOT_KEPT)
    _Atomic uint64_t latency[LATENCY_BUCKETS];
};
#undef STATS_ATOMIC
#undef STATS_NOT_KEPT

extern struct stats stats;

/* deferred, bumped by every call of every launching thread, is counted in
 * shards: a thread counts in one of them, alone as long as there are no
 * more threads than shards, so no cache line bounces between launching
 * threads (issue 13, item 4; W6's 64 threads).  The snapshot adds them to
 * stats.deferred. */
#define STATS_SHARDS 64

struct stats_shard {
    _Alignas(64) _Atomic uint64_t deferred;
};

extern struct stats_shard stats_shards[STATS_SHARDS];
extern _Thread_local int stats_my_shard; /* -1 until the first call */

/* Any thread: the calling thread's shard (taken in turn, once). */
int stats_take_shard(void);

/* Any thread; never blocks: one more call accepted. */
static inline void stats_count_deferred(void)
{
    int shard = stats_my_shard >= 0 ? stats_my_shard : stats_take_shard();
    atomic_fetch_add_explicit(&stats_shards[shard].deferred, 1,
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
