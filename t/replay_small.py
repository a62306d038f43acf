#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write t/replay_small.trace: a small allocation trace in the format of
bench/torch_shims.c (shim_traced_alloc/free, shim_trace_mark), shaped as
PyTorch training makes it, for t/replay_trace.sh to replay with
bench/replay-trace.  Not recorded on a GPU: it is made here, so that the
test has a trace of a few hundred lines whose shape is known.

    python3 t/replay_small.py > t/replay_small.trace

The model: 8 layers on the legacy stream (0).  Before the first step the
parameters are made (model.to(device)).  Each step: zero_grad(set_to_none)
frees the previous step's gradients; the batch is made; the forward pass
keeps each layer's activation and frees its workspace after its kernel;
the backward pass makes each parameter's gradient (kept until the next
step), frees the activations in reverse and passes a gradient temporary
from layer to layer; the optimizer makes its two states per parameter in
the first step (kept for good) and a few temporaries every step.  The
pointers come from a stand-in allocator that reuses a freed pointer of the
same size, newest first, as a cache of unsplit blocks does.
"""

import sys

STEPS = 6
KIB = 1024
PARAM_KIB = [36, 144, 576, 576, 2304, 2304, 4, 2000]
ACTIVATION_KIB = [3136, 3136, 1568, 1568, 784, 784, 392, 8]
WORKSPACE_KIB = [512, 0, 1024, 0, 2048, 0, 256, 0]
GRAD_TEMP_KIB = [3136, 1568, 1568, 784, 784, 392, 392, 8]
BATCH_KIB = 588
OPTIMIZER_TEMP_KIB = [4096, 4096, 2048]


class Recorder:
    """The trace's lines and a stand-in allocator for its pointers."""

    def __init__(self):
        self.lines = []
        self.free_by_size = {}
        self.next_ptr = 0x7f0000000000

    def alloc(self, kib):
        size = kib * KIB
        reuse = self.free_by_size.get(size)
        if reuse:
            ptr = reuse.pop()
        else:
            ptr = self.next_ptr
            self.next_ptr += (size + 511) // 512 * 512
        self.lines.append("a %d 0 %#x" % (size, ptr))
        return (ptr, size)

    def free(self, block):
        ptr, size = block
        self.lines.append("f %#x 0" % ptr)
        self.free_by_size.setdefault(size, []).append(ptr)

    def mark(self, step):
        self.lines.append("m %d" % step)


def main():
    r = Recorder()
    params = [r.alloc(k) for k in PARAM_KIB]
    states = []
    grads = []
    for step in range(STEPS):
        r.mark(step)
        for g in grads:
            r.free(g)
        batch = r.alloc(BATCH_KIB)
        acts = []
        for act_kib, ws_kib in zip(ACTIVATION_KIB, WORKSPACE_KIB):
            acts.append(r.alloc(act_kib))
            if ws_kib:
                r.free(r.alloc(ws_kib))
        grads = []
        grad_out = None
        for i in reversed(range(len(PARAM_KIB))):
            grads.append(r.alloc(PARAM_KIB[i]))
            grad_in = r.alloc(GRAD_TEMP_KIB[i])
            if grad_out is not None:
                r.free(grad_out)
            r.free(acts[i])
            grad_out = grad_in
        r.free(grad_out)
        r.free(batch)
        if not states:
            states = [r.alloc(k) for k in PARAM_KIB for _ in range(2)]
        for kib in OPTIMIZER_TEMP_KIB:
            r.free(r.alloc(kib))
    r.mark(STEPS)  # the end of the last step, as bench/torch_train.py marks it
    out = sys.stdout
    out.write("# t/replay_small.trace: made by t/replay_small.py (not "
              "recorded on a GPU):\n# %d steps of an 8-layer training loop "
              "(parameters, activations, workspaces,\n# gradients kept "
              "until the next step, optimizer states made in step 0);\n"
              "# the last mark ends the last step.\n"
              "# Format: bench/torch_shims.c's header comment.\n" % STEPS)
    out.write("\n".join(r.lines) + "\n")
    del params


if __name__ == "__main__":
    main()
