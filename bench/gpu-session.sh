#!/bin/bash
# SPDX-License-Identifier: MIT
# gpu-session.sh OUTDIR: the GPU measurements the open issues wait for, in
# stages, each leaving few files in OUTDIR (a device machine returns at most
# eight).  Run it from the top of a built tree (the unpacked tarball, after
# ./configure && make), e.g.
#   tar xzf cudefer-0.2.0.tar.gz && cd cudefer-0.2.0 && ./configure -q &&
#     make -j16 all bench && STAGES="check micro" bash bench/gpu-session.sh $OUT
# Stages (STAGES, default "check micro train trace side"; each fits in a
# 10-minute command on an H100 alone, not all together):
#   check  make check (the GPU suite: gpu_handback, gpu_torch.sh, ...)
#          -> check.txt (the summary and every failing test's log)
#   micro  bench/run.py W1-W6 and W5-parts, 3 repetitions
#          -> micro.jsonl, micro.txt (the table; stderr after it)
#   train  bench/run.py train-cnn and train-lm, REPS repetitions (3)
#          -> train.jsonl, train.txt
#   trace  allocation traces of both models for bench/replay-trace
#          -> traces.tar.gz (cnn.trace, lm.trace)
#   side   the record_stream side-stream program under native and cudefer
#          -> side.txt (ms/step, peak, and whether the results match)
#   errors (not by default) out of memory and refusals, quickly: t/gpu/gpu_alloc
#          and t/gpu/torch_errors.py's cases (oom, huge, late), each with
#          its exit status -> errors.txt
#   ddp    (not by default: two GPUs) train-cnn-ddp and train-lm-ddp with
#          the pluggable-floor bound beside cudefer, REPS repetitions
#          -> ddp.jsonl, ddp.txt
# TRAIN_ARGS: more bench/run.py options for the train and ddp stages, e.g.
#   TRAIN_ARGS="--time-calls --variant cudefer-poll1ms=CUDEFER_POLL_US=1000"
#   (whether the reclaimer's event queries slow the launching thread), or
#   TRAIN_ARGS="--cpus 2-5" (every run pinned to the same CPUs).
# Exit status 0 when every stage asked for succeeded.
set -u

OUT=${1:?usage: gpu-session.sh OUTDIR}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
STAGES=${STAGES:-check micro train trace side}
REPS=${REPS:-3}
TRAIN_ARGS=${TRAIN_ARGS:-}
JOBS=$(nproc 2>/dev/null || echo 4)
PY=${PYTHON:-python3}
BENCH=$(cd "$(dirname "$0")" && pwd) # run.py, torch_train.py (also VPATH)
LIB=$PWD/src/.libs/libcudefer.so
export PYTHONUNBUFFERED=1
status=0

want() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
stage() { echo "gpu-session: $1 ($(date -u +%H:%M:%S))" >&2; }
failed() { echo "gpu-session: stage $1 FAILED" >&2; status=1; }

[ -f Makefile ] && [ -f "$LIB" ] ||
  { echo "gpu-session: run it from a configured and built tree" >&2; exit 2; }

if want check; then
  stage check
  make -j"$JOBS" check > "$OUT/check.log" 2>&1 || failed check
  { grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR)' "$OUT/check.log"
    # the GPU suite's own lines: which tests skipped, and why
    grep -HE '^(ok|not ok|1\.\.)' t/gpu/*.log 2>/dev/null | grep -iE 'skip|1\.\.0|record_stream'
    for log in $(grep -lE '^(not ok|FAIL)' t/*.log t/gpu/*.log 2>/dev/null); do
      echo "== $log"; cat "$log"; done; } > "$OUT/check.txt"
  rm -f "$OUT/check.log"
fi
if want micro; then
  stage micro
  "$PY" "$BENCH/run.py" --workloads W1,W2,W3,W4,W5,W5-parts,W6 --reps 3 \
    --json "$OUT/micro.jsonl" > "$OUT/micro.txt" 2> "$OUT/micro.err" ||
    failed micro
  cat "$OUT/micro.err" >> "$OUT/micro.txt"; rm -f "$OUT/micro.err"
fi
if want train; then
  stage train
  # shellcheck disable=SC2086 # TRAIN_ARGS: words
  "$PY" "$BENCH/run.py" --workloads train-cnn,train-lm --reps "$REPS" \
    $TRAIN_ARGS --torch-lib "$LIB" --json "$OUT/train.jsonl" > "$OUT/train.txt" \
    2> "$OUT/train.err" || failed train
  cat "$OUT/train.err" >> "$OUT/train.txt"; rm -f "$OUT/train.err"
fi
if want errors; then
  stage errors
  { make t/gpu/gpu_alloc >/dev/null 2>&1 && ./t/gpu/gpu_alloc 2>&1
    echo "gpu_alloc: exit status $?"
    for c in oom huge late; do
      CUDEFER_LIB=$LIB TORCH_EXTENSIONS_DIR=$(mktemp -d) \
        "$PY" "$BENCH/../t/gpu/torch_errors.py" $c 2>&1 | tail -n 20
      echo "torch_errors.py $c: exit status ${PIPESTATUS[0]}"
    done; } > "$OUT/errors.txt" 2>&1
  grep -qE "exit status [1-9]|^not ok" "$OUT/errors.txt" && failed errors
fi
if want ddp; then
  stage ddp
  "$PY" "$BENCH/run.py" --workloads train-cnn-ddp,train-lm-ddp --reps "$REPS" \
    --strategies native,pluggable-floor,pluggable-async,cudefer $TRAIN_ARGS \
    --torch-lib "$LIB" --json "$OUT/ddp.jsonl" > "$OUT/ddp.txt" \
    2> "$OUT/ddp.err" || failed ddp
  cat "$OUT/ddp.err" >> "$OUT/ddp.txt"; rm -f "$OUT/ddp.err"
fi
if want trace; then
  stage trace
  dir=$(mktemp -d)
  for m in cnn lm; do
    "$PY" "$BENCH/torch_train.py" --model $m --allocator cudefer-trace \
      --trace "$dir/$m.trace" --lib "$LIB" --steps 20 --warmup 5 \
      > "$dir/$m.json" 2> "$dir/$m.err" || { failed "trace $m"; tail "$dir/$m.err" >&2; }
  done
  tar czf "$OUT/traces.tar.gz" -C "$dir" . && rm -rf "$dir"
fi
if want side; then
  stage side
  for a in native cudefer; do
    "$PY" "$BENCH/torch_train.py" --model cnn --allocator $a --side-stream \
      --lib "$LIB" --steps 20 --warmup 5 2> /dev/null | tail -1
  done > "$OUT/side.jsonl" || failed side
  "$PY" - "$OUT/side.jsonl" > "$OUT/side.txt" <<'EOF' || failed side
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
native = next(r for r in rows if r["allocator"] == "native")
for r in rows:
    same = sum(a == b for a, b in zip(r["side_sha256"], native["side_sha256"]))
    print("%-8s %7.2f ms/step  peak %6.0f MiB (%.3fx native)  side results "
          "equal to native's in %d of %d steps" % (
              r["allocator"], r["ms_per_step"], r["peak_mib"] or -1,
              (r["peak_mib"] or 0) / native["peak_mib"], same,
              len(native["side_sha256"])))
EOF
  rm -f "$OUT/side.jsonl"
fi
exit $status
