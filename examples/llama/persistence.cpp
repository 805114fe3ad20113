#include "persistence.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine.hpp"

namespace llama {

std::vector<layer_persistence> measure_persistence(const model& m, const std::vector<eval_text>& texts,
                                                   const persistence_options& o) {
  if (!(o.split > 0.0 && o.split < 1.0)) throw std::invalid_argument("persistence: split must be in (0, 1)");
  if (!(o.min_fraction >= 0.0 && o.min_fraction <= 1.0))
    throw std::invalid_argument("persistence: min_fraction must be in [0, 1]");
  if (o.min_age < 0) throw std::invalid_argument("persistence: min_age must be non-negative");
  if (!(o.alpha > 0.0f)) throw std::invalid_argument("persistence: alpha must be positive");
  if (texts.empty()) throw std::invalid_argument("persistence: no texts");
  const model_config& c = m.config;
  const std::int32_t units = o.per_query_head ? c.q_heads : c.kv_heads;
  const std::int32_t group = o.per_query_head ? 1 : c.q_heads / c.kv_heads;
  const auto L = static_cast<std::size_t>(c.layers);
  std::vector<double> inter(L), late(L), early(L), tokens(L), pivotal(L), fraction(L), heads(L), steps(L);

  std::int32_t longest = 2;
  for (const auto& t : texts) longest = std::max(longest, static_cast<std::int32_t>(t.tokens.size()));
  engine e(m, longest);
  for (const auto& text : texts) {
    const auto T = static_cast<std::int32_t>(text.tokens.size());
    const auto S = static_cast<std::int32_t>(std::floor(o.split * T));
    if (S < 1 || S >= T) throw std::invalid_argument("persistence: text '" + text.name + "' is too short to split");
    // count[layer][unit][i]: steps of each stretch at which token i < S was pivotal.
    std::vector<std::int32_t> count_e(L * static_cast<std::size_t>(units) * static_cast<std::size_t>(S), 0);
    std::vector<std::int32_t> count_l(count_e.size(), 0);
    std::vector<float> a;
    e.on_attention = [&](std::int32_t layer, const float* probs, std::int32_t len) {
      const std::int32_t t = len - 1;  // full cache: slot i holds position i
      const float threshold = o.alpha / static_cast<float>(len);
      a.assign(static_cast<std::size_t>(len), 0.0f);
      for (std::int32_t u = 0; u < units; ++u) {
        for (std::int32_t i = 0; i < len; ++i) {
          float acc = 0.0f;
          for (std::int32_t g = 0; g < group; ++g) {
            const float p = probs[static_cast<std::size_t>(u * group + g) * static_cast<std::size_t>(len) +
                                  static_cast<std::size_t>(i)];
            acc = o.gqa == gqa_kind::max ? std::max(acc, p) : acc + p;
          }
          a[static_cast<std::size_t>(i)] = o.gqa == gqa_kind::max ? acc : acc / static_cast<float>(group);
        }
        std::int32_t n_pivotal = 0;
        auto& count = t < S ? count_e : count_l;
        const std::size_t base = (static_cast<std::size_t>(layer) * static_cast<std::size_t>(units) +
                                  static_cast<std::size_t>(u)) * static_cast<std::size_t>(S);
        for (std::int32_t i = 0; i < len; ++i) {
          if (!(a[static_cast<std::size_t>(i)] > threshold)) continue;
          ++n_pivotal;
          if (i < S && t - i >= o.min_age) ++count[base + static_cast<std::size_t>(i)];
        }
        const auto l = static_cast<std::size_t>(layer);
        pivotal[l] += n_pivotal;
        fraction[l] += static_cast<double>(n_pivotal) / len;
        steps[l] += 1.0;
      }
    };
    e.reset();
    for (std::int32_t t = 0; t < T; ++t) e.step(text.tokens[static_cast<std::size_t>(t)]);
    e.on_attention = nullptr;
    // Steps at which token i counts, and how many of them it must be pivotal at.
    const auto need = [&](std::int32_t stretch_steps) {
      return std::max<std::int32_t>(1, static_cast<std::int32_t>(std::ceil(o.min_fraction * stretch_steps)));
    };
    const auto steps_e = [&](std::int32_t i) { return std::max(0, S - (i + o.min_age)); };
    const auto steps_l = [&](std::int32_t i) { return std::max(0, T - std::max(S, i + o.min_age)); };
    for (std::size_t l = 0; l < L; ++l)
      for (std::int32_t u = 0; u < units; ++u) {
        const std::size_t base = (l * static_cast<std::size_t>(units) + static_cast<std::size_t>(u)) *
                                 static_cast<std::size_t>(S);
        for (std::int32_t i = 0; i < S; ++i) {
          const bool in_e = steps_e(i) > 0 && count_e[base + static_cast<std::size_t>(i)] >= need(steps_e(i));
          const bool in_l = steps_l(i) > 0 && count_l[base + static_cast<std::size_t>(i)] >= need(steps_l(i));
          early[l] += in_e;
          late[l] += in_l;
          inter[l] += in_e && in_l;
        }
        tokens[l] += S;
        heads[l] += 1.0;
      }
  }
  std::vector<layer_persistence> out(L);
  for (std::size_t l = 0; l < L; ++l) {
    layer_persistence& p = out[l];
    p.ratio = late[l] > 0 ? inter[l] / late[l] : 0.0;
    p.chance = tokens[l] > 0 ? early[l] / tokens[l] : 0.0;
    p.early_size = early[l] / heads[l];
    p.late_size = late[l] / heads[l];
    p.overlap = inter[l] / heads[l];
    p.tokens = tokens[l] / heads[l];
    p.step_pivotal = pivotal[l] / steps[l];
    p.step_fraction = fraction[l] / steps[l];
  }
  return out;
}

}  // namespace llama
