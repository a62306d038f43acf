#!/bin/bash
# The sixth session (2026-11-27): what the runtime's wrappers add to the
# launching thread's CUDA calls (bench-call-parts' new drv_* parts: the
# driver API's cuStreamIsCapturing, cuCtxGetDevice, cuEventCreate and
# cuEventRecord beside the runtime's), with W5 itself, and make check of
# the commit.  `bash exp37.sh OUT REPO PART...` with .dist/cudefer-0.2.0.tar.gz
# the make dist of the commit measured:
#   w5     W5 and W5-parts, 3 reps -> OUT/w5.jsonl, OUT/w5.txt
#   micro  W1, W2, W4, W5, W6, 3 interleaved reps, with the row
#          cudefer-runtime (CUDEFER_DRIVER_CALLS=0: the runtime's calls, as
#          before driver_calls.c) beside cudefer -> OUT/micro.jsonl/.txt
#   w4ab   W4 and W5, 5 reps, cudefer and cudefer-runtime with the bounds
#          and inline peers -> OUT/w4ab.jsonl/.txt
#   check  make check -> OUT/check.txt (bench/gpu-session.sh)
OUT=$1; R=$2; shift 2
W=/tmp/w37/cudefer-0.2.0
if [ ! -f $W/src/.libs/libcudefer.so ]; then
  mkdir -p /tmp/w37 && cd /tmp/w37 && rm -rf cudefer-0.2.0 && tar xzf $R/.dist/cudefer-0.2.0.tar.gz &&
    cd $W && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "build failed"
fi
cd $W
for PART in "$@"; do
  case $PART in
    w5)    python3 bench/run.py --workloads W5,W5-parts --reps 3 \
             --json $OUT/w5.jsonl > $OUT/w5.txt 2>&1; grep -v "^\[" $OUT/w5.txt | head -50 ;;
    micro) python3 bench/run.py --workloads W1,W2,W4,W5,W6 --reps 3 \
             --variant cudefer-runtime=CUDEFER_DRIVER_CALLS=0 \
             --json $OUT/micro.jsonl > $OUT/micro.txt 2>&1; grep -v "^\[" $OUT/micro.txt | head -60 ;;
    w4ab)  python3 bench/run.py --workloads W4,W5 --reps 5 \
             --strategies limit,malloc-never-free,inline-cudaFree,inline-async,cudefer \
             --variant cudefer-runtime=CUDEFER_DRIVER_CALLS=0 \
             --json $OUT/w4ab.jsonl > $OUT/w4ab.txt 2>&1; grep -v "^\[" $OUT/w4ab.txt | head -40 ;;
    check) STAGES=check bash bench/gpu-session.sh $OUT; tail -5 $OUT/check.txt ;;
  esac
done
