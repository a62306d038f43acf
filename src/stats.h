/*
 * Statistics: counters bumped by the launching threads and the reclaimer,
 * read as a snapshot by defer_stats_get.  Relaxed atomics: exact counts, no
 * ordering between them.
 */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#define LATENCY_BUCKETS 40 /* bucket i: latencies below 2^i microseconds */

struct stats {
    _Atomic uint64_t deferred;
    _Atomic uint64_t released;
    _Atomic uint64_t failed;
    _Atomic uint64_t rejected;
    _Atomic uint64_t sync_releases;
    _Atomic uint64_t event_queries;
    _Atomic uint64_t wakeups;
    _Atomic uint64_t batches;
    _Atomic uint64_t largest_batch;
    _Atomic uint64_t events_created;
    _Atomic uint64_t held;
    _Atomic uint64_t held_bytes;
    _Atomic uint64_t idle_releases;
    _Atomic uint64_t cap_releases;
    _Atomic uint64_t age_releases;
    _Atomic uint64_t demand_releases;
    _Atomic uint64_t latency_max_us;
    _Atomic uint64_t leaked_at_exit;
    _Atomic uint64_t reused;
    _Atomic uint64_t reused_same_stream;
    _Atomic uint64_t cache_bytes;
    _Atomic uint64_t cache_free_bytes;
    _Atomic uint64_t cache_mallocs;
    _Atomic uint64_t cache_releases;
    _Atomic uint64_t latency[LATENCY_BUCKETS];
};

extern struct stats stats;

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
