#pragma once
// An independent model of what the library keeps, written from the
// algorithm's definition (docs/design.md, "The algorithm"), never from the
// library's code: per (request, layer, KV head) the tokens in slot order,
// each with its observation history, and eviction by a full sort.
//
// Two ways of scoring run side by side:
//  - exact: fp32 in the order the definition prescribes (GQA mean = sum in
//    head order then one division; window sum = (sum - oldest) + newest),
//    from the very probabilities the library was given. Used when the
//    library is fed probabilities (or the policy is static): scores, and so
//    the evicted set, must match to the bit.
//  - bounds: [lo, hi] in double, from the test's own double-precision
//    attention. Used when the library recomputes the probabilities from the
//    queries itself: its fp32 scores differ in the last bits, so the check
//    is that no evicted token scored clearly above a kept one (and, where
//    both scores are exactly known and equal, that the older one went first).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "engine_support.hpp"

namespace engine_test {

namespace sh = scissorhands;

struct contribution {
  float exact = 0.0f;
  double lo = 0.0, hi = 0.0;
};

struct model_token {
  std::int32_t position = 0;
  float score = 0.0f;                         // exact path
  float observed = 0.0f;                      // steps observed (capped at w for a sliding window); exact in both paths
  double lo = 0.0, hi = 0.0;                  // unbounded history: bounds of the running sum
  std::map<std::int64_t, contribution> seen;  // sliding window: the window's steps only
};

template <class Policy>
struct model_rules {
  using observation = typename Policy::observation;
  using history = typename Policy::history;
  // unimportant_indicator counts the steps below the threshold and evicts
  // the highest counts first (the paper's Compress).
  static constexpr bool unimportant = std::is_same_v<observation, sh::unimportant_indicator>;
  static constexpr bool attention = std::is_same_v<observation, sh::attention_mass> ||
                                    std::is_same_v<observation, sh::important_indicator> || unimportant;
  static constexpr bool indicator = std::is_same_v<observation, sh::important_indicator> || unimportant;
  static constexpr bool window = std::is_same_v<history, sh::sliding_window>;
  static constexpr bool gqa_max = std::is_same_v<typename Policy::gqa, sh::gqa_max>;
  static_assert(std::is_same_v<observation, sh::attention_mass> || indicator ||
                    std::is_same_v<observation, sh::recency>,
                "the model knows attention_mass, important_indicator, unimportant_indicator and recency");
  static_assert(window || std::is_same_v<history, sh::unbounded_history>,
                "the model knows sliding_window and unbounded_history");

  sh::settings cfg;

  // The GQA group's probabilities of one key at one query, combined: exact
  // from the fp32 values handed to the library, bounds from doubles.
  contribution combine(const float* p_exact, const double* p_double, std::int32_t group, std::int32_t visible) const {
    float acc = 0.0f;
    double accd = 0.0;
    for (std::int32_t g = 0; g < group; ++g) {
      if constexpr (gqa_max) {
        acc = std::max(acc, p_exact[g]);
        accd = std::max(accd, p_double[g]);
      } else {
        acc = acc + p_exact[g];
        accd += p_double[g];
      }
    }
    if constexpr (!gqa_max) {
      acc = acc / static_cast<float>(group);
      accd /= group;
    }
    contribution c;
    if constexpr (indicator) {
      const bool reached = acc >= cfg.alpha / static_cast<float>(visible);
      c.exact = (reached != unimportant) ? 1.0f : 0.0f;
      const double threshold = static_cast<double>(cfg.alpha) / visible;
      if (std::abs(accd - threshold) <= 1e-4 * threshold) {
        c.lo = 0.0;  // too close to call from outside the library's fp32 maths
        c.hi = 1.0;
      } else {
        c.lo = c.hi = ((accd >= threshold) != unimportant) ? 1.0 : 0.0;
      }
    } else {
      c.exact = acc;
      c.lo = c.hi = accd;
    }
    return c;
  }

  void update(model_token& t, std::int64_t step, const contribution& c) const {
    if constexpr (window) {
      const auto leaving = t.seen.find(step - cfg.window);
      const float oldest = leaving == t.seen.end() ? 0.0f : leaving->second.exact;
      t.score = (t.score - oldest) + c.exact;
      t.observed = std::min(t.observed + 1.0f, static_cast<float>(cfg.window));
      t.seen[step] = c;
      while (!t.seen.empty() && t.seen.begin()->first <= step - cfg.window) t.seen.erase(t.seen.begin());
    } else {
      t.score = t.score + c.exact;
      t.observed = t.observed + 1.0f;
      t.lo += c.lo;
      t.hi += c.hi;
    }
  }

  // The probabilities a step's queries were given, [token][q_head][columns]:
  // fp32 as the library got them, and the test's doubles where it has them.
  struct step_probs {
    std::int32_t kv_heads, group, columns;  // group: query heads per KV head
    const float* probs;
    const double* probs_d = nullptr;  // nullptr: the fp32 values
  };
  // Request q's step on layer l, replayed: its n_new tokens (from position
  // q.base) join every head of the layer (q.heads[l * kv_heads + h]), then
  // each of its q_len queries (probability rows first_token..) adds, to every
  // slot it sees, the probabilities of its GQA group combined. `length`: the
  // layer's slots after the new tokens.
  template <class Request>
  void replay(Request& q, std::int32_t l, std::int32_t length, std::int32_t first_token, const step_probs& p) const {
    auto& heads = q.heads;
    for (std::int32_t h = 0; h < p.kv_heads; ++h)
      for (std::int32_t i = 0; i < q.n_new; ++i) {
        model_token t;
        t.position = q.base + i;
        heads[static_cast<std::size_t>(l * p.kv_heads + h)].push_back(std::move(t));
      }
    if (!attention) return;
    std::vector<float> pe(static_cast<std::size_t>(p.group));
    std::vector<double> pd(static_cast<std::size_t>(p.group));
    for (std::int32_t h = 0; h < p.kv_heads; ++h) {
      auto& slots = heads[static_cast<std::size_t>(l * p.kv_heads + h)];
      for (std::int32_t j = 0; j < q.q_len; ++j) {
        // Where query j's rows of the group start; query head g's is g rows on.
        const std::int64_t first = (std::int64_t{first_token + j} * p.kv_heads * p.group + h * p.group) * p.columns;
        const std::int32_t visible = length - q.q_len + j + 1;
        for (std::int32_t s = 0; s < visible; ++s) {
          for (std::int32_t g = 0; g < p.group; ++g) {
            const auto at = static_cast<std::size_t>(first + std::int64_t{g} * p.columns + s);
            pe[static_cast<std::size_t>(g)] = p.probs[at];
            pd[static_cast<std::size_t>(g)] = p.probs_d != nullptr ? p.probs_d[at] : p.probs[at];
          }
          update(slots[static_cast<std::size_t>(s)], q.step + j, combine(pe.data(), pd.data(), p.group, visible));
        }
      }
    }
  }

  // Bounds of the token's score in exact arithmetic.
  std::pair<double, double> bounds(const model_token& t) const {
    if constexpr (window) {
      double lo = 0.0, hi = 0.0;
      for (const auto& [step, c] : t.seen) {
        lo += c.lo;
        hi += c.hi;
      }
      return {lo, hi};
    } else {
      return {t.lo, t.hi};
    }
  }

  // Lowest first: a count of unimportant steps counts against the token.
  float eviction_score(const model_token& t) const {
    const float v = (cfg.normalize && t.observed > 0.0f) ? t.score / t.observed : t.score;
    return unimportant ? -v : v;
  }
  std::pair<double, double> eviction_bounds(const model_token& t) const {
    auto [lo, hi] = bounds(t);
    if (cfg.normalize && t.observed > 0.0f) {
      lo /= t.observed;
      hi /= t.observed;
    }
    if (unimportant) return {-hi, -lo};
    return {lo, hi};
  }
  // How far the library's fp32 score of a real-valued observation may be
  // from the double one (indicator counts are exact integers).
  double tolerance(double magnitude) const { return indicator ? 0.0 : 2e-4 * (1.0 + std::abs(magnitude)); }

  bool is_protected(std::int32_t position, std::int32_t next_position) const {
    return position >= next_position - cfg.recent || position < cfg.sinks;
  }
};

// The slot order after the victims leave: `stable` keeps the survivors in
// order (compaction::preserve_order, and forget always); otherwise
// fill_holes: the holes below the kept length take the survivors above it,
// both in ascending slot order.
template <class T>
std::vector<T> after_eviction(std::vector<T> slots, const std::vector<char>& gone, bool stable) {
  const auto len = static_cast<std::int32_t>(slots.size());
  std::int32_t evicted = 0;
  for (char g : gone) evicted += g != 0;
  const std::int32_t kept = len - evicted;
  std::vector<T> out;
  if (stable) {
    for (std::int32_t s = 0; s < len; ++s)
      if (!gone[static_cast<std::size_t>(s)]) out.push_back(std::move(slots[static_cast<std::size_t>(s)]));
    return out;
  }
  std::vector<std::int32_t> sources;
  for (std::int32_t s = kept; s < len; ++s)
    if (!gone[static_cast<std::size_t>(s)]) sources.push_back(s);
  std::size_t next = 0;
  for (std::int32_t s = 0; s < kept; ++s) {
    const std::int32_t from = gone[static_cast<std::size_t>(s)] ? sources[next++] : s;
    out.push_back(std::move(slots[static_cast<std::size_t>(from)]));
  }
  return out;
}

// The positions of the flagged slots, for messages: "{ 3 7 12 }".
inline std::string positions_text(const std::vector<model_token>& slots, const std::vector<char>& flags) {
  std::string o = "{";
  for (std::size_t t = 0; t < flags.size() && t < slots.size(); ++t)
    if (flags[t]) o += " " + std::to_string(slots[t].position);
  return o + " }";
}

// Slot t of one head (the model's `slots`) against the library's state at
// flat index i: no position twice (`seen` collects them), ascending
// positions when `ordered`, and the state's position, observed steps and
// score (to the bit when `exact`, else within the model's bounds).
template <class Policy>
void check_slot(const model_rules<Policy>& rules, const sh::eviction_state<sh::memory_space::host>& st, std::int64_t i,
                const std::vector<model_token>& slots, std::int32_t t, bool ordered, bool exact,
                std::set<std::int32_t>& seen, const std::string& where, std::vector<std::string>& errors) {
  const model_token& tok = slots[static_cast<std::size_t>(t)];
  if (!seen.insert(tok.position).second) errors.push_back(where + "a position is held twice");
  if (ordered && t > 0 && slots[static_cast<std::size_t>(t) - 1].position >= tok.position)
    errors.push_back(where + "slots out of position order");
  if (st.positions[i] != tok.position)
    errors.push_back(where + "state.positions at slot " + std::to_string(t) + " is " + std::to_string(st.positions[i]) +
                     ", the cache holds " + std::to_string(tok.position));
  if (std::memcmp(&st.observed[i], &tok.observed, sizeof(float)) != 0)
    errors.push_back(where + "state.observed differs from the model");
  if (exact) {
    if (std::memcmp(&st.scores[i], &tok.score, sizeof(float)) != 0)
      errors.push_back(where + "state.scores " + std::to_string(st.scores[i]) + " differs from the model's " +
                       std::to_string(tok.score) + " at position " + std::to_string(tok.position));
    return;
  }
  const auto [lo, hi] = rules.bounds(tok);
  const double tol = rules.tolerance(hi);
  if (st.scores[i] < lo - tol || st.scores[i] > hi + tol)
    errors.push_back(where + "state.scores " + std::to_string(st.scores[i]) + " outside [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
}

// What a request's row of one layer must hold.
struct layer_expect {
  std::int32_t layer, request, row;  // request: its id, for messages; row: its state row
  std::int32_t length;               // the model's slots per head
  std::int32_t kv_heads, head_dim, capacity;
  std::int32_t start, next_position;  // the request's first position, where it continues
  std::int64_t step;
  bool ordered, exact;  // slots in position order; scores to the bit
};

// One layer's state row of a request against the model: tracked = length,
// the next position, the step, a zero status word; per KV head h the model's
// slots (heads[layer * kv_heads + h]): each slot's K/V rows (row(kind, h, t))
// what its token was written with (content(position): the token's V[1] id),
// check_slot's checks, every protected token still there; then more(h,
// slots, seen, where), the caller's own checks of the head.
template <class Policy, class Row, class Content, class More>
void check_layer(const model_rules<Policy>& rules, const sh::eviction_state<sh::memory_space::host>& st,
                 const std::vector<std::vector<model_token>>& heads, const layer_expect& e, Row row, Content content,
                 More more, std::vector<std::string>& errors) {
  const std::string where = "layer " + std::to_string(e.layer) + ", request " + std::to_string(e.request) + " (row " +
                            std::to_string(e.row) + "): ";
  const auto r = static_cast<std::size_t>(e.row);
  if (st.tracked[r] != e.length)
    errors.push_back(where + "state tracks " + std::to_string(st.tracked[r]) + " of " + std::to_string(e.length));
  if (st.next_position[r] != e.next_position) errors.push_back(where + "next_position differs");
  if (st.step[r] != e.step) errors.push_back(where + "step differs");
  if (st.status[r] != 0) errors.push_back(where + "status word not zero");
  for (std::int32_t h = 0; h < e.kv_heads; ++h) {
    const auto& slots = heads[static_cast<std::size_t>(e.layer * e.kv_heads + h)];
    if (static_cast<std::int32_t>(slots.size()) != e.length) {
      errors.push_back(where + "the model holds another number of tokens");
      continue;
    }
    std::set<std::int32_t> seen;
    for (std::int32_t t = 0; t < e.length; ++t) {
      const std::int32_t position = slots[static_cast<std::size_t>(t)].position;
      check_kv_rows(
          row(0, h, t), row(1, h, t), e.head_dim, position,
          [&](int kind, std::int32_t x) { return token_value(kind, content(position), e.layer, h, position, x); },
          where + "head " + std::to_string(h) + " slot " + std::to_string(t) + ": ", errors);
      check_slot(rules, st, (std::int64_t{e.row} * e.kv_heads + h) * e.capacity + t, slots, t, e.ordered, e.exact, seen,
                 where, errors);
    }
    check_protected(seen, e.start, e.next_position, rules.cfg, where, errors);
    more(h, slots, seen, where);
  }
}

}  // namespace engine_test
