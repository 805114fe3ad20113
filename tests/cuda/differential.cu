// The CUDA backend against the host backend (the reference).
//
//   differential  random configurations (dtypes, layouts incl. paged and
//                 mixed K/V layouts, policies, GQA groups, head_dims incl.
//                 odd ones, ragged lengths incl. 0, m, both compaction
//                 modes, both observe paths, admit, reset_sequence, states
//                 sized below the cache's capacity), several steps each, as
//                 an engine runs them:
//                   - continuous batching: requests keep their state row
//                     while the scheduler moves them between batch
//                     positions (state.for_batch), with padding positions
//                     (row -1, no token); finished requests give their row
//                     to new ones (reset_sequence);
//                   - queries uniform (q_len, 0 included) or ragged
//                     (qo_indptr mixing prefill chunks, decode tokens and
//                     sequences without a query), with head-major or
//                     token-major log-sum-exp, natural or base 2;
//                   - compress's compress_output applied by the engine:
//                     new lengths copied, or the page table shrunk with
//                     host::shrink_page_table and cuda::shrink_page_table.
//                 After every observe the state is compared row by row;
//                 after every compress new_lengths, freed_pages, the state
//                 and the kept K/V rows; after every shrink the page table
//                 and the released pages. Exact (bitwise) everywhere except
//                 the scores of observe_queries, whose dot products are
//                 summed in another order: |device - host| <= 1e-4 *
//                 max(1, |host|), and for 0/1 observations
//                 (important_indicator) at most 1% of the tokens of a step
//                 may flip (a probability within float rounding of
//                 alpha / n). Before compress the device state is reset to
//                 the host's, so compress is always compared exactly from
//                 identical inputs. Unused rows of every attention view are
//                 NaN, so reading one shows up.
//   errors        device-side checks: status bits in the row at fault,
//                 nothing written for it, the other sequences equal to the
//                 host's run without it; batch-wide conditions; sticky rows
//                 and reset_sequence; host-side checks throw
//                 invalid_argument.
//   shrink        cuda::shrink_page_table against host::shrink_page_table on
//                 random tables (empty sequences, several chunks of
//                 sequences and rounds of pages), and its data errors.
//   graph         append, observe, compress and shrink_page_table (a paged
//                 cache, a state_rows mapping with a padding slot) captured
//                 in a CUDA graph, replayed step after step, against the
//                 host.
//   wide_elements a cache and queries of doubles (an 8-byte element type)
//                 at head_dim 64: observe_queries' generic kernel against
//                 the host (differential_wide.cu).
//   quantized, quantized_checks
//                 int8 / int4 caches (quantized_kv_view.hpp): observe from
//                 queries and compress against the host, kept code and
//                 parameter rows bit for bit; the non-finite K parameter
//                 check (status_k_params). See quantized.cuh.
//   argmin        compress's m = 1 selection (key_of_slot, lowest_of_thread,
//                 lowest_key_op: host and device functions) run thread by
//                 thread on the host against host::compress's victim; runs
//                 in host-only runs too. See argmin.cuh.
//   check_parity  the device's checks of a sequence's length, page table,
//                 state counters and query counts (host and device
//                 functions) run on the host: each broken input must be
//                 refused by the host naming the expected argument and
//                 flagged by the device with the expected bit. Runs in
//                 host-only runs too. See check_parity.cuh.
//
// Usage: scissorhands_cuda_test [--configs N] [--seed S] [--graph-steps N]
//                               [--only differential,errors,shrink,graph,wide_elements,quantized,
//                                       quantized_checks,argmin,check_parity]
//                               [--quick] [--long N] [--host-only]
// --quick (for compute-sanitizer) runs 24 small configurations and 8 graph
// steps; --long N makes the first N configurations long heads (> 4096
// slots: selection beyond the shared-memory tile), --quick or not;
// --host-only runs with no device: only what the host decides is checked
// (harness.cuh). Exit status: 0 all passed, 1 a failure, 77 no CUDA device
// (not with --host-only). The per-dtype
// kernels live in differential_<dtype>.cu (differential.cuh).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "differential.cuh"

namespace differential {

config make_config(std::mt19937_64& rng, int index, bool quick, int long_first) {
  config c;
  draw_kind(rng, c, index, 3, num_policies);
  c.path = policy_has_queries(c.policy) ? uniform(rng, 0, 3) : 0;
  const bool queries = c.path != 0;
  // One in 16 has a head longer than the selection's shared-memory tile.
  // (--long N: the first N are, --quick or not, so that a sanitizer run
  // reaches the > 4096-slot selection path.)
  const bool long_head = index < long_first || (!quick && index % 16 == 7);
  // One in 32 (not --quick) has 128 (sequence, KV head) lines of up to
  // ~2,600 slots with the log-sum-exp given: observe_queries' grid reaches
  // its block cap (qk_chunk_traits::max_blocks, detail/slot_chunks.hpp), so
  // a long sequence's blocks take chunks above min_chunk.
  const bool wide = !quick && !long_head && index % 32 == 15;
  if (wide) {
    c.policy = pick(rng, {0, 4});
    c.path = uniform(rng, 1, 2);
  }
  c.batch = long_head ? 1 : wide ? 16 : uniform(rng, 1, 5);
  c.kv_heads = long_head ? 1 : wide ? 8 : uniform(rng, 1, 3);
  // 12: both halves of an m16 tile, 20: beyond it.
  c.group = wide ? pick(rng, {1, 2, 4}) : pick(rng, {1, 2, 3, 4, 5, 8, 12, 20});
  c.head_dim = queries ? pick(rng, {64, 128, 256, 64, 128, 8, 16, 24, 40, 72, 3, 5, 7, 12})
                       : pick(rng, {8, 16, 64, 128, 3, 5, 12, 256});
  if (long_head) c.head_dim = pick(rng, {8, 16, 64});
  if (wide) c.head_dim = pick(rng, {8, 16});
  draw_sizes(rng, c, long_head, 40, [&](int protect) {
    return long_head ? uniform(rng, 4200, 5200)
           : wide    ? uniform(rng, 2100, 2600)
                     : protect + uniform(rng, 1, quick ? 20 : 60);
  });
  c.window = pick(rng, {1, 3, 8, 33, 64});
  c.alpha = pick(rng, {0.5f, 1.0f, 2.0f});
  c.decay = pick(rng, {0.5f, 0.9f, 1.0f});
  c.softmax_scale = coin(rng) ? 0.0f : pick(rng, {0.05f, 0.125f, 0.3f});
  c.normalize = coin(rng, 0.3);
  c.preserve_order = coin(rng);
  c.padded = coin(rng);
  c.v_other_layout = coin(rng, 0.25);
  c.ties = coin(rng, 0.3);
  c.freed_for_contiguous = coin(rng);
  c.mapped = coin(rng, 0.5);
  c.ragged = coin(rng, 0.4);
  c.token_major = coin(rng);
  c.tight_state = coin(rng, 0.3);
  c.steps = long_head || wide ? 2 : uniform(rng, 2, 5);
  draw_seed_and_pooling(rng, c);
  return c;
}

bool run_config(const config& c, mismatch_log& log) {
  switch (c.dtype) {
    case 0: return run_fp32(c, log);
    case 1: return run_fp16(c, log);
    default: return run_bf16(c, log);
  }
}

int run_differential(int configs, std::uint64_t seed, bool quick, int long_first) {
  int by_path[4] = {0, 0, 0, 0}, by_layout[4] = {0, 0, 0, 0}, by_dtype[3] = {0, 0, 0};
  int mapped = 0, ragged = 0, tight = 0;
  const int failed = run_configs(
      configs, seed, [&](std::mt19937_64& rng, int i) { return make_config(rng, i, quick, long_first); }, run_config,
      [&](const config& c) {
        ++by_path[c.path];
        ++by_layout[c.layout];
        ++by_dtype[c.dtype];
        mapped += c.mapped;
        ragged += c.ragged;
        tight += c.tight_state;
      });
  std::printf("differential: %d of %d configurations passed (paths: probabilities %d, queries+lse %d, "
              "queries+lse2 %d, queries %d; layouts NHD %d, HND %d, paged NHD %d, paged HND %d; fp32 %d, fp16 %d, "
              "bf16 %d; state rows %d, ragged %d, tight state %d)\n",
              configs - failed, configs, by_path[0], by_path[1], by_path[2], by_path[3], by_layout[0], by_layout[1],
              by_layout[2], by_layout[3], by_dtype[0], by_dtype[1], by_dtype[2], mapped, ragged, tight);
  return failed;
}

}  // namespace differential

using namespace differential;
#include "argmin.cuh"         // argmin_tests::run
#include "check_parity.cuh"   // check_parity_tests::run
#include "device_checks.cuh"  // run_error_tests, run_shrink_tests, run_graph_test
#include "quantized.cuh"      // quantized_tests::run_differential, run_checks

int main(int argc, char** argv) {
  int graph_steps = 96;
  suite_options o = parse_options(
      argc, argv, 1200,
      "[--configs N] [--seed S] [--graph-steps N] [--only differential,errors,shrink,graph,wide_elements,quantized,"
      "quantized_checks,argmin,check_parity] [--quick] [--long N] [--host-only]",
      [&](const std::string& a, auto& next) {
        if (a != "--graph-steps") return false;
        graph_steps = std::stoi(next());
        return true;
      });
  if (o.quick) {
    o.configs = std::min(o.configs, 24);
    graph_steps = std::min(graph_steps, 8);
  }
  start(argv[0], o.seed, o.host_only);
  const std::string& only = o.only;
  int failures = 0;
  failures +=
      run_part(only, "differential", [&] { return run_differential(o.configs, o.seed, o.quick, o.long_first); });
  failures += run_part(only, "errors", [] { return run_error_tests(); });
  failures += run_part(only, "shrink", [&] { return run_shrink_tests(o.seed, o.quick); });
  failures += run_part(only, "graph", [&] { return run_graph_test(graph_steps); });
  failures += run_part(only, "wide_elements", [] { return run_wide_elements(); });
  failures += run_part(only, "quantized", [] { return quantized_tests::run_differential(); });
  failures += run_part(only, "quantized_checks", [] { return quantized_tests::run_checks(); });
  failures += run_part(only, "argmin", [] { return argmin_tests::run(); });
  failures += run_part(only, "check_parity", [] { return check_parity_tests::run(); });
  return finish(failures);
}
