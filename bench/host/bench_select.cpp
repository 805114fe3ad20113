// Host select (shared_layers: one choice of slots per sequence for the whole
// model) against a naive baseline, side by side on the same model state.
//
// The model: 32 layers shaped like Llama-3-8B's (8 KV heads), the paper's
// Scissorhands settings (w = 400, r = 10) at the shared_layers granularity
// with mean reductions, every sequence holding exactly `budget` tokens, each
// (layer, head, slot) with a score drawn from a pool of window counts. select
// reads every layer's scores and observed counts and the positions it checks
// (12 bytes per (layer, head, slot)) and writes the selection; it moves
// nothing, so every call sees the same state.
//
// The naive baseline is what one writes by hand: a vector of per-slot sums
// over every layer and head, a full sort of the unprotected slots by
// (mean, position), the first `evict` taken. It reads 8 bytes per (layer,
// head, slot) (no consistency check). Untimed, once: both must choose the
// same slots.
//
// local_scores and select_reduced: tensor parallelism's split of select
// (partial_scores.hpp), on the same model.
#include <algorithm>
#include <cmath>
#include <vector>

#include "bench_host.hpp"
#include "fixture.hpp"

namespace bench_host {
namespace {

inline constexpr std::int32_t num_layers = 32;

using shared_policy = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;

struct model_fixture {
  layer cache;  // layer 0's cache: select reads its lengths only
  sh::model_state<sh::memory_space::host> model;
  std::vector<std::int32_t> counts, slots, new_lengths;
  sh::eviction_selection<sh::memory_space::host> selection;
  std::int32_t stride = 0;
};

arena_buffer& model_arena() {
  static arena_buffer a;
  return a;
}

model_fixture make_model(const shared_policy& policy, std::int32_t batch, std::int32_t budget) {
  model_fixture f;
  f.cache = make_layer(policy, batch, budget);
  set_lengths(f.cache, budget);
  const sh::state_shape shape = f.cache.state.shape;
  const std::size_t bytes = sh::model_state_bytes(shape, num_layers);
  f.model = sh::make_model_state(sh::host_span<std::byte>(model_arena().bytes(bytes), bytes), shape, num_layers);
  sh::host::reset_state(f.model);
  // Scores: Scissorhands-like window counts, a different stretch per layer.
  rng r(11);
  for (std::int32_t l = 0; l < num_layers; ++l) {
    const auto st = f.model.layer(l);
    sh::host::admit(policy, f.cache.cache, st);
    for (std::size_t i = 0; i < f.cache.tokens(); ++i) {
      const float u = r.uniform();
      st.scores[i] = std::floor(401.0f * u * u * u);
      st.observed[i] = 400.0f;
    }
  }
  f.stride = sh::max_evictions(shape.capacity, budget, policy.config.evict_count);
  f.counts.assign(static_cast<std::size_t>(batch), 0);
  f.new_lengths.assign(static_cast<std::size_t>(batch), 0);
  f.slots.assign(static_cast<std::size_t>(batch) * static_cast<std::size_t>(f.stride), 0);
  f.selection = {f.stride,
                 {f.counts.data(), f.counts.size()},
                 {f.slots.data(), f.slots.size()},
                 {},
                 {{f.new_lengths.data(), f.new_lengths.size()}, {}}};
  return f;
}

struct naive_slot {
  float score;
  std::int32_t position;
  std::int32_t slot;
};

// Returns the chosen slots of every sequence, ascending, one list after another.
void naive_select(const shared_policy& policy, const model_fixture& f, std::int32_t budget, std::vector<float>& sums,
                  std::vector<naive_slot>& order, std::vector<std::int32_t>& chosen) {
  const sh::settings& cfg = policy.config;
  chosen.clear();
  for (std::int32_t b = 0; b < f.cache.batch; ++b) {
    const std::int32_t len = f.cache.cache.length(b);
    if (len < budget) continue;
    std::fill(sums.begin(), sums.begin() + len, 0.0f);
    for (std::int32_t l = 0; l < num_layers; ++l) {
      const auto st = f.model.layer(l);
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        const std::int64_t base = st.index(b, h, 0);
        for (std::int32_t t = 0; t < len; ++t)
          sums[static_cast<std::size_t>(t)] -= st.scores[base + t] / st.observed[base + t];  // unimportant: highest first
      }
    }
    const auto st = f.model.layer(0);
    const std::int32_t next = st.next_position[b];
    order.clear();
    for (std::int32_t t = 0; t < len; ++t) {
      const std::int32_t pos = st.positions[st.index(b, 0, t)];
      if (pos >= next - cfg.recent || pos < cfg.sinks) continue;
      order.push_back({sums[static_cast<std::size_t>(t)], pos, t});
    }
    std::sort(order.begin(), order.end(), [](const naive_slot& a, const naive_slot& c) {
      return a.score < c.score || (a.score == c.score && a.position < c.position);
    });
    const std::int32_t evict = len - budget + cfg.evict_count;
    const auto first = chosen.size();
    for (std::int32_t k = 0; k < evict; ++k) chosen.push_back(order[static_cast<std::size_t>(k)].slot);
    std::sort(chosen.begin() + static_cast<std::ptrdiff_t>(first), chosen.end());
  }
}

void select_library(benchmark::State& st, shared_policy policy, std::int32_t batch, std::int32_t budget) {
  model_fixture f = make_model(policy, batch, budget);
  for (auto _ : st) {
    sh::host::select(policy, f.cache.cache, f.model, budget, f.cache.workspace, f.selection);
    benchmark::ClobberMemory();
  }
  const auto cells = static_cast<std::int64_t>(f.cache.tokens()) * num_layers;
  st.SetBytesProcessed(st.iterations() * cells * 12);
  st.SetItemsProcessed(st.iterations() * batch * policy.config.evict_count);
}

void select_naive(benchmark::State& st, shared_policy policy, std::int32_t batch, std::int32_t budget) {
  model_fixture f = make_model(policy, batch, budget);
  std::vector<float> sums(static_cast<std::size_t>(budget));
  std::vector<naive_slot> order;
  order.reserve(static_cast<std::size_t>(budget));
  std::vector<std::int32_t> chosen;
  // Untimed: the same slots as the library (mean = sum / (L H): same order
  // up to rounding, so compare as sets and accept a differing tie only if
  // the library's choice is also a minimum).
  sh::host::select(policy, f.cache.cache, f.model, budget, f.cache.workspace, f.selection);
  naive_select(policy, f, budget, sums, order, chosen);
  std::vector<std::int32_t> library;
  for (std::int32_t b = 0; b < batch; ++b)
    for (std::int32_t k = 0; k < f.counts[static_cast<std::size_t>(b)]; ++k)
      library.push_back(f.slots[static_cast<std::size_t>(b * f.stride + k)]);
  if (library.size() != chosen.size()) {
    st.SkipWithError("the library and the naive baseline evicted different counts");
    return;
  }
  for (auto _ : st) {
    naive_select(policy, f, budget, sums, order, chosen);
    benchmark::ClobberMemory();
  }
  const auto cells = static_cast<std::int64_t>(f.cache.tokens()) * num_layers;
  st.SetBytesProcessed(st.iterations() * cells * 8);
  st.SetItemsProcessed(st.iterations() * batch * policy.config.evict_count);
  st.counters["same_slots"] = library == chosen ? 1.0 : 0.0;
}

// Tensor parallelism's two halves on the same model (one rank holding all
// 8 heads: each rank of R reads 1/R of the state in local_scores and the
// whole reduced buffer in select): local_scores writes the partial buffer
// (4 bytes per (layer, sequence, slot)), select_reduced reads it instead of
// the state. Their sum against select is the host cost of agreeing.
// A partial-scores buffer for the fixture's model (all kv_heads on this rank).
sh::partial_scores<sh::memory_space::host> partial_for(const model_fixture& f, std::vector<float>& buffer) {
  const std::int32_t capacity = f.model.first.shape.capacity;
  buffer.assign(sh::partial_score_count(num_layers, f.cache.batch, capacity), 0.0f);
  return {{buffer.data(), buffer.size()}, num_layers, f.cache.batch, capacity, kv_heads};
}

void local_scores(benchmark::State& st, shared_policy policy, std::int32_t batch, std::int32_t budget) {
  model_fixture f = make_model(policy, batch, budget);
  std::vector<float> partial;
  const auto scores = partial_for(f, partial);
  for (auto _ : st) {
    sh::host::local_scores(policy, f.cache.cache, f.model, budget, scores);
    benchmark::ClobberMemory();
  }
  const auto cells = static_cast<std::int64_t>(f.cache.tokens()) * num_layers;
  st.SetBytesProcessed(st.iterations() * (cells * 12 + static_cast<std::int64_t>(partial.size()) * 4));
}

void select_reduced(benchmark::State& st, shared_policy policy, std::int32_t batch, std::int32_t budget) {
  model_fixture f = make_model(policy, batch, budget);
  std::vector<float> partial;
  const auto scores = partial_for(f, partial);
  sh::host::local_scores(policy, f.cache.cache, f.model, budget, scores);
  for (auto _ : st) {
    sh::host::select(policy, f.cache.cache, f.model, budget, scores, f.cache.workspace, f.selection);
    benchmark::ClobberMemory();
  }
  // Reads the reduced buffer and, for its checks, positions of every layer and head.
  const auto cells = static_cast<std::int64_t>(f.cache.tokens()) * num_layers;
  st.SetBytesProcessed(st.iterations() * (cells * 4 + static_cast<std::int64_t>(partial.size()) * 4));
  st.SetItemsProcessed(st.iterations() * batch * policy.config.evict_count);
}

}  // namespace

void register_select() {
  for (std::int32_t batch : {1, 4})
    for (std::int32_t m : {1, 128}) {
      shared_policy p;
      p.config.window = 400;
      p.config.recent = 10;
      p.config.evict_count = m;
      const std::string shape = "/layers:" + std::to_string(num_layers) + "/batch:" + std::to_string(batch) +
                                "/B:2048/m:" + std::to_string(m);
      benchmark::RegisterBenchmark(("select/shared_layers" + shape).c_str(), select_library, p, batch, 2048)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("naive_select/shared_layers" + shape).c_str(), select_naive, p, batch, 2048)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("local_scores/shared_layers" + shape).c_str(), local_scores, p, batch, 2048)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("select_reduced/shared_layers" + shape).c_str(), select_reduced, p, batch, 2048)
          ->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace bench_host
