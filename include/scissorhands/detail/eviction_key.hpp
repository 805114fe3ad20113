#pragma once
// The total order in which tokens are evicted, shared by both backends:
// lowest score first, ties to the older token (smaller position). Packed in
// one uint64 so selection is integer comparison (and radix-selectable).
#include <cstdint>

#include "../config.hpp"
#include "../policy/settings.hpp"

namespace scissorhands::detail {

// Maps a float to a uint32 with the same order; -0 equals +0 and every NaN
// sorts above +inf, so the order is total and never undefined.
SCISSORHANDS_HOST_DEVICE inline std::uint32_t ordered_bits(float x) {
  if (x != x) return 0xFFFFFFFFu;
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

SCISSORHANDS_HOST_DEVICE inline std::uint64_t eviction_key(float score, std::int32_t position) {
  // Positions are non-negative; the bias keeps a negative one ordered too.
  return (std::uint64_t{ordered_bits(score)} << 32) |
         std::uint64_t(static_cast<std::uint32_t>(position) ^ 0x80000000u);
}

}  // namespace scissorhands::detail
