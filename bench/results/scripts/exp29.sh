#!/bin/bash
# Whether new blocks should be
# rounded to 32 sizes per power of two by default (CUDEFER_ROUND_DIVISIONS;
# the fake replay: the CNN's pool 2 % smaller, the LM's the same,
# bench/results/2026-11-27-fake-replay-rounding.txt), on the GPU's own
# measures: NVML peak and step time.  `bash exp29.sh OUT REPO PART` with
# .dist/cudefer-0.2.0.tar.gz the make dist of the commit measured; each
# PART fits one 10-minute call on an H100:
#   train  train-cnn and train-lm, 3 reps, native, pluggable cudaMallocAsync,
#          cudefer and cudefer-round32 -> train.jsonl/.txt
#   ddp    (two GPUs) the same under DDP, 2 reps -> ddp.jsonl/.txt
#   check  make check (the first GPU run of CUDEFER_ROUND_DIVISIONS) -> check.txt
OUT=$1; R=$2; PART=${3:-train}
W=/tmp/w29/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w29 && cd /tmp/w29 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
V="--variant cudefer-round32=CUDEFER_ROUND_DIVISIONS=32"
case $PART in
  check) STAGES=check bash bench/gpu-session.sh $OUT ;;
  train) python3 bench/run.py --workloads train-cnn,train-lm --reps 3 \
           --strategies native,pluggable-async,cudefer $V \
           --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/train.jsonl > $OUT/train.txt 2>&1 ;;
  ddp)   python3 bench/run.py --workloads train-cnn-ddp,train-lm-ddp --reps 2 \
           --strategies native,pluggable-async,cudefer $V \
           --torch-lib $PWD/src/.libs/libcudefer.so --json $OUT/ddp.jsonl > $OUT/ddp.txt 2>&1 ;;
esac
