/*
 * Block records: the struct cache_block records of a device's cache, kept
 * for reuse under the device's lock instead of going back to malloc.
 *
 * A request cut from a larger block needs a new record, and a merge frees
 * one: in the PyTorch LM's trace, one request in four of each.  The cut
 * happens on the launching thread and most records are freed by the
 * reclaimer (a merged piece whose entry completed), so glibc's per-thread
 * caches never matched them up: each calloc took the arena's slow path, 19
 * cache lines missed a cut on average (bench/cold-calls under callgrind's
 * cache simulation, 2026-11-26), and the reclaimer's free() took the
 * launching thread's arena lock.  Kept here, a record comes back as the
 * lines it is written through.
 *
 * A record keeps its device for good (records never move between devices)
 * and its array of recorded streams (hidden by nrecorded 0).  A retired
 * record is BLOCK_RETIRED until it is reused; no thread reads it meanwhile
 * (block_cache_find_locked asks the map again under the lock).
 *
 * block_records_new, _retire and _kept are called with the device's lock
 * held (block_cache.c, block_done.c, block_segments.c, block_leave.c) and
 * make no CUDA call; none frees memory under it, which could wait for a
 * malloc arena's lock (block_records_new callocs a record when none is
 * kept).
 */
#ifndef CUDEFER_BLOCK_RECORDS_H
#define CUDEFER_BLOCK_RECORDS_H

#include <stddef.h>

#include "block_bins.h"

/* Records a device keeps for reuse at most; more go back to malloc (the
 * reclaimer frees them), so that a program that stopped cutting blocks
 * keeps at most 1024 records of 136 bytes a device, and the recorded
 * arrays (63 x 24 bytes) of those that had one. */
#define BLOCK_RECORDS_KEPT 1024

/* Lock held: a zeroed record, the last one c kept if any (its device and
 * its recorded array kept), else a new one from calloc; NULL when out of
 * memory. */
struct cache_block *block_records_new(struct device_cache *c);

/* Lock held: record b, which nothing names any more (out of every list and
 * of the block map), is kept by c for its next block, or goes to c's
 * surplus (for block_records_collect) when c keeps BLOCK_RECORDS_KEPT
 * already. */
void block_records_retire(struct device_cache *c, struct cache_block *b);

/* The reclaimer (any thread not holding c's lock; takes it when there is
 * something to take): frees c's surplus records.  Returns how many. */
size_t block_records_collect(struct device_cache *c);

/* Lock held: how many records c keeps now. */
size_t block_records_kept(const struct device_cache *c);

/* Shutdown (no other thread uses c): the records c keeps and its surplus
 * go back to malloc. */
void block_records_free_all(struct device_cache *c);

#endif
