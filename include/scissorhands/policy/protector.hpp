#pragma once
// Protector policies: tokens that are never evicted.
#include <cstdint>

#include "../config.hpp"
#include "settings.hpp"

namespace scissorhands {

// The r most recent tokens by position (their importance cannot be judged
// yet) and, when s > 0, the attention sinks at positions 0..s-1
// (StreamingLLM). next_position is one past the newest token's position.
struct recent_window {
  static constexpr const char* name = "recent_window";
  SCISSORHANDS_HOST_DEVICE static bool is_protected(std::int32_t position, std::int32_t next_position,
                                                    const settings& s) {
    // Bitwise: no branch, so the loops that count or skip protected tokens vectorise.
    return (position >= next_position - s.recent) | (position < s.sinks);
  }
  static constexpr std::int64_t protected_count(const settings& s) { return std::int64_t{s.recent} + s.sinks; }
};

}  // namespace scissorhands
