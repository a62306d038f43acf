#!/bin/bash
# The library at the session's end (2026-11-27, fourth session) on the GPU:
# a regression check of the micro-workloads and training against the
# numbers README cites (8c9486c, f62662d), after the day's fixes (trim, the
# legacy-stream users, the deleters, record_stream on the per-thread
# stream).  `bash exp32.sh OUT REPO PART` with .dist/cudefer-0.2.0.tar.gz
# the make dist of the commit measured; each PART fits one 10-minute call:
#   micro  W1, W2, W4, W5, W6, 3 interleaved reps, every default strategy
#          -> micro.jsonl/.txt
#   train  train-cnn and train-lm, 3 reps, native, pluggable cudaMallocAsync
#          and cudefer -> train.jsonl/.txt
#   check  make check -> check.txt
OUT=$1; R=$2; PART=${3:-micro}
W=/tmp/w32/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w32 && cd /tmp/w32 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
case $PART in
  check) STAGES=check bash bench/gpu-session.sh $OUT ;;
  micro) python3 bench/run.py --workloads W1,W2,W4,W5,W6 --reps 3 \
           --json $OUT/micro.jsonl > $OUT/micro.txt 2>&1 ;;
  train) python3 bench/run.py --workloads train-cnn,train-lm --reps 3 \
           --strategies native,pluggable-async,cudefer \
           --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/train.jsonl > $OUT/train.txt 2>&1 ;;
esac
