// observe_queries (the library recomputes probabilities from Q and the
// cached K) against observe_probabilities fed with probabilities the test
// computes in double from the same Q and K: with the log-sum-exp given in
// natural and in base-2 form, and without it.
//
// Tolerance: a recomputed probability is exp(logit - lse) with the logit an
// fp32 dot product, so its relative error is the logit's absolute error:
// a few ulps of |q.k|. For moderate logits (|logit| < ~5) we require 1e-5
// relative on every score (a sum of such probabilities over steps); for
// peaky attention (|logit| up to ~40) 1e-4. Observed counts and positions
// do not depend on the probabilities and must match exactly.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;

struct query_case {
  float amplitude;      // queries uniform in [-amplitude, amplitude)
  float softmax_scale;  // 0: the library's default 1/sqrt(head_dim)
  double tolerance;     // relative, per score
  // The attention kernel's variants (attention_options), the reference
  // applying them in double: a sliding window, soft-capping, ALiBi.
  std::int32_t window_left = -1;
  float soft_cap = 0.0f;
  bool alibi = false;
};

template <class Policy, class Cache>
void compare_with_probabilities(Cache& cache, std::int32_t group, const query_case& qc, std::int32_t prefill = 9,
                                std::int32_t extra_decode = 0) {
  INFO("amplitude " << qc.amplitude << ", softmax_scale " << qc.softmax_scale << ", group " << group
                     << ", window_left " << qc.window_left << ", soft cap " << qc.soft_cap << ", alibi " << qc.alibi);
  const std::int32_t batch = cache.batch, H = cache.kv_heads, D = cache.head_dim;
  const std::int32_t q_heads = H * group;
  const std::int32_t columns = cache.max_capacity();
  Policy policy;
  policy.config.recent = 2;
  auto view = cache.view();
  state_holder reference(policy, view), natural(policy, view), base2(policy, view), own(policy, view);
  const double scale = qc.softmax_scale > 0.0f ? static_cast<double>(qc.softmax_scale)
                                               : static_cast<double>(1.0f / std::sqrt(static_cast<float>(D)));
  // ALiBi's geometric slopes, 2^(-8 (qh + 1) / q_heads).
  std::vector<float> slopes;
  if (qc.alibi)
    for (std::int32_t qh = 0; qh < q_heads; ++qh)
      slopes.push_back(static_cast<float>(std::exp2(-8.0 * (qh + 1) / q_heads)));
  sh::attention_options<host> options;
  options.softmax_scale = qc.softmax_scale;
  options.window_left = qc.window_left;
  options.logits_soft_cap = qc.soft_cap;
  options.alibi_slopes = {slopes.data(), slopes.size()};

  // Ragged prefill (the shortest sequence sets q_len), then decode steps.
  // (prefill and extra_decode lengthen it: several tiles of the blocked path.)
  std::vector<std::vector<std::int32_t>> calls = {{prefill, 6, 7}, {1, 1, 1}, {1, 1, 1}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}};
  std::vector<std::int32_t> q_lens = {3, 1, 1, 2, 1, 1};
  for (std::int32_t i = 0; i < extra_decode; ++i) {
    calls.push_back({1, 1, 1});
    q_lens.push_back(1);
  }
  std::int64_t compared = 0;
  double worst = 0.0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    INFO("call " << c);
    const std::int32_t q_len = q_lens[c];
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t i = 0; i < calls[c][static_cast<std::size_t>(b)]; ++i) {
        const std::int32_t slot = cache.append(b);  // no compress here: slot = position
        for (std::int32_t h = 0; h < H; ++h)
          for (int kind = 0; kind < 2; ++kind)
            for (std::int32_t d = 0; d < D; ++d) cache.row(kind, b, h, slot)[d] = token_value(kind, b, h, slot, d);
      }
    // Dense Q [batch][q_len][q_heads][D].
    std::vector<float> q(static_cast<std::size_t>(batch * q_len * q_heads * D));
    for (std::size_t i = 0; i < q.size(); ++i)
      q[i] = qc.amplitude * (2.0f * static_cast<float>(unit(hash_of({77, static_cast<std::int64_t>(c),
                                                                      static_cast<std::int64_t>(i)}))) -
                             1.0f);
    std::vector<float> probs(static_cast<std::size_t>(batch * q_heads * q_len * columns), 0.0f);
    std::vector<float> lse_nat(static_cast<std::size_t>(batch * q_heads * q_len));
    std::vector<float> lse_2(lse_nat.size());
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t qh = 0; qh < q_heads; ++qh)
        for (std::int32_t j = 0; j < q_len; ++j) {
          const std::int32_t visible = cache.length(b) - q_len + j + 1;
          const std::int32_t i = visible - 1;  // the query's slot
          const float* qrow = q.data() + ((static_cast<std::size_t>(b) * q_len + j) * q_heads + qh) * D;
          std::vector<double> logit(static_cast<std::size_t>(visible), -INFINITY);  // -inf: outside the window
          double top = -INFINITY;
          for (std::int32_t t = 0; t < visible; ++t) {
            if (qc.window_left >= 0 && i - t > qc.window_left) continue;
            const float* k = cache.row(0, b, qh / group, t);
            double dot = 0.0;
            for (std::int32_t d = 0; d < D; ++d) dot += static_cast<double>(qrow[d]) * static_cast<double>(k[d]);
            double x = dot * scale;
            if (qc.alibi) x += static_cast<double>(slopes[static_cast<std::size_t>(qh)]) * (t - i);
            if (qc.soft_cap > 0.0f) x = qc.soft_cap * std::tanh(x / qc.soft_cap);
            logit[static_cast<std::size_t>(t)] = x;
            top = std::max(top, x);
          }
          double sum = 0.0;
          for (double l : logit) sum += std::exp(l - top);
          const double lse = top + std::log(sum);
          const std::size_t at = (static_cast<std::size_t>(b) * q_heads + qh) * q_len + j;
          lse_nat[at] = static_cast<float>(lse);
          lse_2[at] = static_cast<float>(lse / std::log(2.0));
          for (std::int32_t t = 0; t < visible; ++t)
            probs[at * columns + t] = static_cast<float>(std::exp(logit[static_cast<std::size_t>(t)] - lse));
        }
    view = cache.view();
    const auto kv_before = std::vector<std::vector<float>>{cache.data[0], cache.data[1]};
    sh::host::observe_probabilities(policy, view, reference.state,
                                    sh::probability_view<host>::dense({probs.data(), probs.size()}, q_heads, q_len,
                                                                      columns));
    const auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, q_heads, q_len, D);
    const auto lse_natural =
        sh::lse_view<host>::dense({lse_nat.data(), lse_nat.size()}, q_heads, q_len, sh::lse_base::natural);
    const auto lse_base2 = sh::lse_view<host>::dense({lse_2.data(), lse_2.size()}, q_heads, q_len, sh::lse_base::base2);
    if (options.plain()) {  // the plain overload, as engines without these variants call it
      sh::host::observe_queries(policy, view, natural.state, qv, lse_natural, qc.softmax_scale);
      sh::host::observe_queries(policy, view, base2.state, qv, lse_base2, qc.softmax_scale);
      sh::host::observe_queries(policy, view, own.state, qv, {}, qc.softmax_scale);
    } else {
      sh::host::observe_queries(policy, view, natural.state, qv, lse_natural, options);
      sh::host::observe_queries(policy, view, base2.state, qv, lse_base2, options);
      sh::host::observe_queries(policy, view, own.state, qv, {}, options);
    }
    REQUIRE(same_floats(kv_before[0], cache.data[0]));
    REQUIRE(same_floats(kv_before[1], cache.data[1]));

    for (const state_holder* other : {&natural, &base2, &own}) {
      INFO((other == &natural ? "natural lse" : other == &base2 ? "base-2 lse" : "no lse"));
      for (std::int32_t b = 0; b < batch; ++b) {
        REQUIRE(other->state.step[b] == reference.state.step[b]);
        REQUIRE(other->state.next_position[b] == reference.state.next_position[b]);
        REQUIRE(other->state.tracked[b] == reference.state.tracked[b]);
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t t = 0; t < cache.length(b); ++t) {
            const auto i = reference.at(b, h, t);
            REQUIRE(other->state.positions[i] == reference.state.positions[i]);
            REQUIRE(same_bits(other->state.observed[i], reference.state.observed[i]));
            const double want = reference.state.scores[i];
            const double got = other->state.scores[i];
            // Scores below 1e-30 are fp32 denormals (probabilities of
            // e^-69 and less): only an absolute bound makes sense there.
            const double diff = std::abs(got - want);
            if (want > 1e-30) worst = std::max(worst, diff / want);
            INFO("sequence " << b << " head " << h << " slot " << t << ": " << got << " vs " << want);
            REQUIRE(diff <= qc.tolerance * want + 1e-30);
            ++compared;
          }
      }
    }
  }
  INFO("worst relative difference " << worst);
  CHECK(compared > 500);
  // The comparison must be between different computations, not a copy.
  CHECK(worst > 0.0);
}

const query_case moderate{3.0f, 0.0f, 1e-5};
const query_case custom_scale{3.0f, 0.37f, 1e-5};
const query_case peaky{24.0f, 0.0f, 1e-4};

using mass_mean = sh::eviction_policy<sh::attention_mass, sh::unbounded_history>;
using mass_max = sh::eviction_policy<sh::attention_mass, sh::unbounded_history, sh::recent_window, sh::gqa_max>;
using mass_decay = sh::eviction_policy<sh::attention_mass, sh::exponential_decay>;

// A paged cache of 3 sequences, 2 KV heads of 16: K pages NHD, V pages HND.
paged_cache mixed_paged(std::int32_t page_size, std::int32_t capacity, std::uint64_t seed) {
  return {
      3,   2, 16, page_size, capacity, sh::paged_layout::nhd(page_size, 2, 16), sh::paged_layout::hnd(page_size, 2, 16),
      seed};
}

// One cache's shape and how long compare_with_probabilities drives it.
struct run_shape {
  std::int32_t head_dim_or_page_size, capacity;
  std::uint64_t seed;
  std::int32_t group, prefill, extra_decode;
};

// Every query case on an NHD cache of 2 KV heads (mass_mean) and an HND
// cache of 1 (mass_max: wide groups); then paged_case on a mixed_paged
// cache (mass_decay).
void compare_on_three_caches(std::initializer_list<query_case> cases, run_shape nhd, run_shape hnd, run_shape paged,
                             const query_case& paged_case) {
  for (const auto& qc : cases) {
    auto a = make_contiguous(layout_kind::nhd, 3, 2, nhd.head_dim_or_page_size, nhd.capacity, nhd.seed);
    compare_with_probabilities<mass_mean>(a, nhd.group, qc, nhd.prefill, nhd.extra_decode);
    auto b = make_contiguous(layout_kind::hnd, 3, 1, hnd.head_dim_or_page_size, hnd.capacity, hnd.seed);
    compare_with_probabilities<mass_max>(b, hnd.group, qc, hnd.prefill, hnd.extra_decode);
  }
  auto c = mixed_paged(paged.head_dim_or_page_size, paged.capacity, paged.seed);
  compare_with_probabilities<mass_decay>(c, paged.group, paged_case, paged.prefill, paged.extra_decode);
}

}  // namespace

TEST_CASE("observe_queries matches observe_probabilities: contiguous HND, GQA mean", "[observe_queries]") {
  // Groups of 3 and 7: the heads past the last four padded to four (7: one
  // four, then three padded).
  for (const auto& qc : {moderate, custom_scale, peaky})
    for (std::int32_t group : {1, 3, 4, 7}) {
      auto cache = make_contiguous(layout_kind::hnd, 3, 2, 16, 24, 5);
      compare_with_probabilities<mass_mean>(cache, group, qc);
    }
}

TEST_CASE("observe_queries matches observe_probabilities: GQA max and decay, padded layout", "[observe_queries]") {
  for (const auto& qc : {moderate, peaky}) {
    auto cache = make_contiguous(layout_kind::padded, 3, 2, 16, 24, 6);
    compare_with_probabilities<mass_max>(cache, 2, qc);
    auto cache2 = make_contiguous(layout_kind::nhd, 3, 2, 16, 24, 7);
    compare_with_probabilities<mass_decay>(cache2, 8, qc);
  }
}

TEST_CASE("observe_queries matches observe_probabilities: long sequences, a head_dim tail, wide groups",
          "[observe_queries]") {
  // 60 and more tokens: whole 16-token tiles and a partial one, prefetch
  // of the next tile; head_dim 13: dot products with a tail; group x
  // head_dim beyond the blocked path's stack scratch: the unblocked path.
  compare_on_three_caches({moderate, peaky}, {13, 80, 11, 3, 40, 20}, {520, 70, 12, 2, 30, 30}, {5, 80, 13, 4, 45, 20},
                          moderate);
}

TEST_CASE("observe_queries matches observe_probabilities: paged cache", "[observe_queries][paged]") {
  for (std::int32_t page_size : {1, 3, 16}) {
    INFO("page size " << page_size);
    auto cache = mixed_paged(page_size, 24, 8);
    compare_with_probabilities<mass_mean>(cache, 4, moderate);
  }
}

// Attention that is not plain causal softmax, as the engine's kernel
// computed it (attention_options): the reference applies the window, the
// soft cap and the ALiBi bias in double; the library must match it with
// and without the kernel's LSE.
TEST_CASE("observe_queries with a sliding window, soft-capping and ALiBi matches the reference",
          "[observe_queries][attention_options]") {
  query_case window = moderate, capped = peaky, alibi = moderate, all = peaky;
  window.window_left = 3;
  capped.soft_cap = 5.0f;  // peaky logits (up to ~40) are capped hard
  alibi.alibi = true;
  all.window_left = 6, all.soft_cap = 8.0f, all.alibi = true;
  query_case edge = moderate;
  edge.window_left = 0;  // each query sees only itself
  compare_on_three_caches({window, capped, alibi, all, edge}, {16, 48, 21, 2, 20, 10}, {8, 40, 22, 4, 12, 8},
                          {3, 48, 23, 2, 20, 10}, all);
}

TEST_CASE("attention options out of range are refused by name", "[observe_queries][attention_options][bad_input]") {
  auto cache = make_contiguous(layout_kind::nhd, 1, 1, 4, 8, 3);
  cache.lengths[0] = 2;
  const sh::h2o_policy policy;
  state_holder st(policy, cache.view());
  const std::vector<float> q(8, 0.5f);
  const auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, 2, 1, 4);
  const auto before = st.buffer.snapshot();
  const auto refused = [&](sh::attention_options<host> options, const char* argument) {
    try {
      sh::host::observe_queries(policy, cache.view(), st.state, qv, {}, options);
      FAIL("accepted");
    } catch (const sh::invalid_argument& e) {
      CHECK(e.argument() == argument);
    }
    CHECK(st.buffer.equals(before));
  };
  sh::attention_options<host> o;
  o.window_left = -2;
  refused(o, "options.window_left");
  o = {};
  o.logits_soft_cap = -1.0f;
  refused(o, "options.logits_soft_cap");
  o.logits_soft_cap = INFINITY;
  refused(o, "options.logits_soft_cap");
  o = {};
  const std::vector<float> one_slope{0.5f}, nan_slopes{0.5f, NAN};
  o.alibi_slopes = {one_slope.data(), one_slope.size()};  // 2 query heads
  refused(o, "options.alibi_slopes");
  o.alibi_slopes = {nan_slopes.data(), nan_slopes.size()};
  refused(o, "options.alibi_slopes");
}

TEST_CASE("the blocked path's four-query dot products equal dot_lanes", "[observe_queries]") {
  // dot_lanes_4<Keys> promises dot_lanes' sums in dot_lanes' order: bit for
  // bit where no multiply-add can be contracted to fma (the default x86-64
  // build), a rounding or two apart where the compiler may contract either.
  // The head_dims cover no full chunk of eight, tails, and whole chunks.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (std::int32_t d : {1, 5, 8, 13, 16, 24, 64, 127, 128, 136}) {
    INFO("head_dim " << d);
    std::vector<float> a(static_cast<std::size_t>(4 * d)), b0(static_cast<std::size_t>(d)), b1(b0.size());
    for (auto* v : {&a, &b0, &b1})
      for (float& x : *v) x = value(rng);
    b1[0] = -0.0f;
    const float* keys[2] = {b0.data(), b1.data()};
    float two[8], one[4];
    sh::host::detail::dot_lanes_4<2>(a.data(), keys, d, two);
    sh::host::detail::dot_lanes_4<1>(a.data(), keys + 1, d, one);
    for (std::int32_t n = 0; n < 4; ++n) {
      const float* row = a.data() + static_cast<std::ptrdiff_t>(n) * d;
      const float r0 = sh::host::detail::dot_lanes(row, b0.data(), d);
      const float r1 = sh::host::detail::dot_lanes(row, b1.data(), d);
#if defined(__FMA__) || defined(__aarch64__)
      // Contraction may differ: the magnitude sum bounds a rounding's size.
      double magnitude = 0.0;
      for (std::int32_t x = 0; x < d; ++x) magnitude += std::fabs(double{row[x]}) * 3.0;
      const double tolerance = 4.0 * magnitude * std::numeric_limits<float>::epsilon();
      CHECK(std::fabs(double{two[n]} - r0) <= tolerance);
      CHECK(std::fabs(double{two[4 + n]} - r1) <= tolerance);
      CHECK(std::fabs(double{one[n]} - r1) <= tolerance);
#else
      CHECK(std::bit_cast<std::uint32_t>(two[n]) == std::bit_cast<std::uint32_t>(r0));
      CHECK(std::bit_cast<std::uint32_t>(two[4 + n]) == std::bit_cast<std::uint32_t>(r1));
      CHECK(std::bit_cast<std::uint32_t>(one[n]) == std::bit_cast<std::uint32_t>(r1));
#endif
    }
  }
}
