# SPDX-License-Identifier: MIT
"""cudefer from Python: the library's counters and trim, and cudefer as the
CUDA allocator of PyTorch (cudefer.torch) and CuPy (cudefer.cupy).

    import cudefer.torch
    cudefer.torch.enable()        # before PyTorch first uses CUDA
    ...
    print(cudefer.stats()["reused"])

Every part loads the same libcudefer, once per process (load()): found, in
this order, as the lib argument, $CUDEFER_LIB, pkg-config's libdir, the
dynamic loader's search (LD_LIBRARY_PATH, ldconfig), then src/.libs of the
source tree this package sits in.  Standard library only; torch and cupy are
imported by their modules' enable() alone.
"""

import ctypes
import ctypes.util
import operator
import os
import re
import subprocess
import threading

__all__ = ["load", "find_library", "library", "stats", "device_stats",
           "trim", "peer_access", "version", "LIBRARY_ENV", "KNOWN_STATS_FIELDS",
           "KNOWN_DEVICE_STATS_FIELDS"]

# The environment variable naming libcudefer.so (overrides the search).
LIBRARY_ENV = "CUDEFER_LIB"

_HERE = os.path.dirname(os.path.abspath(__file__))
# The source tree's top when this package is python/cudefer of one.
_TREE = os.path.dirname(os.path.dirname(_HERE))

_lock = threading.Lock()
# The library load() loaded: {"path": str, "handle": ctypes.CDLL}; set
# once, under _lock, never changed afterwards.
_loaded = {}

# struct defer_stats' fields as this package knows them, in order, for a
# copy installed away from cudefer.h (bench/test_run.py checks them
# against the header).
KNOWN_STATS_FIELDS = (
    "deferred", "released", "pending", "failed", "rejected", "sync_releases",
    "event_queries", "wakeups", "batches", "largest_batch", "events_created",
    "events_in_pool", "held", "held_bytes", "idle_releases", "cap_releases",
    "age_releases", "demand_releases", "latency_p50_us", "latency_max_us",
    "leaked_at_exit", "reused", "reused_same_stream", "cache_bytes",
    "cache_free_bytes", "cache_mallocs", "cache_releases",
    "cache_release_failures")

KNOWN_DEVICE_STATS_FIELDS = (
    "cache_bytes", "cache_bytes_peak", "live_bytes", "live_bytes_peak",
    "cache_free_bytes", "held_bytes", "held_bytes_peak", "cache_mallocs",
    "cache_releases", "allocs", "reused", "cache_release_failures")

# The entry points the Python side and the PyTorch allocator call.
_NEEDED = ("defer_pluggable_alloc_status", "defer_pluggable_free",
           "defer_record_stream", "defer_trim", "defer_stats_get_sized",
           "defer_alloc", "defer_free")


def _pkg_config_libdir():
    """pkg-config's libdir of cudefer, or None (no pkg-config, no
    cudefer.pc on its path)."""
    try:
        run = subprocess.run(["pkg-config", "--variable=libdir", "cudefer"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    # A path is bytes in no encoding in particular: decoded as the file
    # system's names are (os.fsdecode), it names the same file whatever the
    # locale's encoding, where a strict decoding in that encoding (text=True)
    # would raise on a byte it cannot decode.
    libdir = os.fsdecode(run.stdout.strip())
    return libdir if run.returncode == 0 and libdir else None


def _path(lib, hint=""):
    """lib as a str path (None stays None); TypeError, in one line with
    hint after it, when it is not a path."""
    if lib is None:
        return None
    try:
        return os.fsdecode(os.fspath(lib))
    except TypeError:
        raise TypeError("cudefer: lib=%r is not a path to libcudefer%s"
                        % (lib, hint)) from None


def find_library(lib=None):
    """The path (or the loader's name) of the libcudefer to load.

    Order: lib; $CUDEFER_LIB; libcudefer.so in pkg-config's libdir; the
    dynamic loader's search (ctypes.util.find_library); src/.libs of the
    source tree this package sits in, if it does.  A lib or $CUDEFER_LIB
    that names no file (or a directory) is an error, not skipped; blanks
    around $CUDEFER_LIB are ignored.  Raises
    FileNotFoundError naming every place looked at.  Blocks while
    pkg-config runs.  Raises TypeError for a lib that is not a path (str,
    bytes or os.PathLike)."""
    return _find(lib)[0]


def _env_library():
    """$CUDEFER_LIB without the blanks around it (as around $CUDEFER_CXX
    and the library's own variables), or None when unset or empty."""
    return os.environ.get(LIBRARY_ENV, "").strip() or None


def _find(lib):
    """find_library(lib), and the name of the variable that named it
    ("$CUDEFER_LIB") or None."""
    lib = _path(lib)
    for source, path in (("lib=", lib), ("$" + LIBRARY_ENV, _env_library())):
        if path:
            if os.path.isfile(path):
                return (os.path.abspath(path),
                        source if source != "lib=" else None)
            given = source + (repr(path) if source == "lib=" else "=" + path)
            if os.path.isdir(path):
                raise FileNotFoundError(
                    "cudefer: %s is a directory: name the library file in it "
                    "(%s)" % (given, os.path.join(path, "libcudefer.so")))
            raise FileNotFoundError("cudefer: %s names no file" % given)
    tried = ["$" + LIBRARY_ENV + " (unset)"]
    libdir = _pkg_config_libdir()
    if libdir:
        for name in ("libcudefer.so", "libcudefer.so.0"):
            path = os.path.join(libdir, name)
            if os.path.isfile(path):
                return path, None
        tried.append("pkg-config's libdir " + libdir)
    else:
        tried.append("pkg-config (no cudefer.pc)")
    found = ctypes.util.find_library("cudefer")
    if found:
        return found, None
    tried.append("the loader's search")
    if os.path.isfile(os.path.join(_TREE, "include", "cudefer.h")):
        # A source tree's python/cudefer: the tree's own build.
        path = os.path.join(_TREE, "src", ".libs", "libcudefer.so")
        if os.path.isfile(path):
            return path, None
        tried.append(path)
    raise FileNotFoundError(
        "cudefer: libcudefer not found (install it with make install, or set "
        "$%s to its path); looked at: %s" % (LIBRARY_ENV, ", ".join(tried)))


class _DlInfo(ctypes.Structure):
    """Dl_info of dladdr(3)."""
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_of(handle, name):
    """The path of the file the dynamic loader loaded as name (a loader's
    name, such as libcudefer.so.0), from dladdr of one of its functions;
    name when dladdr cannot tell."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return name
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if dladdr(ctypes.cast(handle.defer_trim, ctypes.c_void_p),
              ctypes.byref(info)) and info.dli_fname and \
            os.sep.encode() in info.dli_fname:
        return os.fsdecode(info.dli_fname)
    return name


def load(lib=None):
    """Load libcudefer once for the whole process and return its ctypes
    handle.  lib: as find_library's.  A later call returns the same handle;
    one whose lib names another library raises RuntimeError (one process,
    one cudefer: its allocations must be freed by the library that made
    them).  $CUDEFER_LIB is read by the first load only.
    Raises TypeError (lib is not a path), FileNotFoundError (not found),
    OSError (cannot be loaded), RuntimeError (not libcudefer, not a whole
    one, or lacks an entry point: a library older than this package); each
    names $CUDEFER_LIB when that variable named the file."""
    with _lock:
        if _loaded:
            if lib is not None:
                wanted = find_library(lib)
                if os.path.realpath(wanted) != os.path.realpath(
                        _loaded["path"]) and os.sep in wanted:
                    raise RuntimeError(
                        "cudefer: %s is already loaded; cannot use %s too"
                        % (_loaded["path"], wanted))
            return _loaded["handle"]
        path, variable = _find(lib)
        # The file as the user named it: through $CUDEFER_LIB, said so.
        named = "%s=%s" % (variable, path) if variable else path
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise OSError("cudefer: cannot load %s: %s" % (named, e)) from None
        if not hasattr(handle, "defer_free"):
            # cudefer's first call, in every version: some other library.
            raise RuntimeError("cudefer: %s is not libcudefer (it has no "
                               "defer_free)" % named)
        missing = [n for n in _NEEDED if not hasattr(handle, n)]
        if missing:
            raise RuntimeError("cudefer: %s lacks %s (a library older than "
                               "this package)" % (named, ", ".join(missing)))
        if not hasattr(handle, "defer_version"):
            # In every libcudefer: a library without it is no older one but
            # one cut short (a stub, say).
            raise RuntimeError("cudefer: %s is not a whole libcudefer (it has "
                               "no defer_version, which every version has)"
                               % named)
        if os.sep not in path:
            # Found by the loader's search: name the file it chose, so that
            # library() is a path and a later load of it is the same one.
            path = _file_of(handle, path)
        handle.defer_trim.restype = ctypes.c_int
        handle.defer_trim.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        handle.defer_stats_get_sized.restype = None
        handle.defer_stats_get_sized.argtypes = [ctypes.c_void_p,
                                                 ctypes.c_size_t]
        handle.defer_version.restype = ctypes.c_char_p
        handle.defer_version.argtypes = []
        _loaded.update(path=path, handle=handle)
        return handle


def library():
    """The path of the libcudefer load() loaded, or None before."""
    return _loaded.get("path")


# _struct_fields' answers, by (header path, struct name): the header is
# read once a process, as the library it describes is loaded once.
_fields_read = {}


def _struct_fields(name, known):
    """struct name's fields, one name a uint64_t word, in order: read from
    cudefer.h when this package sits in a source tree (so fields added
    later are picked up; an array's words are NAME[0], NAME[1], ...), else
    known.  Read up to the first field that is not uint64_t (its words
    cannot be told).  The header is read at the first call only; each call
    returns a list of its own."""
    header = os.path.join(_TREE, "include", "cudefer.h")
    key = (header, name)
    if key not in _fields_read:
        _fields_read[key] = tuple(_read_struct_fields(header, name, known))
    return list(_fields_read[key])


def _read_struct_fields(header, name, known):
    """_struct_fields(name, known) read from the file header."""
    try:
        # UTF-8 (its comments are), whatever the locale's encoding: the
        # field names are ASCII, so any byte that does not decode is in a
        # comment and may become U+FFFD.
        with open(header, encoding="utf-8", errors="replace") as f:
            text = f.read()
        body = re.search(r"struct %s\s*\{(.*?)\};" % name, text,
                         re.S).group(1)
    except (OSError, AttributeError):
        return list(known)
    body = re.sub(r"/\*.*?\*/|//[^\n]*", " ", body, flags=re.S)
    fields = []
    for declaration in body.split(";")[:-1]:
        m = re.fullmatch(r"\s*uint64_t\s+(.*?)\s*", declaration, re.S)
        words = [] if m is None else [
            re.fullmatch(r"(\w+)\s*(?:\[\s*(\d+)\s*\])?", d.strip())
            for d in m.group(1).split(",")]
        if not words or None in words:
            break
        for w in words:
            if w.group(2) is None:
                fields.append(w.group(1))
            else:
                fields.extend("%s[%d]" % (w.group(1), i)
                              for i in range(int(w.group(2))))
    return fields or list(known)


def stats_fields():
    """struct defer_stats' field names, in order."""
    return _struct_fields("defer_stats", KNOWN_STATS_FIELDS)


def device_stats_fields():
    """struct defer_device_stats' field names, in order."""
    return _struct_fields("defer_device_stats", KNOWN_DEVICE_STATS_FIELDS)


def stats(lib=None):
    """cudefer's counters (defer_stats_get_sized) as a dict of ints.  Loads
    the library (load(lib)) if nothing did yet.  Never blocks."""
    if isinstance(lib, int) and not isinstance(lib, bool):
        _path(lib, " (a device's counters: cudefer.device_stats(%d))" % lib)
    handle = load(lib)
    fields = stats_fields()
    # Room for fields this package does not know of, should the struct grow.
    buf = (ctypes.c_uint64 * max(256, len(fields)))()
    handle.defer_stats_get_sized(ctypes.byref(buf), ctypes.sizeof(buf))
    return {name: int(buf[i]) for i, name in enumerate(fields)}


def _device_number(device):
    """device as an int 0 .. 63 (any integer type: int, numpy's); raises
    ValueError naming what is wrong with it (not an integer: a bool, a
    float, a string; out of range)."""
    try:
        if isinstance(device, bool):
            raise TypeError
        number = operator.index(device)
    except TypeError:
        raise ValueError("cudefer: device %r is not a device number (an int "
                         "0 .. 63)" % (device,)) from None
    if not 0 <= number < 64:
        raise ValueError("cudefer: device %d: cudefer counts devices 0 .. 63"
                         % number)
    return number


def device_stats(device=0, lib=None, reset_peaks=False):
    """One device's counters (defer_device_stats_get_sized) as a dict of
    ints: the bytes of cudefer's blocks there, live and free, with their
    peaks, held bytes, counts.  device: an integer 0 .. 63 (int, or
    numpy's).  reset_peaks: afterwards set each peak to its current value
    (defer_device_stats_reset_peaks).  Loads the library if nothing did
    yet.  Never blocks.  Raises ValueError for a device that is not such
    an integer, RuntimeError for a library without per-device counters."""
    device = _device_number(device)
    handle = load(lib)
    try:
        get = handle.defer_device_stats_get_sized
        reset = handle.defer_device_stats_reset_peaks
    except AttributeError:
        raise RuntimeError("cudefer: %s has no per-device counters "
                           "(defer_device_stats_get_sized): an older "
                           "libcudefer" % _loaded["path"]) from None
    get.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    reset.argtypes = [ctypes.c_int]
    fields = device_stats_fields()
    buf = (ctypes.c_uint64 * max(64, len(fields)))()
    rc = get(device, ctypes.byref(buf), ctypes.sizeof(buf))
    if rc != 0:
        raise RuntimeError("cudefer: defer_device_stats_get_sized(%d) failed "
                           "with CUDA error %d" % (device, rc))
    if reset_peaks:
        reset(device)
    return {name: int(buf[i]) for i, name in enumerate(fields)}


# cudaErrorNotPermitted: what cudefer returns for a call it refuses after
# defer_shutdown or in a fork child.
_NOT_PERMITTED = 800


def _error_name(handle, rc):
    """The CUDA runtime's name of error rc (cudaGetErrorName of the runtime
    libcudefer uses, which makes no CUDA call), or None."""
    try:
        name = handle.cudaGetErrorName
    except AttributeError:
        return None
    name.restype = ctypes.c_char_p
    name.argtypes = [ctypes.c_int]
    text = (name(rc) or b"").decode(errors="replace")
    return text if text.startswith("cuda") else None


def trim(lib=None):
    """defer_trim: release every completed entry and every free cached block
    now; return the bytes given back to CUDA (0 before anything was
    deferred or allocated).  Blocks for one pass of the reclaimer.  Raises
    RuntimeError after defer_shutdown and in a fork child of a process that
    used cudefer (refused), and with the CUDA error on a failure."""
    handle = load(lib)
    released = ctypes.c_size_t(0)
    rc = handle.defer_trim(ctypes.byref(released))
    if rc == _NOT_PERMITTED:
        raise RuntimeError("cudefer: trim() refused: cudefer is shut down "
                           "(defer_shutdown), or this is a fork child of a "
                           "process that used it (cudaErrorNotPermitted)")
    if rc != 0:
        name = _error_name(handle, rc)
        raise RuntimeError("cudefer: defer_trim failed with CUDA error %d%s"
                           % (rc, " (%s)" % name if name else ""))
    return released.value


def peer_access(device, peer, lib=None):
    """defer_peer_access: let GPU peer's kernels and copies use the memory
    cudefer allocates on GPU device, live and future.  That memory comes
    from a memory pool of cudefer's, which peer access
    (cudaDeviceEnablePeerAccess, CuPy's and PyTorch's) does not reach: call
    it before peer's kernels use arrays of device (cudefer.torch does it
    where PyTorch enables peer access).  device, peer: integers 0 .. 63.
    Starts cudefer as an allocation does; never blocks on the GPU.  Raises
    ValueError for a device that is not such an integer, RuntimeError with
    the CUDA error where it is refused (no such device, peer cannot reach
    device, a CUDA failure: said on stderr too) or for an older libcudefer
    without it."""
    device, peer = _device_number(device), _device_number(peer)
    handle = load(lib)
    try:
        grant = handle.defer_peer_access
    except AttributeError:
        raise RuntimeError("cudefer: %s has no defer_peer_access: an older "
                           "libcudefer" % _loaded["path"]) from None
    grant.restype = ctypes.c_int
    grant.argtypes = [ctypes.c_int, ctypes.c_int]
    rc = grant(device, peer)
    if rc != 0:
        name = _error_name(handle, rc)
        raise RuntimeError("cudefer: defer_peer_access(%d, %d) failed with "
                           "CUDA error %d%s" % (device, peer, rc,
                                                " (%s)" % name if name
                                                else ""))


def version(lib=None):
    """The library's version string (defer_version)."""
    return load(lib).defer_version().decode()
