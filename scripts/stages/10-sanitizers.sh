#!/usr/bin/env bash
# Stage 10: every host test folder built with AddressSanitizer +
# UndefinedBehaviorSanitizer (g++) in its own build directory, and run:
# tests/host, the static tests (tests/static), the engine-driven tests
# (tests/engine: continuous batching over a shared page table, the
# zero-allocation check), the C++17 / -fno-exceptions bridge consumer
# (tests/cxx17) and the README's code (tests/readme). Every report aborts
# its test (-fno-sanitize-recover=all, abort_on_error), so any report fails
# CI. Llama, install test, benchmarks and examples are left out: they add no
# host code paths. The fuzz corpus replay is left out too: stage 20 runs
# every corpus input under ASan + UBSan (clang) before it fuzzes.
# Then the two CUDA test binaries and the CUDA benchmark, built by nvcc
# with the same sanitizers on their host code (in build-asan-cuda; device
# code as compute_90 PTX only, since none runs and ptxas would add a
# quarter to nvcc's time), run with --host-only: the CUDA API's argument
# checks, the host reference of every configuration and every benchmark's
# calls (CTest's *.host_only entries). Without nvcc that part reports NOT
# RUN; SCISSORHANDS_ASAN_CUDA=0 skips it.
# SCISSORHANDS_ASAN_BUILD_DIR sets the build directory (default build-asan);
# SCISSORHANDS_ASAN_SKIP_DIRS the folders left out (default
# cuda;llama;install;fuzz; for a partial run by hand, e.g.
# "host;cuda;llama;install;engine;cxx17;readme" for the static tests alone).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${SCISSORHANDS_ASAN_BUILD_DIR:-build-asan}
source scripts/stages/host_build.bash
sanitize="-fsanitize=address -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
configure_host_tests "$build" Debug "-O1 -g $sanitize" \
  -DSCISSORHANDS_SKIP_DIRS="${SCISSORHANDS_ASAN_SKIP_DIRS:-cuda;llama;install;fuzz}"
cmake --build "$build" -j "$jobs"
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j "$jobs"

[ "${SCISSORHANDS_ASAN_CUDA:-1}" = 1 ] || exit 0
# nvcc splits -Xcompiler values at commas, so one flag per -Xcompiler; the
# CUDA executables link through g++, which needs the runtimes too.
cuda_build=${SCISSORHANDS_ASAN_CUDA_BUILD_DIR:-build-asan-cuda}
cuda_flags="-O1 -g"
for f in $sanitize; do cuda_flags+=" -Xcompiler=$f"; done
cmake -S . -B "$cuda_build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="-O1 -g $sanitize" \
  -DCMAKE_CUDA_FLAGS="$cuda_flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_CUDA_ARCHITECTURES=90-virtual -DSCISSORHANDS_BUILD_BENCHMARKS=ON -DSCISSORHANDS_BUILD_EXAMPLES=OFF \
  -DSCISSORHANDS_SKIP_DIRS="host;fuzz;static;engine;cxx17;readme;llama;install" \
  "${launcher[@]}" ${launcher:+-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache} >/dev/null
# (Listed first: grep -q closing the pipe early would fail it under pipefail.)
listed=$(ctest --test-dir "$cuda_build" -N -R 'host_only$')
if ! grep -q 'host_only' <<<"$listed"; then
  echo "NOT RUN: the CUDA host-only tests under ASan + UBSan (no CUDA compiler found)"
  exit 0
fi
cmake --build "$cuda_build" -j "$jobs"
ctest --test-dir "$cuda_build" --output-on-failure -j "$jobs" -R 'host_only$'
