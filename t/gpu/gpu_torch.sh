#!/bin/sh
# SPDX-License-Identifier: MIT
# gpu_torch.sh: real PyTorch training under cudefer and under PyTorch's own
# caching allocator must give bitwise identical results (TAP).
#
# make check runs it from the top of the build tree (where src/.libs holds
# the libcudefer just built) with $srcdir naming the source tree (where
# bench/torch_train.py and the cudefer package, python/cudefer, are), so
# VPATH builds
# work; $PYTHON picks the interpreter (python3).  It prints "1..0 # SKIP"
# when that python has no torch or torch sees no CUDA device.
#
#   1-2  ResNet-50 (cnn) and a GPT-like LM (lm), 24 steps each under
#        native and under cudefer: every loss identical bit for bit, and
#        the final weights;
#   3    the --side-stream program (a tensor read on a side stream,
#        protected by record_stream, freed at once, same-size tensors
#        requested and overwritten) on the lm (no torchvision needed):
#        every step's side result identical to native's, and the hook
#        counted record_stream calls that reached cudefer (cudefer.torch);
#   4-5  with 2+ GPUs, cnn and lm under DistributedDataParallel (NCCL, one
#        process per GPU): every rank's losses identical to native's same
#        rank, the final weights identical on every rank and to native's;
#   6    examples/torch_allocator.py runs;
#   7-9  t/gpu/torch_errors.py: out of memory (twice the device) raises
#        torch.OutOfMemoryError and cudefer works on; the same for 1 PiB;
#        enable() after PyTorch made a tensor raises RuntimeError and
#        changes nothing.
# Each training process takes 10-40 s on an H100.  Like the other GPU
# tests it takes the lock file of gpu_tests_serialize, since they count
# device memory.

srcdir=${srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}
train_py=$srcdir/bench/torch_train.py
lib=$top_builddir/src/.libs/libcudefer.so
steps='--steps 20 --warmup 4'

gpus=$("$PYTHON" -c 'import torch
print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
  2>/dev/null) || {
  echo "1..0 # SKIP $PYTHON has no torch"
  exit 0
}
if [ "$gpus" -lt 1 ]; then
  echo "1..0 # SKIP no CUDA device"
  exit 0
fi
if [ ! -f "$lib" ]; then
  echo "Bail out! $lib not built"
  exit 1
fi
if [ ! -f "$train_py" ]; then
  echo "Bail out! $train_py not found (srcdir=$srcdir)"
  exit 1
fi

lock=${TMPDIR:-/tmp}/cudefer-gpu-tests.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$lock" && flock 9
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/cudefer-torch.XXXXXX") || exit 99
trap 'rm -rf "$out"' EXIT
# cudefer.torch's compiled allocator goes here, not into $HOME.
TORCH_EXTENSIONS_DIR=$out/ext
export TORCH_EXTENSIONS_DIR
unset CUDEFER_LIB PYTORCH_CUDA_ALLOC_CONF

# train NAME ARGS...: run torch_train.py; its JSON goes to $out/NAME.json,
# its output to $out/NAME.log.  Returns its exit status.
train() {
  name=$1
  shift
  "$PYTHON" "$train_py" --lib "$lib" "$@" > "$out/$name.out" 2> "$out/$name.log" 9>&-
  rc=$?
  tail -n 1 "$out/$name.out" > "$out/$name.json"
  return $rc
}

# compare WHAT REF RUN: exit 0 when runs REF and RUN agree on WHAT
# (losses, weights, side, ranks); explains differences as TAP comments.
compare() {
  "$PYTHON" - "$out/$2.json" "$out/$3.json" "$1" <<'EOF'
import json, sys
def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError) as e:
        print("# no result in %s (%s)" % (path, e))
        sys.exit(1)
ref, run, what = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
def differ(key):
    a, b = ref.get(key), run.get(key)
    if a is None or b is None:
        print("# %s missing (%r vs %r)" % (key, a is None, b is None))
        return True
    if isinstance(a, list):
        bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        if len(a) != len(b) or bad:
            print("# %s: %d of %d entries differ (first at %s): %s vs %s" % (
                key, len(bad) + abs(len(a) - len(b)), max(len(a), len(b)),
                bad[:1], a[bad[0]] if bad else "-", b[bad[0]] if bad else "-"))
            return True
        return False
    if a != b:
        print("# %s: %s vs %s" % (key, a, b))
        return True
    return False
failed = False
if what == "losses":
    failed = differ("losses") | differ("weights_sha256")
elif what == "side":
    failed = differ("side_sha256") | differ("losses")
    # Counted by cudefer.torch as they reach cudefer (the installed flag
    # alone said nothing of the calls).
    calls = run.get("record_stream_recorded")
    print("# record_stream calls that reached cudefer: %s" % calls)
    if run.get("record_stream_reaches_allocator") is not True or not calls:
        print("# record_stream does not reach cudefer")
        failed = True
elif what == "ranks":
    # Every rank's losses (rank 0's alone could hide a difference on
    # another rank), and the final weights.
    failed = differ("losses") | differ("losses_sha256_ranks") | \
        differ("weights_sha256")
    for r in (ref, run):
        if r.get("weights_identical_across_ranks") is not True:
            print("# %s: final weights differ between ranks: %s" % (
                r.get("allocator"), r.get("weights_sha256_ranks")))
            failed = True
for r in (ref, run):
    print("# %s: %.2f ms/step, peak %s MiB (%s)" % (
        r.get("allocator"), r.get("ms_per_step", 0), r.get("peak_mib"),
        r.get("peak_source")))
sys.exit(1 if failed else 0)
EOF
}

n=0
# check DESC WHAT MODEL ARGS...: one TAP line for native against cudefer.
check() {
  desc=$1 what=$2 model=$3
  shift 3
  n=$((n + 1))
  if [ "$model" = cnn ] && ! "$PYTHON" -c 'import torchvision' 2>/dev/null; then
    echo "ok $n - $desc # SKIP $PYTHON has no torchvision"
    return
  fi
  # shellcheck disable=SC2086 # $steps is words
  if ! train "$n-native" --model "$model" --allocator native $steps "$@"; then
    echo "not ok $n - $desc (native run failed)"
    tail -n 20 "$out/$n-native.log" | sed 's/^/# /'
    return
  fi
  # shellcheck disable=SC2086
  if ! train "$n-cudefer" --model "$model" --allocator cudefer $steps "$@"; then
    echo "not ok $n - $desc (cudefer run failed)"
    tail -n 20 "$out/$n-cudefer.log" | sed 's/^/# /'
    return
  fi
  if compare "$what" "$n-native" "$n-cudefer" > "$out/$n.cmp"; then
    echo "ok $n - $desc"
  else
    echo "not ok $n - $desc"
  fi
  cat "$out/$n.cmp"
}

echo "1..9"
check "cnn: losses and weights under cudefer identical to native" losses cnn
check "lm: losses and weights under cudefer identical to native" losses lm
check "side stream + record_stream: side results identical to native" side \
  lm --side-stream
if [ "$gpus" -ge 2 ]; then
  check "cnn DDP on $gpus GPUs: identical to native, on every rank" ranks \
    cnn --ddp
  check "lm DDP on $gpus GPUs: identical to native, on every rank" ranks \
    lm --ddp
else
  echo "ok 4 - cnn DDP # SKIP fewer than 2 GPUs"
  echo "ok 5 - lm DDP # SKIP fewer than 2 GPUs"
fi
# The README's example runs.
if CUDEFER_LIB=$lib "$PYTHON" "$srcdir/examples/torch_allocator.py" \
     > "$out/example.log" 2>&1 9>&-; then
  echo "ok 6 - examples/torch_allocator.py"
else
  echo "not ok 6 - examples/torch_allocator.py"
fi
sed 's/^/# /' "$out/example.log"
n=6
for case in "oom:out of memory raises torch.OutOfMemoryError, cudefer works on" \
            "huge:1 PiB raises torch.OutOfMemoryError too" \
            "late:enable() after a CUDA tensor raises RuntimeError, nothing changed"; do
  n=$((n + 1))
  CUDEFER_LIB=$lib "$PYTHON" "$srcdir/t/gpu/torch_errors.py" "${case%%:*}" \
    > "$out/errors-$n.log" 2>&1 9>&-
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok $n - ${case#*:}"
  else
    echo "not ok $n - ${case#*:} (exit status $rc$([ $rc -gt 128 ] &&
      echo ", signal $((rc - 128))"))"
  fi
  sed 's/^/# /' "$out/errors-$n.log"
done
# GPU_TORCH_KEEP=DIR keeps every run's JSON and stderr there.
if [ -n "${GPU_TORCH_KEEP:-}" ]; then
  mkdir -p "$GPU_TORCH_KEEP" && cp "$out"/*.json "$out"/*.log "$GPU_TORCH_KEEP"/
fi
exit 0
