#!/bin/bash
# W5: idle against idle-primed (an untimed idle phase first): events made during the calls and the call's percentiles
OUT=$1; cd "$2"
for rep in 0 1 2; do
  for w in W5-idle W5-idle-primed; do
    for s in cudefer inline-async; do
      bench/bench-release-call --workload $w --strategy $s --rep $rep >> $OUT/w5primed.jsonl 2>>$OUT/w5primed.err
    done
  done
done
python3 - $OUT <<'PY' > $OUT/w5primed.txt
import json,sys
o=sys.argv[1]
for l in open(o+'/w5primed.jsonl'):
    try: d=json.loads(l)
    except Exception: continue
    keys=['workload','strategy','rep','call_p50_us','call_p99_us','call_max_us','events_created_calls','released_calls','reclaimer_cpu_calls_ms']
    print({k:d.get(k) for k in keys})
PY
