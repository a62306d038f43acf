#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""cudefer as PyTorch's CUDA allocator: a few training steps, PyTorch's
memory statistics, and a tensor shared with a side stream through
record_stream.

    pip install ./python            # once, or PYTHONPATH=python
    CUDEFER_LIB=src/.libs/libcudefer.so python3 examples/torch_allocator.py

(from the top of a tree built in place; after an out-of-tree build, give
CUDEFER_LIB that build's src/.libs/libcudefer.so and run the tree's
examples/torch_allocator.py.  Without CUDEFER_LIB, cudefer looks for the
installed library, then in src/.libs of the source tree.)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))

import torch  # noqa: E402
import cudefer  # noqa: E402
import cudefer.torch  # noqa: E402


def main():
    if not torch.cuda.is_available():
        sys.exit("torch_allocator: no CUDA device")
    # Before PyTorch first uses CUDA (a tensor, set_device): it cannot change
    # an allocator it has set up.
    lib = cudefer.torch.enable()
    print("allocator: %s" % lib)

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(20):
        x = torch.randn(256, 1024, device="cuda")
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print("loss after 20 steps: %.4f" % loss.item())
    # PyTorch's own memory calls work as under its allocator.
    print("allocated %d MiB (peak %d MiB), reserved %d MiB" % (
        torch.cuda.memory_allocated() >> 20,
        torch.cuda.max_memory_allocated() >> 20,
        torch.cuda.memory_reserved() >> 20))

    # A tensor made on the current stream and read on another one: tell the
    # allocator with record_stream, then it may be freed at once.
    side = torch.cuda.Stream()
    data = torch.randn(4096, 4096, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        total = (data @ data).sum()
    data.record_stream(side)  # cudefer waits for side before reusing it
    del data
    again = torch.zeros(4096, 4096, device="cuda")  # may get data's block
    side.synchronize()
    print("side result: %.1f; %d bytes requested again at once"
          % (total.item(), again.numel() * again.element_size()))

    s = cudefer.stats()
    print("cudefer: %d blocks deferred, %d reused, %d held (%d bytes)"
          % (s["deferred"], s["reused"], s["held"], s["held_bytes"]))


if __name__ == "__main__":
    main()
