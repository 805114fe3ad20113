#pragma once
// Host backend internals shared by compress (per_head, shared_heads) and by
// select / compact / forget (shared_layers): the workspace layout, moving a
// token, and choosing a sequence's victims from combined slot scores.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../detail/eviction_key.hpp"
#include "../../error.hpp"
#include "../../eviction_state.hpp"
#include "../../model_state.hpp"
#include "../../partial_scores.hpp"
#include "../../quantized_kv_view.hpp"
#include "../../policy/eviction_policy.hpp"

namespace scissorhands::host::detail {

struct candidate {
  std::uint64_t key;
  std::int32_t slot;
};

// Workspace, per slot a sequence may hold: a candidate, two running
// reductions (shared granularities) and an evicted flag; that once per
// slice a plan may run in (slices 8-byte aligned apart); then, for a paged
// cache, one mark per pool page.
struct eviction_scratch {
  candidate* candidates;
  float* head_acc;
  float* layer_acc;
  unsigned char* evicted;
};
inline constexpr std::size_t scratch_bytes_per_slot = sizeof(candidate) + 2 * sizeof(float) + 1;

// Slots compress or select may see in one sequence: the cache's capacity,
// or the state's when it is smaller (every length is checked against it).
template <class View>
std::int32_t workspace_slots(const View& cache, std::int32_t state_capacity) {
  return std::max(0, std::min(cache.max_capacity(), state_capacity));
}
// One slice's scratch, and the distance between slices' (aligned for the
// next slice's candidates).
inline std::size_t slice_bytes(std::int32_t slots) {
  return static_cast<std::size_t>(slots) * scratch_bytes_per_slot;
}
inline std::size_t slice_stride(std::int32_t slots) {
  return (slice_bytes(slots) + alignof(candidate) - 1) / alignof(candidate) * alignof(candidate);
}
template <class View>
std::size_t workspace_bytes(const View& cache, std::int32_t slots, std::int32_t slices) {
  std::size_t bytes = static_cast<std::size_t>(slices - 1) * slice_stride(slots) + slice_bytes(slots);
  if constexpr (requires { cache.num_pages; })
    bytes += static_cast<std::size_t>(std::max(cache.num_pages, 0));  // one mark per pool page
  return bytes;
}
// Refuses a slice count below 1, or one whose workspace size would not fit
// in a size_t.
template <class View>
void validate_slices(const char* fn, const View& cache, std::int32_t slots, std::int32_t slices) {
  scissorhands::detail::require(slices >= 1, fn, "slices", "must be at least 1, got ", slices);
  const std::size_t one = workspace_bytes(cache, slots, 1);
  const std::size_t most = (SIZE_MAX - one) / std::max<std::size_t>(slice_stride(slots), 1) + 1;
  scissorhands::detail::require(static_cast<std::size_t>(slices) <= most, fn, "slices", "must be at most ", most,
                                " (the workspace size would overflow), got ", slices);
}
// workspace_bytes for `slices` slices of a state of `state_capacity` slots,
// the slice count checked (the public *_workspace_bytes with slices).
template <class View>
std::size_t sliced_workspace_bytes(const char* fn, const View& cache, std::int32_t state_capacity,
                                   std::int32_t slices) {
  const std::int32_t slots = workspace_slots(cache, state_capacity);
  validate_slices(fn, cache, slots, slices);
  return workspace_bytes(cache, slots, slices);
}
inline eviction_scratch scratch_of(std::byte* workspace, std::int32_t slots, std::int32_t part) {
  const auto n = static_cast<std::size_t>(slots);
  std::byte* const at = workspace + static_cast<std::size_t>(part) * slice_stride(slots);
  eviction_scratch s;
  s.candidates = reinterpret_cast<candidate*>(at);
  s.head_acc = reinterpret_cast<float*>(at + n * sizeof(candidate));
  s.layer_acc = s.head_acc + n;
  s.evicted = reinterpret_cast<unsigned char*>(s.layer_acc + n);
  return s;
}
inline unsigned char* page_marks_of(std::byte* workspace, std::int32_t slots, std::int32_t slices) {
  return reinterpret_cast<unsigned char*>(workspace + static_cast<std::size_t>(slices - 1) * slice_stride(slots) +
                                          slice_bytes(slots));
}

// Moves slot `from` of head h to slot `to`: the token's state, and its K and
// V rows when a cache is given (forget moves the state only).
inline void move_state(const eviction_state<memory_space::host>& state, std::int32_t r, std::int32_t h,
                       std::int32_t from, std::int32_t to) {
  const std::int64_t src = state.row_index(r, h, from);
  const std::int64_t dst = state.row_index(r, h, to);
  state.positions[dst] = state.positions[src];
  state.scores[dst] = state.scores[src];
  state.observed[dst] = state.observed[src];
  const history_ring src_ring = state.ring_of(r, h, from);
  const history_ring dst_ring = state.ring_of(r, h, to);
  for (std::int32_t w = 0; w < state.shape.ring_words; ++w) dst_ring[w] = src_ring[w];
}
// A quantized cache moves the token's code rows and parameter rows.
template <class View>
inline void move_token(const View& cache, const eviction_state<memory_space::host>& state, std::int32_t b,
                       std::int32_t h, std::int32_t from, std::int32_t to) {
  const auto row = static_cast<std::size_t>(stored_row_bytes(cache));
  std::memcpy(cache.k_row(b, h, to), cache.k_row(b, h, from), row);
  std::memcpy(cache.v_row(b, h, to), cache.v_row(b, h, from), row);
  if constexpr (is_quantized_view_v<View>) {
    const std::size_t params = sizeof(float) * static_cast<std::size_t>(cache.params_per_row());
    std::memcpy(cache.k_params_row(b, h, to), cache.k_params_row(b, h, from), params);
    std::memcpy(cache.v_params_row(b, h, to), cache.v_params_row(b, h, from), params);
  }
  move_state(state, state.row(b), h, from, to);
}

// Whether token state i of state row r is protected.
template <class Policy>
inline bool is_protected(const Policy& policy, const eviction_state<memory_space::host>& state, std::int32_t r,
                         std::int64_t i) {
  return Policy::protector::is_protected(state.positions[i], state.next_position[r], policy.config);
}

// Puts the `evict` smallest keys of candidates[0, count) first, in linear
// time; keys are unique (positions are). One eviction (m = 1 at the budget)
// is a plain minimum scan, several times cheaper than nth_element.
inline void smallest_first(candidate* candidates, std::int32_t count, std::int32_t evict) {
  const auto by_key = [](const candidate& a, const candidate& c) { return a.key < c.key; };
  if (evict == 1)
    std::iter_swap(candidates, std::min_element(candidates, candidates + count, by_key));
  else
    std::nth_element(candidates, candidates + (evict - 1), candidates + count, by_key);
}

// The moves that close the holes `evicted` flags leave in slots [0, len):
// fill_holes moves the survivors above `kept` into the holes below it, both
// ascending (O(evicted) moves); preserve_order shifts every survivor down.
template <class Move>
inline void for_each_move(const unsigned char* evicted, std::int32_t len, std::int32_t kept, compaction mode,
                          Move&& move) {
  if (mode == compaction::fill_holes) {
    std::int32_t source = kept;
    for (std::int32_t hole = 0; hole < kept; ++hole) {
      if (!evicted[hole]) continue;
      while (evicted[source]) ++source;
      move(source, hole);
      ++source;
    }
  } else {
    std::int32_t to = 0;
    for (std::int32_t from = 0; from < len; ++from) {
      if (evicted[from]) continue;
      if (from != to) move(from, to);
      ++to;
    }
  }
}

// The eviction scores of slots [0, len) of state row r combined over the
// KV heads of layer state `s`, in head order 0..H-1, before the head
// reduction's finish: acc[t] (a tensor-parallel rank's partial scores,
// partial_scores.hpp). Branch-free and through restrict pointers, so the
// compiler vectorises it: x / (observed > 0 ? observed : 1) is
// bit-identical to eviction_score's "divide only when observed > 0" (x / 1
// is x, NaN included).
template <class Policy>
void head_partial(const Policy& policy, const eviction_state<memory_space::host>& s, std::int32_t r,
                  std::int32_t len, float* __restrict acc) {
  using Heads = typename Policy::granularity::head_reduction;
  constexpr bool highest = evicts_highest<typename Policy::observation>;
  const settings& cfg = policy.config;
  std::fill(acc, acc + len, Heads::identity());
  for (std::int32_t h = 0; h < s.shape.kv_heads; ++h) {
    const float* __restrict score = s.scores + s.row_index(r, h, 0);
    const float* __restrict observed = s.observed + s.row_index(r, h, 0);
    if (cfg.pool_width > 1) {
      // Pooling reads each slot's neighbours: the plain per-slot function.
      for (std::int32_t t = 0; t < len; ++t)
        acc[t] = Heads::combine(acc[t], scissorhands::detail::pooled_eviction_score(score, observed, t, len, cfg,
                                                                                    highest));
    } else if (cfg.normalize) {
      for (std::int32_t t = 0; t < len; ++t) {
        // observed > 0 tested on the bits (positive, non-zero, not NaN),
        // an integer select the compiler vectorises without a branch.
        const auto bits = std::bit_cast<std::int32_t>(observed[t]);
        const float divisor = std::bit_cast<float>(bits > 0 && bits <= 0x7F800000 ? bits : 0x3F800000);
        const float v = score[t] / divisor;
        acc[t] = Heads::combine(acc[t], highest ? -v : v);
      }
    } else {
      for (std::int32_t t = 0; t < len; ++t) acc[t] = Heads::combine(acc[t], highest ? -score[t] : score[t]);
    }
  }
}

// The eviction score of slot t of state row r combined over every KV head,
// then (shared_layers) over every layer of `model`, into scratch.layer_acc
// (the value compared, lowest evicted first), in a fixed order: heads
// 0..H-1 inside each layer, then layers 0..L-1.
template <class Policy>
void combine_slot_scores(const Policy& policy, const model_state<memory_space::host>& model, std::int32_t r,
                         std::int32_t len, const eviction_scratch& scratch) {
  using G = typename Policy::granularity;
  using Heads = typename G::head_reduction;
  const std::int32_t heads = model.first.shape.kv_heads;
  float* head_acc = scratch.head_acc;
  float* layer_acc = scratch.layer_acc;
  if constexpr (G::kind == granularity_kind::shared_layers) {
    using Layers = typename G::layer_reduction;
    std::fill(layer_acc, layer_acc + len, Layers::identity());
    for (std::int32_t l = 0; l < model.layers; ++l) {
      head_partial(policy, model.layer(l), r, len, head_acc);
      for (std::int32_t t = 0; t < len; ++t)
        layer_acc[t] = Layers::combine(layer_acc[t], Heads::finish(head_acc[t], heads));
    }
    for (std::int32_t t = 0; t < len; ++t) layer_acc[t] = Layers::finish(layer_acc[t], model.layers);
  } else {
    head_partial(policy, model.first, r, len, head_acc);
    for (std::int32_t t = 0; t < len; ++t) layer_acc[t] = Heads::finish(head_acc[t], heads);
  }
}

// combine_slot_scores from the all-reduced partial scores of sequence b:
// each layer's head reduction finished over all partial.kv_heads heads,
// then the layers reduced, in the same order.
template <class Policy>
void combine_reduced_scores(const partial_scores<memory_space::host>& reduced, std::int32_t b, std::int32_t len,
                            const eviction_scratch& scratch) {
  using G = typename Policy::granularity;
  using Heads = typename G::head_reduction;
  using Layers = typename G::layer_reduction;
  float* __restrict layer_acc = scratch.layer_acc;
  std::fill(layer_acc, layer_acc + len, Layers::identity());
  for (std::int32_t l = 0; l < reduced.layers; ++l) {
    const float* __restrict head_acc = reduced.row(l, b);
    for (std::int32_t t = 0; t < len; ++t)
      layer_acc[t] = Layers::combine(layer_acc[t], Heads::finish(head_acc[t], reduced.kv_heads));
  }
  for (std::int32_t t = 0; t < len; ++t) layer_acc[t] = Layers::finish(layer_acc[t], reduced.layers);
}

// Marks in scratch.evicted[0, len) the `evict` slots of row r with the
// lowest score in scratch.layer_acc among those neither protected
// (positions of layer 0, head 0 of `s`: every head and layer holds the same
// token at a slot) nor below `pinned`; ties to the older token.
template <class Policy>
void choose_lowest(const Policy& policy, const eviction_state<memory_space::host>& s, std::int32_t r,
                   std::int32_t len, std::int32_t evict, std::int32_t pinned, const eviction_scratch& scratch) {
  const std::int64_t base = s.row_index(r, 0, 0);
  std::int32_t count = 0;
  for (std::int32_t t = pinned; t < len; ++t) {
    if (is_protected(policy, s, r, base + t)) continue;
    scratch.candidates[count++] = {
        scissorhands::detail::eviction_key(scratch.layer_acc[t], s.positions[base + t]), t};
  }
  smallest_first(scratch.candidates, count, evict);
  std::memset(scratch.evicted, 0, static_cast<std::size_t>(len));
  for (std::int32_t k = 0; k < evict; ++k) scratch.evicted[scratch.candidates[k].slot] = 1;
}

// The `evict` slots of row r to leave, combined over the heads (and
// layers) of `model`: combine_slot_scores, then choose_lowest.
template <class Policy>
void choose_shared(const Policy& policy, const model_state<memory_space::host>& model, std::int32_t r,
                   std::int32_t len, std::int32_t evict, std::int32_t pinned, const eviction_scratch& scratch) {
  combine_slot_scores(policy, model, r, len, scratch);
  choose_lowest(policy, model.first, r, len, evict, pinned, scratch);
}

}  // namespace scissorhands::host::detail
