/*
 * Stale block records: a record found in the block map under the address
 * of memory cudefer just allocated (block_cache_add).  Its memory was
 * freed with cudaFree behind cudefer's back (the application's mistake,
 * reported) and the runtime gave the address out again: the record leaves
 * every list of its device's cache, and is forgotten once no entry names
 * it.  Called by block_cache.c only; no CUDA call.
 */
#ifndef CUDEFER_BLOCK_STALE_H
#define CUDEFER_BLOCK_STALE_H

#include <stdbool.h>
#include <stddef.h>

#include "block_bins.h"

/* c's lock held (c: stale's device's): stale leaves every list of c.
 * Returns whether an entry still names it, itself or through a part
 * merged into it (then the last of them forgets it: its claim let go, or
 * the reclaimer once its event is done; else the caller does, once the
 * lock is let go). */
bool block_stale_drop_locked(struct device_cache *c,
                             struct cache_block *stale);

/* Any thread: says that the block of size bytes at ptr was freed with
 * cudaFree instead of defer_free, and that its record is dropped. */
void block_stale_report(const void *ptr, size_t size);

/* Any thread holding no device's lock, before it files memory of device
 * at ptr (block_cache_add): a record of another device's filed under ptr
 * (freed with cudaFree on that device behind cudefer's back, the address
 * now device's) leaves that device's lists and the map under that
 * device's lock, and is reported; a MERGED one is only unfiled.  A record
 * of device itself is left to the caller's hold. */
void block_stale_evict_other(const void *ptr, int device);

#endif
