/* The streams a free's blocks were recorded on (defer_record_stream,
 * block_cache.h's struct block_user), on the launching thread inside a
 * defer call: gathering them, and making the device a recorded special
 * handle (0, cudaStreamLegacy) named current for a CUDA call on it, so
 * that a block recorded on device 1's legacy stream and freed while device
 * 0 is current waits for device 1's legacy stream (found by a review
 * helper: device 0's was waited for, and the block reused early). */
#ifndef CUDEFER_BLOCK_USERS_H
#define CUDEFER_BLOCK_USERS_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "block_cache.h"
#include "cuda.h"
#include "request_args.h"

/* How many streams the blocks of a's free were recorded on (a stream
 * recorded on several of them counted once when out is not NULL); their
 * frees must wait for those streams too.  Copied to out (64 of room) when
 * not NULL; a count above 64 means too many.  Never blocks. */
size_t block_users_of(const struct request_args *a, struct block_user *out);

/* Makes the device u's handle means current, where it is a special handle
 * of another device than the current one (a created stream carries its
 * device: nothing to do).  cudaSuccess or cuda_switch_device's error, *call
 * naming the call that failed; cuda_switch_back makes the caller's
 * device current again. */
cudaError_t block_users_enter(const struct block_user *u,
                              struct cuda_switch *sw, const char **call);

/* Whether u and v are the same stream: the same handle, and for a special
 * handle (0, the legacy or the per-thread stream) the same device, where a
 * device below 0 means the caller's (asked once, sw).  Before, v's handle
 * alone was compared with u on the device current now: a block recorded on
 * device 1's legacy stream and then on device 0's, freed from device 0,
 * took device 0's for device 1's and never waited for it (a mutation
 * test's find). */
bool block_users_same(const struct block_user *u, const struct block_user *v,
                      struct cuda_switch *sw);

#endif
