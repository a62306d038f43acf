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
// with an allocation that raises torch.OutOfMemoryError, and sets the
// record_stream and empty_cache functions.  python/cudefer_torch.py
// compiles it at first use (g++ against the installed torch's headers and
// libraries) and calls cudefer_torch_install, then the two setters.
//
// It does not link against libcudefer: the caller passes the addresses of
// the functions from the library it loaded, so the hook and the allocator
// are always the same copy of cudefer.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <memory>

namespace {

// defer_record_stream's signature (include/cudefer.h).
using record_stream_fn = cudaError_t (*)(void *ptr, cudaStream_t stream);
// defer_pluggable_alloc_status's and defer_pluggable_free's.
using alloc_status_fn = cudaError_t (*)(void **ptr, size_t size, int device,
                                        cudaStream_t stream);
using free_fn = void (*)(void *ptr, size_t size, int device,
                         cudaStream_t stream);

// Copies what into message (NUL-terminated, truncated to size).
void put_message(char *message, size_t size, const char *what)
{
    if (message != nullptr && size > 0)
        std::snprintf(message, size, "%s", what);
}

}  // namespace

// cudefer_torch_install: make a pluggable allocator over alloc
// (defer_pluggable_alloc_status) and release (defer_pluggable_free)
// PyTorch's current CUDA allocator.  Its allocation raises
// torch.OutOfMemoryError when cudefer is out of memory (cudefer has
// trimmed what it held and tried again by then) and RuntimeError on any
// other error (cudefer said which on stderr), instead of handing PyTorch a
// NULL it would not check.  Call from Python once, before the first CUDA
// tensor and before other threads use CUDA.  Never blocks.  Returns 0 when
// installed; 2 for a NULL function; 3 when PyTorch refused (its reason,
// e.g. an allocator already in use, is copied to message, at most size
// bytes).  Nothing is changed unless it returns 0.
extern "C" __attribute__((visibility("default"))) int
cudefer_torch_install(void *alloc, void *release, char *message, size_t size)
{
    namespace pluggable = torch::cuda::CUDAPluggableAllocator;
    if (alloc == nullptr || release == nullptr)
        return 2;
    auto allocate = reinterpret_cast<alloc_status_fn>(alloc);
    auto free_block = reinterpret_cast<free_fn>(release);
    try {
        auto allocator = pluggable::createCustomAllocator(
            [allocate](size_t bytes, int device, cudaStream_t stream) {
                void *ptr = nullptr;
                cudaError_t err = allocate(&ptr, bytes, device, stream);
                TORCH_CHECK_WITH(OutOfMemoryError,
                                 err != cudaErrorMemoryAllocation,
                                 "cudefer: CUDA out of memory: tried to "
                                 "allocate ", bytes, " bytes on device ",
                                 device, " (cudefer released every free "
                                 "block it held and tried again)");
                TORCH_CHECK(err == cudaSuccess, "cudefer: allocating ", bytes,
                            " bytes on device ", device,
                            " failed with CUDA error ", static_cast<int>(err),
                            " (cudefer's message on stderr says more)");
                return ptr;
            },
            [free_block](void *ptr, size_t bytes, int device,
                         cudaStream_t stream) {
                free_block(ptr, bytes, device, stream);
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
    }
    return 0;
}

// cudefer_torch_set_record_stream: make PyTorch's current allocator, which
// must be the pluggable allocator enable() just installed, call
// record(ptr, stream) for every Tensor.record_stream.  ptr is what PyTorch
// passes: the data pointer of the tensor's storage, which is the pointer the
// allocator returned (the start of the block), whatever view or offset the
// tensor has.  Call from Python once, after change_current_allocator and
// before any thread calls record_stream (PyTorch keeps the hook in a plain
// std::function, unguarded).  Never blocks.  Returns 0 when the hook is set,
// 1 when the current allocator is not a CUDAPluggableAllocator (nothing
// set), 2 for a NULL record.
extern "C" __attribute__((visibility("default"))) int
cudefer_torch_set_record_stream(void *record)
{
    using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
    if (record == nullptr)
        return 2;
    auto *pluggable = dynamic_cast<CUDAPluggableAllocator *>(
        c10::cuda::CUDACachingAllocator::get());
    if (pluggable == nullptr)
        return 1;
    auto fn = reinterpret_cast<record_stream_fn>(record);
    pluggable->set_record_stream_fn([fn](void *ptr, cudaStream_t stream) {
        // A storage of no bytes has no block (the allocator returned NULL).
        if (ptr == nullptr)
            return;
        cudaError_t err = fn(ptr, stream);
        // cudaErrorInvalidValue: not a block of cudefer's (memory PyTorch
        // did not allocate, e.g. imported through DLPack).  cudefer has
        // said so on stderr; like PyTorch's own allocator, which ignores
        // record_stream on memory it does not own, carry on.  Anything
        // else means the stream could not be recorded and the block could
        // be reused too early: fail the record_stream call.
        TORCH_CHECK(err == cudaSuccess || err == cudaErrorInvalidValue,
                    "cudefer: defer_record_stream failed with CUDA error ",
                    static_cast<int>(err),
                    "; the tensor's memory is not protected for that stream");
    });
    return 0;
}

// cudefer_torch_set_empty_cache: make torch.cuda.empty_cache() call
// trim(NULL) (defer_trim: release every completed block cudefer holds),
// which the pluggable allocator otherwise ignores.  Same callers and rules
// as cudefer_torch_set_record_stream; the same return values.
extern "C" __attribute__((visibility("default"))) int
cudefer_torch_set_empty_cache(void *trim)
{
    using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
    using trim_fn = cudaError_t (*)(size_t *released_bytes);
    if (trim == nullptr)
        return 2;
    auto *pluggable = dynamic_cast<CUDAPluggableAllocator *>(
        c10::cuda::CUDACachingAllocator::get());
    if (pluggable == nullptr)
        return 1;
    auto fn = reinterpret_cast<trim_fn>(trim);
    pluggable->set_reset_fn([fn]() {
        cudaError_t err = fn(nullptr);
        TORCH_CHECK(err == cudaSuccess,
                    "cudefer: defer_trim failed with CUDA error ",
                    static_cast<int>(err));
    });
    return 0;
}
