#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/test_results_md.py: tests of the results page, run by
bench/test_run.py: bench/results_md.py (the tables of bench/RESULTS.md
from the JSON lines of bench/results/, and that the committed page is what
it writes) and bench/plot.py's reading of results files.  Standard library
only."""
import io
import json
import os
import shutil
import sys
import tempfile
from contextlib import redirect_stderr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no __pycache__ in the source tree


def test_plot_reads_old_and_new():
    try:
        import plot
    except ImportError as e:
        return 'skip: %s' % e
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        # the older C bench's lines: summaries with no "record" key
        old = os.path.join(tmp, 'old.json')
        with open(old, 'w') as f:
            for wl, st, ratio in (('W1', 'limit', 1.0), ('W1', 'cudefer', 1.01),
                                  ('W4', 'cudefer-alloc', 0.99)):
                f.write(json.dumps(dict(workload=wl, strategy=st, kind=st, env='',
                                        reps=3, reps_failed=0, ratio_done=ratio,
                                        ratio_done_min=ratio, ratio_done_max=ratio,
                                        device='NVIDIA H200')) + '\n')
        rows = plot.load(old)
        assert any(r['workload'] == 'W4' and r['strategy'] == 'cudefer-alloc' for r in rows)
        assert all('ratio_done' in r for r in rows if r['workload'] in ('W1', 'W2'))
        # a run stopped before its summaries: only repetition lines
        path = os.path.join(tmp, 'reps.jsonl')
        with open(path, 'w') as f:
            for rep, done in ((0, 100.0), (1, 110.0)):
                f.write(json.dumps(dict(record='rep', workload='W1', strategy='cudefer',
                                        kind='cudefer', env='', rep=rep, ok=True,
                                        exit_status=0, device='X', ratio_done=done / 100,
                                        done_ms=done)) + '\n')
        rows = plot.load(path)
        assert len(rows) == 1 and rows[0]['device'] == 'X' and rows[0]['reps'] == 2
        assert rows[0]['ratio_done_max'] == 1.1 and rows[0]['done_ms'] == 105.0, rows
    finally:
        shutil.rmtree(tmp)


def results_run(path, date, commit, device, gpus, reps, header_extra=None):
    """A results file as run.py writes it: header and repetition records
    [(workload, strategy, kind, rep, {keys})]."""
    with open(path, 'w') as f:
        f.write(json.dumps(dict(dict(record='run', date=date, commit=commit,
                                     device=device, gpus=gpus, cuda='runtime 13.0',
                                     command='bench/run.py --reps 9 ' + commit,
                                     workloads=sorted({r[0] for r in reps})),
                                **(header_extra or {}))) + '\n')
        for wl, st, kind, rep, keys in reps:
            f.write(json.dumps(dict(dict(record='rep', workload=wl, strategy=st, kind=kind,
                                         env='', rep=rep, ok=True, exit_status=0,
                                         device=device), **keys)) + '\n')


def w1_reps(done):
    """W1 repetitions: limit 100 ms, cudefer done[rep] ms."""
    out = []
    for rep, d in enumerate(done):
        out.append(('W1', 'limit', 'limit', rep, dict(done_ms=100.0, ratio_done=1.0)))
        out.append(('W1', 'cudefer', 'cudefer', rep, dict(done_ms=d, ratio_done=d / 100)))
    return out


def test_results_md():
    """bench/results_md.py: per GPU kind and workload the newest run, pooled
    with the runs of its commit; A/B files, older runs and other files
    listed, not tabled; the same bytes twice; --check says when the page
    is stale."""
    import results_md
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        res = os.path.join(tmp, 'results')
        os.makedirs(res)
        h = 'NVIDIA H100 80GB HBM3'
        results_run(os.path.join(res, 'a-old.jsonl'), '2026-01-01T00:00:00Z', 'c1' * 20,
                    h, 1, w1_reps([150.0]))
        results_run(os.path.join(res, 'b-new.jsonl'), '2026-01-03T00:00:00Z', 'c2' * 20,
                    h, 1, w1_reps([101.0, 103.0]))
        results_run(os.path.join(res, 'c-same.jsonl'), '2026-01-02T00:00:00Z', 'c2' * 20,
                    h, 1, w1_reps([102.0]))
        results_run(os.path.join(res, 'd-ab.jsonl'), '2026-01-09T00:00:00Z', 'x', h, 1,
                    w1_reps([500.0]), dict(ab=dict(old='o', new='n')))
        # W6 on one GPU of a two-GPU host, and DDP training on two
        results_run(os.path.join(res, 'e-w6.jsonl'), '2026-01-04T00:00:00Z', 'c3' * 20,
                    h, 2, [('W6', 'no-library', 'no-library', 0,
                            dict(enqueue_calls_per_s=2e6, ratio_calls_per_s=1.0)),
                           ('W6', 'cudefer', 'cudefer', 0,
                            dict(enqueue_calls_per_s=1e6, ratio_calls_per_s=0.5))])
        results_run(os.path.join(res, 'f-ddp.jsonl'), '2026-01-05T00:00:00Z', 'c4' * 20,
                    'NVIDIA H200', 2,
                    [('train-lm-ddp', st, st, 0, dict(dict(ms_per_step=ms, ms_per_step_ratio=ms / 40,
                                                           peak_mib=1000.0, peak_ratio=1.0,
                                                           losses_sha256='l', weights_sha256='w'),
                                                      **calls))
                     for st, ms, calls in (('native', 40.0, {}),
                                           ('cudefer', 42.0,
                                            dict(calls_alloc_us_per_step=300.0,
                                                 calls_free_us_per_step=400.0)))])
        with open(os.path.join(res, 'b-new.txt'), 'w') as f:
            f.write('the table\n')
        with open(os.path.join(res, 'traces.tar.gz'), 'w') as f:
            f.write('not read\n')
        out = os.path.join(tmp, 'RESULTS.md')
        text, figures = results_md.render(res, out)
        assert text == results_md.render(res, out)[0]
        assert '## One NVIDIA H100 80GB HBM3' in text and '## 2× NVIDIA H200' in text
        assert '## 2× NVIDIA H100' not in text, 'W6 counted as a two-GPU kind'
        one = text[text.index('## One NVIDIA H100'):text.index('## 2× NVIDIA H200')]
        assert '[`b-new.jsonl`](results/b-new.jsonl) (and [`.txt`](results/b-new.txt))' \
            in one and '`c-same.jsonl`' in one, one
        assert 'commit `%s`' % ('c2' * 20) in one and 'command: `bench/run.py --reps 9' in one
        assert '`a-old.jsonl`' not in one and '`d-ab.jsonl`' not in one
        # pooled: 101, 103, 102 ms -> median 1.020 [1.010-1.030]; 3 repetitions
        row = next(l for l in one.splitlines() if l.startswith('| `cudefer`'))
        assert '1.020 [1.010–1.030]' in row and row.endswith('| 3 |'), row
        assert '| `limit` (bound) | 1.000 (100.0 ms) |' in one, one
        w6 = next(l for l in one.splitlines() if l.startswith('| `cudefer`')
                  and '1.000' in l and 'M calls' not in l)
        assert '| 0.500 |' in w6, w6
        ddp = text[text.index('## 2× NVIDIA H200'):]
        row = next(l for l in ddp.splitlines() if l.startswith('| `cudefer`'))
        assert '| 1.050 |' in row and 'yes, 2 of 2' in row, row
        # --time-calls: the allocator's own time a step, a column of its own
        assert '| LM alloc / free µs a step |' in ddp and '| 300 / 400 |' in row, ddp
        native = next(l for l in ddp.splitlines() if l.startswith('| `native`'))
        assert '| 1.000 (1000 MiB) | - |' in native, native
        assert 'alloc / free µs a step' not in one   # no timed run there
        others = text[text.index('## Other files'):]
        for n in ('a-old.jsonl', 'd-ab.jsonl', 'traces.tar.gz'):
            assert '[`%s`](results/%s)' % (n, n) in others, (n, others)
        assert 'b-new' not in others and 'e-w6' not in others
        assert sorted(os.path.basename(f[3]) for f in figures) == ['h100.png', 'h200x2.png']
        assert '.png' not in text   # no figure drawn yet: none linked
        md = lambda *args: results_md.main(['--results', res, '--out', out] + list(args))
        with redirect_stderr(io.StringIO()) as err:
            assert md('--check') == 1 and 'No such file' in err.getvalue()
        assert md() == 0 and md('--check') == 0
        with open(os.path.join(res, 'h100.png'), 'w') as f:
            f.write('a figure\n')
        with redirect_stderr(io.StringIO()) as err:
            assert md('--check') == 1
        assert 'is not what the results files give' in err.getvalue()
        assert '+![One NVIDIA H100' in err.getvalue(), err.getvalue()
        assert '![One NVIDIA H100 80GB HBM3' in results_md.render(res, out)[0]
    finally:
        shutil.rmtree(tmp)


def test_results_md_identity_from_hashes():
    """The identity column is computed again from the repetitions' hashes,
    as run.py compares them now: native's first repetition, which an older
    run.py compared with itself, counts as no comparison, and every rank
    counts."""
    import results_md
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        res = os.path.join(tmp, 'results')
        os.makedirs(res)
        reps = []
        for rep in (0, 1):
            for st in ('native', 'cudefer'):
                # cudefer's rank 1 differs in rep 1; the stored flags say
                # identical everywhere (rank 0 alone, native with itself)
                ranks = ['a', 'X' if st == 'cudefer' and rep == 1 else 'b']
                reps.append(('train-lm-ddp', st, st, rep, dict(
                    ms_per_step=40.0, ms_per_step_ratio=1.0, peak_mib=1000.0,
                    peak_ratio=1.0, losses_sha256='a', losses_sha256_ranks=ranks,
                    weights_sha256='w', weights_sha256_ranks=['w', 'w'],
                    losses_identical=True, weights_identical=True)))
        results_run(os.path.join(res, 'ddp.jsonl'), '2026-01-05T00:00:00Z',
                    'c4' * 20, 'NVIDIA H200', 2, reps)
        text = results_md.render(res, os.path.join(tmp, 'RESULTS.md'))[0]
        row = lambda name: next(l for l in text.splitlines()
                                if l.startswith('| `%s`' % name))
        assert '| yes, 2 of 2 |' in row('native'), row('native')
        assert '| **no**, 3 of 4 |' in row('cudefer'), row('cudefer')
    finally:
        shutil.rmtree(tmp)


def test_results_md_reps_exit_nonzero():
    """The reps cell says which repetitions failed and which gave their
    result but then exited nonzero, as run.py's table does."""
    import results_md
    assert results_md.reps(dict(reps=3, reps_failed=0, reps_exit_nonzero=0)) == '3'
    assert results_md.reps(dict(reps=3, reps_failed=0, reps_exit_nonzero=1)) == \
        '3 (1 exit≠0)'
    assert results_md.reps(dict(reps=2, reps_failed=1, reps_exit_nonzero=1)) == \
        '2 (1 failed, 1 exit≠0)'


def test_results_md_two_runs_in_a_file():
    """A file holding two runs (two outputs put together) is refused, named
    with the lines of its headers, rather than read as one run."""
    import results_md
    tmp = tempfile.mkdtemp(prefix='cudefer-test-run.')
    try:
        res = os.path.join(tmp, 'results')
        os.makedirs(res)
        one, two = os.path.join(tmp, 'one'), os.path.join(tmp, 'two')
        results_run(one, '2026-01-01T00:00:00Z', 'c1' * 20,
                    'NVIDIA H200', 1, w1_reps([101.0]))
        results_run(two, '2026-01-01T00:05:00Z', 'c1' * 20,
                    'NVIDIA H200', 1, w1_reps([102.0, 103.0]))
        both = os.path.join(res, 'both.jsonl')
        with open(both, 'w') as f:
            f.write(open(one).read() + open(two).read())
        with redirect_stderr(io.StringIO()) as err:
            rc = results_md.main(['--results', res,
                                  '--out', os.path.join(tmp, 'RESULTS.md')])
        assert rc == 1, rc
        assert err.getvalue() == ('results_md.py: %s holds 2 runs ("run" '
                                  'headers on lines 1, 4): give each run a '
                                  'file of its own\n' % both), err.getvalue()
        assert not os.path.exists(os.path.join(tmp, 'RESULTS.md'))
    finally:
        shutil.rmtree(tmp)


def test_results_md_committed():
    """bench/RESULTS.md is what bench/results_md.py writes from the
    committed results."""
    import results_md
    if not os.path.exists(os.path.join(HERE, 'RESULTS.md')):
        return 'skip: no bench/RESULTS.md here'
    with redirect_stderr(io.StringIO()) as err:
        rc = results_md.main(['--check'])
    assert rc == 0, err.getvalue()
