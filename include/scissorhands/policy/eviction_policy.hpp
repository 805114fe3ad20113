#pragma once
// One policy type composed at compile time from the four per-layer
// policies, carrying the run-time settings.
#include <type_traits>

#include "concepts.hpp"
#include "granularity.hpp"
#include "gqa.hpp"
#include "history.hpp"
#include "observation.hpp"
#include "protector.hpp"
#include "settings.hpp"

namespace scissorhands {

// The settings a composition starts from. The paper's counter over a
// sliding window starts from the numbers this library measured best
// (scissorhands_policy's, below); every other composition from the field
// defaults of `settings` (the paper's w = 400, alpha = 1, raw scores).
template <class Observation, class History>
constexpr settings default_settings_for() {
  settings s;
  if constexpr (std::is_same_v<Observation, unimportant_indicator> && std::is_same_v<History, sliding_window>) {
    s.window = 25;
    s.alpha = 2.0f;
    s.normalize = true;
  }
  return s;
}

// The defaults are the library's measured default: eviction_policy<> is
// scissorhands_policy (type and settings).
template <observation_policy Observation = unimportant_indicator, history_policy History = sliding_window,
          protector_policy Protector = recent_window, gqa_reduction Gqa = gqa_mean,
          granularity_policy Granularity = per_head>
struct eviction_policy {
  using observation = Observation;
  using history = History;
  using protector = Protector;
  using gqa = Gqa;
  using granularity = Granularity;
  settings config = default_settings_for<Observation, History>();

  // 32-bit words of ring history each (sequence, head, slot) keeps.
  constexpr std::int32_t ring_words() const { return History::ring_words(config, Observation::binary); }
};

// The paper's Scissorhands exactly: within the last w = 400 steps, count the
// steps a token was unimportant (a < 1 / n) and evict the highest counts
// first, never the r = 10 newest tokens.
struct scissorhands_paper_policy : eviction_policy<unimportant_indicator, sliding_window> {
  constexpr scissorhands_paper_policy() {
    config.window = 400, config.recent = 10, config.normalize = false, config.alpha = 1.0f;
  }
};
// Scissorhands with the defaults this library measured best (docs/quality.md:
// three TinyStories models, 500- and 256-token texts, 6-50% of the cache,
// decode and prefill protocols): the paper's count of unimportant steps
// over a short window (w = 25), a token unimportant below twice the uniform
// average (alpha = 2), divided by the steps observed, r = 10. The window is
// in steps: on longer contexts than measured, scale it (the paper used 400
// on OPT at 2048).
struct scissorhands_policy : eviction_policy<unimportant_indicator, sliding_window> {
  constexpr scissorhands_policy() {
    config.window = 25, config.recent = 10, config.normalize = true, config.alpha = 2.0f;  // as default_settings_for
  }
};
// The important-step count (a >= alpha / n, lowest count evicted first):
// ranks young tokens as unimportant; alike to the paper's with normalize.
using important_count_policy = eviction_policy<important_indicator, sliding_window>;
// H2O: accumulated attention mass since admission.
using h2o_policy = eviction_policy<attention_mass, unbounded_history>;
// TOVA: the attention of the current step only (a one-step window).
struct tova_policy : eviction_policy<attention_mass, sliding_window> {
  constexpr tova_policy() { config.window = 1; }
};
// SnapKV: the attention mass the prompt's last queries (its observation
// window: the engine observes only those) gave each token, pooled over 5
// neighbouring tokens (mean, as SnapKV's reference code), keeping insertion
// order so that slots are neighbours in position; r = 32 keeps the
// observation window itself (set it to the window the engine observes).
struct snapkv_policy : eviction_policy<attention_mass, unbounded_history> {
  constexpr snapkv_policy() {
    config.recent = 32, config.pool_width = 5, config.pool_mode = pooling::mean;
    config.compaction_mode = compaction::preserve_order;
  }
};
// StreamingLLM: sinks + most recent tokens (set settings.sinks).
using streaming_policy = eviction_policy<recency, unbounded_history>;
// The floor: evict uniformly at random (seeded, deterministic).
using random_policy = eviction_policy<random_score, unbounded_history>;
// Static key-norm scoring.
using key_norm_policy = eviction_policy<key_norm, unbounded_history>;

template <class P>
concept composed_policy = requires(const P& p) {
  typename P::observation;
  typename P::history;
  typename P::protector;
  typename P::gqa;
  typename P::granularity;
  { p.config } -> std::convertible_to<settings>;
} && observation_policy<typename P::observation> && history_policy<typename P::history> &&
                          protector_policy<typename P::protector> && gqa_reduction<typename P::gqa> &&
                          granularity_policy<typename P::granularity>;

// Any policy (a preset included, with its settings) at another granularity:
// with_granularity<scissorhands_policy, shared_layers<>> keeps
// scissorhands_policy's settings and evicts whole tokens across the model.
template <class Policy, granularity_policy Granularity>
struct with_granularity : Policy {
  using granularity = Granularity;
};

// The policy's granularity, for `if constexpr`.
template <class Policy>
inline constexpr granularity_kind granularity_of = Policy::granularity::kind;

}  // namespace scissorhands
