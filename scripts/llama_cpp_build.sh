#!/usr/bin/env bash
# Set-up and build shared by scripts/llama_cpp.sh, scripts/gemma_quality.sh,
# scripts/smollm2_quality.sh and scripts/llama_cpp_scale.sh, which source it:
# installs what they need (scripts/setup.sh, scripts/setup_llama_cpp.sh),
# builds scissorhands_llamacpp in SCISSORHANDS_BUILD_DIR (default build),
# then sets bin=<the program>, gemma=<Gemma 3 270M's GGUF> and
# smollm2=<SmolLM2-135M-Instruct's GGUF>; run on its own, it prints them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh >&2
setup=$(bash scripts/setup_llama_cpp.sh)
prefix=$(sed -n 's/^prefix=//p' <<<"$setup")
gemma=$(sed -n 's/^gemma=//p' <<<"$setup")
smollm2=$(sed -n 's/^smollm2=//p' <<<"$setup")
build=${SCISSORHANDS_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" -DSCISSORHANDS_LLAMA_CPP_PREFIX="$prefix" >/dev/null
cmake --build "$build" -j "$(nproc)" --target scissorhands_llamacpp >&2
bin=./$build/examples/llama_cpp/scissorhands_llamacpp
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "bin=$bin"
  echo "gemma=$gemma"
  echo "smollm2=$smollm2"
fi
