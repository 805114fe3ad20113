#pragma once
// Observation policies: what one step's attention contributes to a token's
// importance. Attention policies read probabilities; static policies give a
// token its score once, when it is admitted, and need no attention at all.
#include <cmath>
#include <cstdint>

#include "../config.hpp"
#include "../element.hpp"
#include "settings.hpp"

namespace scissorhands {

// H2O: the attention mass itself.
struct attention_mass {
  static constexpr const char* name = "attention_mass";
  static constexpr bool needs_attention = true;
  static constexpr bool binary = false;  // contributions are real numbers
  SCISSORHANDS_HOST_DEVICE static float contribution(float probability, std::int32_t visible, const settings&) {
    (void)visible;
    return probability;
  }
};

// Scissorhands: 1 when the token was important at this step, i.e. its
// probability reached alpha times the uniform average 1 / n_t.
struct important_indicator {
  static constexpr const char* name = "important_indicator";
  static constexpr bool needs_attention = true;
  static constexpr bool binary = true;  // contributions are 0 or 1
  SCISSORHANDS_HOST_DEVICE static float contribution(float probability, std::int32_t visible, const settings& s) {
    return probability >= s.alpha / static_cast<float>(visible) ? 1.0f : 0.0f;
  }
};

// The paper's Compress step: 1 when the token was *unimportant* at this
// step, its probability below alpha times the uniform average 1 / n_t. Its
// history counts unimportant steps, and compress evicts the HIGHEST counts
// first (ties: the older token): a token that has just left the recent
// window has had few chances to be unimportant and is kept, an old token
// that keeps being ignored goes first. (important_indicator counts the
// important steps and evicts the lowest count, which evicts young tokens
// first; with settings.normalize the two rank alike.)
struct unimportant_indicator {
  static constexpr const char* name = "unimportant_indicator";
  static constexpr bool needs_attention = true;
  static constexpr bool binary = true;          // contributions are 0 or 1
  static constexpr bool evict_highest = true;   // the score counts against the token
  SCISSORHANDS_HOST_DEVICE static float contribution(float probability, std::int32_t visible, const settings& s) {
    return probability < s.alpha / static_cast<float>(visible) ? 1.0f : 0.0f;
  }
};

// Static: tokens with a small key norm tend to draw high attention, so the
// score is -||k||_2 (the largest norms are evicted first). The sum runs over
// the dimensions in order with fmaf, on the host and the device alike, so
// both backends give the same bits.
struct key_norm {
  static constexpr const char* name = "key_norm";
  static constexpr bool needs_attention = false;
  static constexpr bool binary = false;
  static constexpr bool reads_keys = true;  // admit needs the K rows (a kv_view or paged_kv_view)
  template <class T>
  SCISSORHANDS_HOST_DEVICE static float static_score(const T* key, std::int32_t head_dim, std::int32_t position,
                                                     std::int32_t head, const settings&) {
    (void)position;
    (void)head;
    float sum = 0.0f;
    for (std::int32_t d = 0; d < head_dim; ++d) {
      const float x = to_float(key[d]);
      sum = fmaf(x, x, sum);
    }
    return -sqrtf(sum);
  }
};

// Static: every token scores the same, so the tie-break (older first) evicts
// the oldest unprotected token: StreamingLLM's window when used with sinks.
struct recency {
  static constexpr const char* name = "recency";
  static constexpr bool needs_attention = false;
  static constexpr bool binary = false;
  static constexpr bool reads_keys = false;  // admit needs no K (token_table_view will do)
  template <class T>
  SCISSORHANDS_HOST_DEVICE static float static_score(const T*, std::int32_t, std::int32_t, std::int32_t,
                                                     const settings&) {
    return 0.0f;
  }
};

// Static: a seeded hash of (position, head) in [0, 1): the floor any real
// policy must beat. Deterministic, so both backends evict the same tokens.
struct random_score {
  static constexpr const char* name = "random_score";
  static constexpr bool needs_attention = false;
  static constexpr bool binary = false;
  static constexpr bool reads_keys = false;  // admit needs no K (token_table_view will do)
  template <class T>
  SCISSORHANDS_HOST_DEVICE static float static_score(const T*, std::int32_t, std::int32_t position,
                                                     std::int32_t head, const settings& s) {
    std::uint64_t x = (std::uint64_t{s.seed} << 32) ^ (std::uint64_t(std::uint32_t(head)) << 40) ^
                      std::uint64_t(std::uint32_t(position));
    // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
};

// Whether admitting a token reads its K row: a static observation does
// unless it says `static constexpr bool reads_keys = false` (its score then
// depends on position and head only and is given a null key); an attention
// observation never does.
template <class Observation>
inline constexpr bool observation_reads_keys = [] {
  if constexpr (Observation::needs_attention)
    return false;
  else if constexpr (requires { Observation::reads_keys; })
    return static_cast<bool>(Observation::reads_keys);
  else
    return true;
}();

// Whether compress evicts an observation policy's highest scores first.
template <class Observation>
inline constexpr bool evicts_highest = [] {
  if constexpr (requires { Observation::evict_highest; })
    return static_cast<bool>(Observation::evict_highest);
  else
    return false;
}();

}  // namespace scissorhands
