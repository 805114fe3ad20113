#!/usr/bin/env bash
# Constant speed at any length, the user's reason to evict (docs/llama_cpp.md,
# "Speed and memory as the text grows"): Gemma 3 270M to 2k, 4k, 8k and 16k
# tokens and SmolLM2-135M-Instruct to 2k, 4k and 8k (its context), with
# stock llama.cpp (flash attention on, n_ctx = the length, one process per
# length so that its resident memory is its own) and with the library's
# default at B = 1,024 cells (n_ctx = B + the ubatch of 256, one process
# for all lengths; on Gemma also scoring its 3 global layers only), 1 and 2
# threads: decode tokens/s over the last 256
# tokens before each length, llama.cpp's KV memory as allocated, the cells
# held, resident memory, and the library's share of a decode step. The text:
# licence texts of /usr/share/common-licenses one after another. Writes
# results/llama_cpp_scale.{csv,txt,png}. Run it on a quiet machine: 1,641 s
# (27 minutes) on a 2-core VM, 2026-12-07.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llama_cpp_build.sh  # sets bin, gemma and smollm2
mkdir -p results
L=/usr/share/common-licenses
text=("$L/GPL-3" "$L/GPL-2" "$L/LGPL-2.1" "$L/MPL-2.0" "$L/Apache-2.0" "$L/GFDL-1.3" "$L/Artistic" "$L/LGPL-3"
      "$L/GPL-1" "$L/MPL-1.1" "$L/CC0-1.0")
csv=results/llama_cpp_scale.csv
rm -f "$csv"
SECONDS=0
for spec in "$gemma:2048 4096 8192 16384" "$smollm2:2048 4096 8192"; do
  model=${spec%%:*}
  read -r -a lengths <<<"${spec#*:}"
  for threads in 1 2; do
    for length in "${lengths[@]}"; do
      "$bin" scale --model "$model" --text "${text[@]}" --lengths "$length" --threads "$threads" --csv "$csv"
    done
    "$bin" scale --model "$model" --text "${text[@]}" --lengths "${lengths[@]}" --budget 1024 --threads "$threads" \
      --csv "$csv"
    # Gemma: the default scoring the three global layers only (a sixth of the observation).
    if [ "$model" = "$gemma" ]; then
      "$bin" scale --model "$model" --text "${text[@]}" --lengths "${lengths[@]}" --budget 1024 --threads "$threads" \
        --scores global --csv "$csv"
    fi
  done
done | tee results/llama_cpp_scale.txt
if command -v gnuplot >/dev/null; then python3 scripts/llama_cpp_scale_plot.py "$csv" results/llama_cpp_scale.png; fi
echo "scripts/llama_cpp_scale.sh: $SECONDS s"
