// Quantized caches (quantized_kv_view.hpp) against an independent
// dequantize-then-evict oracle: the same tokens held twice, once as int8 or
// int4 codes with their group parameters, once as the floats those codes
// dequantize to, driven through the same decode steps (observe from
// queries, compress). Eviction must choose the same tokens (the scores see
// the same floats: the state's bytes are equal), and every kept packed row
// and parameter row must be bit-identical to what was appended for that
// token. Contiguous and paged, NHD and HND, int8 and int4.
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <scissorhands/host/threads.hpp>

#include "support.hpp"

namespace {

using namespace sh_test;

struct shape {
  std::int32_t batch = 3, kv_heads = 2, q_heads = 4, head_dim = 16, capacity = 40, page_size = 4;
};

// A token's stored row: its codes and parameters (the oracle's record).
struct stored_row {
  std::vector<std::uint8_t> codes;
  std::vector<float> params;
};

// One cache kind (contiguous or paged) held twice: quantized and as floats.
// The float twin has the same sequence table (the paged one the same pages).
struct twin_cache {
  shape s;
  bool paged;
  bool hnd;
  sh::kv_quantization q;
  std::int32_t code_bytes, params_row;
  std::int32_t max_pages, num_pages;
  std::vector<std::uint8_t> codes[2];
  std::vector<float> params[2];
  std::vector<float> floats[2];
  std::vector<std::int32_t> lengths;
  std::vector<std::vector<std::int32_t>> pages;  // per sequence, fixed, scrambled ids
  std::vector<std::int32_t> indptr, indices, last_page_len;
  std::map<std::tuple<int, std::int32_t, std::int32_t, std::int32_t>, stored_row> appended;  // (kind, b, h, position)
  std::vector<std::int32_t> next_position;
  std::int32_t layer = 0;  // mixed into the values: layers hold other tokens

  twin_cache(shape s_, bool paged_, bool hnd_, sh::kv_quantization q_)
      : s(s_), paged(paged_), hnd(hnd_), q(q_), code_bytes(q_.code_row_bytes(s_.head_dim)),
        params_row(q_.params_per_row(s_.head_dim)), max_pages((s_.capacity + s_.page_size - 1) / s_.page_size),
        num_pages(s_.batch * max_pages + 3), lengths(static_cast<std::size_t>(s_.batch), 0),
        pages(static_cast<std::size_t>(s_.batch)), next_position(static_cast<std::size_t>(s_.batch), 0) {
    const std::int64_t rows = paged ? std::int64_t{num_pages} * s.page_size * s.kv_heads
                                    : std::int64_t{s.batch} * s.capacity * s.kv_heads;
    for (int kind = 0; kind < 2; ++kind) {
      codes[kind].resize(static_cast<std::size_t>(rows * code_bytes));
      params[kind].resize(static_cast<std::size_t>(rows * params_row));
      floats[kind].resize(static_cast<std::size_t>(rows * s.head_dim));
      for (std::size_t i = 0; i < codes[kind].size(); ++i)
        codes[kind][i] = static_cast<std::uint8_t>(hash_of({7, kind, static_cast<std::int64_t>(i)}));
      for (std::size_t i = 0; i < params[kind].size(); ++i) params[kind][i] = background_value(8, kind, i);
      for (std::size_t i = 0; i < floats[kind].size(); ++i) floats[kind][i] = background_value(9, kind, i);
    }
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
    for (std::int32_t i = 0; i < num_pages; ++i) ids[static_cast<std::size_t>(i)] = i;
    scramble(ids, 11);
    for (std::int32_t b = 0; b < s.batch; ++b)
      pages[static_cast<std::size_t>(b)].assign(ids.begin() + b * max_pages, ids.begin() + (b + 1) * max_pages);
    rebuild_table();
  }

  void rebuild_table() {
    indptr.assign(1, 0);
    indices.clear();
    last_page_len.clear();
    for (std::int32_t b = 0; b < s.batch; ++b) {
      const std::int32_t len = lengths[static_cast<std::size_t>(b)];
      const std::int32_t used = (len + s.page_size - 1) / s.page_size;
      for (std::int32_t p = 0; p < used; ++p) indices.push_back(pages[static_cast<std::size_t>(b)][static_cast<std::size_t>(p)]);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last_page_len.push_back(used == 0 ? 0 : len - (used - 1) * s.page_size);
    }
    indices.push_back(-1);  // never an empty span
  }

  sh::host_quantized_kv_view quantized_contiguous() {
    return sh::make_quantized_kv_view<host>({codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()},
                                            {params[0].data(), params[0].size()}, {params[1].data(), params[1].size()},
                                            {lengths.data(), lengths.size()}, s.batch, s.kv_heads, s.head_dim,
                                            s.capacity, hnd ? sh::named_layout::hnd : sh::named_layout::nhd, q);
  }
  sh::host_kv_view<float> float_contiguous() {
    return sh::make_kv_view<float, host>({floats[0].data(), floats[0].size()}, {floats[1].data(), floats[1].size()},
                                         {lengths.data(), lengths.size()}, s.batch, s.kv_heads, s.head_dim, s.capacity,
                                         hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
  }
  sh::host_quantized_paged_kv_view quantized_paged() {
    return sh::make_quantized_paged_kv_view<host>(
        {codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()}, {params[0].data(), params[0].size()},
        {params[1].data(), params[1].size()}, {indptr.data(), indptr.size()}, {indices.data(), indices.size() - 1},
        {last_page_len.data(), last_page_len.size()}, s.batch, s.kv_heads, s.head_dim, s.page_size, num_pages,
        max_pages, q, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
  }
  sh::host_paged_kv_view<float> float_paged() {
    return sh::make_paged_kv_view<float, host>(
        {floats[0].data(), floats[0].size()}, {floats[1].data(), floats[1].size()}, {indptr.data(), indptr.size()},
        {indices.data(), indices.size() - 1}, {last_page_len.data(), last_page_len.size()}, s.batch, s.kv_heads,
        s.head_dim, s.page_size, num_pages, max_pages, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
  }

  // Calls f(quantized view, float view) on the views of this twin's kind.
  template <class F>
  void on_views(F&& f) {
    if (paged)
      f(quantized_paged(), float_paged());
    else
      f(quantized_contiguous(), float_contiguous());
  }
  // Grows sequence b by one token (the table too) and appends it to both twins.
  void append_token(std::int32_t b) {
    ++lengths[static_cast<std::size_t>(b)];
    rebuild_table();
    on_views([&](auto qv, auto fv) { append_into(qv, fv, b); });
    ++next_position[static_cast<std::size_t>(b)];
  }

  // Appends one token to sequence b: quantized with the reference
  // quantizer into the quantized twin, its dequantized values into the float twin.
  template <class QView, class FView>
  void append_into(const QView& qv, const FView& fv, std::int32_t b) {
    const std::int32_t t = lengths[static_cast<std::size_t>(b)] - 1;  // the caller grew the length and the table
    const std::int32_t position = next_position[static_cast<std::size_t>(b)];
    for (std::int32_t h = 0; h < s.kv_heads; ++h)
      for (int kind = 0; kind < 2; ++kind) {
        std::vector<float> x(static_cast<std::size_t>(s.head_dim));
        for (std::int32_t d = 0; d < s.head_dim; ++d)
          x[static_cast<std::size_t>(d)] =
              token_value(kind, b, h + 16 * layer, position, d) * (1.0f + static_cast<float>(d % 5));
        std::uint8_t* c = kind == 0 ? qv.k_row(b, h, t) : qv.v_row(b, h, t);
        float* p = kind == 0 ? qv.k_params_row(b, h, t) : qv.v_params_row(b, h, t);
        sh::quantize_row(x.data(), s.head_dim, q, c, p);
        float* f = kind == 0 ? fv.k_row(b, h, t) : fv.v_row(b, h, t);
        sh::dequantize_row(c, p, s.head_dim, q, f);
        appended[{kind, b, h, position}] = {{c, c + code_bytes}, {p, p + params_row}};
      }
  }
};

// Every held row of a twin: the packed row and parameters appended for its
// token (found by the position the state holds for the slot), and the
// float twin's row their dequantized values.
template <class QView, class FView>
void check_rows(const twin_cache& c, const QView& qview, const FView& fview, const sh::eviction_state<host>& st,
                std::int32_t capacity) {
  std::vector<float> deq(static_cast<std::size_t>(c.s.head_dim));
  for (std::int32_t b = 0; b < c.s.batch; ++b)
    for (std::int32_t h = 0; h < c.s.kv_heads; ++h)
      for (std::int32_t t = 0; t < c.lengths[static_cast<std::size_t>(b)]; ++t) {
        const std::int32_t position =
            st.positions[(std::int64_t{st.row(b)} * c.s.kv_heads + h) * capacity + t];
        for (int kind = 0; kind < 2; ++kind) {
          const stored_row& want = c.appended.at({kind, b, h, position});
          const std::uint8_t* codes = kind == 0 ? qview.k_row(b, h, t) : qview.v_row(b, h, t);
          const float* params = kind == 0 ? qview.k_params_row(b, h, t) : qview.v_params_row(b, h, t);
          REQUIRE(std::memcmp(codes, want.codes.data(), want.codes.size()) == 0);
          REQUIRE(std::memcmp(params, want.params.data(), want.params.size() * sizeof(float)) == 0);
          sh::dequantize_row(codes, params, c.s.head_dim, c.q, deq.data());
          const float* f = kind == 0 ? fview.k_row(b, h, t) : fview.v_row(b, h, t);
          REQUIRE(std::memcmp(f, deq.data(), deq.size() * sizeof(float)) == 0);
        }
      }
}

// The queries of one step: q_len per sequence, [batch][q_len][q_heads][head_dim].
std::vector<float> queries_of(const shape& s, std::int32_t q_len, std::int32_t step) {
  std::vector<float> q(static_cast<std::size_t>(s.batch * q_len * s.q_heads * s.head_dim));
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = 3.0f * static_cast<float>(unit(hash_of({21, step, static_cast<std::int64_t>(i)})) - 0.5);
  return q;
}

template <class Policy>
void run_twins(const Policy& policy, bool paged, bool hnd, sh::kv_quantization q, std::int32_t threads) {
  const shape s;
  twin_cache c(s, paged, hnd, q);
  const std::int32_t budget = 20;
  // State sized for the larger of the two views' capacities (they are equal).
  const auto make_states = [&](auto qv, auto fv) {
    return std::make_pair(std::make_unique<state_holder>(policy, qv), std::make_unique<state_holder>(policy, fv));
  };
  auto [qs, fs] = paged ? make_states(c.quantized_paged(), c.float_paged())
                        : make_states(c.quantized_contiguous(), c.float_contiguous());
  REQUIRE(qs->buffer.size() == fs->buffer.size());
  const std::array<std::int32_t, 3> prefill{9, 17, 24};
  for (std::int32_t step = 0; step < 40; ++step) {
    // Prefill at step 0, one token per sequence after (sequence 1 skips every third step).
    for (std::int32_t b = 0; b < s.batch; ++b) {
      const std::int32_t add = step == 0 ? prefill[static_cast<std::size_t>(b)] : (b == 1 && step % 3 == 0 ? 0 : 1);
      for (std::int32_t i = 0; i < add; ++i) c.append_token(b);
    }
    const std::int32_t q_len = step == 0 ? 5 : 1;
    std::vector<std::int32_t> qo{0};
    for (std::int32_t b = 0; b < s.batch; ++b)
      qo.push_back(qo.back() + (step > 0 && b == 1 && step % 3 == 0 ? 0 : q_len));
    const std::vector<float> qdata = queries_of(s, q_len, step);
    const auto qv = sh::query_view<float, host>::ragged({qdata.data(), qdata.size()}, {qo.data(), qo.size()},
                                                        s.q_heads, s.head_dim);
    std::vector<std::int32_t> new_q(static_cast<std::size_t>(s.batch), -7), new_f(static_cast<std::size_t>(s.batch), -7);
    std::vector<std::int32_t> freed_q(static_cast<std::size_t>(s.batch), -7), freed_f(static_cast<std::size_t>(s.batch), -7);
    const auto step_on = [&](auto qview, auto fview) {
      sh::host::observe_queries(policy, qview, qs->state, qv);
      sh::host::observe_queries(policy, fview, fs->state, qv);
      const std::size_t wq = sh::host::compress_workspace_bytes(qview, qs->shape, threads);
      const std::size_t wf = sh::host::compress_workspace_bytes(fview, fs->shape, threads);
      aligned_bytes work_q(wq), work_f(wf);
      const auto plan = sh::host::plan_compress(policy, qview, qs->state, budget, work_q.span(),
                                                {{new_q.data(), new_q.size()}, {freed_q.data(), freed_q.size()}},
                                                threads);
      sh::host::run_on_threads(plan, threads);
      sh::host::compress(policy, fview, fs->state, budget, work_f.span(),
                         {{new_f.data(), new_f.size()}, {freed_f.data(), freed_f.size()}});
    };
    c.on_views(step_on);
    INFO("step " << step);
    REQUIRE(new_q == new_f);
    REQUIRE(freed_q == freed_f);
    REQUIRE(std::memcmp(qs->buffer.data(), fs->buffer.data(), qs->buffer.size()) == 0);
    c.lengths = new_q;
    c.rebuild_table();
    c.on_views([&](auto qv, auto fv) { check_rows(c, qv, fv, qs->state, qs->shape.capacity); });
  }
  // The run evicted: the budget bound every sequence.
  for (std::int32_t b = 0; b < s.batch; ++b) CHECK(c.lengths[static_cast<std::size_t>(b)] <= budget);
}

// shared_layers: select once over two layers, compact each layer; the
// quantized twin and the float twin must select the same slots.
template <class Policy>
void run_twins_layers(const Policy& policy, bool paged, bool hnd, sh::kv_quantization q) {
  const shape s;
  const std::int32_t budget = 20, L = 2;
  std::vector<twin_cache> c;
  for (std::int32_t l = 0; l < L; ++l) {
    c.emplace_back(s, paged, hnd, q);
    c.back().layer = l;
  }
  const sh::state_shape shape{s.batch, s.kv_heads, s.capacity, policy.ring_words()};
  aligned_bytes mq(sh::model_state_bytes(shape, L)), mf(sh::model_state_bytes(shape, L));
  const auto model_q = sh::make_model_state(mq.span(), shape, L), model_f = sh::make_model_state(mf.span(), shape, L);
  sh::host::reset_state(model_q);
  sh::host::reset_state(model_f);
  const std::int32_t stride = sh::max_evictions(shape.capacity, budget, policy.config.evict_count);
  struct selection_store {
    std::vector<std::int32_t> counts, slots, new_lengths, freed;
  } sq, sf;
  for (auto* st : {&sq, &sf}) {
    st->counts.resize(static_cast<std::size_t>(s.batch));
    st->slots.resize(static_cast<std::size_t>(s.batch * stride));
    st->new_lengths.resize(static_cast<std::size_t>(s.batch));
    st->freed.resize(static_cast<std::size_t>(s.batch));
  }
  const auto selection = [&](selection_store& st) {
    return sh::eviction_selection<host>{stride, {st.counts.data(), st.counts.size()},
                                        {st.slots.data(), st.slots.size()}, {},
                                        {{st.new_lengths.data(), st.new_lengths.size()},
                                         {st.freed.data(), st.freed.size()}}};
  };
  for (std::int32_t step = 0; step < 30; ++step) {
    const std::int32_t add = step == 0 ? 22 : 1;
    for (auto& layer : c)
      for (std::int32_t b = 0; b < s.batch; ++b)
        for (std::int32_t i = 0; i < add; ++i) layer.append_token(b);
    const std::vector<float> qdata = queries_of(s, 1, step);
    const auto qv = sh::query_view<float, host>::dense({qdata.data(), qdata.size()}, s.q_heads, 1, s.head_dim);
    const auto run = [&](auto view_of_q, auto view_of_f) {
      for (std::int32_t l = 0; l < L; ++l) {
        sh::host::observe_queries(policy, view_of_q(l), model_q.layer(l), qv);
        sh::host::observe_queries(policy, view_of_f(l), model_f.layer(l), qv);
      }
      aligned_bytes wq(sh::host::select_workspace_bytes(view_of_q(0), shape)),
          wf(sh::host::select_workspace_bytes(view_of_f(0), shape));
      sh::host::select(policy, view_of_q(0), model_q, budget, wq.span(), selection(sq));
      sh::host::select(policy, view_of_f(0), model_f, budget, wf.span(), selection(sf));
      for (std::int32_t l = 0; l < L; ++l) {
        aligned_bytes cq(sh::host::compact_workspace_bytes(view_of_q(l)) + 8),
            cf(sh::host::compact_workspace_bytes(view_of_f(l)) + 8);
        sh::host::compact(policy, view_of_q(l), model_q.layer(l), selection(sq), cq.span());
        sh::host::compact(policy, view_of_f(l), model_f.layer(l), selection(sf), cf.span());
      }
    };
    const auto at = [&](std::int32_t l) -> twin_cache& { return c[static_cast<std::size_t>(l)]; };
    if (paged)
      run([&](std::int32_t l) { return at(l).quantized_paged(); }, [&](std::int32_t l) { return at(l).float_paged(); });
    else
      run([&](std::int32_t l) { return at(l).quantized_contiguous(); },
          [&](std::int32_t l) { return at(l).float_contiguous(); });
    INFO("step " << step);
    REQUIRE(sq.counts == sf.counts);
    REQUIRE(sq.slots == sf.slots);
    REQUIRE(sq.new_lengths == sf.new_lengths);
    REQUIRE(mq.snapshot() == mf.snapshot());
    for (std::int32_t l = 0; l < L; ++l) {
      at(l).lengths = sq.new_lengths;
      at(l).rebuild_table();
      at(l).on_views([&](auto qv, auto fv) { check_rows(at(l), qv, fv, model_q.layer(l), shape.capacity); });
    }
  }
  for (std::int32_t b = 0; b < s.batch; ++b) CHECK(c[0].lengths[static_cast<std::size_t>(b)] <= budget);
}

template <class Policy>
void run_all_layouts(const Policy& policy) {
  for (const auto kind : {sh::quant_kind::int8, sh::quant_kind::int4})
    for (const std::int32_t group : {8, 16})
      for (const bool paged : {false, true})
        for (const bool hnd : {false, true}) {
          DYNAMIC_SECTION(sh::name_of(kind) << " group " << group << (paged ? " paged" : " contiguous")
                                            << (hnd ? " HND" : " NHD")) {
            run_twins(policy, paged, hnd, {kind, group}, 1);
          }
        }
}

}  // namespace

TEST_CASE("quantize_row and dequantize_row: round trip within half a step, exact codes", "[quantized]") {
  for (const auto kind : {sh::quant_kind::int8, sh::quant_kind::int4}) {
    const sh::kv_quantization q{kind, 8};
    const std::int32_t d = 32;
    std::vector<float> x(d), back(d), params(static_cast<std::size_t>(q.params_per_row(d)));
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(q.code_row_bytes(d)));
    for (std::int32_t i = 0; i < d; ++i) x[static_cast<std::size_t>(i)] = token_value(0, 1, 2, 3, i) * static_cast<float>(1 + i % 7);
    x[3] = 0.0f;
    sh::quantize_row(x.data(), d, q, codes.data(), params.data());
    sh::dequantize_row(codes.data(), params.data(), d, q, back.data());
    for (std::int32_t i = 0; i < d; ++i) {
      const float scale = params[static_cast<std::size_t>(q.params_per_group() * (i / q.group_size))];
      INFO(sh::name_of(kind) << " element " << i);
      CHECK(std::fabs(back[static_cast<std::size_t>(i)] - x[static_cast<std::size_t>(i)]) <= 0.5f * scale * 1.0001f);
      CHECK(same_bits(back[static_cast<std::size_t>(i)],
                      sh::dequantize_element(codes.data(), params.data(), i, q)));
    }
  }
  // int8: symmetric, zero is exact; int4: the group minimum is exact.
  const sh::kv_quantization q8{sh::quant_kind::int8, 4};
  const float x[4] = {-2.0f, 0.0f, 1.0f, 2.0f};
  std::uint8_t c[4];
  float p[1];
  sh::quantize_row(x, 4, q8, c, p);
  CHECK(p[0] == 2.0f / 127.0f);
  CHECK(static_cast<std::int8_t>(c[0]) == -127);
  CHECK(c[1] == 0);
  const sh::kv_quantization q4{sh::quant_kind::int4, 4};
  std::uint8_t c4[2];
  float p4[2];
  sh::quantize_row(x, 4, q4, c4, p4);
  CHECK(p4[0] == 4.0f / 15.0f);
  CHECK(p4[1] == 2.0f / (4.0f / 15.0f));  // the zero point: the code of 0.0
  CHECK((c4[0] & 0x0F) == 0);
  CHECK((c4[1] >> 4) == 15);
  // A group of one repeated value is exact in both formats.
  const float same[4] = {-3.25f, -3.25f, -3.25f, -3.25f};
  float back[4];
  for (const auto q : {q8, q4}) {
    float params[2];
    std::uint8_t codes[4];
    sh::quantize_row(same, 4, q, codes, params);
    sh::dequantize_row(codes, params, 4, q, back);
    for (float b : back) CHECK(std::fabs(b - -3.25f) <= (q.kind == sh::quant_kind::int8 ? 3.25f / 254.0f : 0.0f));
  }
}

TEST_CASE("quantized cache: default policy evicts what the dequantized oracle evicts", "[quantized]") {
  run_all_layouts(sh::scissorhands_policy{});
}

TEST_CASE("quantized cache: H2O and key norm (a static scorer on dequantized K)", "[quantized]") {
  SECTION("h2o") { run_all_layouts(sh::h2o_policy{}); }
  SECTION("key_norm") { run_all_layouts(sh::key_norm_policy{}); }
}

TEST_CASE("quantized cache: preserve_order compaction and a 2-thread plan", "[quantized][threads]") {
  sh::scissorhands_policy policy;
  policy.config.compaction_mode = sh::compaction::preserve_order;
  policy.config.evict_count = 3;
  for (const bool paged : {false, true})
    DYNAMIC_SECTION((paged ? "paged" : "contiguous")) {
      run_twins(policy, paged, true, {sh::quant_kind::int4, 8}, 2);
      run_twins(policy, paged, false, {sh::quant_kind::int8, 16}, 2);
    }
}

// ---------------------------------------------------------------------------
// Bad input (docs/errors.md, "Quantized caches"): each refused call names
// its argument, and every byte the caller owns is what it was.

namespace {

struct bad_fixture {
  static constexpr std::int32_t batch = 2, kv_heads = 2, q_heads = 2, head_dim = 16, capacity = 12;
  sh::kv_quantization q{sh::quant_kind::int8, 8};
  std::vector<std::uint8_t> codes[2];
  std::vector<float> params[2];
  std::vector<std::int32_t> lengths{8, 5};
  std::vector<float> queries;
  std::vector<std::int32_t> new_lengths{-7, -7};
  sh::scissorhands_policy policy;
  std::unique_ptr<state_holder> state;

  bad_fixture() {
    const std::size_t rows = std::size_t{batch} * capacity * kv_heads;
    for (int kind = 0; kind < 2; ++kind) {
      codes[kind].assign(rows * 16, 0);
      params[kind].assign(rows * 2, 0.0f);
    }
    const auto v = view();
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < kv_heads; ++h)
        for (std::int32_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t) {
          float x[head_dim];
          for (std::int32_t d = 0; d < head_dim; ++d) x[d] = token_value(0, b, h, t, d);
          sh::quantize_row(x, head_dim, q, v.k_row(b, h, t), v.k_params_row(b, h, t));
          sh::quantize_row(x, head_dim, q, v.v_row(b, h, t), v.v_params_row(b, h, t));
        }
    queries.assign(std::size_t{batch} * q_heads * head_dim, 0.25f);
    state = std::make_unique<state_holder>(policy, v);
    sh::host::observe_queries(policy, v, state->state, query());  // a real, observed state
  }
  sh::host_quantized_kv_view view() {
    return sh::make_quantized_kv_view<host>({codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()},
                                            {params[0].data(), params[0].size()}, {params[1].data(), params[1].size()},
                                            {lengths.data(), lengths.size()}, batch, kv_heads, head_dim, capacity,
                                            sh::named_layout::nhd, q);
  }
  sh::query_view<float, host> query() const {
    return sh::query_view<float, host>::dense({queries.data(), queries.size()}, q_heads, 1, head_dim);
  }
  std::vector<std::byte> snapshot() const {
    std::vector<std::byte> out;
    const auto add = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    };
    for (int kind = 0; kind < 2; ++kind) {
      add(codes[kind].data(), codes[kind].size());
      add(params[kind].data(), params[kind].size() * sizeof(float));
    }
    add(lengths.data(), lengths.size() * sizeof(std::int32_t));
    add(new_lengths.data(), new_lengths.size() * sizeof(std::int32_t));
    add(state->buffer.data(), state->buffer.size());
    return out;
  }
  // Every entry point that takes the cache, on `v`: each must refuse it
  // naming `argument`, and leave every byte alone.
  void expect_refused(const sh::host_quantized_kv_view& v, const std::string& argument, bool observe_only = false) {
    const auto before = snapshot();
    const auto check = [&](auto&& call, const char* fn) {
      try {
        call();
        FAIL(fn << " accepted a bad " << argument);
      } catch (const sh::invalid_argument& e) {
        CHECK(e.function() == fn);
        CHECK(e.argument() == argument);
        CHECK(std::string(e.what()).find(argument) != std::string::npos);
      }
      CHECK(snapshot() == before);
    };
    check([&] { sh::host::observe_queries(policy, v, state->state, query()); }, "host::observe_queries");
    if (observe_only) return;
    std::vector<std::uint64_t> work(4096);
    check(
        [&] {
          sh::host::compress(policy, v, state->state, 11, {reinterpret_cast<std::byte*>(work.data()), work.size() * 8},
                             {{new_lengths.data(), new_lengths.size()}, {}});
        },
        "host::compress");
    check([&] { sh::host::admit(policy, v, state->state); }, "host::admit");
  }
};

}  // namespace

TEST_CASE("quantized bad input: group size zero, not dividing head_dim, odd for int4, or an unknown kind",
          "[quantized][bad_input]") {
  bad_fixture f;
  auto v = f.view();
  v.quantization.group_size = 0;
  f.expect_refused(v, "cache.quantization.group_size");
  v.quantization.group_size = 6;
  f.expect_refused(v, "cache.quantization.group_size");
  // int4 over a group of 1: elements 2i and 2i+1 would need two groups' parameters within one byte.
  v = f.view();
  v.quantization = {sh::quant_kind::int4, 1};
  f.expect_refused(v, "cache.quantization.group_size");
  v.quantization = {static_cast<sh::quant_kind>(5), 8};
  f.expect_refused(v, "cache.quantization.kind");
}

TEST_CASE("quantized bad input: code rows of the wrong width, misaligned, or a buffer too short",
          "[quantized][bad_input]") {
  bad_fixture f;
  // Layouts built for int4 rows (8 bytes) under an int8 format (16 bytes): rows overlap.
  auto v = f.view();
  v.k_layout = sh::kv_layout::nhd(f.capacity, f.kv_heads, 8);
  f.expect_refused(v, "cache.k_layout");
  v = f.view();
  v.k = {f.codes[0].data(), f.codes[0].size() - 1};
  f.expect_refused(v, "cache.k");
  v = f.view();
  v.v = {nullptr, 0};
  f.expect_refused(v, "cache.v");
}

TEST_CASE("quantized bad input: parameter arrays null, too short, overlapping or aliasing", "[quantized][bad_input]") {
  bad_fixture f;
  auto v = f.view();
  v.k_params = {f.params[0].data(), f.params[0].size() - 1};
  f.expect_refused(v, "cache.k_params");
  v = f.view();
  v.v_params = {nullptr, 0};
  f.expect_refused(v, "cache.v_params");
  v = f.view();
  v.k_params_layout.token_stride = 1;  // rows of 2 floats one float apart
  f.expect_refused(v, "cache.k_params_layout");
  v = f.view();
  v.v_params_layout.head_stride = -2;
  f.expect_refused(v, "cache.v_params_layout");
  v = f.view();
  v.v_params = v.k_params;
  f.expect_refused(v, "cache.v_params");
  v = f.view();
  v.head_dim = 1024;
  v.quantization.group_size = 1024;
  f.expect_refused(v, "cache.head_dim");
}

TEST_CASE("quantized bad input: a NaN or Inf K scale in a row that is read", "[quantized][bad_input]") {
  SECTION("observe_queries reads every held row") {
    bad_fixture f;
    const auto v = f.view();
    v.k_params_row(1, 1, 3)[1] = std::numeric_limits<float>::quiet_NaN();
    f.expect_refused(v, "cache.k_params", true);
    v.k_params_row(1, 1, 3)[1] = 0.5f;
    v.k_params_row(0, 0, 0)[0] = -std::numeric_limits<float>::infinity();
    f.expect_refused(v, "cache.k_params", true);
  }
  SECTION("a static scorer reads the new rows only") {
    sh::key_norm_policy policy;
    bad_fixture f;
    auto v = f.view();
    f.lengths[0] = 10;  // two new tokens in sequence 0
    state_holder s(policy, v);
    sh::host::admit(policy, v, s.state);  // rows 0..9 admitted with finite parameters
    f.lengths[0] = 11;
    v.k_params_row(0, 1, 10)[0] = std::numeric_limits<float>::infinity();
    const auto before = s.buffer.snapshot();
    try {
      sh::host::admit(policy, v, s.state);
      FAIL("admit read an infinite scale");
    } catch (const sh::invalid_argument& e) {
      CHECK(e.argument() == "cache.k_params");
      CHECK(std::string(e.what()).find("slot 10") != std::string::npos);
    }
    CHECK(s.buffer.equals(before));
    // An attention policy's compress never reads K: the same row is moved, not refused.
    v.k_params_row(0, 1, 10)[0] = 1.0f;
    v.v_params_row(0, 1, 10)[0] = std::numeric_limits<float>::quiet_NaN();
    CHECK_NOTHROW(sh::host::admit(policy, v, s.state));
  }
}

TEST_CASE("quantized cache: shared_heads compress and shared_layers select + compact", "[quantized][granularity]") {
  using heads = sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::mean_score>>;
  using layers = sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score, sh::mean_score>>;
  for (const bool paged : {false, true})
    for (const auto kind : {sh::quant_kind::int8, sh::quant_kind::int4})
      DYNAMIC_SECTION((paged ? "paged " : "contiguous ") << sh::name_of(kind)) {
        run_twins(heads{}, paged, paged, {kind, 8}, 1);
        run_twins_layers(layers{}, paged, !paged, {kind, 8});
      }
}

TEST_CASE("quantized bad input: outputs and workspace overlapping the parameters", "[quantized][bad_input]") {
  bad_fixture f;
  const auto v = f.view();
  const auto before = f.snapshot();
  // compress's new lengths written over the K parameters.
  try {
    std::vector<std::uint64_t> work(4096);
    sh::host::compress(f.policy, v, f.state->state, 11, {reinterpret_cast<std::byte*>(work.data()), work.size() * 8},
                       {{reinterpret_cast<std::int32_t*>(f.params[0].data()), 2}, {}});
    FAIL("compress wrote its outputs over cache.k_params");
  } catch (const sh::invalid_argument& e) {
    CHECK(e.argument() == "out.new_lengths");
    CHECK(std::string(e.what()).find("cache.k_params") != std::string::npos);
  }
  // compress's workspace over the V parameters.
  try {
    const std::size_t need = sh::host::compress_workspace_bytes(v, f.state->shape);
    REQUIRE(need <= f.params[1].size() * sizeof(float));
    sh::host::compress(f.policy, v, f.state->state, 11, {reinterpret_cast<std::byte*>(f.params[1].data()), need},
                       {{f.new_lengths.data(), f.new_lengths.size()}, {}});
    FAIL("compress used cache.v_params as its workspace");
  } catch (const sh::invalid_argument& e) {
    CHECK(e.argument() == "workspace");
    CHECK(std::string(e.what()).find("cache.v_params") != std::string::npos);
  }
  CHECK(f.snapshot() == before);
}
