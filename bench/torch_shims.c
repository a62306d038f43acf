/*
 * torch_shims.c: the allocators cudefer is compared with, as PyTorch
 * pluggable allocators (torch.cuda.memory.CUDAPluggableAllocator loads a
 * shared object and two functions of these signatures).  bench/torch_train.py
 * compiles this file at first use (cc -shared -fPIC against the CUDA runtime
 * and libcudefer) and picks a pair by name:
 *
 *   pluggable-async  shim_async_alloc  / shim_async_free   cudaMallocAsync, cudaFreeAsync
 *   malloc-defer     shim_malloc_alloc / shim_defer_free   cudaMalloc, defer_free
 *   malloc-free      shim_malloc_alloc / shim_cudafree     cudaMalloc, cudaFree
 *
 * cudefer itself needs no shim: libcudefer exports defer_pluggable_alloc
 * and defer_pluggable_free.  None of these hears Tensor.record_stream
 * (PyTorch forwards it to a pluggable allocator only through a C++ hook),
 * so on a program that relies on record_stream they may reuse memory early.
 */
#include <stdio.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "cudefer.h"

/* Make device current on the calling thread; *previous gets the device that
 * was (so that the caller can restore it).  Returns the CUDA error. */
static cudaError_t enter_device(int device, int *previous)
{
    cudaError_t err = cudaGetDevice(previous);
    if (err != cudaSuccess || *previous == device)
        return err;
    return cudaSetDevice(device);
}

/* Restore the device enter_device found. */
static void leave_device(int device, int previous)
{
    if (previous != device)
        (void)cudaSetDevice(previous);
}

/* Report a failed CUDA call of a shim on stderr (PyTorch sees only NULL). */
static void report_error(const char *what, cudaError_t err, size_t size)
{
    fprintf(stderr, "torch_shims: %s(%zu bytes): %s\n", what, size,
            cudaGetErrorString(err));
}

/* cudaMallocAsync on stream, on device.  Called by PyTorch on any thread;
 * never blocks on the GPU.  Returns NULL when out of memory (PyTorch then
 * raises its out-of-memory error) or on error (reported). */
void *shim_async_alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = NULL;
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaMallocAsync(&ptr, size, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess) {
        if (err != cudaErrorMemoryAllocation)
            report_error("cudaMallocAsync", err, size);
        (void)cudaGetLastError();
        return NULL;
    }
    return ptr;
}

/* cudaFreeAsync on the allocation's stream (the stream PyTorch passes). */
void shim_async_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaFreeAsync(ptr, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("cudaFreeAsync", err, size);
}

/* cudaMalloc on device (stream unused).  Blocks as cudaMalloc does.
 * Returns NULL when out of memory or on error (reported). */
void *shim_malloc_alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = NULL;
    int previous;
    (void)stream;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaMalloc(&ptr, size);
        leave_device(device, previous);
    }
    if (err != cudaSuccess) {
        if (err != cudaErrorMemoryAllocation)
            report_error("cudaMalloc", err, size);
        (void)cudaGetLastError();
        return NULL;
    }
    return ptr;
}

/* defer_free on the allocation's stream: released by cudefer's reclaimer.
 * Never blocks on the GPU. */
void shim_defer_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = defer_free(ptr, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("defer_free", err, size);
}

/* cudaFree: waits for the whole device. */
void shim_cudafree(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    (void)stream;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaFree(ptr);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("cudaFree", err, size);
}
