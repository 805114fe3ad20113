# Sourced by main.sh, sweep.sh, granularity.sh and quantization.sh (from
# the repository root): builds the llama example in Release in
# $SCISSORHANDS_BUILD_DIR (default build, ccache when present) and sets
# `bin` to its binary; creates results/; defines find_models and
# evaluate_models.
build=${SCISSORHANDS_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target scissorhands_llama
bin=./"$build"/examples/llama/scissorhands_llama
mkdir -p results

# find_models NAME: sets `models` to $SCISSORHANDS_MODEL, or to those of
# the three models found in $SCISSORHANDS_MODELS_DIR (default
# ../shared/models), telling (as NAME) which are missing.
find_models() {
  if [ -n "${SCISSORHANDS_MODEL:-}" ]; then
    models=("$SCISSORHANDS_MODEL")
    return
  fi
  local dir=${SCISSORHANDS_MODELS_DIR:-../shared/models} name
  models=()
  for name in stories260K tinystories656k babyllama105; do
    if [ -f "$dir/$name.gguf" ]; then
      models+=("$dir/$name.gguf")
    else
      echo "$1: $dir/$name.gguf not found; skipping it (../shared/models/README.md lists the models)" >&2
    fi
  done
}

# evaluate_models PREFIX ARGS...: `evaluate --protocol decode prefill:50%
# ARGS` on each of `models`, writing results/PREFIX_<model>.csv and .png,
# then results/PREFIX.csv with every model's rows; sets `csvs`.
evaluate_models() {
  local prefix=$1 model name t0 c
  shift
  csvs=()
  for model in "${models[@]}"; do
    name=$(basename "$model" .gguf)
    echo
    echo "=================== $name ==================="
    t0=$SECONDS
    "$bin" --model "$model" evaluate --protocol decode prefill:50% \
      --csv "results/${prefix}_$name.csv" --plot "results/${prefix}_$name.png" "$@"
    echo "($name: $((SECONDS - t0)) s)"
    csvs+=("results/${prefix}_$name.csv")
  done
  {
    head -1 "${csvs[0]}"
    for c in "${csvs[@]}"; do tail -n +2 "$c"; done
  } > "results/$prefix.csv"
}
