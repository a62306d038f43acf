#!/bin/bash
# The eighth session (2026-11-27): device_switch.c (e103d45) on two GPUs,
# W6 on an H200 with the driver's calls, and the W4 A/B on an H200.
# `bash exp40.sh OUT REPO PART...` with .dist/cudefer-0.2.0.tar.gz the make
# dist of the commit measured; builds once in exp38.sh's folder:
#   check, san   as exp38.sh (make check; the C GPU suite under
#                compute-sanitizer, gpu_multidevice included on two GPUs)
#   w6           W6, 5 reps, cudefer against the no-library row
#                -> OUT/w6.jsonl/.txt
#   w4ab         as exp39.sh: W4, 5 reps, the driver's calls against
#                CUDEFER_DRIVER_CALLS=0 -> OUT/w4ab.jsonl/.txt
#   ddp-lm-calls prepared for the next session, not yet run: whether
#                cudefer's calls or the host slowed the DDP LM's second
#                repetition at f586769 on 2x H200 (1.236x native, the GPU
#                0.075 steps behind; the first 1.003x): train-lm-ddp, 4
#                reps, native / pluggable-floor / cudefer, every allocator
#                call timed (--time-calls) -> OUT/ddp-lm-calls.jsonl/.txt
#                (about 8 minutes)
OUT=$1; R=$2; shift 2
S=$(cd $(dirname $0) && pwd)
bash $S/exp38.sh $OUT $R     # unpack and build, no part
cd /tmp/w38/cudefer-0.2.0
for PART in "$@"; do
  case $PART in
    check|san) bash $S/exp38.sh $OUT $R $PART ;;
    w6)   python3 bench/run.py --workloads W6 --reps 5 \
            --json $OUT/w6.jsonl > $OUT/w6.txt 2>&1; grep -v "^\[" $OUT/w6.txt | head -20 ;;
    w4ab) python3 bench/run.py --workloads W4 --reps 5 \
            --strategies limit,malloc-never-free,inline-cudaFree,inline-async,naive-reclaimer,cudefer \
            --variant cudefer-runtime=CUDEFER_DRIVER_CALLS=0 \
            --json $OUT/w4ab.jsonl > $OUT/w4ab.txt 2>&1; grep -v "^\[" $OUT/w4ab.txt | head -30 ;;
    ddp-lm-calls) python3 bench/run.py --workloads train-lm-ddp --reps 4 --time-calls \
            --strategies native,pluggable-floor,cudefer \
            --torch-lib /tmp/w38/cudefer-0.2.0/src/.libs/libcudefer.so \
            --json $OUT/ddp-lm-calls.jsonl > $OUT/ddp-lm-calls.txt 2>&1
          grep -v "^\[" $OUT/ddp-lm-calls.txt | head -30 ;;
  esac
done
