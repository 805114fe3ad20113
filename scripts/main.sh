#!/usr/bin/env bash
# The main job: build the llama example and run `evaluate` on the default
# model (../shared/models/stories260K.gguf, or $SCISSORHANDS_MODEL) with the
# default grid of policies and budgets. Prints the table; writes
# results/llama_nll.csv and results/llama_nll.png. Extra arguments go to
# `scissorhands_llama evaluate` (e.g. --samples 4 --budgets 32,64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

build=${SCISSORHANDS_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target scissorhands_llama
mkdir -p results
./"$build"/examples/llama/scissorhands_llama evaluate \
  --csv results/llama_nll.csv --plot results/llama_nll.png "$@"
