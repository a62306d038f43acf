#!/bin/bash
# The library of the fifth session (2026-11-27) on the H100: the trim's
# walk behind a busy stream (W5-busy-trim: one defer_trim while 20,000
# frees wait behind a 200 ms kernel, 5 reps), then the training
# regression check against README's table (8c9486c): train-cnn and
# train-lm, 3 interleaved reps, native, pluggable cudaMallocAsync, cudefer.
# `bash exp36.sh OUT REPO` with .dist/cudefer-0.2.0.tar.gz the make dist
# of the commit measured -> OUT/trim.jsonl, OUT/train.jsonl/.txt
OUT=$1; R=$2
W=/tmp/w36/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w36 && cd /tmp/w36 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
for rep in 0 1 2 3 4; do
  bench/bench-release-call --workload W5-busy-trim --strategy cudefer --rep $rep >> $OUT/trim.jsonl
done
python3 - $OUT/trim.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('rep %d: %d calls, trim %.2f ms, %d queries, %d released, kernel still running after: %d; call p50/p99 %.2f/%.2f us'
          % (r['rep'], r['calls'], r['busy_trim_ms'], r['busy_trim_queries'], r['busy_trim_released'],
             r['busy_trim_held_after'], r['call_p50_us'], r['call_p99_us']))
PY
python3 bench/run.py --workloads train-cnn,train-lm --reps 3 \
  --strategies native,pluggable-async,cudefer \
  --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/train.jsonl > $OUT/train.txt 2>&1
grep -v "^\[" $OUT/train.txt | tail -14
