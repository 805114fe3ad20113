#pragma once
// The library's presets at the token level (shared_layers: one choice of
// cells per sequence for every layer and head, as llama.cpp's cells need),
// seen from C++17 through the bridge. presets.cpp, the one C++20
// translation unit, defines them; everything else includes only this header.
// Each preset observes either llama.cpp's probabilities (flash attention
// off) or its queries against the K cells (flash attention on).
#include <scissorhands/bridge/bridge.h>

SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::scissorhands_default);  // scissorhands_policy (the library's default)
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::scissorhands_paper);    // the paper: w = 400, r = 10, raw counts
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::h2o);
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::tova);
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::streaming);
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::random);
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::snapkv);  // pooled attention mass; prefill: the prompt's last 32 queries
// The default with the layers' maximum score instead of their mean (the
// library's default reduction until Gemma 3 270M was measured).
SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(sh_llama::scissorhands_max_layers);

namespace sh_llama {

namespace bridge = ::scissorhands::bridge;

// One preset's entry points, so that the run-time choice of a policy is a
// table lookup (each preset is a compile-time policy type on the C++20 side).
struct preset {
  const char* name;
  bridge::error (*default_settings)(bridge::settings*) noexcept;
  bridge::error (*make_state_shape)(const bridge::settings&, std::int32_t, std::int32_t, std::int32_t,
                                    bridge::state_shape*) noexcept;
  bridge::error (*model_state_bytes)(const bridge::state_shape&, std::int32_t, std::size_t*) noexcept;
  bridge::error (*make_model_state)(void*, std::size_t, const bridge::state_shape&, std::int32_t,
                                    bridge::model_state*) noexcept;
  bridge::error (*reset_state)(const bridge::model_state&) noexcept;
  bridge::error (*reset_sequence)(const bridge::model_state&, std::int32_t, std::int32_t) noexcept;
  bridge::error (*observe_probabilities)(const bridge::settings&, const bridge::token_table&, const bridge::state&,
                                         const bridge::probabilities&) noexcept;
  // Flash attention: the scores recomputed from the queries and the K cells
  // (F32 or F16 cache).
  bridge::error (*observe_queries_f32)(const bridge::settings&, const bridge::paged_cache<float>&,
                                       const bridge::state&, const bridge::queries<float>&, const bridge::lse&,
                                       const bridge::attention&) noexcept;
  bridge::error (*observe_queries_f16)(const bridge::settings&, const bridge::paged_cache<bridge::fp16_bits>&,
                                       const bridge::state&, const bridge::queries<float>&, const bridge::lse&,
                                       const bridge::attention&) noexcept;
  bridge::error (*local_scores)(const bridge::settings&, const bridge::token_table&, const bridge::model_state&,
                                std::int32_t, const bridge::partial_scores&) noexcept;
  std::size_t (*select_workspace_bytes)(const bridge::token_table&, const bridge::state_shape&) noexcept;
  bridge::error (*select)(const bridge::settings&, const bridge::token_table&, const bridge::model_state&,
                          std::int32_t, void*, std::size_t, const bridge::selection&, const std::int32_t*) noexcept;
  bridge::error (*forget)(const bridge::settings&, const bridge::token_table&, const bridge::state&,
                          const bridge::selection&) noexcept;
};

// The presets by name: "scissorhands", "scissorhands-paper", "h2o", "tova",
// "streaming", "random", "snapkv", "scissorhands-max-layers"; null for
// another name.
const preset* find_preset(const char* name) noexcept;
// "scissorhands, scissorhands-paper, ..." for messages.
const char* preset_names() noexcept;

}  // namespace sh_llama
