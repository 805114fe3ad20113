#pragma once
// Internal to the llama example: how make_compressor (compressor.cpp) reaches
// the compressors, whose templates are instantiated in one translation unit
// per granularity family (compressor_head.cpp: per_head and the observation
// of every policy; compressor_heads.cpp: shared_heads; compressor_layers_
// mean.cpp / _max.cpp: shared_layers by head reduction;
// compressor_low_precision.cpp: the few per_head policies a bf16 or
// quantized cache runs), so that a parallel build compiles them side by
// side.
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
  const std::vector<cache_view>& caches;
  observe_source source;
  std::int32_t state_capacity;
};

using fp32_view = sh::host_kv_view<float>;
using bf16_view = sh::host_kv_view<bf16>;
using quantized_view = sh::host_quantized_kv_view;

// A compressor for the per_head policy `Base` at granularity `Gran` over
// caches of type `View` (one of cache_view's alternatives).
template <class Base, class Gran, class View = fp32_view>
std::unique_ptr<kv_compressor> make_at(const compressor_args& args);

// host::observe_* of one layer's attention with the per_head policy `Base`
// (observation does not depend on the granularity: the state is per head
// at every granularity), defined in compressor_head.cpp (fp32) and
// compressor_low_precision.cpp (bf16, int8/int4).
template <class Base, class View = fp32_view>
void observe_layer(const Base& policy, observe_source source, View cache,
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

// The per_head policies a bf16 or int8/int4 cache runs: each costs a
// compressor and an observe instantiation per stored type, so only the
// library's default (scissorhands, scissorhands-paper: the unimportant
// count over a sliding window) and H2O (h2o, h2o-norm) are offered; other
// policies and granularities are refused by make_compressor.
#define LLAMA_LOW_PRECISION_POLICIES(X)                                               \
  X(unimportant_indicator, sliding_window, gqa_mean)                                  \
  X(attention_mass, unbounded_history, gqa_mean)

#define LLAMA_BASE_POLICY(O, H, Q) \
  ::scissorhands::eviction_policy<::scissorhands::O, ::scissorhands::H, ::scissorhands::recent_window, ::scissorhands::Q>

}  // namespace llama::detail
