/* SPDX-License-Identifier: MIT */
/* A C++ translation unit built as nvcc --default-stream per-thread builds
 * one (CUDA_API_PER_THREAD_DEFAULT_STREAM): cudefer.h's stream macros
 * compile there with no warning of -Wzero-as-null-pointer-constant, which
 * strict C++ builds turn into errors, and its 0 means the thread's
 * per-thread stream (t/cxx_deleter calls it). */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include <cuda_runtime_api.h> /* its default arguments are 0s */
#pragma GCC diagnostic error "-Wzero-as-null-pointer-constant"

#include "cudefer.h"

/* defer_free(p, 0) through the macro: cudaStreamPerThread for 0. */
cudaError_t cxx_per_thread_free(void *p)
{
    return defer_free(p, nullptr);
}
