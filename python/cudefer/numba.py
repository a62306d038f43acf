# SPDX-License-Identifier: MIT
"""cudefer as Numba's CUDA memory manager (an EMM plugin).

    import cudefer.numba
    cudefer.numba.enable()          # before Numba first uses the GPU

or, without a line of code, NUMBA_CUDA_MEMORY_MANAGER=cudefer.numba (the
library is then found as cudefer.load() finds it).

enable() hands Numba a memory manager class (numba.cuda.set_memory_manager)
built on numba.cuda.HostOnlyCUDAMemoryManager: each device allocation of
Numba (cuda.device_array, cuda.to_device, ...) is
defer_pluggable_alloc_status on the device of Numba's current context,
held by a numba.cuda.MemoryPointer whose finalizer frees it with
defer_pluggable_free once Numba drops it.  Pinned, mapped and managed host
memory stay Numba's own.  Out of memory is Numba's CudaAPIError with the
driver's CUDA_ERROR_OUT_OF_MEMORY code, as Numba's own allocator reports
it.  get_memory_info() is the device's (free, total); reset() (cuda.close())
also trims cudefer's free blocks; defer_cleanup() holds back only Numba's
host frees (cudefer's frees already wait for the GPU); get_ipc_handle()
raises, naming cudefer.  With cudefer.torch or cudefer.cupy enabled too,
all of them share one pool.

Limit: Numba tells memalloc no stream, so every allocation and free is on
the legacy default stream.  A free waits for the work enqueued on the
legacy stream up to the free, which includes the earlier work of every
blocking stream (cuda.stream(), the per-thread default stream) but not of a
non-blocking stream; and a freed block is handed out again at once on the
legacy stream.  Memory used on a non-blocking stream must be dropped only
after that stream's work is done (stream.synchronize()), and a new array
used there only after that stream waits for the legacy stream.
Limit: call enable() before Numba creates its CUDA context: a context keeps
the manager it was made with (enable() refuses once one exists).  Arrays
still alive at cuda.close() are not freed by it: drop them first.
"""

import contextlib
import ctypes
import operator
import threading
import weakref

from . import load, library, trim

__all__ = ["enable", "enabled", "manager_class"]

_lock = threading.Lock()
# enable()'s state: "library" (its path) once enable() succeeded.
_state = {}
# The library's entry points with their ctypes signatures, once loaded:
# "alloc", "free".
_entry = {}
# The manager class, built once numba is imported.
_classes = {}

# cudaErrorMemoryAllocation.
_OUT_OF_MEMORY = 2
# The interface version of Numba's EMM plugins this module implements.
_INTERFACE_VERSION = 1


def _import_numba():
    """numba.cuda and its driver module; ImportError naming Numba."""
    try:
        import numba.cuda
        from numba.cuda.cudadrv import driver
    except ImportError as e:
        raise ImportError("cudefer.numba: Numba (numba.cuda) is not installed "
                          "(import numba.cuda: %s)" % e) from None
    cuda = numba.cuda
    if not hasattr(cuda, "set_memory_manager"):
        raise ImportError("cudefer.numba: this numba.cuda has no "
                          "set_memory_manager (Numba's CUDA simulator, "
                          "NUMBA_ENABLE_CUDASIM, or a Numba without EMM "
                          "plugins)")
    return cuda, driver


def _entry_points(lib=None):
    """The library's alloc and free with their signatures (load(lib))."""
    with _lock:
        if not _entry:
            handle = load(lib)
            alloc = handle.defer_pluggable_alloc_status
            alloc.restype = ctypes.c_int
            alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                              ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            free = handle.defer_pluggable_free
            free.restype = None
            free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                             ctypes.c_void_p]
            _entry.update(alloc=alloc, free=free)
        elif lib is not None:
            load(lib)  # refuses another library than the one loaded
        return _entry["alloc"], _entry["free"]


def _uses_nv_binding(driver):
    """Whether Numba's driver speaks the CUDA Python binding (pointers are
    cuda.bindings.driver.CUdeviceptr) rather than ctypes.  Numba with both
    says so in USE_NV_BINDING; numba-cuda without it has only the binding
    (its module `binding`); an old Numba without either has only ctypes."""
    return bool(getattr(driver, "USE_NV_BINDING", hasattr(driver, "binding")))


def _pointer(driver, address):
    """address as the device pointer Numba's own allocator would hand
    MemoryPointer under this driver binding."""
    if _uses_nv_binding(driver):
        return driver.binding.CUdeviceptr(address)
    from numba.cuda.cudadrv import drvapi
    return drvapi.cu_device_ptr(address)


def _out_of_memory_code(driver):
    """The code Numba's CudaAPIError carries for CUDA_ERROR_OUT_OF_MEMORY."""
    if _uses_nv_binding(driver):
        return driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    from numba.cuda.cudadrv import enums
    return enums.CUDA_ERROR_OUT_OF_MEMORY


def _finalizer(free, address, size, device):
    """The MemoryPointer's finalizer: free the block on the legacy stream
    (any thread, at most once: weakref.finalize calls it once)."""
    def release():
        try:
            free(address, size, device, None)
        except Exception:  # interpreter teardown: nothing left to call
            pass
    return release


def _build_class(cuda, driver):
    class CudeferMemoryManager(cuda.HostOnlyCUDAMemoryManager):
        """Numba's device memory from cudefer (cudefer.numba says how)."""

        def initialize(self):
            _entry_points()

        def memalloc(self, size):
            try:
                size = operator.index(size)
                bad = size < 0
            except TypeError:
                bad = True
            if bad:
                raise ValueError("cudefer.numba: cannot allocate %r bytes "
                                 "(a size is a whole number >= 0)" % (size,))
            # A proxy, as Numba's own manager hands it: an array left alive
            # does not keep a context that cuda.close() dropped.
            context = weakref.proxy(self.context)
            if size == 0:
                return cuda.MemoryPointer(context, _pointer(driver, 0), 0)
            alloc, free = _entry_points()
            device = int(self.context.device.id)
            ptr = ctypes.c_void_p()
            err = alloc(ctypes.byref(ptr), size, device, None)
            if err == _OUT_OF_MEMORY:
                raise driver.CudaAPIError(
                    _out_of_memory_code(driver),
                    "cudefer.numba: out of memory allocating %d bytes on "
                    "device %d (CUDA_ERROR_OUT_OF_MEMORY)" % (size, device))
            if err != 0 or not ptr.value:
                raise RuntimeError(
                    "cudefer.numba: allocating %d bytes on device %d failed "
                    "with CUDA error %d (cudefer's line on stderr says more)"
                    % (size, device, err))
            return cuda.MemoryPointer(
                context, _pointer(driver, ptr.value), size,
                finalizer=_finalizer(free, ptr.value, size, device))

        def get_memory_info(self):
            if _uses_nv_binding(driver):
                free, total = driver.driver.cuMemGetInfo()
            else:
                f, t = ctypes.c_size_t(), ctypes.c_size_t()
                driver.driver.cuMemGetInfo(ctypes.byref(f), ctypes.byref(t))
                free, total = f.value, t.value
            return cuda.MemoryInfo(free=int(free), total=int(total))

        def get_ipc_handle(self, memory):
            raise RuntimeError("cudefer.numba: CUDA IPC handles are not "
                               "supported for memory from cudefer")

        def reset(self):
            super().reset()
            trim()

        @contextlib.contextmanager
        def defer_cleanup(self):
            # cudefer's frees already wait for the legacy stream's work:
            # only Numba's own host frees are held back.
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return _INTERFACE_VERSION

    CudeferMemoryManager.__module__ = __name__
    return CudeferMemoryManager


def manager_class():
    """The EMM plugin class enable() hands Numba (built on the first call).
    Raises ImportError without Numba."""
    cuda, driver = _import_numba()
    with _lock:
        if "class" not in _classes:
            _classes["class"] = _build_class(cuda, driver)
        return _classes["class"]


def _live_contexts(driver):
    """The devices on which Numba holds a CUDA context now."""
    try:
        devices = list(driver.driver.devices.values())
    except Exception:  # no driver (no GPU): no context either
        return []
    return sorted(int(d.id) for d in devices
                  if getattr(d, "primary_context", None) is not None)


def enable(lib=None):
    """Make cudefer Numba's device memory manager; return the library's
    path.  lib: as cudefer.load's.  Call before Numba first uses the GPU.
    A second call returns at once.  Raises ImportError without Numba,
    RuntimeError once Numba holds a CUDA context."""
    cls = manager_class()
    cuda, driver = _import_numba()
    _entry_points(lib)
    with _lock:
        if _state:
            return _state["library"]
        live = _live_contexts(driver)
        if live:
            raise RuntimeError(
                "cudefer.numba: Numba already holds a CUDA context on device "
                "%s; call enable() before Numba first uses the GPU"
                % ", ".join(map(str, live)))
        cuda.set_memory_manager(cls)
        _state["library"] = library()
        return _state["library"]


def enabled():
    """The path of the library enable() installed, or None."""
    return _state.get("library")


def __getattr__(name):
    # NUMBA_CUDA_MEMORY_MANAGER=cudefer.numba: Numba imports this module and
    # reads _numba_memory_manager; built on demand, so that importing the
    # module needs no Numba.
    if name == "_numba_memory_manager":
        return manager_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
