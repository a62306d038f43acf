#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/ab_merge.py: the results file of bench/ab.sh, from the JSON lines
of its bench/run.py runs (one per repetition, workload and build).

    ab_merge.py --old SHA --new SHA --command TEXT --out FILE \\
        BUILD:REP:PART.jsonl ...

BUILD is old or new, REP the A/B repetition; PARTs in the order they ran.
FILE gets one header line (record "run", with "ab": {"old", "new"}, the
device facts of the first part, the command of ab.sh), every repetition
record, and summaries as bench/run.py writes them, so that
`run.py --from-json FILE` prints the table.  In each record:

- a row that runs the library (cudefer, cudefer-alloc, malloc-defer, a
  variant, W5-parts' rows: anything not in NO_LIBRARY) is renamed ROW@old or
  ROW@new; the rows that do not call the library (the bounds and the peers)
  keep their names, the repetitions of both builds pooled;
- "commit" is the commit of the build measured (run.py wrote its own
  checkout's, the harness), "build" is old or new, "rep" the A/B
  repetition.

Every ratio was taken by run.py inside its own run, against the bounds of
the same build and repetition.  Python standard library only.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
from run_summary import summarize  # noqa: E402
from run_workloads import WORKLOADS  # noqa: E402

# Rows that make no cudefer call: the same program whichever build it
# came from.
NO_LIBRARY = {'limit', 'malloc-never-free', 'malloc-record', 'malloc-record-query',
              'inline-cudaFree', 'inline-async', 'naive-reclaimer', 'no-library',
              'native', 'native-async', 'pluggable-floor', 'pluggable-async',
              'malloc-free'}


def read_part(path):
    """(header, repetition records) of one run.py JSON-lines file; lines
    that are not JSON (a run killed while writing) are skipped."""
    header, reps = None, []
    with open(path, encoding='utf-8') as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get('record') == 'run' and header is None:
                header = rec
            elif rec.get('record') == 'rep':
                reps.append(rec)
    return header, reps


def tag(rec, build, commit, rep):
    """The record as the A/B file has it (see the module's comment)."""
    rec = dict(rec, build=build, rep=rep, commit=commit)
    if rec.get('kind') not in NO_LIBRARY:
        rec['strategy'] = '%s@%s' % (rec['strategy'], build)
        if 'allocator' in rec:
            rec['allocator'] = rec['strategy']
    return rec


def merge(old, new, command, parts):
    """The records of the A/B file: [header] + repetitions + summaries.
    parts: [(build, rep, path)] in run order."""
    commits = {'old': old, 'new': new}
    header, reps, seen = None, [], []
    for build, rep, path in parts:
        h, rs = read_part(path)
        if h is None:
            continue
        if header is None:
            header = h
        for w in h.get('workloads') or []:
            if w not in seen:
                seen.append(w)
        reps += [tag(r, build, commits[build], rep) for r in rs]
    if header is None:
        raise ValueError('no part has a run.py header line: nothing ran')
    names = [w.name for w in WORKLOADS]
    workloads = [w for w in WORKLOADS if w.name in seen]
    info = {k: v for k, v in header.items()
            if k not in ('record', 'options', 'workloads', 'commit', 'command')}
    info.update(command=command, commit='old %s, new %s' % (old, new),
                bench_commit=header.get('commit'))
    head = dict(info, record='run', ab=commits,
                options=dict(header.get('options') or {},
                             reps=len({rep for _, rep, _ in parts})),
                workloads=sorted(seen, key=lambda w: names.index(w)
                                 if w in names else len(names)))
    results = {}
    for r in reps:
        results.setdefault((r['workload'], r['strategy']), []).append(r)
    sums = summarize(workloads, results, info)
    for s in sums:
        build = s['strategy'].rpartition('@')[2]
        if s['kind'] not in NO_LIBRARY and build in commits:
            s.update(build=build, commit=commits[build])
    return [head] + reps + sums


def parse_part(text):
    build, _, rest = text.partition(':')
    rep, _, path = rest.partition(':')
    if build not in ('old', 'new') or not rep.isdigit() or not path:
        raise argparse.ArgumentTypeError("'%s' is not old|new:REP:PATH" % text)
    return build, int(rep), path


def main(argv=None):
    p = argparse.ArgumentParser(prog='ab_merge.py', description='bench/ab.sh\'s '
                                'results file from its run.py parts')
    p.add_argument('--old', required=True, help='the commit of the old build')
    p.add_argument('--new', required=True, help='the commit of the new build')
    p.add_argument('--command', required=True, help='the command that ran them')
    p.add_argument('--out', required=True, help='the A/B results file to write')
    p.add_argument('parts', nargs='+', type=parse_part, metavar='BUILD:REP:PATH')
    o = p.parse_args(argv)
    try:
        records = merge(o.old, o.new, o.command, o.parts)
    except (OSError, ValueError) as e:
        sys.stderr.write('ab_merge.py: %s\n' % e)
        return 1
    with open(o.out, 'w', encoding='utf-8') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
