# SPDX-License-Identifier: MIT
"""The fake packages and library t/python_package.py's cases run with: a
torch (its CUDA version and cpp_extension's compiler, ninja, CUDA headers
and build chosen; torch.cuda initialized lazily, as PyTorch's), a cupy
that records the allocator it is given, and libcudefer linked with the
fake CUDA runtime."""
import os
import shutil
import subprocess
import sys

from python_package_harness import LIB

FAKE_TORCH = '''
import types
__version__ = "2.11.0+fake"
version = types.SimpleNamespace(cuda=%(cuda)r)
from . import cuda
'''

# torch.cuda as PyTorch 2.x has it: CUDA is initialized lazily, at the
# first use (a CUDA tensor, init, current_device, set_device), and
# is_initialized() says so from then on, except in a fork child of a process
# that initialized it (a bad fork: CUDA cannot be used there);
# is_available() initializes nothing of PyTorch's, but asks CUDA
# (cudaGetDeviceCount, which makes a fork child a bad fork too) unless
# $PYTORCH_NVML_BASED_CUDA_CHECK is 1.  The lazy init sets up PyTorch's own
# allocator, which its changeCurrentAllocator then refuses to swap: the
# stand-in install (FAKE_INSTALL_RC, read when it is called) refuses as it
# would, with 3.
FAKE_TORCH_CUDA = '''
import os
_initialized = False
_cuda_asked = False
_in_bad_fork = False
def _after_fork():
    global _in_bad_fork
    if _initialized or _cuda_asked:
        _in_bad_fork = True
os.register_at_fork(after_in_child=_after_fork)
def is_available():
    global _cuda_asked
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        _cuda_asked = True
    return True
def is_initialized():
    return _initialized and not _in_bad_fork
def _lazy_init():
    global _initialized
    if _in_bad_fork:
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")
    if not _initialized:
        os.environ["FAKE_INSTALL_RC"] = "3"
        _initialized = True
def init():
    _lazy_init()
def current_device():
    _lazy_init()
    return 0
def set_device(device):
    _lazy_init()
'''

FAKE_EXTENSION = '''
import os
import time
import torch
CUDA_HOME = %(cuda_home)r
# As cpp_extension's search for the CUDA toolkit, at import.
if CUDA_HOME and not torch.cuda.is_available():
    print("No CUDA runtime is found, using CUDA_HOME=%%r" %% CUDA_HOME)
def get_cxx_compiler():
    return %(cxx)r
def is_ninja_available():
    return %(ninja)r
def _get_build_directory(name, verbose):
    # $TORCH_EXTENSIONS_DIR/NAME, else one beside this fake; made.
    # $FAKE_BUILD_DIR_ERRNO fails its os.makedirs.
    if os.environ.get("FAKE_BUILD_DIR_ERRNO"):
        code = int(os.environ["FAKE_BUILD_DIR_ERRNO"])
        raise OSError(code, os.strerror(code), "/cache/torch_extensions/x")
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "torch_extensions")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path
def load(**kw):
    # Each call's name and sources, a line in $FAKE_LOAD_LOG.
    if os.environ.get("FAKE_LOAD_LOG"):
        with open(os.environ["FAKE_LOAD_LOG"], "a") as f:
            f.write(" ".join([kw["name"]] + kw["sources"]) + "\\n")
    directory = kw.get("build_directory") or _get_build_directory(
        kw["name"], kw.get("verbose", False))
    # The build holds the directory's file 'lock', made exclusively and
    # removed once done, as torch.utils.file_baton.FileBaton's; another
    # process's load waits while that file is there, for good.  A build
    # takes $FAKE_BUILD_SECONDS.
    lock = os.path.join(directory, "lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        while os.path.exists(lock):
            time.sleep(0.1)
    else:
        try:
            time.sleep(float(os.environ.get("FAKE_BUILD_SECONDS", "0")))
        finally:
            os.close(fd)
            os.remove(lock)
    # A fake compiler's "build" is the file beside it named COMPILER.so,
    # loaded as cpp_extension loads a build that is no Python module
    # (torch.ops.load_library: ctypes.CDLL, its OSError raised as is).
    built = os.environ.get("CXX", "") + ".so"
    if os.path.isfile(built):
        import ctypes
        ctypes.CDLL(built)
        return built
    # cpp_extension's message: its own line, then ninja's output.
    raise RuntimeError("Error building extension 'cudefer_torch': "
                       + os.environ.get("FAKE_BUILD_OUTPUT", "boom"))
'''

FAKE_CUPY = '''
import ctypes
import os
import types
given = []
pool_frees = []
class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__("Out of memory allocating %%d bytes" %% size)
class _Stream:
    ptr = %(stream)d
_current = []
class Stream:
    # A created stream of the fake CUDA runtime $FAKE_CUDA_LIB, destroyed
    # when the object goes, as CuPy's are.
    def __init__(self):
        self._runtime = ctypes.CDLL(os.environ["FAKE_CUDA_LIB"])
        handle = ctypes.c_void_p()
        assert self._runtime.cudaStreamCreate(ctypes.byref(handle)) == 0
        self.ptr = handle.value
    def __enter__(self):
        _current.append(self)
        return self
    def __exit__(self, *exc):
        _current.pop()
    def __del__(self):
        self._runtime.cudaStreamDestroy(ctypes.c_void_p(self.ptr))
def _get_current_stream():
    return _current[-1] if _current else _Stream()
def _set_allocator(f):
    given.append(f)
class _Pool:
    def free_all_blocks(self):
        pool_frees.append(True)
_pool = _Pool()
def get_default_memory_pool():
    return _pool
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner = ptr, size, owner
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
cuda = types.SimpleNamespace(
    set_allocator=_set_allocator, get_current_stream=_get_current_stream,
    Stream=Stream, runtime=types.SimpleNamespace(getDevice=lambda: 0),
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer)
'''


def fake_torch(root, cuda="13.0", cuda_home=None, cxx="c++", ninja=True):
    d = os.path.join(root, "torch")
    os.makedirs(os.path.join(d, "utils"), exist_ok=True)
    with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write(FAKE_TORCH % {"cuda": cuda})
    with open(os.path.join(d, "utils", "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(d, "cuda.py"), "w") as f:
        f.write(FAKE_TORCH_CUDA)
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


def fake_runtime_library(tmp):
    """libcudefer with the fake CUDA runtime in it, as a shared object (from
    make check's t/libcudefer-fake.la and t/libtap.la, beside LIB's build
    tree), for the cases that allocate and free; (path, None), or (None,
    why not)."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(LIB)))
    archives = [os.path.join(top, "t", ".libs", name)
                for name in ("libcudefer-fake.a", "libtap.a")]
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no cc"
    if not all(os.path.isfile(a) for a in archives):
        return None, "%s not built" % archives[0]
    path = os.path.join(tmp, "libcudefer-fake.so")
    built = subprocess.run([cc, "-shared", "-o", path, "-Wl,--whole-archive",
                            archives[0], "-Wl,--no-whole-archive",
                            archives[1], "-lpthread", "-ldl", "-lrt"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    if built.returncode != 0:
        return None, "linking it failed"
    probe = subprocess.run([sys.executable, "-c", "import ctypes, sys; "
                            "ctypes.CDLL(sys.argv[1])", path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if probe.returncode != 0:
        return None, "python3 cannot load it"
    return path, None
