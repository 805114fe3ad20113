#pragma once
// Part of differential.cu (one translation unit keeps nvcc time down):
// the device-side error checks and the CUDA graph test.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "harness.cuh"

namespace checks {

using namespace harness;
namespace sh = scissorhands;

// Everything a call could write, to prove a refused call wrote nothing.
struct device_snapshot {
  std::vector<std::byte> state;
  std::vector<float> k, v;
  std::vector<std::int32_t> lengths;
  bool operator==(const device_snapshot&) const = default;
};

struct error_case {
  using policy_t = sh::scissorhands_policy;
  static constexpr int B = 2, H = 2, G = 2, QH = H * G, D = 8, cap = 32, budget = 20;
  policy_t policy;
  std::vector<float> hk, hv, probs;
  std::vector<std::int32_t> lengths{12, 25};
  device_buffer<float> dk, dv, d_probs;
  device_buffer<std::int32_t> d_len;
  device_buffer<std::byte> d_state;
  sh::eviction_state<device_space> state;
  device_buffer<std::uint32_t> status;
  device_buffer<std::byte> ws;
  std::size_t ws_bytes = 0;

  error_case() : dk(B * cap * H * D), dv(B * cap * H * D), d_probs(B * QH * cap), d_len(B), status(1) {
    policy.config.window = 8;
    policy.config.recent = 2;
    policy.config.evict_count = 2;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    hk.resize(dk.size());
    hv.resize(dv.size());
    for (auto& x : hk) x = u(rng);
    for (auto& x : hv) x = u(rng);
    dk.upload(hk);
    dv.upload(hv);
    d_len.upload(lengths);
    probs.assign(d_probs.size(), 1.0f / 32.0f);
    d_probs.upload(probs);
    const sh::state_shape shape = sh::state_shape_for(policy, view());
    d_state = device_buffer<std::byte>(sh::state_bytes(shape));
    state = sh::make_state(d_state.span(), shape);
    CUDA_CHECK(sh::cuda::reset_state(state));
    clear_status();
    CUDA_CHECK(sh::cuda::compress(nullptr, ws_bytes, policy, view(), state, budget, {}, status.data()));
    ws = device_buffer<std::byte>(ws_bytes);
  }
  sh::device_kv_view<float> view() const {
    return sh::make_kv_view(dk.span(), dv.span(), d_len.span(), B, H, D, cap, sh::named_layout::nhd);
  }
  sh::probability_view<device_space> probs_view(int q_len = 1) const {
    return sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, q_len, cap / q_len);
  }
  void clear_status() const { CUDA_CHECK(cudaMemset(status.data(), 0, sizeof(std::uint32_t))); }
  std::uint32_t word() const {
    std::uint32_t w = 0;
    CUDA_CHECK(cudaDeviceSynchronize());
    status.download(&w, 1);
    return w;
  }
  device_snapshot snapshot() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    device_snapshot s;
    s.state.resize(d_state.size());
    d_state.download(s.state.data(), s.state.size());
    s.k = dk.download();
    s.v = dv.download();
    s.lengths = d_len.download();
    return s;
  }
  void set_lengths(std::vector<std::int32_t> l) {
    lengths = std::move(l);
    d_len.upload(lengths);
  }
  cudaError_t observe(int q_len = 1) {
    return sh::cuda::observe_probabilities(policy, view(), state, probs_view(q_len), status.data());
  }
  cudaError_t compress() {
    return sh::cuda::compress(ws.data(), ws_bytes, policy, view(), state, budget, {}, status.data());
  }
  template <class X>
  void poke(X* d_ptr, X value) const {
    CUDA_CHECK(cudaMemcpy(d_ptr, &value, sizeof(X), cudaMemcpyHostToDevice));
  }
};

}  // namespace checks

int run_error_tests() {
  using namespace checks;
  int checks_run = 0, failures = 0;
  auto expect = [&](bool ok, const char* what) {
    ++checks_run;
    if (!ok) {
      ++failures;
      std::printf("FAIL errors: %s\n", what);
    }
  };
  // A call the device refuses: the given bit is set and nothing was written.
  auto expect_refused = [&](error_case& c, std::uint32_t bit, const char* what, auto&& call) {
    c.clear_status();
    const device_snapshot before = c.snapshot();
    CUDA_CHECK(call());
    const std::uint32_t w = c.word();
    if ((w & bit) == 0) std::printf("  %s: status word %u (%s)\n", what, w, sh::cuda::describe_status(w).c_str());
    expect((w & bit) != 0, what);
    expect(c.snapshot() == before, (std::string(what) + ": the refused call wrote nothing").c_str());
    c.clear_status();
  };
  // A call the host refuses: invalid_argument, nothing launched.
  auto expect_throw = [&](error_case& c, const char* what, auto&& call) {
    c.clear_status();
    const device_snapshot before = c.snapshot();
    bool threw = false;
    try {
      (void)call();
    } catch (const sh::invalid_argument&) {
      threw = true;
    }
    expect(threw, what);
    expect(c.word() == 0 && c.snapshot() == before, (std::string(what) + ": nothing launched").c_str());
  };

  {
    error_case c;
    CUDA_CHECK(c.observe());
    expect(c.word() == 0, "a valid observe leaves the status word at zero");

    c.set_lengths({12, 33});
    expect_refused(c, sh::cuda::status_length, "length above capacity", [&] { return c.observe(); });
    // Sticky: with the word still set, a valid call is a no-op too.
    c.set_lengths({12, 25});
    c.poke(c.status.data(), std::uint32_t{sh::cuda::status_length});
    const device_snapshot before = c.snapshot();
    CUDA_CHECK(c.observe());
    expect(c.snapshot() == before, "a non-zero status word makes later calls no-ops");
    c.clear_status();
    CUDA_CHECK(c.observe());
    expect(c.word() == 0 && !(c.snapshot() == before), "clearing the word resumes");

    c.probs[1 * c.QH * c.cap + 2 * c.cap + 3] = std::nanf("");
    c.d_probs.upload(c.probs);
    expect_refused(c, sh::cuda::status_probability, "NaN probability", [&] { return c.observe(); });
    c.probs[1 * c.QH * c.cap + 2 * c.cap + 3] = 1.5f;
    c.d_probs.upload(c.probs);
    expect_refused(c, sh::cuda::status_probability, "probability above 1", [&] { return c.observe(); });
    c.probs[1 * c.QH * c.cap + 2 * c.cap + 3] = -0.25f;
    c.d_probs.upload(c.probs);
    expect_refused(c, sh::cuda::status_probability, "negative probability", [&] { return c.observe(); });
    c.probs[1 * c.QH * c.cap + 2 * c.cap + 3] = 1.0f / 32.0f;
    c.d_probs.upload(c.probs);

    std::int32_t tracked0 = 0;
    CUDA_CHECK(cudaMemcpy(&tracked0, c.state.tracked, sizeof tracked0, cudaMemcpyDeviceToHost));
    c.poke(c.state.tracked, std::int32_t{13});
    expect_refused(c, sh::cuda::status_tracked, "tracked above length (observe)", [&] { return c.observe(); });
    expect_refused(c, sh::cuda::status_tracked, "tracked above length (admit)",
                   [&] { return sh::cuda::admit(c.policy, c.view(), c.state, c.status.data()); });
    expect_refused(c, sh::cuda::status_tracked, "tracked above length (compress)", [&] { return c.compress(); });
    c.poke(c.state.tracked, tracked0);

    std::int32_t next0 = 0;
    CUDA_CHECK(cudaMemcpy(&next0, c.state.next_position, sizeof next0, cudaMemcpyDeviceToHost));
    c.set_lengths({14, 25});  // two new tokens that would not get an int32 position
    c.poke(c.state.next_position, std::int32_t{INT32_MAX - 1});
    expect_refused(c, sh::cuda::status_position_overflow, "next_position overflow", [&] { return c.observe(); });
    c.poke(c.state.next_position, next0);
    c.set_lengths({12, 25});

    // The view covers one column everywhere (host check) but not 25.
    {
      const auto full = c.probs_view();
      sh::probability_view<device_space> short_view = full;
      short_view.data = {c.d_probs.data(), static_cast<std::size_t>(full.sequence_stride + 3 * full.head_stride + 20)};
      expect_refused(c, sh::cuda::status_view_extent, "probability view shorter than the lengths", [&] {
        return sh::cuda::observe_probabilities(c.policy, c.view(), c.state, short_view, c.status.data());
      });
    }

    // Tokens appended but never observed, at the budget: compress refuses.
    c.set_lengths({12, 27});
    expect_refused(c, sh::cuda::status_untracked, "compress with unobserved tokens", [&] { return c.compress(); });
    c.set_lengths({12, 25});

    // Every token of (1, 0) protected: too few to evict.
    {
      std::vector<std::int32_t> saved(c.cap);
      std::int32_t* positions = c.state.positions + c.state.index(1, 0, 0);
      CUDA_CHECK(cudaMemcpy(saved.data(), positions, sizeof(std::int32_t) * c.cap, cudaMemcpyDeviceToHost));
      std::int32_t next = 0;
      CUDA_CHECK(cudaMemcpy(&next, c.state.next_position + 1, sizeof next, cudaMemcpyDeviceToHost));
      std::vector<std::int32_t> same(c.cap, next - 1);
      CUDA_CHECK(cudaMemcpy(positions, same.data(), sizeof(std::int32_t) * c.cap, cudaMemcpyHostToDevice));
      expect_refused(c, sh::cuda::status_positions, "compress with too few unprotected tokens",
                     [&] { return c.compress(); });
      CUDA_CHECK(cudaMemcpy(positions, saved.data(), sizeof(std::int32_t) * c.cap, cudaMemcpyHostToDevice));
    }

    // Log-sum-exp that is not finite.
    {
      std::vector<float> q(c.B * c.QH * c.D, 0.5f), lse(c.B * c.QH, 1.0f);
      lse[3] = std::numeric_limits<float>::infinity();
      device_buffer<float> d_q(q.size()), d_lse(lse.size());
      d_q.upload(q);
      d_lse.upload(lse);
      const auto qv = sh::query_view<float, device_space>::dense({d_q.data(), d_q.size()}, c.QH, 1, c.D);
      const auto lv = sh::lse_view<device_space>::dense({d_lse.data(), d_lse.size()}, c.QH, 1);
      expect_refused(c, sh::cuda::status_lse, "infinite log-sum-exp", [&] {
        return sh::cuda::observe_queries(c.policy, c.view(), c.state, qv, lv, 0.0f, c.status.data());
      });
    }

    // Host-side refusals.
    expect_throw(c, "budget not above the protected tokens", [&] {
      return sh::cuda::compress(c.ws.data(), c.ws_bytes, c.policy, c.view(), c.state, 2, {}, c.status.data());
    });
    expect_throw(c, "workspace below the query", [&] {
      std::size_t small = c.ws_bytes - 4;
      return sh::cuda::compress(c.ws.data(), small, c.policy, c.view(), c.state, c.budget, {}, c.status.data());
    });
    expect_throw(c, "null status word", [&] {
      return sh::cuda::observe_probabilities(c.policy, c.view(), c.state, c.probs_view(), nullptr);
    });
    expect_throw(c, "state made for another policy", [&] {
      auto other = c.policy;
      other.config.window = 100;  // more ring words
      return sh::cuda::observe_probabilities(other, c.view(), c.state, c.probs_view(), c.status.data());
    });
    expect_throw(c, "q_heads not a multiple of kv_heads", [&] {
      auto pv = c.probs_view();
      pv.q_heads = 3;
      return sh::cuda::observe_probabilities(c.policy, c.view(), c.state, pv, c.status.data());
    });

    // And a valid compress still works after all of that.
    c.clear_status();
    CUDA_CHECK(c.compress());
    const auto l = c.d_len.download();
    expect(c.word() == 0 && l[0] == 12 && l[1] == c.budget - 2, "compress after the refusals");
  }

  {
    // q_len above a sequence's length (fresh state, so tracked is 0).
    error_case c;
    c.set_lengths({1, 25});
    expect_refused(c, sh::cuda::status_query_length, "q_len above a length", [&] { return c.observe(2); });
  }

  {
    // Paged: page ids outside the pool, and an impossible last_page_len.
    using policy_t = sh::h2o_policy;
    policy_t policy;
    policy.config.recent = 1;
    const int H = 1, D = 4, P = 4, pages = 4;
    device_buffer<float> dk(pages * P * H * D), dv(pages * P * H * D), d_probs(8);
    std::vector<std::int32_t> indptr{0, 2}, indices{0, 5}, last{3};
    device_buffer<std::int32_t> d_indptr(2), d_indices(2), d_last(1);
    d_indptr.upload(indptr);
    d_indices.upload(indices);
    d_last.upload(last);
    std::vector<float> probs(8, 0.1f);
    d_probs.upload(probs);
    device_buffer<std::uint32_t> status(1);
    CUDA_CHECK(cudaMemset(status.data(), 0, 4));
    const auto view = sh::make_paged_kv_view(dk.span(), dv.span(), sh::device_span<const std::int32_t>(d_indptr.data(), 2),
                                             sh::device_span<const std::int32_t>(d_indices.data(), 2), d_last.span(),
                                             1, H, D, P, pages, pages);
    const sh::state_shape shape = sh::state_shape_for(policy, view);
    device_buffer<std::byte> d_state(sh::state_bytes(shape));
    const auto state = sh::make_state(d_state.span(), shape);
    CUDA_CHECK(sh::cuda::reset_state(state));
    const auto pv = sh::probability_view<device_space>::dense({d_probs.data(), 8}, 1, 1, 8);
    auto word = [&] {
      std::uint32_t w = 0;
      CUDA_CHECK(cudaDeviceSynchronize());
      status.download(&w, 1);
      CUDA_CHECK(cudaMemset(status.data(), 0, 4));
      return w;
    };
    CUDA_CHECK(sh::cuda::observe_probabilities(policy, view, state, pv, status.data()));
    expect((word() & sh::cuda::status_page_table) != 0, "paged: page id outside the pool");
    indices[1] = 1;
    d_indices.upload(indices);
    CUDA_CHECK(sh::cuda::observe_probabilities(policy, view, state, pv, status.data()));
    expect(word() == 0, "paged: a valid table passes");
    last[0] = 0;
    d_last.upload(last);
    CUDA_CHECK(sh::cuda::observe_probabilities(policy, view, state, pv, status.data()));
    expect((word() & sh::cuda::status_page_table) != 0, "paged: last_page_len 0 on a sequence with pages");
  }

  std::printf("errors: %d of %d checks passed\n", checks_run - failures, checks_run);
  return failures;
}

// ---------------------------------------------------------------------------
// CUDA graph: append (the engine's part), observe and compress captured
// once, replayed step after step; the host backend runs the same steps.

namespace checks {

template <class T>
__global__ void graph_append(T* k, T* v, sh::kv_layout kl, sh::kv_layout vl, std::int32_t* lengths, const T* k_new,
                             const T* v_new, const int* counter, int batch, int heads, int dim) {
  const int b = static_cast<int>(threadIdx.x);
  if (b >= batch) return;
  const int step = *counter, t = lengths[b];
  for (int h = 0; h < heads; ++h)
    for (int x = 0; x < dim; ++x) {
      const std::size_t src = ((static_cast<std::size_t>(step) * batch + b) * heads + h) * dim + x;
      k[kl.offset(b, h, t) + x] = k_new[src];
      v[vl.offset(b, h, t) + x] = v_new[src];
    }
  lengths[b] = t + 1;
}

__global__ void graph_copy_probs(float* probs, const float* all, const int* counter, std::size_t n) {
  const std::size_t base = static_cast<std::size_t>(*counter) * n;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    probs[i] = all[base + i];
}

__global__ void graph_bump(int* counter) { *counter += 1; }

}  // namespace checks

int run_graph_test(int steps) {
  using namespace checks;
  using T = __nv_bfloat16;
  using policy_t = sh::scissorhands_policy;
  policy_t policy;
  policy.config.window = 16;
  policy.config.recent = 4;
  policy.config.evict_count = 3;
  constexpr int B = 3, H = 2, G = 4, QH = H * G, D = 64, cap = 48, budget = 40;
  const std::size_t elements = static_cast<std::size_t>(B) * cap * H * D;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), up(0.0f, 0.1f);

  std::vector<T> hk(elements), hv(elements), k_new(static_cast<std::size_t>(steps) * B * H * D),
      v_new(k_new.size());
  for (auto& x : hk) x = from_float<T>(u(rng));
  for (auto& x : hv) x = from_float<T>(u(rng));
  for (auto& x : k_new) x = from_float<T>(u(rng));
  for (auto& x : v_new) x = from_float<T>(u(rng));
  const std::size_t probs_per_step = static_cast<std::size_t>(B) * QH * cap;
  std::vector<float> probs_all(probs_per_step * steps);
  for (auto& x : probs_all) x = up(rng);
  std::vector<std::int32_t> h_len{10, 25, 38};

  device_buffer<T> dk(elements), dv(elements), d_knew(k_new.size()), d_vnew(v_new.size());
  device_buffer<float> d_probs_all(probs_all.size()), d_probs(probs_per_step);
  device_buffer<std::int32_t> d_len(B);
  device_buffer<int> counter(1);
  device_buffer<std::uint32_t> status(1);
  dk.upload(hk);
  dv.upload(hv);
  d_knew.upload(k_new);
  d_vnew.upload(v_new);
  d_probs_all.upload(probs_all);
  d_len.upload(h_len);
  CUDA_CHECK(cudaMemset(counter.data(), 0, sizeof(int)));
  CUDA_CHECK(cudaMemset(status.data(), 0, sizeof(std::uint32_t)));

  const auto hview = sh::make_kv_view(sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
                                      sh::host_span<std::int32_t>(h_len.data(), B), B, H, D, cap, sh::named_layout::nhd);
  const auto dview = sh::make_kv_view(dk.span(), dv.span(), d_len.span(), B, H, D, cap, sh::named_layout::nhd);
  const sh::state_shape shape = sh::state_shape_for(policy, hview);
  const std::size_t bytes = sh::state_bytes(shape);
  aligned_bytes h_state(bytes), snap(bytes), h_ws(sh::host::compress_workspace_bytes(hview));
  device_buffer<std::byte> d_state(bytes);
  const auto hst = sh::make_state(h_state.span(), shape);
  const auto dst = sh::make_state(d_state.span(), shape);
  const auto dsnap = sh::make_state(snap.span(), shape);
  sh::host::reset_state(hst);
  CUDA_CHECK(sh::cuda::reset_state(dst));
  std::size_t ws_bytes = 0;
  CUDA_CHECK(sh::cuda::compress(nullptr, ws_bytes, policy, dview, dst, budget, {}, status.data()));
  device_buffer<std::byte> d_ws(ws_bytes);
  const auto dp = sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, 1, cap);

  // Capture one decode step.
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  graph_append<T><<<1, 32, 0, stream>>>(dk.data(), dv.data(), dview.k_layout, dview.v_layout, d_len.data(),
                                         d_knew.data(), d_vnew.data(), counter.data(), B, H, D);
  graph_copy_probs<<<8, 256, 0, stream>>>(d_probs.data(), d_probs_all.data(), counter.data(), probs_per_step);
  CUDA_CHECK(sh::cuda::observe_probabilities(policy, dview, dst, dp, status.data(), stream));
  CUDA_CHECK(sh::cuda::compress(d_ws.data(), ws_bytes, policy, dview, dst, budget, {}, status.data(), stream));
  graph_bump<<<1, 1, 0, stream>>>(counter.data());
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  int failures = 0, host_step = 0;
  auto host_steps = [&](int until) {
    for (; host_step < until; ++host_step) {
      for (int b = 0; b < B; ++b) {
        const int t = h_len[b];
        for (int h = 0; h < H; ++h)
          for (int x = 0; x < D; ++x) {
            const std::size_t src = ((static_cast<std::size_t>(host_step) * B + b) * H + h) * D + x;
            hk[hview.k_layout.offset(b, h, t) + x] = k_new[src];
            hv[hview.v_layout.offset(b, h, t) + x] = v_new[src];
          }
        h_len[b] = t + 1;
      }
      const auto hp = sh::probability_view<host_space>::dense(
          {probs_all.data() + probs_per_step * host_step, probs_per_step}, QH, 1, cap);
      sh::host::observe_probabilities(policy, hview, hst, hp);
      sh::host::compress(policy, hview, hst, budget, h_ws.span());
    }
  };
  auto compare = [&](int at) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    mismatch_log log;
    std::uint32_t w = 0;
    status.download(&w, 1);
    if (w != 0) log.add("status word ", w, " (", sh::cuda::describe_status(w), ")");
    const auto len = d_len.download();
    for (int b = 0; b < B; ++b)
      if (len[b] != h_len[b]) log.add("length[", b, "] host ", h_len[b], " device ", len[b]);
    d_state.download(snap.data(), bytes);
    const std::vector<int> lens(h_len.begin(), h_len.end());
    compare_state("graph", hst, dsnap, lens, score_rule{}, true, log);
    const auto dev_k = dk.download(), dev_v = dv.download();
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < h_len[b]; ++t) {
          const std::size_t ko = hview.k_layout.offset(b, h, t), vo = hview.v_layout.offset(b, h, t);
          if (std::memcmp(&hk[ko], &dev_k[ko], sizeof(T) * D) != 0 || std::memcmp(&hv[vo], &dev_v[vo], sizeof(T) * D) != 0)
            log.add("K/V row (", b, ",", h, ",", t, ") differs");
        }
    if (!log.ok()) {
      ++failures;
      std::printf("FAIL graph after %d replays:\n%s", at, log.text.str().c_str());
    }
  };
  const int half = steps / 2;
  for (int s = 0; s < half; ++s) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  host_steps(half);
  compare(half);
  for (int s = half; s < steps; ++s) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  host_steps(steps);
  compare(steps);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("graph: %d replays of append + observe + compress %s\n", steps,
              failures == 0 ? "match the host backend" : "DIFFER from the host backend");
  return failures;
}
