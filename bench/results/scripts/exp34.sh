#!/bin/bash
# Ran 2026-11-27 on an H100 (bench/results/2026-11-27-h100-w4-capture-check.txt:
# no, the check is not it).  Whether W4's library share
# (holding everything 1.19-1.26x the never-free floor against malloc-record's
# 1.05x, bench/results/2026-11-27-h100-w4-parts.txt; not the queries:
# -tail-first-ab.txt) is the capture check each defer_free makes
# (cudaStreamIsCapturing beside eight threads' cudaMalloc).  A scratch
# build with exp34-no-capture-check.patch applied (CUDEFER_X_NO_CAPTURE_CHECK
# skips the check: unsafe, an experiment only), W4, REPS reps:
# malloc-record, holdall, holdall without the check, the default without it.
# `bash exp34.sh OUT REPO` with .dist/cudefer-0.2.0.tar.gz any make dist
# whose src/capture.c the patch applies to -> OUT/w4x.txt, OUT/w4x.jsonl
OUT=$1; R=$2
W=/tmp/w34/cudefer-0.2.0
mkdir -p /tmp/w34 && cd /tmp/w34 && rm -rf cudefer-0.2.0 &&
  tar xzf $R/.dist/cudefer-0.2.0.tar.gz && cd $W &&
  patch -p1 < $R/bench/results/scripts/exp34-no-capture-check.patch &&
  ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
cd $W
H=CUDEFER_MAX_PENDING=1T,CUDEFER_MAX_DELAY_MS=0
python3 bench/run.py --workloads W4 --reps ${REPS:-4} \
  --strategies malloc-never-free,malloc-record,cudefer \
  --variant holdall=$H --variant holdall-nocheck=$H,CUDEFER_X_NO_CAPTURE_CHECK=1 \
  --variant nocheck=CUDEFER_X_NO_CAPTURE_CHECK=1 \
  --json $OUT/w4x.jsonl > $OUT/w4x.txt 2>&1
grep -v "^\[" $OUT/w4x.txt | tail -12
