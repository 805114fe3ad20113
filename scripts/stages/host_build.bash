# Sourced by the stages (not a stage: the loop runs *.sh only).
# configure_host_tests BUILD_DIR BUILD_TYPE CXX_FLAGS [cmake args...]:
# configures the host tests alone (no CUDA, benchmarks or examples) in
# BUILD_DIR with ccache when present; sets `jobs` and `launcher` for the
# stage's own later calls.
jobs=${SCISSORHANDS_JOBS:-$(nproc)}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
configure_host_tests() {
  local build=$1 type=$2 flags=$3
  shift 3
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="$type" -DCMAKE_CXX_FLAGS="$flags" \
    -DSCISSORHANDS_ENABLE_CUDA=OFF -DSCISSORHANDS_BUILD_BENCHMARKS=OFF -DSCISSORHANDS_BUILD_EXAMPLES=OFF \
    "${launcher[@]}" "$@" >/dev/null
}
