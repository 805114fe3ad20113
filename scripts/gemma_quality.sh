#!/usr/bin/env bash
# The quality sweep on Gemma 3 270M through stock llama.cpp (docs/quality.md,
# "Gemma 3 270M"): 16 texts of 2,000 tokens (12 real: six licences of
# /usr/share/common-licenses as scripts/llama_cpp.sh uses, two more licences,
# two CMake manuals, dpkg's trigger spec, a zlib example in C; four sampled
# from the model, seeds 1-4), 32 tokens per llama_decode.
#   1. persistence of importance per layer (the paper's definition, min age
#      10, min fraction 0.1), full cache;
#   2. the goal grid, 67-68 min on 2 cores (docs/quality.md): the default, StreamingLLM,
#      H2O, TOVA, llama.cpp's context shift and random under the decode
#      protocol at 6.25 / 12.5 / 25 / 50% of the text, and all but the
#      context shift under the prefill protocol (half the text, compressed
#      once) at 6.25 / 12.5 / 25%;
#   3. the other configurations (SCISSORHANDS_GEMMA_VARIANTS=0 skips them):
#      the paper's setting, H2O normalised, SnapKV (prefill: the prompt's
#      last 32 queries), the default's variants (r a share of the budget, the
#      layers' max instead of their mean, 4 sinks protected); 3b, with
#      SCISSORHANDS_GEMMA_COUNTER=1: the counter's settings one at a time;
#   4. tables, the goal cell by cell (the default's margin over each baseline
#      with a 95% paired bootstrap interval over the texts), compression, plot.
# Flash attention as SCISSORHANDS_FLASH_ATTN says (auto, llama.cpp's default:
# on; the tables of docs/quality.md were measured with off, which reproduces
# them; persistence reads llama.cpp's probabilities, so always off).
# evaluate runs SCISSORHANDS_JOBS texts at once (default: one per core), each
# with SCISSORHANDS_THREADS llama.cpp threads (default 1), and takes a
# method's predictions from before its first eviction from the full cache's
# run (--no-reuse recomputes them). Writes results/gemma_*; prints each
# step's seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llama_cpp_build.sh  # sets bin and gemma
jobs=${SCISSORHANDS_JOBS:-$(nproc)}
threads=${SCISSORHANDS_THREADS:-1}
flash=${SCISSORHANDS_FLASH_ATTN:-auto}
out=results
mkdir -p "$out/gemma_tokens"
source scripts/quality_texts.sh  # sets L and texts
SECONDS=0
# 1. Persistence; it also tokenizes and samples the 16 texts once.
"$bin" persistence --model "$gemma" --text "${texts[@]}" --samples 4 --sample-seed 1 --length 2000 \
  --threads "$((jobs * threads))" --save-tokens "$out/gemma_tokens" --csv "$out/gemma_persistence_age0.csv" \
  | tee "$out/gemma_persistence_age0.txt"
tokens=("$out"/gemma_tokens/*.tokens)
"$bin" persistence --model "$gemma" --tokens "${tokens[@]}" --min-age 10 --threads "$((jobs * threads))" \
  --csv "$out/gemma_persistence_age10.csv" | tee "$out/gemma_persistence_age10.txt"
"$bin" persistence --model "$gemma" --tokens "${tokens[@]}" --min-fraction 0.1 --threads "$((jobs * threads))" \
  --csv "$out/gemma_persistence_q01.csv" | tee "$out/gemma_persistence_q01.txt"
echo "persistence: $SECONDS s"
goal=(scissorhands streaming h2o tova random)
more=(scissorhands-paper h2o:normalize=1 scissorhands:recent=50% scissorhands:recent=25% scissorhands-max-layers
      scissorhands-paper:sinks=4 scissorhands:sinks=4)
run() {  # name protocol budgets... -- policies...
  local name=$1 protocol=$2; shift 2
  local budgets=(); while [ "$1" != -- ]; do budgets+=("$1"); shift; done; shift
  "$bin" evaluate --model "$gemma" --tokens "${tokens[@]}" --protocol "$protocol" --chunk 32 --threads "$threads" \
    --flash-attn "$flash" --jobs "$jobs" --budgets "${budgets[@]}" --policies "$@" --csv "$out/gemma_$name.csv" \
    --texts-csv "$out/gemma_${name}_texts.csv" | tee "$out/gemma_$name.txt"
  echo "$name: $SECONDS s"
}
# 2. The goal grid (at 50% the prefill budget holds the whole prompt: nothing to evict).
run decode decode 6.25 12.5 25 50 -- "${goal[@]}" context-shift
run prefill prefill 6.25 12.5 25 -- "${goal[@]}"
decode=("$out/gemma_decode.csv") prefill=("$out/gemma_prefill.csv")
# 3. The other configurations.
if [ "${SCISSORHANDS_GEMMA_VARIANTS:-1}" = 1 ]; then
  run decode_more decode 6.25 12.5 25 50 -- "${more[@]}"
  run prefill_more prefill 6.25 12.5 25 -- snapkv "${more[@]}"
  decode+=("$out/gemma_decode_more.csv") prefill+=("$out/gemma_prefill_more.csv")
fi
# 3b. The counter's settings one at a time from the default (docs/quality.md, "The counter's settings
# around the default"; SCISSORHANDS_GEMMA_COUNTER=1): gemma_counter_*.csv.
if [ "${SCISSORHANDS_GEMMA_COUNTER:-0}" = 1 ]; then
  counter=(scissorhands:window=12 scissorhands:window=50 scissorhands:window=100 scissorhands:alpha=1
           scissorhands:alpha=4 scissorhands:normalize=0)
  run counter_decode decode 6.25 12.5 25 50 -- "${counter[@]}"
  run counter_prefill prefill 6.25 12.5 25 -- "${counter[@]}"
fi
# 4. Tables and plot.
# The goal grid's per-text sums: the default's margins with paired bootstrap intervals.
python3 scripts/gemma_summary.py --tiny docs/quality.md \
  --persistence "$out/gemma_persistence_age0.csv" "$out/gemma_persistence_age10.csv" "$out/gemma_persistence_q01.csv" \
  --texts "$out/gemma_decode_texts.csv" "$out/gemma_prefill_texts.csv" \
  -- "${decode[@]}" "${prefill[@]}" \
  | tee "$out/gemma_summary.md"
if command -v gnuplot >/dev/null; then
  mkdir -p "$out/gemma_merged"  # every configuration's cells, one CSV per protocol
  python3 scripts/gemma_summary.py --out-csv "$out/gemma_merged" -- "${decode[@]}" "${prefill[@]}" >/dev/null
  python3 scripts/llama_cpp_plot.py "$out/gemma_merged/gemma_decode.csv" "$out/gemma_merged/gemma_prefill.csv" \
    "$out/gemma_quality.png"
fi
echo "scripts/gemma_quality.sh: $SECONDS s"
