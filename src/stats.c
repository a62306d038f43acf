/* SPDX-License-Identifier: MIT */
/* Statistics counters, the defer_stats_get snapshot and the one-line print,
 * all from the list in stats_counters.h. */
#include "stats.h"

#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "cudefer.h"
#include "event_pool.h"
#include "report.h"

struct stats stats;
struct stats_device stats_devices[DEFER_STATS_MAX_DEVICES + 1];

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

/* The upper bound of the bucket holding the median latency, at most max_us
 * (the largest latency seen): the bound is above every latency its bucket
 * holds, so where the median's bucket holds the largest (one release, say)
 * it alone would read above the largest. */
static uint64_t latency_p50_us(uint64_t max_us)
{
    uint64_t total = 0, seen = 0;
    for (int i = 0; i < LATENCY_BUCKETS; i++)
        total += read(&stats.latency[i]);
    for (int i = 0; i < LATENCY_BUCKETS && total > 0; i++) {
        seen += read(&stats.latency[i]);
        if (2 * seen >= total)
            return (UINT64_C(1) << i) < max_us ? UINT64_C(1) << i : max_us;
    }
    return 0;
}

/* ---- the public struct agrees with the list ------------------------------ */

/* struct defer_stats is written out in cudefer.h for its readers; the list
 * in stats_counters.h must name the same uint64_t fields in the same order.
 * A mirror of the list, then each field's offset compared. */
#define STATS_MIRROR(name) uint64_t name;
struct stats_mirror {
    STATS_FIELDS(STATS_MIRROR, STATS_MIRROR, STATS_MIRROR, STATS_MIRROR)
};
#define STATS_SAME_PLACE(name)                                              \
    _Static_assert(offsetof(struct defer_stats, name) ==                    \
                       offsetof(struct stats_mirror, name) &&               \
                   sizeof(((struct defer_stats *)0)->name) == sizeof(uint64_t), \
                   "struct defer_stats and stats_counters.h disagree at " #name);
STATS_FIELDS(STATS_SAME_PLACE, STATS_SAME_PLACE, STATS_SAME_PLACE,
             STATS_SAME_PLACE)
_Static_assert(sizeof(struct defer_stats) == sizeof(struct stats_mirror),
               "struct defer_stats has fields stats_counters.h does not list");

/* Where the fields of cudefer 0.1.0's struct defer_stats end: the plain
 * defer_stats_get symbol writes no further (its callers' structs end there)
 * and a smaller size is refused. */
#define STATS_END_0_1_0                                                     \
    (offsetof(struct defer_stats, STATS_LAST_FIELD_0_1_0) + sizeof(uint64_t))

/* ---- gauges: computed when the snapshot is taken ------------------------- */

/* Accepted and neither released nor failed; the finished counts in *snap
 * were read before deferred, so this never underflows from a race. */
static uint64_t stats_gauge_pending(const struct defer_stats *snap)
{
    uint64_t done = snap->released + snap->failed;
    return snap->deferred > done ? snap->deferred - done : 0;
}

static uint64_t stats_gauge_events_in_pool(const struct defer_stats *snap)
{
    (void)snap;
    return event_pool_idle_count();
}

/* Clamped to the snapshot's own latency_max_us, read before it: a latency
 * recorded in between counts in the histogram, not in that maximum, and
 * still the median never reads above the maximum beside it. */
static uint64_t stats_gauge_latency_p50_us(const struct defer_stats *snap)
{
    return latency_p50_us(snap->latency_max_us);
}

/* ---- the overflow slot: devices without a slot of their own ------------ */

/* The overflow slot (Note [Device counters], stats.h): written under the
 * cache locks of several devices at once, so by read-modify-writes; its
 * peaks and held bytes are not kept. */
static struct stats_device *const overflow =
    &stats_devices[DEFER_STATS_MAX_DEVICES];

void stats_overflow_hit(uint64_t size, bool same_stream)
{
    stats_sub(&overflow->free_bytes, size);
    stats_add(&overflow->reused, 1);
    if (same_stream)
        stats_add(&overflow->reused_same_stream, 1);
    stats_add(&overflow->allocs, 1);
}

void stats_overflow_new(uint64_t size)
{
    stats_add(&overflow->bytes, size);
    stats_add(&overflow->allocs, 1);
}

void stats_overflow_freed(uint64_t size)
{
    stats_add(&overflow->free_bytes, size);
}

void stats_overflow_left(uint64_t size, bool was_free)
{
    stats_sub(&overflow->bytes, size);
    if (was_free)
        stats_sub(&overflow->free_bytes, size);
}

/* ---- the block cache's counters: sums over the devices ------------------ */

/* One slot's free bytes and bytes, read in that order, the free bytes no
 * more than the bytes: a block that left between the two reads counts as
 * not free, so live bytes never read below 0. */
static void slot_bytes(struct stats_device *d, uint64_t *bytes,
                       uint64_t *free_bytes)
{
    uint64_t f = read(&d->free_bytes), b = read(&d->bytes);
    *bytes = b;
    *free_bytes = f < b ? f : b;
}

/* Any thread; takes no lock.  Slot d's share of the DEVICE fields of
 * stats_counters.h, into the fields of those names of *one (the others
 * left as they are). */
static void slot_read(struct stats_device *d, struct defer_stats *one)
{
    slot_bytes(d, &one->cache_bytes, &one->cache_free_bytes);
    one->cache_mallocs = read(&d->mallocs);
    one->cache_releases = read(&d->releases);
    one->cache_release_failures = read(&d->release_failures);
    one->reused_same_stream = read(&d->reused_same_stream);
    one->reused = read(&d->reused);
}

/* slot_read fills as many fields as the list has DEVICE fields. */
#define STATS_NONE(name)
#define STATS_ONE(name) +1
enum { STATS_SUMMED = 0 STATS_FIELDS(STATS_NONE, STATS_NONE, STATS_NONE,
                                     STATS_ONE) };
_Static_assert(STATS_SUMMED == 7,
               "slot_read and the DEVICE fields of stats_counters.h disagree");
#undef STATS_NONE
#undef STATS_ONE

/* Any thread; takes no lock.  Each DEVICE field of *snap (0 before) becomes
 * the sum over every slot, the overflow slot included (Note [Device
 * counters], stats.h): for the fields defer_device_stats_get shows, the sum
 * of what it reads over the devices, plus the devices that have no slot of
 * their own.  Read slot by slot, field by field: under load a sum may mix
 * moments, as the snapshot's fields do. */
static void stats_sum_devices(struct defer_stats *snap)
{
#define STATS_ADD(name) snap->name += one.name;
#define STATS_SKIP(name)
    for (int i = 0; i <= DEFER_STATS_MAX_DEVICES; i++) {
        struct defer_stats one;
        slot_read(&stats_devices[i], &one);
        STATS_FIELDS(STATS_SKIP, STATS_SKIP, STATS_SKIP, STATS_ADD)
    }
#undef STATS_ADD
#undef STATS_SKIP
}

/* ---- the snapshot --------------------------------------------------------- */

/* Any thread; never blocks.  Every field of *snap from the list: the
 * finished counts first, then the other counters, then the sums over the
 * devices, then the gauges. */
static void stats_snapshot(struct defer_stats *snap)
{
#define STATS_READ(name) snap->name = read(&stats.name);
#define STATS_SKIP(name)
#define STATS_GAUGE(name) snap->name = stats_gauge_##name(snap);
    memset(snap, 0, sizeof *snap);
    STATS_FIELDS(STATS_SKIP, STATS_READ, STATS_SKIP, STATS_SKIP)
    STATS_FIELDS(STATS_READ, STATS_SKIP, STATS_SKIP, STATS_SKIP)
    for (int i = 0; i < THREAD_SHARDS; i++) /* after the finished counts */
        snap->deferred += read(&thread_shards[i].deferred);
    stats_sum_devices(snap);
    STATS_FIELDS(STATS_SKIP, STATS_SKIP, STATS_GAUGE, STATS_SKIP)
#undef STATS_READ
#undef STATS_SKIP
#undef STATS_GAUGE
}

/* Public, any thread; never blocks.  The whole fields of the snapshot that
 * fit in size bytes are written to out; bytes past this library's struct
 * (a caller built against a later header) are zeroed: counters this
 * library does not keep read 0.  A NULL out writes nothing; a size below
 * 0.1.0's fields writes nothing and is reported. */
void defer_stats_get_sized(struct defer_stats *out, size_t size)
{
    if (out == NULL)
        return;
    if (size < STATS_END_0_1_0) {
        stats_add(&stats.rejected, 1);
        report("defer_stats_get_sized: size %zu is smaller than any struct "
               "defer_stats (%zu bytes in cudefer 0.1.0): nothing written",
               size, (size_t)STATS_END_0_1_0);
        return;
    }
    struct defer_stats snap;
    stats_snapshot(&snap);
    size_t known = size < sizeof snap ? size : sizeof snap;
    known -= known % sizeof(uint64_t); /* whole fields only */
    memcpy(out, &snap, known);
    if (size > sizeof snap)
        memset((char *)out + sizeof snap, 0, size - sizeof snap);
}

/* Public, any thread: cudefer 0.1.0's symbol, kept for the programs built
 * against it (and for callers that bypass the header's macro: dlsym,
 * ctypes).  Writes 0.1.0's fields only, never more. */
void (defer_stats_get)(struct defer_stats *out)
{
    defer_stats_get_sized(out, STATS_END_0_1_0);
}

/* ---- per-device counters ------------------------------------------------- */

/* Any thread: whether device names a slot; if not, says so for who
 * (also: what else who takes, "" if nothing). */
static bool device_in_range(const char *who, int device, const char *also)
{
    if (device >= 0 && device < DEFER_STATS_MAX_DEVICES)
        return true;
    stats_add(&stats.rejected, 1);
    report("%s: device %d is out of range: cudefer counts devices 0 .. %d "
           "(DEFER_STATS_MAX_DEVICES - 1)%s: refused", who, device,
           DEFER_STATS_MAX_DEVICES - 1, also);
    return false;
}

static uint64_t larger(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Any thread; takes no lock.  device's counters (Note [Device counters],
 * stats.h), read field by field: the bytes as slot_bytes reads them; a
 * peak below its current value (a reset raced a growth) reads as that
 * value. */
static void device_snapshot(int device, struct defer_device_stats *snap)
{
    struct stats_device *d = stats_device_of(device);
    memset(snap, 0, sizeof *snap);
    uint64_t bytes, free_bytes;
    slot_bytes(d, &bytes, &free_bytes);
    snap->cache_bytes = bytes;
    snap->cache_free_bytes = free_bytes;
    snap->live_bytes = bytes - free_bytes;
    snap->cache_bytes_peak = larger(read(&d->bytes_peak), bytes);
    snap->live_bytes_peak = larger(read(&d->live_peak), snap->live_bytes);
    snap->held_bytes = read(&d->held_bytes);
    snap->held_bytes_peak = larger(read(&d->held_peak), snap->held_bytes);
    snap->cache_mallocs = read(&d->mallocs);
    snap->cache_releases = read(&d->releases);
    snap->allocs = read(&d->allocs);
    snap->reused = read(&d->reused);
    snap->cache_release_failures = read(&d->release_failures);
}

/* Public, any thread; takes no lock, never blocks.  The whole fields of
 * device's snapshot that fit in size bytes go to out, and bytes past this
 * library's struct are zeroed (a caller built against a later header). */
cudaError_t defer_device_stats_get_sized(int device,
                                         struct defer_device_stats *out,
                                         size_t size)
{
    static const char who[] = "defer_device_stats_get_sized";
    if (out == NULL) {
        stats_add(&stats.rejected, 1);
        report("%s: out is NULL: refused", who);
        return cudaErrorInvalidValue;
    }
    if (size < sizeof(uint64_t)) {
        stats_add(&stats.rejected, 1);
        report("%s: size %zu holds no field of struct defer_device_stats "
               "(%zu bytes): refused", who, size,
               sizeof(struct defer_device_stats));
        return cudaErrorInvalidValue;
    }
    if (!device_in_range(who, device, ""))
        return cudaErrorInvalidValue;
    struct defer_device_stats snap;
    device_snapshot(device, &snap);
    size_t known = size < sizeof snap ? size : sizeof snap;
    known -= known % sizeof(uint64_t); /* whole fields only */
    memcpy(out, &snap, known);
    if (size > sizeof snap)
        memset((char *)out + sizeof snap, 0, size - sizeof snap);
    return cudaSuccess;
}

/* Any thread: each peak of slot d becomes its current value.  A growth
 * between a read here and its store found the old peak as high and left
 * it (stats_device_peak), then the store put the older, lower value: each
 * peak is raised again from fresh reads after the stores, so that it is
 * never below its counter's value at that moment. */
static void device_reset_peaks(struct stats_device *d)
{
    uint64_t free_bytes = read(&d->free_bytes), bytes = read(&d->bytes);
    stats_set(&d->bytes_peak, bytes);
    stats_set(&d->live_peak, bytes > free_bytes ? bytes - free_bytes : 0);
    stats_set(&d->held_peak, read(&d->held_bytes));
    free_bytes = read(&d->free_bytes);
    bytes = read(&d->bytes);
    stats_device_peak(&d->bytes_peak, bytes);
    stats_device_peak(&d->live_peak,
                      bytes > free_bytes ? bytes - free_bytes : 0);
    stats_device_peak(&d->held_peak, read(&d->held_bytes));
}

/* Public, any thread; takes no lock, never blocks. */
cudaError_t defer_device_stats_reset_peaks(int device)
{
    if (device == -1) {
        for (int d = 0; d < DEFER_STATS_MAX_DEVICES; d++)
            device_reset_peaks(&stats_devices[d]);
        return cudaSuccess;
    }
    if (!device_in_range("defer_device_stats_reset_peaks", device,
                         ", or -1 for all"))
        return cudaErrorInvalidValue;
    device_reset_peaks(&stats_devices[device]);
    return cudaSuccess;
}

void stats_abandon_held(void)
{
    stats_set(&stats.held, 0);
    stats_set(&stats.held_bytes, 0);
    for (int d = 0; d < DEFER_STATS_MAX_DEVICES; d++)
        stats_set(&stats_devices[d].held_bytes, 0);
}

/* Any thread: every field of the list, "name value", on one line. */
void stats_print(FILE *out)
{
    struct defer_stats s;
    char line[2048];
    size_t used = 0;
    stats_snapshot(&s);
#define STATS_PRINT(name)                                                   \
    if (used < sizeof line)                                                 \
        used += (size_t)snprintf(line + used, sizeof line - used,          \
                                 " " #name " %" PRIu64, s.name);
    STATS_FIELDS(STATS_PRINT, STATS_PRINT, STATS_PRINT, STATS_PRINT)
#undef STATS_PRINT
    fprintf(out, "cudefer: stats:%s\n", line);
}
