// Budget allocators: every split sums to the total, gives each layer at
// least one token, has the shape its name promises, and refuses bad input
// with the argument named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;

std::int64_t sum_of(const std::vector<std::int32_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

const std::vector<std::int64_t> totals{32, 33, 100, 4097, 65536, 1'000'003};
const std::vector<std::int32_t> layer_counts{1, 2, 5, 32};

}  // namespace

TEST_CASE("uniform budget: equal shares, the remainder to the earliest layers", "[budget]") {
  for (auto L : layer_counts)
    for (auto total : totals) {
      INFO("layers " << L << ", total " << total);
      const auto b = sh::uniform_budget{}.allocate(total, L);
      REQUIRE(b.size() == static_cast<std::size_t>(L));
      CHECK(sum_of(b) == total);
      CHECK(std::is_sorted(b.rbegin(), b.rend()));  // non-increasing
      CHECK(b.front() - b.back() <= 1);
      CHECK(b.back() == total / L);
    }
}

TEST_CASE("ramp budget grows toward later layers, pyramid shrinks", "[budget]") {
  for (double slope : {0.0, 0.25, 0.5, 0.9})
    for (auto L : layer_counts)
      for (auto total : totals) {
        if (total < L) continue;
        INFO("slope " << slope << ", layers " << L << ", total " << total);
        const auto ramp = sh::ramp_budget{slope}.allocate(total, L);
        const auto pyramid = sh::pyramid_budget{slope}.allocate(total, L);
        REQUIRE(ramp.size() == static_cast<std::size_t>(L));
        REQUIRE(pyramid.size() == static_cast<std::size_t>(L));
        CHECK(sum_of(ramp) == total);
        CHECK(sum_of(pyramid) == total);
        CHECK(*std::min_element(ramp.begin(), ramp.end()) >= 1);
        CHECK(*std::min_element(pyramid.begin(), pyramid.end()) >= 1);
        if (slope > 0.0) {
          CHECK(std::is_sorted(ramp.begin(), ramp.end()));
          CHECK(std::is_sorted(pyramid.rbegin(), pyramid.rend()));
        }
        // With room to spare, last / first approaches (1 + slope) / (1 - slope).
        if (L > 1 && total >= 65536) {
          const double ratio = static_cast<double>(ramp.back()) / ramp.front();
          CHECK(ratio == Approx((1.0 + slope) / (1.0 - slope)).epsilon(0.01));
          const double mirror = static_cast<double>(pyramid.front()) / pyramid.back();
          CHECK(mirror == Approx((1.0 + slope) / (1.0 - slope)).epsilon(0.01));
        }
      }
  // Slope 0 is the uniform split.
  CHECK(sh::ramp_budget{0.0}.allocate(1000, 7) == sh::uniform_budget{}.allocate(1000, 7));
}

TEST_CASE("explicit budget returns the list it was given", "[budget]") {
  const sh::explicit_budget e{{5, 1, 9, 30}};
  CHECK(e.allocate(45, 4) == std::vector<std::int32_t>{5, 1, 9, 30});
  CHECK(refused_argument([&] { (void)e.allocate(44, 4); }) == "total");
  CHECK(refused_argument([&] { (void)e.allocate(45, 3); }) == "budgets");
  CHECK(refused_argument([&] { (void)sh::explicit_budget{{5, 0, 40}}.allocate(45, 3); }) == "budgets");
  CHECK(refused_argument([&] { (void)sh::explicit_budget{{5, -1, 41}}.allocate(45, 3); }) == "budgets");
}

TEST_CASE("persistence budget gives less persistent layers more", "[budget]") {
  const std::vector<double> persistence{0.9, 0.8, 0.7, 0.3, 1.0};
  const auto b = sh::persistence_budget{persistence}.allocate(10000, 5);
  REQUIRE(b.size() == 5);
  CHECK(sum_of(b) == 10000);
  CHECK(b[0] < b[1]);
  CHECK(b[1] < b[2]);
  CHECK(b[2] < b[3]);
  // Proportional to 1 - persistence: layer 3 (0.7) gets 7x layer 0 (0.1).
  CHECK(static_cast<double>(b[3]) / b[0] == Approx(7.0).epsilon(0.01));
  // A perfectly persistent layer keeps the floor weight (0.05): half of layer 0.
  CHECK(static_cast<double>(b[4]) / b[0] == Approx(0.5).epsilon(0.01));
  CHECK(refused_argument([&] { (void)sh::persistence_budget{{0.5, 1.5}}.allocate(100, 2); }) == "persistence");
  CHECK(refused_argument([&] { (void)sh::persistence_budget{{0.5, -0.1}}.allocate(100, 2); }) == "persistence");
  CHECK(refused_argument([&] { (void)sh::persistence_budget{{0.5}}.allocate(100, 2); }) == "persistence");
  CHECK(refused_argument([&] { (void)sh::persistence_budget{{0.5, 0.5}, 0.0}.allocate(100, 2); }) == "floor");
}

TEST_CASE("total budgets: tokens per head and compression ratio", "[budget]") {
  CHECK(sh::total_budget::tokens_per_head(512, 32).tokens == 512 * 32);
  CHECK(sh::total_budget::compression_ratio(0.2, 2048, 32).tokens == 409 * 32);
  CHECK(sh::total_budget::compression_ratio(1.0, 2048, 4).tokens == 2048 * 4);
  // A tiny ratio still keeps one token per layer.
  CHECK(sh::total_budget::compression_ratio(1e-9, 2048, 4).tokens == 4);
  const auto via_entry = sh::allocate(sh::ramp_budget{0.5}, sh::total_budget::tokens_per_head(512, 32), 32);
  CHECK(via_entry == sh::ramp_budget{0.5}.allocate(512 * 32, 32));
  CHECK(sum_of(via_entry) == 512 * 32);
}

TEST_CASE("budget allocators refuse bad input, naming the argument", "[budget]") {
  CHECK(refused_argument([] { (void)sh::uniform_budget{}.allocate(3, 4); }) == "total");
  CHECK(refused_argument([] { (void)sh::uniform_budget{}.allocate(100, 0); }) == "num_layers");
  CHECK(refused_argument([] { (void)sh::uniform_budget{}.allocate(100, -2); }) == "num_layers");
  CHECK(refused_argument([] { (void)sh::uniform_budget{}.allocate(std::int64_t{1} << 40, 2); }) == "total");
  CHECK(refused_argument([] { (void)sh::ramp_budget{1.0}.allocate(100, 4); }) == "slope");
  CHECK(refused_argument([] { (void)sh::ramp_budget{-0.1}.allocate(100, 4); }) == "slope");
  CHECK(refused_argument([] { (void)sh::pyramid_budget{1.5}.allocate(100, 4); }) == "slope");
  CHECK(refused_argument([] { (void)sh::total_budget::tokens_per_head(0, 4); }) == "per_layer");
  CHECK(refused_argument([] { (void)sh::total_budget::tokens_per_head(10, 0); }) == "num_layers");
  CHECK(refused_argument([] { (void)sh::total_budget::compression_ratio(0.0, 100, 4); }) == "ratio");
  CHECK(refused_argument([] { (void)sh::total_budget::compression_ratio(1.01, 100, 4); }) == "ratio");
  CHECK(refused_argument([] { (void)sh::total_budget::compression_ratio(0.5, 0, 4); }) == "max_sequence_length");
  CHECK(refused_argument([] { (void)sh::total_budget::compression_ratio(0.5, 100, 0); }) == "num_layers");
  // The message names the function and the bound.
  try {
    (void)sh::uniform_budget{}.allocate(3, 4);
    FAIL("no error");
  } catch (const sh::invalid_argument& e) {
    CHECK(e.function() == "uniform_budget::allocate");
    CHECK_THAT(e.what(), Catch::Contains("at least 1 token"));
  }
}
