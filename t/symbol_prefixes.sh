#!/bin/sh
# SPDX-License-Identifier: MIT
# symbol_prefixes.sh: every function a library source file exports (src/X.c)
# starts with the file's name (X_...), so a reader finds a function from its
# name; the public API (defer_*, cudefer_*) is exempt.  One TAP test per
# object of the library.  make check runs it from the top of the build tree
# with NM as configure found it.  Skipped when no object is found.

objects=$(ls src/.libs/libcudefer_la-*.o 2>/dev/null ||
          ls src/libcudefer_la-*.o 2>/dev/null)
if [ -z "$objects" ]; then
  echo "1..0 # SKIP no object of the library under src/"
  exit 0
fi

echo "1..$(echo "$objects" | wc -l)"
n=0
for o in $objects; do
  n=$((n + 1))
  file=${o##*/libcudefer_la-}
  file=${file%.o}
  # BSD format (libtool's NM is "nm -B"): "ADDRESS TYPE NAME"; T: a function.
  stray=$(${NM:-nm} -g --defined-only "$o" |
          awk -v f="$file" 'NF == 3 && $2 == "T" &&
                            $3 != f && index($3, f "_") != 1 &&
                            $3 !~ /^(defer_|cudefer_)/ {
                              print $3 }')
  if [ -z "$stray" ]; then
    echo "ok $n - src/$file.c exports only ${file}_* and API functions"
  else
    echo "not ok $n - src/$file.c exports functions without its name:"
    echo "$stray" | sed 's/^/#   /'
  fi
done
