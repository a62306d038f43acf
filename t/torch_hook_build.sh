#!/bin/sh
# SPDX-License-Identifier: MIT
# make check: t/torch_hook_build.py (the PyTorch hook's choice of C++
# compiler, without PyTorch) as TAP; skipped without python3.
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP no python3"
    exit 0
fi
exec python3 "${srcdir:-.}/t/torch_hook_build.py"
