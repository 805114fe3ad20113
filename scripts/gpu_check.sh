#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one go (about 5-8 minutes on an
# H200 with 16 cores): build the CUDA test binaries (per-head and
# token-level) and the benchmark binary for the local GPU, run the
# differential / error / shrink_page_table / graph suite and the
# token-level suite (shared_heads compress, select, compact, forget),
# compute-sanitizer memcheck and racecheck on small runs of both, and the
# benchmarks. Everything lands in OUT_DIR; the exit status is non-zero if
# any stage failed.
#
#   scripts/gpu_check.sh OUT_DIR [BUILD_DIR]
#
# Builds with nvcc directly (no CMake): the test tree's CMake wants Catch2,
# which a bare GPU machine may lack, and the translation units need nothing
# else. Knobs (environment): CONFIGS (differential configurations, default
# 1200), TL_CONFIGS (token-level configurations, default 400),
# SANITIZE_CONFIGS (default 12), ARCH (e.g. 90; default: the GPU's),
# SCISSORHANDS_BENCH_ITERATIONS (default 200), BENCH_FILTER (a
# --benchmark_filter regex), SKIP_SANITIZER=1, SKIP_BENCH=1.
#
# Outputs: device.txt, build-*.log, test.log, token-level.log,
# memcheck.log, racecheck.log, memcheck-token-level.log,
# racecheck-token-level.log, bench.txt, bench.json, summary.md (the figures
# bench/RESULTS.md wants), status.txt (one line per stage).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [BUILD_DIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-gpu}
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
cd "$root"

status="$out/status.txt"
: >"$status"
failed=0
stage() {  # stage NAME RC (77: skipped, no device)
  local word="FAILED (exit $2)"
  [ "$2" -eq 0 ] && word=ok
  [ "$2" -eq 77 ] && word="skipped (no CUDA device)"
  echo "$1: $word" | tee -a "$status"
  [ "$2" -eq 0 ] || [ "$2" -eq 77 ] || failed=1
}

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -z "${ARCH:-}" ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  ARCH=${cap:-90}
fi
launcher=()
command -v ccache >/dev/null && launcher=(ccache)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
  echo "arch: sm_$ARCH"
  "$nvcc" --version | tail -2
  nvidia-smi 2>&1
} >"$out/device.txt"

# --- build (all binaries in parallel) ---------------------------------------
flags=(-std=c++20 -O3 -arch="sm_$ARCH" -I"$root/include" -Xcompiler=-Wall,-Wextra -lineinfo)
"${launcher[@]}" "$nvcc" "${flags[@]}" tests/cuda/differential.cu -o "$build/scissorhands_cuda_test" \
  >"$out/build-test.log" 2>&1 &
test_pid=$!
"${launcher[@]}" "$nvcc" "${flags[@]}" tests/cuda/token_level.cu -o "$build/scissorhands_cuda_token_level_test" \
  >"$out/build-token-level.log" 2>&1 &
tl_pid=$!
bench_ok=1
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  "${launcher[@]}" "$nvcc" "${flags[@]}" bench/cuda/bench_cuda.cu -o "$build/scissorhands_cuda_bench" \
    -lbenchmark -lpthread >"$out/build-bench.log" 2>&1 &
  bench_pid=$!
  wait $bench_pid
  rc=$?
  stage build-bench $rc
  [ $rc -eq 0 ] || bench_ok=0
fi
wait $test_pid
rc=$?
stage build-test $rc
wait $tl_pid
rc=$?
stage build-token-level $rc
test_bin="$build/scissorhands_cuda_test"
tl_bin="$build/scissorhands_cuda_token_level_test"

# --- tests --------------------------------------------------------------------
if [ -x "$test_bin" ]; then
  timeout 420 "$test_bin" --configs "${CONFIGS:-1200}" 2>&1 | tee "$out/test.log"
  rc=${PIPESTATUS[0]}
  stage test $rc
  [ $rc -eq 77 ] && SKIP_SANITIZER=1 SKIP_BENCH=1

  if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
    n=${SANITIZE_CONFIGS:-12}
    timeout 300 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 99 \
      "$test_bin" --quick --configs "$n" >"$out/memcheck.log" 2>&1
    stage memcheck $?
    tail -3 "$out/memcheck.log"
    # racecheck instruments shared memory; the differential part covers
    # every observe and compress kernel, the shrink part the in-place
    # page-table rewrite, the graph part only the captured path.
    timeout 300 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 99 \
      "$test_bin" --quick --configs "$n" --only differential,shrink >"$out/racecheck.log" 2>&1
    stage racecheck $?
    tail -3 "$out/racecheck.log"
  fi
fi

# --- token-level tests ----------------------------------------------------------
if [ -x "$tl_bin" ]; then
  timeout 300 "$tl_bin" --configs "${TL_CONFIGS:-400}" 2>&1 | tee "$out/token-level.log"
  rc=${PIPESTATUS[0]}
  stage token-level $rc
  if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ $rc -ne 77 ]; then
    n=${SANITIZE_CONFIGS:-12}
    # --quick: small configurations; errors and graph cover every check path.
    timeout 240 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 99 \
      "$tl_bin" --quick --configs "$n" >"$out/memcheck-token-level.log" 2>&1
    stage memcheck-token-level $?
    tail -3 "$out/memcheck-token-level.log"
    timeout 240 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 99 \
      "$tl_bin" --quick --configs "$n" --only differential >"$out/racecheck-token-level.log" 2>&1
    stage racecheck-token-level $?
    tail -3 "$out/racecheck-token-level.log"
  fi
fi

# --- benchmarks ---------------------------------------------------------------
if [ "${SKIP_BENCH:-0}" != 1 ] && [ $bench_ok = 1 ]; then
  filter=()
  [ -n "${BENCH_FILTER:-}" ] && filter=(--benchmark_filter="$BENCH_FILTER")
  timeout 420 "$build/scissorhands_cuda_bench" "${filter[@]}" --benchmark_out="$out/bench.json" \
    --benchmark_out_format=json --benchmark_counters_tabular=true 2>&1 | tee "$out/bench.txt"
  stage bench "${PIPESTATUS[0]}"
  if command -v python3 >/dev/null && [ -s "$out/bench.json" ]; then
    python3 - "$out/bench.json" >"$out/summary.md" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
ctx = data.get("context", {})
print(f"device: {ctx.get('device', '?')}, date: {ctx.get('date', '?')}, "
      f"copy bandwidth (read + write): {float(ctx.get('copy_GBps', 0)):.0f} GB/s\n")
print("| benchmark | us/call | GB/s | % copy | K % copy | floor us | call/floor | per step/floor |")
print("|---|---|---|---|---|---|---|---|")
for b in data.get("benchmarks", []):
    if b.get("run_type") == "aggregate":
        continue
    g = lambda k, f="{:.3g}": f.format(b[k]) if k in b else ""
    print(f"| {b['name']} | {g('us_per_call')} | {g('GBps')} | {g('pct_copy', '{:.0f}')} | "
          f"{g('k_pct_copy', '{:.0f}')} | {g('floor_us')} | {g('frac_floor')} | {g('frac_floor_per_step')} |")
EOF
    cat "$out/summary.md"
  fi
fi

echo "---"
cat "$status"
exit $failed
