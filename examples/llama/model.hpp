#pragma once
// Llama weights and hyper-parameters, loaded from a GGUF file (or made at
// random for the synthetic demo). Matrices are row-major [out][in], as GGUF
// stores them (ne0 = in is the fastest dimension).
#include <cstdint>
#include <string>
#include <vector>

namespace llama {

class gguf_file;

// How RoPE pairs the dimensions of a head. llama.cpp's converters write Q/K
// rows in the original (Meta / llama2.c) order, where dimension 2i rotates
// with 2i+1 (`interleaved`, llama.cpp's ROPE_TYPE_NORM); Hugging Face
// checkpoints permute them so that i rotates with i + d/2 (`half_split`,
// NEOX). The stories260K GGUF reproduces its known greedy text only with
// `interleaved` (tests/llama check it).
enum class rope_pairing { interleaved, half_split };

struct model_config {
  std::int32_t dim = 0;
  std::int32_t layers = 0;
  std::int32_t q_heads = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t hidden = 0;        // SwiGLU inner size
  std::int32_t vocab = 0;
  std::int32_t context = 0;       // llama.context_length as the file says (0: absent; 2048 for stories260K,
                                  // a converter default): the trained context is resolve_context's (context.hpp)
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  rope_pairing pairing = rope_pairing::interleaved;
};

struct layer_weights {
  std::vector<float> attn_norm;  // [dim]
  std::vector<float> wq;         // [q_heads * head_dim][dim]
  std::vector<float> wk;         // [kv_heads * head_dim][dim]
  std::vector<float> wv;         // [kv_heads * head_dim][dim]
  std::vector<float> wo;         // [dim][q_heads * head_dim]
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> w_gate;     // [hidden][dim]
  std::vector<float> w_up;       // [hidden][dim]
  std::vector<float> w_down;     // [dim][hidden]
};

struct model {
  model_config config;
  std::vector<float> token_embedding;  // [vocab][dim]
  std::vector<float> output_norm;      // [dim]
  std::vector<float> output;           // [vocab][dim]; a copy of token_embedding when tied
  bool tied_output = false;
  std::vector<layer_weights> layers;

  // Reads a llama-architecture GGUF; throws gguf_error naming what is wrong.
  static model load(const gguf_file& file, rope_pairing pairing = rope_pairing::interleaved);
  // Random weights of the given shape (seeded): the synthetic demo's model.
  static model random(const model_config& config, std::uint32_t seed);
};

}  // namespace llama
