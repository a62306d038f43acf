/* SPDX-License-Identifier: MIT */
/*
 * The one list of statistics fields, in the order of struct defer_stats
 * (include/cudefer.h, written out there for its readers).  From it stats.h
 * makes the atomic counters, and stats.c the snapshot, the one-line print
 * (CUDEFER_STATS=1) and the compile-time check that the list and the public
 * struct agree field by field.
 *
 * STATS_FIELDS(COUNTER, FINISHED, GAUGE, DEVICE) calls, for each field, in
 * order:
 *   COUNTER(name)  a counter kept here, read as is;
 *   FINISHED(name) a counter of entries that are done (released, failed):
 *                  the snapshot reads these before the others, so that
 *                  pending, derived from deferred, never underflows;
 *   GAUGE(name)    not kept here: the snapshot computes it (stats.c has one
 *                  stats_gauge_NAME function each);
 *   DEVICE(name)   not kept here: counted per device (struct stats_device,
 *                  stats.h, Note [Device counters]) and added up over the
 *                  devices by the snapshot (stats.c, stats_sum_devices).
 * A new counter: add it here, at the end, and to the end of struct
 * defer_stats with its comment; never reorder (the ABI).
 */
#ifndef CUDEFER_STATS_COUNTERS_H
#define CUDEFER_STATS_COUNTERS_H

#define STATS_FIELDS(COUNTER, FINISHED, GAUGE, DEVICE) \
    COUNTER(deferred)                          \
    FINISHED(released)                         \
    GAUGE(pending)                             \
    FINISHED(failed)                           \
    COUNTER(rejected)                          \
    COUNTER(sync_releases)                     \
    COUNTER(event_queries)                     \
    COUNTER(wakeups)                           \
    COUNTER(batches)                           \
    COUNTER(largest_batch)                     \
    COUNTER(events_created)                    \
    GAUGE(events_in_pool)                      \
    COUNTER(held)                              \
    COUNTER(held_bytes)                        \
    COUNTER(idle_releases)                     \
    COUNTER(cap_releases)                      \
    COUNTER(age_releases)                      \
    COUNTER(demand_releases)                   \
    GAUGE(latency_p50_us)                      \
    COUNTER(latency_max_us)                    \
    COUNTER(leaked_at_exit)                    \
    DEVICE(reused)                             \
    DEVICE(reused_same_stream)                 \
    DEVICE(cache_bytes)                        \
    DEVICE(cache_free_bytes)                   \
    DEVICE(cache_mallocs)                      \
    DEVICE(cache_releases)                     \
    DEVICE(cache_release_failures)

/* The last field of struct defer_stats in cudefer 0.1.0: callers built
 * against 0.1.0 have room up to its end, and no further. */
#define STATS_LAST_FIELD_0_1_0 reused

#endif
