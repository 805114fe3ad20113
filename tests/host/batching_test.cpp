// Continuous-batching pieces of the host API, each against a reference the
// test builds from calls the other tests already check: ragged qo_indptr
// against one uniform call per sequence, state rows against the identity
// mapping, padding slots and empty sequences skipped, and every refusal of
// a bad mapping or query table leaving every byte as it was.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;

constexpr std::int32_t B = 4, H = 2, D = 8, C = 32, QH = 4;

// A contiguous NHD cache whose rows are token_value()s, with its own lengths.
struct small_cache {
  std::vector<float> k, v;
  std::vector<std::int32_t> lengths;
  explicit small_cache(std::vector<std::int32_t> lens) : lengths(std::move(lens)) {
    const std::size_t n = std::size_t{B} * C * H * D;
    k.resize(n);
    v.resize(n);
    for (std::int32_t b = 0; b < B; ++b)
      for (std::int32_t t = 0; t < C; ++t)
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t d = 0; d < D; ++d) {
            const std::size_t i = ((static_cast<std::size_t>(b) * C + t) * H + h) * D + d;
            k[i] = token_value(0, b, h, t, d);
            v[i] = token_value(1, b, h, t, d);
          }
  }
  sh::host_kv_view<float> view() {
    return sh::make_kv_view<float, host>({k.data(), k.size()}, {v.data(), v.size()}, {lengths.data(), lengths.size()},
                                         B, H, D, C, sh::named_layout::nhd);
  }
  // Sequence b alone, as a batch of one over the same memory.
  sh::host_kv_view<float> one(std::int32_t b) {
    const std::size_t at = static_cast<std::size_t>(b) * C * H * D;
    return sh::make_kv_view<float, host>({k.data() + at, std::size_t{C} * H * D}, {v.data() + at, std::size_t{C} * H * D},
                                         {lengths.data() + b, 1}, 1, H, D, C, sh::named_layout::nhd);
  }
};

// Queries for `tokens` tokens, token-major [token][QH][D].
std::vector<float> make_queries(std::int32_t tokens, std::uint64_t seed) {
  std::vector<float> q(static_cast<std::size_t>(tokens) * QH * D);
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<float>(unit(hash_of({static_cast<std::int64_t>(seed), static_cast<std::int64_t>(i)}))) - 0.5f;
  return q;
}

template <class Policy>
Policy small_policy() {
  Policy p;
  p.config.recent = 2;
  p.config.window = 5;
  p.config.evict_count = 2;
  return p;
}

}  // namespace

TEMPLATE_TEST_CASE("ragged queries equal one uniform call per sequence, through state rows", "[batching]",
                   sh::scissorhands_policy, sh::h2o_policy) {
  const auto policy = small_policy<TestType>();
  // Sequence 2 holds nothing (skipped); sequence 1 has no query this step
  // (admitted only); the others mix a prefill chunk and a decode token.
  small_cache cache({10, 7, 0, 12});
  const std::vector<std::int32_t> qo_indptr{0, 3, 3, 4, 6};
  const auto q = make_queries(6, 7);
  // The batch maps to scrambled rows of a larger state.
  const std::vector<std::int32_t> rows{5, 0, 3, 2};
  sh::state_shape shape{6, H, C, policy.ring_words()};
  aligned_bytes mem_a(sh::state_bytes(shape)), mem_b(sh::state_bytes(shape));
  auto a = sh::make_state(mem_a.span(), shape);
  auto b_state = sh::make_state(mem_b.span(), shape);
  sh::host::reset_state(a);
  sh::host::reset_state(b_state);
  const auto batched = a.for_batch({rows.data(), rows.size()});

  const bool with_lse = GENERATE(false, true);
  // The normaliser each query head gets, computed by the test: logsumexp of
  // the scaled logits over the visible slots, in base 2 (FlashInfer's).
  std::vector<float> lse(static_cast<std::size_t>(6) * QH);
  for (std::int32_t b = 0; b < B; ++b) {
    const std::int32_t q_len = qo_indptr[b + 1] - qo_indptr[b];
    for (std::int32_t j = 0; j < q_len; ++j)
      for (std::int32_t qh = 0; qh < QH; ++qh) {
        const std::int32_t token = qo_indptr[b] + j;
        const std::int32_t visible = cache.lengths[b] - q_len + j + 1;
        double m = -1e30, sum = 0.0;
        std::vector<double> logits;
        for (std::int32_t t = 0; t < visible; ++t) {
          double dot = 0.0;
          for (std::int32_t d = 0; d < D; ++d)
            dot += double{q[(static_cast<std::size_t>(token) * QH + qh) * D + d]} *
                   cache.k[((static_cast<std::size_t>(b) * C + t) * H + qh / (QH / H)) * D + d];
          logits.push_back(dot / std::sqrt(double{D}));
          m = std::max(m, logits.back());
        }
        for (double l : logits) sum += std::exp(l - m);
        lse[static_cast<std::size_t>(token) * QH + qh] = static_cast<float>((m + std::log(sum)) / std::log(2.0));
      }
  }
  const sh::host_span<const std::int32_t> qo{qo_indptr.data(), qo_indptr.size()};
  const auto lse_view = with_lse ? sh::lse_view<host>::ragged({lse.data(), lse.size()}, qo, QH, sh::lse_base::base2)
                                 : sh::lse_view<host>{};
  sh::host::observe_queries(policy, cache.view(), batched,
                            sh::query_view<float, host>::ragged({q.data(), q.size()}, qo, QH, D), lse_view);

  // Reference: each sequence alone, uniform views, its row given explicitly.
  for (std::int32_t b = 0; b < B; ++b) {
    const std::int32_t q_len = qo_indptr[b + 1] - qo_indptr[b];
    const auto st = b_state.for_batch({rows.data() + b, 1});
    const std::size_t at = static_cast<std::size_t>(qo_indptr[b]) * QH * D;
    const auto qv = sh::query_view<float, host>::dense({q.data() + at, q.size() - at}, QH, q_len, D);
    const std::size_t lat = static_cast<std::size_t>(qo_indptr[b]) * QH;
    const auto lv = with_lse ? sh::lse_view<host>::token_major({lse.data() + lat, lse.size() - lat}, QH, q_len, sh::lse_base::base2)
                             : sh::lse_view<host>{};
    sh::host::observe_queries(policy, cache.one(b), st, qv, lv);
  }
  CHECK(mem_a.snapshot() == mem_b.snapshot());
  CHECK(a.tracked[5] == 10);
  CHECK(a.step[5] == 3);
  CHECK(a.tracked[0] == 7);
  CHECK(a.step[0] == 0);  // no query: admitted, not observed
  CHECK(a.tracked[3] == 0);
  CHECK(a.step[2] == 2);
  CHECK(a.tracked[1] == 0);  // unmapped rows untouched
  CHECK(a.tracked[4] == 0);

  // Compress through the same mapping equals compressing each alone.
  std::vector<std::byte> ws(sh::host::compress_workspace_bytes(cache.view()) + 16);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 15) / 16 * 16);
  std::vector<std::int32_t> new_lengths(B, -1);
  const auto k0 = cache.k, v0 = cache.v;
  sh::host::compress(policy, cache.view(), batched, 9, {aligned, ws.size() - 16}, {{new_lengths.data(), B}, {}});
  CHECK(new_lengths == std::vector<std::int32_t>{7, 7, 0, 7});
  CHECK(cache.lengths == std::vector<std::int32_t>{10, 7, 0, 12});  // the engine's, untouched
  const auto k_batched = cache.k, v_batched = cache.v;
  cache.k = k0;
  cache.v = v0;
  for (std::int32_t b = 0; b < B; ++b) {
    std::int32_t one_length = -1;
    sh::host::compress(policy, cache.one(b), b_state.for_batch({rows.data() + b, 1}), 9,
                       {aligned, ws.size() - 16}, {{&one_length, 1}, {}});
    CHECK(one_length == new_lengths[static_cast<std::size_t>(b)]);
  }
  CHECK(cache.k == k_batched);
  CHECK(cache.v == v_batched);
  CHECK(mem_a.snapshot() == mem_b.snapshot());
}

TEST_CASE("a uniform q_len skips padding slots and empty sequences", "[batching]") {
  const auto policy = small_policy<sh::h2o_policy>();
  small_cache cache({5, 0, 6, 0});
  const std::vector<std::int32_t> rows{1, -1, 0, 2};  // slot 3: an empty sequence with a row
  sh::state_shape shape{3, H, 8, 0};  // capacity 8: enough for what is held, not for C = 32
  aligned_bytes mem(sh::state_bytes(shape)), ref_mem(sh::state_bytes(shape));
  auto st = sh::make_state(mem.span(), shape);
  auto ref = sh::make_state(ref_mem.span(), shape);
  sh::host::reset_state(st);
  sh::host::reset_state(ref);
  // Dense [B][QH][1][C]: uniform over each sequence's tokens, garbage (2.0,
  // not a probability) in the rows of the empty sequences, which must not be read.
  std::vector<float> probs(std::size_t{B} * QH * C, 2.0f);
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t qh = 0; qh < QH; ++qh)
      for (std::int32_t t = 0; t < cache.lengths[b]; ++t)
        probs[(static_cast<std::size_t>(b) * QH + qh) * C + t] = 1.0f / static_cast<float>(cache.lengths[b]);
  sh::host::observe_probabilities(policy, cache.view(), st.for_batch({rows.data(), rows.size()}),
                                  sh::probability_view<host>::dense({probs.data(), probs.size()}, QH, 1, C));
  for (std::int32_t b : {0, 2}) {
    const std::size_t at = static_cast<std::size_t>(b) * QH * C;
    sh::host::observe_probabilities(policy, cache.one(b), ref.for_batch({rows.data() + b, 1}),
                                    sh::probability_view<host>::dense({probs.data() + at, probs.size() - at}, QH, 1, C));
  }
  CHECK(mem.snapshot() == ref_mem.snapshot());
  CHECK(st.tracked[2] == 0);
  CHECK(st.step[2] == 0);
}

TEST_CASE("bad state rows and query tables are refused and change nothing", "[batching][bad_input]") {
  const auto policy = small_policy<sh::h2o_policy>();
  small_cache cache({4, 3, 0, 5});
  sh::state_shape shape{5, H, C, 0};
  aligned_bytes mem(sh::state_bytes(shape));
  auto st = sh::make_state(mem.span(), shape);
  sh::host::reset_state(st);
  const auto q = make_queries(16, 3);
  std::vector<float> lse(16 * QH, 0.5f);
  std::vector<std::int32_t> rows{0, 1, -1, 2};
  std::vector<std::int32_t> qo{0, 1, 2, 2, 3};
  std::vector<std::int32_t> new_lengths(B, -1);
  std::vector<std::byte> ws(sh::host::compress_workspace_bytes(cache.view()) + 16);
  auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 15) / 16 * 16);
  // One good call first, so the state holds real bytes.
  const auto observe = [&] {
    const sh::host_span<const std::int32_t> qs{qo.data(), qo.size()};
    // The lse is made up, not the queries' (its sums are not checked).
    auto made_up = sh::lse_view<host>::ragged({lse.data(), lse.size()}, qs, QH, sh::lse_base::base2);
    made_up.check = sh::lse_check::none;
    sh::host::observe_queries(policy, cache.view(), st.for_batch({rows.data(), rows.size()}),
                              sh::query_view<float, host>::ragged({q.data(), q.size()}, qs, QH, D), made_up);
  };
  const auto compress = [&] {
    sh::host::compress(policy, cache.view(), st.for_batch({rows.data(), rows.size()}), 4,
                       {aligned, ws.size() - 16}, {{new_lengths.data(), B}, {}});
  };
  observe();
  const auto state0 = mem.snapshot();
  const auto k0 = cache.k, v0 = cache.v;
  const auto new0 = new_lengths;
  const auto unchanged = [&] {
    return mem.snapshot() == state0 && cache.k == k0 && cache.v == v0 && new_lengths == new0;
  };

  SECTION("a row used twice") {
    rows = {0, 2, -1, 2};
    CHECK(refused_argument(observe) == "state.state_rows");
    CHECK(refused_argument(compress) == "state.state_rows");
  }
  SECTION("a row out of range") {
    rows = {0, 5, -1, 2};
    CHECK(refused_argument(observe) == "state.state_rows");
    rows = {0, -2, -1, 2};
    CHECK(refused_argument(compress) == "state.state_rows");
  }
  SECTION("a padding slot (-1) holding tokens") {
    rows = {0, -1, 1, 2};
    CHECK(refused_argument(observe) == "state.state_rows");
  }
  SECTION("state_rows of another size") {
    CHECK(refused_argument([&] {
            sh::host::admit(policy, cache.view(), st.for_batch({rows.data(), 3}));
          }) == "state.state_rows");
  }
  SECTION("without rows the state must hold the whole batch") {
    sh::state_shape small{3, H, C, 0};
    aligned_bytes m2(sh::state_bytes(small));
    auto s2 = sh::make_state(m2.span(), small);
    sh::host::reset_state(s2);
    CHECK(refused_argument([&] { sh::host::admit(policy, cache.view(), s2); }) == "state.shape.rows");
  }
  SECTION("qo_indptr decreasing, too short, or giving more queries than tokens") {
    qo = {0, 2, 1, 1, 3};
    CHECK(refused_argument(observe) == "qo_indptr");
    qo = {0, 1, 2, 2};
    CHECK(refused_argument(observe) == "qo_indptr");
    qo = {0, 5, 6, 6, 7};  // 5 queries for 4 tokens
    CHECK(refused_argument(observe) == "qo_indptr");
    qo = {-1, 0, 1, 1, 2};
    CHECK(refused_argument(observe) == "qo_indptr");
  }
  SECTION("queries reaching past their buffer") {
    qo = {12, 13, 14, 14, 17};  // legal counts, but tokens 12..16 of a 16-token buffer
    CHECK(refused_argument(observe) == "queries.data");
  }
  SECTION("null spans with a size (a caller's bug, not 'absent')") {
    CHECK(refused_argument([&] {
            sh::host::admit(policy, cache.view(), st.for_batch({nullptr, rows.size()}));
          }) == "state.state_rows");
    CHECK(refused_argument([&] {
            sh::host::observe_queries(policy, cache.view(), st.for_batch({rows.data(), rows.size()}),
                                      sh::query_view<float, host>::ragged({q.data(), q.size()}, {nullptr, 5}, QH, D));
          }) == "qo_indptr");
  }
  SECTION("ragged lse over another qo_indptr") {
    const std::vector<std::int32_t> other = qo;
    CHECK(refused_argument([&] {
            sh::host::observe_queries(
                policy, cache.view(), st.for_batch({rows.data(), rows.size()}),
                sh::query_view<float, host>::ragged({q.data(), q.size()}, {qo.data(), qo.size()}, QH, D),
                sh::lse_view<host>::ragged({lse.data(), lse.size()}, {other.data(), other.size()}, QH, sh::lse_base::base2));
          }) == "lse.qo_indptr");
  }
  CHECK(unchanged());
}
