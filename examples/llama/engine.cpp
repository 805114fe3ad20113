#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <variant>
#include <stdexcept>
#include <string>

namespace llama {

namespace sh = scissorhands;
using clock_type = std::chrono::steady_clock;

namespace {

// sum_c row[c] x[c] with four partial sums: keeps the loop short of a
// serial dependency without reordering anything run to run. matvec and
// matmul_tokens both use it, so a token's result is the same bits whichever
// path computed it (the prefill relies on that).
inline float dot(const float* row, const float* x, std::int32_t cols) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  std::int32_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    a0 += row[c] * x[c];
    a1 += row[c + 1] * x[c + 1];
    a2 += row[c + 2] * x[c + 2];
    a3 += row[c + 3] * x[c + 3];
  }
  for (; c < cols; ++c) a0 += row[c] * x[c];
  return (a0 + a1) + (a2 + a3);
}

// out[r] = sum_c w[r][c] x[c].
void matvec(float* out, const std::vector<float>& w, const float* x, std::int32_t rows, std::int32_t cols) {
  for (std::int32_t r = 0; r < rows; ++r)
    out[r] = dot(w.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols), x, cols);
}

// The same for n tokens at once (rows of x and out `cols` and `rows` apart):
// each weight row is read once for all of them.
void matmul_tokens(float* out, const std::vector<float>& w, const float* x, std::int32_t rows, std::int32_t cols,
                   std::int32_t n) {
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* row = w.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
    for (std::int32_t j = 0; j < n; ++j)
      out[static_cast<std::size_t>(j) * static_cast<std::size_t>(rows) + static_cast<std::size_t>(r)] =
          dot(row, x + static_cast<std::size_t>(j) * static_cast<std::size_t>(cols), cols);
  }
}

void rmsnorm(float* out, const float* x, const std::vector<float>& weight, std::int32_t n, float eps) {
  float ss = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::int32_t i = 0; i < n; ++i) out[i] = weight[static_cast<std::size_t>(i)] * (x[i] * scale);
}

}  // namespace

engine::engine(const model& m, std::int32_t max_tokens, sh::named_layout layout, kv_format format)
    : model_(m), max_tokens_(max_tokens), layout_(layout), format_(format) {
  const model_config& c = m.config;
  if (max_tokens <= 0) throw std::invalid_argument("engine: max_tokens must be positive, got " + std::to_string(max_tokens));
  if (format_.head_dim == 0) format_ = resolve_kv_format(format.bits, format.group_size, c.head_dim);
  if (format_.head_dim != c.head_dim)
    throw std::invalid_argument("engine: the KV format is for head_dim " + std::to_string(format_.head_dim) +
                                ", the model's is " + std::to_string(c.head_dim));
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
  for (auto* buffers : {&k_cache_, &v_cache_, &k_params_, &v_params_}) buffers->assign(layers, {});
  k16_.assign(layers, {});
  v16_.assign(layers, {});
  k_codes_.assign(layers, {});
  v_codes_.assign(layers, {});
  lengths_.assign(layers, 0);
  std::int32_t widest = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    const auto rows = static_cast<std::size_t>(capacity_[l]) * static_cast<std::size_t>(c.kv_heads);
    const std::size_t n = rows * static_cast<std::size_t>(c.head_dim);
    switch (format_.bits) {
      case 32:
        k_cache_[l].assign(n, 0.0f);
        v_cache_[l].assign(n, 0.0f);
        break;
      case 16:
        k16_[l].assign(n, bf16{});
        v16_[l].assign(n, bf16{});
        break;
      default: {
        const auto q = format_.quantization();
        k_codes_[l].assign(rows * static_cast<std::size_t>(q.code_row_bytes(c.head_dim)), 0);
        v_codes_[l].assign(k_codes_[l].size(), 0);
        k_params_[l].assign(rows * static_cast<std::size_t>(q.params_per_row(c.head_dim)), 0.0f);
        v_params_[l].assign(k_params_[l].size(), 0.0f);
      }
    }
    widest = std::max(widest, capacity_[l]);
  }
  probs_.assign(static_cast<std::size_t>(c.q_heads) * static_cast<std::size_t>(widest), 0.0f);
  const std::size_t scratch = format_.bits == 32 ? 0
                                                 : static_cast<std::size_t>(widest) *
                                                       static_cast<std::size_t>(c.kv_heads * c.head_dim);
  deq_k_.assign(scratch, 0.0f);
  deq_v_.assign(scratch, 0.0f);
}

void engine::set_policy(const policy_spec* spec, const std::vector<std::int32_t>& budgets, observe_source source,
                        std::optional<prefill_plan> plan) {
  const model_config& c = model_.config;
  compressor_.reset();
  plan_ = plan;
  capacity_.assign(static_cast<std::size_t>(c.layers), max_tokens_);
  if (plan && (plan->prompt < 1 || plan->prompt > max_tokens_ || plan->observe_last < 0 ||
               plan->observe_last > plan->prompt))
    throw std::invalid_argument("engine::set_policy: the prefill plan needs 1 <= prompt <= max_tokens = " +
                                std::to_string(max_tokens_) + " and 0 <= observe_last <= prompt, got prompt " +
                                std::to_string(plan->prompt) + ", observe_last " + std::to_string(plan->observe_last));
  if (spec && plan && spec->observe_last > 0) {
    // The policy's own observation window (SnapKV's k) wins over the protocol's.
    if (spec->observe_last > plan->prompt)
      throw std::invalid_argument("engine::set_policy: policy " + spec->label + " observes the last k = " +
                                  std::to_string(spec->observe_last) + " prompt queries, more than the prompt P = " +
                                  std::to_string(plan->prompt));
    plan_->observe_last = spec->observe_last;
  }
  if (spec) {
    if (budgets.size() != static_cast<std::size_t>(c.layers))
      throw std::invalid_argument("engine::set_policy: budgets must list " + std::to_string(c.layers) +
                                  " layers, got " + std::to_string(budgets.size()));
    // Decode: appending one token a step and compressing at B keeps a head
    // at most B tokens, so B slots are all the engine ever needs. Prefill:
    // the cache holds the prompt, then B plus what is decoded after it.
    if (!plan)
      for (std::size_t l = 0; l < budgets.size(); ++l) capacity_[l] = std::clamp(budgets[l], 1, max_tokens_);
  }
  allocate_cache();
  if (spec) {
    // The state needs a slot per token held at a library call: B when
    // decoding (state_capacity_for(B, 1)); the whole prompt when it lands
    // in one chunk on an empty cache (prefill: P).
    compressor_ = make_compressor(*spec, budgets, caches(), source, plan ? plan->prompt : 0);
  }
  reset();
}

void engine::validate_budgets() {
  reset();
  if (!compressor_) return;
  const std::int32_t m = compressor_->spec().config.evict_count;
  if (compressor_->model_wide()) {
    compressor_->compress_model(caches(), compressor_->budget(0) + (plan_ ? m : 0));
    return;
  }
  for (std::int32_t l = 0; l < model_.config.layers; ++l)
    compressor_->compress(l, cache(l), compressor_->budget(l) + (plan_ ? m : 0));
}

std::vector<sh::host_kv_view<float>> engine::views() {
  std::vector<sh::host_kv_view<float>> out;
  for (std::int32_t l = 0; l < model_.config.layers; ++l) out.push_back(view(l));
  return out;
}

std::vector<cache_view> engine::caches() {
  std::vector<cache_view> out;
  for (std::int32_t l = 0; l < model_.config.layers; ++l) out.push_back(cache(l));
  return out;
}

void engine::observe_and_compress(std::int32_t layer, const cache_view& stored, const attention_batch& att,
                                  std::int32_t budget, std::chrono::steady_clock::time_point l0,
                                  std::chrono::nanoseconds& library, std::chrono::nanoseconds& compress) {
  compressor_->observe(layer, stored, att);
  if (compressor_->model_wide()) {
    library += clock_type::now() - l0;
    return;
  }
  if (before_compress) {
    const auto h0 = clock_type::now();
    before_compress(layer);
    library -= clock_type::now() - h0;
  }
  const auto c0 = clock_type::now();
  lengths_[static_cast<std::size_t>(layer)] = compressor_->compress(layer, stored, budget);
  const auto c1 = clock_type::now();
  library += c1 - l0;
  compress += c1 - c0;
}

void engine::compress_model(std::int32_t budget, std::chrono::nanoseconds& library, std::chrono::nanoseconds& compress) {
  if (before_compress) {
    const auto h0 = clock_type::now();
    for (std::int32_t l = 0; l < model_.config.layers; ++l) before_compress(l);
    library -= clock_type::now() - h0;
  }
  const auto c0 = clock_type::now();
  const std::int32_t kept = compressor_->compress_model(caches(), budget);
  std::fill(lengths_.begin(), lengths_.end(), kept);
  const auto c1 = clock_type::now();
  library += c1 - c0;
  compress += c1 - c0;
}

void engine::reset() {
  position_ = 0;
  std::fill(lengths_.begin(), lengths_.end(), 0);
  if (compressor_) compressor_->reset();
}

sh::host_kv_view<float> engine::view(std::int32_t layer) {
  if (format_.bits != 32)
    throw std::logic_error("engine::view: the cache is stored as " + format_.name() +
                           ", not fp32: use engine::cache for the stored form");
  const auto l = static_cast<std::size_t>(layer);
  const model_config& c = model_.config;
  return sh::make_kv_view(sh::host_span<float>(k_cache_[l].data(), k_cache_[l].size()),
                          sh::host_span<float>(v_cache_[l].data(), v_cache_[l].size()),
                          sh::host_span<const std::int32_t>(&lengths_[l], 1), 1, c.kv_heads, c.head_dim, capacity_[l],
                          layout_);
}

cache_view engine::cache(std::int32_t layer) {
  const auto l = static_cast<std::size_t>(layer);
  const model_config& c = model_.config;
  const sh::host_span<const std::int32_t> length(&lengths_[l], 1);
  switch (format_.bits) {
    case 32: return view(layer);
    case 16:
      return sh::make_kv_view(sh::host_span<bf16>(k16_[l].data(), k16_[l].size()),
                              sh::host_span<bf16>(v16_[l].data(), v16_[l].size()), length, 1, c.kv_heads, c.head_dim,
                              capacity_[l], layout_);
    default:
      return sh::make_quantized_kv_view(sh::host_span<std::uint8_t>(k_codes_[l].data(), k_codes_[l].size()),
                                        sh::host_span<std::uint8_t>(v_codes_[l].data(), v_codes_[l].size()),
                                        sh::host_span<float>(k_params_[l].data(), k_params_[l].size()),
                                        sh::host_span<float>(v_params_[l].data(), v_params_[l].size()), length, 1,
                                        c.kv_heads, c.head_dim, capacity_[l], layout_, format_.quantization());
  }
}

void engine::append(std::int32_t layer, std::int32_t slot, const float* k, const float* v) {
  const model_config& c = model_.config;
  const std::int32_t hd = c.head_dim;
  const cache_view stored = cache(layer);
  for (std::int32_t h = 0; h < c.kv_heads; ++h) {
    const float* kh = k + h * hd;
    const float* vh = v + h * hd;
    std::visit(
        [&](const auto& cv) {
          using V = std::decay_t<decltype(cv)>;
          if constexpr (std::is_same_v<V, sh::host_quantized_kv_view>) {
            sh::quantize_row(kh, hd, cv.quantization, cv.k_row(0, h, slot), cv.k_params_row(0, h, slot));
            sh::quantize_row(vh, hd, cv.quantization, cv.v_row(0, h, slot), cv.v_params_row(0, h, slot));
          } else if constexpr (std::is_same_v<V, sh::host_kv_view<bf16>>) {
            std::transform(kh, kh + hd, cv.k_row(0, h, slot), to_bf16);
            std::transform(vh, vh + hd, cv.v_row(0, h, slot), to_bf16);
          } else {
            std::copy_n(kh, hd, cv.k_row(0, h, slot));
            std::copy_n(vh, hd, cv.v_row(0, h, slot));
          }
        },
        stored);
  }
}

sh::host_kv_view<float> engine::readable(std::int32_t layer, std::int32_t len) {
  if (format_.bits == 32) return view(layer);
  const auto l = static_cast<std::size_t>(layer);
  const model_config& c = model_.config;
  const std::int32_t hd = c.head_dim;
  const std::size_t n = static_cast<std::size_t>(capacity_[l]) * static_cast<std::size_t>(c.kv_heads * hd);
  auto out = sh::make_kv_view(sh::host_span<float>(deq_k_.data(), n), sh::host_span<float>(deq_v_.data(), n),
                              sh::host_span<const std::int32_t>(&lengths_[l], 1), 1, c.kv_heads, hd, capacity_[l],
                              layout_);
  const cache_view stored = cache(layer);
  std::visit(
      [&](const auto& cv) {
        using V = std::decay_t<decltype(cv)>;
        for (std::int32_t h = 0; h < c.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t) {
            if constexpr (std::is_same_v<V, sh::host_quantized_kv_view>) {
              cv.dequantize_k(0, h, t, out.k_row(0, h, t));
              cv.dequantize_v(0, h, t, out.v_row(0, h, t));
            } else if constexpr (std::is_same_v<V, sh::host_kv_view<bf16>>) {
              std::transform(cv.k_row(0, h, t), cv.k_row(0, h, t) + hd, out.k_row(0, h, t), from_bf16);
              std::transform(cv.v_row(0, h, t), cv.v_row(0, h, t) + hd, out.v_row(0, h, t), from_bf16);
            }
          }
      },
      stored);
  return out;
}

std::size_t engine::kv_bytes() const {
  std::size_t n = 0;
  for (std::size_t l = 0; l < k_cache_.size(); ++l)
    n += (k_cache_[l].size() + v_cache_[l].size()) * sizeof(float) + (k16_[l].size() + v16_[l].size()) * sizeof(bf16) +
         k_codes_[l].size() + v_codes_[l].size();
  return n;
}

std::size_t engine::param_bytes() const {
  std::size_t n = 0;
  for (std::size_t l = 0; l < k_params_.size(); ++l) n += (k_params_[l].size() + v_params_[l].size()) * sizeof(float);
  return n;
}

std::size_t engine::state_slot_bytes() const {
  if (!compressor_) return 0;
  std::size_t n = 0;
  for (std::int32_t l = 0; l < model_.config.layers; ++l) {
    const sh::state_shape shape = compressor_->state(l).shape;
    n += static_cast<std::size_t>(shape.rows) * static_cast<std::size_t>(shape.kv_heads) *
         static_cast<std::size_t>(shape.capacity) * sh::state_bytes_per_slot(shape.ring_words);
  }
  return n;
}

std::size_t engine::state_bytes() const {
  if (!compressor_) return 0;
  std::size_t n = 0;
  for (std::int32_t l = 0; l < model_.config.layers; ++l) n += compressor_->state_bytes(l);
  return n;
}

void engine::attend(const float* q_rows, sh::host_kv_view<float>& cache, std::int32_t len, float* probs,
                    std::size_t p_stride, float* lse, float* out_rows) const {
  const model_config& c = model_.config;
  const std::int32_t hd = c.head_dim, group = c.q_heads / c.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::int32_t qh = 0; qh < c.q_heads; ++qh) {
    const std::int32_t h = qh / group;
    const float* q = q_rows + qh * hd;
    float* p = probs + static_cast<std::size_t>(qh) * p_stride;
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
    lse[qh] = mx + std::log(sum);
    float* out = out_rows + qh * hd;
    std::fill_n(out, hd, 0.0f);
    for (std::int32_t t = 0; t < len; ++t) {
      p[t] *= inv;
      const float* v = cache.v_row(0, h, t);
      for (std::int32_t d = 0; d < hd; ++d) out[d] += p[t] * v[d];
    }
  }
}

namespace {

// RoPE on one head, at the angles whose cos/sin are given per pair.
void rotate(float* head, std::int32_t hd, rope_pairing pairing, const float* cs, const float* sn) {
  for (std::int32_t i = 0; i < hd / 2; ++i) {
    const std::int32_t a = pairing == rope_pairing::interleaved ? 2 * i : i;
    const std::int32_t b = pairing == rope_pairing::interleaved ? 2 * i + 1 : i + hd / 2;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * cs[i] - x1 * sn[i];
    head[b] = x0 * sn[i] + x1 * cs[i];
  }
}

void swiglu(float* gate, const float* up, std::int32_t n) {
  for (std::int32_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace

const float* engine::step(std::int32_t token) {
  const auto t0 = clock_type::now();
  const model_config& c = model_.config;
  if (token < 0 || token >= c.vocab)
    throw std::out_of_range("engine::step: token " + std::to_string(token) + " is not in [0, vocab = " +
                            std::to_string(c.vocab) + ")");
  if (position_ >= max_tokens_)
    throw std::length_error("engine::step: position " + std::to_string(position_) + " reaches max_tokens = " +
                            std::to_string(max_tokens_));
  const std::int32_t dim = c.dim, hd = c.head_dim;
  std::copy_n(model_.token_embedding.begin() + static_cast<std::ptrdiff_t>(token) * dim, dim, x_.begin());
  for (std::size_t i = 0; i < rope_freq_.size(); ++i) {
    const float angle = static_cast<float>(position_) * rope_freq_[i];
    rope_cos_[i] = std::cos(angle);
    rope_sin_[i] = std::sin(angle);
  }
  std::chrono::nanoseconds library{0}, compress{0};

  for (std::int32_t l = 0; l < c.layers; ++l) {
    const layer_weights& w = model_.layers[static_cast<std::size_t>(l)];
    rmsnorm(xb_.data(), x_.data(), w.attn_norm, dim, c.rms_eps);
    matvec(q_.data(), w.wq, xb_.data(), c.q_heads * hd, dim);
    matvec(k_.data(), w.wk, xb_.data(), c.kv_heads * hd, dim);
    matvec(v_.data(), w.wv, xb_.data(), c.kv_heads * hd, dim);
    // RoPE at the token's true position, on q and k alike.
    for (std::int32_t h = 0; h < c.q_heads; ++h) rotate(q_.data() + h * hd, hd, c.pairing, rope_cos_.data(), rope_sin_.data());
    for (std::int32_t h = 0; h < c.kv_heads; ++h) rotate(k_.data() + h * hd, hd, c.pairing, rope_cos_.data(), rope_sin_.data());

    // Append K (after RoPE) and V at the next free slot, in the stored format.
    std::int32_t& len = lengths_[static_cast<std::size_t>(l)];
    if (len >= capacity_[static_cast<std::size_t>(l)])
      throw std::logic_error("engine::step: layer " + std::to_string(l) + " cache is full (" + std::to_string(len) +
                             " slots) before append: the policy did not keep it below its budget");
    append(l, len, k_.data(), v_.data());
    ++len;
    const cache_view stored = cache(l);

    // Attention of the step's query over every cached slot (as stored:
    // dequantized unless fp32).
    auto rows = readable(l, len);
    attend(q_.data(), rows, len, probs_.data(), static_cast<std::size_t>(len), lse_.data(), att_out_.data());
    if (on_attention) on_attention(l, probs_.data(), len);

    // The library (decode protocol): observe this step, then evict if the
    // head holds B tokens. In the prefill protocol it ran in prefill() only.
    if (compressor_ && !plan_) {
      const auto l0 = clock_type::now();
      attention_batch att;
      att.probs = probs_.data();
      att.probs_head_stride = len;
      att.probs_query_stride = len;
      att.probs_size = static_cast<std::size_t>(c.q_heads) * static_cast<std::size_t>(len);
      att.queries = q_.data();
      att.lse = lse_.data();
      att.q_heads = c.q_heads;
      att.q_len = 1;
      // shared_layers defers to compress_model after the last layer. That is
      // exact: this layer's attention already ran, and the next step sees the result.
      observe_and_compress(l, stored, att, compressor_->budget(l), l0, library, compress);
    }

    matvec(xb_.data(), w.wo, att_out_.data(), dim, c.q_heads * hd);
    for (std::int32_t i = 0; i < dim; ++i) x_[static_cast<std::size_t>(i)] += xb_[static_cast<std::size_t>(i)];

    // SwiGLU feed-forward.
    rmsnorm(xb_.data(), x_.data(), w.ffn_norm, dim, c.rms_eps);
    matvec(hb_.data(), w.w_gate, xb_.data(), c.hidden, dim);
    matvec(hb2_.data(), w.w_up, xb_.data(), c.hidden, dim);
    swiglu(hb_.data(), hb2_.data(), c.hidden);
    matvec(xb_.data(), w.w_down, hb_.data(), dim, c.hidden);
    for (std::int32_t i = 0; i < dim; ++i) x_[static_cast<std::size_t>(i)] += xb_[static_cast<std::size_t>(i)];
  }

  if (compressor_ && !plan_ && compressor_->model_wide()) compress_model(compressor_->budget(0), library, compress);

  rmsnorm(xb_.data(), x_.data(), model_.output_norm, dim, c.rms_eps);
  matvec(logits_.data(), model_.output, xb_.data(), c.vocab, dim);
  ++position_;
  times_.library += library;
  times_.compress += compress;
  times_.total += clock_type::now() - t0;
  ++times_.steps;
  return logits_.data();
}

const float* engine::prefill(const std::int32_t* tokens, std::int32_t n) {
  const auto t0 = clock_type::now();
  const model_config& c = model_.config;
  if (n < 1) throw std::invalid_argument("engine::prefill: needs at least one token, got " + std::to_string(n));
  if (static_cast<std::int64_t>(position_) + n > max_tokens_)
    throw std::length_error("engine::prefill: " + std::to_string(n) + " tokens from position " +
                            std::to_string(position_) + " pass max_tokens = " + std::to_string(max_tokens_));
  if (compressor_ && !plan_)
    throw std::logic_error("engine::prefill: the decode protocol's state holds B slots per head; a prompt in one "
                           "chunk needs the prefill protocol's plan (set_policy with a prefill_plan)");
  for (std::int32_t j = 0; j < n; ++j)
    if (tokens[j] < 0 || tokens[j] >= c.vocab)
      throw std::out_of_range("engine::prefill: token " + std::to_string(tokens[j]) + " (prompt index " +
                              std::to_string(j) + ") is not in [0, vocab = " + std::to_string(c.vocab) + ")");
  for (std::int32_t l = 0; l < c.layers; ++l) {
    const std::int32_t len = lengths_[static_cast<std::size_t>(l)];
    if (len + n > capacity_[static_cast<std::size_t>(l)] || (compressor_ && len + n > plan_->prompt))
      throw std::length_error("engine::prefill: layer " + std::to_string(l) + " holds " + std::to_string(len) +
                              " tokens; " + std::to_string(n) + " more pass its capacity " +
                              std::to_string(capacity_[static_cast<std::size_t>(l)]) +
                              (compressor_ ? " or the plan's prompt " + std::to_string(plan_->prompt) : std::string()));
  }
  const std::int32_t dim = c.dim, hd = c.head_dim, qd = c.q_heads * hd, kvd = c.kv_heads * hd;
  const auto un = static_cast<std::size_t>(n);
  const auto rows = [&](std::vector<float>& v, std::int32_t width) { v.resize(un * static_cast<std::size_t>(width)); };
  rows(px_, dim);
  rows(pxb_, dim);
  rows(pq_, qd);
  rows(pk_, kvd);
  rows(pv_, kvd);
  rows(patt_, qd);
  rows(phb_, c.hidden);
  rows(phb2_, c.hidden);
  rows(plse_, c.q_heads);
  const std::size_t pairs = rope_freq_.size();
  std::vector<float> cosines(un * pairs), sines(un * pairs);
  for (std::int32_t j = 0; j < n; ++j) {
    std::copy_n(model_.token_embedding.begin() + static_cast<std::ptrdiff_t>(tokens[j]) * dim, dim,
                px_.begin() + static_cast<std::ptrdiff_t>(j) * dim);
    for (std::size_t i = 0; i < pairs; ++i) {
      const float angle = static_cast<float>(position_ + j) * rope_freq_[i];
      cosines[static_cast<std::size_t>(j) * pairs + i] = std::cos(angle);
      sines[static_cast<std::size_t>(j) * pairs + i] = std::sin(angle);
    }
  }
  const auto row = [](std::vector<float>& v, std::int32_t j, std::int32_t width) {
    return v.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(width);
  };
  std::chrono::nanoseconds library{0}, compress{0};

  for (std::int32_t l = 0; l < c.layers; ++l) {
    const layer_weights& w = model_.layers[static_cast<std::size_t>(l)];
    for (std::int32_t j = 0; j < n; ++j) rmsnorm(row(pxb_, j, dim), row(px_, j, dim), w.attn_norm, dim, c.rms_eps);
    matmul_tokens(pq_.data(), w.wq, pxb_.data(), qd, dim, n);
    matmul_tokens(pk_.data(), w.wk, pxb_.data(), kvd, dim, n);
    matmul_tokens(pv_.data(), w.wv, pxb_.data(), kvd, dim, n);
    for (std::int32_t j = 0; j < n; ++j) {
      const float* cs = cosines.data() + static_cast<std::size_t>(j) * pairs;
      const float* sn = sines.data() + static_cast<std::size_t>(j) * pairs;
      for (std::int32_t h = 0; h < c.q_heads; ++h) rotate(row(pq_, j, qd) + h * hd, hd, c.pairing, cs, sn);
      for (std::int32_t h = 0; h < c.kv_heads; ++h) rotate(row(pk_, j, kvd) + h * hd, hd, c.pairing, cs, sn);
    }

    // Append the prompt's K (after RoPE) and V, then attend causally: query
    // j (slot base + j) sees slots 0 .. base + j, as it would in step().
    std::int32_t& len = lengths_[static_cast<std::size_t>(l)];
    const std::int32_t base = len;
    for (std::int32_t j = 0; j < n; ++j) append(l, base + j, row(pk_, j, kvd), row(pv_, j, kvd));
    len = base + n;
    const cache_view stored = cache(l);
    auto rows_read = readable(l, len);
    const auto columns = static_cast<std::size_t>(len);
    const std::size_t head_stride = un * columns;  // probabilities [q_heads][n][len]
    pprobs_.assign(static_cast<std::size_t>(c.q_heads) * head_stride, 0.0f);
    for (std::int32_t j = 0; j < n; ++j)
      attend(row(pq_, j, qd), rows_read, base + j + 1, pprobs_.data() + static_cast<std::size_t>(j) * columns, head_stride,
             row(plse_, j, c.q_heads), row(patt_, j, qd));

    // The library, once: observe the prompt's queries (all, or the last k,
    // as SnapKV's observation window), then compress the layer to B.
    if (compressor_) {
      const auto l0 = clock_type::now();
      const std::int32_t k = plan_->observe_last > 0 ? std::min(plan_->observe_last, n) : n;
      const auto first = static_cast<std::size_t>(n - k);
      attention_batch att;
      att.probs = pprobs_.data() + first * columns;
      att.probs_head_stride = static_cast<std::int64_t>(head_stride);
      att.probs_query_stride = static_cast<std::int64_t>(columns);
      att.probs_size = pprobs_.size() - first * columns;
      att.queries = pq_.data() + first * static_cast<std::size_t>(qd);
      att.lse = plse_.data() + first * static_cast<std::size_t>(c.q_heads);
      att.q_heads = c.q_heads;
      att.q_len = k;
      // compress at budget B + m leaves B tokens: it evicts len - (B + m) + m.
      // (shared_layers: compress_model once every layer has observed, below;
      // the later layers' inputs came from this layer's full attention.)
      observe_and_compress(l, stored, att, compressor_->budget(l) + compressor_->spec().config.evict_count, l0, library,
                           compress);
    }

    matmul_tokens(pxb_.data(), w.wo, patt_.data(), dim, qd, n);
    for (std::size_t i = 0; i < un * static_cast<std::size_t>(dim); ++i) px_[i] += pxb_[i];

    // SwiGLU feed-forward.
    for (std::int32_t j = 0; j < n; ++j) rmsnorm(row(pxb_, j, dim), row(px_, j, dim), w.ffn_norm, dim, c.rms_eps);
    matmul_tokens(phb_.data(), w.w_gate, pxb_.data(), c.hidden, dim, n);
    matmul_tokens(phb2_.data(), w.w_up, pxb_.data(), c.hidden, dim, n);
    for (std::int32_t j = 0; j < n; ++j) swiglu(row(phb_, j, c.hidden), row(phb2_, j, c.hidden), c.hidden);
    matmul_tokens(pxb_.data(), w.w_down, phb_.data(), dim, c.hidden, n);
    for (std::size_t i = 0; i < un * static_cast<std::size_t>(dim); ++i) px_[i] += pxb_[i];
  }

  if (compressor_ && compressor_->model_wide())
    compress_model(compressor_->budget(0) + compressor_->spec().config.evict_count, library, compress);

  // Logits of the last prompt token only (the others predict nothing here).
  rmsnorm(xb_.data(), row(px_, n - 1, dim), model_.output_norm, dim, c.rms_eps);
  matvec(logits_.data(), model_.output, xb_.data(), c.vocab, dim);
  position_ += n;
  times_.library += library;
  times_.compress += compress;
  times_.total += clock_type::now() - t0;
  times_.steps += n;
  return logits_.data();
}

}  // namespace llama
