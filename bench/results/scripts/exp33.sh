#!/bin/bash
# Tail-first polling (d5920bf) against the library before it (bbd30a9's
# tarball: 5d1a3ce's library with the malloc-record bench row), side by side
# on one GPU: W1, W2, W4, repetitions alternating between the two trees, each
# with malloc-record, cudefer, holding everything (holdall) and polling
# every 1 ms (poll1ms, holdall-poll1ms: more entries complete between
# passes, so the tail-first path has something to save).
# `bash exp33.sh OUT REPO` with .dist/old-bbd30a9.tar.gz and
# .dist/new-d5920bf.tar.gz -> OUT/ab.txt (both tables), OUT/{old,new}.jsonl
OUT=$1; R=$2; REPS=${REPS:-3}
for t in old-bbd30a9 new-d5920bf; do
  ( mkdir -p /tmp/w33/$t && cd /tmp/w33/$t && tar xzf $R/.dist/$t.tar.gz &&
    cd cudefer-0.2.0 && ./configure -q && make -j8 all bench >/dev/null 2>&1 ||
    echo "build of $t failed" ) &
done
wait
H=CUDEFER_MAX_PENDING=1T,CUDEFER_MAX_DELAY_MS=0
ARGS="--workloads W1,W2,W4 --reps 1 --strategies malloc-record,cudefer
  --variant holdall=$H --variant poll1ms=CUDEFER_POLL_US=1000
  --variant holdall-poll1ms=$H,CUDEFER_POLL_US=1000"
for rep in $(seq $REPS); do
  for t in old-bbd30a9 new-d5920bf; do
    (cd /tmp/w33/$t/cudefer-0.2.0 && python3 bench/run.py $ARGS \
       --json /tmp/w33/$t-$rep.jsonl > /tmp/w33/$t-$rep.txt 2>&1)
  done
done
for t in old-bbd30a9 new-d5920bf; do
  cat /tmp/w33/$t-*.jsonl > $OUT/${t%%-*}.jsonl
  echo "######## $t"; (cd /tmp/w33/$t/cudefer-0.2.0 &&
    python3 bench/run.py --from-json $OUT/${t%%-*}.jsonl)
done > $OUT/ab.txt 2>&1
