// Randomised simulations (fixed seeds): many small configurations drawn at
// random, for every policy, on contiguous and paged caches, each checked
// against the oracle exactly as the hand-picked ones are. They reach the
// corners the hand-picked ones skip: head_dim 1, r = 0, large sinks, w = 1,
// m = budget - protected, several queries per decode step, odd page sizes.
#include <catch2/catch.hpp>

#include <array>
#include <vector>

#include "policies.hpp"
#include "simulation.hpp"

namespace {

using namespace sh_test;

struct draw {
  std::uint64_t seed;
  std::int64_t salt = 0;
  std::int32_t operator()(std::int32_t n) {
    return static_cast<std::int32_t>(hash_of({static_cast<std::int64_t>(seed), salt++}) % static_cast<std::uint64_t>(n));
  }
  template <class T, std::size_t N>
  T pick(const std::array<T, N>& a) {
    return a[static_cast<std::size_t>((*this)(static_cast<std::int32_t>(N)))];
  }
};

sim_spec random_spec(std::uint64_t seed) {
  draw r{seed};
  sim_spec s;
  s.seed = seed;
  s.kv_heads = 1 + r(3);
  s.group = r.pick(std::array{1, 2, 3, 4, 8});
  s.head_dim = r.pick(std::array{1, 4, 8, 16});
  s.config.recent = r(5);
  s.config.sinks = r(3) == 0 ? r(6) : 0;
  const std::int32_t protect = s.config.recent + s.config.sinks;
  s.budget = protect + 1 + r(20);
  s.config.evict_count = 1 + (r(3) == 0 ? s.budget - protect - 1 : r(std::min(4, s.budget - protect)));
  s.config.window = r.pick(std::array{1, 2, 5, 32, 33});
  s.config.alpha = r.pick(std::array{0.5f, 1.0f, 1.5f});
  s.config.decay = r.pick(std::array{0.5f, 0.9f, 1.0f});
  s.config.normalize = r(2) == 1;
  s.config.compaction_mode = r(2) ? sh::compaction::fill_holes : sh::compaction::preserve_order;
  s.quantized = r(2) == 1;
  s.prefill_q = 1 + r(4);
  s.decode_q = 1 + (r(3) == 0 ? r(3) : 0);
  const std::int32_t batch = 1 + r(4);
  for (std::int32_t b = 0; b < batch; ++b) s.prefill.push_back(s.prefill_q + r(2 * s.budget));
  // Enough calls for every sequence to reach the budget and evict a few times.
  s.calls = s.budget + 6 + r(15);
  // Pooling (SnapKV) needs slot order = position order: preserve_order only.
  // Drawn last, so the earlier draws (and configurations) stay as they were.
  if (s.config.compaction_mode == sh::compaction::preserve_order) {
    s.config.pool_width = r.pick(std::array{1, 1, 3, 5, 9});
    s.config.pool_mode = r(2) == 1 ? sh::pooling::max : sh::pooling::mean;
  }
  return s;
}

template <class Policy>
void run_random(std::uint64_t base, std::int32_t count) {
  std::int64_t evicted = 0;
  for (std::int32_t i = 0; i < count; ++i) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(i);
    const sim_spec spec = random_spec(seed);
    draw r{seed ^ 0xABCDEFull};
    if (r(2) == 0) {
      const auto kind = static_cast<layout_kind>(r(5));
      INFO("contiguous, layout " << name_of(kind));
      auto cache = make_contiguous(kind, spec.batch(), spec.kv_heads, spec.head_dim, spec.capacity(), seed);
      cache.pass_freed = r(2) == 1;
      evicted += simulate<Policy>(spec, cache);
    } else {
      const std::int32_t P = r.pick(std::array{1, 2, 3, 5, 16});
      const auto nhd = sh::paged_layout::nhd(P, spec.kv_heads, spec.head_dim);
      const auto hnd = sh::paged_layout::hnd(P, spec.kv_heads, spec.head_dim);
      const bool k_hnd = r(2) == 1, v_hnd = r(2) == 1;
      INFO("paged, page size " << P << ", K " << (k_hnd ? "hnd" : "nhd") << ", V " << (v_hnd ? "hnd" : "nhd"));
      paged_cache cache(spec.batch(), spec.kv_heads, spec.head_dim, P, spec.capacity(), k_hnd ? hnd : nhd,
                        v_hnd ? hnd : nhd, seed);
      evicted += simulate<Policy>(spec, cache);
    }
  }
  CHECK(evicted > count * 10);
}

}  // namespace

TEMPLATE_TEST_CASE("random configurations match the oracle", "[oracle][random]", mass_unbounded, mass_window,
                   mass_decay, indicator_unbounded, indicator_window, indicator_decay, mass_window_max,
                   indicator_unbounded_max, unimportant_window, unimportant_unbounded_max, key_norm_static, recency_static,
                   random_static) {
  run_random<TestType>(1000, 40);
}
