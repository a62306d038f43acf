#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_history.py: memory history (torch.cuda.memory._record_memory_history)
under PyTorch's own allocator and under cudefer.torch.enable(), each in its
own process, with the same checks for both.

    python3 t/gpu/torch_history.py [--lib PATH]

prints one "PASS name: detail" or "FAIL name: detail" line per check, each
check once per allocator ("native: ..." and "cudefer: ..."), and exits 1 if
any failed, 77 without torch or a CUDA device.  (t/gpu/torch_python.sh runs
it as TAP in make check.)  Each process, as a user would:
  - records history with stacks (context="all", max_entries 100000),
    allocates six tensors of known sizes, three on the default stream and
    three on a side stream, frees three of them, runs into out of memory
    under a memory fraction, and takes _snapshot(): every tensor must have
    an alloc entry with its data_ptr(), a size of at least its bytes and
    its stream; each freed one a free_requested and then a free_completed
    after it, of the same size and stream (the live ones none); the
    entries' frames and the live tensors' blocks' frames must name the
    function that allocated (and freed) them; time_us must fall within
    the workload; an oom entry must say the device's free bytes and a size
    of at least the request; device_traces must hold one list per device;
    _dump_snapshot's pickle must load with the same entries, and
    torch.cuda._memory_viz's trace_plot and segment_plot must give HTML and
    its trace() list the frees and the out of memory;
  - enables again with context=None and clear_history=True: the earlier
    entries (the oom) must be gone, the new ones carry no frames;
  - with context="state": entries without frames, live blocks with them;
  - with max_entries=8: the snapshot keeps the newest 8 entries;
  - with skip_actions=["free_requested", "snapshot"]: none of those;
  - four threads allocating and freeing 200 tensors each: 800 alloc
    entries, and each address's entries go alloc, free_requested,
    free_completed in turn;
  - a MemPool's tensor a of 12 MiB (a segment of its own under PyTorch's
    allocator), a checkpoint of the pool, a tensor b, then a return to
    the checkpoint (as torch.compile's CUDA graph trees return), which
    frees both and allocates a's block again: a's entries must go alloc,
    free_requested, free_completed, alloc and b's alloc,
    free_requested, free_completed, the return's entries carry frames
    naming the function that returned, and so must a's live block;
  - _record_memory_history(enabled=None): isHistoryEnabled is false and a
    tensor allocated (or freed) after it has no entry.
And across the two: the first workload's alloc, free_requested and
free_completed entries come in the same order under both.
"""
import json
import os
import pickle
import sys
import tempfile
import threading
import time

import side_by_side

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "python"))

# The workload's tensors: bytes, stream ("default" or "side"), whether the
# workload frees it.
TENSORS = [(1000, "default", True), (4096, "side", False),
           (100000, "default", False), ((1 << 20) + 7, "side", True),
           (3 << 20, "default", True), (512, "side", False)]
FRAME = "history_workload"  # the function the frames must name
# The function that returns a pool to its checkpoint, which that return's
# entries must name; the bytes of each tensor of that pool (a multiple of
# 2 MiB from 10 MiB: PyTorch's allocator gives it a segment of its own,
# never split, so that a return allocates and frees no other block).
RESTORE_FRAME = "history_restore"
CHECKPOINT_BYTES = 12 << 20


def history_workload(torch, dev, side):
    """Allocates TENSORS (each on its stream), then frees those marked so;
    returns what the user knows of each (address, bytes, stream) and the
    tensors left alive."""
    tensors, records = [], []
    for i, (nbytes, where, _) in enumerate(TENSORS):
        stream = side if where == "side" else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            t = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        tensors.append(t)
        records.append({"i": i, "ptr": t.data_ptr(),
                        "nbytes": t.untyped_storage().nbytes(),
                        "stream": stream.cuda_stream, "freed": TENSORS[i][2]})
    for i, (_, _, freed) in enumerate(TENSORS):
        if freed:
            tensors[i] = None  # the free happens here, in this function
    return records, [t for t in tensors if t is not None]


def history_oom(torch, dev):
    """60 % of the device under a memory fraction of 0.5: raises
    torch.OutOfMemoryError under both allocators, allocating nothing.  An
    OOM observer takes a snapshot meanwhile, as PyTorch's memory docs show:
    how many oom entries it found (seen)."""
    seen = []

    def observer(*args):
        snap = torch.cuda.memory._snapshot()
        seen.append(sum(1 for trace in snap.get("device_traces") or []
                        for e in trace if e.get("action") == "oom"))
    torch._C._cuda_attach_out_of_memory_observer(observer)
    free, total = torch.cuda.mem_get_info()
    n = int(total * 0.6)
    torch.cuda.set_per_process_memory_fraction(0.5)
    try:
        torch.empty(n, dtype=torch.uint8, device=dev)
        raised = False
    except torch.OutOfMemoryError:
        raised = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return {"raised": raised, "bytes": n, "seen": seen}


def history_churn(torch, dev, rounds):
    """rounds tensors of 64 KiB, each freed before the next; their
    addresses."""
    ptrs = []
    for _ in range(rounds):
        t = torch.empty(1 << 16, dtype=torch.uint8, device=dev)
        ptrs.append(t.data_ptr())
        del t
    return ptrs


def history_restore(torch, device, state, tensors):
    """Returns a pool to its checkpoint state, as torch.compile's graph
    trees do, tensors given as stale (PyTorch takes their deleters away:
    their del frees nothing)."""
    torch._C._cuda_setCheckpointPoolState(
        device, state, [t.untyped_storage()._cdata for t in tensors], [])


def history_checkpoint(torch, dev, device):
    """a, a tensor of a MemPool, a checkpoint of the pool, b, then a
    return to the checkpoint, which frees both and allocates a's block
    again (given to no tensor: it stays allocated).  Returns, for a and
    b, their entries ([action, whether its frames name RESTORE_FRAME]),
    and a's block's frames in the snapshot."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(CHECKPOINT_BYTES, dtype=torch.uint8, device=dev)
    state = torch._C._cuda_getCheckpointState(device, pool.id)
    with torch.cuda.use_mem_pool(pool):
        b = torch.empty(CHECKPOINT_BYTES, dtype=torch.uint8, device=dev)
    ptrs = {"a": a.data_ptr(), "b": b.data_ptr()}
    history_restore(torch, device, state, [a, b])
    del a, b
    snap = torch.cuda.memory._snapshot()
    traces = snap.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    out = {}
    for name, ptr in ptrs.items():
        out[name] = [[e["action"], RESTORE_FRAME in frame_names(e)]
                     for e in trace if e.get("addr") == ptr and
                     e["action"] in ("alloc", "free_requested",
                                     "free_completed")]
    blocks = [blk for seg in snap.get("segments", [])
              if seg.get("device") == device
              for blk in seg.get("blocks", [])
              if blk.get("address") == ptrs["a"]]
    out["a_block"] = frame_names(blocks[0]) if blocks else None
    del state, pool
    return out


def frame_names(d):
    return [f.get("name") for f in (d.get("frames") or [])]


def facts(snap, records, device):
    """What the snapshot says of each record: its last alloc entry (index,
    size, stream, frames, time_us), the free_requested and free_completed
    after it, and its block's state and frames."""
    traces = snap.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    blocks = {}
    for seg in snap.get("segments", []):
        if seg.get("device") != device:
            continue
        for b in seg.get("blocks", []):
            blocks[b.get("address")] = b
    out = []
    for r in records:
        f = {"i": r["i"]}
        allocs = [k for k, e in enumerate(trace)
                  if e["action"] == "alloc" and e.get("addr") == r["ptr"]]
        if allocs:
            k = allocs[-1]
            e = trace[k]
            f["alloc"] = {"at": k, "size": e["size"], "stream": e["stream"],
                          "frames": frame_names(e),
                          "time_us": e.get("time_us")}
            for action in ("free_requested", "free_completed"):
                later = [j for j in range(k + 1, len(trace))
                         if trace[j]["action"] == action and
                         trace[j].get("addr") == r["ptr"]]
                if later:
                    e = trace[later[0]]
                    f[action] = {"at": later[0], "size": e["size"],
                                 "stream": e["stream"],
                                 "frames": frame_names(e)}
        b = blocks.get(r["ptr"])
        if b is not None:
            f["block"] = {"state": b.get("state"), "frames": frame_names(b)}
        out.append(f)
    return out


def actions(snap, device):
    traces = snap.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    return [[e["action"], e.get("addr", e.get("device_free")), e["size"],
             bool(e.get("frames"))] for e in trace]


def phase(res, name, fn):
    """Runs fn(), keeping its error (the checks then fail on what is
    missing, one by one)."""
    try:
        fn()
    except Exception as e:  # the allocator refused: say it, go on
        res.setdefault("errors", {})[name] = "%s: %s" % (
            type(e).__name__, str(e).splitlines()[0] if str(e) else "")


def run(mode, lib, out_path):
    """One process's work under mode ("native" or "cudefer"); writes its
    JSON to out_path."""
    import torch
    res = {"mode": mode}
    if mode == "cudefer":
        import cudefer.torch
        res["library"] = cudefer.torch.enable(lib)
    dev = torch.device("cuda")
    device = torch.cuda.current_device()
    res["device_count"] = torch.cuda.device_count()
    side = torch.cuda.Stream()
    memory = torch.cuda.memory
    enabled = torch._C._cuda_isHistoryEnabled
    # Something allocated before history: not in it.
    warm = torch.ones(1 << 20, device=dev)

    # Stacks of everything; the first workload, an out of memory.
    def with_stacks():
        memory._record_memory_history("all", context="all", stacks="all",
                                      max_entries=100000)
        res["enabled"] = enabled()
        t0 = time.time()
        records, live = history_workload(torch, dev, side)
        res["oom"] = history_oom(torch, dev)
        t1 = time.time()
        torch.cuda.synchronize()
        snap = memory._snapshot()
        res["span_us"] = [int(t0 * 1e6), int(t1 * 1e6)]
        res["records"] = records
        res["traces_len"] = len(snap.get("device_traces") or [])
        res["facts"] = facts(snap, records, device)
        res["actions"] = actions(snap, device)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snapshot.pickle")
            memory._dump_snapshot(path)
            with open(path, "rb") as f:
                loaded = pickle.load(f)
        res["dumped_facts"] = facts(loaded, records, device)
        from torch.cuda import _memory_viz
        html = _memory_viz.trace_plot(loaded)
        seg_html = _memory_viz.segment_plot(loaded)
        text = _memory_viz.trace(loaded)
        res["viz"] = {
            "trace_plot": isinstance(html, str) and "<!DOCTYPE html>" in html,
            "segment_plot": (isinstance(seg_html, str) and
                             "<!DOCTYPE html>" in seg_html),
            "frees": text.count("# free completed for"),
            "oom": "raise OutOfMemoryError" in text}
        del live
    phase(res, "context=all", with_stacks)

    # No stacks, history cleared.
    def without_stacks():
        memory._record_memory_history("all", context=None, max_entries=100000,
                                      clear_history=True)
        records, live = history_workload(torch, dev, side)
        snap = memory._snapshot()
        res["none_records"] = records
        res["none_facts"] = facts(snap, records, device)
        res["none_actions"] = actions(snap, device)
        del live
    phase(res, "context=None", without_stacks)

    # Stacks of live blocks only.
    def state_stacks():
        memory._record_memory_history("all", context="state",
                                      max_entries=100000, clear_history=True)
        records, live = history_workload(torch, dev, side)
        snap = memory._snapshot()
        res["state_records"] = records
        res["state_facts"] = facts(snap, records, device)
        res["state_actions"] = actions(snap, device)
        del live
    phase(res, "context=state", state_stacks)

    # A ring of 8.
    def ring():
        memory._record_memory_history("all", context=None, max_entries=8,
                                      clear_history=True)
        ptrs = history_churn(torch, dev, 10)
        snap = memory._snapshot()
        res["ring_ptrs"] = ptrs
        res["ring_actions"] = actions(snap, device)
    phase(res, "max_entries=8", ring)

    # Skipped actions.
    def skip():
        memory._record_memory_history(
            "all", context=None, max_entries=100000, clear_history=True,
            skip_actions=["free_requested", "snapshot"])
        ptrs = history_churn(torch, dev, 3)
        memory._snapshot()
        snap = memory._snapshot()
        res["skip_ptrs"] = ptrs
        res["skip_actions"] = actions(snap, device)
    phase(res, "skip_actions", skip)

    # Threads.
    def threads():
        memory._record_memory_history("all", context="all", stacks="python",
                                      max_entries=1000000, clear_history=True)

        def worker(k):
            live = []
            for i in range(200):
                live.append(torch.empty((k + 1) * 4096 + i, dtype=torch.uint8,
                                        device=dev))
                if len(live) > 4:
                    live.pop(0)
            live.clear()
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        torch.cuda.synchronize()
        res["thread_actions"] = actions(memory._snapshot(), device)
    phase(res, "threads", threads)

    # A return to a checkpoint of a MemPool.
    def checkpoint():
        memory._record_memory_history("all", context="all", stacks="python",
                                      max_entries=100000, clear_history=True)
        res["checkpoint"] = history_checkpoint(torch, dev, device)
    phase(res, "checkpoint", checkpoint)

    # Stopped.
    def stopped():
        memory._record_memory_history("all", context="all",
                                      max_entries=100000, clear_history=True)
        y = torch.empty(54321, dtype=torch.uint8, device=dev)
        before = actions(memory._snapshot(), device)
        memory._record_memory_history(enabled=None)
        res["enabled_after"] = enabled()
        x = torch.empty(12345, dtype=torch.uint8, device=dev)
        y_ptr, x_ptr = y.data_ptr(), x.data_ptr()
        del y
        after = actions(memory._snapshot(), device)
        res["stop"] = {
            "before": sum(1 for a in before if a[1] == y_ptr),
            "after": [a for a in after if a[1] in (x_ptr, y_ptr)],
            "entries_after": len(after)}
        del x
    phase(res, "enabled=None", stopped)
    del warm
    with open(out_path, "w") as f:
        json.dump(res, f)


def check_mode(res, check):
    """The checks of one process; each names what it saw."""
    errors = res.get("errors", {})
    why = ("; errors: %s" % errors) if errors else ""
    records, fa = res.get("records", []), res.get("facts", [])
    check("history recording turns on (isHistoryEnabled)",
          res.get("enabled") is True, "%s%s" % (res.get("enabled"), why))

    bad = [f["i"] for r, f in zip(records, fa)
           if "alloc" not in f or f["alloc"]["size"] < r["nbytes"] or
           f["alloc"]["stream"] != r["stream"]]
    check("device_traces has a list per device, each tensor an alloc entry "
          "with its data_ptr, size >= its bytes and its stream",
          len(records) == len(TENSORS) and not bad and
          res.get("traces_len") == res.get("device_count"),
          "%d tensors, %d device traces for %s devices; wrong: %s" % (
              len(records), res.get("traces_len", 0),
              res.get("device_count"), bad))

    def freed_ok(r, f):
        if not r["freed"]:
            return "free_requested" not in f and "free_completed" not in f
        q, c = f.get("free_requested"), f.get("free_completed")
        return (q is not None and c is not None and
                f["alloc"]["at"] < q["at"] < c["at"] and
                q["size"] == c["size"] == f["alloc"]["size"] and
                q["stream"] == c["stream"] == r["stream"])
    bad = [f["i"] for r, f in zip(records, fa)
           if "alloc" not in f or not freed_ok(r, f)]
    check("each freed tensor: free_requested, then free_completed, after its "
          "alloc, same size and stream; live ones neither",
          len(fa) == len(TENSORS) and not bad, "wrong: %s" % bad)

    bad = [f["i"] for r, f in zip(records, fa)
           if FRAME not in f.get("alloc", {}).get("frames", []) or
           (r["freed"] and (
               FRAME not in f.get("free_requested", {}).get("frames", []) or
               FRAME not in f.get("free_completed", {}).get("frames", [])))]
    check("context='all': alloc and free entries carry frames naming %s"
          % FRAME, len(fa) == len(TENSORS) and not bad, "wrong: %s" % bad)

    live = [(r, f) for r, f in zip(records, fa) if not r["freed"]]
    bad = [f["i"] for r, f in live
           if f.get("block", {}).get("state") != "active_allocated" or
           FRAME not in f.get("block", {}).get("frames", [])]
    check("snapshot blocks of live tensors carry frames naming %s" % FRAME,
          len(live) == 3 and not bad, "wrong: %s" % bad)

    lo, hi = res.get("span_us", [0, 0])
    times = [f["alloc"].get("time_us") for f in fa if "alloc" in f]
    check("time_us of the alloc entries within the workload's wall time",
          len(times) == len(TENSORS) and all(
              isinstance(t, int) and lo - 2000000 <= t <= hi + 2000000
              for t in times),
          "span %s, times %s" % (res.get("span_us"), times))

    oom = res.get("oom", {})
    ooms = [a for a in res.get("actions", []) if a[0] == "oom"]
    check("out of memory: raised, an oom entry with the device's free bytes "
          "and a size >= the request",
          oom.get("raised") is True and len(ooms) == 1 and
          ooms[0][1] is not None and ooms[0][2] >= oom.get("bytes", 1 << 62),
          "%s, entries %s" % (oom, ooms))
    check("out of memory: an OOM observer's snapshot has the oom entry",
          oom.get("seen", [None])[:1] == [1], "%s" % oom.get("seen"))

    def untimed(facts_):
        # Each snapshot converts the clock anew: times may differ by a
        # microsecond.
        return [{k: ({a: b for a, b in v.items() if a != "time_us"}
                     if isinstance(v, dict) else v) for k, v in f.items()}
                for f in facts_]
    dumped = res.get("dumped_facts", [])
    check("_dump_snapshot's pickle loads, with the same entries",
          len(dumped) == len(TENSORS) and untimed(dumped) == untimed(fa) and
          all("alloc" in f for f in dumped), "%d tensors" % len(dumped))

    viz = res.get("viz", {})
    check("_memory_viz: trace_plot and segment_plot give HTML, trace() lists "
          "the frees and the out of memory",
          viz.get("trace_plot") is True and viz.get("segment_plot") is True
          and viz.get("frees", 0) >= sum(1 for t in TENSORS if t[2]) and
          viz.get("oom") is True, "%s" % viz)

    nf = res.get("none_facts", [])
    na = res.get("none_actions", [])
    check("context=None, clear_history=True: the earlier entries gone, "
          "every tensor's alloc entry there, no entry with frames",
          len(nf) == len(TENSORS) and all("alloc" in f for f in nf) and
          not any(a[0] == "oom" for a in na) and
          not any(a[3] for a in na),
          "%d tensors, %d entries, with frames %d, oom %d" % (
              sum(1 for f in nf if "alloc" in f), len(na),
              sum(1 for a in na if a[3]),
              sum(1 for a in na if a[0] == "oom")))

    sr, sf = res.get("state_records", []), res.get("state_facts", [])
    sa = res.get("state_actions", [])
    check("context='state': entries without frames, live blocks with frames "
          "naming %s" % FRAME,
          len(sf) == len(TENSORS) and all("alloc" in f for f in sf) and
          not any(a[3] for a in sa) and
          all(FRAME in f.get("block", {}).get("frames", [])
              for r, f in zip(sr, sf) if not r["freed"]),
          "%d entries, with frames %d" % (
              len(sa), sum(1 for a in sa if a[3])))

    ra, rp = res.get("ring_actions", []), res.get("ring_ptrs", [])
    last = [[a, rp[-1] if rp else None]
            for a in ("alloc", "free_requested", "free_completed")]
    check("max_entries=8: the newest 8 entries, the last round's alloc, "
          "free_requested, free_completed last",
          len(ra) == 8 and len(rp) == 10 and
          [a[:2] for a in ra[-3:]] == last, "%s" % [a[:2] for a in ra])

    ka, kp = res.get("skip_actions", []), set(res.get("skip_ptrs", []))
    counts = {}
    for a in ka:
        if a[1] in kp or a[0] in ("free_requested", "snapshot"):
            counts[a[0]] = counts.get(a[0], 0) + 1
    check("skip_actions=['free_requested', 'snapshot']: neither recorded, "
          "allocs and free_completed are",
          counts.get("alloc") == 3 and counts.get("free_completed") == 3 and
          "free_requested" not in counts and "snapshot" not in counts,
          "%s" % counts)

    ta = res.get("thread_actions", [])
    state, wrong = {}, 0
    step = {"alloc": (0, 1), "free_requested": (1, 2),
            "free_completed": (2, 0)}
    for a in ta:
        if a[0] not in step:
            continue
        want, nxt = step[a[0]]
        if state.get(a[1], 0) != want:
            wrong += 1
        state[a[1]] = nxt
    allocs = sum(1 for a in ta if a[0] == "alloc")
    check("4 threads: 800 alloc entries, each address's alloc, "
          "free_requested, free_completed in turn",
          allocs == 800 and wrong == 0 and
          all(v == 0 for v in state.values()),
          "%d allocs, %d out of turn" % (allocs, wrong))

    cp = res.get("checkpoint", {})
    a, b = cp.get("a", []), cp.get("b", [])
    check("a return to a checkpoint: the tensor it frees and allocates "
          "again has alloc, free_requested, free_completed, alloc; the one "
          "it frees alloc, free_requested, free_completed",
          [e[0] for e in a] == ["alloc", "free_requested", "free_completed",
                                "alloc"] and
          [e[0] for e in b] == ["alloc", "free_requested", "free_completed"],
          "a %s, b %s" % ([e[0] for e in a], [e[0] for e in b]))
    check("a return to a checkpoint: its entries carry frames naming %s "
          "(the tensors' own allocs not), and so does the block it "
          "allocated again" % RESTORE_FRAME,
          len(a) == 4 and len(b) == 3 and
          [e[1] for e in a + b] == [False, True, True, True,
                                    False, True, True] and
          RESTORE_FRAME in (cp.get("a_block") or []),
          "a %s, b %s, a's block %s" % (a, b, cp.get("a_block")))

    stop = res.get("stop", {})
    check("enabled=None: isHistoryEnabled false, no entry for what is "
          "allocated or freed after (recorded before)",
          res.get("enabled_after") is False and stop.get("before", 0) > 0 and
          stop.get("after") == [],
          "enabled %s, %s" % (res.get("enabled_after"), stop))


def compare(native, mine):
    """PASS/FAIL lines, after what each run's parts raised; returns the
    number of failures."""
    for mode, res in (("native", native), ("cudefer", mine)):
        for name, err in sorted(res.get("errors", {}).items()):
            print("%s %s raised %s" % (mode, name, err))
    checks = side_by_side.Checks()

    def checker(prefix):
        return lambda name, ok, detail="": checks.check(name, ok, detail,
                                                       prefix)
    check_mode(native, checker("native"))
    check_mode(mine, checker("cudefer"))

    def sequence(res):
        index = {r["ptr"]: r["i"] for r in res.get("records", [])}
        return [[a[0], index[a[1]]] for a in res.get("actions", [])
                if a[0] in ("alloc", "free_requested", "free_completed") and
                a[1] in index]
    a, b = sequence(native), sequence(mine)
    checker("both")(
        "the workload's alloc, free_requested and free_completed entries in "
        "the same order under cudefer as under PyTorch's allocator",
        bool(a) and a == b, "native %s, cudefer %s" % (a, b))
    return checks.failures


def main():
    return side_by_side.main(
        __file__, lambda mode, args: run(mode, args.lib, args.out), compare)


if __name__ == "__main__":
    sys.exit(main())
