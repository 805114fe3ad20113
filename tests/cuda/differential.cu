// The CUDA backend against the host backend (the reference).
//
//   differential  random configurations (dtypes, layouts incl. paged and
//                 mixed K/V layouts, policies, GQA groups, head_dims incl.
//                 odd ones, ragged lengths, m, both compaction modes, q_len,
//                 both observe paths, admit, reset_sequence), several steps
//                 each. After every
//                 observe the state is compared; after every compress the
//                 lengths, freed pages, state and kept K/V rows. Exact
//                 (bitwise) everywhere except the scores of
//                 observe_queries, whose dot products are summed in another
//                 order: |device - host| <= 1e-4 * max(1, |host|), and for
//                 0/1 observations (threshold_indicator) at most 1% of the
//                 tokens of a step may flip (a probability within float
//                 rounding of alpha / n). Before compress the device state
//                 is reset to the host's, so compress is always compared
//                 exactly from identical inputs.
//   errors        device-side checks: status bits, nothing written, sticky
//                 word; host-side checks throw invalid_argument.
//   graph         observe + compress (and an engine's append) captured in a
//                 CUDA graph, replayed step after step, against the host.
//
// Usage: scissorhands_cuda_test [--configs N] [--seed S] [--graph-steps N]
//                               [--only differential|errors|graph] [--quick]
// --quick (for compute-sanitizer) runs 24 small configurations and 8 graph
// steps. Exit status: 0 all passed, 1 a failure, 77 no CUDA device.
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

namespace {

using namespace harness;
namespace sh = scissorhands;
constexpr auto host_space = sh::memory_space::host;
constexpr auto device_space = sh::memory_space::device;

// ---------------------------------------------------------------------------
// Policies under test
using p_scissorhands = sh::scissorhands_policy;
using p_h2o = sh::h2o_policy;
using p_mass_window = sh::eviction_policy<sh::attention_mass, sh::sliding_window>;
using p_threshold_max = sh::eviction_policy<sh::threshold_indicator, sh::unbounded_history, sh::recent_window, sh::gqa_max>;
using p_mass_decay_max = sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window, sh::gqa_max>;
using p_threshold_decay = sh::eviction_policy<sh::threshold_indicator, sh::exponential_decay>;
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
  std::uint32_t seed = 0;

  std::string describe() const {
    static const char* dtypes[] = {"fp32", "fp16", "bf16"};
    static const char* layouts[] = {"NHD", "HND", "paged-NHD", "paged-HND"};
    static const char* paths[] = {"probabilities", "queries+lse", "queries+lse2", "queries"};
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "config %d: %s %s%s %s via %s, batch %d, kv_heads %d, group %d, head_dim %d, capacity %d, "
                  "page %d, budget %d, m %d, recent %d, sinks %d, window %d, alpha %g, decay %g, normalize %d, "
                  "%s, steps %d, seed %u",
                  index, dtypes[dtype], layouts[layout], v_other_layout ? " (V other)" : "", policy_names[policy],
                  paths[path], batch, kv_heads, group, head_dim, capacity, page_size, budget, m, recent, sinks,
                  window, alpha, decay, normalize, preserve_order ? "preserve_order" : "fill_holes", steps, seed);
    return buf;
  }
};

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> options) {
  std::uniform_int_distribution<std::size_t> d(0, options.size() - 1);
  return *(options.begin() + d(rng));
}
int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool coin(std::mt19937_64& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

config make_config(std::mt19937_64& rng, int index, bool quick) {
  config c;
  c.index = index;
  c.dtype = uniform(rng, 0, 2);
  c.layout = uniform(rng, 0, 3);
  c.policy = uniform(rng, 0, num_policies - 1);
  c.path = policy_has_queries(c.policy) ? uniform(rng, 0, 3) : 0;
  const bool queries = c.path != 0;
  // One in 16 has a head longer than the selection's shared-memory tile.
  const bool long_head = !quick && index % 16 == 7;
  c.batch = long_head ? 1 : uniform(rng, 1, 4);
  c.kv_heads = long_head ? 1 : uniform(rng, 1, 3);
  c.group = pick(rng, {1, 2, 3, 4, 5, 8});
  c.head_dim = queries ? pick(rng, {64, 128, 256, 64, 128, 8, 16, 24, 40, 72, 3, 5, 7, 12})
                       : pick(rng, {8, 16, 64, 128, 3, 5, 12, 256});
  if (long_head) c.head_dim = pick(rng, {8, 16, 64});
  c.recent = uniform(rng, 0, 6);
  c.sinks = coin(rng, 0.3) ? uniform(rng, 1, 3) : 0;
  const int protect = c.recent + c.sinks;
  c.budget = long_head ? uniform(rng, 4200, 5200) : protect + uniform(rng, 1, quick ? 20 : 60);
  c.m = coin(rng, 0.4) ? 1 : uniform(rng, 1, c.budget - protect);
  c.capacity = c.budget + (long_head ? uniform(rng, 200, 900) : uniform(rng, 3, 40));
  c.page_size = pick(rng, {1, 2, 4, 5, 16});
  c.window = pick(rng, {1, 3, 8, 33, 64});
  c.alpha = pick(rng, {0.5f, 1.0f, 2.0f});
  c.decay = pick(rng, {0.5f, 0.9f, 1.0f});
  c.softmax_scale = coin(rng) ? 0.0f : pick(rng, {0.05f, 0.125f, 0.3f});
  c.normalize = coin(rng, 0.3);
  c.preserve_order = coin(rng);
  c.padded = coin(rng);
  c.v_other_layout = coin(rng, 0.25);
  c.ties = coin(rng, 0.3);
  c.freed_for_contiguous = coin(rng);
  c.steps = long_head ? 2 : uniform(rng, 2, 5);
  c.seed = static_cast<std::uint32_t>(rng());
  return c;
}

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

// State after observe or compress: counters exact, per-slot arrays for the
// slots each sequence holds. Returns whether they match (within the rule).
bool compare_state(const char* when, const sh::eviction_state<host_space>& h,
                   const sh::eviction_state<host_space>& d, const std::vector<int>& lengths, score_rule rule,
                   bool compare_ring, mismatch_log& log) {
  const auto& shape = h.shape;
  std::size_t compared = 0, flips = 0;
  for (int b = 0; b < shape.batch; ++b) {
    if (h.step[b] != d.step[b]) log.add(when, ": step[", b, "] host ", h.step[b], " device ", d.step[b]);
    if (h.next_position[b] != d.next_position[b])
      log.add(when, ": next_position[", b, "] host ", h.next_position[b], " device ", d.next_position[b]);
    if (h.tracked[b] != d.tracked[b]) log.add(when, ": tracked[", b, "] host ", h.tracked[b], " device ", d.tracked[b]);
    for (int head = 0; head < shape.kv_heads; ++head)
      for (int t = 0; t < lengths[b]; ++t) {
        const std::int64_t i = h.index(b, head, t);
        ++compared;
        if (h.positions[i] != d.positions[i])
          log.add(when, ": position (", b, ",", head, ",", t, ") host ", h.positions[i], " device ", d.positions[i]);
        if (!same_bits(h.observed[i], d.observed[i]))
          log.add(when, ": observed (", b, ",", head, ",", t, ") host ", h.observed[i], " device ", d.observed[i]);
        if (rule.exact) {
          if (!same_bits(h.scores[i], d.scores[i]))
            log.add(when, ": score (", b, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i]);
        } else {
          const float tol = 1e-4f * std::max(1.0f, std::fabs(h.scores[i]));
          if (!(std::fabs(h.scores[i] - d.scores[i]) <= tol)) {
            if (rule.binary)
              ++flips;
            else
              log.add(when, ": score (", b, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i],
                      " beyond tolerance ", tol);
          }
        }
        if (compare_ring)
          for (int w = 0; w < shape.ring_words; ++w)
            if (h.ring_of(i)[w] != d.ring_of(i)[w])
              log.add(when, ": ring word ", w, " of (", b, ",", head, ",", t, ") host ", h.ring_of(i)[w], " device ",
                      d.ring_of(i)[w]);
      }
  }
  if (flips > std::max<std::size_t>(1, compared / 100))
    log.add(when, ": ", flips, " of ", compared, " 0/1 scores flipped, above the 1% allowed");
  return log.ok();
}

template <class T>
void fill_random(std::vector<T>& v, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : v) x = from_float<T>(d(rng));
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
  constexpr bool attention = Policy::observation::needs_attention;
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 17);

  const int B = c.batch, H = c.kv_heads, D = c.head_dim, G = c.group, QH = H * G;
  const int P = c.page_size;
  const int max_pages = Paged ? (c.capacity + P - 1) / P : 0;
  const int num_pages = Paged ? B * max_pages + 3 : 0;  // a few pages no sequence uses
  const int cap = Paged ? max_pages * P : c.capacity;
  const bool hnd = c.layout % 2 == 1;
  const std::size_t elements = Paged ? static_cast<std::size_t>(num_pages) * P * H * D
                                     : static_cast<std::size_t>(B) * cap * H * D;

  std::vector<T> hk(elements), hv(elements);
  fill_random(hk, rng, -2.0f, 2.0f);
  fill_random(hv, rng, -2.0f, 2.0f);
  device_buffer<T> dk(elements), dv(elements);

  // Lengths or the page table, on both sides.
  std::vector<int> len(B, 0);
  std::vector<std::vector<std::int32_t>> pages(B);
  std::vector<std::int32_t> h_lengths(B), h_indptr(B + 1), h_indices(std::max(1, B * max_pages)), h_last(B),
      h_freed(B, -1);
  device_buffer<std::int32_t> d_lengths(B), d_indptr(B + 1), d_indices(h_indices.size()), d_last(B), d_freed(B);
  if constexpr (Paged) {
    std::vector<std::int32_t> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int b = 0; b < B; ++b) pages[b].assign(ids.begin() + b * max_pages, ids.begin() + (b + 1) * max_pages);
  }
  auto sync_table = [&] {
    if constexpr (Paged) {
      h_indptr[0] = 0;
      for (int b = 0; b < B; ++b) {
        const int used = (len[b] + P - 1) / P;
        for (int i = 0; i < used; ++i) h_indices[h_indptr[b] + i] = pages[b][i];
        h_indptr[b + 1] = h_indptr[b] + used;
        h_last[b] = used == 0 ? 0 : len[b] - (used - 1) * P;
      }
      d_indptr.upload(h_indptr);
      d_indices.upload(h_indices);
      d_last.upload(h_last);
    } else {
      for (int b = 0; b < B; ++b) h_lengths[b] = len[b];
      d_lengths.upload(h_lengths);
    }
  };
  // The layouts K and V use (V may use the other one).
  auto host_view = [&] {
    if constexpr (Paged) {
      auto v = sh::make_paged_kv_view(sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
                                      sh::host_span<const std::int32_t>(h_indptr.data(), h_indptr.size()),
                                      sh::host_span<const std::int32_t>(h_indices.data(), h_indices.size()),
                                      sh::host_span<std::int32_t>(h_last.data(), h_last.size()), B, H, D, P,
                                      num_pages, max_pages, hnd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::paged_layout::nhd(P, H, D) : sh::paged_layout::hnd(P, H, D);
      return v;
    } else {
      auto v = sh::make_kv_view(sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
                                sh::host_span<std::int32_t>(h_lengths.data(), h_lengths.size()), B, H, D, cap,
                                hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::kv_layout::nhd(cap, H, D) : sh::kv_layout::hnd(cap, H, D);
      return v;
    }
  };
  auto device_view = [&] {
    if constexpr (Paged) {
      auto v = sh::make_paged_kv_view(dk.span(), dv.span(),
                                      sh::device_span<const std::int32_t>(d_indptr.data(), d_indptr.size()),
                                      sh::device_span<const std::int32_t>(d_indices.data(), d_indices.size()),
                                      d_last.span(), B, H, D, P, num_pages, max_pages, hnd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::paged_layout::nhd(P, H, D) : sh::paged_layout::hnd(P, H, D);
      return v;
    } else {
      auto v = sh::make_kv_view(dk.span(), dv.span(), d_lengths.span(), B, H, D, cap,
                                hnd ? sh::named_layout::hnd : sh::named_layout::nhd);
      if (c.v_other_layout) v.v_layout = hnd ? sh::kv_layout::nhd(cap, H, D) : sh::kv_layout::hnd(cap, H, D);
      return v;
    }
  };
  sync_table();
  const auto hview0 = host_view();

  // State, workspaces, status.
  const sh::state_shape shape = sh::state_shape_for(policy, hview0);
  const std::size_t state_bytes = sh::state_bytes(shape);
  aligned_bytes h_state_buf(state_bytes), snapshot(state_bytes);
  device_buffer<std::byte> d_state_buf(state_bytes);
  const auto hst = sh::make_state(h_state_buf.span(), shape);
  const auto dst = sh::make_state(d_state_buf.span(), shape);
  const auto dsnap = sh::make_state(snapshot.span(), shape);
  sh::host::reset_state(hst);
  CUDA_CHECK(sh::cuda::reset_state(dst));
  aligned_bytes h_ws(sh::host::compress_workspace_bytes(hview0));
  std::size_t d_ws_bytes = 0;
  device_buffer<std::uint32_t> status(1);
  CUDA_CHECK(cudaMemset(status.data(), 0, sizeof(std::uint32_t)));
  CUDA_CHECK(sh::cuda::compress(nullptr, d_ws_bytes, policy, device_view(), dst, c.budget, {}, status.data()));
  device_buffer<std::byte> d_ws(d_ws_bytes);

  auto status_ok = [&](const char* when) {
    std::uint32_t word = 0;
    status.download(&word, 1);
    if (word != 0) log.add(when, ": status word ", word, " (", sh::cuda::describe_status(word), ")");
    return word == 0;
  };
  auto download_state = [&] { d_state_buf.download(snapshot.data(), state_bytes); };

  for (int step = 0; step < c.steps; ++step) {
    // 0. Now and then the engine reuses a batch slot for a new request.
    if (step > 0 && coin(rng, 0.15)) {
      const int b = uniform(rng, 0, B - 1), start = uniform(rng, 0, 1000);
      sh::host::reset_sequence(hst, b, start);
      CUDA_CHECK(sh::cuda::reset_sequence(dst, b, start));
      len[b] = 0;
    }
    // 1. The engine appends tokens (ragged; at least one when observing).
    for (int b = 0; b < B; ++b) {
      int add;
      if (step == 0)
        add = uniform(rng, attention ? 1 : 0, c.capacity);
      else
        add = uniform(rng, attention ? 1 : 0, 3);
      add = std::min(add, c.capacity - len[b]);
      for (int t = len[b]; t < len[b] + add; ++t)
        for (int h = 0; h < H; ++h) {
          std::int64_t ko, vo;
          if constexpr (Paged) {
            const auto v = hview0;
            ko = v.k_layout.offset(pages[b][t / P], h, t % P);
            vo = v.v_layout.offset(pages[b][t / P], h, t % P);
          } else {
            ko = hview0.k_layout.offset(b, h, t);
            vo = hview0.v_layout.offset(b, h, t);
          }
          std::uniform_real_distribution<float> d(-2.0f, 2.0f);
          for (int x = 0; x < D; ++x) {
            hk[ko + x] = from_float<T>(d(rng));
            hv[vo + x] = from_float<T>(d(rng));
          }
        }
      len[b] += add;
    }
    sync_table();
    dk.upload(hk);
    dv.upload(hv);
    const auto hview = host_view();
    const auto dview = device_view();
    const std::vector<int> observed_len = len;

    // 2. Observe, on both sides, from the same inputs.
    const int min_len = *std::min_element(len.begin(), len.end());
    const int max_len = *std::max_element(len.begin(), len.end());
    int q_len = 1;
    if (attention) {
      q_len = step == 0 ? uniform(rng, 1, std::min(8, min_len)) : (coin(rng, 0.8) ? 1 : uniform(rng, 1, std::min(3, min_len)));
    }
    const bool queries = c.path != 0;
    if (!attention && coin(rng)) {
      // Static policies: admit is all observe does; check the entry point too.
      sh::host::admit(policy, hview, hst);
      CUDA_CHECK(sh::cuda::admit(policy, dview, dst, status.data()));
      CUDA_CHECK(cudaDeviceSynchronize());
    } else if (!queries) {
      const int cols = std::max(1, max_len + (c.padded ? 5 : 0));
      std::vector<float> probs(static_cast<std::size_t>(B) * QH * q_len * cols,
                               std::numeric_limits<float>::quiet_NaN());  // never read beyond visible
      std::normal_distribution<float> logit(0.0f, 2.0f);
      for (int b = 0; b < B; ++b)
        for (int qh = 0; qh < QH; ++qh)
          for (int j = 0; j < q_len; ++j) {
            float* row = probs.data() + ((static_cast<std::size_t>(b) * QH + qh) * q_len + j) * cols;
            const int visible = len[b] - q_len + j + 1;
            float total = 0.0f;
            for (int t = 0; t < visible; ++t) total += (row[t] = std::exp(logit(rng)));
            for (int t = 0; t < visible; ++t) {
              row[t] /= total;
              if (c.ties) row[t] = std::round(row[t] * 16.0f) / 16.0f;  // many equal scores
            }
          }
      device_buffer<float> d_probs(probs.size());
      d_probs.upload(probs);
      const auto hp = sh::probability_view<host_space>::dense({probs.data(), probs.size()}, QH, q_len, cols);
      const auto dp = sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, q_len, cols);
      sh::host::observe_probabilities(policy, hview, hst, hp);
      CUDA_CHECK(sh::cuda::observe_probabilities(policy, dview, dst, dp, status.data()));
      CUDA_CHECK(cudaDeviceSynchronize());
    } else if constexpr (queries_tested<Policy>) {
      std::vector<T> q(static_cast<std::size_t>(B) * q_len * QH * D);
      fill_random(q, rng, -2.0f, 2.0f);
      device_buffer<T> d_q(q.size());
      d_q.upload(q);
      const auto hq = sh::query_view<T, host_space>::dense({q.data(), q.size()}, QH, q_len, D);
      const auto dq = sh::query_view<T, device_space>::dense({d_q.data(), d_q.size()}, QH, q_len, D);
      const float scale = c.softmax_scale > 0.0f ? c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
      std::vector<float> lse;
      const sh::lse_base base = c.path == 2 ? sh::lse_base::base2 : sh::lse_base::natural;
      if (c.path != 3) {
        // The log-sum-exp an attention kernel would return.
        lse.resize(static_cast<std::size_t>(B) * QH * q_len);
        for (int b = 0; b < B; ++b)
          for (int qh = 0; qh < QH; ++qh)
            for (int j = 0; j < q_len; ++j) {
              const int visible = len[b] - q_len + j + 1;
              std::vector<double> logits(visible);
              double m = -1e300;
              for (int t = 0; t < visible; ++t) {
                const T* k = hview.k_row(b, qh / G, t);
                const T* qr = hq.row(b, qh, j);
                double dot = 0.0;
                for (int x = 0; x < D; ++x) dot += double(sh::to_float(qr[x])) * sh::to_float(k[x]);
                logits[t] = dot * scale;
                m = std::max(m, logits[t]);
              }
              double sum = 0.0;
              for (double l : logits) sum += std::exp(l - m);
              const double value = m + std::log(sum);
              lse[(static_cast<std::size_t>(b) * QH + qh) * q_len + j] =
                  static_cast<float>(base == sh::lse_base::base2 ? value / std::log(2.0) : value);
            }
      }
      device_buffer<float> d_lse(lse.size());
      if (!lse.empty()) d_lse.upload(lse);
      const auto hl = lse.empty() ? sh::lse_view<host_space>{}
                                  : sh::lse_view<host_space>::dense({lse.data(), lse.size()}, QH, q_len, base);
      const auto dl = lse.empty() ? sh::lse_view<device_space>{}
                                  : sh::lse_view<device_space>::dense({d_lse.data(), d_lse.size()}, QH, q_len, base);
      sh::host::observe_queries(policy, hview, hst, hq, hl, c.softmax_scale);
      CUDA_CHECK(sh::cuda::observe_queries(policy, dview, dst, dq, dl, c.softmax_scale, status.data()));
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    if (!status_ok("observe")) return false;
    download_state();
    const score_rule after_observe{!queries, Policy::observation::binary};
    if (!compare_state("after observe", hst, dsnap, observed_len, after_observe, !queries, log)) return false;
    // Compress from identical inputs whatever the observe path.
    if (queries) d_state_buf.upload(h_state_buf.data(), state_bytes);

    // 3. Compress.
    const bool with_freed = Paged || c.freed_for_contiguous;
    std::fill(h_freed.begin(), h_freed.end(), -1);
    d_freed.upload(h_freed);
    sh::host::compress(policy, hview, hst, c.budget, h_ws.span(),
                       with_freed ? sh::host_span<std::int32_t>(h_freed.data(), B) : sh::host_span<std::int32_t>{});
    CUDA_CHECK(sh::cuda::compress(d_ws.data(), d_ws_bytes, policy, dview, dst, c.budget,
                                  with_freed ? d_freed.span() : sh::device_span<std::int32_t>{}, status.data()));
    CUDA_CHECK(cudaDeviceSynchronize());
    if (!status_ok("compress")) return false;

    // The new lengths (paged: the engine drops the freed pages).
    std::vector<int> kept_len(B);
    if constexpr (Paged) {
      const auto dev_last = d_last.download();
      const auto dev_freed = d_freed.download();
      for (int b = 0; b < B; ++b) {
        if (dev_last[b] != h_last[b]) log.add("compress: last_page_len[", b, "] host ", h_last[b], " device ", dev_last[b]);
        if (dev_freed[b] != h_freed[b]) log.add("compress: freed_pages[", b, "] host ", h_freed[b], " device ", dev_freed[b]);
        const int kept_pages = (h_indptr[b + 1] - h_indptr[b]) - h_freed[b];
        kept_len[b] = kept_pages == 0 ? 0 : (kept_pages - 1) * P + h_last[b];
      }
    } else {
      const auto dev_len = d_lengths.download();
      for (int b = 0; b < B; ++b) {
        if (dev_len[b] != h_lengths[b]) log.add("compress: length[", b, "] host ", h_lengths[b], " device ", dev_len[b]);
        kept_len[b] = h_lengths[b];
      }
      if (with_freed) {
        const auto dev_freed = d_freed.download();
        for (int b = 0; b < B; ++b)
          if (dev_freed[b] != h_freed[b]) log.add("compress: freed_pages[", b, "] host ", h_freed[b], " device ", dev_freed[b]);
      }
    }
    if (!log.ok()) return false;
    download_state();
    if (!compare_state("after compress", hst, dsnap, kept_len, score_rule{}, true, log)) return false;
    // Kept K and V rows, bit for bit.
    const auto dev_k = dk.download(), dev_v = dv.download();
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < kept_len[b]; ++t) {
          const std::size_t ko = static_cast<std::size_t>(hview.k_row(b, h, t) - hk.data());
          const std::size_t vo = static_cast<std::size_t>(hview.v_row(b, h, t) - hv.data());
          if (std::memcmp(&hk[ko], &dev_k[ko], sizeof(T) * D) != 0)
            log.add("compress: K row (", b, ",", h, ",", t, ") differs");
          if (std::memcmp(&hv[vo], &dev_v[vo], sizeof(T) * D) != 0)
            log.add("compress: V row (", b, ",", h, ",", t, ") differs");
        }
    if (!log.ok()) return false;
    len = kept_len;
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

bool run_config(const config& c, mismatch_log& log) {
  try {
    switch (c.dtype) {
      case 0: return run_typed<float>(c, log);
      case 1: return run_typed<__half>(c, log);
      default: return run_typed<__nv_bfloat16>(c, log);
    }
  } catch (const std::exception& e) {
    log.add("unexpected exception: ", e.what());
    return false;
  }
}

int run_differential(int configs, std::uint64_t seed, bool quick) {
  std::mt19937_64 rng(seed);
  int failed = 0;
  int by_path[4] = {0, 0, 0, 0}, by_layout[4] = {0, 0, 0, 0}, by_dtype[3] = {0, 0, 0};
  for (int i = 0; i < configs; ++i) {
    const config c = make_config(rng, i, quick);
    mismatch_log log;
    if (!run_config(c, log)) {
      if (++failed <= 10) std::printf("FAIL %s\n%s", c.describe().c_str(), log.text.str().c_str());
    }
    ++by_path[c.path];
    ++by_layout[c.layout];
    ++by_dtype[c.dtype];
  }
  std::printf("differential: %d of %d configurations passed (paths: probabilities %d, queries+lse %d, "
              "queries+lse2 %d, queries %d; layouts NHD %d, HND %d, paged NHD %d, paged HND %d; fp32 %d, fp16 %d, "
              "bf16 %d)\n",
              configs - failed, configs, by_path[0], by_path[1], by_path[2], by_path[3], by_layout[0], by_layout[1],
              by_layout[2], by_layout[3], by_dtype[0], by_dtype[1], by_dtype[2]);
  return failed;
}

}  // namespace

#include "device_checks.cuh"  // run_error_tests, run_graph_test

int main(int argc, char** argv) {
  int configs = 1200, graph_steps = 96;
  std::uint64_t seed = 20230517;
  std::string only;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--configs") configs = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--graph-steps") graph_steps = std::stoi(next());
    else if (a == "--only") only = next();
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--configs N] [--seed S] [--graph-steps N] [--only differential|errors|graph] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (quick) {
    configs = std::min(configs, 24);
    graph_steps = std::min(graph_steps, 8);
  }
  require_device_or_skip(argv[0]);
  cudaDeviceProp prop{};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("device %d: %s (sm_%d%d), seed %llu\n", device, prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(seed));

  int failures = 0;
  if (only.empty() || only == "differential") failures += run_differential(configs, seed, quick);
  if (only.empty() || only == "errors") failures += run_error_tests();
  if (only.empty() || only == "graph") failures += run_graph_test(graph_steps);
  std::printf(failures == 0 ? "all passed\n" : "%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
