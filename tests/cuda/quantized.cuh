#pragma once
// Part of differential.cu (its main translation unit): quantized caches
// (quantized_kv_view.hpp) on the CUDA backend against the host backend.
//
//   quantized  int8 and int4 (groups within a 16-byte vector of codes, and
//              groups that split one), head_dim 64 (16-byte code loads) and
//              24 (scalar loads), contiguous NHD / HND and paged NHD / HND,
//              H2O from queries with the log-sum-exp, the paper's count from
//              queries without it (the kernel's own normaliser, GQA over two
//              query tiles), key norm (a static scorer on dequantized K),
//              fill_holes and preserve_order. Each step appends tokens
//              (quantize_row), observes from queries, and compresses, on
//              both backends. After observe: the state, positions and
//              counters exact, scores within 1e-4 * max(1, |host|) (key
//              norm: bit for bit; 0/1 counts: at most 1% flipped). Compress
//              runs from identical states: new lengths, freed pages, the
//              state, and every kept packed code row and parameter row of K
//              and V bit for bit.
//   quantized_checks
//              status_k_params: a non-finite K scale (or int4 zero point) in a
//              row observe reads skips its sequence (the others equal the
//              host's run without it, its row untouched), where the host
//              refuses with "cache.k_params"; observe from queries reads
//              every held row, a static scorer only the new ones, and V's
//              parameters are never read.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cases.cuh"

namespace quantized_tests {

using namespace harness;
namespace sh = scissorhands;

// One quantized cache held on the host (the host backend's) and mirrored
// on the device: codes and parameters of K and V, lengths or a page table.
// Each sequence owns fixed, scrambled pages; the table lists those its
// length needs.
struct twin_cache {
  static constexpr int B = 3, H = 2, cap = 40, page_size = 4;
  int D;
  sh::kv_quantization q;
  bool paged, hnd;
  int code_bytes, params_row, max_pages, num_pages;
  std::vector<std::uint8_t> codes[2];  // K, V
  std::vector<float> params[2];
  std::vector<std::int32_t> lengths, indptr, indices, last;
  std::vector<std::vector<std::int32_t>> pages;
  device_buffer<std::uint8_t> d_codes[2];
  device_buffer<float> d_params[2];
  device_buffer<std::int32_t> d_len, d_indptr, d_indices, d_last;

  twin_cache(int head_dim, sh::kv_quantization q_, bool paged_, bool hnd_, std::uint64_t seed)
      : D(head_dim), q(q_), paged(paged_), hnd(hnd_), code_bytes(q_.code_row_bytes(head_dim)),
        params_row(q_.params_per_row(head_dim)), max_pages((cap + page_size - 1) / page_size),
        num_pages(B * max_pages + 2), lengths(B, 0), pages(B) {
    const std::size_t rows = paged ? static_cast<std::size_t>(num_pages) * page_size * H
                                   : static_cast<std::size_t>(B) * cap * H;
    std::mt19937_64 rng(seed);
    for (int kind = 0; kind < 2; ++kind) {
      codes[kind].resize(rows * static_cast<std::size_t>(code_bytes));
      params[kind].resize(rows * static_cast<std::size_t>(params_row));
      // Unused rows hold garbage codes and finite parameters.
      for (auto& c : codes[kind]) c = static_cast<std::uint8_t>(rng());
      for (auto& p : params[kind]) p = std::uniform_real_distribution<float>(0.0f, 0.1f)(rng);
      d_codes[kind] = device_buffer<std::uint8_t>(codes[kind].size());
      d_params[kind] = device_buffer<float>(params[kind].size());
    }
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
    for (int i = 0; i < num_pages; ++i) ids[static_cast<std::size_t>(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int b = 0; b < B; ++b) pages[b].assign(ids.begin() + b * max_pages, ids.begin() + (b + 1) * max_pages);
    d_len = device_buffer<std::int32_t>(B);
    d_indptr = device_buffer<std::int32_t>(B + 1);
    d_indices = device_buffer<std::int32_t>(static_cast<std::size_t>(B) * max_pages);
    d_last = device_buffer<std::int32_t>(B);
    rebuild_table();
  }

  void rebuild_table() {
    indptr.assign(1, 0);
    indices.clear();
    last.clear();
    for (int b = 0; b < B; ++b) {
      const int used = (lengths[b] + page_size - 1) / page_size;
      for (int p = 0; p < used; ++p) indices.push_back(pages[b][static_cast<std::size_t>(p)]);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last.push_back(used == 0 ? 0 : lengths[b] - (used - 1) * page_size);
    }
  }
  // Everything the host holds, to the device (after the comparisons).
  void upload() {
    for (int kind = 0; kind < 2; ++kind) {
      d_codes[kind].upload(codes[kind]);
      d_params[kind].upload(params[kind]);
    }
    d_len.upload(lengths);
    d_indptr.upload(indptr);
    if (!indices.empty()) d_indices.upload(indices);
    d_last.upload(last);
  }
  sh::named_layout layout() const { return hnd ? sh::named_layout::hnd : sh::named_layout::nhd; }

  sh::host_quantized_kv_view host_contiguous(const std::vector<std::int32_t>& l) {
    return sh::make_quantized_kv_view<host_space>(
        {codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()}, {params[0].data(), params[0].size()},
        {params[1].data(), params[1].size()}, {l.data(), l.size()}, B, H, D, cap, layout(), q);
  }
  sh::host_quantized_paged_kv_view host_paged() {
    return sh::make_quantized_paged_kv_view<host_space>(
        {codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()}, {params[0].data(), params[0].size()},
        {params[1].data(), params[1].size()}, {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
        {last.data(), last.size()}, B, H, D, page_size, num_pages, max_pages, q, layout());
  }
  sh::device_quantized_kv_view device_contiguous() const {
    return sh::make_quantized_kv_view<device_space>(d_codes[0].span(), d_codes[1].span(), d_params[0].span(),
                                                    d_params[1].span(), {d_len.data(), B}, B, H, D, cap, layout(), q);
  }
  sh::device_quantized_paged_kv_view device_paged() const {
    return sh::make_quantized_paged_kv_view<device_space>(
        d_codes[0].span(), d_codes[1].span(), d_params[0].span(), d_params[1].span(), {d_indptr.data(), B + 1},
        {d_indices.data(), indices.size()}, {d_last.data(), B}, B, H, D, page_size, num_pages, max_pages, q, layout());
  }
  // f(host view, device view) with the views of this cache's kind.
  template <class F>
  decltype(auto) with_views(F&& f) {
    if (paged) return f(host_paged(), device_paged());
    return f(host_contiguous(lengths), device_contiguous());
  }

  // Appends one token to sequence b (the caller grew its length and the
  // table): K and V quantized with the reference quantizer.
  template <class View>
  void append(const View& view, int b, std::mt19937_64& rng) {
    const int t = lengths[b] - 1;
    std::vector<float> x(static_cast<std::size_t>(D));
    for (int h = 0; h < H; ++h)
      for (int kind = 0; kind < 2; ++kind) {
        for (int d = 0; d < D; ++d)
          x[static_cast<std::size_t>(d)] =
              std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng) * static_cast<float>(1 + d % 5);
        std::uint8_t* c = kind == 0 ? view.k_row(b, h, t) : view.v_row(b, h, t);
        float* p = kind == 0 ? view.k_params_row(b, h, t) : view.v_params_row(b, h, t);
        sh::quantize_row(x.data(), D, q, c, p);
      }
  }
};

struct quantized_config {
  int policy = 0;  // 0: h2o from queries + lse, 1: scissorhands from queries, 2: key norm (static)
  sh::kv_quantization q;
  bool paged = false, hnd = false;
  int head_dim = 64, group = 2;
  bool preserve_order = false;
  std::string describe() const {
    static const char* policies[] = {"h2o (queries + lse)", "scissorhands (queries)", "key_norm"};
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s group_size %d, %s %s, head_dim %d, GQA group %d, %s, %s", sh::name_of(q.kind),
                  q.group_size, paged ? "paged" : "contiguous", hnd ? "HND" : "NHD", head_dim, group,
                  policies[policy], preserve_order ? "preserve_order" : "fill_holes");
    return buf;
  }
};

// Every kept code row and parameter row of K and V bit for bit: the
// device's buffers against the host's at the host view's row addresses
// (the views share layouts and the page table).
template <class HostView>
void compare_rows(const HostView& hv, const twin_cache& c, const std::vector<std::int32_t>& kept, mismatch_log& log) {
  std::vector<std::uint8_t> dc[2] = {c.d_codes[0].download(), c.d_codes[1].download()};
  std::vector<float> dp[2] = {c.d_params[0].download(), c.d_params[1].download()};
  for (int b = 0; b < twin_cache::B; ++b)
    for (int h = 0; h < twin_cache::H; ++h)
      for (int t = 0; t < kept[b]; ++t)
        for (int kind = 0; kind < 2; ++kind) {
          const std::uint8_t* hc = kind == 0 ? hv.k_row(b, h, t) : hv.v_row(b, h, t);
          const float* hp = kind == 0 ? hv.k_params_row(b, h, t) : hv.v_params_row(b, h, t);
          const std::size_t co = static_cast<std::size_t>(hc - c.codes[kind].data());
          const std::size_t po = static_cast<std::size_t>(hp - c.params[kind].data());
          if (std::memcmp(hc, dc[kind].data() + co, static_cast<std::size_t>(c.code_bytes)) != 0)
            log.add("compress: ", kind == 0 ? "K" : "V", " code row (", b, ",", h, ",", t, ") differs");
          if (std::memcmp(hp, dp[kind].data() + po, sizeof(float) * static_cast<std::size_t>(c.params_row)) != 0)
            log.add("compress: ", kind == 0 ? "K" : "V", " parameter row (", b, ",", h, ",", t, ") differs");
        }
}

template <class Policy>
bool run_case(const quantized_config& qc, Policy policy, std::uint64_t seed, mismatch_log& log) {
  constexpr int B = twin_cache::B, H = twin_cache::H;
  const int QH = H * qc.group, D = qc.head_dim, budget = 20;
  policy.config.recent = 3;
  policy.config.evict_count = 4;
  policy.config.compaction_mode = qc.preserve_order ? sh::compaction::preserve_order : sh::compaction::fill_holes;
  twin_cache c(D, qc.q, qc.paged, qc.hnd, seed);
  std::mt19937_64 rng(seed + 1);
  const twin_state state({B, H, twin_cache::cap, policy.ring_words()});
  const sh::state_shape& shape = state.shape;
  const auto &hst = state.host, &dsnap = state.snapshot;
  const auto& dst = state.device;
  std::size_t d_ws_bytes = 0;
  c.with_views([&](auto, auto dv) {
    CUDA_CHECK(sh::cuda::compress(nullptr, d_ws_bytes, policy, dv, dst, budget, {}));
  });
  device_buffer<std::byte> d_ws(d_ws_bytes);
  std::vector<std::int32_t> h_new(B), h_freed(B);
  device_buffer<std::int32_t> d_new(B), d_freed(B);
  const bool static_policy = !Policy::observation::needs_attention;
  const bool with_lse = qc.policy == 0;

  for (int step = 0; step < 8; ++step) {
    // 1. Append: a prefill at step 0, then a token per sequence (sequence
    // 1 appends two every third step: the step admits both, and its one
    // query is the last's).
    const int prefill[B] = {9, 17, 24};
    const bool admit_first = step > 0 && step % 3 == 0;
    for (int b = 0; b < B; ++b) {
      const int add = step == 0 ? prefill[b] : (b == 1 && admit_first ? 2 : 1);
      for (int i = 0; i < add; ++i) {
        ++c.lengths[b];
        c.rebuild_table();
        c.with_views([&](auto hv, auto) { c.append(hv, b, rng); });
      }
    }
    c.upload();

    // 2. Observe from queries (dense, q_len 3 then 1).
    const int q_len = step == 0 ? 3 : 1;
    std::vector<float> queries(static_cast<std::size_t>(B) * q_len * QH * D);
    for (auto& x : queries) x = std::uniform_real_distribution<float>(-1.5f, 1.5f)(rng);
    device_buffer<float> d_queries(queries.size());
    d_queries.upload(queries);
    const auto hq = sh::query_view<float, host_space>::dense({queries.data(), queries.size()}, QH, q_len, D);
    const auto dq = sh::query_view<float, device_space>::dense({d_queries.data(), queries.size()}, QH, q_len, D);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::vector<float> lse;
    device_buffer<float> d_lse;
    sh::lse_view<host_space> hl{};
    sh::lse_view<device_space> dl{};
    if (with_lse) {
      // The attention kernel's log-sum-exp over the dequantized keys.
      lse.resize(static_cast<std::size_t>(B) * QH * q_len);
      hl = sh::lse_view<host_space>::dense({lse.data(), lse.size()}, QH, q_len, sh::lse_base::natural);
      c.with_views([&](auto hv, auto) {
        std::vector<float> k(static_cast<std::size_t>(D));
        for (int b = 0; b < B; ++b)
          for (int qh = 0; qh < QH; ++qh)
            for (int j = 0; j < q_len; ++j) {
              lse[static_cast<std::size_t>((b * QH + qh) * q_len + j)] =
                  static_cast<float>(reference_lse(c.lengths[b] - q_len + j + 1, scale, [&](int t) {
                    hv.dequantize_k(b, qh / qc.group, t, k.data());
                    double dot = 0.0;
                    for (int d = 0; d < D; ++d) dot += double{hq.row(b, qh, j)[d]} * k[static_cast<std::size_t>(d)];
                    return dot;
                  }));
            }
      });
      d_lse = device_buffer<float>(lse.size());
      d_lse.upload(lse);
      dl = sh::lse_view<device_space>::dense({d_lse.data(), lse.size()}, QH, q_len, sh::lse_base::natural);
    }
    c.with_views([&](auto hv, auto dv) {
      if (admit_first) {
        sh::host::admit(policy, hv, hst);
        CUDA_CHECK(sh::cuda::admit(policy, dv, dst));
      }
      sh::host::observe_queries(policy, hv, hst, hq, hl);
      CUDA_CHECK(sh::cuda::observe_queries(policy, dv, dst, dq, dl));
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    state.download();
    if (!status_clear("observe", dsnap, log)) return false;
    std::vector<row_slots> rows;
    for (int b = 0; b < B; ++b) rows.push_back({b, c.lengths[b]});
    const score_rule after_observe{static_policy, Policy::observation::binary};
    if (!compare_state("after observe", hst, dsnap, rows, after_observe, static_policy, log))
      return false;
    // Compress from identical inputs.
    state.upload();

    // 3. Compress.
    std::fill(h_new.begin(), h_new.end(), -7);
    std::fill(h_freed.begin(), h_freed.end(), -7);
    d_new.upload(h_new);
    d_freed.upload(h_freed);
    c.with_views([&](auto hv, auto dv) {
      aligned_bytes h_ws(sh::host::compress_workspace_bytes(hv, shape));
      sh::host::compress(policy, hv, hst, budget, h_ws.span(),
                         {sh::host_span<std::int32_t>(h_new.data(), B), sh::host_span<std::int32_t>(h_freed.data(), B)});
      CUDA_CHECK(sh::cuda::compress(d_ws.data(), d_ws_bytes, policy, dv, dst, budget, {d_new.span(), d_freed.span()}));
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    state.download();
    if (!status_clear("compress", dsnap, log)) return false;
    if (d_new.download() != h_new) log.add("compress: new_lengths differ at step ", step);
    if (d_freed.download() != h_freed) log.add("compress: freed_pages differ at step ", step);
    if (!log.ok()) return false;
    rows.clear();
    for (int b = 0; b < B; ++b) rows.push_back({b, h_new[b]});
    if (!compare_state("after compress", hst, dsnap, rows, score_rule{}, true, log))
      return false;
    c.with_views([&](auto hv, auto) { compare_rows(hv, c, h_new, log); });
    if (!log.ok()) {
      log.add("at step ", step);
      return false;
    }
    // The engine applies the new lengths.
    c.lengths = h_new;
    c.rebuild_table();
  }
  for (int b = 0; b < B; ++b)
    if (c.lengths[b] > budget) log.add_host("sequence ", b, " holds ", c.lengths[b], " tokens: nothing was evicted");
  return log.ok();
}

inline int run_differential() {
  std::vector<quantized_config> configs;
  const sh::kv_quantization formats[] = {{sh::quant_kind::int8, 32}, {sh::quant_kind::int8, 8},
                                         {sh::quant_kind::int4, 32}, {sh::quant_kind::int4, 16}};
  int i = 0;
  for (const auto& q : formats)
    for (int layout = 0; layout < 4; ++layout)
      for (int policy = 0; policy < 3; ++policy) {
        quantized_config qc;
        qc.q = q;
        qc.paged = layout >= 2;
        qc.hnd = layout % 2 == 1;
        qc.policy = policy;
        qc.group = policy == 1 ? 5 : 2;  // 5: two query tiles
        qc.preserve_order = (i++ % 3) == 1;
        qc.head_dim = 64;
        configs.push_back(qc);
        // head_dim 24: code rows of 24 or 12 bytes, the scalar path.
        if (q.group_size == 8 || (q.kind == sh::quant_kind::int4 && q.group_size == 16 && layout == 1)) {
          qc.head_dim = 24;
          qc.q.group_size = q.kind == sh::quant_kind::int4 ? 12 : 8;
          configs.push_back(qc);
        }
      }
  int failed = 0;
  std::uint64_t seed = 1301;
  for (const auto& qc : configs) {
    mismatch_log log;
    bool ok = false;
    try {
      switch (qc.policy) {
        case 0: ok = run_case(qc, sh::h2o_policy{}, seed++, log); break;
        case 1: ok = run_case(qc, sh::scissorhands_policy{}, seed++, log); break;
        default: ok = run_case(qc, sh::key_norm_policy{}, seed++, log); break;
      }
    } catch (const std::exception& e) {
      log.add_host("unexpected exception: ", e.what());
    }
    if (!ok && ++failed <= 10) std::printf("FAIL quantized: %s\n%s", qc.describe().c_str(), log.text.str().c_str());
  }
  std::printf("quantized: %d of %zu configurations passed (int8 / int4, contiguous / paged, NHD / HND, "
              "head_dim 64 / 24)\n",
              static_cast<int>(configs.size()) - failed, configs.size());
  return failed;
}

// ---------------------------------------------------------------------------
// status_k_params. Three sequences, contiguous NHD, head_dim 16, int8 (16-
// byte code rows) or int4 (8-byte rows: the scalar path), one state row
// each; a NaN or infinite parameter is put into the K
// (or V) parameters of one sequence's row on the device and the host, and
// the call runs on both: the device must flag that sequence only and
// leave its state row as it was; the other rows must equal the host's run
// with the sequence as a padding slot (row -1, no token); the host run
// with the bad parameter must refuse with "cache.k_params".
template <class Policy>
struct params_fault {
  static constexpr int B = 3, H = 2, G = 2, QH = H * G, D = 16;
  Policy policy;
  twin_cache c;
  sh::state_shape shape{B, H, twin_cache::cap, Policy{}.ring_words()};
  aligned_bytes h_state{sh::state_bytes(shape)}, d_snap{sh::state_bytes(shape)};
  device_buffer<std::byte> d_state{sh::state_bytes(shape)};
  sh::eviction_state<host_space> hst = sh::make_state(h_state.span(), shape);
  sh::eviction_state<device_space> dst = sh::make_state(d_state.span(), shape);
  std::vector<float> queries = std::vector<float>(static_cast<std::size_t>(B) * QH * D, 0.25f);
  device_buffer<float> d_queries{queries.size()};
  std::mt19937_64 rng{5};

  explicit params_fault(sh::kv_quantization q) : c(D, q, false, false, 77) {
    sh::host::reset_state(hst);
    CUDA_CHECK(sh::cuda::reset_state(dst));
    d_queries.upload(queries);
    grow({10, 14, 12});
    observe(-1);  // a clean step on both: every row tracked
    grow({1, 2, 1});
    // Sequence 1's two new tokens and one query: a policy scoring from
    // queries admits them first (the observe-step invariant); a static
    // scorer keeps them new, to score them from their K rows.
    if constexpr (Policy::observation::needs_attention) {
      sh::host::admit(policy, c.host_contiguous(c.lengths), hst);
      CUDA_CHECK(sh::cuda::admit(policy, c.device_contiguous(), dst));
      CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  void grow(const std::vector<int>& add) {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < add[static_cast<std::size_t>(b)]; ++i) {
        ++c.lengths[b];
        c.append(c.host_contiguous(c.lengths), b, rng);
      }
    c.upload();
  }
  // Both backends; the host with sequence `bad` (if any) as a padding slot.
  void observe(int bad) {
    std::vector<std::int32_t> l = c.lengths, rows{0, 1, 2};
    if (bad >= 0) l[bad] = 0, rows[bad] = -1;
    const auto hq = sh::query_view<float, host_space>::dense({queries.data(), queries.size()}, QH, 1, D);
    const auto dq = sh::query_view<float, device_space>::dense({d_queries.data(), queries.size()}, QH, 1, D);
    sh::host::observe_queries(policy, c.host_contiguous(l), hst.for_batch({rows.data(), rows.size()}), hq);
    CUDA_CHECK(sh::cuda::observe_queries(policy, c.device_contiguous(), dst, dq));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The host's refusal of the bad parameter: the argument it names and its
  // message, both empty if the host accepts it.
  struct refusal {
    std::string argument, message;
  };
  refusal host_refusal() {
    const auto hq = sh::query_view<float, host_space>::dense({queries.data(), queries.size()}, QH, 1, D);
    aligned_bytes copy(sh::state_bytes(shape));
    std::memcpy(copy.data(), h_state.data(), sh::state_bytes(shape));
    try {
      sh::host::observe_queries(policy, c.host_contiguous(c.lengths), sh::make_state(copy.span(), shape), hq);
    } catch (const sh::invalid_argument& e) {
      return {e.argument(), e.what()};
    }
    return {};
  }
  // Parameter i of (b, h, t) of K (kind 0) or V, on both sides.
  void poke(int kind, int b, int h, int t, int i, float value) {
    float* p = (kind == 0 ? c.host_contiguous(c.lengths).k_params_row(b, h, t)
                          : c.host_contiguous(c.lengths).v_params_row(b, h, t)) +
               i;
    *p = value;
    c.upload();
  }
  std::vector<std::uint32_t> status() const {
    std::vector<std::uint32_t> w(B);
    CUDA_CHECK(cudaMemcpy(w.data(), dst.status, sizeof(std::uint32_t) * B, cudaMemcpyDeviceToHost));
    return w;
  }
  sh::eviction_state<host_space> device_snapshot() {
    d_state.download(d_snap.data(), sh::state_bytes(shape));
    return sh::make_state(d_snap.span(), shape);
  }
};

inline int run_checks() {
  check_tally tally{"quantized_checks"};
  auto words = [](const std::vector<std::uint32_t>& w) {
    std::string s;
    for (const std::uint32_t x : w) {
      s += ' ';
      s += std::to_string(x);
    }
    return s;
  };
  // A fault in slot `t` (negative: from the end) of head 1 of sequence
  // `bad`: flagged with status_k_params, or, when `read` is false (the
  // call does not read that parameter), neither flagged nor refused.
  auto fault = [&](auto tag, sh::kv_quantization q, const std::string& what, int bad, int kind, int t, int i,
                   float value, bool read) {
    using P = decltype(tag);
    params_fault<P> f(q);
    const int slot = t >= 0 ? t : f.c.lengths[bad] + t;
    f.poke(kind, bad, 1, slot, i, value);
    const auto refusal = f.host_refusal();
    f.device_snapshot();
    aligned_bytes before(sh::state_bytes(f.shape));
    std::memcpy(before.data(), f.d_snap.data(), sh::state_bytes(f.shape));
    f.observe(read ? bad : -1);
    const auto w = f.status();
    bool flags = true;
    for (int b = 0; b < f.B; ++b)
      flags = flags && (read && b == bad ? w[b] == sh::cuda::status_k_params : w[b] == 0);
    tally.device(flags, what + ": status words" + words(w));
    if (!read) {
      tally.host(refusal.message.empty(), what + ": the host accepts it too (got \"" + refusal.message + "\")");
      return;
    }
    tally.host(refusal.argument == "cache.k_params",
               what + ": the host refuses naming cache.k_params (got \"" + refusal.message + "\")");
    // The faulty row untouched, the others the host's (within rounding).
    const auto after = f.device_snapshot();
    mismatch_log log;
    compare_state("faulty row", sh::make_state(before.span(), f.shape), after, {{bad, f.c.lengths[bad]}}, score_rule{},
                  true, log);
    std::vector<row_slots> others;
    for (int b = 0; b < f.B; ++b)
      if (b != bad) others.push_back({b, f.c.lengths[b]});
    const bool exact = !P::observation::needs_attention;
    compare_state("other rows", f.hst, after, others, {exact, P::observation::binary}, exact, log);
    tally.device(log.ok(), what + ": the faulty row untouched, the others the host's\n" + log.text.str());
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const sh::kv_quantization int8{sh::quant_kind::int8, 8}, int4{sh::quant_kind::int4, 8};
  // Observe from queries reads every held K row.
  fault(sh::h2o_policy{}, int8, "queries, int8: NaN K scale in an old row", 1, 0, 5, 1, nan, true);
  fault(sh::h2o_policy{}, int8, "queries, int8: infinite K scale in a new row", 2, 0, -1, 0, inf, true);
  fault(sh::scissorhands_policy{}, int4, "queries, int4: -inf K zero point of the first row", 0, 0, 0, 1, -inf, true);
  fault(sh::h2o_policy{}, int4, "queries, int4: NaN K scale in a new row", 1, 0, -2, 2, nan, true);
  fault(sh::h2o_policy{}, int8, "queries, int8: NaN V scale (V is never read)", 1, 1, 3, 0, nan, false);
  // A static scorer reads the new rows only.
  fault(sh::key_norm_policy{}, int8, "key_norm, int8: NaN K scale in a new row", 1, 0, -1, 1, nan, true);
  fault(sh::key_norm_policy{}, int4, "key_norm, int4: NaN K zero point in a new row", 2, 0, -1, 3, nan, true);
  fault(sh::key_norm_policy{}, int8, "key_norm, int8: NaN K scale in an old row (not read)", 1, 0, 4, 1, nan, false);
  tally.host(sh::cuda::describe_status(sh::cuda::status_k_params).find("cache.k_params") != std::string::npos,
         "describe_status names cache.k_params");
  return tally.report();
}

}  // namespace quantized_tests
