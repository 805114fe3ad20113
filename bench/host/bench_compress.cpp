// Host compress against a naive baseline, side by side on the same data.
//
// What each timed call sees. Every sequence holds exactly `budget` tokens
// (compress triggers) and every token's score has just been redrawn, so the
// m tokens to evict are scattered over the slots as in the middle of a long
// decode. compress writes the new lengths into a compress_output (it never
// writes the engine's lengths). Between calls, untimed (manual timing,
// UseManualTime): the engine applies them (copies new_lengths into its
// lengths, as after the last layer of a step) and checks them, then the
// slots the previous call emptied are filled again by admitting m new tokens
// (host::admit: fresh positions and state; their K/V bytes are stale, which
// compress does not look at), and the scores are redrawn from a pool of
// Scissorhands-like window counts (integers 0..400, most of them small, so
// ties are common and the position tie-break is exercised). Restoring only
// this much keeps the untimed work small, and each timed call does the full
// work of a real trigger: validation, the scan of every token, selection and
// compaction of the rows actually evicted.
//
// The naive baseline is what a straightforward implementation does: collect
// every unprotected token's (score, position), sort them all, and copy the
// kept rows (K, V, position, score, observed count, history ring) in slot
// order into a fresh buffer allocated (and pre-faulted) outside the timed
// region. It leaves the source untouched, so no refill is needed; the scores
// are redrawn exactly as for the library, from the same pool offsets.
//
// Byte counts (logical bytes, each counted once per call):
//   both: the state scanned to pick victims, position, score and observed
//         count of every token (12 bytes per token and head);
//   library: + per row actually moved (counted after each call by comparing
//         positions, untimed) its K and V rows and its state, read and
//         written (2 * (1024 + 12 + 4 * ring_words) bytes);
//   naive: + per kept row the same, read and written.
// items = tokens evicted (per KV head), so items/s is evictions per second.
#include <algorithm>
#include <cmath>
#include <vector>

#include "bench_host.hpp"
#include "fixture.hpp"
#include "pool.hpp"

namespace bench_host {
namespace {

// Scissorhands-like window counts: floor(401 u^3), most tokens rarely important.
std::vector<float> make_score_pool(std::size_t tokens) {
  std::vector<float> pool(2 * tokens + 1);
  rng r(5);
  for (float& x : pool) {
    const float u = r.uniform();
    x = std::floor(401.0f * u * u * u);
  }
  return pool;
}

// Redraws every slot's score: a window of the pool that moves with the
// iteration (a large prime stride), identical for library and baseline.
void redraw_scores(const layer& l, const std::vector<float>& pool, std::uint64_t iteration) {
  const std::size_t n = l.tokens();
  const std::size_t offset = (iteration * 104729u) % (pool.size() - n);
  std::memcpy(l.state.scores, pool.data() + offset, n * sizeof(float));
}

// Back to `budget` tokens per sequence (the engine appends m tokens to each),
// the emptied slots re-admitted as new tokens.
template <class Policy>
void refill(const Policy& policy, const layer& l, std::int32_t budget, const std::vector<float>& pool,
            std::uint64_t iteration) {
  set_lengths(l, budget);
  sh::host::admit(policy, l.cache, l.state);
  redraw_scores(l, pool, iteration);
}

// The naive baseline's destination: same shapes as the source, fresh memory.
struct naive_target {
  sh::host_kv_view<float> cache;
  host_state state;
};

naive_target make_naive_target(const layer& src) {
  arenas& s = storage();
  const std::size_t elems = src.tokens() * head_dim;
  naive_target t;
  t.cache = src.cache;
  t.cache.k = sh::host_span<float>(reinterpret_cast<float*>(s.dst_k.bytes(elems * sizeof(float))), elems);
  t.cache.v = sh::host_span<float>(reinterpret_cast<float*>(s.dst_v.bytes(elems * sizeof(float))), elems);
  const std::size_t bytes = sh::state_bytes(src.state.shape);
  t.state = sh::make_state(sh::host_span<std::byte>(s.dst_state.bytes(bytes), bytes), src.state.shape);
  return t;
}

struct naive_candidate {
  float score;
  std::int32_t position;
  std::int32_t slot;
};

// Full sort of the unprotected tokens, then a copy of every kept row. Returns
// the rows copied. `candidates` and `keep` are scratch of capacity entries.
template <class Policy>
std::int64_t naive_compress(const Policy& policy, const layer& src, const naive_target& dst, std::int32_t budget,
                            std::vector<naive_candidate>& candidates, std::vector<unsigned char>& keep) {
  const sh::settings& cfg = policy.config;
  const auto row = static_cast<std::size_t>(head_dim) * sizeof(float);
  const std::int32_t words = src.state.shape.ring_words;
  std::int64_t copied = 0;
  for (std::int32_t b = 0; b < src.batch; ++b) {
    const std::int32_t len = src.cache.length(b);
    if (len < budget) continue;
    const std::int32_t evict = len - budget + cfg.evict_count;
    const std::int32_t next = src.state.next_position[b];
    for (std::int32_t h = 0; h < kv_heads; ++h) {
      candidates.clear();
      for (std::int32_t t = 0; t < len; ++t) {
        const std::int64_t i = src.state.index(b, h, t);
        const std::int32_t pos = src.state.positions[i];
        if (pos >= next - cfg.recent || pos < cfg.sinks) continue;
        // The policy's own order: normalised, and negated for a policy that
        // evicts its highest scores (scissorhands_policy counts unimportant steps).
        candidates.push_back({sh::detail::eviction_score(src.state.scores[i], src.state.observed[i], cfg,
                                                          sh::evicts_highest<typename Policy::observation>),
                              pos, t});
      }
      std::sort(candidates.begin(), candidates.end(), [](const naive_candidate& a, const naive_candidate& c) {
        return a.score < c.score || (a.score == c.score && a.position < c.position);
      });
      std::fill(keep.begin(), keep.begin() + len, 1);
      for (std::int32_t k = 0; k < evict; ++k) keep[static_cast<std::size_t>(candidates[k].slot)] = 0;
      std::int32_t out = 0;
      for (std::int32_t t = 0; t < len; ++t) {
        if (!keep[static_cast<std::size_t>(t)]) continue;
        std::memcpy(dst.cache.k_row(b, h, out), src.cache.k_row(b, h, t), row);
        std::memcpy(dst.cache.v_row(b, h, out), src.cache.v_row(b, h, t), row);
        const std::int64_t i = src.state.index(b, h, t);
        const std::int64_t o = dst.state.index(b, h, out);
        dst.state.positions[o] = src.state.positions[i];
        dst.state.scores[o] = src.state.scores[i];
        dst.state.observed[o] = src.state.observed[i];
        const sh::history_ring from = src.state.ring_of(b, h, t), to = dst.state.ring_of(b, h, out);
        for (std::int32_t w = 0; w < words; ++w) to[w] = from[w];
        ++out;
      }
      copied += out;
    }
  }
  return copied;
}

// Untimed, once per benchmark: the library and the baseline must keep the
// same tokens of every head. Leaves the layer compressed (refill it).
template <class Policy>
bool same_kept_tokens(const Policy& policy, const layer& l, const naive_target& dst, std::int32_t budget,
                      std::vector<naive_candidate>& candidates, std::vector<unsigned char>& keep) {
  naive_compress(policy, l, dst, budget, candidates, keep);
  sh::host::compress(policy, l.cache, l.state, budget, l.workspace, l.out);
  apply_new_lengths(l);
  const std::int32_t kept = budget - policy.config.evict_count;
  for (std::int32_t b = 0; b < l.batch; ++b) {
    if (l.cache.length(b) != kept) return false;
    for (std::int32_t h = 0; h < kv_heads; ++h) {
      const std::int32_t* a = l.state.positions + l.state.index(b, h, 0);
      const std::int32_t* c = dst.state.positions + dst.state.index(b, h, 0);
      std::vector<std::int32_t> x(a, a + kept), y(c, c + kept);
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      if (x != y) return false;
    }
  }
  return true;
}

// threads = 0: the serial call, timed in the thread's CPU time; threads >= 1:
// plan_compress run in that many slices on a spinning pool, timed in wall
// time (plan included), so that 1 and 2 threads compare on one clock.
template <class Policy>
void compress_library(benchmark::State& st, Policy policy, std::int32_t batch, std::int32_t budget,
                      std::int32_t threads) {
  layer l = make_layer(policy, batch, budget);
  const std::size_t sliced_bytes = sh::host::compress_workspace_bytes(l.cache, l.state.shape, std::max(threads, 1));
  std::vector<std::uint64_t> sliced_workspace((sliced_bytes + 7) / 8);  // 8-byte aligned
  const sh::host_span<std::byte> workspace =
      threads == 0 ? l.workspace
                   : sh::host_span<std::byte>(reinterpret_cast<std::byte*>(sliced_workspace.data()), sliced_bytes);
  slice_pool workers(std::max(threads, 1));
  const std::vector<float> pool = make_score_pool(l.tokens());
  std::vector<std::int32_t> before(l.tokens());
  const std::int32_t kept = budget - policy.config.evict_count;
  std::int64_t moves = 0;
  std::uint64_t iteration = 0;
  for (auto _ : st) {
    refill(policy, l, budget, pool, iteration++);
    std::memcpy(before.data(), l.state.positions, before.size() * sizeof(std::int32_t));
    if (threads == 0) {
      const double start = thread_seconds();
      sh::host::compress(policy, l.cache, l.state, budget, workspace, l.out);
      st.SetIterationTime(thread_seconds() - start);
    } else {
      const double start = wall_seconds();
      workers.run(sh::host::plan_compress(policy, l.cache, l.state, budget, workspace, l.out, threads));
      st.SetIterationTime(wall_seconds() - start);
    }
    apply_new_lengths(l);  // the engine's part, untimed (it was inside compress before compress_output)
    if (std::any_of(l.lengths.begin(), l.lengths.end(), [&](std::int32_t n) { return n != kept; })) {
      st.SkipWithError("compress reported a new length other than budget - m");
      break;
    }
    // A slot below `kept` whose token changed received a moved row.
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        const std::int64_t base = l.state.index(b, h, 0);
        for (std::int32_t t = 0; t < kept; ++t)
          moves += l.state.positions[base + t] != before[static_cast<std::size_t>(base + t)];
      }
  }
  const auto tokens = static_cast<std::int64_t>(l.tokens());
  const auto move_bytes = static_cast<std::int64_t>(2 * (kv_row_bytes + state_row_bytes(l.state)));
  st.SetBytesProcessed(st.iterations() * tokens * 12 + moves * move_bytes);
  st.SetItemsProcessed(st.iterations() * batch * kv_heads * policy.config.evict_count);
  st.counters["moves/call"] = static_cast<double>(moves) / static_cast<double>(std::max<std::int64_t>(1, st.iterations()));
}

template <class Policy>
void compress_naive(benchmark::State& st, Policy policy, std::int32_t batch, std::int32_t budget) {
  layer l = make_layer(policy, batch, budget);
  const naive_target dst = make_naive_target(l);
  const std::vector<float> pool = make_score_pool(l.tokens());
  std::vector<naive_candidate> candidates;
  candidates.reserve(static_cast<std::size_t>(budget));
  std::vector<unsigned char> keep(static_cast<std::size_t>(budget));
  refill(policy, l, budget, pool, 0);
  if (!same_kept_tokens(policy, l, dst, budget, candidates, keep)) {
    st.SkipWithError("the library and the naive baseline kept different tokens");
    return;
  }
  refill(policy, l, budget, pool, 0);
  std::int64_t copied = 0;
  std::uint64_t iteration = 0;
  for (auto _ : st) {
    redraw_scores(l, pool, iteration++);  // the source is left as it was; only the scores change
    const double start = thread_seconds();
    copied += naive_compress(policy, l, dst, budget, candidates, keep);
    st.SetIterationTime(thread_seconds() - start);
    benchmark::ClobberMemory();
  }
  const auto tokens = static_cast<std::int64_t>(l.tokens());
  const auto row_bytes = static_cast<std::int64_t>(2 * (kv_row_bytes + state_row_bytes(l.state)));
  st.SetBytesProcessed(st.iterations() * tokens * 12 + copied * row_bytes);
  st.SetItemsProcessed(st.iterations() * batch * kv_heads * policy.config.evict_count);
}

template <class Policy>
void register_pair(const std::string& policy_name, Policy policy, std::int32_t batch, std::int32_t budget) {
  const std::string shape = "/batch:" + std::to_string(batch) + "/B:" + std::to_string(budget) +
                            "/m:" + std::to_string(policy.config.evict_count);
  benchmark::RegisterBenchmark(("compress/" + policy_name + shape).c_str(), compress_library<Policy>, policy, batch,
                               budget, 0)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("naive/" + policy_name + shape).c_str(), compress_naive<Policy>, policy, batch,
                               budget)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

void register_compress_threads() {
  for (std::int32_t batch : {1, 8})
    for (std::int32_t m : {1, 2048 / 16})
      for (std::int32_t threads : {1, 2}) {
        const std::string name = "compress_threads/scissorhands/batch:" + std::to_string(batch) +
                                 "/B:2048/m:" + std::to_string(m) + "/T:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), compress_library<decltype(scissorhands_with(m))>,
                                     scissorhands_with(m), batch, 2048, threads)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
}

void register_compress() {
  for (std::int32_t batch : {1, 8})
    for (std::int32_t budget : {512, 2048, 8192})
      for (std::int32_t m : {1, budget / 16}) register_pair("scissorhands", scissorhands_with(m), batch, budget);
  // H2O keeps no history ring (12 bytes of state per token instead of 64):
  // the same selection with lighter rows, at the target shape only.
  for (std::int32_t batch : {1, 8}) {
    sh::h2o_policy h2o;
    h2o.config.recent = 10;
    h2o.config.evict_count = 2048 / 16;
    register_pair("h2o", h2o, batch, 2048);
  }
}

}  // namespace bench_host
