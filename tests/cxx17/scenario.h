#pragma once
// Shared by the C++17 engine (engine_test.cpp) and the C++20 TU
// (bridge_tu.cpp): the shape of the test's one layer, the policy settings
// as plain numbers, and the reference hooks the C++20 TU implements by
// calling scissorhands::host directly (no bridge). C++17, no library header
// but bridge.h.
#include <cstddef>
#include <cstdint>

#include <scissorhands/bridge/bridge.h>

namespace cxx17_test {

// A FlashInfer NHD page pool, fp32, GQA (4 query heads on 2 KV heads).
// Batch position 3 is a padding slot (state row -1, no page); the others
// map to state rows 3, 0 and 4 of a 5-row state.
inline constexpr std::int32_t batch = 4;
inline constexpr std::int32_t state_rows_count = 5;
inline constexpr std::int32_t state_rows[batch] = {3, 0, 4, -1};
inline constexpr std::int32_t kv_heads = 2;
inline constexpr std::int32_t q_heads = 4;
inline constexpr std::int32_t head_dim = 8;
inline constexpr std::int32_t page_size = 4;
inline constexpr std::int32_t num_pages = 32;
inline constexpr std::int32_t max_pages_per_sequence = 5;
inline constexpr std::size_t pool_elements = std::size_t{num_pages} * page_size * kv_heads * head_dim;

// Policy settings (scissorhands_policy: threshold indicator, sliding window).
inline constexpr std::int32_t window = 6;
inline constexpr std::int32_t recent = 2;
inline constexpr std::int32_t sinks = 1;
inline constexpr std::int32_t evict_count = 2;
inline constexpr float alpha = 1.0f;
inline constexpr bool normalize = true;
inline constexpr std::int32_t budget = 10;
inline constexpr std::int32_t max_step_tokens = 7;  // the largest prefill chunk

// The numbers above on top of a preset's settings: for the bridge's settings
// (engine_test.cpp) and the library's (bridge_tu.cpp), whose fields share names.
// (tests/cuda/cases.cuh sets the same fields from its own cases: alike on purpose.)
template <class Settings>
void set_test_numbers(Settings& s) {
  s.window = window;
  s.recent = recent;
  s.sinks = sinks;
  s.evict_count = evict_count;
  s.alpha = alpha;
  s.normalize = normalize;
}

// One layer's engine-owned memory, as raw pointers.
struct layer_memory {
  float* k_pages;
  float* v_pages;
  const std::int32_t* indptr;         // [batch + 1]
  const std::int32_t* indices;        // num_pages entries
  const std::int32_t* last_page_len;  // [batch]
  void* state;
  std::size_t state_bytes;
  void* workspace;
  std::size_t workspace_bytes;
};

// The C++20 TU's direct calls into scissorhands::host, on a second copy of
// the layer. Each returns false (after printing the message) if it threw.
bool reference_reset(const layer_memory& layer) noexcept;
bool reference_step(const layer_memory& layer, const float* queries, std::size_t queries_size, const float* lse2,
                    std::size_t lse_size, const std::int32_t* qo_indptr, std::int32_t* new_lengths,
                    std::int32_t* freed_pages) noexcept;
// observe_queries alone with the kernel's attention options (the bridge's
// descriptor, converted field by field) and no LSE, on the layer's copy.
bool reference_observe_with(const layer_memory& layer, const float* queries, std::size_t queries_size,
                            const std::int32_t* qo_indptr, const scissorhands::bridge::attention& options) noexcept;
bool reference_shrink(std::int32_t* indptr, std::int32_t* indices, std::int32_t* last_page_len,
                      const std::int32_t* new_lengths, std::int32_t* released, std::size_t* released_count) noexcept;
// State bytes the library's own make_state_shape + state_bytes give.
std::size_t reference_state_bytes() noexcept;

}  // namespace cxx17_test

// The two instantiations the test links: the paged fp32 layer above, and
// an H2O policy for a contiguous cache.
SCISSORHANDS_BRIDGE_DECLARE(cxx17_test::sh_f32, float);
SCISSORHANDS_BRIDGE_DECLARE(cxx17_test::h2o_f32, float);
