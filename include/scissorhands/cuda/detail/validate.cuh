#pragma once
// Host-side validation of the CUDA entry points' arguments: everything that
// needs no device memory, with the shared detail::validate_* helpers, so the
// messages and the thrown type are the host backend's. What needs device
// data (lengths, page table, state rows and counters, qo_indptr, values) is
// checked on the device (see status.cuh).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../../attention_view.hpp"
#include "../../compress_output.hpp"
#include "../../detail/validate.hpp"
#include "../../host/observe.hpp"  // max_group_size, reach
#include "../../kv_view.hpp"
#include "../../paged_kv_view.hpp"
#include "../../policy/observation.hpp"
#include "../../quantized_kv_view.hpp"

namespace scissorhands::cuda::detail {
using namespace scissorhands::detail;

// Grid dimensions y and z are 16-bit.
inline constexpr std::int32_t max_grid_yz = 65535;

template <class T>
void validate_cache(const char* fn, const kv_view<T, memory_space::device>& cache) {
  validate_shape(fn, cache);
}
template <class T>
void validate_cache(const char* fn, const paged_kv_view<T, memory_space::device>& cache) {
  validate_shape(fn, cache);
  require(cache.indices.data() != nullptr || cache.indices.empty(), fn, "cache.indices",
          "must not be null when it holds entries");
}

// A quantized cache: the codes' and the parameters' shapes (the shared
// quantized validate_shape), and the page table's indices as above.
template <class Codes>
void validate_cache(const char* fn, const quantized_kv_view<Codes>& cache) {
  static_assert(Codes::space == memory_space::device, "the CUDA backend needs a device view");
  validate_shape(fn, cache);
  if constexpr (quantized_kv_view<Codes>::paged)
    require(cache.indices.data() != nullptr || cache.indices.empty(), fn, "cache.indices",
            "must not be null when it holds entries");
}

// A static scorer on a quantized cache: key_norm streams the dequantized
// row and recency / random_score never read it; any other static policy
// gets the row dequantized into a per-thread buffer of
// max_quantized_key_floats (kernels/observe.cuh), which bounds head_dim.
inline constexpr std::int32_t max_quantized_key_floats = 512;
template <class Obs, class View>
void validate_static_key(const char* fn, const View& cache) {
  if constexpr (is_quantized_view_v<View> && !Obs::needs_attention && !std::is_same_v<Obs, key_norm> &&
                !std::is_same_v<Obs, recency> && !std::is_same_v<Obs, random_score>)
    require(cache.head_dim <= max_quantized_key_floats, fn, "cache.head_dim", "must be at most ",
            max_quantized_key_floats, " for a quantized cache scored by ", Obs::name,
            " on the CUDA backend (a K row is dequantized per thread), got ", cache.head_dim);
}

// Slots a sequence can hold at a call: the cache's capacity, and at most the
// state's (a longer sequence is a device error). Grids are sized by it.
template <class View>
std::int32_t max_slots(const View& cache, const eviction_state<memory_space::device>& state) {
  const std::int32_t c = cache.max_capacity();
  return c < state.shape.capacity ? c : state.shape.capacity;
}

template <class Policy, class View>
void validate_common(const char* fn, const Policy& policy, const View& cache,
                     const eviction_state<memory_space::device>& state) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  validate_cache(fn, cache);
  validate_settings(fn, policy);
  validate_state_matches(fn, policy, cache, state);
  require(state.status != nullptr, fn, "state", "has no status words: build it with make_state");
  require(cache.batch <= max_grid_yz, fn, "cache.batch", "must be at most ", max_grid_yz,
          " for the CUDA backend, got ", cache.batch);
  require(cache.kv_heads <= max_grid_yz, fn, "cache.kv_heads", "must be at most ", max_grid_yz,
          " for the CUDA backend, got ", cache.kv_heads);
}

// The bytes a state (one layer) occupies, for the overlap checks.
inline byte_range state_range(const eviction_state<memory_space::device>& state, const char* name = "the state") {
  return {state.step, state.step == nullptr ? 0 : offsets_of(state.shape).total, name};
}

// (validate_workspace_apart, shared with the host, is in detail/validate.hpp:
// a workspace the device writes must not overlap what the call reads.)

// The part of host::detail::validate_query_counts that needs no device data:
// query heads, and qo_indptr's size (its values are checked on the device:
// status_qo_indptr, status_query_length) or a non-negative uniform q_len
// (q_len <= length is status_query_length).
template <class View, class Queries>
void validate_query_counts(const char* fn, const View& cache, const Queries& view) {
  require(view.q_heads > 0, fn, "q_heads", "must be positive, got ", view.q_heads);
  require(view.q_heads % cache.kv_heads == 0, fn, "q_heads", "must be a multiple of cache.kv_heads = ",
          cache.kv_heads, " (GQA group size), got ", view.q_heads);
  require(view.q_heads / cache.kv_heads <= host::max_group_size, fn, "q_heads", "/ kv_heads must be at most ",
          host::max_group_size, ", got ", view.q_heads / cache.kv_heads);
  // Uniform is {nullptr, 0}; a null pointer with a size is a caller's bug.
  require(view.ragged() || view.qo_indptr.empty(), fn, "qo_indptr", "must not be null when its size is ",
          view.qo_indptr.size());
  if (view.ragged())
    require(view.qo_indptr.size() == static_cast<std::size_t>(cache.batch) + 1, fn, "qo_indptr",
            "must hold batch + 1 = ", std::int64_t{cache.batch} + 1, " entries, got ", view.qo_indptr.size());
  else
    require(view.q_len >= 0, fn, "q_len", "must be non-negative, got ", view.q_len);
}

// A uniform view's reach is known on the host (`row` elements per row; the
// probabilities' real row length is checked on the device); a ragged
// view's depends on qo_indptr and is checked on the device
// (status_view_extent). Either way a null pointer must come with size 0.
template <class Data, class Queries>
void validate_reach(const char* fn, const char* name, const Data& data, const Queries& view,
                    std::int64_t sequence_stride, std::int64_t head_stride, std::int64_t query_stride,
                    std::int32_t batch, std::int64_t row) {
  require(data.data() != nullptr || data.empty(), fn, name, "must not be null when its size is ", data.size());
  if (view.ragged()) return;
  const std::int64_t need =
      host::detail::reach_uniform(sequence_stride, head_stride, query_stride, batch, view.q_heads, view.q_len, row);
  require(need == 0 || data.data() != nullptr, fn, name, "must not be null");
  require(static_cast<std::uint64_t>(need) <= data.size(), fn, name, "holds ", data.size(),
          " values but the view reaches ", need);
}

template <class View>
void validate_probabilities(const char* fn, const View& cache, const probability_view<memory_space::device>& probs) {
  validate_query_counts(fn, cache, probs);
  for (std::int64_t s : std::initializer_list<std::int64_t>{probs.sequence_stride, probs.head_stride,
                                                            probs.query_stride})
    require(s >= 0, fn, "probs strides", "must be non-negative, got ", s);
  // With one column: the rows' real length is the sequence's, a device check.
  validate_reach(fn, "probs.data", probs.data, probs, probs.sequence_stride, probs.head_stride, probs.query_stride,
                 cache.batch, 1);
}

template <class View, class Q>
void validate_queries(const char* fn, const View& cache, const query_view<Q, memory_space::device>& queries,
                      const lse_view<memory_space::device>& lse, float softmax_scale) {
  validate_query_counts(fn, cache, queries);
  const std::int32_t d = cache.head_dim;
  require(queries.head_dim == d, fn, "queries.head_dim", "must equal cache.head_dim = ", d, ", got ",
          queries.head_dim);
  for (std::int64_t s : std::initializer_list<std::int64_t>{queries.sequence_stride, queries.head_stride,
                                                            queries.query_stride})
    require(s >= 0, fn, "queries strides", "must be non-negative, got ", s);
  validate_reach(fn, "queries.data", queries.data, queries, queries.sequence_stride, queries.head_stride,
                 queries.query_stride, cache.batch, d);
  require(std::isfinite(softmax_scale) && softmax_scale >= 0.0f, fn, "softmax_scale",
          "must be finite and non-negative (0 means 1/sqrt(head_dim)), got ", softmax_scale);
  // Absent is {nullptr, 0}; a null pointer with a size is a caller's bug, not "no lse".
  require(lse.present() || lse.data.empty(), fn, "lse.data", "must not be null when its size is ", lse.data.size());
  if (lse.present()) {
    require(lse.qo_indptr.data() == queries.qo_indptr.data() && lse.qo_indptr.size() == queries.qo_indptr.size(),
            fn, "lse.qo_indptr", "must be the queries' qo_indptr (both ragged over one array, or neither)");
    for (std::int64_t s : std::initializer_list<std::int64_t>{lse.sequence_stride, lse.head_stride,
                                                              lse.query_stride})
      require(s >= 0, fn, "lse strides", "must be non-negative, got ", s);
    validate_reach(fn, "lse.data", lse.data, queries, lse.sequence_stride, lse.head_stride, lse.query_stride,
                   cache.batch, 1);
    require(lse.base == lse_base::natural || lse.base == lse_base::base2, fn, "lse.base",
            "must be named: lse_base::natural (FlashAttention) or lse_base::base2 (FlashInfer), got ",
            lse.base == lse_base::unspecified ? "unspecified" : "an unknown value");
    // The device does not check the sums yet (lse_check), but a value the
    // host would refuse is refused here too.
    require(lse.check == lse_check::sums_to_one || lse.check == lse_check::at_most_one ||
                lse.check == lse_check::none,
            fn, "lse.check", "must be lse_check::sums_to_one, at_most_one or none, got ",
            static_cast<int>(lse.check));
  }
}

}  // namespace scissorhands::cuda::detail
