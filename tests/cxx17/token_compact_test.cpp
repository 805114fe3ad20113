// A C++17, -fno-exceptions engine that evicts whole tokens (shared_layers)
// through bridge.h and lets the library move its K/V rows: a pool of cells
// (page size 1) listed per sequence, two layers with their own K and V
// pools, two sequences growing by chunks of 1 to 3 tokens. Each step: append
// the new tokens' cells (K and V rows written in every layer), observe every
// layer once with one query per new token (observe_queries over the layer's
// K/V cells), select once, compact every layer, then apply new_lengths (each
// sequence keeps its first new_lengths[b] cells and frees the rest). The same
// steps run on a second copy through the C++20 host API directly
// (token_compact_tu.cpp); the K/V pools, the model state, the selection and
// new_lengths must agree byte for byte after every step, and the kept rows
// must sit where the compaction mode puts them (an oracle written here from
// the selection). Float and fp16 K/V, fill_holes and preserve_order. Then bad
// input: each compact returns invalid_argument naming the argument, with the
// K/V pools, the model state, the selection and the table byte-identical.
// Plain main: prints "N passed, M failed".
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <scissorhands/bridge/bridge.h>

#include "../host/slot_list_engine.hpp"
#include "cell_descriptors.h"
#include "check.h"
#include "scenario.h"  // cxx17_test::sh_f32: another policy's namespace, whose settings compact must refuse
#include "token_compact_scenario.h"

namespace br = scissorhands::bridge;
namespace api = cxx17_compact::api;
using namespace cxx17_compact;
using namespace cxx17_check;

namespace {

std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A finite binary16 value from random bits (no _Float16): magnitudes 2^-6 .. 4.
br::fp16_bits half_of(std::uint64_t r) {
  const std::uint32_t exponent = 9 + static_cast<std::uint32_t>(r % 8);
  const auto mantissa = static_cast<std::uint32_t>(r >> 8) & 0x3FFu;
  const auto sign = static_cast<std::uint32_t>(r >> 20) & 1u;
  return {static_cast<std::uint16_t>(sign << 15 | exponent << 10 | mantissa)};
}

enum class element { f32, f16 };

// The calls of one side: through the bridge, or the C++20 reference.
struct bridge_side {
  br::settings settings;
  br::model_state model;
  br::state_shape shape;

  explicit bridge_side(br::compaction mode) {
    check_ok(api::default_settings(&settings), "default_settings");
    settings.evict_count = evict_count;
    settings.sinks = sinks;
    settings.recent = recent;
    settings.compaction_mode = mode;
  }
  static constexpr cxx17_cells::cell_geometry cell_table_geometry{batch, kv_heads, head_dim, cells, capacity};
  br::token_table table(const step_memory& m) const { return cxx17_cells::cell_table(m, cell_table_geometry); }
  // One layer's K and V cells as a page-size-1 paged cache over the step's table.
  template <class T>
  br::paged_cache<T> cache(const step_memory& m, T* k, T* v) const {
    return cxx17_cells::cell_cache(m, cell_table_geometry, k, pool_size, v, pool_size);
  }
  br::selection selection(const selection_memory& s) const { return cxx17_cells::selection_of(s); }
  std::size_t model_bytes() {
    check_ok(api::make_state_shape(settings, batch, kv_heads, capacity, &shape), "make_state_shape");
    std::size_t bytes = 0;
    check_ok(api::model_state_bytes(shape, layers, &bytes), "model_state_bytes");
    return bytes;
  }
  std::size_t select_workspace_bytes() {
    return api::select_workspace_bytes(
        br::token_table{nullptr, nullptr, 0, nullptr, batch, kv_heads, 1, cells, capacity}, shape);
  }
  // Both overloads: the pool's page count, whatever the element type.
  std::size_t compact_workspace_bytes() {
    const step_memory none{nullptr, nullptr, nullptr, nullptr, 0, settings.compaction_mode};
    const std::size_t f32 = api::compact_workspace_bytes(cache<float>(none, nullptr, nullptr));
    const std::size_t f16 = api::compact_workspace_bytes(cache<br::fp16_bits>(none, nullptr, nullptr));
    check(f32 == f16, "compact_workspace_bytes: the same for float and fp16 K/V");
    return f32;
  }
  bool reset(void* buffer, std::size_t bytes) {
    check_ok(api::make_model_state(buffer, bytes, shape, layers, &model), "make_model_state");
    return api::reset_state(model).ok();
  }
  bool observe_queries(const step_memory& m, std::int32_t l, const kv_memory& kv, const float* q, std::size_t size,
                       const std::int32_t* qo) {
    const auto queries = br::queries<float>::ragged(q, size, qo, q_heads, head_dim);
    const br::error e =
        kv.k_f32 != nullptr
            ? api::observe_queries(settings, cache(m, kv.k_f32, kv.v_f32), model.layer(l), queries, br::lse{},
                                   br::attention{})
            : api::observe_queries(settings, cache(m, kv.k_f16, kv.v_f16), model.layer(l), queries, br::lse{},
                                   br::attention{});
    if (!e.ok()) std::printf("bridge observe_queries: %s\n", e.message);
    return e.ok();
  }
  bool select(const step_memory& m, void* ws, std::size_t ws_bytes, const selection_memory& s) {
    const br::error e = api::select(settings, table(m), model, budget, ws, ws_bytes, selection(s));
    if (!e.ok()) std::printf("bridge select: %s\n", e.message);
    return e.ok();
  }
  bool compact(const step_memory& m, std::int32_t l, const kv_memory& kv, const selection_memory& s, void* ws,
               std::size_t ws_bytes) {
    const br::error e =
        kv.k_f32 != nullptr
            ? api::compact(settings, cache(m, kv.k_f32, kv.v_f32), model.layer(l), selection(s), ws, ws_bytes)
            : api::compact(settings, cache(m, kv.k_f16, kv.v_f16), model.layer(l), selection(s), ws, ws_bytes);
    if (!e.ok()) std::printf("bridge compact: %s\n", e.message);
    return e.ok();
  }
};

struct reference_side {
  std::size_t model_bytes() { return reference_model_bytes(); }
  std::size_t select_workspace_bytes() { return reference_select_workspace_bytes(); }
  std::size_t compact_workspace_bytes() { return reference_compact_workspace_bytes(); }
  bool reset(void* buffer, std::size_t bytes) { return reference_reset(buffer, bytes); }
  bool observe_queries(const step_memory& m, std::int32_t l, const kv_memory& kv, const float* q, std::size_t size,
                       const std::int32_t* qo) {
    return reference_observe_queries(m, l, kv, q, size, qo);
  }
  bool select(const step_memory& m, void* ws, std::size_t ws_bytes, const selection_memory& s) {
    return reference_select(m, ws, ws_bytes, s);
  }
  bool compact(const step_memory& m, std::int32_t l, const kv_memory& kv, const selection_memory& s, void* ws,
               std::size_t ws_bytes) {
    return reference_compact(m, l, kv, s, ws, ws_bytes);
  }
};

constexpr std::int32_t steps = 32;
constexpr std::int32_t stride = br::max_evictions(capacity, budget, evict_count);
constexpr std::int32_t rows_of_batch[batch] = {0, 1};  // sequence b on state row b (the table's rows)

// What one step leaves behind.
struct step_record {
  std::vector<unsigned char> model, pools;
  std::vector<std::int32_t> counts, slots, cache_slots, new_lengths, freed_pages;
};

using row_bytes = std::vector<unsigned char>;

// The engine: its cells, its sequences, its table, its K/V pools; drives one side.
struct engine {
  element type;
  br::compaction mode;
  std::vector<std::vector<std::int32_t>> cells_of = std::vector<std::vector<std::int32_t>>(batch);
  std::vector<std::int32_t> free_cells;
  std::vector<std::int32_t> indptr = std::vector<std::int32_t>(batch + 1, 0);
  std::vector<std::int32_t> indices = std::vector<std::int32_t>(cells, -1);
  std::vector<std::int32_t> last = std::vector<std::int32_t>(batch, 0);
  std::vector<std::int32_t> qo = std::vector<std::int32_t>(batch + 1, 0);
  std::vector<std::int32_t> counts = std::vector<std::int32_t>(batch),
                            slots = std::vector<std::int32_t>(batch * stride),
                            cache_slots = std::vector<std::int32_t>(batch * stride),
                            new_lengths = std::vector<std::int32_t>(batch),
                            freed_pages = std::vector<std::int32_t>(batch);
  std::vector<std::vector<float>> k32 = std::vector<std::vector<float>>(layers, std::vector<float>(pool_size)),
                                  v32 = std::vector<std::vector<float>>(layers, std::vector<float>(pool_size));
  std::vector<std::vector<br::fp16_bits>> k16 = std::vector<std::vector<br::fp16_bits>>(
                                              layers, std::vector<br::fp16_bits>(pool_size, br::fp16_bits{0})),
                                          v16 = std::vector<std::vector<br::fp16_bits>>(
                                              layers, std::vector<br::fp16_bits>(pool_size, br::fp16_bits{0}));
  std::vector<float> queries;
  std::int32_t evicted = 0;  // tokens selected over the run
  std::int32_t moved = 0;    // (step, sequence) pairs whose compaction moved kept rows into holes

  engine(element t, br::compaction m) : type(t), mode(m) {
    for (std::int32_t c = 0; c < cells; ++c) free_cells.push_back(c);
    for (std::size_t i = free_cells.size(); i > 1; --i) std::swap(free_cells[i - 1], free_cells[mix(7, i) % i]);
    // Cells never written hold values too, so that a row moved from a wrong cell shows.
    for (std::int32_t l = 0; l < layers; ++l)
      for (std::size_t i = 0; i < pool_size; ++i) write_element(l, i, mix(9, l, i), mix(10, l, i));
  }
  void write_element(std::int32_t l, std::size_t at, std::uint64_t rk, std::uint64_t rv) {
    k32[l][at] = static_cast<float>(rk >> 40) * 0x1p-22f - 2.0f;  // [-2, 2)
    v32[l][at] = static_cast<float>(rv >> 40) * 0x1p-22f - 2.0f;
    k16[l][at] = half_of(rk);
    v16[l][at] = half_of(rv);
  }
  kv_memory kv(std::int32_t l) {
    if (type == element::f32) return {k32[l].data(), v32[l].data(), nullptr, nullptr};
    return {nullptr, nullptr, k16[l].data(), v16[l].data()};
  }
  std::vector<unsigned char> pools() const {
    std::vector<unsigned char> out;
    for (std::int32_t l = 0; l < layers; ++l) {
      append_bytes(out, k32[l]);
      append_bytes(out, v32[l]);
      append_bytes(out, k16[l]);
      append_bytes(out, v16[l]);
    }
    return out;
  }
  // What a refused compact could write (the pools) or must only read (the
  // selection, the table).
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out = pools();
    for (const auto* v : {&counts, &slots, &cache_slots, &new_lengths, &freed_pages, &indptr, &indices, &last})
      append_bytes(out, *v);
    return out;
  }
  selection_memory selection() {
    return {stride, counts.data(), slots.data(), cache_slots.data(), new_lengths.data(), freed_pages.data()};
  }
  step_memory memory(aligned_bytes& model) const {
    return {indptr.data(), indices.data(), last.data(), model.data, model.size, mode};
  }
  std::int32_t length(std::int32_t b) const { return static_cast<std::int32_t>(cells_of[b].size()); }

  // The step's appends (1 to 3 tokens per sequence, their K and V rows
  // written in every layer), the table and the queries' qo_indptr.
  void begin_step(std::int32_t step) {
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto q = 1 + static_cast<std::int32_t>(mix(step, 5, b) % max_step_tokens);
      for (std::int32_t i = 0; i < q; ++i) {
        const std::int32_t cell = free_cells.back();
        free_cells.pop_back();
        cells_of[b].push_back(cell);
        for (std::int32_t l = 0; l < layers; ++l)
          for (std::int32_t x = 0; x < kv_heads * head_dim; ++x)
            write_element(l, static_cast<std::size_t>(cell) * kv_heads * head_dim + x,
                          mix(step, 200 + l, cell * 64 + x), mix(step, 300 + l, cell * 64 + x));
      }
      qo[b + 1] = qo[b] + q;
    }
    sh_test::build_cell_table(cells_of, rows_of_batch, batch, indptr.data(), indices.data(), last.data());
  }
  // Layer l's ragged queries [token][q_head][head_dim] in [-1, 1): one per new token.
  void fill_queries(std::int32_t step, std::int32_t l) {
    queries.resize(static_cast<std::size_t>(qo[batch]) * q_heads * head_dim);
    for (std::size_t i = 0; i < queries.size(); ++i)
      queries[i] = static_cast<float>(mix(step, 400 + l, i) >> 40) * 0x1p-23f - 1.0f;
  }
  // Layer l's K and V elements of sequence b's slot t, every head, as bytes.
  row_bytes row(std::int32_t l, std::int32_t b, std::int32_t t) const {
    const std::size_t at = static_cast<std::size_t>(cells_of[b][t]) * kv_heads * head_dim;
    const std::size_t n = std::size_t{kv_heads} * head_dim;
    row_bytes out;
    const auto add = [&](const auto& pool) {
      const auto* p = reinterpret_cast<const unsigned char*>(pool.data() + at);
      out.insert(out.end(), p, p + n * sizeof(pool[0]));
    };
    if (type == element::f32) {
      add(k32[l]);
      add(v32[l]);
    } else {
      add(k16[l]);
      add(v16[l]);
    }
    return out;
  }
  // The oracle: what sequence b's slots [0, len - count) must hold after
  // compact, from the selection and the rows before it. preserve_order:
  // the survivors in order. fill_holes: the slots below the new length keep
  // their rows, and the holes among them (ascending) take the survivors at
  // or above it (ascending).
  std::vector<row_bytes> expected_rows(std::int32_t l, std::int32_t b) const {
    const std::int32_t len = length(b), count = counts[b], kept = len - count;
    const std::int32_t* list = slots.data() + static_cast<std::size_t>(b) * stride;
    const auto evicted_slot = [&](std::int32_t t) { return std::find(list, list + count, t) != list + count; };
    std::vector<row_bytes> out;
    if (mode == br::compaction::preserve_order) {
      for (std::int32_t t = 0; t < len; ++t)
        if (!evicted_slot(t)) out.push_back(row(l, b, t));
      return out;
    }
    std::vector<std::int32_t> above;
    for (std::int32_t t = kept; t < len; ++t)
      if (!evicted_slot(t)) above.push_back(t);
    std::size_t next = 0;
    for (std::int32_t t = 0; t < kept; ++t) out.push_back(row(l, b, evicted_slot(t) ? above[next++] : t));
    return out;
  }
  // Applies new_lengths: each sequence keeps its first new_lengths[b] cells
  // and frees the rest.
  void finish_step() {
    for (std::int32_t b = 0; b < batch; ++b) {
      while (length(b) > new_lengths[b]) {
        free_cells.push_back(cells_of[b].back());
        cells_of[b].pop_back();
      }
    }
  }
  // One step up to select (append, observe every layer once, select).
  template <class Side>
  void observe_and_select(Side& side, aligned_bytes& model, aligned_bytes& select_ws, std::int32_t step) {
    begin_step(step);
    const step_memory m = memory(model);
    for (std::int32_t l = 0; l < layers; ++l) {
      fill_queries(step, l);
      check(side.observe_queries(m, l, kv(l), queries.data(), queries.size(), qo.data()), "observe_queries");
    }
    for (auto* v : {&counts, &slots, &cache_slots, &new_lengths, &freed_pages}) std::fill(v->begin(), v->end(), -7);
    check(side.select(m, select_ws.data, select_ws.size, selection()), "select");
  }

  template <class Side>
  std::vector<step_record> run(Side& side) {
    aligned_bytes model(side.model_bytes(), 0xA5);
    check(side.reset(model.data, model.size), "reset");
    aligned_bytes select_ws(side.select_workspace_bytes(), 0xA5);
    aligned_bytes compact_ws(side.compact_workspace_bytes(), 0x5A);
    std::vector<step_record> records;
    for (std::int32_t step = 0; step < steps; ++step) {
      // A refused call leaves the engine unshrunk: stop before the pool runs dry.
      if (failed > 0) break;
      observe_and_select(side, model, select_ws, step);
      const step_memory m = memory(model);
      std::vector<std::vector<row_bytes>> expected(static_cast<std::size_t>(layers) * batch);
      for (std::int32_t l = 0; l < layers; ++l)
        for (std::int32_t b = 0; b < batch; ++b) expected[l * batch + b] = expected_rows(l, b);
      for (std::int32_t l = 0; l < layers; ++l)
        check(side.compact(m, l, kv(l), selection(), compact_ws.data, compact_ws.size), "compact");
      bool placed = true;
      for (std::int32_t b = 0; b < batch; ++b) {
        placed &= new_lengths[b] == length(b) - counts[b];
        for (std::int32_t l = 0; l < layers; ++l) {
          const std::vector<row_bytes>& want = expected[l * batch + b];
          placed &= static_cast<std::int32_t>(want.size()) == length(b) - counts[b];
          for (std::int32_t t = 0; t < static_cast<std::int32_t>(want.size()); ++t) placed &= row(l, b, t) == want[t];
        }
        evicted += counts[b];
        moved += counts[b] > 0 && slots[b * stride] < length(b) - counts[b];
      }
      char what[80];
      std::snprintf(what, sizeof what, "step %d: compact left every kept K/V row where the mode puts it", step);
      check(placed, what);
      finish_step();
      records.push_back({model.bytes(), pools(), counts, slots, cache_slots, new_lengths, freed_pages});
    }
    return records;
  }
};

void compare_runs(element type, br::compaction mode, const char* name) {
  bridge_side bridged(mode);
  reference_side reference;
  check(bridged.model_bytes() == reference.model_bytes(), "model_state_bytes matches the library's");
  check(bridged.select_workspace_bytes() == reference.select_workspace_bytes(),
        "select_workspace_bytes matches the library's");
  check(bridged.compact_workspace_bytes() == reference.compact_workspace_bytes() &&
            reference.compact_workspace_bytes() == static_cast<std::size_t>(cells),
        "compact_workspace_bytes matches the library's (a byte per cell)");
  engine a(type, mode), b(type, mode);
  const std::vector<step_record> through_bridge = a.run(bridged);
  const std::vector<step_record> direct = b.run(reference);
  check(through_bridge.size() == static_cast<std::size_t>(steps) && direct.size() == through_bridge.size(),
        "both runs complete every step");
  for (std::size_t s = 0; s < std::min(through_bridge.size(), direct.size()); ++s) {
    const step_record& x = through_bridge[s];
    const step_record& y = direct[s];
    char what[96];
    std::snprintf(what, sizeof what, "%s, step %zu", name, s);
    check(x.pools == y.pools, what, "K/V pool bytes differ");
    check(x.model == y.model, what, "model state bytes differ");
    check(x.counts == y.counts && x.slots == y.slots && x.cache_slots == y.cache_slots, what, "selection differs");
    check(x.new_lengths == y.new_lengths && x.freed_pages == y.freed_pages, what, "new lengths differ");
  }
  check(a.evicted > 40 && a.evicted == b.evicted, "the scenario evicts");
  check(a.moved > 10 && a.moved == b.moved, "compact moved kept rows into holes");
  std::printf("token level compact, %s: %zu steps, %d tokens evicted, %d compactions that moved rows\n", name,
              through_bridge.size(), a.evicted, a.moved);
}

// Refused compacts: invalid_argument naming `argument`, and nothing written
// (the model state, the K/V pools, the selection and the table
// byte-identical; the workspace is scratch).
struct refusals {
  bridge_side side{br::compaction::fill_holes};
  engine e{element::f32, br::compaction::fill_holes};
  aligned_bytes model{side.model_bytes(), 0xA5};
  aligned_bytes select_ws{side.select_workspace_bytes(), 0xA5};
  aligned_bytes compact_ws{side.compact_workspace_bytes(), 0x5A};

  // Steps until a selection whose compaction moves rows, in which both
  // sequences evict fewer than stride tokens (so sequence 0 leaves entries of
  // its stride unused, -7, and sequence 1's count fits stride - 1).
  bool prepare() {
    check(side.reset(model.data, model.size), "reset");
    for (std::int32_t step = 0; step < steps; ++step) {
      e.observe_and_select(side, model, select_ws, step);
      bool moves = false;
      for (std::int32_t b = 0; b < batch; ++b)
        moves |= e.counts[b] > 0 && e.slots[b * stride] < e.length(b) - e.counts[b];
      if (moves && e.counts[0] > 0 && e.counts[0] < stride && e.counts[1] > 0 && e.counts[1] < stride) return true;
      const step_memory m = e.memory(model);
      for (std::int32_t l = 0; l < layers; ++l)
        check(side.compact(m, l, e.kv(l), e.selection(), compact_ws.data, compact_ws.size), "compact");
      e.finish_step();
    }
    return false;
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
    const bool ready = prepare();
    check(ready, "refusals: a step whose selection moves rows, both sequences evicting fewer than stride tokens");
    if (!ready) return;
    const step_memory m = e.memory(model);
    const br::settings s = side.settings;
    const br::paged_cache<float> cache = side.cache(m, e.k32[0].data(), e.v32[0].data());
    const br::paged_cache<br::fp16_bits> cache16 = side.cache(m, e.k16[0].data(), e.v16[0].data());
    const br::state layer0 = side.model.layer(0);
    const br::selection sel = side.selection(e.selection());
    void* const ws = compact_ws.data;
    const std::size_t ws_bytes = compact_ws.size;
    check(ws_bytes == api::compact_workspace_bytes(cache) && ws_bytes == static_cast<std::size_t>(cells),
          "compact_workspace_bytes: a byte per cell");

    // The workspace.
    expect("compact: workspace below compact_workspace_bytes", "workspace",
           [&] { return api::compact(s, cache, layer0, sel, ws, ws_bytes - 1); });
    expect("compact: no workspace", "workspace", [&] { return api::compact(s, cache, layer0, sel, nullptr, 0); });
    expect("compact (fp16): workspace below compact_workspace_bytes", "workspace",
           [&] { return api::compact(s, cache16, layer0, sel, ws, ws_bytes - 1); });

    // V: present for compact (observe_queries' cache may leave it absent).
    br::paged_cache<float> c = cache;
    c.v_pages = nullptr;
    c.v_size = 0;
    expect("compact: V absent (null, size 0), as observe_queries allows", "cache.v_pages",
           [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });
    c = cache;
    c.v_size = 0;
    expect("compact: V empty (size 0)", "cache.v_pages", [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });
    c = cache;
    c.v_pages = nullptr;
    expect("compact: V null with a size", "cache.v_pages",
           [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });
    c = cache;
    c.v_size -= 1;
    expect("compact: V pool below its layout", "cache.v_pages",
           [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });
    c = cache;
    c.v_pages = c.k_pages;
    expect("compact: V aliasing K", "cache.v_pages", [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });
    br::paged_cache<br::fp16_bits> c16 = cache16;
    c16.v_pages = nullptr;
    c16.v_size = 0;
    expect("compact (fp16): V absent", "cache.v_pages",
           [&] { return api::compact(s, c16, layer0, sel, ws, ws_bytes); });
    c = cache;
    c.kv_heads = kv_heads - 1;
    expect("compact: a cache of another KV head count than the state", "state.shape.kv_heads",
           [&] { return api::compact(s, c, layer0, sel, ws, ws_bytes); });

    // The selection.
    br::selection bad = sel;
    bad.stride = -1;
    expect("compact: negative stride", "selection.stride",
           [&] { return api::compact(s, cache, layer0, bad, ws, ws_bytes); });
    bad = sel;
    bad.stride = 1;
    expect("compact: stride below a sequence's count", "selection.counts",
           [&] { return api::compact(s, cache, layer0, bad, ws, ws_bytes); });
    bad = sel;
    bad.stride = stride - 1;
    expect("compact: another stride than select wrote (sequence 1 read from sequence 0's unused entries)",
           "selection.slots", [&] { return api::compact(s, cache, layer0, bad, ws, ws_bytes); });
    bad = sel;
    bad.counts = nullptr;
    expect("compact: null counts", "selection.counts",
           [&] { return api::compact(s, cache, layer0, bad, ws, ws_bytes); });
    bad = sel;
    bad.slots = nullptr;
    expect("compact: null slots", "selection.slots", [&] { return api::compact(s, cache, layer0, bad, ws, ws_bytes); });
    {
      std::int32_t& last_entry = e.slots[static_cast<std::size_t>(e.counts[0]) - 1];
      const std::int32_t kept = last_entry;
      last_entry = e.length(0);
      expect("compact: a slot beyond the length", "selection.slots",
             [&] { return api::compact(s, cache, layer0, sel, ws, ws_bytes); });
      last_entry = e.length(0) - 1;  // the newest token: protected (recent)
      expect("compact: a protected slot", "selection.slots",
             [&] { return api::compact(s, cache, layer0, sel, ws, ws_bytes); });
      last_entry = kept;
    }

    // The settings and the state.
    br::settings per_layer;
    check_ok(cxx17_test::sh_f32::default_settings(&per_layer), "default_settings of the per-layer namespace");
    expect("compact: settings of another namespace's policy", "settings",
           [&] { return api::compact(per_layer, cache, layer0, sel, ws, ws_bytes); });
    expect("compact (fp16): settings not from default_settings", "settings",
           [&] { return api::compact(br::settings{}, cache16, layer0, sel, ws, ws_bytes); });
    expect("compact: model.layer(layers)", "state.buffer",
           [&] { return api::compact(s, cache, side.model.layer(layers), sel, ws, ws_bytes); });
    br::state small = layer0;
    small.bytes -= 1;
    expect("compact: a layer state below state_bytes", "state.bytes",
           [&] { return api::compact(s, cache, small, sel, ws, ws_bytes); });

    // The arguments refused above are accepted as they are, and the call
    // writes (so "nothing written" above could have failed); a layer
    // compacted twice no longer tracks the cache's length.
    const std::vector<unsigned char> model_before = model.bytes(), pools_before = e.pools();
    check_ok(api::compact(s, cache, layer0, sel, ws, ws_bytes), "compact: the refusals' baseline");
    check(model.bytes() != model_before && e.pools() != pools_before, "compact: the baseline moves K/V and state rows");
    expect("compact: a layer compacted twice", "state",
           [&] { return api::compact(s, cache, layer0, sel, ws, ws_bytes); });
    check_ok(api::compact(s, side.cache(m, e.k32[1].data(), e.v32[1].data()), side.model.layer(1), sel, ws, ws_bytes),
             "compact: layer 1");
    e.finish_step();
  }
};

}  // namespace

int main() {
  compare_runs(element::f32, br::compaction::fill_holes, "float K/V, fill_holes");
  compare_runs(element::f32, br::compaction::preserve_order, "float K/V, preserve_order");
  compare_runs(element::f16, br::compaction::fill_holes, "fp16 K/V, fill_holes");
  compare_runs(element::f16, br::compaction::preserve_order, "fp16 K/V, preserve_order");
  refusals r;
  r.run();
  return finish();
}
