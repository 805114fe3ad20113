#!/usr/bin/env bash
# run.sh MODE BINARY MODEL OUTDIR: one check of the llama.cpp integration on
# a tiny model (exit 77 when the model is absent).
set -euo pipefail
mode=$1 bin=$2 model=$3 out=$4
if [ ! -f "$model" ]; then
  echo "SKIPPED: $model not found (../shared/models/README.md)"
  exit 77
fi
text=/usr/share/common-licenses/GPL-3
case "$mode" in
  check-reads)
    # Every logit of the glue's run (observing every layer, never evicting)
    # equals the stock run's; chunks of 32 and of 1 token per decode.
    "$bin" check-reads --model "$model" --text "$text" --length 300 --chunk 32
    "$bin" check-reads --model "$model" --text "$text" --length 64 --chunk 1 ;;
  generate)
    # n_ctx 256 cells serving 1,000 generated tokens: no decode failure, never
    # above the budget, true positions (the program's exit status says so).
    "$bin" generate --model "$model" --ctx 256 -n 1000 --quiet
    "$bin" generate --model "$model" --ctx 256 -n 300 --quiet --policy h2o ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
