#!/bin/sh
# SPDX-License-Identifier: MIT
# static_symbols.sh: the static libcudefer.a defines no global symbol but
# the API's (defer_*, cudefer_*), as one TAP test.  make check runs it from
# the top of the build tree with NM and OBJCOPY as configure found them;
# the build made the archive's internal symbols local (Makefile.am, "the
# static library").  Skipped without a static archive (--disable-static) or
# without objcopy (the build could not localize them).

archive=src/.libs/libcudefer.a
if [ ! -f "$archive" ]; then
  echo "1..0 # SKIP no static library ($archive; --disable-static?)"
  exit 0
fi
if [ -z "$OBJCOPY" ] || [ "$OBJCOPY" = : ]; then
  echo "1..0 # SKIP no objcopy: the static library keeps its internal symbols"
  exit 0
fi

echo 1..2
# BSD format (libtool's NM is "nm -B"): "ADDRESS TYPE NAME" per symbol.
symbols=$(${NM:-nm} -g --defined-only "$archive" | awk 'NF == 3 { print $3 }')
if [ -z "$symbols" ]; then
  echo "not ok 1 - nm lists the archive's global symbols"
else
  echo "ok 1 - nm lists $(echo "$symbols" | wc -l) global symbols"
fi
stray=$(echo "$symbols" | grep -v -E '^(defer_|cudefer_)')
if [ -z "$stray" ]; then
  echo "ok 2 - every global symbol is defer_* or cudefer_*"
else
  echo "not ok 2 - global symbols without the defer_/cudefer_ prefix:"
  echo "$stray" | sed 's/^/#   /'
fi
