/* SPDX-License-Identifier: MIT */
/* Small kernels shared by the GPU tests, the demo and the benchmark.
 * Each launcher enqueues one kernel on stream and returns the launch error. */
#ifndef CUDEFER_GPU_KERNELS_H
#define CUDEFER_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Busy-wait ns nanoseconds (by %globaltimer) on one thread. */
cudaError_t gpu_spin(cudaStream_t stream, uint64_t ns);

/* Busy-wait ns nanoseconds, then fill bytes of buf with byte value. */
cudaError_t gpu_spin_fill(cudaStream_t stream, uint64_t ns, void *buf,
                          size_t bytes, unsigned char value);

/* Busy-wait ns nanoseconds, then store value into *flag (pinned host memory
 * or device memory) with a system-wide fence. */
cudaError_t gpu_spin_set_flag(cudaStream_t stream, uint64_t ns,
                              volatile int *flag, int value);

/* Spin until *flag (mapped pinned host memory, given as a device pointer) is
 * non-zero or timeout_ns nanoseconds have passed, whichever comes first.
 * Used by the benchmark to hold streams back while it enqueues work. */
cudaError_t gpu_wait_flag(cudaStream_t stream, volatile int *flag,
                          uint64_t timeout_ns);

/* Write through an invalid device address (a store to 0x10), which the
 * device reports as an illegal address: the context is lost for the rest of
 * the process (a sticky error).  For tests that run it in a child process. */
cudaError_t gpu_fault_illegal_address(cudaStream_t stream);

/* Block until no other GPU test of this build runs (an flock on a file in
 * the temporary directory, held until the process exits): tests that count
 * device memory must not see another test's allocations.  Call it first. */
void gpu_tests_serialize(void);

#ifdef __cplusplus
}
#endif

#endif
