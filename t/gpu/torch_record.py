# SPDX-License-Identifier: MIT
"""The record_stream and CUDA-graph parts of t/gpu/torch_full.py: a use
recorded on the tensor's own stream (none to wait for: its memory serves
that stream's next request at once); a use recorded on a stream being
captured, for a tensor allocated outside the graph's pool (no error); a
tensor other streams used, freed while a stream that used it is captured
(its memory given back once the capture is over, at empty_cache); a
private pool's growth released before any statistics call
(max_memory_reserved counts it).  What each process saw goes into its
results (record_parts), and check_record compares the two (check is
compare()'s, one PASS/FAIL line each)."""

MiB = 1 << 20
# torch.cuda._sleep's cycles: about half a second at 1.7-2 GHz (an H100's
# or H200's clock), long enough for the caller to go on while it runs.
SLEEP_CYCLES = 1 << 30


def own_stream_use(torch, dev, res):
    """A tensor allocated on a busy stream, recorded on that very stream,
    freed, then the same size again there: PyTorch's allocator ignores a
    use on the allocation's own stream, so the second tensor gets the
    first one's memory at once."""
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x = torch.empty(4 * MiB, dtype=torch.uint8, device=dev)
        first = x.data_ptr()
        x.record_stream(s)
        del x
        y = torch.empty(4 * MiB, dtype=torch.uint8, device=dev)
        same = y.data_ptr() == first
        busy = not s.query()
        del y
    res["own_stream_use"] = (("the same memory" if same else
                              "other memory") if busy else
                             "inconclusive (the stream was done)")
    s.synchronize()


def use_recorded_in_capture(torch, dev, res):
    """A tensor allocated outside any graph, recorded on the stream that
    captures a graph using it: no error, as under PyTorch's allocator."""
    torch.cuda.synchronize()
    x = torch.ones(MiB, dtype=torch.uint8, device=dev)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            y = x + 1
            x.record_stream(torch.cuda.current_stream())
        g.replay()
        torch.cuda.synchronize()
        res["use_recorded_in_capture"] = (
            "no error" if int(y.min().item()) == 2 else "wrong values")
        del y
    except RuntimeError as e:
        res["use_recorded_in_capture"] = "RuntimeError: %s" % (
            str(e).splitlines() or [""])[0][:200]
    del g, x
    torch.cuda.synchronize()


def freed_in_capture(torch, dev, res):
    """A 256 MiB tensor recorded on a side stream, freed while that
    stream captures a graph: once the graph is gone, empty_cache gives
    its memory back (reserved back to where it was)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    side = torch.cuda.Stream()
    x = torch.ones(256 * MiB, dtype=torch.uint8, device=dev)
    x.record_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        y = torch.ones(1, device=dev)
        del x
    del g, y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    res["freed_in_capture"] = torch.cuda.memory_reserved() - base


def pool_peak(torch, dev, res):
    """A graph's pool grows by a 100 MiB and a 140 MiB block (the first
    freed before the second, too large for its memory, is allocated),
    then the graph goes and empty_cache releases the pool, all before any
    statistics call: max_memory_reserved counts the pool's 240 MiB."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        a = torch.empty(100 * MiB, dtype=torch.uint8, device=dev)
        del a
        b = torch.empty(140 * MiB, dtype=torch.uint8, device=dev)
    del b, g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    res["pool_peak"] = torch.cuda.max_memory_reserved() - base


def record_parts(torch, dev, res):
    """Each part above, into res."""
    own_stream_use(torch, dev, res)
    use_recorded_in_capture(torch, dev, res)
    freed_in_capture(torch, dev, res)
    pool_peak(torch, dev, res)


def check_record(native, mine, check):
    """The parts' checks, each under both allocators."""
    check("record_stream on the tensor's own stream: its memory serves that "
          "stream's next request at once",
          mine.get("own_stream_use") == native.get("own_stream_use")
          == "the same memory",
          "native %s, cudefer %s" % (native.get("own_stream_use"),
                                     mine.get("own_stream_use")))
    check("record_stream on a stream being captured, of a tensor allocated "
          "outside the graph: no error",
          mine.get("use_recorded_in_capture")
          == native.get("use_recorded_in_capture") == "no error",
          "native %s, cudefer %s" % (native.get("use_recorded_in_capture"),
                                     mine.get("use_recorded_in_capture")))

    def given_back(r):
        v = r.get("freed_in_capture")
        return isinstance(v, int) and v < 256 * MiB
    check("a tensor recorded on a side stream, freed while that stream "
          "captures: empty_cache gives its 256 MiB back once the graph is "
          "gone",
          given_back(native) and given_back(mine),
          "native %s, cudefer %s (bytes reserved above the start)" % (
              native.get("freed_in_capture"), mine.get("freed_in_capture")))

    def counted(r):
        v = r.get("pool_peak")
        return isinstance(v, int) and v >= 240 * MiB
    check("max_memory_reserved counts a graph pool's 240 MiB released "
          "before any statistics call",
          counted(native) and counted(mine),
          "native %s, cudefer %s (bytes above the reserved at the reset)" % (
              native.get("pool_peak"), mine.get("pool_peak")))
