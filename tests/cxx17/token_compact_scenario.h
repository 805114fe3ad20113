#pragma once
// Shared by the C++17 token-level engine that lets the library move its K/V
// rows (token_compact_test.cpp: compact, not forget) and the C++20 TU
// (token_compact_tu.cpp): the shape of the model (a pool of cells, page size
// 1, two layers sharing one table, each with its own K and V pools), the
// policy's numbers, and the reference hooks the C++20 TU implements by
// calling scissorhands::host directly (no bridge). C++17, no library header
// but bridge.h.
#include <cstddef>
#include <cstdint>

#include <scissorhands/bridge/bridge.h>

#include "selection_memory.h"

namespace cxx17_compact {

inline constexpr std::int32_t layers = 2;
inline constexpr std::int32_t kv_heads = 2;
inline constexpr std::int32_t q_heads = 4;
inline constexpr std::int32_t head_dim = 8;
inline constexpr std::int32_t batch = 2;  // sequence b on state row b (no state_rows)
inline constexpr std::int32_t cells = 40;
inline constexpr std::int32_t budget = 8;
inline constexpr std::int32_t max_step_tokens = 3;
inline constexpr std::int32_t capacity = budget + max_step_tokens - 1;  // state_capacity_for
inline constexpr std::size_t pool_size = std::size_t{cells} * kv_heads * head_dim;  // elements of one K or V pool
// On top of the policy's defaults (with_granularity<scissorhands_policy, shared_layers<>>),
// with the compaction mode each run chooses.
inline constexpr std::int32_t evict_count = 2;
inline constexpr std::int32_t sinks = 1;
inline constexpr std::int32_t recent = 3;

// One step's engine-owned table and the model state buffer, as raw pointers,
// and the run's compaction mode.
struct step_memory {
  const std::int32_t* indptr;         // [batch + 1]
  const std::int32_t* indices;        // cells entries
  const std::int32_t* last_page_len;  // [batch]
  void* model;
  std::size_t model_bytes;
  scissorhands::bridge::compaction compaction_mode;
};

// One layer's K and V pools ([cell][kv_head][head_dim], pool_size elements
// each): the float pair or the fp16 pair, the other null.
struct kv_memory {
  float* k_f32;
  float* v_f32;
  scissorhands::bridge::fp16_bits* k_f16;  // IEEE binary16 bits (the library's fp16_bits)
  scissorhands::bridge::fp16_bits* v_f16;
};

using cxx17_cells::selection_memory;

// The C++20 TU's direct calls into scissorhands::host (K/V as a page-size-1
// paged_kv_view over the step's table, select on a token_table_view). Each
// returns false (after printing the message) if it threw.
std::size_t reference_model_bytes() noexcept;
std::size_t reference_select_workspace_bytes() noexcept;
std::size_t reference_compact_workspace_bytes() noexcept;
bool reference_reset(void* model, std::size_t bytes) noexcept;
// Ragged fp32 queries [token][q_head][head_dim] (one per new token), no LSE, plain attention.
bool reference_observe_queries(const step_memory& step, std::int32_t layer, const kv_memory& kv, const float* queries,
                               std::size_t queries_size, const std::int32_t* qo_indptr) noexcept;
bool reference_select(const step_memory& step, void* workspace, std::size_t workspace_bytes,
                      const selection_memory& out) noexcept;
bool reference_compact(const step_memory& step, std::int32_t layer, const kv_memory& kv,
                       const selection_memory& selection, void* workspace, std::size_t workspace_bytes) noexcept;

}  // namespace cxx17_compact

SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(cxx17_compact::api);
