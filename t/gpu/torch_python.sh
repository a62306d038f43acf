#!/bin/sh
# SPDX-License-Identifier: MIT
# torch_python.sh: the cudefer Python package on a GPU, as TAP.
#   t/gpu/torch_full.py  every memory call of a training script, a CUDA
#                        graph, torch.compile(mode="reduce-overhead"), a
#                        memory fraction, memory freed while a side
#                        stream reads it and a fork child's CUDA tensor
#                        under PyTorch's allocator and under
#                        cudefer.torch.enable(), compared;
#   t/gpu/torch_pools.py a MemPool's tensors read on a side stream
#                        (Tensor.record_stream) and freed outside and
#                        inside use_mem_pool and by a return to a
#                        checkpoint, under both, compared;
#   t/gpu/torch_cupy.py  PyTorch and CuPy on one cudefer pool (DLPack both
#                        ways), compared with each library's own allocator;
#   t/gpu/torch_history.py  memory history (_record_memory_history,
#                        _snapshot, _dump_snapshot, _memory_viz; a return
#                        to a pool's checkpoint), the same checks under
#                        PyTorch's allocator and under cudefer.
# Each runs its workload under both allocators, a process each, and compares
# (t/gpu/side_by_side.py).  Each PASS/FAIL line of theirs is a TAP line.  make check runs it from the
# top of the build tree (src/.libs holds the library just built) with
# $srcdir naming the source tree; $PYTHON picks the interpreter (python3).
# "1..0 # SKIP" when that python has no torch or torch sees no GPU; the
# CuPy part is skipped without cupy.  The allocator is compiled into a
# temporary TORCH_EXTENSIONS_DIR (about 15 s).
srcdir=${srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}
lib=$top_builddir/src/.libs/libcudefer.so

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
[ -f "$lib" ] || { echo "Bail out! $lib not built"; exit 1; }
lock=${TMPDIR:-/tmp}/cudefer-gpu-tests.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$lock" && flock 9
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/cudefer-python.XXXXXX") || exit 99
trap 'rm -rf "$out"' EXIT
TORCH_EXTENSIONS_DIR=$out/ext
PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR PYTHONUNBUFFERED
unset CUDEFER_LIB PYTORCH_CUDA_ALLOC_CONF

for script in torch_full torch_pools torch_cupy torch_history; do
  "$PYTHON" "$srcdir/t/gpu/$script.py" --lib "$lib" > "$out/$script.log" 2>&1 9>&-
  echo "rc $?" >> "$out/$script.log"
done
# PASS/FAIL lines become ok/not ok; everything else is a comment.
awk '
  /^PASS / { n++; sub(/^PASS /, ""); print "ok " n " - " $0; next }
  /^FAIL / { n++; sub(/^FAIL /, ""); print "not ok " n " - " $0; next }
  /^SKIP / { n++; sub(/^SKIP /, ""); print "ok " n " # SKIP " $0; next }
  /^rc 77$/ { next }
  /^rc [0-9]+$/ { if ($2 != 0 && $2 != 1) { n++; print "not ok " n " - " FILENAME " exited " $2 } next }
  { print "# " $0 }
  END { print "1.." n }' "$out/torch_full.log" "$out/torch_pools.log" \
  "$out/torch_cupy.log" "$out/torch_history.log"
