#!/bin/bash
# exp30 found bursts of up to 256 events halving W5-busy's p50 but making
# its p99 bimodal (one call in ~100 pays a burst cut by its 100 us
# deadline).  Smaller bursts: the tarball built with EVENT_BURST_MAX=2, 4
# and 16 beside exp30's builds (256 and 0), W5-busy, 6 interleaved
# repetitions with inline-async.  `bash exp31.sh OUT REPO` after exp30
# (its builds in /tmp/w30).
OUT=$1; R=$2
cd /tmp/w30 || exit 1
for v in 2 4 16; do
  (rm -rf m$v && mkdir m$v && cd m$v && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
     cd cudefer-0.2.0 && ./configure -q CPPFLAGS=-DEVENT_BURST_MAX=$v &&
     make -j5 all bench >/dev/null 2>&1 || echo "m$v build failed") &
done
wait
for rep in 20 21 22 23 24 25; do
  for b in "- a inline-async" "256 a cudefer" "0 b cudefer" "2 m2 cudefer" "4 m4 cudefer" "16 m16 cudefer"; do
    set -- $b
    /tmp/w30/$2/cudefer-0.2.0/bench/bench-release-call --workload W5-busy --strategy $3 --rep $rep --calls 20000 2>>$OUT/w5.err |
      tail -n 1 | sed "s/^{/{\"build\":\"$1\",/" >> $OUT/w5.jsonl
  done
done
python3 $R/bench/results/scripts/exp30_table.py $OUT/w5.jsonl > $OUT/w5.txt
