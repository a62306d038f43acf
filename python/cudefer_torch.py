# SPDX-License-Identifier: MIT
"""cudefer as PyTorch's CUDA allocator.

    import cudefer_torch
    cudefer_torch.enable()          # before the first CUDA tensor
    x = torch.randn(1 << 20, device="cuda")   # now allocated by cudefer

enable() loads libcudefer, makes it PyTorch's CUDA allocator through a small
C++ hook, and wires Tensor.record_stream to defer_record_stream.  Out of
memory raises torch.OutOfMemoryError, as under PyTorch's own allocator.

Why a hook and not torch.cuda.memory.CUDAPluggableAllocator alone: PyTorch
2.11 does not check the pointer such an allocator returns (out of memory
would become a tensor at address 0), so the hook installs
defer_pluggable_alloc_status behind a function that raises.  And PyTorch
tells a pluggable
allocator about record_stream only through the C++ call
CUDAPluggableAllocator::set_record_stream_fn, and passes free the stream of
the allocation, not of the last use.  Without the hook a tensor read on a
side stream and protected by record_stream (as PyTorch's documentation
says) could be handed out again while the side stream still reads it.
enable() therefore compiles python/record_stream_hook.cpp once against
the installed torch (its headers and libraries, the CUDA runtime headers),
with the first C++ compiler ($CUDEFER_CXX alone, else $CXX, g++, c++) whose
build needs the C++ runtime libc10.so needs (a hook with a copy of its own
crashes: build_hook), into a cache directory ($CUDEFER_TORCH_CACHE, else
$XDG_CACHE_HOME/cudefer or ~/.cache/cudefer) and loads it.  If that is not
possible (no C++ compiler, no torch headers, no CUDA headers) enable()
raises HookError, saying why, and changes nothing: call
enable(record_stream=False) to use cudefer anyway (through
CUDAPluggableAllocator and defer_pluggable_alloc/free), which warns
(RecordStreamWarning) that record_stream is then NOT honoured, and where
out of memory hands PyTorch a NULL pointer (cudefer says so on stderr);
a program
that uses record_stream (or DataParallel/DDP moving inputs between GPUs on a
side stream) must not do that.

Limits: enable() must run before CUDA memory is first allocated (PyTorch
cannot swap an allocator in use) and before other threads use CUDA.  Under
a pluggable allocator torch.cuda.memory_allocated, memory_stats and
memory_snapshot raise; CUDA graph private pools and IPC are not available.
With the hook, torch.cuda.empty_cache() calls defer_trim (without it, it
does nothing; trim() here always works).  ProcessGroupNCCL of PyTorch 2.11
does not call record_stream (TORCH_NCCL_AVOID_RECORD_STREAMS is its default
and the variable is deprecated: it keeps a collective's tensors alive until
the work is waited for), so DistributedDataParallel needs no hook for its
allreduce; the hook still matters for user code and for DDP's copies of
inputs that arrive on another GPU (torch.distributed.utils._recursive_to).

Standard library only (plus torch, imported when enable() is called).
"""

import ctypes
import ctypes.util
import hashlib
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import threading
import warnings

__all__ = ["enable", "find_library", "build_hook", "stats", "trim",
           "HookError", "RecordStreamWarning", "LIBRARY_ENV"]

# The environment variable naming libcudefer.so (overrides the search).
LIBRARY_ENV = "CUDEFER_LIB"
# The environment variable naming the directory of the compiled hook.
CACHE_ENV = "CUDEFER_TORCH_CACHE"
# The environment variable naming the C++ compiler for the hook (else $CXX,
# g++, c++: build_hook).
CXX_ENV = "CUDEFER_CXX"

_HERE = os.path.dirname(os.path.abspath(__file__))
_HOOK_SOURCE = os.path.join(_HERE, "record_stream_hook.cpp")

_lock = threading.Lock()
_state = {"library": None, "handle": None, "hook": None, "record_stream": None}


class HookError(RuntimeError):
    """The record_stream hook could not be built or installed."""


class RecordStreamWarning(UserWarning):
    """cudefer is PyTorch's allocator but Tensor.record_stream is ignored."""


def find_library(lib=None):
    """Return the path (or soname) of libcudefer to load.

    Order: the argument; $CUDEFER_LIB; src/.libs/libcudefer.so of the
    source tree this file belongs to and of the current directory (an
    in-tree build); the installed library (ctypes.util.find_library).
    Raises FileNotFoundError naming every place looked at.  Never blocks.
    """
    tried = []
    for source, path in (("argument lib", lib),
                         ("$" + LIBRARY_ENV, os.environ.get(LIBRARY_ENV))):
        if path:
            if os.path.isfile(path):
                return os.path.abspath(path)
            raise FileNotFoundError(
                "cudefer: %s names %r, which is not a file" % (source, path))
    for base in (os.path.dirname(_HERE), os.getcwd()):
        path = os.path.join(base, "src", ".libs", "libcudefer.so")
        tried.append(path)
        if os.path.isfile(path):
            return path
    installed = ctypes.util.find_library("cudefer")
    if installed:
        return installed
    tried.append("the installed library (ctypes.util.find_library)")
    raise FileNotFoundError(
        "cudefer: libcudefer.so not found; pass enable(lib=PATH) or set $%s."
        " Looked at: %s" % (LIBRARY_ENV, ", ".join(tried)))


def _load(path):
    """ctypes handle of libcudefer at path, checked for the PyTorch entry
    points.  Raises OSError when it cannot be loaded, AttributeError when it
    lacks them (a library older than the PyTorch support)."""
    handle = ctypes.CDLL(path)
    missing = [name for name in ("defer_pluggable_alloc",
                                 "defer_pluggable_free",
                                 "defer_record_stream", "defer_stats_get",
                                 "defer_trim")
               if not hasattr(handle, name)]
    if missing:
        raise AttributeError("cudefer: %s has no %s (a library built before "
                             "the PyTorch entry points?)"
                             % (path, ", ".join(missing)))
    handle.defer_record_stream.restype = ctypes.c_int
    handle.defer_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    handle.defer_trim.restype = ctypes.c_int
    handle.defer_trim.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    return handle


def _cache_dir():
    """Directory for the compiled hook (created if missing)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "cudefer")
    os.makedirs(base, exist_ok=True)
    return base


def _cuda_include_dir(torch_lib_dirs):
    """A directory holding cuda_runtime_api.h, or None.  Looks at
    $CUDA_HOME/$CUDA_PATH, torch's idea of CUDA_HOME, nvcc's toolkit,
    /usr/local/cuda, and the CUDA headers of pip's nvidia packages."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    try:
        from torch.utils import cpp_extension
        if cpp_extension.CUDA_HOME:
            candidates.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    except Exception:  # torch without cpp_extension's dependencies
        pass
    nvcc = None
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and os.path.isfile(os.path.join(d, "nvcc")):
            nvcc = os.path.join(d, "nvcc")
            break
    if nvcc:
        candidates.append(os.path.join(
            os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
            "include"))
    candidates.append("/usr/local/cuda/include")
    for lib_dir in torch_lib_dirs:
        site = os.path.dirname(os.path.dirname(lib_dir))
        for sub in ("cu13", "cu12", "cuda_runtime"):
            candidates.append(os.path.join(site, "nvidia", sub, "include"))
    for d in candidates:
        if os.path.isfile(os.path.join(d, "cuda_runtime_api.h")):
            return d
    return None


def _torch_build_paths(torch):
    """(include dirs, library dirs) of the installed torch."""
    try:
        from torch.utils import cpp_extension
        return cpp_extension.include_paths(), cpp_extension.library_paths()
    except Exception:
        root = os.path.dirname(torch.__file__)
        return ([os.path.join(root, "include"),
                 os.path.join(root, "include", "torch", "csrc", "api",
                              "include")],
                [os.path.join(root, "lib")])


def _needed_libraries(path):
    """The DT_NEEDED names of the ELF shared object at path (a list), or
    None when it cannot be read or is not a 64-bit little-endian ELF file
    with a dynamic segment.  Reads the program headers (which a stripped
    file keeps): PT_DYNAMIC's entries, their string table found through
    the PT_LOAD segment that maps it.  Never raises."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return None
        phoff = struct.unpack_from("<Q", data, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        # Elf64_Phdr: type, flags, offset, vaddr, paddr, filesz, memsz, align.
        headers = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
                   for i in range(phnum)]
        dynamic = [h for h in headers if h[0] == 2]  # PT_DYNAMIC
        if not dynamic:
            return None
        entries = []
        offset, size = dynamic[0][2], dynamic[0][5]
        for off in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, off)
            if tag == 0:  # DT_NULL
                break
            entries.append((tag, value))
        strtab = [v for t, v in entries if t == 5]  # DT_STRTAB, an address
        if not strtab:
            return None
        base = None
        for h in headers:  # PT_LOAD mapping that address
            if h[0] == 1 and h[3] <= strtab[0] < h[3] + h[5]:
                base = strtab[0] - h[3] + h[2]
        if base is None:
            return None
        needed = []
        for tag, value in entries:
            if tag == 1:  # DT_NEEDED
                start = base + value
                needed.append(data[start:data.index(b"\0", start)]
                              .decode(errors="replace"))
        return needed
    except (OSError, struct.error, IndexError, ValueError, OverflowError):
        return None


def _cxx_runtimes(names):
    """The C++ runtimes (libstdc++.so.N, libc++.so.N) among names."""
    return {n for n in names or ()
            if n.startswith(("libstdc++.so", "libc++.so"))}


def _foreign_cxx_runtime(path, wanted):
    """Why the hook at path cannot share PyTorch's C++ runtime, or None when
    it can.  wanted: the C++ runtimes libc10.so needs (empty: libstdc++ of
    any version).  The hook shares strings, std::function, exceptions and
    iostream locales with libtorch, so it must need that runtime: one with
    a copy of its own (a compiler whose default is -static-libstdc++, or
    that has no shared libstdc++) crashed in torch.empty at the first out
    of memory on an H100 machine (its iostreams used the locale facets of
    the process's libstdc++.so.6 by the wrong index, building the
    exception's message); one built for libc++ does not even load."""
    needed = _needed_libraries(path)
    if needed is None:
        return "cannot read its dynamic section"
    mine = _cxx_runtimes(needed)
    if wanted and mine & wanted:
        return None
    if not wanted and any(n.startswith("libstdc++.so") for n in mine):
        return None
    return ("it does not link %s dynamically (it needs only %s): a hook with "
            "a C++ runtime other than PyTorch's crashes"
            % (" or ".join(sorted(wanted)) or "libstdc++",
               ", ".join(needed) or "nothing"))


def _compilers():
    """The C++ compilers to try, each as an argument list: $CUDEFER_CXX
    alone when set and not blank (the user's choice, no fallback); else
    $CXX, then g++ and c++, without repeats.  Raises HookError for a value
    shlex cannot split."""
    def split(name, value):
        try:
            return shlex.split(value or "")
        except ValueError as e:
            raise HookError("cudefer: $%s=%r: %s" % (name, value, e)) from None
    mine = split(CXX_ENV, os.environ.get(CXX_ENV))
    if mine:
        return [mine]
    out = []
    for cxx in (split("CXX", os.environ.get("CXX")), ["g++"], ["c++"]):
        if cxx and cxx not in out:
            out.append(cxx)
    return out


def _torch_cxx_runtimes(lib_dirs):
    """The C++ runtimes libc10.so (found in lib_dirs) needs; empty when it
    is not found or names none."""
    for d in lib_dirs:
        path = os.path.join(d, "libc10.so")
        if os.path.isfile(path):
            return _cxx_runtimes(_needed_libraries(path))
    return set()


def build_hook(verbose=False):
    """Compile python/record_stream_hook.cpp for the torch in use, unless a
    build for this exact source, torch and compiler flags is cached; return
    the path of the shared object.  Tries each of _compilers() in turn and
    takes the first whose build needs PyTorch's C++ runtime (the one
    libc10.so needs; see _foreign_cxx_runtime).  A compiler whose build did
    not is remembered in the cache (a .rejected file with the reason) and
    not run again for the same flags.  Blocks while a compiler runs (a few
    seconds, at the first use).  Safe against concurrent callers: each
    compiles to a temporary name, checks it, and only then renames it.
    Raises HookError with every compiler's reason (its output, or what is
    missing) when none works.  verbose: say on stderr what is run and what
    is skipped, and why."""
    import torch
    if not os.path.isfile(_HOOK_SOURCE):
        raise HookError("cudefer: %s is missing" % _HOOK_SOURCE)
    includes, lib_dirs = _torch_build_paths(torch)
    if not os.path.isfile(os.path.join(
            includes[0], "torch", "csrc", "cuda", "CUDAPluggableAllocator.h")):
        raise HookError("cudefer: torch %s ships no C++ headers (looked in %s)"
                        % (torch.__version__, includes[0]))
    cuda_include = _cuda_include_dir(lib_dirs)
    if cuda_include is None:
        raise HookError("cudefer: no CUDA runtime headers (cuda_runtime_api.h)"
                        " found; set CUDA_HOME to the CUDA toolkit")
    wanted = _torch_cxx_runtimes(lib_dirs)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = ["-shared", "-fPIC", "-O2", "-std=c++17",
             "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]
    flags += ["-I" + d for d in includes + [cuda_include]]
    flags += [_HOOK_SOURCE]
    for d in lib_dirs:
        flags += ["-L" + d, "-Wl,-rpath," + d]
    flags += ["-lc10", "-lc10_cuda", "-ltorch_cuda"]
    with open(_HOOK_SOURCE, "rb") as f:
        source = f.read()
    reasons = []
    for cxx in _compilers():
        key = hashlib.sha256(source)
        key.update(repr((torch.__version__, torch.__file__, cxx + flags))
                   .encode())
        target = os.path.join(_cache_dir(), "record_stream_hook-%s.so"
                              % key.hexdigest()[:16])
        try:
            _cached_or_compiled(cxx + flags, target, wanted, verbose)
            return target
        except HookError as e:
            reasons.append("%s: %s" % (" ".join(cxx), e))
            if verbose:
                print("cudefer: not using %s: %s" % (" ".join(cxx), e),
                      file=sys.stderr)
    raise HookError("cudefer: no C++ compiler built a usable hook from %s "
                    "(set $%s to a g++ that links libstdc++ dynamically):\n%s"
                    % (_HOOK_SOURCE, CXX_ENV, "\n".join(reasons)))


def _cached_or_compiled(cmd, target, wanted, verbose):
    """Make target the checked build of cmd: the cached file when it passes
    _foreign_cxx_runtime (one cached by an older cudefer may not), else a
    new build, checked under a temporary name in target's directory and
    renamed only when it passes.  A build that fails the check leaves
    target + ".rejected" (its reason) behind, and later calls raise that
    reason without running the compiler.  Blocks while the compiler runs.
    Raises HookError with the compiler's output or the check's reason."""
    rejected = target + ".rejected"
    if os.path.isfile(target):
        if _foreign_cxx_runtime(target, wanted) is None:
            return
        try:  # an older cudefer's unchecked build: never loaded again
            os.unlink(target)
        except FileNotFoundError:
            pass
    try:
        with open(rejected) as f:
            raise HookError(f.read().strip() + " (remembered in %s)"
                            % rejected)
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        if verbose:
            print("cudefer: " + " ".join(cmd + ["-o", tmp]), file=sys.stderr)
        try:
            run = subprocess.run(cmd + ["-o", tmp], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise HookError("cannot run it (%s); set $%s"
                            % (e, CXX_ENV)) from None
        if run.returncode != 0:
            raise HookError("compiling failed (exit %d):\n%s"
                            % (run.returncode, run.stdout[-4000:]))
        why = _foreign_cxx_runtime(tmp, wanted)
        if why is not None:
            with open(rejected + ".%d" % os.getpid(), "w") as f:
                f.write(why + "\n")
            os.replace(rejected + ".%d" % os.getpid(), rejected)
            raise HookError(why)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_hook(hook_path):
    """The compiled hook (its cudefer_torch_install and
    cudefer_torch_recorded typed).  Raises HookError."""
    try:
        hook = ctypes.CDLL(hook_path)
        install, recorded = hook.cudefer_torch_install, hook.cudefer_torch_recorded
    except (OSError, AttributeError) as e:
        raise HookError("cudefer: cannot load %s: %s" % (hook_path, e)) from None
    install.restype = ctypes.c_int
    install.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_char_p,
                                                ctypes.c_size_t]
    recorded.restype = ctypes.c_ulonglong
    recorded.argtypes = []
    return hook


def _refused(reason):
    """The RuntimeError for PyTorch's refusal to change its allocator."""
    return RuntimeError("cudefer: PyTorch refused to change its allocator "
                        "(%s): call cudefer_torch.enable() before the first "
                        "CUDA tensor" % reason)


def _install(install, handle):
    """Make cudefer PyTorch's current allocator through the hook, all at
    once: allocations over defer_pluggable_alloc_status (out of memory
    raises torch.OutOfMemoryError; PyTorch does not check the NULL of a
    pluggable allocator loaded from Python), Tensor.record_stream to
    defer_record_stream, torch.cuda.empty_cache() to defer_trim.  Raises
    RuntimeError when PyTorch refuses; nothing is changed then."""
    message = ctypes.create_string_buffer(1024)
    functions = (handle.defer_pluggable_alloc_status,
                 handle.defer_pluggable_free, handle.defer_record_stream,
                 handle.defer_trim)
    rc = install(*[ctypes.cast(f, ctypes.c_void_p).value for f in functions],
                 message, ctypes.sizeof(message))
    if rc == 3:
        raise _refused(message.value.decode(errors="replace").strip())
    if rc != 0:
        raise HookError("cudefer: installing the allocator failed (%d)" % rc)


def enable(lib=None, record_stream=True):
    """Make cudefer PyTorch's CUDA allocator; return the library's path.

    lib: path of libcudefer.so (default: find_library()).
    record_stream: True (default) installs cudefer through the compiled
    hook: out of memory raises torch.OutOfMemoryError, Tensor.record_stream
    reaches defer_record_stream; if the hook cannot be built, HookError is
    raised before anything is changed.  False skips the hook and warns
    (RecordStreamWarning) that record_stream is ignored; out of memory then
    gives PyTorch a NULL pointer (a tensor at address 0, said on stderr).

    Call once, before the first CUDA allocation and before other threads use
    CUDA; a second call with the same library returns at once, with another
    raises RuntimeError.  Blocks while the hook compiles (first use only).
    Raises FileNotFoundError/OSError/AttributeError for a missing or
    unsuitable library, RuntimeError from PyTorch when CUDA memory was
    already allocated with another allocator.
    """
    import torch
    with _lock:
        path = find_library(lib)
        if _state["library"] is not None:
            if _state["library"] != path:
                raise RuntimeError("cudefer: already enabled with %s"
                                   % _state["library"])
            if record_stream and not _state["record_stream"]:
                raise RuntimeError("cudefer: already enabled without the "
                                   "record_stream hook")
            return path
        handle = _load(path)
        if record_stream and not hasattr(handle,
                                         "defer_pluggable_alloc_status"):
            raise AttributeError("cudefer: %s has no "
                                 "defer_pluggable_alloc_status (a library "
                                 "older than the hook)" % path)
        # Everything that can fail for want of a compiler or headers
        # happens before PyTorch's allocator is changed.
        hook = _load_hook(build_hook()) if record_stream else None
        if hook is not None:
            _install(hook.cudefer_torch_install, handle)
        else:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(
                path, "defer_pluggable_alloc", "defer_pluggable_free")
            try:
                torch.cuda.memory.change_current_allocator(allocator)
            except RuntimeError as e:
                raise _refused(e) from None
            warnings.warn(
                "cudefer: enabled without the record_stream hook: "
                "Tensor.record_stream is ignored, so memory used on another "
                "stream may be reused before that stream is done with it",
                RecordStreamWarning, stacklevel=2)
        _state.update(library=path, handle=handle, hook=hook,
                      record_stream=hook is not None)
        return path


def enabled():
    """(library path, whether record_stream is wired), or None."""
    if _state["library"] is None:
        return None
    return _state["library"], _state["record_stream"]


def recorded():
    """How many Tensor.record_stream calls reached cudefer through the hook
    and recorded their stream; None when enable() did not install the
    hook."""
    hook = _state.get("hook")
    return None if hook is None else int(hook.cudefer_torch_recorded())


def _stats_fields():
    """Names of struct defer_stats' fields, in order: read from cudefer.h
    when this file sits in a source tree (so fields added later are
    picked up), else the fields this file knows."""
    header = os.path.join(os.path.dirname(_HERE), "include", "cudefer.h")
    try:
        with open(header) as f:
            text = f.read()
        body = re.search(r"struct defer_stats\s*\{(.*?)\};", text, re.S).group(1)
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        fields = re.findall(r"uint64_t\s+(\w+)\s*;", body)
        if fields:
            return fields
    except (OSError, AttributeError):
        pass
    return list(KNOWN_STATS_FIELDS)


# struct defer_stats' fields as this file knows them, for a copy installed
# away from cudefer.h (bench/test_run.py checks them against the header).
KNOWN_STATS_FIELDS = (
    "deferred", "released", "pending", "failed", "rejected", "sync_releases",
    "event_queries", "wakeups", "batches", "largest_batch", "events_created",
    "events_in_pool", "held", "held_bytes", "idle_releases", "cap_releases",
    "age_releases", "demand_releases", "latency_p50_us", "latency_max_us",
    "leaked_at_exit", "reused", "reused_same_stream", "cache_bytes",
    "cache_free_bytes", "cache_mallocs", "cache_releases")


def stats(lib=None):
    """cudefer's counters (defer_stats_get) as a dict.  Uses the library
    enable() loaded, else loads lib (or finds one).  Never blocks."""
    handle = _state["handle"]
    if handle is None:
        handle = ctypes.CDLL(find_library(lib))
    fields = _stats_fields()
    # Room for fields this file does not know of, should the struct grow.
    buf = (ctypes.c_uint64 * max(256, len(fields)))()
    if hasattr(handle, "defer_stats_get_sized"):
        # The plain symbol writes only cudefer 0.1.0's counters (cudefer.h,
        # "Structs that grow"); the sized one every counter that fits.
        handle.defer_stats_get_sized.restype = None
        handle.defer_stats_get_sized.argtypes = [ctypes.c_void_p,
                                                 ctypes.c_size_t]
        handle.defer_stats_get_sized(ctypes.byref(buf), ctypes.sizeof(buf))
    else:
        handle.defer_stats_get(ctypes.byref(buf))
    return {name: int(buf[i]) for i, name in enumerate(fields)}


def trim():
    """defer_trim: release every completed block cudefer holds; returns the
    bytes released.  Blocks while the reclaimer polls once.  Raises
    RuntimeError with the CUDA error number on failure."""
    handle = _state["handle"]
    if handle is None:
        raise RuntimeError("cudefer: trim() before enable()")
    released = ctypes.c_size_t(0)
    rc = handle.defer_trim(ctypes.byref(released))
    if rc != 0:
        raise RuntimeError("cudefer: defer_trim failed with CUDA error %d" % rc)
    return released.value
