/* SPDX-License-Identifier: MIT */
/* A peak reset (defer_device_stats_reset_peaks) racing a growth of the
 * device's bytes.  Once a new block of S bytes was filed while a reset ran
 * and the reset returned, the peak is at least S, whichever way the two
 * are ordered (the reset first: the growth raises the peak; the growth
 * first: the reset finds S).  A growth between the reset's read of the
 * bytes and its store of the peak, the old peak already S (so the
 * growth's compare-and-swap stores nothing), left the peak at the bytes
 * before the growth: once the block left, the peak read 0.
 *
 * t/peak_reset_gdb.sh forces that interleaving under gdb
 * (t/peak_reset_race.gdb): a read watchpoint on device 0's bytes stops
 * the reset right after it read them, and gdb calls grow_block there (the
 * other thread's growth, as cache.c makes it under the device's lock).
 * Run alone (make check runs it so too), the growth comes after the
 * reset. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "cudefer.h"
#include "stats.h"
#include "tap.h"

#define S (UINT64_C(1) << 20)

/* Whether grow_block ran inside the reset (set by gdb). */
volatile int grown_inside;

__attribute__((noinline)) void grow_block(void)
{
    stats_device_new(0, S);
}

/* Where gdb sets its watchpoint, just before the reset. */
__attribute__((noinline)) void before_reset(void)
{
    __asm__ volatile("" ::: "memory");
}

int main(void)
{
    plan_lazy();
    /* A block came and left: bytes 0, cache_bytes_peak S. */
    stats_device_new(0, S);
    stats_device_left(0, S, false);
    before_reset();
    defer_device_stats_reset_peaks(0); /* under gdb: grow_block inside */
    if (!grown_inside)
        grow_block(); /* alone: after the reset */
    diag("grown inside the reset: %s", grown_inside ? "yes (gdb)" : "no");
    stats_device_left(0, S, false); /* the block leaves */
    struct defer_device_stats d;
    defer_device_stats_get(0, &d);
    ok(d.cache_bytes_peak >= S,
       "cache_bytes_peak %llu >= %llu: the block filed during the reset "
       "counts (grown inside it: %s)", (unsigned long long)d.cache_bytes_peak,
       (unsigned long long)S, grown_inside ? "yes" : "no");
    ok(d.live_bytes_peak >= S, "live_bytes_peak %llu >= %llu",
       (unsigned long long)d.live_bytes_peak, (unsigned long long)S);
    if (grown_inside)
        ok(1, "the growth came between the reset's read and its store");
    else /* make check runs it alone too: the order it has then */
        skip("the growth came after the reset: not under gdb "
             "(t/peak_reset_gdb.sh runs it there)");
    return 0;
}
