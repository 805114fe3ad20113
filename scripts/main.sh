#!/usr/bin/env bash
# The main job: build the llama example and run `evaluate` on each of the
# three models of ../shared/models (stories260K, tinystories656k,
# babyllama105), under both protocols: decode (one token a step, compress
# at B) and prefill:50% (half the text prefilled, compressed once to B, the
# rest teacher-forced). Per model it prints the tables and writes
# results/llama_nll_<model>.csv and results/llama_nll_<model>.png (one
# panel per protocol); results/llama_nll.csv holds every model's rows.
#
# Each model runs its default grid: 16 texts of min(500, trained context)
# tokens, budgets 3.125, 6.25, 12.5, 25 and 50% of that length. Extra
# arguments go to every model's `scissorhands_llama evaluate` (e.g.
# --samples 4); options that depend on the model (a --length beyond a
# model's context) are refused for that model. $SCISSORHANDS_MODEL=PATH
# runs that one model only; $SCISSORHANDS_MODELS_DIR changes where the
# three are looked for; $SCISSORHANDS_BUILD_DIR the build folder (build).
# Then the quantized caches (scripts/quantization.sh with 2 groups of texts:
# quantization alone, eviction alone, both; the compounding check).
# Eviction granularity (per head / shared heads / shared layers) has its own
# longer run: scripts/granularity.sh (docs/granularity.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

source scripts/build_llama.sh  # sets bin, creates results/

find_models main.sh
if [ ${#models[@]} -eq 0 ]; then
  # No model at all: the CLI explains how to get one and runs its synthetic demo.
  "$bin" evaluate --csv results/llama_nll.csv --plot results/llama_nll.png "$@"
  exit 0
fi

start=$SECONDS
# results/llama_nll.csv: all models in one CSV (the `model` column tells them apart).
evaluate_models llama_nll "$@"
# The README's summary table and docs/llama.md's per-model tables.
if command -v python3 >/dev/null; then
  python3 scripts/readme_table.py results/llama_nll.csv > results/readme_table.md
  python3 scripts/readme_table.py --docs results/llama_nll.csv > results/llama_tables.md
  cat results/readme_table.md
fi
echo
echo "main.sh: ${#csvs[@]} model(s) in $((SECONDS - start)) s; results/llama_nll.csv holds every row, results/llama_nll_<model>.png the plots, results/readme_table.md the README's table"
# The quantized configurations (--kv-bits 16, 8, 4 alone and with the
# default policy's budgets; docs/quantization.md): 2 groups of 8 texts per
# model here (docs/quantization.md used 8 groups: QUANT_GROUPS=8).
echo
echo "=================== quantized caches ==================="
QUANT_GROUPS=${QUANT_GROUPS:-2} bash scripts/quantization.sh
echo "main.sh: done in $((SECONDS - start)) s; results/quantization_tables.md has the quantized configurations and the compounding check"
