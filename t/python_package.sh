#!/bin/sh
# SPDX-License-Identifier: MIT
# make check: t/python_package.py (the cudefer Python package's errors with
# a fake torch and cupy) as TAP, on the library just built; skipped
# without python3.
if ! command -v python3 >/dev/null 2>&1; then
  echo "1..0 # SKIP no python3"
  exit 0
fi
exec python3 "${srcdir:-.}/t/python_package.py" \
  "${top_builddir:-.}/src/.libs/libcudefer.so"
