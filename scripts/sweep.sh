#!/usr/bin/env bash
# The measurements behind docs/quality.md (about 20 minutes on 2 cores, idle):
#  1. the configuration grid on the three models of ../shared/models under
#     both protocols (decode; prefill:50%): the paper's count of unimportant
#     steps over w in {25, 50, 100, 400}, raw and normalised; alpha 0.5 and
#     2 and r = 5 at w = 25 and 50; and the baselines (important count, H2O
#     raw and normalised, TOVA, SnapKV mean and max pooling, StreamingLLM,
#     random) -> results/sweep_<model>.csv;
#  2. the budget split across layers for the default and H2O normalised:
#     uniform, ramp, pyramid, and persistence_budget fed with each layer's
#     persistence measured on separate calibration texts (the paper's
#     definition; its excess above chance with min-age 10; with
#     min-fraction 0.1) -> results/alloc_<model>_<allocator>.csv;
#  3. alpha 3, 4 and 8 at w = 25, 50 and 400, raw and normalised
#     -> results/sweep_<model>_alpha.csv.
# SWEEP_PARTS="grid alpha alloc" (the default) picks the parts to run.
# Then: python3 scripts/sweep_summary.py prints the tables and the choice.
# Extra arguments go to every run (e.g. --samples 4 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_llama.sh  # sets bin, creates results/
dir=${SCISSORHANDS_MODELS_DIR:-../shared/models}

grid=()
for w in 25 50 100 400; do
  grid+=("scissorhands-paper:w=$w,norm=0,label=w$w-raw" "scissorhands-paper:w=$w,norm=1,label=w$w-norm")
done
for w in 25 50; do
  for n in 0 1; do
    tag=$([ $n = 1 ] && echo norm || echo raw)
    grid+=("scissorhands-paper:w=$w,norm=$n,alpha=0.5,label=w$w-$tag-a0.5"
           "scissorhands-paper:w=$w,norm=$n,alpha=2,label=w$w-$tag-a2"
           "scissorhands-paper:w=$w,norm=$n,r=5,label=w$w-$tag-r5")
  done
done
grid+=("scissorhands-important:label=important" "h2o" "h2o:norm=1,label=h2o-norm" "tova" "snapkv"
       "snapkv:poolmode=max,label=snapkv-max" "streaming" "random")

# Larger alpha (a token is important only well above the average 1 / n).
alpha_grid=()
for w in 25 50 400; do
  for a in 3 4 8; do
    alpha_grid+=("scissorhands-paper:w=$w,norm=0,alpha=$a,label=w$w-raw-a$a"
                 "scissorhands-paper:w=$w,norm=1,alpha=$a,label=w$w-norm-a$a")
  done
done

# SWEEP_PARTS: which of the three parts to run (default all).
parts=${SWEEP_PARTS:-grid alpha alloc}
start=$SECONDS
for name in stories260K tinystories656k babyllama105; do
  model=$dir/$name.gguf
  [ -f "$model" ] || { echo "sweep.sh: $model not found, skipped" >&2; continue; }
  if [[ " $parts " == *" grid "* ]]; then
    echo "=== $name: grid"
    "$bin" --model "$model" evaluate --protocol decode prefill:50% --policies "${grid[@]}" \
      --csv "results/sweep_$name.csv" --no-plot "$@" | grep -E "^(Protocol|budget|B /|[a-z0-9.-]+ +[0-9])" || true
  fi
  if [[ " $parts " == *" alpha "* ]]; then
    echo "=== $name: alpha"
    "$bin" --model "$model" evaluate --protocol decode prefill:50% --policies "${alpha_grid[@]}" \
      --csv "results/sweep_${name}_alpha.csv" --no-plot "$@" | grep -E "^(Protocol|budget|B /|[a-z0-9.-]+ +[0-9])" || true
  fi
  [[ " $parts " == *" alloc "* ]] || continue
  echo "=== $name: allocators"
  for alloc in uniform ramp pyramid persistence "persistence-chance --calibration-min-age 10" \
      "persistence-chance --calibration-min-fraction 0.1"; do
    read -r -a a <<< "$alloc"
    tag=${a[0]}
    [ ${#a[@]} -gt 1 ] && tag="$tag${a[1]#--calibration}${a[2]}"
    "$bin" --model "$model" evaluate --protocol decode prefill:50% --allocator "${a[@]}" \
      --policies scissorhands "h2o:norm=1,label=h2o-norm" --csv "results/alloc_${name}_$tag.csv" --no-plot "$@" \
      | grep -E "^persistence per layer" || true
  done
done
echo "sweep.sh: $((SECONDS - start)) s"
