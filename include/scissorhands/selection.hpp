#pragma once
// What select writes (shared_layers eviction), in caller-owned spans: per
// sequence, which of its slots leave, and its length afterwards. select
// moves no data; the engine either frees the slots in its own allocator and
// calls forget (SGLang's token pool, llama.cpp's cells), or calls compact on
// every layer and then applies new_lengths / freed_pages once (vLLM's and
// FlashInfer's block tables: shrink_page_table).
#include <cstdint>

#include "compress_output.hpp"
#include "span.hpp"

namespace scissorhands {

template <memory_space Space>
struct eviction_selection {
  // Entries per sequence in slots / cache_slots: at least
  // max_evictions(state capacity, budget, m).
  std::int32_t stride = 0;
  span<std::int32_t, Space> counts;       // [batch] tokens evicted from sequence b (0: below the budget)
  span<std::int32_t, Space> slots;        // [batch * stride] the evicted slots (token index in the sequence), ascending
  span<std::int32_t, Space> cache_slots;  // optional [batch * stride]: the same as the engine's slot ids
                                          //   (paged: page id * page_size + offset, i.e. vLLM's slot_mapping
                                          //   and, at page size 1, SGLang's / llama.cpp's cell index;
                                          //   contiguous: the token index)
  compress_output<Space> out;             // new_lengths [batch]; freed_pages as compress's
};

// The most tokens one sequence can lose in a call: one that holds as many
// tokens as the state's capacity. 0 when the capacity never reaches the
// budget.
constexpr std::int32_t max_evictions(std::int32_t state_capacity, std::int32_t budget, std::int32_t evict_count) {
  const std::int64_t e = std::int64_t{state_capacity} - budget + evict_count;
  return e > 0 ? static_cast<std::int32_t>(e > INT32_MAX ? INT32_MAX : e) : 0;
}

}  // namespace scissorhands
