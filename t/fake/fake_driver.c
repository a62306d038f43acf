/* SPDX-License-Identifier: MIT */
/*
 * fake_driver.c — entry points other than the plain cudart calls: the
 * driver's cuPointerGetAttributes and the launching thread's driver calls
 * (cuStreamIsCapturing, cuEventRecord, cuEventCreate, cuCtxGetDevice),
 * which cudefer obtains through cudaGetDriverEntryPointByVersion, and the
 * _ptsz variants that code compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM
 * calls.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <cuda.h>

#include <stdatomic.h>
#include <string.h>

/* ---- Driver entry points ------------------------------------------------
 * cudefer asks the runtime for the driver's cuPointerGetAttributes (to learn
 * an allocation's size and whether it came from a memory pool); the fake
 * hands out its own version. */

/* Stands in for a pool handle: non-NULL for pool allocations. */
#define FAKE_POOL_HANDLE(dev) ((void *)(uintptr_t)(0x9000 + (dev)))

/* The driver's cuPointerGetAttributes over the fake's allocations: size,
 * start, pool handle, memory type and device of a live allocation; for an
 * unknown or released pointer, as the driver documents, CUDA_SUCCESS with
 * every attribute 0 (a size of 0, no pool, no memory type);
 * CUDA_ERROR_NOT_SUPPORTED for another attribute.  Any thread. */
static CUresult fake_cuPointerGetAttributes(unsigned int n,
                                            CUpointer_attribute *attrs,
                                            void **data, CUdeviceptr ptr)
{
    struct falloc *a;

    if (fake_enter(FAKE_CU_POINTER_GET_ATTRIBUTES) != cudaSuccess)
        return CUDA_ERROR_INVALID_VALUE;
    a = fake_alloc_find((const void *)(uintptr_t)ptr, 0);
    if (a != NULL && a->released)
        a = NULL;
    for (unsigned int i = 0; i < n; i++) {
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = a != NULL ? a->size : 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = a != NULL ? (CUdeviceptr)a->addr : 0;
            break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            *(void **)data[i] = a != NULL && a->kind == A_POOL
                                    ? FAKE_POOL_HANDLE(a->dev)
                                    : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] =
                a == NULL              ? 0
                : a->kind == A_HOST    ? CU_MEMORYTYPE_HOST
                                       : CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = a != NULL ? a->dev : 0;
            break;
        default:
            fake_unlock();
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    fake_unlock();
    return CUDA_SUCCESS;
}

/* The launching thread's driver calls (cudefer's src/cuda.c): each is
 * the fake's runtime call of the same meaning, counted and failed as that
 * call (FAKE_STREAM_IS_CAPTURING, FAKE_EVENT_RECORD, FAKE_EVENT_CREATE,
 * FAKE_GET_DEVICE), its cudaError_t returned as the CUresult of the same
 * number, but, as the driver, leaving the thread's last error as it was.
 * While the thread has set fake_set_no_context(1) each answers
 * CUDA_ERROR_INVALID_CONTEXT (a thread with no current context) without
 * being counted or made. */
static _Thread_local int no_context;
static _Atomic unsigned long driver_answers;

void fake_set_no_context(int on)
{
    no_context = on;
}

unsigned long fake_driver_calls(void)
{
    return atomic_load(&driver_answers);
}

/* Ends a driver call: the runtime's answer r, the last error put back. */
static CUresult driver_result(cudaError_t r, cudaError_t last)
{
    fake_thread.last_error = last;
    atomic_fetch_add(&driver_answers, 1);
    return (CUresult)r;
}

static CUresult fake_cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    if (no_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    cudaError_t last = fake_thread.last_error;
    return driver_result(cudaStreamIsCapturing(
                             (cudaStream_t)s, (enum cudaStreamCaptureStatus *)st),
                         last);
}

static CUresult fake_cuEventRecord(CUevent e, CUstream s)
{
    if (no_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    cudaError_t last = fake_thread.last_error;
    return driver_result(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s),
                         last);
}

static CUresult fake_cuEventCreate(CUevent *e, unsigned int flags)
{
    if (no_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    cudaError_t last = fake_thread.last_error;
    return driver_result(cudaEventCreateWithFlags((cudaEvent_t *)e, flags),
                         last);
}

static CUresult fake_cuCtxGetDevice(CUdevice *d)
{
    if (no_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    cudaError_t last = fake_thread.last_error;
    int dev = 0;
    cudaError_t r = cudaGetDevice(&dev);
    if (r == cudaSuccess)
        *d = (CUdevice)dev;
    return driver_result(r, last);
}

static const struct { const char *name; void *fn; } entry_points[] = {
    {"cuPointerGetAttributes", (void *)fake_cuPointerGetAttributes},
    {"cuStreamIsCapturing", (void *)fake_cuStreamIsCapturing},
    {"cuEventRecord", (void *)fake_cuEventRecord},
    {"cuEventCreate", (void *)fake_cuEventCreate},
    {"cuCtxGetDevice", (void *)fake_cuCtxGetDevice},
};

/* The symbols above are known; anything else is not found. */
cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion,
    unsigned long long flags, enum cudaDriverEntryPointQueryResult *status)
{
    (void)cudaVersion;
    (void)flags;
    ENTER(FAKE_DRIVER_ENTRY_POINT);
    if (symbol == NULL || funcPtr == NULL)
        return fake_leave(cudaErrorInvalidValue);
    for (size_t i = 0; i < sizeof entry_points / sizeof *entry_points; i++)
        if (strcmp(symbol, entry_points[i].name) == 0) {
            *funcPtr = entry_points[i].fn;
            if (status != NULL)
                *status = cudaDriverEntryPointSuccess;
            return fake_leave(cudaSuccess);
        }
    *funcPtr = NULL;
    if (status != NULL)
        *status = cudaDriverEntryPointSymbolNotFound;
    return fake_leave(cudaErrorSymbolNotFound);
}

/* ---- Per-thread-default-stream entry points ----------------------------
 * Code compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM calls these; there
 * stream 0 means the per-thread stream. */

#define PTDS(h) ((h) == 0 ? cudaStreamPerThread : (h))

cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t, cudaStream_t, unsigned);
cudaError_t cudaStreamQuery_ptsz(cudaStream_t);
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t);
cudaError_t cudaStreamGetId_ptsz(cudaStream_t, unsigned long long *);
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t, int *);
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t,
                                       enum cudaStreamCaptureStatus *);
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t, cudaEvent_t, unsigned);
cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t,
                                        enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t *);
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t,
    enum cudaStreamCaptureStatus *, unsigned long long *, cudaGraph_t *,
    const cudaGraphNode_t **, const cudaGraphEdgeData **, size_t *);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t, cudaStream_t);

/* Each forwards to the plain call with stream 0 read as the per-thread
 * stream. */
cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s)
{ return cudaEventRecordWithFlags(e, PTDS(s), 0); }
cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s,
                                          unsigned f)
{ return cudaEventRecordWithFlags(e, PTDS(s), f); }
cudaError_t cudaStreamQuery_ptsz(cudaStream_t s)
{ return cudaStreamQuery(PTDS(s)); }
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s)
{ return cudaStreamSynchronize(PTDS(s)); }
cudaError_t cudaStreamGetId_ptsz(cudaStream_t s, unsigned long long *id)
{ return cudaStreamGetId(PTDS(s), id); }
cudaError_t cudaStreamGetDevice_ptsz(cudaStream_t s, int *dev)
{ return cudaStreamGetDevice(PTDS(s), dev); }
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s,
                                       enum cudaStreamCaptureStatus *st)
{ return cudaStreamIsCapturing(PTDS(s), st); }
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned f)
{ return cudaStreamWaitEvent(PTDS(s), e, f); }
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{ return cudaMallocAsync(p, n, PTDS(s)); }
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{ return cudaFreeAsync(p, PTDS(s)); }
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                        enum cudaStreamCaptureMode m)
{ return cudaStreamBeginCapture(PTDS(s), m); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *gr)
{ return cudaStreamEndCapture(PTDS(s), gr); }
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s,
    enum cudaStreamCaptureStatus *st, unsigned long long *id, cudaGraph_t *gr,
    const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges, size_t *n)
{ return cudaStreamGetCaptureInfo(PTDS(s), st, id, gr, deps, edges, n); }
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t x, cudaStream_t s)
{ return cudaGraphLaunch(x, PTDS(s)); }
