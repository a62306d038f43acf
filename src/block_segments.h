/*
 * Block segments: cutting requests from larger cached blocks and merging
 * freed neighbours again (block_cache.h says when).  A segment is one
 * allocation of cudefer's; its blocks are linked in address order
 * (seg_prev, seg_next).  Every function is called with the device's mutex
 * held, by the block cache's files (block_cache.c, block_done.c,
 * block_leave.c); none makes a CUDA call or blocks.
 */
#ifndef CUDEFER_BLOCK_SEGMENTS_H
#define CUDEFER_BLOCK_SEGMENTS_H

#include <stdbool.h>
#include <stddef.h>

#include "block_bins.h"

/* A request of piece bytes (a multiple of 512) on the stream whose PENDING
 * blocks are own (NULL: none) that no cached block fits: cut from the end
 * of the smallest block in the bins from lo up, FREE or PENDING on own
 * (size for size own's first), which keeps the rest with its state, its
 * entries and its hand-out.  Returns the piece's new record, in no list
 * (*same_stream: cut from a PENDING block), or NULL (nothing changed) when
 * no block is large enough or no record could be made. */
struct cache_block *block_segments_split(struct device_cache *c,
                                         struct stream_bins *own, int lo,
                                         size_t piece, bool *same_stream);

/* FREE b merges with its FREE neighbours no entry names (b's record may be
 * freed): memory cut for one size serves any size again, and a segment all
 * free is whole. */
void block_segments_merge_free(struct device_cache *c,
                               struct cache_block *b);

/* b, just PENDING on its stream, merges with its neighbours PENDING on
 * the same stream, the left one absorbing the right: b's right neighbour
 * becomes MERGED into b, b into its left neighbour (block_cache.h); a
 * MERGED record stays filed under its address until its entries are done
 * (block_done_claims unfiles it).  A FREE neighbour that nothing
 * names joins too (its memory PENDING on the stream from now, as b's: a
 * request there may use it all; other streams wait for b's work): b
 * absorbs a right one, and a left one, PENDING first, absorbs b.  Without
 * that, memory freed in pieces stayed in two blocks whenever one piece's
 * work completed before the next was freed, and a request of their
 * combined size missed (bench/replay-trace of the H100 LM trace, the GPU
 * under a step behind: the pool at 1.154x the live peak, 1.022x with it). */
void block_segments_merge_pending(struct device_cache *c,
                                  struct cache_block *b);

/* ---- the segment index ----------------------------------------------- */

/* A new segment [ptr, ptr + size) of c's joins c's index, which drops the
 * ranges it overlaps first (their memory was cudaFree'd behind cudefer's
 * back and allocated again).  False (nothing changed) when out of
 * memory. */
bool block_segments_file(struct device_cache *c, const void *ptr,
                         size_t size);

/* The segment starting at ptr, handed back, leaves c's index. */
void block_segments_unfile(struct device_cache *c, const void *ptr);

/* Whether ptr lies in one of c's segments; then *block is the block that
 * holds it (NULL if none is linked there, as after a record was dropped).
 * A binary search, then a walk along that segment's blocks. */
bool block_segments_holds(struct device_cache *c, const void *ptr,
                          struct cache_block **block);

/* Shutdown: c's index goes. */
void block_segments_index_free(struct device_cache *c);

#endif
