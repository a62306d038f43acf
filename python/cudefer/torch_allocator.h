/* SPDX-License-Identifier: MIT */
// torch_allocator.h: cudefer as PyTorch's whole CUDA allocator: the
// types its units share and the allocator class (private to the extension;
// cudefer.torch compiles the units below together).
//
// A subclass of c10::cuda::CUDACachingAllocator::CUDAAllocator (PyTorch
// 2.11's interface, read from its headers) over cudefer:
//   - tensors come from defer_pluggable_alloc_status and go back through
//     defer_pluggable_free on the stream they were allocated on; out of
//     memory, released private pools' free blocks go back to CUDA and,
//     with no allocate-to-pool section open, every free cudefer has
//     pending, on every device and from every user of the library, is
//     waited for (defer_flush) before one more try, then
//     torch.OutOfMemoryError is raised after the OOM observers ran;
//     Tensor.record_stream calls defer_record_stream (not for the
//     tensor's own stream, nor a stream being captured: ignored, as
//     PyTorch's allocator ignores them), and such a tensor freed while an
//     allocate-to-pool section is open is given to cudefer once none is;
//     empty_cache calls defer_flush and defer_trim;
//   - the statistics torch.cuda.memory_stats reads, with PyTorch's
//     meanings: allocated bytes count each live tensor at the size PyTorch's
//     own allocator rounds it to (512 bytes, or roundup_power2_divisions),
//     so memory_allocated agrees with PyTorch's on the same tensors (but
//     where PyTorch hands a tensor above 1 MiB a block up to 1 MiB larger,
//     which it splits no less off and counts whole);
//     reserved bytes are cudefer's (its cache) plus the private pools',
//     their peak read from cudefer's own peak of its cache, which
//     reset_peak_memory_stats resets too;
//   - CUDA graphs: between beginAllocateToPool and endAllocateToPool, an
//     allocation whose stream the filter accepts comes from a private pool
//     (the newest open section's whose filter accepts it) of cudaMalloc'd
//     blocks (cudaMalloc under a relaxed capture mode, as
//     PyTorch's allocator does), never from cudefer, which refuses a
//     capturing stream.  A pool lives while its use count (graphs,
//     MemPools, allocate-to-pool sections) is above zero; its free blocks
//     go back to CUDA at empty_cache or out of memory once it is released.
//     A block other streams used (Tensor.record_stream) is handed out
//     again once events recorded on those streams have completed, as in
//     PyTorch's allocator: recorded at its free, or, freed while a
//     section was open somewhere (a capture may be under way), at the
//     device's first allocation, pool block free or empty_cache once
//     none is.
//     Checkpoints of a pool (torch.compile's CUDA graph trees) and
//     checkPoolLiveAllocations work on these blocks;
//   - set_per_process_memory_fraction (and PYTORCH_CUDA_ALLOC_CONF's
//     per_process_memory_fraction, from the start) caps the bytes allocated
//     on a device;
//   - memory history (torch.cuda.memory._record_memory_history): each
//     allocation, free and out of memory as a trace entry of its device
//     (a return to a checkpoint's frees and allocations too), with its
//     stack, for torch.cuda.memory._snapshot; no segment entries
//     (cudefer's cache owns its segments).
// What it cannot serve (IPC, trace trackers, a MemPool with its own
// allocator, use_on_oom pools) raises an error naming cudefer.
//
// It does not link libcudefer: Python passes the addresses of the functions
// of the library it loaded (cudefer_torch_install), so allocator and
// Python side always use the same copy.
//
// Threads: any thread may allocate and free.  The hot path (allocation and
// free outside any allocate-to-pool section) takes no lock but one shard
// of the pointer table (64 shards, by address): statistics are per-device
// atomics.  (The first allocation on a device once no section is open
// also takes the device's mutex where pool blocks were deferred.)
// Pools, captures and observers are guarded by a per-device mutex; lock
// order: device mutex, then a table shard.  A device's trace entries have
// a lock of their own, a leaf (none is taken under it).
//
// The units (each keeps the comments of what it defines):
//   torch_allocator.h    the shared types (CudeferFunctions, AtomicStat,
//                        Pool, PoolBlock, Allocation, DeviceState), the
//                        class, and inline what every allocation and
//                        free runs: the pointer table (remember, forget,
//                        lookup), count_alloc and count_free,
//                        reserved_of;
//   torch_allocator.cpp  allocation and free, record_stream, the memory
//                        fraction, out of memory, the rest of
//                        CUDAAllocator, and the extern "C" entry points
//                        Python calls (cudefer_torch_install...);
//   torch_pools.cpp      private pools (CUDA graphs, MemPool,
//                        checkpoints of torch.compile's graph trees),
//                        a pool block's free and reuse after other
//                        streams' uses, and empty_cache, which releases
//                        them;
//   torch_stats.cpp      memory_stats, their resets, the samples of
//                        cudefer's counters, snapshot;
//   torch_history.cpp    memory history: recordHistory, the trace entries
//                        of allocations, frees and out of memory, the
//                        snapshot's traces.
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
#include <c10/util/ApproximateClock.h>
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
    // defer_peer_access (NULL: a library without it).
    cudaError_t (*peer_access)(int device, int peer);
    // defer_flush (in every library).
    cudaError_t (*flush)(void);
    // defer_device_stats_reset_peaks (NULL: a library without it) and the
    // index of struct defer_device_stats' cache_bytes_peak, -1 if unknown.
    cudaError_t (*device_stats_reset_peaks)(int device);
    int64_t dstat_cache_bytes_peak;
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

// A stream other than its block's own that used the block
// (record_stream), and that stream's device.
struct PoolUse {
    cudaStream_t stream;
    int device;
};

// A block of a private pool: one cudaMalloc of size bytes (the rounded
// request), on device, for use on stream.  Guarded by its device's mutex.
struct PoolBlock {
    void *ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    // While allocated: the size its allocation counts in the statistics
    // (the request's rounding, which a reused block may exceed).
    size_t rounded = 0;
    cudaStream_t stream = nullptr;
    Pool *pool = nullptr;
    bool allocated = false;
    // Freed with uses while an allocate-to-pool section was open
    // somewhere (a capture may be under way: no event can be recorded):
    // on its pool's deferred list until none is (pool_undefer records
    // its events then: it is pending).
    bool deferred = false;
    // Freed with uses where CUDA refused an event (or its query): never
    // handed out again (but to a checkpoint that holds it allocated),
    // returned to CUDA with its pool once the devices of its uses are
    // idle.
    bool retired = false;
    // Streams other than its own that used it since it was handed out.
    std::vector<PoolUse> uses;
    // Freed with uses and no section open: one event on each use's
    // stream; the block is on its pool's pending list until all have
    // completed.
    std::vector<cudaEvent_t> events;
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
    // Freed blocks waiting for their events (PoolBlock::events):
    // pool_reclaim puts those whose events completed among free_blocks.
    std::vector<PoolBlock *> pending;
    // Freed blocks waiting for no section to be open anywhere
    // (PoolBlock::deferred): pool_undefer moves them to pending.
    std::vector<PoolBlock *> deferred;
};

// What the allocator knows of a live allocation (the pointer table).
struct Allocation {
    size_t requested = 0;
    size_t rounded = 0;
    cudaStream_t stream = nullptr;
    PoolBlock *block = nullptr;  // nullptr: cudefer's
    int8_t device = 0;
    // cudefer's memory that a stream other than its own used
    // (record_stream): its free is deferred while a section is open.
    bool recorded = false;
};

// The reserved figures of cudefer's counters, sampled (reading them costs
// a pass over its counters: every 64th allocation of a thread and at every
// statistics read).  cache_bytes_peak: the most cache_bytes there were
// since cudefer's last reset of the device's peaks (a device's sample
// only, with a library that counts it; else 0).
struct CudeferSample {
    std::atomic<int64_t> cache_bytes{0};
    std::atomic<int64_t> cache_bytes_peak{0};
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
    // The most reserved bytes seen (sample_reserved) since the last reset
    // of the peaks: never above the true peak.
    std::atomic<int64_t> reserved_peak{0};
    // The fewest bytes the private pools' segments held since the last
    // reset of the peaks; changed under mu, read without it.
    std::atomic<int64_t> pool_bytes_low{0};
    std::atomic<int64_t> num_alloc_retries{0};
    std::atomic<int64_t> num_ooms{0};
    std::atomic<int64_t> pool_mallocs{0};
    std::atomic<int64_t> pool_frees{0};
    // cudefer's cache_mallocs and cache_releases, and its part of the
    // reserved bytes (reserved_of less the private pools'), at the last
    // reset of the accumulated counters.
    std::atomic<int64_t> device_alloc_base{0};
    std::atomic<int64_t> device_free_base{0};
    std::atomic<int64_t> reserved_base{0};
    // set_per_process_memory_fraction: kNoCap none, else the cap in bytes
    // (0 for a fraction of 0: nothing may be allocated).
    std::atomic<uint64_t> cap{kNoCap};
    std::atomic<double> fraction{1.0};
    // Allocate-to-pool sections open on this device (hot-path test).
    std::atomic<int> sections{0};
    // Set (under mu) when a block of this device's pools is deferred,
    // cleared by pool_undefer once it emptied every deferred list; every
    // allocation reads it without the lock (hot-path test).
    std::atomic<bool> has_deferred{false};
    // Set (under mu) when a free of cudefer's memory is deferred, cleared
    // by undefer_frees once it emptied deferred_frees (hot-path test).
    std::atomic<bool> has_deferred_frees{false};
    // cudefer's own counters of this device, sampled (per_device()).
    CudeferSample sample;

    std::mutex mu;  // guards what follows
    std::map<MempoolId_t, std::unique_ptr<Pool>> pools;
    struct Section {
        MempoolId_t id;
        std::function<bool(cudaStream_t)> filter;
    };
    std::vector<Section> open_sections;
    // Tensors of cudefer's memory that other streams used
    // (Allocation::recorded), freed while an allocate-to-pool section was
    // open somewhere: a capture may be under way on one of those streams,
    // where cudefer refuses the free (it cannot wait for a capturing
    // stream) and the memory would be lost.  Given to cudefer once none
    // is open (undefer_frees), as PyTorch's allocator records such
    // blocks' events once no capture is under way.
    std::vector<std::pair<void *, Allocation>> deferred_frees;

    // Memory history (torch_history.cpp): this device's trace entries, at
    // most trace_max, in order, the oldest at trace_next once there are
    // trace_max; and the stacks of its live allocations made while it
    // kept stacks, by address (the snapshot's block frames).  Guarded by
    // trace_mu, a leaf lock.  Never destroyed (nor is the allocator): a
    // stack may hold Python objects, gone in the interpreter's exit.
    std::mutex trace_mu;
    std::vector<CCA::TraceEntry> trace;
    size_t trace_next = 0;
    size_t trace_max = 1;
    std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>>
        contexts;
};

class CudeferAllocator;
// Allocate-to-pool sections open on any device (torch_allocator.cpp).
extern std::atomic<int> sections_anywhere;

// The deleter of the allocator's DataPtrs (torch_allocator.cpp).
void raw_delete_fn(void *ptr);

// The size PyTorch's own allocator rounds a request of size bytes to
// (torch_allocator.cpp).  Any thread; never blocks.
size_t torch_round_size(size_t size);

class CudeferAllocator final : public CCA::CUDAAllocator {
  public:
    explicit CudeferAllocator(const CudeferFunctions &fns) : fns_(fns)
    {
        for (auto &d : devices_)
            d = std::make_unique<DeviceState>();
    }

    // ---- allocation and free (torch_allocator.cpp) ----------------------

    c10::DataPtr allocate(size_t size) override;
    c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_fn; }
    void *raw_alloc(size_t nbytes) override;
    void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
    void *malloc(size_t size, c10::DeviceIndex device, cudaStream_t stream);
    void raw_delete(void *ptr) override;

    // ---- record_stream, fraction, OOM observers (torch_allocator.cpp) ---

    void recordStream(const c10::DataPtr &data_ptr,
                      c10::cuda::CUDAStream stream) override;
    void setMemoryFraction(double fraction,
                           c10::DeviceIndex device) override;
    double getMemoryFraction(c10::DeviceIndex device) override;
    void attachOutOfMemoryObserver(
        CCA::OutOfMemoryObserver observer) override;

    // ---- the rest of the interface (torch_allocator.cpp) ----------------

    void init(int device_count) override;
    bool initialized() override { return initialized_.load(); }
    void enable(bool) override {}
    bool isEnabled() const override { return true; }
    std::string name() override { return "cudefer"; }

    std::vector<CCA::StreamSegmentSize>
    getExpandableSegmentSizes(c10::DeviceIndex) override
    {
        return {};
    }

    void cacheInfo(c10::DeviceIndex device, size_t *largest) override;
    void *getBaseAllocation(void *ptr, size_t *size) override;
    CCA::ShareableHandle shareIpcHandle(void *) override;
    std::shared_ptr<void> getIpcDevPtr(std::string) override;
    void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker) override;
    void enablePeerAccess(c10::DeviceIndex dev,
                          c10::DeviceIndex dev_to_access) override;
    cudaError_t memcpyAsync(void *dst, int dst_device, const void *src,
                            int src_device, size_t count, cudaStream_t stream,
                            bool p2p_enabled) override;
    void copy_data(void *dest, const void *src,
                   std::size_t count) const override;

    // ---- memory history (torch_history.cpp) -----------------------------

    bool isHistoryEnabled() override { return tracing(); }
    void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                       size_t alloc_trace_max_entries, CCA::RecordContext when,
                       bool clearHistory,
                       const std::vector<std::string> &skip_actions) override;
    void pushCompileContext(std::string &md) override;
    void popCompileContext() override;
    void setUserMetadata(const std::string &metadata) override;
    std::string getUserMetadata() override;

    // ---- for Python and tests (torch_allocator.cpp) ---------------------

    double bookkeeping_ns(int n);

    // ---- private pools, empty_cache (torch_pools.cpp) -------------------

    void emptyCache(MempoolId_t mempool_id) override;
    void beginAllocateToPool(
        c10::DeviceIndex device, MempoolId_t mempool_id,
        std::function<bool(cudaStream_t)> filter) override;
    void endAllocateToPool(c10::DeviceIndex device,
                           MempoolId_t mempool_id) override;
    void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override;
    void createOrIncrefPool(
        c10::DeviceIndex device, MempoolId_t mempool_id,
        std::shared_ptr<CCA::CUDAAllocator> allocator) override;
    int getPoolUseCount(c10::DeviceIndex device,
                        MempoolId_t mempool_id) override;
    void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) override;
    // Blocks of a private pool are never split: nothing to do.
    void setNoSplit(c10::DeviceIndex, MempoolId_t) override {}

    bool checkPoolLiveAllocations(
        c10::DeviceIndex device, MempoolId_t mempool_id,
        const std::unordered_set<void *> &expected) override;
    std::shared_ptr<CCA::AllocatorState>
    getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override;
    CCA::CheckpointDelta setCheckpointPoolState(
        c10::DeviceIndex device,
        std::shared_ptr<CCA::AllocatorState> as) override;

    // ---- statistics, snapshot (torch_stats.cpp) -------------------------

    DeviceStats getDeviceStats(c10::DeviceIndex device) override;
    void resetAccumulatedStats(c10::DeviceIndex device) override;
    void resetPeakStats(c10::DeviceIndex device) override;
    CCA::SnapshotInfo snapshot(MempoolId_t mempool_id,
                               bool /*include_traces*/) override;

  private:
    struct Shard {
        std::mutex mu;
        std::unordered_map<void *, Allocation> map;
    };

    // ---- inline: every unit uses these, per allocation and free ---------

    // A device argument must be one init was told of, as PyTorch's
    // allocator requires (assertValidDevice): a statistics call for a GPU
    // the process does not have raises instead of reading zeros.
    void check_device(c10::DeviceIndex device) const
    {
        int count = device_count_.load();
        TORCH_CHECK(device >= 0 && device < count,
                    "cudefer: invalid device argument ",
                    static_cast<int>(device), ": the process has ", count,
                    " CUDA device(s)");
    }

    DeviceState &state(c10::DeviceIndex device)
    {
        check_device(device);
        return *devices_[device];
    }

    Shard &shard_of(void *ptr)
    {
        auto v = reinterpret_cast<uintptr_t>(ptr) >> 9;
        return shards_[(v ^ (v >> 7) ^ (v >> 17)) % kShards];
    }

    void remember(void *ptr, const Allocation &a)
    {
        Shard &s = shard_of(ptr);
        std::lock_guard<std::mutex> lock(s.mu);
        s.map[ptr] = a;
    }

    bool forget(void *ptr, Allocation *out)
    {
        Shard &s = shard_of(ptr);
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = s.map.find(ptr);
        if (it == s.map.end())
            return false;
        *out = it->second;
        s.map.erase(it);
        return true;
    }

    // The live allocation at ptr, marked recorded when mark (a use by
    // another stream).  False for a pointer not in the table.
    bool lookup_allocation(void *ptr, Allocation *out, bool mark)
    {
        Shard &s = shard_of(ptr);
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = s.map.find(ptr);
        if (it == s.map.end())
            return false;
        if (mark)
            it->second.recorded = true;
        *out = it->second;
        return true;
    }

    bool lookup(void *ptr, PoolBlock **block, int *device)
    {
        Shard &s = shard_of(ptr);
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = s.map.find(ptr);
        if (it == s.map.end())
            return false;
        *block = it->second.block;
        *device = it->second.device;
        return true;
    }

    void count_alloc(DeviceState &d, const Allocation &a, int device,
                     void *ptr)
    {
        bool small = a.rounded <= kSmallSize;
        d.allocation.add(small, 1);
        d.allocated_bytes.add(small, static_cast<int64_t>(a.rounded));
        d.requested_bytes.add(small, static_cast<int64_t>(a.requested));
        uint64_t bit = 1ull << device;
        if (C10_UNLIKELY(!(used_devices_.load(std::memory_order_relaxed) &
                           bit)))
            used_devices_.fetch_or(bit, std::memory_order_relaxed);
        // The profiler's memory events carry the device's allocated and
        // reserved bytes, as PyTorch's allocator reports them (reserved:
        // reserved_of, never below allocated; tools divide by it).
        if (ptr != nullptr)
            c10::reportMemoryUsageToProfiler(
                ptr, static_cast<int64_t>(a.rounded),
                static_cast<size_t>(d.allocated_bytes.s[0].current.load(
                    std::memory_order_relaxed)),
                static_cast<size_t>(reserved_of(device)),
                c10::Device(c10::DeviceType::CUDA,
                            static_cast<c10::DeviceIndex>(device)));
    }

    void count_free(DeviceState &d, const Allocation &a, void *ptr)
    {
        bool small = a.rounded <= kSmallSize;
        d.allocation.sub(small, 1);
        d.allocated_bytes.sub(small, static_cast<int64_t>(a.rounded));
        d.requested_bytes.sub(small, static_cast<int64_t>(a.requested));
        if (ptr != nullptr)
            c10::reportMemoryUsageToProfiler(
                ptr, -static_cast<int64_t>(a.rounded),
                static_cast<size_t>(d.allocated_bytes.s[0].current.load(
                    std::memory_order_relaxed)),
                static_cast<size_t>(reserved_of(a.device)),
                c10::Device(c10::DeviceType::CUDA, a.device));
    }

    // Whether device is the only one this allocator has served, so that
    // cudefer's process-wide counters are that device's.
    bool device_used_alone(int device) const
    {
        uint64_t used = used_devices_.load(std::memory_order_relaxed);
        return (used & ~(1ull << device)) == 0;
    }

    // Whether cudefer counts per device (defer_device_stats_get_sized):
    // then every figure below is the device's own.
    bool per_device() const
    {
        return fns_.device_stats_get_sized != nullptr &&
               fns_.dstat_cache_bytes >= 0;
    }

    // Reserved bytes of device: cudefer's cache there (with a library that
    // counts per device; else the process's while the device was used
    // alone, else the bytes of cudefer's blocks live there, a lower bound);
    // plus the private pools'.  Never below the allocated bytes.
    int64_t reserved_of(int device)
    {
        DeviceState &d = *devices_[device];
        int64_t live = d.allocated_bytes.s[0].current.load() -
                       d.pool_allocated.load();
        int64_t cudefer_part = live;
        if (per_device())
            cudefer_part = std::max(d.sample.cache_bytes.load(), live);
        else if (device_used_alone(device))
            cudefer_part = std::max(sample_.cache_bytes.load(), live);
        return cudefer_part + d.pool_bytes.s[0].current.load();
    }

    void pool_put_free(Pool &pool, PoolBlock *b)
    {
        b->allocated = false;
        pool.free_blocks.insert({{b->stream, b->size}, b});
    }

    // ---- torch_allocator.cpp --------------------------------------------

    // context: the stack malloc_traced gathered, for the oom entry
    // out_of_memory records (nullptr: none).
    void *malloc_untraced(
        size_t size, c10::DeviceIndex device, cudaStream_t stream,
        const std::shared_ptr<c10::GatheredContext> *context = nullptr);
    Allocation take(void *ptr);
    void give_back(void *ptr, const Allocation &a);
    void undefer_frees(DeviceState &d);
    void set_cap(int device, double fraction, size_t total);
    cudaError_t cudefer_alloc(void **ptr, size_t size, int device,
                              cudaStream_t stream);
    [[noreturn]] void
    out_of_memory(int device, size_t rounded, const char *why,
                  cudaStream_t stream,
                  const std::shared_ptr<c10::GatheredContext> *context);

    // ---- private pools, under the device's mutex (torch_pools.cpp) ------

    Pool &pool_incref(DeviceState &d, int device, MempoolId_t id);
    void *pool_malloc(DeviceState &d, int device, size_t size, size_t rounded,
                      cudaStream_t stream,
                      const std::shared_ptr<c10::GatheredContext> *context);
    void *pool_malloc_locked(DeviceState &d, int device, size_t size,
                             size_t rounded, cudaStream_t stream);
    void pool_free(DeviceState &d, PoolBlock *b);
    void pool_undefer(DeviceState &d);
    bool pool_record_events(PoolBlock *b);
    void pool_reclaim(Pool &pool);
    void pool_drop_events(Pool &pool, PoolBlock *b);
    void pool_take_free(Pool &pool, PoolBlock *b);
    size_t release_free_pools(int device, const MempoolId_t *only = nullptr);

    // ---- memory history (torch_history.cpp) -----------------------------

    // Whether memory history is recorded.  While it is not, memory history
    // costs an allocation or a free this relaxed load, nothing else: the
    // hot path is measured (bookkeeping_ns, torch_full.py's share of a
    // step).  Any thread; never blocks.
    bool tracing() const
    {
        return history_on_.load(std::memory_order_relaxed);
    }
    std::shared_ptr<c10::GatheredContext>
    gather_context(CCA::RecordContext level) const;
    void *malloc_traced(size_t size, c10::DeviceIndex device,
                        cudaStream_t stream);
    void raw_delete_traced(void *ptr);
    MempoolId_t pool_of(void *ptr);
    CCA::TraceEntry entry(int device, CCA::TraceEntry::Action action,
                          size_t addr, size_t size, cudaStream_t stream,
                          MempoolId_t pool,
                          std::shared_ptr<c10::GatheredContext> context) const;
    bool skipped(CCA::TraceEntry::Action action) const;
    void record_locked(DeviceState &d, CCA::TraceEntry e);
    void record_alloc_locked(DeviceState &d, int device, void *ptr,
                             size_t size, cudaStream_t stream,
                             MempoolId_t pool,
                             std::shared_ptr<c10::GatheredContext> context);
    void record_free_locked(DeviceState &d, void *ptr, const Allocation &a,
                            MempoolId_t pool,
                            std::shared_ptr<c10::GatheredContext> context);
    void trace(int device, CCA::TraceEntry::Action action, size_t addr,
               size_t size, cudaStream_t stream, MempoolId_t pool,
               std::shared_ptr<c10::GatheredContext> context);
    void trace_snapshot(CCA::SnapshotInfo &info, MempoolId_t mempool_id,
                        bool include_traces);

    // ---- torch_stats.cpp ------------------------------------------------

    int64_t sampled_mallocs(int device) const;
    int64_t sampled_releases(int device) const;
    static void store_sample(CudeferSample &to, const uint64_t *words,
                             int64_t bytes, int64_t bytes_peak,
                             int64_t mallocs, int64_t releases);
    void sample_reserved(int device);
    static c10::cuda::CUDACachingAllocator::SegmentInfo
    segment_of(int device, void *ptr, size_t size, size_t requested,
               cudaStream_t stream, bool allocated, MempoolId_t pool);

    CudeferFunctions fns_;
    std::array<std::unique_ptr<DeviceState>, kMaxDevices> devices_;
    std::array<Shard, kShards> shards_;
    CudeferSample sample_;
    std::atomic<uint64_t> used_devices_{0};
    std::atomic<bool> initialized_{false};
    // The devices init was told of (at most kMaxDevices); only grows.  Any
    // thread reads it.
    std::atomic<int> device_count_{0};
    std::mutex observers_mu_;
    std::vector<CCA::OutOfMemoryObserver> observers_;

    // Memory history's settings (recordHistory): whether it is recorded,
    // the stack recorder, when stacks are kept (a RecordContext), the
    // actions not recorded (a bit per TraceEntry::Action).  Any thread
    // reads them without a lock; recordHistory changes them under
    // history_mu_.
    std::atomic<bool> history_on_{false};
    std::atomic<CCA::CreateContextFn> history_recorder_{nullptr};
    std::atomic<int> history_when_{0};
    std::atomic<uint32_t> history_skip_{0};
    std::mutex history_mu_;
    // Turns the entries' approximate times into microseconds since the
    // epoch (the snapshot's time_us), as PyTorch's allocator does.
    c10::ApproximateClockToUnixTimeConverter clock_;
};

}  // namespace cudefer_torch

#endif  // CUDEFER_TORCH_ALLOCATOR_H
