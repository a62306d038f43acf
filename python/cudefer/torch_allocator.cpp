/* SPDX-License-Identifier: MIT */
// torch_allocator.cpp: cudefer as PyTorch's CUDA allocator: allocation and
// free (the hot path), record_stream, the memory fraction, out of memory,
// the rest of CUDAAllocator, and the entry points Python calls.
// torch_allocator.h says what the allocator serves and its thread rules.

#include "torch_allocator.h"

#include <c10/util/llvmMathExtras.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>

namespace cudefer_torch __attribute__((visibility("hidden"))) {

namespace {

std::string format_size(uint64_t bytes)
{
    char text[64];
    if (bytes < (1u << 10))
        std::snprintf(text, sizeof text, "%" PRIu64 " bytes", bytes);
    else if (bytes < (1u << 20))
        std::snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
    else if (bytes < (1ull << 30))
        std::snprintf(text, sizeof text, "%.2f MiB", bytes / 1048576.0);
    else if (bytes < (1ull << 40))
        std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
    else
        std::snprintf(text, sizeof text, "%.2f TiB",
                      bytes / 1099511627776.0);
    return text;
}

CudeferAllocator *the_allocator = nullptr;  // set once, before it is current
std::atomic<unsigned long long> recorded{0};

}  // namespace

std::atomic<int> sections_anywhere{0};

// PyTorch's own allocator's rounding of a request (round_size of
// CUDACachingAllocator.cpp): at least 512 bytes, a multiple of 512, or the
// next of roundup_power2_divisions' steps where configured.
size_t torch_round_size(size_t size)
{
    if (size < kMinBlockSize)
        return kMinBlockSize;
    size_t divisions =
        c10::CachingAllocator::AcceleratorAllocatorConfig::
            roundup_power2_divisions(size);
    if (divisions > 1 && size > kMinBlockSize * divisions) {
        if (c10::llvm::isPowerOf2_64(size))
            return size;
        size_t floor2 = c10::llvm::PowerOf2Floor(size);
        size_t step =
            floor2 >> (63 - c10::llvm::countLeadingZeros(divisions));
        if (step == 0)
            return floor2 << 1;
        size_t down = size & ~(step - 1);
        return down == size ? size : down + step;
    }
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

c10::DataPtr CudeferAllocator::allocate(size_t size)
{
    c10::DeviceIndex device = c10::cuda::current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void *ptr = malloc(size, device, stream);
    return {ptr, ptr, &raw_delete_fn,
            c10::Device(c10::DeviceType::CUDA, device)};
}

void *CudeferAllocator::raw_alloc(size_t nbytes)
{
    c10::DeviceIndex device = c10::cuda::current_device();
    return malloc(nbytes, device,
                  c10::cuda::getCurrentCUDAStream(device).stream());
}

void *CudeferAllocator::raw_alloc_with_stream(size_t nbytes,
                                              cudaStream_t stream)
{
    return malloc(nbytes, c10::cuda::current_device(), stream);
}

// Any thread; blocks only where cudefer does (out of memory: a trim, and
// the work its pending frees wait for), and while memory history records
// stacks, for the GIL (the recorder takes it, before any lock of the
// allocator's).  Raises OutOfMemoryError.
void *CudeferAllocator::malloc(size_t size, c10::DeviceIndex device,
                               cudaStream_t stream)
{
    if (size == 0)
        return nullptr;
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "cudefer: device ",
                static_cast<int>(device), " is beyond the ", kMaxDevices,
                " devices cudefer's PyTorch allocator keeps");
    if (C10_UNLIKELY(tracing()))
        return malloc_traced(size, device, stream);
    return malloc_untraced(size, device, stream);
}

// malloc once its arguments are checked, without memory history.  Any
// thread, holding no lock of the allocator's; blocks only where cudefer
// does (out of memory: its trim, then defer_flush).  Raises
// OutOfMemoryError.
void *CudeferAllocator::malloc_untraced(
    size_t size, c10::DeviceIndex device, cudaStream_t stream,
    const std::shared_ptr<c10::GatheredContext> *context)
{
    DeviceState &d = *devices_[device];
    size_t rounded = torch_round_size(size);
    // The cap covers private pools' allocations too, as PyTorch's
    // allowed_memory_maximum covers its private pools' segments.
    uint64_t cap = d.cap.load(std::memory_order_relaxed);
    if (C10_UNLIKELY(cap != kNoCap) &&
        static_cast<uint64_t>(
            d.allocated_bytes.s[0].current.load(std::memory_order_relaxed)) +
                rounded > cap)
        out_of_memory(device, rounded, "the memory fraction's cap", stream,
                      context);
    if (C10_UNLIKELY(d.sections.load(std::memory_order_acquire) > 0)) {
        void *p = pool_malloc(d, device, size, rounded, stream, context);
        if (p != nullptr)
            return p;
    } else if (C10_UNLIKELY(
                   d.has_deferred.load(std::memory_order_relaxed) ||
                   d.has_deferred_frees.load(std::memory_order_relaxed)) &&
               sections_anywhere.load(std::memory_order_acquire) == 0) {
        // Blocks freed with uses while a section was open: their events
        // are recorded now that none is (pool blocks), or they go to
        // cudefer (its memory), as PyTorch's allocator records them at an
        // allocation with no capture under way.
        {
            std::lock_guard<std::mutex> lock(d.mu);
            pool_undefer(d);
        }
        undefer_frees(d);
    }
    void *ptr = nullptr;
    cudaError_t err = cudefer_alloc(&ptr, size, device, stream);
    if (err == cudaErrorMemoryAllocation) {
        // cudefer trimmed and retried before it failed, but waited for
        // no work: a block whose free waits for work still running (of
        // other streams that used it, Tensor.record_stream; or of its
        // own stream, for a request on another) is not back in its
        // cache.  Give it what released private pools hold and, with no
        // allocate-to-pool section open anywhere, wait for those frees
        // (defer_flush), as PyTorch's allocator synchronises its blocks'
        // events before it frees its cache; then try once more (cudefer
        // trims again there).  Not while a section is open, as PyTorch's
        // allocator synchronises nothing during a capture: one may be
        // under way, which the flush's wait on the legacy stream would
        // fail on (as emptyCache says of defer_trim).  The flush's error
        // is not raised: the retry's is (a sticky error comes back
        // there).
        d.num_alloc_retries.fetch_add(1, std::memory_order_relaxed);
        bool retry = release_free_pools(device) > 0;
        if (sections_anywhere.load(std::memory_order_acquire) == 0) {
            (void)fns_.flush();
            retry = true;
        }
        if (retry)
            err = cudefer_alloc(&ptr, size, device, stream);
    }
    if (err == cudaErrorMemoryAllocation)
        out_of_memory(device, rounded, nullptr, stream, context);
    TORCH_CHECK(err != cudaErrorStreamCaptureUnsupported,
                "cudefer: cannot allocate ", size, " bytes on a stream "
                "being captured into a CUDA graph outside a private pool "
                "(capture with torch.cuda.graph, which gives one)");
    TORCH_CHECK(err == cudaSuccess, "cudefer: allocating ", size,
                " bytes on device ", static_cast<int>(device),
                " failed with CUDA error ", static_cast<int>(err), " (",
                cudaGetErrorString(err), "; cudefer's line on stderr "
                "says more)");
    Allocation a;
    a.requested = size;
    a.rounded = rounded;
    a.stream = stream;
    a.device = device;
    remember(ptr, a);
    count_alloc(d, a, device, ptr);
    thread_local unsigned sample_every = 0;
    if ((++sample_every & 63) == 0)
        sample_reserved(device);
    return ptr;
}

// Any thread; blocks only while memory history records the stacks of
// frees (the recorder takes the GIL, before any lock of the allocator's).
// Raises for a pointer it did not allocate.
void CudeferAllocator::raw_delete(void *ptr)
{
    if (ptr == nullptr)
        return;
    if (C10_UNLIKELY(tracing())) {
        raw_delete_traced(ptr);
        return;
    }
    give_back(ptr, take(ptr));
}

// The live allocation at ptr, taken off the table and the statistics.
// Any thread; takes ptr's table shard.  Raises for a pointer this
// allocator did not allocate.
Allocation CudeferAllocator::take(void *ptr)
{
    Allocation a;
    TORCH_CHECK(forget(ptr, &a), "cudefer: freeing ", ptr,
                ", which cudefer's PyTorch allocator did not allocate "
                "(or freed already)");
    count_free(*devices_[a.device], a, ptr);
    return a;
}

// A taken allocation's memory back to its private pool, or to cudefer on
// the stream it was allocated on; cudefer's memory that other streams
// used, while an allocate-to-pool section is open anywhere, later
// (DeviceState::deferred_frees).  Any thread; takes the device's mutex
// for a pool block or a deferred free.  Never blocks otherwise, never
// throws.
void CudeferAllocator::give_back(void *ptr, const Allocation &a)
{
    if (a.block != nullptr) {
        DeviceState &d = *devices_[a.device];
        std::lock_guard<std::mutex> lock(d.mu);
        pool_free(d, a.block);
        return;
    }
    if (C10_UNLIKELY(a.recorded) &&
        sections_anywhere.load(std::memory_order_acquire) > 0) {
        DeviceState &d = *devices_[a.device];
        std::lock_guard<std::mutex> lock(d.mu);
        try {
            d.deferred_frees.emplace_back(ptr, a);
            d.has_deferred_frees.store(true, std::memory_order_relaxed);
            return;
        } catch (const std::bad_alloc &) {
            // No memory to defer it: freed now, which cudefer may refuse
            // (said on stderr) if a stream that used it captures.
        }
    }
    fns_.free(ptr, a.requested, a.device, a.stream);
}

// Any thread, holding no lock of the allocator's; never blocks nor
// throws.  Once no allocate-to-pool section is open anywhere, the
// deferred frees of d's tensors (DeviceState::deferred_frees) go to
// cudefer, each on the stream it was allocated on.  Nothing while a
// section is open.
void CudeferAllocator::undefer_frees(DeviceState &d)
{
    std::vector<std::pair<void *, Allocation>> frees;
    {
        std::lock_guard<std::mutex> lock(d.mu);
        if (sections_anywhere.load(std::memory_order_acquire) > 0)
            return;
        frees.swap(d.deferred_frees);
        d.has_deferred_frees.store(false, std::memory_order_relaxed);
    }
    for (const auto &f : frees)
        fns_.free(f.first, f.second.requested, f.second.device,
                  f.second.stream);
}

// defer_pluggable_alloc_status, under a relaxed capture mode while any
// allocate-to-pool section is open (this thread may be capturing in
// global mode, where cudefer's cudaMalloc would break the capture).
cudaError_t CudeferAllocator::cudefer_alloc(void **ptr, size_t size,
                                            int device, cudaStream_t stream)
{
    if (C10_UNLIKELY(sections_anywhere.load(std::memory_order_acquire) >
                     0)) {
        c10::cuda::CUDAStreamCaptureModeGuard relaxed(
            cudaStreamCaptureModeRelaxed);
        return fns_.alloc_status(ptr, size, device, stream);
    }
    return fns_.alloc_status(ptr, size, device, stream);
}

// ---- record_stream, fraction, out of memory ---------------------------

void CudeferAllocator::recordStream(const c10::DataPtr &data_ptr,
                                    c10::cuda::CUDAStream stream)
{
    void *ptr = data_ptr.get();
    // A storage of no bytes has no block.
    if (ptr == nullptr)
        return;
    Allocation a;
    if (!lookup_allocation(ptr, &a, false))
        return;  // memory PyTorch did not allocate (DLPack): ignored
    PoolBlock *block = a.block;
    int device = a.device;
    // A use on the stream it was allocated on needs no care, as
    // PyTorch's allocator ignores it: its free is ordered there.
    if (stream.stream() == a.stream && stream.device_index() == device)
        return;
    if (block != nullptr) {
        std::lock_guard<std::mutex> lock(devices_[device]->mu);
        if (stream.stream() != block->stream &&
            std::none_of(block->uses.begin(), block->uses.end(),
                         [&](const PoolUse &u) {
                             return u.stream == stream.stream() &&
                                    u.device == stream.device_index();
                         }))
            block->uses.push_back({stream.stream(), stream.device_index()});
        recorded.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    cudaError_t err;
    {
        // To cudefer, stream 0 is the legacy stream of the device
        // current at the call: for a default stream, that must be the
        // stream's device, not the caller's (Tensor.record_stream runs
        // on the tensor's device).
        c10::cuda::CUDAGuard guard(stream.device_index());
        err = fns_.record_stream(ptr, stream.stream());
    }
    // A use by a stream being captured is work of the graph, which the
    // application keeps the tensor alive for: none to wait for, as
    // PyTorch's allocator drops the uses recorded during a capture
    // (cudefer refuses it, the capture left intact).
    if (err == cudaErrorStreamCaptureUnsupported)
        return;
    TORCH_CHECK(err == cudaSuccess,
                "cudefer: defer_record_stream failed with CUDA error ",
                static_cast<int>(err),
                "; the tensor's memory is not protected for that stream");
    lookup_allocation(ptr, &a, true);
    recorded.fetch_add(1, std::memory_order_relaxed);
}

void CudeferAllocator::setMemoryFraction(double fraction,
                                         c10::DeviceIndex device)
{
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "cudefer: memory "
                "fraction ", fraction, " is not between 0 and 1");
    check_device(device);
    c10::cuda::CUDAGuard guard(device);
    size_t free_bytes = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    set_cap(device, fraction, total);
}

double CudeferAllocator::getMemoryFraction(c10::DeviceIndex device)
{
    check_device(device);
    return devices_[device]->fraction.load();
}

// The memory fraction of device: a cap of fraction times total bytes;
// a fraction of 1 is no cap (PyTorch's allocator then has no
// allowed_memory_maximum), one of 0 allows nothing.
void CudeferAllocator::set_cap(int device, double fraction, size_t total)
{
    devices_[device]->fraction.store(fraction);
    devices_[device]->cap.store(
        fraction < 1.0
            ? static_cast<uint64_t>(fraction * static_cast<double>(total))
            : kNoCap);
}

void CudeferAllocator::attachOutOfMemoryObserver(
    CCA::OutOfMemoryObserver observer)
{
    std::lock_guard<std::mutex> lock(observers_mu_);
    observers_.push_back(std::move(observer));
}

// While memory history is recorded, the oom entry (the device's free
// bytes, the rounded size, context's stack) goes in before the observers
// run, as PyTorch's allocator records it: an observer that takes a
// snapshot (torch.cuda.memory._dump_snapshot, as PyTorch's docs show)
// finds the out of memory in it.  Any thread, holding no lock of the
// allocator's (observers may take the GIL).
void CudeferAllocator::out_of_memory(
    int device, size_t rounded, const char *why, cudaStream_t stream,
    const std::shared_ptr<c10::GatheredContext> *context)
{
    DeviceState &d = *devices_[device];
    d.num_ooms.fetch_add(1, std::memory_order_relaxed);
    size_t device_free = 0, device_total = 0;
    {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess)
            (void)cudaGetLastError();
    }
    if (tracing())
        trace(device, CCA::TraceEntry::OOM, device_free, rounded, stream,
              {0, 0},
              context != nullptr ? *context
                                 : std::shared_ptr<c10::GatheredContext>());
    sample_reserved(device);
    int64_t allocated = d.allocated_bytes.s[0].current.load();
    int64_t reserved = reserved_of(device);
    uint64_t cap = d.cap.load();
    c10::reportOutOfMemoryToProfiler(
        static_cast<int64_t>(rounded), static_cast<size_t>(allocated),
        static_cast<size_t>(reserved),
        c10::Device(c10::DeviceType::CUDA,
                    static_cast<c10::DeviceIndex>(device)));
    std::vector<CCA::OutOfMemoryObserver> observers;
    {
        std::lock_guard<std::mutex> lock(observers_mu_);
        observers = observers_;
    }
    for (auto &o : observers)
        o(device, rounded, cap != kNoCap ? cap : device_total,
          device_free);
    // It opens as PyTorch's own does ("CUDA out of memory. Tried to
    // allocate"): tools that retry with smaller batches look for
    // "CUDA out of memory." in the message.
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "CUDA out of memory. Tried to "
        "allocate ", format_size(rounded), " on device ", device,
        why != nullptr ? " beyond " : "", why != nullptr ? why : "",
        cap != kNoCap ? " (" + format_size(cap) + " allowed)" : "",
        "; the device has ", format_size(device_total), " of which ",
        format_size(device_free), " is free; PyTorch has ",
        format_size(static_cast<uint64_t>(allocated)),
        " allocated and cudefer ",
        format_size(static_cast<uint64_t>(reserved)), " reserved");
}

// ---- the rest of the interface ---------------------------------------

// PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction caps each
// device from the start, as PyTorch's allocator sets it for each device
// it sets up (DeviceCachingAllocator's constructor); a later init adds
// devices, never resets one.  cudaGetDeviceProperties makes no context.
void CudeferAllocator::init(int device_count)
{
    int count = std::min(device_count, kMaxDevices);
    double fraction =
        CCA::CUDAAllocatorConfig::per_process_memory_fraction();
    if (fraction < 1.0) {
        for (int i = device_count_.load(); i < count; i++) {
            cudaDeviceProp prop{};
            C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
            set_cap(i, fraction, prop.totalGlobalMem);
        }
    }
    device_count_.store(std::max(device_count_.load(), count));
    initialized_.store(true);
}

// The largest block an allocation could get now: the device's free
// memory (cudefer's free blocks are not listed) or a free pool block.
void CudeferAllocator::cacheInfo(c10::DeviceIndex device, size_t *largest)
{
    if (*largest == 0) {
        c10::cuda::CUDAGuard guard(device);
        size_t total = 0;
        C10_CUDA_CHECK(cudaMemGetInfo(largest, &total));
    }
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto &p : d.pools)
        for (auto &f : p.second->free_blocks)
            *largest = std::max(*largest, f.second->size);
}

// Blocks are never parts of larger ones: a block is its own base.  A
// pointer that is no live allocation's start raises, as PyTorch's
// allocator does ("invalid device pointer"): callers that fall back on
// the pointer itself catch the error.
void *CudeferAllocator::getBaseAllocation(void *ptr, size_t *size)
{
    Shard &s = shard_of(ptr);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(ptr);
    TORCH_CHECK(it != s.map.end(), "cudefer: getBaseAllocation of ", ptr,
                ", which is not the start of a live allocation of "
                "cudefer's PyTorch allocator (invalid device pointer)");
    if (size != nullptr)
        *size = it->second.rounded;
    return ptr;
}

CCA::ShareableHandle CudeferAllocator::shareIpcHandle(void *)
{
    TORCH_CHECK(false, "cudefer: sharing CUDA tensors between processes "
                "(CUDA IPC) is not supported while cudefer is PyTorch's "
                "allocator");
}

std::shared_ptr<void> CudeferAllocator::getIpcDevPtr(std::string)
{
    TORCH_CHECK(false, "cudefer: opening a CUDA tensor of another "
                "process (CUDA IPC) is not supported while cudefer is "
                "PyTorch's allocator");
}

// A tracker follows the allocator's segments (NCCL's registration hook
// registers each segment_alloc's memory and unregisters it at its
// segment_free): cudefer's cache owns its segments and says nothing of
// them, so a tracker would keep memory registered after cudefer gave it
// back.  Raises.
void CudeferAllocator::attachAllocatorTraceTracker(
    CCA::AllocatorTraceTracker)
{
    TORCH_CHECK(false, "cudefer: allocator trace trackers (NCCL's "
                "register hook) are not supported while cudefer is "
                "PyTorch's allocator: cudefer's cache does not report its "
                "segments");
}

// Peer access reaches the private pools' cudaMalloc'd blocks, not
// cudefer's, which come from its memory pool on dev_to_access: that pool
// is opened to dev too (defer_peer_access).  Once this returns, PyTorch
// copies between the two devices with kernels of dev that use the other
// device's memory directly.
void CudeferAllocator::enablePeerAccess(c10::DeviceIndex dev,
                                        c10::DeviceIndex dev_to_access)
{
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
    else
        C10_CUDA_CHECK(err);
    if (fns_.peer_access == nullptr)
        return;
    err = fns_.peer_access(dev_to_access, dev);
    TORCH_CHECK(err == cudaSuccess, "cudefer: defer_peer_access(",
                static_cast<int>(dev_to_access), ", ", static_cast<int>(dev),
                ") failed with CUDA error ", static_cast<int>(err), " (",
                cudaGetErrorString(err), "): GPU ", static_cast<int>(dev),
                " cannot use cudefer's memory of GPU ",
                static_cast<int>(dev_to_access));
}

// cudefer's blocks come from a memory pool of its own on each device
// (cudaMallocFromPoolAsync), which peer access (cudaDeviceEnablePeerAccess)
// does not open to other devices: cudaMemcpyAsync cannot copy them from
// one device to another unless the destination's pool was opened to the
// source's device (p2p_enabled: PyTorch called enablePeerAccess for the
// pair, which opened it), cudaMemcpyPeerAsync can (and copies the private
// pools' cudaMalloc'd blocks too).  As PyTorch's cudaMallocAsync backend.
cudaError_t CudeferAllocator::memcpyAsync(void *dst, int dst_device,
                                          const void *src, int src_device,
                                          size_t count, cudaStream_t stream,
                                          bool p2p_enabled)
{
    if (dst_device == src_device ||
        (p2p_enabled && fns_.peer_access != nullptr))
        return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice,
                               stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count,
                               stream);
}

void CudeferAllocator::copy_data(void *dest, const void *src,
                                 std::size_t count) const
{
    C10_CUDA_CHECK(
        cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

// ---- for Python and tests ----------------------------------------------

// The cost of the bookkeeping of one allocation and its free (the
// table and the statistics, no CUDA call), in nanoseconds, over n
// pairs on device 0's counters, which are put back as they were: call
// it while no other thread allocates.
double CudeferAllocator::bookkeeping_ns(int n)
{
    DeviceState &d = *devices_[0];
    uint64_t used = used_devices_.load();
    std::vector<std::pair<int64_t, int64_t>> saved;  // peak, freed
    for (AtomicStatArray *a :
         {&d.allocation, &d.allocated_bytes, &d.requested_bytes})
        for (auto &x : a->s)
            saved.push_back({x.peak.load(), x.freed.load()});
    std::vector<char> fake(64 * 1024);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) {
        void *ptr = fake.data() + (i % 1024) * 64;
        Allocation a;
        a.requested = 1000 + (i & 4095);
        a.rounded = torch_round_size(a.requested);
        a.device = 0;
        remember(ptr, a);
        count_alloc(d, a, 0, nullptr);
        Allocation back;
        forget(ptr, &back);
        count_free(d, back, nullptr);
    }
    auto ns = std::chrono::duration<double, std::nano>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    used_devices_.store(used);
    size_t i = 0;
    for (AtomicStatArray *a :
         {&d.allocation, &d.allocated_bytes, &d.requested_bytes})
        for (auto &x : a->s) {
            x.peak.store(saved[i].first);
            x.freed.store(saved[i].second);
            i++;
        }
    return n > 0 ? ns / n : 0.0;
}

void raw_delete_fn(void *ptr)
{
    the_allocator->raw_delete(ptr);
}

namespace {

// Copies what into message (NUL-terminated, truncated to size).
void put_message(char *message, size_t size, const char *what)
{
    if (message != nullptr && size > 0)
        std::snprintf(message, size, "%s", what);
}

std::shared_ptr<CudeferAllocator> installed;

// cudefer_torch_install's code for an exception: 3 when it is PyTorch's
// refusal to swap an allocator already in use (changeCurrentAllocator
// throws only while PyTorch's own allocator is initialized, that is once
// PyTorch first used CUDA), which calling enable() first avoids; 5 for any
// other cause, which that advice would not fix.
int install_failure(bool swapping)
{
    return swapping && c10::cuda::CUDACachingAllocator::get()->initialized()
               ? 3
               : 5;
}

}  // namespace

}  // namespace cudefer_torch

// The entry points use the namespace's names as they are.
using namespace cudefer_torch;

// cudefer_torch_install: make cudefer PyTorch's CUDA allocator (current
// for torch.cuda and registered for the CUDA device type), over the
// functions in *fns.  Call once, from Python, before PyTorch first uses
// CUDA (its lazy init sets up its own allocator) and before other threads
// use CUDA.  Makes no CUDA call: PyTorch's lazy init tells the allocator
// the devices (init), and CUDA initialized here would leave the process's
// fork children unable to use it.  Returns 0 when installed; 2 for a
// NULL function of those every library has (alloc_status, free,
// record_stream, trim, flush); 3 when PyTorch refused (an allocator
// already in use); 4 when installed already; 5 when it failed for another
// cause.  For 3 and 5 the reason is copied to message, at most size
// bytes, NUL-terminated.
// Nothing is changed unless it returns 0.  Never blocks.
extern "C" __attribute__((visibility("default"))) int
cudefer_torch_install(const CudeferFunctions *fns, char *message, size_t size)
{
    if (fns == nullptr || fns->alloc_status == nullptr ||
        fns->free == nullptr || fns->record_stream == nullptr ||
        fns->trim == nullptr || fns->flush == nullptr)
        return 2;
    if (installed)
        return 4;
    bool swapping = false;  // in changeCurrentAllocator
    try {
        // Never destroyed: tensors may be freed during the interpreter's
        // teardown, after this library's static destructors ran.
        std::shared_ptr<CudeferAllocator> allocator(
            new CudeferAllocator(*fns), [](CudeferAllocator *) {});
        the_allocator = allocator.get();
        swapping = true;
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
        swapping = false;
        // Also for c10::GetAllocator(kCUDA): storages made from Python and
        // torch.accelerator's memory calls (same priority as PyTorch's own
        // registration, which it replaces).
        c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), 0);
        installed = allocator;
    } catch (const c10::Error &e) {
        // No C++ exception may cross into ctypes: hand the reason back
        // (without the C++ backtrace what() appends).
        the_allocator = installed.get();
        put_message(message, size, e.what_without_backtrace());
        return install_failure(swapping);
    } catch (const std::exception &e) {
        the_allocator = installed.get();
        put_message(message, size, e.what());
        return install_failure(swapping);
    }
    return 0;
}

// cudefer_torch_recorded: Tensor.record_stream calls that reached cudefer
// (defer_record_stream, or a private pool block).  Any thread.
extern "C" __attribute__((visibility("default"))) unsigned long long
cudefer_torch_recorded(void)
{
    return recorded.load(std::memory_order_relaxed);
}

// cudefer_torch_bookkeeping_ns: nanoseconds of the allocator's own
// bookkeeping (pointer table and statistics, no CUDA call) per allocation
// and free, over n pairs; -1 before cudefer_torch_install.  Call it while
// no other thread allocates (CudeferAllocator::bookkeeping_ns).
extern "C" __attribute__((visibility("default"))) double
cudefer_torch_bookkeeping_ns(int n)
{
    return installed ? installed->bookkeeping_ns(n) : -1.0;
}
