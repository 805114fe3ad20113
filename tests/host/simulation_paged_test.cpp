// The host backend against the brute-force oracle on paged caches: page
// sizes 1, 3 and 16, pages handed out from a scrambled pool (and freed pages
// returned to it at scrambled places), NHD, HND and padded page layouts.
// After every compress the test checks freed_pages and last_page_len and
// releases the pages with release_freed_pages (see support.hpp).
#include <catch2/catch.hpp>

#include <vector>

#include "policies.hpp"
#include "simulation.hpp"

namespace {

using namespace sh_test;

enum class page_layout { nhd, hnd, padded_mixed };

struct paged_variant {
  std::int32_t page_size;
  page_layout layout;
  sim_spec spec;
};

std::vector<paged_variant> paged_variants() {
  using sh::compaction;
  std::vector<paged_variant> v;
  v.push_back({1, page_layout::nhd,
               make_sim_spec(2, 2, 8, {9, 14, 5}, 3, 1, 35, 12, 1, 3, 0, 6, compaction::fill_holes, false, 31)});
  v.push_back({3, page_layout::hnd,
               make_sim_spec(2, 4, 8, {17, 4, 11}, 2, 2, 35, 13, 3, 2, 2, 6, compaction::preserve_order, true, 32)});
  // Budget 40, m 10: every compress drops from 3 pages of 16 to 2.
  v.push_back({16, page_layout::nhd,
               make_sim_spec(2, 1, 8, {50, 20}, 6, 1, 40, 40, 10, 6, 1, 6, compaction::fill_holes, false, 33)});
  v.push_back({3, page_layout::padded_mixed,
               make_sim_spec(3, 8, 8, {7, 12}, 1, 1, 40, 10, 2, 2, 0, 6, compaction::fill_holes, true, 34)});
  v.back().spec.quantized = true;
  return v;
}

paged_cache make_paged(const paged_variant& var) {
  const auto& s = var.spec;
  const std::int32_t P = var.page_size, H = s.kv_heads, D = s.head_dim;
  const auto nhd = sh::paged_layout::nhd(P, H, D);
  const auto hnd = sh::paged_layout::hnd(P, H, D);
  switch (var.layout) {
    case page_layout::nhd: return {s.batch(), H, D, P, s.capacity(), nhd, nhd, s.seed};
    case page_layout::hnd: return {s.batch(), H, D, P, s.capacity(), hnd, hnd, s.seed};
    case page_layout::padded_mixed: {
      // K: [page][token][head][dim] with rows padded to D + 2 and pages by 3; V: HND.
      const std::int64_t row = D + 2;
      const sh::paged_layout k{P * H * row + 3, row, H * row};
      return {s.batch(), H, D, P, s.capacity(), k, hnd, s.seed};
    }
  }
  return {s.batch(), H, D, P, s.capacity(), nhd, nhd, s.seed};
}

template <class Policy>
void run_paged() {
  std::int64_t evicted = 0;
  for (const auto& var : paged_variants()) {
    INFO("page size " << var.page_size << ", layout " << static_cast<int>(var.layout));
    auto cache = make_paged(var);
    evicted += simulate<Policy>(var.spec, cache);
  }
  CHECK(evicted > 100);
}

}  // namespace

TEMPLATE_TEST_CASE("paged caches match the oracle", "[oracle][paged]", mass_unbounded, mass_window, mass_decay,
                   indicator_unbounded, indicator_window, indicator_decay, mass_window_max, unimportant_window,
                   key_norm_static, recency_static, random_static) {
  run_paged<TestType>();
}
