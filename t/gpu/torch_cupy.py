#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_cupy.py: PyTorch and CuPy in one process on one cudefer pool.

    python3 t/gpu/torch_cupy.py [--lib PATH]

Runs the same program twice, each in its own process: once with each
library's own allocator (PyTorch's caching allocator, CuPy's memory pool),
once with cudefer.torch.enable() and cudefer.cupy.enable().  The program
hands arrays from PyTorch to CuPy and back through DLPack (no copy), and in
three rounds has PyTorch, then CuPy, use a 1 GiB temporary and free it.
Checks, one PASS/FAIL line each (exit 1 if any failed, 77 without torch,
cupy or a device):
  - the results are identical bit for bit;
  - DLPack shares memory both ways (the same address);
  - a CuPy array that outlives its cupy.cuda.Stream object is freed;
  - under cudefer the process's peak device memory (cudaMemGetInfo) above
    what is live (measured with every cache emptied) is at most the larger
    of the two libraries' own peaks above the same point in the native run
    (PyTorch's: max_memory_reserved; CuPy's: its pool's largest total),
    plus 5 % and 64 MiB for rounding; the native run's process peak, two
    pools, is printed for reference.  (PyTorch's temporary costs it three
    times its size: sum(dtype=float64) makes a double copy; CuPy's
    reduction casts as it reads.)
  - with two GPUs that reach each other, a CuPy kernel on GPU 1 reading an
    array of GPU 0 gives the same result under both (cudefer's after
    cudefer.peer_access(0, 1)).
"""
import gc
import hashlib
import json
import os
import sys

import side_by_side

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))

MiB = 1 << 20
TEMP = 1 << 30           # each library's temporary
LIVE_ELEMS = 32 * MiB    # float32 elements of each long-lived array (128 MiB)


def run(mode, lib, out_path):
    import torch
    import cupy
    res = {"mode": mode}
    if mode == "cudefer":
        import cudefer
        import cudefer.torch
        import cudefer.cupy
        res["library"] = cudefer.torch.enable(lib)
        cudefer.cupy.enable(lib)
    dev = torch.device("cuda")

    def used():
        free, total = torch.cuda.mem_get_info()
        return total - free

    # Warm-up: contexts, kernels, cuBLAS, CuPy's elementwise compilation.
    w = torch.ones(1024, device=dev) * 2
    c = cupy.ones(1024, dtype=cupy.float32) * 2
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    del w, c
    peak = 0

    gen = torch.Generator(device=dev).manual_seed(3)
    a = torch.rand(LIVE_ELEMS, device=dev, generator=gen)
    # PyTorch -> CuPy: the same memory.
    a_cp = cupy.from_dlpack(a)
    res["dlpack_torch_to_cupy_same"] = int(a_cp.data.ptr) == a.data_ptr()
    b_cp = cupy.sqrt(a_cp * 3 + 1)
    # CuPy -> PyTorch.
    b = torch.from_dlpack(b_cp)
    res["dlpack_cupy_to_torch_same"] = b.data_ptr() == int(b_cp.data.ptr)
    acc_t = torch.zeros(1, device=dev, dtype=torch.float64)
    acc_c = cupy.zeros(1, dtype=cupy.float64)
    # The baseline: what is live now, every cache emptied.
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    torch.cuda.empty_cache()
    if mode == "cudefer":
        cudefer.trim()
    else:
        cupy.get_default_memory_pool().free_all_blocks()
    base = used()
    torch.cuda.reset_peak_memory_stats()
    torch_base = torch.cuda.memory_reserved()
    pool = cupy.get_default_memory_pool()
    cupy_base = pool.total_bytes()
    cupy_peak = 0
    for r in range(3):
        t = torch.empty(TEMP // 4, device=dev).uniform_(generator=gen)
        acc_t += t.sum(dtype=torch.float64) + b.sum(dtype=torch.float64)
        torch.cuda.synchronize()
        peak = max(peak, used() - base)
        del t
        cp = cupy.arange(TEMP // 4, dtype=cupy.float32)
        cp *= r + 1
        acc_c += cp.sum(dtype=cupy.float64) + b_cp.sum(dtype=cupy.float64)
        cupy.cuda.Device().synchronize()
        peak = max(peak, used() - base)
        cupy_peak = max(cupy_peak, pool.total_bytes() - cupy_base)
        del cp
        # The streams differ (PyTorch's and CuPy's current); the frees above
        # were on each one's own stream: order the next round after both.
        torch.cuda.synchronize()
        cupy.cuda.Device().synchronize()
    if mode == "cudefer":
        # An array that outlives the cupy.cuda.Stream it was allocated on
        # (CuPy destroys the stream when the object goes): its free is
        # still accepted.
        rejected = cudefer.stats()["rejected"]
        with cupy.cuda.Stream():
            kept = cupy.ones(MiB, dtype=cupy.float32)
        gc.collect()
        del kept
        cupy.cuda.Device().synchronize()
        res["freed_after_stream"] = cudefer.stats()["rejected"] == rejected
    # Two GPUs: a CuPy kernel on GPU 1 reads an array of GPU 0 (CuPy turns
    # peer access on); under cudefer the array's pool is opened to GPU 1
    # first (cudefer.peer_access), which peer access does not reach.
    if (cupy.cuda.runtime.getDeviceCount() > 1 and
            cupy.cuda.runtime.deviceCanAccessPeer(1, 0)):
        import numpy
        with cupy.cuda.Device(0):
            on0 = cupy.arange(MiB, dtype=cupy.float32) % 1024
            cupy.cuda.Device().synchronize()
        if mode == "cudefer":
            cudefer.peer_access(0, 1)
        try:
            with cupy.cuda.Device(1):
                doubled = on0 * 2
                cupy.cuda.Device().synchronize()
            want = (numpy.arange(MiB, dtype=numpy.float32) % 1024) * 2
            res["peer_kernel"] = ("identical" if numpy.array_equal(
                cupy.asnumpy(doubled), want) else "differs")
            del doubled
        except Exception as e:  # noqa: BLE001 (compared)
            res["peer_kernel"] = "%s: %s" % (type(e).__name__, str(e)[:200])
        del on0
    h = hashlib.sha256()
    h.update(b.cpu().numpy().tobytes())
    h.update(acc_t.cpu().numpy().tobytes())
    h.update(cupy.asnumpy(acc_c).tobytes())
    res.update(sha=h.hexdigest(), peak=peak, cupy_peak=cupy_peak,
               torch_peak=torch.cuda.max_memory_reserved() - torch_base)
    with open(out_path, "w") as f:
        json.dump(res, f)


def compare(native, mine):
    """PASS/FAIL lines; returns the number of failures."""
    checks = side_by_side.Checks()
    check = checks.check

    check("PyTorch and CuPy on one cudefer pool: results identical to each "
          "library's own allocator", native["sha"] == mine["sha"])
    check("DLPack shares memory PyTorch -> CuPy and CuPy -> PyTorch",
          mine["dlpack_torch_to_cupy_same"] and
          mine["dlpack_cupy_to_torch_same"])
    check("a CuPy array freed after its stream object went is freed, not "
          "refused", mine.get("freed_after_stream") is True)
    if "peer_kernel" in native:
        check("a CuPy kernel on GPU 1 reads an array of GPU 0 (peer access; "
              "under cudefer after cudefer.peer_access(0, 1))",
              mine.get("peer_kernel") == native["peer_kernel"] ==
              "identical", "native %s, cudefer %s" % (
                  native["peer_kernel"], mine.get("peer_kernel")))
    else:
        print("SKIP a CuPy kernel on GPU 1 reading an array of GPU 0: one "
              "GPU, or no peer access")
    # Above what is live (the baseline): the larger library's own peak,
    # 5 % and 64 MiB for rounding.
    larger = max(native["torch_peak"], native["cupy_peak"])
    bound = larger * 1.05 + 64 * MiB
    check("one pool: peak at most the larger library's peak plus what is "
          "live", larger >= TEMP and mine["peak"] <= bound,
          "cudefer %d MiB, bound %d MiB (PyTorch's own peak %d MiB, CuPy's "
          "%d MiB); two pools %d MiB" % (
              mine["peak"] // MiB, bound // MiB, native["torch_peak"] // MiB,
              native["cupy_peak"] // MiB, native["peak"] // MiB))
    return checks.failures


def main():
    return side_by_side.main(
        __file__, lambda mode, args: run(mode, args.lib, args.out), compare,
        needs=("cupy",))


if __name__ == "__main__":
    sys.exit(main())
