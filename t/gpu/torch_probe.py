# SPDX-License-Identifier: MIT
"""The CUDA allocator calls PyTorch's Python API does not reach
(getBaseAllocation, getPoolUseCount, releasePool), for t/gpu/torch_full.py:
torch_probe.cpp beside this file, compiled with cpp_extension and loaded
with ctypes; each call made under whichever allocator is PyTorch's."""
import ctypes
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def allocator_probe(torch):
    """t/gpu/torch_probe.cpp (the allocator calls PyTorch's Python API does
    not reach) compiled with cpp_extension, which caches it, and loaded
    with ctypes; a string saying why not when it cannot be built."""
    try:
        from torch.utils import cpp_extension
        import cudefer.torch as ct
        include = ct._cuda_include_dir(cpp_extension)
        if include is None:
            return "no CUDA runtime headers"
        saved = os.environ.get("CXX")
        os.environ["CXX"] = ct.compilers()[0]
        try:
            path = cpp_extension.load(
                name="cudefer_probe_" + re.sub(r"\W", "_", torch.__version__),
                sources=[os.path.join(HERE, "torch_probe.cpp")],
                extra_include_paths=[include],
                extra_ldflags=["-lc10_cuda", "-lc10"],
                with_cuda=False, is_python_module=False)
        finally:
            if saved is None:
                del os.environ["CXX"]
            else:
                os.environ["CXX"] = saved
        probe = ctypes.CDLL(path)
    except Exception as e:  # noqa: BLE001 (reported)
        return "%s: %s" % (type(e).__name__,
                           (str(e).strip().splitlines() or [""])[0][:200])
    error = [ctypes.c_char_p, ctypes.c_size_t]
    probe.probe_base_allocation.argtypes = [
        ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_uint64)] + error
    pool = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    probe.probe_pool_use_count.argtypes = pool + [
        ctypes.POINTER(ctypes.c_int)] + error
    probe.probe_release_pool.argtypes = pool + error
    return probe


def probe_call(function, *args):
    """function(*args, error, size) of the probe: None when it returned 0,
    else its error ("c10::Error: message")."""
    error = ctypes.create_string_buffer(512)
    if function(*args, error, ctypes.sizeof(error)) == 0:
        return None
    return error.value.decode(errors="replace")


def base_allocation(probe, ptr):
    """getBaseAllocation(ptr): (base, size), or the error it raised."""
    base, size = ctypes.c_size_t(), ctypes.c_uint64()
    failed = probe_call(probe.probe_base_allocation, ptr, ctypes.byref(base),
                        ctypes.byref(size))
    return failed or (base.value, size.value)


def pool_use_count(probe, device, pool):
    """getPoolUseCount(device, pool): the count, or the error it raised."""
    count = ctypes.c_int()
    failed = probe_call(probe.probe_pool_use_count, device, pool[0], pool[1],
                        ctypes.byref(count))
    return failed or count.value
