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

#include "harness.cuh"
#include "requests.cuh"

namespace differential {

using namespace harness;
namespace sh = scissorhands;
constexpr auto host_space = sh::memory_space::host;
constexpr auto device_space = sh::memory_space::device;

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
struct config {
  int index = 0;
  int dtype = 0;   // 0 fp32, 1 fp16, 2 bf16
  int layout = 0;  // 0 NHD, 1 HND, 2 paged NHD, 3 paged HND
  int policy = 0;
  int path = 0;  // 0 probabilities, 1 queries + natural lse, 2 queries + base-2 lse, 3 queries, own normaliser
  int batch = 1, kv_heads = 1, group = 1, head_dim = 8;
  int capacity = 16, page_size = 4, budget = 8, m = 1;
  int recent = 0, sinks = 0, window = 8, steps = 3;
  float alpha = 1.0f, decay = 0.9f, softmax_scale = 0.0f;
  bool normalize = false, preserve_order = false, padded = false, v_other_layout = false, ties = false;
  bool freed_for_contiguous = false;
  bool mapped = false;       // state_rows: requests move between batch positions, padding slots
  bool ragged = false;       // qo_indptr views
  bool token_major = false;  // uniform lse: token-major instead of head-major
  bool tight_state = false;  // state capacity below the cache's
  std::uint32_t seed = 0;
  int pool_width = 1;     // SnapKV pooling (preserve_order only)
  bool pool_max = false;  // max pooling, else mean

  std::string describe() const {
    static const char* dtypes[] = {"fp32", "fp16", "bf16"};
    static const char* layouts[] = {"NHD", "HND", "paged-NHD", "paged-HND"};
    static const char* paths[] = {"probabilities", "queries+lse", "queries+lse2", "queries"};
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "config %d: %s %s%s %s via %s%s%s, batch %d%s, kv_heads %d, group %d, head_dim %d, capacity %d%s, "
                  "page %d, budget %d, m %d, recent %d, sinks %d, window %d, alpha %g, decay %g, normalize %d, "
                  "%s, pool %d %s, steps %d, seed %u",
                  index, dtypes[dtype], layouts[layout], v_other_layout ? " (V other)" : "", policy_names[policy],
                  paths[path], ragged ? " ragged" : "", token_major ? " token-major lse" : "", batch,
                  mapped ? " (state rows)" : "", kv_heads, group, head_dim, capacity,
                  tight_state ? " (tight state)" : "", page_size, budget, m, recent, sinks, window, alpha, decay,
                  normalize, preserve_order ? "preserve_order" : "fill_holes", pool_width, pool_max ? "max" : "mean",
                  steps, seed);
    return buf;
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

// Random draws.
template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> options) {
  std::uniform_int_distribution<std::size_t> d(0, options.size() - 1);
  return *(options.begin() + d(rng));
}
inline int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
inline bool coin(std::mt19937_64& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

// ---------------------------------------------------------------------------
// Comparisons

// Bitwise equality of two 4-byte values (NaN-safe).
template <class X>
bool same_bits(const X& a, const X& b) {
  return std::memcmp(&a, &b, sizeof(X)) == 0;
}

struct score_rule {
  bool exact = true;
  bool binary = false;
};

// A state row to compare and how many slots it holds.
struct row_slots {
  int row = 0, slots = 0;
};

// State after observe or compress: each listed row's counters exact, its
// per-slot arrays for the slots it holds. Returns whether they match
// (within the rule).
inline bool compare_state(const char* when, const sh::eviction_state<host_space>& h,
                   const sh::eviction_state<host_space>& d, const std::vector<row_slots>& rows, score_rule rule,
                   bool compare_ring, mismatch_log& log) {
  const auto& shape = h.shape;
  std::size_t compared = 0, flips = 0;
  // Every row's ticket word is back to 0 after a launch (finish_block).
  for (int r = 0; r < shape.rows; ++r)
    if (d.blocks_done[r] != 0) log.add(when, ": blocks_done[", r, "] is ", d.blocks_done[r], ", not 0");
  for (const row_slots& rs : rows) {
    const int r = rs.row;
    if (h.step[r] != d.step[r]) log.add(when, ": step[", r, "] host ", h.step[r], " device ", d.step[r]);
    if (h.next_position[r] != d.next_position[r])
      log.add(when, ": next_position[", r, "] host ", h.next_position[r], " device ", d.next_position[r]);
    if (h.tracked[r] != d.tracked[r]) log.add(when, ": tracked[", r, "] host ", h.tracked[r], " device ", d.tracked[r]);
    for (int head = 0; head < shape.kv_heads; ++head)
      for (int t = 0; t < rs.slots; ++t) {
        const std::int64_t i = h.row_index(r, head, t);
        ++compared;
        if (h.positions[i] != d.positions[i])
          log.add(when, ": position (row ", r, ",", head, ",", t, ") host ", h.positions[i], " device ",
                  d.positions[i]);
        if (!same_bits(h.observed[i], d.observed[i]))
          log.add(when, ": observed (row ", r, ",", head, ",", t, ") host ", h.observed[i], " device ",
                  d.observed[i]);
        if (rule.exact) {
          if (!same_bits(h.scores[i], d.scores[i]))
            log.add(when, ": score (row ", r, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i]);
        } else {
          const float tol = 1e-4f * std::max(1.0f, std::fabs(h.scores[i]));
          if (!(std::fabs(h.scores[i] - d.scores[i]) <= tol)) {
            if (rule.binary)
              ++flips;
            else
              log.add(when, ": score (row ", r, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i],
                      " beyond tolerance ", tol);
          }
        }
        if (compare_ring)
          for (int w = 0; w < shape.ring_words; ++w)
            if (h.ring_of(i)[w] != d.ring_of(i)[w])
              log.add(when, ": ring word ", w, " of (row ", r, ",", head, ",", t, ") host ", h.ring_of(i)[w],
                      " device ", d.ring_of(i)[w]);
      }
  }
  if (flips > std::max<std::size_t>(1, compared / 100))
    log.add(when, ": ", flips, " of ", compared, " 0/1 scores flipped, above the 1% allowed");
  return log.ok();
}

// The device's status words, all of which must be zero in a valid run.
inline bool status_clear(const char* when, const sh::eviction_state<host_space>& d, mismatch_log& log) {
  for (int r = 0; r < d.shape.rows; ++r)
    if (d.status[r] != 0)
      log.add(when, ": status word of row ", r, " is ", d.status[r], " (", sh::cuda::describe_status(d.status[r]), ")");
  return log.ok();
}

template <class T>
void fill_random(std::vector<T>& v, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : v) x = from_float<T>(d(rng));
}

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
  sh::settings& s = policy.config;
  s.window = c.window;
  s.recent = c.recent;
  s.sinks = c.sinks;
  s.evict_count = c.m;
  s.alpha = c.alpha;
  s.decay = c.decay;
  s.normalize = c.normalize;
  s.compaction_mode = c.preserve_order ? sh::compaction::preserve_order : sh::compaction::fill_holes;
  s.seed = c.seed;
  s.pool_width = c.pool_width;
  s.pool_mode = c.pool_max ? sh::pooling::max : sh::pooling::mean;
  constexpr bool attention = Policy::observation::needs_attention;
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 17);

  const int B = c.batch, H = c.kv_heads, D = c.head_dim, G = c.group, QH = H * G;
  const int P = c.page_size;
  const int max_pages = Paged ? (c.capacity + P - 1) / P : 0;
  const int num_pages = Paged ? B * max_pages + 3 : 0;  // a few reqs.pages no sequence uses
  const int cap = Paged ? max_pages * P : c.capacity;
  const bool hnd = c.layout % 2 == 1;
  const std::size_t elements = Paged ? static_cast<std::size_t>(num_pages) * P * H * D
                                     : static_cast<std::size_t>(B) * cap * H * D;
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
  auto host_view = [&] {
    if constexpr (Paged) {
      auto v = sh::make_paged_kv_view(sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
                                      sh::host_span<const std::int32_t>(reqs.h_indptr.data(), reqs.h_indptr.size()),
                                      sh::host_span<const std::int32_t>(reqs.h_indices.data(), reqs.h_indices.size()),
                                      sh::host_span<const std::int32_t>(reqs.h_last.data(), reqs.h_last.size()), B, H,
                                      D, P, num_pages, max_pages, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::paged_layout::nhd(P, H, D) : sh::paged_layout::hnd(P, H, D);
      return v;
    } else {
      auto v = sh::make_kv_view(sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
                                sh::host_span<const std::int32_t>(reqs.h_lengths.data(), reqs.h_lengths.size()), B, H,
                                D, cap, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::kv_layout::nhd(cap, H, D) : sh::kv_layout::hnd(cap, H, D);
      return v;
    }
  };
  auto device_view = [&] {
    if constexpr (Paged) {
      auto v = sh::make_paged_kv_view(dk.span(), dv.span(),
                                      sh::device_span<const std::int32_t>(reqs.d_indptr.data(), reqs.d_indptr.size()),
                                      sh::device_span<const std::int32_t>(reqs.d_indices.data(), reqs.d_indices.size()),
                                      sh::device_span<const std::int32_t>(reqs.d_last.data(), reqs.d_last.size()), B, H,
                                      D, P, num_pages, max_pages, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::paged_layout::nhd(P, H, D) : sh::paged_layout::hnd(P, H, D);
      return v;
    } else {
      auto v = sh::make_kv_view(dk.span(), dv.span(),
                                sh::device_span<const std::int32_t>(reqs.d_lengths.data(), reqs.d_lengths.size()), B, H,
                                D, cap, hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::kv_layout::nhd(cap, H, D) : sh::kv_layout::hnd(cap, H, D);
      return v;
    }
  };
  reqs.sync();
  const auto hview0 = host_view();
  std::int64_t block = 0;  // one position's K (and V) elements
  if constexpr (!Paged) block = hview0.k_layout.sequence_stride;

  // State, workspaces; the state seen through the batch when mapped.
  const sh::state_shape shape{rows, H, state_cap, policy.ring_words()};
  const std::size_t state_bytes = sh::state_bytes(shape);
  aligned_bytes h_state_buf(state_bytes), snapshot(state_bytes);
  device_buffer<std::byte> d_state_buf(state_bytes);
  const auto hst0 = sh::make_state(h_state_buf.span(), shape);
  const auto dst0 = sh::make_state(d_state_buf.span(), shape);
  const auto dsnap = sh::make_state(snapshot.span(), shape);
  const auto hst = c.mapped ? hst0.for_batch(sh::host_span<const std::int32_t>(reqs.h_rows.data(), B)) : hst0;
  const auto dst = c.mapped ? dst0.for_batch(sh::device_span<const std::int32_t>(reqs.d_rows.data(), B)) : dst0;
  sh::host::reset_state(hst0);
  CUDA_CHECK(sh::cuda::reset_state(dst0));
  aligned_bytes h_ws(sh::host::compress_workspace_bytes(hview0));
  std::size_t d_ws_bytes = 0;
  CUDA_CHECK(sh::cuda::compress(nullptr, d_ws_bytes, policy, device_view(), dst, c.budget, {}));
  device_buffer<std::byte> d_ws(d_ws_bytes);
  device_buffer<sh::cuda::shrink_result> d_result(1);

  auto download_state = [&] { d_state_buf.download(snapshot.data(), state_bytes); };
  auto live_rows = [&](const std::vector<int>& slots) {
    std::vector<row_slots> out;
    for (int q = 0; q < live; ++q) out.push_back({reqs.row_of[q], slots[q]});
    return out;
  };

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
    if (c.mapped && step > 0 && coin(rng, 0.5)) {
      std::vector<int> p(B);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), rng);
      if constexpr (!Paged) {
        const std::vector<T> k_old = hk, v_old = hv;
        for (int q = 0; q < live; ++q) {
          std::copy_n(k_old.begin() + reqs.pos_of[q] * block, block, hk.begin() + p[q] * block);
          std::copy_n(v_old.begin() + reqs.pos_of[q] * block, block, hv.begin() + p[q] * block);
        }
      }
      reqs.move_to(p);
    }
    // 1. The engine appends tokens (ragged, none for some).
    for (int q = 0; q < live; ++q) {
      int add = step == 0 ? uniform(rng, 0, most) : uniform(rng, 0, 3);
      if (step == 0 && coin(rng, 0.8)) add = std::max(add, 1);
      add = std::min(add, most - reqs.len[q]);
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

    // 2. This step's queries: uniform q_len (at most the shortest non-empty
    //    sequence, 0 now and then) or ragged per sequence (0 for some,
    //    anything for positions holding no token: they are skipped).
    int min_len = std::numeric_limits<int>::max(), max_len = 0;
    for (int b = 0; b < B; ++b) {
      const int l = reqs.len_at(b);
      if (l > 0) min_len = std::min(min_len, l);
      max_len = std::max(max_len, l);
    }
    if (min_len == std::numeric_limits<int>::max()) min_len = 8;
    const bool ragged = attention && c.ragged;
    int q_len = 0;
    std::vector<std::int32_t> h_qo(B + 1, 0);
    std::vector<int> q_of(B, 0);
    if (ragged) {
      for (int b = 0; b < B; ++b) {
        const int l = reqs.len_at(b);
        if (l == 0)
          q_of[b] = uniform(rng, 0, 2);
        else if (coin(rng, 0.2))
          q_of[b] = 0;
        else
          q_of[b] = coin(rng, 0.5) ? 1 : uniform(rng, 1, std::min(l, 8));
        h_qo[b + 1] = h_qo[b] + q_of[b];
      }
    } else if (attention) {
      q_len = coin(rng, 0.05) ? 0
              : step == 0     ? uniform(rng, 1, std::min(8, min_len))
                              : (coin(rng, 0.8) ? 1 : uniform(rng, 1, std::min(3, min_len)));
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
            const int visible = l - q_of[b] + j + 1;
            float total = 0.0f;
            for (int t = 0; t < visible; ++t) total += (row[t] = std::exp(logit(rng)));
            for (int t = 0; t < visible; ++t) {
              row[t] /= total;
              if (c.ties) row[t] = std::round(row[t] * 16.0f) / 16.0f;  // many equal scores
            }
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
    download_state();
    if (!status_clear("observe", dsnap, log)) return false;
    const score_rule after_observe{!queries, Policy::observation::binary};
    if (!compare_state("after observe", hst0, dsnap, live_rows(observed_len), after_observe, !queries, log))
      return false;
    // Compress from identical inputs whatever the observe path.
    if (queries) d_state_buf.upload(h_state_buf.data(), state_bytes);

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
    download_state();
    if (!status_clear("compress", dsnap, log)) return false;
    {
      const auto dev_new = d_new.download(), dev_freed = d_freed.download();
      for (int b = 0; b < B; ++b) {
        if (dev_new[b] != h_new[b]) log.add("compress: new_lengths[", b, "] host ", h_new[b], " device ", dev_new[b]);
        if (h_new[b] != sh::length_after_compress(reqs.len_at(b), c.budget, c.m))
          log.add("compress: new_lengths[", b, "] ", h_new[b], " is not length_after_compress");
        if (with_freed && dev_freed[b] != h_freed[b])
          log.add("compress: freed_pages[", b, "] host ", h_freed[b], " device ", dev_freed[b]);
      }
    }
    if (!log.ok()) return false;
    std::vector<int> kept_len(live);
    const auto who = reqs.at_position();
    for (int b = 0; b < B; ++b)
      if (who[b] >= 0) kept_len[who[b]] = h_new[b];
    if (!compare_state("after compress", hst0, dsnap, live_rows(kept_len), score_rule{}, true, log)) return false;
    // Kept K and V rows, bit for bit.
    const auto dev_k = dk.download(), dev_v = dv.download();
    for (int q = 0; q < live; ++q)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < kept_len[q]; ++t) {
          const int b = reqs.pos_of[q];
          const std::size_t ko = static_cast<std::size_t>(hview.k_row(b, h, t) - hk.data());
          const std::size_t vo = static_cast<std::size_t>(hview.v_row(b, h, t) - hv.data());
          if (std::memcmp(&hk[ko], &dev_k[ko], sizeof(T) * D) != 0)
            log.add("compress: K row (request ", q, " at ", b, ",", h, ",", t, ") differs");
          if (std::memcmp(&hv[vo], &dev_v[vo], sizeof(T) * D) != 0)
            log.add("compress: V row (request ", q, " at ", b, ",", h, ",", t, ") differs");
        }
    if (!log.ok()) return false;

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
