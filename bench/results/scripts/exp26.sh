#!/bin/bash
# The LM's slow frees against the CUDA calls under them: LM training
# (--time-calls) with bench/results/scripts/timecalls.so preloaded (every
# cudaEventRecord, cudaEventQuery, ... timed, launching threads apart from
# the reclaimer), native, cudefer and cudefer with batches of 64, REPS reps.
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
gcc -O2 -Wall -shared -fPIC -I/usr/local/cuda/include $R/bench/results/scripts/timecalls.c -o /tmp/w/timecalls.so -ldl || echo "timecalls build failed"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt; lscpu | grep -E "Model name|^CPU\(s\)" >> $OUT/host.txt
LD_PRELOAD=/tmp/w/timecalls.so TIMECALLS_OUT=$OUT/timecalls.txt python3 bench/run.py --workloads train-lm --strategies native,cudefer --variant cudefer-batch64=CUDEFER_FREE_BATCH=64 --reps ${REPS:-2} --time-calls --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/calls.jsonl > $OUT/calls.txt 2>&1
python3 - $OUT/calls.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l)
    if 'strategy' not in d: continue
    c={k[6:]:v for k,v in d.items() if k.startswith('calls_')}
    print(d['strategy'], 'rep', d.get('rep'), 'ms/step %.2f x %.3f' % (d['ms_per_step'], d.get('ms_per_step_ratio') or 0), 'steps', d.get('steps'), 'free calls/step', c.get('free_calls_per_step'), 'slow frees/step', c.get('free_tail_calls_per_step'), 'us', c.get('free_tail_us_per_step'), 'slow allocs/step', c.get('alloc_tail_calls_per_step'))
PY
