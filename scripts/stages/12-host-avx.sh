#!/usr/bin/env bash
# Stage 12: the host test suites built with -march=x86-64-v3. observe's dot
# products take an AVX path (four query heads against two keys at a time)
# that the default x86-64 build of the main stage never compiles; engines
# built with -march=native get it. On a CPU without x86-64-v3 the stage
# says it did not run (it cannot execute the binaries) and passes.
# SCISSORHANDS_AVX_BUILD_DIR sets the build directory (default build-avx).
set -euo pipefail
cd "$(dirname "$0")/../.."
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
for f in avx avx2 bmi1 bmi2 f16c fma abm movbe xsave; do
  if [[ " $flags " != *" $f "* ]]; then
    echo "host AVX stage: NOT RUN (this CPU lacks $f, part of x86-64-v3)"
    exit 0
  fi
done
build=${SCISSORHANDS_AVX_BUILD_DIR:-build-avx}
source scripts/stages/host_build.bash
configure_host_tests "$build" Release "-march=x86-64-v3"
cmake --build "$build" -j "$jobs" --target host_test host_parallel_test host_quantized_test
for t in host_test host_parallel_test host_quantized_test; do
  "$build/tests/host/$t"
done
