#pragma once
// History policies: how a token's observations are aggregated over steps.
// Per token the state holds a score, the (possibly decayed) number of steps
// it was observed, and ring_words() 32-bit words of history of its own,
// which update() reaches as ring[0 .. ring_words() - 1] (history_ring).
#include <cmath>
#include <cstdint>

#include "../config.hpp"
#include "../history_ring.hpp"
#include "settings.hpp"

namespace scissorhands {

// Running sum of every observation since the token was admitted (H2O).
struct unbounded_history {
  static constexpr const char* name = "unbounded";
  static constexpr std::int32_t ring_words(const settings&, bool) { return 0; }
  SCISSORHANDS_HOST_DEVICE static void update(float& score, float& observed, history_ring, std::int64_t,
                                              float contribution, const settings&, bool) {
    score += contribution;
    observed += 1.0f;
  }
};

// The sum of the last w steps' observations (Scissorhands). The state keeps
// one entry per step of the window in a ring indexed by step mod w, and the
// running sum. Memory per token and head: binary observations (the
// threshold indicator) take 1 bit a step, ceil(w / 32) words (52 bytes at
// w = 400) and the window count is exact (integers below 2^24); real-valued
// observations take one fp32 a step, w words (1600 bytes at w = 400), and the
// running sum carries the rounding of (sum - oldest) + newest, each step
// adding at most one ulp of the window sum.
struct sliding_window {
  static constexpr const char* name = "sliding_window";
  static constexpr std::int32_t ring_words(const settings& s, bool binary) {
    // In 64 bits: window + 31 overflows int32 for a window near INT32_MAX.
    return binary ? static_cast<std::int32_t>((std::int64_t{s.window} + 31) / 32) : s.window;
  }
  // The ring word update() reads and writes at `step`, the same for every
  // token (optional for a history policy: a backend that finds it may
  // prefetch the word ahead of the update).
  SCISSORHANDS_HOST_DEVICE static std::int32_t ring_word(std::int64_t step, const settings& s, bool binary) {
    const auto slot = static_cast<std::int32_t>(step % s.window);
    return binary ? slot >> 5 : slot;
  }
  SCISSORHANDS_HOST_DEVICE static void update(float& score, float& observed, history_ring ring, std::int64_t step,
                                              float contribution, const settings& s, bool binary) {
    const auto slot = static_cast<std::int32_t>(step % s.window);
    float oldest;
    if (binary) {
      const std::uint32_t bit = 1u << (slot & 31);
      std::uint32_t& word = ring[ring_word(step, s, binary)];
      oldest = (word & bit) ? 1.0f : 0.0f;
      word = contribution != 0.0f ? (word | bit) : (word & ~bit);
    } else {
      std::uint32_t& word = ring[ring_word(step, s, binary)];
      oldest = __builtin_bit_cast(float, word);
      word = __builtin_bit_cast(std::uint32_t, contribution);
    }
    score = (score - oldest) + contribution;
    const float w = static_cast<float>(s.window);
    observed = observed + 1.0f < w ? observed + 1.0f : w;
  }
};

// score <- decay * score + observation, and the observed count decays alike.
// fmaf on both backends, so the host and the device agree to the bit.
struct exponential_decay {
  static constexpr const char* name = "exponential_decay";
  static constexpr std::int32_t ring_words(const settings&, bool) { return 0; }
  SCISSORHANDS_HOST_DEVICE static void update(float& score, float& observed, history_ring, std::int64_t,
                                              float contribution, const settings& s, bool) {
    score = fmaf(score, s.decay, contribution);
    observed = fmaf(observed, s.decay, 1.0f);
  }
};

}  // namespace scissorhands
