/* SPDX-License-Identifier: MIT */
// record_stream_hook.cpp: cudefer as PyTorch's allocator, with what a
// pluggable allocator loaded from Python lacks.
//
// A pluggable allocator loaded from Python (torch.cuda.memory.
// CUDAPluggableAllocator) gets only an alloc and a free function, and
// PyTorch 2.11 does not check the pointer alloc returns: out of memory
// becomes a tensor at address 0.  PyTorch also hands Tensor.record_stream(s)
// to the allocator's C++ recordStream, which for the pluggable allocator
// calls the function set with the C++-only set_record_stream_fn, or does
// nothing when none was set.  This file installs the allocator from C++,
// with an allocation that raises torch.OutOfMemoryError and the
// record_stream and empty_cache functions set, in one step.
// python/cudefer_torch.py compiles it at first use (g++ against the
// installed torch's headers and libraries) and calls cudefer_torch_install.
//
// It does not link against libcudefer: the caller passes the addresses of
// the functions from the library it loaded, so the hook and the allocator
// are always the same copy of cudefer.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>

namespace {

// Record_stream calls that reached cudefer and recorded their stream
// (cudefer_torch_recorded): how a test knows the hook is wired, not only
// installed.
std::atomic<unsigned long long> recorded{0};

// defer_record_stream's signature (include/cudefer.h).
using record_stream_fn = cudaError_t (*)(void *ptr, cudaStream_t stream);
// defer_pluggable_alloc_status's, defer_pluggable_free's, defer_trim's.
using alloc_status_fn = cudaError_t (*)(void **ptr, size_t size, int device,
                                        cudaStream_t stream);
using free_fn = void (*)(void *ptr, size_t size, int device,
                         cudaStream_t stream);
using trim_fn = cudaError_t (*)(size_t *released_bytes);

using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// PyTorch's allocation: a block, or torch.OutOfMemoryError when cudefer is
// out of memory, RuntimeError for any other error (cudefer said which on
// stderr), instead of a NULL that PyTorch 2.11 would not check.
void *allocate(alloc_status_fn alloc, size_t bytes, int device,
               cudaStream_t stream)
{
    void *ptr = nullptr;
    cudaError_t err = alloc(&ptr, bytes, device, stream);
    TORCH_CHECK_WITH(OutOfMemoryError, err != cudaErrorMemoryAllocation,
                     "cudefer: CUDA out of memory: tried to allocate ", bytes,
                     " bytes on device ", device);
    TORCH_CHECK(err == cudaSuccess, "cudefer: allocating ", bytes,
                " bytes on device ", device, " failed with CUDA error ",
                static_cast<int>(err), " (cudefer's message on stderr says ",
                "more)");
    return ptr;
}

// Tensor.record_stream(stream) of the block at ptr.  ptr is what PyTorch
// passes: the data pointer of the tensor's storage, which is the pointer
// the allocator returned (the start of the block), whatever view or offset
// the tensor has.
void record(record_stream_fn fn, void *ptr, cudaStream_t stream)
{
    // A storage of no bytes has no block (the allocator returned NULL).
    if (ptr == nullptr)
        return;
    cudaError_t err = fn(ptr, stream);
    if (err == cudaSuccess)
        recorded.fetch_add(1, std::memory_order_relaxed);
    // cudaErrorInvalidValue: not a block of cudefer's (memory PyTorch did
    // not allocate, e.g. imported through DLPack).  cudefer has said so on
    // stderr; like PyTorch's own allocator, which ignores record_stream on
    // memory it does not own, carry on.  Anything else means the stream
    // could not be recorded and the block could be reused too early: fail
    // the record_stream call.
    TORCH_CHECK(err == cudaSuccess || err == cudaErrorInvalidValue,
                "cudefer: defer_record_stream failed with CUDA error ",
                static_cast<int>(err),
                "; the tensor's memory is not protected for that stream");
}

// Copies what into message (NUL-terminated, truncated to size).
void put_message(char *message, size_t size, const char *what)
{
    if (message != nullptr && size > 0)
        std::snprintf(message, size, "%s", what);
}

}  // namespace

// cudefer_torch_recorded: how many Tensor.record_stream calls reached
// defer_record_stream through this hook and recorded their stream.  Any
// thread; never blocks.
extern "C" __attribute__((visibility("default"))) unsigned long long
cudefer_torch_recorded(void)
{
    return recorded.load(std::memory_order_relaxed);
}

// cudefer_torch_install: make PyTorch's current CUDA allocator a pluggable
// allocator over cudefer, given the addresses of defer_pluggable_alloc_status,
// defer_pluggable_free, defer_record_stream and defer_trim of the library
// Python loaded: allocations raise torch.OutOfMemoryError (see allocate),
// Tensor.record_stream calls defer_record_stream, torch.cuda.empty_cache()
// calls defer_trim.  Everything is set before the allocator becomes
// current, so nothing changes unless it returns 0.  Call from Python once,
// before the first CUDA tensor and before other threads use CUDA.  Never
// blocks.  Returns 0 when installed; 2 for a NULL function; 3 when PyTorch
// refused (its reason, e.g. an allocator already in use, is copied to
// message, at most size bytes, NUL-terminated).
extern "C" __attribute__((visibility("default"))) int
cudefer_torch_install(void *alloc, void *release, void *record_stream,
                      void *trim, char *message, size_t size)
{
    namespace pluggable = torch::cuda::CUDAPluggableAllocator;
    if (alloc == nullptr || release == nullptr || record_stream == nullptr ||
        trim == nullptr)
        return 2;
    auto alloc_fn = reinterpret_cast<alloc_status_fn>(alloc);
    auto release_fn = reinterpret_cast<free_fn>(release);
    auto record_fn = reinterpret_cast<record_stream_fn>(record_stream);
    auto trim_block_fn = reinterpret_cast<trim_fn>(trim);
    try {
        auto allocator = pluggable::createCustomAllocator(
            [alloc_fn](size_t bytes, int device, cudaStream_t stream) {
                return allocate(alloc_fn, bytes, device, stream);
            },
            [release_fn](void *ptr, size_t bytes, int device,
                         cudaStream_t stream) {
                release_fn(ptr, bytes, device, stream);
            });
        auto *mine = dynamic_cast<CUDAPluggableAllocator *>(allocator.get());
        TORCH_CHECK(mine != nullptr, "createCustomAllocator made no "
                                     "CUDAPluggableAllocator");
        mine->set_record_stream_fn([record_fn](void *ptr, cudaStream_t s) {
            record(record_fn, ptr, s);
        });
        mine->set_reset_fn([trim_block_fn]() {
            cudaError_t err = trim_block_fn(nullptr);
            TORCH_CHECK(err == cudaSuccess,
                        "cudefer: defer_trim failed with CUDA error ",
                        static_cast<int>(err));
        });
        pluggable::changeCurrentAllocator(allocator);
    } catch (const c10::Error &e) {
        // No C++ exception may cross into ctypes: hand the reason back
        // (without the C++ backtrace what() appends).
        put_message(message, size, e.what_without_backtrace());
        return 3;
    } catch (const std::exception &e) {
        put_message(message, size, e.what());
        return 3;
    } catch (...) {
        put_message(message, size, "an exception that is no std::exception");
        return 3;
    }
    return 0;
}
