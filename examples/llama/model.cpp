#include "model.hpp"

#include <cmath>
#include <random>

#include "gguf.hpp"

namespace llama {

namespace {

std::int32_t positive_int(const gguf_file& f, const std::string& key, std::uint64_t fallback, bool has_fallback) {
  const std::uint64_t v = has_fallback ? f.get_uint(key, fallback) : f.get_uint(key);
  if (v == 0 || v > (1u << 24))
    throw gguf_error("model: metadata '" + key + "' = " + std::to_string(v) + " must be in [1, 2^24]");
  return static_cast<std::int32_t>(v);
}

}  // namespace

model model::load(const gguf_file& f, rope_pairing pairing) {
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama")
    throw gguf_error("model: general.architecture is '" + arch + "'; this example runs 'llama' models only");
  const std::string p = arch + ".";
  model m;
  model_config& c = m.config;
  c.dim = positive_int(f, p + "embedding_length", 0, false);
  c.layers = positive_int(f, p + "block_count", 0, false);
  c.hidden = positive_int(f, p + "feed_forward_length", 0, false);
  c.q_heads = positive_int(f, p + "attention.head_count", 0, false);
  c.kv_heads = positive_int(f, p + "attention.head_count_kv", static_cast<std::uint64_t>(c.q_heads), true);
  // As the file says (0 when absent); the context runs are kept within is
  // resolve_context's (context.hpp), which knows files that say otherwise.
  c.context = f.find(p + "context_length") ? positive_int(f, p + "context_length", 0, false) : 0;
  c.rms_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(f.get_float(p + "rope.freq_base", 10000.0));
  c.pairing = pairing;
  if (c.dim % c.q_heads != 0)
    throw gguf_error("model: embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                     std::to_string(c.q_heads));
  if (c.q_heads % c.kv_heads != 0)
    throw gguf_error("model: head_count " + std::to_string(c.q_heads) + " is not a multiple of head_count_kv " +
                     std::to_string(c.kv_heads));
  c.head_dim = c.dim / c.q_heads;
  if (c.head_dim % 2 != 0) throw gguf_error("model: head_dim " + std::to_string(c.head_dim) + " must be even for RoPE");
  const std::uint64_t rot = f.get_uint(p + "rope.dimension_count", static_cast<std::uint64_t>(c.head_dim));
  if (rot != static_cast<std::uint64_t>(c.head_dim))
    throw gguf_error("model: rope.dimension_count " + std::to_string(rot) +
                     " must equal head_dim " + std::to_string(c.head_dim) + " (partial rotary is not supported)");
  if (!(c.rms_eps > 0.0f) || !(c.rope_theta > 1.0f))
    throw gguf_error("model: layer_norm_rms_epsilon must be positive and rope.freq_base above 1");

  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto qd = static_cast<std::uint64_t>(c.q_heads) * static_cast<std::uint64_t>(c.head_dim);
  const auto kvd = static_cast<std::uint64_t>(c.kv_heads) * static_cast<std::uint64_t>(c.head_dim);
  const auto hid = static_cast<std::uint64_t>(c.hidden);
  const tensor_info& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2 || emb.dims[0] != dim)
    throw gguf_error("model: token_embd.weight must be [" + std::to_string(dim) + "][vocab]");
  c.vocab = static_cast<std::int32_t>(emb.dims[1]);
  const auto vocab = emb.dims[1];
  m.token_embedding = f.read_f32("token_embd.weight", {dim, vocab});
  m.output_norm = f.read_f32("output_norm.weight", {dim});
  if (f.has_tensor("output.weight")) {
    m.output = f.read_f32("output.weight", {dim, vocab});
  } else {
    m.output = m.token_embedding;  // tied: the output projection is the embedding
    m.tied_output = true;
  }
  for (std::int32_t l = 0; l < c.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    layer_weights w;
    w.attn_norm = f.read_f32(b + "attn_norm.weight", {dim});
    w.wq = f.read_f32(b + "attn_q.weight", {dim, qd});
    w.wk = f.read_f32(b + "attn_k.weight", {dim, kvd});
    w.wv = f.read_f32(b + "attn_v.weight", {dim, kvd});
    w.wo = f.read_f32(b + "attn_output.weight", {qd, dim});
    w.ffn_norm = f.read_f32(b + "ffn_norm.weight", {dim});
    w.w_gate = f.read_f32(b + "ffn_gate.weight", {dim, hid});
    w.w_up = f.read_f32(b + "ffn_up.weight", {dim, hid});
    w.w_down = f.read_f32(b + "ffn_down.weight", {hid, dim});
    m.layers.push_back(std::move(w));
  }
  return m;
}

model model::random(const model_config& config, std::uint32_t seed) {
  model m;
  m.config = config;
  const model_config& c = config;
  std::mt19937 rng(seed);
  const auto fill = [&](std::size_t n, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
  };
  const auto ones = [](std::size_t n) { return std::vector<float>(n, 1.0f); };
  const auto dim = static_cast<std::size_t>(c.dim);
  const auto qd = static_cast<std::size_t>(c.q_heads * c.head_dim);
  const auto kvd = static_cast<std::size_t>(c.kv_heads * c.head_dim);
  const auto hid = static_cast<std::size_t>(c.hidden);
  const float s = 1.0f / std::sqrt(static_cast<float>(c.dim));
  m.token_embedding = fill(static_cast<std::size_t>(c.vocab) * dim, 1.0f);
  m.output_norm = ones(dim);
  // A separate output of modest scale, so the next-token distribution is
  // neither flat nor one-hot (logits of standard deviation about 1.5).
  m.output = fill(static_cast<std::size_t>(c.vocab) * dim, 1.5f * s);
  m.tied_output = false;
  for (std::int32_t l = 0; l < c.layers; ++l) {
    layer_weights w;
    w.attn_norm = ones(dim);
    w.wq = fill(qd * dim, s);
    w.wk = fill(kvd * dim, s);
    w.wv = fill(kvd * dim, s);
    w.wo = fill(dim * qd, 1.0f / std::sqrt(static_cast<float>(qd)));
    w.ffn_norm = ones(dim);
    w.w_gate = fill(hid * dim, s);
    w.w_up = fill(hid * dim, s);
    w.w_down = fill(dim * hid, 1.0f / std::sqrt(static_cast<float>(hid)));
    m.layers.push_back(std::move(w));
  }
  return m;
}

}  // namespace llama
