#pragma once
// An independent reference of WHICH tokens token-level eviction removes,
// written from the definition (include/scissorhands/policy/granularity.hpp's
// header comment, docs/design.md), never from the library's selection code:
//
//   per (layer l, KV head h, slot t): e(l, h, t) = the eviction score of the
//     token (reference_model.hpp's model_rules::eviction_score: the history's
//     score, divided by the steps observed when normalised, negated for a
//     policy that evicts its highest counts), so lower is evicted first;
//   shared_heads:  s(l, t) = HeadReduction over h = 0..H-1, in that order;
//   shared_layers: s(t)    = LayerReduction over l = 0..L-1 of s(l, t);
//   per_head:      each head on its own, s = e(l, h, t);
//   the `evict` lowest scores among the eligible slots (neither protected by
//   position, recent window or sinks, nor inside the pinned prefix) leave;
//   equal scores: the older token (smaller position) leaves first.
//
// Reductions in fp32, in the order above: mean = ((0 + x0) + x1 + ...) / n,
// max = the largest (NaN anywhere: NaN). Scores come from the model's own
// exact fp32 replay of the probabilities the library was given, so the
// evicted set must match the library's to the bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "reference_model.hpp"

namespace engine_test {

// The reduction a granularity names, computed here from its definition (the
// library's types serve only as tags).
template <class Tag>
struct reference_reduction;

template <>
struct reference_reduction<sh::mean_score> {
  static float over(const std::vector<float>& xs) {
    float sum = 0.0f;
    for (float x : xs) sum = sum + x;
    return sum / static_cast<float>(xs.size());
  }
};

template <>
struct reference_reduction<sh::max_score> {
  static float over(const std::vector<float>& xs) {
    float best = -std::numeric_limits<float>::infinity();
    for (float x : xs) {
      if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
      if (x > best) best = x;
    }
    return best;
  }
};

// One sequence's tokens as the model holds them: heads[l * kv_heads + h] in
// slot order, every list the same length.
using model_heads = std::vector<std::vector<model_token>>;

template <class Policy>
struct token_reference {
  const model_rules<Policy>& rules;
  std::int32_t layers;
  std::int32_t kv_heads;

  const model_token& at(const model_heads& heads, std::int32_t l, std::int32_t h, std::int32_t t) const {
    return heads[static_cast<std::size_t>(l * kv_heads + h)][static_cast<std::size_t>(t)];
  }

  // shared_heads (and the inner step of shared_layers): slot t of layer l.
  template <class HeadReduction>
  float layer_score(const model_heads& heads, std::int32_t l, std::int32_t t) const {
    std::vector<float> per_head;
    for (std::int32_t h = 0; h < kv_heads; ++h) per_head.push_back(rules.eviction_score(at(heads, l, h, t)));
    return reference_reduction<HeadReduction>::over(per_head);
  }

  // shared_layers: slot t over the whole model.
  template <class HeadReduction, class LayerReduction>
  float model_score(const model_heads& heads, std::int32_t t) const {
    std::vector<float> per_layer;
    for (std::int32_t l = 0; l < layers; ++l) per_layer.push_back(layer_score<HeadReduction>(heads, l, t));
    return reference_reduction<LayerReduction>::over(per_layer);
  }

  // The `evict` slots to drop, as flags over [0, len): the lowest scores
  // among slots >= pinned whose position is not protected; ties older first.
  // Returns an empty vector when fewer than `evict` slots are eligible.
  std::vector<char> victims(const std::vector<float>& scores, const std::vector<std::int32_t>& positions,
                            std::int32_t pinned, std::int32_t next_position, std::int32_t evict) const {
    const auto len = static_cast<std::int32_t>(scores.size());
    std::vector<std::int32_t> eligible;
    for (std::int32_t t = std::max(pinned, 0); t < len; ++t)
      if (!rules.is_protected(positions[static_cast<std::size_t>(t)], next_position)) eligible.push_back(t);
    if (static_cast<std::int32_t>(eligible.size()) < evict) return {};
    // NaN is kept last (it never appears here; the order must be total anyway).
    const auto before = [&](std::int32_t x, std::int32_t y) {
      const float a = scores[static_cast<std::size_t>(x)], b = scores[static_cast<std::size_t>(y)];
      const bool an = std::isnan(a), bn = std::isnan(b);
      if (an != bn) return bn;
      if (!an && a != b) return a < b;
      return positions[static_cast<std::size_t>(x)] < positions[static_cast<std::size_t>(y)];
    };
    std::sort(eligible.begin(), eligible.end(), before);
    std::vector<char> gone(static_cast<std::size_t>(len), 0);
    for (std::int32_t k = 0; k < evict; ++k) gone[static_cast<std::size_t>(eligible[static_cast<std::size_t>(k)])] = 1;
    return gone;
  }

  std::vector<std::int32_t> positions_of(const std::vector<model_token>& slots) const {
    std::vector<std::int32_t> p;
    for (const auto& t : slots) p.push_back(t.position);
    return p;
  }

  // One choice for the whole model (shared_layers<HeadReduction, LayerReduction>).
  template <class Granularity>
  std::vector<char> shared_layers_victims(const model_heads& heads, std::int32_t pinned, std::int32_t next_position,
                                          std::int32_t evict) const {
    using Heads = typename Granularity::head_reduction;
    using Layers = typename Granularity::layer_reduction;
    const auto len = static_cast<std::int32_t>(heads[0].size());
    std::vector<float> scores;
    for (std::int32_t t = 0; t < len; ++t) scores.push_back(model_score<Heads, Layers>(heads, t));
    return victims(scores, positions_of(heads[0]), pinned, next_position, evict);
  }

  // One choice for layer l (shared_heads<HeadReduction>).
  template <class Granularity>
  std::vector<char> shared_heads_victims(const model_heads& heads, std::int32_t l, std::int32_t next_position,
                                         std::int32_t evict) const {
    using Heads = typename Granularity::head_reduction;
    const auto& first = heads[static_cast<std::size_t>(l * kv_heads)];
    const auto len = static_cast<std::int32_t>(first.size());
    std::vector<float> scores;
    for (std::int32_t t = 0; t < len; ++t) scores.push_back(layer_score<Heads>(heads, l, t));
    return victims(scores, positions_of(first), 0, next_position, evict);
  }

  // Head (l, h) on its own (per_head).
  std::vector<char> per_head_victims(const model_heads& heads, std::int32_t l, std::int32_t h,
                                     std::int32_t next_position, std::int32_t evict) const {
    const auto& slots = heads[static_cast<std::size_t>(l * kv_heads + h)];
    std::vector<float> scores;
    for (const auto& t : slots) scores.push_back(rules.eviction_score(t));
    return victims(scores, positions_of(slots), 0, next_position, evict);
  }
};

}  // namespace engine_test
