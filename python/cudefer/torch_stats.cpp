/* SPDX-License-Identifier: MIT */
// torch_stats.cpp: the allocator's statistics (torch.cuda.memory_stats
// and their resets), its samples of cudefer's own counters, and
// torch.cuda.memory_snapshot (its traces: torch_history.cpp).  The
// counters are per-device atomics (torch_allocator.h): any thread reads
// them without a lock.

#include "torch_allocator.h"

namespace cudefer_torch __attribute__((visibility("hidden"))) {

// ---- statistics ---------------------------------------------------------

DeviceStats CudeferAllocator::getDeviceStats(c10::DeviceIndex device)
{
    check_device(device);
    sample_reserved(device);
    DeviceState &d = *devices_[device];
    DeviceStats s;
    s.allocation = d.allocation.get();
    s.active = s.allocation;
    s.allocated_bytes = d.allocated_bytes.get();
    s.active_bytes = s.allocated_bytes;
    s.requested_bytes = d.requested_bytes.get();
    // Reserved: cudefer's cache on the device (see reserved_of) plus
    // the private pools' segments.  The
    // small and large pools' figures are the private pools' alone
    // (cudefer does not sort its cache by size); the aggregate's
    // allocated and freed count cudefer's part by how much it grew or
    // shrank since the last reset of the accumulated counters (cudefer
    // does not count the bytes of the blocks it made and released), so
    // that a reset leaves both at 0, as PyTorch's does.
    s.reserved_bytes = d.pool_bytes.get();
    s.segment = d.pool_segments.get();
    int64_t reserved = reserved_of(device);
    int64_t cudefer_part = reserved - s.reserved_bytes[0].current;
    Stat &r = s.reserved_bytes[0];
    r.current = reserved;
    // The reserved bytes are never below the allocated ones (reserved_of),
    // so neither is their peak (reserved_peak: sample_reserved).
    r.peak = std::max<int64_t>({d.reserved_peak.load(), reserved,
                                s.allocated_bytes[0].peak});
    int64_t grown = cudefer_part - d.reserved_base.load();
    r.allocated += std::max<int64_t>(grown, 0);
    r.freed += std::max<int64_t>(-grown, 0);
    int64_t mallocs = sampled_mallocs(device);
    int64_t releases = sampled_releases(device);
    s.segment[0].current += mallocs - releases;
    s.segment[0].peak = std::max(s.segment[0].peak, s.segment[0].current);
    s.num_alloc_retries = d.num_alloc_retries.load();
    s.num_ooms = d.num_ooms.load();
    s.num_device_alloc = d.pool_mallocs.load() + mallocs -
                         d.device_alloc_base.load();
    s.num_device_free = d.pool_frees.load() + releases -
                        d.device_free_base.load();
    s.max_split_size = static_cast<int64_t>(
        c10::CachingAllocator::AcceleratorAllocatorConfig::
            max_split_size());
    return s;
}

void CudeferAllocator::resetAccumulatedStats(c10::DeviceIndex device)
{
    check_device(device);
    sample_reserved(device);
    DeviceState &d = *devices_[device];
    for (AtomicStatArray *a : {&d.allocation, &d.allocated_bytes,
                               &d.requested_bytes, &d.pool_bytes,
                               &d.pool_segments})
        a->reset_accumulated();
    d.num_alloc_retries.store(0);
    d.num_ooms.store(0);
    d.pool_mallocs.store(0);
    d.pool_frees.store(0);
    d.device_alloc_base.store(sampled_mallocs(device));
    d.device_free_base.store(sampled_releases(device));
    d.reserved_base.store(reserved_of(device) -
                          d.pool_bytes.s[0].current.load());
}

// Resets cudefer's peaks of the device too (defer_device_stats_reset_peaks:
// cudefer.device_stats reads them), whose cache_bytes_peak the reserved
// peak comes from.  Any thread; takes the device's mutex.
void CudeferAllocator::resetPeakStats(c10::DeviceIndex device)
{
    check_device(device);
    DeviceState &d = *devices_[device];
    for (AtomicStatArray *a : {&d.allocation, &d.allocated_bytes,
                               &d.requested_bytes, &d.pool_bytes,
                               &d.pool_segments})
        a->reset_peak();
    // Its one error is for a device beyond cudefer's 64 (kMaxDevices).
    if (fns_.device_stats_reset_peaks != nullptr)
        (void)fns_.device_stats_reset_peaks(device);
    {
        std::lock_guard<std::mutex> lock(d.mu);
        d.pool_bytes_low.store(d.pool_bytes.s[0].current.load());
    }
    sample_reserved(device);
    d.reserved_peak.store(reserved_of(device));
}

// cudefer's blocks made and released on device, sampled: its own
// counts, else the process's while the device was used alone, else 0.
int64_t CudeferAllocator::sampled_mallocs(int device) const
{
    if (per_device())
        return devices_[device]->sample.cache_mallocs.load();
    return device_used_alone(device) ? sample_.cache_mallocs.load() : 0;
}

int64_t CudeferAllocator::sampled_releases(int device) const
{
    if (per_device())
        return devices_[device]->sample.cache_releases.load();
    return device_used_alone(device) ? sample_.cache_releases.load() : 0;
}

// words[i] of a counters struct into *to, for each index known (>= 0).
void CudeferAllocator::store_sample(CudeferSample &to,
                                    const uint64_t *words,
                                    int64_t bytes, int64_t bytes_peak,
                                    int64_t mallocs, int64_t releases)
{
    to.cache_bytes.store(static_cast<int64_t>(words[bytes]));
    if (bytes_peak >= 0)
        to.cache_bytes_peak.store(static_cast<int64_t>(words[bytes_peak]));
    if (mallocs >= 0)
        to.cache_mallocs.store(static_cast<int64_t>(words[mallocs]));
    if (releases >= 0)
        to.cache_releases.store(static_cast<int64_t>(words[releases]));
}

// Samples cudefer's counters of device (or the process's) and raises the
// device's reserved_peak to the reserved bytes now, and, with a library
// that counts cudefer's cache_bytes_peak of the device, to that peak
// plus the fewest bytes the private pools held since the last reset of
// the peaks: the reserved bytes were at least that when the cache
// peaked, however briefly, between samples.  Any thread; never blocks.
void CudeferAllocator::sample_reserved(int device)
{
    uint64_t words[kStatsWords] = {};
    DeviceState &d = *devices_[device];
    bool peak_known = false;
    if (per_device()) {
        if (fns_.device_stats_get_sized(device, words, sizeof words) ==
            cudaSuccess) {
            store_sample(d.sample, words, fns_.dstat_cache_bytes,
                         fns_.dstat_cache_bytes_peak,
                         fns_.dstat_cache_mallocs,
                         fns_.dstat_cache_releases);
            peak_known = fns_.dstat_cache_bytes_peak >= 0;
        }
    } else if (fns_.stats_get_sized != nullptr &&
               fns_.stat_cache_bytes >= 0) {
        fns_.stats_get_sized(words, sizeof words);
        store_sample(sample_, words, fns_.stat_cache_bytes, -1,
                     fns_.stat_cache_mallocs, fns_.stat_cache_releases);
    }
    int64_t now = reserved_of(device);
    if (peak_known)
        now = std::max(now, d.sample.cache_bytes_peak.load() +
                                d.pool_bytes_low.load());
    int64_t seen = d.reserved_peak.load(std::memory_order_relaxed);
    while (now > seen && !d.reserved_peak.compare_exchange_weak(seen, now))
        ;
}

// ---- snapshot -----------------------------------------------------------

// Any thread; takes each device's mutex and the table's shards in turn,
// then each device's trace lock (trace_snapshot, torch_history.cpp: the
// traces, the stacks of the live blocks' allocations).
CCA::SnapshotInfo CudeferAllocator::snapshot(MempoolId_t mempool_id,
                                             bool include_traces)
{
    CCA::SnapshotInfo info{};  // zeroes config_metadata's numbers
    bool all = mempool_id.first == 0 && mempool_id.second == 0;
    for (int dev = 0; dev < device_count_; dev++) {
        DeviceState &d = *devices_[dev];
        std::lock_guard<std::mutex> lock(d.mu);
        for (auto &p : d.pools) {
            if (!all && p.first != mempool_id)
                continue;
            for (auto &b : p.second->blocks)
                info.segments.push_back(segment_of(
                    dev, b->ptr, b->size, b->requested, b->stream,
                    b->allocated, p.first));
        }
    }
    if (all) {
        // cudefer's live blocks, each as a segment of its own (cudefer
        // does not say how its cache lays them out).
        for (auto &shard : shards_) {
            std::lock_guard<std::mutex> lock(shard.mu);
            for (auto &e : shard.map)
                if (e.second.block == nullptr)
                    info.segments.push_back(segment_of(
                        e.second.device, e.first, e.second.rounded,
                        e.second.requested, e.second.stream, true,
                        {0, 0}));
        }
    }
    // In PyTorch's order: device by device, each device's segments by
    // address (memory_viz and other readers of torch.cuda.memory._snapshot
    // lay segments out in the order given).
    std::sort(info.segments.begin(), info.segments.end(),
              [](const CCA::SegmentInfo &a, const CCA::SegmentInfo &b) {
                  return a.device != b.device ? a.device < b.device
                                              : a.address < b.address;
              });
    trace_snapshot(info, mempool_id, include_traces);
    info.config_metadata.max_split_size =
        c10::CachingAllocator::AcceleratorAllocatorConfig::
            max_split_size();
    info.config_metadata.last_allocator_settings = "cudefer";
    return info;
}

c10::cuda::CUDACachingAllocator::SegmentInfo
CudeferAllocator::segment_of(int device, void *ptr, size_t size,
                             size_t requested, cudaStream_t stream,
                             bool allocated, MempoolId_t pool)
{
    c10::CachingDeviceAllocator::SegmentInfo s;
    s.device = static_cast<c10::DeviceIndex>(device);
    s.address = reinterpret_cast<size_t>(ptr);
    s.total_size = size;
    s.requested_size = allocated ? requested : 0;
    s.allocated_size = allocated ? size : 0;
    s.active_size = s.allocated_size;
    s.stream = stream;
    s.is_large = size > kSmallSize;
    s.owner_private_pool_id = pool;
    c10::CachingDeviceAllocator::BlockInfo b;
    b.size = size;
    b.requested_size = allocated ? requested : 0;
    b.allocated = allocated;
    b.active = allocated;
    s.blocks.push_back(b);
    return s;
}

}  // namespace cudefer_torch
