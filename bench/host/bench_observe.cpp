// Host observe at a decode step (q_len = 1) over a cache of `length` tokens.
// observe does not depend on m; it runs once per generated token.
//
// Byte counts (logical bytes, each counted once per call):
//   state: per (sequence, KV head, token) the score and observed count, and
//          the one 32-bit word of the ring this step overwrites, each read
//          and written: 3 * 4 * 2 = 24 bytes;
//   observe_probabilities: + the probability rows, read once
//          (batch * 32 query heads * length * 4 bytes; the validation pass
//          reads them a second time, which is not counted);
//   observe_queries: + the queries and K. K is read once with the kernel's
//          log-sum-exp; without it host/observe.hpp makes one pass for an
//          online log-sum-exp of every query head of the group together,
//          then the scoring pass: 2 reads, counted as such (from L2 or L3: a head's keys are 256 KiB at B = 512, 4 MiB at 8192).
// observe_queries_lse_bf16: the same on a cache stored as an engine's bf16
//          (K counted at 2 bytes per element).
// observe_queries_lse_int8 / _int4: the same on a quantized cache
//          (quantized_kv_view, groups of 32), K dequantized on the fly: K
//          counted as its codes plus its fp32 group parameters (136 and 72
//          bytes per row at head_dim 128).
// observe_queries_lse_checked_every_call / _unchecked: observe_queries_lse
//          with the LSE's sums checked on every call / never (lse_check):
//          the cost of one sampled call, and the baseline.
// items = (sequence, KV head, token) triples observed.
// Each timed step observes the last token as a new one (rewind_last_token):
// admitted, then scored with the others, as a decode step's token is.
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "bench_host.hpp"
#include "fixture.hpp"
#include "pool.hpp"

namespace bench_host {
// An engine's own bf16 (the upper 16 bits of an fp32), as a host engine
// storing bf16 K/V declares it: the library reads it through
// element_traits (tests/host/element_test.cpp checks the pattern).
struct bench_bf16 {
  std::uint16_t bits;
};
inline bench_bf16 to_bf16(float x) {  // round to nearest even
  const auto u = std::bit_cast<std::uint32_t>(x);
  return {static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
}  // namespace bench_host

template <>
struct scissorhands::element_traits<bench_host::bench_bf16> {
  static float to_float(bench_host::bench_bf16 x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }
};

namespace bench_host {
namespace {

constexpr std::size_t state_observe_bytes = 24;

// Attention rows of a decode step: heavy-tailed (u^4), each row summing to 1.
std::vector<float> make_probabilities(std::int32_t batch, std::int32_t length) {
  std::vector<float> p(static_cast<std::size_t>(batch) * q_heads * length);
  rng r(3);
  for (std::size_t row = 0; row < p.size() / length; ++row) {
    float* x = p.data() + row * length;
    double sum = 0.0;
    for (std::int32_t t = 0; t < length; ++t) {
      const float u = r.uniform();
      x[t] = u * u * u * u;
      sum += x[t];
    }
    for (std::int32_t t = 0; t < length; ++t) x[t] = static_cast<float>(x[t] / sum);
  }
  return p;
}

// threads = 0: the serial call; threads >= 1: its plan in that many slices
// on a spinning pool. Both timed in wall time (Google Benchmark's clock).
void observe_probabilities(benchmark::State& st, std::int32_t batch, std::int32_t length, std::int32_t threads) {
  const auto policy = scissorhands_with(1);
  layer l = make_layer(policy, batch, length);
  set_lengths(l, length);
  const std::vector<float> p = make_probabilities(batch, length);
  const auto probs = sh::probability_view<sh::memory_space::host>::dense(
      sh::host_span<const float>(p.data(), p.size()), q_heads, 1, length);
  sh::host::observe_probabilities(policy, l.cache, l.state, probs);  // admits every token, untimed
  slice_pool workers(std::max(threads, 1));
  for (auto _ : st) {
    rewind_last_token(l);
    if (threads == 0)
      sh::host::observe_probabilities(policy, l.cache, l.state, probs);
    else
      workers.run(sh::host::plan_observe_probabilities(policy, l.cache, l.state, probs));
    benchmark::ClobberMemory();
  }
  const auto tokens = static_cast<std::int64_t>(l.tokens());
  st.SetItemsProcessed(st.iterations() * tokens);
  st.SetBytesProcessed(st.iterations() *
                       (tokens * static_cast<std::int64_t>(state_observe_bytes) +
                        static_cast<std::int64_t>(p.size() * sizeof(float))));
}

// The layer's K and V quantized with the reference quantizer, NHD.
struct quantized_copy {
  std::vector<std::uint8_t> codes[2];
  std::vector<float> params[2];
  sh::host_quantized_kv_view view;
  quantized_copy(const layer& l, std::int32_t batch, std::int32_t length, sh::kv_quantization q) {
    const std::size_t rows = l.cache.k.size() / head_dim;
    for (int kind = 0; kind < 2; ++kind) {
      codes[kind].resize(rows * static_cast<std::size_t>(q.code_row_bytes(head_dim)));
      params[kind].resize(rows * static_cast<std::size_t>(q.params_per_row(head_dim)));
    }
    view = sh::make_quantized_kv_view<sh::memory_space::host>(
        {codes[0].data(), codes[0].size()}, {codes[1].data(), codes[1].size()}, {params[0].data(), params[0].size()},
        {params[1].data(), params[1].size()}, l.cache.lengths, batch, kv_heads, head_dim, length,
        sh::named_layout::nhd, q);
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < kv_heads; ++h)
        for (std::int32_t t = 0; t < length; ++t) {
          sh::quantize_row(l.cache.k_row(b, h, t), head_dim, q, view.k_row(b, h, t), view.k_params_row(b, h, t));
          sh::quantize_row(l.cache.v_row(b, h, t), head_dim, q, view.v_row(b, h, t), view.v_params_row(b, h, t));
        }
  }
};

struct int8_storage {};
struct int4_storage {};
template <class T>
constexpr bool is_quantized_storage = std::is_same_v<T, int8_storage> || std::is_same_v<T, int4_storage>;
template <class T>
constexpr sh::kv_quantization quantization_of() {
  return {std::is_same_v<T, int8_storage> ? sh::quant_kind::int8 : sh::quant_kind::int4, 32};
}

// What an observe_queries benchmark hands over: no LSE (the library's own
// normaliser), the kernel's LSE with its sums checked on sampled calls (the
// default lse_check: a row's first call and one in 256, so a run of fewer
// timed calls may see none), the same LSE checked on every call (each
// row's step counter zeroed first, so every call is a row's first: what
// one sampled call costs), or unchecked (lse_check::none: the baseline).
enum class lse_passed { none, checked, checked_every_call, unchecked };

// T: how the cache is stored: float, an engine's bf16 (the layer's K and V
// rounded to it; the library reads it through element_traits), or int8 /
// int4 codes with group parameters (a quantized_kv_view). group_size:
// query heads per KV head (the fixture's `group`; observe_queries_gqa
// also 3).
template <class T>
void observe_queries(benchmark::State& st, std::int32_t batch, std::int32_t length, lse_passed passed,
                     std::int32_t threads, std::int32_t group_size) {
  const bool with_lse = passed != lse_passed::none;
  const std::int32_t heads = group_size * kv_heads;  // query heads
  const auto policy = scissorhands_with(1);
  layer l = make_layer(policy, batch, length);
  set_lengths(l, length);
  std::vector<T> k_narrow, v_narrow;
  std::unique_ptr<quantized_copy> quantized;
  const auto cache = [&] {
    if constexpr (std::is_same_v<T, float>) {
      return l.cache;
    } else if constexpr (is_quantized_storage<T>) {
      quantized = std::make_unique<quantized_copy>(l, batch, length, quantization_of<T>());
      return quantized->view;
    } else {
      const std::size_t n = l.cache.k.size();
      k_narrow.resize(n);
      v_narrow.resize(n);
      for (std::size_t i = 0; i < n; ++i) k_narrow[i] = to_bf16(l.cache.k[i]), v_narrow[i] = to_bf16(l.cache.v[i]);
      return sh::make_kv_view(sh::host_span<T>(k_narrow.data(), n), sh::host_span<T>(v_narrow.data(), n),
                              l.cache.lengths, batch, kv_heads, head_dim, length, sh::named_layout::nhd);
    }
  }();
  // K row (b, h, t) as the library reads it.
  std::vector<float> key(head_dim);
  const auto key_of = [&](std::int32_t b, std::int32_t h, std::int32_t t) {
    if constexpr (is_quantized_storage<T>) {
      cache.dequantize_k(b, h, t, key.data());
    } else {
      for (std::int32_t d = 0; d < head_dim; ++d) key[static_cast<std::size_t>(d)] = sh::to_float(cache.k_row(b, h, t)[d]);
    }
    return key.data();
  };
  std::vector<float> q(static_cast<std::size_t>(batch) * heads * head_dim);
  rng r(4);
  for (float& x : q) x = r.symmetric();
  const auto queries =
      sh::query_view<float, sh::memory_space::host>::dense(sh::host_span<const float>(q.data(), q.size()), heads,
                                                           1, head_dim);
  // The true natural log-sum-exp of each query's scaled logits, as the
  // attention kernel would hand it over.
  std::vector<float> lse_data(static_cast<std::size_t>(batch) * heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (std::int32_t b = 0; b < batch; ++b)
    for (std::int32_t qh = 0; qh < heads; ++qh) {
      std::vector<double> logits(static_cast<std::size_t>(length));
      double m = -1e300;
      for (std::int32_t t = 0; t < length; ++t) {
        const float* k = key_of(b, qh / group_size, t);
        const float* x = queries.row(b, qh, 0);
        double dot = 0.0;
        for (std::int32_t d = 0; d < head_dim; ++d) dot += double{x[d]} * k[d];
        logits[static_cast<std::size_t>(t)] = dot * scale;
        m = std::max(m, dot * scale);
      }
      double sum = 0.0;
      for (double z : logits) sum += std::exp(z - m);
      lse_data[static_cast<std::size_t>(b) * heads + qh] = static_cast<float>(m + std::log(sum));
    }
  sh::lse_view<sh::memory_space::host> lse{};
  if (with_lse) lse = sh::lse_view<sh::memory_space::host>::dense(
                    sh::host_span<const float>(lse_data.data(), lse_data.size()), heads, 1, sh::lse_base::natural);
  if (passed == lse_passed::unchecked) lse.check = sh::lse_check::none;
  sh::host::observe_queries(policy, cache, l.state, queries, lse);  // admits every token, untimed
  slice_pool workers(std::max(threads, 1));
  for (auto _ : st) {
    rewind_last_token(l);
    if (passed == lse_passed::checked_every_call)
      for (std::int32_t b = 0; b < batch; ++b) l.state.step[b] = 0;
    if (threads == 0)
      sh::host::observe_queries(policy, cache, l.state, queries, lse);
    else
      workers.run(sh::host::plan_observe_queries(policy, cache, l.state, queries, lse));
    benchmark::ClobberMemory();
  }
  const auto tokens = static_cast<std::int64_t>(l.tokens());
  const std::int64_t k_passes = with_lse ? 1 : 2;
  std::int64_t k_row_bytes = head_dim * static_cast<std::int64_t>(sizeof(T));
  if constexpr (is_quantized_storage<T>) {
    constexpr sh::kv_quantization q = quantization_of<T>();
    k_row_bytes = q.code_row_bytes(head_dim) + q.params_per_row(head_dim) * std::int64_t{sizeof(float)};
  }
  const std::int64_t per_call = tokens * static_cast<std::int64_t>(state_observe_bytes) +
                                k_passes * tokens * k_row_bytes +
                                static_cast<std::int64_t>(q.size() * sizeof(float)) +
                                (with_lse ? static_cast<std::int64_t>(lse_data.size() * sizeof(float)) : 0);
  st.SetItemsProcessed(st.iterations() * tokens);
  st.SetBytesProcessed(st.iterations() * per_call);
}

// The single-core copy bandwidth the observe figures are compared with:
// memcpy of `bytes` between two buffers, counted once (bytes copied per
// second). Sizes: the probabilities of a batch-1 and a batch-8 step at
// B = 2048, and K of one layer at batch 1 and 8.
void copy_baseline(benchmark::State& st, std::size_t bytes) {
  std::vector<std::byte> from(bytes, std::byte{1}), to(bytes, std::byte{0});
  for (auto _ : st) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<std::int64_t>(bytes));
}

}  // namespace

void register_copy_baseline() {
  for (std::size_t kib : {256, 2048, 8192, 65536})
    benchmark::RegisterBenchmark(("copy/KiB:" + std::to_string(kib)).c_str(), copy_baseline, kib * 1024)
        ->Unit(benchmark::kMicrosecond);
}

void register_observe() {
  for (std::int32_t batch : {1, 8})
    for (std::int32_t length : {512, 2048, 8192}) {
      const std::string shape = "/batch:" + std::to_string(batch) + "/B:" + std::to_string(length);
      benchmark::RegisterBenchmark(("observe_probabilities" + shape).c_str(), observe_probabilities, batch, length, 0)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("observe_queries_lse" + shape).c_str(), observe_queries<float>, batch, length,
                                   lse_passed::checked,
                                   0, group)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("observe_queries" + shape).c_str(), observe_queries<float>, batch, length,
                                   lse_passed::none,
                                   0, group)
          ->Unit(benchmark::kMicrosecond);
      if (length == 2048) {
        // The LSE's sums check (lse_check) on every call, and no check, against observe_queries_lse.
        benchmark::RegisterBenchmark(("observe_queries_lse_checked_every_call" + shape).c_str(),
                                     observe_queries<float>, batch, length, lse_passed::checked_every_call, 0, group)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("observe_queries_lse_unchecked" + shape).c_str(), observe_queries<float>, batch,
                                     length, lse_passed::unchecked, 0, group)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("observe_queries_lse_bf16" + shape).c_str(), observe_queries<bench_bf16>, batch,
                                     length, lse_passed::checked, 0, group)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("observe_queries_lse_int8" + shape).c_str(), observe_queries<int8_storage>,
                                     batch, length, lse_passed::checked, 0, group)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("observe_queries_lse_int4" + shape).c_str(), observe_queries<int4_storage>,
                                     batch, length, lse_passed::checked, 0, group)
            ->Unit(benchmark::kMicrosecond);
      }
    }
}

// Grouped-query attention with 3 query heads per KV head (SmolLM2's 9 / 3):
// the heads past the last four, which the blocked path pads to four,
// against the fixture's 4 per KV head over the same K (the baseline of
// the same run). Without an LSE, as a flash-attention engine that keeps
// none (llama.cpp) calls it.
void register_observe_groups() {
  for (std::int32_t g : {3, 4}) {
    const std::string shape = "/batch:1/B:2048/group:" + std::to_string(g);
    benchmark::RegisterBenchmark(("observe_queries_gqa" + shape).c_str(), observe_queries<float>, 1, 2048, lse_passed::none,
                                 0, g)
        ->Unit(benchmark::kMicrosecond);
  }
}

void register_observe_threads() {
  for (std::int32_t batch : {1, 8})
    for (std::int32_t threads : {1, 2}) {
      const std::string shape = "/batch:" + std::to_string(batch) + "/B:2048/T:" + std::to_string(threads);
      benchmark::RegisterBenchmark(("observe_probabilities_threads" + shape).c_str(), observe_probabilities, batch,
                                   2048, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("observe_queries_lse_threads" + shape).c_str(), observe_queries<float>, batch, 2048,
                                   lse_passed::checked, threads, group)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace bench_host
