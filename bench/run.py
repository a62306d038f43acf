#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/run.py: run cudefer's benchmark matrix and print the table.

Every (workload, strategy, repetition) runs in a fresh process: the C
programs of `make bench` for W1-W6, bench/torch_train.py for the training
workloads.  Each prints one JSON object (its last line on stdout).  The
repetitions are interleaved (rep 0 of everything, then rep 1, ...), and in
each one the bound rows of a workload run first, so that every result can
be written at once with its ratios to the bounds of the same repetition.
Progress goes to stderr, JSON lines to --json FILE (or stdout), the table
is the last thing on stdout.  bench/README.md explains the workloads,
strategies, columns and keys.  Python standard library only.

The parts: run_workloads.py (workloads, strategies, variants),
run_matrix.py (the runs and their records), run_process.py (one run in a
fresh process), run_summary.py (the statistics), run_facts.py (device,
versions, commit), table.py (the table).
"""
import argparse
import json
import os
import shlex
import signal
import sys
import time

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
from run_facts import (device_info, device_info_without_programs,  # noqa: E402
                       driver_version, git_commit, torch_check)
from run_matrix import Runner  # noqa: E402
from run_process import library_setting, parse_cpus, progress  # noqa: E402
from run_summary import summarize  # noqa: E402
from run_workloads import BUILTIN, GROUPS, WORKLOADS, parse_variant  # noqa: E402
from table import print_table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULTS = dict(reps=3, iters=5000, w5_calls=20000, w6_entries=1000000,
                train_steps=40, train_warmup=10)
QUICK = dict(reps=1, iters=500, w5_calls=2000, w6_entries=65536,
             train_steps=15, train_warmup=5)


# ---- the command line --------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog='run.py', description='Run the cudefer benchmark: every strategy on '
        'every workload, each repetition in a fresh process (bench/README.md).')
    p.add_argument('--workloads', help='comma-separated: %s (default: W1-W6, W5-parts, '
                   'train-cnn, train-lm, and the -ddp ones on 2+ GPUs)' %
                   ','.join(GROUPS))
    p.add_argument('--strategies', help='comma-separated built-in strategies '
                   '(default all; the bound rows always run): ' + ','.join(BUILTIN))
    p.add_argument('--variant', action='append', default=[],
                   metavar='NAME[:BASE]=ENV=VAL[,ENV=VAL...]',
                   help='also run strategy BASE (default cudefer) with these '
                   'environment settings, as row NAME; repeatable')
    p.add_argument('--reps', type=int, help='repetitions (default 3)')
    p.add_argument('--iters', type=int, help='W1-W4 iterations per thread (5000)')
    p.add_argument('--w5-calls', type=int, help='W5 calls per process (20000)')
    p.add_argument('--w6-entries', type=int, help='W6 calls (1000000)')
    p.add_argument('--train-steps', type=int, help='timed training steps (40)')
    p.add_argument('--train-warmup', type=int, help='untimed first steps (10)')
    p.add_argument('--quick', action='store_true', help='smoke run: 1 repetition, '
                   '500 iterations, 2000 W5 calls, 65536 W6 calls, 15+5 training '
                   'steps (each unless given)')
    p.add_argument('--json', metavar='FILE', help='write the JSON lines there '
                   '(default: stdout, before the table)')
    p.add_argument('--cpus', metavar='LIST',
                   help='pin every measured process, its threads and children '
                   'to these CPUs (taskset\'s form, e.g. 2-5): whether the '
                   'spread between processes is where they run')
    p.add_argument('--timeout', type=int, default=120,
                   help='seconds a C workload may run (120)')
    p.add_argument('--train-timeout', type=int, default=900,
                   help='seconds a training run may run (900)')
    p.add_argument('--bindir', help='where the programs of make bench are '
                   '(default: ./bench if it has them, else the source bench/)')
    p.add_argument('--time-calls', action='store_true',
                   help='training: time every allocation and free of the '
                   'pluggable allocators (torch_train.py --time-calls) and '
                   'show their microseconds a step')
    p.add_argument('--torch-lib', metavar='PATH',
                   help='passed to torch_train.py as --lib (default: '
                   'BINDIR/../src/.libs/libcudefer.so when it exists)')
    p.add_argument('--torch-script', default=os.path.join(HERE, 'torch_train.py'),
                   help=argparse.SUPPRESS)
    p.add_argument('--dry-run', action='store_true',
                   help='print the runs (environment and command) and stop')
    p.add_argument('--from-json', metavar='FILE',
                   help='run nothing: print the table of the JSON lines of an '
                   'earlier run, from its repetitions (so a run cut short '
                   'gets the table of those it finished)'),
    o = p.parse_args(argv)
    base = QUICK if o.quick else DEFAULTS
    for k, v in base.items():
        if getattr(o, k) is None:
            setattr(o, k, v)
    for k, lo in (('reps', 1), ('iters', 1), ('w5_calls', 100), ('w6_entries', 64),
                  ('train_steps', 1), ('train_warmup', 0), ('timeout', 1),
                  ('train_timeout', 1)):
        if getattr(o, k) < lo:
            p.error('--%s must be at least %d' % (k.replace('_', '-'), lo))
    if o.cpus is not None:
        try:
            o.cpus = parse_cpus(o.cpus)
        except ValueError as e:
            p.error('--cpus: %s' % e)
        missing = sorted(set(o.cpus) - os.sched_getaffinity(0))
        if missing:
            p.error('--cpus: CPU %s not available to this process (it may '
                    'use %s)' % (', '.join(map(str, missing)),
                                 ', '.join(map(str, sorted(os.sched_getaffinity(0))))))
    o.strategy_set = set(BUILTIN)
    if o.strategies:
        o.strategy_set = set(o.strategies.split(','))
        bad = o.strategy_set - set(BUILTIN)
        if bad:
            p.error('unknown strategy %s (known: %s)' % (', '.join(sorted(bad)),
                                                         ', '.join(BUILTIN)))
    o.variants = []
    for spec in o.variant:
        try:
            v = parse_variant(spec)
        except ValueError as e:
            p.error("--variant '%s': %s" % (spec, e))
        if any(w.name == v.name for w in o.variants):
            p.error("--variant '%s': name '%s' already used" % (spec, v.name))
        o.variants.append(v)
    o.explicit = None
    if o.workloads:
        o.explicit = o.workloads.split(',')
        known = set(GROUPS) | {w.name for w in WORKLOADS}
        bad = [w for w in o.explicit if w not in known]
        if bad:
            p.error('unknown workload %s (known: %s)' % (', '.join(bad),
                                                         ', '.join(GROUPS)))
    return o


def select_workloads(o):
    """The workloads to run, in table order; training ones only where
    python3 has torch (and -ddp ones only with 2+ GPUs).  Returns
    (workloads, torch_check's answer or None)."""
    if o.explicit:
        chosen = [w for w in WORKLOADS if w.group in o.explicit or w.name in o.explicit]
    else:
        chosen = [w for w in WORKLOADS if not w.ddp]
    train = [w for w in chosen if w.is_train]
    if not train:
        return chosen, None
    names = ', '.join(w.name for w in train)
    why, found = None, None
    if not os.path.exists(o.torch_script):
        why = '%s does not exist' % o.torch_script
    else:
        found = torch_check(sys.executable)
        if not found:
            why = '%s cannot import torch' % sys.executable
    if why:
        progress('run.py: skipping %s: %s' % (names, why))
        return [w for w in chosen if not w.is_train], None
    if found[1] >= 2 and not o.explicit:
        chosen += [w for w in WORKLOADS if w.ddp]
    elif found[1] < 2 and any(w.ddp for w in chosen):
        progress('run.py: skipping the -ddp workloads: torch sees %d GPU(s)' % found[1])
        chosen = [w for w in chosen if not w.ddp]
    return chosen, found


def find_bindir(o):
    if o.bindir:
        return o.bindir
    for d in (os.path.join(os.getcwd(), 'bench'), HERE):
        if os.path.exists(os.path.join(d, 'bench-launch-loop')):
            return d
    return os.path.join(os.getcwd(), 'bench')


def build_library(bindir):
    """The libcudefer.so of the build directory whose bench/ is bindir
    (BUILD/src/.libs/libcudefer.so), or None when there is none: with a
    build directory apart from the sources, torch_train.py would otherwise
    look in the source tree."""
    path = os.path.join(os.path.dirname(os.path.abspath(bindir)), 'src', '.libs',
                        'libcudefer.so')
    return path if os.path.isfile(path) else None


def table_from_json(path):
    """--from-json: the table of an earlier run's JSON lines, computed
    again from its header and repetition records (a line cut by a kill is
    skipped, said).  Returns the exit status."""
    header, results = None, {}
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        progress('run.py: %s: %s' % (path, e.strerror))
        return 2
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            progress('run.py: %s:%d: not a JSON line (cut short?): skipped' % (path, n))
            continue
        if rec.get('record') == 'run':
            header = rec
        elif rec.get('record') == 'rep':
            results.setdefault((rec['workload'], rec['strategy']), []).append(rec)
    if header is None:
        progress('run.py: %s: no header line (record "run"): not a run.py file?' % path)
        return 2
    names = header.get('workloads') or []
    workloads = [w for w in WORKLOADS if w.name in names]
    info = {k: v for k, v in header.items()
            if k not in ('record', 'options', 'workloads')}
    o = argparse.Namespace(**header.get('options', {}))
    for k, v in DEFAULTS.items():
        if not hasattr(o, k):
            setattr(o, k, v)
    failures = sum(1 for recs in results.values() for r in recs if not r['ok'])
    print_table(workloads, summarize(workloads, results, info), info, o, failures)
    return 0


def main(argv=None):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # quiet under `| head`
    o = parse_args(sys.argv[1:] if argv is None else argv)
    if o.from_json:
        return table_from_json(o.from_json)
    workloads, torch_found = select_workloads(o)
    if not workloads:
        progress('run.py: nothing to run')
        return 2
    bindir = find_bindir(o)
    if not o.torch_lib and any(w.is_train for w in workloads):
        o.torch_lib = build_library(bindir)
    programs = sorted({w.program for w in workloads if w.program})
    runner = Runner(o, workloads, o.variants, bindir, {}, sys.stdout)
    if o.dry_run:
        # --cpus: the same pinning as taskset would give.
        pin = ['taskset', '-c', ','.join(map(str, o.cpus))] if o.cpus else []
        for rep, wl, st in runner.plan():
            print(' '.join(['%s=%s' % (k, shlex.quote(v)) for k, v in st.env.items()] +
                           pin + [shlex.quote(c) for c in runner.command(wl, st, rep)]))
        return 0
    missing = [p for p in programs if not os.access(os.path.join(bindir, p), os.X_OK)]
    if missing:
        progress('run.py: %s not found in %s: run "make bench" in the build '
                 'directory, or give --bindir' % (', '.join(missing), bindir))
        return 2
    for k in sorted(os.environ):
        if library_setting(k):
            progress('run.py: note: %s is ignored (each run gets only its '
                     'variant\'s CUDEFER_* settings; use --variant)' % k)
    info = dict(date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                command=' '.join(shlex.quote(a) for a in [sys.argv[0]] +
                                 (sys.argv[1:] if argv is None else argv)),
                commit=git_commit(), driver_version=driver_version())
    if programs:
        device = device_info(bindir)
        if not device:
            progress('run.py: no usable CUDA device: nothing measured')
            return 1
        info.update(device)
    elif os.access(os.path.join(bindir, 'bench-launch-loop'), os.X_OK):
        # training only, but make bench was run: the same facts as the C runs
        info.update(device_info(bindir) or device_info_without_programs(torch_found))
    else:
        info.update(device_info_without_programs(torch_found))
    if torch_found:
        info['torch_version'] = torch_found[0]
    progress('run.py: %s, CUDA %s, NVIDIA driver %s, commit %s' % (
        info.get('device', '?'), info.get('cuda', '?'),
        info.get('driver_version') or '?', info['commit']))
    try:
        out = open(o.json, 'w') if o.json else sys.stdout
    except OSError as e:
        progress('run.py: %s: %s' % (o.json, e.strerror))
        return 2
    header = dict(info, record='run', options={
        k: getattr(o, k) for k in ('reps', 'iters', 'w5_calls', 'w6_entries',
                                   'train_steps', 'train_warmup', 'quick',
                                   'cpus')},
        workloads=[w.name for w in workloads])
    out.write(json.dumps(header) + '\n')
    runner.info, runner.out = info, out
    runner.run()
    summaries = summarize(workloads, runner.results, info)
    for s in summaries:
        runner.write(s)
    if o.json:
        out.close()
        progress('run.py: JSON lines written to %s' % o.json)
    print_table(workloads, summaries, info, o, runner.failures)
    return 1 if runner.failures else 0


if __name__ == '__main__':
    sys.exit(main())
