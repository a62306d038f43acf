#!/bin/bash
# Whether the LM's slow frees are waits for a device's lock: a scratch build
# of 73ffe62's library (.dist/x-spin.tar.gz, exp27-spin.patch applied; its cache_lock counts the waits
# of 4 us or more and, with CUDEFER_X_SPIN_NS, spins that long before it
# sleeps), LM training with --time-calls, native, cudefer and cudefer
# spinning up to 20 us, REPS reps.
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/x-spin.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
python3 bench/run.py --workloads train-lm --strategies native,cudefer --variant cudefer-spin20us=CUDEFER_X_SPIN_NS=20000 --reps ${REPS:-2} --time-calls --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/calls.jsonl > $OUT/calls.txt 2>&1
grep -E "cudefer-x|ok \(" $OUT/calls.txt
python3 - $OUT/calls.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if 'strategy' not in d: continue
    c={k[6:]:v for k,v in d.items() if k.startswith('calls_')}
    print(d['strategy'], 'rep', d.get('rep'), 'ms/step %.2f x %.3f' % (d['ms_per_step'], d.get('ms_per_step_ratio') or 0), 'alloc/free us/step', c.get('alloc_us_per_step'), c.get('free_us_per_step'), 'p50', c.get('alloc_ns_p50'), c.get('free_ns_p50'), 'slow frees/step', c.get('free_tail_calls_per_step'), 'us', c.get('free_tail_us_per_step'), 'slow allocs/step', c.get('alloc_tail_calls_per_step'), c.get('alloc_tail_us_per_step'))
PY
