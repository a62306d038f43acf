#!/usr/bin/env python3
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
"""
import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
from table import print_table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.path.dirname(HERE)

LOOP_STRATEGIES = ['limit', 'malloc-never-free', 'inline-cudaFree', 'inline-async',
                   'naive-reclaimer', 'cudefer', 'cudefer-alloc']
CALL_STRATEGIES = ['inline-cudaFree', 'inline-async', 'naive-reclaimer', 'cudefer']
TRAIN_STRATEGIES = ['native', 'native-async', 'pluggable-async', 'cudefer',
                    'malloc-defer', 'malloc-free']

# A ratio: (key written, metric divided, strategy divided by, its metric).
LIMIT_RATIOS = [('ratio_done', 'done_ms', 'limit', 'done_ms'),
                ('ratio_released', 'released_ms', 'limit', 'done_ms')]
FLOOR_RATIOS = [('ratio_done_floor', 'done_ms', 'malloc-never-free', 'done_ms')]
ASYNC_RATIOS = [('ratio_p50_async', 'call_p50_us', 'inline-async', 'call_p50_us'),
                ('ratio_p99_async', 'call_p99_us', 'inline-async', 'call_p99_us')]
SCALE_RATIOS = [('ratio_calls_per_s', 'enqueue_calls_per_s', 'no-library',
                 'enqueue_calls_per_s')]
TRAIN_RATIOS = [('ms_per_step_ratio', 'ms_per_step', 'native', 'ms_per_step'),
                ('peak_ratio', 'peak_mib', 'native', 'peak_mib')]


class Workload:
    """One workload: which program runs it, its strategies in table order,
    the bound rows that always run (first in each repetition), the ratios."""

    def __init__(self, name, group, program, strategies, bounds, ratios,
                 model=None, ddp=False, title=''):
        self.name, self.group, self.program = name, group, program
        self.strategies, self.bounds, self.ratios = strategies, bounds, ratios
        self.model, self.ddp, self.title = model, ddp, title

    @property
    def is_train(self):
        return self.model is not None


def _loop(name, title, floor=True):
    return Workload(name, name, 'bench-launch-loop', LOOP_STRATEGIES,
                    ['limit', 'malloc-never-free'] if floor else ['limit'],
                    LIMIT_RATIOS + (FLOOR_RATIOS if floor else []), title=title)


def _train(model, ddp):
    name = 'train-%s%s' % (model, '-ddp' if ddp else '')
    title = '%s training, %s' % ('ResNet-class CNN' if model == 'cnn' else
                                 'transformer LM',
                                 'DistributedDataParallel over NCCL' if ddp
                                 else 'one GPU')
    return Workload(name, name, None, TRAIN_STRATEGIES, ['native'], TRAIN_RATIOS,
                    model=model, ddp=ddp, title=title)


WORKLOADS = [
    _loop('W1', 'steady: 1 thread, 1 stream, {allocate 1 MiB, 50 us kernel, '
                'release} per iteration, no host sync'),
    _loop('W2', 'bursty: W1 with cudaStreamSynchronize every 32 iterations'),
    Workload('W3', 'W3', 'bench-launch-loop', ['limit', 'inline-async', 'cudefer'],
             ['limit'], LIMIT_RATIOS,
             title='pool: W1 with cudaMallocAsync allocations '
                   '(cudefer: defer_free of pool memory)'),
    _loop('W4', 'threads: 8 launching threads, each W1 on its own stream'),
    Workload('W5-idle', 'W5', 'bench-release-call', CALL_STRATEGIES, [],
             ASYNC_RATIOS, title='call cost: the release call alone, 1 MiB buffers'),
    Workload('W5-busy', 'W5', 'bench-release-call', CALL_STRATEGIES, [],
             ASYNC_RATIOS, title='call cost: the release call alone, 1 MiB buffers'),
    Workload('W6', 'W6', 'bench-scale', ['no-library', 'cudefer'], ['no-library'],
             SCALE_RATIOS, title='scale: 10^6 calls over 1024 streams from 64 '
             'threads, streams held back by a gate kernel (cudefer: defer_call '
             'of a trivial callback; no-library: cudaEventRecord)'),
    _train('cnn', False), _train('lm', False), _train('cnn', True), _train('lm', True),
]
GROUPS = []
for _w in WORKLOADS:
    if _w.group not in GROUPS:
        GROUPS.append(_w.group)
BUILTIN = sorted({s for w in WORKLOADS for s in w.strategies})

# Keys of every record that describe the run, not one result.
RUN_FACTS = ('date', 'command', 'commit', 'driver_version', 'cuda', 'cuda_runtime',
             'cuda_driver', 'cudefer_version', 'torch_version')

DEFAULTS = dict(reps=3, iters=5000, w5_calls=20000, w6_entries=1000000,
                train_steps=40, train_warmup=10)
QUICK = dict(reps=1, iters=500, w5_calls=2000, w6_entries=65536,
             train_steps=15, train_warmup=5)


class Strategy:
    """A row: a built-in strategy, or a variant (a base strategy run with
    environment settings)."""

    def __init__(self, name, base, env=None, env_text=''):
        self.name, self.base, self.env, self.env_text = name, base, env or {}, env_text


def parse_variant(spec):
    """'NAME[:BASE]=ENV=VAL[,ENV=VAL...]' -> Strategy; ValueError says why."""
    head, sep, assigns = spec.partition('=')
    name, _, base = head.partition(':')
    base = base or 'cudefer'
    if not sep or not assigns:
        raise ValueError("expected NAME[:BASE]=ENV=VAL[,ENV=VAL...]")
    if not re.fullmatch(r'[A-Za-z0-9._+-]+', name):
        raise ValueError("bad name '%s' (letters, digits, . _ + -)" % name)
    if name in BUILTIN:
        raise ValueError("'%s' is a built-in strategy" % name)
    if base not in BUILTIN:
        raise ValueError("unknown base strategy '%s'" % base)
    env = {}
    for item in assigns.split(','):
        key, eq, val = item.partition('=')
        if not eq or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', key):
            raise ValueError("'%s' is not ENV=VAL" % item)
        env[key] = val
    return Strategy(name, base, env, assigns)


def median_min_max(values):
    """(median, min, max) of the numbers among values; Nones when none."""
    nums = [v for v in values if isinstance(v, (int, float))
            and not isinstance(v, bool) and v == v]
    if not nums:
        return None, None, None
    return statistics.median(nums), min(nums), max(nums)


def last_json_object(text):
    """The last line of text that is a JSON object, as a dict, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith('{'):
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


def last_json_list(text):
    """The last line of text, parsed as a JSON list, or None."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    try:
        obj = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return obj if isinstance(obj, list) else None


def run_child(cmd, env, timeout):
    """Run cmd in its own process group; kill the group after timeout s.
    Returns (exit status or None when timed out, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True, universal_newlines=True,
                                errors='replace')
    except OSError as e:
        return -1, '', 'cannot start %s: %s\n' % (cmd[0], e), 0.0
    try:
        out, err = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        status = None
    return status, out, err, time.monotonic() - t0


def child_env(strategy):
    """The environment of a child: no CUDEFER_* but the variant's own (a
    library setting is read once per process; the default row must see the
    defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('CUDEFER_')}
    env.update(strategy.env)
    return env


class Runner:
    """The matrix: which runs, in which order, and their results."""

    def __init__(self, opts, workloads, variants, bindir, info, out):
        self.o, self.workloads, self.variants = opts, workloads, variants
        self.bindir, self.info, self.out = bindir, info, out
        self.results = {}     # (workload, strategy) -> list of rep records
        self.failures = 0

    def rows(self, wl):
        """The strategies that run for wl, in table order: its bounds (always),
        the chosen built-ins, then the variants whose base it runs."""
        names = wl.bounds + [n for n in wl.strategies if n not in wl.bounds
                             and n in self.o.strategy_set]
        return [Strategy(n, n) for n in names] + \
            [s for s in self.variants if s.base in wl.strategies]

    def command(self, wl, st, rep):
        o = self.o
        if wl.is_train:
            cmd = [sys.executable, o.torch_script, '--model', wl.model,
                   '--allocator', st.base, '--steps', str(o.train_steps),
                   '--warmup', str(o.train_warmup)]
            if wl.ddp:
                cmd.append('--ddp')
            if o.torch_lib:
                cmd += ['--lib', o.torch_lib]
            return cmd
        cmd = [os.path.join(self.bindir, wl.program), '--workload', wl.name,
               '--strategy', st.base, '--label', st.name, '--rep', str(rep)]
        if wl.program == 'bench-launch-loop':
            cmd += ['--iters', str(o.iters)]
        elif wl.program == 'bench-release-call':
            cmd += ['--calls', str(o.w5_calls)]
        else:
            cmd += ['--entries', str(o.w6_entries)]
        return cmd

    def plan(self):
        """[(rep, workload, strategy)] in run order."""
        return [(rep, wl, st) for rep in range(self.o.reps)
                for wl in self.workloads for st in self.rows(wl)]

    def bound_record(self, wl, name, rep):
        """The bound's record of this repetition, or one made of the medians
        of its earlier repetitions when this one failed."""
        recs = [r for r in self.results.get((wl.name, name), []) if r['ok']]
        for r in recs:
            if r['rep'] == rep:
                return r
        if not recs:
            return None
        keys = {k for r in recs for k in r}
        return {k: median_min_max([r.get(k) for r in recs])[0] for k in keys}

    def add_ratios(self, wl, rec):
        mine = rec['strategy']
        for key, metric, bound, bound_metric in wl.ratios:
            if mine in wl.bounds and bound in wl.bounds and \
                    wl.bounds.index(bound) > wl.bounds.index(mine):
                rec[key] = None   # that bound runs later in the repetition
                continue
            b = rec if mine == bound else self.bound_record(wl, bound, rec['rep'])
            num, den = rec.get(metric), b.get(bound_metric) if b else None
            ok = all(isinstance(v, (int, float)) and v == v for v in (num, den))
            rec[key] = num / den if ok and den > 0 else None
        if wl.is_train:
            # native of the same repetition; native itself: its first
            # repetition (so that its row checks that training is deterministic)
            natives = [r for r in self.results.get((wl.name, 'native'), []) if r['ok']]
            if rec['strategy'] != 'native':
                natives = [r for r in natives if r['rep'] == rec['rep']] or natives
            ref = natives[0] if natives else rec if rec['strategy'] == 'native' else {}
            for what in ('losses', 'weights'):
                mine, theirs = rec.get(what + '_sha256'), ref.get(what + '_sha256')
                rec[what + '_identical'] = mine == theirs if mine and theirs else None

    def make_record(self, wl, st, rep, status, out, seconds):
        """The JSON line of one run (ok or not), with the run's facts."""
        rec = dict(self.info)
        result = last_json_object(out) if status is not None else None
        error = None
        if status is None:
            error = 'timed out after %d s' % self.timeout(wl)
        elif result is None:
            error = 'no result (exit status %d)' % status
        elif not wl.is_train and (result.get('workload') != wl.name or
                                  result.get('strategy') != st.name):
            error = 'result for another run: %s %s' % (result.get('workload'),
                                                         result.get('strategy'))
        elif wl.is_train and not isinstance(result.get('ms_per_step'), (int, float)):
            error = 'no ms_per_step in the result (exit status %d)%s' % (
                status, ': ' + str(result['error']) if 'error' in result else '')
        if error is None:
            rec.update(result)
            for k in RUN_FACTS:   # the run's facts win; a child's own go aside
                if k in result and k in self.info and result[k] != self.info[k]:
                    rec['child_' + k], rec[k] = result[k], self.info[k]
        rec.update(record='rep', workload=wl.name, strategy=st.name, kind=st.base,
                   env=st.env_text, rep=rep, ok=error is None,
                   exit_status=status, seconds=round(seconds, 3))
        if wl.is_train:
            rec.update(allocator=st.name, allocator_base=st.base)
            rec.setdefault('model', wl.model)
        if error:
            rec['error'] = error
        else:
            self.add_ratios(wl, rec)
        return rec

    def timeout(self, wl):
        return self.o.train_timeout if wl.is_train else self.o.timeout

    def run(self):
        plan = self.plan()
        for i, (rep, wl, st) in enumerate(plan):
            cmd = self.command(wl, st, rep)
            status, out, err, secs = run_child(cmd, child_env(st), self.timeout(wl))
            rec = self.make_record(wl, st, rep, status, out, secs)
            self.results.setdefault((wl.name, st.name), []).append(rec)
            self.write(rec)
            if not rec['ok']:
                self.failures += 1
                state = 'FAILED: ' + rec['error']
            elif status != 0:
                state = 'ok, but the run then failed: exit status %d' % status
            else:
                state = 'ok'
            progress('[%d/%d rep %d/%d] %-13s %-20s %s (%.1f s)' % (
                i + 1, len(plan), rep + 1, self.o.reps, wl.name, st.name, state, secs))
            echo_stderr(err, failed=not rec['ok'] or status != 0, cmd=cmd, env=st.env)

    def write(self, rec):
        self.out.write(json.dumps(rec, sort_keys=False) + '\n')
        self.out.flush()


def progress(msg):
    sys.stderr.write(msg + '\n')
    sys.stderr.flush()


def echo_stderr(err, failed, cmd, env):
    """What a child said that matters: its notes and cudefer's messages, or
    on failure its last lines and the command to repeat it."""
    lines = [l for l in err.splitlines() if l.strip()]
    if failed:
        shown = lines[-15:]
        shown.append('command: ' + ' '.join(
            ['%s=%s' % (k, shlex.quote(v)) for k, v in env.items()] +
            [shlex.quote(c) for c in cmd]))
    else:
        shown = [l for l in lines if 'note:' in l or l.startswith('cudefer')]
    for line in shown:
        progress('    ' + line)


def summarize(workloads, results, info):
    """One record per (workload, strategy): medians of every number over its
    good repetitions, ratios with _min and _max, counts (the keys of the old
    C bench's lines, so bench/plot.py reads both)."""
    out = []
    for wl in workloads:
        for (wname, sname), recs in results.items():
            if wname != wl.name:
                continue
            good = [r for r in recs if r['ok']]
            s = dict(info)
            s.update(record='summary', workload=wname, strategy=sname,
                     kind=recs[0]['kind'], env=recs[0]['env'], reps=len(good),
                     reps_failed=len(recs) - len(good),
                     reps_exit_nonzero=sum(1 for r in good if r['exit_status'] != 0))
            ratio_keys = [k for k, _, _, _ in wl.ratios]
            keys = [k for r in good for k, v in r.items() if k not in s
                    and k not in ('rep', 'exit_status')
                    and isinstance(v, (int, float)) and not isinstance(v, bool)]
            for k in dict.fromkeys(keys):
                med, lo, hi = median_min_max([r.get(k) for r in good])
                s[k] = med
                if k in ratio_keys:
                    s[k + '_min'], s[k + '_max'] = lo, hi
            for k in ('losses_identical', 'weights_identical', 'model', 'gpus',
                      'device', 'allocator', 'allocator_base') if wl.is_train else ():
                vals = [r.get(k) for r in good if r.get(k) is not None]
                if k.endswith('_identical'):
                    s[k] = (all(vals) if vals else None)
                    s[k + '_reps'] = sum(1 for v in vals if v)
                elif vals:
                    s[k] = vals[0]
            out.append(s)
    return out


# ---- the run's facts ---------------------------------------------------------

def git_commit():
    """HEAD of the source tree (-dirty with uncommitted changes), or the
    commit make dist wrote into the tarball, or 'unknown'."""
    try:
        head = subprocess.run(['git', '-C', SRCDIR, 'rev-parse', 'HEAD'],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True, timeout=30)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(['git', '-C', SRCDIR, 'diff', '--quiet', 'HEAD'],
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, timeout=30)
            return head.stdout.strip() + ('-dirty' if dirty.returncode else '')
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open(os.path.join(HERE, 'source-commit')) as f:
            return f.read().strip() or 'unknown'
    except OSError:
        return 'unknown'


def parse_driver_version(text):
    """The driver's version (e.g. 580.95.05) in the text of
    /proc/driver/nvidia/version, or None.  Its first line is either
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." or
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  ...":
    the version is the first dotted number after "Kernel Module", not the
    word after it."""
    m = re.search(r'Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)', text)
    return m.group(1) if m else None


def nvidia_smi_gpus():
    """[(name, driver version)] of every GPU as nvidia-smi lists them (it
    does not initialize CUDA in this process); [] when nvidia-smi is missing
    or fails.  Blocks until nvidia-smi ends (at most 60 s)."""
    try:
        r = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version',
                            '--format=csv,noheader'], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    rows = []
    for line in r.stdout.splitlines():
        name, _, version = line.rpartition(',')
        if name.strip() and version.strip():
            rows.append((name.strip(), version.strip()))
    return rows


def driver_version(proc_file='/proc/driver/nvidia/version'):
    """The NVIDIA kernel driver's version (e.g. 580.95.05), from proc_file
    or else nvidia-smi; None when neither says."""
    try:
        with open(proc_file) as f:
            version = parse_driver_version(f.read())
        if version:
            return version
    except OSError:
        pass
    rows = nvidia_smi_gpus()
    return rows[0][1] if rows else None


def device_info_without_programs(torch_found):
    """Device facts for a run with no C program to ask (training only, no
    make bench): device and GPU count from nvidia-smi, the CUDA version
    PyTorch was built with; {} for what is unknown."""
    info = {}
    rows = nvidia_smi_gpus()
    if rows:
        info['device'], info['gpus'] = rows[0][0], len(rows)
    if torch_found and torch_found[2]:
        info['cuda'] = 'PyTorch built with CUDA %s' % torch_found[2]
    return info


def device_info(bindir):
    """Device and versions from `bench-launch-loop --info` (the parent never
    initializes CUDA itself); {} when that fails (said on stderr)."""
    status, out, err, _ = run_child([os.path.join(bindir, 'bench-launch-loop'),
                                     '--info'], child_env(Strategy('', '')), 60)
    info = last_json_object(out) if status == 0 else None
    if not info:
        progress('run.py: device info failed (%s): %s' % (
            'timed out' if status is None else 'exit status %s' % status,
            err.strip()[-300:]))
        return {}
    info.pop('info', None)
    rt, drv = info.get('cuda_runtime', 0), info.get('cuda_driver', 0)
    info['cuda'] = 'runtime %d.%d, driver %d.%d' % (rt // 1000, rt % 1000 // 10,
                                                     drv // 1000, drv % 1000 // 10)
    return info


def torch_check(python):
    """(torch version, GPU count, CUDA version torch was built with or None)
    when python can import torch, else None."""
    status, out, err, _ = run_child(
        [python, '-c', 'import json, torch; print(json.dumps([torch.__version__, '
                       'torch.cuda.device_count(), getattr(getattr(torch, '
                       '"version", None), "cuda", None)]))'], dict(os.environ), 300)
    found = last_json_list(out) if status == 0 else None
    if not found or len(found) != 3 or not isinstance(found[1], int):
        return None
    return found[0], found[1], found[2]


# ---- the command line --------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog='run.py', description='Run the cudefer benchmark: every strategy on '
        'every workload, each repetition in a fresh process (bench/README.md).')
    p.add_argument('--workloads', help='comma-separated: %s (default: W1-W6, '
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
    p.add_argument('--timeout', type=int, default=120,
                   help='seconds a C workload may run (120)')
    p.add_argument('--train-timeout', type=int, default=900,
                   help='seconds a training run may run (900)')
    p.add_argument('--bindir', help='where the programs of make bench are '
                   '(default: ./bench if it has them, else the source bench/)')
    p.add_argument('--torch-lib', metavar='PATH',
                   help='passed to torch_train.py as --lib (default: '
                   'BINDIR/../src/.libs/libcudefer.so when it exists)')
    p.add_argument('--torch-script', default=os.path.join(HERE, 'torch_train.py'),
                   help=argparse.SUPPRESS)
    p.add_argument('--dry-run', action='store_true',
                   help='print the runs (environment and command) and stop')
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


def main(argv=None):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # quiet under `| head`
    o = parse_args(sys.argv[1:] if argv is None else argv)
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
        for rep, wl, st in runner.plan():
            print(' '.join(['%s=%s' % (k, shlex.quote(v)) for k, v in st.env.items()] +
                           [shlex.quote(c) for c in runner.command(wl, st, rep)]))
        return 0
    missing = [p for p in programs if not os.access(os.path.join(bindir, p), os.X_OK)]
    if missing:
        progress('run.py: %s not found in %s: run "make bench" in the build '
                 'directory, or give --bindir' % (', '.join(missing), bindir))
        return 2
    for k in sorted(os.environ):
        if k.startswith('CUDEFER_'):
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
                                   'train_steps', 'train_warmup', 'quick')},
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
