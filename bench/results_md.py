#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/results_md.py: bench/RESULTS.md, written from the JSON lines of
bench/results/.

    python3 bench/results_md.py           write bench/RESULTS.md
    python3 bench/results_md.py --check   exit 1 when bench/RESULTS.md is
                                          not what it would write
    python3 bench/results_md.py --plots   draw each GPU kind's figure
                                          (bench/results/KIND.png, needs
                                          matplotlib), then write

Which runs make the tables: every bench/run.py results file in
bench/results/ (a *.jsonl whose first record is its "run" header; the A/B
files of bench/ab.sh and the runs of experiment builds, whose header says
"experiment", are left out).  A GPU kind is the device, and for the
DDP workloads the number of GPUs too.  For each kind and workload the run
with the newest date gives the table, pooled with the other runs of the
same commit, kind and workload (each ratio was taken inside its own run,
so repetitions of several runs can share a median).  The numbers are
computed again from the repetition records with bench/run_summary.py, as
`run.py --from-json` does; nothing is typed by hand.  The output depends
on the files only, so a second run writes the same bytes.

Python standard library only (--plots: matplotlib, through bench/plot.py).
"""
import argparse
import difflib
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
from run_matrix import set_identical  # noqa: E402
from run_summary import summarize  # noqa: E402
from run_workloads import WORKLOADS  # noqa: E402
from table import PARTS  # noqa: E402

BY_NAME = {w.name: w for w in WORKLOADS}

# The families of workloads, one table each, in this order.
FAMILIES = [('train', 'Training'),
            ('loops', 'W1-W4: the launch loop'),
            ('W5', 'W5: the release call alone'),
            ('W5-parts', 'W5-parts: the call\'s parts'),
            ('W6', 'W6: many threads and streams')]

HEAD = '''\
# Benchmark results

<!-- Written by bench/results_md.py from the JSON lines in bench/results/:
     edit that script (or add a run), not this file. -->

What cudefer costs on real GPUs, beside the ways a program can release
memory without it. bench/README.md describes the workloads, the rows and
every column; this page gives the current run of each GPU kind.

## Method

- **A timing is a ratio measured side by side in one run.** `bench/run.py`
  runs every (workload, row, repetition) in a fresh process, on one
  machine, and divides each result by a **bound row** of the same
  workload and the same repetition: `limit` (W1-W4: buffers allocated
  before timing, nothing allocated or released in the loop),
  `malloc-never-free` (the floor of a program that allocates with
  `cudaMalloc`: nothing released), `inline-async` for W5, `no-library`
  for W6 (the same threads recording events with no library), `native`
  for training (PyTorch's caching allocator). No number is compared with
  one from another run or another machine.
- **Repetitions are interleaved.** Repetition 0 of every row, then
  repetition 1, and so on; in each, a workload's bound rows run first and
  its other rows follow in an order rotated by one each repetition, so
  that no row always runs last, furthest from the bounds (on a machine
  whose speed drifts, its ratios would always lean one way; with fewer
  repetitions than rows, some rows still run closer to the bounds than
  others on average).
- **Peers run beside cudefer:** inline `cudaFree`, inline
  `cudaFreeAsync`, a naive reclaimer thread with no library, and in
  training PyTorch's own allocators, pluggable `cudaMallocAsync` and the
  `pluggable-floor` bound (exact-size free lists, nothing released: the
  least any pluggable allocator can cost).
- **A cell** is the median over the repetitions of the per-repetition
  ratios, with [min–max] where they differ; a bound row shows its own
  median in parentheses. Training also checks that losses and final
  weights are bitwise equal to native's of the same repetition (under DDP
  on every rank).
- **Which run.** For each GPU kind and workload the newest run in
  `bench/results/` gives the table, pooled with the other runs of the same
  commit (each ratio was taken inside its own run). Each table names its results file, the device, the commit measured and
  the command; the `.txt` beside a results file is the table `run.py`
  printed, with the notes of whoever ran it.

To add a run: copy its `--json` file into `bench/results/`, run
`python3 bench/results_md.py --plots`, delete the run it replaces (git
history keeps it) and commit. `make check` fails while this page is not
what the script writes from the files (`--check`). To compare two commits
on one GPU, side by side: `bench/ab.sh OLD NEW` (bench/README.md); its
files are A/B experiments, not tables here.
'''


# ---- reading -----------------------------------------------------------------

class Run:
    """One results file of bench/run.py: its header and its repetition
    records."""

    def __init__(self, name, header, reps):
        self.name, self.header, self.reps = name, header, reps
        self.date = header.get('date') or ''
        self.commit = header.get('commit') or 'unknown'


class BadFile(Exception):
    """A results file this script cannot read as one run; its text says
    which file and why."""


def read_run(path):
    """A Run, or None when the file is not a bench/run.py results file (no
    "run" header first), is an A/B file of bench/ab.sh, or is a run of an
    experiment build (its header's "experiment" says which: rows named as
    main's that are not main's library).  Lines that are not JSON (a run
    killed while writing) are skipped."""
    records, headers = [], []
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
                if isinstance(records[-1], dict) and \
                        records[-1].get('record') == 'run':
                    headers.append(number)
    if len(headers) > 1:
        raise BadFile('%s holds %d runs ("run" headers on lines %s): give '
                      'each run a file of its own' % (
                          path, len(headers),
                          ', '.join(str(n) for n in headers)))
    if not records or not isinstance(records[0], dict) or \
            records[0].get('record') != 'run' or 'ab' in records[0] or \
            'experiment' in records[0]:
        return None
    reps = [r for r in records[1:] if isinstance(r, dict) and r.get('record') == 'rep'
            and r.get('workload') in BY_NAME]
    return Run(os.path.basename(path), records[0], reps)


def kind_of(run, workload):
    """(device, GPUs): a DDP workload's kind counts its GPUs, any other
    runs on one GPU whatever the host has."""
    device = run.header.get('device') or 'unknown device'
    gpus = run.header.get('gpus') if BY_NAME[workload].ddp else 1
    return device, gpus if isinstance(gpus, int) and gpus > 0 else 1


def kind_title(kind):
    device, gpus = kind
    return ('One %s' % device) if gpus == 1 else ('%d× %s' % (gpus, device))


def kind_slug(kind):
    """The figure's file name: h100, h200x2, ..."""
    device, gpus = kind
    m = re.search(r'\b([A-Z]\d{2,4}[A-Za-z]?)\b', device)
    slug = m.group(1).lower() if m else \
        re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-') or 'gpu'
    return slug + ('x%d' % gpus if gpus > 1 else '')


def family_of(workload):
    w = BY_NAME[workload]
    if w.is_train:
        return 'train'
    if w.program == 'bench-launch-loop':
        return 'loops'
    return w.group


def choose(runs):
    """{kind: {family: [(workloads, [runs])]}}: for each kind and workload
    the newest run and the other runs of its commit; workloads of one
    family that come from the same runs share a table."""
    candidates = {}
    for run in runs:
        for wname in dict.fromkeys(r['workload'] for r in run.reps):
            candidates.setdefault((kind_of(run, wname), wname), []).append(run)
    chosen = {}
    for (kind, wname), cands in candidates.items():
        newest = max(cands, key=lambda r: (r.date, r.name))
        pool = sorted((r for r in cands if r.commit == newest.commit),
                      key=lambda r: (r.date, r.name))
        chosen.setdefault(kind, {}).setdefault(family_of(wname), {}) \
            .setdefault(tuple(r.name for r in pool), (pool, []))[1].append(wname)
    out = {}
    order = [w.name for w in WORKLOADS]
    for kind, families in chosen.items():
        for family, tables in families.items():
            out.setdefault(kind, {})[family] = sorted(
                [(sorted(wls, key=order.index), pool) for pool, wls in tables.values()],
                key=lambda t: order.index(t[0][0]))
    return out


def summaries(workloads, pool):
    """run_summary's records of these workloads over the pooled runs'
    repetitions, in the first run's row order.  Training's identity to
    native is compared again from the hashes, inside each run, as
    bench/run.py compares it (a record's own flags say what the run.py
    that wrote it compared)."""
    results = {}
    for run in pool:
        natives = {}
        for r in run.reps:
            if r['workload'] not in workloads:
                continue
            if BY_NAME[r['workload']].is_train and r['ok']:
                r = dict(r)
                set_identical(r, natives.get(r['workload'], []))
                if r['strategy'] == 'native':
                    natives.setdefault(r['workload'], []).append(r)
            results.setdefault((r['workload'], r['strategy']), []).append(r)
    info = {k: v for k, v in pool[0].header.items()
            if k not in ('record', 'options', 'workloads')}
    return summarize([BY_NAME[w] for w in workloads], results, info)


# ---- cells -------------------------------------------------------------------

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def ratio(s, key, absolute=None, unit='', prec=1):
    """'median [min-max]' of a ratio; a bound row (its own ratio exactly 1)
    shows its absolute median instead of a spread."""
    if not s or not num(s.get(key)):
        return '-'
    med, lo, hi = s[key], s.get(key + '_min'), s.get(key + '_max')
    text = '%.3f' % med
    if num(lo) and num(hi) and '%.3f' % lo != '%.3f' % hi:
        text += ' [%.3f–%.3f]' % (lo, hi)
    if absolute and med == 1.0 and lo == hi and num(s.get(absolute)):
        text += ' (%.*f%s)' % (prec, s[absolute], unit)
    return text


def value(s, key, prec, scale=1.0):
    return '%.*f' % (prec, s[key] * scale) if s and num(s.get(key)) else '-'


def pair(s, keys, prec):
    vals = [value(s, k, prec) for k in keys]
    return '-' if all(v == '-' for v in vals) else ' / '.join(vals)


def reps(s):
    """Repetitions with a result; those that failed, and those whose
    result counts but whose program then exited nonzero, said."""
    if not s:
        return '-'
    notes = (['%d failed' % s['reps_failed']] if s.get('reps_failed') else []) + \
        (['%d exit≠0' % s['reps_exit_nonzero']] if s.get('reps_exit_nonzero') else [])
    return '%d (%s)' % (s['reps'], ', '.join(notes)) if notes else '%d' % s['reps']


def row_name(s, bounds):
    name = '`%s`' % s['strategy']
    if s['strategy'] in bounds:
        name += ' (bound)'
    if s.get('env'):
        name += ' (%s, `%s`)' % (s['kind'], s['env'])
    return name


def grid(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
    return '\n'.join(lines) + '\n'


def by_row(sums, workloads):
    """[(row name, {workload: summary})] in the order rows first appear."""
    rows = {}
    for s in sums:
        if s['workload'] in workloads:
            rows.setdefault(s['strategy'], {})[s['workload']] = s
    return list(rows.items())


# ---- the tables --------------------------------------------------------------

MODEL = {'cnn': 'CNN', 'lm': 'LM'}


def table_train(workloads, sums):
    bounds = set(BY_NAME[workloads[0]].bounds)
    # A run with --time-calls: the allocator's own µs a step, per model.
    timed = any(s.get('calls_alloc_us_per_step') is not None for s in sums
                if s['workload'] in workloads)
    header = ['row']
    for w in workloads:
        m = MODEL.get(BY_NAME[w].model, BY_NAME[w].model)
        header += ['%s ms/step × native' % m, '%s peak × native' % m]
        if timed:
            header.append('%s alloc / free µs a step' % m)
    header += ['losses, weights identical to native', 'reps']
    rows = []
    for name, per in by_row(sums, workloads):
        any_s = next(iter(per.values()))
        cells = [row_name(any_s, bounds)]
        same = compared = 0
        for w in workloads:
            s = per.get(w)
            cells += [ratio(s, 'ms_per_step_ratio', 'ms_per_step', ' ms'),
                      ratio(s, 'peak_ratio', 'peak_mib', ' MiB', 0)]
            if timed:
                cells.append(pair(s, ('calls_alloc_us_per_step',
                                      'calls_free_us_per_step'), 0))
            for k in ('losses_identical', 'weights_identical'):
                if s:
                    same += s.get(k + '_reps') or 0
                    compared += s.get(k + '_compared') or 0
        cells.append('-' if not compared else '%s, %d of %d' % (
            'yes' if same == compared else '**no**', same, compared))
        cells.append(' / '.join(reps(per.get(w)) for w in workloads))
        rows.append(cells)
    return grid(header, rows) + (
        '\nms/step and peak: median [min–max] of the repetitions\' ratios '
        'to native of the same repetition (peak: NVML, the larger rank\'s '
        'under DDP)%s; reps: %s.\n' % (
            '; alloc / free µs a step: the pluggable allocator\'s own time '
            'in its calls, medians (`--time-calls`; the timing itself takes '
            'about 40 ns a call)' if timed else '', ', '.join(workloads)))


def table_loops(workloads, sums):
    bounds = set()
    for w in workloads:
        bounds |= set(BY_NAME[w].bounds)
    header = ['row'] + ['%s done × limit (× floor)' % w for w in workloads] + \
        ['peak MiB (%s)' % ', '.join(workloads), 'reps']
    rows = []
    for name, per in by_row(sums, workloads):
        any_s = next(iter(per.values()))
        cells = [row_name(any_s, bounds)]
        for w in workloads:
            s = per.get(w)
            cell = ratio(s, 'ratio_done', 'done_ms', ' ms')
            if s and num(s.get('ratio_done_floor')):
                cell += ' (%.3f)' % s['ratio_done_floor']
            cells.append(cell)
        cells.append(' / '.join(value(per.get(w), 'peak_bytes', 0, 1 / 1048576.0)
                                for w in workloads))
        cells.append(' / '.join(reps(per.get(w)) for w in workloads))
        rows.append(cells)
    return grid(header, rows) + (
        '\nDone: from the start of the timed loop until all GPU work is done; '
        '× limit: median [min–max] of the repetitions\' ratios; (× floor, '
        '`malloc-never-free`): the median of the ratios to it; peak: device '
        'memory in use at its highest.\n')


def table_call(workloads, sums):
    bounds = set(BY_NAME[workloads[0]].bounds)
    header = ['row']
    for w in workloads:
        phase = w.split('-', 1)[1]
        header += ['%s p50 / p99 µs' % phase, '%s p50 / p99 × async' % phase]
    header.append('reps')
    rows = []
    for name, per in by_row(sums, workloads):
        any_s = next(iter(per.values()))
        cells = [row_name(any_s, bounds)]
        for w in workloads:
            s = per.get(w)
            cells += [pair(s, ['call_p50_us', 'call_p99_us'], 2),
                      pair(s, ['ratio_p50_async', 'ratio_p99_async'], 3)]
        cells.append(' / '.join(reps(per.get(w)) for w in workloads))
        rows.append(cells)
    return grid(header, rows) + (
        '\nEach call timed alone; × async: to `inline-async` (`cudaFreeAsync`) '
        'of the same repetition, medians; busy: a 200 ms kernel queued '
        'first.\n')


def table_parts(workloads, sums):
    get = lambda n: next((s for s in sums if s['strategy'] == n), None)
    idle, busy = get('idle'), get('busy')
    rows = []
    for part in PARTS:
        cells = [value(s, '%s_%s_p50_us' % (stream, part), 2)
                 for stream in ('created', 'legacy') for s in (idle, busy)]
        if any(c != '-' for c in cells):
            rows.append(['`%s`' % part] + cells)
    return grid(['part', 'created stream, idle: p50 µs', 'created, busy',
                 'stream 0, idle', 'stream 0, busy'], rows) + (
        '\nEach part timed alone, medians over the repetitions; busy: a 2 s '
        'kernel queued first.\n')


def table_scale(workloads, sums):
    bounds = set(BY_NAME[workloads[0]].bounds)
    rows = []
    for name, per in by_row(sums, workloads):
        s = per[workloads[0]]
        rows.append([row_name(s, bounds), value(s, 'enqueue_calls_per_s', 3, 1e-6),
                     ratio(s, 'ratio_calls_per_s'),
                     pair(s, ['call_p50_us', 'call_p99_us'], 2),
                     value(s, 'queries_per_release', 3),
                     value(s, 'bytes_per_entry', 0), reps(s)])
    return grid(['row', 'M calls/s', '× no-library', 'call p50 / p99 µs',
                 'queries an entry', 'bytes an entry', 'reps'], rows) + (
        '\n× no-library: median [min–max] of the repetitions\' ratios of calls '
        'a second; the other columns: medians.\n')


TABLES = {'train': table_train, 'loops': table_loops, 'W5': table_call,
          'W5-parts': table_parts, 'W6': table_scale}


def provenance(pool, workloads, rel):
    """The lines that say where a table comes from: per results file its
    device, commit, date, repetitions and command."""
    lines = []
    for run in pool:
        h = run.header
        n = {r['rep'] for r in run.reps if r['workload'] in workloads}
        txt = os.path.splitext(run.name)[0] + '.txt'
        facts = [h.get('device') or 'unknown device']
        if BY_NAME[workloads[0]].ddp and h.get('gpus'):
            facts[0] = '%d× %s' % (h['gpus'], facts[0])
        if h.get('cuda'):
            facts.append('CUDA %s' % h['cuda'])
        if h.get('driver_version'):
            facts.append('NVIDIA driver %s' % h['driver_version'])
        if h.get('torch_version') and BY_NAME[workloads[0]].is_train:
            facts.append('PyTorch %s' % h['torch_version'])
        lines.append('- [`%s`](%s)%s: %s; commit `%s`; %s, %d repetition%s' % (
            run.name, rel(run.name),
            ' (and [`.txt`](%s))' % rel(txt) if run.has_txt else '',
            ', '.join(facts), run.commit, run.date, len(n), '' if len(n) == 1 else 's'))
        lines.append('  - command: `%s`' % (h.get('command') or '?'))
    return '\n'.join(lines) + '\n'


def render(results_dir, out_path):
    """The text of RESULTS.md for the files in results_dir, with links
    relative to out_path's folder; and the figures to draw, [(kind,
    rows, title, png path)]."""
    names = sorted(os.listdir(results_dir))
    runs = []
    for n in names:
        path = os.path.join(results_dir, n)
        if n.endswith('.jsonl') and os.path.isfile(path):
            run = read_run(path)
            if run:
                run.has_txt = os.path.splitext(n)[0] + '.txt' in names
                runs.append(run)
    base = os.path.relpath(results_dir, os.path.dirname(os.path.abspath(out_path)))
    rel = lambda name: (base + '/' + name) if base != '.' else name
    chosen = choose(runs)
    used, figures = set(), []
    text = [HEAD]
    for kind in sorted(chosen, key=lambda k: (k[1], k[0])):
        text.append('\n## %s\n' % kind_title(kind))
        png = kind_slug(kind) + '.png'
        used.add(png)
        plot_rows = []
        body = []
        for family, title in FAMILIES:
            for workloads, pool in chosen[kind].get(family, []):
                sums = summaries(workloads, pool)
                plot_rows += sums
                for run in pool:
                    used.add(run.name)
                    used.add(os.path.splitext(run.name)[0] + '.txt')
                heading = title if family != 'train' else '%s: %s' % (
                    title, ', '.join(workloads))
                body.append('\n### %s\n\n%s\n%s' % (
                    heading, provenance(pool, workloads, rel),
                    TABLES[family](workloads, sums)))
        if png in names:
            text.append('\n![%s: the tables below drawn by bench/plot.py](%s)\n' % (
                kind_title(kind), rel(png)))
        text += body
        figures.append((kind, plot_rows, '%s: %s' % (kind_title(kind), ', '.join(
            sorted({r.name for fam in chosen[kind].values() for _, p in fam
                    for r in p}))), os.path.join(results_dir, png)))
    others = [n for n in names if n not in used and not n.startswith('.')]
    if others:
        text.append('\n## Other files in bench/results\n\n'
                    'Inputs of the tools in bench/README.md (the allocation '
                    'traces that `bench/replay-trace` and `bench/cold-calls` '
                    'replay), and any run that no table above shows (an older '
                    'run of a kind and workload, or an A/B file):\n\n')
        text += ['- [`%s`](%s)\n' % (n, rel(n)) for n in others]
    return ''.join(text), figures


def main(argv=None):
    p = argparse.ArgumentParser(
        prog='results_md.py', description='Write bench/RESULTS.md from the JSON '
        'lines in bench/results/ (its header says how the runs are chosen).')
    p.add_argument('--check', action='store_true',
                   help='write nothing; exit 1 when the file differs from what '
                   'would be written')
    p.add_argument('--plots', action='store_true',
                   help='first draw each GPU kind\'s figure into the results '
                   'folder (needs matplotlib)')
    p.add_argument('--results', default=os.path.join(HERE, 'results'),
                   help=argparse.SUPPRESS)
    p.add_argument('--out', default=os.path.join(HERE, 'RESULTS.md'),
                   help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.check and o.plots:
        p.error('--check and --plots do not go together: --check writes nothing')
    if not os.path.isdir(o.results):
        sys.stderr.write('results_md.py: %s: no such folder\n' % o.results)
        return 2
    try:
        text, figures = render(o.results, o.out)
    except BadFile as e:
        sys.stderr.write('results_md.py: %s\n' % e)
        return 1
    if o.plots:
        import plot
        for kind, rows, title, png in figures:
            if plot.draw(rows, title, png) != 0:
                return 1
        text, _ = render(o.results, o.out)
    if o.check:
        try:
            with open(o.out, encoding='utf-8') as f:
                current = f.read()
        except OSError as e:
            sys.stderr.write('results_md.py: %s: %s\n' % (o.out, e.strerror))
            return 1
        if current != text:
            sys.stderr.write('results_md.py: %s is not what the results files '
                             'give: run python3 bench/results_md.py\n' % o.out)
            sys.stderr.writelines(list(difflib.unified_diff(
                current.splitlines(True), text.splitlines(True), o.out,
                'written now', n=1))[:40])
            return 1
        return 0
    with open(o.out, 'w', encoding='utf-8') as f:
        f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
