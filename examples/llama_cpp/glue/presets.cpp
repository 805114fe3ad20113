// The one C++20 translation unit of the llama.cpp integration: it
// instantiates the library for each preset at the token level
// (shared_layers) and fills presets.h's table. Compiled with exceptions;
// the bridge turns every refusal into a bridge::error.
#include "presets.h"

#include <scissorhands/bridge/bridge_impl.hpp>
#include <cstring>

namespace sh = ::scissorhands;

SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::scissorhands_default,
                                       sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::scissorhands_paper,
                                       sh::with_granularity<sh::scissorhands_paper_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::h2o, sh::with_granularity<sh::h2o_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::tova, sh::with_granularity<sh::tova_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::streaming,
                                       sh::with_granularity<sh::streaming_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::random, sh::with_granularity<sh::random_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(sh_llama::snapkv, sh::with_granularity<sh::snapkv_policy, sh::shared_layers<>>);
SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(
    sh_llama::scissorhands_max_layers,
    sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<sh::mean_score, sh::max_score>>);

namespace sh_llama {
namespace {

// observe_queries is overloaded on the K element type: each pointer picks one.
#define SH_LLAMA_PRESET(label, ns)                                                                             \
  preset {                                                                                                     \
    label, &ns::default_settings, &ns::make_state_shape, &ns::model_state_bytes, &ns::make_model_state,         \
        &ns::reset_state, &ns::reset_sequence, &ns::observe_probabilities, &ns::observe_queries, &ns::observe_queries,               \
        &ns::local_scores, &ns::select_workspace_bytes, &ns::select, &ns::forget                                \
  }

const preset presets[] = {
    SH_LLAMA_PRESET("scissorhands", scissorhands_default), SH_LLAMA_PRESET("scissorhands-paper", scissorhands_paper),
    SH_LLAMA_PRESET("h2o", h2o),                           SH_LLAMA_PRESET("tova", tova),
    SH_LLAMA_PRESET("streaming", streaming),               SH_LLAMA_PRESET("random", random),
    SH_LLAMA_PRESET("snapkv", snapkv),                     SH_LLAMA_PRESET("scissorhands-max-layers", scissorhands_max_layers),
};
#undef SH_LLAMA_PRESET

}  // namespace

const preset* find_preset(const char* name) noexcept {
  for (const preset& p : presets)
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}

const char* preset_names() noexcept {
  return "scissorhands, scissorhands-paper, h2o, tova, streaming, random, snapkv, scissorhands-max-layers";
}

}  // namespace sh_llama
