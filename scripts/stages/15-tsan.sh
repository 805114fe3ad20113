#!/usr/bin/env bash
# Stage 15: the host backend's slices on threads under ThreadSanitizer.
# tests/host/parallel_test.cpp runs plans (host/plan.hpp) in slices on
# std::threads and compares them with the serial calls; built alone with
# -fsanitize=thread, any data race between slices aborts the run.
# SCISSORHANDS_TSAN_BUILD_DIR sets the build directory (default build-tsan).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${SCISSORHANDS_TSAN_BUILD_DIR:-build-tsan}
source scripts/stages/host_build.bash
configure_host_tests "$build" Debug "-O1 -g -fsanitize=thread -fno-omit-frame-pointer"
cmake --build "$build" -j "$jobs" --target host_parallel_test
export TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1
"$build/tests/host/host_parallel_test"
