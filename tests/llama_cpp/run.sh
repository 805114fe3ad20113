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
  settings)
    # A preset with settings in its name runs as set and is labelled so; a
    # bad setting is refused before any run, naming the setting and its bounds.
    "$bin" evaluate --model "$model" --text "$text" --length 200 --budgets 50 --chunk 8 \
      --policies "scissorhands:recent=25%/window=50" "h2o:normalize=1" --csv "$out/settings.csv" >"$out/settings.log" 2>&1
    grep -q '^stories260K.gguf,decode,scissorhands:recent=25%/window=50,50.00%,100,' "$out/settings.csv"
    grep -q '^stories260K.gguf,decode,h2o:normalize=1,50.00%,100,' "$out/settings.csv"
    if "$bin" evaluate --model "$model" --text "$text" --length 200 --policies "scissorhands:recent=120%" \
        >"$out/refused.log" 2>&1; then echo "recent=120% was accepted"; exit 1; fi
    grep -q "setting 'recent=120%' is not one of .*recent (cells, or 0-100%)" "$out/refused.log"
    if grep -q "full cache" "$out/refused.log"; then echo "the bad setting was refused only after a run"; exit 1; fi
    echo "settings: run as set, labelled, a bad one refused before any run" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
