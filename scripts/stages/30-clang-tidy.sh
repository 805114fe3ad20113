#!/usr/bin/env bash
# Stage 30: clang-tidy on the host headers, through tests/static/tidy_tu.cpp
# (which instantiates every entry point and policy), with the checks in
# .clang-tidy. Every warning is an error (WarningsAsErrors): any fails CI.
# Twice: for the default x86-64 ISA and for x86-64-v3, since observe's dot
# products take a different path with AVX.
set -euo pipefail
cd "$(dirname "$0")/../.."
tidy=$(command -v clang-tidy-14 || command -v clang-tidy)
for isa in x86-64 x86-64-v3; do
  rc=0
  out=$("$tidy" --quiet tests/static/tidy_tu.cpp -- -std=c++20 -march="$isa" -I"$PWD/include" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v ' warnings generated\.$' || true
  if [ "$rc" -ne 0 ]; then
    echo "clang-tidy ($isa): FAILED (fix the header, or justify a check change in .clang-tidy and docs/hardening.md)"
    exit "$rc"
  fi
  echo "clang-tidy ($isa): clean"
done
