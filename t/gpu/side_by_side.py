# SPDX-License-Identifier: MIT
"""side_by_side.py: what the GPU suite's Python scripts share.  Each runs
one workload twice, under PyTorch's own allocator ("native") and under
cudefer.torch.enable() ("cudefer"), each in a process of its own (an
allocator is chosen once per process), then compares the two JSON
results and prints one "PASS name: detail" or "FAIL name: detail" line
per check (t/gpu/torch_python.sh turns them into TAP).

A script's main is

    sys.exit(side_by_side.main(__file__, run, compare))

with run(mode, args) writing mode's results to args.out, and
compare(native, mine) printing the checks (Checks does the counting) and
returning the number of failures.  main's exit status: 0 when every
check passed, 1 when one failed or a run did not end well, 77 (skip)
without torch, without a module the script names in needs, or without
a CUDA device.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODES = ("native", "cudefer")


class Checks:
    """PASS/FAIL lines, each optionally prefixed ("native: name"), and
    their failures counted in .failures."""

    def __init__(self):
        self.failures = 0

    def check(self, name, ok, detail="", prefix=None):
        print("%s %s%s%s" % ("PASS" if ok else "FAIL",
                             prefix + ": " if prefix else "", name,
                             ": " + detail if detail else ""), flush=True)
        self.failures += 0 if ok else 1
        return ok


def parser():
    """The options every script takes: --lib (libcudefer.so, default:
    cudefer's search), and the hidden --run MODE --out FILE of a run."""
    p = argparse.ArgumentParser()
    p.add_argument("--lib", help="libcudefer.so (default: cudefer's search)")
    p.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def _skip(needs):
    """A SKIP line's text when torch, a module of needs or a CUDA device
    is missing, else None."""
    try:
        import torch
        for name in needs:
            __import__(name)
    except ImportError as e:
        return "no torch" if getattr(e, "name", "") == "torch" else str(e)
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def main(script, run, compare, p=None, forward=(), needs=(), before=None):
    """Parses the command line (p: parser() with the script's own options
    added), and either does one run (--run) or both and the comparison.
    forward: the names of the script's own options passed on to the runs.
    before(args): called first, its result returned where it is not None
    (a script's other hidden modes).  Each run's last 30 lines are shown
    when it fails."""
    args = (p or parser()).parse_args()
    if before is not None:
        status = before(args)
        if status is not None:
            return status
    if args.run:
        run(args.run, args)
        return 0
    why = _skip(needs)
    if why is not None:
        print("SKIP " + why)
        return 77
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            out = os.path.join(tmp, mode + ".json")
            cmd = [sys.executable, os.path.abspath(script), "--run", mode,
                   "--out", out]
            for name in forward:
                cmd += ["--" + name, str(getattr(args, name))]
            if args.lib:
                cmd += ["--lib", args.lib]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0 or not os.path.exists(out):
                print("FAIL %s run: exit status %d" % (mode, proc.returncode))
                print("\n".join("  " + line for line in
                                proc.stdout.splitlines()[-30:]))
                return 1
            with open(out) as f:
                results[mode] = json.load(f)
    return 1 if compare(results["native"], results["cudefer"]) else 0
