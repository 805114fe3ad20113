#pragma once
// Host-side validation of the CUDA entry points' arguments: everything that
// needs no device memory, with the shared detail::validate_* helpers, so the
// messages and the thrown type are the host backend's. What needs device
// data is checked on the device (see status.cuh).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../../attention_view.hpp"
#include "../../detail/validate.hpp"
#include "../../host/observe.hpp"  // max_group_size, reach
#include "../../kv_view.hpp"
#include "../../paged_kv_view.hpp"

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

template <class Policy, class View>
void validate_common(const char* fn, const Policy& policy, const View& cache,
                     const eviction_state<memory_space::device>& state, const std::uint32_t* d_status) {
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  validate_cache(fn, cache);
  validate_settings(fn, policy);
  validate_state_matches(fn, policy, cache, state);
  require(d_status != nullptr, fn, "d_status", "must point to a device word (see cuda/status.cuh)");
  require(cache.batch <= max_grid_yz, fn, "cache.batch", "must be at most ", max_grid_yz,
          " for the CUDA backend, got ", cache.batch);
  require(cache.kv_heads <= max_grid_yz, fn, "cache.kv_heads", "must be at most ", max_grid_yz,
          " for the CUDA backend, got ", cache.kv_heads);
}

// The shape part of host::detail::validate_queries_shape; q_len <= length
// is a device check (status_query_length).
template <class View>
void validate_queries_shape(const char* fn, const View& cache, std::int32_t q_heads, std::int32_t q_len) {
  require(q_heads > 0, fn, "q_heads", "must be positive, got ", q_heads);
  require(q_heads % cache.kv_heads == 0, fn, "q_heads", "must be a multiple of cache.kv_heads = ", cache.kv_heads,
          " (GQA group size), got ", q_heads);
  require(q_heads / cache.kv_heads <= host::max_group_size, fn, "q_heads", "/ kv_heads must be at most ",
          host::max_group_size, ", got ", q_heads / cache.kv_heads);
  require(q_len > 0, fn, "q_len", "must be positive, got ", q_len);
  require(q_len <= cache.max_capacity(), fn, "q_len", "must not exceed the cache's capacity ",
          cache.max_capacity(), ": each query is a cached token, got ", q_len);
}

template <class View>
void validate_probabilities(const char* fn, const View& cache, const probability_view<memory_space::device>& probs) {
  validate_queries_shape(fn, cache, probs.q_heads, probs.q_len);
  require(probs.data.data() != nullptr, fn, "probs.data", "must not be null");
  for (std::int64_t s : std::initializer_list<std::int64_t>{probs.sequence_stride, probs.head_stride,
                                                            probs.query_stride})
    require(s >= 0, fn, "probs strides", "must be non-negative, got ", s);
  // With at least one column; the extent for the actual lengths is a device
  // check (status_view_extent).
  const std::int64_t need = host::detail::reach(probs.sequence_stride, cache.batch, probs.head_stride, probs.q_heads,
                                                probs.query_stride, probs.q_len, 1);
  require(static_cast<std::uint64_t>(need) <= probs.data.size(), fn, "probs.data", "holds ", probs.data.size(),
          " values but the view reaches ", need);
}

template <class View, class Q>
void validate_queries(const char* fn, const View& cache, const query_view<Q, memory_space::device>& queries,
                      const lse_view<memory_space::device>& lse, float softmax_scale) {
  validate_queries_shape(fn, cache, queries.q_heads, queries.q_len);
  const std::int32_t d = cache.head_dim;
  require(queries.head_dim == d, fn, "queries.head_dim", "must equal cache.head_dim = ", d, ", got ",
          queries.head_dim);
  require(queries.data.data() != nullptr, fn, "queries.data", "must not be null");
  for (std::int64_t s : std::initializer_list<std::int64_t>{queries.sequence_stride, queries.head_stride,
                                                            queries.query_stride})
    require(s >= 0, fn, "queries strides", "must be non-negative, got ", s);
  const std::int64_t need = host::detail::reach(queries.sequence_stride, cache.batch, queries.head_stride,
                                                queries.q_heads, queries.query_stride, queries.q_len, d);
  require(static_cast<std::uint64_t>(need) <= queries.data.size(), fn, "queries.data", "holds ", queries.data.size(),
          " values but the view reaches ", need);
  require(std::isfinite(softmax_scale) && softmax_scale >= 0.0f, fn, "softmax_scale",
          "must be finite and non-negative (0 means 1/sqrt(head_dim)), got ", softmax_scale);
  if (lse.present()) {
    for (std::int64_t s : std::initializer_list<std::int64_t>{lse.sequence_stride, lse.head_stride,
                                                              lse.query_stride})
      require(s >= 0, fn, "lse strides", "must be non-negative, got ", s);
    const std::int64_t lneed = host::detail::reach(lse.sequence_stride, cache.batch, lse.head_stride,
                                                   queries.q_heads, lse.query_stride, queries.q_len, 1);
    require(static_cast<std::uint64_t>(lneed) <= lse.data.size(), fn, "lse.data", "holds ", lse.data.size(),
            " values but the view reaches ", lneed);
    require(lse.base == lse_base::natural || lse.base == lse_base::base2, fn, "lse.base",
            "must be natural or base2, got ", static_cast<int>(lse.base));
  }
}

}  // namespace scissorhands::cuda::detail
