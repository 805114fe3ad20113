#pragma once
// backend<memory_space::host>: the host backend's calls under the spelling
// both backends share (backend.hpp). Each forwards to host::.
#include <cstddef>
#include <cstdint>

#include "../attention_view.hpp"
#include "../backend.hpp"
#include "../compress_output.hpp"
#include "../eviction_state.hpp"
#include "../model_state.hpp"
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

  void reset_state(eviction_state<space> state) const { host::reset_state(state); }
  void reset_state(model_state<space> model) const { host::reset_state(model); }
  void reset_sequence(eviction_state<space> state, std::int32_t row, std::int32_t start_position = 0) const {
    host::reset_sequence(state, row, start_position);
  }
  void reset_sequence(model_state<space> model, std::int32_t row, std::int32_t start_position = 0) const {
    host::reset_sequence(model, row, start_position);
  }
  template <class Policy, class View>
  void admit(const Policy& policy, View cache, eviction_state<space> state) const {
    host::admit(policy, cache, state);
  }
  template <class Policy, class View>
  void observe_probabilities(const Policy& policy, View cache, eviction_state<space> state,
                             probability_view<space> probs) const {
    host::observe_probabilities(policy, cache, state, probs);
  }
  template <class Policy, class View, class Q>
  void observe_queries(const Policy& policy, View cache, eviction_state<space> state, query_view<Q, space> queries,
                       lse_view<space> lse, attention_options<space> options = {}) const {
    host::observe_queries(policy, cache, state, queries, lse, options);
  }
  template <class Policy, class View>
  void compress(const Policy& policy, View cache, eviction_state<space> state, std::int32_t budget,
                span_of<std::byte> workspace, compress_output<space> out) const {
    host::compress(policy, cache, state, budget, workspace, out);
  }
  template <class Policy, class View>
  void select(const Policy& policy, View cache, model_state<space> model, std::int32_t budget,
              span_of<std::byte> workspace, eviction_selection<space> selection,
              span_of<const std::int32_t> pinned_prefix = {}) const {
    host::select(policy, cache, model, budget, workspace, selection, pinned_prefix);
  }
  template <class Policy, class View>
  void compact(const Policy& policy, View cache, eviction_state<space> state, eviction_selection<space> selection,
               span_of<std::byte> workspace) const {
    host::compact(policy, cache, state, selection, workspace);
  }
  template <class Policy, class View>
  void forget(const Policy& policy, View cache, eviction_state<space> state,
              eviction_selection<space> selection) const {
    host::forget(policy, cache, state, selection);
  }
  void shrink_page_table(span_of<std::int32_t> indptr, span_of<std::int32_t> indices,
                         span_of<std::int32_t> last_page_len, std::int32_t page_size,
                         span_of<const std::int32_t> new_lengths, span_of<std::int32_t> released,
                         span_of<shrink_result> result) const {
    host::shrink_page_table(indptr, indices, last_page_len, page_size, new_lengths, released, result);
  }
};

}  // namespace scissorhands
