#pragma once
// Views of what the engine's attention produced: probabilities, queries and
// log-sum-exp. Columns of a probability row are cache slots 0..length-1;
// query j of q_len in sequence b sits at slot length(b) - q_len + j and sees
// slots 0..length(b) - q_len + j (causal).
#include <cstdint>

#include "config.hpp"
#include "span.hpp"

namespace scissorhands {

template <memory_space Space>
struct probability_view {
  span<const float, Space> data;
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;
  std::int64_t sequence_stride = 0;  // elements between sequences
  std::int64_t head_stride = 0;      // elements between query heads
  std::int64_t query_stride = 0;     // elements between queries; columns are contiguous

  SCISSORHANDS_HOST_DEVICE const float* row(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    return data.data() + std::int64_t{b} * sequence_stride + std::int64_t{qh} * head_stride +
           std::int64_t{j} * query_stride;
  }
  // Dense [batch][q_heads][q_len][columns].
  static probability_view dense(span<const float, Space> data, std::int32_t q_heads, std::int32_t q_len,
                                std::int32_t columns) {
    const std::int64_t row = columns;
    return {data, q_heads, q_len, std::int64_t{q_heads} * q_len * row, std::int64_t{q_len} * row, row};
  }
};

// Queries as the attention kernel saw them (after RoPE), head_dim contiguous.
template <class T, memory_space Space>
struct query_view {
  span<const T, Space> data;
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;
  std::int32_t head_dim = 0;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;

  SCISSORHANDS_HOST_DEVICE const T* row(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    return data.data() + std::int64_t{b} * sequence_stride + std::int64_t{qh} * head_stride +
           std::int64_t{j} * query_stride;
  }
  // Dense [batch][q_len][q_heads][head_dim] (token-major, as engines store Q).
  static query_view dense(span<const T, Space> data, std::int32_t q_heads, std::int32_t q_len, std::int32_t head_dim) {
    const std::int64_t row = head_dim;
    return {data, q_heads, q_len, head_dim, std::int64_t{q_len} * q_heads * row, row, std::int64_t{q_heads} * row};
  }
};

// FlashAttention returns the natural log-sum-exp of the scaled logits;
// FlashInfer returns it in base 2.
enum class lse_base { natural, base2 };

template <memory_space Space>
struct lse_view {
  span<const float, Space> data;  // empty: the library computes the normaliser itself
  lse_base base = lse_base::natural;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;

  SCISSORHANDS_HOST_DEVICE bool present() const { return data.data() != nullptr; }
  SCISSORHANDS_HOST_DEVICE float natural(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    const float x = data[static_cast<std::size_t>(std::int64_t{b} * sequence_stride + std::int64_t{qh} * head_stride +
                                                  std::int64_t{j} * query_stride)];
    return base == lse_base::base2 ? x * 0.693147180559945309f : x;
  }
  // Dense [batch][q_heads][q_len].
  static lse_view dense(span<const float, Space> data, std::int32_t q_heads, std::int32_t q_len,
                        lse_base base = lse_base::natural) {
    return {data, base, std::int64_t{q_heads} * q_len, q_len, 1};
  }
};

}  // namespace scissorhands
