/* SPDX-License-Identifier: MIT */
/* Kernels for the GPU tests, the demo and the benchmark (see gpu_kernels.h). */
#include "gpu_kernels.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

__device__ static uint64_t global_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ static void spin_ns(uint64_t ns)
{
    uint64_t start = global_ns();
    while (global_ns() - start < ns) {
    }
}

__global__ static void spin_kernel(uint64_t ns)
{
    spin_ns(ns);
}

/* Thread 0 of every block spins, then the whole grid fills: no byte is
 * written before ns have passed. */
__global__ static void spin_fill_kernel(uint64_t ns, unsigned char *buf,
                                        size_t bytes, unsigned char value)
{
    if (threadIdx.x == 0)
        spin_ns(ns);
    __syncthreads();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes;
         i += stride)
        buf[i] = value;
}

__global__ static void spin_set_flag_kernel(uint64_t ns, volatile int *flag,
                                            int value)
{
    spin_ns(ns);
    __threadfence_system();
    *flag = value;
    __threadfence_system();
}

extern "C" cudaError_t gpu_spin(cudaStream_t stream, uint64_t ns)
{
    spin_kernel<<<1, 1, 0, stream>>>(ns);
    return cudaGetLastError();
}

extern "C" cudaError_t gpu_spin_fill(cudaStream_t stream, uint64_t ns,
                                     void *buf, size_t bytes,
                                     unsigned char value)
{
    spin_fill_kernel<<<8, 256, 0, stream>>>(ns, (unsigned char *)buf, bytes,
                                            value);
    return cudaGetLastError();
}

extern "C" cudaError_t gpu_spin_set_flag(cudaStream_t stream, uint64_t ns,
                                         volatile int *flag, int value)
{
    spin_set_flag_kernel<<<1, 1, 0, stream>>>(ns, flag, value);
    return cudaGetLastError();
}

__global__ static void wait_flag_kernel(volatile int *flag, uint64_t timeout_ns)
{
    uint64_t start = global_ns();
    while (*flag == 0 && global_ns() - start < timeout_ns) {
    }
}

extern "C" cudaError_t gpu_wait_flag(cudaStream_t stream, volatile int *flag,
                                     uint64_t timeout_ns)
{
    wait_flag_kernel<<<1, 1, 0, stream>>>(flag, timeout_ns);
    return cudaGetLastError();
}

__global__ static void fault_kernel(volatile int *bad)
{
    *bad = 1;
}

extern "C" cudaError_t gpu_fault_illegal_address(cudaStream_t stream)
{
    fault_kernel<<<1, 1, 0, stream>>>((volatile int *)(uintptr_t)0x10);
    return cudaGetLastError();
}

extern "C" void gpu_tests_serialize(void)
{
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/cudefer-gpu-tests.lock",
             dir != NULL && *dir != '\0' ? dir : "/tmp");
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (fd >= 0)
        flock(fd, LOCK_EX); /* released when the process exits */
}
