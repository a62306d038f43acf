# SPDX-License-Identifier: MIT
"""cudefer as CuPy's device memory allocator.

    import cudefer.cupy
    cudefer.cupy.enable()           # CuPy's arrays now come from cudefer

enable() makes cudefer CuPy's allocator (cupy.cuda.set_allocator): each
allocation is defer_pluggable_alloc_status on CuPy's current device and
stream, held by a cupy.cuda.UnownedMemory whose owner frees it with
defer_pluggable_free on the stream it was allocated on, once CuPy drops it.
With cudefer.torch.enable() too, PyTorch and CuPy share one pool: memory
one of them frees is reused by the other (DLPack exchanges in both
directions need no copy, and a tensor imported from the other library is
freed by its owner only).

Limit: CuPy's per-thread default stream (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM,
cupy.cuda.Stream.ptds) is refused: a finalizer may run on another thread,
whose per-thread stream is another stream.
Limit: a cupy.cuda.ExternalStream (its stream is the user's to destroy) must
outlive the arrays allocated on it.
Limit: an allocation on a stream being captured into a CUDA graph
(cupy.cuda.Stream.begin_capture) is refused (RuntimeError): allocate
before the capture.
Limit: a kernel of another GPU that uses an array of cudefer's (CuPy's
peer access) needs cudefer.peer_access(array's device, kernel's device)
first: the memory comes from a pool of cudefer's, which peer access does
not reach.
Limit: a CuPy array used on a stream other than its allocation stream must
be freed only once that stream's work is ordered before the allocation
stream (as with CuPy's own pool, which also reuses per stream).
"""

import ctypes
import gc
import os
import threading

from . import load, library, device_stats

__all__ = ["enable", "enabled", "allocate"]

_lock = threading.Lock()
_state = {}

# cudaStreamPerThread's handle.
_PER_THREAD_STREAM = 2
# cudaErrorMemoryAllocation.
_OUT_OF_MEMORY = 2
# cudaErrorStreamCaptureUnsupported: the stream is being captured.
_CAPTURING = 900


class _Block:
    """The owner of one allocation: frees it, on its allocation stream and
    device, when CuPy drops the last reference (any thread).  It holds the
    cupy.cuda.Stream too: CuPy destroys a stream when its object goes, and
    the free must find the stream alive."""
    __slots__ = ("ptr", "size", "device", "stream", "free")

    def __init__(self, ptr, size, device, stream, free):
        self.ptr = ptr
        self.size = size
        self.device = device
        self.stream = stream
        self.free = free

    def __del__(self):
        try:
            self.free(self.ptr, self.size, self.device, self.stream.ptr)
        except Exception:  # interpreter teardown: nothing left to call
            pass


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError("cudefer.cupy: CuPy is not installed "
                          "(import cupy: %s)" % e) from None
    return cupy


def allocate(size):
    """A cupy.cuda.MemoryPointer to size bytes from cudefer on CuPy's
    current device and stream: the function enable() hands CuPy.  Out of
    memory, it collects garbage (gc.collect) and empties CuPy's own pool
    on the device (free_all_blocks), as CuPy's pool does, waits for the
    frees cudefer defers to complete (defer_flush: a block freed while
    its stream's work runs serves no other stream until then, and
    cudefer's own retry waits for no work), and tries once more; it
    blocks for those.  Raises cupy.cuda.memory.OutOfMemoryError
    when cudefer has no memory even then (its "allocated so far": the
    bytes of cudefer's blocks handed out on the device, PyTorch's too),
    RuntimeError before enable(),
    on a capturing stream, for another CUDA error or on the per-thread
    default stream."""
    cupy = _import_cupy()
    try:
        alloc, free, flush = _state["alloc"], _state["free"], _state["flush"]
    except KeyError:
        raise RuntimeError("cudefer.cupy: allocate() before enable(): call "
                           "cudefer.cupy.enable() first") from None
    device = cupy.cuda.runtime.getDevice()
    if size == 0:
        return cupy.cuda.MemoryPointer(
            cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    stream = cupy.cuda.get_current_stream()
    if stream.ptr == _PER_THREAD_STREAM:
        raise RuntimeError("cudefer.cupy: CuPy's per-thread default stream "
                           "is not supported; use cupy.cuda.Stream()")
    ptr = ctypes.c_void_p()
    err = alloc(ctypes.byref(ptr), size, device, stream.ptr)
    if err == _OUT_OF_MEMORY:
        # As CuPy's own pool does: free what only garbage cycles still
        # hold, and the free blocks CuPy's pool kept, then try once more,
        # once those frees and the earlier ones are back in cudefer's
        # cache (a block whose work still runs cannot serve this stream).
        # The flush's error is not raised: the retry's is (a device's
        # sticky error comes back there).
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()
        flush()
        err = alloc(ctypes.byref(ptr), size, device, stream.ptr)
    if err == _OUT_OF_MEMORY:
        raise cupy.cuda.memory.OutOfMemoryError(size, _live_bytes(device))
    if err == _CAPTURING:
        raise RuntimeError("cudefer.cupy: allocating %d bytes on a stream "
                           "being captured into a CUDA graph is not "
                           "supported: allocate before the capture" % size)
    if err != 0:
        raise RuntimeError("cudefer.cupy: allocating %d bytes on device %d "
                           "failed with CUDA error %d (cudefer's line on "
                           "stderr says more)" % (size, device, err))
    owner = _Block(ptr.value, size, device, stream, free)
    mem = cupy.cuda.UnownedMemory(ptr.value, size, owner, device)
    return cupy.cuda.MemoryPointer(mem, 0)


def _live_bytes(device):
    """The bytes of cudefer's blocks handed out on device (PyTorch's
    too), for an out of memory's "allocated so far"; 0 where the library
    does not count them per device."""
    try:
        return device_stats(device)["live_bytes"]
    except (RuntimeError, ValueError, KeyError):
        return 0


def _ptds_value(value):
    """Whether CuPy takes value of CUPY_CUDA_PER_THREAD_DEFAULT_STREAM as
    its per-thread default stream: an integer other than 0, as CuPy reads
    it (int(value) != 0; "00" and " 0" are 0).  A value CuPy cannot read
    fails its import; here it is not refused (allocate() refuses the
    per-thread stream itself)."""
    try:
        return int(value) != 0
    except ValueError:
        return False


def enable(lib=None):
    """Make cudefer CuPy's allocator; return the library's path.  lib: as
    cudefer.load's.  Call before CuPy allocates what should come from
    cudefer (arrays allocated before stay CuPy's pool's).  A second call
    returns at once.  Raises ImportError without CuPy, RuntimeError under
    CuPy's per-thread default stream."""
    with _lock:
        if _state:
            load(lib)
            return _state["library"]
        cupy = _import_cupy()
        value = os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0")
        if _ptds_value(value):
            raise RuntimeError("cudefer.cupy: CuPy's per-thread default "
                               "stream (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="
                               "%s) is not supported" % value.strip())
        handle = load(lib)
        alloc = handle.defer_pluggable_alloc_status
        alloc.restype = ctypes.c_int
        alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                          ctypes.c_int, ctypes.c_void_p]
        free = handle.defer_pluggable_free
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]
        flush = handle.defer_flush
        flush.restype = ctypes.c_int
        flush.argtypes = []
        _state.update(library=library(), alloc=alloc, free=free, flush=flush)
        try:
            cupy.cuda.set_allocator(allocate)
        except Exception:
            _state.clear()
            raise
        return _state["library"]


def enabled():
    """The path of the library enable() installed, or None."""
    return _state.get("library")
