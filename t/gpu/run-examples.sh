#!/bin/sh
# SPDX-License-Identifier: MIT
# run-examples.sh: the examples on a GPU, as one TAP test.  make check runs
# it from the top of the build tree, where the examples were built; each
# runs with a short iteration count and must exit 0.  Without a CUDA device
# the first example (the demo, always built with nvcc) exits 1 saying "no
# CUDA device found", and the script prints "1..0 # SKIP no CUDA device"
# without running the others.  An example that was not built (no C++
# compiler) is reported as skipped.  The examples take turns with the GPU
# tests (the lock file of gpu_tests_serialize), since those count device
# memory.

# name and arguments of each example
examples='demo -n 200
streams -n 200
quickstart
cpp_raii -n 200
graph_capture -n 5'

lock=${TMPDIR:-/tmp}/cudefer-gpu-tests.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$lock" && flock 9
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/cudefer-examples.XXXXXX") || exit 99
trap 'rm -rf "$out"' EXIT

n=0 ran=0
while read -r name args; do
  n=$((n + 1))
  prog=./examples/$name
  if [ ! -x "$prog" ]; then
    echo skipped > "$out/$n.status"
    continue
  fi
  ran=$((ran + 1))
  # shellcheck disable=SC2086 # args are words
  "$prog" $args > "$out/$n.log" 2>&1 9>&-
  rc=$?
  echo "$rc" > "$out/$n.status"
  if [ "$ran" -eq 1 ] && [ "$rc" -eq 1 ] &&
     grep -q 'no CUDA device found' "$out/$n.log"; then
    echo "1..0 # SKIP no CUDA device"
    exit 0
  fi
done <<EOF
$examples
EOF

echo "1..$n"
i=0
while read -r name args; do
  i=$((i + 1))
  status=$(cat "$out/$i.status")
  if [ "$status" = skipped ]; then
    echo "ok $i - $name # SKIP not built"
    continue
  fi
  if [ "$status" -eq 0 ]; then
    echo "ok $i - $name $args"
  else
    echo "not ok $i - $name $args (exit status $status)"
  fi
  sed 's/^/# /' "$out/$i.log"
done <<EOF
$examples
EOF
exit 0
