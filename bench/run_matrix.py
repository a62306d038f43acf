# SPDX-License-Identifier: MIT
"""bench/run_matrix.py: bench/run.py's matrix: which runs, in which order
(interleaved repetitions, bound rows first), their commands, and one JSON
record per run with its ratios to the bounds of the same repetition.
Python standard library only."""
import json
import os
import sys

from run_facts import RUN_FACTS
from run_process import child_env, echo_stderr, last_json_object, progress, run_child
from run_summary import median_min_max
from run_workloads import Strategy

def set_identical(rec, natives):
    """rec's losses_identical and weights_identical, from the hashes: to
    native of the same repetition; native itself: to its first earlier
    repetition (so that its row checks that training is deterministic),
    None for its first (compared with itself, it said "identical" having
    checked nothing).  natives: the workload's good native records that ran
    before rec, in run order."""
    if rec['strategy'] != 'native':
        natives = [r for r in natives if r['rep'] == rec['rep']] or natives
    else:
        natives = [r for r in natives if r['rep'] < rec['rep']]
    ref = natives[0] if natives else {}
    # Under DDP every rank's against native's same rank (rank 0's alone hid
    # a difference on another rank).
    for what in ('losses', 'weights'):
        mine, theirs = rec.get(what + '_sha256'), ref.get(what + '_sha256')
        ranks = rec.get(what + '_sha256_ranks'), ref.get(what + '_sha256_ranks')
        if all(ranks):
            mine, theirs = ranks
        rec[what + '_identical'] = mine == theirs if mine and theirs else None


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
            if o.time_calls and st.base not in ('native', 'native-async'):
                cmd.append('--time-calls')
            if o.torch_lib:
                cmd += ['--lib', o.torch_lib]
            return cmd
        cmd = [os.path.join(self.bindir, wl.program), '--workload', wl.name,
               '--strategy', st.base, '--label', st.name, '--rep', str(rep)]
        if wl.program == 'bench-launch-loop':
            cmd += ['--iters', str(o.iters)]
        elif wl.program in ('bench-release-call', 'bench-call-parts'):
            cmd += ['--calls', str(o.w5_calls)]
        else:
            cmd += ['--entries', str(o.w6_entries)]
        return cmd

    def plan(self):
        """[(rep, workload, strategy)] in run order: in each repetition a
        workload's bounds first, then its other rows rotated by one more
        each repetition, so that no row always runs last, furthest from
        the bounds its ratios divide by (a machine whose speed drifts
        would favour or penalize one row always)."""
        order = []
        for rep in range(self.o.reps):
            for wl in self.workloads:
                rows = self.rows(wl)
                nb = sum(1 for st in rows if st.name in wl.bounds)
                rest = rows[nb:]
                k = rep % len(rest) if rest else 0
                order += [(rep, wl, st) for st in rows[:nb] + rest[k:] + rest[:k]]
        return order

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
            set_identical(rec, [r for r in self.results.get((wl.name, 'native'), [])
                                if r['ok']])

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
            # cudefer's misses and hand-backs per timed step, as plain
            # numbers so that the summary takes their medians.
            per_step = rec.get('cudefer_per_step') or {}
            for key, counter in (('misses_per_step', 'cache_mallocs'),
                                 ('hand_backs_per_step', 'cache_releases')):
                if isinstance(per_step.get(counter), (int, float)):
                    rec[key] = per_step[counter]
            # --time-calls: the allocator's own time a step, flat too.
            for key, value in (rec.get('calls') or {}).items():
                if isinstance(value, (int, float)):
                    rec['calls_' + key] = value
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
            status, out, err, secs = run_child(cmd, child_env(st), self.timeout(wl),
                                               self.o.cpus)
            rec = self.make_record(wl, st, rep, status, out, secs)
            self.results.setdefault((wl.name, st.name), []).append(rec)
            self.write(rec)
            if not rec['ok']:
                self.failures += 1
                state = 'FAILED: ' + rec['error']
            elif status != 0:
                self.failures += 1 # its result counts; run.py exits 1
                state = 'ok, but the run then failed: exit status %d' % status
            else:
                state = 'ok'
            progress('[%d/%d rep %d/%d] %-13s %-20s %s (%.1f s)' % (
                i + 1, len(plan), rep + 1, self.o.reps, wl.name, st.name, state, secs))
            echo_stderr(err, failed=not rec['ok'] or status != 0, cmd=cmd, env=st.env)

    def write(self, rec):
        self.out.write(json.dumps(rec, sort_keys=False) + '\n')
        self.out.flush()
