// observe_queries with a sliding window measured in positions
// (window_unit::positions), the way llama.cpp masks its sliding-window
// layers: over a llama.cpp-like pool of cells (page size 1, each
// sequence's cells in position order) from which select + forget remove
// tokens, so that the positions have holes and a window of W positions
// holds fewer than W + 1 slots. The reference is observe_probabilities fed
// with probabilities the test computes in double from the same queries and
// keys, a key visible when its position is within W of the query's. K is
// fp32 or fp16 bits (llama.cpp's cache type); V is absent, as observe
// never reads it. Blocked path (plain logits) and unblocked path (soft
// cap), with the LSE given and without.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;

using mass_policy = sh::with_granularity<sh::eviction_policy<sh::attention_mass, sh::unbounded_history>,
                                         sh::shared_layers<>>;

// A binary16 value from its fields, in double (independent of the
// library's bit manipulation): subnormal, normal, infinity or NaN.
double decode_fp16(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 31, mantissa = bits & 1023;
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Finite binary16 bits from a hash: magnitudes from subnormal to 2^3.
sh::fp16_bits fp16_of_hash(std::uint64_t h) {
  const auto exponent = static_cast<std::uint16_t>((h >> 20) % 18);  // 0 (subnormal) .. 17 (2^2)
  return {static_cast<std::uint16_t>(((h >> 40) & 1u) << 15 | exponent << 10 | (h & 1023u))};
}

struct window_case {
  std::int32_t head_dim, group, window;
  float soft_cap;  // > 0: the unblocked path
  bool fp16_keys;
};

template <class K>
void run_window_case(const window_case& wc) {
  INFO("head_dim " << wc.head_dim << ", group " << wc.group << ", window " << wc.window << " positions, soft cap "
                   << wc.soft_cap << ", fp16 K " << wc.fp16_keys);
  constexpr std::int32_t batch = 2, kv_heads = 2, cells = 96, budget = 20, chunk_prefill = 9, steps = 60;
  const std::int32_t d = wc.head_dim, q_heads = kv_heads * wc.group;
  mass_policy policy;
  policy.config.recent = 2;
  policy.config.evict_count = 3;
  const std::int32_t capacity = sh::state_capacity_for(budget, chunk_prefill);
  const sh::state_shape shape{batch, kv_heads, capacity, policy.ring_words()};
  model_holder reference(shape, 1), with_lse(shape, 1), without(shape, 1);

  // The pool of cells: K [cell][head][d]; a free list; per sequence its
  // cells and positions in position order.
  std::vector<K> k_pool(static_cast<std::size_t>(cells * kv_heads * d));
  std::vector<float> k_exact(k_pool.size());  // what the pool holds, as float
  std::vector<std::int32_t> free_cells;
  for (std::int32_t c = cells - 1; c >= 0; --c) free_cells.push_back(c);
  scramble(free_cells, 3);
  std::vector<std::vector<std::int32_t>> held_cells(batch), held_positions(batch);
  std::vector<std::int32_t> next_position(batch, 0);
  std::vector<std::int32_t> indptr(batch + 1), indices, last_page_len(batch);
  const auto build_table = [&] {
    indices.clear();
    for (std::int32_t b = 0; b < batch; ++b) {
      indptr[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(indices.size());
      indices.insert(indices.end(), held_cells[static_cast<std::size_t>(b)].begin(),
                     held_cells[static_cast<std::size_t>(b)].end());
      last_page_len[static_cast<std::size_t>(b)] = held_cells[static_cast<std::size_t>(b)].empty() ? 0 : 1;
    }
    indptr[batch] = static_cast<std::int32_t>(indices.size());
  };
  std::int64_t compared = 0, holes_in_window = 0;
  // The LSE's sums (lse_check) tell the units apart where holes make the
  // windows differ: each step a scratch copy of the LSE-given state, made
  // to sample (step 255), is observed with the window in slots.
  model_holder scratch(shape, 1);
  std::int64_t unit_refused = 0, unit_differs = 0;
  double worst = 0.0;
  for (std::int32_t step = 0; step < steps; ++step) {
    INFO("step " << step);
    // Sequence 0 prefills 9 tokens then decodes one a step; sequence 1
    // starts at step 3 and appends two a step.
    std::vector<std::int32_t> q_len(batch, 0);
    q_len[0] = step == 0 ? chunk_prefill : 1;
    q_len[1] = step < 3 ? 0 : 2;
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t n = 0; n < q_len[static_cast<std::size_t>(b)]; ++n) {
        const std::int32_t cell = free_cells.back();
        free_cells.pop_back();
        const std::int32_t position = next_position[static_cast<std::size_t>(b)]++;
        held_cells[static_cast<std::size_t>(b)].push_back(cell);
        held_positions[static_cast<std::size_t>(b)].push_back(position);
        for (std::int32_t h = 0; h < kv_heads; ++h)
          for (std::int32_t x = 0; x < d; ++x) {
            const std::size_t at = (static_cast<std::size_t>(cell) * kv_heads + h) * d + x;
            if constexpr (std::is_same_v<K, float>) {
              k_pool[at] = 2.0f * token_value(0, b, h, position, x);
              k_exact[at] = k_pool[at];
            } else {
              k_pool[at] = fp16_of_hash(hash_of({5, b, h, position, x}));
              k_exact[at] = static_cast<float>(decode_fp16(k_pool[at].bits));
            }
          }
      }
    build_table();
    std::vector<std::int32_t> qo_indptr(batch + 1, 0);
    for (std::int32_t b = 0; b < batch; ++b)
      qo_indptr[static_cast<std::size_t>(b) + 1] = qo_indptr[static_cast<std::size_t>(b)] + q_len[static_cast<std::size_t>(b)];
    const std::int32_t tokens = qo_indptr[batch];
    // Queries [token][q_head][d], ragged.
    std::vector<float> q(static_cast<std::size_t>(tokens * q_heads * d));
    for (std::size_t i = 0; i < q.size(); ++i)
      q[i] = 3.0f * (2.0f * static_cast<float>(unit(hash_of({91, step, static_cast<std::int64_t>(i)}))) - 1.0f);
    const std::int32_t columns = capacity;
    std::vector<float> probs(static_cast<std::size_t>(tokens * q_heads * columns), 0.0f);
    std::vector<float> lse(static_cast<std::size_t>(tokens * q_heads));
    bool last_differs = false;  // sequence 0's last query: its window by slot shows other keys
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto& pos = held_positions[static_cast<std::size_t>(b)];
      const auto len = static_cast<std::int32_t>(pos.size());
      for (std::int32_t j = 0; j < q_len[static_cast<std::size_t>(b)]; ++j) {
        const std::int32_t i = len - q_len[static_cast<std::size_t>(b)] + j;  // the query's slot
        const std::int32_t token = qo_indptr[static_cast<std::size_t>(b)] + j;
        std::int32_t by_slot = 0, by_position = 0;  // keys of head 0's window
        for (std::int32_t qh = 0; qh < q_heads; ++qh) {
          const float* qrow = q.data() + (static_cast<std::size_t>(token) * q_heads + qh) * d;
          std::vector<double> logit(static_cast<std::size_t>(i + 1), -INFINITY);
          double top = -INFINITY;
          for (std::int32_t t = 0; t <= i; ++t) {
            if (qh == 0) by_slot += i - t <= wc.window, by_position += pos[t] >= pos[i] - wc.window;
            if (pos[static_cast<std::size_t>(t)] < pos[static_cast<std::size_t>(i)] - wc.window) continue;
            const std::int32_t cell = held_cells[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)];
            const float* k = k_exact.data() + (static_cast<std::size_t>(cell) * kv_heads + qh / wc.group) * d;
            double dot = 0.0;
            for (std::int32_t x = 0; x < d; ++x) dot += static_cast<double>(qrow[x]) * static_cast<double>(k[x]);
            double x = dot * scale;
            if (wc.soft_cap > 0.0f) x = wc.soft_cap * std::tanh(x / wc.soft_cap);
            logit[static_cast<std::size_t>(t)] = x;
            top = std::max(top, x);
          }
          double sum = 0.0;
          for (double l : logit) sum += std::exp(l - top);
          const double norm = top + std::log(sum);
          lse[static_cast<std::size_t>(token) * q_heads + qh] = static_cast<float>(norm);
          for (std::int32_t t = 0; t <= i; ++t)
            probs[(static_cast<std::size_t>(token) * q_heads + qh) * columns + t] =
                static_cast<float>(std::exp(logit[static_cast<std::size_t>(t)] - norm));
        }
        holes_in_window += by_slot != by_position;
        if (b == 0 && j == q_len[0] - 1) last_differs = by_slot != by_position;
      }
    }
    const auto qo = sh::host_span<const std::int32_t>(qo_indptr.data(), qo_indptr.size());
    const auto table = sh::make_token_table_view<host>({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                                       {last_page_len.data(), last_page_len.size()}, batch, kv_heads,
                                                       1, cells, capacity);
    const auto keys = sh::paged_kv_view<K, host>{{k_pool.data(), k_pool.size()},
                                                 {},  // V absent: observe reads only K
                                                 sh::paged_layout::nhd(1, kv_heads, d),
                                                 sh::paged_layout::nhd(1, kv_heads, d),
                                                 {indptr.data(), indptr.size()},
                                                 {indices.data(), indices.size()},
                                                 {last_page_len.data(), last_page_len.size()},
                                                 batch,
                                                 kv_heads,
                                                 d,
                                                 1,
                                                 cells,
                                                 capacity};
    sh::host::observe_probabilities(policy, table, reference.model.layer(0),
                                    sh::probability_view<host>::ragged({probs.data(), probs.size()}, qo, q_heads,
                                                                       columns));
    sh::attention_options<host> options;
    options.window_left = wc.window;
    options.window_left_unit = sh::window_unit::positions;
    options.logits_soft_cap = wc.soft_cap;
    const auto queries = sh::query_view<float, host>::ragged({q.data(), q.size()}, qo, q_heads, d);
    const auto lse_given = sh::lse_view<host>::ragged({lse.data(), lse.size()}, qo, q_heads, sh::lse_base::natural);
    if (wc.window > 0 && step > 0) {  // (sequence 1's row samples only its first call, before any hole)
      std::memcpy(scratch.buffer.data(), with_lse.buffer.data(), with_lse.buffer.size());
      scratch.model.layer(0).step[0] = 255;
      sh::attention_options<host> by_slots = options;
      by_slots.window_left_unit = sh::window_unit::slots;
      bool refused = false;
      try {
        sh::host::observe_queries(policy, keys, scratch.model.layer(0), queries, lse_given, by_slots);
      } catch (const sh::invalid_argument& e) {
        refused = true;
        CHECK(std::string(e.argument()) == "lse");
      }
      if (!last_differs) CHECK_FALSE(refused);  // the same keys: the same sums
      unit_differs += last_differs;
      unit_refused += refused;
    }
    sh::host::observe_queries(policy, keys, with_lse.model.layer(0), queries, lse_given, options);
    sh::host::observe_queries(policy, keys, without.model.layer(0), queries, {}, options);
    for (const model_holder* other : {&with_lse, &without}) {
      INFO((other == &with_lse ? "lse given" : "no lse"));
      const auto want = reference.model.layer(0), got = other->model.layer(0);
      for (std::int32_t b = 0; b < batch; ++b) {
        REQUIRE(got.step[b] == want.step[b]);
        REQUIRE(got.tracked[b] == want.tracked[b]);
        for (std::int32_t h = 0; h < kv_heads; ++h)
          for (std::int32_t t = 0; t < static_cast<std::int32_t>(held_cells[static_cast<std::size_t>(b)].size()); ++t) {
            const auto at = want.row_index(b, h, t);
            REQUIRE(got.positions[at] == want.positions[at]);
            REQUIRE(want.positions[at] == held_positions[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)]);
            REQUIRE(same_bits(got.observed[at], want.observed[at]));
            const double w = want.scores[at], g = got.scores[at];
            INFO("sequence " << b << " head " << h << " slot " << t << ": " << g << " vs " << w);
            REQUIRE(std::abs(g - w) <= 2e-5 * w + 1e-30);
            if (w > 1e-30) worst = std::max(worst, std::abs(g - w) / w);
            ++compared;
          }
      }
    }
    // At the budget: select on the reference, forget on all three with
    // the table of before the removal, then the engine drops the cells.
    const std::int32_t stride = sh::max_evictions(capacity, budget, policy.config.evict_count);
    std::vector<std::int32_t> counts(batch), slots(static_cast<std::size_t>(batch * stride)),
        cache_slots(slots.size()), new_lengths(batch), freed(batch);
    const sh::eviction_selection<host> selection{stride,
                                                 {counts.data(), counts.size()},
                                                 {slots.data(), slots.size()},
                                                 {cache_slots.data(), cache_slots.size()},
                                                 {{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}}};
    aligned_bytes workspace(sh::host::select_workspace_bytes(table, shape));
    sh::host::select(policy, table, reference.model, budget, workspace.span(), selection);
    for (const model_holder* m : {&reference, &with_lse, &without})
      sh::host::forget(policy, table, m->model.layer(0), selection);
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t k = counts[static_cast<std::size_t>(b)] - 1; k >= 0; --k) {
        const auto slot = static_cast<std::size_t>(slots[static_cast<std::size_t>(b * stride + k)]);
        auto& cs = held_cells[static_cast<std::size_t>(b)];
        REQUIRE(cache_slots[static_cast<std::size_t>(b * stride + k)] == cs[slot]);
        free_cells.push_back(cs[slot]);
        cs.erase(cs.begin() + static_cast<std::ptrdiff_t>(slot));
        held_positions[static_cast<std::size_t>(b)].erase(held_positions[static_cast<std::size_t>(b)].begin() +
                                                          static_cast<std::ptrdiff_t>(slot));
      }
  }
  INFO("worst relative difference " << worst << ", " << holes_in_window << " queries whose window by slot differs");
  CHECK(compared > 2000);
  CHECK(worst > 0.0);  // different computations, not a copy
  // Eviction made holes inside windows: a window by slot would have
  // shown those queries other keys.
  if (wc.window > 0) CHECK(holes_in_window > 20);
  INFO(unit_refused << " of " << unit_differs << " sampled calls whose window by slot differs were refused");
  if (wc.window > 0) CHECK(unit_refused > 0);
}

}  // namespace

TEST_CASE("observe_queries: a window in positions over a cache with holes (blocked path)",
          "[observe_queries][attention_options][window_positions]") {
  run_window_case<float>({16, 2, 6, 0.0f, false});
  run_window_case<float>({13, 3, 0, 0.0f, false});  // each query sees only itself
  run_window_case<sh::fp16_bits>({16, 4, 9, 0.0f, true});
}

TEST_CASE("observe_queries: a window in positions over a cache with holes (unblocked path)",
          "[observe_queries][attention_options][window_positions]") {
  run_window_case<float>({16, 2, 6, 4.0f, false});
  run_window_case<sh::fp16_bits>({8, 2, 5, 4.0f, true});
}

TEST_CASE("fp16_bits and bf16_bits convert every value exactly", "[element]") {
  std::int64_t checked = 0;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const auto u = static_cast<std::uint16_t>(bits);
    const double want = decode_fp16(u);
    const float got = sh::to_float(sh::fp16_bits{u});
    INFO("fp16 bits " << bits);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(static_cast<double>(got) == want);  // every binary16 value is a float
      REQUIRE(std::signbit(got) == std::signbit(want));
    }
    // bfloat16: the upper half of a float.
    const float bf = sh::to_float(sh::bf16_bits{u});
    const std::uint32_t widened = bits << 16;
    float want_bf;
    std::memcpy(&want_bf, &widened, sizeof want_bf);
    if (std::isnan(want_bf)) {
      REQUIRE(std::isnan(bf));
    } else {
      REQUIRE(same_bits(bf, want_bf));
    }
    ++checked;
  }
  CHECK(checked == 65536);
  // A row at a time (F16C where the build has it): the same values.
  std::vector<sh::fp16_bits> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i].bits = static_cast<std::uint16_t>(i * 40503u);
  std::vector<float> rows(all.size());
  sh::binary16_to_float(all.data(), static_cast<std::int32_t>(all.size()), rows.data());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float one = sh::to_float(all[i]);
    INFO("value " << i);
    if (std::isnan(one)) {
      REQUIRE(std::isnan(rows[i]));
    } else {
      REQUIRE(same_bits(rows[i], one));
    }
  }
}
