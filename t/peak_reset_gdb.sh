#!/bin/sh
# SPDX-License-Identifier: MIT
# t/peak_reset_gdb.sh: t/peak_reset_race under gdb (t/peak_reset_race.gdb),
# which stops a peak reset between its read of the bytes and its store of
# the peak and files a block there; its TAP lines are this test's.  "1..0 # SKIP" without
# gdb, or for a sanitizer build (gdb and the sanitizers' own memory maps
# do not mix).
srcdir=${srcdir:-.}
prog=./t/peak_reset_race
command -v gdb >/dev/null 2>&1 || { echo "1..0 # SKIP no gdb"; exit 0; }
if ${NM:-nm} "$prog" 2>/dev/null | grep -qE '__(tsan|asan)_init'; then
  echo "1..0 # SKIP a sanitizer build"
  exit 0
fi
gdb -nx -batch -x "$srcdir/t/peak_reset_race.gdb" "$prog" 2>/dev/null |
  grep -E '^(ok|not ok|1\.\.|#)'
