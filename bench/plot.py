#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/plot.py RESULTS.jsonl OUT.png: draw the benchmark's figures.

Reads the JSON lines of bench/run.py (its summary records; from the
per-repetition records when a run stopped before its summaries) and the
files of the older C bench (one summary line per workload and strategy,
no "record" key, the same keys).  bench/results_md.py draws each GPU
kind's figure through draw().  Panels, each drawn only when the rows have
their data:
  1. W1-W4: time until all GPU work is done, ratio to the preallocated limit
     (median; whiskers min..max);
  2. W5: the release call alone, p50 and p99, idle and busy (log scale);
  3. W6: calls per second (with the ratio to the no-library bound and the
     call's p99);
  4. training: ms/step and peak memory as ratios to PyTorch's native
     allocator; a bar whose losses were not identical to native's is hatched.
Needs matplotlib (no GPU, no display).
"""
import json
import os
import sys

LOOPS = ['W1', 'W2', 'W3', 'W4']
CALLS = [('W5-idle', 'call_p50_us', 'idle p50'), ('W5-idle', 'call_p99_us', 'idle p99'),
         ('W5-busy', 'call_p50_us', 'busy p50'), ('W5-busy', 'call_p99_us', 'busy p99')]


def load(path):
    """Summary rows of a results file: run.py's summary records, or the
    C bench's lines (no 'record' key), or summaries computed from run.py's
    repetition records.  A later row for the same workload and strategy
    replaces an earlier one (files of several runs appended)."""
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as e:
                    raise SystemExit('plot.py: %s:%d: not JSON: %s' % (path, n, e))
    rows = [r for r in records if r.get('record', 'summary') == 'summary'
            and 'workload' in r]
    if not rows:
        reps = [r for r in records if r.get('record') == 'rep']
        if reps:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            sys.dont_write_bytecode = True
            import run_facts
            import run_summary
            import run_workloads
            results = {}
            for r in reps:
                results.setdefault((r['workload'], r['strategy']), []).append(r)
            facts = {k: reps[0][k] for k in run_facts.RUN_FACTS + ('device',) if k in reps[0]}
            rows = run_summary.summarize(run_workloads.WORKLOADS, results,
                                         facts)
    latest = {}
    for r in rows:
        latest[(r['workload'], r['strategy'])] = r
    return list(latest.values())


def title_of(path, rows):
    r = rows[0]
    parts = [r.get('device'), r.get('cuda'), r.get('date')]
    if r.get('commit'):
        parts.append('commit ' + r['commit'][:12])
    return '%s: %s' % (os.path.basename(path), ' | '.join(p for p in parts if p))


def strategies_of(rows, workloads):
    """Strategy names in the order they first appear for these workloads."""
    names = []
    for r in rows:
        if r['workload'] in workloads and r['strategy'] not in names:
            names.append(r['strategy'])
    return names


def get(rows, workload, strategy, key):
    for r in rows:
        if r['workload'] == workload and r['strategy'] == strategy:
            v = r.get(key)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def bars(ax, groups, names, value, spread, colors, hatch=None):
    """Grouped bars: one group per label in groups, one bar per name;
    value(g, n) the height (None: no bar), spread(g, n) (lo, hi) or None."""
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs, hs, lo, hi, hatches = [], [], [], [], []
        for j, g in enumerate(groups):
            v = value(g, n)
            if v is None:
                continue
            s = spread(g, n) if spread else None
            xs.append(j - 0.4 + width * (i + 0.5))
            hs.append(v)
            lo.append(v - s[0] if s and s[0] is not None else 0)
            hi.append(s[1] - v if s and s[1] is not None else 0)
            hatches.append(hatch(g, n) if hatch else None)
        if not xs:
            continue
        drawn = ax.bar(xs, hs, width, label=n, color=colors[n], edgecolor='black',
                       linewidth=0.4, yerr=[lo, hi] if spread else None, capsize=2)
        for b, h in zip(drawn, hatches):
            if h:
                b.set_hatch(h)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.grid(axis='y', alpha=0.3)
    ax.legend(loc='upper left', bbox_to_anchor=(1.0, 1.0), fontsize=8)


def ratio_value(rows, key):
    return lambda g, n: get(rows, g, n, key)


def ratio_spread(rows, key):
    return lambda g, n: (get(rows, g, n, key + '_min'), get(rows, g, n, key + '_max'))


def panel_loops(ax, rows, colors):
    groups = [w for w in LOOPS if any(r['workload'] == w for r in rows)]
    bars(ax, groups, strategies_of(rows, groups), ratio_value(rows, 'ratio_done'),
         ratio_spread(rows, 'ratio_done'), colors)
    ax.axhline(1.0, color='black', linestyle='--', linewidth=0.8)
    ax.set_ylabel('done / limit')
    ax.set_title('time until all GPU work is done, ratio to the preallocated limit '
                 '(median; whiskers min..max)')


def panel_calls(ax, rows, colors):
    have = [c for c in CALLS if any(r['workload'] == c[0] for r in rows)]
    names = strategies_of(rows, {'W5-idle', 'W5-busy'})
    by_label = {label: (wl, key) for wl, key, label in have}
    bars(ax, [label for _, _, label in have], names,
         lambda g, n: get(rows, by_label[g][0], n, by_label[g][1]), None, colors)
    ax.set_yscale('log')
    ax.set_ylabel('us per call')
    ax.set_title('W5: cost of the release call alone (log scale)')


def panel_scale(ax, rows, colors):
    names = [n for n in strategies_of(rows, {'W6'})
             if get(rows, 'W6', n, 'enqueue_calls_per_s') is not None]
    values = [get(rows, 'W6', n, 'enqueue_calls_per_s') / 1e6 for n in names]
    ax.barh(range(len(names)), values, color=[colors[n] for n in names],
            edgecolor='black', linewidth=0.4)
    for i, n in enumerate(names):
        r = get(rows, 'W6', n, 'ratio_calls_per_s')
        p99 = get(rows, 'W6', n, 'call_p99_us')
        text = ' %.3f M/s' % values[i]
        if r is not None:
            text += ', %.2fx no-library' % r
        if p99 is not None:
            text += ', call p99 %.1f us' % p99
        ax.annotate(text, (values[i], i), va='center', fontsize=8)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(values or [1]) * 1.6)
    ax.grid(axis='x', alpha=0.3)
    ax.set_xlabel('M calls/s')
    ax.set_title('W6: calls per second from 64 threads over 1024 streams')


def panel_train(ax, rows, colors, key, what):
    groups = [w for w in dict.fromkeys(r['workload'] for r in rows)
              if w.startswith('train-')]
    names = strategies_of(rows, set(groups))
    differs = lambda g, n: '//' if next((r.get('losses_identical') for r in rows
                                         if r['workload'] == g and r['strategy'] == n),
                                        None) is False else None
    bars(ax, groups, names, ratio_value(rows, key), ratio_spread(rows, key), colors,
         hatch=differs)
    ax.axhline(1.0, color='black', linestyle='--', linewidth=0.8)
    ax.set_ylabel('%s / native' % what)
    ax.set_title('training: %s, ratio to PyTorch\'s native allocator (median; whiskers '
                 'min..max; hatched: losses differ from native\'s)' % what)


def draw(rows, title, out):
    """Draws the panels that rows (summary records) have data for into
    out (a PNG).  Returns 0, or 1 with the reason on stderr."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write('plot.py: needs matplotlib (pip install matplotlib)\n')
        return 1
    wls = {r['workload'] for r in rows}
    panels, heights = [], []   # the W6 panel: one thin bar per strategy
    if wls & set(LOOPS):
        panels.append(panel_loops)
    if wls & {'W5-idle', 'W5-busy'}:
        panels.append(panel_calls)
    heights = [1.0] * len(panels)
    if 'W6' in wls:
        panels.append(panel_scale)
        heights.append(0.3 + 0.12 * len(strategies_of(rows, {'W6'})))
    if any(w.startswith('train-') for w in wls):
        panels.append(lambda ax, r, c: panel_train(ax, r, c, 'ms_per_step_ratio', 'ms/step'))
        panels.append(lambda ax, r, c: panel_train(ax, r, c, 'peak_ratio', 'peak memory'))
        heights += [1.0, 1.0]
    if not panels:
        sys.stderr.write('plot.py: no benchmark results for %s\n' % out)
        return 1
    names = list(dict.fromkeys(r['strategy'] for r in rows))
    cmap = plt.get_cmap('tab20')
    colors = {n: cmap(i % 20) for i, n in enumerate(names)}
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 4.2 * sum(heights)),
                             squeeze=False, gridspec_kw={'height_ratios': heights})
    for draw_panel, ax in zip(panels, axes[:, 0]):
        draw_panel(ax, rows, colors)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    sys.stderr.write('plot.py: wrote %s\n' % out)
    return 0


def main(argv):
    if len(argv) != 3:
        sys.stderr.write('usage: plot.py RESULTS.jsonl OUT.png\n')
        return 2
    src, out = argv[1], argv[2]
    try:
        rows = load(src)
    except OSError as e:
        sys.stderr.write('plot.py: %s: %s\n' % (src, e.strerror))
        return 1
    if not rows:
        sys.stderr.write('plot.py: no benchmark results in %s\n' % src)
        return 1
    return draw(rows, title_of(src, rows), out)


if __name__ == '__main__':
    sys.exit(main(sys.argv))
