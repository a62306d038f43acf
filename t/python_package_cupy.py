# SPDX-License-Identifier: MIT
"""t/python_package.py's cases of cudefer.cupy with a fake cupy: without
CuPy, on its per-thread default stream, before enable(); and on the
library built with the fake CUDA runtime, an array that outlives its
stream, an out of memory with CuPy holding memory, an out of memory
while the memory is freed on a stream still at work, an allocation
during a CUDA-graph capture."""
import os

from python_package_fakes import fake_cupy, fake_runtime_library
from python_package_harness import LIB, py, raises, skip, tap


def cupy_cases(tmp):
    have_cupy = py("import cupy")[0] == 0
    ok, out = raises("import cudefer.cupy; cudefer.cupy.enable(%r)" % LIB,
                     "ImportError", ["cudefer.cupy: CuPy is not installed"])
    if have_cupy:
        skip("without cupy: ImportError naming CuPy", "cupy installed")
    else:
        tap(ok, "without cupy: ImportError naming CuPy", out)
    root = fake_cupy(os.path.join(tmp, "cupy0"))
    ok, out = raises("import cudefer.cupy; cudefer.cupy.enable(%r)" % LIB,
                     "RuntimeError", ["per-thread default stream"],
                     fakes=root,
                     env={"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"})
    tap(ok, "CuPy's per-thread default stream is refused", out)
    # CuPy reads the variable as an integer (int(value) != 0): a value it
    # reads as 0 leaves its default stream the legacy one, not refused.
    for value in ("00", " 0 "):
        rc, out = py("""
            import cupy, cudefer.cupy
            print("ENABLED", cudefer.cupy.enable(%r) is not None,
                  cupy.given == [cudefer.cupy.allocate])
            """ % LIB, fakes=root,
            env={"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": value})
        tap(rc == 0 and "ENABLED True True" in out,
            "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=%r, off for CuPy, is not "
            "refused" % value, out)
    rc, out = py("""
        import cupy, cudefer.cupy
        cudefer.cupy.enable(%r)
        assert cupy.given == [cudefer.cupy.allocate], cupy.given
        empty = cudefer.cupy.allocate(0)
        assert empty.ptr == 0
        try:
            p = cudefer.cupy.allocate(1 << 20)
        except RuntimeError as e:
            print("REFUSED", e)
        except MemoryError as e:
            print("OOM", e)
        else:
            print("ALLOCATED", p.ptr != 0)
        """ % LIB, fakes=root)
    tap(rc == 0 and ("REFUSED cudefer.cupy: allocating 1048576 bytes on "
                     "device 0 failed with CUDA error" in out
                     or "ALLOCATED True" in out),
        "cudefer.cupy: CuPy gets the allocator; a failing allocation names "
        "the size, device and CUDA error", out)
    root = fake_cupy(os.path.join(tmp, "cupy2"), stream=2)
    ok, out = raises("""
        import cudefer.cupy
        cudefer.cupy.enable(%r)
        cudefer.cupy.allocate(4096)
        """ % LIB, "RuntimeError", ["per-thread default stream",
                                    "cupy.cuda.Stream()"], fakes=root)
    tap(ok, "an allocation on cupy.cuda.Stream.ptds is refused", out)
    ok, out = raises("""
        import cupy, cudefer.cupy
        cupy.cuda.set_allocator(cudefer.cupy.allocate)
        cudefer.cupy.allocate(4096)
        """, "RuntimeError", ["cudefer.cupy:", "before enable()",
                              "cudefer.cupy.enable()"], fakes=root)
    tap(ok, "cudefer.cupy.allocate before enable() says to call enable()",
        out)

    fake, why = fake_runtime_library(tmp)
    root = fake_cupy(os.path.join(tmp, "cupy-fake"))
    name = ("cudefer.cupy: an array outlives its stream object; its free is "
            "on that stream, still alive")
    if fake is None:
        skip(name, why)
    else:
        rc, out = py("""
            import gc, cupy, cudefer, cudefer.cupy
            cudefer.cupy.enable(%r)
            with cupy.cuda.Stream():
                p = cudefer.cupy.allocate(1 << 20)
            gc.collect()
            del p
            s = cudefer.stats()
            print("REJECTED", s["rejected"], "FREE", s["cache_free_bytes"])
            """ % fake, fakes=root, env={"FAKE_CUDA_LIB": fake})
        tap(rc == 0 and "REJECTED 0 FREE 1048576" in out
            and "cudefer:" not in out, name, out)
    name = ("cudefer.cupy: out of memory, what CuPy holds is released "
            "(garbage cycles, its own pool's free blocks) before a retry")
    if fake is None:
        skip(name, why)
    else:
        rc, out = py("""
            import ctypes, gc, cupy, cudefer, cudefer.cupy
            runtime = ctypes.CDLL(%r)
            runtime.fake_set_device_memory.argtypes = [ctypes.c_int,
                                                       ctypes.c_size_t]
            runtime.fake_set_device_memory(0, 64 << 20)
            cudefer.cupy.enable(%r)
            gc.disable()
            cycle = [cudefer.cupy.allocate(48 << 20)]
            cycle.append(cycle)
            del cycle
            p = cudefer.cupy.allocate(48 << 20)
            print("ALLOCATED", p.ptr != 0, "POOL", len(cupy.pool_frees))
            try:
                cudefer.cupy.allocate(1 << 40)
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("OOM", e)
            """ % (fake, fake), fakes=root, env={"FAKE_CUDA_LIB": fake})
        tap(rc == 0 and "ALLOCATED True POOL 1" in out
            and "OOM Out of memory allocating 1099511627776 bytes" in out,
            name, out)

    # The device's memory all in one array freed on a stream whose work
    # on it still runs: that block serves no other stream until the work
    # is done, and cudefer's trim waits for no work.  The allocation on
    # the default stream must wait for it (defer_flush), not fail.
    name = ("cudefer.cupy: out of memory while a block is freed on a "
            "stream still at work, the allocation waits for that work")
    if fake is None:
        skip(name, why)
    else:
        rc, out = py("""
            import ctypes, cupy, cudefer, cudefer.cupy
            runtime = ctypes.CDLL(%r)
            runtime.fake_set_device_memory.argtypes = [ctypes.c_int,
                                                       ctypes.c_size_t]
            runtime.fake_launch.restype = ctypes.c_void_p
            runtime.fake_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint,
                                            ctypes.c_void_p, ctypes.c_size_t]
            runtime.fake_work_done.argtypes = [ctypes.c_void_p]
            runtime.fake_set_device_memory(0, 64 << 20)
            cudefer.cupy.enable(%r)
            side = cupy.cuda.Stream()
            with side:
                p = cudefer.cupy.allocate(48 << 20)
            uses = (ctypes.c_void_p * 1)(p.ptr)
            work = runtime.fake_launch(ctypes.c_void_p(side.ptr), 200000,
                                       uses, 1)
            del p
            try:
                q = cudefer.cupy.allocate(48 << 20)
                print("ALLOCATED", q.ptr != 0, "WORK DONE",
                      runtime.fake_work_done(work))
            except cupy.cuda.memory.OutOfMemoryError as e:
                print("OOM", e)
            """ % (fake, fake), fakes=root, env={"FAKE_CUDA_LIB": fake})
        tap(rc == 0 and "ALLOCATED True WORK DONE 1" in out
            and "cudefer:" not in out, name, out)

    name = ("cudefer.cupy: an allocation during a CUDA-graph capture is "
            "refused in words, the capture left intact")
    if fake is None:
        skip(name, why)
    else:
        rc, out = py("""
            import ctypes, cupy, cudefer.cupy
            runtime = ctypes.CDLL(%r)
            cudefer.cupy.enable(%r)
            with cupy.cuda.Stream() as s:
                assert runtime.cudaStreamBeginCapture(
                    ctypes.c_void_p(s.ptr), 0) == 0
                try:
                    cudefer.cupy.allocate(1 << 20)
                except RuntimeError as e:
                    print("REFUSED", e)
                graph = ctypes.c_void_p()
                print("ENDED", runtime.cudaStreamEndCapture(
                    ctypes.c_void_p(s.ptr), ctypes.byref(graph)))
            """ % (fake, fake), fakes=root, env={"FAKE_CUDA_LIB": fake})
        tap(rc == 0 and "REFUSED cudefer.cupy: allocating 1048576 bytes on "
            "a stream being captured into a CUDA graph is not supported: "
            "allocate before the capture" in out and "ENDED 0" in out,
            name, out)
