/* SPDX-License-Identifier: MIT */
/*
 * The CUDA layer: every CUDA call of cudefer's goes through this header and
 * cuda.c, so that a new call means a wrapper here, its fake in t/fake and
 * its row in the fault table (t/faults.h).  Calls on the launching
 * thread's path are static inline below (no cost over the call itself);
 * the rest are in cuda.c.
 *
 * Driver-direct calls.  The launching thread's four calls (the capture
 * check, the event record, the event creation, the current device) go to
 * the driver's own entry points, looked up through the runtime at the
 * start (cudaGetDriverEntryPointByVersion: cudefer needs no link to
 * libcuda), because the runtime's wrappers add 0.04-0.09 us to each
 * (cuStreamIsCapturing 0.06 us where cudaStreamIsCapturing takes 0.14, on
 * an H100).  Each means what the runtime's call of the same name means for
 * a library built without per-thread default streams (stream 0 is the
 * legacy stream) and returns the same cudaError_t (the runtime's codes are
 * the driver's numbers).  Where the driver answers that the thread has no
 * current context (its first CUDA call, a context destroyed under it), an
 * entry point was not found, or CUDEFER_DRIVER_CALLS=0, the runtime's call
 * is made instead and does what the application's own call would.  The
 * driver's cuPointerGetAttributes answers the allocation facts (size,
 * memory pool, kind) that the runtime cannot.  Everything else, and the
 * same four calls off the launching path (the *_runtime flavours), goes
 * through the runtime.
 *
 * Errors.  A call returns CUDA's error and says nothing, but for what the
 * layer alone knows (a missing entry point, a failed switch back, a failed
 * allocation query: each says so below).  The caller, which knows what the
 * call was for, says a failure once, through cuda_report_failure, which
 * says nothing of cudaErrorCudartUnloading (the process is exiting: every
 * call fails alike, and the failures are counted).  A sticky error
 * (cuda_error_is_sticky: a kernel fault) is the device's, not the call's:
 * every later call on the device fails the same way, so the device is
 * marked failed (lifecycle_fail_device, reclaimer_fail_device) and the
 * error is never cleared.  The thread's last error (cudaGetLastError,
 * which PyTorch's launch checks read after every kernel) is the
 * application's: a failure that is cudefer's own business (a device
 * switch, a pointer probed, a query answered not ready, an entry point
 * looked up) leaves it as it was: the driver-direct calls never touch it,
 * and after the runtime's calls of that kind the layer clears the error
 * they left (not a sticky one).  A failure that the defer call returns to
 * its caller (its stream is unknown, say) stays as the runtime left it, as
 * the application's own call would have.
 *
 * Device switch.  A device is made current only where a call must be made
 * on another device than the caller's: a special stream handle (0,
 * cudaStreamLegacy, cudaStreamPerThread) means the current device's
 * stream, and events, cudaMalloc and a synchronous release belong to one
 * device.  The caller's device is asked once per defer call (through the
 * driver), nothing is switched where the device is current already, and
 * the caller's device is made current again before the call returns
 * (cuda_switch_back): a thread that works on one device makes no
 * cudaSetDevice.  A thread with no current context is not given back
 * "none": the runtime's calls make its runtime device's context current
 * (measured: bench/results/h200x2-stream-ids.txt), as the application's
 * own would, and telling would cost every call a cuCtxGetCurrent
 * (cudefer.h's limit).  The reclaimer keeps its own current device
 * (reclaimer_state.h) and never switches back (cuda_set_device).
 *
 * Capture modes.  A query or a wait on a launching thread runs in the
 * relaxed mode (cuda_event_query_relaxed, cuda_stream_synchronize_relaxed):
 * in the thread's own mode (global by default) it is refused while the
 * thread captures another stream or any thread captures in the global
 * mode, and invalidates that capture.  The reclaimer runs relaxed
 * throughout.
 */
#ifndef CUDEFER_CUDA_H
#define CUDEFER_CUDA_H

/* The entry points are the legacy-stream flavours (cudaEnableLegacyStream),
 * as the runtime calls they stand in for are when the library is built
 * without per-thread default streams; built with them, the two would read
 * stream 0 differently. */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "cuda.h looks up the legacy-stream entry points: build cudefer without CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- start and fork ------------------------------------------------------ */

/* Any thread, at the start (its lock held, before any call is admitted;
 * what names the defer call): looks up cuPointerGetAttributes (not found:
 * said; allocation facts unknown) and, when fast (CUDEFER_DRIVER_CALLS),
 * the four launching-path calls (one not found: the runtime's, silently).
 * Once until cuda_forget_entry_points; never blocks on the GPU. */
void cuda_resolve_entry_points(const char *what, bool fast);

/* Any thread, in a fork child or after a start that failed (its lock
 * held): forgets the entry points (runtime calls until the next start
 * looks them up). */
void cuda_forget_entry_points(void);

/* Any thread, at the start: cudaGetDeviceCount (initializes the runtime). */
cudaError_t cuda_device_count(int *count);

/* ---- the launching path, driver-direct ----------------------------------- */

/* Any thread; never blocks on the GPU: cudaStreamIsCapturing. */
cudaError_t cuda_stream_is_capturing(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *status);

/* Any thread; never blocks on the GPU (may wait for room in the stream's
 * queue): cudaEventRecord. */
cudaError_t cuda_event_record(cudaEvent_t event, cudaStream_t stream);

/* Any thread; never blocks on the GPU: an event without timing on the
 * current device (cudaEventCreateWithFlags(cudaEventDisableTiming)). */
cudaError_t cuda_event_create(cudaEvent_t *event);

/* Any thread; never blocks on the GPU: the current device (cudaGetDevice). */
cudaError_t cuda_get_device(int *device);

/* ---- the same calls through the runtime ---------------------------------- */

/* Reclaimer only (a capture's origins); never blocks on the GPU:
 * cudaStreamIsCapturing. */
cudaError_t cuda_stream_is_capturing_runtime(
    cudaStream_t stream, enum cudaStreamCaptureStatus *status);

/* Reclaimer only (a capture's origins); never blocks on the GPU:
 * cudaEventRecord. */
cudaError_t cuda_event_record_runtime(cudaEvent_t event, cudaStream_t stream);

/* Reclaimer only (a capture's origins); never blocks on the GPU:
 * cudaEventCreateWithFlags(cudaEventDisableTiming). */
cudaError_t cuda_event_create_runtime(cudaEvent_t *event);

/* Any thread (a captured entry's device; the reclaimer after a callback);
 * never blocks on the GPU: cudaGetDevice. */
cudaError_t cuda_get_device_runtime(int *device);

/* ---- device switch ------------------------------------------------------- */

/* The caller's device and the one current since (both -1: not asked
 * yet).  Start with CUDA_SWITCH_NONE; one per defer call, on its thread's
 * stack. */
struct cuda_switch {
    int caller, on;
};
#define CUDA_SWITCH_NONE ((struct cuda_switch){-1, -1})

/* Any thread; never blocks on the GPU: the caller's device in *device,
 * asked the first time only; cudaSuccess or the query's error. */
cudaError_t cuda_switch_caller_device(struct cuda_switch *sw, int *device);

/* Any thread; never blocks on the GPU: makes device current (nothing to do
 * where it is); cudaSuccess or the error, *call (unless NULL) naming the
 * call that failed; a failure leaves the current device and the last error
 * as they were (but for a sticky error). */
cudaError_t cuda_switch_device(struct cuda_switch *sw, int device,
                               const char **call);

/* Any thread; never blocks on the GPU: cuda_switch_device for a request
 * that put the switch off until its first CUDA call (lazy: the caller's
 * switch, which it switches back); nothing where lazy is NULL (device is
 * current already). */
static inline cudaError_t cuda_switch_lazy(struct cuda_switch *lazy,
                                           int device, const char **call)
{
    return lazy == NULL ? cudaSuccess : cuda_switch_device(lazy, device, call);
}

/* Any thread; never blocks on the GPU: makes the caller's device current
 * again where another was; cudaSuccess or cudaSetDevice's error (left off
 * the last error as above), said naming what unless what is NULL.  sw may
 * be used again after it. */
cudaError_t cuda_switch_back(struct cuda_switch *sw, const char *what);

/* Reclaimer only (its own current device, never switched back); never
 * blocks on the GPU: cudaSetDevice. */
cudaError_t cuda_set_device(int device);

/* Reclaimer only, at its start and after each callback (which may change
 * it): the thread's capture mode relaxed (its queries and frees never
 * invalidate another thread's capture). */
void cuda_relax_capture_mode(void);

/* ---- events -------------------------------------------------------------- */

/* Reclaimer only; never blocks: cudaEventQuery (cudaSuccess,
 * cudaErrorNotReady or the error). */
static inline cudaError_t cuda_event_query(cudaEvent_t event)
{
    return cudaEventQuery(event);
}

/* A thread's capture mode while cudefer makes a "potentially unsafe" call
 * of CUDA's (a query, a free, cudaMalloc) on an application thread: in the
 * thread's own mode (Global by default) such a call is refused, and
 * invalidates the capture, while another thread captures in the global
 * mode or the thread captures a stream itself.  cudefer makes such a call
 * only where no capture could be hurt by it (a stream checked not to
 * capture, memory no capture can use), so it makes it in the relaxed mode,
 * as the reclaimer makes all of its calls.  Same thread: relax, the call,
 * then put back; nothing else in between. */
struct cuda_capture_mode {
    enum cudaStreamCaptureMode mode; /* the thread's own, put back */
    bool exchanged;                  /* false: nothing to put back */
};

/* Any thread: the thread's capture mode made Relaxed; its own returned. */
static inline struct cuda_capture_mode cuda_capture_mode_relax(void)
{
    struct cuda_capture_mode m = {cudaStreamCaptureModeRelaxed, false};
    m.exchanged = cudaThreadExchangeStreamCaptureMode(&m.mode) == cudaSuccess;
    return m;
}

/* The same thread: its own capture mode put back. */
static inline void cuda_capture_mode_put_back(struct cuda_capture_mode m)
{
    if (m.exchanged)
        cudaThreadExchangeStreamCaptureMode(&m.mode);
}

/* Any thread; never blocks: cudaEventQuery in the relaxed capture mode (the
 * thread's own put back after), a not-ready answer left off the thread's
 * last error. */
static inline cudaError_t cuda_event_query_relaxed(cudaEvent_t event)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaEventQuery(event);
    cuda_capture_mode_put_back(mode);
    if (err == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
        cudaGetLastError();
    return err;
}

/* Reclaimer only (out of memory for a FIFO); blocks until the event's
 * records complete: cudaEventSynchronize. */
cudaError_t cuda_event_synchronize(cudaEvent_t event);

/* Any thread (the event's device current); never blocks on the GPU:
 * cudaEventDestroy. */
cudaError_t cuda_event_destroy(cudaEvent_t event);

/* ---- streams ------------------------------------------------------------- */

/* Any thread; never blocks on the GPU: cudaStreamGetId. */
static inline cudaError_t cuda_stream_get_id(cudaStream_t stream,
                                             unsigned long long *id)
{
    return cudaStreamGetId(stream, id);
}

/* Any thread; never blocks on the GPU: cudaStreamGetDevice. */
static inline cudaError_t cuda_stream_get_device(cudaStream_t stream,
                                                 int *device)
{
    return cudaStreamGetDevice(stream, device);
}

/* Any thread; blocks until the stream's work is done:
 * cudaStreamSynchronize. */
cudaError_t cuda_stream_synchronize(cudaStream_t stream);

/* Any thread, on a stream its caller checked not to capture; blocks until
 * the stream's work is done: cudaStreamSynchronize in the relaxed capture
 * mode (the thread's own put back after), as a wait in the thread's own
 * mode is refused, and invalidates the capture, while the thread captures
 * another stream or another thread captures in the global mode. */
static inline cudaError_t cuda_stream_synchronize_relaxed(cudaStream_t stream)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cuda_stream_synchronize(stream);
    cuda_capture_mode_put_back(mode);
    return err;
}

/* Any thread; never blocks on the GPU: whether device has memory pools
 * (cudaDevAttrMemoryPoolsSupported), the condition of cudaFreeAsync and of
 * cudefer's own pool; false when CUDA cannot say (that error cleared). */
bool cuda_device_has_pools(int device);

/* Reclaimer only; never blocks on the GPU: a non-blocking stream on the
 * current device (cudaStreamCreateWithFlags). */
cudaError_t cuda_stream_create(cudaStream_t *stream);

/* Reclaimer only (the stream's device current): cudaStreamDestroy. */
cudaError_t cuda_stream_destroy(cudaStream_t stream);

/* Any thread; never blocks on the GPU: cudaStreamGetCaptureInfo's status,
 * and while the stream captures, the capture's id and graph. */
cudaError_t cuda_stream_capture_info(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id,
                                     cudaGraph_t *graph);

/* ---- graphs -------------------------------------------------------------- */

/* Any thread; never blocks on the GPU: a user object of one reference (the
 * caller's) whose release calls destroy(ptr) on a thread of CUDA's, where
 * CUDA may not be called (cudaUserObjectNoDestructorSync). */
cudaError_t cuda_user_object_create(cudaUserObject_t *object, void *ptr,
                                    void (*destroy)(void *));

/* Any thread; never blocks on the GPU: moves the caller's reference to
 * graph (cudaGraphRetainUserObject); on failure it is still the caller's. */
cudaError_t cuda_graph_take_user_object(cudaGraph_t graph,
                                        cudaUserObject_t object);

/* Any thread; never blocks on the GPU: releases the caller's reference. */
cudaError_t cuda_user_object_release(cudaUserObject_t object);

/* ---- memory -------------------------------------------------------------- */

/* Any thread (the reclaimer; a synchronous release), the device current;
 * may wait for the device: cudaFree. */
cudaError_t cuda_free(void *ptr);

/* Any thread (the reclaimer; a synchronous release); may wait for the
 * device: cudaFreeHost. */
cudaError_t cuda_free_host(void *ptr);

/* Reclaimer only (the device current); never blocks on the GPU:
 * cudaFreeAsync on stream. */
cudaError_t cuda_free_async(void *ptr, cudaStream_t stream);

/* Reclaimer only (the device current); never blocks on the GPU: the
 * device's free and total bytes (cudaMemGetInfo). */
cudaError_t cuda_memory_info(size_t *free_bytes, size_t *total_bytes);

/* ---- the block cache's memory -------------------------------------------- */

/* The calls of the block cache's upstream (cache_upstream.c): its memory
 * pools and its segments.  CUDA counts each of them "potentially unsafe",
 * so each is made in the relaxed capture mode (struct cuda_capture_mode;
 * the thread's own put back after): a miss on an application thread makes
 * them while another thread may capture, or while the thread captures
 * another stream, and none touches a capture (the stream a segment is
 * ordered on was checked not to capture; no graph uses the memory they
 * make or release).  Each returns CUDA's error, said nowhere; the runtime's
 * last error is as the call left it (the caller says and clears). */

/* Any thread; never blocks on the GPU: a memory pool of device's memory
 * (cudaMemPoolCreate) that keeps what it reserved until trimmed (its
 * release threshold the maximum); *call: the call that failed (the pool
 * created, if it was, destroyed again). */
cudaError_t cuda_pool_create(int device, cudaMemPool_t *pool,
                             const char **call);

/* Start-up failure or shutdown: cudaMemPoolDestroy (memory still allocated
 * from the pool is released by CUDA once freed). */
cudaError_t cuda_pool_destroy(cudaMemPool_t pool);

/* Any thread; never blocks on the GPU: bytes of pool's memory on stream
 * (cudaMallocFromPoolAsync; stream's device is the pool's). */
cudaError_t cuda_pool_malloc(void **ptr, size_t bytes, cudaMemPool_t pool,
                             cudaStream_t stream);

/* Any thread; never blocks on the GPU: the memory pool reserved from CUDA
 * (cudaMemPoolAttrReservedMemCurrent). */
cudaError_t cuda_pool_reserved(cudaMemPool_t pool, uint64_t *bytes);

/* Any thread (the reclaimer); may wait for the device: the pool's unused
 * memory released to CUDA (cudaMemPoolTrimTo 0). */
cudaError_t cuda_pool_trim(cudaMemPool_t pool);

/* Any thread; never blocks on the GPU: lets peer's kernels and copies read
 * and write pool's memory (cudaMemPoolSetAccess). */
cudaError_t cuda_pool_grant(cudaMemPool_t pool, int peer);

/* Any thread, the device current; may wait for the device: cudaMalloc. */
cudaError_t cuda_malloc_relaxed(void **ptr, size_t bytes);

/* Any thread; may wait for the device: cudaFree. */
cudaError_t cuda_free_relaxed(void *ptr);

/* Any thread; never blocks on the GPU: cudaFreeAsync on stream. */
cudaError_t cuda_free_async_relaxed(void *ptr, cudaStream_t stream);

/* Any thread; never blocks on the GPU: *bytes, device's memory
 * (cudaGetDeviceProperties' totalGlobalMem); a failure is left off the
 * thread's last error (not known: the caller asks again later). */
cudaError_t cuda_device_memory(int device, uint64_t *bytes);

/* Any thread; never blocks on the GPU: whether peer can access device's
 * memory (cudaDeviceCanAccessPeer). */
cudaError_t cuda_can_access_peer(int device, int peer, bool *can);

/* ---- allocation facts ---------------------------------------------------- */

/* What the release policy needs to know of an allocation. */
struct cuda_allocation {
    size_t bytes; /* size of the allocation containing ptr; 0 if unknown */
    const void *start; /* where that allocation begins; NULL if unknown */
    bool pool;    /* from cudaMallocAsync / cudaMallocFromPoolAsync */
    int device;   /* the device whose memory it is; -1: not asked, unknown */
};

/* Reclaimer only (a driver call, kept off the launching path): the
 * allocation containing ptr, its device too when device memory (a device
 * pointer's attribute, not asked of pinned host memory); false, zero bytes,
 * not pool and device -1 when CUDA knows none there (said nowhere: its
 * release says it), the query failed (said) or is not available. */
bool cuda_allocation_of(const void *ptr, bool device_memory,
                        struct cuda_allocation *a);

/* Reclaimer only: cuda_allocation_of, said nowhere, for a pointer whose
 * release failed: true when CUDA answered (a->bytes 0: it knows no
 * allocation there), false when the query failed or is not available
 * (nothing known). */
bool cuda_allocation_known(const void *ptr, bool device_memory,
                           struct cuda_allocation *a);

/* What CUDA says a pointer is, for a message about it. */
enum cuda_memory_kind {
    CUDA_MEMORY_UNKNOWN, /* no allocation of CUDA's there: host memory it
                            did not allocate, a freed or made-up address */
    CUDA_MEMORY_DEVICE,  /* device (or managed) memory */
    CUDA_MEMORY_HOST,    /* host memory CUDA allocated or registered */
    CUDA_MEMORY_UNSURE,  /* the query is not available or failed */
};

/* Any thread (a failed release only: a driver call); never blocks on the
 * GPU: what ptr is, and for device and host memory, in *start, where its
 * allocation starts. */
enum cuda_memory_kind cuda_memory_kind_of(const void *ptr, const void **start);

/* Any thread, also during a capture; never blocks on the GPU: the device of
 * the first of the n pointers that CUDA knows as a device's memory, or -1;
 * a failed query leaves a last error of none as it was. */
int cuda_device_of_pointers(void *const *ptrs, size_t n);

/* ---- errors -------------------------------------------------------------- */

/* Any thread: whether err leaves the device's context unusable (a kernel
 * fault), every later call on it failing the same way. */
bool cuda_error_is_sticky(cudaError_t err);

/* Any thread: prints "cudefer: <what>: <call> failed: <error string>
 * (<error name>)<detail>" (detail may be ""), nothing for
 * cudaErrorCudartUnloading; an invalid handle from a query of the
 * caller's stream (its capture status, id or device) first says that a
 * stream given is not a live one. */
void cuda_report_failure(const char *what, const char *call, cudaError_t err,
                         const char *detail);

/* Any thread, right after a CUDA call of cudefer's own failed with err
 * (said and counted by its caller, not returned to the application): err
 * cleared from the thread's last error, but for a sticky error, which is
 * the device's (the application's pending error, if any, the runtime had
 * overwritten already). */
static inline void cuda_forget_failure(cudaError_t err)
{
    if (err != cudaSuccess && !cuda_error_is_sticky(err))
        cudaGetLastError();
}

/* Any thread, right after cudefer's own call failed with err and the
 * defer call goes on another way (said, not returned): err cleared from
 * the thread's last error where that call left it there (a runtime call;
 * a driver call or a host allocation leaves none), but for a sticky
 * error. */
static inline void cuda_forget_failure_left(cudaError_t err)
{
    if (err != cudaSuccess && cudaPeekAtLastError() == err)
        cuda_forget_failure(err);
}

/* Any thread: the thread's last error cleared: on the reclaimer before a
 * callback, so that the callback finds its own CUDA errors, not the
 * reclaimer's; after an allocation call's out of memory, which is its
 * return value's alone (cudefer.h). */
static inline void cuda_clear_last_error(void)
{
    cudaGetLastError();
}

#endif
