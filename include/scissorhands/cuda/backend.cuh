#pragma once
// backend<memory_space::device>: the CUDA backend's calls under the
// spelling both backends share (backend.hpp), on the stream the backend
// was made with: `backend<memory_space::device> be{stream};`. Each
// forwards to cuda:: and returns its cudaError_t (launch errors only),
// [[nodiscard]]: a dropped launch error is a silent failure (check it with
// succeeded(), backend.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../attention_view.hpp"
#include "../backend.hpp"
#include "../compress_output.hpp"
#include "../eviction_state.hpp"
#include "../model_state.hpp"
#include "../partial_scores.hpp"
#include "../selection.hpp"
#include "compress.cuh"
#include "observe.cuh"
#include "page_table.cuh"
#include "select.cuh"
#include "state.cuh"

namespace scissorhands {

template <>
struct backend<memory_space::device> {
  static constexpr memory_space space = memory_space::device;
  template <class T>
  using span_of = device_span<T>;

  cudaStream_t stream = 0;

  template <class Policy, class View>
  static std::size_t compress_workspace_bytes(const Policy& policy, const View& cache, const state_shape& shape) {
    return cuda::compress_workspace_bytes(policy, cache, shape);
  }
  template <class Policy, class View>
  static std::size_t select_workspace_bytes(const Policy& policy, const View& cache, const state_shape& shape) {
    return cuda::select_workspace_bytes(policy, cache, shape);
  }
  template <class View>
  static std::size_t compact_workspace_bytes(const View& cache) {
    return cuda::compact_workspace_bytes(cache);
  }

  [[nodiscard]] cudaError_t reset_state(eviction_state<space> state) const {
    return cuda::reset_state(state, stream);
  }
  [[nodiscard]] cudaError_t reset_state(model_state<space> model) const { return cuda::reset_state(model, stream); }
  [[nodiscard]] cudaError_t reset_sequence(eviction_state<space> state, std::int32_t row,
                                           std::int32_t start_position = 0) const {
    return cuda::reset_sequence(state, row, start_position, stream);
  }
  [[nodiscard]] cudaError_t reset_sequence(model_state<space> model, std::int32_t row,
                                           std::int32_t start_position = 0) const {
    return cuda::reset_sequence(model, row, start_position, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t admit(const Policy& policy, View cache, eviction_state<space> state) const {
    return cuda::admit(policy, cache, state, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t observe_probabilities(const Policy& policy, View cache, eviction_state<space> state,
                                    probability_view<space> probs) const {
    return cuda::observe_probabilities(policy, cache, state, probs, stream);
  }
  template <int HeadDim = 0, class Policy, class View, class Q>
  [[nodiscard]] cudaError_t observe_queries(const Policy& policy, View cache, eviction_state<space> state,
                                            query_view<Q, space> queries, lse_view<space> lse,
                                            attention_options<space> options = {}) const {
    return cuda::observe_queries<HeadDim>(policy, cache, state, queries, lse, options, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t compress(const Policy& policy, View cache, eviction_state<space> state, std::int32_t budget,
                       span_of<std::byte> workspace, compress_output<space> out) const {
    return cuda::compress(policy, cache, state, budget, workspace, out, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t select(const Policy& policy, View cache, model_state<space> model, std::int32_t budget,
                     span_of<std::byte> workspace, eviction_selection<space> selection,
                     span_of<const std::int32_t> pinned_prefix = {}) const {
    return cuda::select(policy, cache, model, budget, workspace, selection, pinned_prefix, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t local_scores(const Policy& policy, View cache, model_state<space> model,
                                         std::int32_t budget, partial_scores<space> partial) const {
    return cuda::local_scores(policy, cache, model, budget, partial, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t select(const Policy& policy, View cache, model_state<space> model, std::int32_t budget,
                                   partial_scores<space> reduced, span_of<std::byte> workspace,
                                   eviction_selection<space> selection,
                                   span_of<const std::int32_t> pinned_prefix = {}) const {
    return cuda::select(policy, cache, model, budget, reduced, workspace, selection, pinned_prefix, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t compact(const Policy& policy, View cache, eviction_state<space> state,
                      eviction_selection<space> selection, span_of<std::byte> workspace) const {
    return cuda::compact(policy, cache, state, selection, workspace, stream);
  }
  template <class Policy, class View>
  [[nodiscard]] cudaError_t forget(const Policy& policy, View cache, eviction_state<space> state,
                     eviction_selection<space> selection) const {
    return cuda::forget(policy, cache, state, selection, stream);
  }
  [[nodiscard]] cudaError_t shrink_page_table(span_of<std::int32_t> indptr, span_of<std::int32_t> indices,
                                span_of<std::int32_t> last_page_len, std::int32_t page_size,
                                span_of<const std::int32_t> new_lengths, span_of<std::int32_t> released,
                                span_of<shrink_result> result) const {
    return cuda::shrink_page_table(indptr, indices, last_page_len, page_size, new_lengths, released, result, stream);
  }
  template <class View>
    requires page_table_view<View>
  [[nodiscard]] cudaError_t shrink_page_table(const View& cache, span_of<const std::int32_t> new_lengths,
                                              span_of<std::int32_t> released, span_of<shrink_result> result) const {
    return cuda::shrink_page_table(cache, new_lengths, released, result, stream);
  }
};

}  // namespace scissorhands
