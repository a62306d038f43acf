#!/bin/bash
# Prepared in the seventh session (2026-11-27) for the next one, not yet
# run: whether the driver's calls or the host moved W4 on the H200
# (f37f47e: cudefer 1.516x the floor against inline cudaFree's 1.419x in
# every repetition, where f62662d on another H200 had 1.630x against
# 1.691x), and the LM's training time against the pluggable floor with
# more repetitions.  `bash exp39.sh OUT REPO PART...` with
# .dist/cudefer-0.2.0.tar.gz the make dist of the commit measured:
#   w4ab   W4, 5 reps, cudefer and cudefer-runtime (CUDEFER_DRIVER_CALLS=0)
#          with the bounds, inline peers and the naive reclaimer
#          -> OUT/w4ab.jsonl/.txt
#   lm     train-lm, 6 reps, native, pluggable-floor, cudefer, every call
#          timed -> OUT/lm.jsonl/.txt
OUT=$1; R=$2; shift 2
W=/tmp/w39/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w39 && cd /tmp/w39 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
for PART in "$@"; do
  case $PART in
    w4ab) python3 bench/run.py --workloads W4 --reps 5 \
            --strategies limit,malloc-never-free,inline-cudaFree,inline-async,naive-reclaimer,cudefer \
            --variant cudefer-runtime=CUDEFER_DRIVER_CALLS=0 \
            --json $OUT/w4ab.jsonl > $OUT/w4ab.txt 2>&1; grep -v "^\[" $OUT/w4ab.txt | head -30 ;;
    lm)   python3 bench/run.py --workloads train-lm --reps 6 --time-calls \
            --strategies native,pluggable-floor,cudefer --torch-lib $W/src/.libs/libcudefer.so \
            --json $OUT/lm.jsonl > $OUT/lm.txt 2>&1; grep -v "^\[" $OUT/lm.txt | head -30 ;;
  esac
done
