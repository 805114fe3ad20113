#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace llama {

namespace sh = scissorhands;
using clock_type = std::chrono::steady_clock;

namespace {

// out[r] = sum_c w[r][c] x[c]; four partial sums keep the loop short of a
// serial dependency without reordering anything run to run.
void matvec(float* out, const std::vector<float>& w, const float* x, std::int32_t rows, std::int32_t cols) {
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* row = w.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    std::int32_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      a0 += row[c] * x[c];
      a1 += row[c + 1] * x[c + 1];
      a2 += row[c + 2] * x[c + 2];
      a3 += row[c + 3] * x[c + 3];
    }
    for (; c < cols; ++c) a0 += row[c] * x[c];
    out[r] = (a0 + a1) + (a2 + a3);
  }
}

void rmsnorm(float* out, const float* x, const std::vector<float>& weight, std::int32_t n, float eps) {
  float ss = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::int32_t i = 0; i < n; ++i) out[i] = weight[static_cast<std::size_t>(i)] * (x[i] * scale);
}

}  // namespace

engine::engine(const model& m, std::int32_t max_tokens, sh::named_layout layout)
    : model_(m), max_tokens_(max_tokens), layout_(layout) {
  const model_config& c = m.config;
  if (max_tokens <= 0) throw std::invalid_argument("engine: max_tokens must be positive, got " + std::to_string(max_tokens));
  x_.resize(static_cast<std::size_t>(c.dim));
  xb_.resize(static_cast<std::size_t>(c.dim));
  q_.resize(static_cast<std::size_t>(c.q_heads * c.head_dim));
  k_.resize(static_cast<std::size_t>(c.kv_heads * c.head_dim));
  v_.resize(static_cast<std::size_t>(c.kv_heads * c.head_dim));
  att_out_.resize(static_cast<std::size_t>(c.q_heads * c.head_dim));
  hb_.resize(static_cast<std::size_t>(c.hidden));
  hb2_.resize(static_cast<std::size_t>(c.hidden));
  lse_.resize(static_cast<std::size_t>(c.q_heads));
  logits_.resize(static_cast<std::size_t>(c.vocab));
  // RoPE frequencies theta^(-2i/d), one per rotated pair.
  for (std::int32_t i = 0; i < c.head_dim / 2; ++i)
    rope_freq_.push_back(std::pow(c.rope_theta, -2.0f * static_cast<float>(i) / static_cast<float>(c.head_dim)));
  rope_cos_.resize(rope_freq_.size());
  rope_sin_.resize(rope_freq_.size());
  set_policy(nullptr, {});
}

void engine::allocate_cache() {
  const model_config& c = model_.config;
  const auto layers = static_cast<std::size_t>(c.layers);
  k_cache_.assign(layers, {});
  v_cache_.assign(layers, {});
  lengths_.assign(layers, 0);
  std::int32_t widest = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t n = static_cast<std::size_t>(capacity_[l]) * static_cast<std::size_t>(c.kv_heads * c.head_dim);
    k_cache_[l].assign(n, 0.0f);
    v_cache_[l].assign(n, 0.0f);
    widest = std::max(widest, capacity_[l]);
  }
  probs_.assign(static_cast<std::size_t>(c.q_heads) * static_cast<std::size_t>(widest), 0.0f);
}

void engine::set_policy(const policy_spec* spec, const std::vector<std::int32_t>& budgets, observe_source source) {
  const model_config& c = model_.config;
  compressor_.reset();
  capacity_.assign(static_cast<std::size_t>(c.layers), max_tokens_);
  if (spec) {
    if (budgets.size() != static_cast<std::size_t>(c.layers))
      throw std::invalid_argument("engine::set_policy: budgets must list " + std::to_string(c.layers) +
                                  " layers, got " + std::to_string(budgets.size()));
    // Appending one token a step and compressing at B keeps a head at most
    // B tokens: B slots are all the engine ever needs.
    for (std::size_t l = 0; l < budgets.size(); ++l)
      capacity_[l] = std::clamp(budgets[l], 1, max_tokens_);
  }
  allocate_cache();
  if (spec) {
    std::vector<sh::host_kv_view<float>> views;
    for (std::int32_t l = 0; l < c.layers; ++l) views.push_back(view(l));
    compressor_ = make_compressor(*spec, budgets, views, source);
  }
  reset();
}

void engine::reset() {
  position_ = 0;
  std::fill(lengths_.begin(), lengths_.end(), 0);
  if (compressor_) compressor_->reset();
}

sh::host_kv_view<float> engine::view(std::int32_t layer) {
  const auto l = static_cast<std::size_t>(layer);
  const model_config& c = model_.config;
  return sh::make_kv_view(sh::host_span<float>(k_cache_[l].data(), k_cache_[l].size()),
                          sh::host_span<float>(v_cache_[l].data(), v_cache_[l].size()),
                          sh::host_span<const std::int32_t>(&lengths_[l], 1), 1, c.kv_heads, c.head_dim, capacity_[l],
                          layout_);
}

std::size_t engine::kv_bytes() const {
  std::size_t n = 0;
  for (std::size_t l = 0; l < k_cache_.size(); ++l) n += (k_cache_[l].size() + v_cache_[l].size()) * sizeof(float);
  return n;
}

std::size_t engine::state_bytes() const {
  if (!compressor_) return 0;
  std::size_t n = 0;
  for (std::int32_t l = 0; l < model_.config.layers; ++l) n += compressor_->state_bytes(l);
  return n;
}

const float* engine::step(std::int32_t token) {
  const auto t0 = clock_type::now();
  const model_config& c = model_.config;
  if (token < 0 || token >= c.vocab)
    throw std::out_of_range("engine::step: token " + std::to_string(token) + " is not in [0, vocab = " +
                            std::to_string(c.vocab) + ")");
  if (position_ >= max_tokens_)
    throw std::length_error("engine::step: position " + std::to_string(position_) + " reaches max_tokens = " +
                            std::to_string(max_tokens_));
  const std::int32_t dim = c.dim, hd = c.head_dim, group = c.q_heads / c.kv_heads;
  std::copy_n(model_.token_embedding.begin() + static_cast<std::ptrdiff_t>(token) * dim, dim, x_.begin());
  for (std::size_t i = 0; i < rope_freq_.size(); ++i) {
    const float angle = static_cast<float>(position_) * rope_freq_[i];
    rope_cos_[i] = std::cos(angle);
    rope_sin_[i] = std::sin(angle);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::chrono::nanoseconds library{0}, compress{0};

  for (std::int32_t l = 0; l < c.layers; ++l) {
    const layer_weights& w = model_.layers[static_cast<std::size_t>(l)];
    rmsnorm(xb_.data(), x_.data(), w.attn_norm, dim, c.rms_eps);
    matvec(q_.data(), w.wq, xb_.data(), c.q_heads * hd, dim);
    matvec(k_.data(), w.wk, xb_.data(), c.kv_heads * hd, dim);
    matvec(v_.data(), w.wv, xb_.data(), c.kv_heads * hd, dim);
    // RoPE at the token's true position, on q and k alike.
    const auto rotate = [&](float* head) {
      for (std::int32_t i = 0; i < hd / 2; ++i) {
        const float cs = rope_cos_[static_cast<std::size_t>(i)], sn = rope_sin_[static_cast<std::size_t>(i)];
        const std::int32_t a = c.pairing == rope_pairing::interleaved ? 2 * i : i;
        const std::int32_t b = c.pairing == rope_pairing::interleaved ? 2 * i + 1 : i + hd / 2;
        const float x0 = head[a], x1 = head[b];
        head[a] = x0 * cs - x1 * sn;
        head[b] = x0 * sn + x1 * cs;
      }
    };
    for (std::int32_t h = 0; h < c.q_heads; ++h) rotate(q_.data() + h * hd);
    for (std::int32_t h = 0; h < c.kv_heads; ++h) rotate(k_.data() + h * hd);

    // Append K (after RoPE) and V at the next free slot.
    auto cache = view(l);
    std::int32_t& len = lengths_[static_cast<std::size_t>(l)];
    if (len >= capacity_[static_cast<std::size_t>(l)])
      throw std::logic_error("engine::step: layer " + std::to_string(l) + " cache is full (" + std::to_string(len) +
                             " slots) before append: the policy did not keep it below its budget");
    for (std::int32_t h = 0; h < c.kv_heads; ++h) {
      std::copy_n(k_.data() + h * hd, hd, cache.k_row(0, h, len));
      std::copy_n(v_.data() + h * hd, hd, cache.v_row(0, h, len));
    }
    ++len;

    // Attention of the step's query over every cached slot.
    for (std::int32_t qh = 0; qh < c.q_heads; ++qh) {
      const std::int32_t h = qh / group;
      const float* q = q_.data() + qh * hd;
      float* p = probs_.data() + static_cast<std::size_t>(qh) * static_cast<std::size_t>(len);
      float mx = -INFINITY;
      for (std::int32_t t = 0; t < len; ++t) {
        const float* k = cache.k_row(0, h, t);
        float dot = 0.0f;
        for (std::int32_t d = 0; d < hd; ++d) dot += q[d] * k[d];
        p[t] = dot * scale;
        mx = std::max(mx, p[t]);
      }
      float sum = 0.0f;
      for (std::int32_t t = 0; t < len; ++t) {
        p[t] = std::exp(p[t] - mx);
        sum += p[t];
      }
      const float inv = 1.0f / sum;
      lse_[static_cast<std::size_t>(qh)] = mx + std::log(sum);
      float* out = att_out_.data() + qh * hd;
      std::fill_n(out, hd, 0.0f);
      for (std::int32_t t = 0; t < len; ++t) {
        p[t] *= inv;
        const float* v = cache.v_row(0, h, t);
        for (std::int32_t d = 0; d < hd; ++d) out[d] += p[t] * v[d];
      }
    }
    if (on_attention) on_attention(l, probs_.data(), len);

    // The library: observe this step, then evict if the head holds B tokens.
    if (compressor_) {
      const auto l0 = clock_type::now();
      compressor_->observe(l, cache, probs_.data(), q_.data(), lse_.data(), c.q_heads);
      if (before_compress) {
        const auto h0 = clock_type::now();
        before_compress(l);
        library -= clock_type::now() - h0;
      }
      const auto c0 = clock_type::now();
      lengths_[static_cast<std::size_t>(l)] = compressor_->compress(l, cache);
      const auto c1 = clock_type::now();
      library += c1 - l0;
      compress += c1 - c0;
    }

    matvec(xb_.data(), w.wo, att_out_.data(), dim, c.q_heads * hd);
    for (std::int32_t i = 0; i < dim; ++i) x_[static_cast<std::size_t>(i)] += xb_[static_cast<std::size_t>(i)];

    // SwiGLU feed-forward.
    rmsnorm(xb_.data(), x_.data(), w.ffn_norm, dim, c.rms_eps);
    matvec(hb_.data(), w.w_gate, xb_.data(), c.hidden, dim);
    matvec(hb2_.data(), w.w_up, xb_.data(), c.hidden, dim);
    for (std::int32_t i = 0; i < c.hidden; ++i) {
      const float g = hb_[static_cast<std::size_t>(i)];
      hb_[static_cast<std::size_t>(i)] = g / (1.0f + std::exp(-g)) * hb2_[static_cast<std::size_t>(i)];
    }
    matvec(xb_.data(), w.w_down, hb_.data(), dim, c.hidden);
    for (std::int32_t i = 0; i < dim; ++i) x_[static_cast<std::size_t>(i)] += xb_[static_cast<std::size_t>(i)];
  }

  rmsnorm(xb_.data(), x_.data(), model_.output_norm, dim, c.rms_eps);
  matvec(logits_.data(), model_.output, xb_.data(), c.vocab, dim);
  ++position_;
  times_.library += library;
  times_.compress += compress;
  times_.total += clock_type::now() - t0;
  ++times_.steps;
  return logits_.data();
}

}  // namespace llama
