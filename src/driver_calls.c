/* Driver calls: the launching thread's CUDA calls through the driver's
 * entry points (see the header). */
#include "driver_calls.h"

/* The entry points are the legacy-stream flavours (cudaEnableLegacyStream),
 * as the runtime calls they stand in for are when the library is built
 * without per-thread default streams; built with them, the two would read
 * stream 0 differently. */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "driver_calls.c looks up the legacy-stream entry points: build cudefer without CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "report.h"

typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*ctx_get_device_fn)(CUdevice *);

/* Whether a start looked the entry points up (a start that failed later
 * and is tried again looks nothing up, and says nothing, again). */
static _Atomic bool resolved;

/* NULL: not resolved (yet, or not found): the runtime's call is made. */
static _Atomic(driver_calls_pointer_attributes_fn) pointer_attributes;
static _Atomic(is_capturing_fn) is_capturing;
static _Atomic(event_record_fn) event_record;
static _Atomic(event_create_fn) event_create;
static _Atomic(ctx_get_device_fn) ctx_get_device;

/* The legacy-stream flavour of symbol (as the library's runtime calls
 * read stream 0), or NULL with *err the reason (the runtime's error, or
 * cudaErrorSymbolNotFound), cleared from the thread: not the
 * application's error. */
static void *entry_point(const char *symbol, cudaError_t *err)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult status;
    *err = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000,
                                            cudaEnableLegacyStream, &status);
    if (*err != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (status != cudaDriverEntryPointSuccess || fn == NULL) {
        *err = cudaErrorSymbolNotFound;
        return NULL;
    }
    return fn;
}

void driver_calls_resolve(const char *what, bool fast)
{
    if (atomic_exchange(&resolved, true))
        return;
    cudaError_t err;
    void *fn = entry_point("cuPointerGetAttributes", &err);
    if (fn == NULL)
        report_cuda(what,
                    "cudaGetDriverEntryPointByVersion(cuPointerGetAttributes)",
                    err, "; allocation sizes and pools are unknown: pool "
                    "memory is freed with cudaFree, and the cap does not see "
                    "these bytes");
    atomic_store_explicit(&pointer_attributes,
                          (driver_calls_pointer_attributes_fn)fn,
                          memory_order_release);
    if (!fast)
        return;
    /* One not found leaves its call to the runtime, silently. */
    is_capturing_fn c = (is_capturing_fn)entry_point("cuStreamIsCapturing",
                                                      &err);
    event_record_fn r = (event_record_fn)entry_point("cuEventRecord", &err);
    event_create_fn e = (event_create_fn)entry_point("cuEventCreate", &err);
    ctx_get_device_fn d = (ctx_get_device_fn)entry_point("cuCtxGetDevice",
                                                         &err);
    atomic_store_explicit(&is_capturing, c, memory_order_release);
    atomic_store_explicit(&event_record, r, memory_order_release);
    atomic_store_explicit(&event_create, e, memory_order_release);
    atomic_store_explicit(&ctx_get_device, d, memory_order_release);
}

driver_calls_pointer_attributes_fn driver_calls_pointer_attributes(void)
{
    return atomic_load_explicit(&pointer_attributes, memory_order_acquire);
}

void driver_calls_reset(void)
{
    atomic_store(&resolved, false);
    atomic_store(&pointer_attributes, NULL);
    atomic_store(&is_capturing, NULL);
    atomic_store(&event_record, NULL);
    atomic_store(&event_create, NULL);
    atomic_store(&ctx_get_device, NULL);
}

/* Whether the driver's result says the thread has no usable current
 * context: then the runtime's call makes one current and answers.  (Not
 * CUDA_ERROR_NOT_INITIALIZED: the runtime, up since the start, has
 * initialized the driver; that error is returned as the runtime's
 * cudaErrorInitializationError, of the same number.) */
static bool no_context(CUresult r)
{
    return r == CUDA_ERROR_INVALID_CONTEXT ||
           r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

cudaError_t driver_calls_is_capturing(cudaStream_t stream,
                                      enum cudaStreamCaptureStatus *status)
{
    is_capturing_fn fn =
        atomic_load_explicit(&is_capturing, memory_order_acquire);
    if (fn != NULL) {
        CUstreamCaptureStatus s;
        CUresult r = fn((CUstream)stream, &s);
        if (r == CUDA_SUCCESS)
            *status = (enum cudaStreamCaptureStatus)s;
        if (!no_context(r))
            return (cudaError_t)r;
    }
    return cudaStreamIsCapturing(stream, status);
}

cudaError_t driver_calls_event_record(cudaEvent_t event, cudaStream_t stream)
{
    event_record_fn fn =
        atomic_load_explicit(&event_record, memory_order_acquire);
    if (fn != NULL) {
        CUresult r = fn((CUevent)event, (CUstream)stream);
        if (!no_context(r))
            return (cudaError_t)r;
    }
    return cudaEventRecord(event, stream);
}

cudaError_t driver_calls_event_create(cudaEvent_t *event)
{
    event_create_fn fn =
        atomic_load_explicit(&event_create, memory_order_acquire);
    if (fn != NULL) {
        CUevent e;
        CUresult r = fn(&e, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS)
            *event = (cudaEvent_t)e;
        if (!no_context(r))
            return (cudaError_t)r;
    }
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
}

cudaError_t driver_calls_get_device(int *device)
{
    ctx_get_device_fn fn =
        atomic_load_explicit(&ctx_get_device, memory_order_acquire);
    if (fn != NULL) {
        CUdevice d;
        CUresult r = fn(&d);
        if (r == CUDA_SUCCESS) {
            *device = (int)d;
            return cudaSuccess;
        }
        if (!no_context(r))
            return (cudaError_t)r;
    }
    return cudaGetDevice(device);
}
