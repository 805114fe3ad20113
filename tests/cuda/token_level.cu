// Token-level eviction on the CUDA backend against the host backend (the
// reference): compress at shared_heads, select + compact / forget at
// shared_layers (policy/granularity.hpp).
//
//   differential  random configurations (fp32 / fp16; contiguous NHD, HND,
//                 paged NHD, HND; four policies, among them the paper's
//                 unimportant count (evicts_highest), H2O, a static one
//                 (key norm) and a threshold + decay + GQA max one; mean /
//                 max head and layer reductions; fill_holes and
//                 preserve_order; pinned prefixes; state rows with padding
//                 positions; compact and forget; sequences beyond the
//                 selection's shared-memory tile), several steps each as an
//                 engine runs them: append to every layer, observe every
//                 layer, then compress every layer (shared_heads) or select
//                 once and compact / forget every layer (shared_layers),
//                 then apply the new lengths (the test removes forgotten
//                 rows itself, keeping the order, as a slot-allocator
//                 engine does). Compared bit for bit: the state after
//                 observe, the selection (counts, slots, cache_slots,
//                 new_lengths, freed_pages) or compress's outputs, and
//                 after compaction every layer's state and kept K/V rows.
//   errors        device checks (a fault in one sequence: its status bit
//                 set, in every layer for select; the others equal to the
//                 host's run without it; nothing of it written), batch-wide
//                 and sticky conditions, shared pages (refused where
//                 written, accepted where pinned), and host-side argument
//                 refusals (invalid_argument, nothing launched).
//   graph         select + compact of every layer captured in a CUDA graph
//                 and replayed, against the host.
//   tensor_parallel
//                 simulated ranks, each holding some of every layer's heads
//                 (partial_scores.hpp): cuda::local_scores against the
//                 host's, then select on the reduced scores against one
//                 rank over all heads; one rank's local_scores + select
//                 captured in a CUDA graph. tensor_parallel_multi_gpu (only when
//                 named in --only) puts rank k on device k % count and exits
//                 77 below two devices.
//   combined_score
//                 select_shared_kernel's per-slot score
//                 (cuda::detail::combined_score, host and device code)
//                 called on the host over host memory, against the host
//                 backend's combine_slot_scores / combine_reduced_scores bit
//                 for bit: head counts on both sides of its 8-head load
//                 groups, pooled and not, normalised or not, NaN scores and
//                 zero counts, from the state and from reduced scores, and
//                 a head holding another token (mismatch); and
//                 local_scores_kernel's per-slot value (heads_of_slot, no
//                 positions read) against head_partial. Runs for real with
//                 --host-only.
//
// Usage: scissorhands_cuda_token_level_test [--configs N] [--seed S]
//                                           [--only differential,errors,graph,tensor_parallel,
//                                                   tensor_parallel_multi_gpu,combined_score] [--quick]
//                                           [--long N]
//                                           [--host-only]
// --long N makes the first N configurations long sequences (> 4096 slots:
// selection beyond the shared-memory tile), --quick or not. --host-only
// runs with no device: only what the host decides is checked (harness.cuh).
// Exit status: 0 all passed, 1 a failure, 77 no CUDA device (not with
// --host-only).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../engine/one_api_engine.hpp"
#include "cases.cuh"

// The engine of one_api_engine.hpp holds its device arrays in the harness's
// buffers (host memory in a host-only run).
template <>
struct one_api::memory<scissorhands::memory_space::device> {
  template <class T>
  struct array {
    harness::device_buffer<T> buffer;
    explicit array(const std::vector<T>& v) : buffer(v.size()) { buffer.upload(v); }
    scissorhands::device_span<T> span() { return buffer.span(); }
    std::vector<T> download() const { return buffer.download(); }
  };
};

namespace {

using namespace harness;
namespace sh = scissorhands;

// ---------------------------------------------------------------------------
// Policies and granularities under test
using base_scissorhands = sh::scissorhands_policy;  // unimportant count: evicts its highest scores
using base_h2o = sh::h2o_policy;
using base_key_norm = sh::key_norm_policy;  // static
using base_threshold = sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>;
constexpr int num_policies = 4;
const char* const policy_names[num_policies] = {"scissorhands", "h2o", "key_norm", "threshold+decay+max"};

using g_heads_mean = sh::shared_heads<sh::mean_score>;
using g_heads_max = sh::shared_heads<sh::max_score>;
using g_layers_mean = sh::shared_layers<sh::mean_score, sh::mean_score>;
using g_layers_max_mean = sh::shared_layers<sh::max_score, sh::mean_score>;
using g_layers_mean_max = sh::shared_layers<sh::mean_score, sh::max_score>;
constexpr int num_granularities = 5;
const char* const granularity_names[num_granularities] = {"shared_heads<mean>", "shared_heads<max>",
                                                          "shared_layers<mean,mean>", "shared_layers<max,mean>",
                                                          "shared_layers<mean,max>"};

// ---------------------------------------------------------------------------
// dtype: 0 fp32, 1 fp16.
struct config : case_config {
  int granularity = 0;
  bool forget = false;  // shared_layers: forget instead of compact
  int layers = 1;
  int stride_extra = 0;
  bool pinned = false, cache_slots = true;

  std::string describe() const {
    static const char* dtypes[] = {"fp32", "fp16"};
    return describe_as(std::string(dtypes[dtype]) + " " + policy_names[policy] + " " + granularity_names[granularity] +
                           (granularity >= 2 ? (forget ? " via forget" : " via compact") : ""),
                       ", layers " + std::to_string(layers) + ", pinned " + std::to_string(pinned) + ", cache_slots " +
                           std::to_string(cache_slots) + ", stride +" + std::to_string(stride_extra));
  }
};

config make_config(std::mt19937_64& rng, int index, bool quick, int long_first) {
  config c;
  draw_kind(rng, c, index, 2, num_policies);
  c.granularity = uniform(rng, 0, num_granularities - 1);
  c.forget = coin(rng, 0.35);
  // One in 16 has a sequence longer than the selection's shared-memory tile.
  const bool long_seq = index < long_first || (!quick && index % 16 == 7);
  c.batch = long_seq ? 1 : uniform(rng, 1, 5);
  c.layers = long_seq ? 2 : uniform(rng, 1, 4);
  c.kv_heads = long_seq ? 1 : uniform(rng, 1, 3);
  c.group = pick(rng, {1, 2, 4});
  c.head_dim = long_seq ? 8 : pick(rng, {8, 16, 64, 128, 5, 12});
  draw_sizes(rng, c, long_seq, 30, [&](int protect) {
    return long_seq ? uniform(rng, 4200, 5200) : protect + uniform(rng, 1, quick ? 20 : 48);
  });
  c.window = pick(rng, {1, 3, 8, 33});
  c.alpha = pick(rng, {0.5f, 1.0f, 2.0f});
  c.decay = pick(rng, {0.5f, 0.9f, 1.0f});
  c.normalize = coin(rng, 0.4);
  c.preserve_order = coin(rng);
  c.ties = coin(rng, 0.3);
  c.pinned = coin(rng, 0.5);
  c.mapped = coin(rng, 0.4);
  c.cache_slots = coin(rng, 0.7);
  c.freed_for_contiguous = coin(rng);
  c.tight_state = coin(rng, 0.3);
  c.stride_extra = uniform(rng, 0, 2);
  c.steps = long_seq ? 2 : uniform(rng, 2, 6);
  draw_seed_and_pooling(rng, c);
  return c;
}

// Every layer's listed rows (compare_state, bit for bit; the ticket words
// are not part of this suite's comparison).
bool compare_model(const char* when, const sh::model_state<host_space>& h, const sh::model_state<host_space>& d,
                   const std::vector<row_slots>& rows, mismatch_log& log) {
  for (int l = 0; l < h.layers; ++l)
    compare_state(std::string(when) + ": layer " + std::to_string(l), h.layer(l), d.layer(l), rows, score_rule{}, true,
                  log, false);
  return log.ok();
}

bool status_clear(const char* when, const sh::model_state<host_space>& d, mismatch_log& log) {
  for (int l = 0; l < d.layers; ++l)
    harness::status_clear(std::string(when) + ": layer " + std::to_string(l), d.layer(l), log);
  return log.ok();
}

// ---------------------------------------------------------------------------
// One configuration

template <class T, class Policy, bool Paged>
bool run_case(const config& c, mismatch_log& log) {
  using G = typename Policy::granularity;
  constexpr bool over_layers = G::kind == sh::granularity_kind::shared_layers;
  constexpr bool attention = Policy::observation::needs_attention;
  Policy policy;
  c.apply(policy.config);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 29);

  const int B = c.batch, L = c.layers, H = c.kv_heads, D = c.head_dim, QH = H * c.group, P = c.page_size;
  const cache_geometry geo = cache_geometry::of(c, Paged);
  const int cap = geo.capacity;
  const std::size_t elements = geo.elements;  // per layer
  const int state_cap = c.tight_state ? std::min(cap, c.budget + 2 + uniform(rng, 0, 6)) : cap;
  const int most = std::min(c.capacity, state_cap);
  const int protect = c.recent + c.sinks;

  std::vector<T> hk(elements * L), hv(elements * L);
  fill_random(hk, rng, -2.0f, 2.0f);
  fill_random(hv, rng, -2.0f, 2.0f);
  device_buffer<T> dk(hk.size()), dv(hv.size());

  // Requests keep their state row and pages; the scheduler places them.
  const int live = c.mapped ? uniform(rng, 1, B) : B;
  const int rows = c.mapped ? live + uniform(rng, 0, 2) : B + (coin(rng, 0.3) ? 1 : 0);
  request_batch reqs(rng, B, live, rows, c.mapped, Paged, P, geo.max_pages, geo.num_pages);
  auto host_view = [&](int l) { return cache_view<Paged>(geo, hk.data(), hv.data(), reqs.host_table(), l); };
  auto device_view = [&](int l) { return cache_view<Paged>(geo, dk.data(), dv.data(), reqs.device_table(), l); };
  reqs.sync();
  const auto hview0 = host_view(0);
  std::int64_t block = 0;  // one batch position's K (or V) elements, contiguous
  if constexpr (!Paged) block = hview0.k_layout.sequence_stride;

  // The model state (shared_heads: one layer state per layer, compressed on its own).
  const sh::state_shape shape{rows, H, state_cap, policy.ring_words()};
  const std::size_t model_bytes = sh::model_state_bytes(shape, L);
  aligned_bytes h_model_buf(model_bytes), snapshot(model_bytes);
  device_buffer<std::byte> d_model_buf(model_bytes);
  const auto hm0 = sh::make_model_state(h_model_buf.span(), shape, L);
  const auto dm0 = sh::make_model_state(d_model_buf.span(), shape, L);
  const auto dsnap = sh::make_model_state(snapshot.span(), shape, L);
  const auto hm = c.mapped ? hm0.for_batch(sh::host_span<const std::int32_t>(reqs.h_rows.data(), B)) : hm0;
  const auto dm = c.mapped ? dm0.for_batch(sh::device_span<const std::int32_t>(reqs.d_rows.data(), B)) : dm0;
  sh::host::reset_state(hm0);
  CUDA_CHECK(sh::cuda::reset_state(dm0));

  // Workspaces and the selection.
  aligned_bytes h_ws(std::max(sh::host::select_workspace_bytes(hview0, shape),
                              sh::host::compress_workspace_bytes(hview0, shape)));
  aligned_bytes h_cws(sh::host::compact_workspace_bytes(hview0) + 1);
  std::size_t d_ws_bytes = 0, d_cws_bytes = 0;
  if constexpr (over_layers) {
    CUDA_CHECK(sh::cuda::select(nullptr, d_ws_bytes, policy, device_view(0), dm, c.budget, {}));
    CUDA_CHECK(sh::cuda::compact(nullptr, d_cws_bytes, policy, device_view(0), dm.layer(0), {}));
  } else {
    CUDA_CHECK(sh::cuda::compress(nullptr, d_ws_bytes, policy, device_view(0), dm.layer(0), c.budget, {}));
  }
  device_buffer<std::byte> d_ws(d_ws_bytes), d_cws(d_cws_bytes);
  const int stride = sh::max_evictions(state_cap, c.budget, c.m) + c.stride_extra;
  const std::size_t entries = std::max<std::size_t>(1, static_cast<std::size_t>(B) * stride);
  std::vector<std::int32_t> h_counts(B), h_slots(entries), h_cache(entries), h_new(B), h_freed(B), h_pinned(B);
  device_buffer<std::int32_t> d_counts(B), d_slots(entries), d_cache(entries), d_new(B), d_freed(B), d_pinned(B);
  const bool with_freed = Paged || c.freed_for_contiguous;

  auto download_model = [&] { d_model_buf.download(snapshot.data(), model_bytes); };

  for (int step = 0; step < c.steps; ++step) {
    // 0. A request finishes and a new one takes its row; the scheduler
    //    reorders the batch (contiguous K/V move with their request).
    if (step > 0 && coin(rng, 0.15)) {
      const int q = uniform(rng, 0, live - 1), start = uniform(rng, 0, 1000);
      sh::host::reset_sequence(hm0, reqs.row_of[q], start);
      CUDA_CHECK(sh::cuda::reset_sequence(dm0, reqs.row_of[q], start));
      reqs.len[q] = 0;
    }
    if (c.mapped && step > 0 && coin(rng, 0.5)) shuffle_batch<Paged>(rng, reqs, hk, hv, block, elements, L);
    // 1. The engine appends tokens to every layer; after the prompt,
    //    requests append alike, as a decode step does (one query count
    //    for all, below, is each one's new tokens).
    const int shared_add = uniform(rng, 0, 3);
    for (int q = 0; q < live; ++q)
      reqs.len[q] += attention && step > 0 ? std::min(shared_add, most - reqs.len[q])
                                           : draw_append(rng, step, most, reqs.len[q]);
    reqs.sync();
    {
      std::uniform_real_distribution<float> d(-2.0f, 2.0f);
      const auto who = reqs.at_position();
      for (int l = 0; l < L; ++l) {
        const auto hvw = host_view(l);
        for (int b = 0; b < B; ++b) {
          if (who[b] < 0) continue;
          // New rows since the state last tracked them: rewrite every row
          // past the host's tracked count (the others are the state's).
          const int first = hm.layer(l).tracked[reqs.h_rows[b]];
          for (int t = first; t < reqs.len_at(b); ++t)
            for (int h = 0; h < H; ++h) {
              T* k = hvw.k_row(b, h, t);
              T* v = hvw.v_row(b, h, t);
              for (int x = 0; x < D; ++x) k[x] = from_float<T>(d(rng)), v[x] = from_float<T>(d(rng));
            }
        }
      }
    }
    dk.upload(hk);
    dv.upload(hv);
    const std::vector<int> observed_len = reqs.len;

    // 2. Observe every layer, each with its own probabilities, with one
    //    query count (1 or 2) the observe-step invariant allows every
    //    sequence (allowed_queries); when none does (a request reset or
    //    full), every layer admits the new tokens first, on both sides.
    const int max_len = std::max(1, length_range(reqs).second);
    const auto common = [&] {
      query_bounds all{1, 2};
      for (int l = 0; l < L; ++l)
        for (int b = 0; b < B; ++b) {
          const int n = reqs.len_at(b);
          if (n == 0) continue;
          const query_bounds one = allowed_queries(hm.layer(l), b, n);
          all = {std::max(all.least, one.least), std::min(all.most, one.most)};
        }
      return all;
    };
    query_bounds all = common();
    if (all.empty()) {
      for (int l = 0; l < L; ++l) {
        sh::host::admit(policy, host_view(l), hm.layer(l));
        CUDA_CHECK(sh::cuda::admit(policy, device_view(l), dm.layer(l)));
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      all = common();
    }
    const int q_len = all.empty() ? 0 : (all.most > all.least && coin(rng, 0.3) ? all.least + 1 : all.least);
    for (int l = 0; l < L; ++l) {
      std::vector<float> probs(std::max<std::size_t>(1, static_cast<std::size_t>(B) * QH * std::max(q_len, 1) * max_len),
                               std::numeric_limits<float>::quiet_NaN());
      const auto hp = sh::probability_view<host_space>::dense({probs.data(), probs.size()}, QH, q_len, max_len);
      if constexpr (attention) {
        std::normal_distribution<float> logit(0.0f, 2.0f);
        for (int b = 0; b < B; ++b) {
          const int n = reqs.len_at(b);
          if (n == 0) continue;
          for (int qh = 0; qh < QH; ++qh)
            for (int j = 0; j < q_len; ++j) {
              float* row = probs.data() + (static_cast<std::size_t>(b) * QH * q_len + qh * q_len + j) * max_len;
              fill_probabilities(row, n - q_len + j + 1, logit, rng, c.ties);
            }
        }
      }
      device_buffer<float> d_probs(probs.size());
      d_probs.upload(probs);
      const auto dp = sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, q_len, max_len);
      sh::host::observe_probabilities(policy, host_view(l), hm.layer(l), hp);
      CUDA_CHECK(sh::cuda::observe_probabilities(policy, device_view(l), dm.layer(l), dp));
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    download_model();
    if (!status_clear("observe", dsnap, log)) return false;
    if (!compare_model("after observe", hm0, dsnap, live_rows(reqs, observed_len), log)) return false;

    // 3. Evict.
    std::fill(h_new.begin(), h_new.end(), -7);
    std::fill(h_freed.begin(), h_freed.end(), -7);
    d_new.upload(h_new);
    d_freed.upload(h_freed);
    const sh::compress_output<host_space> h_out{sh::host_span<std::int32_t>(h_new.data(), B),
                                                with_freed ? sh::host_span<std::int32_t>(h_freed.data(), B)
                                                           : sh::host_span<std::int32_t>{}};
    const sh::compress_output<device_space> d_out{d_new.span(), with_freed ? d_freed.span()
                                                                           : sh::device_span<std::int32_t>{}};
    if constexpr (!over_layers) {
      for (int l = 0; l < L; ++l) {
        sh::host::compress(policy, host_view(l), hm.layer(l), c.budget, h_ws.span(), h_out);
        CUDA_CHECK(sh::cuda::compress(d_ws.data(), d_ws_bytes, policy, device_view(l), dm.layer(l), c.budget, d_out));
      }
      CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      // Pinned prefixes that leave enough free tokens (the test's choice),
      // in [0, length] as both backends require (0 for an empty sequence or
      // a padding slot).
      for (int b = 0; b < B; ++b) {
        const int n = reqs.len_at(b);
        h_pinned[b] = !c.pinned       ? 0
                      : n >= c.budget ? uniform(rng, 0, std::max(0, c.budget - c.m - protect))
                                      : uniform(rng, 0, n);
      }
      d_pinned.upload(h_pinned);
      std::fill(h_counts.begin(), h_counts.end(), -7);
      d_counts.upload(h_counts);
      const sh::host_span<const std::int32_t> hpin =
          c.pinned ? sh::host_span<const std::int32_t>(h_pinned.data(), B) : sh::host_span<const std::int32_t>{};
      const sh::device_span<const std::int32_t> dpin =
          c.pinned ? sh::device_span<const std::int32_t>(d_pinned.data(), B) : sh::device_span<const std::int32_t>{};
      const std::size_t used = static_cast<std::size_t>(B) * stride;
      sh::eviction_selection<host_space> hsel{stride, {h_counts.data(), static_cast<std::size_t>(B)},
                                              {h_slots.data(), used},
                                              c.cache_slots ? sh::host_span<std::int32_t>(h_cache.data(), used)
                                                            : sh::host_span<std::int32_t>{},
                                              h_out};
      sh::eviction_selection<device_space> dsel{stride, {d_counts.data(), static_cast<std::size_t>(B)},
                                                {d_slots.data(), used},
                                                c.cache_slots ? sh::device_span<std::int32_t>(d_cache.data(), used)
                                                              : sh::device_span<std::int32_t>{},
                                                d_out};
      sh::host::select(policy, host_view(0), hm, c.budget, h_ws.span(), hsel, hpin);
      CUDA_CHECK(sh::cuda::select(d_ws.data(), d_ws_bytes, policy, device_view(0), dm, c.budget, dsel, dpin));
      CUDA_CHECK(cudaDeviceSynchronize());
      {
        download_model();
        if (!status_clear("select", dsnap, log)) return false;
        const auto dc = d_counts.download(), ds = d_slots.download(), dcs = d_cache.download();
        for (int b = 0; b < B; ++b) {
          if (dc[b] != h_counts[b]) {
            log.add("select: counts[", b, "] host ", h_counts[b], " device ", dc[b]);
            continue;
          }
          for (int k = 0; k < h_counts[b]; ++k) {
            const std::size_t i = static_cast<std::size_t>(b) * stride + k;
            if (ds[i] != h_slots[i]) log.add("select: slots[", b, "][", k, "] host ", h_slots[i], " device ", ds[i]);
            if (c.cache_slots && dcs[i] != h_cache[i])
              log.add("select: cache_slots[", b, "][", k, "] host ", h_cache[i], " device ", dcs[i]);
          }
        }
        if (!log.ok()) return false;
      }
      // Apply to every layer: compact, or forget (and the test removes the
      // rows itself, in order, as a slot-allocator engine does).
      for (int l = 0; l < L; ++l) {
        if (c.forget) {
          sh::host::forget(policy, host_view(l), hm.layer(l), hsel);
          CUDA_CHECK(sh::cuda::forget(policy, device_view(l), dm.layer(l), dsel));
        } else {
          sh::host::compact(policy, host_view(l), hm.layer(l), hsel, h_cws.span());
          CUDA_CHECK(sh::cuda::compact(d_cws.data(), d_cws_bytes, policy, device_view(l), dm.layer(l), dsel));
        }
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      if (c.forget) {
        for (int l = 0; l < L; ++l) {
          const auto hvw = host_view(l);
          for (int b = 0; b < B; ++b) {
            const int count = h_counts[b];
            if (count == 0) continue;
            const std::int32_t* list = h_slots.data() + static_cast<std::size_t>(b) * stride;
            for (int h = 0; h < H; ++h) {
              int to = list[0], k = 0;
              for (int from = list[0]; from < reqs.len_at(b); ++from) {
                if (k < count && list[k] == from) {
                  ++k;
                  continue;
                }
                std::memmove(static_cast<void*>(hvw.k_row(b, h, to)),
                             static_cast<const void*>(hvw.k_row(b, h, from)), sizeof(T) * D);
                std::memmove(static_cast<void*>(hvw.v_row(b, h, to)),
                             static_cast<const void*>(hvw.v_row(b, h, from)), sizeof(T) * D);
                ++to;
              }
            }
          }
        }
        dk.upload(hk);
        dv.upload(hv);
      }
    }
    // 4. Outputs, state and kept rows.
    download_model();
    const char* what = over_layers ? (c.forget ? "forget" : "compact") : "compress";
    if (!status_clear(what, dsnap, log)) return false;
    if (!check_outputs(what, c, reqs, h_new, d_new, h_freed, d_freed, with_freed, log)) return false;
    const std::vector<int> kept_len = kept_lengths(reqs, h_new);
    if (!compare_model("after eviction", hm0, dsnap, live_rows(reqs, kept_len), log)) return false;
    const auto dev_k = dk.download(), dev_v = dv.download();
    for (int l = 0; l < L; ++l)
      check_kept_rows(std::string(what) + ": layer " + std::to_string(l), host_view(l), hk, hv, dev_k, dev_v, reqs,
                      kept_len, log);
    if (!log.ok()) return false;
    // 5. The engine applies the new lengths (the next step's table).
    reqs.len = kept_len;
  }
  return true;
}

template <class T, class Base, class G>
bool run_layout(const config& c, mismatch_log& log) {
  using P = sh::with_granularity<Base, G>;
  return c.layout >= 2 ? run_case<T, P, true>(c, log) : run_case<T, P, false>(c, log);
}

template <class T, class Base>
bool run_granularity(const config& c, mismatch_log& log) {
  switch (c.granularity) {
    case 0: return run_layout<T, Base, g_heads_mean>(c, log);
    case 1: return run_layout<T, Base, g_heads_max>(c, log);
    case 2: return run_layout<T, Base, g_layers_mean>(c, log);
    case 3: return run_layout<T, Base, g_layers_max_mean>(c, log);
    default: return run_layout<T, Base, g_layers_mean_max>(c, log);
  }
}

template <class T>
bool run_typed(const config& c, mismatch_log& log) {
  switch (c.policy) {
    case 0: return run_granularity<T, base_scissorhands>(c, log);
    case 1: return run_granularity<T, base_h2o>(c, log);
    case 2: return run_granularity<T, base_key_norm>(c, log);
    default: return run_granularity<T, base_threshold>(c, log);
  }
}

bool run_config(const config& c, mismatch_log& log) {
  return c.dtype == 0 ? run_typed<float>(c, log) : run_typed<__half>(c, log);
}

int run_differential(int configs, std::uint64_t seed, bool quick, int long_first) {
  int by_granularity[num_granularities] = {}, by_layout[4] = {}, forgets = 0, pinned = 0, mapped = 0;
  const int failed = run_configs(
      configs, seed, [&](std::mt19937_64& rng, int i) { return make_config(rng, i, quick, long_first); }, run_config,
      [&](const config& c) {
        ++by_granularity[c.granularity];
        ++by_layout[c.layout];
        forgets += c.granularity >= 2 && c.forget;
        pinned += c.granularity >= 2 && c.pinned;
        mapped += c.mapped;
      });
  std::printf("token-level differential: %d of %d configurations passed (shared_heads mean %d, max %d; "
              "shared_layers mean/mean %d, max/mean %d, mean/max %d; via forget %d, pinned %d; layouts NHD %d, "
              "HND %d, paged NHD %d, paged HND %d; state rows %d)\n",
              configs - failed, configs, by_granularity[0], by_granularity[1], by_granularity[2], by_granularity[3],
              by_granularity[4], forgets, pinned, by_layout[0], by_layout[1], by_layout[2], by_layout[3], mapped);
  return failed;
}

// ---------------------------------------------------------------------------
// Device checks: a small model (two layers, two heads) with three sequences
// at batch positions 0..2 in state rows {2, 0, 3} of four, lengths
// {12, 25, 22} (two at the budget), every layer observed once. A fault is
// put into one sequence's device data; the host runs the same call with
// that sequence as a padding slot (row -1, no token), which is what the
// device must do: skip it and leave it untouched, and give the others
// exactly the host's result.
template <bool Paged, class Policy = sh::with_granularity<sh::scissorhands_policy, g_layers_mean>>
struct fixture {
  using policy_t = Policy;
  static constexpr int B = 3, rows = 4, L = 2, H = 2, D = 8, cap = 32, budget = 20, m = 2, P = 4;
  static constexpr int max_pages = cap / P, num_pages = B * max_pages + 4;
  static constexpr std::size_t elements =
      Paged ? std::size_t{num_pages} * P * H * D : std::size_t{B} * cap * H * D;  // per layer
  policy_t policy;
  sh::state_shape shape{};
  int stride = 0;
  std::vector<std::int32_t> lengths{12, 25, 22}, map{2, 0, 3};
  std::vector<std::vector<std::int32_t>> pages;
  std::vector<float> hk, hv;
  device_buffer<float> dk, dv;
  // The device's table (all sequences) and the host's (one may be padding).
  std::vector<std::int32_t> t_len, t_indptr, t_indices, t_last;
  device_buffer<std::int32_t> d_len, d_indptr, d_indices, d_last, d_map;
  std::vector<std::int32_t> h_len, h_indptr, h_indices, h_last, h_map;
  aligned_bytes h_model_buf;
  device_buffer<std::byte> d_model_buf;
  sh::model_state<host_space> hm0;
  sh::model_state<device_space> dm0;
  std::vector<std::int32_t> h_counts, h_slots, h_cache, h_new, h_freed;
  device_buffer<std::int32_t> d_counts, d_slots, d_cache, d_new, d_freed, d_pinned;
  aligned_bytes h_ws{1}, h_cws{1};
  device_buffer<std::byte> d_ws, d_cws;
  std::size_t ws_bytes = 0, cws_bytes = 0;
  bool observed_ok = true;

  static policy_t make_policy() {
    policy_t p;
    p.config.window = 8;
    p.config.recent = 2;
    p.config.evict_count = m;
    p.config.normalize = true;
    return p;
  }
  fixture()
      : policy(make_policy()),
        shape{rows, H, cap, make_policy().ring_words()},
        stride(sh::max_evictions(cap, budget, m)),
        dk(elements * L),
        dv(elements * L),
        d_len(B),
        d_indptr(B + 1),
        d_indices(B * max_pages),
        d_last(B),
        d_map(B),
        h_model_buf(sh::model_state_bytes(shape_of(), L)),
        d_model_buf(sh::model_state_bytes(shape_of(), L)),
        h_counts(B, 0),
        h_slots(B * stride_of(), 0),
        h_cache(B * stride_of(), 0),
        h_new(B, -7),
        h_freed(B, -7),
        d_counts(B),
        d_slots(B * stride_of()),
        d_cache(B * stride_of()),
        d_new(B),
        d_freed(B),
        d_pinned(B) {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    fill_uploaded(hk, dk, rng);
    fill_uploaded(hv, dv, rng);
    std::vector<std::int32_t> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    pages.resize(B);
    for (int b = 0; b < B; ++b) pages[b].assign(ids.begin() + b * max_pages, ids.begin() + (b + 1) * max_pages);
    upload_table();
    build_host_table(-1);
    hm0 = sh::make_model_state(h_model_buf.span(), shape, L);
    dm0 = sh::make_model_state(d_model_buf.span(), shape, L);
    sh::host::reset_state(hm0);
    CUDA_CHECK(sh::cuda::reset_state(dm0));
    h_ws = aligned_bytes(std::max(sh::host::select_workspace_bytes(host_view(0), shape),
                                  sh::host::compress_workspace_bytes(host_view(0), shape)));
    h_cws = aligned_bytes(sh::host::compact_workspace_bytes(host_view(0)) + 1);
    if constexpr (sh::granularity_of<policy_t> == sh::granularity_kind::shared_layers) {
      CUDA_CHECK(sh::cuda::select(nullptr, ws_bytes, policy, device_view(0), device_model(), budget, {}));
      CUDA_CHECK(sh::cuda::compact(nullptr, cws_bytes, policy, device_view(0), device_model().layer(0), {}));
    } else {
      CUDA_CHECK(sh::cuda::compress(nullptr, ws_bytes, policy, device_view(0), device_model().layer(0), budget, {}));
    }
    d_ws = device_buffer<std::byte>(ws_bytes);
    d_cws = device_buffer<std::byte>(std::max<std::size_t>(cws_bytes, 1));
    // Observe every layer once (admits every token).
    for (int l = 0; l < L; ++l) {
      std::vector<float> probs(static_cast<std::size_t>(B) * H * cap, 0.0f);
      for (int b = 0; b < B; ++b)
        for (int qh = 0; qh < H; ++qh) {
          float* row = probs.data() + (static_cast<std::size_t>(b) * H + qh) * cap;
          float total = 0.0f;
          for (int t = 0; t < lengths[b]; ++t) total += (row[t] = std::exp(2.0f * u(rng)));
          for (int t = 0; t < lengths[b]; ++t) row[t] /= total;
        }
      device_buffer<float> d_probs(probs.size());
      d_probs.upload(probs);
      build_host_table(-1);
      sh::host::observe_probabilities(policy, host_view(l), host_model(-1).layer(l),
                                      sh::probability_view<host_space>::dense({probs.data(), probs.size()}, H, 1, cap));
      CUDA_CHECK(sh::cuda::observe_probabilities(
          policy, device_view(l), device_model().layer(l),
          sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, H, 1, cap)));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto dev = model_bytes();
    observed_ok = same_state(dev.data(), h_model_buf.data()) && all_clear();
  }
  static sh::state_shape shape_of() { return {rows, H, cap, make_policy().ring_words()}; }
  static int stride_of() { return sh::max_evictions(cap, budget, m); }

  // Tables: the device's from `lengths` and `pages`; the host's the same
  // with sequence `bad` (if any) a padding slot.
  void build_table(int bad, std::vector<std::int32_t>& len, std::vector<std::int32_t>& indptr,
                   std::vector<std::int32_t>& indices, std::vector<std::int32_t>& last, std::vector<std::int32_t>& r) {
    len.assign(B, 0);
    indptr.assign(B + 1, 0);
    indices.assign(B * max_pages, 0);
    last.assign(B, 0);
    r = map;
    for (int b = 0; b < B; ++b) {
      const int l = b == bad ? 0 : lengths[b];
      if (b == bad) r[b] = -1;
      len[b] = l;
      const int used = (l + P - 1) / P;
      for (int i = 0; i < used; ++i) indices[indptr[b] + i] = pages[b][i];
      indptr[b + 1] = indptr[b] + used;
      last[b] = used == 0 ? 0 : l - (used - 1) * P;
    }
  }
  void upload_table() {
    std::vector<std::int32_t> r;
    build_table(-1, t_len, t_indptr, t_indices, t_last, r);
    d_len.upload(t_len);
    d_indptr.upload(t_indptr);
    d_indices.upload(t_indices);
    d_last.upload(t_last);
    d_map.upload(map);
  }
  void build_host_table(int bad) { build_table(bad, h_len, h_indptr, h_indices, h_last, h_map); }
  // NHD, B sequences of up to cap tokens (max_pages pages of P).
  static constexpr cache_geometry geometry{B, H, D, P, max_pages, num_pages, cap, false, false, elements};
  auto host_view(int l) {
    const kv_table<host_space> t{{h_len.data(), B}, {h_indptr.data(), B + 1}, {h_indices.data(), h_indices.size()},
                                 {h_last.data(), B}};
    return cache_view<Paged>(geometry, hk.data(), hv.data(), t, l);
  }
  auto device_view(int l) const {
    const kv_table<device_space> t{{d_len.data(), B}, {d_indptr.data(), B + 1}, {d_indices.data(), d_indices.size()},
                                   {d_last.data(), B}};
    return cache_view<Paged>(geometry, dk.data(), dv.data(), t, l);
  }
  sh::model_state<host_space> host_model(int bad) {
    build_host_table(bad);
    return hm0.for_batch(sh::host_span<const std::int32_t>(h_map.data(), B));
  }
  sh::model_state<device_space> device_model() const {
    return dm0.for_batch(sh::device_span<const std::int32_t>(d_map.data(), B));
  }
  sh::eviction_selection<host_space> host_selection(bool with_out = true) {
    return {stride,
            {h_counts.data(), static_cast<std::size_t>(B)},
            {h_slots.data(), h_slots.size()},
            {h_cache.data(), h_cache.size()},
            with_out ? sh::compress_output<host_space>{{h_new.data(), static_cast<std::size_t>(B)},
                                                       {h_freed.data(), static_cast<std::size_t>(B)}}
                     : sh::compress_output<host_space>{}};
  }
  sh::eviction_selection<device_space> device_selection() const {
    return {stride, d_counts.span(), d_slots.span(), d_cache.span(), {d_new.span(), d_freed.span()}};
  }

  // select on both sides (host: `bad` a padding slot, its pin 0).
  void host_select(int bad, const std::vector<std::int32_t>& pinned = {}) {
    const auto model = host_model(bad);
    std::vector<std::int32_t> pin = pinned;
    if (bad >= 0 && !pin.empty()) pin[bad] = 0;
    sh::host::select(policy, host_view(0), model, budget, h_ws.span(), host_selection(),
                     pin.empty() ? sh::host_span<const std::int32_t>{}
                                 : sh::host_span<const std::int32_t>(pin.data(), pin.size()));
  }
  cudaError_t device_select(const std::vector<std::int32_t>& pinned = {}, cudaStream_t stream = 0) {
    if (!pinned.empty()) d_pinned.upload(pinned);
    return sh::cuda::select(d_ws.data(), ws_bytes, policy, device_view(0), device_model(), budget,
                            device_selection(),
                            pinned.empty() ? sh::device_span<const std::int32_t>{}
                                           : sh::device_span<const std::int32_t>(d_pinned.data(), B),
                            stream);
  }
  void upload_selection() const {
    d_counts.upload(h_counts);
    d_slots.upload(h_slots);
  }
  // compact or forget one layer with the host's selection (`bad`: a padding
  // slot with count 0).
  void host_apply(int l, int bad, bool forget) {
    const auto model = host_model(bad);
    std::vector<std::int32_t> saved = h_counts;
    if (bad >= 0) h_counts[bad] = 0;
    if (forget)
      sh::host::forget(policy, host_view(l), model.layer(l), host_selection(false));
    else
      sh::host::compact(policy, host_view(l), model.layer(l), host_selection(false), h_cws.span());
    h_counts = saved;
  }
  cudaError_t device_apply(int l, bool forget, cudaStream_t stream = 0) {
    if (forget) return sh::cuda::forget(policy, device_view(l), device_model().layer(l), device_selection(), stream);
    return sh::cuda::compact(d_cws.data(), cws_bytes, policy, device_view(l), device_model().layer(l),
                             device_selection(), stream);
  }
  // compress one layer (shared_heads / per_head policies).
  void host_compress(int l, int bad) {
    const auto model = host_model(bad);
    sh::host::compress(policy, host_view(l), model.layer(l), budget, h_ws.span(),
                       {{h_new.data(), static_cast<std::size_t>(B)}, {h_freed.data(), static_cast<std::size_t>(B)}});
  }
  cudaError_t device_compress(int l) {
    return sh::cuda::compress(d_ws.data(), ws_bytes, policy, device_view(l), device_model().layer(l), budget,
                              {d_new.span(), d_freed.span()});
  }

  std::vector<std::byte> model_bytes() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::byte> s(d_model_buf.size());
    d_model_buf.download(s.data(), s.size());
    return s;
  }
  // Every layer's bytes equal, the status words excepted.
  bool same_state(const std::byte* a, const std::byte* b) const {
    const auto o = sh::detail::offsets_of(shape);
    for (int l = 0; l < L; ++l) {
      const std::size_t at = hm0.layer_bytes * l;
      if (std::memcmp(a + at, b + at, o.status) != 0 ||
          std::memcmp(a + at + o.positions, b + at + o.positions, o.total - o.positions) != 0)
        return false;
    }
    return true;
  }
  std::vector<std::uint32_t> status(int l) const {
    std::vector<std::uint32_t> w(rows);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(w.data(), dm0.layer(l).status, sizeof(std::uint32_t) * rows, cudaMemcpyDeviceToHost));
    return w;
  }
  bool all_clear() const {
    for (int l = 0; l < L; ++l)
      for (std::uint32_t w : status(l))
        if (w != 0) return false;
    return true;
  }
  bool same_kv() const { return dk.download() == hk && dv.download() == hv; }
  // A poke into both states' layer l (the host's bad row is a padding
  // slot, never read).
  template <class X>
  static void put(X* h, X* d, X value) {
    *h = value;
    CUDA_CHECK(cudaMemcpy(d, &value, sizeof(X), cudaMemcpyHostToDevice));
  }
  void poke_tracked(int l, int r, std::int32_t v) { put(hm0.layer(l).tracked + r, dm0.layer(l).tracked + r, v); }
  void poke_next(int l, int r, std::int32_t v) {
    put(hm0.layer(l).next_position + r, dm0.layer(l).next_position + r, v);
  }
  void poke_step(int l, int r, std::int64_t v) { put(hm0.layer(l).step + r, dm0.layer(l).step + r, v); }
  void poke_position(int l, int r, int h, int t, std::int32_t v) {
    const std::int64_t i = hm0.layer(l).row_index(r, h, t);
    put(hm0.layer(l).positions + i, dm0.layer(l).positions + i, v);
  }
  void poke_status(int l, int r, std::uint32_t v) {
    put(hm0.layer(l).status + r, dm0.layer(l).status + r, v);
    hm0.layer(l).status[r] = 0;  // the host uses its words as scratch (zero between calls)
  }
};

std::string status_text(const std::vector<std::uint32_t>& w) {
  std::string s;
  for (std::size_t r = 0; r < w.size(); ++r)
    s += " row " + std::to_string(r) + ": " + std::to_string(w[r]) + " (" + sh::cuda::describe_status(w[r]) + ")";
  return s;
}

template <class F>
void expect_throw(check_tally& t, F& f, const std::string& what, const std::string& argument,
                  const std::function<cudaError_t()>& call) {
  const auto before = f.model_bytes();
  const auto k_before = f.dk.download();
  t.refuses(what, argument, call);
  t.device(f.model_bytes() == before && f.dk.download() == k_before, what + ": nothing launched");
}

int run_error_tests() {
  check_tally t{"errors"};
  using fx = fixture<false>;
  using fxp = fixture<true>;

  // --- valid runs ---------------------------------------------------------
  {
    fx f;
    t.device(f.observed_ok, "observe of the fixture matches the host");
    const std::vector<std::int32_t> pinned{3, 5, 0};
    f.host_select(-1, pinned);
    CUDA_CHECK(f.device_select(pinned));
    const auto dc = f.d_counts.download(), ds = f.d_slots.download(), dn = f.d_new.download();
    bool ok = f.all_clear() && dn == f.h_new && dc == f.h_counts;
    for (int b = 0; b < fx::B; ++b)
      for (int k = 0; k < f.h_counts[b]; ++k) ok = ok && ds[b * f.stride + k] == f.h_slots[b * f.stride + k];
    t.device(ok, "a valid select with pinned prefixes matches the host and flags nothing");
    for (int l = 0; l < fx::L; ++l) {
      f.host_apply(l, -1, false);
      CUDA_CHECK(f.device_apply(l, false));
    }
    const auto dev = f.model_bytes();
    t.device(f.all_clear() && f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             "a valid compact of every layer matches the host");
  }

  // --- select: one sequence at fault ----------------------------------------
  // Its row flagged in every layer (`bit` in each), count 0, nothing of it
  // written; the others equal the host's run without it.
  auto select_fault = [&](const std::string& what, int bad, std::uint32_t bit, auto&& fault,
                          std::vector<std::int32_t> pinned = {}) {
    fx f;
    fault(f);
    CUDA_CHECK(f.device_select(pinned));
    f.host_select(bad, pinned);
    bool rows_ok = true;
    for (int l = 0; l < fx::L; ++l) {
      const auto w = f.status(l);
      bool layer_ok = (w[f.map[bad]] & bit) != 0;
      for (int b = 0; b < fx::B; ++b)
        if (b != bad) layer_ok = layer_ok && w[f.map[b]] == 0;
      if (!device_fact(layer_ok)) std::printf("  %s: layer %d:%s\n", what.c_str(), l, status_text(w).c_str());
      rows_ok = rows_ok && layer_ok;
    }
    t.device(rows_ok, what + ": the bit is in the faulty sequence's row of every layer, no other");
    const auto dc = f.d_counts.download(), ds = f.d_slots.download(), dn = f.d_new.download();
    bool sel_ok = dc[bad] == 0;
    for (int b = 0; b < fx::B; ++b) {
      sel_ok = sel_ok && dn[b] == sh::length_after_compress(f.lengths[b], fx::budget, fx::m);
      if (b == bad) continue;
      sel_ok = sel_ok && dc[b] == f.h_counts[b];
      for (int k = 0; k < f.h_counts[b]; ++k) sel_ok = sel_ok && ds[b * f.stride + k] == f.h_slots[b * f.stride + k];
    }
    t.device(sel_ok, what + ": count 0 for it, the others the host's, new_lengths for every sequence");
    const auto dev = f.model_bytes();
    t.device(f.same_state(dev.data(), f.h_model_buf.data()), what + ": the state is not written");
  };
  select_fault("select: a layer tracking fewer tokens", 1, sh::cuda::status_untracked,
               [](fx& f) { f.poke_tracked(1, f.map[1], f.lengths[1] - 1); });
  select_fault("select: layers disagreeing on next_position", 1, sh::cuda::status_slot_mismatch, [](fx& f) {
    const std::int32_t next = f.hm0.layer(1).next_position[f.map[1]];
    f.poke_next(1, f.map[1], next + 1);
  });
  select_fault("select: another token in layer 1 head 1", 2, sh::cuda::status_slot_mismatch,
               [](fx& f) { f.poke_position(1, f.map[2], 1, 3, 1000); });
  select_fault("select: another token in layer 0 head 1", 1, sh::cuda::status_slot_mismatch,
               [](fx& f) { f.poke_position(0, f.map[1], 1, 7, 999); });
  select_fault("select: pinned_prefix above the length", 1, sh::cuda::status_pinned_prefix, [](fx&) {},
               {0, 26, 0});
  select_fault("select: negative pinned_prefix", 2, sh::cuda::status_pinned_prefix, [](fx&) {}, {0, 0, -1});
  select_fault("select: a pinned prefix leaving too few free tokens", 1, sh::cuda::status_positions, [](fx&) {},
               {0, 23, 0});
  select_fault("select: a damaged step in layer 1", 2, sh::cuda::status_step,
               [](fx& f) { f.poke_step(1, f.map[2], std::int64_t{-1}); });
  {
    // A row already flagged in one layer (sticky): skipped, count 0, no new bits.
    fx f;
    f.poke_status(1, f.map[1], sh::cuda::status_probability);
    CUDA_CHECK(f.device_select());
    f.host_select(1);
    const auto w0 = f.status(0), w1 = f.status(1);
    const auto dc = f.d_counts.download();
    t.device(w0 == std::vector<std::uint32_t>(fx::rows, 0u) && w1[f.map[1]] == sh::cuda::status_probability &&
                 dc[1] == 0 && dc[2] == f.h_counts[2],
             "select: a row flagged in one layer is skipped (count 0), the others proceed");
    f.upload_selection();  // the host's (count 0 for it)
    CUDA_CHECK(f.device_apply(0, false));
    f.host_apply(0, 1, false);
    const auto dev = f.model_bytes();
    t.device(f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             "compact after it matches the host without the sequence");
    sh::host::reset_sequence(f.hm0, f.map[1], 50);
    CUDA_CHECK(sh::cuda::reset_sequence(f.dm0, f.map[1], 50));
    t.device(f.all_clear(), "cuda::reset_sequence(model) clears the row's word in every layer");
  }
  {
    // The whole batch: a state row used twice flags both rows in every layer.
    fx f;
    f.map = {2, 0, 2};
    f.upload_table();
    CUDA_CHECK(f.device_select());
    bool ok = true;
    for (int l = 0; l < fx::L; ++l) {
      const auto w = f.status(l);
      ok = ok && (w[0] & sh::cuda::status_state_rows) && (w[2] & sh::cuda::status_state_rows) && w[1] == 0 &&
           w[3] == 0;
    }
    const auto dc = f.d_counts.download();
    t.device(ok && dc == std::vector<std::int32_t>(fx::B, 0),
             "select: a state row used twice flags the batch's rows in every layer, every count 0");
  }
  {
    // A padding slot holding tokens flags every row of the batch.
    fx f;
    f.map = {2, -1, 3};
    f.upload_table();
    CUDA_CHECK(f.device_select());
    bool ok = true;
    for (int l = 0; l < fx::L; ++l) {
      const auto w = f.status(l);
      ok = ok && (w[2] & sh::cuda::status_state_rows) && (w[3] & sh::cuda::status_state_rows) && w[0] == 0;
    }
    t.device(ok && f.d_counts.download() == std::vector<std::int32_t>(fx::B, 0),
             "select: a padding slot holding tokens flags the batch, every count 0");
  }

  // --- compact / forget: one sequence at fault (layer 0) ------------------
  auto apply_fault = [&](const std::string& what, int bad, std::uint32_t bit, bool forget, auto&& fault) {
    fx f;
    f.host_select(-1);
    f.upload_selection();
    std::vector<std::int32_t> counts = f.h_counts, slots = f.h_slots;
    fault(f, counts, slots);
    f.d_counts.upload(counts);
    f.d_slots.upload(slots);
    CUDA_CHECK(f.device_apply(0, forget));
    f.host_apply(0, bad, forget);
    const auto w = f.status(0);
    bool rows_ok = (w[f.map[bad]] & bit) != 0;
    for (int b = 0; b < fx::B; ++b)
      if (b != bad) rows_ok = rows_ok && w[f.map[b]] == 0;
    if (!device_fact(rows_ok)) std::printf("  %s:%s\n", what.c_str(), status_text(w).c_str());
    t.device(rows_ok, what + ": the bit is in the faulty sequence's row only");
    const auto dev = f.model_bytes();
    t.device(f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             what + ": state, K and V equal the host's run without the sequence");
  };
  using vec = std::vector<std::int32_t>;
  for (bool forget : {false, true}) {
    const std::string op = forget ? "forget" : "compact";
    apply_fault(op + ": count above the length", 0, sh::cuda::status_selection, forget,
                [](fx& f, vec& c, vec&) { c[0] = f.lengths[0] + 1; });
    apply_fault(op + ": count above the stride", 1, sh::cuda::status_selection, forget,
                [](fx& f, vec& c, vec&) { c[1] = f.stride + 1; });
    apply_fault(op + ": negative count", 2, sh::cuda::status_selection, forget,
                [](fx&, vec& c, vec&) { c[2] = -1; });
    apply_fault(op + ": slots not ascending", 1, sh::cuda::status_selection, forget, [](fx& f, vec& c, vec& s) {
      std::swap(s[1 * f.stride + 0], s[1 * f.stride + c[1] - 1]);
    });
    apply_fault(op + ": a slot twice", 2, sh::cuda::status_selection, forget,
                [](fx& f, vec&, vec& s) { s[2 * f.stride + 1] = s[2 * f.stride + 0]; });
    apply_fault(op + ": a slot past the length", 1, sh::cuda::status_selection, forget,
                [](fx& f, vec& c, vec& s) { s[1 * f.stride + c[1] - 1] = f.lengths[1]; });
    apply_fault(op + ": a protected slot", 1, sh::cuda::status_selection_protected, forget,
                [](fx& f, vec& c, vec& s) { s[1 * f.stride + c[1] - 1] = f.lengths[1] - 1; });  // the newest token
    apply_fault(op + ": a state tracking fewer tokens", 2, sh::cuda::status_untracked, forget,
                [](fx& f, vec&, vec&) { f.poke_tracked(0, f.map[2], f.lengths[2] - 1); });
    apply_fault(op + ": a damaged tracked count", 1, sh::cuda::status_tracked, forget,
                [](fx& f, vec&, vec&) { f.poke_tracked(0, f.map[1], f.lengths[1] + 3); });
  }

  // --- shared pages ---------------------------------------------------------
  {
    // Sequence 0 (below the budget, nothing written) lists a page that
    // compact would rewrite for sequence 1: sequence 1 is skipped.
    fxp f;
    f.host_select(-1);
    const int first = f.h_slots[1 * f.stride], kept = f.lengths[1] - f.h_counts[1];
    t.device(first < kept, "paged fixture: sequence 1's compaction writes a page");
    f.pages[0][0] = f.pages[1][first / fxp::P];
    f.upload_table();
    f.upload_selection();
    CUDA_CHECK(f.device_apply(0, false));
    f.host_apply(0, 1, false);
    const auto w = f.status(0);
    const auto dev = f.model_bytes();
    t.device((w[f.map[1]] & sh::cuda::status_shared_page) && w[f.map[0]] == 0 && w[f.map[2]] == 0 &&
                 f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             "compact: a written page listed twice skips its sequence (status_shared_page), the others proceed");
  }
  {
    // A shared prefix pinned in select is never written: accepted.
    fxp f;
    f.pages[2][0] = f.pages[1][0];
    f.upload_table();
    const std::vector<std::int32_t> pinned{0, fxp::P, fxp::P};
    f.host_select(-1, pinned);
    CUDA_CHECK(f.device_select(pinned));
    bool ok = f.d_counts.download() == f.h_counts;
    for (int l = 0; l < fxp::L; ++l) {
      f.host_apply(l, -1, false);
      CUDA_CHECK(f.device_apply(l, false));
    }
    const auto dev = f.model_bytes();
    t.device(ok && f.all_clear() && f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             "compact: pages shared below the pinned prefix are accepted and match the host");
  }

  // --- compress at shared_heads (and per_head shared pages) ---------------
  using fxh = fixture<false, sh::with_granularity<sh::scissorhands_policy, g_heads_mean>>;
  using fxhp = fixture<true, sh::with_granularity<sh::scissorhands_policy, g_heads_max>>;
  using fxpp = fixture<true, sh::scissorhands_policy>;
  auto compress_fault = [&](auto tag, const std::string& what, int bad, std::uint32_t bit, auto&& fault) {
    using F = typename decltype(tag)::type;
    F f;
    t.device(f.observed_ok, what + ": the fixture's observe matches the host");
    fault(f);
    CUDA_CHECK(f.device_compress(0));
    f.host_compress(0, bad);
    const auto w = f.status(0);
    bool rows_ok = bad < 0 ? w == std::vector<std::uint32_t>(F::rows, 0u) : (w[f.map[bad]] & bit) != 0;
    for (int b = 0; b < F::B; ++b)
      if (b != bad) rows_ok = rows_ok && w[f.map[b]] == 0;
    if (!device_fact(rows_ok)) std::printf("  %s:%s\n", what.c_str(), status_text(w).c_str());
    t.device(rows_ok, what + ": status words");
    const auto dev = f.model_bytes();
    const auto dn = f.d_new.download();
    bool out_ok = true;
    for (int b = 0; b < F::B; ++b) out_ok = out_ok && dn[b] == sh::length_after_compress(f.lengths[b], F::budget, F::m);
    t.device(out_ok && f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv(),
             what + ": new_lengths for every sequence; state, K and V equal the host's run without the sequence");
  };
  struct tag_h {
    using type = fxh;
  };
  struct tag_hp {
    using type = fxhp;
  };
  struct tag_pp {
    using type = fxpp;
  };
  compress_fault(tag_h{}, "compress shared_heads: valid", -1, 0, [](fxh&) {});
  compress_fault(tag_hp{}, "compress shared_heads paged: valid", -1, 0, [](fxhp&) {});
  compress_fault(tag_h{}, "compress shared_heads: heads holding different tokens", 1, sh::cuda::status_slot_mismatch,
                 [](fxh& f) { f.poke_position(0, f.map[1], 1, 4, 777); });
  compress_fault(tag_h{}, "compress shared_heads: untracked tokens", 2, sh::cuda::status_untracked,
                 [](fxh& f) { f.poke_tracked(0, f.map[2], f.lengths[2] - 2); });
  compress_fault(tag_hp{}, "compress shared_heads: a page listed twice", 1, sh::cuda::status_shared_page,
                 [](fxhp& f) {
                   f.pages[0][1] = f.pages[1][0];
                   f.upload_table();
                 });
  compress_fault(tag_pp{}, "compress per_head: a page listed twice", 2, sh::cuda::status_shared_page, [](fxpp& f) {
    f.pages[2][3] = f.pages[2][0];  // twice in its own list
    f.upload_table();
  });

  // --- host-side refusals -------------------------------------------------
  {
    fx f;
    auto sel = [&] { return f.device_selection(); };
    const auto dm = f.device_model();
    const auto dv = f.device_view(0);
    const auto expect_select_throw = [&](const std::string& what, const std::string& argument,
                                         sh::eviction_selection<device_space> s,
                                         sh::device_span<const std::int32_t> pin = {}) {
      expect_throw(t, f, what, argument, [&] {
        return sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, dv, dm, fx::budget, s, pin);
      });
    };
    auto s = sel();
    s.stride = f.stride - 1;
    expect_select_throw("select: stride below max_evictions", "selection.stride", s);
    s = sel();
    s.counts = {f.d_counts.data(), fx::B - 1};
    expect_select_throw("select: counts of the wrong size", "selection.counts", s);
    s = sel();
    s.slots = {f.d_slots.data(), f.d_slots.size() - 1};
    expect_select_throw("select: slots too short", "selection.slots", s);
    s = sel();
    s.cache_slots = {f.d_cache.data(), 1};
    expect_select_throw("select: cache_slots too short", "selection.cache_slots", s);
    expect_select_throw("select: pinned_prefix of the wrong size", "pinned_prefix", sel(), {f.d_pinned.data(), fx::B - 1});
    expect_select_throw("select: null pinned_prefix with a size", "pinned_prefix", sel(), {nullptr, fx::B});
    s = sel();
    s.out.new_lengths = f.d_counts.span();
    expect_select_throw("select: new_lengths over counts", "selection.out.new_lengths", s);
    s = sel();
    s.counts = {reinterpret_cast<std::int32_t*>(f.d_model_buf.data()), fx::B};
    expect_select_throw("select: counts over the model state", "selection.counts", s);
    s = sel();
    s.out.freed_pages = {f.d_freed.data(), 1};
    expect_select_throw("select: freed_pages of the wrong size", "selection.out.freed_pages", s);
    expect_throw(t, f, "select: workspace below the query", "workspace_bytes", [&] {
      std::size_t small = f.ws_bytes - 1;
      return sh::cuda::select(f.d_ws.data(), small, f.policy, dv, dm, fx::budget, sel());
    });
    expect_throw(t, f, "select: misaligned workspace", "d_workspace", [&] {
      return sh::cuda::select(f.d_ws.data() + 16, f.ws_bytes, f.policy, dv, dm, fx::budget, sel());
    });
    expect_throw(t, f, "select: workspace over the model state", "d_workspace", [&] {
      return sh::cuda::select(f.d_model_buf.data(), f.ws_bytes, f.policy, dv, dm, fx::budget, sel());
    });
    expect_throw(t, f, "select: budget not above the protected tokens", "budget", [&] {
      return sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, dv, dm, 2, sel());
    });
    expect_throw(t, f, "select: model with the wrong layer stride", "model.layer_bytes", [&] {
      auto bad = dm;
      bad.layer_bytes += 256;
      return sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, dv, bad, fx::budget, sel());
    });
    expect_throw(t, f, "select: model not laid out", "model", [&] {
      return sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, dv, sh::model_state<device_space>{}, fx::budget,
                              sel());
    });
    // compact / forget
    const auto layer = dm.layer(0);
    const auto expect_apply_throw = [&](const std::string& what, const std::string& argument,
                                        sh::eviction_selection<device_space> s2) {
      expect_throw(t, f, "compact: " + what, argument, [&] {
        return sh::cuda::compact(f.d_cws.data(), f.cws_bytes, f.policy, dv, layer, s2);
      });
      expect_throw(t, f, "forget: " + what, argument, [&] { return sh::cuda::forget(f.policy, dv, layer, s2); });
    };
    s = sel();
    s.counts = {f.d_counts.data(), fx::B + 1};
    expect_apply_throw("counts of the wrong size", "selection.counts", s);
    s = sel();
    s.slots = {f.d_slots.data(), 2};
    expect_apply_throw("slots too short", "selection.slots", s);
    s = sel();
    s.stride = -1;
    expect_apply_throw("negative stride", "selection.stride", s);
    s = sel();
    s.counts = {reinterpret_cast<std::int32_t*>(f.d_model_buf.data()), fx::B};
    expect_apply_throw("counts over the state", "selection.counts", s);
    s = sel();
    s.slots = {reinterpret_cast<std::int32_t*>(f.dk.data()), f.d_slots.size()};
    expect_throw(t, f, "compact: slots over K", "selection.slots", [&] {
      return sh::cuda::compact(f.d_cws.data(), f.cws_bytes, f.policy, dv, layer, s);
    });
    expect_throw(t, f, "reset_sequence(model): row out of range", "row",
                 [&] { return sh::cuda::reset_sequence(f.dm0, fx::rows, 0); });
    expect_throw(t, f, "reset_state(model): not laid out", "model",
                 [&] { return sh::cuda::reset_state(sh::model_state<device_space>{}); });
    // Tensor parallelism: the partial (and reduced) scores buffer.
    device_buffer<float> d_partial(sh::partial_score_count(fx::L, fx::B, f.shape.capacity));
    const sh::partial_scores<device_space> partial{
        {d_partial.data(), d_partial.size()}, fx::L, fx::B, f.shape.capacity, fx::H};
    const auto expect_partial_throw = [&](const std::string& what, const std::string& argument,
                                          sh::partial_scores<device_space> p) {
      expect_throw(t, f, "local_scores: " + what, "partial." + argument,
                   [&] { return sh::cuda::local_scores(f.policy, dv, dm, fx::budget, p); });
      expect_throw(t, f, "select from reduced scores: " + what, "reduced." + argument, [&] {
        return sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, dv, dm, fx::budget, p, sel());
      });
    };
    auto p = partial;
    p.layers = fx::L + 1;
    expect_partial_throw("another layer count", "layers", p);
    p = partial;
    p.batch = fx::B - 1;
    expect_partial_throw("another batch", "batch", p);
    p = partial;
    p.capacity = f.shape.capacity - 1;
    expect_partial_throw("another capacity", "capacity", p);
    p = partial;
    p.kv_heads = fx::H - 1;
    expect_partial_throw("fewer heads than this rank holds", "kv_heads", p);
    p = partial;
    p.values = {d_partial.data(), d_partial.size() - 1};
    expect_partial_throw("values too short", "values", p);
    p = partial;
    p.values = {reinterpret_cast<float*>(f.d_model_buf.data()), d_partial.size()};
    expect_throw(t, f, "local_scores: values over the model state", "partial.values",
                 [&] { return sh::cuda::local_scores(f.policy, dv, dm, fx::budget, p); });
  }
  {
    fxp f;
    const auto layer = f.device_model().layer(0);
    expect_throw(t, f, "compact: paged workspace below the query", "workspace_bytes", [&] {
      std::size_t small = f.cws_bytes - 4;
      return sh::cuda::compact(f.d_cws.data(), small, f.policy, f.device_view(0), layer, f.device_selection());
    });
    expect_throw(t, f, "compact: workspace over the page table", "d_workspace", [&] {
      return sh::cuda::compact(f.d_indices.data(), f.cws_bytes, f.policy, f.device_view(0), layer,
                               f.device_selection());
    });
  }
  {
    fxh f;
    expect_throw(t, f, "compress shared_heads: budget not above the protected tokens", "budget", [&] {
      return sh::cuda::compress(f.d_ws.data(), f.ws_bytes, f.policy, f.device_view(0), f.device_model().layer(0), 1,
                                {f.d_new.span(), {}});
    });
  }
  return t.report();
}

// ---------------------------------------------------------------------------
// Captures record(stream) on a fresh non-blocking stream into a CUDA graph,
// replays it once and waits: a call that allocated or synchronised would
// fail the capture.
void replay_captured(const std::function<cudaError_t(cudaStream_t)>& record) {
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CUDA_CHECK(record(stream));
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// select + compact of every layer captured in a CUDA graph, replayed: no
// allocation, no synchronisation inside.
int run_graph_test() {
  using fxp = fixture<true>;
  fxp f;
  const std::vector<std::int32_t> pinned{2, 0, 1};
  f.d_pinned.upload(pinned);
  replay_captured([&](cudaStream_t stream) {
    cudaError_t err = sh::cuda::select(f.d_ws.data(), f.ws_bytes, f.policy, f.device_view(0), f.device_model(),
                                       fxp::budget, f.device_selection(),
                                       sh::device_span<const std::int32_t>(f.d_pinned.data(), fxp::B), stream);
    for (int l = 0; err == cudaSuccess && l < fxp::L; ++l) err = f.device_apply(l, false, stream);
    return err;
  });
  f.host_select(-1, pinned);
  for (int l = 0; l < fxp::L; ++l) f.host_apply(l, -1, false);
  const auto dev = f.model_bytes();
  const bool ok = device_fact(f.all_clear() && f.d_counts.download() == f.h_counts && f.d_new.download() == f.h_new &&
                              f.same_state(dev.data(), f.h_model_buf.data()) && f.same_kv());
  std::printf("graph: select + compact captured and replayed: %s\n", ok ? "matches the host" : "MISMATCH");
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// select_shared_kernel's per-slot score, cuda::detail::combined_score (a
// host and device function), called on the host over host memory and
// compared bit for bit (NaN with NaN) with the host backend's
// combine_slot_scores, and from reduced scores with combine_reduced_scores;
// and local_scores_kernel's, heads_of_slot without positions, with
// head_partial.
// Not a device result: it runs in host-only runs too.
template <class Policy>
void check_combined_score(check_tally& tally, std::mt19937_64& rng, int layers, int heads, int pool, bool normalize,
                          bool from_reduced) {
  using G = typename Policy::granularity;
  constexpr bool highest = sh::evicts_highest<typename Policy::observation>;
  constexpr bool over_layers = G::kind == sh::granularity_kind::shared_layers;
  if (!over_layers) layers = 1;
  Policy policy;
  policy.config.pool_width = pool;
  policy.config.normalize = normalize;
  const int rows = 2, r = 1, b = 0, cap = 40, len = 37;
  const sh::state_shape shape{rows, heads, cap, policy.ring_words()};
  aligned_bytes buf(sh::model_state_bytes(shape, layers));
  const auto host_model = sh::make_model_state(sh::host_span<std::byte>(buf.data(), buf.n), shape, layers);
  // The same bytes typed as the device's: combined_score reads them on the host.
  const auto as_device = sh::make_model_state(sh::span<std::byte, device_space>(buf.data(), buf.n), shape, layers);
  std::uniform_real_distribution<float> u(-1.0f, 3.0f);
  std::uniform_int_distribution<int> counts(0, 400), one_in(0, 49);
  for (int l = 0; l < layers; ++l) {
    const auto st = host_model.layer(l);
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < cap; ++t) {
        const std::int64_t i = st.row_index(r, h, t);
        st.positions[i] = t;
        const int pick = one_in(rng);
        st.scores[i] = pick == 0 ? std::numeric_limits<float>::quiet_NaN() : pick == 1 ? 0.0f : u(rng);
        st.observed[i] = one_in(rng) < 5 ? 0.0f : static_cast<float>(counts(rng));
      }
  }
  // A head of the last layer holding another token at slot 5.
  const int odd_slot = 5;
  host_model.layer(layers - 1).positions[host_model.layer(layers - 1).row_index(r, heads - 1, odd_slot)] = 1000;
  std::vector<float> partial_values, head_acc(cap), layer_acc(cap);
  sh::partial_scores<device_space> reduced{};
  const sh::host::detail::eviction_scratch scratch{nullptr, head_acc.data(), layer_acc.data(), nullptr};
  if constexpr (over_layers) {
    if (from_reduced) {
      partial_values.assign(sh::partial_score_count(layers, 1, cap), 0.0f);
      sh::partial_scores<host_space> host_reduced{
          {partial_values.data(), partial_values.size()}, layers, 1, cap, heads};
      for (int l = 0; l < layers; ++l)
        sh::host::detail::head_partial(policy, host_model.layer(l), r, len, host_reduced.row(l, b));
      sh::host::detail::combine_reduced_scores<Policy>(host_reduced, b, len, scratch);
      reduced = {{partial_values.data(), partial_values.size()}, layers, 1, cap, heads};
    }
  }
  if (!from_reduced) sh::host::detail::combine_slot_scores(policy, host_model, r, len, scratch);
  // Bit for bit, any NaN equal to any NaN.
  const auto same_score = [](float got, float want) { return (got != got && want != want) || same_bits(got, want); };
  int wrong = 0;
  bool mismatch_right = true;
  std::string first;
  for (int t = 0; t < len; ++t) {
    bool mismatch = false;
    const float got =
        sh::cuda::detail::combined_score<G, highest>(policy.config, as_device, reduced, b, r, t, len, t, mismatch);
    const float want = layer_acc[t];
    if (!same_score(got, want) && wrong++ == 0)
      first = "slot " + std::to_string(t) + ": " + std::to_string(got) + " against the host's " + std::to_string(want);
    mismatch_right = mismatch_right && mismatch == (t == odd_slot);
  }
  const std::string what = std::string(G::name) + " " + G::head_reduction::name + ", " + std::to_string(layers) +
                           " layer(s) of " + std::to_string(heads) + " heads, pool " + std::to_string(pool) +
                           (normalize ? ", normalised" : "") + (from_reduced ? ", from reduced scores" : "");
  tally.host(wrong == 0, what + ": " + std::to_string(wrong) + " slots differ" + (first.empty() ? "" : "; " + first));
  tally.host(mismatch_right, what + ": mismatch set at the slot whose head holds another token, only there");
  if (from_reduced) return;
  // local_scores_kernel's value: one layer's heads, unfinished, positions
  // not read (host::detail::head_partial).
  int wrong_partial = 0;
  bool quiet = true;
  for (int l = 0; l < layers; ++l) {
    sh::host::detail::head_partial(policy, host_model.layer(l), r, len, head_acc.data());
    auto no_positions = as_device.layer(l);
    no_positions.positions = nullptr;  // a read would fault; -1 below matches no token either
    for (int t = 0; t < len; ++t) {
      bool unused = false;
      const float got = sh::cuda::detail::heads_of_slot<typename G::head_reduction, highest>(
          policy.config, no_positions, r, t, len, true, false, -1, unused);
      wrong_partial += same_score(got, head_acc[t]) ? 0 : 1;
      quiet = quiet && !unused;
    }
  }
  tally.host(wrong_partial == 0 && quiet,
             what + ": heads_of_slot without positions equals head_partial: " + std::to_string(wrong_partial) +
                 " slots differ" + (quiet ? "" : "; mismatch set though positions were not read"));
}

int run_combined_score_test(std::uint64_t seed) {
  check_tally tally{"combined_score"};
  std::mt19937_64 rng(seed);
  for (int heads : {1, 3, 8, 9, 17})
    for (int pool : {1, 3})
      for (bool normalize : {true, false}) {
        check_combined_score<sh::with_granularity<base_scissorhands, g_heads_mean>>(tally, rng, 1, heads, pool,
                                                                                    normalize, false);
        check_combined_score<sh::with_granularity<base_h2o, g_heads_max>>(tally, rng, 1, heads, pool, normalize, false);
        for (bool from_reduced : {false, true}) {
          check_combined_score<sh::with_granularity<base_scissorhands, g_layers_mean_max>>(tally, rng, 3, heads, pool,
                                                                                           normalize, from_reduced);
          check_combined_score<sh::with_granularity<base_h2o, g_layers_max_mean>>(tally, rng, 2, heads, pool, normalize,
                                                                                  from_reduced);
        }
      }
  return tally.report();
}

// ---------------------------------------------------------------------------
// Tensor parallelism (partial_scores.hpp): R ranks, each holding H / R KV
// heads of every layer, on one device or (multi_gpu) rank k on device
// k % count. Each rank's cuda::local_scores must equal host::local_scores
// on its shard bit for bit; the test all-reduces the partials (rank order,
// through host memory, standing in for NCCL), every rank's cuda::select on
// the reduced buffer must choose exactly what host::select chooses on the
// whole model (window counts, not normalised: every sum is exact).
// One API: the engine loop of one_api_engine.hpp, one source, through
// backend<device> on a stream and through backend<host>; the device's
// transcript (every step's new lengths and released pages, the final
// table, both layers' pools and states) must equal the host's bit for bit.
// In a host-only run the calls' host halves (every argument check, the
// shape-only sizing) run and the comparison is void.
int run_one_api() {
  int failures = 0;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const auto compare = [&](const char* name, const auto& policy) {
    const one_api::transcript on_host = one_api::run(sh::backend<sh::memory_space::host>{}, policy);
    const one_api::transcript on_device =
        one_api::run(sh::backend<sh::memory_space::device>{stream}, policy, !host_only_run());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaGetLastError());
    const bool same = device_fact(on_device == on_host);
    std::printf("one_api %s: %s\n", name, host_only_run() ? "host half only" : same ? "identical" : "DIFFERENT");
    failures += same ? 0 : 1;
  };
  sh::h2o_policy h2o;
  h2o.config.recent = 2;
  h2o.config.evict_count = 4;
  compare("h2o", h2o);
  sh::scissorhands_policy counter;
  counter.config.recent = 3;
  counter.config.evict_count = 5;
  compare("scissorhands", counter);
  if (stream != nullptr) cudaStreamDestroy(stream);
  return failures;
}

int run_tensor_parallel(bool multi_gpu) {
  using policy_t = sh::with_granularity<sh::scissorhands_paper_policy, g_layers_mean>;
  constexpr int B = 3, L = 2, H = 4, D = 8, cap = 40, budget = 24, m = 3;
  policy_t policy;
  policy.config.window = 16;
  policy.config.recent = 4;
  policy.config.evict_count = m;
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (multi_gpu && devices < 2) {
    std::printf("tensor_parallel_multi_gpu: %d device(s), needs 2: skipping\n", devices);
    return -1;
  }
  const std::vector<std::int32_t> lengths{30, 12, 24};
  const sh::state_shape whole_shape{B, H, cap, policy.ring_words()};
  // The whole model on the host, admitted, with integer window counts.
  std::vector<float> hk(std::size_t{B} * cap * H * D, 0.5f), hv = hk;
  const auto host_view = [&](std::vector<float>& k, std::vector<float>& v, int heads) {
    return sh::make_kv_view<float, host_space>({k.data(), k.size()}, {v.data(), v.size()},
                                               {lengths.data(), lengths.size()}, B, heads, D, cap,
                                               sh::named_layout::nhd);
  };
  aligned_bytes whole_buf(sh::model_state_bytes(whole_shape, L));
  const auto whole = sh::make_model_state(whole_buf.span(), whole_shape, L);
  sh::host::reset_state(whole);
  std::mt19937_64 rng(5);
  for (int l = 0; l < L; ++l) {
    sh::host::admit(policy, host_view(hk, hv, H), whole.layer(l));
    const auto st = whole.layer(l);
    for (std::int64_t i = 0; i < std::int64_t{B} * H * cap; ++i) {
      st.scores[i] = static_cast<float>(rng() % 17);
      st.observed[i] = 16.0f;
    }
  }
  // The reference: one rank, all heads.
  const int stride = sh::max_evictions(cap, budget, m);
  std::vector<std::int32_t> ref_counts(B), ref_slots(std::size_t{B} * stride, -1), ref_new(B);
  aligned_bytes ref_ws(sh::host::select_workspace_bytes(host_view(hk, hv, H), whole_shape));
  sh::host::select(policy, host_view(hk, hv, H), whole, budget, ref_ws.span(),
                   {stride, {ref_counts.data(), ref_counts.size()}, {ref_slots.data(), ref_slots.size()}, {},
                    {{ref_new.data(), ref_new.size()}, {}}});

  // A device selection against the reference, entry by entry.
  const auto same_selection = [&](const std::vector<std::int32_t>& counts, const std::vector<std::int32_t>& slots,
                                  const std::vector<std::int32_t>& news) {
    if (counts != ref_counts || news != ref_new) return false;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < ref_counts[b]; ++j)
        if (slots[static_cast<std::size_t>(b) * stride + j] != ref_slots[static_cast<std::size_t>(b) * stride + j])
          return false;
    return true;
  };
  bool ok = true;
  for (const int R : {2, 4}) {
    const int per = H / R;
    const sh::state_shape shape{B, per, cap, policy.ring_words()};
    const std::size_t floats = sh::partial_score_count(L, B, cap);
    std::vector<float> reduced(floats, 0.0f);
    struct rank_data {
      int device;
      aligned_bytes host_model{1};
      std::vector<float> host_partial;
      device_buffer<std::byte> d_model;
      device_buffer<float> d_k, d_v, d_partial;
      device_buffer<std::int32_t> d_len, d_counts, d_slots, d_new;
      device_buffer<std::byte> d_ws;
      std::size_t ws_bytes = 0;
    };
    std::vector<rank_data> ranks(R);
    for (int k = 0; k < R; ++k) {
      rank_data& rd = ranks[k];
      rd.device = multi_gpu ? k % devices : 0;
      CUDA_CHECK(cudaSetDevice(rd.device));
      // The shard: heads [k per, (k + 1) per) of every layer.
      rd.host_model = aligned_bytes(sh::model_state_bytes(shape, L));
      const auto hm = sh::make_model_state(rd.host_model.span(), shape, L);
      sh::host::reset_state(hm);
      std::vector<float> sk(std::size_t{B} * cap * per * D, 0.5f), sv = sk;
      for (int l = 0; l < L; ++l) {
        sh::host::admit(policy, host_view(sk, sv, per), hm.layer(l));
        const auto from = whole.layer(l);
        const auto to = hm.layer(l);
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < per; ++h)
            for (int t = 0; t < cap; ++t) {
              to.scores[to.index(b, h, t)] = from.scores[from.index(b, k * per + h, t)];
              to.observed[to.index(b, h, t)] = from.observed[from.index(b, k * per + h, t)];
            }
      }
      rd.host_partial.assign(floats, -99.0f);
      sh::host::local_scores(policy, host_view(sk, sv, per), hm, budget,
                             {{rd.host_partial.data(), floats}, L, B, cap, H});
      // The same shard on the device.
      const std::size_t bytes = sh::model_state_bytes(shape, L);
      rd.d_model = device_buffer<std::byte>(bytes);
      rd.d_model.upload(rd.host_model.data(), bytes);
      rd.d_k = device_buffer<float>(sk.size());
      rd.d_v = device_buffer<float>(sv.size());
      rd.d_len = device_buffer<std::int32_t>(B);
      rd.d_len.upload(lengths);
      rd.d_partial = device_buffer<float>(floats);
      rd.d_counts = device_buffer<std::int32_t>(B);
      rd.d_slots = device_buffer<std::int32_t>(std::size_t{B} * stride);
      rd.d_new = device_buffer<std::int32_t>(B);
      const auto view = sh::make_kv_view<float, device_space>({rd.d_k.data(), rd.d_k.size()}, {rd.d_v.data(), rd.d_v.size()},
                                                              {rd.d_len.data(), B}, B, per, D, cap, sh::named_layout::nhd);
      const auto dm = sh::make_model_state(rd.d_model.span(), shape, L);
      CUDA_CHECK(sh::cuda::local_scores(policy, view, dm, budget, {{rd.d_partial.data(), floats}, L, B, cap, H}));
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> dev_partial = rd.d_partial.download();
      for (std::size_t i = 0; i < floats; ++i)
        if (!device_fact(same_bits(dev_partial[i], rd.host_partial[i]))) {
          std::printf("tensor_parallel: R %d rank %d partial %zu: device %g host %g\n", R, k, i, dev_partial[i],
                      rd.host_partial[i]);
          ok = false;
          break;
        }
      for (std::size_t i = 0; i < floats; ++i) reduced[i] = k == 0 ? dev_partial[i] : reduced[i] + dev_partial[i];
    }
    for (int k = 0; k < R; ++k) {
      rank_data& rd = ranks[k];
      CUDA_CHECK(cudaSetDevice(rd.device));
      rd.d_partial.upload(reduced);  // the all-reduce's result, the same bits on every rank
      const auto view = sh::make_kv_view<float, device_space>({rd.d_k.data(), rd.d_k.size()}, {rd.d_v.data(), rd.d_v.size()},
                                                              {rd.d_len.data(), B}, B, per, D, cap, sh::named_layout::nhd);
      const auto dm = sh::make_model_state(rd.d_model.span(), shape, L);
      const sh::partial_scores<device_space> scores{{rd.d_partial.data(), floats}, L, B, cap, H};
      const sh::eviction_selection<device_space> sel{
          stride, {rd.d_counts.data(), B}, {rd.d_slots.data(), std::size_t{B} * stride}, {}, {{rd.d_new.data(), B}, {}}};
      CUDA_CHECK(sh::cuda::select(nullptr, rd.ws_bytes, policy, view, dm, budget, scores, sel));
      rd.d_ws = device_buffer<std::byte>(rd.ws_bytes);
      CUDA_CHECK(sh::cuda::select(rd.d_ws.data(), rd.ws_bytes, policy, view, dm, budget, scores, sel));
      CUDA_CHECK(cudaDeviceSynchronize());
      if (!device_fact(same_selection(rd.d_counts.download(), rd.d_slots.download(), rd.d_new.download()))) {
        std::printf("tensor_parallel: R %d rank %d (device %d) chose other slots than one rank over all heads\n", R, k,
                    rd.device);
        ok = false;
      }
    }
  }
  CUDA_CHECK(cudaSetDevice(0));
  if (!multi_gpu) {
    // One rank holding every head, local_scores + select on its (trivially
    // reduced) scores captured in a CUDA graph on a non-default stream, as
    // an engine's decode step would hold them around its all-reduce node.
    const std::size_t floats = sh::partial_score_count(L, B, cap);
    const std::size_t bytes = sh::model_state_bytes(whole_shape, L);
    device_buffer<std::byte> d_model(bytes);
    d_model.upload(whole_buf.data(), bytes);
    device_buffer<float> d_k(hk.size()), d_v(hv.size()), d_partial(floats);
    device_buffer<std::int32_t> d_len(B), d_counts(B), d_slots(std::size_t{B} * stride), d_new(B);
    d_len.upload(lengths);
    const auto view = sh::make_kv_view<float, device_space>({d_k.data(), d_k.size()}, {d_v.data(), d_v.size()},
                                                            {d_len.data(), B}, B, H, D, cap, sh::named_layout::nhd);
    const auto dm = sh::make_model_state(d_model.span(), whole_shape, L);
    const sh::partial_scores<device_space> scores{{d_partial.data(), floats}, L, B, cap, H};
    const sh::eviction_selection<device_space> sel{
        stride, {d_counts.data(), B}, {d_slots.data(), std::size_t{B} * stride}, {}, {{d_new.data(), B}, {}}};
    std::size_t ws_bytes = 0;
    CUDA_CHECK(sh::cuda::select(nullptr, ws_bytes, policy, view, dm, budget, scores, sel));
    device_buffer<std::byte> d_ws(ws_bytes);
    replay_captured([&](cudaStream_t stream) {
      const cudaError_t err = sh::cuda::local_scores(policy, view, dm, budget, scores, stream);
      return err != cudaSuccess ? err
                                : sh::cuda::select(d_ws.data(), ws_bytes, policy, view, dm, budget, scores, sel, {}, stream);
    });
    const bool same = device_fact(same_selection(d_counts.download(), d_slots.download(), d_new.download()));
    std::printf("tensor_parallel: local_scores + select captured in a graph and replayed: %s\n",
                same ? "matches the host" : "MISMATCH");
    ok = ok && same;
  }
  std::printf("tensor_parallel%s: local_scores against the host, select on reduced scores against one rank: %s\n",
              multi_gpu ? " (multi-GPU)" : "", ok ? "match" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  suite_options o = parse_options(argc, argv, 600,
                                  "[--configs N] [--seed S] [--only differential,errors,graph,tensor_parallel,"
                                  "tensor_parallel_multi_gpu,combined_score,one_api] [--quick] [--long N] [--host-only]",
                                  [](const std::string&, auto&) { return false; });
  if (o.quick) o.configs = std::min(o.configs, 24);
  const std::string& only = o.only;
  start(argv[0], o.seed, o.host_only);
  int failures = 0;
  failures +=
      run_part(only, "differential", [&] { return run_differential(o.configs, o.seed, o.quick, o.long_first); });
  failures += run_part(only, "errors", [] { return run_error_tests(); });
  failures += run_part(only, "graph", [] { return run_graph_test(); });
  failures += run_part(only, "tensor_parallel", [] { return run_tensor_parallel(false); });
  failures += run_part(only, "combined_score", [&] { return run_combined_score_test(o.seed); });
  failures += run_part(only, "one_api", [] { return run_one_api(); });
  if (!only.empty()) {
    // Its own CTest entry: skipped (77) below two devices.
    int multi = 0;
    failures += run_part(only, "tensor_parallel_multi_gpu", [&] {
      multi = run_tensor_parallel(true);
      return multi < 0 ? 0 : multi;
    });
    if (multi < 0) return 77;
  }
  return finish(failures);
}
