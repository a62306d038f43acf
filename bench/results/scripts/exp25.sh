#!/bin/bash
# A/B in one run on one GPU: 61a4e68 (prev) against 155326d (the reclaimer lets threads waiting for a device lock in before its next hold).
# Part 1: cold-calls on this host's CPU (fake runtime), W5-parts pairs, LM training with --time-calls.
OUT=$1; R=$2; PART=${3:-1}
set -u
if [ "$PART" = 1 ] || [ ! -f /tmp/w/cudefer-0.2.0/src/.libs/libcudefer.so ] || [ ! -f /tmp/w/prev/cudefer-0.2.0/src/.libs/libcudefer.so ]; then
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 traces && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev traces && (cd prev && tar xzf $R/.dist/prev-61a4e68.tar.gz) && (cd traces && tar xzf $R/bench/results/2026-11-23-h100-traces.tar.gz)
(cd /tmp/w/prev/cudefer-0.2.0 && ./configure -q && make -j8 all bench bench/cold-calls >/dev/null 2>&1 || echo "prev build failed") &
cd /tmp/w/cudefer-0.2.0 && ./configure -q && make -j8 all bench bench/cold-calls >/dev/null 2>&1 || echo "new build failed"
wait
fi
P=/tmp/w/prev/cudefer-0.2.0; N=/tmp/w/cudefer-0.2.0
# The new build's make check (fake and GPU suites) first: CHECK=0 skips it.
if [ "${CHECK:-1}" = 1 ]; then
  (cd $N && make -j16 check > /tmp/w/check.log 2>&1; { grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR)' /tmp/w/check.log
   for log in $(grep -lE '^(not ok|FAIL)' t/*.log t/gpu/*.log 2>/dev/null); do echo "== $log"; cat "$log"; done; } > $OUT/check.txt)
fi
lscpu | grep -E "Model name|L2|L3" > $OUT/host.txt
if [ "$PART" = 1 ]; then
for i in 1 2 3 4 5 6; do
  echo "prev $($P/bench/cold-calls --evict 2048 /tmp/w/traces/lm.trace | grep '^{')" >> $OUT/cold.txt
  echo "new $($N/bench/cold-calls --evict 2048 /tmp/w/traces/lm.trace | grep '^{')" >> $OUT/cold.txt
done
for rep in 0 1 2; do
  $P/bench/bench-call-parts --workload W5-parts --strategy idle --rep $rep | sed 's/^{/{"build":"61a4e68",/' >> $OUT/parts.jsonl 2>>$OUT/err.txt
  $N/bench/bench-call-parts --workload W5-parts --strategy idle --rep $rep | sed 's/^{/{"build":"155326d",/' >> $OUT/parts.jsonl 2>>$OUT/err.txt
done
fi
W=${WL:-train-lm}
for rep in ${REPS:-0 1 2}; do
  for b in prev new; do
    D=$P; [ $b = new ] && D=$N
    [ $((rep % 2)) = 1 ] && { D=$N; [ $b = new ] && D=$P; }   # alternate the order
    tag=61a4e68; [ $D = $N ] && tag=155326d
    (rm -f /tmp/w/t.jsonl; cd $D && python3 bench/run.py --workloads $W --strategies native,cudefer --reps 1 --time-calls --torch-lib $D/src/.libs/libcudefer.so --json /tmp/w/t.jsonl > /tmp/w/t.txt 2>&1; sed "s/^{/{\"build\":\"$tag\",\"abrep\":$rep,/" /tmp/w/t.jsonl >> $OUT/train.jsonl; cat /tmp/w/t.txt >> $OUT/train.txt)
  done
done
for f in $OUT/train.jsonl; do python3 - $f <<'PY'
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if d.get('strategy') in ('native','cudefer'):
        c={k[6:]:v for k,v in d.items() if k.startswith('calls_')}
        print(d['build'], d['abrep'], d.get('model', d.get('workload')), d['strategy'], 'ms/step %.2f x %.3f' % (d['ms_per_step'], d.get('ms_per_step_ratio') or 0), 'alloc/free us/step', c.get('alloc_us_per_step'), c.get('free_us_per_step'), 'p50/p99 ns', c.get('alloc_ns_p50'), c.get('alloc_ns_p99'), c.get('free_ns_p50'), c.get('free_ns_p99'), 'slow calls/us a step alloc', c.get('alloc_tail_calls_per_step'), c.get('alloc_tail_us_per_step'), 'free', c.get('free_tail_calls_per_step'), c.get('free_tail_us_per_step'), 'gpu behind', d.get('gpu_steps_behind'), 'identical', d.get('losses_identical'))
PY
done
[ -f $OUT/cold.txt ] && python3 - $OUT/cold.txt <<'PY'
import json,sys,statistics as st
d={}
for l in open(sys.argv[1]):
    b,j=l.split(' ',1); j=json.loads(j)
    d.setdefault(b,[]).append((j['cudefer_alloc_us'],j['cudefer_free_us'],j['floor_alloc_us'],j['floor_free_us']))
for b,v in d.items():
    print('cold-calls', b,'cudefer alloc %.3f free %.3f  floor %.3f %.3f'%tuple(st.median(x[i] for x in v) for i in range(4)), 'n', len(v))
PY
[ -f $OUT/parts.jsonl ] && python3 - $OUT/parts.jsonl <<'PY'
import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    rows.setdefault(d['build'],[]).append(d)
for b,ds in rows.items():
    for k in ['legacy_pair_defer_alloc_p50_us','legacy_pair_defer_free_p50_us','legacy_pair_defer_p50_us','legacy_pair_defer_p99_us','created_pair_defer_p50_us','legacy_get_device_p50_us']:
        print('parts', b, k, [d.get(k) for d in ds])
PY
true
