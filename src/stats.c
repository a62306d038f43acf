/* Statistics counters and the defer_stats_get snapshot. */
#include "stats.h"

#include <string.h>

#include "cudefer.h"
#include "event_pool.h"

struct stats stats;

void stats_record_batch(uint64_t n)
{
    stats_add(&stats.batches, 1);
    if (n > atomic_load_explicit(&stats.largest_batch, memory_order_relaxed))
        atomic_store_explicit(&stats.largest_batch, n, memory_order_relaxed);
}

void stats_reset(void)
{
    _Atomic uint64_t *c = &stats.deferred;
    for (size_t i = 0; i < sizeof stats / sizeof *c; i++)
        atomic_store_explicit(&c[i], 0, memory_order_relaxed);
}

static uint64_t read(_Atomic uint64_t *counter)
{
    return atomic_load_explicit(counter, memory_order_relaxed);
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
}
