// token_table_view (a page table without K/V, llama.cpp's cells): the same
// random multi-step shared_layers scenario of a slot-allocator engine runs
// on a paged_kv_view of page size 1 over real K/V pools and on a
// token_table_view over the same table; states, local_scores, selections
// and outputs must agree bit for bit after every step. Then a bad table is refused by name,
// and the calls that need K/V do not take the table view (compile time).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "slot_list_engine.hpp"
#include "support.hpp"

namespace {

using namespace sh_test;

// ---- compile time -----------------------------------------------------------
using table_view = sh::host_token_table_view;
using paged_view = sh::host_paged_kv_view<float>;
static_assert(!sh::kv_rows_view<table_view> && sh::kv_rows_view<paged_view> &&
              sh::kv_rows_view<sh::host_kv_view<float>>);
static_assert(!sh::observation_reads_keys<sh::recency> && !sh::observation_reads_keys<sh::random_score> &&
              sh::observation_reads_keys<sh::key_norm> && !sh::observation_reads_keys<sh::attention_mass>);
// observe_queries, compress and compact static_assert kv_rows_view<View>
// (tests/host/token_table_refusals.cmake compiles each and checks the
// message); the table-only calls take the view.
using shared_policy = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;
static_assert(requires(shared_policy p, table_view c, sh::model_state<host> m, sh::eviction_state<host> s,
                       sh::probability_view<host> probs, sh::host_span<std::byte> ws,
                       sh::eviction_selection<host> sel) {
  sh::host::observe_probabilities(p, c, s, probs);
  sh::host::admit(p, c, s);
  sh::host::select(p, c, m, 8, ws, sel);
  sh::host::forget(p, c, s, sel);
  sh::host::local_scores(p, c, m, 8, sh::partial_scores<host>{});
  sh::host::select_workspace_bytes(c, m.shape());
});

// ---- the engine ---------------------------------------------------------------
// A llama.cpp-like slot allocator: a pool of cells, each request's cells
// listed in position order (page size 1), requests arriving and leaving on
// state rows, a padding position in every batch.
struct scenario {
  std::int32_t layers = 3, kv_heads = 2, group = 2, head_dim = 4, budget = 16, chunk = 5, steps = 80;
  std::int32_t rows = 5, batch = 4, cells = 128;
  std::uint64_t seed = 1;
};

struct selection_record {
  std::vector<std::int32_t> counts, slots, cache_slots, new_lengths, freed_pages;
  bool operator==(const selection_record&) const = default;
};

struct run_record {
  std::vector<std::vector<std::byte>> states;  // the model state after every step
  std::vector<selection_record> selections;
  std::vector<std::vector<std::int32_t>> tables;  // indices after every step
  std::vector<std::vector<float>> partials;       // local_scores before every select
};

template <class Policy>
run_record run(const Policy& policy, const scenario& sc, bool table_only) {
  const std::int32_t L = sc.layers, B = sc.batch, H = sc.kv_heads, q_heads = H * sc.group;
  const std::int32_t m = policy.config.evict_count;
  const sh::state_shape shape{sc.rows, H, sh::state_capacity_for(sc.budget, sc.chunk), policy.ring_words()};
  aligned_bytes model_buffer(sh::model_state_bytes(shape, L));
  const auto model = sh::make_model_state(model_buffer.span(), shape, L);
  sh::host::reset_state(model);

  // K/V pools, one pair per layer (only the paged run uses them; nothing may write them).
  const std::size_t pool = static_cast<std::size_t>(sc.cells) * H * sc.head_dim;
  std::vector<std::vector<float>> k(static_cast<std::size_t>(L)), v(static_cast<std::size_t>(L));
  for (std::int32_t l = 0; l < L; ++l) {
    k[l].resize(pool);
    v[l].resize(pool);
    for (std::size_t i = 0; i < pool; ++i) {
      k[l][i] = background_value(sc.seed + l, 0, i);
      v[l][i] = background_value(sc.seed + l, 1, i);
    }
  }
  const auto k_before = k;
  const auto v_before = v;

  // Requests: per state row, its cells in position order (empty: free row).
  std::vector<std::vector<std::int32_t>> cells_of(static_cast<std::size_t>(sc.rows));
  std::vector<std::int32_t> free_cells;
  for (std::int32_t c = 0; c < sc.cells; ++c) free_cells.push_back(c);
  scramble(free_cells, sc.seed);
  std::vector<bool> active(static_cast<std::size_t>(sc.rows), false);

  const std::int32_t stride = sh::max_evictions(shape.capacity, sc.budget, m);
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(B + 1)), indices(static_cast<std::size_t>(sc.cells)),
      last(static_cast<std::size_t>(B)), rows(static_cast<std::size_t>(B)), qo(static_cast<std::size_t>(B + 1)),
      pinned(static_cast<std::size_t>(B)), counts(static_cast<std::size_t>(B)),
      slots(static_cast<std::size_t>(B * stride)), cache_slots(static_cast<std::size_t>(B * stride)),
      new_lengths(static_cast<std::size_t>(B)), freed(static_cast<std::size_t>(B));
  std::vector<float> probs;
  run_record record;

  for (std::int32_t step = 0; step < sc.steps; ++step) {
    const auto h = [&](std::int64_t what, std::int64_t x = 0) {
      return hash_of({static_cast<std::int64_t>(sc.seed), step, what, x});
    };
    // Requests leave (cells back to the pool) and arrive (row reset).
    for (std::int32_t r = 0; r < sc.rows; ++r) {
      if (active[r] && h(1, r) % 30 == 0) {
        for (std::int32_t c : cells_of[r]) free_cells.push_back(c);
        cells_of[r].clear();
        active[r] = false;
      } else if (!active[r] && h(2, r) % 3 == 0) {
        active[r] = true;
        sh::host::reset_sequence(model, r, static_cast<std::int32_t>(h(3, r) % 4));
      }
    }
    // This step's batch: up to batch - 1 active rows in a shuffled order,
    // the rest padding (row -1, no cell).
    std::vector<std::int32_t> order;
    for (std::int32_t r = 0; r < sc.rows; ++r)
      if (active[r]) order.push_back(r);
    scramble(order, h(4));
    if (static_cast<std::int32_t>(order.size()) > B - 1) order.resize(static_cast<std::size_t>(B - 1));
    while (static_cast<std::int32_t>(order.size()) < B) order.push_back(-1);
    // Append 1..chunk tokens to each (prefill chunks, then decode), cells
    // taken from the scrambled pool.
    qo[0] = 0;
    for (std::int32_t b = 0; b < B; ++b) {
      const std::int32_t r = order[static_cast<std::size_t>(b)];
      rows[b] = r;
      std::int32_t q = 0;
      if (r >= 0) {
        q = cells_of[r].size() < 8 ? 1 + static_cast<std::int32_t>(h(5, b) % sc.chunk) : 1;
        for (std::int32_t i = 0; i < q; ++i) {
          REQUIRE(!free_cells.empty());
          cells_of[r].push_back(free_cells.back());
          free_cells.pop_back();
        }
      }
      qo[b + 1] = qo[b] + q;
    }
    const std::int32_t columns = build_cell_table(cells_of, rows.data(), B, indptr.data(), indices.data(), last.data());
    for (std::int32_t b = 0; b < B; ++b)
      pinned[b] = std::min(indptr[b + 1] - indptr[b], static_cast<std::int32_t>(h(6, b) % 3));
    std::fill(indices.begin() + indptr[B], indices.end(), -5);  // unused entries: never read

    const sh::host_span<const std::int32_t> indptr_s(indptr.data(), indptr.size()),
        indices_s(indices.data(), indices.size()), last_s(last.data(), last.size()), rows_s(rows.data(), rows.size()),
        qo_s(qo.data(), qo.size());
    const auto view_of = [&](std::int32_t l) {
      return sh::make_paged_kv_view(sh::host_span<float>(k[l].data(), pool), sh::host_span<float>(v[l].data(), pool),
                                    indptr_s, indices_s, last_s, B, H, sc.head_dim, 1, sc.cells, shape.capacity);
    };
    const auto table = sh::make_token_table_view(indptr_s, indices_s, last_s, B, H, 1, sc.cells, shape.capacity);
    const sh::model_state<host> step_model = model.for_batch(rows_s);

    // Every layer: probabilities (rows summing to 1 over the visible slots).
    for (std::int32_t l = 0; l < L; ++l) {
      fill_causal_probabilities(probs, indptr.data(), qo.data(), B, q_heads, columns,
                                [&](std::int32_t b, std::int32_t qh, std::int32_t j, std::int32_t t) {
                                  return 0.01f + static_cast<float>(unit(h(7 + l, (qh * 64 + j) * 4096 + b * 512 + t)));
                                });
      const auto pv = sh::probability_view<host>::ragged({probs.data(), probs.size()}, qo_s, q_heads, columns);
      if constexpr (Policy::observation::needs_attention) {
        if (table_only)
          sh::host::observe_probabilities(policy, table, step_model.layer(l), pv);
        else
          sh::host::observe_probabilities(policy, view_of(l), step_model.layer(l), pv);
      } else {
        if (table_only)
          sh::host::admit(policy, table, step_model.layer(l));
        else
          sh::host::admit(policy, view_of(l), step_model.layer(l));
      }
    }
    // Tensor parallelism's share of select (one rank: every head), before select.
    std::vector<float> partial(sh::partial_score_count(L, B, shape.capacity), -3.0f);
    const sh::partial_scores<host> ps{{partial.data(), partial.size()}, L, B, shape.capacity, H};
    if (table_only)
      sh::host::local_scores(policy, table, step_model, sc.budget, ps);
    else
      sh::host::local_scores(policy, view_of(0), step_model, sc.budget, ps);
    record.partials.push_back(partial);
    // Once: select, with the engine's workspace sized by the view it passes.
    const std::size_t ws_bytes = table_only ? sh::host::select_workspace_bytes(table, shape)
                                            : sh::host::select_workspace_bytes(view_of(0), shape);
    REQUIRE(ws_bytes == sh::host::select_workspace_bytes(view_of(0), shape));
    aligned_bytes workspace(ws_bytes);
    std::fill(counts.begin(), counts.end(), -7);
    std::fill(slots.begin(), slots.end(), -7);
    std::fill(cache_slots.begin(), cache_slots.end(), -7);
    std::fill(new_lengths.begin(), new_lengths.end(), -7);
    std::fill(freed.begin(), freed.end(), -7);
    const sh::eviction_selection<host> sel{stride,
                                           {counts.data(), counts.size()},
                                           {slots.data(), slots.size()},
                                           {cache_slots.data(), cache_slots.size()},
                                           {{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}}};
    const sh::host_span<const std::int32_t> pins(pinned.data(), pinned.size());
    if (table_only)
      sh::host::select(policy, table, step_model, sc.budget, workspace.span(), sel, pins);
    else
      sh::host::select(policy, view_of(0), step_model, sc.budget, workspace.span(), sel, pins);
    record.selections.push_back({counts, slots, cache_slots, new_lengths, freed});

    // The engine: frees the chosen cells, keeps the others in order; the
    // state forgets them layer by layer (views still before the removal).
    for (std::int32_t l = 0; l < L; ++l) {
      if (table_only)
        sh::host::forget(policy, table, step_model.layer(l), sel);
      else
        sh::host::forget(policy, view_of(l), step_model.layer(l), sel);
    }
    for (std::int32_t b = 0; b < B; ++b) {
      const std::int32_t r = rows[b];
      if (r < 0 || counts[b] == 0) continue;
      std::vector<std::int32_t> kept;
      const std::int32_t* chosen = slots.data() + static_cast<std::size_t>(b) * stride;
      std::int32_t k_at = 0;
      for (std::int32_t t = 0; t < static_cast<std::int32_t>(cells_of[r].size()); ++t) {
        if (k_at < counts[b] && chosen[k_at] == t) {
          // cache_slots: the cell id, indices[...] * page_size + offset.
          REQUIRE(cache_slots[static_cast<std::size_t>(b) * stride + k_at] == cells_of[r][t]);
          free_cells.push_back(cells_of[r][t]);
          ++k_at;
        } else {
          kept.push_back(cells_of[r][t]);
        }
      }
      REQUIRE(k_at == counts[b]);
      cells_of[r] = kept;
      REQUIRE(static_cast<std::int32_t>(kept.size()) == new_lengths[b]);
    }
    record.states.push_back(model_buffer.snapshot());
    record.tables.push_back(indices);
  }
  REQUIRE(k == k_before);  // no call wrote K or V
  REQUIRE(v == v_before);
  return record;
}

template <class Policy>
void compare(const Policy& policy, const scenario& sc) {
  const run_record paged = run(policy, sc, false);
  const run_record table = run(policy, sc, true);
  REQUIRE(paged.states.size() == static_cast<std::size_t>(sc.steps));
  std::int32_t evicting_steps = 0;
  for (std::size_t s = 0; s < paged.states.size(); ++s) {
    INFO("step " << s);
    REQUIRE(paged.tables[s] == table.tables[s]);
    REQUIRE(paged.selections[s] == table.selections[s]);
    REQUIRE(std::memcmp(paged.partials[s].data(), table.partials[s].data(), paged.partials[s].size() * sizeof(float)) ==
            0);
    REQUIRE(paged.states[s] == table.states[s]);
    for (std::int32_t c : paged.selections[s].counts) evicting_steps += c > 0;
  }
  CHECK(evicting_steps > sc.steps / 4);  // the scenario does evict
}

TEST_CASE("token_table_view: select + forget bit-identical to a page-size-1 paged_kv_view", "[token_table]") {
  scenario sc;
  SECTION("scissorhands_policy (threshold indicator, window)") {
    for (std::uint64_t seed : {1, 2, 3}) {
      sc.seed = seed;
      compare(sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>{}, sc);
    }
  }
  SECTION("h2o, max over heads and layers, m = 3") {
    sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score, sh::max_score>> p;
    p.config.evict_count = 3;
    p.config.recent = 4;
    p.config.sinks = 1;
    compare(p, sc);
  }
  SECTION("static observations that read no key: recency, random_score (admit)") {
    sh::with_granularity<sh::streaming_policy, sh::shared_layers<>> streaming;
    streaming.config.recent = 4;
    streaming.config.sinks = 2;
    compare(streaming, sc);
    sh::with_granularity<sh::random_policy, sh::shared_layers<>> random;
    random.config.seed = 7;
    compare(random, sc);
  }
}

TEST_CASE("token_table_view: a bad table is refused by name, nothing written", "[token_table]") {
  using policy_t = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;
  const policy_t p;
  const std::int32_t B = 2, H = 2, cells = 16, capacity = 12;
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{4, 9, 1, 7, 2, 0, 0, 0}, last{1, 1};
  const sh::state_shape shape{B, H, capacity, p.ring_words()};
  aligned_bytes buffer(sh::model_state_bytes(shape, 2));
  const auto model = sh::make_model_state(buffer.span(), shape, 2);
  sh::host::reset_state(model);
  const auto table = [&] {
    return sh::make_token_table_view<host>({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                           {last.data(), last.size()}, B, H, 1, cells, capacity);
  };
  sh::host::admit(p, table(), model.layer(0));
  sh::host::admit(p, table(), model.layer(1));
  const auto before = buffer.snapshot();
  const auto refused = [&](const char* argument, auto&& call) {
    INFO("expected a refusal naming " << argument);
    try {
      call();
      FAIL("accepted");
    } catch (const sh::invalid_argument& e) {
      CHECK(std::string(e.argument()) == argument);
      CHECK(std::string(e.what()).find("host::") != std::string::npos);
    }
    CHECK(buffer.equals(before));
  };
  std::vector<float> probs(64, 0.0f);
  std::vector<std::int32_t> qo{0, 0, 0};
  const auto pv = sh::probability_view<host>::ragged({probs.data(), probs.size()}, {qo.data(), qo.size()}, 4, 8);
  const std::int32_t stride = sh::max_evictions(capacity, 4, 1);
  std::vector<std::int32_t> counts(B), slots(B * stride), new_lengths(B), freed(B);
  aligned_bytes ws(sh::host::select_workspace_bytes(table(), shape));
  const sh::eviction_selection<host> sel{stride,
                                         {counts.data(), counts.size()},
                                         {slots.data(), slots.size()},
                                         {},
                                         {{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}}};
  enum class call { admit, observe, select, forget };
  const auto call_on = [&](call c, const sh::host_token_table_view& t) {
    switch (c) {
      case call::admit:
        sh::host::admit(p, t, model.layer(0));
        break;
      case call::observe:
        sh::host::observe_probabilities(p, t, model.layer(0), pv);
        break;
      case call::select:
        sh::host::select(p, t, model, 4, ws.span(), sel);
        break;
      case call::forget:
        sh::host::forget(p, t, model.layer(0), sel);
        break;
    }
  };
  const auto all_calls = [&](const char* argument) {
    for (call c : {call::admit, call::observe, call::select, call::forget})
      refused(argument, [&] { call_on(c, table()); });
  };
  // One call on the table as `change` leaves it.
  const auto refused_changed = [&](const char* argument, call c, auto&& change) {
    refused(argument, [&] {
      auto t = table();
      change(t);
      call_on(c, t);
    });
  };
  SECTION("indptr not from 0") {
    indptr[0] = 1;
    all_calls("cache.indptr");
  }
  SECTION("indptr decreasing") {
    indptr[2] = 2;
    all_calls("cache.indptr");
  }
  SECTION("a cell outside the pool") {
    indices[3] = cells;
    all_calls("cache.indices");
  }
  SECTION("a negative cell") {
    indices[0] = -1;
    all_calls("cache.indices");
  }
  SECTION("last_page_len above page size 1") {
    last[1] = 2;
    all_calls("cache.last_page_len");
  }
  SECTION("too few indices") {
    indices.resize(4);
    all_calls("cache.indices");
  }
  SECTION("shape") {
    using table_t = sh::host_token_table_view;
    refused_changed("cache.page_size", call::admit, [](table_t& t) { t.page_size = 0; });
    refused_changed("cache.num_pages", call::select, [](table_t& t) { t.num_pages = 0; });
    refused_changed("cache.indptr", call::forget, [&](table_t& t) { t.indptr = {indptr.data(), 2}; });
    refused_changed("cache.last_page_len", call::observe, [](table_t& t) { t.last_page_len = {}; });
    refused_changed("state.shape.kv_heads", call::admit, [](table_t& t) { t.kv_heads = 3; });
    // Sequence 0 holds 3 cells.
    refused_changed("cache.indptr", call::admit, [](table_t& t) { t.max_pages_per_sequence = 2; });
  }
}

}  // namespace
