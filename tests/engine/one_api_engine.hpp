#pragma once
// An engine loop written once against scissorhands::backend<Space>, the
// spelling both backends share: two layers over one FlashInfer page table
// (NHD pages), continuous batching with a prefill chunk, a paused request
// and decode steps; per step and layer observe_probabilities then compress
// (workspace sized from the policy and shapes only, before any cache
// memory exists), then one shrink_page_table whose released pages go back
// to the pool. The same source runs on the host (tests/host/one_api_test.cpp,
// which checks the transcript's invariants) and on the device
// (tests/cuda/token_level.cu, "one_api": the device's transcript must equal
// the host's, bit for bit; its argument checks run in CI's host-only run).
//
// memory<Space>::array<T> is how the engine holds an array in that space:
// constructed from host values, span(), download(). The host one is here;
// the CUDA test defines the device one.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <stdexcept>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace one_api {

namespace sh = scissorhands;

template <sh::memory_space Space>
struct memory;

// Host arrays 256-byte aligned, as make_state wants a state buffer.
template <>
struct memory<sh::memory_space::host> {
  template <class T>
  struct array {
    T* p = nullptr;
    std::size_t n = 0;
    explicit array(const std::vector<T>& v) : n(v.size()) {
      p = static_cast<T*>(std::aligned_alloc(256, (n * sizeof(T) + 255) / 256 * 256 + 256));
      if (n > 0) std::memcpy(static_cast<void*>(p), v.data(), n * sizeof(T));
    }
    array(array&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr, o.n = 0; }
    array& operator=(array&& o) noexcept {
      std::swap(p, o.p);
      std::swap(n, o.n);
      return *this;
    }
    array(const array&) = delete;
    ~array() { std::free(p); }
    sh::host_span<T> span() { return {p, n}; }
    std::vector<T> download() const { return std::vector<T>(p, p + n); }
  };
};

struct transcript {
  std::vector<std::vector<std::int32_t>> new_lengths;  // per step
  std::vector<std::int32_t> released;                  // per step, pages released
  std::vector<std::int32_t> indptr, indices, last_page_len;
  std::vector<std::vector<float>> k, v;     // per layer, the whole pool
  std::vector<std::vector<std::byte>> states;  // per layer
  bool operator==(const transcript&) const = default;
};

constexpr std::int32_t batch = 2, kv_heads = 2, q_heads = 4, head_dim = 8, page_size = 4, layers = 2;
constexpr std::int32_t budget = 12, num_pages = 16, max_pages = 8, steps = 20;

inline float value_of(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                    (c + 0x85EBCA77C2B2AE63ull) * 0x94D049BB133111EBull ^ (d + 1) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ull;
  x ^= x >> 27;
  return static_cast<float>(static_cast<double>(x >> 40) * 0x1p-24 * 2.0 - 1.0);
}

// Tokens each request appends at step s: request 0 prefills 6 then decodes,
// request 1 joins at step 2 with 3, pauses at steps 9 and 10.
inline std::int32_t appended(std::int32_t b, std::int32_t s) {
  if (b == 0) return s == 0 ? 6 : 1;
  if (s < 2) return 0;
  if (s == 2) return 3;
  return s == 9 || s == 10 ? 0 : 1;
}

// Every backend call's result is checked (the device's launch status, the
// host's host_status; bad input throws on both), unless `check_launches`
// is false: a host-only run of the CUDA test, where every launch fails
// and only the calls' host halves are under test.
template <sh::memory_space Space, class Policy>
transcript run(sh::backend<Space> be, const Policy& policy, bool check_launches = true) {
  const auto launched = [check_launches](auto status) {
    if (check_launches && !sh::succeeded(status)) throw std::runtime_error("one_api: a launch failed");
  };
  using mem = memory<Space>;
  const std::int32_t step_tokens = 6;
  const sh::state_shape shape{batch, kv_heads, sh::state_capacity_for(budget, step_tokens), policy.ring_words()};
  // The engine's host mirror of its table; the pools live in Space.
  std::vector<std::int32_t> indptr(batch + 1, 0), indices, last(batch, 0), free_pages;
  for (std::int32_t p = num_pages - 1; p >= 0; --p) free_pages.push_back(p);
  const std::size_t pool = std::size_t{num_pages} * page_size * kv_heads * head_dim;
  std::vector<typename mem::template array<float>> k, v;
  std::vector<typename mem::template array<std::byte>> states;
  for (std::int32_t l = 0; l < layers; ++l) {
    k.emplace_back(std::vector<float>(pool, 0.0f));
    v.emplace_back(std::vector<float>(pool, 0.0f));
    states.emplace_back(std::vector<std::byte>(sh::state_bytes(shape)));
    launched(be.reset_state(sh::make_state(states.back().span(), shape)));
  }
  std::vector<std::int32_t> next_position(batch, 0);
  const auto row = [&](std::int32_t page, std::int32_t t, std::int32_t h) {
    return ((std::size_t(page) * page_size + std::size_t(t)) * kv_heads + std::size_t(h)) * head_dim;
  };
  const auto pages_of = [&](std::int32_t b) { return indptr[std::size_t(b) + 1] - indptr[std::size_t(b)]; };
  const auto length_of = [&](std::int32_t b) {
    return pages_of(b) == 0 ? 0 : (pages_of(b) - 1) * page_size + last[std::size_t(b)];
  };
  transcript out;
  for (std::int32_t s = 0; s < steps; ++s) {
    // Append: pages from the pool, K/V rows written into the pools.
    std::vector<std::vector<float>> hk, hv;
    for (std::int32_t l = 0; l < layers; ++l) hk.push_back(k[std::size_t(l)].download()), hv.push_back(v[std::size_t(l)].download());
    std::vector<std::int32_t> q_len(batch);
    for (std::int32_t b = 0; b < batch; ++b) {
      q_len[std::size_t(b)] = appended(b, s);
      for (std::int32_t i = 0; i < q_len[std::size_t(b)]; ++i) {
        const std::int32_t len = length_of(b);
        if (len % page_size == 0) {  // a new page at the end of b's list
          const std::int32_t page = free_pages.back();
          free_pages.pop_back();
          indices.insert(indices.begin() + indptr[std::size_t(b) + 1], page);
          for (std::int32_t c = b + 1; c <= batch; ++c) ++indptr[std::size_t(c)];
          last[std::size_t(b)] = 0;
        }
        const std::int32_t page = indices[std::size_t(indptr[std::size_t(b) + 1] - 1)];
        const std::int32_t t = last[std::size_t(b)]++;
        const std::int32_t position = next_position[std::size_t(b)]++;
        for (std::int32_t l = 0; l < layers; ++l)
          for (std::int32_t h = 0; h < kv_heads; ++h)
            for (std::int32_t d = 0; d < head_dim; ++d) {
              hk[std::size_t(l)][row(page, t, h) + std::size_t(d)] = value_of(1 + std::uint64_t(l), std::uint64_t(b), std::uint64_t(position) * 16 + std::uint64_t(h), std::uint64_t(d));
              hv[std::size_t(l)][row(page, t, h) + std::size_t(d)] = value_of(7 + std::uint64_t(l), std::uint64_t(b), std::uint64_t(position) * 16 + std::uint64_t(h), std::uint64_t(d));
            }
      }
    }
    typename mem::template array<std::int32_t> d_indptr(indptr), d_indices(indices.empty() ? std::vector<std::int32_t>{0} : indices),
        d_last(last), qo([&] {
          std::vector<std::int32_t> qo(batch + 1, 0);
          for (std::int32_t b = 0; b < batch; ++b) qo[std::size_t(b) + 1] = qo[std::size_t(b)] + q_len[std::size_t(b)];
          return qo;
        }());
    const std::int32_t tokens = [&] { std::int32_t n = 0; for (auto q : q_len) n += q; return n; }();
    const std::int32_t columns = max_pages * page_size;
    typename mem::template array<std::int32_t> new_lengths(std::vector<std::int32_t>(batch, -1)),
        freed(std::vector<std::int32_t>(batch, -1));
    for (std::int32_t l = 0; l < layers; ++l) {
      k[std::size_t(l)] = typename mem::template array<float>(hk[std::size_t(l)]);
      v[std::size_t(l)] = typename mem::template array<float>(hv[std::size_t(l)]);
      const auto cache = sh::make_paged_kv_view(k[std::size_t(l)].span(), v[std::size_t(l)].span(),
                                                sh::span<const std::int32_t, Space>(d_indptr.span()),
                                                sh::span<const std::int32_t, Space>(d_indices.span()),
                                                d_last.span(), batch, kv_heads, head_dim, page_size, num_pages,
                                                max_pages, sh::named_layout::nhd);
      // The step's attention, token-major ragged [token][q_head][column]:
      // causal softmax of q.k / sqrt(head_dim) over the request's slots.
      std::vector<float> probs(std::size_t(tokens > 0 ? tokens : 1) * q_heads * columns, 0.0f);
      std::int32_t token = 0;
      for (std::int32_t b = 0; b < batch; ++b) {
        const std::int32_t len = length_of(b);
        for (std::int32_t j = 0; j < q_len[std::size_t(b)]; ++j, ++token)
          for (std::int32_t qh = 0; qh < q_heads; ++qh) {
            const std::int32_t h = qh / (q_heads / kv_heads);
            const std::int32_t visible = len - q_len[std::size_t(b)] + j + 1;
            std::vector<double> logit(static_cast<std::size_t>(visible));
            double top = -1e300;
            for (std::int32_t t = 0; t < visible; ++t) {
              const std::int32_t page = indices[std::size_t(indptr[std::size_t(b)] + t / page_size)];
              double dot = 0.0;
              for (std::int32_t d = 0; d < head_dim; ++d)
                dot += double(value_of(3, std::uint64_t(s), std::uint64_t(token) * 16 + std::uint64_t(qh), std::uint64_t(d)) * 3.0f) *
                       double(hk[std::size_t(l)][row(page, t % page_size, h) + std::size_t(d)]);
              logit[std::size_t(t)] = dot / std::sqrt(double(head_dim));
              top = logit[std::size_t(t)] > top ? logit[std::size_t(t)] : top;
            }
            double sum = 0.0;
            for (double x : logit) sum += std::exp(x - top);
            for (std::int32_t t = 0; t < visible; ++t)
              probs[(std::size_t(token) * q_heads + std::size_t(qh)) * columns + std::size_t(t)] =
                  static_cast<float>(std::exp(logit[std::size_t(t)] - top) / sum);
          }
      }
      typename mem::template array<float> d_probs(probs);
      const auto state = sh::make_state(states[std::size_t(l)].span(), shape);
      launched(be.observe_probabilities(policy, cache, state,
                               sh::probability_view<Space>::ragged(d_probs.span(), qo.span(), q_heads, columns)));
      // Sized from the policy and the shapes alone (a view with no memory).
      auto shape_only = cache;
      shape_only.k_pages = {}, shape_only.v_pages = {}, shape_only.indptr = {}, shape_only.indices = {}, shape_only.last_page_len = {};
      typename mem::template array<std::byte> workspace(
          std::vector<std::byte>(sh::backend<Space>::compress_workspace_bytes(policy, shape_only, shape)));
      launched(be.compress(policy, cache, state, budget, workspace.span(), {new_lengths.span(), freed.span()}));
    }
    // Once after the last layer: the table shrinks, the pages go back.
    typename mem::template array<std::int32_t> released(std::vector<std::int32_t>(num_pages, -1));
    typename mem::template array<sh::shrink_result> result(std::vector<sh::shrink_result>(1));
    launched(be.shrink_page_table(d_indptr.span(), d_indices.span(), d_last.span(), page_size,
                         sh::span<const std::int32_t, Space>(new_lengths.span()), released.span(), result.span()));
    const sh::shrink_result r = result.download()[0];
    const std::vector<std::int32_t> gone = released.download();
    for (std::int32_t i = 0; i < r.released; ++i) free_pages.push_back(gone[std::size_t(i)]);
    out.new_lengths.push_back(new_lengths.download());
    out.released.push_back(r.released);
    indptr = d_indptr.download();
    indices = d_indices.download();
    indices.resize(std::size_t(indptr[batch]));
    last = d_last.download();
  }
  out.indptr = indptr, out.indices = indices, out.last_page_len = last;
  for (std::int32_t l = 0; l < layers; ++l) {
    out.k.push_back(k[std::size_t(l)].download());
    out.v.push_back(v[std::size_t(l)].download());
    out.states.push_back(states[std::size_t(l)].download());
  }
  return out;
}

}  // namespace one_api
