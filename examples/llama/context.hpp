#pragma once
// The context a model was trained on, and the checks that keep every run
// inside it.
//
// Where it comes from, first match wins:
//   1. --context N (an explicit override; the CLI says that it was given);
//   2. the known-models table below, keyed by a metadata fingerprint (the
//      model's shape and the context_length its file claims), for files
//      whose llama.context_length is not the trained context: stories260K's
//      GGUF says 2048, a converter default, but the model was trained on
//      512-token windows;
//   3. the GGUF's llama.context_length.
// A file with no context_length that is not in the table needs --context.
// The fingerprint is not the file name, so a renamed copy is still
// recognised, and a different model that happens to share the name is not.
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"

namespace llama {

struct known_model {
  const char* name;
  // Fingerprint: shape and the context the file claims.
  std::int32_t dim, layers, q_heads, kv_heads, hidden, vocab, file_context;
  std::int32_t trained_context;
  const char* note;  // why the table holds it
};

// The three models of ../shared/models/README.md.
const std::vector<known_model>& known_models();
// The entry whose fingerprint matches `c` (c.context is the file's value), or null.
const known_model* find_known_model(const model_config& c);

struct context_info {
  std::int32_t tokens = 0;       // the trained context every run is kept within
  std::int32_t file_tokens = 0;  // llama.context_length as the file says (0: absent)
  std::string model;             // a known model's name, else the file's stem
  std::string source;            // where `tokens` came from, in words
};

// `override_tokens` > 0 is --context. Throws std::invalid_argument when the
// file gives no context, the model is not in the table and no override is given.
context_info resolve_context(const model_config& c, const std::string& path, std::int32_t override_tokens = 0);

// "stories260K's trained context of 512 tokens (known-models table; the file says 2048)"
std::string describe_context(const context_info& ctx);

// Throws std::invalid_argument naming `option`, `value` and the context when
// value > ctx.tokens: "--length 600 is beyond stories260K's trained context
// of 512 tokens (...): use at most 512, or --context N to override".
void require_within_context(const std::string& option, std::int64_t value, const context_info& ctx);

}  // namespace llama
