#!/usr/bin/env python3
"""exp30's table: per workload and row (build label and strategy), the
median [min-max] over repetitions of each metric, and the ratio to the
peer of the same repetition (W5: inline-async's call p50/p99; W4:
malloc-never-free's done time; W6: no-library's calls/s)."""
import json
import statistics
import sys

PEER = {'W5-busy': 'inline-async', 'W5-idle': 'inline-async',
        'W4': 'malloc-never-free', 'W6': 'no-library'}
METRICS = {'W5-busy': ['call_p50_us', 'call_p99_us', 'call_max_us', 'slow_calls', 'events_created_calls'],
           'W5-idle': ['call_p50_us', 'call_p99_us', 'call_max_us', 'events_created_calls'],
           'W4': ['done_ms', 'iter_p99_us', 'iter_max_us', 'events_created'],
           'W6': ['enqueue_calls_per_s', 'call_p99_us', 'call_max_us', 'events_created']}
RATIO = {'W5-busy': ['call_p50_us', 'call_p99_us'], 'W5-idle': ['call_p50_us', 'call_p99_us'],
         'W4': ['done_ms'], 'W6': ['enqueue_calls_per_s']}


def mmm(v):
    v = [x for x in v if isinstance(x, (int, float))]
    if not v:
        return '-'
    return '%.4g [%.4g-%.4g]' % (statistics.median(v), min(v), max(v))


recs = []
for line in open(sys.argv[1]):
    try:
        recs.append(json.loads(line))
    except ValueError:
        pass
for w in PEER:
    rows = {}
    for r in recs:
        if r.get('workload') == w:
            rows.setdefault((r['build'], r['strategy']), []).append(r)
    peer = {r['rep']: r for (b, s), rs in rows.items() if s == PEER[w] for r in rs}
    print('== %s (ratios to %s of the same repetition)' % (w, PEER[w]))
    for (b, s), rs in sorted(rows.items()):
        cols = ['%s %s' % (m, mmm([r.get(m) for r in rs])) for m in METRICS[w]]
        for m in RATIO[w]:
            ratios = [r[m] / peer[r['rep']][m] for r in rs
                      if r['rep'] in peer and isinstance(r.get(m), (int, float))
                      and peer[r['rep']].get(m)]
            cols.append('x peer %s %s' % (m, mmm(ratios)))
        print('%-6s %-18s %s' % (b, s, '  '.join(cols)))
