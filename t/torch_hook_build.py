#!/usr/bin/env python3
"""t/torch_hook_build.py: how python/cudefer_torch.py picks the compiler
of its PyTorch hook, as TAP, without PyTorch or a GPU.

The hook shares C++ objects (strings, std::function, exceptions, iostream
locales) with libtorch, so it must use the process's libstdc++.so.  On an
H100 machine whose $CXX linked libstdc++ into the hook statically, the
first out of memory crashed the process (SIGSEGV while the hook built the
exception's message).  build_hook now takes the first compiler whose build
lists libstdc++.so in its dynamic section and says why it skipped others.

A fake `torch` package (headers that exist, empty libc10/libtorch_cuda
stubs) lets build_hook run; the hook's source is replaced by a small C++
file that formats a number into a string, as the real one does.  The
"static" compiler is a script that adds -static-libstdc++ to the first of
$CXX, g++, c++ that links libstdc++ dynamically (the GPU machine's $CXX
does not).  Run: python3 t/torch_hook_build.py.  Exits 0 with "1..0 # SKIP"
without a C++ compiler or without a static libstdc++ to test against."""
import io
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree

SOURCE = r'''#include <sstream>
#include <string>
extern "C" int hook_format(unsigned long n, char *out, unsigned long size)
{
    std::ostringstream s;
    s << "tried to allocate " << n << " bytes";
    std::string text = s.str();
    return text.copy(out, size - 1) > 0;
}
'''

FAKE_EXTENSION = '''import os
ROOT = %r
CUDA_HOME = os.path.join(ROOT, "cuda")
def include_paths():
    return [os.path.join(ROOT, "include")]
def library_paths():
    return [os.path.join(ROOT, "lib")]
'''

tests = []


def ok(cond, what):
    tests.append(bool(cond))
    print("%s %d - %s" % ("ok" if cond else "not ok", len(tests), what))
    return bool(cond)


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def make_tree(root, real_cxx):
    """The fake torch and the two compiler scripts under root; returns the
    path of the static compiler script."""
    os.makedirs(os.path.join(root, "torch", "utils"))
    with open(os.path.join(root, "torch", "__init__.py"), "w") as f:
        f.write("__version__ = '0.0-fake'\n"
                "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n")
    open(os.path.join(root, "torch", "utils", "__init__.py"), "w").close()
    with open(os.path.join(root, "torch", "utils", "cpp_extension.py"),
              "w") as f:
        f.write(FAKE_EXTENSION % root)
    headers = os.path.join(root, "include", "torch", "csrc", "cuda")
    os.makedirs(headers)
    open(os.path.join(headers, "CUDAPluggableAllocator.h"), "w").close()
    os.makedirs(os.path.join(root, "cuda", "include"))
    open(os.path.join(root, "cuda", "include", "cuda_runtime_api.h"),
         "w").close()
    lib = os.path.join(root, "lib")
    os.makedirs(lib)
    empty = os.path.join(root, "empty.cpp")
    open(empty, "w").close()
    for name in ("c10", "c10_cuda", "torch_cuda"):
        r = run(real_cxx + ["-shared", "-fPIC", empty, "-o",
                            os.path.join(lib, "lib%s.so" % name)])
        if r.returncode != 0:
            raise RuntimeError("stub lib%s.so: %s" % (name, r.stdout))
    static = os.path.join(root, "static-cxx")
    with open(static, "w") as f:
        f.write("#!/bin/sh\nexec %s -static-libstdc++ \"$@\"\n"
                % " ".join(real_cxx))
    os.chmod(static, 0o755)
    return static


def main():
    root = tempfile.mkdtemp(prefix="torch_hook_build.")
    try:
        return body(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def dynamic_compiler(root, source, ct):
    """The first of $CXX, g++, c++ whose plain build of source needs
    libstdc++.so (a machine's $CXX may link it statically: the case this
    file is about), as an argument list; None when there is none."""
    for cxx in (os.environ.get("CXX"), "g++", "c++"):
        if not cxx or shutil.which(cxx.split()[0]) is None:
            continue
        out = os.path.join(root, "plain.so")
        r = run(cxx.split() + ["-shared", "-fPIC", source, "-o", out])
        if r.returncode == 0 and ct._static_cxx_runtime(out) is None \
                and ct._needed_libraries(out) is not None:
            return cxx.split()
    return None


def body(root):
    source = os.path.join(root, "hook.cpp")
    with open(source, "w") as f:
        f.write(SOURCE)
    import cudefer_torch as ct
    real_cxx = dynamic_compiler(root, source, ct)
    if real_cxx is None:
        print("1..0 # SKIP no C++ compiler here ($CXX, g++, c++) links "
              "libstdc++ dynamically")
        return 0
    static = make_tree(root, real_cxx)
    sys.path.insert(0, root)  # the fake torch
    # Does this machine have a static libstdc++ to test against at all?
    probe = os.path.join(root, "probe.so")
    r = run([static, "-shared", "-fPIC", source, "-o", probe])
    if r.returncode != 0 or ct._needed_libraries(probe) is None:
        print("1..0 # SKIP %s -static-libstdc++ does not link here: %s"
              % (" ".join(real_cxx), r.stdout.strip()[-200:]))
        return 0
    print("1..8")
    plain = os.path.join(root, "plain.so")
    r = run(real_cxx + ["-shared", "-fPIC", source, "-o", plain])
    needed = ct._needed_libraries(plain) or []
    ok(any(n.startswith("libstdc++.so") for n in needed),
       "a plain build needs libstdc++.so (%s)" % ", ".join(needed))
    ok(ct._static_cxx_runtime(plain) is None
       and "libstdc++" in (ct._static_cxx_runtime(probe) or ""),
       "a -static-libstdc++ build is told apart: %s"
       % ct._static_cxx_runtime(probe))
    ok(ct._needed_libraries(source) is None
       and ct._static_cxx_runtime(source) is None,
       "a file that is no ELF object is not judged")

    ct._HOOK_SOURCE = source
    os.environ[ct.CACHE_ENV] = os.path.join(root, "cache")
    os.environ.pop(ct.CXX_ENV, None)
    os.environ["CXX"] = static
    err = io.StringIO()
    with redirect_stderr(err):
        hook = ct.build_hook(verbose=True)
    ok(ct._static_cxx_runtime(hook) is None,
       "$CXX linking libstdc++ statically: build_hook takes the next "
       "compiler (%s)" % os.path.basename(hook))
    ok("not using %s" % static in err.getvalue()
       and "links the C++ runtime into the hook" in err.getvalue(),
       "verbose says which compiler was skipped and why")
    cached = os.listdir(os.environ[ct.CACHE_ENV])
    ok(cached == [os.path.basename(hook)],
       "the static build is not left in the cache (%s)" % cached)

    os.environ[ct.CXX_ENV] = static
    messages = []
    for _ in range(2):
        try:
            ct.build_hook()
            messages.append("no HookError")
        except ct.HookError as e:
            messages.append(str(e))
    ok(all(static in m and "links the C++ runtime" in m
           and "$" + ct.CXX_ENV in m for m in messages),
       "$%s names the static compiler: HookError saying why, twice "
       "(%s)" % (ct.CXX_ENV, messages[-1].splitlines()[0]))
    os.environ[ct.CXX_ENV] = os.path.join(root, "no-such-compiler")
    try:
        ct.build_hook()
        message = "no HookError"
    except ct.HookError as e:
        message = str(e)
    ok("no-such-compiler" in message and "cannot run it" in message,
       "a compiler that does not exist: HookError naming it")
    return 0 if all(tests) else 1


if __name__ == "__main__":
    sys.exit(main())
