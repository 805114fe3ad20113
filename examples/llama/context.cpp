#include "context.hpp"

#include <filesystem>
#include <stdexcept>

namespace llama {

const std::vector<known_model>& known_models() {
  static const std::vector<known_model> table = {
      {"stories260K", 64, 5, 8, 4, 172, 512, 2048, 512,
       "karpathy/tinyllamas stories260K, trained with max_seq_len 512; its GGUF's context_length 2048 is the "
       "llama2.c converter's default"},
      {"tinystories656k", 128, 2, 8, 4, 384, 2048, 512, 512,
       "raincandy-u/TinyStories-656K; the GGUF gives its trained context"},
      {"babyllama105", 128, 5, 8, 4, 352, 105, 256, 256, "EN10/BabyLlama (characters); the GGUF gives its trained context"},
  };
  return table;
}

const known_model* find_known_model(const model_config& c) {
  for (const auto& k : known_models())
    if (k.dim == c.dim && k.layers == c.layers && k.q_heads == c.q_heads && k.kv_heads == c.kv_heads &&
        k.hidden == c.hidden && k.vocab == c.vocab && k.file_context == c.context)
      return &k;
  return nullptr;
}

context_info resolve_context(const model_config& c, const std::string& path, std::int32_t override_tokens) {
  context_info ctx;
  ctx.file_tokens = c.context;
  const known_model* known = find_known_model(c);
  ctx.model = known ? known->name : std::filesystem::path(path).stem().string();
  const std::string file = c.context > 0 ? "the file says " + std::to_string(c.context)
                                         : "the file gives no llama.context_length";
  if (override_tokens > 0) {
    ctx.tokens = override_tokens;
    ctx.source = "--context; " + file;
  } else if (known && known->trained_context != c.context) {
    ctx.tokens = known->trained_context;
    ctx.source = "known-models table; " + file;
  } else if (c.context > 0) {
    ctx.tokens = c.context;
    ctx.source = "GGUF llama.context_length";
  } else {
    throw std::invalid_argument("model '" + path +
                                "' gives no llama.context_length and is not in the known-models table "
                                "(examples/llama/context.cpp): pass --context N, the context it was trained on");
  }
  return ctx;
}

std::string describe_context(const context_info& ctx) {
  return ctx.model + "'s trained context of " + std::to_string(ctx.tokens) + " tokens (" + ctx.source + ")";
}

void require_within_context(const std::string& option, std::int64_t value, const context_info& ctx) {
  if (value <= ctx.tokens) return;
  throw std::invalid_argument(option + " " + std::to_string(value) + " is beyond " + describe_context(ctx) +
                              ": use at most " + std::to_string(ctx.tokens) + ", or --context N to override");
}

}  // namespace llama
