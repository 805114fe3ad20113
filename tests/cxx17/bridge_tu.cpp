// The C++20 translation unit of the test "engine": compiled with
// exceptions, it instantiates the bridge (SCISSORHANDS_BRIDGE_DEFINE) and
// implements the reference hooks of scenario.h by calling scissorhands::host
// directly, building the views with the library's own factories.
#include <scissorhands/bridge/bridge_impl.hpp>

#include "report.hpp"
#include "scenario.h"

SCISSORHANDS_BRIDGE_DEFINE(cxx17_test::sh_f32, float, scissorhands::scissorhands_policy);
SCISSORHANDS_BRIDGE_DEFINE(
    cxx17_test::h2o_f32, float,
    scissorhands::eviction_policy<scissorhands::attention_mass, scissorhands::unbounded_history>);

namespace cxx17_test {
namespace {

namespace sh = scissorhands;
using cxx17_reference::report;

sh::scissorhands_policy reference_policy() {
  sh::scissorhands_policy p;
  set_test_numbers(p.config);
  return p;
}

sh::state_shape reference_shape() {
  return {state_rows_count, kv_heads, sh::state_capacity_for(budget, max_step_tokens), reference_policy().ring_words()};
}

sh::host_paged_kv_view<float> reference_cache(const layer_memory& layer) {
  return sh::make_paged_kv_view(sh::host_span<float>(layer.k_pages, pool_elements),
                                sh::host_span<float>(layer.v_pages, pool_elements),
                                sh::host_span<const std::int32_t>(layer.indptr, batch + 1),
                                sh::host_span<const std::int32_t>(layer.indices, num_pages),
                                sh::host_span<const std::int32_t>(layer.last_page_len, batch), batch, kv_heads,
                                head_dim, page_size, num_pages, max_pages_per_sequence);
}

sh::eviction_state<sh::memory_space::host> reference_state(const layer_memory& layer) {
  return sh::make_state(sh::host_span<std::byte>(static_cast<std::byte*>(layer.state), layer.state_bytes),
                        reference_shape())
      .for_batch(sh::host_span<const std::int32_t>(state_rows, batch));
}

}  // namespace

bool reference_reset(const layer_memory& layer) noexcept {
  return report("reset", [&] { sh::host::reset_state(reference_state(layer)); });
}

bool reference_step(const layer_memory& layer, const float* queries, std::size_t queries_size, const float* lse2,
                    std::size_t lse_size, const std::int32_t* qo_indptr, std::int32_t* new_lengths,
                    std::int32_t* freed_pages) noexcept {
  return report("step", [&] {
    const auto policy = reference_policy();
    const auto cache = reference_cache(layer);
    const auto state = reference_state(layer);
    const sh::host_span<const std::int32_t> indptr(qo_indptr, batch + 1);
    sh::host::observe_queries(
        policy, cache, state,
        sh::query_view<float, sh::memory_space::host>::ragged({queries, queries_size}, indptr, q_heads, head_dim),
        sh::lse_view<sh::memory_space::host>::ragged({lse2, lse_size}, indptr, q_heads, sh::lse_base::base2));
    sh::host::compress(
        policy, cache, state, budget,
        sh::host_span<std::byte>(static_cast<std::byte*>(layer.workspace), layer.workspace_bytes),
        {sh::host_span<std::int32_t>(new_lengths, batch), sh::host_span<std::int32_t>(freed_pages, batch)});
  });
}

bool reference_observe_with(const layer_memory& layer, const float* queries, std::size_t queries_size,
                            const std::int32_t* qo_indptr, const scissorhands::bridge::attention& options) noexcept {
  return report("observe_queries with options", [&] {
    sh::attention_options<sh::memory_space::host> o;
    o.softmax_scale = options.softmax_scale;
    o.window_left = options.window_left;
    o.window_left_unit = options.window_left_unit == scissorhands::bridge::window_unit::positions
                             ? sh::window_unit::positions
                             : sh::window_unit::slots;
    o.logits_soft_cap = options.logits_soft_cap;
    if (options.alibi_slopes != nullptr) o.alibi_slopes = {options.alibi_slopes, options.alibi_slopes_size};
    sh::host::observe_queries(reference_policy(), reference_cache(layer), reference_state(layer),
                              sh::query_view<float, sh::memory_space::host>::ragged(
                                  {queries, queries_size}, {qo_indptr, batch + 1}, q_heads, head_dim),
                              sh::lse_view<sh::memory_space::host>{}, o);
  });
}

bool reference_shrink(std::int32_t* indptr, std::int32_t* indices, std::int32_t* last_page_len,
                      const std::int32_t* new_lengths, std::int32_t* released, std::size_t* released_count) noexcept {
  return report("shrink", [&] {
    *released_count = sh::host::shrink_page_table(
        sh::host_span<std::int32_t>(indptr, batch + 1), sh::host_span<std::int32_t>(indices, num_pages),
        sh::host_span<std::int32_t>(last_page_len, batch), page_size,
        sh::host_span<const std::int32_t>(new_lengths, batch), sh::host_span<std::int32_t>(released, num_pages));
  });
}

std::size_t reference_state_bytes() noexcept {
  std::size_t bytes = 0;
  (void)report("state_bytes", [&] { bytes = sh::state_bytes(reference_shape()); });
  return bytes;
}

}  // namespace cxx17_test
