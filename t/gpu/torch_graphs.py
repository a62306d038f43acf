# SPDX-License-Identifier: MIT
"""The CUDA-graph parts of t/gpu/torch_full.py: the forward pass captured
with torch.cuda.graph and replayed, the model run through
torch.compile(mode="reduce-overhead"), and empty_cache while another
thread captures a graph; what each process saw goes into its results,
and the check_ functions compare the two (check is compare()'s, one
PASS/FAIL line each).  tensor_sha is also what the training loop's
losses are compared by."""
import hashlib
import threading


def tensor_sha(tensors):
    """sha256 of the tensors' values (as float32, in order): what "bit
    for bit identical" compares."""
    import torch
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to(torch.float32).cpu().reshape(-1)
                 .contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cuda_graphs(torch, dev, model, gen, res):
    """Capture and replay the forward pass, then run the model through
    torch.compile(mode="reduce-overhead"), putting outputs' hashes or the
    errors in res.  Returns what it leaves bound (inputs, outputs, the
    compiled model): the caller holds it to the end of its work, so what
    comes after starts from the memory these leave."""
    # CUDA graph: capture the forward pass on a side stream, replay it.
    model.eval()
    static_in = torch.randn(64, 1024, device=dev, generator=gen)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = model(static_in)
        res["graph_allocated"] = torch.cuda.memory_allocated()
        outs = []
        for _ in range(3):
            static_in.copy_(torch.randn(64, 1024, device=dev, generator=gen))
            graph.replay()
            outs.append(static_out.clone())
        torch.cuda.synchronize()
        res["graph_sha"] = tensor_sha(outs)
        del graph, static_out
        torch.cuda.empty_cache()
        res["after_graph_allocated"] = torch.cuda.memory_allocated()
    except Exception as e:  # noqa: BLE001 (reported, compared)
        res["graph_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])

    # torch.compile's CUDA graphs (graph trees, private pools, checkpoints).
    try:
        import triton  # noqa: F401
        compiled = torch.compile(model, mode="reduce-overhead")
        outs = []
        with torch.no_grad():
            for _ in range(6):
                inp = torch.randn(64, 1024, device=dev, generator=gen)
                outs.append(compiled(inp).clone())
        torch.cuda.synchronize()
        res["compile_sha"] = tensor_sha(outs)
    except ImportError:
        res["compile_skip"] = "no triton"
    except Exception as e:  # noqa: BLE001
        res["compile_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    return list(locals().values())


def blocking_stream(torch):
    """A blocking stream (cudaStreamCreate's, through the libcudart the
    process loaded) as a torch.cuda.ExternalStream, and a function that
    destroys it; None when no libcudart.so is among the process's
    libraries."""
    import ctypes
    path = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcudart.so" in line:
                path = line.split()[-1]
                break
    if path is None:
        return None
    rt = ctypes.CDLL(path)
    rt.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    rt.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    handle = ctypes.c_void_p()
    if rt.cudaStreamCreate(ctypes.byref(handle)) != 0:
        return None
    return (torch.cuda.ExternalStream(handle.value),
            lambda: rt.cudaStreamDestroy(handle))


def empty_cache_during_capture(torch, dev):
    """(what empty_cache did, what the capture did) when a tensor of the
    default stream is freed and empty_cache called while another thread
    captures a CUDA graph on a blocking stream; None when no blocking
    stream can be made."""
    made = blocking_stream(torch)
    if made is None:
        return None
    stream, destroy = made
    capturing, finish = threading.Event(), threading.Event()
    outcome = {}

    def capture():
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                y = torch.ones(1 << 20, device=dev) * 2
                capturing.set()
                finish.wait(60)
            del graph, y
            outcome["capture"] = "ok"
        except Exception as e:  # noqa: BLE001 (reported, compared)
            outcome["capture"] = "%s: %s" % (type(e).__name__, str(e)[:200])
        finally:
            capturing.set()

    x = torch.ones(1 << 20, device=dev)  # the default stream's
    torch.cuda.synchronize()
    thread = threading.Thread(target=capture)
    thread.start()
    capturing.wait(60)
    try:
        del x  # a free on the default stream during the capture
        torch.cuda.empty_cache()
        outcome["empty_cache"] = "ok"
    except Exception as e:  # noqa: BLE001
        outcome["empty_cache"] = "%s: %s" % (type(e).__name__, str(e)[:200])
    finish.set()
    thread.join()
    torch.cuda.synchronize()
    destroy()
    return [outcome.get("empty_cache"), outcome.get("capture")]


def check_graphs(native, mine, check):
    """The graph capture's and torch.compile's checks."""
    if "graph_error" in mine or "graph_error" in native:
        check("torch.cuda.graph capture and replay", False,
              "native: %s; cudefer: %s" % (native.get("graph_error", "ok"),
                                          mine.get("graph_error", "ok")))
    else:
        check("torch.cuda.graph capture and replay: identical outputs",
              native["graph_sha"] == mine["graph_sha"])
        check("memory_allocated identical after capture and after the graph",
              native["graph_allocated"] == mine["graph_allocated"] and
              native["after_graph_allocated"] == mine["after_graph_allocated"],
              "%s/%s vs %s/%s" % (native["graph_allocated"],
                                  native["after_graph_allocated"],
                                  mine["graph_allocated"],
                                  mine["after_graph_allocated"]))
    if "compile_skip" in native:
        print("SKIP torch.compile(mode='reduce-overhead'): %s"
              % native["compile_skip"])
    elif "compile_error" in mine or "compile_error" in native:
        check("torch.compile(mode='reduce-overhead')", False,
              "native: %s; cudefer: %s" % (native.get("compile_error", "ok"),
                                          mine.get("compile_error", "ok")))
    else:
        check("torch.compile(mode='reduce-overhead'): identical outputs",
              native["compile_sha"] == mine["compile_sha"])


def check_empty_cache_during_capture(native, mine, check):
    """empty_cache while another thread captures (skipped where the
    native run could make no blocking stream)."""
    if native.get("capture_empty_cache") is None:
        print("SKIP empty_cache during another thread's capture: no "
              "libcudart.so to make a blocking stream with")
    else:
        check("empty_cache while another thread captures a CUDA graph: no "
              "error, and the capture succeeds",
              mine.get("capture_empty_cache")
              == native["capture_empty_cache"] == ["ok", "ok"],
              "native %s, cudefer %s (empty_cache, capture)" % (
                  native["capture_empty_cache"],
                  mine.get("capture_empty_cache")))
