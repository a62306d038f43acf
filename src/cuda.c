/* SPDX-License-Identifier: MIT */
/* The CUDA layer: the rules are in cuda.h. */
#include "cuda.h"

#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "report.h"

/* ---- driver entry points ------------------------------------------------- */

typedef CUresult (*pointer_attributes_fn)(unsigned int, CUpointer_attribute *,
                                          void **, CUdeviceptr);
typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*ctx_get_device_fn)(CUdevice *);

/* Whether a start looked the entry points up (a start that failed later
 * and is tried again looks nothing up, and says nothing, again). */
static _Atomic bool resolved;

/* NULL: not resolved (yet, or not found): the runtime's call is made. */
static _Atomic(pointer_attributes_fn) pointer_attributes;
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

void cuda_resolve_entry_points(const char *what, bool fast)
{
    if (atomic_exchange(&resolved, true))
        return;
    cudaError_t err;
    void *fn = entry_point("cuPointerGetAttributes", &err);
    if (fn == NULL)
        cuda_report_failure(
            what, "cudaGetDriverEntryPointByVersion(cuPointerGetAttributes)",
            err, "; allocation sizes and pools are unknown: the cap does "
                 "not see these bytes");
    atomic_store_explicit(&pointer_attributes, (pointer_attributes_fn)fn,
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

void cuda_forget_entry_points(void)
{
    atomic_store(&resolved, false);
    atomic_store(&pointer_attributes, NULL);
    atomic_store(&is_capturing, NULL);
    atomic_store(&event_record, NULL);
    atomic_store(&event_create, NULL);
    atomic_store(&ctx_get_device, NULL);
}

cudaError_t cuda_device_count(int *count)
{
    return cudaGetDeviceCount(count);
}

/* ---- the launching path, driver-direct ----------------------------------- */

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

cudaError_t cuda_stream_is_capturing(cudaStream_t stream,
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

cudaError_t cuda_event_record(cudaEvent_t event, cudaStream_t stream)
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

cudaError_t cuda_event_create(cudaEvent_t *event)
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

cudaError_t cuda_get_device(int *device)
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

/* ---- the same calls through the runtime ---------------------------------- */

cudaError_t cuda_stream_is_capturing_runtime(
    cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    return cudaStreamIsCapturing(stream, status);
}

cudaError_t cuda_event_record_runtime(cudaEvent_t event, cudaStream_t stream)
{
    return cudaEventRecord(event, stream);
}

cudaError_t cuda_event_create_runtime(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
}

cudaError_t cuda_get_device_runtime(int *device)
{
    return cudaGetDevice(device);
}

/* ---- device switch ------------------------------------------------------- */

cudaError_t cuda_switch_caller_device(struct cuda_switch *sw, int *device)
{
    if (sw->caller < 0) {
        int current;
        cudaError_t err = cuda_get_device(&current);
        if (err != cudaSuccess)
            return err;
        sw->caller = sw->on = current;
    }
    *device = sw->caller;
    return cudaSuccess;
}

/* cudaSetDevice(device), its failure (not the device's sticky error)
 * cleared from the thread's last error: cudefer's own, said by its caller
 * (the application's pending error, if any, the runtime had overwritten
 * already). */
static cudaError_t switch_to(int device)
{
    cudaError_t err = cudaSetDevice(device);
    cuda_forget_failure(err);
    return err;
}

cudaError_t cuda_switch_device(struct cuda_switch *sw, int device,
                               const char **call)
{
    int caller;
    cudaError_t err = cuda_switch_caller_device(sw, &caller);
    if (err != cudaSuccess) {
        if (call != NULL)
            *call = "cudaGetDevice";
        return err;
    }
    if (sw->on == device)
        return cudaSuccess;
    /* A failed cudaSetDevice leaves the current device as it was. */
    if ((err = switch_to(device)) == cudaSuccess)
        sw->on = device;
    else if (call != NULL)
        *call = "cudaSetDevice";
    return err;
}

cudaError_t cuda_switch_back(struct cuda_switch *sw, const char *what)
{
    if (sw->caller < 0 || sw->on == sw->caller)
        return cudaSuccess;
    cudaError_t err = switch_to(sw->caller);
    if (err == cudaSuccess)
        sw->on = sw->caller;
    else if (what != NULL)
        cuda_report_failure(what, "cudaSetDevice (back to the caller's device)",
                            err, "");
    return err;
}

cudaError_t cuda_set_device(int device)
{
    return cudaSetDevice(device);
}

void cuda_relax_capture_mode(void)
{
    enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&relaxed);
}

/* ---- events -------------------------------------------------------------- */

cudaError_t cuda_event_synchronize(cudaEvent_t event)
{
    return cudaEventSynchronize(event);
}

cudaError_t cuda_event_destroy(cudaEvent_t event)
{
    return cudaEventDestroy(event);
}

/* ---- streams ------------------------------------------------------------- */

cudaError_t cuda_stream_synchronize(cudaStream_t stream)
{
    return cudaStreamSynchronize(stream);
}

bool cuda_device_has_pools(int device)
{
    int value = 0;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMemoryPoolsSupported,
                               device) != cudaSuccess) {
        cudaGetLastError(); /* not the caller's error to find later */
        return false;
    }
    return value != 0;
}

cudaError_t cuda_stream_create(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
}

cudaError_t cuda_stream_destroy(cudaStream_t stream)
{
    return cudaStreamDestroy(stream);
}

cudaError_t cuda_stream_capture_info(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *status,
                                     unsigned long long *id,
                                     cudaGraph_t *graph)
{
    return cudaStreamGetCaptureInfo(stream, status, id, graph, NULL, NULL,
                                    NULL);
}

/* ---- graphs -------------------------------------------------------------- */

cudaError_t cuda_user_object_create(cudaUserObject_t *object, void *ptr,
                                    void (*destroy)(void *))
{
    return cudaUserObjectCreate(object, ptr, destroy, 1,
                                cudaUserObjectNoDestructorSync);
}

cudaError_t cuda_graph_take_user_object(cudaGraph_t graph,
                                        cudaUserObject_t object)
{
    return cudaGraphRetainUserObject(graph, object, 1,
                                     cudaGraphUserObjectMove);
}

cudaError_t cuda_user_object_release(cudaUserObject_t object)
{
    return cudaUserObjectRelease(object, 1);
}

/* ---- memory -------------------------------------------------------------- */

cudaError_t cuda_free(void *ptr)
{
    return cudaFree(ptr);
}

cudaError_t cuda_free_host(void *ptr)
{
    return cudaFreeHost(ptr);
}

cudaError_t cuda_free_async(void *ptr, cudaStream_t stream)
{
    return cudaFreeAsync(ptr, stream);
}

cudaError_t cuda_memory_info(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes);
}

/* ---- the block cache's memory -------------------------------------------- */

cudaError_t cuda_pool_create(int device, cudaMemPool_t *pool,
                             const char **call)
{
    struct cudaMemPoolProps props = {0};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    uint64_t keep = UINT64_MAX;
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    *call = "cudaMemPoolCreate";
    cudaError_t err = cudaMemPoolCreate(pool, &props);
    if (err == cudaSuccess) {
        *call = "cudaMemPoolSetAttribute";
        err = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold,
                                      &keep);
        if (err != cudaSuccess)
            cudaMemPoolDestroy(*pool);
    }
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_pool_destroy(cudaMemPool_t pool)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMemPoolDestroy(pool);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_pool_malloc(void **ptr, size_t bytes, cudaMemPool_t pool,
                             cudaStream_t stream)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_pool_reserved(cudaMemPool_t pool, uint64_t *bytes)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMemPoolGetAttribute(
        pool, cudaMemPoolAttrReservedMemCurrent, bytes);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_pool_trim(cudaMemPool_t pool)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMemPoolTrimTo(pool, 0);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_pool_grant(cudaMemPool_t pool, int peer)
{
    struct cudaMemAccessDesc desc = {0};
    desc.location.type = cudaMemLocationTypeDevice;
    desc.location.id = peer;
    desc.flags = cudaMemAccessFlagsProtReadWrite;
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMemPoolSetAccess(pool, &desc, 1);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_malloc_relaxed(void **ptr, size_t bytes)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaMalloc(ptr, bytes);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_free_relaxed(void *ptr)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaFree(ptr);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_free_async_relaxed(void *ptr, cudaStream_t stream)
{
    struct cuda_capture_mode mode = cuda_capture_mode_relax();
    cudaError_t err = cudaFreeAsync(ptr, stream);
    cuda_capture_mode_put_back(mode);
    return err;
}

cudaError_t cuda_device_memory(int device, uint64_t *bytes)
{
    struct cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return err;
    }
    *bytes = prop.totalGlobalMem;
    return cudaSuccess;
}

cudaError_t cuda_can_access_peer(int device, int peer, bool *can)
{
    int yes = 0;
    cudaError_t err = cudaDeviceCanAccessPeer(&yes, peer, device);
    *can = err == cudaSuccess && yes;
    return err;
}

/* ---- allocation facts ---------------------------------------------------- */

/* The name of a driver result (the common ones; others by number). */
static const char *result_name(CUresult res)
{
    static char other[32];
    switch (res) {
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default:
        snprintf(other, sizeof other, "CUresult %d", (int)res);
        return other;
    }
}

/* cuda_allocation_of's query, said nowhere: CUDA_SUCCESS with *a filled
 * (bytes 0: CUDA knows no allocation there), else the query's failure
 * (CUDA_ERROR_NOT_SUPPORTED where it is not available), *a zero. */
static CUresult query_allocation(const void *ptr, bool device_memory,
                                 struct cuda_allocation *a)
{
    a->bytes = 0;
    a->start = NULL;
    a->pool = false;
    a->device = -1;
    pointer_attributes_fn get =
        atomic_load_explicit(&pointer_attributes, memory_order_acquire);
    if (get == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t bytes = 0;
    CUdeviceptr start = 0;
    CUmemoryPool pool = NULL;
    int device = -1;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&bytes, &start, &pool, &device};
    CUresult res = get(device_memory ? 4 : 3, attrs, data,
                       (CUdeviceptr)(uintptr_t)ptr);
    /* The driver answers a pointer it knows nothing of with every
     * attribute 0 (cuPointerGetAttributes' documentation): its release
     * will fail, and says so. */
    if (res != CUDA_SUCCESS || bytes == 0)
        return res;
    a->bytes = bytes;
    a->start = (const void *)(uintptr_t)start;
    a->pool = pool != NULL;
    a->device = device_memory ? device : -1;
    return CUDA_SUCCESS;
}

bool cuda_allocation_of(const void *ptr, bool device_memory,
                        struct cuda_allocation *a)
{
    CUresult res = query_allocation(ptr, device_memory, a);
    if (res != CUDA_SUCCESS && res != CUDA_ERROR_NOT_SUPPORTED)
        report("reclaimer: the size of %p is unknown: cuPointerGetAttributes "
               "failed: %s; it is released all the same, and the cap does not "
               "count it", ptr, result_name(res));
    return a->bytes > 0;
}

bool cuda_allocation_known(const void *ptr, bool device_memory,
                           struct cuda_allocation *a)
{
    return query_allocation(ptr, device_memory, a) == CUDA_SUCCESS;
}

enum cuda_memory_kind cuda_memory_kind_of(const void *ptr, const void **start)
{
    *start = ptr;
    pointer_attributes_fn get =
        atomic_load_explicit(&pointer_attributes, memory_order_acquire);
    if (get == NULL)
        return CUDA_MEMORY_UNSURE;
    size_t bytes = 0;
    CUdeviceptr begin = 0;
    unsigned int type = 0;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
    void *data[] = {&bytes, &begin, &type};
    if (get(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
        return CUDA_MEMORY_UNSURE;
    if (bytes == 0)
        return CUDA_MEMORY_UNKNOWN;
    *start = (const void *)(uintptr_t)begin;
    return type == CU_MEMORYTYPE_HOST ? CUDA_MEMORY_HOST : CUDA_MEMORY_DEVICE;
}

int cuda_device_of_pointers(void *const *ptrs, size_t n)
{
    /* A failed query is no error of the application's: its last error is
     * left as it was (where it had none). */
    bool had_error = n > 0 && cudaPeekAtLastError() != cudaSuccess;
    for (size_t i = 0; i < n; i++) {
        struct cudaPointerAttributes at;
        cudaError_t err = cudaPointerGetAttributes(&at, ptrs[i]);
        if (err != cudaSuccess && !had_error)
            cudaGetLastError();
        if (err == cudaSuccess && at.type != cudaMemoryTypeUnregistered &&
            at.device >= 0)
            return at.device;
    }
    return -1;
}

/* ---- errors -------------------------------------------------------------- */

bool cuda_error_is_sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorTensorMemoryLeak:
        return true;
    default:
        return false;
    }
}

void cuda_report_failure(const char *what, const char *call, cudaError_t err,
                         const char *detail)
{
    /* The runtime is unloading: the process is exiting, every call fails
     * alike, and the failures are counted; a line each says nothing. */
    if (err == cudaErrorCudartUnloading)
        return;
    /* An invalid handle from a query of the caller's stream is the
     * caller's stream, destroyed or never one: said first, in its words. */
    static const char *const stream_queries[] = {
        "cudaStreamIsCapturing", "cuStreamIsCapturing", "cudaStreamGetId",
        "cudaStreamGetDevice", "cudaStreamGetCaptureInfo"};
    const char *whose = "";
    for (size_t i = 0; i < sizeof stream_queries / sizeof *stream_queries;
         i++)
        if (err == cudaErrorInvalidResourceHandle && call != NULL &&
            strcmp(call, stream_queries[i]) == 0)
            whose = "a stream given is not a live stream (destroyed, or "
                    "never created): ";
    report("%s: %s%s failed: %s (%s)%s", what, whose, call,
           cudaGetErrorString(err), cudaGetErrorName(err), detail);
}
