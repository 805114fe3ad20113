// The translation unit clang-tidy checks the headers through
// (scripts/stages/30-clang-tidy.sh): the umbrella header, plus one use of
// every host entry point and policy so that templates are instantiated and
// their bodies analysed, not only declared: observe from dense and ragged
// probabilities and queries (lse dense, token-major and ragged; attention
// options: a window, a soft cap, ALiBi), admit,
// compress into a compress_output, a state seen through a batch mapping,
// reset_state / reset_sequence, shrink_page_table, the sizing helpers,
// catch_errors, token-level eviction (shared_heads compress, select,
// compact, forget, the model state, tensor parallelism's local_scores and
// select on reduced scores), quantized caches (quantized_kv_view, the
// reference codec), their plans run in slices
// (host/plan.hpp, host/threads.hpp), and the C++17 bridge's definitions
// (one policy), and the CUDA backend's plain C++ headers (the tensor-core
// operand layout and the slot chunks, shared with host tests).
// Built as part of the tests so it also compiles with g++.
#include <scissorhands/scissorhands.hpp>
#include <scissorhands/bridge/bridge_impl.hpp>
#include <scissorhands/cuda/detail/mma_layout.hpp>
#include <scissorhands/cuda/detail/slot_chunks.hpp>
#include <scissorhands/host/threads.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

SCISSORHANDS_BRIDGE_DECLARE(tidy_bridge::f32, float);
SCISSORHANDS_BRIDGE_DEFINE(tidy_bridge::f32, float, scissorhands::scissorhands_policy);

namespace tidy {

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

// What the engine owns next to the cache: outputs, the batch's state rows,
// a step's qo_indptr, and the page table the outputs are applied to.
struct engine_buffers {
  std::vector<std::byte> workspace;
  std::vector<std::int32_t> new_lengths, freed, state_rows, qo_indptr, indptr, indices, last_page_len, released;
};

template <class Policy, class View>
void use_backend(const Policy& policy, View cache, sh::eviction_state<host> state, engine_buffers& e) {
  const sh::host_span<const std::int32_t> qo(e.qo_indptr.data(), e.qo_indptr.size());
  const auto mapped = state.for_batch({e.state_rows.data(), e.state_rows.size()});
  sh::host::admit(policy, cache, mapped);
  const std::vector<float> data(64, 0.0f);
  const sh::host_span<const float> values(data.data(), data.size());
  sh::host::observe_probabilities(policy, cache, state, sh::probability_view<host>::dense(values, 2, 1, 8));
  sh::host::observe_probabilities(policy, cache, mapped, sh::probability_view<host>::ragged(values, qo, 2, 8));
  sh::host::observe_queries(policy, cache, state, sh::query_view<float, host>::dense(values, 2, 1, 4),
                            sh::lse_view<host>::dense(values, 2, 1, sh::lse_base::base2));
  sh::host::observe_queries(policy, cache, state, sh::query_view<float, host>::dense(values, 2, 1, 4),
                            sh::lse_view<host>::token_major(values, 2, 1, sh::lse_base::base2), 0.5f);
  sh::host::observe_queries(policy, cache, mapped, sh::query_view<float, host>::ragged(values, qo, 2, 4),
                            sh::lse_view<host>::ragged(values, qo, 2, sh::lse_base::base2));
  sh::host::observe_queries(policy, cache, mapped, sh::query_view<float, host>::ragged(values, qo, 2, 4));
  // A sliding-window, soft-capped, ALiBi layer (attention_options).
  sh::attention_options<host> options;
  options.window_left = 4;
  options.logits_soft_cap = 30.0f;
  options.alibi_slopes = {data.data(), 2};
  sh::host::observe_queries(policy, cache, state, sh::query_view<float, host>::dense(values, 2, 1, 4), {}, options);
  const sh::compress_output<host> out{{e.new_lengths.data(), e.new_lengths.size()}, {e.freed.data(), e.freed.size()}};
  sh::host::compress(policy, cache, mapped, 8, {e.workspace.data(), e.workspace.size()}, out);
  sh::host::compress(policy, cache, state, 8, {e.workspace.data(), e.workspace.size()},
                     {{e.new_lengths.data(), e.new_lengths.size()}, {}});
  // The plans (host/plan.hpp) and the std::thread runner.
  sh::host::plan_observe_probabilities(policy, cache, state, sh::probability_view<host>::dense(values, 2, 1, 8))
      .run({0, 2});
  sh::host::run_on_threads(
      sh::host::plan_observe_queries(policy, cache, state, sh::query_view<float, host>::dense(values, 2, 1, 4)), 2);
  const auto plan = sh::host::plan_compress(policy, cache, state, 8, {e.workspace.data(), e.workspace.size()}, out,
                                            2);
  for (std::int32_t i = 0; i < 2; ++i) plan.run({i, 2});
  (void)sh::host::compress_workspace_bytes(cache, state.shape, 2);
}

template <class Policy>
void use_policy(sh::host_kv_view<float> contiguous, sh::host_paged_kv_view<float> paged, sh::eviction_state<host> state,
                engine_buffers& e) {
  const Policy policy{};
  use_backend(policy, contiguous, state, e);
  use_backend(policy, paged, state, e);
}

// Token-level eviction: shared_heads through compress, shared_layers
// through select + compact / forget over a model state.
template <class View>
void use_token_level(View cache, sh::model_state<host> model, engine_buffers& e) {
  using heads = sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::max_score>>;
  using layers = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;
  const sh::compress_output<host> out{{e.new_lengths.data(), e.new_lengths.size()}, {e.freed.data(), e.freed.size()}};
  sh::host::compress(heads{}, cache, model.layer(0), 8, {e.workspace.data(), e.workspace.size()}, out);
  std::vector<std::int32_t> counts(4), slots(64), cache_slots(64);
  const sh::eviction_selection<host> selection{16, {counts.data(), counts.size()}, {slots.data(), slots.size()},
                                               {cache_slots.data(), cache_slots.size()}, out};
  const auto mapped = model.for_batch({e.state_rows.data(), e.state_rows.size()});
  sh::host::select(layers{}, cache, mapped, 8, {e.workspace.data(), e.workspace.size()}, selection,
                   {e.qo_indptr.data(), e.qo_indptr.size()});
  for (std::int32_t l = 0; l < model.layers; ++l) {
    sh::host::compact(layers{}, cache, mapped.layer(l), selection, {e.workspace.data(), e.workspace.size()});
    sh::host::forget(layers{}, cache, mapped.layer(l), selection);
  }
  sh::host::plan_select(layers{}, cache, mapped, 8, {e.workspace.data(), e.workspace.size()}, selection, {}, 2)
      .run({1, 2});
  sh::host::plan_compact(layers{}, cache, mapped.layer(0), selection, {e.workspace.data(), e.workspace.size()}).run();
  sh::host::plan_forget(layers{}, cache, mapped.layer(0), selection).run({0, 3});
  (void)sh::host::select_workspace_bytes(cache, model.shape());
  (void)sh::host::select_workspace_bytes(cache, model.shape(), 2);
  (void)sh::host::compact_workspace_bytes(cache);
  // Tensor parallelism: local scores, (the engine's all-reduce), select on them.
  using layers_max = sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score>>;
  std::vector<float> partial(sh::partial_score_count(model.layers, cache.batch, model.shape().capacity));
  const sh::partial_scores<host> scores{{partial.data(), partial.size()}, model.layers, cache.batch,
                                        model.shape().capacity, 2 * model.shape().kv_heads};
  sh::host::local_scores(layers{}, cache, mapped, 8, scores);
  sh::host::plan_local_scores(layers_max{}, cache, mapped, 8, scores).run({0, 2});
  sh::host::select(layers{}, cache, mapped, 8, scores, {e.workspace.data(), e.workspace.size()}, selection);
  sh::host::plan_select(layers_max{}, cache, mapped, 8, scores, {e.workspace.data(), e.workspace.size()}, selection,
                        {}, 2)
      .run({1, 2});
}

// Never called: it exists to be compiled and analysed.
void instantiate(sh::host_kv_view<float> contiguous, sh::host_paged_kv_view<float> paged,
                 sh::eviction_state<host> state, engine_buffers& e) {
  use_policy<sh::scissorhands_policy>(contiguous, paged, state, e);
  use_policy<sh::h2o_policy>(contiguous, paged, state, e);
  use_policy<sh::streaming_policy>(contiguous, paged, state, e);
  use_policy<sh::random_policy>(contiguous, paged, state, e);
  use_policy<sh::key_norm_policy>(contiguous, paged, state, e);
  use_policy<sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(
      contiguous, paged, state, e);
  use_policy<sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>(
      contiguous, paged, state, e);
  use_policy<sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(
      contiguous, paged, state, e);
  std::vector<std::byte> model_buffer(sh::model_state_bytes(state.shape, 2));
  const auto model = sh::make_model_state(sh::host_span<std::byte>(model_buffer.data(), model_buffer.size()),
                                          state.shape, 2);
  use_token_level(contiguous, model, e);
  use_token_level(paged, model, e);
  // Quantized caches (int8 / int4 codes with group parameters) over the same tables.
  const sh::kv_quantization q{sh::quant_kind::int4, 32};
  std::vector<std::uint8_t> codes(4096);
  std::vector<float> params(1024);
  const sh::host_span<std::uint8_t> k_codes(codes.data(), 2048), v_codes(codes.data() + 2048, 2048);
  const sh::host_span<float> k_params(params.data(), 512), v_params(params.data() + 512, 512);
  const auto quantized = sh::make_quantized_kv_view<host>(k_codes, v_codes, k_params, v_params, contiguous.lengths,
                                                          contiguous.batch, contiguous.kv_heads, contiguous.head_dim,
                                                          contiguous.capacity, sh::named_layout::hnd, q);
  const auto quantized_paged = sh::make_quantized_paged_kv_view<host>(
      k_codes, v_codes, k_params, v_params, paged.indptr, paged.indices, paged.last_page_len, paged.batch,
      paged.kv_heads, paged.head_dim, paged.page_size, paged.num_pages, paged.max_pages_per_sequence, q);
  use_backend(sh::scissorhands_policy{}, quantized, state, e);
  use_backend(sh::key_norm_policy{}, quantized_paged, state, e);
  use_token_level(quantized, model, e);
  sh::quantize_row(params.data(), 64, q, codes.data(), params.data() + 64);
  sh::dequantize_row(codes.data(), params.data() + 64, 64, q, params.data());
  sh::host::reset_state(model);
  sh::host::reset_sequence(model, 0, 0);
  (void)sh::max_evictions(512, 256, 8);
  sh::host::reset_state(state);
  sh::host::reset_sequence(state, 0, 0);
  (void)sh::catch_errors([&] { sh::host::reset_sequence(state, 1, 0); });
  // The engine applies compress's outputs to its FlashInfer page table.
  (void)sh::host::shrink_page_table({e.indptr.data(), e.indptr.size()}, {e.indices.data(), e.indices.size()},
                                    {e.last_page_len.data(), e.last_page_len.size()}, paged.page_size,
                                    {e.new_lengths.data(), e.new_lengths.size()},
                                    {e.released.data(), e.released.size()});
  (void)sh::host::compress_workspace_bytes(contiguous);
  (void)sh::host::compress_workspace_bytes(paged);
  (void)sh::state_bytes(sh::state_shape_for(sh::scissorhands_policy{}, paged));
  sh::state_shape budget_sized = sh::state_shape_for(sh::h2o_policy{}, contiguous);
  budget_sized.capacity = sh::state_capacity_for(512, 16);
  (void)sh::state_bytes(budget_sized);
  (void)sh::state_bytes_per_token(sh::scissorhands_policy{});
  (void)sh::length_after_compress(600, 512, 16);
  std::vector<std::byte> buffer(4096);
  (void)sh::make_state(sh::host_span<std::byte>(buffer.data(), buffer.size()), state.shape);
  (void)sh::allocate(sh::uniform_budget{}, sh::total_budget::tokens_per_head(512, 32), 32);
  (void)sh::allocate(sh::ramp_budget{}, sh::total_budget::compression_ratio(0.2, 4096, 32), 32);
  (void)sh::allocate(sh::pyramid_budget{}, sh::total_budget::tokens_per_head(512, 32), 32);
  (void)sh::allocate(sh::explicit_budget{{1, 2}}, sh::total_budget{3}, 2);
  (void)sh::allocate(sh::persistence_budget{{0.5, 0.9}}, sh::total_budget{100}, 2);
}

}  // namespace tidy
