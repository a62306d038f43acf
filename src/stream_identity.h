/* SPDX-License-Identifier: MIT */
/*
 * Stream identity: the device and the unique id (cudaStreamGetId) of a
 * stream handle, as the launching thread sees it.  The id, not the handle,
 * names a stream: the per-thread default stream is a different stream on
 * every thread, the legacy stream one stream per device, and a destroyed
 * stream's handle value may come back for a new stream.
 */
#ifndef CUDEFER_STREAM_IDENTITY_H
#define CUDEFER_STREAM_IDENTITY_H

#include <stdbool.h>
#include <cuda_runtime_api.h>

/* Any thread; never blocks.  Device and id of stream.  Each thread caches
 * the identities of the last 64 or so handles it asked about: a created
 * stream by its handle; a special handle, which names
 * the caller's stream on its current device, by the handle and the current
 * device (one cudaGetDevice call).  *cached says whether the answer came
 * from the cache.  On failure, the error with *failed naming the call.
 * A destroyed stream's handle may come back for a new stream: a cached
 * identity is then stale.  Recording on it fails when the new stream is on
 * another device (the caller forgets it and asks again); otherwise an entry
 * joins the old stream's FIFO, which only delays it (its event is recorded
 * on the stream its work is on, and shared with other entries only on the
 * exact identity: stream_lane.h).
 * exact: never stale.  A cached identity of a created stream is checked
 * with one cudaStreamGetId call (a stream's id is unique for the life of
 * the process, across its devices, and never given again: measured on two
 * H200s, bench/results/h200x2-stream-ids.txt, so the id alone tells a new
 * stream of another device) and looked up afresh if it changed (a
 * special handle's cannot go stale).  Callbacks, which keep an order per stream, ask this
 * way, and so does the block cache: a stale identity there would hand a
 * block pending on a destroyed stream's work to the new stream that got
 * its handle. */
cudaError_t stream_identity_lookup(cudaStream_t stream, bool exact,
                                   int *device, unsigned long long *id,
                                   bool *cached, const char **failed);

/* The same, for a caller that knows the current device (current >= 0:
 * the pluggable entry points made it current), which a special handle's
 * look-up then does not ask for again (cudaGetDevice); current < 0: as
 * stream_identity_lookup. */
cudaError_t stream_identity_lookup_on(cudaStream_t stream, bool exact,
                                      int current, int *device,
                                      unsigned long long *id, bool *cached,
                                      const char **failed);

/* Any thread; no CUDA call: the identity of a special handle (current:
 * the current device, which must be known) when this thread has it
 * cached, in *device and *id; false when not.  A special handle's cannot
 * go stale, so it is what an exact look-up would give. */
bool stream_identity_cached_special(cudaStream_t stream, int current,
                                    int *device, unsigned long long *id);

/* Any thread: forget this thread's cached identities of stream (they proved
 * stale: a destroyed stream's handle now names another stream). */
void stream_identity_forget(cudaStream_t stream);

/* True for 0 and cudaStreamLegacy: the legacy stream, which is never
 * destroyed and cannot be captured (cudaStreamBeginCapture refuses it). */
static inline bool stream_is_legacy(cudaStream_t stream)
{
    return stream == 0 || stream == cudaStreamLegacy;
}

/* True for 0, cudaStreamLegacy and cudaStreamPerThread. */
static inline bool stream_is_special(cudaStream_t stream)
{
    return stream == 0 || stream == cudaStreamLegacy ||
           stream == cudaStreamPerThread;
}

#endif
