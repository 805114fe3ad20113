#pragma once
// Shared-slot eviction under tensor parallelism (docs/tensor_parallel.md).
// Each rank holds some of every layer's KV heads, but all ranks share one
// block table, so they must evict the same slots. select splits in two:
//
//   rank k:  local_scores(policy, cache, model_k, budget, partial_k)
//            -- per (layer, sequence, slot) the head reduction of the rank's
//               own heads' eviction scores, not yet finished;
//   engine:  all-reduce partial_k over the ranks in place, with the
//            operation all_reduce_op_of<Policy> (sum for mean_score, max
//            for max_score), on its own communicator and stream;
//   rank k:  select(policy, cache, model_k, budget, partial_k (reduced), ...)
//            -- finishes each layer's head reduction over all
//               partial.kv_heads heads, reduces the layers and selects.
//
// The library never communicates. Selection is a deterministic function of
// the reduced buffer and of positions (identical on every rank), so ranks
// that receive bit-identical reduced buffers choose identical slots: what
// the engine must guarantee is that its all-reduce delivers the same bits to
// every rank (NCCL's ring and tree all-reduce do: each element is reduced
// once and then broadcast). A max is exact in any order; a sum in another
// order can round differently, so the choice may differ from a single-rank
// run over all heads (never across ranks) where two slots' scores tie to
// within a rounding; sums of integer-valued scores below 2^24 (window
// counts) are exact.
#include <cstddef>
#include <cstdint>

#include "config.hpp"
#include "policy/granularity.hpp"
#include "span.hpp"

namespace scissorhands {

// The operation the engine's all-reduce applies to a policy's partial
// scores (all_reduce_op: sum for mean_score, max for max_score).
template <class Policy>
inline constexpr all_reduce_op all_reduce_op_of = Policy::granularity::head_reduction::all_reduce;

// A rank's partial scores, or after the all-reduce the reduced ones, in a
// caller-owned buffer: value (layer l, sequence b, slot t) at
// values[(l * batch + b) * capacity + t], capacity the state's. Slots at or
// past a sequence's length, and every slot of a sequence below the budget,
// hold the head reduction's identity (0 for a sum, -inf for a max), so the
// all-reduce may run over the whole buffer.
template <memory_space Space>
struct partial_scores {
  static constexpr memory_space space = Space;
  span<float, Space> values;     // [layers][batch][capacity]
  std::int32_t layers = 0;       // the model's
  std::int32_t batch = 0;        // the cache's
  std::int32_t capacity = 0;     // the state's shape.capacity
  std::int32_t kv_heads = 0;     // KV heads of a layer over all ranks (the mean's divisor)

  SCISSORHANDS_HOST_DEVICE float* row(std::int32_t l, std::int32_t b) const {
    return values.data() + (std::int64_t{l} * batch + b) * capacity;
  }
};

// Floats a partial_scores buffer holds (a size_t: layers x batch x
// capacity passes 2^31 at 80 layers, batch 8, 4096 slots).
constexpr std::size_t partial_score_count(std::int32_t layers, std::int32_t batch, std::int32_t capacity) {
  return (layers > 0 && batch > 0 && capacity > 0)
             ? static_cast<std::size_t>(layers) * static_cast<std::size_t>(batch) * static_cast<std::size_t>(capacity)
             : 0;
}

}  // namespace scissorhands
