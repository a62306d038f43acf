/* SPDX-License-Identifier: MIT */
// torch_history.cpp: memory history under cudefer
// (torch.cuda.memory._record_memory_history): recordHistory, a trace
// entry for each allocation, free and out of memory, the stacks of live
// allocations, and the traces torch.cuda.memory._snapshot returns, in
// the format of PyTorch's own allocator's (TraceEntry, each device's
// trace oldest first, times in microseconds since the epoch).
//
// What is recorded, against PyTorch's allocator:
//   - alloc, free_requested, free_completed, oom and snapshot entries,
//     with their address, size (the request's; an OOM's is the rounded
//     size, its address the device's free bytes), stream, private pool
//     and, where `when` keeps them, stacks;
//   - no segment_alloc or segment_free: cudefer's cache (the C library)
//     owns its segments and reports none; the snapshot shows each live
//     block as a segment of its own;
//   - free_completed right after free_requested (see raw_delete_traced);
//   - a return to a checkpoint of a private pool (torch.compile's graph
//     trees; setCheckpointPoolState, torch_pools.cpp): a free of each
//     block it frees, an alloc of each it allocates again, with the
//     return's stack, as PyTorch's allocator records them; not the alloc
//     and free that allocator adds of each block free in the checkpoint
//     (it allocates every block of a checkpointed segment, then frees
//     those free in it);
//   - enabled=None drops the stacks of the live blocks too (PyTorch's
//     allocator keeps them until the blocks are freed).
// Each device's entries are a ring of at most alloc_trace_max_entries,
// the newest kept, under a lock of the device's own (DeviceState's
// trace_mu, a leaf).  The stack recorder takes the GIL: it is called
// before any lock of the allocator's is taken.

#include "torch_allocator.h"

namespace cudefer_torch __attribute__((visibility("hidden"))) {

namespace {

using Action = CCA::TraceEntry::Action;

// The actions skip_actions may name, by their names in the snapshot.
struct ActionName {
    const char *name;
    Action action;
};
constexpr ActionName kActionNames[] = {
    {"alloc", Action::ALLOC},
    {"free_requested", Action::FREE_REQUESTED},
    {"free_completed", Action::FREE_COMPLETED},
    {"segment_alloc", Action::SEGMENT_ALLOC},
    {"segment_free", Action::SEGMENT_FREE},
    {"segment_map", Action::SEGMENT_MAP},
    {"segment_unmap", Action::SEGMENT_UNMAP},
    {"snapshot", Action::SNAPSHOT},
    {"oom", Action::OOM},
};

// This thread's torch.compile contexts (pushed while memory history is
// recorded) and its metadata (torch.cuda.memory._set_memory_metadata):
// the entries this thread records carry the innermost context ("N/A"
// without one) and the metadata, as PyTorch's allocator's do.
thread_local std::vector<std::string> compile_contexts;
thread_local std::string user_metadata;

}  // namespace

// ---- settings -----------------------------------------------------------

// Any thread (torch.cuda.memory._record_memory_history); takes each
// device's trace lock in turn.  enabled false (enabled=None) stops the
// recording and drops every entry, as PyTorch's allocator does, and the
// stacks kept of live blocks; clearHistory drops the entries when
// enabling.  A new alloc_trace_max_entries
// keeps the newest entries that fit.  Raises, changing nothing, for
// stacks asked of no recorder or a skip action that is none.
void CudeferAllocator::recordHistory(
    bool enabled, CCA::CreateContextFn context_recorder,
    size_t alloc_trace_max_entries, CCA::RecordContext when,
    bool clearHistory, const std::vector<std::string> &skip_actions)
{
    TORCH_CHECK(when == CCA::RecordContext::NEVER ||
                    context_recorder != nullptr,
                "cudefer: memory history asked to keep stacks without a "
                "stack recorder");
    uint32_t skip = 0;
    for (const std::string &name : skip_actions) {
        const ActionName *found = std::find_if(
            std::begin(kActionNames), std::end(kActionNames),
            [&](const ActionName &a) { return name == a.name; });
        TORCH_CHECK(found != std::end(kActionNames), "cudefer: skip_actions "
                    "names '", name, "', which is no trace action (alloc, "
                    "free_requested, free_completed, segment_alloc, "
                    "segment_free, segment_map, segment_unmap, snapshot, "
                    "oom)");
        skip |= 1u << found->action;
    }
    std::lock_guard<std::mutex> lock(history_mu_);
    // Off before the traces are dropped: an entry or a stack is kept only
    // while it is on, tested under the trace's lock, so none racing with
    // the drop is kept after it.
    if (!enabled)
        history_on_.store(false);
    history_recorder_.store(enabled ? context_recorder : nullptr);
    history_when_.store(enabled ? static_cast<int>(when) : 0);
    history_skip_.store(skip);
    size_t max = std::max<size_t>(1, alloc_trace_max_entries);
    for (auto &state : devices_) {
        DeviceState &d = *state;
        std::lock_guard<std::mutex> ring(d.trace_mu);
        if (!enabled) {
            d.contexts.clear();
            d.contexts.rehash(0);
        }
        if (!enabled || clearHistory) {
            d.trace.clear();
            d.trace.shrink_to_fit();
        } else {
            // Oldest first, so that the ring can grow or drop its oldest.
            std::rotate(d.trace.begin(),
                        d.trace.begin() + static_cast<ptrdiff_t>(d.trace_next),
                        d.trace.end());
            if (d.trace.size() > max)
                d.trace.erase(d.trace.begin(),
                              d.trace.end() - static_cast<ptrdiff_t>(max));
        }
        d.trace_next = 0;
        d.trace_max = max;
    }
    if (enabled)
        history_on_.store(true);
}

// torch.compile's context of what this thread compiles (memory history's
// compile_context=True), pushed and popped while memory history is
// recorded, as PyTorch's allocator takes them.  Any thread; never blocks.
void CudeferAllocator::pushCompileContext(std::string &md)
{
    if (tracing())
        compile_contexts.push_back(md);
}

void CudeferAllocator::popCompileContext()
{
    if (tracing() && !compile_contexts.empty())
        compile_contexts.pop_back();
}

// This thread's metadata for the entries it records from now on (an empty
// string: none).  Any thread; never blocks.
void CudeferAllocator::setUserMetadata(const std::string &metadata)
{
    user_metadata = metadata;
}

std::string CudeferAllocator::getUserMetadata()
{
    return user_metadata;
}

// ---- recording ----------------------------------------------------------

// The calling thread's stack, where memory history keeps stacks at level
// (STATE: of allocations, ALL: of frees too); else null.  Any thread,
// holding no lock of the allocator's: the recorder (PyTorch's
// CapturedTraceback::gather) takes the GIL, so it may block for it.
std::shared_ptr<c10::GatheredContext>
CudeferAllocator::gather_context(CCA::RecordContext level) const
{
    if (history_when_.load(std::memory_order_relaxed) <
        static_cast<int>(level))
        return nullptr;
    CCA::CreateContextFn recorder =
        history_recorder_.load(std::memory_order_relaxed);
    return recorder != nullptr ? recorder() : nullptr;
}

// malloc while memory history is recorded: the allocation gets its alloc
// entry and keeps its stack (where stacks are kept); an out of memory
// gets its oom entry with that stack from out_of_memory, before the OOM
// observers run (torch_allocator.cpp).  Any thread, holding no lock of
// the allocator's (the stack recorder takes the GIL).  Raises
// OutOfMemoryError.
void *CudeferAllocator::malloc_traced(size_t size, c10::DeviceIndex device,
                                      cudaStream_t stream)
{
    std::shared_ptr<c10::GatheredContext> context =
        gather_context(CCA::RecordContext::STATE);
    void *ptr = malloc_untraced(size, device, stream, &context);
    MempoolId_t pool = pool_of(ptr);
    DeviceState &d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.trace_mu);
    record_alloc_locked(d, device, ptr, size, stream, pool,
                        std::move(context));
    return ptr;
}

// raw_delete while memory history is recorded: free_requested, then
// free_completed at once, before the memory goes back (its next
// allocation's entry then comes after them).  A free is stream-ordered:
// to this allocator it is complete when it returns, as a free of
// PyTorch's own allocator that no other stream used is (the memory
// serves later work of its stream at once).  Memory that other streams
// used (Tensor.record_stream) is handed out again only once their work
// queued before the free is done, which cudefer (or the private pool)
// waits for without telling this side: there, free_completed marks the
// hand-back to cudefer, not that moment.  Both entries carry the free's
// stack where stacks of frees are kept (when ALL), else the
// allocation's.  Any thread, holding no lock of the allocator's (the
// stack recorder takes the GIL).  Raises for a pointer it did not
// allocate.
void CudeferAllocator::raw_delete_traced(void *ptr)
{
    std::shared_ptr<c10::GatheredContext> context =
        gather_context(CCA::RecordContext::ALL);
    Allocation a = take(ptr);
    // The block is still allocated: its pool lives (see pool_of).
    MempoolId_t pool =
        a.block != nullptr ? a.block->pool->id : MempoolId_t{0, 0};
    {
        DeviceState &d = *devices_[a.device];
        std::lock_guard<std::mutex> lock(d.trace_mu);
        record_free_locked(d, ptr, a, pool, std::move(context));
    }
    give_back(ptr, a);
}

// The alloc entry of the allocation at ptr (size bytes asked on stream,
// of pool), and its stack kept for the snapshot's blocks where there is
// one; nothing once recordHistory stopped the recording (it drops the
// stacks when it stops: none is kept after).  Under d's trace lock (the
// caller may hold the device's mutex too).  Throws only std::bad_alloc.
void CudeferAllocator::record_alloc_locked(
    DeviceState &d, int device, void *ptr, size_t size, cudaStream_t stream,
    MempoolId_t pool, std::shared_ptr<c10::GatheredContext> context)
{
    if (!tracing())
        return;
    if (context != nullptr)
        d.contexts[ptr] = context;
    if (!skipped(Action::ALLOC))
        record_locked(d, entry(device, Action::ALLOC,
                               reinterpret_cast<size_t>(ptr), size, stream,
                               pool, std::move(context)));
}

// The free_requested and free_completed entries of the allocation a at
// ptr, of pool, each with context, or where that is null with the stack
// kept of the allocation; that stack is dropped either way.  Under d's
// trace lock (the caller may hold the device's mutex too).  Throws only
// std::bad_alloc.
void CudeferAllocator::record_free_locked(
    DeviceState &d, void *ptr, const Allocation &a, MempoolId_t pool,
    std::shared_ptr<c10::GatheredContext> context)
{
    std::shared_ptr<c10::GatheredContext> allocated;
    auto it = d.contexts.find(ptr);
    if (it != d.contexts.end()) {
        allocated = std::move(it->second);
        d.contexts.erase(it);
    }
    if (context == nullptr)
        context = std::move(allocated);
    size_t addr = reinterpret_cast<size_t>(ptr);
    if (!skipped(Action::FREE_REQUESTED))
        record_locked(d, entry(a.device, Action::FREE_REQUESTED, addr,
                               a.requested, a.stream, pool, context));
    if (!skipped(Action::FREE_COMPLETED))
        record_locked(d, entry(a.device, Action::FREE_COMPLETED, addr,
                               a.requested, a.stream, pool,
                               std::move(context)));
}

// The private pool of the live allocation at ptr, {0, 0} for cudefer's.
// Any thread; takes ptr's table shard.
MempoolId_t CudeferAllocator::pool_of(void *ptr)
{
    PoolBlock *b = nullptr;
    int device = 0;
    if (!lookup(ptr, &b, &device) || b == nullptr)
        return {0, 0};
    // A block's pool and the pool's id never change, and the pool lives
    // while one of its blocks is allocated: read without the device's
    // mutex.
    return b->pool->id;
}

// Whether skip_actions names action.  Any thread; never blocks.
bool CudeferAllocator::skipped(CCA::TraceEntry::Action action) const
{
    return (history_skip_.load(std::memory_order_relaxed) >> action) & 1u;
}

// An entry of device, stamped now, with the calling thread's compile
// context and metadata; with its stack only where entries keep stacks
// (when ALLOC or ALL).  Any thread; never blocks.
CCA::TraceEntry
CudeferAllocator::entry(int device, CCA::TraceEntry::Action action,
                        size_t addr, size_t size, cudaStream_t stream,
                        MempoolId_t pool,
                        std::shared_ptr<c10::GatheredContext> context) const
{
    if (history_when_.load(std::memory_order_relaxed) <
        static_cast<int>(CCA::RecordContext::ALLOC))
        context.reset();
    return CCA::TraceEntry(
        action, static_cast<c10::DeviceIndex>(device), addr, size, stream,
        pool, c10::getApproximateTime(), std::move(context),
        compile_contexts.empty() ? std::string("N/A")
                                 : compile_contexts.back(),
        user_metadata);
}

// Puts e in d's trace, the oldest entry making room once there are
// trace_max; not once recordHistory stopped the recording (it may have
// dropped the rest).  Under d's trace lock.  Throws only std::bad_alloc.
void CudeferAllocator::record_locked(DeviceState &d, CCA::TraceEntry e)
{
    if (!tracing())
        return;
    if (d.trace.size() < d.trace_max) {
        d.trace.push_back(std::move(e));
        return;
    }
    d.trace[d.trace_next] = std::move(e);
    d.trace_next = (d.trace_next + 1) % d.trace_max;
}

// Records an entry in device's trace, unless its action is skipped.  Any
// thread; takes the device's trace lock (a leaf: the caller may hold any
// other lock of the allocator's).  Throws only std::bad_alloc.
void CudeferAllocator::trace(int device, CCA::TraceEntry::Action action,
                             size_t addr, size_t size, cudaStream_t stream,
                             MempoolId_t pool,
                             std::shared_ptr<c10::GatheredContext> context)
{
    if (skipped(action))
        return;
    CCA::TraceEntry e =
        entry(device, action, addr, size, stream, pool, std::move(context));
    DeviceState &d = *devices_[device];
    std::lock_guard<std::mutex> lock(d.trace_mu);
    record_locked(d, std::move(e));
}

// The snapshot's device_traces, one list per device init was told of,
// each oldest first with its times in microseconds since the epoch (when
// include_traces; else empty lists); the stacks of the live blocks'
// allocations (a cudefer block's segment is the block: its stack too);
// then, while memory history is recorded, a snapshot entry on each
// device (its allocated bytes), as PyTorch's allocator records one per
// snapshot (it shows in the next).  Any thread, holding no lock of the
// allocator's; takes each device's trace lock in turn.
void CudeferAllocator::trace_snapshot(CCA::SnapshotInfo &info,
                                      MempoolId_t mempool_id,
                                      bool include_traces)
{
    int count = device_count_.load();
    info.device_traces.resize(static_cast<size_t>(count));
    std::function<c10::time_t(c10::approx_time_t)> to_ns;
    if (include_traces)
        to_ns = clock_.makeConverter();
    for (int dev = 0; dev < count; dev++) {
        DeviceState &d = *devices_[dev];
        std::vector<CCA::TraceEntry> &out = info.device_traces[dev];
        std::lock_guard<std::mutex> lock(d.trace_mu);
        if (!d.contexts.empty()) {
            for (CCA::SegmentInfo &seg : info.segments) {
                if (seg.device != dev || !seg.blocks[0].allocated)
                    continue;
                auto it = d.contexts.find(reinterpret_cast<void *>(seg.address));
                if (it == d.contexts.end())
                    continue;
                seg.blocks[0].context_when_allocated = it->second;
                if (seg.owner_private_pool_id == MempoolId_t{0, 0})
                    seg.context_when_allocated = it->second;
            }
        }
        if (!include_traces)
            continue;
        auto oldest = d.trace.begin() + static_cast<ptrdiff_t>(d.trace_next);
        out.reserve(d.trace.size());
        out.insert(out.end(), oldest, d.trace.end());
        out.insert(out.end(), d.trace.begin(), oldest);
    }
    for (auto &out : info.device_traces) {
        for (CCA::TraceEntry &e : out) {
            c10::approx_time_t t = e.time_.approx_t_;
            e.time_.t_ = to_ns(t) / 1000;
        }
    }
    if (!tracing())
        return;
    for (int dev = 0; dev < count; dev++)
        trace(dev, Action::SNAPSHOT, 0,
              static_cast<size_t>(
                  devices_[dev]->allocated_bytes.s[0].current.load()),
              nullptr, mempool_id, nullptr);
}

}  // namespace cudefer_torch
