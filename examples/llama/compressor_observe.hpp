#pragma once
// Internal to the llama example: the definition of observe_layer
// (compressor_factory.hpp), included only by the translation units that
// instantiate it (compressor_head.cpp for fp32, compressor_low_precision.cpp
// for bf16 and int8/int4), so that no other compiles it again.
#include "compressor_impl.hpp"

namespace llama::detail {

// One layer's attention handed to host::observe_* (the same at every
// granularity: the state is per head whichever slots later leave together).
template <class Base, class View>
void observe_layer(const Base& policy, observe_source source, View cache,
                   sh::eviction_state<sh::memory_space::host> state, const attention_batch& att) {
  switch (source) {
    case observe_source::probabilities: {
      // A strided view over the engine's [q_heads][queries][slots] buffer:
      // the library reads the q_len rows it is given, each up to its
      // causal limit.
      sh::probability_view<sh::memory_space::host> view{};
      view.data = sh::host_span<const float>(att.probs, att.probs_size);
      view.q_heads = att.q_heads;
      view.q_len = att.q_len;
      view.sequence_stride = 0;  // one sequence
      view.head_stride = att.probs_head_stride;
      view.query_stride = att.probs_query_stride;
      sh::host::observe_probabilities(policy, cache, state, view);
      break;
    }
    case observe_source::queries:
    case observe_source::queries_lse: {
      const std::size_t rows = static_cast<std::size_t>(att.q_len) * static_cast<std::size_t>(att.q_heads);
      const auto q = sh::query_view<float, sh::memory_space::host>::dense(
          sh::host_span<const float>(att.queries, rows * static_cast<std::size_t>(cache.head_dim)), att.q_heads,
          att.q_len, cache.head_dim);
      sh::lse_view<sh::memory_space::host> lv{};
      if (source == observe_source::queries_lse)
        lv = sh::lse_view<sh::memory_space::host>::token_major(sh::host_span<const float>(att.lse, rows),
                                                                att.q_heads, att.q_len, sh::lse_base::natural);
      sh::host::observe_queries(policy, cache, state, q, lv);
      break;
    }
  }
}

}  // namespace llama::detail
