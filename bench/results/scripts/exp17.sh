#!/bin/bash
# W5 diagnostic: which CUDA calls the launching thread makes per defer_free (LD_PRELOAD countcalls.c), default vs CUDEFER_POLL_US=10
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
gcc -O2 -shared -fPIC -I/usr/local/cuda/include $R/.dist/countcalls.c -o /tmp/w/cc.so -ldl || echo "cc failed"
B=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2; do
  for w in W5-idle W5-busy; do
    for v in default poll10; do
      env=""; [ $v = poll10 ] && env="CUDEFER_POLL_US=10"
      echo "== $w $v rep $rep" >> $OUT/counts.txt
      env $env LD_PRELOAD=/tmp/w/cc.so $B/bench-release-call --workload $w --strategy cudefer --rep $rep 2>>$OUT/counts.txt | sed "s/^{/{\"build\":\"$v\",/" >> $OUT/w5.jsonl
    done
    $B/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5.jsonl
  done
done
python3 $R/.dist/abtab.py $OUT/w5.jsonl; cat $OUT/counts.txt
