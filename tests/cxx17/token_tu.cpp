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
  out->filled = scissorhands::bridge::settings_filled;
}

}  // namespace cxx17_tokens
