/* SPDX-License-Identifier: MIT */
// torch_pools.cpp: the allocator's private pools (CUDA graphs, MemPool,
// torch.compile's CUDA graph trees and their checkpoints) and
// empty_cache, which gives released pools' blocks back.  Pools are
// guarded by their device's mutex (torch_allocator.h).

#include "torch_allocator.h"

namespace cudefer_torch __attribute__((visibility("hidden"))) {

namespace {

// pool_malloc_locked's "out of memory" (no block's address).
void *const kPoolOutOfMemory = reinterpret_cast<void *>(uintptr_t{1});

// A checkpoint of a private pool (getCheckpointState): each block's
// address, size, stream and whether it was allocated (then its
// allocation's request and the size the statistics count it at).
struct PoolCheckpoint : CCA::AllocatorState {
    MempoolId_t id{0, 0};
    struct Block {
        void *ptr;
        size_t size;
        size_t requested;
        size_t rounded;
        cudaStream_t stream;
        bool allocated;
    };
    std::vector<Block> blocks;
};

}  // namespace

// ---- private pools: CUDA graphs, MemPool, torch.compile; empty_cache ---

// Releases nothing while an allocate-to-pool section is open, as
// PyTorch's allocator releases nothing of its default pools while one
// is open on the device (release_cached_blocks tests captures_underway):
// a capture may be under way in another thread, and defer_flush and
// defer_trim fail then (cudaErrorStreamCaptureImplicit) when that
// capture's stream is a blocking one and blocks freed on the legacy
// stream wait for their event.  cudefer trims every device: a section on
// any device counts.  A section begun while they run is not seen.
// Otherwise blocks until the frees cudefer has pending are done
// (defer_flush: a block other streams used, Tensor.record_stream, is
// back in its cache then), as PyTorch's allocator synchronises its
// blocks' events first (synchronize_and_free_events), so that the trim
// gives those blocks back too.  Raises a failed flush's or trim's error.
void CudeferAllocator::emptyCache(MempoolId_t mempool_id)
{
    if (mempool_id.first == 0 && mempool_id.second == 0) {
        if (sections_anywhere.load(std::memory_order_acquire) > 0)
            return;
        for (int i = 0; i < device_count_; i++)
            undefer_frees(*devices_[i]);
        cudaError_t err = fns_.flush();
        TORCH_CHECK(err == cudaSuccess,
                    "cudefer: defer_flush failed with CUDA error ",
                    static_cast<int>(err));
        err = fns_.trim(nullptr);
        TORCH_CHECK(err == cudaSuccess,
                    "cudefer: defer_trim failed with CUDA error ",
                    static_cast<int>(err));
        for (int i = 0; i < device_count_; i++)
            release_free_pools(i);
        return;
    }
    for (int i = 0; i < device_count_; i++)
        release_free_pools(i, &mempool_id);
}

void CudeferAllocator::beginAllocateToPool(
    c10::DeviceIndex device, MempoolId_t mempool_id,
    std::function<bool(cudaStream_t)> filter)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    // One open section per pool, as PyTorch's allocator requires: two
    // would hand one pool's blocks to two captures at once, and
    // endAllocateToPool could not tell which of them ends.  Refused
    // before the use count changes.
    for (const auto &s : d.open_sections)
        TORCH_CHECK(s.id != mempool_id, "cudefer: beginAllocateToPool: "
                    "already recording to mempool_id (", mempool_id.first,
                    ", ", mempool_id.second, ")");
    pool_incref(d, device, mempool_id);
    d.open_sections.push_back({mempool_id, std::move(filter)});
    d.sections.fetch_add(1, std::memory_order_release);
    sections_anywhere.fetch_add(1, std::memory_order_release);
}

void CudeferAllocator::endAllocateToPool(c10::DeviceIndex device,
                                         MempoolId_t mempool_id)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto it = d.open_sections.begin(); it != d.open_sections.end();
         ++it) {
        if (it->id == mempool_id) {
            d.open_sections.erase(it);
            d.sections.fetch_sub(1, std::memory_order_release);
            sections_anywhere.fetch_sub(1, std::memory_order_release);
            return;
        }
    }
    TORCH_CHECK(false, "cudefer: endAllocateToPool for pool (",
                mempool_id.first, ", ", mempool_id.second,
                ") with no allocation to it begun");
}

void CudeferAllocator::releasePool(c10::DeviceIndex device,
                                   MempoolId_t mempool_id)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.pools.find(mempool_id);
    TORCH_CHECK(it != d.pools.end(), "cudefer: releasePool of pool (",
                mempool_id.first, ", ", mempool_id.second,
                ") that does not exist");
    TORCH_CHECK(it->second->use_count > 0, "cudefer: pool (",
                mempool_id.first, ", ", mempool_id.second,
                ") released more often than used");
    // Its free blocks go back to CUDA at empty_cache or out of memory,
    // as PyTorch's own allocator does: not here, where graph replays
    // may still run.
    it->second->use_count--;
}

void CudeferAllocator::createOrIncrefPool(
    c10::DeviceIndex device, MempoolId_t mempool_id,
    std::shared_ptr<CCA::CUDAAllocator> allocator)
{
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "cudefer: a MemPool with an allocator of its own is not "
                "supported while cudefer is PyTorch's allocator");
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    pool_incref(d, device, mempool_id);
}

// A pool the device does not have (never made, or released and its
// blocks returned) raises, as in PyTorch's allocator: its use count is
// not 0, there is no such pool.
int CudeferAllocator::getPoolUseCount(c10::DeviceIndex device,
                                      MempoolId_t mempool_id)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.pools.find(mempool_id);
    TORCH_CHECK(it != d.pools.end(), "cudefer: getPoolUseCount of pool (",
                mempool_id.first, ", ", mempool_id.second,
                "), which does not exist on device ",
                static_cast<int>(device));
    return it->second->use_count;
}

void CudeferAllocator::setUseOnOOM(c10::DeviceIndex, MempoolId_t,
                                   bool use_on_oom)
{
    // MemPool's destructor turns it off: accepted.
    TORCH_CHECK(!use_on_oom, "cudefer: MemPool(use_on_oom=True) is not "
                "supported while cudefer is PyTorch's allocator");
}

bool CudeferAllocator::checkPoolLiveAllocations(
    c10::DeviceIndex device, MempoolId_t mempool_id,
    const std::unordered_set<void *> &expected)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.pools.find(mempool_id);
    TORCH_CHECK(it != d.pools.end(), "cudefer: no pool (",
                mempool_id.first, ", ", mempool_id.second, ")");
    size_t live = 0;
    for (auto &b : it->second->blocks) {
        if (!b->allocated)
            continue;
        if (expected.count(b->ptr) == 0)
            return false;
        live++;
    }
    return live == expected.size();
}

std::shared_ptr<CCA::AllocatorState>
CudeferAllocator::getCheckpointState(c10::DeviceIndex device,
                                     MempoolId_t id)
{
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.pools.find(id);
    TORCH_CHECK(it != d.pools.end(), "cudefer: no pool (", id.first,
                ", ", id.second, ") to checkpoint");
    TORCH_CHECK(it->second->use_count > 0, "cudefer: pool (", id.first,
                ", ", id.second, ") was released: no checkpoint");
    // As PyTorch's allocator, which records deferred frees' events here.
    pool_undefer(d);
    auto state = std::make_shared<PoolCheckpoint>();
    state->id = id;
    for (auto &b : it->second->blocks)
        state->blocks.push_back(
            {b->ptr, b->size, b->requested, b->rounded, b->stream,
             b->allocated});
    return state;
}

// Returns the pool to a checkpoint: every block allocated now is freed
// as a tensor's free frees it (ptrs_freed; PyTorch takes their
// storages' deleters away), so that one other streams used
// (record_stream) is pending or deferred until they are done; every
// block allocated in the checkpoint is allocated again, counted in the
// statistics as it was then, and handed back as a DataPtr
// (dataptrs_allocd).  Deferred blocks get their events
// first where no section is open, so that one the checkpoint holds
// allocated waits for its uses as a pending one does.  While memory
// history is recorded, each block freed gets its free_requested and
// free_completed entries and each allocated again its alloc entry, as
// a tensor's free and allocation get theirs, with the return's stack
// (torch_history.cpp).  Any thread; blocks for the GIL while memory
// history keeps stacks (the recorder takes it, before any lock of the
// allocator's), and for the events of a pending block the checkpoint
// holds allocated.
CCA::CheckpointDelta CudeferAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> as)
{
    auto *cp = dynamic_cast<PoolCheckpoint *>(as.get());
    TORCH_CHECK(cp != nullptr, "cudefer: a checkpoint that is not "
                "cudefer's");
    // The return's stack: the frees' where stacks of frees are kept
    // (when ALL), the allocations' where stacks are kept.
    bool traced = tracing();
    std::shared_ptr<c10::GatheredContext> freed, allocated;
    if (traced) {
        freed = gather_context(CCA::RecordContext::ALL);
        allocated = freed != nullptr
                        ? freed
                        : gather_context(CCA::RecordContext::STATE);
    }
    DeviceState &d = state(device);
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.pools.find(cp->id);
    TORCH_CHECK(it != d.pools.end() && it->second->use_count > 0,
                "cudefer: the checkpoint's pool (", cp->id.first, ", ",
                cp->id.second, ") is gone");
    pool_undefer(d);
    Pool &pool = *it->second;
    CCA::CheckpointDelta delta;
    std::unordered_map<void *, PoolBlock *> by_ptr;
    for (auto &b : pool.blocks) {
        by_ptr[b->ptr] = b.get();
        if (!b->allocated)
            continue;
        Allocation a;
        TORCH_CHECK(forget(b->ptr, &a), "cudefer: pool block ", b->ptr,
                    " missing from the table");
        count_free(d, a, b->ptr);
        if (traced) {
            std::lock_guard<std::mutex> ring(d.trace_mu);
            record_free_locked(d, b->ptr, a, pool.id, freed);
        }
        pool_free(d, b.get());
        delta.ptrs_freed.push_back(b->ptr);
    }
    for (auto &c : cp->blocks) {
        if (!c.allocated)
            continue;
        auto found = by_ptr.find(c.ptr);
        TORCH_CHECK(found != by_ptr.end() && found->second->size == c.size,
                    "cudefer: the checkpoint's block ", c.ptr,
                    " is no longer in its pool");
        PoolBlock *b = found->second;
        pool_take_free(pool, b);
        b->allocated = true;
        b->requested = c.requested;
        b->rounded = c.rounded;
        b->stream = c.stream;
        Allocation a;
        a.requested = c.requested;
        a.rounded = c.rounded;
        a.stream = c.stream;
        a.block = b;
        a.device = device;
        remember(b->ptr, a);
        count_alloc(d, a, device, b->ptr);
        d.pool_allocated.fetch_add(static_cast<int64_t>(b->size));
        if (traced) {
            std::lock_guard<std::mutex> ring(d.trace_mu);
            record_alloc_locked(d, device, b->ptr, c.requested, c.stream,
                                pool.id, allocated);
        }
        delta.dataptrs_allocd.emplace_back(
            b->ptr, b->ptr, &raw_delete_fn,
            c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
}

// ---- private pools, under the device's mutex -------------------------

Pool &CudeferAllocator::pool_incref(DeviceState &d, int device,
                                    MempoolId_t id)
{
    auto &slot = d.pools[id];
    if (!slot) {
        slot = std::make_unique<Pool>();
        slot->id = id;
        slot->device = device;
    }
    slot->use_count++;
    return *slot;
}

// An allocation of the newest open section whose filter takes stream
// (sections nest: an inner use_mem_pool or a capture inside one wins,
// as in PyTorch's allocator), or nullptr when none does (the
// allocation is cudefer's then).
// Raises OutOfMemoryError when cudaMalloc has no memory for the pool.
void *CudeferAllocator::pool_malloc(
    DeviceState &d, int device, size_t size, size_t rounded,
    cudaStream_t stream, const std::shared_ptr<c10::GatheredContext> *context)
{
    int64_t made = d.pool_mallocs.load(std::memory_order_relaxed);
    void *ptr = pool_malloc_locked(d, device, size, rounded, stream);
    if (ptr == kPoolOutOfMemory)
        out_of_memory(device, rounded, nullptr, stream, context);
    // A pool that grew raises the reserved peak now: its growth may be
    // released before any statistics call samples it (a graph's pool, at
    // empty_cache once the graph is gone).  No CUDA call; next to the
    // new block's cudaMalloc, its cost does not show.
    if (d.pool_mallocs.load(std::memory_order_relaxed) != made)
        sample_reserved(device);
    return ptr;
}

// pool_malloc under the device's mutex; kPoolOutOfMemory when
// cudaMalloc had no memory (the error is raised once it is unlocked:
// OOM observers may take the GIL).
void *CudeferAllocator::pool_malloc_locked(DeviceState &d, int device,
                                           size_t size, size_t rounded,
                                           cudaStream_t stream)
{
    std::lock_guard<std::mutex> lock(d.mu);
    Pool *pool = nullptr;
    for (auto s = d.open_sections.rbegin(); s != d.open_sections.rend();
         ++s) {
        if (s->filter(stream)) {
            auto it = d.pools.find(s->id);
            TORCH_INTERNAL_ASSERT(it != d.pools.end());
            pool = it->second.get();
            break;
        }
    }
    if (pool == nullptr)
        return nullptr;
    pool_reclaim(*pool);
    PoolBlock *b = nullptr;
    // The smallest free block of this stream that fits and wastes less
    // than the request (blocks are never split); else a new block; where
    // cudaMalloc has no memory for it, the smallest free block of this
    // stream that fits at all, its tail unused, rather than out of memory
    // (PyTorch's allocator would split that block).
    auto it = pool->free_blocks.lower_bound({stream, rounded});
    bool fits = it != pool->free_blocks.end() && it->first.first == stream;
    void *ptr = nullptr;
    cudaError_t err = cudaErrorMemoryAllocation;  // cudaSuccess: a new block
    if (!fits || it->first.second > 2 * rounded) {
        {
            c10::cuda::CUDAGuard guard(
                static_cast<c10::DeviceIndex>(device));
            c10::cuda::CUDAStreamCaptureModeGuard relaxed(
                cudaStreamCaptureModeRelaxed);
            err = cudaMalloc(&ptr, rounded);
        }
        if (err == cudaErrorMemoryAllocation)
            (void)cudaGetLastError();
        else
            C10_CUDA_CHECK(err);
    }
    if (err != cudaSuccess) {
        if (!fits)
            return kPoolOutOfMemory;
        b = it->second;
        pool->free_blocks.erase(it);
    } else {
        auto owned = std::make_unique<PoolBlock>();
        b = owned.get();
        b->ptr = ptr;
        b->size = rounded;
        b->pool = pool;
        pool->blocks.push_back(std::move(owned));
        bool small = rounded <= kSmallSize;
        d.pool_bytes.add(small, static_cast<int64_t>(rounded));
        d.pool_segments.add(small, 1);
        d.pool_mallocs.fetch_add(1, std::memory_order_relaxed);
    }
    b->allocated = true;
    b->requested = size;
    b->rounded = rounded;
    b->stream = stream;
    Allocation a;
    a.requested = size;
    a.rounded = rounded;
    a.stream = stream;
    a.block = b;
    a.device = static_cast<int8_t>(device);
    remember(b->ptr, a);
    count_alloc(d, a, device, b->ptr);
    // The block's size (a reused block may be larger than rounded), as
    // pool_free takes it off.
    d.pool_allocated.fetch_add(static_cast<int64_t>(b->size));
    return b->ptr;
}

// Any thread, under the device's mutex: a block a checkpoint has
// allocated, taken off its pool's free blocks; a pending one once its
// events completed (waits for them); a deferred one (a section is
// open: no event may be recorded) off its pool's deferred list, and a
// retired one, as they are (the checkpoint's tensors are the graph
// tree's again).
void CudeferAllocator::pool_take_free(Pool &pool, PoolBlock *b)
{
    auto range = pool.free_blocks.equal_range({b->stream, b->size});
    for (auto it = range.first; it != range.second; ++it) {
        if (it->second == b) {
            pool.free_blocks.erase(it);
            return;
        }
    }
    if (!b->events.empty()) {
        pool_drop_events(pool, b);
        b->uses.clear();
        return;
    }
    if (b->deferred) {
        auto it = std::find(pool.deferred.begin(), pool.deferred.end(), b);
        if (it != pool.deferred.end())
            pool.deferred.erase(it);
        b->deferred = false;
        b->uses.clear();
        return;
    }
    TORCH_CHECK(b->retired, "cudefer: the checkpoint's block ", b->ptr,
                " is neither free, pending, deferred nor retired");
    b->retired = false;
    b->uses.clear();
}

// Any thread, under the device's mutex; never blocks nor throws (frees
// run in deleters): a pool block's free, back to its pool's free blocks
// for its stream where no other stream recorded a use.  Else, with no
// allocate-to-pool section open anywhere, an event on each use's
// stream: the block is pending until they have completed
// (pool_reclaim), as PyTorch's allocator frees a block other streams
// used (insert_events); where CUDA refused an event, it is retired.
// With a section open (a capture may be under way: no event may be
// recorded or queried there), it is deferred until none is
// (pool_undefer), as PyTorch's allocator defers it
// (needs_events_deferred_until_no_capture).  Blocks deferred before
// get their events first once no section is open.
void CudeferAllocator::pool_free(DeviceState &d, PoolBlock *b)
{
    pool_undefer(d);
    d.pool_allocated.fetch_sub(static_cast<int64_t>(b->size));
    if (b->uses.empty()) {
        pool_put_free(*b->pool, b);
        return;
    }
    b->allocated = false;
    if (sections_anywhere.load(std::memory_order_acquire) > 0) {
        b->deferred = true;
        b->pool->deferred.push_back(b);
        d.has_deferred.store(true, std::memory_order_relaxed);
        return;
    }
    if (pool_record_events(b))
        b->pool->pending.push_back(b);
    else
        b->retired = true;
}

// Any thread, under the device's mutex; never blocks nor throws (frees
// run in deleters): once no allocate-to-pool section is open anywhere,
// the deferred blocks of the device's pools (freed with uses while one
// was) get an event on each use's stream and are pending (retired
// where CUDA refused one), as PyTorch's allocator records such blocks'
// events once no capture is under way on the device.  Does nothing
// while a section is open or where no block is deferred.
void CudeferAllocator::pool_undefer(DeviceState &d)
{
    if (!d.has_deferred.load(std::memory_order_relaxed) ||
        sections_anywhere.load(std::memory_order_acquire) > 0)
        return;
    for (auto &entry : d.pools) {
        Pool &pool = *entry.second;
        for (PoolBlock *b : pool.deferred) {
            b->deferred = false;
            if (pool_record_events(b))
                pool.pending.push_back(b);
            else
                b->retired = true;
        }
        pool.deferred.clear();
    }
    d.has_deferred.store(false, std::memory_order_relaxed);
}

// Any thread, under the device's mutex; never blocks nor throws (frees
// run in deleters): records an event on each of b's uses' streams, on
// that stream's device (the caller's current device is put back).
// Returns false, with no event left and CUDA's error cleared, where
// CUDA refused one.
bool CudeferAllocator::pool_record_events(PoolBlock *b)
{
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    bool ok = true;
    for (const PoolUse &u : b->uses) {
        cudaEvent_t e = nullptr;
        if (cudaSetDevice(u.device) != cudaSuccess ||
            cudaEventCreateWithFlags(&e, cudaEventDisableTiming) !=
                cudaSuccess) {
            ok = false;
            break;
        }
        b->events.push_back(e);
        if (cudaEventRecord(e, u.stream) != cudaSuccess) {
            ok = false;
            break;
        }
    }
    if (!ok) {
        (void)cudaGetLastError();
        for (cudaEvent_t e : b->events)
            (void)cudaEventDestroy(e);
        b->events.clear();
    }
    if (cudaSetDevice(current) != cudaSuccess)
        (void)cudaGetLastError();
    return ok;
}

// Any thread, under the device's mutex; never blocks: puts the pool's
// pending blocks whose events have all completed among its free blocks;
// one whose event CUDA cannot query is retired.  Only queries, under a
// relaxed capture mode: this thread may be capturing into the pool (the
// events were recorded outside any capture, which a relaxed mode allows
// querying).
void CudeferAllocator::pool_reclaim(Pool &pool)
{
    if (pool.pending.empty())
        return;
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(
        cudaStreamCaptureModeRelaxed);
    for (size_t i = 0; i < pool.pending.size();) {
        PoolBlock *b = pool.pending[i];
        cudaError_t err = cudaSuccess;
        for (cudaEvent_t e : b->events) {
            err = cudaEventQuery(e);
            if (err != cudaSuccess)
                break;
        }
        if (err == cudaErrorNotReady) {
            (void)cudaGetLastError();
            i++;
            continue;
        }
        for (cudaEvent_t e : b->events)
            (void)cudaEventDestroy(e);
        b->events.clear();
        pool.pending[i] = pool.pending.back();
        pool.pending.pop_back();
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            b->retired = true;
            continue;
        }
        b->uses.clear();
        pool_put_free(pool, b);
    }
}

// Any thread, under the device's mutex; blocks: waits for a pending
// block's events, destroys them and takes the block off its pool's
// pending list; its uses stay.  CUDA's errors are cleared: the caller
// gives the block back or hands it out.
void CudeferAllocator::pool_drop_events(Pool &pool, PoolBlock *b)
{
    for (cudaEvent_t e : b->events) {
        if (cudaEventSynchronize(e) != cudaSuccess)
            (void)cudaGetLastError();
        (void)cudaEventDestroy(e);
    }
    b->events.clear();
    auto it = std::find(pool.pending.begin(), pool.pending.end(), b);
    if (it != pool.pending.end())
        pool.pending.erase(it);
}

// Give the free, pending, deferred and retired blocks of released pools
// (use count 0) of device back to CUDA (only that pool with only !=
// nullptr), and drop pools with no blocks left.  Blocks: deferred
// blocks (of every pool of the device) get their events first, as
// PyTorch's allocator records them before it synchronises; the device
// synchronises, and so do the other devices whose streams used a
// retired block (or one still deferred: a section begun since); a
// pending block waits for its events.  Not while any allocate-to-pool
// section is open (a capture may be running: no synchronisation then).
// Returns the bytes released; the device's pool_bytes_low follows what
// is left.
// d.mu held: pool_bytes_low follows the private pools' bytes down (the
// least they held since the last reset of the peaks: max_memory_reserved
// counts it beside cudefer's own peak).
static void lower_pool_low(DeviceState &d)
{
    int64_t left = d.pool_bytes.s[0].current.load();
    if (left < d.pool_bytes_low.load())
        d.pool_bytes_low.store(left);
}

// d.mu held: b, whose memory just went back to CUDA, out of pool's free,
// pending and deferred lists before its struct goes, so that a CUDA error
// later in release_free_pools leaves no list naming a freed block.
static void pool_unlist(Pool &pool, PoolBlock *b)
{
    auto range = pool.free_blocks.equal_range({b->stream, b->size});
    for (auto it = range.first; it != range.second;)
        it = it->second == b ? pool.free_blocks.erase(it) : std::next(it);
    for (std::vector<PoolBlock *> *list : {&pool.pending, &pool.deferred})
        list->erase(std::remove(list->begin(), list->end(), b), list->end());
}

size_t CudeferAllocator::release_free_pools(int device,
                                            const MempoolId_t *only)
{
    if (sections_anywhere.load(std::memory_order_acquire) > 0)
        return 0;
    DeviceState &d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.mu);
    pool_undefer(d);
    size_t released = 0;
    bool synced = false;
    uint64_t others_synced = 0;  // other devices synchronised, by bit
    for (auto it = d.pools.begin(); it != d.pools.end();) {
        Pool &pool = *it->second;
        if (pool.use_count > 0 || (only != nullptr && pool.id != *only)) {
            ++it;
            continue;
        }
        auto &blocks = pool.blocks;
        for (auto b = blocks.begin(); b != blocks.end();) {
            if ((*b)->allocated) {
                ++b;
                continue;
            }
            c10::cuda::CUDAGuard guard(
                static_cast<c10::DeviceIndex>(device));
            if (!synced) {
                // Replays of the pool's graphs may still run.
                C10_CUDA_CHECK(cudaDeviceSynchronize());
                synced = true;
            }
            if (!(*b)->events.empty())
                pool_drop_events(pool, b->get());
            if ((*b)->retired || (*b)->deferred) {
                for (const PoolUse &u : (*b)->uses) {
                    uint64_t bit = 1ull << u.device;
                    if (u.device == device || (others_synced & bit))
                        continue;
                    c10::cuda::CUDAGuard other(
                        static_cast<c10::DeviceIndex>(u.device));
                    C10_CUDA_CHECK(cudaDeviceSynchronize());
                    others_synced |= bit;
                }
            }
            C10_CUDA_CHECK(cudaFree((*b)->ptr));
            pool_unlist(pool, b->get());
            bool small = (*b)->size <= kSmallSize;
            d.pool_bytes.sub(small, static_cast<int64_t>((*b)->size));
            lower_pool_low(d);  // at once: a later CUDA call may throw
            d.pool_segments.sub(small, 1);
            d.pool_frees.fetch_add(1, std::memory_order_relaxed);
            released += (*b)->size;
            b = blocks.erase(b);
        }
        if (blocks.empty())
            it = d.pools.erase(it);
        else
            ++it;
    }
    return released;
}

}  // namespace cudefer_torch
