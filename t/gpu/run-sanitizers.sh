#!/bin/bash
# SPDX-License-Identifier: MIT
# run-sanitizers.sh LOGDIR: the GPU tests under compute-sanitizer, memcheck
# and racecheck.
#
# Run it from the top of a configured build tree (where Makefile and libtool
# are); it builds the test programs first.  The programs in t/gpu/ are
# libtool wrapper scripts: "./libtool --mode=execute compute-sanitizer ...
# t/gpu/gpu_basic" runs the real binary with src/.libs on the library path.
# Children are tracked too (--target-processes all: gpu_exit forks).
# gpu_fault is left out: it faults on purpose, which both tools report.
#
# For each (tool, test) it prints one line:
#   TOOL TEST rc=N sanitizer_errors=N api_errors=N tap_ok=N tap_not_ok=N SECONDS VERDICT
# VERDICT is CLEAN (no sanitizer error, the test passed), SANITIZER-ERRORS,
# TEST-FAILED (no sanitizer error, but the test's own checks failed: see the
# log; timing checks may fail under the sanitizer's slowdown), TIMEOUT,
# NO-SUMMARY (the sanitizer printed no summary) or SKIPPED (time budget).
# sanitizer_errors sums the "ERROR SUMMARY" of every tracked process;
# api_errors counts the "Program hit ..." lines among them (CUDA calls that
# returned an error, as the sanitizer saw them).  The full output of each
# run is LOGDIR/TOOL-TEST.log; the lines above also go to LOGDIR/summary.txt.
# Exit status 0 when every run is CLEAN.
#
# Environment:
#   COMPUTE_SANITIZER   the compute-sanitizer program (default: from PATH,
#                       $CUDA_HOME/bin or /usr/local/cuda/bin)
#   SAN_TOOLS           tools to run (default "memcheck racecheck")
#   SAN_TESTS           tests to run (default: the C GPU suite but
#                       gpu_fault and the soak: "t/gpu/gpu_basic
#                       t/gpu/gpu_alloc t/gpu/gpu_handback t/gpu/gpu_capture
#                       t/gpu/gpu_multidevice t/gpu/gpu_exit")
#   SAN_TIMEOUT         seconds per run (default 120)
#   SAN_DEADLINE        epoch seconds after which no run starts, and no run
#                       goes past (default: none)
#   SAN_EXTRA_ARGS      more compute-sanitizer options
#   CUDEFER_TEST_SCALE  handed to the tests (default 0.1: gpu_basic does
#                       1000 device buffers instead of 10 000)
# Each run gets CUDEFER_TEST_SANITIZER=TOOL: gpu_exit then skips its check
# of how long an exit behind a 10 s kernel took (the sanitizer itself waits
# for the kernel when the process exits; that check failed under both tools
# in every run before).
set -u

LOGDIR=${1:?usage: run-sanitizers.sh LOGDIR}
mkdir -p "$LOGDIR" || exit 2
SUMMARY=$LOGDIR/summary.txt
: > "$SUMMARY"

if [ ! -f Makefile ] || [ ! -x libtool ]; then
  echo "run-sanitizers: run me from the top of a configured build tree" >&2
  exit 2
fi

SAN=${COMPUTE_SANITIZER:-}
if [ -z "$SAN" ]; then
  for c in "$(command -v compute-sanitizer 2>/dev/null)" \
           "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
           /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then SAN=$c; break; fi
  done
fi
if [ -z "$SAN" ]; then
  echo "run-sanitizers: compute-sanitizer not found (set COMPUTE_SANITIZER)" | tee -a "$SUMMARY"
  exit 2
fi

TOOLS=${SAN_TOOLS:-memcheck racecheck}
TESTS=${SAN_TESTS:-t/gpu/gpu_basic t/gpu/gpu_alloc t/gpu/gpu_handback t/gpu/gpu_capture t/gpu/gpu_multidevice t/gpu/gpu_exit}
TIMEOUT=${SAN_TIMEOUT:-120}
DEADLINE=${SAN_DEADLINE:-0}
SCALE=${CUDEFER_TEST_SCALE:-0.1}

# A developer's own CUDEFER_* settings must not change what the tests see.
for v in $(env | sed -n 's/^\(CUDEFER_[A-Za-z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done
export CUDEFER_TEST_SCALE=$SCALE

echo "run-sanitizers: $("$SAN" --version 2>&1 | grep -i version | head -1)" | tee -a "$SUMMARY"
echo "run-sanitizers: CUDEFER_TEST_SCALE=$SCALE, timeout ${TIMEOUT}s per run" | tee -a "$SUMMARY"

# shellcheck disable=SC2086
if ! make -s $TESTS > "$LOGDIR/build.log" 2>&1; then
  echo "run-sanitizers: building the tests failed:" | tee -a "$SUMMARY"
  tail -20 "$LOGDIR/build.log"
  exit 2
fi

# Errors in a log: the sum over its "ERROR SUMMARY: N errors" lines (one per
# tracked process), or, if larger, over racecheck's "RACECHECK SUMMARY: ...
# (N errors, M warnings)" lines.
count_errors() {
  local a b
  a=$(sed -n 's/.*ERROR SUMMARY: *\([0-9][0-9]*\).*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }')
  b=$(sed -n 's/.*RACECHECK SUMMARY:.*(\([0-9][0-9]*\) error.*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }')
  if [ "$a" -ge "$b" ]; then echo "$a"; else echo "$b"; fi
}

all_clean=1
for tool in $TOOLS; do
  for t in $TESTS; do
    name=${t##*/}
    log=$LOGDIR/$tool-$name.log
    limit=$TIMEOUT
    if [ "$DEADLINE" -gt 0 ]; then
      left=$(( DEADLINE - $(date +%s) ))
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    if [ "$limit" -lt 10 ]; then
      line=$(printf '%-9s %-16s SKIPPED (time budget spent)' "$tool" "$name")
      echo "$line" | tee -a "$SUMMARY"
      all_clean=0
      continue
    fi
    start=$(date +%s)
    # shellcheck disable=SC2086
    CUDEFER_TEST_SANITIZER=$tool \
    timeout -k 10 "$limit" ./libtool --mode=execute "$SAN" --tool "$tool" \
      --error-exitcode 99 --target-processes all ${SAN_EXTRA_ARGS:-} \
      "$t" > "$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    errs=$(count_errors "$log")
    summaries=$(grep -c 'ERROR SUMMARY:\|RACECHECK SUMMARY:' "$log")
    api=$(grep -c 'Program hit ' "$log")
    tap_ok=$(grep -c '^ok ' "$log")
    tap_bad=$(grep -c '^not ok ' "$log")
    skipped=""
    grep -q '^1\.\.0 # SKIP' "$log" && skipped=" (test skipped: $(grep -m1 '^1\.\.0 # SKIP' "$log" | sed 's/^1\.\.0 # SKIP *//'))"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      verdict="TIMEOUT after ${limit}s"
    elif [ "$errs" -gt 0 ] || [ "$rc" -eq 99 ]; then
      verdict=SANITIZER-ERRORS
    elif [ "$summaries" -eq 0 ]; then
      verdict=NO-SUMMARY
    elif [ "$rc" -ne 0 ] || [ "$tap_bad" -gt 0 ]; then
      verdict=TEST-FAILED
    else
      verdict=CLEAN
    fi
    [ "$verdict" = CLEAN ] || all_clean=0
    line=$(printf '%-9s %-16s rc=%-3s sanitizer_errors=%-3s api_errors=%-3s tap_ok=%-3s tap_not_ok=%-3s %4ss %s%s' \
      "$tool" "$name" "$rc" "$errs" "$api" "$tap_ok" "$tap_bad" "$secs" "$verdict" "$skipped")
    echo "$line" | tee -a "$SUMMARY"
    if [ "$verdict" != CLEAN ]; then
      # The first reports, to see at once what went wrong.
      grep -m8 '^=========  *\(Invalid\|Program hit\|Error\|Race\|Warning\|ERROR\)\|^not ok\|^Bail out' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
  done
done
[ "$all_clean" -eq 1 ] && echo "run-sanitizers: all CLEAN" | tee -a "$SUMMARY"
[ "$all_clean" -eq 1 ]
