#pragma once
// Shared by the translation units of scissorhands_cuda_test (differential.cu
// and one differential_<dtype>.cu per element type, so that nvcc compiles
// the per-dtype kernels in parallel): the policies under test, a
// configuration, and run_case, which runs one configuration on both
// backends. Each differential_<dtype>.cu defines run_<dtype>.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cases.cuh"

namespace differential {

using namespace harness;
namespace sh = scissorhands;

// ---------------------------------------------------------------------------
// Policies under test
using p_scissorhands = sh::scissorhands_policy;
using p_h2o = sh::h2o_policy;
using p_mass_window = sh::eviction_policy<sh::attention_mass, sh::sliding_window>;
using p_threshold_max = sh::eviction_policy<sh::important_indicator, sh::unbounded_history, sh::recent_window, sh::gqa_max>;
using p_mass_decay_max = sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window, sh::gqa_max>;
using p_threshold_decay = sh::eviction_policy<sh::important_indicator, sh::exponential_decay>;
using p_key_norm = sh::key_norm_policy;
using p_streaming = sh::streaming_policy;
using p_random = sh::random_policy;
constexpr int num_policies = 9;
const char* const policy_names[num_policies] = {"scissorhands", "h2o", "mass+window", "threshold+unbounded+max",
                                                "mass+decay+max", "threshold+decay", "key_norm", "streaming",
                                                "random"};
// observe_queries is compiled for two policies (it is the heavy kernel):
// they cover both observations, both GQA reductions, ring and no ring.
template <class Policy>
constexpr bool queries_tested = std::is_same_v<Policy, p_scissorhands> || std::is_same_v<Policy, p_mass_decay_max>;
constexpr bool policy_has_queries(int p) { return p == 0 || p == 4; }

// ---------------------------------------------------------------------------
// dtype: 0 fp32, 1 fp16, 2 bf16.
struct config : case_config {
  int path = 0;  // 0 probabilities, 1 queries + natural lse, 2 queries + base-2 lse, 3 queries, own normaliser
  float softmax_scale = 0.0f;
  bool padded = false, v_other_layout = false;
  bool ragged = false;       // qo_indptr views
  bool token_major = false;  // uniform lse: token-major instead of head-major

  std::string describe() const {
    static const char* dtypes[] = {"fp32", "fp16", "bf16"};
    static const char* paths[] = {"probabilities", "queries+lse", "queries+lse2", "queries"};
    return describe_as(std::string(v_other_layout ? "(V other) " : "") + dtypes[dtype] + " " + policy_names[policy] +
                           " via " + paths[path] + (ragged ? " ragged" : "") + (token_major ? " token-major lse" : ""),
                       ", padded " + std::to_string(padded) + ", softmax_scale " + std::to_string(softmax_scale));
  }
};

// One configuration of element type float / __half / __nv_bfloat16, each
// defined in its own translation unit (differential_<dtype>.cu).
bool run_fp32(const config& c, mismatch_log& log);
bool run_fp16(const config& c, mismatch_log& log);
bool run_bf16(const config& c, mismatch_log& log);
// An 8-byte element type through observe_queries' generic path
// (differential_wide.cu); returns the failures.
int run_wide_elements();

// Where row (b, qh, j) of a view with these strides starts (uniform or ragged).
inline std::size_t row_offset(const std::vector<std::int32_t>* qo_indptr, std::int64_t sequence_stride,
                       std::int64_t head_stride, std::int64_t query_stride, int b, int qh, int j) {
  const sh::host_span<const std::int32_t> qo =
      qo_indptr ? sh::host_span<const std::int32_t>(qo_indptr->data(), qo_indptr->size())
                : sh::host_span<const std::int32_t>{};
  return static_cast<std::size_t>(sh::detail::query_offset(qo, sequence_stride, head_stride, query_stride, b, qh, j));
}

// ---------------------------------------------------------------------------
// One configuration

template <class T, class Policy, bool Paged>
bool run_case(const config& c, mismatch_log& log) {
  Policy policy;
  c.apply(policy.config);
  constexpr bool attention = Policy::observation::needs_attention;
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 17);

  const int B = c.batch, H = c.kv_heads, D = c.head_dim, G = c.group, QH = H * G;
  const cache_geometry geo = cache_geometry::of(c, Paged, c.v_other_layout);
  const int P = geo.page_size, max_pages = geo.max_pages, num_pages = geo.num_pages, cap = geo.capacity;
  const std::size_t elements = geo.elements;
  // The state holds what a sequence may hold at a call: the cache's
  // capacity, or (tight) the budget plus the tokens appended between two
  // compress calls (at most 3 after the first step).
  const int state_cap = c.tight_state ? std::min(cap, c.budget + 2 + uniform(rng, 0, 6)) : cap;
  const int most = std::min(c.capacity, state_cap);  // the longest a sequence gets at a call

  std::vector<T> hk(elements), hv(elements);
  fill_random(hk, rng, -2.0f, 2.0f);
  fill_random(hv, rng, -2.0f, 2.0f);
  device_buffer<T> dk(elements), dv(elements);

  // Requests: each keeps its state row and (paged) its reqs.pages for its whole
  // life; the scheduler puts it at a batch position. Without a mapping,
  // request b is at position b in row b.
  const int live = c.mapped ? uniform(rng, 1, B) : B;
  const int rows = c.mapped ? live + uniform(rng, 0, 3) : B + (coin(rng, 0.3) ? uniform(rng, 1, 2) : 0);
  request_batch reqs(rng, B, live, rows, c.mapped, Paged, P, max_pages, num_pages);
  std::vector<std::int32_t> h_new(B), h_freed(B), h_released(reqs.h_indices.size());
  device_buffer<std::int32_t> d_new(B), d_freed(B), d_released(reqs.h_indices.size());
  // The layouts K and V use (V may use the other one).
  auto host_view = [&] { return cache_view<Paged>(geo, hk.data(), hv.data(), reqs.host_table()); };
  auto device_view = [&] { return cache_view<Paged>(geo, dk.data(), dv.data(), reqs.device_table()); };
  reqs.sync();
  const auto hview0 = host_view();
  std::int64_t block = 0;  // one position's K (and V) elements
  if constexpr (!Paged) block = hview0.k_layout.sequence_stride;

  // State, workspaces; the state seen through the batch when mapped.
  const twin_state state({rows, H, state_cap, policy.ring_words()});
  const auto &hst0 = state.host, &dsnap = state.snapshot;
  const auto& dst0 = state.device;
  const auto hst = c.mapped ? hst0.for_batch(sh::host_span<const std::int32_t>(reqs.h_rows.data(), B)) : hst0;
  const auto dst = c.mapped ? dst0.for_batch(sh::device_span<const std::int32_t>(reqs.d_rows.data(), B)) : dst0;
  aligned_bytes h_ws(sh::host::compress_workspace_bytes(hview0));
  std::size_t d_ws_bytes = 0;
  CUDA_CHECK(sh::cuda::compress(nullptr, d_ws_bytes, policy, device_view(), dst, c.budget, {}));
  device_buffer<std::byte> d_ws(d_ws_bytes);
  device_buffer<sh::cuda::shrink_result> d_result(1);


  for (int step = 0; step < c.steps; ++step) {
    // 0. Now and then a request finishes and a new one takes a row (a free
    //    one if there is one) and, when mapped, the scheduler reorders the
    //    batch; contiguous K/V move with their request.
    if (step > 0 && coin(rng, 0.15)) {
      const int q = uniform(rng, 0, live - 1), start = uniform(rng, 0, 1000);
      if (c.mapped) {
        std::vector<int> free_rows;
        for (int r = 0; r < rows; ++r)
          if (std::find(reqs.row_of.begin(), reqs.row_of.end(), r) == reqs.row_of.end()) free_rows.push_back(r);
        if (!free_rows.empty()) reqs.row_of[q] = free_rows[uniform(rng, 0, static_cast<int>(free_rows.size()) - 1)];
      }
      sh::host::reset_sequence(hst0, reqs.row_of[q], start);
      CUDA_CHECK(sh::cuda::reset_sequence(dst0, reqs.row_of[q], start));
      reqs.len[q] = 0;
    }
    if (c.mapped && step > 0 && coin(rng, 0.5)) shuffle_batch<Paged>(rng, reqs, hk, hv, block, elements, 1);
    // 1. The engine appends tokens (ragged, none for some). With one query
    //    count for all (a dense query view), requests append alike after
    //    the prompt, as a decode step does.
    const bool dense_queries = attention && !c.ragged;
    const int shared_add = uniform(rng, 0, 3);
    for (int q = 0; q < live; ++q) {
      const int add = dense_queries && step > 0 ? std::min(shared_add, most - reqs.len[q])
                                                : draw_append(rng, step, most, reqs.len[q]);
      for (int t = reqs.len[q]; t < reqs.len[q] + add; ++t)
        for (int h = 0; h < H; ++h) {
          std::int64_t ko, vo;
          if constexpr (Paged) {
            ko = hview0.k_layout.offset(reqs.pages[q][t / P], h, t % P);
            vo = hview0.v_layout.offset(reqs.pages[q][t / P], h, t % P);
          } else {
            ko = hview0.k_layout.offset(reqs.pos_of[q], h, t);
            vo = hview0.v_layout.offset(reqs.pos_of[q], h, t);
          }
          std::uniform_real_distribution<float> d(-2.0f, 2.0f);
          for (int x = 0; x < D; ++x) {
            hk[ko + x] = from_float<T>(d(rng));
            hv[vo + x] = from_float<T>(d(rng));
          }
        }
      reqs.len[q] += add;
    }
    reqs.sync();
    dk.upload(hk);
    dv.upload(hv);
    const auto hview = host_view();
    const auto dview = device_view();
    const std::vector<int> observed_len = reqs.len;

    // 2. This step's queries, as many as the observe-step invariant allows
    //    (allowed_queries): uniform q_len (0 now and then) or ragged per
    //    sequence (0 for some, anything for positions holding no token:
    //    they are skipped). A uniform count no sequence's new tokens fit
    //    (a request reset or full) admits them first, on both sides, and
    //    its queries are then the last of them.
    const int max_len = length_range(reqs).second;
    const bool ragged = attention && c.ragged;
    int q_len = 0;
    std::vector<std::int32_t> h_qo(B + 1, 0);
    std::vector<int> q_of(B, 0);
    if (ragged) {
      for (int b = 0; b < B; ++b) {
        const int l = reqs.len_at(b);
        const query_bounds allowed = allowed_queries(hst, b, l);
        if (l == 0)
          q_of[b] = uniform(rng, 0, 2);
        else if (allowed.empty() || coin(rng, 0.2))
          q_of[b] = 0;
        else
          q_of[b] = coin(rng, 0.5) ? allowed.least
                                   : uniform(rng, allowed.least, std::min(allowed.most, allowed.least + 7));
        h_qo[b + 1] = h_qo[b] + q_of[b];
      }
    } else if (attention) {
      const auto common = [&] {
        query_bounds all{1, std::numeric_limits<int>::max()};
        for (int b = 0; b < B; ++b) {
          const int l = reqs.len_at(b);
          if (l == 0) continue;
          const query_bounds one = allowed_queries(hst, b, l);
          all = {std::max(all.least, one.least), std::min(all.most, one.most)};
        }
        return all;
      };
      query_bounds all = common();
      if (all.empty()) {
        sh::host::admit(policy, hview, hst);
        CUDA_CHECK(sh::cuda::admit(policy, dview, dst));
        CUDA_CHECK(cudaDeviceSynchronize());
        all = common();
      }
      q_len = coin(rng, 0.05) || all.empty() ? 0
              : step == 0 ? uniform(rng, all.least, std::min(all.most, std::max(all.least, 8)))
                          : (coin(rng, 0.8) ? all.least : uniform(rng, all.least, std::min(all.most, all.least + 2)));
      for (int b = 0; b < B; ++b) q_of[b] = q_len;
    }
    const int tokens = ragged ? h_qo[B] : B * q_len;
    device_buffer<std::int32_t> d_qo(B + 1);
    d_qo.upload(h_qo);
    const sh::host_span<const std::int32_t> hqo = ragged ? sh::host_span<const std::int32_t>(h_qo.data(), B + 1)
                                                         : sh::host_span<const std::int32_t>{};
    const sh::device_span<const std::int32_t> dqo = ragged ? sh::device_span<const std::int32_t>(d_qo.data(), B + 1)
                                                           : sh::device_span<const std::int32_t>{};
    const std::vector<std::int32_t>* qo_ptr = ragged ? &h_qo : nullptr;

    // 3. Observe, on both sides, from the same inputs.
    const bool queries = c.path != 0;
    if (!attention && coin(rng)) {
      // Static policies: admit is all observe does; check the entry point too.
      sh::host::admit(policy, hview, hst);
      CUDA_CHECK(sh::cuda::admit(policy, dview, dst));
      CUDA_CHECK(cudaDeviceSynchronize());
    } else if (!queries) {
      const int cols = std::max(1, max_len + (c.padded ? 5 : 0));
      std::vector<float> probs(std::max<std::size_t>(1, static_cast<std::size_t>(tokens) * QH * cols),
                               std::numeric_limits<float>::quiet_NaN());  // never read beyond visible
      const auto hp0 = ragged ? sh::probability_view<host_space>::ragged({probs.data(), probs.size()}, hqo, QH, cols)
                              : sh::probability_view<host_space>::dense({probs.data(), probs.size()}, QH, q_len, cols);
      std::normal_distribution<float> logit(0.0f, 2.0f);
      for (int b = 0; b < B; ++b) {
        const int l = reqs.len_at(b);
        if (l == 0) continue;
        for (int qh = 0; qh < QH; ++qh)
          for (int j = 0; j < q_of[b]; ++j) {
            float* row = probs.data() + row_offset(qo_ptr, hp0.sequence_stride, hp0.head_stride, hp0.query_stride,
                                                   b, qh, j);
            fill_probabilities(row, l - q_of[b] + j + 1, logit, rng, c.ties);
          }
      }
      device_buffer<float> d_probs(probs.size());
      d_probs.upload(probs);
      auto dp = ragged ? sh::probability_view<device_space>::ragged({d_probs.data(), d_probs.size()}, dqo, QH, cols)
                       : sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, q_len, cols);
      sh::host::observe_probabilities(policy, hview, hst, hp0);
      CUDA_CHECK(sh::cuda::observe_probabilities(policy, dview, dst, dp));
      CUDA_CHECK(cudaDeviceSynchronize());
    } else if constexpr (queries_tested<Policy>) {
      std::vector<T> q(std::max<std::size_t>(1, static_cast<std::size_t>(tokens) * QH * D),
                       from_float<T>(std::numeric_limits<float>::quiet_NaN()));
      const auto hq = ragged ? sh::query_view<T, host_space>::ragged({q.data(), q.size()}, hqo, QH, D)
                             : sh::query_view<T, host_space>::dense({q.data(), q.size()}, QH, q_len, D);
      std::uniform_real_distribution<float> qd(-2.0f, 2.0f);
      for (int b = 0; b < B; ++b) {
        if (reqs.len_at(b) == 0) continue;
        for (int qh = 0; qh < QH; ++qh)
          for (int j = 0; j < q_of[b]; ++j) {
            T* row = q.data() + row_offset(qo_ptr, hq.sequence_stride, hq.head_stride, hq.query_stride, b, qh, j);
            for (int x = 0; x < D; ++x) row[x] = from_float<T>(qd(rng));
          }
      }
      device_buffer<T> d_q(q.size());
      d_q.upload(q);
      const auto dq = ragged ? sh::query_view<T, device_space>::ragged({d_q.data(), d_q.size()}, dqo, QH, D)
                             : sh::query_view<T, device_space>::dense({d_q.data(), d_q.size()}, QH, q_len, D);
      const float scale = c.softmax_scale > 0.0f ? c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
      std::vector<float> lse;
      const sh::lse_base base = c.path == 2 ? sh::lse_base::base2 : sh::lse_base::natural;
      sh::lse_view<host_space> hl{};
      if (c.path != 3) {
        // The log-sum-exp an attention kernel would return; NaN where no query is.
        lse.assign(std::max(1, tokens * QH), std::numeric_limits<float>::quiet_NaN());
        const sh::host_span<const float> ls(lse.data(), lse.size());
        hl = ragged           ? sh::lse_view<host_space>::ragged(ls, hqo, QH, base)
             : c.token_major ? sh::lse_view<host_space>::token_major(ls, QH, q_len, base)
                             : sh::lse_view<host_space>::dense(ls, QH, q_len, base);
        for (int b = 0; b < B; ++b) {
          const int l = reqs.len_at(b);
          if (l == 0) continue;
          for (int qh = 0; qh < QH; ++qh)
            for (int j = 0; j < q_of[b]; ++j) {
              const T* qr = hq.row(b, qh, j);
              const double value = reference_lse(l - q_of[b] + j + 1, scale, [&](int t) {
                const T* k = hview.k_row(b, qh / G, t);
                double dot = 0.0;
                for (int x = 0; x < D; ++x) dot += double(sh::to_float(qr[x])) * sh::to_float(k[x]);
                return dot;
              });
              lse[row_offset(qo_ptr, hl.sequence_stride, hl.head_stride, hl.query_stride, b, qh, j)] =
                  static_cast<float>(base == sh::lse_base::base2 ? value / std::log(2.0) : value);
            }
        }
      }
      device_buffer<float> d_lse(lse.size());
      if (!lse.empty()) d_lse.upload(lse);
      sh::lse_view<device_space> dl{};
      if (!lse.empty()) {
        dl = {{d_lse.data(), d_lse.size()}, hl.base, hl.sequence_stride, hl.head_stride, hl.query_stride, dqo};
      }
      sh::host::observe_queries(policy, hview, hst, hq, hl, c.softmax_scale);
      // Every other head_dim-128 configuration through the compile-time
      // head_dim (the same kernel, chosen without the run-time dispatch).
      if (D == 128 && c.index % 2 == 0)
        CUDA_CHECK(sh::cuda::observe_queries<128>(policy, dview, dst, dq, dl, c.softmax_scale));
      else
        CUDA_CHECK(sh::cuda::observe_queries(policy, dview, dst, dq, dl, c.softmax_scale));
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    state.download();
    if (!status_clear("observe", dsnap, log)) return false;
    const score_rule after_observe{!queries, Policy::observation::binary};
    if (!compare_state("after observe", hst0, dsnap, live_rows(reqs, observed_len), after_observe, !queries, log))
      return false;
    // Compress from identical inputs whatever the observe path.
    if (queries) state.upload();

    // 4. Compress: its outputs against the host's.
    const bool with_freed = Paged || c.freed_for_contiguous;
    std::fill(h_new.begin(), h_new.end(), -7);
    std::fill(h_freed.begin(), h_freed.end(), -7);
    d_new.upload(h_new);
    d_freed.upload(h_freed);
    sh::host::compress(policy, hview, hst, c.budget, h_ws.span(),
                       {sh::host_span<std::int32_t>(h_new.data(), B),
                        with_freed ? sh::host_span<std::int32_t>(h_freed.data(), B) : sh::host_span<std::int32_t>{}});
    CUDA_CHECK(sh::cuda::compress(d_ws.data(), d_ws_bytes, policy, dview, dst, c.budget,
                                  {d_new.span(), with_freed ? d_freed.span() : sh::device_span<std::int32_t>{}}));
    CUDA_CHECK(cudaDeviceSynchronize());
    state.download();
    if (!status_clear("compress", dsnap, log)) return false;
    if (!check_outputs("compress", c, reqs, h_new, d_new, h_freed, d_freed, with_freed, log)) return false;
    const std::vector<int> kept_len = kept_lengths(reqs, h_new);
    if (!compare_state("after compress", hst0, dsnap, live_rows(reqs, kept_len), score_rule{}, true, log))
      return false;
    // Kept K and V rows, bit for bit.
    if (!check_kept_rows("compress", hview, hk, hv, dk.download(), dv.download(), reqs, kept_len, log)) return false;

    // 5. The engine applies the new lengths (paged: shrinks the table on
    //    both sides; the next step rebuilds it, which must agree).
    if constexpr (Paged) {
      const std::size_t released =
          sh::host::shrink_page_table(sh::host_span<std::int32_t>(reqs.h_indptr.data(), reqs.h_indptr.size()),
                                      sh::host_span<std::int32_t>(reqs.h_indices.data(), reqs.h_indices.size()),
                                      sh::host_span<std::int32_t>(reqs.h_last.data(), reqs.h_last.size()), P,
                                      sh::host_span<const std::int32_t>(h_new.data(), B),
                                      sh::host_span<std::int32_t>(h_released.data(), h_released.size()));
      CUDA_CHECK(sh::cuda::shrink_page_table(reqs.d_indptr.span(), reqs.d_indices.span(), reqs.d_last.span(), P,
                                             sh::device_span<const std::int32_t>(d_new.data(), B), d_released.span(),
                                             d_result.data()));
      sh::cuda::shrink_result result;
      CUDA_CHECK(cudaDeviceSynchronize());
      d_result.download(&result, 1);
      const auto di = reqs.d_indptr.download(), dx = reqs.d_indices.download(), dl = reqs.d_last.download(),
                 dr = d_released.download();
      if (result.status != 0 || result.released != static_cast<std::int32_t>(released))
        log.add("shrink_page_table: device {", result.released, ", ", result.status, "} host released ", released);
      for (int b = 0; b <= B; ++b)
        if (di[b] != reqs.h_indptr[b])
          log.add("shrink_page_table: indptr[", b, "] host ", reqs.h_indptr[b], " device ", di[b]);
      for (int i = 0; i < reqs.h_indptr[B]; ++i)
        if (dx[i] != reqs.h_indices[i])
          log.add("shrink_page_table: indices[", i, "] host ", reqs.h_indices[i], " device ", dx[i]);
      for (int b = 0; b < B; ++b)
        if (dl[b] != reqs.h_last[b])
          log.add("shrink_page_table: last_page_len[", b, "] host ", reqs.h_last[b], " device ", dl[b]);
      for (std::size_t i = 0; i < released; ++i)
        if (dr[i] != h_released[i])
          log.add("shrink_page_table: released[", i, "] host ", h_released[i], " device ", dr[i]);
      if (!log.ok()) return false;
      const std::vector<std::int32_t> shrunk_indptr = reqs.h_indptr, shrunk_last = reqs.h_last;
      const std::vector<std::int32_t> shrunk_indices(reqs.h_indices.begin(), reqs.h_indices.begin() + reqs.h_indptr[B]);
      reqs.len = kept_len;
      reqs.sync();
      if (shrunk_indptr != reqs.h_indptr || shrunk_last != reqs.h_last ||
          !std::equal(shrunk_indices.begin(), shrunk_indices.end(), reqs.h_indices.begin()))
        log.add("shrink_page_table: the shrunk table is not the table of the new lengths");
      if (!log.ok()) return false;
    } else {
      reqs.len = kept_len;
    }
  }
  return true;
}

template <class T, class Policy>
bool run_layout(const config& c, mismatch_log& log) {
  return c.layout >= 2 ? run_case<T, Policy, true>(c, log) : run_case<T, Policy, false>(c, log);
}

template <class T>
bool run_typed(const config& c, mismatch_log& log) {
  switch (c.policy) {
    case 0: return run_layout<T, p_scissorhands>(c, log);
    case 1: return run_layout<T, p_h2o>(c, log);
    case 2: return run_layout<T, p_mass_window>(c, log);
    case 3: return run_layout<T, p_threshold_max>(c, log);
    case 4: return run_layout<T, p_mass_decay_max>(c, log);
    case 5: return run_layout<T, p_threshold_decay>(c, log);
    case 6: return run_layout<T, p_key_norm>(c, log);
    case 7: return run_layout<T, p_streaming>(c, log);
    default: return run_layout<T, p_random>(c, log);
  }
}

}  // namespace differential
