#pragma once
// One token's history words, as a history policy sees them (policy/
// history.hpp): ring[w] is word w. The state stores the ring word-major
// (eviction_state.hpp), so consecutive words of one token are `stride`
// words apart and the same word of consecutive tokens is adjacent.
#include <cstdint>

#include "config.hpp"

namespace scissorhands {

struct history_ring {
  std::uint32_t* word0 = nullptr;  // word 0 of the token
  std::int64_t stride = 0;         // words between word w and word w + 1 (the state's capacity)

  SCISSORHANDS_HOST_DEVICE std::uint32_t& operator[](std::int32_t w) const { return word0[w * stride]; }
};

}  // namespace scissorhands
