/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_control.c — self-test of the fake CUDA runtime:
 * failure injection and call counting for every call kind, error strings,
 * versions and attributes, and fake_reset.
 */
#define _GNU_SOURCE
#include "fake_selftest.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Failure injection ------------------------------------------------ */

/* The driver's cuPointerGetAttributes (through the runtime's entry-point
 * query) on a fresh allocation: cudaSuccess, or the injected error. */
static cudaError_t cu_range_size_of_new_alloc(void)
{
    CUresult (*get)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
    void *fn = NULL, *p = NULL;
    size_t size = 0;
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_RANGE_SIZE;
    void *data = &size;
    CUresult r;

    cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, 0,
                                     NULL);
    get = (CUresult (*)(unsigned, CUpointer_attribute *, void **,
                        CUdeviceptr))fn;
    cudaMalloc(&p, 100);
    r = get(1, &attr, &data, (CUdeviceptr)(uintptr_t)p);
    cudaFree(p);
    if (r != CUDA_SUCCESS)
        return cudaErrorIllegalAddress; /* what the test injects */
    return size == 100 ? cudaSuccess : cudaErrorUnknown;
}

/* Make one call of kind c with valid arguments; return its result. */
static cudaError_t call_one(enum fake_call c, cudaStream_t s, cudaEvent_t e)
{
    void *p = NULL;
    int i = 0;
    unsigned long long id;
    size_t f, t;
    enum cudaStreamCaptureStatus cs;
    struct cudaPointerAttributes at;
    cudaStream_t ns;
    cudaEvent_t ne;
    cudaError_t r;

    switch (c) {
    case FAKE_EVENT_CREATE:
        r = cudaEventCreate(&ne);
        if (r == cudaSuccess)
            cudaEventDestroy(ne);
        return r;
    case FAKE_EVENT_RECORD: return cudaEventRecord(e, s);
    case FAKE_EVENT_QUERY: return cudaEventQuery(e);
    case FAKE_EVENT_DESTROY:
        cudaEventCreate(&ne);
        r = cudaEventDestroy(ne);
        if (r != cudaSuccess)
            cudaEventDestroy(ne);
        return r;
    case FAKE_EVENT_SYNCHRONIZE: return cudaEventSynchronize(e);
    case FAKE_FREE:
        cudaMalloc(&p, 8);
        r = cudaFree(p);
        if (r != cudaSuccess)
            cudaFree(p);
        return r;
    case FAKE_FREE_HOST:
        cudaMallocHost(&p, 8);
        r = cudaFreeHost(p);
        if (r != cudaSuccess)
            cudaFreeHost(p);
        return r;
    case FAKE_FREE_ASYNC:
        cudaMalloc(&p, 8);
        r = cudaFreeAsync(p, s);
        if (r != cudaSuccess)
            cudaFree(p);
        return r;
    case FAKE_SET_DEVICE: return cudaSetDevice(0);
    case FAKE_GET_DEVICE: return cudaGetDevice(&i);
    case FAKE_GET_DEVICE_COUNT: return cudaGetDeviceCount(&i);
    case FAKE_STREAM_GET_DEVICE: return cudaStreamGetDevice(s, &i);
    case FAKE_STREAM_GET_ID: return cudaStreamGetId(s, &id);
    case FAKE_STREAM_CREATE:
        r = cudaStreamCreate(&ns);
        if (r == cudaSuccess)
            cudaStreamDestroy(ns);
        return r;
    case FAKE_STREAM_DESTROY:
        cudaStreamCreate(&ns);
        r = cudaStreamDestroy(ns);
        if (r != cudaSuccess)
            cudaStreamDestroy(ns);
        return r;
    case FAKE_STREAM_SYNCHRONIZE: return cudaStreamSynchronize(s);
    case FAKE_STREAM_IS_CAPTURING: return cudaStreamIsCapturing(s, &cs);
    case FAKE_POINTER_GET_ATTRIBUTES: return cudaPointerGetAttributes(&at, &i);
    case FAKE_MEM_GET_INFO: return cudaMemGetInfo(&f, &t);
    case FAKE_DRIVER_ENTRY_POINT:
        return cudaGetDriverEntryPointByVersion("cuPointerGetAttributes",
                                                &p, 12000, 0, NULL);
    case FAKE_CU_POINTER_GET_ATTRIBUTES:
        return cu_range_size_of_new_alloc();
    case FAKE_MALLOC:
        r = cudaMalloc(&p, 8);
        cudaFree(p);
        return r;
    case FAKE_MALLOC_HOST:
        r = cudaMallocHost(&p, 8);
        cudaFreeHost(p);
        return r;
    case FAKE_MALLOC_ASYNC:
        r = cudaMallocAsync(&p, 8, s);
        cudaFree(p);
        return r;
    case FAKE_STREAM_QUERY: return cudaStreamQuery(s);
    case FAKE_STREAM_WAIT_EVENT: return cudaStreamWaitEvent(s, e, 0);
    case FAKE_DEVICE_SYNCHRONIZE: return cudaDeviceSynchronize();
    case FAKE_DEVICE_GET_ATTRIBUTE:
        return cudaDeviceGetAttribute(&i, cudaDevAttrWarpSize, 0);
    case FAKE_DRIVER_GET_VERSION: return cudaDriverGetVersion(&i);
    case FAKE_RUNTIME_GET_VERSION: return cudaRuntimeGetVersion(&i);
    case FAKE_MEM_POOL_CREATE: {
        struct cudaMemPoolProps props = {0};
        cudaMemPool_t pool;
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        r = cudaMemPoolCreate(&pool, &props);
        if (r == cudaSuccess)
            cudaMemPoolDestroy(pool);
        return r;
    }
    case FAKE_MEM_POOL_TRIM: return cudaMemPoolTrimTo(fake_mem_pool(0), 0);
    case FAKE_NCALLS: break;
    }
    return cudaErrorUnknown;
}

void test_injection(void)
{
    cudaStream_t s, ns = NULL;
    cudaEvent_t e, ne = NULL;
    void *p;
    fake_work *h;
    int c, i, all_fail;
    unsigned long before;
    double t0;

    diag("failure injection");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaEventCreate(&e);

    for (c = 0; c < FAKE_NCALLS; c++) {
        cudaError_t r1, r2;

        ok(strncmp(fake_call_name((enum fake_call)c), "cu", 2) == 0,
           "fake_call_name(%d) = %s", c, fake_call_name((enum fake_call)c));
        before = fake_calls((enum fake_call)c);
        fake_fail((enum fake_call)c, cudaErrorIllegalAddress, 0, 1);
        r1 = call_one((enum fake_call)c, s, e);
        r2 = call_one((enum fake_call)c, s, e);
        ok(r1 == cudaErrorIllegalAddress && r2 == cudaSuccess,
           "%s: fails once, then succeeds (%d, %d)",
           fake_call_name((enum fake_call)c), (int)r1, (int)r2);
        /* + the retry call_one makes to clean up after a failed release */
        is_int((long long)(fake_calls((enum fake_call)c) - before),
               2 + (c == FAKE_EVENT_DESTROY || c == FAKE_FREE ||
                    c == FAKE_FREE_HOST || c == FAKE_STREAM_DESTROY),
               "%s: calls counted, failed ones included",
               fake_call_name((enum fake_call)c));
    }
    is_str(fake_call_name(FAKE_EVENT_QUERY), "cudaEventQuery",
           "fake_call_name(FAKE_EVENT_QUERY)");
    is_str(fake_call_name(FAKE_NCALLS), "?", "fake_call_name out of range");
    is_int((long long)fake_live_allocations(), 0, "no allocations leaked");
    is_int((long long)fake_live_events(), 1, "no events leaked");
    is_int(fake_violations(), 0, "no violations");

    fake_fail(FAKE_EVENT_QUERY, cudaErrorLaunchFailure, 0, -1);
    for (i = 0, all_fail = 1; i < 5; i++)
        all_fail &= cudaEventQuery(e) == cudaErrorLaunchFailure;
    ok(all_fail, "count -1: fails every time");
    fake_fail_clear();
    is_int(cudaEventQuery(e), cudaSuccess, "fake_fail_clear");

    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 2, 2);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "skip 2: first call succeeds");
    cudaFree(p);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "skip 2: second call succeeds");
    cudaFree(p);
    is_int(cudaMalloc(&p, 8), cudaErrorMemoryAllocation, "third fails");
    is_int(cudaMalloc(&p, 8), cudaErrorMemoryAllocation, "fourth fails");
    is_int(cudaMalloc(&p, 8), cudaSuccess, "fifth succeeds");
    cudaFree(p);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, 1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, 0);
    is_int(cudaMalloc(&p, 8), cudaSuccess, "count 0 disarms");
    cudaFree(p);

    /* No side effects */
    fake_fail(FAKE_EVENT_CREATE, cudaErrorUnknown, 0, 1);
    cudaEventCreate(&ne);
    ok(ne == NULL, "failed cudaEventCreate writes nothing");
    is_int((long long)fake_live_events(), 1, "... creates nothing");
    fake_fail(FAKE_STREAM_CREATE, cudaErrorUnknown, 0, 1);
    cudaStreamCreateWithFlags(&ns, cudaStreamNonBlocking);
    ok(ns == NULL, "failed cudaStreamCreateWithFlags writes nothing");
    h = fake_launch_held(s, NULL, 0);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorUnknown, 0, 1);
    is_int(cudaEventRecord(e, s), cudaErrorUnknown, "failed record");
    is_int(cudaEventQuery(e), cudaSuccess, "... left the event as it was");
    fake_fail(FAKE_EVENT_SYNCHRONIZE, cudaErrorIllegalAddress, 0, 1);
    cudaEventRecord(e, s);
    is_int(cudaEventSynchronize(e), cudaErrorIllegalAddress,
           "failed cudaEventSynchronize returns at once");
    fake_fail(FAKE_EVENT_DESTROY, cudaErrorUnknown, 0, 1);
    cudaEventDestroy(e);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "failed destroy: event lives");
    fake_complete(h);
    cudaMallocHost(&p, 8);
    fake_fail(FAKE_FREE_HOST, cudaErrorUnknown, 0, 1);
    cudaFreeHost(p);
    is_int(fake_is_released(p), 0, "failed cudaFreeHost: allocation lives");
    cudaFreeHost(p);

    fake_set_latency(FAKE_EVENT_QUERY, 3000000);
    t0 = now_ms();
    cudaEventQuery(e);
    ok(now_ms() - t0 >= 3, "fake_set_latency: call took %.2f ms",
       now_ms() - t0);
    fake_set_latency(FAKE_EVENT_QUERY, 0);

    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, -1);
    fake_set_latency(FAKE_EVENT_QUERY, 1000000000);
    fake_reset(1);
    is_int(cudaGetDeviceCount(&i), cudaSuccess, "fake_reset clears injections");
    is_int((long long)fake_calls(FAKE_GET_DEVICE_COUNT), 1,
           "... and call counts");
    t0 = now_ms();
    cudaEventQuery(NULL);
    ok(now_ms() - t0 < 500, "... and latencies");
}

/* ---- Error strings, versions, attributes ------------------------------ */

void test_misc(void)
{
    int v = 0;

    diag("error strings, versions, attributes");
    is_str(cudaGetErrorString(cudaErrorIllegalAddress),
           "an illegal memory access was encountered", "IllegalAddress text");
    is_str(cudaGetErrorName(cudaErrorIllegalAddress),
           "cudaErrorIllegalAddress", "IllegalAddress name");
    is_str(cudaGetErrorString(cudaSuccess), "no error", "Success text");
    is_str(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady",
           "NotReady name");
    is_str(cudaGetErrorName(cudaErrorCudartUnloading),
           "cudaErrorCudartUnloading", "CudartUnloading name");
    is_str(cudaGetErrorString(cudaErrorInvalidResourceHandle),
           "invalid resource handle", "InvalidResourceHandle text");
    is_str(cudaGetErrorString((cudaError_t)12345), "unrecognized error code",
           "unknown code text");
    is_str(cudaGetErrorName((cudaError_t)12345), "unrecognized error code",
           "unknown code name");
    cudaGetLastError();
    is_int(cudaPeekAtLastError(), cudaSuccess, "cudaPeekAtLastError: cleared");
    cudaSetDevice(99);
    is_int(cudaPeekAtLastError(), cudaErrorInvalidDevice,
           "a failed call is the last error");
    is_int(cudaGetLastError(), cudaErrorInvalidDevice, "cudaGetLastError");
    is_int(cudaGetLastError(), cudaSuccess, "which clears it");
    cudaDriverGetVersion(&v);
    is_int(v, 13000, "driver version");
    cudaRuntimeGetVersion(&v);
    is_int(v, 13000, "runtime version");
    cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0);
    is_int(v, 9, "compute capability major");
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxTexture1DWidth, 0);
    is_int(v, 0, "unknown attribute: 0");
    is_int(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 7),
           cudaErrorInvalidDevice, "attribute of a bad device");
}

/* ---- Reset ------------------------------------------------------------ */

void test_reset(void)
{
    cudaStream_t s;
    cudaEvent_t e;
    void *p, *q;
    unsigned long long old_id;

    diag("fake_reset");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaEventCreate(&e);
    cudaMalloc(&p, 8);
    old_id = stream_id(s);
    fake_reset(1);
    is_int(cudaStreamQuery(s), cudaErrorInvalidResourceHandle,
           "old stream handles are stale");
    is_int(cudaEventQuery(e), cudaErrorInvalidResourceHandle,
           "old event handles are stale");
    is_int(fake_is_released(p), -1, "old pointers are unknown");
    is_int((long long)fake_live_allocations(), 0, "no live allocations");
    is_int((long long)fake_live_events(), 0, "no live events");
    ok(stream_id(0) > old_id, "stream ids are never reused");
    cudaMalloc(&q, 8);
    ok((uintptr_t)q > (uintptr_t)p, "addresses are never reused");
    cudaFree(q);
}
