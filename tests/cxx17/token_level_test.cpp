// A C++17, -fno-exceptions engine shaped like llama.cpp that evicts whole
// tokens (shared_layers) through bridge.h: a pool of cells (page size 1)
// listed per request in position order, several layers, requests arriving
// and leaving on state rows, a padding position, prefill chunks then
// decode. Each step: every layer observes (admit first on some steps),
// local_scores once a request is at the budget, select once, the engine
// frees the chosen cells keeping the others in order, forget every layer.
// The scenario runs with probabilities and no K/V (observe_probabilities
// on the table), then with queries over a K pool of cells, V absent
// (observe_queries on a page-size-1 paged cache): float K without LSE, fp16
// K with a natural-base LSE computed here in double, and fp16 K without
// (which must leave the same state: the LSE is the kernel's). The layers'
// attention options: a window in positions, a soft cap, plain. The same steps run on a second copy through the
// C++20 host API directly (token_tu.cpp); the model state, local_scores'
// buffer and every selection must agree byte for byte after every step.
// Then bad input: each call returns invalid_argument naming the argument,
// with the caller's buffers byte-identical; and default_settings is the
// policy's own. Plain main: prints "N passed, M failed".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <scissorhands/bridge/bridge.h>

#include "../host/slot_list_engine.hpp"
#include "cell_descriptors.h"
#include "check.h"
#include "scenario.h"
#include "token_scenario.h"

namespace br = scissorhands::bridge;
namespace api = cxx17_tokens::api;
using namespace cxx17_tokens;
using namespace cxx17_check;

namespace {

std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The settings both sides use: the policy's defaults plus m and sinks.
br::settings step_settings() {
  br::settings s;
  check_ok(api::default_settings(&s), "default_settings");
  s.evict_count = evict_count;
  s.sinks = sinks;
  return s;
}

// What one step leaves behind (partial: local_scores' buffer, empty on a
// step with no request at the budget).
struct step_record {
  std::vector<unsigned char> model, partial;
  std::vector<std::int32_t> counts, slots, cache_slots, new_lengths, freed_pages;
};

// How the layers observe.
enum class observe_with { probabilities, queries_f32, queries_f16 };

// The layers' attention, as the engine's kernel ran it: layer 0 a sliding
// window in positions (llama.cpp's mask; wider than the policy's 10 recent
// tokens, so that evictions leave holes inside it), layer 1 a soft cap and
// its own scale (Gemma 2), layer 2 plain.
constexpr std::int32_t window_positions = 12;
br::attention attention_of(std::int32_t l) {
  br::attention a;
  if (l == 0) {
    a.window_left = window_positions;
    a.window_left_unit = br::window_unit::positions;
  } else if (l == 1) {
    a.softmax_scale = 0.5f;
    a.logits_soft_cap = 2.0f;
  }
  return a;
}

// A finite binary16 value from random bits, made directly (no _Float16):
// magnitudes 2^-6 .. 4, one exponent in nine subnormal (or zero).
br::fp16_bits half_of(std::uint64_t r) {
  std::uint32_t exponent = 8 + static_cast<std::uint32_t>(r % 9);
  if (exponent == 8) exponent = 0;
  const auto mantissa = static_cast<std::uint32_t>(r >> 8) & 0x3FFu;
  const auto sign = static_cast<std::uint32_t>(r >> 20) & 1u;
  return {static_cast<std::uint16_t>(sign << 15 | exponent << 10 | mantissa)};
}
double value_of(br::fp16_bits h) {
  const int exponent = (h.bits >> 10) & 0x1F, mantissa = h.bits & 0x3FF;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h.bits & 0x8000u) != 0 ? -magnitude : magnitude;
}
double value_of(float x) { return x; }

// The calls of one side: through the bridge, or the C++20 reference.
struct bridge_side {
  br::settings settings = step_settings();
  br::model_state model;
  br::state_shape shape;
  static constexpr cxx17_cells::cell_geometry cell_table_geometry{batch, kv_heads, head_dim, cells, capacity};
  br::token_table table(const step_memory& m) const { return cxx17_cells::cell_table(m, cell_table_geometry); }
  br::selection selection(const selection_memory& s) const { return cxx17_cells::selection_of(s); }
  std::size_t model_bytes() {
    check_ok(api::make_state_shape(settings, rows, kv_heads, capacity, &shape), "make_state_shape");
    std::size_t bytes = 0;
    check_ok(api::model_state_bytes(shape, layers, &bytes), "model_state_bytes");
    return bytes;
  }
  // The layer's K cells as a page-size-1 paged cache over the step's table, V absent.
  template <class T>
  br::paged_cache<T> keys(const step_memory& m, T* pool, std::size_t size) const {
    return cxx17_cells::cell_cache(m, cell_table_geometry, pool, size);
  }
  std::size_t workspace_bytes() {
    return api::select_workspace_bytes(
        br::token_table{nullptr, nullptr, 0, nullptr, batch, kv_heads, 1, cells, capacity}, shape);
  }
  bool reset(void* buffer, std::size_t bytes) {
    check_ok(api::make_model_state(buffer, bytes, shape, layers, &model), "make_model_state");
    return api::reset_state(model).ok();
  }
  bool reset_sequence(void*, std::size_t, std::int32_t row, std::int32_t start) {
    return api::reset_sequence(model, row, start).ok();
  }
  bool admit(const step_memory& m, std::int32_t l) {
    return api::admit(settings, table(m), model.for_batch(m.state_rows).layer(l)).ok();
  }
  bool observe(const step_memory& m, std::int32_t l, const float* probs, std::size_t size, const std::int32_t* qo,
               std::int32_t columns) {
    return api::observe_probabilities(settings, table(m), model.for_batch(m.state_rows).layer(l),
                                      br::probabilities::ragged(probs, size, qo, q_heads, columns))
        .ok();
  }
  bool observe_queries(const step_memory& m, std::int32_t l, const query_memory& q) {
    const br::state layer = model.for_batch(m.state_rows).layer(l);
    const auto queries = br::queries<float>::ragged(q.queries, q.queries_size, q.qo_indptr, q_heads, head_dim);
    const br::lse lse =
        q.lse != nullptr ? br::lse::ragged(q.lse, q.lse_size, q.qo_indptr, q_heads, br::lse_base::natural) : br::lse{};
    const br::error e =
        q.keys_f32 != nullptr
            ? api::observe_queries(settings, keys(m, q.keys_f32, q.keys_size), layer, queries, lse, q.options)
            : api::observe_queries(settings, keys(m, q.keys_f16, q.keys_size), layer, queries, lse, q.options);
    if (!e.ok()) std::printf("bridge observe_queries: %s\n", e.message);
    return e.ok();
  }
  bool local_scores(const step_memory& m, float* values, std::size_t size) {
    const br::partial_scores partial{values, size, layers, batch, capacity, kv_heads};
    const br::error e = api::local_scores(settings, table(m), model.for_batch(m.state_rows), budget, partial);
    if (!e.ok()) std::printf("bridge local_scores: %s\n", e.message);
    return e.ok();
  }
  bool select(const step_memory& m, void* ws, std::size_t ws_bytes, const selection_memory& s,
              const std::int32_t* pins) {
    return api::select(settings, table(m), model.for_batch(m.state_rows), budget, ws, ws_bytes, selection(s), pins)
        .ok();
  }
  bool forget(const step_memory& m, std::int32_t l, const selection_memory& s) {
    return api::forget(settings, table(m), model.for_batch(m.state_rows).layer(l), selection(s)).ok();
  }
};

struct reference_side {
  std::size_t model_bytes() { return reference_model_bytes(); }
  std::size_t workspace_bytes() { return reference_workspace_bytes(); }
  bool reset(void* buffer, std::size_t bytes) { return reference_reset(buffer, bytes); }
  bool reset_sequence(void* buffer, std::size_t bytes, std::int32_t row, std::int32_t start) {
    return reference_reset_sequence(buffer, bytes, row, start);
  }
  bool admit(const step_memory& m, std::int32_t l) { return reference_admit(m, l); }
  bool observe(const step_memory& m, std::int32_t l, const float* probs, std::size_t size, const std::int32_t* qo,
               std::int32_t columns) {
    return reference_observe(m, l, probs, size, qo, columns);
  }
  bool observe_queries(const step_memory& m, std::int32_t l, const query_memory& q) {
    return reference_observe_queries(m, l, q);
  }
  bool local_scores(const step_memory& m, float* values, std::size_t size) {
    return reference_local_scores(m, values, size);
  }
  bool select(const step_memory& m, void* ws, std::size_t ws_bytes, const selection_memory& s,
              const std::int32_t* pins) {
    return reference_select(m, ws, ws_bytes, s, pins);
  }
  bool forget(const step_memory& m, std::int32_t l, const selection_memory& s) { return reference_forget(m, l, s); }
};

constexpr std::int32_t steps = 70;
constexpr std::int32_t stride = br::max_evictions(capacity, budget, evict_count);

// The engine: its cells, its requests, its table; drives one side.
struct engine {
  std::vector<std::vector<std::int32_t>> cells_of = std::vector<std::vector<std::int32_t>>(rows);
  std::vector<bool> active = std::vector<bool>(rows, false);
  std::vector<std::int32_t> free_cells;
  std::vector<std::int32_t> indptr = std::vector<std::int32_t>(batch + 1, 0);
  std::vector<std::int32_t> indices = std::vector<std::int32_t>(cells, -1);
  std::vector<std::int32_t> last = std::vector<std::int32_t>(batch, 0);
  std::vector<std::int32_t> state_rows = std::vector<std::int32_t>(batch, -1);
  std::vector<std::int32_t> qo = std::vector<std::int32_t>(batch + 1, 0);
  std::vector<std::int32_t> pinned = std::vector<std::int32_t>(batch, 0);
  std::vector<std::int32_t> counts = std::vector<std::int32_t>(batch),
                            slots = std::vector<std::int32_t>(batch * stride),
                            cache_slots = std::vector<std::int32_t>(batch * stride),
                            new_lengths = std::vector<std::int32_t>(batch),
                            freed_pages = std::vector<std::int32_t>(batch);
  std::vector<float> probs;
  std::int32_t columns = 1;
  // The observe_queries variant: each request's cells' positions (parallel
  // to cells_of), every layer's K pool in both element types (a cell's rows
  // written when it is taken), the step's queries and natural LSE.
  observe_with mode = observe_with::probabilities;
  bool with_lse = false;
  std::vector<std::vector<std::int32_t>> positions_of = std::vector<std::vector<std::int32_t>>(rows);
  std::vector<std::int32_t> next_position = std::vector<std::int32_t>(rows, 0);
  static constexpr std::size_t pool_size = std::size_t{cells} * kv_heads * head_dim;
  std::vector<std::vector<float>> keys_f32 =
      std::vector<std::vector<float>>(layers, std::vector<float>(pool_size, 0.0f));
  std::vector<std::vector<br::fp16_bits>> keys_f16 =
      std::vector<std::vector<br::fp16_bits>>(layers, std::vector<br::fp16_bits>(pool_size, br::fp16_bits{0}));
  std::vector<float> queries, lse;
  std::vector<float> partial = std::vector<float>(std::size_t{layers} * batch * capacity, -7.0f);
  std::int32_t window_holes = 0;  // queries whose window of positions held fewer slots than one of slots
  std::int32_t local_score_steps = 0;
  bool scores_vary = false;  // some partial score is neither 0 nor -inf

  engine() {
    for (std::int32_t c = 0; c < cells; ++c) free_cells.push_back(c);
    for (std::size_t i = free_cells.size(); i > 1; --i) std::swap(free_cells[i - 1], free_cells[mix(7, i) % i]);
  }
  // What a refused call could write (the selection buffers, the table,
  // local_scores' buffer) or must only read (the K pools).
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out;
    for (const auto* v : {&counts, &slots, &cache_slots, &new_lengths, &freed_pages, &indices, &indptr})
      append_bytes(out, *v);
    append_bytes(out, partial);
    for (std::int32_t l = 0; l < layers; ++l) {
      append_bytes(out, keys_f32[l]);
      append_bytes(out, keys_f16[l]);
    }
    return out;
  }
  selection_memory selection() {
    return {stride, counts.data(), slots.data(), cache_slots.data(), new_lengths.data(), freed_pages.data()};
  }

  // The step's arrivals, departures, appends and table (the same on both sides).
  template <class Side>
  void begin_step(Side& side, aligned_bytes& model, std::int32_t step) {
    for (std::int32_t r = 0; r < rows; ++r) {
      if (active[r] && mix(step, 1, r) % 30 == 0) {
        for (std::int32_t c : cells_of[r]) free_cells.push_back(c);
        cells_of[r].clear();
        positions_of[r].clear();
        active[r] = false;
      } else if (!active[r] && mix(step, 2, r) % 3 == 0) {
        active[r] = true;
        next_position[r] = static_cast<std::int32_t>(mix(step, 3, r) % 4);
        check(side.reset_sequence(model.data, model.size, r, next_position[r]), "reset_sequence");
      }
    }
    std::vector<std::int32_t> order;
    for (std::int32_t r = 0; r < rows; ++r)
      if (active[r]) order.push_back(r);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[mix(step, 4, i) % i]);
    if (order.size() > std::size_t{batch - 1}) order.resize(std::size_t{batch - 1});
    while (order.size() < std::size_t{batch}) order.push_back(-1);
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t r = order[b];
      state_rows[b] = r;
      std::int32_t q = 0;
      if (r >= 0) {
        q = cells_of[r].size() < 8 ? 1 + static_cast<std::int32_t>(mix(step, 5, b) % max_step_tokens) : 1;
        for (std::int32_t i = 0; i < q; ++i) {
          cells_of[r].push_back(free_cells.back());
          free_cells.pop_back();
          positions_of[r].push_back(next_position[r]++);
          fill_keys(step, cells_of[r].back());
        }
      }
      qo[b + 1] = qo[b] + q;
    }
    columns = sh_test::build_cell_table(cells_of, state_rows.data(), batch, indptr.data(), indices.data(), last.data());
    for (std::int32_t b = 0; b < batch; ++b)
      pinned[b] = std::min(indptr[b + 1] - indptr[b], static_cast<std::int32_t>(mix(step, 6, b) % 3));
  }
  // Layer l's probabilities: rows summing to 1 over the visible cells.
  void fill_probabilities(std::int32_t step, std::int32_t l) {
    sh_test::fill_causal_probabilities(
        probs, indptr.data(), qo.data(), batch, q_heads, columns,
        [&](std::int32_t b, std::int32_t qh, std::int32_t j, std::int32_t t) {
          return 0.01f + static_cast<float>(mix(step, 100 + l, (qh * 64 + j) * 4096 + b * 512 + t) >> 40) * 0x1p-24f;
        });
  }
  // A new cell's K rows in every layer's pools.
  void fill_keys(std::int32_t step, std::int32_t cell) {
    for (std::int32_t l = 0; l < layers; ++l)
      for (std::int32_t i = 0; i < kv_heads * head_dim; ++i) {
        const std::size_t at = static_cast<std::size_t>(cell) * kv_heads * head_dim + static_cast<std::size_t>(i);
        const std::uint64_t r = mix(step, 200 + l, static_cast<std::uint64_t>(cell) * 4096 + i);
        keys_f32[l][at] = static_cast<float>(r >> 40) * 0x1p-22f - 2.0f;  // [-2, 2)
        keys_f16[l][at] = half_of(r);
      }
  }
  // Layer l's ragged queries [token][q_head][head_dim] in [-1, 1), and the
  // natural log-sum-exp [token][q_head] of each query's logits as the
  // kernel formed them (attention_of(l)) over the keys it sees, in double.
  void fill_queries(std::int32_t step, std::int32_t l) {
    queries.resize(static_cast<std::size_t>(qo[batch]) * q_heads * head_dim);
    for (std::size_t i = 0; i < queries.size(); ++i)
      queries[i] = static_cast<float>(mix(step, 300 + l, i) >> 40) * 0x1p-23f - 1.0f;
    lse.assign(static_cast<std::size_t>(qo[batch]) * q_heads, 0.0f);
    const br::attention a = attention_of(l);
    const double scale = a.softmax_scale > 0.0f ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
    const auto key = [&](std::int32_t cell, std::int32_t h, std::int32_t x) {
      const std::size_t at = (static_cast<std::size_t>(cell) * kv_heads + h) * head_dim + x;
      return mode == observe_with::queries_f16 ? value_of(keys_f16[l][at]) : value_of(keys_f32[l][at]);
    };
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t r = state_rows[b], len = indptr[b + 1] - indptr[b], q_len = qo[b + 1] - qo[b];
      for (std::int32_t j = 0; j < q_len; ++j) {
        const std::int32_t i = len - q_len + j;  // the query's slot: it sees slots 0 .. i
        std::int32_t first = 0;
        if (a.window_left >= 0 && a.window_left_unit == br::window_unit::slots) first = std::max(0, i - a.window_left);
        if (a.window_left >= 0 && a.window_left_unit == br::window_unit::positions) {
          while (positions_of[r][first] < positions_of[r][i] - a.window_left) ++first;
          window_holes += i - first < std::min(i, a.window_left);
        }
        for (std::int32_t qh = 0; qh < q_heads; ++qh) {
          const float* q = queries.data() + (static_cast<std::size_t>(qo[b] + j) * q_heads + qh) * head_dim;
          std::vector<double> logits;
          for (std::int32_t t = first; t <= i; ++t) {
            double x = 0.0;
            for (std::int32_t d = 0; d < head_dim; ++d)
              x += double{q[d]} * key(indices[indptr[b] + t], qh / (q_heads / kv_heads), d);
            x *= scale;
            if (a.logits_soft_cap > 0.0f) x = a.logits_soft_cap * std::tanh(x / a.logits_soft_cap);
            logits.push_back(x);
          }
          const double top = *std::max_element(logits.begin(), logits.end());
          double sum = 0.0;
          for (double x : logits) sum += std::exp(x - top);
          lse[static_cast<std::size_t>(qo[b] + j) * q_heads + qh] = static_cast<float>(top + std::log(sum));
        }
      }
    }
  }
  query_memory query_input(std::int32_t l) {
    const bool half = mode == observe_with::queries_f16;
    return {half ? nullptr : keys_f32[l].data(),
            half ? keys_f16[l].data() : nullptr,
            pool_size,
            queries.data(),
            queries.size(),
            qo.data(),
            with_lse ? lse.data() : nullptr,
            with_lse ? lse.size() : 0,
            attention_of(l)};
  }
  // Frees the selected cells, keeping the others in order; checks that
  // cache_slots name the cells.
  void free_selected() {
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t r = state_rows[b];
      if (r < 0 || counts[b] == 0) continue;
      std::vector<std::int32_t> kept, kept_positions;
      std::int32_t k = 0;
      bool named = true;
      for (std::int32_t t = 0; t < static_cast<std::int32_t>(cells_of[r].size()); ++t) {
        if (k < counts[b] && slots[b * stride + k] == t) {
          named &= cache_slots[b * stride + k] == cells_of[r][t];
          free_cells.push_back(cells_of[r][t]);
          ++k;
        } else {
          kept.push_back(cells_of[r][t]);
          kept_positions.push_back(positions_of[r][t]);
        }
      }
      check(named && k == counts[b] && static_cast<std::int32_t>(kept.size()) == new_lengths[b],
            "selection names the cells it frees");
      cells_of[r] = kept;
      positions_of[r] = kept_positions;
    }
  }

  template <class Side>
  std::vector<step_record> run(Side& side) {
    aligned_bytes model(side.model_bytes(), 0xA5);
    check(side.reset(model.data, model.size), "reset");
    aligned_bytes workspace(side.workspace_bytes(), 0xA5);
    std::vector<step_record> records;
    for (std::int32_t step = 0; step < steps; ++step) {
      // A refused call leaves the engine unshrunk: stop before the pool runs dry.
      if (failed > 0) break;
      begin_step(side, model, step);
      const step_memory m{indptr.data(), indices.data(), last.data(), state_rows.data(), model.data, model.size};
      for (std::int32_t l = 0; l < layers; ++l) {
        if (step % 5 == 0) check(side.admit(m, l), "admit");
        if (mode == observe_with::probabilities) {
          fill_probabilities(step, l);
          check(side.observe(m, l, probs.data(), probs.size(), qo.data(), columns), "observe_probabilities");
        } else {
          fill_queries(step, l);
          check(side.observe_queries(m, l, query_input(l)), "observe_queries");
        }
      }
      // What select will rank, once a request is at the budget.
      std::vector<unsigned char> partial_bytes;
      bool at_budget = false;
      for (std::int32_t b = 0; b < batch; ++b) at_budget |= indptr[b + 1] - indptr[b] >= budget;
      if (at_budget) {
        std::fill(partial.begin(), partial.end(), -7.0f);
        check(side.local_scores(m, partial.data(), partial.size()), "local_scores");
        append_bytes(partial_bytes, partial);
        ++local_score_steps;
        for (float x : partial) scores_vary |= x != 0.0f && !std::isinf(x) && x != -7.0f;
      }
      std::fill(counts.begin(), counts.end(), -7);
      std::fill(slots.begin(), slots.end(), -7);
      std::fill(cache_slots.begin(), cache_slots.end(), -7);
      std::fill(new_lengths.begin(), new_lengths.end(), -7);
      std::fill(freed_pages.begin(), freed_pages.end(), -7);
      check(side.select(m, workspace.data, workspace.size, selection(), pinned.data()), "select");
      for (std::int32_t l = 0; l < layers; ++l) check(side.forget(m, l, selection()), "forget");
      free_selected();
      records.push_back({model.bytes(), partial_bytes, counts, slots, cache_slots, new_lengths, freed_pages});
    }
    return records;
  }
};

std::vector<step_record> compare_runs(observe_with mode, bool with_lse, const char* name) {
  bridge_side bridged;
  reference_side reference;
  check(bridged.model_bytes() == reference.model_bytes(), "model_state_bytes matches the library's");
  check(bridged.workspace_bytes() == reference.workspace_bytes(), "select_workspace_bytes matches the library's");
  engine a, b;
  a.mode = b.mode = mode;
  a.with_lse = b.with_lse = with_lse;
  const std::vector<step_record> through_bridge = a.run(bridged);
  const std::vector<step_record> direct = b.run(reference);
  check(through_bridge.size() == static_cast<std::size_t>(steps) && direct.size() == through_bridge.size(),
        "both runs complete every step");
  std::int32_t evicted = 0;
  for (std::size_t s = 0; s < std::min(through_bridge.size(), direct.size()); ++s) {
    const step_record& x = through_bridge[s];
    const step_record& y = direct[s];
    char what[96];
    std::snprintf(what, sizeof what, "%s, step %zu", name, s);
    check(x.model == y.model, what, "model state bytes differ");
    check(x.partial == y.partial, what, "local_scores differ");
    check(x.counts == y.counts && x.slots == y.slots && x.cache_slots == y.cache_slots, what, "selection differs");
    check(x.new_lengths == y.new_lengths && x.freed_pages == y.freed_pages, what, "outputs differ");
    for (std::int32_t c : x.counts) evicted += c > 0 ? c : 0;
  }
  check(evicted > 60, "the scenario evicts");
  check(a.local_score_steps > 20 && a.local_score_steps == b.local_score_steps && a.scores_vary,
        "local_scores ran on the steps at the budget, with scores to rank");
  if (mode != observe_with::probabilities)
    check(a.window_holes > 0 && a.window_holes == b.window_holes,
          "evictions left holes inside the window of positions (fewer slots than a window of slots)");
  std::printf("token level, %s: %zu steps, %d tokens evicted, local_scores on %d steps, %d windows with holes\n", name,
              through_bridge.size(), evicted, a.local_score_steps, a.window_holes);
  return through_bridge;
}

// Refused calls: invalid_argument naming `argument`, and nothing written
// (the model state and the selection buffers byte-identical).
struct refusals {
  bridge_side side;
  engine e;
  aligned_bytes model{side.model_bytes(), 0xA5};
  aligned_bytes workspace{side.workspace_bytes(), 0xA5};

  refusals() {
    check(side.reset(model.data, model.size), "reset");
    begin();
  }
  void begin() {
    e.begin_step(side, model, 0);
    e.begin_step(side, model, 1);
    const step_memory m = memory();
    for (std::int32_t l = 0; l < layers; ++l) check(side.admit(m, l), "admit");
  }
  step_memory memory() {
    return {e.indptr.data(), e.indices.data(), e.last.data(), e.state_rows.data(), model.data, model.size};
  }
  template <class Call>
  void expect(const char* name, const char* argument, Call&& call) {
    const std::vector<unsigned char> before = model.bytes(), engine_before = e.bytes();
    const br::error err = call();
    const bool named = err.code == br::error_code::invalid_argument && std::strcmp(err.argument, argument) == 0 &&
                       err.function[0] != '\0';
    check(named, name, err.message[0] != '\0' ? err.message : "(accepted)");
    check(model.bytes() == before && e.bytes() == engine_before, name, "wrote something");
  }
  void run() {
    const step_memory m = memory();
    const br::settings s = side.settings;
    const br::token_table table = side.table(m);
    const br::model_state model_d = side.model.for_batch(m.state_rows);
    const br::selection sel = side.selection(e.selection());
    std::fill(e.counts.begin(), e.counts.end(), 0);  // a selection of nothing (forget's input)
    const auto select = [&](const br::token_table& t, const br::model_state& md, std::int32_t budget_,
                            std::size_t ws_bytes, const br::selection& out, const std::int32_t* pins) {
      return api::select(s, t, md, budget_, workspace.data, ws_bytes, out, pins);
    };

    br::token_table t = table;
    t.indptr = nullptr;
    expect("admit: null indptr", "cache.indptr", [&] { return api::admit(s, t, model_d.layer(0)); });
    // Settings another namespace's default_settings filled (another policy).
    br::settings per_layer;
    check_ok(cxx17_test::sh_f32::default_settings(&per_layer), "default_settings of the per-layer namespace");
    expect("admit: settings of another namespace's policy", "settings",
           [&] { return api::admit(per_layer, table, model_d.layer(0)); });
    // A layer past the model: a state without a buffer, refused.
    expect("admit: model.layer(layers)", "state.buffer",
           [&] { return api::admit(s, table, model_d.layer(model_d.layers)); });
    expect("admit: model.layer(-1)", "state.buffer", [&] { return api::admit(s, table, model_d.layer(-1)); });
    t = table;
    std::vector<std::int32_t> bad_indices = e.indices;
    bad_indices[0] = cells;
    t.indices = bad_indices.data();
    expect("select: a cell outside the pool", "cache.indices",
           [&] { return select(t, model_d, budget, workspace.size, sel, nullptr); });
    t = table;
    std::vector<std::int32_t> bad_last = e.last;
    bad_last[0] = 2;
    t.last_page_len = bad_last.data();
    expect("observe_probabilities: last_page_len 2 at page size 1", "cache.last_page_len", [&] {
      return api::observe_probabilities(s, t, model_d.layer(1),
                                        br::probabilities::ragged(nullptr, 0, e.qo.data(), q_heads, 1));
    });
    t = table;
    t.kv_heads = 1;
    expect("forget: a table of 1 KV head", "state.shape.kv_heads",
           [&] { return api::forget(s, t, model_d.layer(2), sel); });
    t = table;
    t.page_size = 0;
    expect("select: page size 0", "cache.page_size",
           [&] { return select(t, model_d, budget, workspace.size, sel, nullptr); });
    t = table;
    t.indices_size = 1;
    expect("admit: indices shorter than indptr[batch]", "cache.indices",
           [&] { return api::admit(s, t, model_d.layer(0)); });

    std::vector<float> nan_probs(static_cast<std::size_t>(e.qo[batch]) * q_heads * 32, 0.0f);
    nan_probs[0] = 2.0f;
    expect("observe_probabilities: a probability above 1", "probs", [&] {
      return api::observe_probabilities(
          s, table, model_d.layer(0),
          br::probabilities::ragged(nan_probs.data(), nan_probs.size(), e.qo.data(), q_heads, 32));
    });

    br::selection bad = sel;
    bad.stride = stride - 1;
    expect("select: stride below max_evictions", "selection.stride",
           [&] { return select(table, model_d, budget, workspace.size, bad, nullptr); });
    bad = sel;
    bad.counts = nullptr;
    expect("select: null counts", "selection.counts",
           [&] { return select(table, model_d, budget, workspace.size, bad, nullptr); });
    // Page size 1: freed_pages would count trailing cells, which llama.cpp
    // must not free (it frees cache_slots): optional, so null is accepted.
    bad = sel;
    bad.out.freed_pages = nullptr;
    check_ok(select(table, model_d, budget, workspace.size, bad, nullptr), "select: null freed_pages at page size 1");
    bad = sel;
    bad.cache_slots = e.counts.data();
    expect("select: cache_slots over counts", "selection.cache_slots",
           [&] { return select(table, model_d, budget, workspace.size, bad, nullptr); });
    expect("select: budget at the protected tokens", "budget",
           [&] { return select(table, model_d, s.recent + s.sinks, workspace.size, sel, nullptr); });
    expect("select: workspace too small", "workspace", [&] { return select(table, model_d, budget, 8, sel, nullptr); });
    std::vector<std::int32_t> pins(batch, 0);
    pins[0] = -1;
    expect("select: negative pinned prefix", "pinned_prefix",
           [&] { return select(table, model_d, budget, workspace.size, sel, pins.data()); });

    br::model_state md = model_d;
    md.layer_bytes += 256;
    expect("select: layer_bytes not the shape's", "model.layer_bytes",
           [&] { return select(table, md, budget, workspace.size, sel, nullptr); });
    md = model_d;
    md.bytes -= 1;
    expect("select: model buffer below model_state_bytes", "model.bytes",
           [&] { return select(table, md, budget, workspace.size, sel, nullptr); });
    md = model_d;
    md.buffer = static_cast<unsigned char*>(md.buffer) + 8;
    expect("select: misaligned model buffer", "model.buffer",
           [&] { return select(table, md, budget, workspace.size, sel, nullptr); });
    md = model_d;
    md.layers = 0;
    expect("reset_state: no layers", "model.layers", [&] { return api::reset_state(md); });
    expect("reset_sequence: row out of range", "row", [&] { return api::reset_sequence(model_d, rows, 0); });
    br::state layer_state = model_d.layer(1);
    layer_state.bytes -= 1;
    expect("admit: a layer state below state_bytes", "state.bytes", [&] { return api::admit(s, table, layer_state); });

    // forget: a selection that names a slot beyond the sequence.
    for (std::int32_t b = 0; b < batch; ++b)
      if (e.indptr[b + 1] > e.indptr[b]) {
        e.counts[b] = 1;
        e.slots[b * stride] = e.indptr[b + 1] - e.indptr[b];
        break;
      }
    expect("forget: a slot beyond the length", "selection.slots",
           [&] { return api::forget(s, table, model_d.layer(0), sel); });
    std::fill(e.counts.begin(), e.counts.end(), 0);

    // observe_queries over the K cells (page size 1, V absent), and local_scores.
    e.mode = observe_with::queries_f16;
    e.fill_queries(1, 0);
    const br::paged_cache<br::fp16_bits> keys16 = side.keys(m, e.keys_f16[0].data(), e.keys_f16[0].size());
    const br::paged_cache<float> keys32 = side.keys(m, e.keys_f32[0].data(), e.keys_f32[0].size());
    const auto queries = br::queries<float>::ragged(e.queries.data(), e.queries.size(), e.qo.data(), q_heads, head_dim);
    const br::lse lse = br::lse::ragged(e.lse.data(), e.lse.size(), e.qo.data(), q_heads, br::lse_base::natural);
    const br::attention window = attention_of(0);
    br::attention a = window;
    a.window_left = -2;
    expect("observe_queries: window_left -2", "options.window_left",
           [&] { return api::observe_queries(s, keys32, model_d.layer(0), queries, lse, a); });
    a = window;
    a.window_left_unit = static_cast<br::window_unit>(2);
    expect("observe_queries: window_left_unit out of range", "options.window_left_unit",
           [&] { return api::observe_queries(s, keys16, model_d.layer(0), queries, lse, a); });
    a = attention_of(1);
    a.logits_soft_cap = -1.0f;
    expect("observe_queries: negative soft cap", "options.logits_soft_cap",
           [&] { return api::observe_queries(s, keys32, model_d.layer(1), queries, br::lse{}, a); });
    a = br::attention{};
    a.alibi_slopes_size = q_heads;
    expect("observe_queries: ALiBi slopes null with a size", "options.alibi_slopes",
           [&] { return api::observe_queries(s, keys16, model_d.layer(2), queries, lse, a); });
    br::paged_cache<br::fp16_bits> k16 = keys16;
    k16.head_dim = head_dim / 2;
    expect("observe_queries: K cells of another head_dim than the queries", "queries.head_dim",
           [&] { return api::observe_queries(s, k16, model_d.layer(0), queries, lse, window); });
    k16 = keys16;
    k16.k_size -= 1;
    expect("observe_queries: K pool below its layout", "cache.k_pages",
           [&] { return api::observe_queries(s, k16, model_d.layer(0), queries, lse, window); });
    k16 = keys16;
    k16.v_size = keys16.k_size;  // absent V is a null pointer with size 0
    expect("observe_queries: V null with a size", "cache.v_pages",
           [&] { return api::observe_queries(s, k16, model_d.layer(0), queries, lse, window); });
    br::lse unnamed = lse;
    unnamed.base = br::lse_base::unspecified;
    expect("observe_queries: lse base not named", "lse.base",
           [&] { return api::observe_queries(s, keys16, model_d.layer(0), queries, unnamed, window); });
    const std::vector<std::int32_t> qo_copy = e.qo;
    expect("observe_queries: lse over another qo_indptr array", "lse.qo_indptr", [&] {
      return api::observe_queries(
          s, keys16, model_d.layer(0), queries,
          br::lse::ragged(e.lse.data(), e.lse.size(), qo_copy.data(), q_heads, br::lse_base::natural), window);
    });

    const br::partial_scores partial{e.partial.data(), e.partial.size(), layers, batch, capacity, kv_heads};
    br::partial_scores p = partial;
    p.capacity = capacity + 1;
    expect("local_scores: capacity not the state's", "partial.capacity",
           [&] { return api::local_scores(s, table, model_d, budget, p); });
    p = partial;
    p.kv_heads = kv_heads - 1;
    expect("local_scores: fewer KV heads than the model's", "partial.kv_heads",
           [&] { return api::local_scores(s, table, model_d, budget, p); });
    p = partial;
    p.size -= 1;
    expect("local_scores: buffer below layers x batch x capacity", "partial.values",
           [&] { return api::local_scores(s, table, model_d, budget, p); });
    expect("local_scores: budget at the protected tokens", "budget",
           [&] { return api::local_scores(s, table, model_d, s.recent + s.sinks, partial); });

    // Set-up calls.
    br::state_shape shape = side.shape;
    std::size_t bytes = 0;
    expect("model_state_bytes: no layers", "layers", [&] { return api::model_state_bytes(shape, 0, &bytes); });
    expect("model_state_bytes: null out", "bytes", [&] { return api::model_state_bytes(shape, layers, nullptr); });
    br::model_state out;
    aligned_bytes small(model.size - 256, 0xA5);
    expect("make_model_state: buffer too small", "buffer",
           [&] { return api::make_model_state(small.data, small.size, shape, layers, &out); });
    check(out.buffer == nullptr && out.layer_bytes == 0, "make_model_state: refused, out untouched");
    expect("default_settings: null", "settings", [&] { return api::default_settings(nullptr); });
    expect("make_state_shape: settings not from default_settings", "settings", [&] {
      return api::make_state_shape(br::settings{}, rows, kv_heads, capacity, &shape);
    });
    br::settings bad_settings = s;
    bad_settings.evict_count = 0;
    expect("make_state_shape: m = 0", "settings.evict_count",
           [&] { return api::make_state_shape(bad_settings, rows, kv_heads, capacity, &shape); });

    // The arguments the refusals above break are accepted as they are
    // (these calls write: last).
    check_ok(api::local_scores(s, table, model_d, budget, partial), "local_scores: the refusals' baseline");
    check_ok(api::observe_queries(s, keys16, model_d.layer(0), queries, lse, window),
             "observe_queries: the refusals' baseline (fp16 K, LSE, window in positions)");
    check_ok(api::observe_queries(s, keys32, model_d.layer(1), queries, br::lse{}, attention_of(1)),
             "observe_queries: the refusals' baseline (float K, soft cap)");
  }
};

void default_settings_are_the_policys() {
  br::settings mine, theirs;
  check_ok(api::default_settings(&mine), "default_settings");
  reference_default_settings(&theirs);
  check(mine.window == theirs.window && mine.recent == theirs.recent && mine.sinks == theirs.sinks &&
            mine.evict_count == theirs.evict_count && mine.alpha == theirs.alpha && mine.decay == theirs.decay &&
            mine.normalize == theirs.normalize && mine.compaction_mode == theirs.compaction_mode &&
            mine.seed == theirs.seed && mine.pool_width == theirs.pool_width && mine.pool_mode == theirs.pool_mode,
        "default_settings is Policy{}.config field by field");
  check(mine.filled == theirs.filled && mine.filled != 0 && br::settings{}.filled == 0,
        "default_settings marks what it filled with its policy's mark; a settings{} is unmarked");
  br::settings per_layer;
  check_ok(cxx17_test::sh_f32::default_settings(&per_layer), "default_settings of the per-layer namespace");
  check(per_layer.filled != 0 && per_layer.filled != mine.filled, "another policy's namespace marks with another mark");
  // scissorhands_policy's measured numbers, not bridge::settings{}'s (the paper's).
  check(mine.window == 25 && mine.alpha == 2.0f && mine.normalize && br::settings{}.window == 400,
        "default_settings gives the preset's numbers");
}

}  // namespace

int main() {
  default_settings_are_the_policys();
  compare_runs(observe_with::probabilities, false, "observe_probabilities");
  compare_runs(observe_with::queries_f32, false, "observe_queries, float K, no LSE");
  // The LSE the test computes is the kernel's: the library's own normaliser
  // (no LSE) gives the same state bytes (an LSE off by 0.1 matches none).
  const std::vector<step_record> given =
      compare_runs(observe_with::queries_f16, true, "observe_queries, fp16 K, natural LSE");
  const std::vector<step_record> own =
      compare_runs(observe_with::queries_f16, false, "observe_queries, fp16 K, no LSE");
  std::size_t same = 0;
  for (std::size_t i = 0; i < std::min(given.size(), own.size()); ++i) same += given[i].model == own[i].model;
  check(same >= given.size() / 2 && !given.empty(),
        "the test's LSE gives the state the library's own normaliser gives");
  std::printf("fp16 K: the state with the test's LSE equals the state without on %zu of %zu steps\n", same,
              given.size());
  refusals r;
  r.run();
  return finish();
}
