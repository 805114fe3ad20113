#pragma once
// CUDA backend, steps 3-4: the twin of host::compress, on the caller's stream.
//
// Two-phase, like CUB: call with d_workspace == nullptr to get the bytes it
// needs in workspace_bytes (nothing is launched), then again with a device
// buffer of at least that size. Two kernels per call (see
// kernels/compress.cuh; a paged cache first clears the workspace's page
// listing counts with cudaMemsetAsync): selection (per (sequence, head), or
// per sequence for a shared_heads policy), then compaction, which skips
// every sequence whose state row's status word is non-zero, so a sequence
// whose data fails a device check changes nothing (status.cuh) and the
// others proceed. Whether a sequence triggers (length >= budget) is decided on the
// device. One workspace serves every layer of a stream (calls run in
// order); give concurrent streams their own.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../compress_output.hpp"
#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../model_state.hpp"
#include "../paged_kv_view.hpp"
#include "../policy/eviction_policy.hpp"
#include "detail/tables.cuh"
#include "detail/validate.cuh"
#include "kernels/compress.cuh"
#include "kernels/select.cuh"
#include "launch.cuh"
#include "status.cuh"
#include "traits.cuh"

namespace scissorhands::cuda {

namespace detail {
// The most tokens a sequence evicts per head: one holding as many tokens as
// the cache and the state allow.
template <class Policy, class View>
std::int32_t max_evict(const Policy& policy, const View& cache, const eviction_state<memory_space::device>& state,
                       std::int32_t budget) {
  const std::int64_t e = std::int64_t{max_slots(cache, state)} - budget + policy.config.evict_count;
  return e > 0 ? static_cast<std::int32_t>(e) : 0;
}

// The workspace compress needs: per_head one list per (sequence, head),
// shared_heads one per sequence (plus keys beyond the selection tile), and
// for a paged cache one listing count per pool page.
template <class Policy, class View>
compress_workspace::sizes compress_sizes(const Policy& policy, const View& cache,
                                         const eviction_state<memory_space::device>& state, std::int32_t budget) {
  constexpr bool shared = granularity_of<Policy> == granularity_kind::shared_heads;
  compress_workspace::sizes n;
  n.batch = cache.batch;
  n.lists = shared ? 1 : cache.kv_heads;
  n.max_evict = max_evict(policy, cache, state, budget);
  if constexpr (requires { cache.num_pages; }) n.pages = cache.num_pages;
  const std::int32_t slots = max_slots(cache, state);
  n.key_slots = shared && slots > select_traits::tile_keys ? slots : 0;
  return n;
}

// Slots a sequence can hold, from the shapes alone (max_slots without a state).
template <class View>
std::int32_t max_slots(const View& cache, const state_shape& shape) {
  const std::int32_t c = cache.max_capacity();
  return c < shape.capacity ? c : shape.capacity;
}

// compress's sizes for every valid budget: a sequence evicts
// length - budget + m < length tokens a head (validate_budget: m <= budget -
// protected), so the slots it can hold bound the lists.
template <class Policy, class View>
compress_workspace::sizes compress_sizes(const Policy&, const View& cache, const state_shape& shape) {
  constexpr bool shared = granularity_of<Policy> == granularity_kind::shared_heads;
  compress_workspace::sizes n;
  n.batch = cache.batch > 0 ? cache.batch : 0;
  n.lists = shared ? 1 : (cache.kv_heads > 0 ? cache.kv_heads : 0);
  const std::int32_t slots = max_slots(cache, shape);
  n.max_evict = slots > 0 ? slots : 0;
  if constexpr (requires { cache.num_pages; }) n.pages = cache.num_pages > 0 ? cache.num_pages : 0;
  n.key_slots = shared && slots > select_traits::tile_keys ? slots : 0;
  return n;
}

}  // namespace detail

// Bytes of workspace compress needs for this cache, state, policy and
// budget: a few bytes per (sequence, head) and token it may evict (per
// sequence for shared_heads, plus 8 bytes per slot when a sequence may
// hold more slots than the selection's shared-memory tile), and for a
// paged cache 4 bytes per pool page; sized by the smaller of the cache's
// and the state's capacity.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t compress_workspace_bytes(const Policy& policy, const View& cache,
                                     const eviction_state<memory_space::device>& state, std::int32_t budget) {
  const char* fn = "cuda::compress_workspace_bytes";
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  static_assert(granularity_of<Policy> != granularity_kind::shared_layers,
                "a shared_layers policy evicts one set of slots for the whole model: observe every layer into a "
                "model_state, then cuda::select once per step and cuda::compact (or cuda::forget) per layer");
  detail::validate_cache(fn, cache);
  detail::validate_settings(fn, policy);
  detail::validate_state_matches(fn, policy, cache, state);
  detail::validate_budget(fn, policy, budget);
  return detail::compress_workspace::bytes(detail::compress_sizes(policy, cache, state, budget));
}

// The same from shapes and the policy only, for any budget, as
// host::compress_workspace_bytes(policy, cache, shape): only the view's
// shape fields are read (batch, kv_heads, capacity or pages), so a view
// built before its memory exists (null spans) sizes the workspace. At
// least the size the budget-specific overload gives.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t compress_workspace_bytes(const Policy& policy, const View& cache, const state_shape& shape) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  static_assert(granularity_of<Policy> != granularity_kind::shared_layers,
                "a shared_layers policy evicts one set of slots for the whole model: observe every layer into a "
                "model_state, then cuda::select once per step and cuda::compact (or cuda::forget) per layer");
  return detail::compress_workspace::bytes(detail::compress_sizes(policy, cache, shape));
}

namespace detail {
// compress after the workspace is known: `size_name` and `data_name` are
// the arguments a refusal names (the CUB-style call's workspace_bytes and
// d_workspace, the span call's workspace).
template <class Policy, class View>
cudaError_t run_compress(const char* fn, void* d_workspace, std::size_t workspace_bytes, const char* size_name,
                         const char* data_name, const Policy& policy, View cache,
                         eviction_state<memory_space::device> state, std::int32_t budget,
                         compress_output<memory_space::device> out, cudaStream_t stream) {
  constexpr bool shared = granularity_of<Policy> == granularity_kind::shared_heads;
  detail::validate_common(fn, policy, cache, state);
  detail::validate_budget(fn, policy, budget);
  const detail::compress_workspace::sizes sizes = detail::compress_sizes(policy, cache, state, budget);
  const std::size_t need = detail::compress_workspace::bytes(sizes);
  detail::require(workspace_bytes >= need, fn, size_name, "is ", workspace_bytes,
                  ", below the ", need, " bytes the workspace query returned");
  detail::require(d_workspace != nullptr, fn, data_name, "must not be null");
  detail::require(reinterpret_cast<std::uintptr_t>(d_workspace) % detail::compress_workspace::alignment == 0, fn,
                  data_name, "must be aligned to ", detail::compress_workspace::alignment, " bytes");
  detail::validate_output(fn, cache, state, out, {d_workspace, workspace_bytes, data_name});
  detail::validate_workspace_apart(fn, cache, state, {d_workspace, workspace_bytes, data_name});

  const detail::sequence_table seqs = detail::make_sequence_table(cache);
  const detail::compress_workspace ws = detail::compress_workspace::carve(d_workspace, sizes);
  if (ws.page_counts != nullptr) {
    const cudaError_t err = cudaMemsetAsync(ws.page_counts, 0, sizeof(std::int32_t) * static_cast<std::size_t>(sizes.pages),
                                            stream);
    if (err != cudaSuccess) return err;
  }
  using Protector = typename Policy::protector;
  constexpr bool highest = evicts_highest<typename Policy::observation>;
  const dim3 grid(static_cast<unsigned>(cache.kv_heads), static_cast<unsigned>(cache.batch));
  if constexpr (shared)
    detail::select_shared_kernel<Protector, highest, typename Policy::granularity>
        <<<static_cast<unsigned>(cache.batch), select_traits::threads, 0, stream>>>(
            policy.config, seqs, scissorhands::detail::single_layer(state), budget, nullptr, ws,
            partial_scores<memory_space::device>{});
  else
    detail::select_kernel<Protector, highest><<<grid, select_traits::threads, 0, stream>>>(policy.config, seqs, state,
                                                                                           budget, ws);
  const bool stable = policy.config.compaction_mode == compaction::preserve_order;
  detail::launch_second(detail::compact_kernel<>, grid, compact_traits::threads, compact_traits::stage_for(stable),
                        stream, policy.config, seqs, detail::make_row_planes(cache), state, budget, ws,
                        out.new_lengths.data(), out.freed_pages.empty() ? nullptr : out.freed_pages.data());
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}
}  // namespace detail

// Evicts, from every sequence holding `budget` tokens or more, the
// length - budget + m lowest-scoring unprotected tokens of each KV head
// (shared_heads: the same slots from every head, by the score combined
// over the heads), and compacts K, V and the state (fill_holes or
// preserve_order), exactly as host::compress; a quantized cache's code
// rows and parameter rows move together. The cache's lengths and page
// table are not written: out.new_lengths[b] gets every sequence's
// length_after_compress (also for sequences skipped for a device-found
// error: see status.cuh; a paged sequence whose indptr or last_page_len
// entry is unusable counts as length 0, one listing a page id outside the
// pool keeps the length those entries give) and out.freed_pages[b] (pages of several
// tokens: required; page size 1 and contiguous: optional) the trailing pages of its list it no longer
// uses. Apply them after the last layer that shares the table
// (cuda::shrink_page_table for a FlashInfer table), in stream order. A
// paged sequence at the budget one of whose pages is listed more than once
// in the table is skipped (status_shared_page), as host::compress refuses
// it.
//
// host::compress's call on the device: the workspace a device span of at
// least compress_workspace_bytes(policy, cache, shape) bytes, in the same
// place as on the host, then the caller's stream.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t compress(const Policy& policy, View cache, eviction_state<memory_space::device> state, std::int32_t budget,
                     device_span<std::byte> workspace, compress_output<memory_space::device> out,
                     cudaStream_t stream = 0) {
  static_assert(granularity_of<Policy> != granularity_kind::shared_layers,
                "a shared_layers policy evicts one set of slots for the whole model: observe every layer into a "
                "model_state, then cuda::select once per step and cuda::compact (or cuda::forget) per layer");
  return detail::run_compress("cuda::compress", workspace.data(), workspace.size(), "workspace", "workspace", policy,
                              cache, state, budget, out, stream);
}

// Deprecated spelling, CUB's two-phase call (d_workspace == nullptr: the
// size for this budget in workspace_bytes, nothing launched). Kept for
// callers written against it; the call above is the one API of both
// backends.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t compress(void* d_workspace, std::size_t& workspace_bytes, const Policy& policy, View cache,
                     eviction_state<memory_space::device> state, std::int32_t budget,
                     compress_output<memory_space::device> out, cudaStream_t stream = 0) {
  static_assert(granularity_of<Policy> != granularity_kind::shared_layers,
                "a shared_layers policy evicts one set of slots for the whole model: observe every layer into a "
                "model_state, then cuda::select once per step and cuda::compact (or cuda::forget) per layer");
  if (d_workspace == nullptr) {
    workspace_bytes = compress_workspace_bytes(policy, cache, state, budget);
    return cudaSuccess;
  }
  return detail::run_compress("cuda::compress", d_workspace, workspace_bytes, "workspace_bytes", "d_workspace", policy,
                              cache, state, budget, out, stream);
}

}  // namespace scissorhands::cuda
