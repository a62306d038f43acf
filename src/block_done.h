/*
 * Block done: the block cache (block_cache.h) once work is done.  An entry
 * whose work is done settles the blocks it names: a PENDING block of that
 * hand-out goes FREE, a MERGED part tells the block it was merged into, a
 * record no entry names any more is retired.  A release adopts the block
 * its free claimed; a pointer no free claimed is checked against the cache
 * before it may be cudaFree'd.  Mostly the reclaimer's (a launching thread
 * calls these in a free batch's fallback and a synchronous release; which
 * blocks leave the cache is reclaimer_cache.c's).  Each call blocks on a
 * device's mutex, holds it while it works, and makes no CUDA call.
 */
#ifndef CUDEFER_BLOCK_DONE_H
#define CUDEFER_BLOCK_DONE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block_cache.h"

/* The reclaimer, or a thread that waited for the work itself (a free
 * batch's fallback).  The event of an entry naming block (for hand-out
 * handout) completed (ok) or never will: a PENDING block of that hand-out
 * is FREE from now.  Blocks on the device's mutex, after spinning up to
 * 50 us while launching threads already wait for it. */
void block_done_event(struct cache_block *block, uint64_t handout, bool ok,
                      uint64_t now);
/* The same for n claims at once (an entry's, a free batch's), each naming
 * a record (block not NULL): the device's lock is taken once for a run of
 * one device's claims, 8 claims at most a hold. */
void block_done_claims(const struct block_claim *claims, size_t n, bool ok,
                       uint64_t now);

/* Any thread releasing a pointer whose work is done (reclaimer, or a
 * synchronous release), of a free that claimed a block (claim->block not
 * NULL); blocks on the device's mutex: that block is FREE now, reusable by
 * any stream.  A record dropped meanwhile (its memory was cudaFree'd behind
 * cudefer's back and its address allocated again) is reported and let go.
 * Either way the pointer must not be cudaFree'd. */
void block_done_adopt(const struct block_claim *claim);

/* Any thread releasing a pointer whose free claimed no block (it was none
 * when the free was accepted); blocks on the device's mutex.  True
 * (reported) when a whole segment starts at ptr now, which must not be
 * cudaFree'd under the cache (its address was cudaFree'd and allocated
 * again behind cudefer's back, or it is a block freed twice after cudefer
 * released it); false when ptr is no block, or a piece of a segment (the
 * pointer was interior when deferred: cudaFree refuses it as it would have
 * then).  Changes no block. */
bool block_done_unclaimed_is_block(void *ptr);

#endif
