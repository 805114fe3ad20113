// The library allocates nothing per step. This binary replaces every form
// of the global operator new and delete (plain, array, aligned, nothrow,
// sized) with counting versions, sets up a realistic contiguous and a paged
// cache, their states, workspaces and views outside the counted region, and
// then counts the allocations made inside each per-step entry point over a
// short continuous-batching decode loop: observe_queries (uniform and
// ragged, with and without lse), observe_probabilities (uniform and
// ragged), compress (triggering and not), admit, shrink_page_table,
// reset_sequence, length_after_compress. Every count must be zero. A
// refused call must allocate (its message is built on failure), which
// proves the counter counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "engine_support.hpp"

// ---- counting operator new / delete -----------------------------------------

namespace {

std::atomic<bool> g_counting{false};
std::atomic<std::size_t> g_allocations{0};
std::atomic<std::size_t> g_deallocations{0};

void* counted_allocate(std::size_t bytes, std::size_t alignment, bool nothrow) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) bytes = 1;
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(bytes);
  } else if (posix_memalign(&p, alignment, bytes) != 0) {
    p = nullptr;
  }
  if (p == nullptr && !nothrow) throw std::bad_alloc();
  return p;
}

void counted_release(void* p) noexcept {
  if (p != nullptr && g_counting.load(std::memory_order_relaxed))
    g_deallocations.fetch_add(1, std::memory_order_relaxed);
  std::free(p);
}

constexpr std::size_t plain = 0;

}  // namespace

void* operator new(std::size_t n) { return counted_allocate(n, plain, false); }
void* operator new[](std::size_t n) { return counted_allocate(n, plain, false); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_allocate(n, plain, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_allocate(n, plain, true); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_allocate(n, static_cast<std::size_t>(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_allocate(n, static_cast<std::size_t>(a), true);
}
void operator delete(void* p) noexcept { counted_release(p); }
void operator delete[](void* p) noexcept { counted_release(p); }
void operator delete(void* p, std::size_t) noexcept { counted_release(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_release(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_release(p); }

namespace {

using namespace engine_test;
namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

// Calls and allocations seen per entry point.
struct tally {
  std::size_t calls = 0, allocations = 0, deallocations = 0;
};

class counter {
 public:
  // Runs call() with counting on; everything outside is not counted.
  template <class F>
  void run(const std::string& name, F&& call) {
    g_allocations.store(0);
    g_deallocations.store(0);
    g_counting.store(true);
    call();
    g_counting.store(false);
    const std::size_t a = g_allocations.load(), d = g_deallocations.load();
    auto& t = tallies_[name];  // may allocate: counting is off
    ++t.calls;
    t.allocations += a;
    t.deallocations += d;
  }
  // A refused call: run() with the library's invalid_argument caught.
  template <class F>
  void run_refused(const std::string& name, F&& call) {
    run(name, [&] {
      try {
        call();
      } catch (const sh::invalid_argument&) {
      }
    });
  }
  const std::map<std::string, tally>& tallies() const { return tallies_; }
  // Prints the tallies; every entry point allocated nothing, every refused
  // call did (its message), which proves the counter counts.
  void check(const std::string& title) const {
    std::printf("%s:\n", title.c_str());
    for (const auto& [name, t] : tallies_)
      std::printf("  %-52s %5zu calls, %zu allocations, %zu deallocations\n", name.c_str(), t.calls, t.allocations,
                  t.deallocations);
    for (const auto& [name, t] : tallies_) {
      INFO(name << ": " << t.calls << " calls");
      if (name.rfind("refused", 0) == 0)
        CHECK(t.allocations > 0);
      else
        CHECK(t.allocations == 0);
    }
  }

 private:
  std::map<std::string, tally> tallies_;
};

constexpr std::int32_t batch = 5;
constexpr std::int32_t kv_heads = 4;
constexpr std::int32_t q_heads = 16;
constexpr std::int32_t head_dim = 32;
constexpr std::int32_t budget = 24;
constexpr std::int32_t chunk = 4;  // q_len of every call; tokens appended per step
constexpr std::int32_t rows = 8;
constexpr std::int32_t page_size = 4;
constexpr std::int32_t table_capacity = 128;  // slots the page table allows a sequence

// What every observe call needs: queries, lse and probabilities in every
// layout, for `chunk` queries per sequence (uniform) or per qo_indptr (ragged).
struct step_inputs {
  std::vector<float> queries, lse, probs;
  std::vector<std::int32_t> qo;
  step_inputs()
      : queries(static_cast<std::size_t>(batch * chunk * q_heads * head_dim)),
        lse(static_cast<std::size_t>(batch * chunk * q_heads)),
        probs(static_cast<std::size_t>(batch * chunk * q_heads * table_capacity)),
        qo(static_cast<std::size_t>(batch + 1)) {
    for (std::size_t i = 0; i < queries.size(); ++i)
      queries[i] = hashed_value(hash_of({1, static_cast<std::int64_t>(i)}), 1.0f);
    // An lse far above every logit: its sums (lse_check) are about 0, which
    // at_most_one accepts, so the sampled check runs in the counted calls.
    // 1/n-ish probabilities keep observe's checks happy.
    for (auto& x : lse) x = 1000.0f;
    for (auto& p : probs) p = 1.0f / 64.0f;
    // Ragged: a query per appended token (each query is a new token), none
    // for position 2, a padding slot.
    const std::int32_t counts[batch] = {chunk, chunk, 0, chunk, chunk};
    qo[0] = 0;
    for (std::int32_t b = 0; b < batch; ++b)
      qo[static_cast<std::size_t>(b) + 1] = qo[static_cast<std::size_t>(b)] + counts[b];
  }
  sh::host_span<const std::int32_t> qo_span() const { return {qo.data(), qo.size()}; }
  sh::query_view<float, host> uniform_queries() const {
    return sh::query_view<float, host>::dense({queries.data(), queries.size()}, q_heads, chunk, head_dim);
  }
  sh::query_view<float, host> ragged_queries() const {
    return sh::query_view<float, host>::ragged({queries.data(), queries.size()}, qo_span(), q_heads, head_dim);
  }
  sh::lse_view<host> uniform_lse() const {
    auto l = sh::lse_view<host>::token_major({lse.data(), lse.size()}, q_heads, chunk, sh::lse_base::base2);
    l.check = sh::lse_check::at_most_one;
    return l;
  }
  sh::lse_view<host> ragged_lse() const {
    auto l = sh::lse_view<host>::ragged({lse.data(), lse.size()}, qo_span(), q_heads, sh::lse_base::base2);
    l.check = sh::lse_check::at_most_one;
    return l;
  }
  sh::probability_view<host> uniform_probs() const {
    return sh::probability_view<host>::dense({probs.data(), probs.size()}, q_heads, chunk, table_capacity);
  }
  sh::probability_view<host> ragged_probs() const {
    return sh::probability_view<host>::ragged({probs.data(), probs.size()}, qo_span(), q_heads, table_capacity);
  }
};

// One layer's state for a policy, over its own aligned buffer.
struct layer_state {
  aligned_buffer buffer;
  sh::eviction_state<host> state;
  template <class Policy>
  explicit layer_state(const Policy& policy)
      : buffer(sh::state_bytes({rows, kv_heads, sh::state_capacity_for(budget, chunk), policy.ring_words()})),
        state(sh::make_state(buffer.span(),
                             {rows, kv_heads, sh::state_capacity_for(budget, chunk), policy.ring_words()})) {
    sh::host::reset_state(state);
  }
};

// Batch position -> state row; position 2 is a padding slot.
const std::int32_t state_rows_of_batch[batch] = {6, 1, -1, 3, 0};

}  // namespace

TEST_CASE("allocation: the counter counts every form of operator new", "[engine][allocation]") {
  counter count;
  count.run("plain new/delete", [] {
    void* p = ::operator new(24);
    ::operator delete(p);
  });
  count.run("aligned nothrow new[]", [] {
    void* p = ::operator new[](24, std::align_val_t{64}, std::nothrow);
    ::operator delete[](p, std::align_val_t{64}, std::nothrow);
  });
  count.run("std::string", [] {
    std::string s(100, 'x');
    (void)s;
  });
  for (const auto& [name, t] : count.tallies()) {
    INFO(name);
    CHECK(t.allocations == 1);
    CHECK(t.deallocations == 1);
  }
}

TEST_CASE("allocation: no per-step entry point allocates (contiguous cache)", "[engine][allocation]") {
  // --- set-up, not counted -------------------------------------------------
  // Three layers, one policy each (H2O, Scissorhands, StreamingLLM), each
  // with its own K/V and state; one lengths array shared by all layers.
  const std::int32_t capacity = table_capacity;
  constexpr int layers = 3;
  std::vector<float> k[layers], v[layers];
  for (int l = 0; l < layers; ++l) {
    k[l].resize(static_cast<std::size_t>(batch * kv_heads * capacity * head_dim));
    v[l].resize(k[l].size());
    for (std::size_t i = 0; i < k[l].size(); ++i) {
      k[l][i] = hashed_value(hash_of({2, l, static_cast<std::int64_t>(i)}), 2.0f);
      v[l][i] = hashed_value(hash_of({3, l, static_cast<std::int64_t>(i)}), 1.0f);
    }
  }
  std::vector<std::int32_t> lengths(batch, 0), new_lengths(batch, 0), freed(batch, 0);
  const auto view_of = [&](int l) {
    return sh::make_kv_view(mspan(k[l]), mspan(v[l]), cspan(lengths), batch, kv_heads, head_dim, capacity,
                            sh::named_layout::nhd);
  };
  const auto c0 = view_of(0), c1 = view_of(1), c2 = view_of(2);
  sh::h2o_policy h2o;
  h2o.config = make_settings(3, 4, 0, 400, false, sh::compaction::fill_holes);
  sh::scissorhands_policy sch;
  sch.config = make_settings(3, 4, 0, 40, false, sh::compaction::fill_holes);
  sh::streaming_policy streaming;
  streaming.config = make_settings(3, 4, 2, 400, false, sh::compaction::fill_holes);
  layer_state h2o_state(h2o), sch_state(sch), streaming_state(streaming);
  const sh::host_span<const std::int32_t> map(state_rows_of_batch, batch);
  const auto hs = h2o_state.state.for_batch(map);
  const auto ss = sch_state.state.for_batch(map);
  const auto ts = streaming_state.state.for_batch(map);
  aligned_buffer workspace(sh::host::compress_workspace_bytes(c0));
  const sh::host_span<std::byte> ws = workspace.span();
  const sh::compress_output<host> out{{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}};
  const sh::compress_output<host> out_no_freed{{new_lengths.data(), new_lengths.size()}, {}};
  step_inputs in;
  counter count;
  std::size_t triggered = 0, not_triggered = 0;

  // --- a decode loop: append (not counted), observe, compress --------------
  for (std::int32_t step = 0; step < 30; ++step) {
    for (std::int32_t b = 0; b < batch; ++b)
      if (state_rows_of_batch[b] >= 0) lengths[static_cast<std::size_t>(b)] += chunk;
    // Layer 0 (H2O) and layer 1 (Scissorhands) are observed once a step
    // (each query is a new token), through every input form in turn.
    if (step % 3 == 0) {
      count.run("host::observe_queries (uniform, lse)",
                [&] { sh::host::observe_queries(h2o, c0, hs, in.uniform_queries(), in.uniform_lse()); });
      count.run("host::observe_queries (uniform, no lse)",
                [&] { sh::host::observe_queries(sch, c1, ss, in.uniform_queries()); });
    } else if (step % 3 == 1) {
      count.run("host::observe_queries (ragged, lse)",
                [&] { sh::host::observe_queries(h2o, c0, hs, in.ragged_queries(), in.ragged_lse()); });
      count.run("host::observe_queries (ragged, no lse)",
                [&] { sh::host::observe_queries(sch, c1, ss, in.ragged_queries(), {}, 0.2f); });
    } else {
      count.run("host::observe_probabilities (uniform)",
                [&] { sh::host::observe_probabilities(sch, c1, ss, in.uniform_probs()); });
      count.run("host::observe_probabilities (ragged)",
                [&] { sh::host::observe_probabilities(h2o, c0, hs, in.ragged_probs()); });
    }
    count.run("host::admit", [&] { sh::host::admit(streaming, c2, ts); });
    const bool triggers = std::ranges::any_of(lengths, [](std::int32_t len) { return len >= budget; });
    const char* name = triggers ? "host::compress (triggering)" : "host::compress (not triggering)";
    (triggers ? triggered : not_triggered) += 3;
    count.run(name, [&] { sh::host::compress(h2o, c0, hs, budget, ws, out); });
    count.run(name, [&] { sh::host::compress(sch, c1, ss, budget, ws, out); });
    count.run(name, [&] { sh::host::compress(streaming, c2, ts, budget, ws, out_no_freed); });
    std::int32_t mirrored[batch];
    count.run("length_after_compress", [&] {
      for (std::int32_t b = 0; b < batch; ++b)
        mirrored[b] = sh::length_after_compress(lengths[static_cast<std::size_t>(b)], budget, h2o.config.evict_count);
    });
    for (std::int32_t b = 0; b < batch; ++b) REQUIRE(mirrored[b] == new_lengths[static_cast<std::size_t>(b)]);
    lengths = new_lengths;  // the engine applies them once, after the last layer
    if (step == 17) {
      // Batch position 1's request leaves; a new one takes its row.
      lengths[1] = 0;
      count.run("host::reset_sequence", [&] {
        sh::host::reset_sequence(h2o_state.state, 1);
        sh::host::reset_sequence(sch_state.state, 1);
        sh::host::reset_sequence(streaming_state.state, 1, 5);
      });
    }
  }
  CHECK(triggered >= 9);
  CHECK(not_triggered >= 9);

  // --- a refused call allocates (its message), proving the counter works ---
  count.run_refused("refused host::compress", [&] { sh::host::compress(h2o, c0, hs, /*budget=*/0, ws, out); });

  count.check("contiguous cache");
}

TEST_CASE("allocation: no per-step entry point allocates (paged cache, shared table)", "[engine][allocation]") {
  // --- set-up, not counted -------------------------------------------------
  constexpr std::int32_t max_pages = table_capacity / page_size;
  constexpr std::int32_t num_pages = batch * (budget + chunk) / page_size + 8;
  constexpr std::int32_t layers = 2;
  const std::size_t pool = static_cast<std::size_t>(num_pages) * page_size * kv_heads * head_dim;
  std::vector<float> pools[layers][2];
  for (std::int32_t l = 0; l < layers; ++l)
    for (int kind = 0; kind < 2; ++kind) {
      pools[l][kind].resize(pool);
      for (std::size_t i = 0; i < pool; ++i)
        pools[l][kind][i] = hashed_value(hash_of({4, l, kind, static_cast<std::int64_t>(i)}), 2.0f);
    }
  std::vector<std::int32_t> indptr(batch + 1, 0), indices(num_pages, -1), last_page_len(batch, 0);
  std::vector<std::int32_t> lengths(batch, 0), released(num_pages, -1), free_pages;
  std::vector<std::vector<std::int32_t>> pages(batch);
  for (std::int32_t p = num_pages - 1; p >= 0; --p) free_pages.push_back(p);
  std::vector<std::int32_t> new_lengths[layers], freed[layers];
  for (std::int32_t l = 0; l < layers; ++l) {
    new_lengths[l].assign(batch, 0);
    freed[l].assign(batch, 0);
  }
  free_pages.reserve(num_pages);
  for (auto& list : pages) list.reserve(max_pages);
  const auto view_of = [&](std::int32_t l) {
    return paged_view({pools[l][0].data(), pool}, {pools[l][1].data(), pool}, indptr, indices, last_page_len, batch,
                      kv_heads, head_dim, page_size, num_pages, max_pages);
  };
  // Appends `chunk` tokens to every real sequence and rebuilds the table (the engine's job, not counted).
  const auto append = [&] {
    std::int32_t used = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      auto& list = pages[static_cast<std::size_t>(b)];
      auto& len = lengths[static_cast<std::size_t>(b)];
      if (state_rows_of_batch[b] >= 0) len += chunk;
      while (static_cast<std::int32_t>(list.size()) * page_size < len) {
        REQUIRE(!free_pages.empty());
        list.push_back(free_pages.back());
        free_pages.pop_back();
      }
      indptr[static_cast<std::size_t>(b)] = used;
      for (std::int32_t p : list) indices[static_cast<std::size_t>(used++)] = p;
      last_page_len[static_cast<std::size_t>(b)] =
          list.empty() ? 0 : len - (static_cast<std::int32_t>(list.size()) - 1) * page_size;
    }
    indptr[batch] = used;
  };
  sh::h2o_policy h2o;
  h2o.config = make_settings(5, 4, 0, 400, false, sh::compaction::fill_holes);
  sh::streaming_policy streaming;
  streaming.config = make_settings(5, 3, 2, 400, false, sh::compaction::fill_holes);
  std::vector<layer_state> states;
  states.reserve(layers);
  for (std::int32_t l = 0; l < layers; ++l) states.emplace_back(h2o);
  layer_state streaming_state(streaming);
  const sh::host_span<const std::int32_t> map(state_rows_of_batch, batch);
  aligned_buffer workspace(sh::host::compress_workspace_bytes(view_of(0)));
  const sh::host_span<std::byte> ws = workspace.span();
  step_inputs in;
  counter count;
  std::size_t triggered = 0, not_triggered = 0, released_total = 0;

  for (std::int32_t step = 0; step < 30; ++step) {
    append();
    const bool triggers = std::ranges::any_of(lengths, [](std::int32_t len) { return len >= budget; });
    for (std::int32_t l = 0; l < layers; ++l) {
      const auto cache = view_of(l);
      const auto st = states[static_cast<std::size_t>(l)].state.for_batch(map);
      const sh::compress_output<host> out{{new_lengths[l].data(), batch}, {freed[l].data(), batch}};
      // Once a step (each query is a new token), every input form in turn.
      switch ((step + l) % 6) {
        case 0:
          count.run("host::observe_queries (ragged, lse)",
                    [&] { sh::host::observe_queries(h2o, cache, st, in.ragged_queries(), in.ragged_lse()); });
          break;
        case 1:
          count.run("host::observe_queries (uniform, no lse)",
                    [&] { sh::host::observe_queries(h2o, cache, st, in.uniform_queries()); });
          break;
        case 2:
          count.run("host::observe_queries (uniform, lse)",
                    [&] { sh::host::observe_queries(h2o, cache, st, in.uniform_queries(), in.uniform_lse()); });
          break;
        case 3:
          count.run("host::observe_probabilities (ragged)",
                    [&] { sh::host::observe_probabilities(h2o, cache, st, in.ragged_probs()); });
          break;
        case 4:
          count.run("host::observe_queries (ragged, no lse)",
                    [&] { sh::host::observe_queries(h2o, cache, st, in.ragged_queries()); });
          break;
        default:
          count.run("host::observe_probabilities (uniform)",
                    [&] { sh::host::observe_probabilities(h2o, cache, st, in.uniform_probs()); });
      }
      (triggers ? triggered : not_triggered) += 1;
      count.run(triggers ? "host::compress (triggering)" : "host::compress (not triggering)",
                [&] { sh::host::compress(h2o, cache, st, budget, ws, out); });
    }
    {
      // The static policy only admits, on its own state (not compressed here: its state only needs admitting).
      const auto cache = view_of(0);
      if (step < 5)
        count.run("host::admit", [&] { sh::host::admit(streaming, cache, streaming_state.state.for_batch(map)); });
    }
    for (std::int32_t l = 1; l < layers; ++l) REQUIRE(new_lengths[l] == new_lengths[0]);
    std::size_t n = 0;
    count.run("host::shrink_page_table", [&] {
      n = sh::host::shrink_page_table(mspan(indptr), mspan(indices), mspan(last_page_len), page_size,
                                      cspan(new_lengths[0], batch), mspan(released));
    });
    released_total += n;
    for (std::size_t i = 0; i < n; ++i) free_pages.push_back(released[i]);
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      pages[ub].assign(indices.begin() + indptr[ub], indices.begin() + indptr[ub + 1]);
      lengths[ub] = new_lengths[0][ub];
    }
    if (step == 11) {
      // The request at batch position 3 leaves; a new one takes its row.
      for (std::int32_t p : pages[3]) free_pages.push_back(p);
      pages[3].clear();
      lengths[3] = 0;
      count.run("host::reset_sequence", [&] {
        for (auto& s : states) sh::host::reset_sequence(s.state, 3);
        sh::host::reset_sequence(streaming_state.state, 3, 2);
      });
      lengths[3] = 0;
    }
  }
  CHECK(triggered >= 10);
  CHECK(not_triggered >= 4);
  CHECK(released_total > 0);

  const std::vector<std::int32_t> too_long{1000, 0, 0, 0, 0};  // built outside the count
  count.run_refused("refused host::shrink_page_table", [&] {
    (void)sh::host::shrink_page_table(mspan(indptr), mspan(indices), mspan(last_page_len), page_size, cspan(too_long),
                                      mspan(released));
  });

  count.check("paged cache (" + std::to_string(layers) + " layers, one table)");
}
