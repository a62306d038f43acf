#!/bin/bash
# W5/W6 A/B in one run: 4b84cdd (the lane queries its newest on every miss) against 190681f (backoff, relaxed capture mode, CAS completed, reserve rule)
OUT=$1; R=$2
cd /tmp/w && rm -rf prev && mkdir prev && cd prev && tar xzf $R/.dist/prev-4b84cdd.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "prev build failed"
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2; do
  for w in W5-idle W5-idle-primed W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"4b84cdd",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"190681f",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
  done
  $PREV/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"4b84cdd",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"190681f",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
done
python3 - $OUT <<'PY' > $OUT/summary.txt
import json,sys
o=sys.argv[1]
for f in ['w5ab.jsonl','w6ab.jsonl']:
    for l in open(o+'/'+f):
        try: d=json.loads(l)
        except Exception: continue
        keys=['build','workload','strategy','rep','enqueue_calls_per_s','call_p50_us','call_p95_us','call_p99_us','call_max_us','calls_over_1ms','events_created','events_created_calls','slow_calls','slow_gap_mode','calls_minor_faults','calls_vol_switches','bytes_per_entry']
        print({k:d.get(k) for k in keys if k in d})
PY
cat $OUT/summary.txt
