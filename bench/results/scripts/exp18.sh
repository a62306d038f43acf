#!/bin/bash
# A/B in one run: 879e306 against the reclaimer keeping the event pool stocked (low mark, refill up to the stock, mid-pass recycling)
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev && cd prev && tar xzf $R/.dist/prev-879e306.tar.gz
(cd /tmp/w/prev/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "prev build failed") &
cd /tmp/w/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "new build failed"
wait
gcc -O2 -shared -fPIC -I/usr/local/cuda/include $R/.dist/countcalls.c -o /tmp/w/cc.so -ldl || echo "cc failed"
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3; do
  for w in W5-idle W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"879e306",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"refill",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
  done
  $PREV/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"879e306",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"refill",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
  if [ $rep -lt 3 ]; then for s in cudefer cudefer-alloc; do
    $PREV/bench-launch-loop --workload W4 --strategy $s --rep $rep | sed 's/^{/{"build":"879e306",/' >> $OUT/w4ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-launch-loop --workload W4 --strategy $s --rep $rep | sed 's/^{/{"build":"refill",/' >> $OUT/w4ab.jsonl 2>>$OUT/err.txt
  done; $NEW/bench-launch-loop --workload W4 --strategy limit --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w4ab.jsonl 2>>$OUT/err.txt; fi
done
for b in prev new; do for w in W5-idle W5-busy; do
  D=$PREV; [ $b = new ] && D=$NEW
  echo "== $b $w" >> $OUT/counts.txt
  LD_PRELOAD=/tmp/w/cc.so $D/bench-release-call --workload $w --strategy cudefer --rep 9 2>>$OUT/counts.txt >/dev/null
done; done
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl; python3 $R/.dist/abtab.py $OUT/w6ab.jsonl; cat $OUT/counts.txt
python3 - $OUT/w4ab.jsonl <<'PY'
import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    rows.setdefault((d['strategy'],d['build']),[]).append(d)
for k,ds in sorted(rows.items()):
    keys=['done_ms','call_p50_us','call_p99_us','call_max_us','iter_max_us','peak_bytes']
    print(k, {x:[d.get(x) for d in ds] for x in keys})
PY
