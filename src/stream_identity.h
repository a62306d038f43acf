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

/* Any thread; never blocks.  Device and id of stream.  The last created
 * stream this thread asked about is cached (special handles, which depend on
 * the caller's thread and current device, never are); *cached says whether
 * the answer came from that cache.  On failure, the error with *failed
 * naming the call. */
cudaError_t stream_identity_lookup(cudaStream_t stream, int *device,
                                   unsigned long long *id, bool *cached,
                                   const char **failed);

/* Any thread: forget this thread's cached identity (it proved stale: a
 * destroyed stream's handle now names another stream). */
void stream_identity_forget(void);

/* True for 0, cudaStreamLegacy and cudaStreamPerThread. */
static inline bool stream_is_special(cudaStream_t stream)
{
    return stream == 0 || stream == cudaStreamLegacy ||
           stream == cudaStreamPerThread;
}

#endif
