#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What an entry point of cudefer costs per call, in instructions, from
callgrind (no GPU: the fake runtime), split into cudefer's own and the
fake runtime's (whose cost is not what a GPU pays).

    python3 bench/callgrind_calls.py [--reps N] [--top N] [--entry FN]...
            [--lines] -- PROGRAM [ARGS...]

For each entry (default: defer_pluggable_alloc_status and
defer_pluggable_free, the pair python/cudefer/torch_allocator.cpp calls),
PROGRAM runs under valgrind --tool=callgrind --toggle-collect=ENTRY, so
that only instructions executed inside that entry are counted; one more
run without toggling counts the calls.  Printed per entry and repetition:
the calls, the instructions per call (inclusive), and its parts: cudefer
(src/), the fake runtime (t/fake/), the rest (libc, pthreads); then, of
the last repetition, the --top functions by self cost per call.  Typical
use, PyTorch's path on the LM trace:

    python3 bench/callgrind_calls.py -- bench/replay-trace --legacy-stream \\
        --pluggable /tmp/statsum/lm.trace

--lines counts cache lines instead of instructions: callgrind simulates a
32 KiB L1 and a 1 MiB last level (--cache-sim), and a line is a miss of
the last level, code read (ILmr), data read (DLmr) or written (DLmw), per
call; each run's line also gives those three apart.  Under
bench/cold-calls, which writes 2 MiB of its own before each call, each
data miss is a line the call touched, the stack's included; that is what a
call costs after PyTorch's own work evicted it (bench/cold_calls.c), with
two differences: PyTorch's work keeps the stack's lines at the call's
depth warm, and evicts the code, which the eviction (data only) leaves in
the simulated L1.  --seal-when-full makes two builds comparable:

    python3 bench/callgrind_calls.py --reps 1 --lines \
        --entry defer_pluggable_free --entry shim_floor_free \
        -- bench/cold-calls --evict 2048 --cycles 2 --seal-when-full \
        lm6k.trace

Standard library only.  Needs valgrind.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ENTRIES = ["defer_pluggable_alloc_status", "defer_pluggable_free"]
LINE_EVENTS = ("ILmr", "DLmr", "DLmw")
CACHE_SIM = ["--cache-sim=yes", "--D1=32768,8,64", "--I1=32768,8,64",
             "--LL=1048576,16,64"]


def parse(path, events=("Ir",)):
    """Self cost per (function, file of the code) of the sum of events,
    calls per function."""
    names = {"fl": {}, "fn": {}}
    columns = [0]  # of events, in the file's events: line
    self_cost = collections.Counter()
    calls = collections.Counter()
    fn = fl = cur_file = None
    pending_call = None  # callee of the next cost line: inclusive, skipped

    def name(kind, text):
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), text)

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line[0] == "#":
                continue
            if line.startswith("events:"):
                have = line.split()[1:]
                columns = [have.index(e) for e in events if e in have]
                if len(columns) != len(events):
                    sys.exit("callgrind_calls: %s lacks events %s" %
                             (path, ", ".join(events)))
                continue
            key, _, rest = line.partition("=")
            if key in ("fl",):
                fl = cur_file = name("fl", rest)
            elif key in ("fi", "fe"):
                cur_file = name("fl", rest)
            elif key == "fn":
                fn = name("fn", rest)
                cur_file = fl
            elif key in ("cfi", "cfl"):
                name("fl", rest)
            elif key == "cfn":
                pending_callee = name("fn", rest)
            elif key == "calls":
                calls[pending_callee] += int(rest.split()[0])
                pending_call = True
            elif key in ("ob", "cob", "jump", "jcnd", "positions", "events",
                         "summary", "totals", "version", "creator", "pid",
                         "cmd", "part", "desc"):
                continue
            elif line[0].isdigit() or line[0] in "+-*":
                parts = line.split()
                if pending_call:
                    pending_call = None
                    continue
                if fn is not None and len(parts) >= 2:
                    self_cost[(fn, cur_file)] += sum(
                        int(parts[1 + c]) for c in columns
                        if 1 + c < len(parts))
    return self_cost, calls


def group(path):
    if path is None:
        return "other"
    if "/t/fake/" in path:
        return "fake"
    if "/src/" in path or "/include/" in path:
        return "cudefer"
    return "other"


def callgrind(args, out, toggle=None, lines=False):
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out]
    if lines:
        cmd += CACHE_SIM
    if toggle:
        cmd.append("--toggle-collect=" + toggle)
    r = subprocess.run(cmd + args, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("callgrind_calls: %s failed (%d):\n%s" %
                 (" ".join(args), r.returncode, r.stderr[-2000:]))


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--entry", action="append")
    ap.add_argument("--lines", action="store_true")
    ap.add_argument("program", nargs=argparse.REMAINDER)
    o = ap.parse_args()
    prog = o.program[1:] if o.program[:1] == ["--"] else o.program
    if not prog:
        sys.exit("callgrind_calls: no program given")
    entries = o.entry or ENTRIES
    events = LINE_EVENTS if o.lines else ("Ir",)
    unit = "lines" if o.lines else "Ir"
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "all.out")
        callgrind(prog, full)
        _, calls = parse(full)
        per_entry = {e: [] for e in entries}
        last = {}
        for rep in range(o.reps):
            for e in entries:
                out = os.path.join(tmp, "%s.%d.out" % (e, rep))
                callgrind(prog, out, toggle=e, lines=o.lines)
                cost, _ = parse(out, events)
                n = calls.get(e, 0)
                if n == 0:
                    sys.exit("callgrind_calls: %s was never called" % e)
                parts = collections.Counter()
                for (fn, path), ir in cost.items():
                    parts[group(path)] += ir
                if o.lines:  # each kind of line apart: code, read, written
                    for ev in LINE_EVENTS:
                        one, _ = parse(out, (ev,))
                        parts[ev] = sum(one.values())
                per_entry[e].append((n, parts))
                last[e] = cost
        for e in entries:
            print("%s: %d calls" % (e, per_entry[e][0][0]))
            for i, (n, parts) in enumerate(per_entry[e]):
                total = parts["cudefer"] + parts["fake"] + parts["other"]
                print("  run %d: %7.1f %s/call = cudefer %7.1f + fake %7.1f"
                      " + other %6.1f" % (i + 1, total / n, unit,
                                          parts["cudefer"] / n,
                                          parts["fake"] / n,
                                          parts["other"] / n))
                if o.lines:
                    print("         = code %7.1f + data read %7.1f + data "
                          "written %6.1f" % tuple(parts[ev] / n
                                                  for ev in LINE_EVENTS))
            by_fn = collections.Counter()
            fn_group = {}
            for (fn, path), ir in last[e].items():
                by_fn[fn] += ir
                fn_group.setdefault(fn, group(path))
            n = per_entry[e][-1][0]
            print("  self %s/call, top %d:" % (unit, o.top))
            for fn, ir in by_fn.most_common(o.top):
                print("    %7.1f  %-8s %s" % (ir / n, fn_group[fn], fn))


if __name__ == "__main__":
    main()
