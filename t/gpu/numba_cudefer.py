#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""numba_cudefer.py: cudefer as Numba's CUDA memory manager on a GPU.

    python3 t/gpu/numba_cudefer.py [--lib PATH]

Runs the same program twice, each in its own process: once with Numba's
own memory manager, once with cudefer.numba.enable().  The program runs a
@cuda.jit kernel (out = a * x + y) on arrays from cuda.to_device and
cuda.device_array_like, four rounds that free and allocate the same sizes
again, then one round on a cuda.stream(), and asks for more memory than
the device has.  Checks, one PASS/FAIL line each (exit 1 if any failed, 77
without numba or a device):
  - under cudefer.numba Numba's context uses cudefer's manager;
  - the results are identical bit for bit to Numba's own manager's;
  - cudefer served the allocations: its live bytes on the device cover the
    round's three arrays while they live, and the later rounds reused the
    blocks the earlier ones freed (cudefer.stats()["reused"] grew);
  - more memory than the device has is Numba's CudaAPIError with the
    driver's out-of-memory code, under both managers;
  - get_memory_info() is the device's (free, total) and an IPC handle is
    refused naming cudefer;
  - the manager's reset() (cuda.close()) leaves no free block in cudefer's
    cache on the device.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))

N = 1 << 22            # float32 elements of each array (16 MiB)
ROUNDS = 4


def _describe(e):
    return "%s: %s" % (type(e).__name__, e)


def _out_of_memory_code(driver):
    """CUDA_ERROR_OUT_OF_MEMORY as Numba's driver binding spells it: the
    CUDA Python binding's CUresult (USE_NV_BINDING where Numba has both
    bindings, numba-cuda has only that one), else the ctypes enum."""
    if getattr(driver, "USE_NV_BINDING", hasattr(driver, "binding")):
        return driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    from numba.cuda.cudadrv import enums
    return enums.CUDA_ERROR_OUT_OF_MEMORY


def run(mode, lib, out_path):
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv import driver
    res = {"mode": mode}
    if mode == "cudefer":
        import cudefer
        import cudefer.numba
        res["library"] = cudefer.numba.enable(lib)
    ctx = cuda.current_context()
    dev = int(ctx.device.id)
    res["manager"] = type(ctx.memory_manager).__name__

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    rng = np.random.default_rng(7)
    x = rng.random(N, dtype=np.float32)
    y = rng.random(N, dtype=np.float32)
    threads = 256
    blocks = (N + threads - 1) // threads
    h = hashlib.sha256()
    if mode == "cudefer":
        before = cudefer.stats()
    for r in range(ROUNDS):
        dx = cuda.to_device(x)
        dy = cuda.to_device(y)
        dout = cuda.device_array_like(x)
        axpy[blocks, threads](np.float32(r + 1), dx, dy, dout)
        h.update(dout.copy_to_host().tobytes())
        if mode == "cudefer" and r == 0:
            res["live_bytes"] = cudefer.device_stats(dev)["live_bytes"]
        # Freed to the manager here; the next round asks for the same sizes.
        del dx, dy, dout
    s = cuda.stream()
    dx = cuda.to_device(x, stream=s)
    dy = cuda.to_device(y, stream=s)
    dout = cuda.device_array(N, dtype=np.float32, stream=s)
    axpy[blocks, threads, s](np.float32(0.5), dx, dy, dout)
    host = dout.copy_to_host(stream=s)
    s.synchronize()
    h.update(host.tobytes())
    if mode == "cudefer":
        try:
            ctx.get_ipc_handle(dx.gpu_data)
            res["ipc"] = "no error"
        except Exception as e:
            res["ipc"] = _describe(e)
    del dx, dy, dout
    res["sha"] = h.hexdigest()
    if mode == "cudefer":
        after = cudefer.stats()
        res["reused"] = after["reused"] - before["reused"]

    free, total = ctx.get_memory_info()
    res["memory_info"] = [int(free), int(total)]
    try:
        huge = cuda.device_array(2 * int(total), dtype=np.uint8)
        res["oom"] = "allocated %d bytes" % huge.nbytes
        del huge
    except driver.CudaAPIError as e:
        res["oom"] = "CudaAPIError " + str(e)
        res["oom_is_oom"] = e.code == _out_of_memory_code(driver)
    except Exception as e:
        res["oom"] = _describe(e)

    if mode == "cudefer":
        cuda.synchronize()
        try:
            res["cache_free_before_reset"] = \
                cudefer.device_stats(dev)["cache_free_bytes"]
            ctx.memory_manager.reset()
            res["cache_free_after_reset"] = \
                cudefer.device_stats(dev)["cache_free_bytes"]
        except Exception as e:
            res["reset"] = _describe(e)
    with open(out_path, "w") as f:
        json.dump(res, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib")
    p.add_argument("--run", choices=["native", "cudefer"],
                   help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        run(args.run, args.lib, args.out)
        return 0
    try:
        import numpy  # noqa: F401
        from numba import cuda
    except ImportError as e:
        print("SKIP numba: %s" % e)
        return 77
    try:
        available = cuda.is_available()
    except Exception as e:
        print("SKIP numba.cuda: %s" % _describe(e))
        return 77
    if not available:
        print("SKIP numba.cuda sees no CUDA device")
        return 77
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("native", "cudefer"):
            out = os.path.join(tmp, mode + ".json")
            cmd = [sys.executable, os.path.abspath(__file__), "--run", mode,
                   "--out", out] + (["--lib", args.lib] if args.lib else [])
            proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0 or not os.path.exists(out):
                print("FAIL Numba with %s memory manager: exit status %d"
                      % ("its own" if mode == "native" else "cudefer's",
                         proc.returncode))
                print("\n".join("  " + line for line in
                                proc.stdout.splitlines()[-30:]))
                return 1
            if proc.stdout.strip():
                print("\n".join("  %s: %s" % (mode, line) for line in
                                proc.stdout.splitlines()[-10:]))
            with open(out) as f:
                results[mode] = json.load(f)
    native, mine = results["native"], results["cudefer"]
    failures = 0

    def check(name, ok, detail=""):
        nonlocal failures
        print("%s %s%s" % ("PASS" if ok else "FAIL", name,
                           ": " + detail if detail else ""), flush=True)
        failures += 0 if ok else 1

    check("cudefer.numba.enable(): Numba's context uses cudefer's manager",
          mine["manager"] == "CudeferMemoryManager",
          "manager %s (Numba's own: %s), library %s" % (
              mine["manager"], native["manager"], mine.get("library")))
    check("a @cuda.jit kernel on cudefer's memory: results identical to "
          "Numba's own manager's", native["sha"] == mine["sha"])
    live = mine.get("live_bytes", 0)
    check("cudefer served Numba's arrays: its live bytes on the device cover "
          "one round's three arrays", live >= 3 * N * 4,
          "live %d bytes, arrays %d bytes" % (live, 3 * N * 4))
    check("freed arrays come back: later rounds reused cudefer's blocks",
          mine.get("reused", 0) > 0,
          "stats()['reused'] grew by %d" % mine.get("reused", 0))
    for res in (native, mine):
        check("more memory than the device has: CudaAPIError with the "
              "out-of-memory code (%s manager)" % res["mode"],
              res["oom"].startswith("CudaAPIError ")
              and res.get("oom_is_oom") is True, res["oom"])
    free, total = mine["memory_info"]
    check("get_memory_info() under cudefer: the device's (free, total)",
          0 < free <= total and total == native["memory_info"][1],
          "free %d, total %d (Numba's own manager: total %d)"
          % (free, total, native["memory_info"][1]))
    check("an IPC handle of cudefer's memory is refused naming cudefer",
          mine["ipc"].startswith("RuntimeError: cudefer.numba:"),
          mine["ipc"])
    check("the manager's reset() leaves no free block in cudefer's cache",
          "reset" not in mine and mine.get("cache_free_after_reset") == 0,
          mine.get("reset") or "free cached bytes %s before reset, %s after"
          % (mine.get("cache_free_before_reset"),
             mine.get("cache_free_after_reset")))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
