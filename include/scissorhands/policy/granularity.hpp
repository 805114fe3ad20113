#pragma once
// Eviction granularity: which tokens must leave together.
//
//   per_head       every (sequence, KV head) evicts on its own (the default):
//                  the cheapest in quality, and fine wherever every slot of
//                  every head may hold a different token (FlashInfer-style
//                  per-layer tables, RoPE applied before caching).
//   shared_heads   one choice per (sequence, layer): a slot is one token for
//                  all KV heads of the layer, and all heads' rows move
//                  together (compress, as per_head).
//   shared_layers  one choice per sequence for the whole model: a slot is one
//                  token for every head of every layer (vLLM's one block
//                  table, SGLang's token pool, llama.cpp's cells). Observe
//                  each layer into its layer of a model_state, then one
//                  select per step names the evicted slots and moves
//                  nothing; compact (per layer) or forget apply it.
//
// A shared slot's score combines the heads' (and layers') eviction scores
// (eviction_score: normalised when settings.normalize, negated for a policy
// that evicts its highest counts), so "lower is evicted first" holds at
// every granularity. The reduction runs in a fixed order (heads 0..H-1,
// then layers 0..L-1) on both backends, so they agree to the bit. The
// protector, the budget, m and the tie-break (older token first) mean what
// they mean per head, applied to the sequence's slots.
#include <cstdint>

#include "../config.hpp"

namespace scissorhands {

// The collective that combines tensor-parallel ranks' partial head
// reductions (partial_scores.hpp): the engine's all-reduce operation.
enum class all_reduce_op { sum, max };

// Score reductions (over heads or over layers) of eviction scores.
// `all_reduce`: how partial reductions over disjoint sets of heads combine
// (combine's own operation, before finish).
struct mean_score {
  static constexpr const char* name = "mean";
  static constexpr all_reduce_op all_reduce = all_reduce_op::sum;
  SCISSORHANDS_HOST_DEVICE static constexpr float identity() { return 0.0f; }
  SCISSORHANDS_HOST_DEVICE static float combine(float acc, float x) { return acc + x; }
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t count) {
    return acc / static_cast<float>(count);
  }
};

// A slot is kept when any head (layer) values it: the largest eviction
// score. A NaN anywhere makes the result NaN (kept last), whatever the
// order, so the choice never depends on where the NaN was.
struct max_score {
  static constexpr const char* name = "max";
  static constexpr all_reduce_op all_reduce = all_reduce_op::max;
  SCISSORHANDS_HOST_DEVICE static constexpr float identity() { return -__builtin_huge_valf(); }
  SCISSORHANDS_HOST_DEVICE static float combine(float acc, float x) {
    if (acc != acc || x != x) return __builtin_nanf("");
    return x > acc ? x : acc;
  }
  SCISSORHANDS_HOST_DEVICE static float finish(float acc, std::int32_t) { return acc; }
};

enum class granularity_kind { per_head, shared_heads, shared_layers };

struct per_head {
  static constexpr const char* name = "per_head";
  static constexpr granularity_kind kind = granularity_kind::per_head;
};

template <class HeadReduction = mean_score>
struct shared_heads {
  static constexpr const char* name = "shared_heads";
  static constexpr granularity_kind kind = granularity_kind::shared_heads;
  using head_reduction = HeadReduction;
};

// Defaults by measurement. Heads: the mean (docs/granularity.md: mean and
// max tie on the three tiny models). Layers: the mean, from Gemma 3 270M
// inside llama.cpp (docs/quality.md: 16 texts, both protocols): the only
// reduction within 0.5 points of the best configuration at every budget
// (the max is 0.8 points behind under prefill at 6.25%; summed over the 7
// cells the mean is 0.9 points better). On the three tiny models the max
// was 0.15 points a cell better: shared_layers<mean_score, max_score> keeps
// that choice.
template <class HeadReduction = mean_score, class LayerReduction = mean_score>
struct shared_layers {
  static constexpr const char* name = "shared_layers";
  static constexpr granularity_kind kind = granularity_kind::shared_layers;
  using head_reduction = HeadReduction;
  using layer_reduction = LayerReduction;
};

}  // namespace scissorhands
