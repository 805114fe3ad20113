#!/usr/bin/env bash
# The test command (README): installs what is missing, then configures,
# builds the library, the examples, the benchmarks and the tests, and runs
# every CTest test. CUDA tests compile; without a GPU they report "skipped"
# and their host halves (--host-only) run. The llama.cpp integration's tests
# run when the pinned llama-cpp-python is already installed
# (scripts/setup_llama_cpp.sh); otherwise they report skipped, loudly.
# The full run, scripts/test_full.sh (what CI runs), installs it first
# (SCISSORHANDS_LLAMA_CPP_INSTALL=1) and adds the hardening stages.
# SCISSORHANDS_BUILD_DIR sets the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh

# --if-installed: prefix of an existing install, never a build.
llama_cpp=()
install=${SCISSORHANDS_LLAMA_CPP_INSTALL:-0}
how=--if-installed
[ "$install" = 1 ] && how=
if prefix=$(SCISSORHANDS_GEMMA=0 SCISSORHANDS_SMOLLM2=0 bash scripts/setup_llama_cpp.sh $how | sed -n 's/^prefix=//p') && [ -n "$prefix" ]; then
  llama_cpp=(-DSCISSORHANDS_LLAMA_CPP_PREFIX="$prefix")
elif [ "$install" = 1 ]; then
  echo "== WARNING: llama-cpp-python==0.3.36 could not be installed: the llama.cpp integration is NOT tested" >&2
else
  echo "== NOTE: llama-cpp-python==0.3.36 is not installed: the llama.cpp integration's tests report skipped" >&2
  echo "==       (bash scripts/setup_llama_cpp.sh installs it, about 3 minutes cold; the full run does)" >&2
fi
echo "== set-up took $((SECONDS - start)) s"

build=${SCISSORHANDS_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
start=$SECONDS
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${llama_cpp[@]}"
cmake --build "$build" -j "$(nproc)"
echo "== build took $((SECONDS - start)) s"
start=$SECONDS
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
echo "== ctest took $((SECONDS - start)) s"
