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
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t group) {
    return acc / static_cast<float>(group);
  }
};

struct gqa_max {
  static constexpr const char* name = "max";
  SCISSORHANDS_HOST_DEVICE static constexpr float identity() { return 0.0f; }
  SCISSORHANDS_HOST_DEVICE static float combine(float acc, float p) { return p > acc ? p : acc; }
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t) { return acc; }
};

}  // namespace scissorhands
