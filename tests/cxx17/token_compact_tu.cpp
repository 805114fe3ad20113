// The C++20 side of the token-level compact test: SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL
// for cxx17_compact::api and the reference hooks of token_compact_scenario.h,
// which call scissorhands::host directly on views built with the library's
// own factories.
#include <scissorhands/bridge/bridge_impl.hpp>

#include "report.hpp"
#include "token_compact_scenario.h"

SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(
    cxx17_compact::api,
    scissorhands::with_granularity<scissorhands::scissorhands_policy, scissorhands::shared_layers<>>);

namespace cxx17_compact {
namespace {

namespace sh = scissorhands;
using cxx17_reference::report;
constexpr auto host = sh::memory_space::host;
using policy_type = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;

policy_type reference_policy(scissorhands::bridge::compaction mode) {
  policy_type p;
  p.config.evict_count = evict_count;
  p.config.sinks = sinks;
  p.config.recent = recent;
  p.config.compaction_mode = mode == scissorhands::bridge::compaction::preserve_order
                                 ? sh::compaction::preserve_order
                                 : sh::compaction::fill_holes;
  return p;
}

sh::state_shape reference_shape() {
  return {batch, kv_heads, capacity, reference_policy(scissorhands::bridge::compaction::fill_holes).ring_words()};
}

sh::host_token_table_view table_of(const step_memory& s) {
  return sh::make_token_table_view<host>({s.indptr, batch + 1}, {s.indices, cells}, {s.last_page_len, batch}, batch,
                                         kv_heads, 1, cells, capacity);
}

// One layer's K and V pools as the library's own paged view: page size 1,
// the step's table, NHD.
template <class T>
sh::host_paged_kv_view<T> kv_of(const step_memory& s, T* k, T* v) {
  return sh::make_paged_kv_view<T, host>({k, pool_size}, {v, pool_size}, {s.indptr, batch + 1}, {s.indices, cells},
                                         {s.last_page_len, batch}, batch, kv_heads, head_dim, 1, cells, capacity);
}

sh::model_state<host> model_of(void* model, std::size_t bytes) {
  return sh::make_model_state(sh::host_span<std::byte>(static_cast<std::byte*>(model), bytes), reference_shape(),
                              layers);
}

sh::eviction_selection<host> selection_of(const selection_memory& m) {
  const std::size_t all = std::size_t{batch} * static_cast<std::size_t>(m.stride);
  return {m.stride,
          {m.counts, batch},
          {m.slots, all},
          {m.cache_slots, all},
          {{m.new_lengths, batch}, {m.freed_pages, batch}}};
}

sh::host_span<std::byte> bytes_of(void* p, std::size_t n) { return {static_cast<std::byte*>(p), n}; }

}  // namespace

std::size_t reference_model_bytes() noexcept {
  std::size_t bytes = 0;
  (void)report("model_state_bytes", [&] { bytes = sh::model_state_bytes(reference_shape(), layers); });
  return bytes;
}

std::size_t reference_select_workspace_bytes() noexcept {
  const std::int32_t indptr[batch + 1] = {}, indices[1] = {}, last[batch] = {};
  return sh::host::select_workspace_bytes(table_of({indptr, indices, last, nullptr, 0, {}}), reference_shape());
}

std::size_t reference_compact_workspace_bytes() noexcept {
  const std::int32_t indptr[batch + 1] = {}, indices[1] = {}, last[batch] = {};
  return sh::host::compact_workspace_bytes(
      kv_of<float>({indptr, indices, last, nullptr, 0, {}}, nullptr, nullptr));
}

bool reference_reset(void* model, std::size_t bytes) noexcept {
  return report("reset", [&] { sh::host::reset_state(model_of(model, bytes)); });
}

bool reference_observe_queries(const step_memory& step, std::int32_t layer, const kv_memory& kv, const float* queries,
                               std::size_t queries_size, const std::int32_t* qo_indptr) noexcept {
  return report("observe_queries", [&] {
    const auto q = sh::query_view<float, host>::ragged({queries, queries_size}, {qo_indptr, batch + 1}, q_heads,
                                                       head_dim);
    const auto state = model_of(step.model, step.model_bytes).layer(layer);
    const auto policy = reference_policy(step.compaction_mode);
    if (kv.k_f32 != nullptr)
      sh::host::observe_queries(policy, kv_of(step, kv.k_f32, kv.v_f32), state, q, sh::lse_view<host>{},
                                sh::attention_options<host>{});
    else
      sh::host::observe_queries(policy,
                                kv_of(step, reinterpret_cast<sh::fp16_bits*>(kv.k_f16),
                                      reinterpret_cast<sh::fp16_bits*>(kv.v_f16)),
                                state, q, sh::lse_view<host>{}, sh::attention_options<host>{});
  });
}

bool reference_select(const step_memory& step, void* workspace, std::size_t workspace_bytes,
                      const selection_memory& out) noexcept {
  return report("select", [&] {
    sh::host::select(reference_policy(step.compaction_mode), table_of(step), model_of(step.model, step.model_bytes),
                     budget, bytes_of(workspace, workspace_bytes), selection_of(out));
  });
}

bool reference_compact(const step_memory& step, std::int32_t layer, const kv_memory& kv,
                       const selection_memory& selection, void* workspace, std::size_t workspace_bytes) noexcept {
  return report("compact", [&] {
    const auto state = model_of(step.model, step.model_bytes).layer(layer);
    const auto policy = reference_policy(step.compaction_mode);
    if (kv.k_f32 != nullptr)
      sh::host::compact(policy, kv_of(step, kv.k_f32, kv.v_f32), state, selection_of(selection),
                        bytes_of(workspace, workspace_bytes));
    else
      sh::host::compact(policy,
                        kv_of(step, reinterpret_cast<sh::fp16_bits*>(kv.k_f16),
                              reinterpret_cast<sh::fp16_bits*>(kv.v_f16)),
                        state, selection_of(selection), bytes_of(workspace, workspace_bytes));
  });
}

}  // namespace cxx17_compact
