#!/bin/bash
# W5/W6 A/B in one run: entry slabs mapped by the launching thread (e1ef5f4) against slabs the reclaimer maps ahead into the pool (refill)
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev && (cd prev && tar xzf $R/.dist/prev-slabs.tar.gz)
(cd prev/cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "prev build failed") &
(cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "new build failed") &
wait
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3 4; do
  for w in W5-idle W5-idle-primed W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"e1ef5f4",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"refill",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
  done
  $PREV/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"e1ef5f4",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"refill",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
done
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl; python3 $R/.dist/abtab.py $OUT/w6ab.jsonl
