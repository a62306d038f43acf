/*
 * Block map: from the start address of every block the block cache owns to
 * its record, so defer_free can tell in one lookup whether a pointer is one
 * of cudefer's blocks.  Sharded by address, a mutex per shard: launching
 * threads freeing different blocks rarely meet.  No CUDA call is made here.
 */
#ifndef CUDEFER_BLOCK_MAP_H
#define CUDEFER_BLOCK_MAP_H

#include <stdbool.h>

struct cache_block;

/* Any thread.  The block starting at ptr, or NULL.  The record stays valid
 * while the caller owns the block (it is released only once free). */
struct cache_block *block_map_find(const void *ptr);

/* Any thread.  As block_map_find, and *device the block's device, read
 * under the map's lock (a record in the map is not freed: its removal
 * takes that lock).  Only a holder of that device's lock may go on to use
 * the record (block_cache_find_locked). */
struct cache_block *block_map_find_device(const void *ptr, int *device);

/* Any thread, holding b's device's lock.  Adds b (keyed by b->ptr); false
 * when out of memory, or when another device's record is filed under that
 * address (only a holder of that device's lock may take it out:
 * block_stale_evict_other).  A record of b's device filed there is
 * replaced and returned in *stale (the application must have cudaFree'd
 * it behind cudefer's back), else NULL. */
bool block_map_insert(struct cache_block *b, struct cache_block **stale);

/* Any thread.  Removes b. */
void block_map_remove(struct cache_block *b);

/* Shutdown, no other thread using the map: removes every record and hands
 * it to dispose. */
void block_map_clear(void (*dispose)(struct cache_block *b));

/* Fork child: forget every record (the records themselves
 * belong to the block cache); resets the locks. */
void block_map_reset(void);

#endif
