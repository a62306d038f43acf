# SPDX-License-Identifier: MIT
"""bench/run_summary.py: the statistics of bench/run.py: medians and
spreads over the repetitions, one summary record per (workload, strategy).
Python standard library only."""
import statistics

def median_min_max(values):
    """(median, min, max) of the numbers among values; Nones when none."""
    nums = [v for v in values if isinstance(v, (int, float))
            and not isinstance(v, bool) and v == v]
    if not nums:
        return None, None, None
    return statistics.median(nums), min(nums), max(nums)


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
                    s[k + '_compared'] = len(vals)
                elif vals:
                    s[k] = vals[0]
            out.append(s)
    return out
