#!/bin/bash
# W4 defer_free against inline cudaFree: which releases the reclaimer makes (CUDEFER_STATS=1), and two policy variants
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
B=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2; do
  for v in inline default delay10s pending40g never; do
    s=cudefer; env="CUDEFER_STATS=1"
    case $v in inline) s=inline-cudaFree;; never) s=malloc-never-free;; delay10s) env="$env CUDEFER_MAX_DELAY_MS=10000";; pending40g) env="$env CUDEFER_MAX_PENDING=40G";; esac
    echo "== $v rep $rep" >> $OUT/stats.txt
    env $env $B/bench-launch-loop --workload W4 --strategy $s --rep $rep 2>>$OUT/stats.txt | sed "s/^{/{\"build\":\"$v\",/" >> $OUT/w4.jsonl
  done
done
python3 - $OUT/w4.jsonl <<'PY'
import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    rows.setdefault(d['build'],[]).append(d)
for b,ds in rows.items():
    print('%-10s done_ms %s  median %.0f  peak GiB %s  batches %s' % (b,[round(d['done_ms']) for d in ds], st.median(d['done_ms'] for d in ds), [round(d['peak_bytes']/2**30,1) for d in ds], [d.get('batches') for d in ds]))
PY
grep -A3 "== default rep 0\|== delay10s rep 0\|== pending40g rep 0" $OUT/stats.txt | cut -c1-600
