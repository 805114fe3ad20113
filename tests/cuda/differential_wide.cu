// scissorhands_cuda_test, part "wide_elements": a cache and queries of an
// 8-byte element type (double, converted by an element_traits an engine
// would write, as below) at head_dim 64, which has a fast path. The fast
// paths hold four or more elements a 16-byte vector, so observe_queries
// must take the generic kernel for it; observe from queries (with and
// without the log-sum-exp) is compared with the host's, as
// run_case compares it (positions and observed counts exact, scores within
// 1e-4 relative).
#include "differential.cuh"

template <>
struct scissorhands::element_traits<double> {
  SCISSORHANDS_HOST_DEVICE static float to_float(double x) { return static_cast<float>(x); }
};

namespace differential {

int run_wide_elements() {
  using policy_t = p_mass_decay_max;
  constexpr int B = 2, H = 2, G = 2, QH = H * G, D = 64, cap = 40;
  // Two steps: the first admits a prompt and observes its last token's
  // query, the second appends a token and observes its query (the same
  // query vector, the log-sum-exp of each step's keys).
  const std::vector<std::int32_t> lengths_at[2] = {{36, 20}, {37, 21}};
  std::vector<std::int32_t> lengths = lengths_at[0];
  policy_t policy;
  policy.config.recent = 4;
  std::mt19937_64 rng(64);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> k(std::size_t{B} * cap * H * D), v(k.size()), q(std::size_t{B} * QH * D);
  for (auto* x : {&k, &v, &q})
    for (double& e : *x) e = u(rng);
  const auto hview = sh::make_kv_view<double, host_space>({k.data(), k.size()}, {v.data(), v.size()},
                                                          {lengths.data(), lengths.size()}, B, H, D, cap,
                                                          sh::named_layout::nhd);
  const auto hq = sh::query_view<double, host_space>::dense({q.data(), q.size()}, QH, 1, D);
  // The log-sum-exp an attention kernel would return (natural base), per step.
  const double scale = 1.0 / std::sqrt(double{D});
  std::vector<float> lse_at[2];
  for (int step = 0; step < 2; ++step) {
    lse_at[step].resize(std::size_t{B} * QH);
    for (int b = 0; b < B; ++b)
      for (int qh = 0; qh < QH; ++qh)
        lse_at[step][static_cast<std::size_t>(b) * QH + qh] =
            static_cast<float>(reference_lse(lengths_at[step][b], scale, [&](int t) {
              double dot = 0.0;
              for (int x = 0; x < D; ++x)
                dot += double(sh::to_float(hq.row(b, qh, 0)[x])) * sh::to_float(hview.k_row(b, qh / G, t)[x]);
              return dot;
            }));
  }

  device_buffer<double> d_k(k.size()), d_v(v.size()), d_q(q.size());
  device_buffer<std::int32_t> d_len(lengths.size());
  device_buffer<float> d_lse(std::size_t{B} * QH);
  d_k.upload(k);
  d_v.upload(v);
  d_q.upload(q);
  const auto dview = sh::make_kv_view<double, device_space>({d_k.data(), d_k.size()}, {d_v.data(), d_v.size()},
                                                            {d_len.data(), d_len.size()}, B, H, D, cap,
                                                            sh::named_layout::nhd);
  const auto dq = sh::query_view<double, device_space>::dense({d_q.data(), d_q.size()}, QH, 1, D);

  const sh::state_shape shape{B, H, cap, policy.ring_words()};
  const std::size_t bytes = sh::state_bytes(shape);
  int failed = 0;
  for (const bool with_lse : {true, false}) {
    aligned_bytes h_buf(bytes), snapshot(bytes);
    device_buffer<std::byte> d_buf(bytes);
    const auto hst = sh::make_state(h_buf.span(), shape);
    const auto dst = sh::make_state(d_buf.span(), shape);
    sh::host::reset_state(hst);
    CUDA_CHECK(sh::cuda::reset_state(dst));
    mismatch_log log;
    for (int step = 0; step < 2 && log.ok(); ++step) {
      lengths = lengths_at[step];
      d_len.upload(lengths);
      std::vector<float>& lse = lse_at[step];
      d_lse.upload(lse);
      const auto hl = with_lse ? sh::lse_view<host_space>::dense({lse.data(), lse.size()}, QH, 1, sh::lse_base::natural)
                               : sh::lse_view<host_space>{};
      const auto dl = with_lse
                          ? sh::lse_view<device_space>::dense({d_lse.data(), d_lse.size()}, QH, 1, sh::lse_base::natural)
                          : sh::lse_view<device_space>{};
      sh::host::observe_queries(policy, hview, hst, hq, hl);
      CUDA_CHECK(sh::cuda::observe_queries(policy, dview, dst, dq, dl));
      CUDA_CHECK(cudaDeviceSynchronize());
      d_buf.download(snapshot.data(), bytes);
      const auto dsnap = sh::make_state(snapshot.span(), shape);
      if (status_clear("wide elements", dsnap, log))
        compare_state("wide elements", hst, dsnap, {{0, lengths[0]}, {1, lengths[1]}}, score_rule{false, false},
                      false, log);
    }
    std::printf("wide_elements: double cache and queries, head_dim %d, %s: %s\n", D,
                with_lse ? "log-sum-exp given" : "own normaliser", log.ok() ? "matches the host" : "MISMATCH");
    if (!log.ok()) {
      std::printf("%s", log.text.str().c_str());
      ++failed;
    }
  }
  return failed;
}

}  // namespace differential
