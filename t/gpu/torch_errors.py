#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_errors.py CASE: cudefer as PyTorch's allocator (cudefer.torch) when
a call fails.  t/gpu/gpu_torch.sh runs it with CUDEFER_LIB set; exit status 0 when the
case behaves, 1 (with the reason on stdout) when not, 77 without a GPU.

  oom   a request for twice the device's memory raises
        torch.OutOfMemoryError naming cudefer (PyTorch 2.11 would take a
        pluggable allocator's NULL for a tensor at address 0); afterwards
        the tensor made before is intact and new tensors compute
  huge  the same for 1 PiB, beyond any device's address space
        (t/gpu/gpu_alloc asks for both sizes through the C entry points).
        Both killed this process on an H100 (SIGSEGV in torch.empty): that
        machine's $CXX linked libstdc++ into the allocator statically, and
        its copy crashed formatting the message
        (t/gpu/results/2026-11-25-h100-hook-segv.txt); cudefer.torch now
        refuses such a build (t/python_package.py)
  late  enable() once PyTorch's own allocator has made a tensor raises
        RuntimeError saying to call it first, and PyTorch goes on working
"""
import faulthandler
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))

import torch  # noqa: E402
import cudefer.torch  # noqa: E402


def fail(why):
    print(why, flush=True)
    sys.exit(1)


def step(what):
    """Say what comes next: a crash then shows where it happened."""
    print(what, flush=True)


def oom(size=None):
    cudefer.torch.enable()
    kept = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    size = size or 2 * torch.cuda.get_device_properties(0).total_memory
    step("asking for %d GiB" % (size >> 30))
    try:
        huge = torch.empty(size, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        text = str(e)
        if "CUDA out of memory. Tried to allocate" not in text or \
                "cudefer" not in text:
            fail("OutOfMemoryError without cudefer's message: %s" % text)
        step("raised: %s" % text.splitlines()[0])
    else:
        fail("%d GiB allocated at 0x%x: no exception"
             % (size >> 30, huge.data_ptr()))
    step("reading the tensor made before")
    if not torch.equal(kept.cpu(), torch.arange(1 << 20, dtype=torch.float32)):
        fail("the tensor made before the failure changed")
    step("computing with a new tensor")
    x = torch.ones(1024, 1024, device="cuda")
    total = (x @ x).sum().item()
    if total != 1024.0 ** 3:
        fail("a new tensor computed %r after the failure" % total)


def late():
    first = torch.ones(16, device="cuda")  # PyTorch's own allocator
    try:
        cudefer.torch.enable()
    except RuntimeError as e:
        text = str(e)
        if "before PyTorch first uses CUDA" not in text:
            fail("RuntimeError without the advice: %s" % text)
        step("raised: %s" % text)
    else:
        fail("enable() after a CUDA tensor returned")
    if cudefer.torch.enabled() is not None:
        fail("enabled() says %r after the refusal" % (cudefer.torch.enabled(),))
    if (first * 2).sum().item() != 32.0:
        fail("PyTorch's allocator broke after the refusal")


if __name__ == "__main__":
    faulthandler.enable()  # a crash names its Python line on stderr
    if not torch.cuda.is_available():
        print("no CUDA device")
        sys.exit(77)
    {"oom": oom, "huge": lambda: oom(1 << 50),
     "late": late}[sys.argv[1]]()
