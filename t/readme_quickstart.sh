#!/bin/sh
# SPDX-License-Identifier: MIT
# readme_quickstart.sh: the C quick start that README.md prints is
# examples/quickstart.c line for line, so the program a reader copies is
# the one make builds (and t/gpu/run-examples.sh runs on a GPU).
srcdir=${srcdir:-.}
readme=$srcdir/README.md
example=$srcdir/examples/quickstart.c

printed=$(mktemp "${TMPDIR:-/tmp}/cudefer-quickstart.XXXXXX") || exit 99
trap 'rm -f "$printed"' EXIT
# The first ```c block after the "## Quick start" heading.
awk '/^## Quick start/ { inside = 1; next }
     inside && !block && /^```c$/ { block = 1; next }
     block && /^```$/ { exit }
     block { print }' "$readme" > "$printed"

echo "1..2"
if [ -s "$printed" ]; then
  echo "ok 1 - README.md has a C block under its Quick start heading"
else
  echo "not ok 1 - README.md has a C block under its Quick start heading"
fi
if cmp -s "$printed" "$example"; then
  echo "ok 2 - README.md's quick start is examples/quickstart.c"
else
  echo "not ok 2 - README.md's quick start is examples/quickstart.c"
  diff -u "$example" "$printed" | sed 's/^/# /'
fi
