#pragma once
// Budget allocators: split a total token budget (summed over layers, per KV
// head) across layers. Setup-time code: may allocate, never runs per step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "concepts.hpp"

namespace scissorhands {

// The total, given either as the average tokens each layer may keep per
// head, or as a compression ratio of the longest sequence the engine serves.
struct total_budget {
  std::int64_t tokens = 0;  // summed over layers

  static total_budget tokens_per_head(std::int32_t per_layer, std::int32_t num_layers) {
    detail::require(per_layer > 0, "total_budget::tokens_per_head", "per_layer", "must be positive, got ", per_layer);
    detail::require(num_layers > 0, "total_budget::tokens_per_head", "num_layers", "must be positive, got ",
                    num_layers);
    return {std::int64_t{per_layer} * num_layers};
  }
  // ratio = kept / full, in (0, 1]: 0.2 keeps a fifth of max_sequence_length.
  static total_budget compression_ratio(double ratio, std::int32_t max_sequence_length, std::int32_t num_layers) {
    detail::require(ratio > 0.0 && ratio <= 1.0, "total_budget::compression_ratio", "ratio", "must be in (0, 1], got ",
                    ratio);
    detail::require(max_sequence_length > 0, "total_budget::compression_ratio", "max_sequence_length",
                    "must be positive, got ", max_sequence_length);
    detail::require(num_layers > 0, "total_budget::compression_ratio", "num_layers", "must be positive, got ",
                    num_layers);
    const auto per_layer = static_cast<std::int64_t>(std::floor(ratio * max_sequence_length));
    return {std::max<std::int64_t>(1, per_layer) * num_layers};
  }
};

namespace detail {

// Splits total in proportion to weights, each layer at least 1, summing to
// total exactly (largest remainder; ties to the earlier layer).
inline std::vector<std::int32_t> split_by_weights(const char* fn, std::int64_t total,
                                                  const std::vector<double>& weights) {
  const auto layers = static_cast<std::int64_t>(weights.size());
  require(layers > 0, fn, "num_layers", "must be positive, got ", layers);
  require(total >= layers, fn, "total", "must give every one of ", layers, " layers at least 1 token, got ", total);
  require(total / layers <= INT32_MAX, fn, "total", "gives a layer more than INT32_MAX tokens: ", total);
  double sum = 0.0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    require(std::isfinite(weights[i]) && weights[i] > 0.0, fn, "weights", "[", i, "] must be finite and positive, got ",
            weights[i]);
    sum += weights[i];
  }
  // Everyone gets 1 up front; the rest is shared by weight.
  const std::int64_t rest = total - layers;
  std::vector<std::int64_t> out(weights.size(), 1);
  std::vector<std::pair<double, std::size_t>> remainders;
  std::int64_t given = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(rest) * weights[i] / sum;
    const auto whole = static_cast<std::int64_t>(std::floor(exact));
    out[i] += whole;
    given += whole;
    remainders.emplace_back(exact - static_cast<double>(whole), i);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::int64_t k = 0; k < rest - given; ++k) out[remainders[static_cast<std::size_t>(k)].second] += 1;
  std::vector<std::int32_t> budgets(out.begin(), out.end());
  return budgets;
}

}  // namespace detail

// Every layer the same.
struct uniform_budget {
  std::vector<std::int32_t> allocate(std::int64_t total, std::int32_t layers) const {
    return detail::split_by_weights("uniform_budget::allocate", total,
                                    std::vector<double>(static_cast<std::size_t>(std::max(layers, 0)), 1.0));
  }
};

// Linear ramp: layer l gets weight 1 + slope * (2 l / (L - 1) - 1), so the
// last layer has (1 + slope) / (1 - slope) times the first's (the paper:
// later layers persist less and need more).
struct ramp_budget {
  double slope = 0.5;  // in [0, 1)
  std::vector<std::int32_t> allocate(std::int64_t total, std::int32_t layers) const {
    return detail::split_by_weights("ramp_budget::allocate", total, weights(layers, slope, "ramp_budget::allocate"));
  }
  static std::vector<double> weights(std::int32_t layers, double slope, const char* fn) {
    detail::require(slope >= 0.0 && slope < 1.0, fn, "slope", "must be in [0, 1), got ", slope);
    std::vector<double> w(static_cast<std::size_t>(std::max(layers, 0)), 1.0);
    for (std::int32_t l = 0; l < layers && layers > 1; ++l)
      w[static_cast<std::size_t>(l)] = 1.0 + slope * (2.0 * l / (layers - 1) - 1.0);
    return w;
  }
};

// The mirror of the ramp: earlier layers get more (PyramidKV).
struct pyramid_budget {
  double slope = 0.5;  // in [0, 1)
  std::vector<std::int32_t> allocate(std::int64_t total, std::int32_t layers) const {
    auto w = ramp_budget::weights(layers, slope, "pyramid_budget::allocate");
    std::reverse(w.begin(), w.end());
    return detail::split_by_weights("pyramid_budget::allocate", total, w);
  }
};

// Exactly the budgets given; total must equal their sum.
struct explicit_budget {
  std::vector<std::int32_t> budgets;
  std::vector<std::int32_t> allocate(std::int64_t total, std::int32_t layers) const {
    const char* fn = "explicit_budget::allocate";
    detail::require(static_cast<std::int64_t>(budgets.size()) == layers, fn, "budgets", "must list num_layers = ",
                    layers, " budgets, got ", budgets.size());
    for (std::size_t i = 0; i < budgets.size(); ++i)
      detail::require(budgets[i] > 0, fn, "budgets", "[", i, "] must be positive, got ", budgets[i]);
    const std::int64_t sum = std::accumulate(budgets.begin(), budgets.end(), std::int64_t{0});
    detail::require(sum == total, fn, "total", "must equal the sum of the budgets, ", sum, ", got ", total);
    return budgets;
  }
};

// From measured persistence ratios (one per layer, in [0, 1]): a layer whose
// important tokens persist less needs more room, weight 1 - persistence
// (floored at `floor` so a perfectly persistent layer keeps some budget).
struct persistence_budget {
  std::vector<double> persistence;
  double floor = 0.05;
  std::vector<std::int32_t> allocate(std::int64_t total, std::int32_t layers) const {
    const char* fn = "persistence_budget::allocate";
    detail::require(static_cast<std::int64_t>(persistence.size()) == layers, fn, "persistence",
                    "must list num_layers = ", layers, " ratios, got ", persistence.size());
    detail::require(floor > 0.0 && floor <= 1.0, fn, "floor", "must be in (0, 1], got ", floor);
    std::vector<double> w;
    for (std::size_t i = 0; i < persistence.size(); ++i) {
      detail::require(persistence[i] >= 0.0 && persistence[i] <= 1.0, fn, "persistence", "[", i,
                      "] must be in [0, 1], got ", persistence[i]);
      w.push_back(std::max(floor, 1.0 - persistence[i]));
    }
    return detail::split_by_weights(fn, total, w);
  }
};

static_assert(budget_allocator<uniform_budget>);
static_assert(budget_allocator<ramp_budget>);
static_assert(budget_allocator<pyramid_budget>);
static_assert(budget_allocator<explicit_budget>);
static_assert(budget_allocator<persistence_budget>);

// allocate(allocator, total, layers): the checked entry point.
template <budget_allocator A>
std::vector<std::int32_t> allocate(const A& allocator, total_budget total, std::int32_t num_layers) {
  return allocator.allocate(total.tokens, num_layers);
}

}  // namespace scissorhands
