#!/bin/bash
# Prepared for the next session (not run yet): the library since 155326d on
# the GPU, and whether the reclaimer should poll every 1 ms by default.
# `bash exp28.sh OUT REPO PART` with .dist/cudefer-0.2.0.tar.gz the make
# dist of the commit measured; each PART fits one 10-minute call on an H100:
#   check  make check (the GPU suite covers 0dc73d0, b5f9b85, fd69acb,
#          ae9ce0c, 58adec0, which never ran on a GPU) -> check.txt
#   micro  W1, W2, W4, W5, W6, 3 reps, with CUDEFER_POLL_US=1000 variants of
#          cudefer and cudefer-alloc beside the defaults -> micro.jsonl/.txt
#   train  train-lm and train-cnn, --time-calls, 3 reps, with the 1 ms
#          variant (bench/results/2026-11-26-h100-slow-frees.txt: frees 994
#          against 1252 us a step, ms/step 0.793x against 0.932x, 2 reps)
#          -> train.jsonl/.txt
OUT=$1; R=$2; PART=${3:-check}
W=/tmp/w28/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w28 && cd /tmp/w28 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
POLL="--variant cudefer-poll1ms=CUDEFER_POLL_US=1000 --variant cudefer-alloc-poll1ms:cudefer-alloc=CUDEFER_POLL_US=1000"
case $PART in
  check) STAGES=check bash bench/gpu-session.sh $OUT ;;
  micro) python3 bench/run.py --workloads W1,W2,W4,W5,W6 --reps 3 $POLL \
           --json $OUT/micro.jsonl > $OUT/micro.txt 2>&1 ;;
  train) python3 bench/run.py --workloads train-lm,train-cnn --reps 3 --time-calls \
           --strategies native,pluggable-async,cudefer --variant cudefer-poll1ms=CUDEFER_POLL_US=1000 \
           --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/train.jsonl > $OUT/train.txt 2>&1 ;;
esac
