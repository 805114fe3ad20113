#pragma once
// Concepts that every policy is checked against, so a wrong policy fails at
// the point of use with the name of the requirement it misses.
#include <concepts>
#include <cstdint>
#include <vector>

#include "../history_ring.hpp"
#include "granularity.hpp"
#include "settings.hpp"

namespace scissorhands {

template <class P>
concept named_policy = requires {
  { P::name } -> std::convertible_to<const char*>;
};

// Attention-driven observation: turns one probability into a contribution.
template <class P>
concept attention_observation = named_policy<P> && P::needs_attention && requires(float p, std::int32_t n,
                                                                                  const settings& s) {
  { P::binary } -> std::convertible_to<bool>;
  { P::contribution(p, n, s) } -> std::same_as<float>;
};

// Static observation: scores a token once from its key, position and head.
template <class P>
concept static_observation = named_policy<P> && (!P::needs_attention) && requires(const float* key, std::int32_t d,
                                                                                   const settings& s) {
  { P::binary } -> std::convertible_to<bool>;
  { P::static_score(key, d, d, d, s) } -> std::same_as<float>;
};

template <class P>
concept observation_policy = attention_observation<P> || static_observation<P>;

template <class P>
concept history_policy = named_policy<P> && requires(float& score, float& observed, history_ring ring,
                                                     std::int64_t step, float c, const settings& s, bool binary) {
  { P::ring_words(s, binary) } -> std::same_as<std::int32_t>;
  { P::update(score, observed, ring, step, c, s, binary) } -> std::same_as<void>;
};

template <class P>
concept protector_policy = named_policy<P> && requires(std::int32_t position, const settings& s) {
  { P::is_protected(position, position, s) } -> std::same_as<bool>;
  { P::protected_count(s) } -> std::same_as<std::int64_t>;
};

template <class P>
concept gqa_reduction = named_policy<P> && requires(float acc, std::int32_t group) {
  { P::identity() } -> std::same_as<float>;
  { P::combine(acc, acc) } -> std::same_as<float>;
  { P::finish(acc, group) } -> std::same_as<float>;
};

// Combines eviction scores over the heads (or layers) that share a slot.
template <class P>
concept score_reduction = named_policy<P> && requires(float acc, std::int32_t count) {
  { P::identity() } -> std::same_as<float>;
  { P::combine(acc, acc) } -> std::same_as<float>;
  { P::finish(acc, count) } -> std::same_as<float>;
};

// A head reduction tensor-parallel ranks can split (partial_scores.hpp):
// reductions over disjoint sets of heads combine with one all-reduce
// operation, the same as `combine` (sum for a sum, max for a max).
template <class P>
concept splittable_reduction = score_reduction<P> && requires {
  { P::all_reduce } -> std::convertible_to<all_reduce_op>;
};

// Which tokens leave together: per_head, shared_heads<R>, shared_layers<R, R>
// (granularity.hpp).
template <class G>
concept granularity_policy = named_policy<G> && requires {
  { G::kind } -> std::convertible_to<granularity_kind>;
} && (G::kind == granularity_kind::per_head || score_reduction<typename G::head_reduction>) &&
                             (G::kind != granularity_kind::shared_layers ||
                              score_reduction<typename G::layer_reduction>);

// Splits a total token budget across layers (setup time, may allocate).
template <class A>
concept budget_allocator = requires(const A& a, std::int64_t total, std::int32_t layers) {
  { a.allocate(total, layers) } -> std::same_as<std::vector<std::int32_t>>;
};

}  // namespace scissorhands
