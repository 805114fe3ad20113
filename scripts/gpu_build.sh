#!/usr/bin/env bash
# Builds, here (no GPU needed), what scripts/gpu_check.sh runs on a GPU
# machine, so that the device's minutes go to running, not compiling: the
# two CUDA test binaries and the benchmark, for sm_90 (H100/H200; ARCH=80
# for an A100), libstdc++ and libgcc linked in, and the shared libraries
# the benchmark needs beyond libc (Google Benchmark) copied into lib/
# beside them.
#
#   scripts/gpu_build.sh [BIN_DIR]     (default gpu-bin/, ignored by git)
#
# Then, on the GPU machine (the device tool: carry BIN_DIR):
#   scripts/gpu_check.sh OUT_DIR gpu-bin
# About 6 minutes on 2 cores from nothing (ccache makes a rebuild quick).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/gpu-bin}
build=${SCISSORHANDS_GPU_BUILD_DIR:-$root/build-gpu}
arch=${ARCH:-90}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
static="-static-libstdc++ -static-libgcc"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_EXE_LINKER_FLAGS="$static" -DCMAKE_CUDA_FLAGS="-Xcompiler=-static-libstdc++,-static-libgcc" \
  "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target scissorhands_cuda_test scissorhands_cuda_token_level_test \
  scissorhands_cuda_bench
mkdir -p "$bin/lib"
cp "$build/tests/cuda/scissorhands_cuda_test" "$build/tests/cuda/scissorhands_cuda_token_level_test" \
  "$build/bench/cuda/scissorhands_cuda_bench" "$bin/"
# Every shared library but the C library's own and the kernel's, so that
# the binaries start on another distribution.
for exe in "$bin"/scissorhands_cuda_*; do
  ldd "$exe" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$bin/lib/" ;;
    esac
  done
done
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "commit: $(git -C "$root" rev-parse HEAD) $(git -C "$root" status --porcelain | grep -q . && echo '(dirty)')"
  echo "arch: sm_$arch"
  nvcc --version | tail -1
} >"$bin/BUILD.txt"
ls -la "$bin" "$bin/lib"
echo "gpu_build.sh: $bin ready; on the GPU machine: scripts/gpu_check.sh OUT_DIR $(basename "$bin")"
