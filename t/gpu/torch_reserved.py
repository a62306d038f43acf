# SPDX-License-Identifier: MIT
"""The reserved-memory parts of t/gpu/torch_full.py: a tensor freed while
a side stream still reads it (Tensor.record_stream), then an allocation
that needs its memory, and empty_cache; max_memory_reserved across a peak
no statistics call saw; reserved_bytes' accumulated count after
reset_accumulated_memory_stats.  What each process saw goes into its
results (reserved_parts), and check_reserved compares the two (check is
compare()'s, one PASS/FAIL line each)."""
import threading

MiB = 1 << 20
GiB = 1 << 30
# torch.cuda._sleep's cycles: about half a second at 1.7-2 GHz (an H100's
# or H200's clock), long enough for the caller to go on while it runs.
SLEEP_CYCLES = 1 << 30


def read_on_side(torch, side, x):
    """The least of x's bytes (a reduction with no temporary of x's size:
    x may fill most of the device), read on stream side once the current
    stream's work so far is done and side slept about half a second; x is
    recorded on side (Tensor.record_stream).  Returns at once, side still
    at work."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        total = x.min()
    x.record_stream(side)
    return total


def oom_while_read(torch, dev, side, res):
    """Three quarters of the device's free memory in one tensor of ones,
    read on the busy side stream and freed, then the same size again
    (zeros) on the default stream: it fits only in the first tensor's
    memory.  PyTorch's allocator waits for the side stream's read (its
    block's event) and hands that memory out; cudefer must wait too
    (defer_flush), not raise OutOfMemoryError.  The side stream must have
    read ones, not the new tensor's zeros."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    # A quarter (20 GiB and more on these GPUs) is left for the read's own
    # allocations and either allocator's rounding.
    size = free * 3 // 4 // (2 * MiB) * (2 * MiB)
    x = torch.ones(size, dtype=torch.uint8, device=dev)
    total = read_on_side(torch, side, x)
    del x
    busy = not side.query()
    try:
        y = torch.zeros(size, dtype=torch.uint8, device=dev)
        res["oom_while_read"] = ("allocated" if busy else
                                 "inconclusive (the side stream was done)")
        del y
    except torch.OutOfMemoryError as e:
        res["oom_while_read"] = "OutOfMemoryError: %s" % (
            str(e).splitlines() or [""])[0][:240]
    side.synchronize()
    read = total.item()
    res["oom_while_read_sum"] = ("right" if read == 1 else
                                 "a byte read as %d, not 1" % read)
    del total
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def empty_cache_while_read(torch, dev, side, res):
    """A 1 GiB tensor read on the busy side stream and freed, then
    empty_cache: memory_reserved must drop by at least 1 GiB, as PyTorch's
    allocator waits for the read (its block's event) before it releases
    its cache."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.ones(GiB, dtype=torch.uint8, device=dev)
    total = read_on_side(torch, side, x)
    del x
    busy = not side.query()
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    dropped = before - torch.cuda.memory_reserved()
    res["empty_cache_while_read"] = (
        dropped if busy else "inconclusive (the side stream was done)")
    side.synchronize()
    res["empty_cache_read_sum"] = total.item() == 1
    del total


def peak_between_reads(torch, dev, side, res):
    """Two 1 GiB blocks reserved at once, one tensor at a time allocated:
    the first tensor freed while the side stream reads it, the second
    allocated meanwhile, both gone before max_memory_reserved is read,
    which must count both (its peak less the reserved bytes at
    reset_peak_memory_stats: 2 GiB at least).  The second comes from a
    thread of its own: that thread's first allocation, which under
    cudefer takes no sample of cudefer's counters (every 64th of a
    thread does), so that only an exact peak shows it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    x = torch.ones(GiB, dtype=torch.uint8, device=dev)
    total = read_on_side(torch, side, x)
    del x
    second = []
    t = threading.Thread(target=lambda: second.append(
        torch.empty(GiB, dtype=torch.uint8, device=dev)))
    t.start()
    t.join()
    busy = not side.query()
    del second[:]
    side.synchronize()
    del total
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    grown = torch.cuda.max_memory_reserved() - base
    res["peak_between_reads"] = (
        grown if busy else "inconclusive (the side stream was done)")


def reserved_after_reset(torch, dev, res):
    """A 64 MiB tensor freed, reset_accumulated_memory_stats, then 64 MiB
    again (the first's block serves it under both allocators): nothing was
    reserved since the reset, so memory_stats' reserved_bytes.all.allocated
    and num_device_alloc must read as PyTorch's allocator's."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    del x
    torch.cuda.reset_accumulated_memory_stats()
    y = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    del y
    s = torch.cuda.memory_stats()
    res["reserved_after_reset"] = [s.get("reserved_bytes.all.allocated"),
                                   s.get("num_device_alloc")]


def reserved_parts(torch, dev, res):
    """Each part above, on a side stream of its own, into res."""
    side = torch.cuda.Stream()
    oom_while_read(torch, dev, side, res)
    empty_cache_while_read(torch, dev, side, res)
    peak_between_reads(torch, dev, side, res)
    reserved_after_reset(torch, dev, res)
    side.synchronize()


def check_reserved(native, mine, check):
    """The parts' checks, each under both allocators."""
    check("a tensor freed while a side stream reads it (record_stream): an "
          "allocation that needs its memory waits for the read, no "
          "OutOfMemoryError",
          mine.get("oom_while_read") == native.get("oom_while_read")
          == "allocated",
          "native %s, cudefer %s" % (native.get("oom_while_read"),
                                     mine.get("oom_while_read")))
    check("... and the side stream read the freed tensor's values",
          mine.get("oom_while_read_sum") == native.get("oom_while_read_sum")
          == "right",
          "native %s, cudefer %s" % (native.get("oom_while_read_sum"),
                                     mine.get("oom_while_read_sum")))

    def dropped(r):
        v = r.get("empty_cache_while_read")
        return isinstance(v, int) and v >= GiB and \
            r.get("empty_cache_read_sum") is True
    check("empty_cache while a freed 1 GiB tensor is read on a side stream "
          "(record_stream): memory_reserved drops by 1 GiB",
          dropped(native) and dropped(mine),
          "native %s, cudefer %s (bytes dropped)" % (
              native.get("empty_cache_while_read"),
              mine.get("empty_cache_while_read")))

    def counted(r):
        v = r.get("peak_between_reads")
        return isinstance(v, int) and v >= 2 * GiB
    check("max_memory_reserved counts two 1 GiB blocks reserved at once "
          "between two statistics calls",
          counted(native) and counted(mine),
          "native %s, cudefer %s (bytes above the reserved at the reset)" % (
              native.get("peak_between_reads"),
              mine.get("peak_between_reads")))
    check("after reset_accumulated_memory_stats: reserved_bytes.all."
          "allocated and num_device_alloc as under PyTorch's allocator",
          mine.get("reserved_after_reset") is not None
          and mine.get("reserved_after_reset")
          == native.get("reserved_after_reset"),
          "native %s, cudefer %s" % (native.get("reserved_after_reset"),
                                     mine.get("reserved_after_reset")))
