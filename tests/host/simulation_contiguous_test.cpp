// The host backend against the brute-force oracle on contiguous caches:
// every policy combination, NHD, HND and arbitrary strides, GQA groups
// 1/2/4/8, ragged batches, m = 1 and m > 1, prefill then decode, both
// compaction modes. See simulation.hpp for what is checked after each call.
#include <catch2/catch.hpp>

#include <vector>

#include "policies.hpp"
#include "simulation.hpp"

namespace {

using namespace sh_test;

struct variant {
  layout_kind layout;
  sim_spec spec;
  bool pass_freed = true;
};

std::vector<variant> contiguous_variants() {
  using sh::compaction;
  std::vector<variant> v;
  // Ragged prefill: one sequence above the budget, one below, one between.
  // Groups 1/2/4/8 as in real models, and 3, where the mean's division is
  // not exact (a multiply by 1/3 would round differently).
  v.push_back({layout_kind::nhd,
               make_sim_spec(2, 1, 8, {30, 9, 17}, 4, 1, 45, 16, 1, 4, 0, 5, compaction::fill_holes, false, 11)});
  v.push_back({layout_kind::hnd,
               make_sim_spec(2, 2, 8, {12, 20, 6}, 3, 2, 40, 14, 3, 3, 2, 37, compaction::preserve_order, true, 12)});
  v.back().spec.config.alpha = 0.5f;
  v.push_back({layout_kind::padded,
               make_sim_spec(3, 4, 12, {1, 3}, 1, 1, 50, 12, 1, 2, 1, 5, compaction::preserve_order, false, 13)});
  v.back().spec.quantized = true;
  v.push_back({layout_kind::mixed,
               make_sim_spec(2, 8, 8, {20, 25, 16, 2}, 2, 1, 35, 18, 5, 4, 0, 7, compaction::fill_holes, true, 14)});
  v.back().spec.config.decay = 0.8f;
  v.push_back({layout_kind::sequence_inner,
               make_sim_spec(2, 3, 8, {10, 4, 13}, 2, 1, 40, 15, 2, 5, 3, 5, compaction::fill_holes, false, 15),
               false});
  v.back().spec.quantized = true;
  // One sequence, the largest m the budget allows (budget - r - s).
  v.push_back({layout_kind::nhd,
               make_sim_spec(1, 1, 8, {24}, 5, 1, 30, 12, 8, 3, 1, 5, compaction::preserve_order, false, 16)});
  // A full causal prefill (every token a query), then multi-token steps.
  v.push_back({layout_kind::hnd,
               make_sim_spec(2, 4, 8, {40, 40}, 40, 3, 20, 20, 1, 2, 0, 9, compaction::fill_holes, false, 17)});
  v.back().spec.config.alpha = 2.0f;
  return v;
}

template <class Policy>
void run_contiguous() {
  std::int64_t evicted = 0;
  for (const auto& var : contiguous_variants()) {
    INFO("layout " << name_of(var.layout));
    auto cache = make_contiguous(var.layout, var.spec.batch(), var.spec.kv_heads, var.spec.head_dim,
                                 var.spec.capacity(), var.spec.seed);
    cache.pass_freed = var.pass_freed;
    evicted += simulate<Policy>(var.spec, cache);
  }
  CHECK(evicted > 100);
}

}  // namespace

TEMPLATE_TEST_CASE("contiguous caches match the oracle", "[oracle][contiguous]", mass_unbounded, mass_window,
                   mass_decay, indicator_unbounded, indicator_window, indicator_decay, mass_window_max,
                   indicator_unbounded_max, unimportant_window, unimportant_unbounded_max, key_norm_static, recency_static,
                   random_static) {
  run_contiguous<TestType>();
}

TEST_CASE("recency with sinks is StreamingLLM: sinks plus the newest tokens stay", "[oracle][contiguous]") {
  // Independent of the oracle: with equal scores the tie-break evicts the
  // oldest unprotected tokens, so exactly sinks + the newest remain.
  sim_spec spec = make_sim_spec(2, 1, 8, {20, 7}, 1, 1, 30, 10, 1, 3, 2, 5, sh::compaction::preserve_order, false, 21);
  auto cache = make_contiguous(layout_kind::nhd, spec.batch(), spec.kv_heads, spec.head_dim, spec.capacity(), 3);
  sh::streaming_policy policy;
  policy.config = spec.config;
  simulation<sh::streaming_policy, contiguous_cache> sim(spec, policy, cache);
  sim.run();
  for (std::int32_t b = 0; b < spec.batch(); ++b)
    for (std::int32_t h = 0; h < spec.kv_heads; ++h) {
      const auto& kept = sim.slots(b, h);
      const std::int32_t next = sim.model().next_position(b);
      std::vector<std::int32_t> want{0, 1};
      for (std::int32_t p = next - (cache.length(b) - 2); p < next; ++p) want.push_back(p);
      CHECK(kept == want);
    }
}
