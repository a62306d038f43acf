#!/bin/bash
# SPDX-License-Identifier: MIT
# run-reliability.sh OUTDIR: cudefer's reliability checks on a GPU machine, in
# one go, within a time budget (RELIABILITY_BUDGET_S, default 500 s):
#   1. build: ./configure if there is no Makefile yet, make, make soak;
#   2. make check (the GPU suite, gpu_fault included);
#   3. the soak: t/gpu/gpu_soak, 10^7 entries, time limit SOAK_SECONDS (180);
#   4. t/gpu/run-sanitizers.sh: the GPU suite under compute-sanitizer
#      (memcheck, racecheck), with the time left.
# Run it from the top of the build tree (the unpacked tarball), e.g.
#   tar xzf cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && \
#     bash t/gpu/run-reliability.sh /tmp/out
# STAGES="build check soak sanitizers" picks stages (a later stage needs
# the build).  Everything goes to OUTDIR: header.txt, configure.log,
# build.log, check.log (+ check-logs/*.log, the GPU tests' TAP logs),
# soak.txt (+ soak-stderr.txt), sanitizers/ (summary.txt, one log per run),
# summary.txt (the lines printed here).  Exit status 0 when every stage
# passed.
set -u

OUT=${1:?usage: run-reliability.sh OUTDIR}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BUDGET=${RELIABILITY_BUDGET_S:-500}
SOAK_SECONDS=${SOAK_SECONDS:-180}
STAGES=${STAGES:-build check soak sanitizers}
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$(date +%s)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "$*" | tee -a "$SUMMARY"; }
want() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

for v in $(env | sed -n 's/^\(CUDEFER_[A-Za-z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done

{
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | sort | uniq -c | sed 's/^ *//')"
  echo "# cuda: $("${CUDA_HOME:-/usr/local/cuda}"/bin/nvcc --version 2>&1 | tail -2 | head -1)"
  echo "# command: bash t/gpu/run-reliability.sh OUTDIR (STAGES=\"$STAGES\", budget ${BUDGET}s, soak ${SOAK_SECONDS}s)"
} > "$OUT/header.txt"
tee -a "$SUMMARY" < "$OUT/header.txt"

status=0

# ---- 1. build -----------------------------------------------------------------
if want build; then
  s=$(date +%s)
  if [ ! -f Makefile ]; then
    if ! ./configure > "$OUT/configure.log" 2>&1; then
      say "build: ./configure FAILED (see configure.log)"
      tail -20 "$OUT/configure.log"
      exit 1
    fi
  fi
  if ! { make -j"$JOBS" && make -j"$JOBS" soak; } > "$OUT/build.log" 2>&1; then
    say "build: FAILED (see build.log)"
    tail -30 "$OUT/build.log"
    exit 1
  fi
  say "build: ok ($(( $(date +%s) - s ))s)"
fi

# ---- 2. make check --------------------------------------------------------------
if want check; then
  s=$(date +%s)
  limit=$(left)
  [ "$limit" -lt 120 ] && limit=120
  timeout -k 10 "$limit" make -j8 check > "$OUT/check.log" 2>&1
  rc=$?
  mkdir -p "$OUT/check-logs"
  cp t/gpu/*.log "$OUT/check-logs/" 2>/dev/null
  for trs in t/gpu/*.trs; do
    [ -f "$trs" ] || continue
    log=${trs%.trs}.log
    say "check: ${trs%.trs}: $(sed -n 's/^:global-test-result: //p' "$trs")" \
      "(ok $(grep -c '^ok ' "$log"), not ok $(grep -c '^not ok ' "$log")$(grep -m1 '^1\.\.0 # SKIP' "$log" | sed 's/^1\.\.0 # SKIP/; skipped:/'))"
  done
  grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR):' "$OUT/check.log" | sed 's/^/check: /' | tee -a "$SUMMARY"
  grep -hE '^not ok|^Bail out' t/*.log t/gpu/*.log 2>/dev/null | head -20 | sed 's/^/check:   /' | tee -a "$SUMMARY"
  say "check: make check rc=$rc ($(( $(date +%s) - s ))s)"
  [ "$rc" -eq 0 ] || status=1
fi

# ---- 3. the soak ----------------------------------------------------------------
if want soak; then
  secs=$SOAK_SECONDS
  room=$(( $(left) - 45 ))
  [ "$room" -lt "$secs" ] && secs=$room
  if [ "$secs" -lt 30 ]; then
    say "soak: SKIPPED (time budget spent)"
    status=1
  else
    s=$(date +%s)
    timeout -k 5 $(( secs + 40 )) t/gpu/gpu_soak --seconds "$secs" \
      --watchdog 30 > "$OUT/soak.txt" 2> "$OUT/soak-stderr.txt"
    rc=$?
    grep -E '^soak: (cudefer|1 in|every|cap|entries|device|releases|release|final|note|FAIL|PASS|SKIP)|^(ok|FAIL) - ' "$OUT/soak.txt" | tee -a "$SUMMARY"
    grep -E '^soak: t=' "$OUT/soak.txt" | tail -1 | tee -a "$SUMMARY"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && say "soak: killed after $(( secs + 40 ))s"
    say "soak: rc=$rc ($(( $(date +%s) - s ))s; stderr: $(wc -l < "$OUT/soak-stderr.txt") lines)"
    [ "$rc" -eq 0 ] || status=1
  fi
fi

# ---- 4. the sanitizers -----------------------------------------------------------
if want sanitizers; then
  s=$(date +%s)
  SAN_DEADLINE=$(( T0 + BUDGET )) bash "$HERE/run-sanitizers.sh" "$OUT/sanitizers" \
    | sed 's/^/sanitizers: /' | tee -a "$SUMMARY"
  rc=${PIPESTATUS[0]}
  say "sanitizers: rc=$rc ($(( $(date +%s) - s ))s)"
  [ "$rc" -eq 0 ] || status=1
fi

say "reliability: $([ $status -eq 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - T0 ))s"
exit $status
