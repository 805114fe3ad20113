#pragma once
// select's outputs as raw pointers ([batch], [batch * stride]): what the
// token-level scenarios (token_scenario.h, token_compact_scenario.h) hand
// between their C++17 test and their C++20 reference TU.
#include <cstdint>

namespace cxx17_cells {

struct selection_memory {
  std::int32_t stride;
  std::int32_t* counts;
  std::int32_t* slots;
  std::int32_t* cache_slots;
  std::int32_t* new_lengths;
  std::int32_t* freed_pages;
};

}  // namespace cxx17_cells
