#!/usr/bin/env bash
# The GPU check of the CUDA backend, one command of at most about 9 minutes
# (the timeouts below), for a machine lent for 15 minutes. It runs the
# binaries scripts/gpu_build.sh made on a CPU machine (BIN_DIR, default
# gpu-bin/, carried to the device); where they are missing or do not start
# it builds them first with nvcc (about 3 minutes on 16 cores; the
# benchmark only where Google Benchmark is installed).
#
#   scripts/gpu_check.sh OUT_DIR [BIN_DIR]
#
# Stages, each under its own timeout:
#   1. a probe: can compute-sanitizer attach here? (Under some container
#      runtimes it cannot: "Device not supported".) If not, the sanitizer
#      stages are reported "not run", never failed;
#   2. in parallel: the differential / error / shrink_page_table / graph
#      suite (CONFIGS configurations), the token-level suite (TL_CONFIGS),
#      and memcheck + racecheck on small runs of both, each with one
#      > 4096-slot configuration (--long 1) so the selection path beyond
#      the shared-memory tile is instrumented too;
#      Also, with SCISSORHANDS_PDL=1 (programmatic dependent launch,
#      cuda/launch.cuh, off by default): the differential suite
#      (PDL_CONFIGS) and the token-level suite (PDL_TL_CONFIGS);
#   3. alone: the benchmarks (CUDA events, L2 flushed before each timed
#      call, SCISSORHANDS_BENCH_ITERATIONS iterations), then observe and
#      compress at batch 1 and 32, B = 2048, again with SCISSORHANDS_PDL=1.
# OUT_DIR receives six files (the device tool brings back at most 8):
# status.txt (one line per stage), summary.md (the figures bench/RESULTS.md
# wants), bench.json, bench_pdl.json, device.txt, logs.tar.gz (every
# stage's log). The exit status is non-zero if any stage that ran failed.
#
# Knobs (environment): CONFIGS (default 400), TL_CONFIGS (200),
# PDL_CONFIGS (100), PDL_TL_CONFIGS (40), SKIP_PDL=1,
# SANITIZE_CONFIGS (6), SCISSORHANDS_BENCH_ITERATIONS (50), BENCH_FILTER (a
# --benchmark_filter regex), SKIP_SANITIZER=1, SKIP_BENCH=1, ARCH (a build
# here; default: the GPU's).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [BIN_DIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${2:-$root/gpu-bin}
mkdir -p "$out" "$bin"
out=$(cd "$out" && pwd)
bin=$(cd "$bin" && pwd)
logs=$(mktemp -d)
cd "$root"
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SCISSORHANDS_BENCH_ITERATIONS=${SCISSORHANDS_BENCH_ITERATIONS:-50}

status="$out/status.txt"
: >"$status"
failed=0
stage() {  # stage NAME RC [NOTE]
  local word="FAILED (exit $2)"
  [ "$2" -eq 0 ] && word=ok
  [ "$2" -eq 77 ] && word="skipped (no CUDA device)"
  [ "$2" -eq 124 ] && word="FAILED (timed out)"
  echo "$1: $word${3:+ $3}" | tee -a "$status"
  [ "$2" -eq 0 ] || [ "$2" -eq 77 ] || failed=1
}
not_run() { echo "$1: not run ($2)" | tee -a "$status"; }
finish() {
  tar czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
  echo "---"
  cat "$status"
  exit $failed
}

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -z "${ARCH:-}" ]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  ARCH=${cap:-90}
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
  echo "binaries: $bin"
  cat "$bin/BUILD.txt" 2>/dev/null || echo "(no BUILD.txt: built here)"
  "$nvcc" --version 2>/dev/null | tail -2
  nvidia-smi 2>&1
} >"$out/device.txt"

test_bin="$bin/scissorhands_cuda_test"
tl_bin="$bin/scissorhands_cuda_token_level_test"
bench_bin="$bin/scissorhands_cuda_bench"
# Whether a binary starts here (a missing library or another processor
# gives 126/127 or the loader's message). The tests answer --help with
# their usage and exit 2 before touching the device.
starts() {
  [ -x "$1" ] || return 1
  local msg rc
  msg=$("$1" --help 2>&1 </dev/null | head -5)
  rc=$?
  [ $rc -ne 126 ] && [ $rc -ne 127 ] && ! grep -q "error while loading shared libraries\|cannot execute" <<<"$msg"
}

# --- build here only what did not come prebuilt ---------------------------------
flags=(-std=c++20 -O3 -arch="sm_$ARCH" -I"$root/include" -Xcompiler=-Wall,-Wextra -lineinfo)
pids=()
if ! starts "$test_bin"; then
  "$nvcc" "${flags[@]}" tests/cuda/differential.cu tests/cuda/differential_fp32.cu tests/cuda/differential_fp16.cu \
    tests/cuda/differential_bf16.cu tests/cuda/differential_wide.cu -o "$test_bin" >"$logs/build-test.log" 2>&1 &
  pids+=("build-test:$!")
fi
if ! starts "$tl_bin"; then
  "$nvcc" "${flags[@]}" tests/cuda/token_level.cu -o "$tl_bin" >"$logs/build-token-level.log" 2>&1 &
  pids+=("build-token-level:$!")
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && ! starts "$bench_bin"; then
  "$nvcc" "${flags[@]}" bench/cuda/bench_cuda.cu -o "$bench_bin" -lbenchmark -lpthread \
    >"$logs/build-bench.log" 2>&1 &
  pids+=("build-bench:$!")
fi
for p in "${pids[@]}"; do
  wait "${p#*:}"
  stage "${p%%:*}" $?
done
[ ${#pids[@]} -eq 0 ] && echo "build: prebuilt binaries from $bin ($(head -1 "$bin/BUILD.txt" 2>/dev/null))" | tee -a "$status"

# --- 1. can the sanitizer attach? ----------------------------------------------------
sanitize=0
if [ "${SKIP_SANITIZER:-0}" = 1 ]; then
  not_run sanitizers "SKIP_SANITIZER=1"
elif [ ! -x "$sanitizer" ]; then
  not_run sanitizers "compute-sanitizer not found"
elif [ -x "$test_bin" ]; then
  timeout 60 "$sanitizer" --tool memcheck --error-exitcode 99 "$test_bin" --quick --configs 1 --only shrink \
    >"$logs/sanitizer-probe.log" 2>&1
  rc=$?
  if [ $rc -eq 77 ]; then
    not_run sanitizers "no CUDA device"
  elif [ $rc -eq 0 ] || [ $rc -eq 1 ] || [ $rc -eq 99 ]; then
    sanitize=1
  else
    not_run sanitizers "compute-sanitizer could not attach (exit $rc): $(grep -m1 -i 'error\|not supported' \
      "$logs/sanitizer-probe.log" | cut -c1-160)"
  fi
fi

# --- 2. the suites and the sanitizers, in parallel ------------------------------------
n=${SANITIZE_CONFIGS:-6}
jobs=()
run() {  # run NAME TIMEOUT COMMAND...: in the background, log in $logs/NAME.log
  local name=$1 limit=$2
  shift 2
  (timeout "$limit" "$@" >"$logs/$name.log" 2>&1; echo $? >"$logs/$name.rc") &
  jobs+=("$name")
}
[ -x "$test_bin" ] && run test 200 "$test_bin" --configs "${CONFIGS:-400}"
[ -x "$tl_bin" ] && run token-level 150 "$tl_bin" --configs "${TL_CONFIGS:-200}"
if [ "${SKIP_PDL:-0}" != 1 ]; then
  # The same suites with the second kernel of each call launched
  # programmatically dependent on the first (sm_90+; off below).
  [ -x "$test_bin" ] && run test-pdl 200 env SCISSORHANDS_PDL=1 "$test_bin" --configs "${PDL_CONFIGS:-100}" \
    --seed 7
  [ -x "$tl_bin" ] && run token-level-pdl 150 env SCISSORHANDS_PDL=1 "$tl_bin" --configs "${PDL_TL_CONFIGS:-40}" \
    --seed 7
fi
if [ $sanitize = 1 ]; then
  [ -x "$test_bin" ] && run memcheck 200 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 99 \
    "$test_bin" --quick --configs "$n" --long 1
  # racecheck instruments shared memory: the kernels of every observe and
  # compress (differential), the in-place page-table rewrite (shrink).
  [ -x "$test_bin" ] && run racecheck 200 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 99 \
    "$test_bin" --quick --configs "$n" --long 1 --only differential,shrink
  [ -x "$tl_bin" ] && run memcheck-token-level 150 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 99 \
    "$tl_bin" --quick --configs "$n" --long 1
  [ -x "$tl_bin" ] && run racecheck-token-level 150 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 99 "$tl_bin" --quick --configs "$n" --long 1 --only differential
fi
wait
no_device=0
for name in "${jobs[@]}"; do
  rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
  stage "$name" "$rc" "$(grep -m1 '^differential:\|^all passed\|failure(s)\|ERROR SUMMARY' "$logs/$name.log" | cut -c1-200)"
  [ "$rc" -eq 77 ] && no_device=1
done

# --- 3. the benchmarks, alone ---------------------------------------------------------
if [ "${SKIP_BENCH:-0}" = 1 ]; then
  not_run bench "SKIP_BENCH=1"
elif [ $no_device = 1 ]; then
  not_run bench "no CUDA device"
elif [ ! -x "$bench_bin" ]; then
  not_run bench "no benchmark binary (Google Benchmark missing here and none prebuilt)"
else
  filter=()
  [ -n "${BENCH_FILTER:-}" ] && filter=(--benchmark_filter="$BENCH_FILTER")
  timeout 200 "$bench_bin" "${filter[@]}" --benchmark_out="$out/bench.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true >"$logs/bench.txt" 2>&1
  stage bench $?
  if [ "${SKIP_PDL:-0}" != 1 ]; then
    SCISSORHANDS_PDL=1 timeout 60 "$bench_bin" \
      --benchmark_filter='^(observe_queries|observe_probabilities|compress|compress_paged)/batch:(1|32)/budget:2048(/m:1|/m:128)?$' \
      --benchmark_out="$out/bench_pdl.json" --benchmark_out_format=json --benchmark_counters_tabular=true \
      >"$logs/bench-pdl.txt" 2>&1
    stage bench-pdl $?
  fi
  if command -v python3 >/dev/null && [ -s "$out/bench.json" ]; then
    python3 - "$out/bench.json" "$out/bench_pdl.json" >"$out/summary.md" <<'PY'
import json, os, sys
for i, path in enumerate(sys.argv[1:]):
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        continue
    data = json.load(open(path))
    ctx = data.get("context", {})
    if i > 0:
        print("\nWith SCISSORHANDS_PDL=1 (programmatic dependent launch: "
              f"{ctx.get('programmatic_launch', '?')}):\n")
    print(f"device: {ctx.get('device', '?')}, date: {ctx.get('date', '?')}, "
          f"copy bandwidth (read + write): {float(ctx.get('copy_GBps', 0)):.0f} GB/s, "
          f"L2 flushed before each call: {ctx.get('l2_flush_bytes', '?')} bytes, "
          f"programmatic launch: {ctx.get('programmatic_launch', '?')}\n")
    print("| benchmark | us/call | us back to back | GB/s | % copy | K % copy | floor us | call/floor | per step/floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate":
            continue
        g = lambda k, f="{:.3g}": f.format(b[k]) if k in b else ""
        print(f"| {b['name']} | {g('us_per_call')} | {g('us_back_to_back')} | {g('GBps')} | "
              f"{g('pct_copy', '{:.0f}')} | {g('k_pct_copy', '{:.0f}')} | {g('floor_us')} | {g('frac_floor')} | "
              f"{g('frac_floor_per_step')} |")
PY
    cat "$out/summary.md"
  fi
fi
finish
