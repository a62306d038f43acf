#!/bin/bash
# W6 with the first stock and the reserve; W5's slow calls: gaps between them, faults, switches; EVENT_POOL_BATCH=128 beside
OUT=$1; SRC=$2
cd $SRC/..; mkdir -p b128 && cd b128 && $SRC/configure -q CPPFLAGS=-DEVENT_POOL_BATCH=128 && make -j16 >/dev/null 2>&1 && make -j16 bench >/dev/null 2>&1 || echo "b128 build failed"
B128=$SRC/../b128/bench
cd $SRC
for rep in 0 1 2; do
  for w in W5-idle W5-idle-primed W5-busy; do
    for s in cudefer inline-async; do
      bench/bench-release-call --workload $w --strategy $s --rep $rep | sed 's/^{/{"build":"default",/' >> $OUT/w5.jsonl 2>>$OUT/w5.err
    done
    $B128/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"batch128",/' >> $OUT/w5.jsonl 2>>$OUT/w5.err
  done
  bench/bench-scale --workload W6 --strategy cudefer --rep $rep >> $OUT/w6.jsonl 2>>$OUT/w6.err
  bench/bench-scale --workload W6 --strategy no-library --rep $rep >> $OUT/w6.jsonl 2>>$OUT/w6.err
done
python3 - $OUT <<'PY' > $OUT/summary.txt
import json,sys
o=sys.argv[1]
for f in ['w5.jsonl','w6.jsonl']:
    for l in open(o+'/'+f):
        try: d=json.loads(l)
        except Exception: continue
        keys=['build','workload','strategy','rep','first_call_us','call_p50_us','call_p90_us','call_p95_us','call_p98_us','call_p99_us','call_max_us','events_created_calls','slow_calls','slow_gap_mode','slow_gap_mode_share','calls_minor_faults','calls_vol_switches','calls_invol_switches','events_created','call_max_index','call_max_at_ms','calls_over_1ms','enqueue_calls_per_s']
        print({k:d.get(k) for k in keys if k in d})
PY
cat $OUT/summary.txt
echo exp4 done
