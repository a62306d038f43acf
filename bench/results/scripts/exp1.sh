#!/bin/bash
# W5 and W6 diagnostics: events made during W5's calls; where W6's slowest call comes; W6 stall stacks
OUT=$1; cd "$2"
B=bench
for rep in 0 1 2; do
  for w in W5-idle W5-busy; do
    for s in cudefer inline-async; do
      $B/bench-release-call --workload $w --strategy $s --rep $rep >> $OUT/w5.jsonl 2>>$OUT/w5.err
    done
  done
  $B/bench-scale --workload W6 --strategy cudefer --rep $rep >> $OUT/w6.jsonl 2>>$OUT/w6.err
  $B/bench-scale --workload W6 --strategy no-library --rep $rep >> $OUT/w6.jsonl 2>>$OUT/w6.err
done
python3 - $OUT <<'PY' > $OUT/summary.txt
import json,sys
o=sys.argv[1]
for f in ['w5.jsonl','w6.jsonl']:
    for l in open(o+'/'+f):
        try: d=json.loads(l)
        except Exception: continue
        keys=['workload','strategy','rep','call_p50_us','call_p99_us','call_max_us','events_created_calls','released_calls','reclaimer_cpu_calls_ms','events_created','call_max_index','call_max_at_ms','calls_over_1ms','enqueue_calls_per_s']
        print({k:d.get(k) for k in keys if k in d})
PY
cd bench && timeout 200 python3 stall_stacks.py ./bench-scale --workload W6 --strategy cudefer --rep 9 > $OUT/w6-stacks.txt 2>&1
echo exp1 done
