/*
 * Statistics: counters any thread may bump, read as a snapshot by
 * defer_stats_get.  Relaxed atomics: exact counts, no ordering between them.
 */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include <stdatomic.h>
#include <stdint.h>

struct defer_stats;

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
};

extern struct stats stats;

static inline void stats_add(_Atomic uint64_t *counter, uint64_t n)
{
    atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

/* Reclaimer only (single writer): a batch of n releases happened. */
void stats_record_batch(uint64_t n);

/* Any thread: zero every counter (start-up, fork child). */
void stats_reset(void);

#endif
