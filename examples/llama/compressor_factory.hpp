#pragma once
// Internal to the llama example: how make_compressor (compressor.cpp) reaches
// the compressors, whose templates are instantiated in one translation unit
// per granularity family (compressor_head.cpp: per_head and the observation
// of every policy; compressor_heads.cpp: shared_heads; compressor_layers_
// mean.cpp / _max.cpp: shared_layers by head reduction), so that a parallel
// build compiles them side by side.
#include <cstdint>
#include <memory>
#include <vector>

#include "compressor.hpp"

namespace llama::detail {

namespace sh = scissorhands;

using heads_mean = sh::shared_heads<sh::mean_score>;
using heads_max = sh::shared_heads<sh::max_score>;
using layers_mean_mean = sh::shared_layers<sh::mean_score, sh::mean_score>;
using layers_mean_max = sh::shared_layers<sh::mean_score, sh::max_score>;
using layers_max_mean = sh::shared_layers<sh::max_score, sh::mean_score>;
using layers_max_max = sh::shared_layers<sh::max_score, sh::max_score>;

struct compressor_args {
  const policy_spec& spec;
  const std::vector<std::int32_t>& budgets;
  const std::vector<sh::host_kv_view<float>>& caches;
  observe_source source;
  std::int32_t state_capacity;
};

// A compressor for the per_head policy `Base` at granularity `Gran`.
template <class Base, class Gran>
std::unique_ptr<kv_compressor> make_at(const compressor_args& args);

// host::observe_* of one layer's attention with the per_head policy `Base`
// (observation does not depend on the granularity: the state is per head
// at every granularity), defined in compressor_head.cpp.
template <class Base>
void observe_layer(const Base& policy, observe_source source, sh::host_kv_view<float> cache,
                   sh::eviction_state<sh::memory_space::host> state, const attention_batch& att);

// Every per_head policy make_compressor builds: X(observation, history, gqa).
// Static observations (key_norm, recency, random) never read attention:
// one history and one reduction.
#define LLAMA_BASE_POLICIES(X)                                                        \
  X(important_indicator, sliding_window, gqa_mean)                                    \
  X(important_indicator, sliding_window, gqa_max)                                     \
  X(important_indicator, unbounded_history, gqa_mean)                                 \
  X(important_indicator, unbounded_history, gqa_max)                                  \
  X(important_indicator, exponential_decay, gqa_mean)                                 \
  X(important_indicator, exponential_decay, gqa_max)                                  \
  X(unimportant_indicator, sliding_window, gqa_mean)                                  \
  X(unimportant_indicator, sliding_window, gqa_max)                                   \
  X(unimportant_indicator, unbounded_history, gqa_mean)                               \
  X(unimportant_indicator, unbounded_history, gqa_max)                                \
  X(unimportant_indicator, exponential_decay, gqa_mean)                               \
  X(unimportant_indicator, exponential_decay, gqa_max)                                \
  X(attention_mass, sliding_window, gqa_mean)                                         \
  X(attention_mass, sliding_window, gqa_max)                                          \
  X(attention_mass, unbounded_history, gqa_mean)                                      \
  X(attention_mass, unbounded_history, gqa_max)                                       \
  X(attention_mass, exponential_decay, gqa_mean)                                      \
  X(attention_mass, exponential_decay, gqa_max)                                       \
  X(key_norm, unbounded_history, gqa_mean)                                            \
  X(recency, unbounded_history, gqa_mean)                                             \
  X(random_score, unbounded_history, gqa_mean)

#define LLAMA_BASE_POLICY(O, H, Q) \
  ::scissorhands::eviction_policy<::scissorhands::O, ::scissorhands::H, ::scissorhands::recent_window, ::scissorhands::Q>

}  // namespace llama::detail
