#!/usr/bin/env bash
# Stage 20: a bounded libFuzzer run of the host harness (tests/fuzz), with
# ASan + UBSan, a fixed seed, from the committed seed corpus. A crash, a
# sanitizer report or a broken invariant fails CI and leaves the input in
# build-fuzz/ci_crashes/ (add it to tests/fuzz/corpus/ once fixed; run it
# with FUZZ_TRACE=1 in the environment to see the program it decodes to).
# SCISSORHANDS_FUZZ_SECONDS sets the budget (default 120),
# SCISSORHANDS_FUZZ_BUILD_DIR the build directory (default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${SCISSORHANDS_FUZZ_BUILD_DIR:-build-fuzz}
seconds=${SCISSORHANDS_FUZZ_SECONDS:-120}
cxx=$(command -v clang++-14 || command -v clang++)
launcher=()
command -v ccache >/dev/null && launcher=(ccache)
mkdir -p "$build"
"${launcher[@]}" "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -fno-omit-frame-pointer -Iinclude tests/fuzz/fuzz_host.cpp -o "$build/fuzz_host"
corpus="$build/ci_corpus"
crashes="$build/ci_crashes"
log="$build/ci_fuzz.log"
rm -rf "$corpus"
mkdir -p "$corpus" "$crashes"
cp tests/fuzz/corpus/* "$corpus/"
export UBSAN_OPTIONS=print_stacktrace=1
if ! "$build/fuzz_host" -seed=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "$corpus" >"$log" 2>&1; then
  tail -n 80 "$log"
  echo "fuzz: FAILED; the input is in $crashes/ (reproduce: $build/fuzz_host <file>)"
  exit 1
fi
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::' "$log"
