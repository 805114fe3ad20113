#!/usr/bin/env bash
# The full run (README; .ci/run calls it): the test command,
# scripts/test.sh, with the pinned llama-cpp-python installed first (about
# 3 minutes cold on 2 cores, seconds from pip's wheel cache) so that the
# llama.cpp integration is tested, then every hardening stage in
# scripts/stages/, in name order (docs/hardening.md): sanitizers, the
# x86-64-v3 build, ThreadSanitizer, fuzzing, clang-tidy. Each part says how
# long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
total=$SECONDS
SCISSORHANDS_LLAMA_CPP_INSTALL=1 bash scripts/test.sh
echo "== test command took $((SECONDS - total)) s"
for stage in scripts/stages/*.sh; do
  [ -e "$stage" ] || continue
  echo "== stage: $stage"
  start=$SECONDS
  bash "$stage"
  echo "== stage: $stage took $((SECONDS - start)) s"
done
echo "== full run took $((SECONDS - total)) s"
