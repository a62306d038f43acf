#!/bin/sh
# SPDX-License-Identifier: MIT
# make check: bench/test_run.py (bench/run.py's orchestration, statistics,
# table and JSON, with fake programs) as TAP; skipped without python3.
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP no python3"
    exit 0
fi
exec python3 "${srcdir:-.}/bench/test_run.py"
