#pragma once
// A brute-force model of BRIEF §2, written from the algorithm's definition
// and not from the library's code: per (sequence, KV head) a plain list of
// tokens with their positions and their full observation history (a map
// step -> contribution, not a ring), and eviction by a full sort.
//
// Scores are computed with the same float operations in the same order as
// the definition prescribes (running sums, fmaf for decay and key norms,
// the GQA mean as a sum in head order then one division), so the library's
// scores must match to the bit. Only random_score borrows the library's
// hash (static_score), since that hash is the definition.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <type_traits>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh_test {

namespace sh = scissorhands;

template <class Policy>
class oracle {
 public:
  using observation = typename Policy::observation;
  using history = typename Policy::history;

  struct token {
    std::int32_t position = 0;
    float score = 0.0f;
    float observed = 0.0f;
    std::map<std::int64_t, float> seen;  // step -> contribution, pruned to the window
  };

  oracle(const Policy& policy, std::int32_t batch, std::int32_t kv_heads, std::int32_t group)
      : cfg_(policy.config), batch_(batch), kv_heads_(kv_heads), group_(group),
        tokens_(static_cast<std::size_t>(batch * kv_heads)), step_(static_cast<std::size_t>(batch), 0),
        next_position_(static_cast<std::size_t>(batch), 0) {}

  static constexpr bool needs_attention() {
    return std::is_same_v<observation, sh::attention_mass> || std::is_same_v<observation, sh::important_indicator> ||
           std::is_same_v<observation, sh::unimportant_indicator>;
  }

  std::vector<token>& tokens(std::int32_t b, std::int32_t h) {
    return tokens_[static_cast<std::size_t>(b * kv_heads_ + h)];
  }
  const token* find(std::int32_t b, std::int32_t h, std::int32_t position) const {
    for (const auto& t : tokens_[static_cast<std::size_t>(b * kv_heads_ + h)])
      if (t.position == position) return &t;
    return nullptr;
  }
  std::int32_t length(std::int32_t b) const {
    return static_cast<std::int32_t>(tokens_[static_cast<std::size_t>(b * kv_heads_)].size());
  }
  std::int64_t step(std::int32_t b) const { return step_[static_cast<std::size_t>(b)]; }
  std::int32_t next_position(std::int32_t b) const { return next_position_[static_cast<std::size_t>(b)]; }

  // Admits `count` new tokens of sequence b. key(h, position) returns the
  // token's K row (head_dim floats), read only by key_norm.
  template <class Key>
  void admit(std::int32_t b, std::int32_t count, std::int32_t head_dim, Key key) {
    for (std::int32_t i = 0; i < count; ++i) {
      const std::int32_t position = next_position_[static_cast<std::size_t>(b)] + i;
      for (std::int32_t h = 0; h < kv_heads_; ++h) {
        token t;
        t.position = position;
        t.score = static_score(key(h, position), head_dim, position, h);
        tokens(b, h).push_back(std::move(t));
      }
    }
    next_position_[static_cast<std::size_t>(b)] += count;
  }

  // One observe call for sequence b with q_len queries: query j is the token
  // at position next_position - q_len + j and sees every token up to it.
  // prob(query_head, j, position) is what the engine's attention gave.
  template <class Prob>
  void observe(std::int32_t b, std::int32_t q_len, Prob prob) {
    if constexpr (needs_attention()) {
      for (std::int32_t h = 0; h < kv_heads_; ++h) {
        for (std::int32_t j = 0; j < q_len; ++j) {
          const std::int32_t query_position = next_position(b) - q_len + j;
          std::int32_t visible = 0;
          for (const auto& t : tokens(b, h)) visible += t.position <= query_position;
          const std::int64_t s = step(b) + j;
          for (auto& t : tokens(b, h)) {
            if (t.position > query_position) continue;
            update(t, s, contribution(combined(b, h, j, t.position, prob), visible));
          }
        }
      }
      step_[static_cast<std::size_t>(b)] += q_len;
    }
  }

  // The window sum recomputed from scratch (double), for the exactness check.
  double window_sum(const token& t, std::int64_t current_step) const {
    double sum = 0.0;
    for (const auto& [s, c] : t.seen)
      if (s > current_step - cfg_.window) sum += c;
    return sum;
  }

  bool is_protected(std::int32_t b, std::int32_t position) const {
    return position >= next_position(b) - cfg_.recent || position < cfg_.sinks;
  }

  // The oracle's own reading of the rule: counts of unimportant steps count
  // against a token (highest first), every other score for it (lowest first).
  float eviction_score(const token& t) const {
    const float v = (cfg_.normalize && t.observed > 0.0f) ? t.score / t.observed : t.score;
    return std::is_same_v<observation, sh::unimportant_indicator> ? -v : v;
  }

  // The score compress ranks the token at `position` of (b, h) by: its
  // eviction_score, or with pooling (pool_width > 1) the max or mean of
  // the eviction scores of the held tokens nearest in position, up to h =
  // (pool_width - 1) / 2 on each side (fewer at the ends of the sequence).
  float ranked_score(std::int32_t b, std::int32_t h, std::int32_t position) {
    std::vector<const token*> held;
    for (const auto& t : tokens(b, h)) held.push_back(&t);
    std::sort(held.begin(), held.end(), [](const token* x, const token* y) { return x->position < y->position; });
    std::size_t at = 0;
    while (held[at]->position != position) ++at;
    if (cfg_.pool_width <= 1) return eviction_score(*held[at]);
    const auto half = static_cast<std::size_t>(cfg_.pool_width / 2);
    const std::size_t first = at >= half ? at - half : 0, last = std::min(held.size() - 1, at + half);
    float out = eviction_score(*held[first]);
    for (std::size_t i = first + 1; i <= last; ++i) {
      const float v = eviction_score(*held[i]);
      if (cfg_.pool_mode == sh::pooling::max)
        out = (out != out || v != v) ? NAN : std::max(out, v);
      else
        out += v;
    }
    return cfg_.pool_mode == sh::pooling::max ? out : out / static_cast<float>(last - first + 1);
  }

  // When sequence b holds `budget` tokens or more, evicts len - budget + m
  // unprotected tokens per head by a full sort on (score, position).
  // Returns the evicted positions per head (empty when not triggered).
  std::vector<std::vector<std::int32_t>> compress(std::int32_t b, std::int32_t budget) {
    std::vector<std::vector<std::int32_t>> evicted(static_cast<std::size_t>(kv_heads_));
    const std::int32_t len = length(b);
    if (len < budget) return evicted;
    const std::int32_t count = len - budget + cfg_.evict_count;
    for (std::int32_t h = 0; h < kv_heads_; ++h) {
      auto& list = tokens(b, h);
      std::vector<const token*> order;
      std::map<std::int32_t, float> ranked;  // position -> ranked_score
      for (const auto& t : list)
        if (!is_protected(b, t.position)) {
          order.push_back(&t);
          ranked[t.position] = ranked_score(b, h, t.position);
        }
      std::sort(order.begin(), order.end(), [&](const token* x, const token* y) {
        const float sx = ranked[x->position], sy = ranked[y->position];
        if (sx != sy) return sx < sy;
        return x->position < y->position;
      });
      auto& out = evicted[static_cast<std::size_t>(h)];
      for (std::int32_t k = 0; k < count && k < static_cast<std::int32_t>(order.size()); ++k)
        out.push_back(order[static_cast<std::size_t>(k)]->position);
      std::erase_if(list, [&](const token& t) { return std::find(out.begin(), out.end(), t.position) != out.end(); });
    }
    return evicted;
  }

  // Forgets sequence b (reset_sequence).
  void reset(std::int32_t b, std::int32_t start_position) {
    for (std::int32_t h = 0; h < kv_heads_; ++h) tokens(b, h).clear();
    step_[static_cast<std::size_t>(b)] = 0;
    next_position_[static_cast<std::size_t>(b)] = start_position;
  }

 private:
  float static_score(const float* key, std::int32_t head_dim, std::int32_t position, std::int32_t h) const {
    if constexpr (std::is_same_v<observation, sh::key_norm>) {
      float sum = 0.0f;
      for (std::int32_t d = 0; d < head_dim; ++d) sum = std::fma(key[d], key[d], sum);
      return -std::sqrt(sum);
    } else if constexpr (std::is_same_v<observation, sh::random_score>) {
      return observation::template static_score<float>(key, head_dim, position, h, cfg_);
    } else {
      // recency scores every token alike; attention policies start at 0.
      (void)key, (void)head_dim, (void)position, (void)h;
      return 0.0f;
    }
  }

  template <class Prob>
  float combined(std::int32_t b, std::int32_t h, std::int32_t j, std::int32_t position, Prob& prob) const {
    (void)b;
    if constexpr (std::is_same_v<typename Policy::gqa, sh::gqa_max>) {
      float best = 0.0f;
      for (std::int32_t g = 0; g < group_; ++g) best = std::max(best, prob(h * group_ + g, j, position));
      return best;
    } else {
      float sum = 0.0f;
      for (std::int32_t g = 0; g < group_; ++g) sum += prob(h * group_ + g, j, position);
      return sum / static_cast<float>(group_);
    }
  }

  float contribution(float p, std::int32_t visible) const {
    if constexpr (std::is_same_v<observation, sh::important_indicator>)
      return p >= cfg_.alpha / static_cast<float>(visible) ? 1.0f : 0.0f;
    else if constexpr (std::is_same_v<observation, sh::unimportant_indicator>)
      return p < cfg_.alpha / static_cast<float>(visible) ? 1.0f : 0.0f;
    else
      return p;
  }

  void update(token& t, std::int64_t s, float c) const {
    if constexpr (std::is_same_v<history, sh::unbounded_history>) {
      t.score = t.score + c;
      t.observed = t.observed + 1.0f;
    } else if constexpr (std::is_same_v<history, sh::sliding_window>) {
      // The step leaving the window is s - w; the token may not have been
      // observed then (it was younger), which leaves nothing to subtract.
      const auto old = t.seen.find(s - cfg_.window);
      const float leaving = old == t.seen.end() ? 0.0f : old->second;
      t.score = (t.score - leaving) + c;
      t.observed = std::min(t.observed + 1.0f, static_cast<float>(cfg_.window));
      t.seen[s] = c;
      while (!t.seen.empty() && t.seen.begin()->first <= s - cfg_.window) t.seen.erase(t.seen.begin());
    } else {
      static_assert(std::is_same_v<history, sh::exponential_decay>);
      t.score = std::fma(t.score, cfg_.decay, c);
      t.observed = std::fma(t.observed, cfg_.decay, 1.0f);
    }
  }

  sh::settings cfg_;
  std::int32_t batch_, kv_heads_, group_;
  std::vector<std::vector<token>> tokens_;  // [b * kv_heads + h]
  std::vector<std::int64_t> step_;
  std::vector<std::int32_t> next_position_;
};

}  // namespace sh_test
