/* SPDX-License-Identifier: MIT */
/*
 * cudefer.hpp — C++ ownership for cudefer: deleters for std::unique_ptr and
 * std::shared_ptr that release CUDA memory with defer_free, bound to the
 * stream whose work uses the memory.  Header-only, C++11; link with
 * -lcudefer as for the C API (<cudefer.h>).
 *
 *   float *raw;
 *   cudaMalloc(&raw, n * sizeof *raw);
 *   std::shared_ptr<float> p(raw, cudefer::deleter{stream});
 *   my_kernel<<<grid, block, 0, stream>>>(p.get());
 *   p.reset();   // returns at once: freed once the kernel is done
 *
 *   auto buf = cudefer::make_device_unique<float>(n, stream);   // T[]
 *
 * cudefer::deleter releases device memory (cudaMalloc, and pool memory from
 * cudaMallocAsync, which cudefer frees with cudaFreeAsync);
 * cudefer::host_deleter releases pinned host memory (cudaMallocHost,
 * cudaHostAlloc).  Each holds the stream whose work must be done before the
 * memory is released; when the last use moves to another stream, change it
 * (p.get_deleter().stream = other).  The stream must still exist when the
 * deleter runs.  As with defer_free, the event is recorded on the thread that
 * runs the deleter (the one that drops the last owner): stream 0 means the
 * legacy stream of that thread's current device, cudaStreamPerThread that
 * thread's own stream.
 *
 * A deleter never throws.  If defer_free (or defer_free_host) refuses the
 * pointer — after defer_shutdown, in a forked child, on a stream that cannot
 * be recorded — the deleter releases it synchronously instead: it waits for
 * the stream (cudaStreamSynchronize) and calls cudaFree (cudaFreeHost), so
 * nothing leaks — unless CUDA refuses those calls too: in a forked child, or
 * on a stream whose graph capture was invalidated.  Three refusals leave
 * the pointer alone: cudaErrorInvalidValue, where cudefer says the pointer
 * is not the caller's to give (a block of defer_alloc already freed, a
 * pointer inside one: freeing it would free memory another owner uses),
 * and the refusals of a capture under way, which waiting or freeing would
 * break (the memory stays allocated): cudaErrorStreamCaptureUnsupported (a
 * capture cudefer cannot defer into) and cudaErrorStreamCaptureImplicit
 * (the legacy stream while a blocking stream of its device captures).
 * Every refusal is explained on stderr by cudefer.
 *
 * Not for blocks of defer_alloc: where cudefer refuses one for another
 * cause (after defer_shutdown, on a destroyed stream), the fallback's
 * cudaFree releases memory of cudefer's cache, the blocks cut from the same
 * allocation with it, while others own them.  Free blocks with defer_free.
 */
#ifndef CUDEFER_HPP
#define CUDEFER_HPP

#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "cudefer.h"

namespace cudefer {

namespace detail {

/* p as the untyped pointer the C API takes, whatever T's qualifiers. */
template <class T>
inline void *untyped(T *p) noexcept
{
    return const_cast<void *>(static_cast<const volatile void *>(p));
}

/* Whether a refusal of defer_free leaves p the caller's to release now:
 * not where cudefer says p is not the caller's to give (a block of
 * defer_alloc already freed, a pointer inside one: freeing it would free
 * memory its next owner uses), nor where a capture under way refused it
 * (a capture cudefer cannot defer into; the legacy stream beside a
 * blocking stream's capture): cudaStreamSynchronize and cudaFree would
 * invalidate that capture. */
inline bool release_now_after(cudaError_t refusal) noexcept
{
    return refusal != cudaErrorInvalidValue &&
           refusal != cudaErrorStreamCaptureUnsupported &&
           refusal != cudaErrorStreamCaptureImplicit;
}

/* The fallback when cudefer refused p: wait for stream, release now. */
inline void free_device_now(void *p, cudaStream_t stream) noexcept
{
    (void)cudaStreamSynchronize(stream);
    (void)cudaFree(p); /* cudaFree also waits for the device's work */
}

inline void free_host_now(void *p, cudaStream_t stream) noexcept
{
    (void)cudaStreamSynchronize(stream);
    (void)cudaFreeHost(p);
}

inline cudaError_t malloc_device(void **p, std::size_t bytes)
{
    return cudaMalloc(p, bytes);
}

inline cudaError_t malloc_host(void **p, std::size_t bytes)
{
    return cudaMallocHost(p, bytes);
}

/* n objects of T from alloc; on cudaErrorMemoryAllocation, defer_trim and
 * one retry (pool memory a trim releases is not counted in its bytes, so
 * the retry does not ask them); std::bad_alloc if it still fails. */
template <class T>
inline T *allocate(cudaError_t (*alloc)(void **, std::size_t), std::size_t n)
{
    static_assert(std::is_trivially_destructible<T>::value,
                  "cudefer: no destructor runs on memory from "
                  "make_device_unique / make_host_unique");
    if (n == 0)
        return nullptr;
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
        throw std::bad_alloc();
    void *p = nullptr;
    cudaError_t err = alloc(&p, n * sizeof(T));
    if (err == cudaErrorMemoryAllocation) {
        std::size_t released = 0;
        (void)cudaGetLastError(); /* clear the runtime's last error */
        if (defer_trim(&released) == cudaSuccess)
            err = alloc(&p, n * sizeof(T));
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::bad_alloc();
    }
    return static_cast<T *>(p);
}

} // namespace detail

/*
 * deleter: defer_free(p, stream) — device memory, released once the work
 * enqueued on stream up to the moment the deleter runs is done.  A
 * default-constructed deleter uses stream 0.  For std::unique_ptr<T,
 * cudefer::deleter> and std::unique_ptr<T[], cudefer::deleter> of any T, and
 * as the deleter of a std::shared_ptr.
 */
struct deleter {
    cudaStream_t stream;

    constexpr deleter() noexcept : stream(nullptr) {}
    constexpr explicit deleter(cudaStream_t s) noexcept : stream(s) {}

    template <class T>
    void operator()(T *p) const noexcept
    {
        void *raw = detail::untyped(p);
        cudaError_t err = raw != nullptr ? defer_free(raw, stream) : cudaSuccess;
        if (err != cudaSuccess && detail::release_now_after(err))
            detail::free_device_now(raw, stream);
    }

    /* std::shared_ptr<T>(nullptr, d) calls d(nullptr): nothing to free. */
    void operator()(std::nullptr_t) const noexcept {}
};

/* host_deleter: defer_free_host(p, stream) — pinned host memory; otherwise
 * as deleter (the fallback is cudaStreamSynchronize, then cudaFreeHost). */
struct host_deleter {
    cudaStream_t stream;

    constexpr host_deleter() noexcept : stream(nullptr) {}
    constexpr explicit host_deleter(cudaStream_t s) noexcept : stream(s) {}

    template <class T>
    void operator()(T *p) const noexcept
    {
        void *raw = detail::untyped(p);
        cudaError_t err =
            raw != nullptr ? defer_free_host(raw, stream) : cudaSuccess;
        if (err != cudaSuccess && detail::release_now_after(err))
            detail::free_host_now(raw, stream);
    }

    void operator()(std::nullptr_t) const noexcept {}
};

/* Owners of n objects of T in device memory and in pinned host memory. */
template <class T>
using device_array = std::unique_ptr<T[], deleter>;
template <class T>
using host_array = std::unique_ptr<T[], host_deleter>;

/*
 * make_device_unique<T>(n, stream): cudaMalloc of n objects of T (not
 * constructed: T must be trivially destructible), owned by a
 * std::unique_ptr<T[]> whose deleter defers the free on stream.  When
 * cudaMalloc runs out of memory, defer_trim releases what cudefer holds and
 * the allocation is tried once more (defer_trim blocks briefly).  Throws
 * std::bad_alloc if it fails (or n * sizeof(T) overflows).  n == 0 gives an
 * empty pointer.
 */
template <class T>
device_array<T> make_device_unique(std::size_t n, cudaStream_t stream = nullptr)
{
    return device_array<T>(detail::allocate<T>(detail::malloc_device, n),
                           deleter(stream));
}

/* make_host_unique<T>(n, stream): the same with cudaMallocHost (pinned host
 * memory) and host_deleter. */
template <class T>
host_array<T> make_host_unique(std::size_t n, cudaStream_t stream = nullptr)
{
    return host_array<T>(detail::allocate<T>(detail::malloc_host, n),
                         host_deleter(stream));
}

} // namespace cudefer

#endif /* CUDEFER_HPP */
