#!/usr/bin/env bash
# Mutation check: breaks the library on purpose, one known way at a time, and
# requires the suite that guards that rule to fail. A refactor of the tests
# that stopped checking something shows up here as a mutation that survives.
#
#   bash scripts/mutation_check.sh            every mutation below
#   bash scripts/mutation_check.sh NAME ...   only those
#   bash scripts/mutation_check.sh --list     their names
#
# The library's headers are copied to a scratch folder and each mutation is
# applied there (the tree is never edited); the suite's sources compile from
# the tree against that copy, at -O1 with g++ (CXX overrides). Each suite is
# first built and run unmutated and must pass, so that a failure under a
# mutation is the mutation's. A mutation whose text is no longer found is an
# error: the table must follow the code. Host code only (nvcc is not used);
# the CUDA rules that run on the host are covered through their .hpp halves.
# About 12 minutes on 2 cores (the dated runs in docs/hardening.md add up to 702 s); not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
CXX=${CXX:-g++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | library file | text | replacement | suite
mutations=(
  "recent_window_one_short|policy/protector.hpp|(position >= next_position - s.recent)|(position > next_position - s.recent)|simulation_contiguous"
  "ties_to_newer_token|detail/eviction_key.hpp|position) ^ 0x80000000u);|position) ^ 0x7FFFFFFFu);|simulation_random"
  "partial_selection_at_m2|host/detail/eviction.hpp|if (evict == 1)|if (evict <= 2)|simulation_paged"
  "normalise_dropped_in_head_partial|host/detail/eviction.hpp|const float v = score[t] / divisor;|const float v = score[t];|granularity"
  "pinned_prefix_ignored|host/detail/eviction.hpp|for (std::int32_t t = pinned; t < len; ++t) {|for (std::int32_t t = 0; t < len; ++t) {|engine_token_level"
  "freed_pages_one_short|host/compress.hpp|cache.pages_of(b) - cache.pages_for(kept);|cache.pages_of(b) - cache.pages_for(kept + 1);|engine_continuous_batching"
  "evict_count_bound_loose|detail/validate.hpp|require(s.evict_count <= budget - protect,|require(s.evict_count <= budget,|bad_input"
  "pages_for_rounds_wrong|token_table_view.hpp|(std::int64_t{length} + t.page_size - 1) / t.page_size|(std::int64_t{length} + t.page_size) / t.page_size|simulation_paged"
  "query_normaliser_without_sum|host/observe.hpp|norm[g] = run_max[g] + std::log(run_sum[g]);|norm[g] = run_max[g];|observe_queries"
  "fill_holes_starts_early|host/detail/eviction.hpp|std::int32_t source = kept;|std::int32_t source = kept - 1;|fuzz_replay"
  "bridge_drops_sinks|bridge/bridge_impl.hpp|  to.sinks = from.sinks;||cxx17_engine"
  "mma_b_words_swapped|cuda/detail/mma_layout.hpp|return 2 * (step % 2) + r; }|return 2 * (step % 2) + (1 - r); }|mma_layout"
  "observed_twice_accepted|host/observe.hpp|if (state.observed[state.row_index(r, 0, t)] != 0.0f) [[unlikely]]|if (false)|bad_input"
  "new_tokens_without_queries_accepted|host/observe.hpp|require(first_query <= tracked|require(true|bad_input"
  "model_layer_unbounded|model_state.hpp|require(l >= 0 && l < layers,|require(true,|bad_input"
  "nan_sorts_last|detail/eviction_key.hpp|if (x != x) return 0u;|if (x != x) return 0xFFFFFFFFu;|determinism"
  "shrink_view_page_size_ignored|token_table_view.hpp|writable(view.last_page_len), view.page_size};|writable(view.last_page_len), 2 * view.page_size};|bad_input"
  "lse_sums_upper_bound_dropped|host/observe.hpp|const bool too_high = sum[g] > 1.0 + lse_sum_tolerance;|const bool too_high = false;|bad_input"
  "lse_sums_lower_bound_dropped|host/observe.hpp|const bool too_low = lse.check == lse_check::sums_to_one && sum|const bool too_low = false && sum|bad_input"
  "lse_sums_at_most_one_ignored|host/observe.hpp|const bool too_low = lse.check == lse_check::sums_to_one &&|const bool too_low = lse.check != lse_check::none &&|bad_input"
  "lse_sums_first_observe_only|host/observe.hpp|step / lse_check_interval != (step + queries) / lse_check_interval;|false;|bad_input"
)

# The suites: what to compile (tree-relative) and how to run the result.
catch_suite() {  # name -> sources
  case $1 in
    simulation_contiguous | simulation_random | simulation_paged | granularity | observe_queries | \
      mma_layout) echo "tests/host/$1_test.cpp" ;;
    bad_input) echo "tests/host/bad_input_test.cpp" ;;
    determinism) echo "tests/static/determinism_test.cpp" ;;
    engine_token_level) echo "tests/engine/token_level_test.cpp" ;;
    engine_continuous_batching) echo "tests/engine/continuous_batching_test.cpp" ;;
    *) return 1 ;;
  esac
}

build_suite() {  # suite include-dir out-binary
  local suite=$1 inc=$2 out=$3
  local common=(-O1 -w -I "$inc")
  case $suite in
    fuzz_replay)
      "$CXX" -std=c++20 "${common[@]}" tests/fuzz/fuzz_host.cpp tests/fuzz/replay_main.cpp -o "$out" ;;
    cxx17_engine)
      "$CXX" -std=c++20 "${common[@]}" -c tests/cxx17/bridge_tu.cpp -o "$out.bridge.o"
      "$CXX" -std=c++20 "${common[@]}" -c tests/cxx17/token_tu.cpp -o "$out.token.o"
      "$CXX" -std=c++17 -fno-exceptions "${common[@]}" tests/cxx17/engine_test.cpp "$out.bridge.o" "$out.token.o" \
        -o "$out" ;;
    *)
      local sources
      sources=$(catch_suite "$suite") || { echo "unknown suite $suite" >&2; return 2; }
      # shellcheck disable=SC2086
      "$CXX" -std=c++20 "${common[@]}" $sources -lCatch2WithMain -o "$out" ;;
  esac
}

run_suite() {  # suite binary
  case $1 in
    fuzz_replay) timeout 900 "$2" tests/fuzz/corpus ;;
    *) timeout 900 "$2" ;;
  esac
}

list_only=0
selected=()
for a in "$@"; do
  if [ "$a" = --list ]; then list_only=1; else selected+=("$a"); fi
done
if [ "$list_only" = 1 ]; then
  for m in "${mutations[@]}"; do IFS='|' read -r name file _ _ suite <<<"$m"; echo "$name ($file, $suite)"; done
  exit 0
fi

cp -r include "$work/clean"
declare -A baseline_done
caught=0 survived=0 broken=0
SECONDS=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file from to suite <<<"$m"
  if [ "${#selected[@]}" -gt 0 ] && [[ ! " ${selected[*]} " == *" $name "* ]]; then continue; fi
  # The suite unmutated, once: it must pass.
  if [ -z "${baseline_done[$suite]:-}" ]; then
    if ! build_suite "$suite" "$work/clean" "$work/$suite.clean" >"$work/$suite.clean.log" 2>&1 ||
      ! run_suite "$suite" "$work/$suite.clean" >>"$work/$suite.clean.log" 2>&1; then
      echo "ERROR $suite fails unmutated:"; tail -20 "$work/$suite.clean.log"; exit 1
    fi
    baseline_done[$suite]=1
  fi
  rm -rf "$work/mutant" && cp -r "$work/clean" "$work/mutant"
  if ! python3 - "$work/mutant/scissorhands/$file" "$from" "$to" <<'EOF'; then
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"{path}: the text to mutate is found {text.count(old)} times, not once: {old!r}")
open(path, "w").write(text.replace(old, new))
EOF
    echo "BROKEN $name: the mutation table no longer matches $file"
    broken=$((broken + 1))
    continue
  fi
  log="$work/$name.log"
  if ! build_suite "$suite" "$work/mutant" "$work/$name" >"$log" 2>&1; then
    echo "BROKEN $name: the mutant does not compile"; tail -5 "$log"
    broken=$((broken + 1))
    continue
  fi
  if run_suite "$suite" "$work/$name" >>"$log" 2>&1; then
    echo "SURVIVED $name: $suite passed with $file mutated"
    survived=$((survived + 1))
  else
    # Catch's summary line, or the replay's / bridge test's last words.
    summary=$(grep -E "^test cases:|failed" "$log" | tail -1 || true)
    echo "caught $name by $suite: ${summary:-$(tail -1 "$log")}"
    caught=$((caught + 1))
  fi
done
echo "mutation_check: $caught caught, $survived survived, $broken broken ($SECONDS s)"
[ "$survived" = 0 ] && [ "$broken" = 0 ]
