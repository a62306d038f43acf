#!/bin/bash
# Whether W4's library share is what any event-polling reclaimer pays: the
# new bound malloc-record-query (records from a ring, one thread querying each
# event once complete, nothing released; bench/event_watcher.c) beside
# malloc-record and cudefer holding everything (nothing released until the
# end) and cudefer's default.  `bash exp35.sh OUT REPO` with
# .dist/cudefer-0.2.0.tar.gz the make dist of the commit measured
# -> OUT/w4q.txt/.jsonl (W4), OUT/w1q.txt/.jsonl (W1, W2)
OUT=$1; R=$2
W=/tmp/w35/cudefer-0.2.0
mkdir -p /tmp/w35 && cd /tmp/w35 && rm -rf cudefer-0.2.0 &&
  tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd $W &&
  ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
cd $W
H=CUDEFER_MAX_PENDING=1T,CUDEFER_MAX_DELAY_MS=0
python3 bench/run.py --workloads W4 --reps ${REPS:-3} \
  --strategies malloc-never-free,malloc-record,malloc-record-query,cudefer \
  --variant holdall=$H --json $OUT/w4q.jsonl > $OUT/w4q.txt 2>&1
grep -v "^\[" $OUT/w4q.txt | tail -9
python3 bench/run.py --workloads W1,W2 --reps ${REPS:-3} \
  --strategies malloc-never-free,malloc-record,malloc-record-query,cudefer \
  --json $OUT/w1q.jsonl > $OUT/w1q.txt 2>&1
grep -v "^\[" $OUT/w1q.txt | tail -16
