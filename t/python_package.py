#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""t/python_package.py: the cudefer Python package's errors, as TAP,
without PyTorch, CuPy or a GPU.

Each case runs in a fresh interpreter (the package loads one library per
process) with python/ on its path and, where the case needs one, a fake
`torch`, `cupy` or `numba` package in front of it: a torch with no CUDA,
one whose cpp_extension has no compiler, no ninja, no CUDA headers or fails
to compile; a cupy that records the allocator it is given; a numba.cuda
with each of its driver bindings, whose memory manager cudefer.numba
replaces (on a recording libcudefer built here: the pointer Numba gets, the
finalizer's free, out of memory, reset).  What must come out is the
one-line error naming what is missing.  Also: the library is
found and read (stats, version), a library without cudefer's entry points
is refused, and cudefer.torch.check_cxx_runtime refuses a shared object
with a C++ runtime of its own (a g++ build with -static-libstdc++: such an
allocator crashed PyTorch at its first out of memory) but takes one that
links libstdc++ dynamically.

    python3 t/python_package.py [LIBCUDEFER]

LIBCUDEFER defaults to src/.libs/libcudefer.so of the current directory
(make check runs it from the top of the build tree).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), "python")
LIB = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                      else os.path.join("src", ".libs", "libcudefer.so"))

results = []


def tap(ok, name, detail=""):
    results.append(ok)
    print("%s %d - %s" % ("ok" if ok else "not ok", len(results), name))
    if detail and not ok:
        for line in detail.splitlines()[-15:]:
            print("# " + line)


def skip(name, why):
    results.append(True)
    print("ok %d - %s # SKIP %s" % (len(results), name, why))


def py(code, fakes=None, env=None):
    """Run code in a fresh interpreter with python/ (and fakes, a dir of
    fake packages, before it) on its path; return (exit status, output)."""
    path = [PYTHON_DIR] + ([fakes] if fakes else [])
    full = dict(os.environ)
    for k in ("CUDEFER_LIB", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM",
              "TORCH_EXTENSIONS_DIR"):
        full.pop(k, None)
    full["PYTHONPATH"] = os.pathsep.join(([fakes] if fakes else []) +
                                         [PYTHON_DIR])
    full["PYTHONDONTWRITEBYTECODE"] = "1"
    full.update(env or {})
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=full, timeout=120)
    return run.returncode, run.stdout


def raises(code, kind, words, fakes=None, env=None):
    """Whether code raises kind with every one of words in its message, on
    one line."""
    rc, out = py("""
        try:
%s
        except %s as e:
            text = str(e)
            print("RAISED", text.replace("\\n", " | "))
            assert "\\n" not in text, "more than one line"
        else:
            print("NOT RAISED")
        """ % (textwrap.indent(textwrap.dedent(code), " " * 12), kind),
        fakes, env)
    raised = [l for l in out.splitlines() if l.startswith("RAISED ")]
    ok = rc == 0 and raised and all(w in raised[0] for w in words)
    return ok, out


FAKE_TORCH = '''
import types
__version__ = "2.11.0+fake"
version = types.SimpleNamespace(cuda=%(cuda)r)
'''

FAKE_EXTENSION = '''
import os
CUDA_HOME = %(cuda_home)r
def get_cxx_compiler():
    return %(cxx)r
def is_ninja_available():
    return %(ninja)r
def load(**kw):
    # A fake compiler's "build" is the file beside it named COMPILER.so.
    built = os.environ.get("CXX", "") + ".so"
    if os.path.isfile(built):
        return built
    raise RuntimeError("Error building extension 'cudefer_torch': boom")
'''

FAKE_CUPY = '''
import types
given = []
class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__("Out of memory allocating %%d bytes" %% size)
class _Stream:
    ptr = %(stream)d
def _set_allocator(f):
    given.append(f)
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner = ptr, size, owner
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
cuda = types.SimpleNamespace(
    set_allocator=_set_allocator, get_current_stream=lambda: _Stream(),
    runtime=types.SimpleNamespace(getDevice=lambda: 0),
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer)
'''


# A fake numba.cuda with what the EMM interface uses: the memory manager
# base class, MemoryPointer, set_memory_manager, the driver's binding (the
# CUDA Python one or ctypes), devices and contexts.  make_context() is
# Numba's first use of a GPU: a context made with the manager set then.
FAKE_NUMBA_CUDA = """
from .cudadrv.driver import (HostOnlyCUDAMemoryManager, MemoryPointer,
                             MemoryInfo, set_memory_manager)
"""

FAKE_NUMBA_DRIVER = """
import collections, contextlib, ctypes, types, weakref
NV = %(nv)r
if NV:
    class CUdeviceptr:
        def __init__(self, value=0):
            self.value = int(value)
        def __int__(self):
            return self.value
    binding = types.SimpleNamespace(
        CUdeviceptr=CUdeviceptr,
        CUresult=types.SimpleNamespace(
            CUDA_ERROR_OUT_OF_MEMORY="CUresult.CUDA_ERROR_OUT_OF_MEMORY"))
    %(nv_flag)s
else:
    USE_NV_BINDING = False
FREE, TOTAL = 3 << 30, 80 << 30
held = []
class CudaAPIError(Exception):
    def __init__(self, code, msg):
        self.code, self.msg = code, msg
        super().__init__(code, msg)
    def __str__(self):
        return "[%%s] %%s" %% (self.code, self.msg)
MemoryInfo = collections.namedtuple("MemoryInfo", "free,total")
class MemoryPointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context, self.device_pointer, self.size = context, pointer, size
        if finalizer is not None:
            self._finalizer = weakref.finalize(self, finalizer)
class HostOnlyCUDAMemoryManager:
    def __init__(self, *args, **kwargs):
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")
        self.host_resets = 0
    def reset(self):
        self.host_resets += 1
    @contextlib.contextmanager
    def defer_cleanup(self):
        held.append("host")
        try:
            yield
        finally:
            held.pop()
_memory_manager = None
def set_memory_manager(cls):
    global _memory_manager
    if cls(context=None).interface_version != 1:
        raise RuntimeError("EMM Plugin interface has another version")
    _memory_manager = cls
class Device:
    def __init__(self, devnum):
        self.id = devnum
        self.primary_context = None
class NumbaCUDAMemoryManager(HostOnlyCUDAMemoryManager):
    pass
class Context:
    def __init__(self, device):
        self.device = device
        self.memory_manager = (_memory_manager or
                               NumbaCUDAMemoryManager)(context=self)
class Driver:
    def __init__(self):
        self.devices = {}
    def cuMemGetInfo(self, *out):
        if NV:
            return FREE, TOTAL
        ctypes.cast(out[0], ctypes.POINTER(ctypes.c_size_t))[0] = FREE
        ctypes.cast(out[1], ctypes.POINTER(ctypes.c_size_t))[0] = TOTAL
driver = Driver()
def make_context(devnum=0):
    dev = driver.devices.setdefault(devnum, Device(devnum))
    dev.primary_context = Context(dev)
    return dev.primary_context
"""

# A libcudefer that records: allocations come from a static arena (never
# touched), above 1 GiB are out of memory, on a device other than 0 fail
# with cudaErrorInvalidDevice; frees and trims are counted and the last
# free's arguments kept for the test to read.
FAKE_LIBCUDEFER = r"""
#include <stddef.h>
#include <string.h>
static char arena[1 << 20];
static size_t used, frees, trims, allocs;
static void *free_ptr, *free_stream = (void *)1, *alloc_stream = (void *)1;
static size_t free_size;
static int free_device = -1;
int defer_pluggable_alloc_status(void **ptr, size_t size, int device,
                                 void *stream)
{
    *ptr = NULL;
    alloc_stream = stream;
    if (device != 0)
        return 101;
    if (size > ((size_t)1 << 30))
        return 2;
    *ptr = arena + used % sizeof arena;
    used += 256;
    allocs++;
    return 0;
}
void defer_pluggable_free(void *ptr, size_t size, int device, void *stream)
{
    free_ptr = ptr, free_size = size, free_device = device;
    free_stream = stream;
    frees++;
}
int defer_trim(size_t *released) { *released = 0; trims++; return 0; }
void defer_stats_get_sized(void *s, size_t n) { memset(s, 0, n); }
const char *defer_version(void) { return "fake"; }
int defer_record_stream(void *p, void *s) { (void)p; (void)s; return 0; }
int defer_alloc(void **p, size_t n, void *s) { (void)p; (void)n; (void)s; return 2; }
int defer_free(void *p, void *s) { (void)p; (void)s; return 0; }
size_t fake_allocs(void) { return allocs; }
size_t fake_frees(void) { return frees; }
size_t fake_trims(void) { return trims; }
void *fake_alloc_stream(void) { return alloc_stream; }
void *fake_free(size_t *size, int *device, void **stream)
{
    *size = free_size, *device = free_device, *stream = free_stream;
    return free_ptr;
}
"""


def fake_torch(root, cuda="13.0", cuda_home=None, cxx="c++", ninja=True):
    d = os.path.join(root, "torch")
    os.makedirs(os.path.join(d, "utils"), exist_ok=True)
    with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write(FAKE_TORCH % {"cuda": cuda})
    with open(os.path.join(d, "utils", "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(d, "utils", "cpp_extension.py"), "w") as f:
        f.write(FAKE_EXTENSION % {"cuda_home": cuda_home, "cxx": cxx,
                                  "ninja": ninja})
    return root


def fake_cupy(root, stream=0):
    d = os.path.join(root, "cupy")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write(FAKE_CUPY % {"stream": stream})
    return root


def fake_numba(root, nv=True, nv_flag=True):
    """A fake numba.cuda under root: nv, the CUDA Python binding (nv_flag:
    saying so in USE_NV_BINDING, as Numba with both bindings does; else
    only a `binding` module, as numba-cuda has), or ctypes."""
    d = os.path.join(root, "numba", "cuda", "cudadrv")
    os.makedirs(d, exist_ok=True)
    files = {
        "numba/__init__.py": "",
        "numba/cuda/__init__.py": FAKE_NUMBA_CUDA,
        "numba/cuda/cudadrv/__init__.py": "",
        "numba/cuda/cudadrv/driver.py": FAKE_NUMBA_DRIVER % {
            "nv": nv, "nv_flag": "USE_NV_BINDING = True" if nv_flag
            else "pass"},
        "numba/cuda/cudadrv/drvapi.py": "import ctypes\n"
                                        "cu_device_ptr = ctypes.c_size_t\n",
        "numba/cuda/cudadrv/enums.py": "CUDA_ERROR_OUT_OF_MEMORY = 2\n",
    }
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    return root


def main():
    print("# python %s, library %s" % (sys.version.split()[0], LIB))
    if not os.path.isfile(LIB):
        print("Bail out! %s not built" % LIB)
        return 1
    # A library built with a sanitizer (configure --enable-sanitizer)
    # cannot be loaded into an interpreter built without it.
    probe = subprocess.run([sys.executable, "-c", "import ctypes, sys; "
                            "ctypes.CDLL(sys.argv[1])", LIB],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    if probe.returncode != 0:
        why = (probe.stdout.strip().splitlines() or ["?"])[-1]
        print("1..0 # SKIP python3 cannot load %s (%s)" % (LIB, why[:120]))
        return 0
    tmp = tempfile.mkdtemp(prefix="cudefer-pkg.")
    try:
        cases(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1..%d" % len(results))
    return 0


def compiler_choice(tmp, headers, dynamic, static):
    """build()'s choice among $CUDEFER_CXX, $CXX, g++ and c++, with fake
    compilers whose builds are dynamic (shares PyTorch's C++ runtime) or
    static (carries its own)."""
    root = fake_torch(os.path.join(tmp, "choice"), cuda_home=headers)
    bin_dir = os.path.join(tmp, "choice-bin")
    os.makedirs(bin_dir)

    def compiler(name, build):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        os.chmod(path, 0o755)
        shutil.copy(build, path + ".so")
        return path
    own = compiler("own-runtime-c++", static)
    good = compiler("g++", dynamic)
    path = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    code = "import cudefer.torch as t; print('BUILT', t.build(verbose=True))"
    rc, out = py(code, root, dict(path, CXX=own))
    tap(rc == 0 and "BUILT %s.so" % good in out
        and "not using %s" % own in out,
        "a $CXX whose build carries its own C++ runtime is passed over for "
        "g++, and verbose says so", out)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", [own, "a C++ runtime of its own",
                                      "set CUDEFER_CXX"], root,
                     dict(path, CUDEFER_CXX=own))
    tap(ok and good not in out,
        "$CUDEFER_CXX is the only compiler tried: its refusal is said", out)
    shutil.copy(static, good + ".so")
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no C++ compiler built", own, good],
                     root, dict(path, CXX=own))
    tap(ok, "no compiler's build shares the runtime: each one said", out)


def cases(tmp):
    ok, out = raises('import cudefer; cudefer.load("/no/such/libcudefer.so")',
                     "FileNotFoundError", ["cudefer:", "lib=",
                                           "/no/such/libcudefer.so",
                                           "names no file"])
    tap(ok, "load(lib) of a missing file names it", out)
    ok, out = raises("import cudefer; cudefer.stats()", "FileNotFoundError",
                     ["$CUDEFER_LIB=/no/such.so", "names no file"],
                     env={"CUDEFER_LIB": "/no/such.so"})
    tap(ok, "a $CUDEFER_LIB naming no file is said", out)

    rc, out = py("""
        import cudefer
        s = cudefer.stats(%r)
        assert list(s) == cudefer.stats_fields(), list(s)
        assert all(isinstance(v, int) for v in s.values())
        print("VERSION", cudefer.version(), cudefer.library())
        """ % LIB)
    tap(rc == 0 and "VERSION " in out and LIB in out,
        "the library is loaded once and read: stats() and version()", out)
    rc, out = py("""
        import cudefer
        s = cudefer.device_stats(1, %r, reset_peaks=True)
        assert list(s) == cudefer.device_stats_fields(), list(s)
        assert tuple(s) == cudefer.KNOWN_DEVICE_STATS_FIELDS, list(s)
        assert set(s.values()) == {0}, s
        print("DEVICE1", s)
        """ % LIB)
    tap(rc == 0 and "DEVICE1 " in out,
        "device_stats(): one device's counters by the header's field names "
        "(an unused device: all 0)", out)
    for bad in ("-1", "64", "'0'", "True"):
        ok, out = raises("import cudefer; cudefer.device_stats(%s, %r)"
                         % (bad, LIB), "ValueError",
                         ["cudefer: device", "0 .. 63"])
        tap(ok, "device_stats(%s) is refused in one line" % bad, out)
    rc, out = py("""
        import cudefer
        cudefer.load(%r)
        try:
            cudefer.load("/bin/sh")
        except RuntimeError as e:
            print("RAISED", e)
        """ % LIB)
    tap("RAISED cudefer: %s is already loaded; cannot use /bin/sh too" % LIB
        in out, "a second library in the same process is refused", out)

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        other = os.path.join(tmp, "libother.so")
        src = os.path.join(tmp, "other.c")
        with open(src, "w") as f:
            f.write("int other(void) { return 1; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", other, src], check=True)
        ok, out = raises("import cudefer; cudefer.load(%r)" % other,
                         "RuntimeError", ["lacks defer_pluggable_alloc_status",
                                          "older than this package"])
        tap(ok, "a library without cudefer's entry points is refused", out)
    else:
        skip("a library without cudefer's entry points is refused", "no cc")

    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "ImportError", ["cudefer.torch: PyTorch is not installed"],
                     fakes=os.path.join(tmp, "none"))
    # (an empty fakes dir: real torch absent on the machine running make
    # check; where torch is installed this case says nothing useful)
    have_torch = py("import torch")[0] == 0
    if have_torch:
        skip("without torch: ImportError naming PyTorch", "torch installed")
    else:
        tap(ok, "without torch: ImportError naming PyTorch", out)

    root = fake_torch(os.path.join(tmp, "nocuda"), cuda=None)
    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "RuntimeError", ["built without CUDA"], fakes=root)
    tap(ok, "a torch without CUDA is said", out)
    root = fake_torch(os.path.join(tmp, "nocxx"),
                      cxx=os.path.join(tmp, "no-such-c++"))
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no C++ compiler", "no-such-c++",
                                      "set CUDEFER_CXX"], fakes=root,
                     env={"CUDEFER_CXX": os.path.join(tmp, "no-such-c++")})
    tap(ok, "no C++ compiler: said, with the name tried", out)
    # The cases below name the "compiler" (python3: found, never run).
    one = {"CUDEFER_CXX": sys.executable}
    root = fake_torch(os.path.join(tmp, "noninja"), cxx=sys.executable,
                      ninja=False)
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["needs ninja"], fakes=root, env=one)
    tap(ok, "no ninja: said", out)
    root = fake_torch(os.path.join(tmp, "noheaders"), cxx=sys.executable,
                      cuda_home=os.path.join(tmp, "no-cuda"))
    # pip's CUDA runtime package, where installed, has headers too.
    os.makedirs(os.path.join(root, "nvidia"))
    open(os.path.join(root, "nvidia", "__init__.py"), "w").close()
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["no CUDA runtime headers",
                                      "set CUDA_HOME"], fakes=root, env=one)
    tap(ok, "no CUDA headers: said", out)
    headers = os.path.join(tmp, "cuda")
    os.makedirs(os.path.join(headers, "include"))
    open(os.path.join(headers, "include", "cuda_runtime_api.h"), "w").close()
    root = fake_torch(os.path.join(tmp, "fails"), cxx=sys.executable,
                      cuda_home=headers)
    ok, out = raises("import cudefer.torch; cudefer.torch.enable(%r)" % LIB,
                     "RuntimeError", ["compiling", "torch_allocator.cpp",
                                      "boom", "build(verbose=True)"],
                     fakes=root, env=one)
    tap(ok, "a failed compilation: said, with the compiler's first line",
        out)

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        src = os.path.join(tmp, "fmt.cpp")
        with open(src, "w") as f:
            f.write('#include <sstream>\n#include <string>\n'
                    'extern "C" int fmt(unsigned long n, char *o) {'
                    ' std::ostringstream s; s << n; std::string t = s.str();'
                    ' o[t.copy(o, 30)] = 0; return 1; }\n')
        dyn = os.path.join(tmp, "dynamic.so")
        subprocess.run([cxx, "-shared", "-fPIC", "-o", dyn, src], check=True)
        rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                     % dyn)
        tap(rc == 0 and "WHY None" in out,
            "check_cxx_runtime takes a build that links libstdc++ dynamically",
            out)
        plain = os.path.join(tmp, "plain.so")
        with open(os.path.join(tmp, "plain.c"), "w") as f:
            f.write("int plain(int x) { return x + 1; }\n")
        subprocess.run([shutil.which("gcc") or shutil.which("cc") or cxx,
                        "-shared", "-fPIC", "-x", "c", "-o", plain,
                        os.path.join(tmp, "plain.c")], check=True)
        rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                     % plain)
        tap(rc == 0 and "WHY None" in out,
            "check_cxx_runtime takes a build that needs no C++ runtime of "
            "its own (its C++ calls reach torch's)", out)
        static = os.path.join(tmp, "static.so")
        built = subprocess.run([cxx, "-shared", "-fPIC", "-static-libstdc++",
                                "-o", static, src], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
        if built.returncode != 0:
            skip("check_cxx_runtime refuses a build with its own C++ runtime",
                 "no static libstdc++")
        else:
            rc, out = py("import cudefer.torch as t; print('WHY', t.check_cxx_runtime(%r))"
                         % static)
            tap(rc == 0 and "a C++ runtime of its own" in out,
                "check_cxx_runtime refuses a build with its own C++ runtime",
                out)
            compiler_choice(tmp, headers, dyn, static)
    else:
        skip("check_cxx_runtime", "no C++ compiler")

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
    numba_cases(tmp)


def numba_cases(tmp):
    """cudefer.numba with a fake numba.cuda: on a recording libcudefer (the
    pointer Numba gets, the finalizer's free, out of memory, reset, the
    other entry points), on the library just built, and its refusals."""
    have_numba = py("import numba.cuda")[0] == 0
    for code in ("cudefer.numba.enable(%r)" % LIB,
                 "cudefer.numba._numba_memory_manager"):
        ok, out = raises("import cudefer.numba; " + code, "ImportError",
                         ["cudefer.numba: Numba (numba.cuda) is not "
                          "installed"])
        if have_numba:
            skip("without numba: %s raises ImportError naming Numba" % code,
                 "numba installed")
        else:
            tap(ok, "without numba: %s raises ImportError naming Numba"
                % code.replace(LIB, "LIB"), out)

    root = fake_numba(os.path.join(tmp, "numba-ctx"))
    ok, out = raises("""
        from numba.cuda.cudadrv import driver
        import cudefer.numba
        driver.make_context(1)
        cudefer.numba.enable(%r)
        """ % LIB, "RuntimeError", ["cudefer.numba: Numba already holds a "
                                    "CUDA context on device 1",
                                    "before Numba first uses the GPU"],
        fakes=root)
    tap(ok, "cudefer.numba.enable() once Numba holds a context: refused in "
        "one line", out)

    root = fake_numba(os.path.join(tmp, "numba-real"))
    rc, out = py("""
        from numba.cuda.cudadrv import driver
        import cudefer.numba
        cudefer.numba.enable(%r)
        mm = driver.make_context(0).memory_manager
        try:
            p = mm.memalloc(1 << 20)
        except RuntimeError as e:
            print("REFUSED", e)
        else:
            print("ALLOCATED", int(p.device_pointer) != 0, p.size)
        """ % LIB, fakes=root)
    tap(rc == 0 and ("REFUSED cudefer.numba: allocating 1048576 bytes on "
                     "device 0 failed with CUDA error" in out
                     or "ALLOCATED True 1048576" in out),
        "cudefer.numba on the library just built: Numba's allocation comes "
        "from it, or its failure names the size, device and CUDA error", out)

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        skip("cudefer.numba on a recording libcudefer", "no cc")
        return
    fakelib = os.path.join(tmp, "libcudefer-recording.so")
    src = os.path.join(tmp, "recording.c")
    with open(src, "w") as f:
        f.write(FAKE_LIBCUDEFER)
    subprocess.run([cc, "-shared", "-fPIC", "-o", fakelib, src], check=True)
    check = """
        import ctypes, gc
        import numba.cuda as cuda
        from numba.cuda.cudadrv import driver
        import cudefer, cudefer.numba
        assert cudefer.numba.enable(%(lib)r) == %(lib)r
        assert cudefer.numba.enable() == %(lib)r, "a second call returns"
        cls = driver._memory_manager
        assert cls is cudefer.numba.manager_class(), cls
        assert cls is cudefer.numba._numba_memory_manager
        assert issubclass(cls, cuda.HostOnlyCUDAMemoryManager)
        h = cudefer.load()
        for name in ("fake_allocs", "fake_frees", "fake_trims"):
            getattr(h, name).restype = ctypes.c_size_t
        h.fake_alloc_stream.restype = ctypes.c_void_p
        h.fake_free.restype = ctypes.c_void_p
        mm = driver.make_context(0).memory_manager
        mm.initialize()

        p = mm.memalloc(4096)
        assert isinstance(p, cuda.MemoryPointer), type(p)
        assert type(p.device_pointer) is %(kind)s, type(p.device_pointer)
        addr = int(p.device_pointer.value)
        assert addr and p.size == 4096, (addr, p.size)
        assert h.fake_allocs() == 1 and h.fake_alloc_stream() is None
        assert h.fake_frees() == 0, "freed while Numba holds it"
        del p
        gc.collect()
        assert h.fake_frees() == 1, h.fake_frees()
        size, device, stream = ctypes.c_size_t(), ctypes.c_int(), \\
            ctypes.c_void_p(1)
        freed = h.fake_free(ctypes.byref(size), ctypes.byref(device),
                            ctypes.byref(stream))
        assert (freed, size.value, device.value, stream.value) == \\
            (addr, 4096, 0, None), (freed, size, device, stream)

        z = mm.memalloc(0)
        assert z.size == 0 and not int(z.device_pointer.value or 0)
        assert h.fake_allocs() == 1, "no library call for 0 bytes"
        del z
        assert h.fake_frees() == 1, "nothing to free for 0 bytes"
        try:
            mm.memalloc(2 << 30)
        except driver.CudaAPIError as e:
            assert e.code == %(oom)s, e.code
            assert "\\n" not in str(e)
            print("OOM", e)
        for bad in (-1, 1.5):
            try:
                mm.memalloc(bad)
            except ValueError as e:
                print("BAD", e)
        assert tuple(mm.get_memory_info()) == (driver.FREE, driver.TOTAL)
        try:
            mm.get_ipc_handle(None)
        except RuntimeError as e:
            print("IPC", e)
        mm.reset()
        assert h.fake_trims() == 1 and mm.host_resets == 1
        with mm.defer_cleanup():
            assert driver.held == ["host"], driver.held
        assert mm.interface_version == 1
        print("DONE")
        """
    for label, nv, nv_flag, kind, oom in (
            ("the CUDA Python binding (USE_NV_BINDING)", True, True,
             "driver.binding.CUdeviceptr",
             "driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY"),
            ("numba-cuda's binding only", True, False,
             "driver.binding.CUdeviceptr",
             "driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY"),
            ("the ctypes binding", False, False, "ctypes.c_size_t", "2")):
        root = fake_numba(os.path.join(tmp, "numba-%d%d" % (nv, nv_flag)),
                          nv=nv, nv_flag=nv_flag)
        rc, out = py(check % {"lib": fakelib, "kind": kind, "oom": oom},
                     fakes=root)
        tap(rc == 0 and "DONE" in out
            and "cudefer.numba: out of memory allocating 2147483648 bytes "
                "on device 0 (CUDA_ERROR_OUT_OF_MEMORY)" in out
            and "BAD cudefer.numba: cannot allocate -1 bytes" in out
            and "BAD cudefer.numba: cannot allocate 1.5 bytes" in out
            and "IPC cudefer.numba: CUDA IPC handles are not supported" in out,
            "cudefer.numba under %s: Numba gets its pointer kind with the "
            "size, the finalizer frees it on the legacy stream, out of "
            "memory is Numba's CudaAPIError, reset trims" % label, out)
    root = fake_numba(os.path.join(tmp, "numba-env"))
    rc, out = py("""
        import numba.cuda as cuda
        from numba.cuda.cudadrv import driver
        import cudefer.numba
        # What NUMBA_CUDA_MEMORY_MANAGER=cudefer.numba makes Numba do.
        cuda.set_memory_manager(cudefer.numba._numba_memory_manager)
        mm = driver.make_context(1).memory_manager
        mm.initialize()
        try:
            mm.memalloc(4096)
        except RuntimeError as e:
            print("REFUSED", e)
        """, fakes=root, env={"CUDEFER_LIB": fakelib})
    tap(rc == 0 and "REFUSED cudefer.numba: allocating 4096 bytes on device "
        "1 failed with CUDA error 101" in out,
        "NUMBA_CUDA_MEMORY_MANAGER=cudefer.numba: the manager loads "
        "$CUDEFER_LIB itself; an allocation's failure names the size, the "
        "context's device and the CUDA error", out)


if __name__ == "__main__":
    sys.exit(main())
