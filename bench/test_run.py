#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/test_run.py: tests of bench/run.py and bench/ab.sh, and those of
bench/test_train_measure.py and bench/test_results_md.py (the results
page), without a GPU, as TAP.  The C programs and torch_train.py are
replaced by small Python fakes written into a temporary directory (their
output has the real programs' keys); a fake `torch` package on PYTHONPATH
makes the training workloads run.  Run: python3 bench/test_run.py.  Standard library
only; needs nothing built."""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
import run  # noqa: E402
import table  # noqa: E402
import run_facts  # noqa: E402
import run_matrix  # noqa: E402
import run_process  # noqa: E402
import run_summary  # noqa: E402
import run_workloads  # noqa: E402
from test_train_measure import *  # noqa: E402,F401,F403 (its test_ too)
from test_results_md import *  # noqa: E402,F401,F403 (its test_ too)

# One fake answers for all three C programs.  Done time: limit 100 ms, the
# floor 110, cudefer 105, others 150 (rep adds 1 each).  FAKE_FAIL=label
# exits 1 without a result, FAKE_HANG=label starts a grandchild and sleeps.
FAKE_C = r'''#!PYTHON
import json, os, subprocess, sys, time
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
if '--info' in sys.argv:
    print(json.dumps(dict(info='device', device='Fake GPU', cc='9.0', gpus=1,
                          cuda_runtime=13000, cuda_driver=13000, cudefer_version='0.1.0')))
    sys.exit(0)
label, wl, rep = a['--label'], a['--workload'], int(a['--rep'])
if os.environ.get('FAKE_FAIL') == label:
    sys.stderr.write('bench: fake failure\n'); sys.exit(1)
if os.environ.get('FAKE_HANG') == label:
    subprocess.Popen(['sleep', '60']).wait()
sys.stderr.write('bench [%s %s]: note: something to see\n' % (wl, label))
base = {'limit': 100, 'malloc-never-free': 110, 'cudefer': 105}.get(a['--strategy'], 150)
done = base + rep
r = dict(workload=wl, strategy=label, kind=a['--strategy'], rep=rep,
         env_poll=os.environ.get('CUDEFER_POLL_US'), stray=os.environ.get('CUDEFER_STRAY'))
if wl == 'W5-parts':
    r.update(calls=int(a['--calls']), busy_held=1 if a['--strategy'] == 'busy' else None,
             created_defer_free_own_p50_us=0.25, legacy_defer_free_own_p50_us=0.5)
    for s in ('created', 'legacy'):
        for part in ('event_record', 'defer_free', 'pair_defer', 'pair_async'):
            r[s + '_' + part + '_p50_us'] = 1.25 if part == 'defer_free' else 0.75
            r[s + '_' + part + '_p99_us'] = 3.0
elif wl.startswith('W5'):
    r.update(calls=int(a['--calls']), call_p50_us=base / 100.0, call_p99_us=base / 50.0,
             call_max_us=9.0, busy_held=1 if wl == 'W5-busy' else None)
elif wl == 'W6':
    r.update(entries=int(a['--entries']), enqueue_calls_per_s=1e6 * 100 / base,
             call_p50_us=0.3, call_p99_us=2.0, call_max_us=50.0, bytes_per_entry=600.0,
             gate_stalled=0)
else:
    r.update(iters=int(a['--iters']), done_ms=done, released_ms=done + 10,
             iter_p50_us=60.0, iter_p99_us=70.0, iter_max_us=90.0, peak_bytes=2 ** 20,
             call_p50_us=None if base < 105 else 0.5, call_p99_us=None)
print(json.dumps(r))
'''

# torch_train.py: native 40 ms/step, 7000 MiB; malloc-free's losses differ.
FAKE_TRAIN = r'''#!PYTHON
import hashlib, json, os, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
alloc, model = a['--allocator'], a['--model']
if os.environ.get('FAKE_FAIL') == alloc:
    print(json.dumps(dict(error='CUDA out of memory'))); sys.exit(1)
ms = {'native': 40.0, 'cudefer': 41.0, 'malloc-free': 150.0}.get(alloc, 44.0)
peak = {'native': 7000.0, 'cudefer': 7700.0}.get(alloc, 6900.0)
losses = ['0x1.8p+1', '0x1.4p+1'] if alloc != 'malloc-free' else ['0x1.8p+1', '0x1.3p+1']
h = hashlib.sha256(''.join(losses).encode()).hexdigest()
print('step 1 loss 3.0')
r = dict(model=model, allocator=alloc, device='Fake GPU',
         gpus=2 if '--ddp' in sys.argv else 1, steps=int(a['--steps']),
         ms_per_step=ms, peak_mib=peak, losses=losses, losses_sha256=h,
         weights_sha256='w' + h[:8], lib=a.get('--lib'), cuda='13.0',
         gpu_steps_behind=0.97, host_busy_cpus=2.25, host_steal_pct=0.5)
if alloc == 'cudefer':
    r['cudefer_per_step'] = dict(cache_mallocs=27.0, cache_releases=26.0)
if '--time-calls' in sys.argv:
    r['calls'] = dict(alloc_calls_per_step=1000.0, alloc_us_per_step=600.0,
                      alloc_ns_mean=600.0, free_calls_per_step=1000.0,
                      free_us_per_step=1500.0, free_ns_mean=1500.0)
print(json.dumps(r))
'''

FAKE_TORCH = '''__version__ = '9.9-fake'
class version:
    cuda = '13.0'
class cuda:
    @staticmethod
    def device_count():
        return FAKE_GPUS
'''


def write(path, text, mode=0o755):
    with open(path, 'w') as f:
        f.write(text.replace('#!PYTHON', '#!' + sys.executable))
    os.chmod(path, mode)


def make_fakes(tmp, gpus=1, with_torch=True):
    bindir = os.path.join(tmp, 'bin')
    os.makedirs(bindir, exist_ok=True)
    for prog in ('bench-launch-loop', 'bench-release-call', 'bench-scale',
                 'bench-call-parts'):
        write(os.path.join(bindir, prog), FAKE_C)
    write(os.path.join(tmp, 'torch_train.py'), FAKE_TRAIN)
    # with_torch=False: a torch that fails to import, so that the python3 of a
    # GPU machine (which has the real one) cannot import torch either
    os.makedirs(os.path.join(tmp, 'py', 'torch'), exist_ok=True)
    write(os.path.join(tmp, 'py', 'torch', '__init__.py'),
          FAKE_TORCH.replace('FAKE_GPUS', str(gpus)) if with_torch else
          "raise ImportError('fake: no torch')\n", 0o644)
    return bindir


def run_py(tmp, args, env=None, timeout=120):
    e = dict(os.environ, PYTHONPATH=os.path.join(tmp, 'py'))
    e.update(env or {})
    p = subprocess.run([sys.executable, os.path.join(HERE, 'run.py'), '--bindir',
                        os.path.join(tmp, 'bin'), '--torch-script',
                        os.path.join(tmp, 'torch_train.py')] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                       universal_newlines=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def close(a, b):
    return a is not None and abs(a - b) < 1e-9 * abs(b)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


# ---- the tests ---------------------------------------------------------------

def test_parse_variant():
    v = run_workloads.parse_variant('poll10=CUDEFER_POLL_US=10,CUDEFER_X=a=b')
    assert (v.name, v.base) == ('poll10', 'cudefer'), v.__dict__
    assert v.env == {'CUDEFER_POLL_US': '10', 'CUDEFER_X': 'a=b'}, v.env
    v = run_workloads.parse_variant('cap1g:malloc-defer=CUDEFER_MAX_PENDING=1G')
    assert (v.name, v.base) == ('cap1g', 'malloc-defer')
    for bad in ('x', 'x=', 'cudefer=A=1', 'a b=A=1', 'x:nosuch=A=1', 'x=1A=2', 'x=A'):
        try:
            run_workloads.parse_variant(bad)
        except ValueError:
            continue
        raise AssertionError('accepted ' + bad)


def test_statistics():
    assert run_summary.median_min_max([3, None, 1, float('nan'), 2, True]) == (2, 1, 3)
    assert run_summary.median_min_max([None]) == (None, None, None)
    assert run_summary.median_min_max([1, 2]) == (1.5, 1, 2)
    assert run_process.last_json_object('x\n{"a": 1}\nnoise {\n{"b": 2}\n\n') == {'b': 2}
    assert run_process.last_json_object('{"a": 1}\n{broken') is None
    assert run_process.last_json_object('') is None


def test_child_env():
    os.environ['CUDEFER_STRAY'] = '1'
    os.environ['CUDEFER_LIB'] = '/opt/x/libcudefer.so'
    try:
        env = run_process.child_env(run_workloads.Strategy('v', 'cudefer', {'CUDEFER_POLL_US': '5'}))
    finally:
        del os.environ['CUDEFER_STRAY']
        del os.environ['CUDEFER_LIB']
    assert 'CUDEFER_STRAY' not in env and env['CUDEFER_POLL_US'] == '5'
    assert env.get('PATH') == os.environ.get('PATH')
    # where the PyTorch helper finds the library is no library setting
    # (it was dropped, and another library measured)
    assert env['CUDEFER_LIB'] == '/opt/x/libcudefer.so'


def test_plan_order():
    o = run.parse_args(['--strategies', 'cudefer,inline-async', '--reps', '2',
                        '--variant', 'v=CUDEFER_A=1', '--variant', 'm:malloc-defer=B=2'])
    w = {x.name: x for x in run_workloads.WORKLOADS}
    r = run_matrix.Runner(o, [w['W1'], w['W6'], w['train-cnn']], o.variants, '/b', {}, None)
    assert [s.name for s in r.rows(w['W1'])] == \
        ['limit', 'malloc-never-free', 'inline-async', 'cudefer', 'v'], r.rows(w['W1'])
    assert [s.name for s in r.rows(w['W6'])] == ['no-library', 'cudefer', 'v']
    assert [s.name for s in r.rows(w['train-cnn'])] == ['native', 'cudefer', 'v', 'm']
    plan = [(rep, wl.name, st.name) for rep, wl, st in r.plan()]
    assert len(plan) == 2 * 12 and plan[0] == (0, 'W1', 'limit') and plan[12][0] == 1
    w1 = [[p[2] for p in plan if p[0] == rep and p[1] == 'W1'] for rep in (0, 1)]
    assert w1 == [['limit', 'malloc-never-free', 'inline-async', 'cudefer', 'v'],
                  ['limit', 'malloc-never-free', 'cudefer', 'v', 'inline-async']], w1
    tr = [[p[2] for p in plan if p[0] == rep and p[1] == 'train-cnn'] for rep in (0, 1)]
    assert tr == [['native', 'cudefer', 'v', 'm'], ['native', 'v', 'm', 'cudefer']], tr
    cmd = r.command(w['W1'], r.rows(w['W1'])[-1], 1)
    assert cmd[1:] == ['--workload', 'W1', '--strategy', 'cudefer', '--label', 'v',
                       '--rep', '1', '--iters', '5000'], cmd
    q = run.parse_args(['--quick'])
    assert (q.reps, q.iters, q.w5_calls, q.w6_entries) == (1, 500, 2000, 65536)
    q = run.parse_args(['--quick', '--reps', '4', '--iters', '9'])
    assert (q.reps, q.iters) == (4, 9)


def test_w5_ratio_same_rep():
    """W5's ratios divide by inline-async of the same repetition in every
    repetition, rotation or not (before, rows that ran before it divided
    by an earlier repetition's median, or got none)."""
    o = run.parse_args(['--reps', '4', '--workloads', 'W5'])
    wl = next(x for x in run_workloads.WORKLOADS if x.name == 'W5-idle')
    r = run_matrix.Runner(o, [wl], [], '/b', {}, io.StringIO())
    for rep, _, st in r.plan():
        x = dict(record='rep', workload=wl.name, strategy=st.name, rep=rep,
                 ok=True, call_p99_us=1.0,
                 call_p50_us=(rep + 1) * (1.0 if st.name == 'inline-async'
                                          else 2.0))
        r.add_ratios(wl, x)
        r.results.setdefault((wl.name, st.name), []).append(x)
    bad = [(s, x['rep'], x['ratio_p50_async'])
           for (w, s), xs in r.results.items() for x in xs
           if s != 'inline-async' and x['ratio_p50_async'] != 2.0]
    assert not bad, bad


def test_ddp_identity_every_rank():
    """Under DDP, losses and weights are compared rank by rank with
    native's same repetition: a difference on rank 1 alone is seen."""
    o = run.parse_args(['--reps', '1', '--workloads', 'train-lm-ddp'])
    wl = next(x for x in run_workloads.WORKLOADS if x.name == 'train-lm-ddp')
    r = run_matrix.Runner(o, [wl], [], '/b', {}, io.StringIO())

    def rec(strategy, losses, weights):
        return dict(record='rep', workload=wl.name, strategy=strategy, rep=0,
                    ok=True, ms_per_step=1.0, peak_mib=1.0,
                    losses_sha256=losses[0], weights_sha256=weights[0],
                    losses_sha256_ranks=losses, weights_sha256_ranks=weights)
    native = rec('native', ['a', 'b'], ['w', 'w'])
    r.add_ratios(wl, native)
    r.results[(wl.name, 'native')] = [native]
    same, other = rec('cudefer', ['a', 'b'], ['w', 'w']), \
        rec('cudefer', ['a', 'X'], ['w', 'Y'])
    r.add_ratios(wl, same)
    r.add_ratios(wl, other)
    assert same['losses_identical'] and same['weights_identical'], same
    assert other['losses_identical'] is False and \
        other['weights_identical'] is False, other


def test_reps_column():
    """The reps column says which repetitions failed and which exited
    nonzero after their result."""
    assert table.fmt_reps(dict(reps=3, reps_failed=0, reps_exit_nonzero=0)) == '3'
    assert table.fmt_reps(dict(reps=3, reps_failed=0, reps_exit_nonzero=1)) == \
        '3 (1 exit!=0)'
    assert table.fmt_reps(dict(reps=2, reps_failed=1, reps_exit_nonzero=1)) == \
        '2 (1 FAILED, 1 exit!=0)'
    assert table.fmt_reps(dict(reps=2, reps_failed=1)) == '2 (1 FAILED)'


def test_bad_options():
    for args in (['--workloads', 'W7'], ['--strategies', 'nosuch'], ['--reps', '0'],
                 ['--variant', 'cudefer=A=1'], ['--variant', 'a=A=1', '--variant', 'a=B=2']):
        p = subprocess.run([sys.executable, os.path.join(HERE, 'run.py')] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        assert p.returncode == 2 and 'run.py: error:' in p.stderr, (args, p.stderr)


def test_ratios_and_fallback():
    o = run.parse_args(['--reps', '2'])
    wl = next(x for x in run_workloads.WORKLOADS if x.name == 'W1')
    r = run_matrix.Runner(o, [wl], [], '/b', {}, io.StringIO())
    def rec(strategy, rep, done, ok=True):
        x = dict(record='rep', workload='W1', strategy=strategy, rep=rep, ok=ok,
                 done_ms=done, released_ms=done)
        if ok:
            r.add_ratios(wl, x)
        r.results.setdefault(('W1', strategy), []).append(x)
        return x
    assert rec('limit', 0, 100)['ratio_done'] == 1.0
    rec('malloc-never-free', 0, 200)
    assert rec('cudefer', 0, 150)['ratio_done'] == 1.5
    assert rec('cudefer', 0, 150)['ratio_done_floor'] == 0.75
    rec('limit', 1, None, ok=False)            # rep 1's bound failed:
    x = rec('cudefer', 1, 300)                 # the median of its good reps
    assert x['ratio_done'] == 3.0, x
    assert x['ratio_done_floor'] == 1.5, x


def test_run_child_timeout_kills_group():
    t0 = time.monotonic()
    status, out, err, secs = run_process.run_child(
        ['sh', '-c', 'sleep 60 & echo started; wait'], dict(os.environ), 1)
    assert status is None and 'started' in out and time.monotonic() - t0 < 20


def test_parse_cpus():
    assert run_process.parse_cpus('2-5,8') == [2, 3, 4, 5, 8]
    assert run_process.parse_cpus('3, 1') == [1, 3]
    for bad in ('x', '5-2', '', '1-', '-1'):
        try:
            run_process.parse_cpus(bad)
        except ValueError as e:
            assert 'CPU' in str(e), e
        else:
            raise AssertionError('parse_cpus(%r) accepted' % bad)


def test_run_child_pins():
    cpu = min(os.sched_getaffinity(0))
    status, out, err, _ = run_process.run_child(
        [sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],
        dict(os.environ), 30, [cpu])
    assert status == 0 and out.strip() == '[%d]' % cpu, (out, err)


def test_cpus_option():
    """--cpus pins every measured process (shown by --dry-run as taskset
    would) and is recorded in the run's options; CPUs this process may not
    use, or garbage, are refused naming the problem."""
    cpu = min(os.sched_getaffinity(0))
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp)
        rc, so, se = run_py(tmp, ['--dry-run', '--reps', '1', '--workloads', 'W1',
                                  '--cpus', str(cpu)])
        assert rc == 0 and all(l.startswith('taskset -c %d ' % cpu)
                               for l in so.splitlines()), so
        out = os.path.join(tmp, 'r.jsonl')
        rc, so, se = run_py(tmp, ['--reps', '1', '--iters', '7', '--workloads', 'W1',
                                  '--cpus', str(cpu), '--json', out])
        header = json.loads(open(out).readline())
        assert rc == 0 and header['options']['cpus'] == [cpu], (se, header)
        rc, so, se = run_py(tmp, ['--dry-run', '--cpus', '99999'])
        assert rc == 2 and 'CPU 99999 not available' in se, se
        rc, so, se = run_py(tmp, ['--dry-run', '--cpus', 'abc'])
        assert rc == 2 and "--cpus: 'abc' is not a CPU number" in se, se
    finally:
        shutil.rmtree(tmp)


def test_end_to_end():
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp, gpus=2)
        out = os.path.join(tmp, 'r.jsonl')
        rc, so, se = run_py(tmp, ['--reps', '2', '--json', out, '--iters', '7',
                                  '--workloads', 'W1,W5,W5-parts,W6,train-lm,train-cnn-ddp',
                                  '--variant', 'poll=CUDEFER_POLL_US=10',
                                  '--torch-lib', '/x/libcudefer.so'],
                            env={'FAKE_FAIL': 'naive-reclaimer', 'CUDEFER_STRAY': '1'})
        assert rc == 1, (rc, se)               # naive-reclaimer failed
        assert 'CUDEFER_STRAY is ignored' in se and 'note: something to see' in se
        assert 'FAILED: no result (exit status 1)' in se and 'fake failure' in se
        recs = read_jsonl(out)
        head, reps = recs[0], [x for x in recs if x['record'] == 'rep']
        sums = {(x['workload'], x['strategy']): x for x in recs if x['record'] == 'summary'}
        assert head['record'] == 'run' and head['device'] == 'Fake GPU'
        for key in ('commit', 'command', 'driver_version', 'cuda', 'date'):
            assert key in head and all(key in x for x in recs), key
        assert 'train-cnn-ddp' in head['workloads'] and head['torch_version'] == '9.9-fake'
        w1 = [x for x in reps if x['workload'] == 'W1' and x['strategy'] == 'cudefer']
        assert [x['rep'] for x in w1] == [0, 1] and w1[1]['ratio_done'] == 106 / 101.0
        assert w1[0]['ratio_done_floor'] == 105 / 110.0 and w1[0]['iters'] == 7
        assert all(x['stray'] is None for x in reps if 'stray' in x)
        poll = [x for x in reps if x['strategy'] == 'poll' and x['workload'] == 'W1']
        assert poll[0]['env_poll'] == '10' and poll[0]['kind'] == 'cudefer'
        # interleaved: every rep-0 record before any rep-1 record
        order = [x['rep'] for x in reps]
        assert order == sorted(order), order
        s = sums[('W1', 'cudefer')]
        assert s['reps'] == 2 and s['ratio_done_max'] == 105 / 100.0 and \
            s['ratio_done_min'] == 106 / 101.0 and s['done_ms'] == 105.5, s
        assert sums[('W1', 'naive-reclaimer')]['reps_failed'] == 2
        assert close(sums[('W6', 'cudefer')]['ratio_calls_per_s'], 150 / 105.0)
        assert close(sums[('W5-busy', 'cudefer')]['ratio_p50_async'], 105 / 150.0)
        tr = [x for x in reps if x['workload'] == 'train-lm']
        assert len(tr) == 2 * 8 and all(x['model'] == 'lm' for x in tr)
        for x in tr:
            for k in ('model', 'allocator', 'device', 'gpus', 'ms_per_step',
                      'ms_per_step_ratio', 'peak_mib', 'peak_ratio', 'losses_identical'):
                assert k in x, (k, x)
            assert x['lib'] == '/x/libcudefer.so'
            assert x['cuda'] == 'runtime 13.0, driver 13.0' and x['child_cuda'] == '13.0'
        c = next(x for x in tr if x['allocator'] == 'cudefer')
        assert close(c['ms_per_step_ratio'], 41 / 40.0) and close(c['peak_ratio'], 1.1)
        assert c['misses_per_step'] == 27.0 and c['hand_backs_per_step'] == 26.0
        assert sums[('train-lm', 'cudefer')]['misses_per_step'] == 27.0
        assert 'misses_per_step' not in next(x for x in tr if x['allocator'] == 'native')
        assert c['losses_identical'] is True
        mf = next(x for x in tr if x['allocator'] == 'malloc-free')
        assert mf['losses_identical'] is False
        ddp = [x for x in reps if x['workload'] == 'train-cnn-ddp']
        assert ddp and all(x['gpus'] == 2 for x in ddp)
        assert sums[('train-lm', 'malloc-free')]['losses_identical'] is False
        # native's first repetition is the reference, compared with none
        assert sums[('train-lm', 'native')]['losses_identical_reps'] == 1
        assert sums[('train-lm', 'native')]['losses_identical_compared'] == 1
        assert [x['losses_identical'] for x in tr if x['allocator'] == 'native'
                and x['rep'] == 0] == [None]
        for needle in ('== W1 steady', 'done x floor', '1.050 [1.050-1.050]',
                       '0 (2 FAILED)', '== W5 call cost',
                       '== W6 scale', 'x no-library', '== train-lm', 'NO (0/2)',
                       'yes (2/2)', '1.100 [1.100-1.100]', 'run(s) FAILED',
                       'GPU behind', 'hand-backs', '== W5-parts',
                       'host busy/steal%', '2.2/0.5',
                       'defer_free own p50', '1.25/3.00'):
            assert needle in so, (needle, so)
    finally:
        shutil.rmtree(tmp)


def test_skips_and_timeouts():
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp, gpus=1, with_torch=False)
        rc, so, se = run_py(tmp, ['--quick', '--workloads', 'W1,train-cnn',
                                  '--strategies', 'cudefer', '--timeout', '1'],
                            env={'FAKE_HANG': 'cudefer'})
        assert 'skipping train-cnn' in se and 'cannot import torch' in se, se
        assert 'FAILED: timed out after 1 s' in se and rc == 1, se
        lines = [json.loads(l) for l in so.splitlines() if l.startswith('{')]
        assert [x['strategy'] for x in lines if x['record'] == 'rep'] == \
            ['limit', 'malloc-never-free', 'cudefer']
        assert '== W1' in so and '== train' not in so
        make_fakes(tmp, gpus=1)
        rc, so, se = run_py(tmp, ['--quick', '--workloads', 'train-cnn',
                                  '--strategies', 'malloc-free'],
                            env={'FAKE_FAIL': 'malloc-free'})
        assert rc == 1 and 'FAILED: no ms_per_step in the result (exit status 1): ' \
            'CUDA out of memory' in se, se
        rc, so, se = run_py(tmp, ['--quick', '--workloads', 'train-lm-ddp'])
        assert rc == 2 and 'skipping the -ddp workloads' in se, se
        rc, so, se = run_py(tmp, ['--quick', '--workloads', 'W2', '--bindir', '/nonexistent'])
        assert rc == 2 and 'make bench' in se, se
    finally:
        shutil.rmtree(tmp)


# nvidia-smi --query-gpu=name,driver_version --format=csv,noheader, 2 GPUs
FAKE_SMI = r'''#!/bin/sh
echo "Fake GPU, Model 80GB, 580.95.05"
echo "Fake GPU, Model 80GB, 580.95.05"
'''


def test_driver_version():
    open_module = ('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  '
                   'Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:09:33 '
                   'UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0)\n')
    closed = ('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 '
              '01:15:15 UTC 2023\nGCC version:  gcc version 12.3.0\n')
    assert run_facts.parse_driver_version(open_module) == '580.95.05'
    assert run_facts.parse_driver_version(closed) == '535.104.05'
    assert run_facts.parse_driver_version('NVRM version: NVIDIA UNIX Open Kernel Module for '
                                    'aarch64  570.86.10') == '570.86.10'
    assert run_facts.parse_driver_version('no driver here') is None
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        path = os.path.join(tmp, 'version')
        with open(path, 'w') as f:
            f.write(open_module)
        assert run_facts.driver_version(path) == '580.95.05'
    finally:
        shutil.rmtree(tmp)


def test_training_only_facts_and_library():
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp, gpus=1)
        os.makedirs(os.path.join(tmp, 'path'))
        write(os.path.join(tmp, 'path', 'nvidia-smi'), FAKE_SMI)
        os.makedirs(os.path.join(tmp, 'src', '.libs'))
        lib = os.path.join(tmp, 'src', '.libs', 'libcudefer.so')   # BINDIR/../src/.libs
        write(lib, '', 0o644)
        env = {'PATH': os.path.join(tmp, 'path') + os.pathsep + os.environ['PATH']}
        have_proc = os.path.exists('/proc/driver/nvidia/version')
        args = ['--quick', '--workloads', 'train-cnn', '--strategies', 'cudefer']
        # make bench was run: bench-launch-loop --info gives the facts
        rc, so, se = run_py(tmp, args, env=env)
        lines = [json.loads(l) for l in so.splitlines() if l.startswith('{')]
        head, reps = lines[0], [x for x in lines if x['record'] == 'rep']
        assert rc == 0 and head['device'] == 'Fake GPU', (rc, se, head)
        assert head['cuda'] == 'runtime 13.0, driver 13.0', head
        assert have_proc or head['driver_version'] == '580.95.05', head
        assert reps and all(x['lib'] == lib for x in reps), reps
        assert 'cudefer bench: Fake GPU, CUDA runtime 13.0' in so, so
        rc, so, se = run_py(tmp, args + ['--torch-lib', '/y/libcudefer.so'], env=env)
        reps = [json.loads(l) for l in so.splitlines() if '"record": "rep"' in l]
        assert rc == 0 and reps and all(x['lib'] == '/y/libcudefer.so' for x in reps)
        # no programs and no library beside them: nvidia-smi and torch say
        os.makedirs(os.path.join(tmp, 'other', 'bench'))
        rc, so, se = run_py(tmp, args + ['--bindir', os.path.join(tmp, 'other', 'bench')],
                            env=env)
        lines = [json.loads(l) for l in so.splitlines() if l.startswith('{')]
        head, reps = lines[0], [x for x in lines if x['record'] == 'rep']
        assert rc == 0 and head['device'] == 'Fake GPU, Model 80GB', (rc, se, head)
        assert head['gpus'] == 2 and head['cuda'] == 'PyTorch built with CUDA 13.0', head
        assert have_proc or head['driver_version'] == '580.95.05', head
        assert reps and all(x['lib'] is None for x in reps), reps
        assert 'cudefer bench: Fake GPU, Model 80GB, CUDA PyTorch built' in so, so
    finally:
        shutil.rmtree(tmp)


def test_dry_run():
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp, gpus=2)
        rc, so, se = run_py(tmp, ['--dry-run', '--reps', '1', '--workloads', 'W5,train-cnn',
                                  '--variant', 'v=CUDEFER_A=1'])
        lines = so.splitlines()
        assert rc == 0 and len(lines) == 2 * 5 + 8, so
        rc, so, se = run_py(tmp, ['--dry-run', '--quick'])   # 2 GPUs: the -ddp ones too
        assert '--model lm --allocator malloc-free --steps 15 --warmup 5 --ddp' in so, so
        assert '--workload W6 --strategy no-library' in so and '--workload W4' in so
        assert lines[0].endswith('--workload W5-idle --strategy inline-async '
                                 '--label inline-async --rep 0 --calls 20000'), lines[0]
        assert any(l.startswith('CUDEFER_A=1 ') and '--allocator cudefer' in l
                   for l in lines), so
    finally:
        shutil.rmtree(tmp)


def test_time_calls():
    """--time-calls reaches the pluggable allocators' runs only, and the
    training table shows their microseconds a step."""
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp)
        rc, so, se = run_py(tmp, ['--dry-run', '--reps', '1', '--workloads', 'train-lm',
                                  '--strategies', 'native,cudefer', '--time-calls'])
        lines = so.splitlines()
        assert rc == 0, se
        assert any('--allocator cudefer ' in l and l.endswith('--time-calls')
                   for l in lines), so
        assert not any('--allocator native ' in l and '--time-calls' in l
                       for l in lines), so
        out = os.path.join(tmp, 'r.jsonl')
        rc, so, se = run_py(tmp, ['--reps', '1', '--workloads', 'train-lm',
                                  '--strategies', 'native,cudefer', '--time-calls',
                                  '--json', out])
        assert rc == 0, se
        reps = [json.loads(l) for l in open(out) if '"rep"' in l]
        c = next(r for r in reps if r.get('strategy') == 'cudefer' and r['record'] == 'rep')
        assert c['calls_free_us_per_step'] == 1500.0, c
        assert 'alloc/free us' in so and '600/1500' in so, so
    finally:
        shutil.rmtree(tmp)


def test_from_json():
    """--from-json prints the table of a run's JSON lines without running
    anything, also of a run cut short (its last line half written, no
    summaries), and refuses a file with no header."""
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        make_fakes(tmp)
        out = os.path.join(tmp, 'r.jsonl')
        rc, so, se = run_py(tmp, ['--reps', '2', '--workloads', 'train-lm',
                                  '--strategies', 'native,cudefer', '--json', out])
        assert rc == 0, se
        whole = [l for l in open(out).read().splitlines()
                 if '"record": "summary"' not in l]
        cut = os.path.join(tmp, 'cut.jsonl')
        with open(cut, 'w') as f:   # the last repetition record, half written
            f.write('\n'.join(whole[:-1]) + '\n' + whole[-1][:40] + '\n')
        rc, so2, se2 = run_py(tmp, ['--from-json', cut])
        assert rc == 0, se2
        assert 'not a JSON line (cut short?)' in se2, se2
        assert '== train-lm' in so2, so2
        # native: 2 repetitions, the second compared with the first;
        # cudefer: the one left whole
        rows = {l.split()[0]: l.split() for l in so2.splitlines()
                if l.startswith(('native ', 'cudefer '))}
        assert rows['native'][-5:] == ['yes', '(1/1)', 'yes', '(1/1)', '2'], so2
        assert rows['cudefer'][-5:] == ['yes', '(1/1)', 'yes', '(1/1)', '1'], so2
        table = so[so.index('== train-lm'):]
        rc, so3, se3 = run_py(tmp, ['--from-json', out])
        assert rc == 0 and so3[so3.index('== train-lm'):] == table, (so3, table)
        bare = os.path.join(tmp, 'bare.jsonl')
        with open(bare, 'w') as f:
            f.write(whole[1] + '\n')
        rc, so4, se4 = run_py(tmp, ['--from-json', bare])
        assert rc == 2 and 'no header line' in se4, (rc, se4)
    finally:
        shutil.rmtree(tmp)


def make_ab_tree(work, label, commit, cudefer_ms):
    """A build of ab.sh's, as if made: WORK/LABEL/tree/bench with the fake
    programs (cudefer's done time cudefer_ms) and the marker."""
    tree = os.path.join(work, label, 'tree')
    make_fakes(tree)
    os.rename(os.path.join(tree, 'bin'), os.path.join(tree, 'bench'))
    for prog in os.listdir(os.path.join(tree, 'bench')):
        path = os.path.join(tree, 'bench', prog)
        with open(path) as f:
            text = f.read().replace("'cudefer': 105", "'cudefer': %d" % cudefer_ms)
        write(path, text)
    with open(os.path.join(work, label, '.ab-built'), 'w') as f:
        f.write(commit + '\n')


def test_ab():
    """bench/ab.sh: both builds' rows side by side in one file, each its
    own ratios, the order swapped each (repetition, workload), the header
    with the device, the command and both commits; a bad argument said."""
    if not shutil.which('bash') or not shutil.which('tar'):
        return 'skip: no bash or tar'
    import tarfile
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        work = os.path.join(tmp, 'work')
        commits = {'old': 'a' * 40, 'new': 'b' * 40}
        tarballs = {}
        for label, commit in commits.items():
            src = os.path.join(tmp, label + '-src', 'cudefer-0.2.0', 'bench')
            os.makedirs(src)
            with open(os.path.join(src, 'source-commit'), 'w') as f:
                f.write(commit + '\n')
            tarballs[label] = os.path.join(tmp, label + '.tar.gz')
            with tarfile.open(tarballs[label], 'w:gz') as t:
                t.add(os.path.dirname(src), 'cudefer-0.2.0')
        make_ab_tree(work, 'old', commits['old'], 105)
        make_ab_tree(work, 'new', commits['new'], 102)
        out = os.path.join(tmp, 'ab.jsonl')
        env = dict(os.environ, AB_WORK=work, OUT=out, WORKLOADS='W1 W5', REPS='2',
                   PYTHON=sys.executable, RUN_ARGS='--iters 7')
        p = subprocess.run(['bash', os.path.join(HERE, 'ab.sh'), tarballs['old'],
                            tarballs['new']], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
        assert p.returncode == 0, p.stderr
        recs = read_jsonl(out)
        head = recs[0]
        assert head['ab'] == commits and head['device'] == 'Fake GPU', head
        assert 'bench/ab.sh %s %s' % (tarballs['old'], tarballs['new']) in head['command']
        assert "WORKLOADS='W1 W5' REPS=2" in head['command'], head['command']
        assert head['workloads'] == ['W1', 'W5-idle', 'W5-busy'], head['workloads']
        reps = [r for r in recs if r['record'] == 'rep']
        w1 = [(r['rep'], r['build']) for r in reps
              if r['workload'] == 'W1' and r['strategy'].startswith('cudefer@')]
        assert w1 == [(0, 'old'), (0, 'new'), (1, 'new'), (1, 'old')], w1
        w5 = [(r['rep'], r['build']) for r in reps
              if r['workload'] == 'W5-idle' and r['strategy'].startswith('cudefer@')]
        assert w5 == [(0, 'new'), (0, 'old'), (1, 'old'), (1, 'new')], w5
        for r in reps:
            assert r['commit'] == commits[r['build']], r
        sums = {(r['workload'], r['strategy']): r for r in recs if r['record'] == 'summary'}
        assert sums[('W1', 'cudefer@old')]['ratio_done'] == 1.05
        assert sums[('W1', 'cudefer@new')]['ratio_done'] == 1.02
        assert sums[('W1', 'cudefer@new')]['commit'] == commits['new']
        assert sums[('W1', 'limit')]['reps'] == 4   # both builds' bound rows
        assert ('W1', 'cudefer') not in sums
        table = open(os.path.join(tmp, 'ab.txt')).read()
        assert 'cudefer@old' in table and 'cudefer@new' in table, table
        assert 'old %s, new %s' % (commits['old'], commits['new']) in table, table
        p = subprocess.run(['bash', os.path.join(HERE, 'ab.sh'), tarballs['old'],
                            os.path.join(tmp, 'missing.tar.gz')], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
        assert p.returncode == 2 and "missing.tar.gz' is neither a file nor a commit" \
            in p.stderr, p.stderr
    finally:
        shutil.rmtree(tmp)


def test_link_cudefer():
    """The shims link an installed library by its soname (a bare name from
    find_library was made a path in the current directory)."""
    import torch_train
    assert torch_train.link_cudefer('libcudefer.so.0') == ['-lcudefer']
    assert torch_train.link_cudefer('/x/src/.libs/libcudefer.so') == \
        ['/x/src/.libs/libcudefer.so', '-Wl,-rpath,/x/src/.libs']


def test_stats_fields_known():
    """The cudefer package's own list of struct defer_stats' fields (used
    away from the source tree) is the header's (it once lacked five)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))
    try:
        import cudefer
    finally:
        sys.path.pop(0)
    assert cudefer.stats_fields() == \
        list(cudefer.KNOWN_STATS_FIELDS), cudefer.stats_fields()


TESTS = [v for k, v in sorted(globals().items()) if k.startswith('test_')]


def main():
    print('1..%d' % len(TESTS))
    failed = 0
    for i, t in enumerate(TESTS, 1):
        name = t.__name__[5:]
        try:
            with redirect_stdout(io.StringIO()):
                skip = t()
        except Exception:
            failed += 1
            print('not ok %d - %s' % (i, name))
            for line in traceback.format_exc().splitlines():
                print('# ' + line)
            continue
        print('ok %d - %s%s' % (i, name, ' # SKIP ' + skip[6:] if skip else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
