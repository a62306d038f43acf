#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
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
import ctypes
import io
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree

SOURCE = r"""#include <sstream>
#include <string>
extern "C" int hook_format(unsigned long n, char *out, unsigned long size)
{
    std::ostringstream s;
    s << "tried to allocate " << n << " bytes";
    std::string text = s.str();
    out[text.copy(out, size - 1)] = 0;
    return 1;
}
"""

# libc10.so's stub: it needs libstdc++ as the real one does (also where the
# linker drops libraries nothing uses, --as-needed).
C10_STUB = r"""#include <string>
std::string c10_stub(const char *s) { return std::string(s) + "!"; }
"""

FAKE_EXTENSION = """import os
ROOT = %r
CUDA_HOME = os.path.join(ROOT, "cuda")
def include_paths():
    return [os.path.join(ROOT, "include")]
def library_paths():
    return [os.path.join(ROOT, "lib")]
"""

tests = []


def ok(cond, what):
    tests.append(bool(cond))
    print("%s %d - %s" % ("ok" if cond else "not ok", len(tests), what))
    return bool(cond)


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def write(path, text, mode=None):
    with open(path, "w") as f:
        f.write(text)
    if mode is not None:
        os.chmod(path, mode)


def make_tree(root, real_cxx):
    """The fake torch, its stub libraries, and three compiler scripts:
    bin/g++ and bin/c++ run real_cxx (put first in PATH, so that
    build_hook's fallbacks find a compiler that links dynamically), and
    static-cxx adds -static-libstdc++ to it.  Returns static-cxx's path."""
    os.makedirs(os.path.join(root, "torch", "utils"))
    write(os.path.join(root, "torch", "__init__.py"),
          "__version__ = '0.0-fake'\n"
          "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n")
    write(os.path.join(root, "torch", "utils", "__init__.py"), "")
    write(os.path.join(root, "torch", "utils", "cpp_extension.py"),
          FAKE_EXTENSION % root)
    headers = os.path.join(root, "include", "torch", "csrc", "cuda")
    os.makedirs(headers)
    write(os.path.join(headers, "CUDAPluggableAllocator.h"), "")
    os.makedirs(os.path.join(root, "cuda", "include"))
    write(os.path.join(root, "cuda", "include", "cuda_runtime_api.h"), "")
    lib = os.path.join(root, "lib")
    os.makedirs(lib)
    write(os.path.join(root, "empty.cpp"), "")
    write(os.path.join(root, "c10.cpp"), C10_STUB)
    for name, src in (("c10", "c10.cpp"), ("c10_cuda", "empty.cpp"),
                      ("torch_cuda", "empty.cpp")):
        r = run(real_cxx + ["-shared", "-fPIC", os.path.join(root, src), "-o",
                            os.path.join(lib, "lib%s.so" % name)])
        if r.returncode != 0:
            raise RuntimeError("stub lib%s.so: %s" % (name, r.stdout))
    os.makedirs(os.path.join(root, "bin"))
    # An absolute path: bin/g++ must not find itself.
    absolute = [shutil.which(real_cxx[0])] + real_cxx[1:]
    quoted = " ".join(shlex.quote(w) for w in absolute)
    for name in ("g++", "c++"):
        write(os.path.join(root, "bin", name),
              "#!/bin/sh\nexec %s \"$@\"\n" % quoted, 0o755)
    static = os.path.join(root, "static-cxx")
    write(static, "#!/bin/sh\nexec %s -static-libstdc++ \"$@\"\n" % quoted,
          0o755)
    return static


def dynamic_compiler(root, source, ct):
    """The first of $CXX, g++, c++ whose plain build of source needs
    libstdc++.so (a machine's $CXX may link it statically: the case this
    file is about), as an argument list; None when there is none."""
    for cxx in (os.environ.get("CXX"), "g++", "c++"):
        words = shlex.split(cxx or "")
        if not words or shutil.which(words[0]) is None:
            continue
        out = os.path.join(root, "plain.so")
        r = run(words + ["-shared", "-fPIC", source, "-o", out])
        if r.returncode == 0 and ct._foreign_cxx_runtime(out, set()) is None:
            return words
    return None


def build(ct, **env):
    """build_hook(verbose=True) with env set (None: unset): (the hook's
    path or the HookError's text, what it said on stderr)."""
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            return ct.build_hook(verbose=True), err.getvalue()
    except ct.HookError as e:
        return "HookError: %s" % e, err.getvalue()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    root = tempfile.mkdtemp(prefix="torch_hook_build.")
    try:
        return body(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def body(root):
    source = os.path.join(root, "hook.cpp")
    write(source, SOURCE)
    import cudefer_torch as ct
    real_cxx = dynamic_compiler(root, source, ct)
    if real_cxx is None:
        print("1..0 # SKIP no C++ compiler here ($CXX, g++, c++) links "
              "libstdc++ dynamically")
        return 0
    static = make_tree(root, real_cxx)
    sys.path.insert(0, root)  # the fake torch
    os.environ["PATH"] = os.path.join(root, "bin") + os.pathsep + \
        os.environ.get("PATH", "")
    # Does this machine have a static libstdc++ to test against at all?
    probe = os.path.join(root, "probe.so")
    r = run([static, "-shared", "-fPIC", source, "-o", probe])
    if r.returncode != 0 or ct._foreign_cxx_runtime(probe, set()) is None:
        print("1..0 # SKIP %s -static-libstdc++ links no static libstdc++ "
              "here: %s" % (" ".join(real_cxx), r.stdout.strip()[-200:]))
        return 0
    print("1..12")
    plain = os.path.join(root, "plain.so")
    run(real_cxx + ["-shared", "-fPIC", source, "-o", plain])
    needed = ct._needed_libraries(plain) or []
    ok(any(n.startswith("libstdc++.so") for n in needed),
       "a plain build needs libstdc++.so (%s)" % ", ".join(needed))
    wanted = ct._torch_cxx_runtimes([os.path.join(root, "lib")])
    ok(any(n.startswith("libstdc++.so") for n in wanted),
       "the C++ runtime libc10.so needs is read from it (%s)"
       % ", ".join(sorted(wanted)))
    why = ct._foreign_cxx_runtime(probe, wanted) or ""
    ok(ct._foreign_cxx_runtime(plain, wanted) is None and "libstdc++" in why,
       "a -static-libstdc++ build is told apart: %s" % why)
    ok(ct._needed_libraries(source) is None
       and "cannot read" in (ct._foreign_cxx_runtime(source, wanted) or ""),
       "a file that is no ELF object is refused, not passed")
    # Section headers gone (as sstrip leaves a file): read all the same.
    stripped = os.path.join(root, "stripped.so")
    with open(plain, "rb") as f:
        data = bytearray(f.read())
    data[0x28:0x30] = bytes(8)            # e_shoff
    data[0x3C:0x40] = bytes(4)            # e_shnum, e_shstrndx
    with open(stripped, "wb") as f:
        f.write(data)
    ok(ct._needed_libraries(stripped) == needed,
       "without section headers the dynamic segment still names them")

    ct._HOOK_SOURCE = source
    cache = os.path.join(root, "cache")
    os.environ[ct.CACHE_ENV] = cache
    hook, said = build(ct, CXX=static, CUDEFER_CXX=None)
    text = ctypes.create_string_buffer(64)
    loaded = not hook.startswith("HookError") and \
        ctypes.CDLL(hook).hook_format(ctypes.c_ulong(12345), text, 64) == 1
    ok(loaded and text.value == b"tried to allocate 12345 bytes",
       "$CXX linking libstdc++ statically: build_hook takes the next "
       "compiler, whose hook loads and formats a number (%r)" % text.value)
    ok("not using %s" % static in said and "static" not in hook
       and "does not link libstdc++" in said,
       "verbose says which compiler was skipped and why")
    files = sorted(os.listdir(cache))
    ok(len(files) == 2 and os.path.basename(hook) in files
       and any(f.endswith(".rejected") for f in files),
       "the cache holds the hook and the rejection, no static build (%s)"
       % files)
    again, said = build(ct, CXX=static, CUDEFER_CXX=None)
    ok(again == hook and "remembered" in said
       and "%s -shared" % static not in said,
       "the next build_hook does not run the static compiler again")
    msgs = [build(ct, CUDEFER_CXX=static)[0] for _ in range(2)]
    ok(all(m.startswith("HookError") and static in m
           and "does not link libstdc++" in m and "$" + ct.CXX_ENV in m
           for m in msgs),
       "$%s names the static compiler: HookError saying why, twice (%s)"
       % (ct.CXX_ENV, msgs[-1].splitlines()[0]))
    missing = build(ct, CUDEFER_CXX=os.path.join(root, "no-such-compiler"))[0]
    ok("no-such-compiler" in missing and "cannot run it" in missing,
       "a compiler that does not exist: HookError naming it")
    blank = build(ct, CUDEFER_CXX="  ", CXX=None)[0]
    quote = build(ct, CUDEFER_CXX="g++ 'unclosed")[0]
    ok(blank == hook and quote.startswith("HookError")
       and "unclosed" in quote,
       "a blank $%s counts as unset; an unbalanced quote is a HookError"
       % ct.CXX_ENV)
    return 0 if all(tests) else 1


if __name__ == "__main__":
    sys.exit(main())
