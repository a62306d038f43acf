/* The streams recorded as users of a cached block (defer_record_stream):
 * the block's free waits for them too (block_users.h gathers them for a
 * free).  On the block's record, under its device's lock. */
#ifndef CUDEFER_BLOCK_RECORDED_H
#define CUDEFER_BLOCK_RECORDED_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "block_cache.h"

/* Any thread, the block's owner.  Records user (a stream's handle, id and
 * device: the one a special handle means, current when it was recorded)
 * as a user of the LIVE block at ptr.  cudaSuccess (also when already
 * recorded, or when the stream is the only one), cudaErrorInvalidValue
 * when ptr is no live block, cudaErrorNotSupported when it has
 * BLOCK_MAX_RECORDED streams (both reported), cudaErrorMemoryAllocation. */
cudaError_t block_recorded_add(void *ptr, const struct block_user *user);

/* Any thread, the block's owner.  The streams recorded on the LIVE (or
 * claimed: FREEING) block at ptr, copied to out (BLOCK_MAX_RECORDED of
 * room) when not NULL; how many (0 when ptr is no such block). */
size_t block_recorded_of(const void *ptr, struct block_user *out);

#endif
