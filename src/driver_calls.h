/*
 * Driver calls: the four CUDA calls on the launching thread's path (the
 * capture check, the event record, the event creation and the current
 * device) made through the driver's own entry points, found through the
 * runtime (no link to libcuda), because the runtime's wrappers add
 * 0.04-0.09 us to each: on the H100 cudaStreamIsCapturing 0.14 us against
 * cuStreamIsCapturing's 0.06, cudaEventRecord 0.38 against 0.30,
 * cudaEventCreateWithFlags 0.33 against 0.24, cudaGetDevice 0.10 against
 * cuCtxGetDevice's 0.06 (bench-call-parts' drv_* parts, p50 on an idle
 * created stream, bench/results/2026-11-27-h100-call-parts-driver.txt).
 *
 * Each call means what the runtime's call of the same name means for a
 * library built without per-thread default streams (stream 0 is the legacy
 * stream; cudaStreamPerThread and cudaStreamLegacy as the runtime reads
 * them) and returns the same cudaError_t (the runtime's codes are the
 * driver's numbers).  Where the driver answers that the thread has no
 * current context (a thread whose first CUDA call this is, a context
 * destroyed under it) or the entry points could not be had, the runtime's
 * call is made instead and does what the application's own call would
 * (the capture check, record and creation make the current device's
 * primary context current; cudaGetDevice answers the thread's device
 * without).  Unlike the runtime's, a failed driver call leaves the
 * thread's last error (cudaGetLastError) as it was: an error of cudefer's
 * is returned, not left for the application's next check.
 */
#ifndef CUDEFER_DRIVER_CALLS_H
#define CUDEFER_DRIVER_CALLS_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>

/* The start of the library, for its first call what (the lock held,
 * before any call is admitted): look the entry points up, the driver's
 * cuPointerGetAttributes first (alloc_info.h; not found: said once, and
 * allocation sizes and pools are unknown), then, when fast
 * (CUDEFER_DRIVER_CALLS, 1 by default), the four calls below (one not
 * found leaves that call to the runtime, silently: it works, only slower;
 * fast false leaves all four to it).  Never blocks on the GPU. */
void driver_calls_resolve(const char *what, bool fast);

/* Fork child: forget the entry points (CUDA cannot be used there). */
void driver_calls_reset(void);

/* Any thread: the driver's cuPointerGetAttributes, or NULL (not found, or
 * not looked up yet). */
typedef CUresult (*driver_calls_pointer_attributes_fn)(unsigned int,
                                                       CUpointer_attribute *,
                                                       void **, CUdeviceptr);
driver_calls_pointer_attributes_fn driver_calls_pointer_attributes(void);

/* Any thread; never block on the GPU.  cudaStreamIsCapturing,
 * cudaEventRecord, cudaEventCreateWithFlags(cudaEventDisableTiming),
 * cudaGetDevice. */
cudaError_t driver_calls_is_capturing(cudaStream_t stream,
                                      enum cudaStreamCaptureStatus *status);
cudaError_t driver_calls_event_record(cudaEvent_t event, cudaStream_t stream);
cudaError_t driver_calls_event_create(cudaEvent_t *event);
cudaError_t driver_calls_get_device(int *device);

#endif
