// The C++20 side of the token-level test: SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL
// and the reference hooks of token_scenario.h, which call scissorhands::host
// directly on a token_table_view built with the library's own factories.
#include <scissorhands/bridge/bridge_impl.hpp>

#include "report.hpp"
#include "token_scenario.h"

SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(
    cxx17_tokens::api,
    scissorhands::with_granularity<scissorhands::scissorhands_policy, scissorhands::shared_layers<>>);

namespace cxx17_tokens {
namespace {

namespace sh = scissorhands;
using cxx17_reference::report;
constexpr auto host = sh::memory_space::host;
using policy_type = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;

policy_type reference_policy() {
  policy_type p;
  p.config.evict_count = evict_count;
  p.config.sinks = sinks;
  return p;
}

sh::state_shape reference_shape() { return {rows, kv_heads, capacity, reference_policy().ring_words()}; }

sh::host_token_table_view table_of(const step_memory& s) {
  return sh::make_token_table_view<host>({s.indptr, batch + 1}, {s.indices, cells}, {s.last_page_len, batch}, batch,
                                         kv_heads, 1, cells, capacity);
}

sh::model_state<host> model_of(void* model, std::size_t bytes) {
  return sh::make_model_state(sh::host_span<std::byte>(static_cast<std::byte*>(model), bytes), reference_shape(),
                              layers);
}
sh::model_state<host> model_of(const step_memory& s) {
  return model_of(s.model, s.model_bytes).for_batch({s.state_rows, batch});
}

// The engine's K cells as the library's own paged view (page size 1, the
// step's table, V absent), K as float or the library's fp16_bits.
template <class T>
sh::host_paged_kv_view<T> keys_of(const step_memory& s, T* pool, std::size_t size) {
  return sh::make_paged_kv_view<T, host>({pool, size}, {}, {s.indptr, batch + 1}, {s.indices, cells},
                                         {s.last_page_len, batch}, batch, kv_heads, head_dim, 1, cells, capacity);
}

// The bridge's attention descriptor as the library's options, field by field.
sh::attention_options<host> options_of(const scissorhands::bridge::attention& a) {
  sh::attention_options<host> o;
  o.softmax_scale = a.softmax_scale;
  o.window_left = a.window_left;
  o.window_left_unit = a.window_left_unit == scissorhands::bridge::window_unit::positions ? sh::window_unit::positions
                                                                                          : sh::window_unit::slots;
  o.logits_soft_cap = a.logits_soft_cap;
  if (a.alibi_slopes != nullptr) o.alibi_slopes = {a.alibi_slopes, a.alibi_slopes_size};
  return o;
}

sh::eviction_selection<host> selection_of(const selection_memory& m) {
  const std::size_t all = std::size_t{batch} * static_cast<std::size_t>(m.stride);
  return {m.stride,
          {m.counts, batch},
          {m.slots, all},
          {m.cache_slots, all},
          {{m.new_lengths, batch}, {m.freed_pages, batch}}};
}

}  // namespace

std::size_t reference_model_bytes() noexcept {
  std::size_t bytes = 0;
  (void)report("model_state_bytes", [&] { bytes = sh::model_state_bytes(reference_shape(), layers); });
  return bytes;
}

std::size_t reference_workspace_bytes() noexcept {
  const std::int32_t indptr[batch + 1] = {}, indices[1] = {}, last[batch] = {};
  return sh::host::select_workspace_bytes(table_of({indptr, indices, last, nullptr, nullptr, 0}), reference_shape());
}

bool reference_reset(void* model, std::size_t bytes) noexcept {
  return report("reset", [&] { sh::host::reset_state(model_of(model, bytes)); });
}

bool reference_reset_sequence(void* model, std::size_t bytes, std::int32_t row, std::int32_t start) noexcept {
  return report("reset_sequence", [&] { sh::host::reset_sequence(model_of(model, bytes), row, start); });
}

bool reference_admit(const step_memory& step, std::int32_t layer) noexcept {
  return report("admit", [&] { sh::host::admit(reference_policy(), table_of(step), model_of(step).layer(layer)); });
}

bool reference_observe(const step_memory& step, std::int32_t layer, const float* probs, std::size_t size,
                       const std::int32_t* qo_indptr, std::int32_t columns) noexcept {
  return report("observe_probabilities", [&] {
    sh::host::observe_probabilities(
        reference_policy(), table_of(step), model_of(step).layer(layer),
        sh::probability_view<host>::ragged({probs, size}, {qo_indptr, batch + 1}, q_heads, columns));
  });
}

bool reference_observe_queries(const step_memory& step, std::int32_t layer, const query_memory& q) noexcept {
  return report("observe_queries", [&] {
    const sh::host_span<const std::int32_t> qo(q.qo_indptr, batch + 1);
    const auto queries = sh::query_view<float, host>::ragged({q.queries, q.queries_size}, qo, q_heads, head_dim);
    const auto lse = q.lse != nullptr
                         ? sh::lse_view<host>::ragged({q.lse, q.lse_size}, qo, q_heads, sh::lse_base::natural)
                         : sh::lse_view<host>{};
    const auto state = model_of(step).layer(layer);
    if (q.keys_f32 != nullptr)
      sh::host::observe_queries(reference_policy(), keys_of(step, q.keys_f32, q.keys_size), state, queries, lse,
                                options_of(q.options));
    else
      sh::host::observe_queries(reference_policy(),
                                keys_of(step, reinterpret_cast<sh::fp16_bits*>(q.keys_f16), q.keys_size), state,
                                queries, lse, options_of(q.options));
  });
}

bool reference_local_scores(const step_memory& step, float* values, std::size_t size) noexcept {
  return report("local_scores", [&] {
    sh::host::local_scores(reference_policy(), table_of(step), model_of(step), budget,
                           sh::partial_scores<host>{{values, size}, layers, batch, capacity, kv_heads});
  });
}

bool reference_select(const step_memory& step, void* workspace, std::size_t workspace_bytes,
                      const selection_memory& out, const std::int32_t* pinned_prefix) noexcept {
  return report("select", [&] {
    sh::host::select(reference_policy(), table_of(step), model_of(step), budget,
                     sh::host_span<std::byte>(static_cast<std::byte*>(workspace), workspace_bytes), selection_of(out),
                     {pinned_prefix, batch});
  });
}

bool reference_forget(const step_memory& step, std::int32_t layer, const selection_memory& selection) noexcept {
  return report("forget", [&] {
    sh::host::forget(reference_policy(), table_of(step), model_of(step).layer(layer), selection_of(selection));
  });
}

void reference_default_settings(scissorhands::bridge::settings* out) noexcept {
  const sh::settings c = policy_type{}.config;
  out->window = c.window;
  out->recent = c.recent;
  out->sinks = c.sinks;
  out->evict_count = c.evict_count;
  out->alpha = c.alpha;
  out->decay = c.decay;
  out->normalize = c.normalize;
  out->compaction_mode = c.compaction_mode == sh::compaction::preserve_order
                             ? scissorhands::bridge::compaction::preserve_order
                             : scissorhands::bridge::compaction::fill_holes;
  out->seed = c.seed;
  out->pool_width = c.pool_width;
  out->pool_mode =
      c.pool_mode == sh::pooling::max ? scissorhands::bridge::pooling::max : scissorhands::bridge::pooling::mean;
  out->filled = scissorhands::bridge::detail::settings_marker<policy_type>();
}

}  // namespace cxx17_tokens
