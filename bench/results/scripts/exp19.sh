#!/bin/bash
# A/B in one run: 879e306 against mid-pass recycling of events alone
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev && cd prev && tar xzf $R/.dist/prev-879e306.tar.gz
(cd /tmp/w/prev/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "prev build failed") &
cd /tmp/w/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "new build failed"
wait
gcc -O2 -shared -fPIC -I/usr/local/cuda/include $R/.dist/countcalls.c -o /tmp/w/cc.so -ldl || echo "cc failed"
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3 4; do
  for w in W5-idle W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"879e306",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"recycle",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
  done
done
for b in prev new; do for w in W5-idle W5-busy; do
  D=$PREV; [ $b = new ] && D=$NEW
  echo "== $b $w" >> $OUT/counts.txt
  LD_PRELOAD=/tmp/w/cc.so $D/bench-release-call --workload $w --strategy cudefer --rep 9 2>>$OUT/counts.txt >/dev/null
done; done
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl; cat $OUT/counts.txt
