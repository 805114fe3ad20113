#!/usr/bin/env bash
# KV quantization composed with eviction on the three models of
# ../shared/models (docs/quantization.md): NLL against the total KV memory
# held (K/V values or codes + quantization parameters + the library's
# state) for
#   (a) quantization alone: --kv-bits 16, 8, 4 with the full cache;
#   (b) eviction alone: the library's default policy (scissorhands) on the
#       fp32 cache at 3.125, 6.25, 12.5, 25 and 50% of the text;
#   (c) both: --kv-bits 16, 8 and 4 at the same budgets;
# and the paper's claim that eviction composes with 4-bit quantization with
# no compounding error: per model, format and budget, ΔNLL(quant + evict)
# against ΔNLL(quant) + ΔNLL(evict), every Δ against the full fp32 cache on
# the same texts.
#
# Texts: $QUANT_GROUPS groups (default 8) of $QUANT_SAMPLES texts (default
# 8) sampled from the full fp32 model, min(500, trained context) tokens each
# (64 texts per model); group g uses seeds 1 + (g - 1) * QUANT_SAMPLES ...,
# so every configuration sees the same texts, and the spread of the groups
# gives each Δ and each compounding excess a standard error. About 6 minutes
# on 2 idle cores with the defaults.
#
# Writes results/quantization/<model>_kv<bits>_g<group>.csv (the evaluate
# CSVs), then (scripts/quantization_summary.py) results/quantization.csv
# (one row per model, format, policy and budget: memory, NLL, ΔNLL and its
# standard error, whether it is on the memory/NLL frontier),
# results/quantization_compounding.csv, results/quantization_tables.md
# (docs/quantization.md's tables) and results/quantization_nll.png (a panel
# per model, via gnuplot). `bash scripts/quantization.sh --summary` redoes
# those from the CSVs already under results/quantization/ without running
# anything.
#
# $QUANT_POLICIES (default "scissorhands"; "scissorhands h2o" adds H2O, the
# other policy a quantized cache runs), $QUANT_BITS (default "32 16 8 4"),
# $SCISSORHANDS_MODEL (one model), $SCISSORHANDS_MODELS_DIR and
# $SCISSORHANDS_BUILD_DIR as for scripts/main.sh. Extra arguments go to
# every `scissorhands_llama evaluate` (e.g. --protocol decode prefill:50%,
# or --kv-group 4).
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/quantization

if [ "${1:-}" = "--summary" ]; then
  python3 scripts/quantization_summary.py "$out"
  exit 0
fi

source scripts/build_llama.sh  # sets bin, creates results/
mkdir -p "$out"
groups=${QUANT_GROUPS:-8}
samples=${QUANT_SAMPLES:-8}
read -r -a policies <<< "${QUANT_POLICIES:-scissorhands}"
read -r -a bit_list <<< "${QUANT_BITS:-32 16 8 4}"
threads=$(nproc)

find_models quantization.sh
[ ${#models[@]} -gt 0 ] || { echo "quantization.sh: no model found" >&2; exit 1; }

start=$SECONDS
for model in "${models[@]}"; do
  name=$(basename "$model" .gguf)
  t0=$SECONDS
  for bits in "${bit_list[@]}"; do
    for ((g = 1; g <= groups; g++)); do
      seed=$((1 + (g - 1) * samples))
      csv="$out/${name}_kv${bits}_g$g.csv"
      # Only the fp32 reference line and the progress go to the terminal.
      "$bin" --model "$model" --threads "$threads" --kv-bits "$bits" evaluate --policies "${policies[@]}" \
        --budgets 3.125%,6.25%,12.5%,25%,50% --samples "$samples" --sample-seed "$seed" --no-plot --csv "$csv" \
        "$@" > "$out/${name}_kv${bits}_g$g.out" 2>&1 ||
        { echo "quantization.sh: $name --kv-bits $bits group $g failed:" >&2; tail -5 "$out/${name}_kv${bits}_g$g.out" >&2; exit 1; }
    done
    echo "$name --kv-bits $bits: $groups groups of $samples texts done ($((SECONDS - t0)) s)"
  done
done
echo "quantization.sh: runs took $((SECONDS - start)) s"
python3 scripts/quantization_summary.py "$out"
