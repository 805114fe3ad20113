#pragma once
// GQA reductions: how the probabilities of the query heads that share one KV
// head are combined before they are observed. K/V are never duplicated.
#include <cstdint>

#include "../config.hpp"

namespace scissorhands {

struct gqa_mean {
  static constexpr const char* name = "mean";
  SCISSORHANDS_HOST_DEVICE static constexpr float identity() { return 0.0f; }
  SCISSORHANDS_HOST_DEVICE static float combine(float acc, float p) { return acc + p; }
  // For a power-of-two group the product by the exact reciprocal is the
  // quotient, bit for bit (one rounding of the same real number), and a
  // multiply where a divide would set the pace of observe's combine loop.
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t group) {
    const auto g = static_cast<float>(group);
    return (group & (group - 1)) == 0 ? acc * (1.0f / g) : acc / g;
  }
};

struct gqa_max {
  static constexpr const char* name = "max";
  SCISSORHANDS_HOST_DEVICE static constexpr float identity() { return 0.0f; }
  SCISSORHANDS_HOST_DEVICE static float combine(float acc, float p) { return p > acc ? p : acc; }
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t) { return acc; }
};

}  // namespace scissorhands
