#!/usr/bin/env python3
"""How many allocations a per-thread magazine would serve: replays
bench/torch_shims.c traces (bench/results/2026-11-23-h100-traces.tar.gz)
through a last-in-first-out list of the K most recent frees of one thread
and stream (PyTorch's training frees and allocates on the legacy stream
from one thread), an allocation served by the newest entry of its exact
size, or of its size class (16 sizes per power of two, cudefer's
rounding, 512 bytes at least).  A free that overflows the list drops its
oldest entry, as a magazine would hand it to the shared cache.

    python3 magazine_hits.py TRACE...
"""
import sys


def size_class(size):
    if size <= 512:
        return 512
    step = max((1 << (size.bit_length() - 1)) // 16, 512)
    return (size + step - 1) // step * step


def hits(path, capacity, key):
    sizes, magazine = {}, []
    allocs = served = 0
    with open(path) as f:
        for line in f:
            t = line.split()
            if not t or t[0] == '#':
                continue
            if t[0] == 'a':
                allocs += 1
                k = key(int(t[1]))
                for i in range(len(magazine) - 1, -1, -1):
                    if magazine[i] == k:
                        del magazine[i]
                        served += 1
                        break
                sizes[t[3]] = int(t[1])
            elif t[0] == 'f' and t[1] in sizes:
                magazine.append(key(sizes[t[1]]))
                if len(magazine) > capacity:
                    del magazine[0]
    return allocs, served


def main():
    print('trace  K  allocations  served: exact size  size class')
    for path in sys.argv[1:]:
        for capacity in (1, 4, 8, 16, 64):
            n, exact = hits(path, capacity, lambda s: s)
            _, rounded = hits(path, capacity, size_class)
            print(f'{path}  {capacity}  {n}  {exact / n:.1%}  {rounded / n:.1%}')


if __name__ == '__main__':
    main()
