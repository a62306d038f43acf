#!/usr/bin/env python3
"""Synthetic allocation traces in bench/torch_shims.c's format, for
bench/replay-trace: a step allocates 60 tensors whose sizes scale with a
sequence length drawn per step (as variable-length batches do), frees
about 30 % of them as it goes and the rest at its end; 20 persistent 4 MiB
tensors.  Used by bench/results/2026-11-27-fake-replay-rounding.txt.

    python3 varlen_trace.py DIR   -> DIR/varlen.trace (lengths 256-1024),
                                     DIR/varlen-narrow.trace (900-1024)
"""
import os
import random
import sys


def write(path, seed, lengths):
    random.seed(seed)
    bases = [random.choice([1, 2, 3, 4, 6, 8, 12, 16]) * 4096
             for _ in range(60)]
    out = ['# cudefer allocation trace (bench/torch_shims.c): '
           'a SIZE STREAM PTR | f PTR STREAM | m STEP']
    addr = 0x300000000
    for _ in range(20):
        out.append('a %d 0 0x%x' % (4 << 20, addr))
        addr += 8 << 20
    for step in range(30):
        out.append('m %d' % step)
        n = random.randint(*lengths)
        live = []
        for b in bases:
            size = b * n // 64 * 64
            out.append('a %d 0 0x%x' % (size, addr))
            live.append(addr)
            addr += ((size >> 20) + 2) << 20
            if random.random() < 0.3:
                out.append('f 0x%x 0' % live.pop(random.randrange(len(live))))
        out.extend('f 0x%x 0' % p for p in reversed(live))
    out.append('m 30')
    with open(path, 'w') as f:
        f.write('\n'.join(out) + '\n')


if __name__ == '__main__':
    d = sys.argv[1] if len(sys.argv) > 1 else '.'
    write(os.path.join(d, 'varlen.trace'), 1, (256, 1024))
    write(os.path.join(d, 'varlen-narrow.trace'), 2, (900, 1024))
