/* Statistics counters and the defer_stats_get snapshot. */
#include "stats.h"

#include <inttypes.h>
#include <string.h>

#include "cudefer.h"
#include "event_pool.h"

struct stats stats;

static uint64_t read(_Atomic uint64_t *counter)
{
    return atomic_load_explicit(counter, memory_order_relaxed);
}

void stats_record_batch(uint64_t n)
{
    stats_add(&stats.batches, 1);
    if (n > read(&stats.largest_batch))
        stats_set(&stats.largest_batch, n);
}

void stats_record_latency(uint64_t latency_ns)
{
    uint64_t us = latency_ns / 1000;
    int bucket = 0;
    while (bucket < LATENCY_BUCKETS - 1 && us >= (UINT64_C(1) << bucket))
        bucket++;
    stats_add(&stats.latency[bucket], 1);
    if (us > read(&stats.latency_max_us))
        stats_set(&stats.latency_max_us, us);
}

/* The upper bound of the bucket holding the median latency. */
static uint64_t latency_p50_us(void)
{
    uint64_t total = 0, seen = 0;
    for (int i = 0; i < LATENCY_BUCKETS; i++)
        total += read(&stats.latency[i]);
    for (int i = 0; i < LATENCY_BUCKETS && total > 0; i++) {
        seen += read(&stats.latency[i]);
        if (2 * seen >= total)
            return UINT64_C(1) << i;
    }
    return 0;
}

void defer_stats_get(struct defer_stats *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof *out);
    /* Finished counts first: pending never underflows from a race. */
    out->released = read(&stats.released);
    out->failed = read(&stats.failed);
    out->deferred = read(&stats.deferred);
    uint64_t done = out->released + out->failed;
    out->pending = out->deferred > done ? out->deferred - done : 0;
    out->rejected = read(&stats.rejected);
    out->sync_releases = read(&stats.sync_releases);
    out->event_queries = read(&stats.event_queries);
    out->wakeups = read(&stats.wakeups);
    out->batches = read(&stats.batches);
    out->largest_batch = read(&stats.largest_batch);
    out->events_created = read(&stats.events_created);
    out->events_in_pool = event_pool_idle_count();
    out->held = read(&stats.held);
    out->held_bytes = read(&stats.held_bytes);
    out->idle_releases = read(&stats.idle_releases);
    out->cap_releases = read(&stats.cap_releases);
    out->age_releases = read(&stats.age_releases);
    out->demand_releases = read(&stats.demand_releases);
    out->latency_p50_us = latency_p50_us();
    out->latency_max_us = read(&stats.latency_max_us);
    out->leaked_at_exit = read(&stats.leaked_at_exit);
    out->reused = read(&stats.reused);
    out->reused_same_stream = read(&stats.reused_same_stream);
    out->cache_bytes = read(&stats.cache_bytes);
    out->cache_free_bytes = read(&stats.cache_free_bytes);
    out->cache_mallocs = read(&stats.cache_mallocs);
    out->cache_releases = read(&stats.cache_releases);
}

void stats_print(FILE *out)
{
    struct defer_stats s;
    defer_stats_get(&s);
    fprintf(out,
            "cudefer: stats: deferred %" PRIu64 " released %" PRIu64
            " pending %" PRIu64 " failed %" PRIu64 " rejected %" PRIu64
            " sync_releases %" PRIu64 " event_queries %" PRIu64
            " wakeups %" PRIu64 " batches %" PRIu64 " largest_batch %" PRIu64
            " events_created %" PRIu64 " events_in_pool %" PRIu64
            " held %" PRIu64 " held_bytes %" PRIu64 " releases(idle %" PRIu64
            " cap %" PRIu64 " age %" PRIu64 " demand %" PRIu64
            ") latency_p50_us %" PRIu64 " latency_max_us %" PRIu64
            " leaked_at_exit %" PRIu64 " reused %" PRIu64
            " reused_same_stream %" PRIu64 " cache_bytes %" PRIu64
            " cache_free_bytes %" PRIu64 " cache_mallocs %" PRIu64
            " cache_releases %" PRIu64 "\n",
            s.deferred, s.released, s.pending, s.failed, s.rejected,
            s.sync_releases, s.event_queries, s.wakeups, s.batches,
            s.largest_batch, s.events_created, s.events_in_pool, s.held,
            s.held_bytes, s.idle_releases, s.cap_releases, s.age_releases,
            s.demand_releases, s.latency_p50_us, s.latency_max_us,
            s.leaked_at_exit, s.reused, s.reused_same_stream, s.cache_bytes,
            s.cache_free_bytes, s.cache_mallocs, s.cache_releases);
}
