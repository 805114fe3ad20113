# Sourced by main.sh, sweep.sh and granularity.sh (from the repository
# root): builds the llama example in Release in $SCISSORHANDS_BUILD_DIR
# (default build, ccache when present) and sets `bin` to its binary;
# creates results/.
build=${SCISSORHANDS_BUILD_DIR:-build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target scissorhands_llama
bin=./"$build"/examples/llama/scissorhands_llama
mkdir -p results
