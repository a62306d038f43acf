#!/bin/bash
# Per-call distributions in training (--time-calls histograms), one GPU.
OUT=$1; R=$2
mkdir -p /tmp/w3 && cd /tmp/w3 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
python3 bench/run.py --workloads ${WL:-train-lm,train-cnn} --strategies ${STRATS:-native,pluggable-floor,pluggable-async,cudefer} ${VARIANTS:-} --reps ${REPS:-2} --time-calls --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/calls.jsonl > $OUT/calls.txt 2>&1
python3 - $OUT/calls.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if 'strategy' not in d or d['strategy']=='native': continue
    c={k[6:]:v for k,v in d.items() if k.startswith('calls_')}
    if not c: continue
    print('%-9s %-16s rep %s  ms/step %.2f x %.3f  alloc: %.0f us/step, mean %.0f ns, p50/p90/p99 %s/%s/%s ns, slow %.1f calls %.0f us a step | free: %.0f us/step, mean %.0f, p50/p90/p99 %s/%s/%s, slow %.1f calls %.0f us' % (
        d.get('workload'), d['strategy'], d.get('rep'), d['ms_per_step'], d.get('ms_per_step_ratio') or 0,
        c['alloc_us_per_step'], c['alloc_ns_mean'], c.get('alloc_ns_p50'), c.get('alloc_ns_p90'), c.get('alloc_ns_p99'), c.get('alloc_tail_calls_per_step',0), c.get('alloc_tail_us_per_step',0),
        c['free_us_per_step'], c['free_ns_mean'], c.get('free_ns_p50'), c.get('free_ns_p90'), c.get('free_ns_p99'), c.get('free_tail_calls_per_step',0), c.get('free_tail_us_per_step',0)))
PY
