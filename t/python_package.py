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
destroyed with its object, as CuPy's.  The cases are in
python_package_library.py, python_package_torch.py and
python_package_cupy.py beside this file, what they run with in
python_package_harness.py and python_package_fakes.py.

    python3 t/python_package.py [LIBCUDEFER]

LIBCUDEFER defaults to src/.libs/libcudefer.so of the current directory
(make check runs it from the top of the build tree).
"""
import os
import shutil
import subprocess
import sys
import tempfile

# The modules beside this one leave no __pycache__ in the source tree.
sys.dont_write_bytecode = True

from python_package_cupy import cupy_cases  # noqa: E402
from python_package_harness import LIB, results  # noqa: E402
from python_package_library import library_cases  # noqa: E402
from python_package_torch import torch_cases  # noqa: E402


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


def cases(tmp):
    library_cases(tmp)
    torch_cases(tmp)
    cupy_cases(tmp)


if __name__ == "__main__":
    sys.exit(main())
