// Determinism: the same inputs give the same evicted sets and the same bytes
// (K, V, lengths, page table, state, compress outputs) whatever the scratch
// memory held, run after run and run beside run on several threads. The
// loop is an engine's: the state has more rows than the batch, sequences
// sit on shuffled rows (state.for_batch), the state holds state_capacity_for
// (budget, 1) slots rather than the cache's capacity, queries come uniform
// or ragged, and the engine applies compress_output itself (copies the new
// lengths, or shrink_page_table). And the documented tie-break
// (docs/hardening.md): lowest eviction score first, equal scores older
// position first, -0 = +0, NaN below -inf (first evicted).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "../host/support.hpp"

namespace {

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

// splitmix64: mix64 adds the step itself, so the state advances after.
struct generator {
  std::uint64_t state;
  std::uint64_t next() {
    const std::uint64_t z = sh_test::mix64(state);
    state += 0x9E3779B97F4A7C15ull;
    return z;
  }
  float uniform() { return static_cast<float>(next() >> 40) / 16777216.0f; }
};

struct aligned_bytes {
  std::byte* data;
  std::size_t size;
  explicit aligned_bytes(std::size_t n) : data(static_cast<std::byte*>(::operator new(n, std::align_val_t{256}))), size(n) {}
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
  ~aligned_bytes() { ::operator delete(data, std::align_val_t{256}); }
  void scribble(std::uint64_t seed) {
    generator g{seed};
    for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>(g.next());
  }
};

template <class T>
void append_bytes(std::vector<std::uint8_t>& out, const T* p, std::size_t n) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Everything a run produced: every byte after every step, and per compress
// the positions each head evicted, in slot order.
struct trace {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int32_t> evicted;
  bool consistent = true;  // the page table shrink_page_table left holds compress's new lengths
  bool operator==(const trace&) const = default;
};

// A decode loop: prefill, then steps of append one token per sequence,
// observe (probabilities or queries, uniform or ragged), compress at the
// budget, apply the new lengths. `scratch_seed` fills the workspace and the
// state buffer (before reset) with different garbage per run: it must not
// matter.
template <class Policy, bool Paged>
trace run(const sh::settings& s, std::uint64_t scratch_seed) {
  constexpr std::int32_t batch = 3, heads = 2, dim = 8, page = 4, max_pages = 12, capacity = page * max_pages,
                         q_heads = 4, budget = 24, steps = 48;
  constexpr std::int32_t pool = batch * max_pages;
  Policy policy;
  policy.config = s;
  generator data{12345};  // the engine's data: the same in every run
  std::vector<float> k(static_cast<std::size_t>(pool) * page * heads * dim), v(k.size());
  for (auto& x : k) x = data.uniform() * 4.0f - 2.0f;
  for (auto& x : v) x = data.uniform() * 4.0f - 2.0f;
  std::vector<std::int32_t> lengths{5, 17, 11};
  std::vector<std::int32_t> indptr(batch + 1, 0), indices, last(batch, 0), free_pages, freed(batch, 0);
  for (std::int32_t p = pool - 1; p >= 0; --p) free_pages.push_back(p);
  const auto grow = [&](std::int32_t b) {  // paged: make room for one more token of b
    const std::int32_t pages = indptr[b + 1] - indptr[b];
    if (pages * page > lengths[b]) return;
    indices.insert(indices.begin() + indptr[b + 1], free_pages.back());
    free_pages.pop_back();
    for (std::int32_t i = b + 1; i <= batch; ++i) ++indptr[i];
  };
  const auto sync_last = [&] {
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t pages = indptr[b + 1] - indptr[b];
      last[b] = pages == 0 ? 0 : lengths[b] - (pages - 1) * page;
    }
  };
  if constexpr (Paged) {
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t n = lengths[b];
      lengths[b] = 0;
      for (std::int32_t t = 0; t < n; ++t) grow(b), ++lengths[b];
    }
    sync_last();
  }
  const auto view = [&] {
    if constexpr (Paged)
      return sh::make_paged_kv_view<float, host>({k.data(), k.size()}, {v.data(), v.size()},
                                                 {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                                 {last.data(), last.size()}, batch, heads, dim, page, pool, max_pages,
                                                 sh::named_layout::hnd);
    else
      return sh::make_kv_view<float, host>({k.data(), static_cast<std::size_t>(batch) * capacity * heads * dim},
                                           {v.data(), static_cast<std::size_t>(batch) * capacity * heads * dim},
                                           {lengths.data(), lengths.size()}, batch, heads, dim, capacity,
                                           sh::named_layout::nhd);
  };
  // One more row than the batch, sequences on shuffled rows, and only the
  // slots a decode at this budget needs (one token appended per compress).
  sh::state_shape shape = sh::state_shape_for(policy, view());
  shape.rows = batch + 1;
  shape.capacity = sh::state_capacity_for(budget, 1);
  const std::vector<std::int32_t> rows{2, 0, 3};
  aligned_bytes state_mem(sh::state_bytes(shape));
  state_mem.scribble(scratch_seed);
  const auto base = sh::make_state(sh::host_span<std::byte>(state_mem.data, state_mem.size), shape);
  sh::host::reset_state(base);
  const auto state = base.for_batch({rows.data(), rows.size()});
  aligned_bytes workspace(sh::host::compress_workspace_bytes(view()) + 64);
  std::vector<std::int32_t> new_lengths(batch, -1);
  const std::vector<std::int32_t> qo_indptr{0, 1, 2, 3};  // one query each, as a ragged view

  trace out;
  std::vector<float> probs(static_cast<std::size_t>(batch) * q_heads * capacity);
  std::vector<float> queries(static_cast<std::size_t>(batch) * q_heads * dim);
  for (std::int32_t step = 0; step < steps; ++step) {
    if (step > 0)
      for (std::int32_t b = 0; b < batch; ++b) {
        if constexpr (Paged) grow(b);
        ++lengths[b];
      }
    if constexpr (Paged) sync_last();
    if (step % 3 == 2) {
      for (auto& x : queries) x = data.uniform() * 2.0f - 1.0f;
      const sh::host_span<const float> q(queries.data(), queries.size());
      if (step % 2 == 0)
        sh::host::observe_queries(policy, view(), state, sh::query_view<float, host>::dense(q, q_heads, 1, dim));
      else
        sh::host::observe_queries(policy, view(), state,
                                  sh::query_view<float, host>::ragged(q, {qo_indptr.data(), qo_indptr.size()}, q_heads,
                                                                      dim));
    } else {
      std::int32_t columns = 0;
      for (auto n : lengths) columns = std::max(columns, n);
      for (std::int32_t b = 0; b < batch; ++b)
        for (std::int32_t qh = 0; qh < q_heads; ++qh) {
          float* row = probs.data() + (static_cast<std::size_t>(b) * q_heads + static_cast<std::size_t>(qh)) * columns;
          float sum = 0.0f;
          for (std::int32_t t = 0; t < lengths[b]; ++t) sum += (row[t] = std::pow(data.uniform(), 4.0f) + 1e-3f);
          for (std::int32_t t = 0; t < lengths[b]; ++t) row[t] /= sum;
        }
      const sh::host_span<const float> p(probs.data(), static_cast<std::size_t>(batch) * q_heads * columns);
      // One query per sequence: dense [batch][q_heads][1][columns] is also
      // ragged token-major [token][q_heads][columns].
      sh::host::observe_probabilities(policy, view(), state,
                                      step % 2 == 0 ? sh::probability_view<host>::dense(p, q_heads, 1, columns)
                                                    : sh::probability_view<host>::ragged(
                                                          p, {qo_indptr.data(), qo_indptr.size()}, q_heads, columns));
    }
    // Positions per head before, to list what compress evicted.
    std::vector<std::vector<std::int32_t>> before(batch * heads);
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < heads; ++h)
        for (std::int32_t t = 0; t < lengths[b]; ++t) before[b * heads + h].push_back(state.positions[state.index(b, h, t)]);
    workspace.scribble(scratch_seed + static_cast<std::uint64_t>(step));
    sh::host::compress(policy, view(), state, budget, sh::host_span<std::byte>(workspace.data, workspace.size),
                       {{new_lengths.data(), new_lengths.size()},
                        Paged ? sh::host_span<std::int32_t>(freed.data(), freed.size()) : sh::host_span<std::int32_t>{}});
    append_bytes(out.bytes, new_lengths.data(), new_lengths.size());
    append_bytes(out.bytes, freed.data(), freed.size());
    // The engine applies the new lengths (one layer here: right away).
    if constexpr (Paged) {
      std::vector<std::int32_t> released(indices.size());
      const std::size_t n = sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                                        {last.data(), last.size()}, page,
                                                        {new_lengths.data(), new_lengths.size()},
                                                        {released.data(), released.size()});
      indices.resize(static_cast<std::size_t>(indptr[batch]));
      for (std::size_t i = 0; i < n; ++i) free_pages.push_back(released[i]);
      for (std::int32_t b = 0; b < batch; ++b) {
        const std::int32_t pages = indptr[b + 1] - indptr[b];
        lengths[b] = pages == 0 ? 0 : (pages - 1) * page + last[b];
        out.consistent = out.consistent && lengths[b] == new_lengths[b];  // (no Catch2 assertion: runs on threads)
      }
      append_bytes(out.bytes, indptr.data(), indptr.size());
      append_bytes(out.bytes, indices.data(), indices.size());
      append_bytes(out.bytes, last.data(), last.size());
    } else {
      lengths = new_lengths;
    }
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < heads; ++h) {
        std::vector<std::int32_t> gone = before[b * heads + h];
        for (std::int32_t t = 0; t < lengths[b]; ++t)
          gone.erase(std::find(gone.begin(), gone.end(), state.positions[state.index(b, h, t)]));
        out.evicted.insert(out.evicted.end(), gone.begin(), gone.end());
        out.evicted.push_back(-1);  // head separator
      }
    append_bytes(out.bytes, k.data(), k.size());
    append_bytes(out.bytes, v.data(), v.size());
    append_bytes(out.bytes, lengths.data(), lengths.size());
    append_bytes(out.bytes, state_mem.data, state_mem.size);
  }
  return out;
}

template <class Policy, bool Paged>
void check_deterministic(const sh::settings& s) {
  const trace first = run<Policy, Paged>(s, 1);
  REQUIRE(!first.evicted.empty());
  CHECK(first.consistent);
  CHECK(first.evicted.size() > static_cast<std::size_t>(48 * 3 * 2));  // compress did evict, every step
  const trace second = run<Policy, Paged>(s, 2);
  CHECK(first.evicted == second.evicted);
  const bool same_bytes = first.bytes == second.bytes;
  CHECK(same_bytes);
  // Four runs side by side: no hidden shared state between calls.
  std::vector<trace> side(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < side.size(); ++i)
    threads.emplace_back([&, i] { side[i] = run<Policy, Paged>(s, 100 + i); });
  for (auto& t : threads) t.join();
  for (const trace& t : side) {
    CHECK(t.evicted == first.evicted);
    const bool same = t.bytes == first.bytes;
    CHECK(same);
  }
}

sh::settings settings_for(std::int32_t m, sh::compaction mode, bool normalize) {
  return {.window = 16, .recent = 3, .sinks = 1, .evict_count = m, .normalize = normalize, .compaction_mode = mode};
}

}  // namespace

TEST_CASE("determinism: scissorhands, contiguous, fill holes", "[determinism]") {
  check_deterministic<sh::scissorhands_policy, false>(settings_for(4, sh::compaction::fill_holes, false));
}
TEST_CASE("determinism: h2o, contiguous, preserve order, normalised", "[determinism]") {
  check_deterministic<sh::h2o_policy, false>(settings_for(3, sh::compaction::preserve_order, true));
}
TEST_CASE("determinism: decay with max GQA, paged", "[determinism]") {
  check_deterministic<sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window, sh::gqa_max>,
                      true>(settings_for(5, sh::compaction::fill_holes, false));
}
TEST_CASE("determinism: scissorhands, paged, m = 1", "[determinism]") {
  check_deterministic<sh::scissorhands_policy, true>(settings_for(1, sh::compaction::preserve_order, false));
}
TEST_CASE("determinism: key norm, paged", "[determinism]") {
  check_deterministic<sh::key_norm_policy, true>(settings_for(2, sh::compaction::fill_holes, false));
}

// ---------------------------------------------------------------------------
// The tie-break, on hand-set scores.

namespace {

// One sequence, one head, 8 tokens at positions 0..7, no protection, m given.
struct tie_case {
  std::vector<float> k = std::vector<float>(8 * 2, 0.0f), v = std::vector<float>(8 * 2, 0.0f);
  std::vector<std::int32_t> lengths{8};
  sh::h2o_policy policy;
  aligned_bytes mem{4096};
  sh::eviction_state<host> state{};
  std::vector<std::uint64_t> workspace = std::vector<std::uint64_t>(64);

  explicit tie_case(std::int32_t m, bool normalize = false) {
    policy.config.recent = 0;
    policy.config.evict_count = m;
    policy.config.normalize = normalize;
    for (std::size_t i = 0; i < 8; ++i) k[2 * i] = static_cast<float>(i);  // row i carries its position
    const auto shape = sh::state_shape_for(policy, view());
    REQUIRE(sh::state_bytes(shape) <= mem.size);
    state = sh::make_state(sh::host_span<std::byte>(mem.data, mem.size), shape);
    sh::host::reset_state(state);
    sh::host::admit(policy, view(), state);
  }
  sh::host_kv_view<float> view() {
    return sh::make_kv_view<float, host>({k.data(), k.size()}, {v.data(), v.size()}, {lengths.data(), 1}, 1, 1, 2, 8,
                                         sh::named_layout::nhd);
  }
  void set(std::int32_t slot, float score, float observed = 1.0f) {
    state.scores[state.index(0, 0, slot)] = score;
    state.observed[state.index(0, 0, slot)] = observed;
  }
  // Positions left after compressing to budget 8 (so m tokens go), sorted.
  std::vector<std::int32_t> evicted() {
    std::vector<std::int32_t> new_length(1, -1);
    sh::host::compress(policy, view(), state, 8,
                       {reinterpret_cast<std::byte*>(workspace.data()), workspace.size() * 8},
                       {{new_length.data(), 1}, {}});
    REQUIRE(new_length[0] == 8 - policy.config.evict_count);
    lengths[0] = new_length[0];
    std::vector<std::int32_t> kept;
    for (std::int32_t t = 0; t < lengths[0]; ++t) {
      kept.push_back(state.positions[state.index(0, 0, t)]);
      CHECK(k[2 * static_cast<std::size_t>(t)] == static_cast<float>(kept.back()));  // row still paired
    }
    std::vector<std::int32_t> gone;
    for (std::int32_t p = 0; p < 8; ++p)
      if (std::find(kept.begin(), kept.end(), p) == kept.end()) gone.push_back(p);
    return gone;
  }
};

}  // namespace

TEST_CASE("tie-break: equal scores evict the older tokens first", "[determinism][tie]") {
  tie_case c(3);
  for (std::int32_t t = 0; t < 8; ++t) c.set(t, 0.25f);
  CHECK(c.evicted() == std::vector<std::int32_t>{0, 1, 2});
}

TEST_CASE("tie-break: lower score first, then older among equals", "[determinism][tie]") {
  tie_case c(3);
  const float scores[8] = {0.5f, 0.2f, 0.9f, 0.2f, 0.1f, 0.7f, 0.2f, 0.3f};
  for (std::int32_t t = 0; t < 8; ++t) c.set(t, scores[t]);
  CHECK(c.evicted() == std::vector<std::int32_t>{1, 3, 4});  // 0.1, then the older two of three 0.2s
}

TEST_CASE("tie-break: -0 equals +0", "[determinism][tie]") {
  tie_case c(1);
  for (std::int32_t t = 0; t < 8; ++t) c.set(t, 1.0f);
  c.set(5, -0.0f);
  c.set(6, 0.0f);
  CHECK(c.evicted() == std::vector<std::int32_t>{5});  // equal: the older of the two
  tie_case d(1);
  for (std::int32_t t = 0; t < 8; ++t) d.set(t, 1.0f);
  d.set(2, 0.0f);
  d.set(4, -0.0f);
  CHECK(d.evicted() == std::vector<std::int32_t>{2});
}

TEST_CASE("tie-break: NaN < -inf < finite < +inf", "[determinism][tie]") {
  const float nan_f = std::numeric_limits<float>::quiet_NaN(), inf_f = std::numeric_limits<float>::infinity();
  const float scores[8] = {nan_f, inf_f, 3.0f, -inf_f, nan_f, 2.0f, inf_f, 1e30f};
  for (std::int32_t m = 1; m <= 7; ++m) {
    tie_case c(m);
    for (std::int32_t t = 0; t < 8; ++t) c.set(t, scores[t]);
    const std::vector<std::int32_t> order{0, 4, 3, 5, 2, 7, 1, 6};  // NaN (older first), -inf, 2, 3, 1e30, +inf
    std::vector<std::int32_t> want(order.begin(), order.begin() + m);
    std::sort(want.begin(), want.end());
    CHECK(c.evicted() == want);
  }
}

TEST_CASE("tie-break: normalised scores compare score / observed", "[determinism][tie]") {
  tie_case c(2, /*normalize=*/true);
  for (std::int32_t t = 0; t < 8; ++t) c.set(t, 1.0f, 1.0f);  // 1 each
  c.set(6, 3.0f, 10.0f);  // 0.3: lowest
  c.set(1, 0.5f, 1.0f);   // 0.5
  c.set(0, 0.0f, 0.0f);   // never observed: compared as the raw score 0
  CHECK(c.evicted() == std::vector<std::int32_t>{0, 6});
}
