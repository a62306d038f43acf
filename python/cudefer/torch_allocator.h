/* SPDX-License-Identifier: MIT */
// torch_allocator.h: cudefer as PyTorch's whole CUDA allocator: the
// types its units share (private to the extension;
// cudefer.torch compiles the units below together).
//
// A subclass of c10::cuda::CUDACachingAllocator::CUDAAllocator (PyTorch
// 2.11's interface, read from its headers) over cudefer:
//   - tensors come from defer_pluggable_alloc_status and go back through
//     defer_pluggable_free on the stream they were allocated on; out of
//     memory raises torch.OutOfMemoryError after the OOM observers ran;
//     Tensor.record_stream calls defer_record_stream; empty_cache calls
//     defer_trim;
//   - the statistics torch.cuda.memory_stats reads, with PyTorch's
//     meanings: allocated bytes count each live tensor at the size PyTorch's
//     own allocator rounds it to (512 bytes, or roundup_power2_divisions),
//     so memory_allocated agrees with PyTorch's on the same tensors;
//     reserved bytes are cudefer's (its cache) plus the private pools';
//   - CUDA graphs: between beginAllocateToPool and endAllocateToPool, an
//     allocation whose stream the filter accepts comes from a private pool
//     (the newest open section's whose filter accepts it) of cudaMalloc'd
//     blocks (cudaMalloc under a relaxed capture mode, as
//     PyTorch's allocator does), never from cudefer, which refuses a
//     capturing stream.  A pool lives while its use count (graphs,
//     MemPools, allocate-to-pool sections) is above zero; its free blocks
//     go back to CUDA at empty_cache or out of memory once it is released.
//     Checkpoints of a pool (torch.compile's CUDA graph trees) and
//     checkPoolLiveAllocations work on these blocks;
//   - set_per_process_memory_fraction (and PYTORCH_CUDA_ALLOC_CONF's
//     per_process_memory_fraction, from the start) caps the bytes allocated
//     on a device.
// What it cannot serve (IPC, memory history, trace trackers, a MemPool with
// its own allocator, use_on_oom pools) raises an error naming cudefer.
//
// It does not link libcudefer: Python passes the addresses of the functions
// of the library it loaded (cudefer_torch_install), so allocator and
// Python side always use the same copy.
//
// Threads: any thread may allocate and free.  The hot path (allocation and
// free outside any allocate-to-pool section) takes no lock but one shard
// of the pointer table (64 shards, by address): statistics are per-device
// atomics.  Pools, captures and observers are guarded by a per-device
// mutex; lock order: device mutex, then a table shard.
//
// The units (each keeps the comments of what it defines):
//   torch_allocator.h    the shared types (CudeferFunctions, AtomicStat,
//                        Pool, PoolBlock, Allocation, DeviceState);
//   torch_allocator.cpp  the allocator class, and the extern "C" entry
//                        points Python calls (cudefer_torch_install...).
// Everything but the entry points is in namespace cudefer_torch, hidden
// from the shared object's exports.

#ifndef CUDEFER_TORCH_ALLOCATOR_H
#define CUDEFER_TORCH_ALLOCATOR_H

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace cudefer_torch __attribute__((visibility("hidden"))) {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::CachingAllocator::kMinBlockSize;
using c10::CachingAllocator::kSmallSize;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::MempoolId_t;

// The functions of libcudefer Python loaded (include/cudefer.h), and where
// struct defer_stats keeps the counters read here (field indices: this
// file does not include cudefer.h, so the struct's layout comes from
// Python, which reads the header or knows the fields).
struct CudeferFunctions {
    cudaError_t (*alloc_status)(void **ptr, size_t size, int device,
                                cudaStream_t stream);
    void (*free)(void *ptr, size_t size, int device, cudaStream_t stream);
    cudaError_t (*record_stream)(void *ptr, cudaStream_t stream);
    cudaError_t (*trim)(size_t *released_bytes);
    void (*stats_get_sized)(void *out, size_t size);
    int64_t stat_cache_bytes;     // index of cache_bytes, -1 if unknown
    int64_t stat_cache_mallocs;   // index of cache_mallocs
    int64_t stat_cache_releases;  // index of cache_releases
    // defer_device_stats_get_sized (NULL: a library without it) and the
    // indices of struct defer_device_stats' fields, -1 if unknown.
    cudaError_t (*device_stats_get_sized)(int device, void *out, size_t size);
    int64_t dstat_cache_bytes;
    int64_t dstat_cache_mallocs;
    int64_t dstat_cache_releases;
};

inline constexpr int kMaxDevices = 64;
// Room for struct defer_stats to grow.
inline constexpr size_t kStatsWords = 256;
inline constexpr int kShards = 64;
// DeviceState::cap with no memory fraction set (or a fraction of 1): no cap.
inline constexpr uint64_t kNoCap = UINT64_MAX;

// One statistic of PyTorch's (c10::CachingAllocator::Stat) kept in atomics.
// current and freed change with every allocation and free; allocated is
// current + freed - base (base: current at the last reset of the
// accumulated counters), so an allocation costs two atomic additions and a
// load.  The peak is raised with a compare-and-swap only when passed.
// Any thread; never blocks.
struct AtomicStat {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> freed{0};
    std::atomic<int64_t> base{0};

    void add(int64_t n)
    {
        int64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
        int64_t seen = peak.load(std::memory_order_relaxed);
        while (now > seen &&
               !peak.compare_exchange_weak(seen, now,
                                           std::memory_order_relaxed))
            ;
    }
    void sub(int64_t n)
    {
        current.fetch_sub(n, std::memory_order_relaxed);
        freed.fetch_add(n, std::memory_order_relaxed);
    }
    void reset_peak()
    {
        peak.store(current.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
    }
    void reset_accumulated()
    {
        freed.store(0, std::memory_order_relaxed);
        base.store(current.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
    }
    Stat get() const
    {
        Stat s;
        s.current = current.load(std::memory_order_relaxed);
        s.peak = std::max(peak.load(std::memory_order_relaxed), s.current);
        s.freed = freed.load(std::memory_order_relaxed);
        s.allocated = s.current + s.freed - base.load(std::memory_order_relaxed);
        return s;
    }
};

// AGGREGATE, SMALL_POOL, LARGE_POOL (StatType's order).
struct AtomicStatArray {
    std::array<AtomicStat, 3> s;
    void add(bool small, int64_t n)
    {
        s[0].add(n);
        s[small ? 1 : 2].add(n);
    }
    void sub(bool small, int64_t n)
    {
        s[0].sub(n);
        s[small ? 1 : 2].sub(n);
    }
    StatArray get() const
    {
        StatArray a;
        for (size_t i = 0; i < 3; i++)
            a[i] = s[i].get();
        return a;
    }
    void reset_peak()
    {
        for (auto &x : s)
            x.reset_peak();
    }
    void reset_accumulated()
    {
        for (auto &x : s)
            x.reset_accumulated();
    }
};

struct Pool;

// A block of a private pool: one cudaMalloc of size bytes (the rounded
// request), on device, for use on stream.  Guarded by its device's mutex.
struct PoolBlock {
    void *ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    cudaStream_t stream = nullptr;
    Pool *pool = nullptr;
    bool allocated = false;
    // Recorded on another stream (record_stream) before its free: never
    // handed out again, returned to CUDA with its pool.
    bool retired = false;
    std::vector<cudaStream_t> uses;
};

// A private pool (a CUDA graph's, a MemPool's, torch.compile's CUDA graph
// trees'): its blocks, its free blocks by (stream, size), its use count.
// Guarded by its device's mutex.
struct Pool {
    MempoolId_t id{0, 0};
    int device = 0;
    int use_count = 0;
    std::vector<std::unique_ptr<PoolBlock>> blocks;
    std::multimap<std::pair<cudaStream_t, size_t>, PoolBlock *> free_blocks;
};

// What the allocator knows of a live allocation (the pointer table).
struct Allocation {
    size_t requested = 0;
    size_t rounded = 0;
    cudaStream_t stream = nullptr;
    PoolBlock *block = nullptr;  // nullptr: cudefer's
    int8_t device = 0;
};

// The reserved figures of cudefer's counters, sampled (reading them costs
// a pass over its counters: every 64th allocation of a thread and at every
// statistics read).
struct CudeferSample {
    std::atomic<int64_t> cache_bytes{0};
    std::atomic<int64_t> cache_mallocs{0};
    std::atomic<int64_t> cache_releases{0};
};

struct alignas(64) DeviceState {
    AtomicStatArray allocation;       // count of live allocations
    AtomicStatArray allocated_bytes;  // their rounded bytes
    AtomicStatArray requested_bytes;  // their requested bytes
    AtomicStatArray pool_bytes;       // private pools' segments' bytes
    AtomicStatArray pool_segments;    // and their count
    std::atomic<int64_t> pool_allocated{0};  // bytes of live pool blocks
    std::atomic<int64_t> reserved_peak{0};
    std::atomic<int64_t> num_alloc_retries{0};
    std::atomic<int64_t> num_ooms{0};
    std::atomic<int64_t> pool_mallocs{0};
    std::atomic<int64_t> pool_frees{0};
    // cudefer's cache_mallocs and cache_releases at the last reset of the
    // accumulated counters.
    std::atomic<int64_t> device_alloc_base{0};
    std::atomic<int64_t> device_free_base{0};
    // set_per_process_memory_fraction: kNoCap none, else the cap in bytes
    // (0 for a fraction of 0: nothing may be allocated).
    std::atomic<uint64_t> cap{kNoCap};
    std::atomic<double> fraction{1.0};
    // Allocate-to-pool sections open on this device (hot-path test).
    std::atomic<int> sections{0};
    // cudefer's own counters of this device, sampled (per_device()).
    CudeferSample sample;

    std::mutex mu;  // guards what follows
    std::map<MempoolId_t, std::unique_ptr<Pool>> pools;
    struct Section {
        MempoolId_t id;
        std::function<bool(cudaStream_t)> filter;
    };
    std::vector<Section> open_sections;
};

class CudeferAllocator;
// Allocate-to-pool sections open on any device (torch_allocator.cpp).
extern std::atomic<int> sections_anywhere;

// The deleter of the allocator's DataPtrs (torch_allocator.cpp).
void raw_delete_fn(void *ptr);

}  // namespace cudefer_torch

#endif  // CUDEFER_TORCH_ALLOCATOR_H
