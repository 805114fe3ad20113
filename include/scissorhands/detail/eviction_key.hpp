#pragma once
// The total order in which tokens are evicted, shared by both backends:
// NaN first, then lowest score, ties to the older token (smaller position). Packed in
// one uint64 so selection is integer comparison (and radix-selectable).
#include <cstdint>

#include "../config.hpp"
#include "../policy/settings.hpp"

namespace scissorhands::detail {

// Maps a float to a uint32 with the same order; -0 equals +0 and every NaN
// sorts below -inf, so the order is total and never undefined. NaN first:
// a NaN score (a NaN query or key observed without a log-sum-exp, a
// damaged state) is no evidence that the token mattered, and sorted last
// it would never be evicted and hold its slot for the sequence's life.
SCISSORHANDS_HOST_DEVICE inline std::uint32_t ordered_bits(float x) {
  if (x != x) return 0u;
  if (x == 0.0f) x = 0.0f;
  const std::uint32_t u = __builtin_bit_cast(std::uint32_t, x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The score compress compares, lowest first: optionally divided by the steps
// observed, so a young token's short history neither favours nor penalises
// it, and negated for a policy whose score counts against the token
// (evicts_highest), so its highest scores go first.
SCISSORHANDS_HOST_DEVICE inline float eviction_score(float score, float observed, const settings& s,
                                                     bool highest_first = false) {
  const float v = (s.normalize && observed > 0.0f) ? score / observed : score;
  return highest_first ? -v : v;
}

inline constexpr std::int32_t max_pool_width = 255;

// The eviction score of slot t of one (sequence, head) row, pooled over the
// slots [t - h, t + h] clipped to [0, length), h = (pool_width - 1) / 2
// (settings.pool_width = 1: eviction_score of t itself). `scores` and
// `observed` point at slot 0 of the row. Max propagates a NaN like
// max_score; the mean sums in slot order and divides by the slots in the
// pool, so both backends give the same bits.
SCISSORHANDS_HOST_DEVICE inline float pooled_eviction_score(const float* scores, const float* observed,
                                                            std::int32_t t, std::int32_t length, const settings& s,
                                                            bool highest_first = false) {
  if (s.pool_width <= 1) return eviction_score(scores[t], observed[t], s, highest_first);
  const std::int32_t half = (s.pool_width - 1) / 2;
  const std::int32_t first = t - half < 0 ? 0 : t - half;
  const std::int32_t last = t + half >= length ? length - 1 : t + half;
  if (s.pool_mode == pooling::max) {
    float best = eviction_score(scores[first], observed[first], s, highest_first);
    for (std::int32_t u = first + 1; u <= last; ++u) {
      const float v = eviction_score(scores[u], observed[u], s, highest_first);
      best = (v != v || best != best) ? (best != best ? best : v) : (v > best ? v : best);
    }
    return best;
  }
  float sum = 0.0f;
  for (std::int32_t u = first; u <= last; ++u) sum += eviction_score(scores[u], observed[u], s, highest_first);
  return sum / static_cast<float>(last - first + 1);
}

SCISSORHANDS_HOST_DEVICE inline std::uint64_t eviction_key(float score, std::int32_t position) {
  // Positions are non-negative; the bias keeps a negative one ordered too.
  return (std::uint64_t{ordered_bits(score)} << 32) |
         std::uint64_t(static_cast<std::uint32_t>(position) ^ 0x80000000u);
}

}  // namespace scissorhands::detail
