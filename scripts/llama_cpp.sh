#!/usr/bin/env bash
# The llama.cpp integration on Gemma 3 270M (docs/llama_cpp.md), flash
# attention as llama.cpp defaults it (on) unless said: installs what it
# needs (scripts/setup_llama_cpp.sh), builds scissorhands_llamacpp, then
#   - the reads-only check (logits bit for bit with and without the glue),
#     flash attention on and off,
#   - the flash-attention path's observation against llama.cpp's
#     probabilities of the same queries and keys (agree),
#   - several sequences: five texts in four sequences of one context
#     against each text alone, one stream per sequence and a unified cache
#     (interleave),
#   - bounded memory: n_ctx = 256 cells, 4,000 tokens generated,
#   - speed: decode tokens/s with and without eviction, 1 and 2 threads,
#   - the quality grid: 8 texts of 2,000 tokens (six licence texts of
#     /usr/share/common-licenses, two sampled from the model), the full
#     cache, llama.cpp's context shift and six presets at 6.25-50% of the
#     text, decode and prefill protocols, 32 tokens per llama_decode;
#   - the default preset scored from the global layers only (--scores global).
# Writes results/llama_cpp_*.{txt,csv,png}. About 85 minutes on 2 cores.
# SCISSORHANDS_LLAMA_CPP_QUICK=1: one text of 600 tokens, two budgets (a few
# minutes); SCISSORHANDS_THREADS (default 2); SCISSORHANDS_FLASH_ATTN (auto,
# llama.cpp's default: on) for generate, speed and the grids (the grid of
# docs/llama_cpp.md was measured with off, which reproduces it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llama_cpp_build.sh  # sets bin and gemma
threads=${SCISSORHANDS_THREADS:-2}
flash=${SCISSORHANDS_FLASH_ATTN:-auto}
mkdir -p results
licences=/usr/share/common-licenses
texts=("$licences/GPL-1" "$licences/GPL-2" "$licences/GPL-3" "$licences/LGPL-2.1" "$licences/MPL-1.1" "$licences/MPL-2.0")
grid=(--length 2000 --samples 2 --budgets 6.25 12.5 25 50)
if [ "${SCISSORHANDS_LLAMA_CPP_QUICK:-0}" = 1 ]; then
  texts=("$licences/GPL-3"); grid=(--length 600 --samples 0 --budgets 12.5 50)
fi
SECONDS=0
for reads in auto off; do
  "$bin" check-reads --model "$gemma" --text "$licences/GPL-3" --length 1100 --chunk 128 --threads "$threads" \
    --flash-attn "$reads"
done | tee results/llama_cpp_check_reads.txt
"$bin" agree --model "$gemma" --text "$licences/GPL-3" --length 2000 --budgets 125 500 --chunk 32 --threads "$threads" \
  | tee results/llama_cpp_agree.txt
# One stream per sequence: llama.cpp computes each text as alone (bit for
# bit); a unified cache: within 1e-4 with flash attention off; with it on,
# llama.cpp's kernel accumulates V in f16 in cell order, which eviction
# changes (docs/llama_cpp.md, "Several sequences"): TOVA's choices, within 1e-3.
interleave=(interleave --model "$gemma" --text "$licences/GPL-3" "$licences/GPL-2" "$licences/LGPL-2.1"
            "$licences/MPL-2.0" "$licences/Apache-2.0" --length 1000 --budget 250 --chunk 32 --sequences 4
            --threads "$threads")
{
  "$bin" "${interleave[@]}" --cache streams --tolerance 0
  "$bin" "${interleave[@]}" --cache both --flash-attn off --tolerance 1e-4
  "$bin" "${interleave[@]}" --cache unified --policy tova --tolerance 1e-3
} | tee results/llama_cpp_interleave.txt
"$bin" generate --model "$gemma" --ctx 256 -n 4000 --threads "$threads" --flash-attn "$flash" \
  --prompt "The history of the printing press begins" | tee results/llama_cpp_generate.txt | tail -n 1
for t in 1 2; do
  "$bin" speed --model "$gemma" --text "$licences/GPL-3" --budget 1024 -n 256 --threads "$t" --flash-attn "$flash"
done | tee results/llama_cpp_speed.txt
for protocol in decode prefill; do
  "$bin" evaluate --model "$gemma" --text "${texts[@]}" "${grid[@]}" --protocol "$protocol" --chunk 32 \
    --threads "$threads" --flash-attn "$flash" --csv "results/llama_cpp_gemma_$protocol.csv" | tee "results/llama_cpp_gemma_$protocol.txt"
done
# What the sliding-window layers add to the score: the default preset
# observing the three global layers only, on the same texts.
for protocol in decode prefill; do
  "$bin" evaluate --model "$gemma" --text "${texts[@]}" "${grid[@]}" --protocol "$protocol" --chunk 32 \
    --threads "$threads" --flash-attn "$flash" --policies scissorhands --scores global \
    --csv "results/llama_cpp_gemma_${protocol}_global.csv" | tee "results/llama_cpp_gemma_${protocol}_global.txt"
done
if command -v gnuplot >/dev/null; then
  python3 scripts/llama_cpp_plot.py results/llama_cpp_gemma_decode.csv results/llama_cpp_gemma_prefill.csv \
    results/llama_cpp_gemma.png
fi
echo "scripts/llama_cpp.sh: $SECONDS s"
