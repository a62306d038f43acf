#!/bin/bash
# A/B in one run: W5 and W6, 688cd43 (prev) against 9857b08 (the cache-line diet), builds of exp21.sh (rebuilt if missing)
OUT=$1; R=$2
if [ ! -x /tmp/w/cudefer-0.2.0/bench/bench-scale ] || [ ! -x /tmp/w/prev/cudefer-0.2.0/bench/bench-scale ]; then
  mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev && (cd prev && tar xzf $R/.dist/prev-688cd43.tar.gz)
  (cd /tmp/w/prev/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "prev build failed") &
  cd /tmp/w/cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "new build failed"
  wait
fi
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3 4; do
  for w in W5-idle W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"688cd43",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"9857b08",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/err.txt
  done
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
  $PREV/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"688cd43",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"9857b08",/' >> $OUT/w6ab.jsonl 2>>$OUT/err.txt
done
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl; python3 $R/.dist/abtab.py $OUT/w6ab.jsonl
