#!/bin/bash
# W6 A/B/C: d703d07, reserve 1024 (new), reserve 256 -- stock 4096 in both new
OUT=$1; R=$2
cd /tmp/w && rm -rf r256 && mkdir r256 && cd r256 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q CPPFLAGS=-DEVENT_POOL_RESERVE=256 && make -j16 all bench >/dev/null 2>&1 || echo "r256 build failed"
if [ ! -x /tmp/w/old/cudefer-0.2.0/bench/bench-scale ]; then
  cd /tmp/w && rm -rf old && mkdir old && cd old && tar xzf $R/.dist/old-d703d07.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "old build failed"
fi
OLD=/tmp/w/old/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench; R256=/tmp/w/r256/cudefer-0.2.0/bench
for rep in 0 1 2 3; do
  $OLD/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"d703d07",/' >> $OUT/w6abc.jsonl 2>>$OUT/w6abc.err
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"reserve1024",/' >> $OUT/w6abc.jsonl 2>>$OUT/w6abc.err
  $R256/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"reserve256",/' >> $OUT/w6abc.jsonl 2>>$OUT/w6abc.err
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6abc.jsonl 2>>$OUT/w6abc.err
done
python3 - $OUT <<'PY' > $OUT/w6abc.txt
import json,sys
o=sys.argv[1]
for l in open(o+'/w6abc.jsonl'):
    try: d=json.loads(l)
    except Exception: continue
    keys=['build','strategy','rep','enqueue_calls_per_s','call_p50_us','call_p99_us','call_max_us','call_max_index','calls_over_1ms','events_created','queries_per_release','bytes_per_entry']
    print({k:d.get(k) for k in keys if k in d})
PY
cat $OUT/w6abc.txt
