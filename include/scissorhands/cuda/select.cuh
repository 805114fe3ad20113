#pragma once
// CUDA backend, shared_layers eviction: the twins of host::select,
// host::compact and host::forget (host/select.hpp), on the caller's stream,
// bit-identical to them.
//
//   per step:  observe layer l into model.layer(l), for every layer
//              cuda::select(d_ws, ws_bytes, policy, cache, model, budget, selection, pinned, stream)
//   then either (block-table engines: vLLM, FlashInfer)
//              cuda::compact(d_cws, cws_bytes, policy, cache_of_layer(l), model.layer(l), selection, stream)
//                  for every layer
//              cuda::shrink_page_table(..., selection.out.new_lengths, ...) once
//   or (slot-allocator engines: SGLang, llama.cpp)
//              free selection.cache_slots in the engine's allocator, remove them
//              from each sequence's token list keeping the order, and
//              cuda::forget(policy, cache, model.layer(l), selection, stream) for every layer
//
// select and compact are two-phase like CUB (d_workspace == nullptr: the
// size query, nothing launched). Nothing allocates or synchronises; a
// decode step can be captured in a CUDA graph. Every call validates on the
// host what needs no device memory (throwing invalid_argument with the host
// backend's messages) and checks the data on the device (status.cuh):
//
//   select   every layer's counters (as compress), every layer tracking all
//            tokens of a sequence at the budget (status_untracked) at the
//            same next_position and the same positions in every head
//            (status_slot_mismatch), pinned_prefix in [0, length]
//            (status_pinned_prefix), enough tokens neither protected nor
//            pinned (status_positions). A sequence at fault is flagged in
//            every layer's status word, so compact and forget skip it in
//            every layer; it gets selection count 0, and new_lengths /
//            freed_pages as if it had been compacted (as compress reports a
//            skipped sequence), its contents void until its row is reset.
//            A row already flagged in any layer is skipped the same way.
//   compact, forget
//            the layer's counters (as compress), counts in [0, min(length,
//            stride)] and slots strictly ascending in [0, length)
//            (status_selection), none protected in any head
//            (status_selection_protected), the state tracking every token
//            of a sequence with a non-zero count (status_untracked), and
//            (compact, paged) every page that would be written listed once
//            (status_shared_page). A sequence at fault is skipped in this
//            layer; the others proceed.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../detail/validate.hpp"
#include "../model_state.hpp"
#include "../partial_scores.hpp"
#include "../selection.hpp"
#include "compress.cuh"
#include "detail/tables.cuh"
#include "detail/validate.cuh"
#include "kernels/select.cuh"
#include "launch.cuh"
#include "status.cuh"
#include "traits.cuh"

namespace scissorhands::cuda {

namespace detail {

// The model must be laid out by make_model_state, and every layer must
// match the cache and the policy (as compress's state).
template <class Policy, class View>
void validate_model(const char* fn, const Policy& policy, const View& cache,
                    const model_state<memory_space::device>& model) {
  require(model.layers > 0 && model.first.step != nullptr, fn, "model",
          "is not laid out: build it with make_model_state");
  require(model.layer_bytes == state_bytes(model.first.shape), fn, "model.layer_bytes",
          "must be state_bytes(shape) = ", state_bytes(model.first.shape), " (make_model_state sets it), got ",
          model.layer_bytes);
  for (std::int32_t l = 0; l < model.layers; ++l) validate_common(fn, policy, cache, model.layer(l));
}

template <class Policy, class View>
compress_workspace::sizes select_sizes(const Policy& policy, const View& cache,
                                       const model_state<memory_space::device>& model, std::int32_t budget) {
  compress_workspace::sizes n;
  n.batch = cache.batch;
  n.lists = 1;
  n.max_evict = max_evict(policy, cache, model.first, budget);
  const std::int32_t slots = max_slots(cache, model.first);
  n.key_slots = slots > select_traits::tile_keys ? slots : 0;
  return n;
}

// The selection compact and forget read: the sizes of its spans (its
// values are checked on the device).
template <class View>
void validate_selection_spans(const char* fn, const View& cache, const eviction_selection<memory_space::device>& sel) {
  require(sel.stride >= 0, fn, "selection.stride", "must be non-negative, got ", sel.stride);
  require(sel.counts.size() == static_cast<std::size_t>(cache.batch) && sel.counts.data() != nullptr, fn,
          "selection.counts", "must hold batch = ", cache.batch, " entries (non-null), got ", sel.counts.size());
  const std::size_t entries = static_cast<std::size_t>(cache.batch) * static_cast<std::size_t>(sel.stride);
  require(sel.slots.size() >= entries && (entries == 0 || sel.slots.data() != nullptr), fn, "selection.slots",
          "must hold batch * stride = ", entries, " entries (non-null), got ", sel.slots.size());
}

inline selection_in selection_input(const eviction_selection<memory_space::device>& sel) {
  return {sel.counts.data(), sel.slots.data(), sel.stride};
}

// Reads the selection; `written` (K, V, the state, the workspace) must not
// overlap it.
template <std::size_t N>
void validate_selection_apart(const char* fn, std::int32_t batch, const eviction_selection<memory_space::device>& sel,
                              const byte_range (&written)[N]) {
  const std::size_t entries = static_cast<std::size_t>(batch) * static_cast<std::size_t>(sel.stride);
  const byte_range read[] = {range_of(sel.counts, "selection.counts"),
                             {sel.slots.data(), entries * sizeof(std::int32_t), "selection.slots"}};
  for (const byte_range& w : written)
    for (const byte_range& r : read)
      require(!overlaps(w, r), fn, r.name, "must not overlap ", w.name, " (the call reads it while writing)");
}

}  // namespace detail

// Bytes of workspace select needs for this cache, model, policy and budget:
// a few bytes per sequence and token it may evict, plus 8 bytes per slot
// when a sequence may hold more slots than the selection's shared-memory
// tile (select_traits::tile_keys).
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t select_workspace_bytes(const Policy& policy, const View& cache,
                                   const model_state<memory_space::device>& model, std::int32_t budget) {
  const char* fn = "cuda::select_workspace_bytes";
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  detail::require(model.layers > 0 && model.first.step != nullptr, fn, "model",
                  "is not laid out: build it with make_model_state");
  detail::validate_cache(fn, cache);
  detail::validate_settings(fn, policy);
  detail::validate_state_matches(fn, policy, cache, model.first);
  detail::validate_budget(fn, policy, budget);
  return detail::compress_workspace::bytes(detail::select_sizes(policy, cache, model, budget));
}

// The same from shapes and the policy only, for any budget, as
// host::select_workspace_bytes(policy, cache, shape) (one layer's shape):
// only the view's shape fields are read, so a view built before its memory
// exists sizes the workspace.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t select_workspace_bytes(const Policy&, const View& cache, const state_shape& shape) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  detail::compress_workspace::sizes n;
  n.batch = cache.batch > 0 ? cache.batch : 0;
  n.lists = 1;
  const std::int32_t slots = detail::max_slots(cache, shape);
  n.max_evict = slots > 0 ? slots : 0;  // length - budget + m < length (validate_budget)
  n.key_slots = slots > select_traits::tile_keys ? slots : 0;
  return detail::compress_workspace::bytes(n);
}

// Chooses, for every sequence holding `budget` tokens or more, the
// length - budget + m slots to evict from the whole model, exactly as
// host::select: each slot's eviction score combined over the heads of
// every layer (Policy::granularity, a shared_layers<HeadReduction,
// LayerReduction>), the protector's tokens and the first pinned_prefix[b]
// slots never chosen, ties to the older token. Writes selection.counts,
// the ascending slots (and cache_slots when given: paged
// indices[indptr[b] + t / page_size] * page_size + t % page_size,
// contiguous t), selection.out.new_lengths (always length_after_compress)
// and selection.out.freed_pages; moves nothing. `cache` is any layer's
// view: select reads its lengths and page table only. One block per
// sequence. See the top of this file for what the device checks.
namespace detail {

// select, from the model's scores or (reduced non-null) from all-reduced
// partial scores.
// `size_name` and `data_name` are the arguments a refusal names (the
// CUB-style call's workspace_bytes and d_workspace, the span call's
// workspace).
template <class Policy, class View>
cudaError_t run_select(const char* fn, void* d_workspace, std::size_t workspace_bytes, const char* size_name,
                       const char* data_name, const Policy& policy, View cache,
                       model_state<memory_space::device> model, std::int32_t budget,
                       const partial_scores<memory_space::device>* reduced,
                       eviction_selection<memory_space::device> selection,
                       device_span<const std::int32_t> pinned_prefix, cudaStream_t stream) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  static_assert(granularity_of<Policy> == granularity_kind::shared_layers,
                "cuda::select chooses one set of slots for the whole model: give the policy a shared_layers "
                "granularity (with_granularity<Policy, shared_layers<>>); per_head and shared_heads policies "
                "evict layer by layer with cuda::compress");
  validate_model(fn, policy, cache, model);
  validate_budget(fn, policy, budget);
  const std::int32_t m = policy.config.evict_count;
  // Workspace.
  const compress_workspace::sizes sizes = select_sizes(policy, cache, model, budget);
  const std::size_t need = compress_workspace::bytes(sizes);
  require(workspace_bytes >= need, fn, size_name, "is ", workspace_bytes, ", below the ", need,
          " bytes the workspace query returned");
  require(d_workspace != nullptr, fn, data_name, "must not be null");
  require(reinterpret_cast<std::uintptr_t>(d_workspace) % compress_workspace::alignment == 0, fn, data_name,
          "must be aligned to ", compress_workspace::alignment, " bytes");
  const byte_range ws_range{d_workspace, workspace_bytes, data_name};
  const partial_scores<memory_space::device> scores =
      reduced != nullptr ? *reduced : partial_scores<memory_space::device>{};
  if (reduced != nullptr) validate_partial_scores(fn, "reduced", scores, cache, model);
  validate_selection_output(fn, cache, model, budget, m, selection, pinned_prefix, ws_range,
                            {scores.values.data(), scores.values.size() * sizeof(float), "reduced.values"});

  const sequence_table seqs = make_sequence_table(cache);
  const compress_workspace ws = compress_workspace::carve(d_workspace, sizes);
  const auto blocks = static_cast<unsigned>(cache.batch);
  select_shared_kernel<typename Policy::protector, evicts_highest<typename Policy::observation>,
                       typename Policy::granularity><<<blocks, select_traits::threads, 0, stream>>>(
      policy.config, seqs, model, budget, pinned_prefix.empty() ? nullptr : pinned_prefix.data(), ws, scores);
  selection_out out;
  out.counts = selection.counts.data();
  out.slots = selection.slots.data();
  out.cache_slots = selection.cache_slots.empty() ? nullptr : selection.cache_slots.data();
  out.stride = selection.stride;
  out.new_lengths = selection.out.new_lengths.data();
  out.freed_pages = selection.out.freed_pages.empty() ? nullptr : selection.out.freed_pages.data();
  launch_second(publish_selection_kernel<>, blocks, slot_traits::threads, 0, stream, m, seqs, model, budget, ws, out);
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}

}  // namespace detail

// host::select's call on the device: the workspace a device span of at
// least select_workspace_bytes(policy, cache, shape) bytes, in the same
// place as on the host, then the caller's stream.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t select(const Policy& policy, View cache, model_state<memory_space::device> model, std::int32_t budget,
                   device_span<std::byte> workspace, eviction_selection<memory_space::device> selection,
                   device_span<const std::int32_t> pinned_prefix = {}, cudaStream_t stream = 0) {
  return detail::run_select("cuda::select", workspace.data(), workspace.size(), "workspace", "workspace", policy,
                            cache, model, budget, nullptr, selection, pinned_prefix, stream);
}
// Deprecated spelling, CUB's two-phase call (d_workspace == nullptr: the
// size for this budget in workspace_bytes); the call above is the one API.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t select(void* d_workspace, std::size_t& workspace_bytes, const Policy& policy, View cache,
                   model_state<memory_space::device> model, std::int32_t budget,
                   eviction_selection<memory_space::device> selection,
                   device_span<const std::int32_t> pinned_prefix = {}, cudaStream_t stream = 0) {
  if (d_workspace == nullptr) {
    workspace_bytes = select_workspace_bytes(policy, cache, model, budget);
    return cudaSuccess;
  }
  return detail::run_select("cuda::select", d_workspace, workspace_bytes, "workspace_bytes", "d_workspace", policy,
                            cache, model, budget, nullptr, selection, pinned_prefix, stream);
}

// Tensor parallelism (partial_scores.hpp, docs/tensor_parallel.md): this
// rank's share of select, host::local_scores's twin, bit for bit. Writes
// `partial` (layers x batch x capacity floats on the device): for every
// sequence at the budget, each layer's head reduction of this rank's
// heads' eviction scores, before finish; the identity elsewhere, and for a
// sequence whose row the device cannot trust (out of range, flagged, not
// tracking its tokens: select then flags it). One launch, no workspace;
// the engine then all-reduces `partial` across ranks on its stream (NCCL:
// ncclAllReduce with ncclFloat and all_reduce_op_of<Policy>) and calls
// select below.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t local_scores(const Policy& policy, View cache, model_state<memory_space::device> model,
                         std::int32_t budget, partial_scores<memory_space::device> partial, cudaStream_t stream = 0) {
  const char* fn = "cuda::local_scores";
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  static_assert(granularity_of<Policy> == granularity_kind::shared_layers,
                "cuda::local_scores is select's first half: give the policy a shared_layers granularity");
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "local_scores splits the head reduction across ranks: the granularity's head_reduction needs "
                "`static constexpr all_reduce_op all_reduce` (mean_score and max_score have it)");
  detail::validate_model(fn, policy, cache, model);
  detail::validate_budget(fn, policy, budget);
  detail::validate_partial_scores(fn, "partial", partial, cache, model);
  detail::validate_workspace_apart(fn, cache, model.first.state_rows, detail::model_range(model),
                                   {partial.values.data(), partial.values.size() * sizeof(float), "partial.values"});
  if (cache.batch == 0) return cudaSuccess;
  const detail::sequence_table seqs = detail::make_sequence_table(cache);
  const auto chunks = static_cast<unsigned>((std::int64_t{partial.capacity} + slot_traits::chunk - 1) / slot_traits::chunk);
  const dim3 grid(chunks, static_cast<unsigned>(model.layers), static_cast<unsigned>(cache.batch));
  detail::local_scores_kernel<typename Policy::granularity, evicts_highest<typename Policy::observation>>
      <<<grid, slot_traits::threads, 0, stream>>>(policy.config, seqs, model, budget, partial);
  return cudaPeekAtLastError();
}

// select from the all-reduced partial scores of every rank
// (host::select's reduced overload): each layer's head reduction finished
// over reduced.kv_heads heads, then the layer reduction, protection,
// pinning and tie-break; the device checks are select's. Ranks given the
// same reduced bits choose the same slots.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t select(const Policy& policy, View cache, model_state<memory_space::device> model, std::int32_t budget,
                   partial_scores<memory_space::device> reduced, device_span<std::byte> workspace,
                   eviction_selection<memory_space::device> selection,
                   device_span<const std::int32_t> pinned_prefix = {}, cudaStream_t stream = 0) {
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "select from reduced scores needs a head_reduction with `static constexpr all_reduce_op all_reduce`");
  return detail::run_select("cuda::select", workspace.data(), workspace.size(), "workspace", "workspace", policy,
                            cache, model, budget, &reduced, selection, pinned_prefix, stream);
}
// Deprecated spelling (CUB's two-phase call) of the same.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t select(void* d_workspace, std::size_t& workspace_bytes, const Policy& policy, View cache,
                   model_state<memory_space::device> model, std::int32_t budget,
                   partial_scores<memory_space::device> reduced, eviction_selection<memory_space::device> selection,
                   device_span<const std::int32_t> pinned_prefix = {}, cudaStream_t stream = 0) {
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "select from reduced scores needs a head_reduction with `static constexpr all_reduce_op all_reduce`");
  if (d_workspace == nullptr) {
    workspace_bytes = select_workspace_bytes(policy, cache, model, budget);
    return cudaSuccess;
  }
  return detail::run_select("cuda::select", d_workspace, workspace_bytes, "workspace_bytes", "d_workspace", policy,
                            cache, model, budget, &reduced, selection, pinned_prefix, stream);
}

// Bytes of workspace compact needs: 4 per pool page for a paged cache (the
// shared-page check's listing counts). Never 0, as CUB's sizes: a contiguous
// cache gets 1 (unused), so the call after a query is never taken for one.
template <class View>
std::size_t compact_workspace_bytes(const View& cache) {
  if constexpr (requires { cache.num_pages; })
    return cache.num_pages > 0 ? sizeof(std::int32_t) * static_cast<std::size_t>(cache.num_pages) : 1;
  else
    return 1;
}

namespace detail {
// compact after the workspace is known (names as run_compress's). A
// contiguous cache needs none: its workspace may be empty and null.
template <class Policy, class View>
cudaError_t run_compact(const char* fn, void* d_workspace, std::size_t workspace_bytes, const char* size_name,
                        const char* data_name, const Policy& policy, View cache,
                        eviction_state<memory_space::device> state, eviction_selection<memory_space::device> selection,
                        cudaStream_t stream) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  constexpr bool paged = requires { cache.page_size; };
  detail::validate_common(fn, policy, cache, state);
  detail::validate_selection_spans(fn, cache, selection);
  std::size_t need = 0;
  if constexpr (paged) {
    need = compact_workspace_bytes(cache);
    detail::require(workspace_bytes >= need, fn, size_name, "is ", workspace_bytes, ", below the ", need,
                    " bytes the workspace query returned");
    detail::require(d_workspace != nullptr, fn, data_name, "must not be null");
  }
  detail::require(reinterpret_cast<std::uintptr_t>(d_workspace) % alignof(std::int32_t) == 0, fn, data_name,
                  "must be aligned to ", alignof(std::int32_t), " bytes");
  const detail::byte_range ws_range{d_workspace, paged ? need : 0, data_name};
  {
    detail::byte_range kv[2], params[2];
    detail::kv_ranges(cache, kv);
    detail::params_ranges(cache, params);
    const detail::byte_range written[] = {kv[0], kv[1], params[0], params[1], detail::state_range(state), ws_range};
    detail::validate_selection_apart(fn, cache.batch, selection, written);
    detail::validate_workspace_apart(fn, cache, state, ws_range);
  }
  const detail::sequence_table seqs = detail::make_sequence_table(cache);
  std::int32_t* page_counts = nullptr;
  if constexpr (paged) {
    page_counts = static_cast<std::int32_t*>(d_workspace);
    const cudaError_t err = cudaMemsetAsync(page_counts, 0, need, stream);
    if (err != cudaSuccess) return err;
  }
  const detail::selection_in sel = detail::selection_input(selection);
  detail::selection_check_kernel<typename Policy::protector>
      <<<static_cast<unsigned>(cache.batch), slot_traits::threads, 0, stream>>>(policy.config, seqs, state, sel,
                                                                                  page_counts);
  const dim3 grid(static_cast<unsigned>(cache.kv_heads), static_cast<unsigned>(cache.batch));
  const bool stable = policy.config.compaction_mode == compaction::preserve_order;
  detail::launch_second(detail::apply_selection_kernel<>, grid, compact_traits::threads,
                        compact_traits::stage_for(stable), stream, stable, true, seqs, detail::make_row_planes(cache),
                        state, sel, page_counts);
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}
}  // namespace detail

// Applies a selection to one layer, exactly as host::compact: evicts its
// slots from every head and closes the holes in K, V (a quantized cache:
// codes and parameter rows together) and the layer's state
// (settings.compaction_mode, as compress). Call it for every layer with
// the same selection, then apply selection.out once (shrink_page_table).
// Lengths and the page table are read, not written. A page that would be
// written (one holding a slot in [first evicted slot, new length) of its
// sequence) must be listed once in the table (status_shared_page); pages
// wholly below a sequence's first evicted slot, such as a shared prefix
// pinned in select, may be shared. One workspace serves every layer of a
// stream.
//
// host::compact's call on the device: the workspace a device span of
// compact_workspace_bytes(cache) bytes (a paged cache's page listing
// counts; a contiguous cache's may be empty), in the same place as on the
// host, then the caller's stream.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t compact(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                    eviction_selection<memory_space::device> selection, device_span<std::byte> workspace,
                    cudaStream_t stream = 0) {
  return detail::run_compact("cuda::compact", workspace.data(), workspace.size(), "workspace", "workspace", policy,
                             cache, state, selection, stream);
}
// Deprecated spelling, CUB's two-phase call (d_workspace == nullptr: the
// size in workspace_bytes, at least 1); the call above is the one API.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t compact(void* d_workspace, std::size_t& workspace_bytes, const Policy& policy, View cache,
                    eviction_state<memory_space::device> state, eviction_selection<memory_space::device> selection,
                    cudaStream_t stream = 0) {
  const char* fn = "cuda::compact";
  if (d_workspace == nullptr) {
    detail::validate_cache(fn, cache);
    workspace_bytes = compact_workspace_bytes(cache);
    return cudaSuccess;
  }
  const std::size_t need = compact_workspace_bytes(cache);  // 1 for a contiguous cache, as the query said
  detail::require(workspace_bytes >= need, fn, "workspace_bytes", "is ", workspace_bytes, ", below the ", need,
                  " bytes the workspace query returned");
  return detail::run_compact(fn, d_workspace, workspace_bytes, "workspace_bytes", "d_workspace", policy, cache, state,
                             selection, stream);
}

// Applies a selection to one layer's state only, exactly as host::forget,
// for an engine that freed the slots in its own allocator
// (selection.cache_slots) and removed them from each sequence's token list
// keeping the others in order: the state drops the same slots and keeps
// its order too, whatever settings.compaction_mode says. K and V are not
// touched; `cache` gives the lengths before the removal.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t forget(const Policy& policy, View cache, eviction_state<memory_space::device> state,
                   eviction_selection<memory_space::device> selection, cudaStream_t stream = 0) {
  const char* fn = "cuda::forget";
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  detail::validate_common(fn, policy, cache, state);
  detail::validate_selection_spans(fn, cache, selection);
  const detail::byte_range written[] = {detail::state_range(state)};
  detail::validate_selection_apart(fn, cache.batch, selection, written);
  const detail::sequence_table seqs = detail::make_sequence_table(cache);
  const detail::selection_in sel = detail::selection_input(selection);
  detail::selection_check_kernel<typename Policy::protector>
      <<<static_cast<unsigned>(cache.batch), slot_traits::threads, 0, stream>>>(policy.config, seqs, state, sel,
                                                                                  nullptr);
  const dim3 grid(static_cast<unsigned>(cache.kv_heads), static_cast<unsigned>(cache.batch));
  detail::launch_second(detail::apply_selection_kernel<>, grid, compact_traits::threads, compact_traits::stage_for(true),
                        stream, true, false, seqs, detail::row_planes{}, state, sel,
                        static_cast<const std::int32_t*>(nullptr));
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}

}  // namespace scissorhands::cuda
