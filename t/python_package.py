#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""t/python_package.py: the cudefer Python package's errors, as TAP,
without PyTorch, CuPy or a GPU.

Each case runs in a fresh interpreter (the package loads one library per
process) with python/ on its path and, where the case needs one, a fake
`torch` or `cupy` package in front of it: a torch with no CUDA, one whose
cpp_extension has no compiler, no ninja, no CUDA headers or fails to
compile; a cupy that records the allocator it is given.  What must come
out is the one-line error naming what is missing.  Also: the library is
found and read (stats, version), a library without cudefer's entry points
is refused, and cudefer.torch.check_cxx_runtime refuses a shared object
with a C++ runtime of its own (a g++ build with -static-libstdc++: such an
allocator crashed PyTorch at its first out of memory) but takes one that
links libstdc++ dynamically.  cudefer.cupy's allocations and frees run
on the library built with the fake CUDA runtime (make check's
t/libcudefer-fake.la, linked here into a shared object; skipped where it
is not built), with a fake cupy whose Stream is a stream of that runtime,
destroyed with its object, as CuPy's.

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
    # Each call's name and sources, a line in $FAKE_LOAD_LOG.
    if os.environ.get("FAKE_LOAD_LOG"):
        with open(os.environ["FAKE_LOAD_LOG"], "a") as f:
            f.write(" ".join([kw["name"]] + kw["sources"]) + "\\n")
    # A fake compiler's "build" is the file beside it named COMPILER.so.
    built = os.environ.get("CXX", "") + ".so"
    if os.path.isfile(built):
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


def allocator_files(tmp, headers, dynamic):
    """build() with the allocator's files: it compiles every unit the
    package has, names the build after every file's contents, says a
    missing one and names the unit that failed to compile.  Runs on a copy
    of the package (in front of python/ on the path), edited."""
    rc, out = py("import cudefer.torch as t; print('FILES', t.SOURCES, "
                 "t.HEADERS)")
    words = out.split()
    shipped = sorted(f for f in os.listdir(os.path.join(PYTHON_DIR, "cudefer"))
                     if f.endswith((".cpp", ".h")))
    listed = sorted(os.path.basename(w.strip("[]',")) for w in words[1:])
    tap(rc == 0 and listed == shipped,
        "SOURCES and HEADERS list every .cpp and .h of the package, each "
        "there", "%s\nshipped %s, listed %s" % (out, shipped, listed))

    root = fake_torch(os.path.join(tmp, "files"), cuda_home=headers)
    package = os.path.join(root, "cudefer")
    shutil.copytree(os.path.join(PYTHON_DIR, "cudefer"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    cxx = os.path.join(tmp, "files-bin", "g++")
    os.makedirs(os.path.dirname(cxx))
    with open(cxx, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(cxx, 0o755)
    shutil.copy(dynamic, cxx + ".so")
    log = os.path.join(tmp, "files.log")
    env = {"CUDEFER_CXX": cxx, "FAKE_LOAD_LOG": log}
    code = ("import cudefer.torch as t; print('BUILT', t.build()); "
            "print('SOURCES', ' '.join(t.SOURCES + t.HEADERS))")

    def build():
        """(the build's name, its sources, all files) or None."""
        if os.path.exists(log):
            os.remove(log)
        rc, out = py(code, root, env)
        files = [l.split()[1:] for l in out.splitlines()
                 if l.startswith("SOURCES ")]
        if rc != 0 or not files or not os.path.exists(log):
            return None, out
        with open(log) as f:
            called = f.read().split()
        return (called[0], called[1:], files[0]), out
    base, out = build()
    units = [] if base is None else base[1]
    tap(base is not None and units and
        all(u.endswith(".cpp") and os.path.dirname(u) == package
            for u in units) and base[2] == units + [
                p for p in base[2] if p.endswith(".h")],
        "build() hands cpp_extension every unit, from the package", out)
    if base is None:
        return
    for path in base[2]:
        with open(path) as f:
            saved = f.read()
        with open(path, "a") as f:
            f.write("\n// edited\n")
        edited, out_edited = build()
        with open(path, "w") as f:
            f.write(saved)
        again, out_again = build()
        tap(edited is not None and edited[0] != base[0] and again == base,
            "an edit of %s is a build of its own name"
            % os.path.basename(path), out_edited + out_again)
    header = [p for p in base[2] if p.endswith(".h")][0]
    os.rename(header, header + ".away")
    ok, out = raises("import cudefer.torch; cudefer.torch.build()",
                     "RuntimeError", ["cudefer.torch:", header, "is missing"],
                     root, env)
    os.rename(header + ".away", header)
    tap(ok, "a missing header is said", out)

    fail = dict(env, CUDEFER_CXX=sys.executable)
    last = units[-1]
    stem = os.path.splitext(os.path.basename(last))[0]
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["compiling %s with" % last, "build(verbose=True)"], root,
        dict(fail, FAKE_BUILD_OUTPUT="[2/4] c++ -c %s -o %s.o\nFAILED: "
             "%s.o\n%s:12:5: error: 'x' was not declared in this scope"
             % (last, stem, stem, last)))
    others = [u for u in units if u != last]
    tap(ok and not any(u in l for u in others for l in out.splitlines()
                       if l.startswith("RAISED")),
        "a failed compilation names the unit the compiler blamed, only it",
        out)
    ok, out = raises(
        "import cudefer.torch; cudefer.torch.build()", "RuntimeError",
        ["compiling %s with" % header], root,
        dict(fail, FAKE_BUILD_OUTPUT="".join(
            "FAILED: %s.o\n%s:3:1: error: expected ';'\n"
            % (os.path.splitext(os.path.basename(u))[0], header)
            for u in units)))
    tap(ok and not any(u in l for u in units for l in out.splitlines()
                       if l.startswith("RAISED")),
        "an error in the header names the header, not the units that "
        "include it", out)


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
    rc, out = py("""
        import cudefer
        cudefer.load(%r)
        print("STATS", len(cudefer.stats()), cudefer.version())
        """ % LIB, env={"CUDEFER_LIB": "/bin/sh"})
    tap(rc == 0 and "STATS " in out,
        "after load(lib), stats() and version() use that library, whatever "
        "$CUDEFER_LIB names", out)
    # Found by the dynamic loader's search (pkg-config finding nothing):
    # the same file named by its path afterwards is the same library.
    empty = os.path.join(tmp, "no-pc")
    os.makedirs(empty)
    search = {"LD_LIBRARY_PATH": os.path.dirname(LIB),
              "PKG_CONFIG_LIBDIR": empty, "PKG_CONFIG_PATH": empty}
    rc, out = py("""
        import ctypes.util, cudefer
        if ctypes.util.find_library("cudefer") is None:
            print("NO LOADER SEARCH")
        else:
            cudefer.load()
            print("FOUND", cudefer.library())
            cudefer.load(%r)
            print("SAME", cudefer.library())
        """ % LIB, env=search)
    name = ("a library the loader found is its file: load() of its path "
            "is the same library, library() a path")
    if "NO LOADER SEARCH" in out:
        skip(name, "ctypes.util.find_library does not search "
             "LD_LIBRARY_PATH here")
    else:
        found = [l.split(" ", 1)[1] for l in out.splitlines()
                 if l.startswith("FOUND ")]
        tap(rc == 0 and "SAME " in out and found and os.sep in found[0]
            and os.path.realpath(found[0]) == os.path.realpath(LIB),
            name, out)

    # Installed away from a source tree (pip install ./python), found
    # nowhere: the error lists the places searched, and no source tree's
    # src/.libs beside site-packages, which no one built.
    site = os.path.join(tmp, "site")
    shutil.copytree(os.path.join(PYTHON_DIR, "cudefer"),
                    os.path.join(site, "cudefer"))
    nowhere = {"LD_LIBRARY_PATH": "", "PKG_CONFIG_LIBDIR": empty,
               "PKG_CONFIG_PATH": empty}
    name = ("an installed package that finds no library says where it "
            "looked, no made-up source tree among them")
    rc, out = py("import ctypes.util; "
                 "print('LOADER', ctypes.util.find_library('cudefer'))",
                 env=nowhere)
    if "LOADER None" not in out:
        skip(name, "the loader's search finds a libcudefer here")
    else:
        ok, out = raises("import cudefer; cudefer.load()",
                         "FileNotFoundError",
                         ["libcudefer not found", "make install",
                          "the loader's search"], fakes=site, env=nowhere)
        tap(ok and os.path.join("src", ".libs") not in out, name, out)

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
        allocator_files(tmp, headers, dyn)
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


if __name__ == "__main__":
    sys.exit(main())
