/* SPDX-License-Identifier: MIT */
// torch_probe.cpp: the CUDA allocator calls PyTorch's Python API does not
// reach, for t/gpu/torch_full.py (compiled with cpp_extension, loaded
// with ctypes: no Python headers needed).  Each function calls whichever
// allocator is PyTorch's current one and returns 0, or 1 with the C++
// exception's type ("c10::Error", "std::exception") and the first line of
// its message copied to error (NUL-terminated, at most size bytes): no
// C++ exception crosses into ctypes.  Any thread.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

int failed(char *error, size_t size, const char *type, const char *what)
{
    std::string line(what);
    line = line.substr(0, line.find('\n'));
    std::snprintf(error, size, "%s: %s", type, line.c_str());
    return 1;
}

template <typename F>
int guarded(char *error, size_t size, F call)
{
    try {
        call();
        return 0;
    } catch (const c10::Error &e) {
        return failed(error, size, "c10::Error",
                      e.what_without_backtrace());
    } catch (const std::exception &e) {
        return failed(error, size, "std::exception", e.what());
    }
}

c10::MempoolId_t pool_id(uint64_t first, uint64_t second)
{
    return {static_cast<c10::CaptureId_t>(first),
            static_cast<c10::CaptureId_t>(second)};
}

}  // namespace

// getBaseAllocation(ptr, &size): the base into *base, the size into *size.
extern "C" __attribute__((visibility("default"))) int
probe_base_allocation(uintptr_t ptr, uintptr_t *base, uint64_t *size,
                      char *error, size_t error_size)
{
    return guarded(error, error_size, [&] {
        size_t n = 0;
        void *b = c10::cuda::CUDACachingAllocator::getBaseAllocation(
            reinterpret_cast<void *>(ptr), &n);
        *base = reinterpret_cast<uintptr_t>(b);
        *size = n;
    });
}

// getPoolUseCount(device, (first, second)) into *count.
extern "C" __attribute__((visibility("default"))) int
probe_pool_use_count(int device, uint64_t first, uint64_t second,
                     int *count, char *error, size_t error_size)
{
    return guarded(error, error_size, [&] {
        *count = c10::cuda::CUDACachingAllocator::getPoolUseCount(
            static_cast<c10::DeviceIndex>(device), pool_id(first, second));
    });
}

// releasePool(device, (first, second)).
extern "C" __attribute__((visibility("default"))) int
probe_release_pool(int device, uint64_t first, uint64_t second, char *error,
                   size_t error_size)
{
    return guarded(error, error_size, [&] {
        c10::cuda::CUDACachingAllocator::releasePool(
            static_cast<c10::DeviceIndex>(device), pool_id(first, second));
    });
}
