#!/bin/bash
# Whether a miss after the first stock should make events ahead in bursts
# (1, 2, 4 ... 256; src/event_pool.c burst) on the H100: the tarball built
# twice, as is (burst) and with CPPFLAGS=-DEVENT_BURST_MAX=0 (one event a
# miss, as before), run side by side, 3 interleaved repetitions, with the
# peers of each workload.  `bash exp30.sh OUT REPO`; writes ab.jsonl and
# ab.txt (bench/results/scripts/exp30_table.py).
OUT=$1; R=$2
mkdir -p /tmp/w30 && cd /tmp/w30 && rm -rf a b && mkdir a b
(cd a && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 || echo "a build failed") &
(cd b && tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q CPPFLAGS=-DEVENT_BURST_MAX=0 && make -j8 all bench >/dev/null 2>&1 || echo "b build failed") &
wait
A=/tmp/w30/a/cudefer-0.2.0/bench; B=/tmp/w30/b/cudefer-0.2.0/bench
run() { # build-label program args...
  local label=$1; shift
  "$@" 2>>$OUT/ab.err | tail -n 1 | sed "s/^{/{\"build\":\"$label\",/" >> $OUT/ab.jsonl
}
for rep in 0 1 2; do
  for w in W5-busy W5-idle; do
    run - $A/bench-release-call --workload $w --strategy inline-async --rep $rep --calls 20000
    run burst $A/bench-release-call --workload $w --strategy cudefer --rep $rep --calls 20000
    run one $B/bench-release-call --workload $w --strategy cudefer --rep $rep --calls 20000
  done
  run - $A/bench-launch-loop --workload W4 --strategy malloc-never-free --rep $rep --iters 5000
  run - $A/bench-launch-loop --workload W4 --strategy inline-cudaFree --rep $rep --iters 5000
  run burst $A/bench-launch-loop --workload W4 --strategy cudefer --rep $rep --iters 5000
  run one $B/bench-launch-loop --workload W4 --strategy cudefer --rep $rep --iters 5000
  run - $A/bench-scale --workload W6 --strategy no-library --rep $rep --entries 1000000
  run burst $A/bench-scale --workload W6 --strategy cudefer --rep $rep --entries 1000000
  run one $B/bench-scale --workload W6 --strategy cudefer --rep $rep --entries 1000000
done
python3 $R/bench/results/scripts/exp30_table.py $OUT/ab.jsonl > $OUT/ab.txt
