#!/bin/bash
# H200: W5/W6 A/B in one run: 190681f against entry slabs (e1ef5f4)
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && mkdir prev && cd prev && tar xzf $R/.dist/prev-190681f.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "prev build failed"
cd /tmp/w/cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "new build failed"
PREV=/tmp/w/prev/cudefer-0.2.0/bench; NEW=/tmp/w/cudefer-0.2.0/bench
for rep in 0 1 2 3; do
  for w in W5-idle W5-idle-primed W5-busy; do
    $PREV/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"190681f",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy cudefer --rep $rep | sed 's/^{/{"build":"e1ef5f4",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    $NEW/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
  done
  $PREV/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"190681f",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy cudefer --rep $rep | sed 's/^{/{"build":"e1ef5f4",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
  $NEW/bench-scale --workload W6 --strategy no-library --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w6ab.jsonl 2>>$OUT/w6ab.err
done
cd /tmp/w/cudefer-0.2.0 && python3 bench/cpu_profile.py --us 1000 --top 40 bench/bench-scale --workload W6 --strategy cudefer --rep 9 > $OUT/w6-profile-slabs-h200.txt 2>&1
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl; python3 $R/.dist/abtab.py $OUT/w6ab.jsonl
