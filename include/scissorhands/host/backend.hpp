#pragma once
// backend<memory_space::host>: the host backend's calls under the spelling
// both backends share (backend.hpp). Each forwards to host:: and returns
// host_status::success (errors throw).
#include <cstddef>
#include <cstdint>

#include "../attention_view.hpp"
#include "../backend.hpp"
#include "../compress_output.hpp"
#include "../eviction_state.hpp"
#include "../model_state.hpp"
#include "../partial_scores.hpp"
#include "../selection.hpp"
#include "compress.hpp"
#include "observe.hpp"
#include "select.hpp"
#include "state.hpp"

namespace scissorhands {

template <>
struct backend<memory_space::host> {
  static constexpr memory_space space = memory_space::host;
  template <class T>
  using span_of = host_span<T>;

  template <class Policy, class View>
  static std::size_t compress_workspace_bytes(const Policy& policy, const View& cache, const state_shape& shape) {
    return host::compress_workspace_bytes(policy, cache, shape);
  }
  template <class Policy, class View>
  static std::size_t select_workspace_bytes(const Policy& policy, const View& cache, const state_shape& shape) {
    return host::select_workspace_bytes(policy, cache, shape);
  }
  template <class View>
  static std::size_t compact_workspace_bytes(const View& cache) {
    return host::compact_workspace_bytes(cache);
  }

  [[nodiscard]] host_status reset_state(eviction_state<space> state) const {
    host::reset_state(state);
    return host_status::success;
  }
  [[nodiscard]] host_status reset_state(model_state<space> model) const {
    host::reset_state(model);
    return host_status::success;
  }
  [[nodiscard]] host_status reset_sequence(eviction_state<space> state, std::int32_t row,
                                           std::int32_t start_position = 0) const {
    host::reset_sequence(state, row, start_position);
    return host_status::success;
  }
  [[nodiscard]] host_status reset_sequence(model_state<space> model, std::int32_t row,
                                           std::int32_t start_position = 0) const {
    host::reset_sequence(model, row, start_position);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status admit(const Policy& policy, View cache, eviction_state<space> state) const {
    host::admit(policy, cache, state);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status observe_probabilities(const Policy& policy, View cache, eviction_state<space> state,
                                                  probability_view<space> probs) const {
    host::observe_probabilities(policy, cache, state, probs);
    return host_status::success;
  }
  // HeadDim as cuda::observe_queries<HeadDim> takes it (the device compiles
  // only that head_dim's kernel); the host has one path for every head_dim
  // and refuses a cache of another, as the device does.
  template <int HeadDim = 0, class Policy, class View, class Q>
  [[nodiscard]] host_status observe_queries(const Policy& policy, View cache, eviction_state<space> state,
                                            query_view<Q, space> queries, lse_view<space> lse,
                                            attention_options<space> options = {}) const {
    static_assert(HeadDim == 0 || HeadDim == 64 || HeadDim == 128 || HeadDim == 256,
                  "HeadDim: 0 (head_dim chosen at run time) or a head_dim with a fast path: 64, 128 or 256");
    if constexpr (HeadDim != 0)
      detail::require(cache.head_dim == HeadDim, "host::observe_queries", "cache.head_dim",
                      "must equal the HeadDim template argument, ", HeadDim, ", got ", cache.head_dim);
    host::observe_queries(policy, cache, state, queries, lse, options);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status compress(const Policy& policy, View cache, eviction_state<space> state,
                                     std::int32_t budget, span_of<std::byte> workspace,
                                     compress_output<space> out) const {
    host::compress(policy, cache, state, budget, workspace, out);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status select(const Policy& policy, View cache, model_state<space> model, std::int32_t budget,
                                   span_of<std::byte> workspace, eviction_selection<space> selection,
                                   span_of<const std::int32_t> pinned_prefix = {}) const {
    host::select(policy, cache, model, budget, workspace, selection, pinned_prefix);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status local_scores(const Policy& policy, View cache, model_state<space> model,
                                         std::int32_t budget, partial_scores<space> partial) const {
    host::local_scores(policy, cache, model, budget, partial);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status select(const Policy& policy, View cache, model_state<space> model, std::int32_t budget,
                                   partial_scores<space> reduced, span_of<std::byte> workspace,
                                   eviction_selection<space> selection,
                                   span_of<const std::int32_t> pinned_prefix = {}) const {
    host::select(policy, cache, model, budget, reduced, workspace, selection, pinned_prefix);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status compact(const Policy& policy, View cache, eviction_state<space> state,
                                    eviction_selection<space> selection, span_of<std::byte> workspace) const {
    host::compact(policy, cache, state, selection, workspace);
    return host_status::success;
  }
  template <class Policy, class View>
  [[nodiscard]] host_status forget(const Policy& policy, View cache, eviction_state<space> state,
                                   eviction_selection<space> selection) const {
    host::forget(policy, cache, state, selection);
    return host_status::success;
  }
  [[nodiscard]] host_status shrink_page_table(span_of<std::int32_t> indptr, span_of<std::int32_t> indices,
                                              span_of<std::int32_t> last_page_len, std::int32_t page_size,
                                              span_of<const std::int32_t> new_lengths, span_of<std::int32_t> released,
                                              span_of<shrink_result> result) const {
    host::shrink_page_table(indptr, indices, last_page_len, page_size, new_lengths, released, result);
    return host_status::success;
  }
  // The table a paged view was made over, with the view's page size.
  template <class View>
    requires page_table_view<View>
  [[nodiscard]] host_status shrink_page_table(const View& cache, span_of<const std::int32_t> new_lengths,
                                              span_of<std::int32_t> released, span_of<shrink_result> result) const {
    host::shrink_page_table(cache, new_lengths, released, result);
    return host_status::success;
  }
};

}  // namespace scissorhands
