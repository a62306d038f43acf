/* Making a device current for a CUDA call and the caller's current again
 * after it, on any thread.  cudefer does this where a call must be made on
 * a device other than the caller's current one: a special stream handle (0,
 * cudaStreamLegacy, cudaStreamPerThread) means the current device's stream,
 * and events, cudaMalloc and a synchronous release belong to one device.
 * The caller's device is asked once, through the driver's query
 * (driver_calls.h), and nothing is switched where the device is current
 * already, so a thread that works on one device makes no cudaSetDevice and
 * no context is made current that was not.  The reclaimer thread keeps
 * its own current device (reclaimer_state.h) and never switches back. */
#ifndef CUDEFER_DEVICE_SWITCH_H
#define CUDEFER_DEVICE_SWITCH_H

#include <cuda_runtime_api.h>

/* The caller's device and the one current since (both -1: not asked
 * yet).  Start with DEVICE_SWITCH_NONE; one per call of cudefer's, on its
 * thread's stack (any thread may switch). */
struct device_switch {
    int caller, on;
};
#define DEVICE_SWITCH_NONE ((struct device_switch){-1, -1})

/* The caller's device in *device, asked the first time only.  cudaSuccess
 * or the query's error (asked again next time).  Never blocks on the GPU. */
cudaError_t device_switch_caller(struct device_switch *sw, int *device);

/* Make device current (nothing to do where it is).  cudaSuccess, or the
 * error of the query or of cudaSetDevice, *call (when not NULL) naming the
 * one that failed.  A failed cudaSetDevice is cleared from the thread's
 * last error (but for the device's sticky error), so that the
 * application's next cudaGetLastError (PyTorch's launch check) does not
 * read cudefer's; a failed query through the driver leaves the last error
 * as it was (driver_calls.h).  Never blocks on the GPU. */
cudaError_t device_switch_to(struct device_switch *sw, int device,
                             const char **call);

/* Make the caller's device current again where another one was made
 * current; cudaSuccess or cudaSetDevice's error (cleared from the last
 * error as above), which is said naming what (the cudefer call) unless
 * what is NULL (the caller says it).  sw may be used again after it.
 * Never blocks on the GPU. */
cudaError_t device_switch_back(struct device_switch *sw, const char *what);

#endif
