// Token-level eviction (granularity.hpp) against the brute-force oracle:
// shared_heads through compress, shared_layers through select + compact
// (block tables) or select + forget (slot lists), over contiguous and paged
// caches, both compaction modes, several reductions and policies, with
// pinned prefixes. The test keeps its own slot -> position map per sequence
// and applies the documented compaction rules itself, so the library's
// moves, selection and scores are all checked against independent code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "oracle.hpp"
#include "policies.hpp"
#include "support.hpp"

namespace {

using namespace sh_test;

// The oracle's combined score of the token at `position` over the given
// layers' oracles (heads in order, then layers in order), written from the
// definition in granularity.hpp.
template <class HeadR, class LayerR, class Oracle>
float combined_score(std::vector<Oracle>& oracles, std::int32_t b, std::int32_t kv_heads, std::int32_t position,
                     bool over_layers) {
  float layer_acc = LayerR::identity();
  float only = 0.0f;
  for (std::size_t l = 0; l < oracles.size(); ++l) {
    float head_acc = HeadR::identity();
    for (std::int32_t h = 0; h < kv_heads; ++h) {
      REQUIRE(oracles[l].find(b, h, position) != nullptr);
      const float s = oracles[l].ranked_score(b, h, position);
      if constexpr (std::is_same_v<HeadR, sh::max_score>)
        head_acc = (head_acc != head_acc || s != s) ? NAN : std::max(head_acc, s);
      else
        head_acc = head_acc + s;
    }
    const float per_layer =
        std::is_same_v<HeadR, sh::max_score> ? head_acc : head_acc / static_cast<float>(kv_heads);
    only = per_layer;
    if constexpr (std::is_same_v<LayerR, sh::max_score>)
      layer_acc = (layer_acc != layer_acc || per_layer != per_layer) ? NAN : std::max(layer_acc, per_layer);
    else
      layer_acc = layer_acc + per_layer;
  }
  if (!over_layers) return only;
  return std::is_same_v<LayerR, sh::max_score> ? layer_acc : layer_acc / static_cast<float>(oracles.size());
}

enum class apply_mode { compress_layer, compact, forget };

struct scenario {
  std::int32_t layers = 2, batch = 2, kv_heads = 2, group = 2, head_dim = 4, budget = 12, chunk = 1, steps = 40;
  std::int32_t page_size = 0;  // 0: contiguous
  std::int32_t pinned = 0;     // first tokens of sequence 0 pinned (select only)
  sh::compaction mode = sh::compaction::fill_holes;
  apply_mode apply = apply_mode::compact;
  std::uint64_t seed = 1;
  std::int32_t pool_width = 1;  // > 1 needs preserve_order
  sh::pooling pool_mode = sh::pooling::mean;
};

// Finds the layer reduction of a granularity (mean for shared_heads).
template <class G>
struct layer_reduction_of {
  using type = sh::mean_score;
};
template <class H, class L>
struct layer_reduction_of<sh::shared_layers<H, L>> {
  using type = L;
};

template <class Policy, class Cache>
void drive(const Policy& policy, const scenario& sc, std::vector<Cache>& caches) {
  using G = typename Policy::granularity;
  using HeadR = typename G::head_reduction;
  using LayerR = typename layer_reduction_of<G>::type;
  constexpr bool over_layers = G::kind == sh::granularity_kind::shared_layers;
  constexpr bool paged = requires { caches[0].page_size; };
  const std::int32_t L = sc.layers, B = sc.batch, H = sc.kv_heads, q_heads = H * sc.group;
  const std::int32_t m = policy.config.evict_count;

  // The model state: one layer state per layer (shared_heads: one per layer too).
  const sh::state_shape shape{B, H, sh::state_capacity_for(sc.budget, sc.chunk), policy.ring_words()};
  aligned_bytes model_buffer(sh::model_state_bytes(shape, L));
  const auto model = sh::make_model_state(model_buffer.span(), shape, L);
  sh::host::reset_state(model);
  std::vector<oracle<Policy>> oracles;
  for (std::int32_t l = 0; l < L; ++l) oracles.emplace_back(policy, B, H, sc.group);

  // The test's own slot -> position map per sequence (identical in every
  // layer and head at these granularities).
  std::vector<std::vector<std::int32_t>> slot_pos(static_cast<std::size_t>(B));
  const auto head_id = [&](std::int32_t l, std::int32_t h) { return l * 16 + h; };
  const auto key = [&](std::int32_t l) {
    return [&, l](std::int32_t b, std::int32_t h, std::int32_t position) {
      static thread_local std::vector<float> row;
      row.resize(static_cast<std::size_t>(sc.head_dim));
      for (std::int32_t d = 0; d < sc.head_dim; ++d) row[static_cast<std::size_t>(d)] = token_value(0, b, head_id(l, h), position, d);
      return row.data();
    };
  };

  aligned_bytes workspace(std::max(sh::host::select_workspace_bytes(caches[0].view(), shape),
                                   sh::host::compress_workspace_bytes(caches[0].view(), shape)) +
                          sh::host::compact_workspace_bytes(caches[0].view()) + 64);
  aligned_bytes compact_ws(sh::host::compact_workspace_bytes(caches[0].view()) + 8);
  const std::int32_t stride = sh::max_evictions(shape.capacity, sc.budget, m);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(B)), slots(static_cast<std::size_t>(B * stride)),
      cache_slots(static_cast<std::size_t>(B * stride)), pinned(static_cast<std::size_t>(B), 0);

  for (std::int32_t step = 0; step < sc.steps; ++step) {
    const std::int32_t q_len = 1 + static_cast<std::int32_t>(hash_of({static_cast<std::int64_t>(sc.seed), step}) %
                                                             static_cast<std::uint64_t>(sc.chunk));
    // Append q_len tokens to every sequence in every layer.
    for (std::int32_t b = 0; b < B; ++b) {
      const std::int32_t first = oracles[0].next_position(b);
      for (std::int32_t i = 0; i < q_len; ++i) {
        std::int32_t slot = -1;
        for (std::int32_t l = 0; l < L; ++l) {
          slot = caches[static_cast<std::size_t>(l)].append(b);
          for (std::int32_t h = 0; h < H; ++h)
            for (int kind = 0; kind < 2; ++kind)
              for (std::int32_t d = 0; d < sc.head_dim; ++d)
                caches[static_cast<std::size_t>(l)].row(kind, b, h, slot)[d] =
                    token_value(kind, b, head_id(l, h), first + i, d);
        }
        REQUIRE(slot == static_cast<std::int32_t>(slot_pos[static_cast<std::size_t>(b)].size()));
        slot_pos[static_cast<std::size_t>(b)].push_back(first + i);
      }
      for (std::int32_t l = 0; l < L; ++l)
        oracles[static_cast<std::size_t>(l)].admit(b, q_len, sc.head_dim,
                                                   [&](std::int32_t h, std::int32_t p) { return key(l)(b, h, p); });
    }
    // Observe every layer with its own probabilities.
    std::int32_t max_len = 0;
    for (std::int32_t b = 0; b < B; ++b) max_len = std::max(max_len, caches[0].length(b));
    for (std::int32_t l = 0; l < L; ++l) {
      std::vector<float> probs(static_cast<std::size_t>(B * q_heads * q_len * max_len), 0.0f);
      const auto at = [&](std::int32_t b, std::int32_t qh, std::int32_t j, std::int32_t t) -> float& {
        return probs[static_cast<std::size_t>(((b * q_heads + qh) * q_len + j) * max_len + t)];
      };
      for (std::int32_t b = 0; b < B; ++b) {
        const std::int32_t len = caches[0].length(b);
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t j = 0; j < q_len; ++j) {
            const std::int32_t visible = len - q_len + j + 1;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) {
              const std::int32_t p = slot_pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)];
              // Some exact ties (coarse values) to exercise the tie-break.
              const float w = 0.05f + static_cast<float>(hash_of({static_cast<std::int64_t>(sc.seed), l, b, qh, step, j, p}) % 8);
              at(b, qh, j, t) = w;
              sum += w;
            }
            for (std::int32_t t = 0; t < visible; ++t) at(b, qh, j, t) /= sum;
          }
        std::vector<float> by_position(static_cast<std::size_t>(oracles[0].next_position(b)) * static_cast<std::size_t>(q_heads * q_len), 0.0f);
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t j = 0; j < q_len; ++j)
            for (std::int32_t t = 0; t < len - q_len + j + 1; ++t)
              by_position[static_cast<std::size_t>((qh * q_len + j)) * static_cast<std::size_t>(oracles[0].next_position(b)) +
                          static_cast<std::size_t>(slot_pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)])] =
                  at(b, qh, j, t);
        oracles[static_cast<std::size_t>(l)].observe(b, q_len, [&](std::int32_t qh, std::int32_t j, std::int32_t p) {
          return by_position[static_cast<std::size_t>((qh * q_len + j)) * static_cast<std::size_t>(oracles[0].next_position(b)) +
                             static_cast<std::size_t>(p)];
        });
      }
      const auto view = sh::probability_view<host>::dense({probs.data(), probs.size()}, q_heads, q_len, max_len);
      sh::host::observe_probabilities(policy, caches[static_cast<std::size_t>(l)].view(), model.layer(l), view);
    }

    // The oracle's choice: per sequence at the budget, the unprotected,
    // unpinned tokens by (combined score, position).
    std::vector<std::vector<std::int32_t>> expected(static_cast<std::size_t>(B));
    std::vector<std::int32_t> new_lengths(static_cast<std::size_t>(B));
    for (std::int32_t b = 0; b < B; ++b) {
      const std::int32_t len = caches[0].length(b);
      new_lengths[static_cast<std::size_t>(b)] = sh::length_after_compress(len, sc.budget, m);
      pinned[static_cast<std::size_t>(b)] = b == 0 ? std::min(sc.pinned, len) : 0;
      if (len < sc.budget) continue;
      std::vector<std::pair<float, std::int32_t>> order;
      for (const auto& t : oracles[0].tokens(b, 0)) {
        if (oracles[0].is_protected(b, t.position)) continue;
        if (b == 0 && t.position < sc.pinned) continue;  // sequence 0 starts at position 0
        order.emplace_back(combined_score<HeadR, LayerR>(oracles, b, H, t.position, over_layers), t.position);
      }
      std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
        const std::uint32_t bx = sh::detail::ordered_bits(x.first), by = sh::detail::ordered_bits(y.first);
        return bx != by ? bx < by : x.second < y.second;
      });
      const std::int32_t evict = len - sc.budget + m;
      REQUIRE(static_cast<std::int32_t>(order.size()) >= evict);
      for (std::int32_t k = 0; k < evict; ++k) expected[static_cast<std::size_t>(b)].push_back(order[static_cast<std::size_t>(k)].second);
    }

    // The library's choice, applied.
    std::vector<std::vector<std::int32_t>> evicted_slots(static_cast<std::size_t>(B));
    if constexpr (!over_layers) {
      REQUIRE(sc.apply == apply_mode::compress_layer);
      for (std::int32_t l = 0; l < L; ++l) {
        auto out = caches[static_cast<std::size_t>(l)].output();
        sh::host::compress(policy, caches[static_cast<std::size_t>(l)].view(), model.layer(l), sc.budget,
                           workspace.span(), out);
        REQUIRE(caches[static_cast<std::size_t>(l)].reported == new_lengths);
      }
      // Which slots went: compare the state's positions with the test's map.
      for (std::int32_t b = 0; b < B; ++b) {
        std::vector<std::int32_t> before = slot_pos[static_cast<std::size_t>(b)];
        std::set<std::int32_t> kept;
        const auto st = model.layer(0);
        for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t) kept.insert(st.positions[st.index(b, 0, t)]);
        for (std::size_t t = 0; t < before.size(); ++t)
          if (!kept.count(before[t])) evicted_slots[static_cast<std::size_t>(b)].push_back(static_cast<std::int32_t>(t));
      }
      for (std::int32_t l = 0; l < L; ++l) REQUIRE(caches[static_cast<std::size_t>(l)].after_compress(new_lengths).empty());
    } else {
      REQUIRE(sc.apply != apply_mode::compress_layer);
      std::fill(counts.begin(), counts.end(), -5);
      std::fill(slots.begin(), slots.end(), -5);
      std::fill(cache_slots.begin(), cache_slots.end(), -5);
      auto out = caches[0].output();
      // A slot-list engine (page size 1) frees cache_slots, never trailing
      // pages: freed_pages is optional there and this engine leaves it out.
      if (sc.apply == apply_mode::forget) out.freed_pages = {};
      sh::eviction_selection<host> sel{stride, {counts.data(), counts.size()}, {slots.data(), slots.size()},
                                       {cache_slots.data(), cache_slots.size()}, out};
      const auto cache0 = caches[0].view();
      sh::host::select(policy, cache0, model, sc.budget, workspace.span(), sel,
                       sh::host_span<const std::int32_t>(pinned.data(), pinned.size()));
      REQUIRE(caches[0].reported == new_lengths);
      for (std::int32_t b = 0; b < B; ++b) {
        const std::int32_t len = caches[0].length(b);
        const std::int32_t c = counts[static_cast<std::size_t>(b)];
        REQUIRE(c == len - new_lengths[static_cast<std::size_t>(b)]);
        for (std::int32_t k = 0; k < c; ++k) {
          const std::int32_t t = slots[static_cast<std::size_t>(b * stride + k)];
          REQUIRE((k == 0 || t > slots[static_cast<std::size_t>(b * stride + k - 1)]));
          evicted_slots[static_cast<std::size_t>(b)].push_back(t);
          // The engine's slot id of that token.
          std::int32_t id = t;
          if constexpr (paged)
            id = caches[0].pages[static_cast<std::size_t>(b)][static_cast<std::size_t>(t / sc.page_size)] * sc.page_size +
                 t % sc.page_size;
          REQUIRE(cache_slots[static_cast<std::size_t>(b * stride + k)] == id);
        }
      }
      if (sc.apply == apply_mode::compact) {
        for (std::int32_t l = 0; l < L; ++l)
          sh::host::compact(policy, caches[static_cast<std::size_t>(l)].view(), model.layer(l), sel, compact_ws.span());
        for (std::int32_t l = 0; l < L; ++l) {
          caches[static_cast<std::size_t>(l)].reported = caches[0].reported;
          caches[static_cast<std::size_t>(l)].freed = caches[0].freed;
          REQUIRE(caches[static_cast<std::size_t>(l)].after_compress(new_lengths).empty());
        }
      } else {
        // A slot-list engine (page size 1): drop the freed entries from each
        // sequence's list, keeping the order, and hand them back.
        if constexpr (paged) {
          for (std::int32_t l = 0; l < L; ++l) {
            sh::host::forget(policy, caches[static_cast<std::size_t>(l)].view(), model.layer(l), sel);
            auto& c = caches[static_cast<std::size_t>(l)];
            for (std::int32_t b = 0; b < B; ++b) {
              auto& list = c.pages[static_cast<std::size_t>(b)];
              const auto& gone = evicted_slots[static_cast<std::size_t>(b)];
              for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
                c.free_list.push_back(list[static_cast<std::size_t>(*it)]);
                list.erase(list.begin() + *it);
              }
              c.lengths[static_cast<std::size_t>(b)] = new_lengths[static_cast<std::size_t>(b)];
            }
          }
        }
      }
    }

    // The selection is the oracle's, as a set of positions.
    for (std::int32_t b = 0; b < B; ++b) {
      std::vector<std::int32_t> got;
      for (std::int32_t t : evicted_slots[static_cast<std::size_t>(b)])
        got.push_back(slot_pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)]);
      std::sort(got.begin(), got.end());
      auto want = expected[static_cast<std::size_t>(b)];
      std::sort(want.begin(), want.end());
      INFO("step " << step << " sequence " << b);
      REQUIRE(got == want);
      for (std::int32_t l = 0; l < L; ++l)
        for (std::int32_t h = 0; h < H; ++h)
          std::erase_if(oracles[static_cast<std::size_t>(l)].tokens(b, h), [&](const auto& t) {
            return std::find(want.begin(), want.end(), t.position) != want.end();
          });
      // The test's own compaction of its slot map (forget keeps the order).
      compact_slot_map(slot_pos[static_cast<std::size_t>(b)], evicted_slots[static_cast<std::size_t>(b)],
                       sc.apply == apply_mode::forget ? sh::compaction::preserve_order : sc.mode);
    }

    // Every layer and head holds exactly the test's map: K/V rows
    // bit-identical (slot-list engines: the rows never moved, the lists
    // did), positions, and scores bit-identical to the oracle's.
    for (std::int32_t l = 0; l < L; ++l) {
      const auto st = model.layer(l);
      auto& c = caches[static_cast<std::size_t>(l)];
      for (std::int32_t b = 0; b < B; ++b) {
        const auto& map = slot_pos[static_cast<std::size_t>(b)];
        REQUIRE(c.length(b) == static_cast<std::int32_t>(map.size()));
        REQUIRE(st.tracked[b] == c.length(b));
        for (std::int32_t h = 0; h < H; ++h)
          for (std::size_t t = 0; t < map.size(); ++t) {
            const auto slot = static_cast<std::int32_t>(t);
            INFO("layer " << l << " sequence " << b << " head " << h << " slot " << t);
            REQUIRE(st.positions[st.index(b, h, slot)] == map[t]);
            for (int kind = 0; kind < 2; ++kind)
              for (std::int32_t d = 0; d < sc.head_dim; ++d)
                REQUIRE(same_bits(c.row(kind, b, h, slot)[d], token_value(kind, b, head_id(l, h), map[t], d)));
            const auto* o = oracles[static_cast<std::size_t>(l)].find(b, h, map[t]);
            REQUIRE(o != nullptr);
            REQUIRE(same_bits(st.scores[st.index(b, h, slot)], o->score));
            REQUIRE(same_bits(st.observed[st.index(b, h, slot)], o->observed));
          }
      }
    }
  }
}

template <class Policy>
Policy configured(const scenario& sc, std::int32_t recent = 3) {
  Policy p;
  p.config.recent = recent;
  p.config.evict_count = 2;
  p.config.compaction_mode = sc.mode;
  p.config.pool_width = sc.pool_width;
  p.config.pool_mode = sc.pool_mode;
  if constexpr (std::is_same_v<typename Policy::history, sh::sliding_window>) p.config.window = 6;
  return p;
}

template <class Policy>
void run_contiguous(const scenario& sc) {
  std::vector<contiguous_cache> caches;
  const std::int32_t capacity = sh::state_capacity_for(sc.budget, sc.chunk) + 2;
  for (std::int32_t l = 0; l < sc.layers; ++l)
    caches.push_back(make_contiguous(l % 2 ? layout_kind::hnd : layout_kind::nhd, sc.batch, sc.kv_heads, sc.head_dim,
                                     capacity, sc.seed));
  drive(configured<Policy>(sc), sc, caches);
}

template <class Policy>
void run_paged(const scenario& sc) {
  std::vector<paged_cache> caches;
  const std::int32_t capacity = sh::state_capacity_for(sc.budget, sc.chunk) + sc.page_size;
  for (std::int32_t l = 0; l < sc.layers; ++l) {
    const auto nhd = sh::paged_layout::nhd(sc.page_size, sc.kv_heads, sc.head_dim);
    const auto hnd = sh::paged_layout::hnd(sc.page_size, sc.kv_heads, sc.head_dim);
    // Same seed: every layer's pool hands out the same pages, as one shared
    // block table does.
    caches.emplace_back(sc.batch, sc.kv_heads, sc.head_dim, sc.page_size, capacity, l % 2 ? hnd : nhd,
                        l % 2 ? hnd : nhd, sc.seed);
  }
  drive(configured<Policy>(sc), sc, caches);
}

template <class Base, class G>
using at = sh::with_granularity<Base, G>;

}  // namespace

TEST_CASE("shared_heads: compress evicts one set of slots per layer, as the oracle's combined score says",
          "[granularity]") {
  for (auto mode : {sh::compaction::fill_holes, sh::compaction::preserve_order}) {
    scenario sc{.layers = 1, .kv_heads = 3, .chunk = 3, .mode = mode, .apply = apply_mode::compress_layer};
    run_contiguous<at<sh::scissorhands_policy, sh::shared_heads<>>>(sc);
    run_contiguous<at<mass_unbounded, sh::shared_heads<sh::max_score>>>(sc);
    run_contiguous<at<indicator_window, sh::shared_heads<>>>(sc);
    sc.page_size = 4;
    run_paged<at<sh::scissorhands_policy, sh::shared_heads<sh::max_score>>>(sc);
    run_paged<at<sh::key_norm_policy, sh::shared_heads<>>>(sc);
  }
}

TEST_CASE("shared_layers: select + compact over a contiguous cache matches the oracle", "[granularity]") {
  for (auto mode : {sh::compaction::fill_holes, sh::compaction::preserve_order})
    for (std::int32_t chunk : {1, 3}) {
      const scenario sc{.layers = 3,
                        .chunk = chunk,
                        .pinned = 4,
                        .mode = mode,
                        .seed = static_cast<std::uint64_t>(chunk) * 7 + static_cast<std::uint64_t>(mode)};
      run_contiguous<at<sh::scissorhands_policy, sh::shared_layers<>>>(sc);
      run_contiguous<at<sh::scissorhands_policy, sh::shared_layers<sh::max_score, sh::max_score>>>(sc);
      run_contiguous<at<mass_unbounded, sh::shared_layers<sh::max_score, sh::mean_score>>>(sc);
      run_contiguous<at<sh::scissorhands_paper_policy, sh::shared_layers<sh::mean_score, sh::max_score>>>(sc);
      run_contiguous<at<sh::random_policy, sh::shared_layers<>>>(sc);
    }
}

TEST_CASE("shared_layers: select + compact over a shared page table matches the oracle", "[granularity]") {
  for (auto mode : {sh::compaction::fill_holes, sh::compaction::preserve_order})
    for (std::int32_t page_size : {1, 4}) {
      const scenario sc{.layers = 2,
                        .batch = 3,
                        .chunk = 2,
                        .page_size = page_size,
                        .pinned = 5,
                        .mode = mode,
                        .seed = 11 + static_cast<std::uint64_t>(page_size)};
      run_paged<at<sh::scissorhands_policy, sh::shared_layers<>>>(sc);
      run_paged<at<indicator_window, sh::shared_layers<sh::max_score, sh::max_score>>>(sc);
    }
}

TEST_CASE("shared_layers: select + forget for a slot-list engine (page size 1) matches the oracle",
          "[granularity]") {
  for (auto mode : {sh::compaction::fill_holes, sh::compaction::preserve_order}) {
    // forget keeps the order whatever the mode.
    const scenario sc{
        .layers = 3, .batch = 2, .chunk = 2, .page_size = 1, .pinned = 3, .mode = mode, .apply = apply_mode::forget};
    run_paged<at<sh::scissorhands_policy, sh::shared_layers<>>>(sc);
    run_paged<at<mass_decay, sh::shared_layers<sh::max_score>>>(sc);
  }
}

TEST_CASE("pooling (SnapKV): every granularity ranks by the pooled score the oracle computes", "[granularity]") {
  for (auto pool_mode : {sh::pooling::mean, sh::pooling::max})
    for (std::int32_t width : {3, 5}) {
      scenario sc{.layers = 1,
                  .kv_heads = 3,
                  .chunk = 3,
                  .mode = sh::compaction::preserve_order,
                  .apply = apply_mode::compress_layer,
                  .seed = 40 + static_cast<std::uint64_t>(width),
                  .pool_width = width,
                  .pool_mode = pool_mode};
      run_contiguous<at<sh::h2o_policy, sh::shared_heads<>>>(sc);
      run_contiguous<at<sh::scissorhands_policy, sh::shared_heads<sh::max_score>>>(sc);
      sc.layers = 3;
      sc.apply = apply_mode::compact;
      sc.pinned = 4;
      run_contiguous<at<sh::h2o_policy, sh::shared_layers<>>>(sc);
      sc.page_size = 4;
      run_paged<at<indicator_window, sh::shared_layers<sh::max_score, sh::mean_score>>>(sc);
      sc.page_size = 1;
      sc.apply = apply_mode::forget;
      run_paged<at<sh::scissorhands_policy, sh::shared_layers<>>>(sc);
    }
}

namespace {

// A two-layer contiguous cache at the budget, for the refusal tests.
struct refusal_fixture {
  using policy_t = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;
  policy_t policy;
  static constexpr std::int32_t L = 2, B = 2, H = 2, D = 4, budget = 8;
  sh::state_shape shape;
  aligned_bytes model_buffer;
  sh::model_state<host> model;
  std::vector<contiguous_cache> caches;
  aligned_bytes workspace;
  std::int32_t stride;
  std::vector<std::int32_t> counts, slots, cache_slots, new_lengths, freed;

  refusal_fixture()
      : policy(make_policy()), shape{B, H, sh::state_capacity_for(budget, 1), policy.ring_words()},
        model_buffer(sh::model_state_bytes(shape, L)), model(sh::make_model_state(model_buffer.span(), shape, L)),
        workspace(4096), stride(sh::max_evictions(shape.capacity, budget, 1) + 2),
        counts(B, -1), slots(static_cast<std::size_t>(B * stride), -1), cache_slots(static_cast<std::size_t>(B * stride), -1),
        new_lengths(B, -1), freed(B, -1) {
    sh::host::reset_state(model);
    for (std::int32_t l = 0; l < L; ++l)
      caches.push_back(make_contiguous(layout_kind::nhd, B, H, D, shape.capacity, 5));
    // Fill both sequences to the budget, observing every layer.
    for (std::int32_t step = 0; step < budget; ++step) {
      for (auto& c : caches)
        for (std::int32_t b = 0; b < B; ++b) {
          const std::int32_t t = c.append(b);
          for (std::int32_t h = 0; h < H; ++h)
            for (std::int32_t d = 0; d < D; ++d) c.row(0, b, h, t)[d] = c.row(1, b, h, t)[d] = token_value(0, b, h, step, d);
        }
      const std::int32_t len = step + 1;
      std::vector<float> probs(static_cast<std::size_t>(B * H * len), 1.0f / static_cast<float>(len));
      for (std::int32_t l = 0; l < L; ++l)
        sh::host::observe_probabilities(policy, caches[static_cast<std::size_t>(l)].view(), model.layer(l),
                                        sh::probability_view<host>::dense({probs.data(), probs.size()}, H, 1, len));
    }
  }
  static policy_t make_policy() {
    policy_t p;
    p.config.recent = 2;
    return p;
  }
  sh::eviction_selection<host> selection() {
    return {stride,
            {counts.data(), counts.size()},
            {slots.data(), slots.size()},
            {cache_slots.data(), cache_slots.size()},
            {{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}}};
  }
  // Everything a refused call must leave alone.
  std::vector<std::vector<std::byte>> snapshot() const {
    std::vector<std::vector<std::byte>> s{model_buffer.snapshot()};
    const auto bytes = [](const auto& v) {
      const auto* p = reinterpret_cast<const std::byte*>(v.data());
      return std::vector<std::byte>(p, p + v.size() * sizeof(v[0]));
    };
    for (const auto& c : caches) s.push_back(bytes(c.data[0])), s.push_back(bytes(c.data[1])), s.push_back(bytes(c.lengths));
    for (const auto* v : {&counts, &slots, &cache_slots, &new_lengths, &freed}) s.push_back(bytes(*v));
    return s;
  }
};

template <class Call>
void refused(refusal_fixture& f, const char* argument, Call&& call) {
  const auto before = f.snapshot();
  try {
    call();
    FAIL("expected a refusal naming " << argument);
  } catch (const sh::invalid_argument& e) {
    INFO(e.what());
    CHECK(e.argument() == argument);
  }
  CHECK(f.snapshot() == before);
}

}  // namespace

TEST_CASE("select, compact and forget refuse bad input by name and change nothing", "[granularity]") {
  refusal_fixture f;
  auto& p = f.policy;
  const auto view0 = f.caches[0].view();
  const auto ws = f.workspace.span();

  SECTION("a layer whose tokens differ") {
    auto l1 = f.model.layer(1);
    std::swap(l1.positions[l1.index(0, 1, 2)], l1.positions[l1.index(0, 1, 3)]);
    refused(f, "model", [&] { sh::host::select(p, view0, f.model, f.budget, ws, f.selection()); });
  }
  SECTION("a layer that was not observed") {
    f.model.layer(1).tracked[1] -= 1;
    refused(f, "model", [&] { sh::host::select(p, view0, f.model, f.budget, ws, f.selection()); });
  }
  SECTION("stride below max_evictions") {
    auto sel = f.selection();
    sel.stride = 0;
    refused(f, "selection.stride", [&] { sh::host::select(p, view0, f.model, f.budget, ws, sel); });
  }
  SECTION("an output over the state") {
    auto sel = f.selection();
    sel.counts = {reinterpret_cast<std::int32_t*>(f.model.layer(1).tracked), 2};
    refused(f, "selection.counts", [&] { sh::host::select(p, view0, f.model, f.budget, ws, sel); });
  }
  SECTION("pinned prefix longer than the sequence, or leaving too little to evict") {
    std::vector<std::int32_t> pinned{9, 0};
    refused(f, "pinned_prefix", [&] { sh::host::select(p, view0, f.model, f.budget, ws, f.selection(), {pinned.data(), 2}); });
    pinned = {7, 0};  // 8 tokens, 2 protected, 7 pinned: none left to evict
    refused(f, "pinned_prefix", [&] { sh::host::select(p, view0, f.model, f.budget, ws, f.selection(), {pinned.data(), 2}); });
    std::vector<std::int32_t> short_list{1};
    refused(f, "pinned_prefix", [&] { sh::host::select(p, view0, f.model, f.budget, ws, f.selection(), {short_list.data(), 1}); });
  }
  SECTION("a workspace too small") {
    refused(f, "workspace", [&] { sh::host::select(p, view0, f.model, f.budget, {ws.data(), 16}, f.selection()); });
  }
  SECTION("compact and forget check the selection they are given") {
    sh::host::select(p, view0, f.model, f.budget, ws, f.selection());
    REQUIRE(f.counts[0] == 1);
    const auto good = f.slots;
    f.counts[0] = 2;
    f.slots[0] = 3, f.slots[1] = 3;  // not ascending
    refused(f, "selection.slots", [&] { sh::host::compact(p, f.caches[0].view(), f.model.layer(0), f.selection()); });
    refused(f, "selection.slots", [&] { sh::host::forget(p, f.caches[0].view(), f.model.layer(0), f.selection()); });
    f.slots[0] = 6, f.slots[1] = 7;  // the two newest: protected (recent = 2)
    refused(f, "selection.slots", [&] { sh::host::compact(p, f.caches[0].view(), f.model.layer(0), f.selection()); });
    f.slots = good;
    f.counts[0] = 9;  // more than the sequence holds
    refused(f, "selection.counts", [&] { sh::host::compact(p, f.caches[0].view(), f.model.layer(0), f.selection()); });
    f.counts[0] = 1;
    auto sel = f.selection();
    sel.counts = {f.counts.data(), 1};
    refused(f, "selection.counts", [&] { sh::host::forget(p, f.caches[0].view(), f.model.layer(0), sel); });
    sel = f.selection();
    sel.slots = {reinterpret_cast<std::int32_t*>(f.caches[0].data[0].data()), sel.slots.size()};
    refused(f, "selection.slots", [&] { sh::host::compact(p, f.caches[0].view(), f.model.layer(0), sel); });
  }
}

TEST_CASE("shared_heads compress refuses heads that hold different tokens", "[granularity]") {
  using policy_t = sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<>>;
  policy_t p;
  p.config.recent = 2;
  auto cache = make_contiguous(layout_kind::nhd, 1, 2, 4, 8, 3);
  const sh::state_shape shape{1, 2, 8, p.ring_words()};
  aligned_bytes buffer(sh::state_bytes(shape));
  const auto st = sh::make_state(buffer.span(), shape);
  sh::host::reset_state(st);
  for (int i = 0; i < 8; ++i) cache.append(0);
  sh::host::admit(p, cache.view(), st);
  std::swap(st.positions[st.index(0, 1, 0)], st.positions[st.index(0, 1, 1)]);
  aligned_bytes ws(sh::host::compress_workspace_bytes(cache.view(), shape));
  const auto before = buffer.snapshot();
  try {
    sh::host::compress(p, cache.view(), st, 8, ws.span(), cache.output());
    FAIL("expected a refusal");
  } catch (const sh::invalid_argument& e) {
    CHECK(e.argument() == "state.positions");
    CHECK(std::string(e.what()).find("head 1") != std::string::npos);
  }
  CHECK(buffer.equals(before));
}

namespace {

// H2O at granularity G with one protected recent token: the small policy of
// the page-table cases below.
template <class G>
sh::with_granularity<sh::h2o_policy, G> small_h2o() {
  sh::with_granularity<sh::h2o_policy, G> p;
  p.config.recent = 1;
  return p;
}

}  // namespace

TEST_CASE("a shared prefix page may be listed twice when compact never writes it", "[granularity]") {
  // Two sequences share their first page (a prefix); sequence 0 is at the
  // budget with the prefix pinned: compact writes only above it.
  const auto p = small_h2o<sh::shared_layers<>>();
  const std::int32_t page = 4, H = 1, D = 4;
  paged_cache cache(2, H, D, page, 12, sh::paged_layout::nhd(page, H, D), sh::paged_layout::nhd(page, H, D), 9);
  for (int i = 0; i < 8; ++i) cache.append(0);
  for (int i = 0; i < 4; ++i) cache.append(1);
  cache.pages[1][0] = cache.pages[0][0];  // the shared prefix page
  const sh::state_shape shape{2, H, 12, p.ring_words()};
  const model_holder holder(shape, 1);
  const auto& model = holder.model;
  sh::host::admit(p, cache.view(), model.layer(0));
  aligned_bytes ws(sh::host::select_workspace_bytes(cache.view(), shape));
  aligned_bytes cws(sh::host::compact_workspace_bytes(cache.view()));
  std::vector<std::int32_t> counts(2), slots(2 * 8), lens(2), freed(2), pinned{4, 4};
  sh::eviction_selection<host> sel{8, {counts.data(), 2}, {slots.data(), slots.size()}, {}, {{lens.data(), 2}, {freed.data(), 2}}};
  sh::host::select(p, cache.view(), model, 8, ws.span(), sel, {pinned.data(), 2});
  REQUIRE(counts[0] == 1);
  REQUIRE(slots[0] >= 4);
  CHECK_NOTHROW(sh::host::compact(p, cache.view(), model.layer(0), sel, cws.span()));
  // Without the pin the prefix page could be written: refused.
  sh::host::reset_state(model);
  sh::host::admit(p, cache.view(), model.layer(0));
  sh::host::select(p, cache.view(), model, 8, ws.span(), sel);
  REQUIRE(slots[0] < 4);  // all scores 0: the oldest goes
  CHECK_THROWS_AS(sh::host::compact(p, cache.view(), model.layer(0), sel, cws.span()), sh::invalid_argument);
}

TEST_CASE("compress, select and compact refuse a workspace over the page table", "[granularity]") {
  const auto p = small_h2o<sh::shared_layers<>>();
  const std::int32_t page = 2, H = 1, D = 4;
  paged_cache cache(1, H, D, page, 8, sh::paged_layout::nhd(page, H, D), sh::paged_layout::nhd(page, H, D), 4);
  for (int i = 0; i < 8; ++i) cache.append(0);
  const sh::state_shape shape{1, H, 8, p.ring_words()};
  const model_holder holder(shape, 1);
  const auto& model = holder.model;
  auto view = cache.view();
  sh::host::admit(p, view, model.layer(0));
  // The table's indices copied to the start of a buffer the test then also
  // passes as the workspace.
  aligned_bytes shared_bytes(4096);
  auto* ids = reinterpret_cast<std::int32_t*>(shared_bytes.data());
  std::copy(cache.indices.begin(), cache.indices.end(), ids);
  view.indices = {ids, cache.indices.size()};
  const sh::host_span<std::byte> bad = shared_bytes.span();
  std::vector<std::int32_t> counts(1), slots(8), lens(1), freed(1);
  const sh::eviction_selection<host> sel{8, {counts.data(), 1}, {slots.data(), 8}, {}, {{lens.data(), 1}, {freed.data(), 1}}};
  const std::vector<std::int32_t> table_before(ids, ids + cache.indices.size());
  const auto expect_workspace_refused = [&](auto&& call) {
    CHECK(refused_argument(call) == "workspace");
    CHECK(std::equal(table_before.begin(), table_before.end(), ids));
  };
  expect_workspace_refused([&] { sh::host::select(p, view, model, 8, bad, sel); });
  const auto heads = small_h2o<sh::shared_heads<>>();
  expect_workspace_refused([&] { sh::host::compress(heads, view, model.layer(0), 8, bad, cache.output()); });
  aligned_bytes ws(sh::host::select_workspace_bytes(view, shape));
  sh::host::select(p, view, model, 8, ws.span(), sel);
  REQUIRE(counts[0] == 1);
  expect_workspace_refused([&] { sh::host::compact(p, view, model.layer(0), sel, bad); });
}
