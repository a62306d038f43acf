#!/bin/bash
# W6 A/B (d703d07 against the stock of 4096 + reserve); W5: contended locks (LD_PRELOAD lockprof), malloc trimming off
OUT=$1; R=$2
which strace perf gdb > $OUT/tools.txt 2>&1
gcc -shared -fPIC -O2 -o /tmp/lockprof.so $R/.dist/lockprof.c -ldl || echo "lockprof build failed"
if [ ! -x /tmp/w/old/cudefer-0.2.0/bench/bench-scale ]; then
  cd /tmp/w && rm -rf old && mkdir old && cd old && tar xzf $R/.dist/old-d703d07.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "old build failed"
fi
OLD=/tmp/w/old/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3; do
  $OLD/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"d703d07",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"new",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
done
for rep in 0 1; do
  for w in W5-idle W5-idle-primed W5-busy; do
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"new",/' >> $OUT/w5.jsonl 2>>$OUT/w5.err
    MALLOC_TOP_PAD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"new-notrim",/' >> $OUT/w5.jsonl 2>>$OUT/w5.err
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"new",/' >> $OUT/w5.jsonl 2>>$OUT/w5.err
  done
done
for w in W5-idle W5-idle-primed W5-busy; do
  echo "== $w" >> $OUT/lockprof.txt
  LD_PRELOAD=/tmp/lockprof.so $NEW/.libs/bench-release-call --workload $w --strategy cudefer --rep 9 >> $OUT/lockprof.txt 2>&1 || LD_PRELOAD=/tmp/lockprof.so $NEW/bench-release-call --workload $w --strategy cudefer --rep 9 >> $OUT/lockprof.txt 2>&1
done
ls $NEW/.libs/ >> $OUT/tools.txt 2>&1; ls /tmp/w/cudefer-0.2.0/src/.libs/ >> $OUT/tools.txt 2>&1
python3 - $OUT <<'PY' > $OUT/summary.txt
import json,sys
o=sys.argv[1]
for f in ['w6ab.jsonl','w5.jsonl']:
    for l in open(o+'/'+f):
        try: d=json.loads(l)
        except Exception: continue
        keys=['build','workload','strategy','rep','enqueue_calls_per_s','first_call_us','call_p50_us','call_p95_us','call_p99_us','call_max_us','call_max_index','calls_over_1ms','events_created','events_created_calls','slow_calls','slow_gap_mode','calls_minor_faults','calls_vol_switches','bytes_per_entry']
        print({k:d.get(k) for k in keys if k in d})
PY
cat $OUT/summary.txt
