#!/bin/bash
# CPU profiles (bench/cpu_profile.py, SIGPROF every 1 ms of CPU) of W6 cudefer and no-library, and W5-busy cudefer
OUT=$1; R=$2
cd /tmp/w && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
P="python3 bench/cpu_profile.py --us 1000 --top 45"
for rep in 0 1; do
  $P bench/bench-scale --workload W6 --strategy cudefer --rep $rep > $OUT/w6-cudefer-$rep.txt 2>&1
  bench/bench-scale --workload W6 --strategy cudefer --rep $rep > $OUT/w6-plain-$rep.txt 2>&1
  bench/bench-scale --workload W6 --strategy no-library --rep $rep >> $OUT/w6-plain-$rep.txt 2>&1
done
$P bench/bench-scale --workload W6 --strategy no-library --rep 0 > $OUT/w6-nolib.txt 2>&1
$P bench/bench-release-call --workload W5-busy --strategy cudefer --rep 0 > $OUT/w5busy.txt 2>&1
for f in $OUT/*.txt; do echo "=== $f"; head -c 300 $f | head -3; done
