#!/bin/sh
# SPDX-License-Identifier: MIT
# Every source file of the tree names its licence in an SPDX line within its
# first three lines (LICENSE holds the text).  Build trees and .dist/ (what
# is carried to a GPU machine, ignored by git) are not looked at.
srcdir=${srcdir:-.}
echo "1..1"
missing=$(find "$srcdir" \( -path "$srcdir/build-*" -o -path "$srcdir/build-aux" \
                -o -path "$srcdir/m4" -o -path "$srcdir/bench/results" \
                -o -path "$srcdir/t/gpu/results" -o -path "$srcdir/.git" \
                -o -path "$srcdir/_build" -o -path "$srcdir/cudefer-*" \
                -o -path "$srcdir/.dist" -o -path "$srcdir/python/build" \) -prune -o \
          -type f \( -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \
                -o -name '*.cu' -o -name '*.py' -o -name '*.sh' \) -print |
  while read -r f; do
    head -n 3 "$f" | grep -q 'SPDX-License-Identifier: MIT' || echo "$f"
  done)
if [ -z "$missing" ]; then
  echo "ok 1 - every source file has an SPDX-License-Identifier line"
else
  echo "not ok 1 - without an SPDX-License-Identifier line: $(echo $missing)"
fi
