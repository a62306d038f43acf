// record_stream_hook.cpp: forwards PyTorch's Tensor.record_stream to cudefer.
//
// A pluggable allocator loaded from Python (torch.cuda.memory.
// CUDAPluggableAllocator) gets only an alloc and a free function; PyTorch
// hands Tensor.record_stream(s) to the allocator's C++ recordStream, which
// for the pluggable allocator calls the function set with the C++-only
// set_record_stream_fn, or does nothing when none was set.  This file sets
// it.  python/cudefer_torch.py compiles it at first use (g++ against the
// installed torch's headers and libraries) and calls the one function
// below right after installing cudefer as the current allocator.
//
// It does not link against libcudefer: the caller passes the address of
// defer_record_stream from the library it loaded, so the hook and the
// allocator are always the same copy of cudefer.

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

namespace {

// defer_record_stream's signature (include/cudefer.h).
using record_stream_fn = cudaError_t (*)(void *ptr, cudaStream_t stream);

}  // namespace

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
