/* Internal entry points of the public API (api.c) for the library's own
 * callers. */
#ifndef CUDEFER_API_H
#define CUDEFER_API_H

#include <cuda_runtime_api.h>

/* defer_free(ptr, stream) from a caller that knows the current device
 * (current >= 0; the pluggable entry point made it current), which the
 * look-up of a special stream handle then does not ask for again; -1:
 * defer_free itself.  Any thread; blocks where defer_free does. */
cudaError_t api_free_on(void *ptr, cudaStream_t stream, int current);

/* api_free_on for defer_pluggable_free, which says the block's size and
 * device (checked against the block's record once it is found: a
 * mismatch is reported, the block freed all the same). */
cudaError_t api_free_pluggable(void *ptr, size_t bytes, int device,
                               cudaStream_t stream, int current);

#endif
