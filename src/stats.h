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

#include "cudefer.h"
#include "stats_counters.h"
#include "thread_shard.h"

#define LATENCY_BUCKETS 40 /* bucket i: latencies below 2^i microseconds */

/* One atomic per kept counter of stats_counters.h (gauges are computed by
 * the snapshot, the block cache's counters summed from the devices'), then
 * the latency histogram.  Each counter on a cache line of its own: the
 * reclaimer bumps its counters at every pass. */
#define STATS_ATOMIC(name) _Alignas(64) _Atomic uint64_t name;
#define STATS_NOT_KEPT(name)
struct stats {
    STATS_FIELDS(STATS_ATOMIC, STATS_ATOMIC, STATS_NOT_KEPT, STATS_NOT_KEPT)
    _Atomic uint64_t latency[LATENCY_BUCKETS];
};
#undef STATS_ATOMIC
#undef STATS_NOT_KEPT

extern struct stats stats;

/* deferred is bumped by the launching threads at every call: it is counted
 * in the thread's shard (thread_shard.h); the snapshot adds the shards to
 * the kept counter of that name. */

/* Any thread; never blocks: one more call accepted. */
static inline void stats_count_deferred(void)
{
    atomic_fetch_add_explicit(&thread_shard_mine()->deferred, 1,
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

/* ---- per-device counters (defer_device_stats_get) ----------------------- */

/*
 * Note [Device counters]
 *
 * One struct stats_device a device, static (so readable before the start,
 * after shutdown and in a fork child, with no lock and no lifetime to
 * guard), for devices 0 .. DEFER_STATS_MAX_DEVICES - 1, and one overflow
 * slot past them that takes the counts of every higher device.  They are
 * the only count of the block cache: defer_stats' cache_bytes,
 * cache_free_bytes, cache_mallocs, cache_releases, cache_release_failures,
 * reused and reused_same_stream are their sums over all the slots, the
 * overflow slot included (stats.c, stats_sum_devices), so that a hit or a free touches
 * its own device's line and no line every launching thread shares.
 * Each field of a device's own slot has one kind of writer:
 * - the holder of the device's cache lock (cache_block.h, Note [Locks]):
 *   bytes, free_bytes, allocs, reused and reused_same_stream, updated by a
 *   relaxed load and store (no locked instruction: the lock makes the
 *   writer one at a time);
 * - the reclaimer, holding the device's held lock (held.h): held_bytes;
 * - any thread, by read-modify-write: mallocs, releases and
 *   release_failures (counted after the CUDA call, outside any lock).
 * The overflow slot is written under the cache locks of several devices
 * at once: every field of it by read-modify-write.  Its peaks and
 * held_bytes are not kept (no device reads them, defer_stats has none).
 * A peak grows by compare-and-swap wherever its current value grows, since
 * a reset (any thread, no lock) stores into it too; a reset racing a growth
 * may leave a peak below its current value, which the snapshot corrects.
 * live bytes are not kept: bytes less free_bytes.
 */
struct stats_device {
    _Alignas(64) _Atomic uint64_t bytes; /* the cache lock's writers */
    _Atomic uint64_t bytes_peak;
    _Atomic uint64_t free_bytes;
    _Atomic uint64_t live_peak;
    _Atomic uint64_t allocs;
    _Atomic uint64_t reused;
    _Atomic uint64_t reused_same_stream; /* defer_stats' only */
    _Alignas(64) _Atomic uint64_t held_bytes; /* the reclaimer's */
    _Atomic uint64_t held_peak;
    _Atomic uint64_t mallocs; /* any thread's */
    _Atomic uint64_t releases;
    _Atomic uint64_t release_failures;
};

/* The overflow slot is stats_devices[DEFER_STATS_MAX_DEVICES]. */
extern struct stats_device stats_devices[DEFER_STATS_MAX_DEVICES + 1];

/* Whether device has a slot of its own (else it counts in the overflow). */
static inline bool stats_device_own(int device)
{
    return (unsigned)device < DEFER_STATS_MAX_DEVICES;
}

/* Any thread: device's counters (the overflow slot for one out of range). */
static inline struct stats_device *stats_device_of(int device)
{
    return &stats_devices[stats_device_own(device) ? device
                                                    : DEFER_STATS_MAX_DEVICES];
}

/* The sole writer of *x, a field of a device's own slot (Note [Device
 * counters]): *x += delta (mod 2^64), by a relaxed load and store. */
static inline uint64_t stats_device_bump(_Atomic uint64_t *x, uint64_t delta)
{
    uint64_t v = atomic_load_explicit(x, memory_order_relaxed) + delta;
    atomic_store_explicit(x, v, memory_order_relaxed);
    return v;
}

/* Any thread: *peak is at least now. */
static inline void stats_device_peak(_Atomic uint64_t *peak, uint64_t now)
{
    uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);
    while (now > p && !atomic_compare_exchange_weak_explicit(
                          peak, &p, now, memory_order_relaxed,
                          memory_order_relaxed))
        ;
}

/* Any thread holding the cache lock of a device without a slot of its own:
 * stats_device_hit, stats_device_new, stats_device_freed and
 * stats_device_left on the overflow slot, by read-modify-writes (stats.c:
 * out of the inlined path of the devices that have a slot). */
void stats_overflow_hit(uint64_t size, bool same_stream);
void stats_overflow_new(uint64_t size);
void stats_overflow_freed(uint64_t size);
void stats_overflow_left(uint64_t size, bool was_free);

/* Any thread holding device's cache lock: a block of size bytes reused
 * from the cache is handed out; same_stream: it was PENDING on the
 * request's own stream. */
static inline void stats_device_hit(int device, uint64_t size,
                                    bool same_stream)
{
    if (!stats_device_own(device)) {
        stats_overflow_hit(size, same_stream);
        return;
    }
    struct stats_device *d = &stats_devices[device];
    uint64_t bytes = atomic_load_explicit(&d->bytes, memory_order_relaxed);
    uint64_t free_bytes = stats_device_bump(&d->free_bytes, -size);
    stats_device_bump(&d->reused, 1);
    if (same_stream)
        stats_device_bump(&d->reused_same_stream, 1);
    stats_device_bump(&d->allocs, 1);
    stats_device_peak(&d->live_peak, bytes - free_bytes);
}

/* Any thread holding device's cache lock: a new block of size bytes, filed
 * by cache_add, is handed out. */
static inline void stats_device_new(int device, uint64_t size)
{
    if (!stats_device_own(device)) {
        stats_overflow_new(size);
        return;
    }
    struct stats_device *d = &stats_devices[device];
    uint64_t bytes = stats_device_bump(&d->bytes, size);
    uint64_t free_bytes = atomic_load_explicit(&d->free_bytes,
                                               memory_order_relaxed);
    stats_device_peak(&d->bytes_peak, bytes);
    stats_device_bump(&d->allocs, 1);
    stats_device_peak(&d->live_peak, bytes - free_bytes);
}

/* Any thread holding device's cache lock: size bytes of blocks went back to
 * the cache (PENDING or FREE), waiting for reuse. */
static inline void stats_device_freed(int device, uint64_t size)
{
    if (!stats_device_own(device))
        stats_overflow_freed(size);
    else
        stats_device_bump(&stats_devices[device].free_bytes, size);
}

/* Any thread holding device's cache lock: a block of size bytes left the
 * cache (released, handed back upstream, or dropped); was_free: it was
 * PENDING or FREE, not the application's. */
static inline void stats_device_left(int device, uint64_t size,
                                     bool was_free)
{
    if (!stats_device_own(device)) {
        stats_overflow_left(size, was_free);
        return;
    }
    struct stats_device *d = &stats_devices[device];
    stats_device_bump(&d->bytes, -size);
    if (was_free)
        stats_device_bump(&d->free_bytes, -size);
}

/* Any thread: n more new blocks made, blocks released, or blocks whose
 * release failed (out of the cache, their memory not given back), on
 * device. */
static inline void stats_device_count_mallocs(int device, uint64_t n)
{
    stats_add(&stats_device_of(device)->mallocs, n);
}
static inline void stats_device_count_releases(int device, uint64_t n)
{
    stats_add(&stats_device_of(device)->releases, n);
}
static inline void stats_device_count_release_failures(int device,
                                                       uint64_t n)
{
    stats_add(&stats_device_of(device)->release_failures, n);
}

/* Reclaimer only, holding device's held lock: it holds bytes now (not kept
 * for a device without a slot of its own). */
static inline void stats_device_held(int device, uint64_t bytes)
{
    if (!stats_device_own(device))
        return;
    struct stats_device *d = stats_device_of(device);
    atomic_store_explicit(&d->held_bytes, bytes, memory_order_relaxed);
    stats_device_peak(&d->held_peak, bytes);
}

/* Once the pending entries are counted failed, in a fork child or by an
 * exit that gave up its drain: the held ones among them are abandoned too,
 * so nothing reads held (held, held_bytes and each device's held_bytes
 * read 0; peaks kept).  No other writer: no reclaimer runs in the child,
 * and exit's reclaimer writes none of them once abandoned
 * (lifecycle_counting_begin). */
void stats_abandon_held(void);

/* Reclaimer only (single writer): a pass released n entries. */
void stats_record_batch(uint64_t n);

/* Reclaimer only: one release, latency_ns after its completion was seen. */
void stats_record_latency(uint64_t latency_ns);

/* Any thread: print every counter, one line, to out (CUDEFER_STATS=1). */
void stats_print(FILE *out);

#endif
