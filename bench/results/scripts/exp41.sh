#!/bin/bash
# Prepared in the eighth session (2026-11-27) for the next one, not yet
# run: whether cudefer's calls or the host slowed the DDP LM's second
# repetition at f586769 on 2x H200 (1.236x native, the GPU 0.075 steps
# behind; the first 1.003x; f37f47e's 0.922x and 0.981x).  `bash exp41.sh
# OUT REPO PART...` with .dist/cudefer-0.2.0.tar.gz the make dist of the
# commit measured; builds once in exp38.sh's folder:
#   ddp-lm-calls  train-lm-ddp, 4 reps, native / pluggable-floor / cudefer,
#                 every allocator call timed on every rank (--time-calls)
#                 -> OUT/ddp-lm-calls.jsonl/.txt (about 8 minutes)
OUT=$1; R=$2; shift 2
S=$(cd $(dirname $0) && pwd)
bash $S/exp38.sh $OUT $R     # unpack and build, no part
cd /tmp/w38/cudefer-0.2.0
for PART in "$@"; do
  case $PART in
    ddp-lm-calls) python3 bench/run.py --workloads train-lm-ddp --reps 4 --time-calls \
            --strategies native,pluggable-floor,cudefer \
            --torch-lib /tmp/w38/cudefer-0.2.0/src/.libs/libcudefer.so \
            --json $OUT/ddp-lm-calls.jsonl > $OUT/ddp-lm-calls.txt 2>&1
          grep -v "^\[" $OUT/ddp-lm-calls.txt | head -30 ;;
  esac
done
