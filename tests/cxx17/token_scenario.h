#pragma once
// Shared by the C++17 token-level engine (token_level_test.cpp) and the
// C++20 TU (token_tu.cpp): the shape of a llama.cpp-like engine (a pool of
// cells, page size 1, several layers sharing one table), the policy, and the
// reference hooks the C++20 TU implements by calling scissorhands::host
// directly on a token_table_view (no bridge). C++17, no library header but
// bridge.h.
#include <cstddef>
#include <cstdint>

#include <scissorhands/bridge/bridge.h>

#include "selection_memory.h"

namespace cxx17_tokens {

inline constexpr std::int32_t layers = 3;
inline constexpr std::int32_t kv_heads = 2;
inline constexpr std::int32_t q_heads = 4;
inline constexpr std::int32_t rows = 5;   // requests the state holds at once
inline constexpr std::int32_t batch = 4;  // positions per step (the last ones padding)
inline constexpr std::int32_t cells = 96;
inline constexpr std::int32_t budget = 16;
inline constexpr std::int32_t max_step_tokens = 4;
inline constexpr std::int32_t capacity = budget + max_step_tokens - 1;  // state_capacity_for
inline constexpr std::int32_t head_dim = 8;  // the K cells and queries of the observe_queries variant
// On top of the policy's defaults (with_granularity<scissorhands_policy, shared_layers<>>).
inline constexpr std::int32_t evict_count = 2;
inline constexpr std::int32_t sinks = 1;

// One step's engine-owned table and the model state buffer, as raw pointers.
struct step_memory {
  const std::int32_t* indptr;         // [batch + 1]
  const std::int32_t* indices;        // cells entries
  const std::int32_t* last_page_len;  // [batch]
  const std::int32_t* state_rows;     // [batch]
  void* model;
  std::size_t model_bytes;
};

using cxx17_cells::selection_memory;

// One layer's observe_queries inputs, as raw pointers: the engine's K cells
// ([cell][kv_head][head_dim], page size 1, the step's table as the page
// table; exactly one of the two pools given), its ragged queries
// [token][q_head][head_dim], and its natural-base LSE [token][q_head] (null:
// none). V is absent. The attention options as the bridge's descriptor;
// the C++20 TU converts them field by field.
struct query_memory {
  float* keys_f32;
  scissorhands::bridge::fp16_bits* keys_f16;  // IEEE binary16 bits (the library's fp16_bits)
  std::size_t keys_size;                      // elements
  const float* queries;
  std::size_t queries_size;
  const std::int32_t* qo_indptr;  // [batch + 1]
  const float* lse;
  std::size_t lse_size;
  scissorhands::bridge::attention options;
};

// The C++20 TU's direct calls into scissorhands::host on a token_table_view.
// Each returns false (after printing the message) if it threw.
std::size_t reference_model_bytes() noexcept;
std::size_t reference_workspace_bytes() noexcept;
bool reference_reset(void* model, std::size_t bytes) noexcept;
bool reference_reset_sequence(void* model, std::size_t bytes, std::int32_t row, std::int32_t start) noexcept;
bool reference_admit(const step_memory& step, std::int32_t layer) noexcept;
bool reference_observe(const step_memory& step, std::int32_t layer, const float* probs, std::size_t size,
                       const std::int32_t* qo_indptr, std::int32_t columns) noexcept;
bool reference_observe_queries(const step_memory& step, std::int32_t layer, const query_memory& q) noexcept;
// local_scores into values[layers * batch * capacity] (kv_heads: this model's).
bool reference_local_scores(const step_memory& step, float* values, std::size_t size) noexcept;
bool reference_select(const step_memory& step, void* workspace, std::size_t workspace_bytes,
                      const selection_memory& out, const std::int32_t* pinned_prefix) noexcept;
bool reference_forget(const step_memory& step, std::int32_t layer, const selection_memory& selection) noexcept;
// The policy type's own settings (Policy{}.config), copied field by field.
void reference_default_settings(scissorhands::bridge::settings* out) noexcept;

}  // namespace cxx17_tokens

SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(cxx17_tokens::api);
