# SPDX-License-Identifier: MIT
"""cudefer as PyTorch's CUDA allocator.

    import cudefer.torch
    cudefer.torch.enable()          # before PyTorch first uses CUDA
    x = torch.randn(1 << 20, device="cuda")   # allocated by cudefer

enable() loads libcudefer (cudefer.load), compiles the allocator's units
(SOURCES, which share the header torch_allocator.h) for the installed torch
with torch.utils.cpp_extension (once: it caches the build in
$TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions, keyed by the
contents of every one of those files, the compiler, the flags and this
torch's version) and installs it: a whole c10 CUDAAllocator over cudefer,
so that torch.cuda.memory_allocated,
memory_stats, memory_summary, reset_peak_memory_stats, empty_cache,
set_per_process_memory_fraction, Tensor.record_stream, torch.cuda.graph and
torch.compile(mode="reduce-overhead") work as under PyTorch's own allocator
(README's table says what differs).  Out of memory raises
torch.OutOfMemoryError.

Needs, at the first enable(): torch built with CUDA, a C++ compiler whose
build shares PyTorch's C++ runtime ($CUDEFER_CXX; else the first of $CXX,
g++ and c++ that does), ninja, and the CUDA runtime's headers (the
toolkit's: $CUDA_HOME, else nvcc's; else those of pip's nvidia runtime
package).  Each missing piece is a RuntimeError (or ImportError for torch)
naming it, raised before PyTorch's allocator is changed.
"""

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading

from . import load, library, stats_fields, device_stats_fields

__all__ = ["enable", "enabled", "build", "recorded", "bookkeeping_ns",
           "SOURCE", "SOURCES", "HEADERS"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# The allocator's units, compiled together, and the private header they
# share; all shipped as package data (torch_allocator.h says which unit
# holds what).
SOURCES = [os.path.join(_HERE, name) for name in
           ("torch_allocator.cpp", "torch_pools.cpp", "torch_stats.cpp",
            "torch_history.cpp")]
HEADERS = [os.path.join(_HERE, "torch_allocator.h")]
# The unit with the entry points enable() calls (cudefer_torch_install).
SOURCE = SOURCES[0]

# The environment variable that names the one C++ compiler to use.
CXX_ENV = "CUDEFER_CXX"

# PyTorch's switch for torch.cuda.is_available() through NVML, which leaves
# CUDA uninitialized, where CUDA's own check (cudaGetDeviceCount) does not.
_NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"

_lock = threading.Lock()
# Held while the environment is changed for torch.utils.cpp_extension:
# $PYTORCH_NVML_BASED_CUDA_CHECK for its import, $CXX for a build.
_env_lock = threading.Lock()
_state = {}  # "library", "extension" once enable() succeeded


class _Functions(ctypes.Structure):
    """struct CudeferFunctions of torch_allocator.h."""
    _fields_ = [("alloc_status", ctypes.c_void_p),
                ("free", ctypes.c_void_p),
                ("record_stream", ctypes.c_void_p),
                ("trim", ctypes.c_void_p),
                ("stats_get_sized", ctypes.c_void_p),
                ("stat_cache_bytes", ctypes.c_int64),
                ("stat_cache_mallocs", ctypes.c_int64),
                ("stat_cache_releases", ctypes.c_int64),
                ("device_stats_get_sized", ctypes.c_void_p),
                ("dstat_cache_bytes", ctypes.c_int64),
                ("dstat_cache_mallocs", ctypes.c_int64),
                ("dstat_cache_releases", ctypes.c_int64),
                ("peer_access", ctypes.c_void_p),
                ("flush", ctypes.c_void_p),
                ("device_stats_reset_peaks", ctypes.c_void_p),
                ("dstat_cache_bytes_peak", ctypes.c_int64)]


def _import_torch():
    """torch, built with CUDA; ImportError or RuntimeError naming what is
    missing."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("cudefer.torch: PyTorch is not installed "
                          "(import torch: %s)" % e) from None
    if not getattr(torch.version, "cuda", None):
        raise RuntimeError("cudefer.torch: torch %s is built without CUDA"
                           % torch.__version__)
    return torch


def _tool_output(cmd):
    """cmd's output, or None when it cannot run or fails.  Read as the file
    system names things (os.fsdecode): tools print paths and library
    names, bytes in no encoding in particular, which a strict decoding in
    the locale's encoding (text=True) would refuse."""
    try:
        run = subprocess.run(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return os.fsdecode(run.stdout) if run.returncode == 0 else None


def _needed_libraries(path):
    """The DT_NEEDED entries of the shared object at path, as readelf or
    objdump prints them; None when neither tool is there."""
    for cmd in (["readelf", "-d", path], ["objdump", "-p", path]):
        out = _tool_output(cmd)
        if out is not None:
            return re.findall(r"NEEDED\)?\s+(?:Shared library: \[)?([^\]\s]+)",
                              out)
    return None


def _defines_cxx_runtime(path):
    """Whether the shared object at path carries a copy of the C++ runtime
    (defines its exception machinery, as a -static-libstdc++ build does);
    None when nm is not there to tell."""
    out = _tool_output(["nm", path])
    if out is None:
        return None
    return re.search(r"^\S*\s+[TtWw]\s+(__gxx_personality_v0|__cxa_throw)$",
                     out, re.M) is not None


def check_cxx_runtime(path):
    """None when the shared object at path uses the process's C++ runtime
    (it needs the shared libstdc++, or reaches it only through torch's
    libraries and carries none of its own), or when no tool can tell; else
    why it must not be loaded: an allocator with a C++ runtime of its own
    crashed PyTorch at the first out of memory (its copy of the runtime
    used the process's locale facets by the wrong index, building the
    exception's message)."""
    needed = _needed_libraries(path)
    if needed is None or any(n.startswith("libstdc++.so") for n in needed):
        return None
    if not _defines_cxx_runtime(path):
        return None
    return ("its build carries a C++ runtime of its own (it needs only %s, "
            "not libstdc++)" % (", ".join(needed) or "nothing"))


def compilers():
    """The C++ compilers build() tries, in order, each as a path: the one
    $CUDEFER_CXX names, alone, when it is set (the user's choice: no
    other is tried); else $CXX, g++ and c++, each that is found, without
    repeats (the same file run by the same name: a wrapper such as ccache,
    which runs the compiler its name says, is a compiler per name), and
    none at a path with a blank, which cpp_extension's ninja build cannot
    run.  Raises RuntimeError when none is found, or when $CUDEFER_CXX's
    path has a blank."""
    mine = os.environ.get(CXX_ENV, "").strip()
    names = [mine] if mine else [os.environ.get("CXX", "").strip(),
                                 "g++", "c++"]

    def same(path):
        return os.path.realpath(path), os.path.basename(path)
    found = []
    for name in names:
        path = shutil.which(name) if name else None
        if path and same(path) not in (same(f) for f in found):
            found.append(path)
    # cpp_extension writes the compiler unquoted into build.ninja, whose
    # shell splits a path with a blank: none such is run.
    blank = [p for p in found if any(c.isspace() for c in p)]
    if mine and blank:
        raise RuntimeError(
            "cudefer.torch: $%s=%r is at a path with a blank, which "
            "torch.utils.cpp_extension writes unquoted into its ninja "
            "build: use a path without one (a symbolic link to it)"
            % (CXX_ENV, mine))
    found = [p for p in found if p not in blank]
    if not found and blank:
        raise RuntimeError(
            "cudefer.torch: no C++ compiler at a path without a blank (%s: "
            "torch.utils.cpp_extension writes it unquoted into its ninja "
            "build); set %s to one at a path without one"
            % (", ".join(blank), CXX_ENV))
    if not found and mine:
        line = os.sep not in mine and mine.split()[1:]
        raise RuntimeError(
            "cudefer.torch: no C++ compiler: $%s=%r %s (set %s to one%s)"
            % (CXX_ENV, mine, _not_a_program(mine), CXX_ENV,
               " program, not a command line" if line else ""))
    if not found:
        raise RuntimeError("cudefer.torch: no C++ compiler: $CXX, 'g++' or "
                           "'c++' not found (set %s to one)" % CXX_ENV)
    return found


def _not_a_program(name):
    """Why shutil.which found no program by name, in words."""
    if os.sep not in name:
        return "is not a command on PATH"
    if os.path.isdir(name):
        return "is a directory"
    if not os.path.exists(name):
        return "names no file"
    return "is not executable"


def _import_cpp_extension():
    """torch.utils.cpp_extension, imported without initializing CUDA.  Its
    import looks for the CUDA toolkit and, where it finds one, calls
    torch.cuda.is_available(), which initializes CUDA (cudaGetDeviceCount)
    unless $PYTORCH_NVML_BASED_CUDA_CHECK is 1; a process whose CUDA is
    initialized has fork children that cannot use CUDA ("Cannot
    re-initialize CUDA in forked subprocess").  The variable is 1 for the
    import alone, then as it was.  Where NVML cannot count the devices,
    PyTorch's check falls back on CUDA's."""
    with _env_set(_NVML_CHECK_ENV, "1"):
        from torch.utils import cpp_extension
    return cpp_extension


@contextlib.contextmanager
def _env_set(name, value):
    """$name is value inside the block, then as it was (unset if it was),
    _env_lock held throughout: no other thread's change of the environment
    for cpp_extension interleaves."""
    with _env_lock:
        saved = os.environ.get(name)
        os.environ[name] = value
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved


def _cuda_include_dir(cpp_extension):
    """A directory with cuda_runtime_api.h: the CUDA toolkit's
    (cpp_extension.CUDA_HOME: $CUDA_HOME, nvcc's, /usr/local/cuda) or that
    of pip's nvidia runtime package torch came with; None when neither."""
    candidates = []
    if cpp_extension.CUDA_HOME:
        candidates.append(os.path.join(cpp_extension.CUDA_HOME, "include"))
    try:
        import nvidia
        for base in getattr(nvidia, "__path__", []):
            for sub in sorted(os.listdir(base)):
                candidates.append(os.path.join(base, sub, "include"))
    except ImportError:
        pass
    for d in candidates:
        if os.path.isfile(os.path.join(d, "cuda_runtime_api.h")):
            return d
    return None


def build(verbose=False):
    """Compile the allocator for the torch in use, unless
    torch.utils.cpp_extension has it cached; return the shared object's
    path.  Blocks while the compiler runs (a few seconds, at the first use
    for a torch version), and while another process builds the same
    allocator (said on stderr); removes, said, the lock file a build killed
    there left, which cpp_extension alone would wait on for good.  Raises
    RuntimeError naming what is missing: no C++ compiler, no ninja, no
    CUDA headers, a failed compilation (its output is shown with
    verbose=True), a build that carries its own C++ runtime, a build
    directory that cannot be written, a build that cannot be loaded (a
    damaged cached one: its directory said).  Initializes no CUDA
    (torch.utils.cpp_extension is imported under PyTorch's NVML check,
    where NVML can count the GPUs): the process may fork children that
    use CUDA afterwards."""
    torch = _import_torch()
    cpp_extension = _import_cpp_extension()
    for path in SOURCES + HEADERS:
        if not os.path.isfile(path):
            raise RuntimeError("cudefer.torch: %s is missing" % path)
    candidates = compilers()
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("cudefer.torch: building the allocator needs "
                           "ninja (pip install ninja)")
    cuda_include = _cuda_include_dir(cpp_extension)
    if cuda_include is None:
        raise RuntimeError("cudefer.torch: no CUDA runtime headers "
                           "(cuda_runtime_api.h) found: set CUDA_HOME to the "
                           "CUDA toolkit")
    reasons = []
    for cxx in candidates:
        try:
            path = _build_with(torch, cpp_extension, cxx, cuda_include,
                               verbose)
        except RuntimeError as e:
            if len(candidates) == 1:
                raise
            why = str(e)
        else:
            why = check_cxx_runtime(path)
        if why is None:
            return path
        reasons.append("%s: %s" % (cxx, why))
        if verbose:
            print("cudefer.torch: not using %s: %s" % (cxx, why),
                  file=sys.stderr)
    if len(reasons) == 1:
        raise RuntimeError("cudefer.torch: %s; set %s to a g++ that links "
                           "libstdc++ dynamically" % (reasons[0], CXX_ENV))
    raise RuntimeError("cudefer.torch: no C++ compiler built an allocator "
                       "that shares PyTorch's C++ runtime (set %s to a g++ "
                       "that links libstdc++ dynamically): %s"
                       % (CXX_ENV, "; ".join(reasons)))


def _files_digest():
    """A digest of the names and contents of the allocator's files, every
    source and header."""
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        with open(path, "rb") as f:
            content = f.read()
        digest.update(b"%s\0%d\0" % (os.path.basename(path).encode(),
                                       len(content)))
        digest.update(content)
    return digest.hexdigest()


def _failed_files(output):
    """The allocator's files a failed build's output blames: those with a
    compiler error in them, else those whose object ninja says FAILED,
    else (nothing said: verbose builds print it instead) every source."""
    def blamed(pattern):
        return [p for p in SOURCES + HEADERS
                if re.search(pattern % re.escape(os.path.basename(p)),
                             output, re.M)]
    return (blamed(r"\b%s:\d+(?::\d+)?: (?:fatal )?error")
            or [p for p in SOURCES if re.search(
                r"^FAILED: .*\b%s\.o\b"
                % re.escape(os.path.splitext(os.path.basename(p))[0]),
                output, re.M)]
            or SOURCES)


# The errors of a build directory that cannot be made or written
# ($TORCH_EXTENSIONS_DIR naming a file, or under one, is ENOTDIR).
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
               errno.EDQUOT, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG,
               errno.ELOOP)


@contextlib.contextmanager
def _building(cpp_extension, name, verbose):
    """Hold this build's directory for cpp_extension.load(name), yielding
    it (None where cpp_extension does not say it: then nothing is held).

    cpp_extension's build holds the file 'lock' there while it runs
    (torch.utils.file_baton.FileBaton) and waits, for good, while another
    build does; a build killed (SIGKILL, the OOM killer, a cancelled job)
    leaves that file, and every later build waits on it.  Each of cudefer's
    builds holds an flock(2) on the directory's file cudefer.lock through
    cpp_extension's, which the kernel lets go when the process ends: with
    it held, a 'lock' file there is one no build of the allocator holds,
    and is removed, said.  A build under way in another process is waited
    for, said.  The directory is made (cpp_extension's OSError where it
    cannot be)."""
    get = getattr(cpp_extension, "_get_build_directory", None)
    if get is None:
        yield None
        return
    directory = get(name, verbose)
    fd = os.open(os.path.join(directory, "cudefer.lock"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("cudefer.torch: waiting for another process's build of "
                  "the allocator in %s" % directory, file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        lock = os.path.join(directory, "lock")
        try:
            os.remove(lock)
        except FileNotFoundError:
            pass
        else:
            print("cudefer.torch: removed %s, left by an interrupted build "
                  "of the allocator" % lock, file=sys.stderr)
        yield directory
    finally:
        os.close(fd)  # lets the flock go


def _build_with(torch, cpp_extension, cxx, cuda_include, verbose):
    """The allocator built with the compiler at path cxx (cached by
    cpp_extension under a name of the torch version, the compiler and the
    files' contents); its path.  Raises RuntimeError naming the files that
    failed to compile."""
    # The torch version in the name: a build for another torch (another
    # CUDAAllocator layout) is never loaded.  The compiler's resolved path
    # too: cpp_extension's cache does not know the compiler, and two
    # compilers of one name (/opt/gcc/bin/g++, /usr/bin/g++) may link
    # different C++ runtimes.  And the contents of every file, header
    # included: cpp_extension hashes only the sources it compiles, and
    # ninja rebuilds by modification times, which an installed copy of
    # another version need not advance.
    tag = hashlib.sha256(("%s\0%s" % (os.path.realpath(cxx),
                                       _files_digest())).encode()
                         ).hexdigest()[:8]
    name = "cudefer_torch_%s_%s_%s" % (
        re.sub(r"\W", "_", torch.__version__),
        re.sub(r"\W", "_", os.path.basename(cxx)), tag)
    # $CXX is cpp_extension's compiler, read from the environment; set
    # for this build alone, under _env_lock so that another thread's build
    # neither reads it as this one's nor puts back this one's value.
    with _env_set("CXX", cxx):
        return _load(cpp_extension, name, cxx, cuda_include, verbose)


def _load(cpp_extension, name, cxx, cuda_include, verbose):
    """_build_with's build, $CXX set to cxx: cpp_extension.load, its
    failures said as RuntimeError."""
    try:
        # No CUDA source: no nvcc, no GPU architectures (with_cuda would
        # ask the GPU for them); libcudart comes with libtorch_cuda.
        with _building(cpp_extension, name, verbose) as directory:
            return cpp_extension.load(
                name=name, sources=list(SOURCES), extra_cflags=["-O2"],
                extra_include_paths=[cuda_include],
                extra_ldflags=["-lc10_cuda", "-ltorch_cuda"],
                with_cuda=False, is_python_module=False,
                build_directory=directory, verbose=verbose)
    except Exception as e:  # cpp_extension raises several kinds
        # Its build directory (or lock file) that cannot be made or
        # written fails before any compiler runs.
        if isinstance(e, OSError) and e.errno in _UNWRITABLE:
            raise RuntimeError(
                "cudefer.torch: the allocator's build cannot be written "
                "(%s: %s): set TORCH_EXTENSIONS_DIR to a writable directory "
                "with room" % (e.filename or "its directory", e.strerror)
            ) from None
        # cpp_extension loads what it built or found cached
        # (torch.ops.load_library: ctypes.CDLL, whose OSError says the
        # file first): a damaged build, or one for another torch of the
        # same version, stays cached, ninja seeing it up to date, and no
        # compiler ran.
        loading = isinstance(e, OSError) and e.errno is None and re.match(
            r"(/.*?\.so): (.+)", str(e).strip().splitlines()[0]
            if str(e).strip() else "")
        if loading:
            raise RuntimeError(
                "cudefer.torch: the allocator's build %s cannot be loaded "
                "(%s): a damaged or stale build; delete %s to have it built "
                "again" % (loading.group(1), loading.group(2),
                           os.path.dirname(loading.group(1)))) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RuntimeError("cudefer.torch: compiling %s with %s failed (%s);"
                           " cudefer.torch.build(verbose=True) shows the "
                           "compiler's output"
                           % (", ".join(_failed_files(str(e))), cxx, first)
                           ) from None


def _function(handle, name):
    return ctypes.cast(getattr(handle, name), ctypes.c_void_p).value


def enable(lib=None, verbose=False):
    """Make cudefer PyTorch's CUDA allocator; return the library's path.

    lib: libcudefer's path (default: cudefer.find_library's search).
    verbose: show the compiler's command and output.
    Call once, before PyTorch first uses CUDA (a CUDA tensor,
    torch.cuda.set_device, current_device or init: each sets up PyTorch's
    own allocator, which it then will not swap) and before other threads
    use CUDA; a second call returns at once.  Initializes no CUDA (PyTorch
    does, at its first use): the process may fork children that use CUDA
    afterwards, as before it.  Raises ImportError without torch,
    RuntimeError for a build that cannot be made (build()),
    RuntimeError saying to call it first when PyTorch's own allocator is in
    use already (said before any build once torch.cuda.is_initialized()),
    and RuntimeError naming the cause when installing fails
    otherwise; nothing is changed then."""
    with _lock:
        if _state:
            load(lib)  # the same library, or RuntimeError
            return _state["library"]
        torch = _import_torch()
        # PyTorch's first use of CUDA (its lazy init) sets up its own
        # allocator, which it then refuses to swap: said now, before a
        # build that could only end in that refusal (is_available()
        # initializes nothing).
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and getattr(cuda, "is_initialized",
                                        lambda: False)():
            raise RuntimeError(
                "cudefer.torch: call enable() before PyTorch first uses CUDA "
                "(a CUDA tensor, torch.cuda.set_device or current_device "
                "all do): PyTorch has set up its own allocator already "
                "(torch.cuda.is_initialized())")
        handle = load(lib)
        extension = ctypes.CDLL(build(verbose))
        install = extension.cudefer_torch_install
        install.restype = ctypes.c_int
        install.argtypes = [ctypes.POINTER(_Functions), ctypes.c_char_p,
                            ctypes.c_size_t]
        extension.cudefer_torch_recorded.restype = ctypes.c_ulonglong
        extension.cudefer_torch_recorded.argtypes = []
        extension.cudefer_torch_bookkeeping_ns.restype = ctypes.c_double
        extension.cudefer_torch_bookkeeping_ns.argtypes = [ctypes.c_int]
        fields = stats_fields()
        dfields = device_stats_fields()

        def index(field, names=fields):
            return names.index(field) if field in names else -1
        # A library without per-device counters: the process's are used.
        per_device = hasattr(handle, "defer_device_stats_get_sized")

        fns = _Functions(
            _function(handle, "defer_pluggable_alloc_status"),
            _function(handle, "defer_pluggable_free"),
            _function(handle, "defer_record_stream"),
            _function(handle, "defer_trim"),
            _function(handle, "defer_stats_get_sized"),
            index("cache_bytes"), index("cache_mallocs"),
            index("cache_releases"),
            _function(handle, "defer_device_stats_get_sized")
            if per_device else None,
            index("cache_bytes", dfields) if per_device else -1,
            index("cache_mallocs", dfields), index("cache_releases", dfields),
            _function(handle, "defer_peer_access")
            if hasattr(handle, "defer_peer_access") else None,
            _function(handle, "defer_flush"),
            _function(handle, "defer_device_stats_reset_peaks")
            if hasattr(handle, "defer_device_stats_reset_peaks") else None,
            index("cache_bytes_peak", dfields) if per_device else -1)
        message = ctypes.create_string_buffer(1024)
        rc = install(ctypes.byref(fns), message, ctypes.sizeof(message))
        # The reason's first line: a C++ exception's text may add context
        # on lines of its own, and the error is said in one line.
        why = (message.value.decode(errors="replace").strip().splitlines()
               or ["no reason given"])[0]
        if rc == 3:
            raise RuntimeError(
                "cudefer.torch: call enable() before PyTorch first uses CUDA "
                "(a CUDA tensor, torch.cuda.set_device or current_device "
                "all do): PyTorch refused to change its allocator (%s)" % why)
        if rc == 5:
            raise RuntimeError("cudefer.torch: installing the allocator "
                               "failed: %s" % why)
        if rc not in (0, 4):
            raise RuntimeError("cudefer.torch: installing the allocator "
                               "failed (%d)" % rc)
        _state.update(library=library(), extension=extension)
        return _state["library"]


def enabled():
    """The path of the library enable() installed, or None."""
    return _state.get("library")


def recorded():
    """How many Tensor.record_stream calls reached cudefer; None before
    enable()."""
    ext = _state.get("extension")
    return None if ext is None else int(ext.cudefer_torch_recorded())


def bookkeeping_ns(pairs=1000000):
    """Nanoseconds of the allocator's own bookkeeping (pointer table and
    statistics, no CUDA call) per allocation and free, measured over pairs
    pairs now; None before enable().  Call it while no other thread
    allocates or frees CUDA memory: it runs on device 0's statistics, then
    puts their peaks and freed totals back as they were, losing what
    another thread's allocations and frees added meanwhile."""
    ext = _state.get("extension")
    return None if ext is None else ext.cudefer_torch_bookkeeping_ns(pairs)
