#pragma once
// CUDA backend, steps 1-2: the twins of host::admit, host::observe_probabilities
// and host::observe_queries, on the caller's stream.
//
// Layering (after CUB): these entry points validate on the host (throwing
// scissorhands::invalid_argument as the host backend does), then dispatch
// picks the kernels and their traits; kernels/ hold the per-block agents and
// block/ the collectives. Each call launches two kernels, in stream order:
//
//   1. a check kernel (device data: lengths, page table, state rows and
//      counters, qo_indptr, probability or log-sum-exp values) that ORs bits
//      into the status words of the rows at fault (status.cuh),
//   2. the observe kernel, which skips every sequence whose row is -1 or
//      whose status word is non-zero; the last of a sequence's blocks to
//      finish updates its row's counters (kernels/observe.cuh,
//      finish_block). With SCISSORHANDS_PDL=1 on sm_90+ it is launched
//      programmatically dependent on the check (launch.cuh).
//
// Continuous batching: pass state.for_batch(d_state_rows) (a device span)
// to map batch positions to state rows; ragged views (qo_indptr in device
// memory) mix prefill chunks, decode tokens and sequences with no query
// (those only have their new tokens admitted). Nothing is allocated,
// nothing synchronises with the host, and which tokens are new is decided
// on the device, so a decode step can be captured in a CUDA graph. Returns
// the CUDA runtime's launch error, if any.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../attention_view.hpp"
#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../paged_kv_view.hpp"
#include "../policy/eviction_policy.hpp"
#include "../quantized_kv_view.hpp"
#include "detail/tables.cuh"
#include "detail/validate.cuh"
#include "element.cuh"
#include "kernels/check.cuh"
#include "kernels/observe.cuh"
#include "kernels/observe_queries.cuh"
#include "launch.cuh"
#include "status.cuh"
#include "traits.cuh"

namespace scissorhands::cuda {

namespace detail {

// Largest dynamic shared memory observe_queries asks for (group * head_dim floats).
inline constexpr std::int32_t max_query_tile_floats = 10 * 1024;

// Grid (chunks, kv_heads, batch) of the slot kernels: sized by the longest
// a sequence can be, capped (detail/slot_chunks.hpp); the bookkeeping
// kernels' chunks by default, observe_queries' with the log-sum-exp.
inline dim3 slot_grid(std::int32_t slots, std::int32_t kv_heads, std::int32_t batch,
                      std::int32_t min_chunk = slot_traits::chunk, std::int64_t max_blocks = slot_traits::max_blocks) {
  const std::int32_t chunks = chunk_blocks(slots, std::int64_t{kv_heads} * batch, min_chunk, max_blocks);
  return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(kv_heads), static_cast<unsigned>(batch));
}

template <observe_mode Mode>
void launch_check(const sequence_table& seqs, const eviction_state<memory_space::device>& state,
                  const query_rows& counts, const probability_view<memory_space::device>& probs,
                  const query_rows& lse_rows, const lse_view<memory_space::device>& lse, std::int32_t head_dim,
                  const key_params_check& key_params, cudaStream_t stream) {
  // Blocks per sequence (observe_check_kernel): a query head's values
  // each where they are many, a KV head's K parameters each, else one.
  const unsigned heads = Mode == observe_mode::probabilities ? static_cast<unsigned>(counts.q_heads)
                         : key_params.per_row > 0         ? static_cast<unsigned>(state.shape.kv_heads)
                                                          : 1u;
  const dim3 grid(heads, static_cast<unsigned>(seqs.batch));
  observe_check_kernel<Mode><<<grid, slot_traits::threads, 0, stream>>>(seqs, state, counts, probs, lse_rows, lse,
                                                                        head_dim, key_params);
}

// Admission; a static scorer reads the new K rows (a quantized cache's K
// parameters of those rows are checked first, as the host does).
template <class Policy, class View>
cudaError_t dispatch_admit(const char* fn, const Policy& policy, const View& cache,
                           const eviction_state<memory_space::device>& state, cudaStream_t stream) {
  using Obs = typename Policy::observation;
  validate_static_key<Obs>(fn, cache);
  const sequence_table seqs = make_sequence_table(cache);
  const auto rows = make_key_rows(cache);
  const key_params_check key_params = Obs::needs_attention ? key_params_check{} : make_key_params_check(cache, false);
  launch_check<observe_mode::admit>(seqs, state, {}, {}, {}, {}, 0, key_params, stream);
  launch_second(admit_kernel<Obs, std::remove_const_t<decltype(rows)>>,
                slot_grid(max_slots(cache, state), cache.kv_heads, cache.batch), slot_traits::threads, 0, stream,
                policy.config, seqs, rows, cache.head_dim, state);
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}

template <class Policy, class Rows, class Q, int HeadDim>
void launch_queries(const Policy& policy, const sequence_table& seqs, const Rows& rows, std::int32_t head_dim,
                    const eviction_state<memory_space::device>& state,
                    const query_view<Q, memory_space::device>& queries, const lse_view<memory_space::device>& lse,
                    float scale, dim3 grid, std::size_t smem, cudaStream_t stream) {
  using T = typename key_traits<Rows>::element;
  using mma = mma_qk<T, Q, HeadDim>;
  const std::int32_t group = queries.q_heads / state.shape.kv_heads;
  if constexpr (mma::available) {
    // A fast kernel on tensor cores holds up to 16 query heads a KV head;
    // larger groups (multi-query models) take the generic kernel.
    if (group > mma::max_group) {
      launch_queries<Policy, Rows, Q, 0>(policy, seqs, rows, head_dim, state, queries, lse, scale, grid, smem, stream);
      return;
    }
  }
  smem += mma::extra_shared_bytes(group);
  launch_second(observe_queries_kernel<Policy, Rows, Q, HeadDim>, grid, qk_traits<T, HeadDim>::threads, smem, stream,
                policy, seqs, rows, head_dim, state, queries, lse, scale);
}

}  // namespace detail

// Admits the tokens appended since the last call (slots tracked..length-1)
// without observing: what observe_* do first, and all they do for static
// policies.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t admit(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                  cudaStream_t stream = 0) {
  detail::validate_common("cuda::admit", policy, cache, state);
  return detail::dispatch_admit("cuda::admit", policy, cache, state, stream);
}

// Admits new tokens, then records this step's attention probabilities
// (GQA-combined per KV head, causal for several queries; uniform or ragged
// view). Bit-identical to host::observe_probabilities.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t observe_probabilities(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                                  probability_view<memory_space::device> probs, cudaStream_t stream = 0) {
  const char* fn = "cuda::observe_probabilities";
  detail::validate_common(fn, policy, cache, state);
  if constexpr (!Policy::observation::needs_attention) {
    return detail::dispatch_admit(fn, policy, cache, state, stream);
  } else {
    detail::validate_probabilities(fn, cache, probs);
    const detail::sequence_table seqs = detail::make_sequence_table(cache);
    const detail::query_rows counts = detail::make_query_rows(probs, probs.q_heads, probs.data.size());
    detail::launch_check<detail::observe_mode::probabilities>(seqs, state, counts, probs, {}, {}, 0, {}, stream);
    detail::launch_second(detail::observe_probabilities_kernel<Policy>,
                          detail::slot_grid(detail::max_slots(cache, state), cache.kv_heads, cache.batch),
                          slot_traits::threads, 0, stream, policy, seqs, state, probs);
    return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
  }
}

// Admits new tokens, then recomputes this step's probabilities from the
// queries (after RoPE) and the cached keys and records them: with `lse`
// (natural or base 2, head-major or token-major, as the attention kernel
// returned it) in one read of K; without, with a normaliser of its own (two
// reads). softmax_scale multiplies q.k (1/sqrt(head_dim) when 0). A ragged
// `queries` needs a ragged `lse` over the same qo_indptr array. Prefill:
// pass the last w queries of each sequence, causal. Scores match
// host::observe_queries within float rounding (the dot products are summed
// in another order). A quantized cache (device_quantized_kv_view,
// device_quantized_paged_kv_view) has K dequantized on the fly; a row's
// non-finite K parameter skips its sequence (status_k_params).
//
// HeadDim: 0 (the default) compiles a kernel for each head_dim with a fast
// path (64, 128, 256) and two generic ones, and picks at run time; an
// engine with one model passes its head_dim, observe_queries<128>(...),
// and compiles only that fast kernel and the generic ones it falls back to
// (rows not 16-byte aligned; on tensor cores, groups of more than 16 query
// heads a KV head): cache.head_dim must then equal HeadDim.
template <int HeadDim = 0, class Policy, class View, class Q>
  requires composed_policy<Policy>
cudaError_t observe_queries(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                            query_view<Q, memory_space::device> queries, lse_view<memory_space::device> lse = {},
                            float softmax_scale = 0.0f, cudaStream_t stream = 0) {
  using T = typename View::element_type;
  static_assert(is_quantized_view_v<View> || float_convertible<T>,
                "specialise scissorhands::element_traits for the cache's element type");
  static_assert(float_convertible<Q>, "specialise scissorhands::element_traits for the query's element type");
  static_assert(HeadDim == 0 || HeadDim == 64 || HeadDim == 128 || HeadDim == 256,
                "HeadDim: 0 (head_dim chosen at run time) or a head_dim with a fast path: 64, 128 or 256");
  const char* fn = "cuda::observe_queries";
  detail::validate_common(fn, policy, cache, state);
  if constexpr (HeadDim != 0)
    scissorhands::detail::require(cache.head_dim == HeadDim, fn, "cache.head_dim",
                                  "must equal the HeadDim template argument, ", HeadDim, ", got ", cache.head_dim);
  if constexpr (!Policy::observation::needs_attention) {
    return detail::dispatch_admit(fn, policy, cache, state, stream);
  } else {
    detail::validate_queries(fn, cache, queries, lse, softmax_scale);
    const std::int32_t group = queries.q_heads / cache.kv_heads;
    scissorhands::detail::require(std::int64_t{group} * cache.head_dim <= detail::max_query_tile_floats, fn,
                                  "q_heads", "/ kv_heads times head_dim must be at most ",
                                  detail::max_query_tile_floats, " for the CUDA backend (queries of a step in shared "
                                  "memory), got ", std::int64_t{group} * cache.head_dim);
    const float scale = softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(cache.head_dim));
    const detail::sequence_table seqs = detail::make_sequence_table(cache);
    const auto rows = detail::make_key_rows(cache);
    using Rows = std::remove_const_t<decltype(rows)>;
    const detail::query_rows counts = detail::make_query_rows(queries, queries.q_heads, queries.data.size());
    const detail::query_rows lse_rows = detail::make_query_rows(lse, counts);
    detail::launch_check<detail::observe_mode::queries>(seqs, state, counts, {}, lse_rows, lse, cache.head_dim,
                                                        detail::make_key_params_check(cache, true), stream);
    // With the log-sum-exp, a head's slots are split over blocks (about a
    // thousand in all; each block takes its share of its own sequence's
    // length: detail/slot_chunks.hpp); without, a block per head computes
    // the normaliser (a grid for 0 slots: one block a head).
    const dim3 grid = detail::slot_grid(lse.present() ? detail::max_slots(cache, state) : 0, cache.kv_heads,
                                        cache.batch, qk_chunk_traits::min_chunk, qk_chunk_traits::max_blocks);
    const std::size_t smem = static_cast<std::size_t>(group) * static_cast<std::size_t>(cache.head_dim) * sizeof(float);
    const bool vectorised = detail::key_rows_vectorised(rows, cache.head_dim);
    // The kernel for head_dim `dim` (a std::integral_constant): -1 scalar
    // (rows not 16-byte aligned), 0 generic, else a fast path. A quantized
    // cache takes the generic paths only (two kernels per policy for both
    // formats instead of a fast path per format and size), and so does an
    // engine's element type wider than 4 bytes (the fast paths hold four or
    // more elements a 16-byte vector).
    auto launch = [&](auto dim) {
      detail::launch_queries<Policy, Rows, Q, decltype(dim)::value>(policy, seqs, rows, cache.head_dim, state,
                                                                   queries, lse, scale, grid, smem, stream);
    };
    using std::integral_constant;
    if (!vectorised)
      launch(integral_constant<int, -1>{});
    else if constexpr (is_quantized_view_v<View> || sizeof(T) > 4)
      launch(integral_constant<int, 0>{});
    else if constexpr (HeadDim != 0)
      launch(integral_constant<int, HeadDim>{});
    else if (cache.head_dim == 64)
      launch(integral_constant<int, 64>{});
    else if (cache.head_dim == 128)
      launch(integral_constant<int, 128>{});
    else if (cache.head_dim == 256)
      launch(integral_constant<int, 256>{});
    else
      launch(integral_constant<int, 0>{});
    return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
  }
}

// With the attention kernel's options (attention_view.hpp). The CUDA kernels
// compute plain causal softmax only: a sliding window, soft-capped logits or
// ALiBi slopes are refused, naming the option, rather than scored as plain
// softmax. Such a layer observes through host::observe_queries (which
// applies them) or through observe_probabilities with the kernel's own
// probabilities.
template <int HeadDim = 0, class Policy, class View, class Q>
  requires composed_policy<Policy>
cudaError_t observe_queries(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                            query_view<Q, memory_space::device> queries, lse_view<memory_space::device> lse,
                            attention_options<memory_space::device> options, cudaStream_t stream = 0) {
  const char* fn = "cuda::observe_queries";
  const char* not_yet = " is not supported by the CUDA backend yet (its kernels compute plain causal softmax): "
                        "observe this layer with host::observe_queries or observe_probabilities, got ";
  scissorhands::detail::require(options.window_left == -1, fn, "options.window_left", "(a sliding window)", not_yet,
                                options.window_left);
  scissorhands::detail::require(options.logits_soft_cap == 0.0f, fn, "options.logits_soft_cap", "(soft-capping)",
                                not_yet, options.logits_soft_cap);
  scissorhands::detail::require(options.alibi_slopes.empty(), fn, "options.alibi_slopes", "(ALiBi)", not_yet,
                                options.alibi_slopes.size(), " slopes");
  return observe_queries<HeadDim>(policy, cache, state, queries, lse, options.softmax_scale, stream);
}

}  // namespace scissorhands::cuda
