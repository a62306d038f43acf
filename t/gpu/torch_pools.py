#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_pools.py: a MemPool's tensors read on a side stream
(Tensor.record_stream) and freed, under PyTorch's own allocator and under
cudefer.torch.enable(), each in its own process, then compared.

    python3 t/gpu/torch_pools.py [--lib PATH]

prints one "PASS name: detail" or "FAIL name: detail" line per check and
exits 1 if any failed, 77 without torch or a CUDA device
(t/gpu/torch_python.sh runs it as TAP in make check).  cudefer hands
such a block out again once events recorded on the side stream have
completed, never before: recorded at the free outside
torch.cuda.use_mem_pool, or, for a free inside it (where a CUDA graph
capture may be under way), at the first allocation once no use_mem_pool
is open.  Each process frees such tensors outside use_mem_pool, then
inside it (each round then also allocates a tensor outside, as a program
does between two use_mem_pool):
  - a block the side stream, held busy, has yet to read must not be
    handed out to the pool's next tensor of its size and stream (inside,
    PyTorch 2.11's own allocator was seen to hand it out: only
    cudefer's is checked there);
  - 300 rounds of 4 MiB, synchronised every 4th, may grow the pool by
    64 MiB at most (its blocks come back once the side stream is done),
    and the side stream must read every value right; inside, the pool
    must hold no segment once it is gone (del and empty_cache), the
    block of the last round, freed inside and never followed by an
    allocation outside, included.
Then a tensor freed by a return to a checkpoint of its pool (as
torch.compile's graph trees return): its block must not be handed out
while the side stream has yet to read it, and must come back after; and
a return to a checkpoint must leave memory_allocated as it was, a tensor
in a larger block of the pool counted at its own rounding.
"""
import json
import os
import sys
from contextlib import nullcontext

import side_by_side

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))

N = 1 << 20  # float32 elements: a block of 4 MiB
ROUNDS = 300


def pool_bytes(torch, pool_id):
    """Bytes of the segments of the pool pool_id (memory_snapshot):
    PyTorch's allocator serves 4 MiB from segments of 20 MiB it splits,
    cudefer from a segment of 4 MiB each."""
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == pool_id)


def intact(y, z, old, busy):
    """What came of a block the side stream read (y: twice its 7.0s)
    while z, the pool's next tensor, was allocated.  A side stream found
    done after z may have been done before it too: then a hand-out is no
    fault, and nothing is proved."""
    return ("overwritten" if not bool((y == 14).all()) else
            "inconclusive (side stream done too soon)" if not busy else
            "handed out while read" if z.data_ptr() == old else "intact")


def read_while_freed(torch, dev, pool, side, free=None, inside=False):
    """x, a tensor of pool, read on side after about 1 s of sleep
    (record_stream), then freed: by free(x) where given, and its del
    (inside: all of it inside use_mem_pool, then a tensor allocated
    outside, where PyTorch's allocator records x's event); then z, the
    pool's next tensor of x's size and stream, allocated while side has
    yet to read x.  Returns what came of x's block (intact), its address,
    and z: a caller that asks whether x's block comes back keeps z alive
    meanwhile, or z's own block, freed, could be the one handed out;
    side is synchronised."""
    outside = None
    whole = torch.cuda.use_mem_pool(pool) if inside else nullcontext()
    with whole:
        with nullcontext() if inside else torch.cuda.use_mem_pool(pool):
            x = torch.full((N,), 7.0, device=dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(2000000000)
            y = x * 2
        x.record_stream(side)
        old = x.data_ptr()
        if free is not None:
            free(x)
        del x
    if inside:
        outside = torch.empty(256, device=dev)
    with torch.cuda.use_mem_pool(pool):
        z = torch.full((N,), -1.0, device=dev)
    busy = not side.query()
    side.synchronize()
    del outside
    return intact(y, z, old, busy), old, z


def warm_up(torch, dev):
    """Runs once every kernel the parts time, so that none is loaded
    (CUDA's lazy loading) while the side stream sleeps: a load may wait
    for the device, and the side stream would be done too soon."""
    pool = torch.cuda.MemPool()
    side = torch.cuda.Stream()
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((N,), 7.0, device=dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        y = x * 2
        wrong = (y != 14).sum()
        wrong += (y != 14).sum()
    x.record_stream(side)
    del x
    torch.cuda.synchronize()
    assert int(wrong.item()) == 0 and bool((y == 14).all())
    del y, wrong, pool
    torch.cuda.empty_cache()


def freed_outside(torch, dev, res):
    """Frees outside use_mem_pool; puts pool_record_intact and
    pool_record_reuse in res."""
    pool = torch.cuda.MemPool()
    side = torch.cuda.Stream()
    pool_id = tuple(pool.id)

    # A tensor of the pool allocated while the side stream has yet to
    # read x, freed, must not get x's block.
    res["pool_record_intact"], _, z = read_while_freed(torch, dev, pool,
                                                       side)
    del z  # the pool's: its segments go with the pool
    torch.cuda.synchronize()

    # Many rounds, synchronised every 4th: the blocks come back.
    with torch.cuda.stream(side):
        wrong = torch.zeros((), dtype=torch.int64, device=dev)
    before = pool_bytes(torch, pool_id)
    for i in range(ROUNDS):
        with torch.cuda.use_mem_pool(pool):
            x = torch.full((N,), float(i), device=dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            wrong += (x * 2 != 2 * i).sum()
        x.record_stream(side)
        del x
        if i % 4 == 3:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    grown = (pool_bytes(torch, pool_id) - before) >> 20
    res["pool_record_reuse"] = {"rounds": ROUNDS, "grown_mib": grown,
                                "wrong": int(wrong.item())}
    del wrong, pool
    torch.cuda.empty_cache()


def freed_inside(torch, dev, res):
    """Frees inside use_mem_pool (the side stream's work too, its
    temporaries the pool's); puts pool_inside_intact and
    pool_inside_reuse in res."""
    pool = torch.cuda.MemPool()
    side = torch.cuda.Stream()
    pool_id = tuple(pool.id)

    # As freed_outside's first part, x freed inside use_mem_pool.
    res["pool_inside_intact"], _, z = read_while_freed(torch, dev, pool,
                                                       side, inside=True)
    del z  # the pool's: left alive, it would hold a segment past the pool
    torch.cuda.synchronize()

    # Many rounds, each opened by an allocation outside use_mem_pool and
    # synchronised every 4th: the blocks come back.  The last round's
    # block is still waiting for an allocation outside when the pool goes.
    with torch.cuda.stream(side):
        wrong = torch.zeros((), dtype=torch.int64, device=dev)
    before = pool_bytes(torch, pool_id)
    for i in range(ROUNDS):
        outside = torch.empty(256, device=dev)
        with torch.cuda.use_mem_pool(pool):
            x = torch.full((N,), float(i), device=dev)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                wrong += (x * 2 != 2 * i).sum()
            x.record_stream(side)
            del x
        if i % 4 == 3:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    grown = (pool_bytes(torch, pool_id) - before) >> 20
    wrong = int(wrong.item())
    del outside, pool
    torch.cuda.empty_cache()
    res["pool_inside_reuse"] = {
        "rounds": ROUNDS, "grown_mib": grown, "wrong": wrong,
        "left_mib": pool_bytes(torch, pool_id) >> 20}


def freed_by_checkpoint(torch, dev, res):
    """A block freed by a return to a checkpoint of its pool
    (torch.compile's graph trees do this between recordings; here the
    allocator's own calls, with the checkpoint taken while the pool was
    empty); puts pool_checkpoint_intact and pool_checkpoint_back in
    res."""
    pool = torch.cuda.MemPool()
    side = torch.cuda.Stream()
    index = dev.index if dev.index is not None else \
        torch.cuda.current_device()
    state = torch._C._cuda_getCheckpointState(index, pool.id)

    # x is freed by the return to the checkpoint (its storage given as
    # stale: PyTorch takes its deleter away, so its del frees nothing).
    def to_checkpoint(x):
        torch._C._cuda_setCheckpointPoolState(
            index, state, [x.untyped_storage()._cdata], [])
    res["pool_checkpoint_intact"], old, z = read_while_freed(
        torch, dev, pool, side, to_checkpoint)

    # Once the side stream is done, the block is the pool's again (z,
    # still alive, holds the pool's other block of that size).
    with torch.cuda.use_mem_pool(pool):
        w = torch.full((N,), 1.0, device=dev)
    res["pool_checkpoint_back"] = w.data_ptr() == old
    del w, z, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def restored_counts(torch, dev, res):
    """memory_allocated before and after a return to a checkpoint that
    holds a tensor of 3 MiB in a block freed by one of 4 MiB (cudefer
    hands it out again, a block of the pool never being split); puts
    pool_checkpoint_allocated in res: the two figures, which must be
    equal."""
    pool = torch.cuda.MemPool()
    index = dev.index if dev.index is not None else \
        torch.cuda.current_device()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(4 << 20, dtype=torch.uint8, device=dev)
        del x
        y = torch.empty(3 << 20, dtype=torch.uint8, device=dev)
    before = torch.cuda.memory_allocated(dev)
    state = torch._C._cuda_getCheckpointState(index, pool.id)
    # y's block is freed and allocated again (y's storage given as stale:
    # PyTorch takes its deleter away; the block allocated again is given
    # to no storage, so it stays allocated, counted, with the process).
    torch._C._cuda_setCheckpointPoolState(
        index, state, [y.untyped_storage()._cdata], [])
    res["pool_checkpoint_allocated"] = [before,
                                        torch.cuda.memory_allocated(dev)]
    del y, state, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run(mode, lib, out_path):
    """One process's work under mode ("native" or "cudefer"); writes its
    JSON to out_path."""
    import torch
    res = {"mode": mode}
    if mode == "cudefer":
        import cudefer.torch
        res["library"] = cudefer.torch.enable(lib)
    dev = torch.device("cuda")
    warm_up(torch, dev)
    for part, keys in ((freed_outside, ("pool_record_intact",
                                        "pool_record_reuse")),
                       (freed_inside, ("pool_inside_intact",
                                       "pool_inside_reuse")),
                       (freed_by_checkpoint, ("pool_checkpoint_intact",
                                              "pool_checkpoint_back")),
                       (restored_counts, ("pool_checkpoint_allocated",))):
        try:
            part(torch, dev, res)
        except Exception as e:  # noqa: BLE001 (compared)
            for key in keys:
                res[key] = "%s: %s" % (type(e).__name__, str(e)[:200])
    with open(out_path, "w") as f:
        json.dump(res, f)


def compare(native, mine):
    """PASS/FAIL lines; returns the number of failures."""
    checks = side_by_side.Checks()
    check = checks.check

    def reused(r):
        return (isinstance(r, dict) and r["grown_mib"] <= 64
                and r["wrong"] == 0 and r.get("left_mib", 0) == 0)

    for where, intact_key, reuse_key, comes_back in (
            ("outside", "pool_record_intact", "pool_record_reuse",
             "once the side stream is done (300 rounds of 4 MiB grow the "
             "pool by 64 MiB at most)"),
            ("inside", "pool_inside_intact", "pool_inside_reuse",
             "once the side stream is done and no use_mem_pool is open "
             "(300 rounds of 4 MiB grow the pool by 64 MiB at most; the "
             "pool, once gone, holds no segment)")):
        # Inside, PyTorch 2.11's own allocator hands the block out while
        # the side stream has yet to read it ("overwritten"): cudefer must
        # not, whatever native does.
        check("record_stream on a MemPool's tensor freed %s "
              "use_mem_pool: its block is not handed out while the side "
              "stream has yet to read it" % where,
              mine.get(intact_key) == "intact" and
              (where == "inside" or native.get(intact_key) == "intact"),
              "native %s, cudefer %s" % (native.get(intact_key),
                                         mine.get(intact_key)))
        check("record_stream on a MemPool's tensor freed %s use_mem_pool: "
              "its block comes back %s" % (where, comes_back),
              reused(native.get(reuse_key)) and reused(mine.get(reuse_key)),
              "native %s, cudefer %s" % (native.get(reuse_key),
                                         mine.get(reuse_key)))
    check("record_stream on a MemPool's tensor freed by a return to a "
          "checkpoint: its block is not handed out while the side stream "
          "has yet to read it, and comes back once it is done",
          all(r.get("pool_checkpoint_intact") == "intact" and
              r.get("pool_checkpoint_back") is True
              for r in (native, mine)),
          "native %s, back %s; cudefer %s, back %s" % (
              native.get("pool_checkpoint_intact"),
              native.get("pool_checkpoint_back"),
              mine.get("pool_checkpoint_intact"),
              mine.get("pool_checkpoint_back")))

    def unchanged(r):
        return isinstance(r, list) and r[0] == r[1]
    check("a return to a checkpoint leaves memory_allocated as it was "
          "(a 3 MiB tensor in a 4 MiB block of the pool counts 3 MiB)",
          unchanged(native.get("pool_checkpoint_allocated")) and
          unchanged(mine.get("pool_checkpoint_allocated")),
          "native %s, cudefer %s" % (native.get("pool_checkpoint_allocated"),
                                     mine.get("pool_checkpoint_allocated")))
    return checks.failures


def main():
    return side_by_side.main(
        __file__, lambda mode, args: run(mode, args.lib, args.out), compare)


if __name__ == "__main__":
    sys.exit(main())
