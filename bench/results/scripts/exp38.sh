#!/bin/bash
# The seventh session (2026-11-27): the commit's make check on a GPU, the
# C GPU suite under compute-sanitizer (0.2.0's allocator tests included),
# the soak, and training.  `bash exp38.sh OUT REPO PART...` with
# .dist/cudefer-0.2.0.tar.gz the make dist of the commit measured:
#   check  make check -> OUT/check.txt (bench/gpu-session.sh)
#   san    t/gpu/run-sanitizers.sh (memcheck, racecheck; 300 s at most)
#          -> OUT/san-summary.txt, OUT/san-logs.tar.gz
#   soak   t/gpu/gpu_soak, 10^7 entries (t/gpu/run-reliability.sh's stage)
#          -> OUT/soak.txt
#   train  train-cnn and train-lm, REPS (3) repetitions -> OUT/train.jsonl/.txt
#   micro  W1, W2, W4, W5, 3 reps -> OUT/micro.jsonl/.txt
#   ddp    train-cnn-ddp and train-lm-ddp (two GPUs) -> OUT/ddp.jsonl/.txt
OUT=$1; R=$2; shift 2
W=/tmp/w38/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w38 && cd /tmp/w38 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
for PART in "$@"; do
  case $PART in
    check) STAGES=check bash bench/gpu-session.sh $OUT; tail -5 $OUT/check.txt ;;
    san)   SAN_DEADLINE=$(( $(date +%s) + 300 )) bash t/gpu/run-sanitizers.sh /tmp/w38/san \
             > /dev/null 2>&1; cp /tmp/w38/san/summary.txt $OUT/san-summary.txt
           tar czf $OUT/san-logs.tar.gz -C /tmp/w38 san; cat $OUT/san-summary.txt ;;
    soak)  make -s soak > /dev/null 2>&1
           STAGES=soak RELIABILITY_BUDGET_S=240 SOAK_SECONDS=180 bash t/gpu/run-reliability.sh /tmp/w38/rel \
             > $OUT/soak.txt 2>&1; cat /tmp/w38/rel/soak.txt >> $OUT/soak.txt 2>/dev/null; tail -8 $OUT/soak.txt ;;
    train) STAGES=train REPS=${REPS:-3} bash bench/gpu-session.sh $OUT; grep -v "^\[" $OUT/train.txt | head -40 ;;
    micro) python3 bench/run.py --workloads W1,W2,W4,W5 --reps 3 \
             --json $OUT/micro.jsonl > $OUT/micro.txt 2>&1; grep -v "^\[" $OUT/micro.txt | head -60 ;;
    ddp)   STAGES=ddp REPS=${REPS:-2} bash bench/gpu-session.sh $OUT; grep -v "^\[" $OUT/ddp.txt | head -40 ;;
  esac
done
