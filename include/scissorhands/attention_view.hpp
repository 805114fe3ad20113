#pragma once
// Views of what the engine's attention produced: probabilities, queries and
// log-sum-exp.
//
// Which queries each sequence has: either the same q_len for every sequence
// (qo_indptr empty), or FlashInfer's ragged `qo_indptr[batch + 1]`: the
// queries of sequence b are the step's tokens qo_indptr[b] ..
// qo_indptr[b + 1], so one step mixes prefill chunks, single decode tokens
// and sequences with no query at all (q_len 0: nothing is observed for
// them). Ragged views are token-major, as engines store them: row (b, qh, j)
// is token qo_indptr[b] + j, at that token times query_stride plus qh times
// head_stride (sequence_stride is unused).
//
// Query j of the q_len(b) queries of sequence b sits at cache slot
// length(b) - q_len(b) + j and sees slots 0 .. length(b) - q_len(b) + j
// (causal). Columns of a probability row are cache slots.
#include <cstdint>

#include "config.hpp"
#include "span.hpp"

namespace scissorhands {

namespace detail {
// Where row (b, qh, j) of a uniform or ragged view starts.
template <memory_space Space>
SCISSORHANDS_HOST_DEVICE inline std::int64_t query_offset(const span<const std::int32_t, Space>& qo_indptr,
                                                          std::int64_t sequence_stride, std::int64_t head_stride,
                                                          std::int64_t query_stride, std::int32_t b,
                                                          std::int32_t qh, std::int32_t j) {
  if (qo_indptr.data() != nullptr)
    return (std::int64_t{qo_indptr[b]} + j) * query_stride + std::int64_t{qh} * head_stride;
  return std::int64_t{b} * sequence_stride + std::int64_t{qh} * head_stride + std::int64_t{j} * query_stride;
}
}  // namespace detail

template <memory_space Space>
struct probability_view {
  span<const float, Space> data;
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;            // queries per sequence when qo_indptr is empty
  std::int64_t sequence_stride = 0;  // elements between sequences (uniform views)
  std::int64_t head_stride = 0;      // elements between query heads
  std::int64_t query_stride = 0;     // elements between queries (ragged: between tokens); columns are contiguous
  span<const std::int32_t, Space> qo_indptr;  // [batch + 1] ragged queries; empty: q_len each

  SCISSORHANDS_HOST_DEVICE bool ragged() const { return qo_indptr.data() != nullptr; }
  SCISSORHANDS_HOST_DEVICE std::int32_t queries_of(std::int32_t b) const {
    return ragged() ? qo_indptr[b + 1] - qo_indptr[b] : q_len;
  }
  SCISSORHANDS_HOST_DEVICE const float* row(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    return data.data() + detail::query_offset(qo_indptr, sequence_stride, head_stride, query_stride, b, qh, j);
  }
  // Dense [batch][q_heads][q_len][columns].
  static probability_view dense(span<const float, Space> data, std::int32_t q_heads, std::int32_t q_len,
                                std::int32_t columns) {
    const std::int64_t row = columns;
    return {data, q_heads, q_len, std::int64_t{q_heads} * q_len * row, std::int64_t{q_len} * row, row, {}};
  }
  // Ragged, token-major [token][q_heads][columns].
  static probability_view ragged(span<const float, Space> data, span<const std::int32_t, Space> qo_indptr,
                                 std::int32_t q_heads, std::int32_t columns) {
    const std::int64_t row = columns;
    return {data, q_heads, 0, 0, row, std::int64_t{q_heads} * row, qo_indptr};
  }
};

// Queries as the attention kernel saw them (after RoPE), head_dim contiguous.
template <class T, memory_space Space>
struct query_view {
  span<const T, Space> data;
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;  // queries per sequence when qo_indptr is empty
  std::int32_t head_dim = 0;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  span<const std::int32_t, Space> qo_indptr;  // [batch + 1] ragged queries; empty: q_len each

  SCISSORHANDS_HOST_DEVICE bool ragged() const { return qo_indptr.data() != nullptr; }
  SCISSORHANDS_HOST_DEVICE std::int32_t queries_of(std::int32_t b) const {
    return ragged() ? qo_indptr[b + 1] - qo_indptr[b] : q_len;
  }
  SCISSORHANDS_HOST_DEVICE const T* row(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    return data.data() + detail::query_offset(qo_indptr, sequence_stride, head_stride, query_stride, b, qh, j);
  }
  // Dense [batch][q_len][q_heads][head_dim] (token-major, as engines store Q).
  static query_view dense(span<const T, Space> data, std::int32_t q_heads, std::int32_t q_len, std::int32_t head_dim) {
    const std::int64_t row = head_dim;
    return {data, q_heads, q_len, head_dim, std::int64_t{q_len} * q_heads * row, row, std::int64_t{q_heads} * row, {}};
  }
  // Ragged [token][q_heads][head_dim], tokens as qo_indptr lists them.
  static query_view ragged(span<const T, Space> data, span<const std::int32_t, Space> qo_indptr, std::int32_t q_heads,
                           std::int32_t head_dim) {
    const std::int64_t row = head_dim;
    return {data, q_heads, 0, head_dim, 0, row, std::int64_t{q_heads} * row, qo_indptr};
  }
};

// FlashAttention returns the natural log-sum-exp of the scaled logits;
// FlashInfer returns it in base 2. No default: a natural LSE read as base 2
// (or the reverse) gives scores off by a factor of e^(0.31 lse) and nothing
// downstream can tell, so the engine names its kernel's base, and a view
// built without one (`unspecified`) is refused by observe_queries.
enum class lse_base { unspecified, natural, base2 };

// What the host's observe_queries checks of a given LSE. The engine's LSE
// normalises over the keys its kernel saw, so for a query the library
// recomputes exp(logit - lse) over the same held keys and the terms sum to
// 1; a sum far from 1 means the attention is described wrongly (the LSE's
// base, softmax_scale, a window, soft-capping, ALiBi, or heads that do not
// match the data) and every score would be off. Sampled, so it costs
// little: the last query of every query head, on a row's first observe
// and on every call that crosses a multiple of lse_check_interval of its
// queries (host/observe.hpp); refused when the sum strays beyond
// lse_sum_tolerance. The device backend does not check sums yet.
//   sums_to_one  (default) both bounds: the kernel's softmax was over
//                exactly the cache's keys.
//   at_most_one  the upper bound only: the softmax also had terms outside
//                the cache (learned attention sinks, as gpt-oss has), so a
//                sum below 1 is legitimate.
//   none         unchecked: a kernel whose logits differ from the
//                library's by more than the tolerance (say, Q quantized to
//                8 bits before the dot products).
enum class lse_check { sums_to_one, at_most_one, none };

template <memory_space Space>
struct lse_view {
  span<const float, Space> data;  // empty: the library computes the normaliser itself
  lse_base base = lse_base::unspecified;  // must be named when data is present
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  span<const std::int32_t, Space> qo_indptr;  // ragged: the queries' qo_indptr (the same array)
  lse_check check = lse_check::sums_to_one;    // what observe_queries checks of it (host)

  SCISSORHANDS_HOST_DEVICE bool present() const { return data.data() != nullptr; }
  SCISSORHANDS_HOST_DEVICE float natural(std::int32_t b, std::int32_t qh, std::int32_t j) const {
    const float x = data[static_cast<std::size_t>(
        detail::query_offset(qo_indptr, sequence_stride, head_stride, query_stride, b, qh, j))];
    return base == lse_base::base2 ? x * 0.693147180559945309f : x;
  }
  // Dense [batch][q_heads][q_len] (head-major, as FlashAttention returns it).
  static lse_view dense(span<const float, Space> data, std::int32_t q_heads, std::int32_t q_len, lse_base base) {
    return {data, base, std::int64_t{q_heads} * q_len, q_len, 1, {}};
  }
  // Token-major [batch * q_len][q_heads] (FlashInfer's layout) for a uniform q_len.
  static lse_view token_major(span<const float, Space> data, std::int32_t q_heads, std::int32_t q_len,
                              lse_base base) {
    return {data, base, std::int64_t{q_len} * q_heads, 1, q_heads, {}};
  }
  // Ragged token-major [token][q_heads], tokens as qo_indptr lists them (FlashInfer).
  static lse_view ragged(span<const float, Space> data, span<const std::int32_t, Space> qo_indptr,
                         std::int32_t q_heads, lse_base base) {
    return {data, base, 0, 1, q_heads, qo_indptr};
  }
};

// What a sliding window's width counts. FlashInfer's and FlashAttention's
// kernels measure it in cache slots (their kv index). llama.cpp's mask
// measures it in logical positions: once eviction leaves holes, a window
// of 512 positions holds fewer than 512 slots, so an engine whose mask
// works on positions says so, and the library measures each key's distance
// with the positions it keeps for every token.
enum class window_unit { slots, positions };

// How the engine's attention kernel formed its logits beyond plain causal
// softmax, in FlashInfer's terms (its sm_scale, window_left,
// logits_soft_cap and ALiBi slopes). Distances are in cache slots, the
// kernel's kv index, as FlashInfer's and FlashAttention's kernels measure
// them (the window's may be in positions instead: window_left_unit). The
// logit of the query at slot i (head qh) against the key at slot t:
//   x = softmax_scale * q.k + alibi_slopes[qh] * (t - i)   (ALiBi, when given)
//   x = logits_soft_cap * tanh(x / logits_soft_cap)         (when > 0: Gemma 2)
// and keys at t < i - window_left get no attention (when window_left >= 0:
// Mistral's and Gemma 2/3's sliding-window layers; with window_unit::
// positions, keys whose position is below the query's minus window_left).
// observe_queries must be told what the kernel did: with plain options it
// computes plain causal softmax over every held slot, and its scores for
// such a layer are wrong.
template <memory_space Space>
struct attention_options {
  float softmax_scale = 0.0f;             // multiplies q.k; 0: 1/sqrt(head_dim)
  std::int32_t window_left = -1;          // sliding window: slots [i - window_left, i]; -1: none
  float logits_soft_cap = 0.0f;           // > 0: soft-capped logits; 0: none
  span<const float, Space> alibi_slopes;  // [q_heads] ALiBi slopes; empty: none
  window_unit window_left_unit = window_unit::slots;  // what window_left counts

  SCISSORHANDS_HOST_DEVICE bool plain() const {
    return window_left < 0 && logits_soft_cap == 0.0f && alibi_slopes.empty();
  }
};

}  // namespace scissorhands
