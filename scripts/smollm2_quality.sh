#!/usr/bin/env bash
# SmolLM2-135M-Instruct through stock llama.cpp (docs/quality.md,
# "SmolLM2-135M-Instruct"): grouped-query attention in every layer (9 query
# / 3 KV heads), no sliding window, flash attention on (llama.cpp's
# default). The reads-only check (every logit bit for bit, flash attention
# on and off), then the decode grid on 16 texts of 2,000 tokens (the twelve
# real texts scripts/gemma_quality.sh uses, four sampled from the model,
# seeds 1-4), 32 tokens per llama_decode: the default against the full
# cache, StreamingLLM, TOVA, H2O and llama.cpp's context shift at 6.25 /
# 12.5 / 25 / 50% of the text, per-text sums for paired intervals. Writes
# results/smollm2_*. SCISSORHANDS_JOBS texts at once (default: one per
# core), SCISSORHANDS_THREADS llama.cpp threads each (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llama_cpp_build.sh  # sets bin, gemma and smollm2
jobs=${SCISSORHANDS_JOBS:-$(nproc)}
threads=${SCISSORHANDS_THREADS:-1}
out=results
mkdir -p "$out/smollm2_tokens"
source scripts/quality_texts.sh  # sets L and texts
SECONDS=0
for flash in auto off; do
  "$bin" check-reads --model "$smollm2" --text "$L/GPL-3" --length 1100 --chunk 128 --threads "$((jobs * threads))" \
    --flash-attn "$flash"
done | tee "$out/smollm2_check_reads.txt"
echo "check-reads: $SECONDS s"
"$bin" evaluate --model "$smollm2" --text "${texts[@]}" --samples 4 --sample-seed 1 --length 2000 \
  --save-tokens "$out/smollm2_tokens" --protocol decode --chunk 32 --threads "$threads" --jobs "$jobs" \
  --budgets 6.25 12.5 25 50 --policies scissorhands streaming tova h2o context-shift \
  --csv "$out/smollm2_decode.csv" --texts-csv "$out/smollm2_decode_texts.csv" | tee "$out/smollm2_decode.txt"
echo "decode grid: $SECONDS s"
python3 scripts/gemma_summary.py --name "SmolLM2-135M-Instruct" --texts "$out/smollm2_decode_texts.csv" -- "$out/smollm2_decode.csv" \
  | tee "$out/smollm2_summary.txt"
echo "scripts/smollm2_quality.sh: $SECONDS s"
