#pragma once
// The persistence-of-importance measurement (Scissorhands §3), per layer,
// on a full-cache run. Definition (docs/llama.md states it in full):
//
// For a text of T tokens, step t (0-based) is the step that feeds token t;
// its query sees n_t = t + 1 tokens. Token i is pivotal at step t when its
// attention a(t, i) > alpha / n_t (alpha = 1: above the uniform average)
// and it is at least `min_age` steps old (t - i >= min_age; 0 counts every
// step, as the paper does; r = 10 ignores the steps in which the token is
// still in the recent window that an eviction policy protects anyway).
// The earlier stretch is steps [0, S), the later stretch steps [S, T), with
// S = floor(split * T). Only tokens i < S (those that existed in the
// earlier stretch) are counted. For one head:
//   E = { i < S : pivotal at >= max(1, ceil(q * n_E(i))) steps of the earlier stretch }
//   L = { i < S : pivotal at >= max(1, ceil(q * n_L(i))) steps of the later stretch }
// where n_E(i), n_L(i) count the stretch's steps at which i is old enough
// to count (S - i - min_age and T - max(S, i + min_age), at least 0)
// (q = min_fraction; q = 0 means "at least one step", the paper's union)
// persistence ratio = |E ∩ L| / |L|, pooled over heads and texts (sums of
// |E ∩ L| over sums of |L|). If L were drawn at random among the S tokens,
// the expected ratio would be |E| / S: reported as `chance` beside it.
#include <cstdint>
#include <vector>

#include "compressor.hpp"
#include "evaluate.hpp"
#include "model.hpp"

namespace llama {

struct persistence_options {
  double split = 0.5;         // S = floor(split * T)
  double min_fraction = 0.0;  // q above
  float alpha = 1.0f;         // pivotal: a > alpha / n
  std::int32_t min_age = 0;   // pivotal only at steps t >= i + min_age
  bool per_query_head = false;  // false: per KV head, the group's attention reduced by `gqa` (what the library sees)
  gqa_kind gqa = gqa_kind::mean;
};

struct layer_persistence {
  double ratio = 0.0;          // sum |E ∩ L| / sum |L|
  double chance = 0.0;         // sum |E| / sum S
  double early_size = 0.0;     // mean |E| per head and text
  double late_size = 0.0;      // mean |L|
  double overlap = 0.0;        // mean |E ∩ L|
  double tokens = 0.0;         // mean S
  double step_pivotal = 0.0;   // mean number of pivotal tokens at one step
  double step_fraction = 0.0;  // mean (pivotal tokens at a step) / n_t
};

std::vector<layer_persistence> measure_persistence(const model& m, const std::vector<eval_text>& texts,
                                                   const persistence_options& options);

}  // namespace llama
