#pragma once
// Part of differential.cu (its main translation unit): compress's m = 1
// selection, the decode steady state, run on the host.
//
//   argmin  select_kernel's one-victim path is key_of_slot, lowest_of_thread
//           and lowest_key_op (kernels/compress.cuh), all host and device
//           functions. Here each of the block's threads is called in turn
//           on host memory and their results are reduced with
//           lowest_key_op in two orders (highest thread first, and the
//           pairwise tree a block reduction uses); the slot must be the one
//           host::compress evicts from the same state (budget = length,
//           m = 1), and the count the head's unprotected tokens. Lengths
//           around the thread's tiling (threads x argmin_items = 2,048
//           slots a pass), pooled and not, both eviction orders, NaN and
//           tied scores, shuffled positions, every token protected, and
//           equal keys (a damaged state: the lowest slot wins). Not a
//           device result: it runs in host-only runs too.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.cuh"

namespace argmin_tests {

using namespace harness;
namespace sh = scissorhands;
namespace kd = sh::cuda::detail;

// The block's result: every thread's lowest key reduced with lowest_key_op.
// Two orders, so an operator whose ties depend on the order shows up.
template <class Protector, bool HighestFirst>
std::pair<kd::lowest_key, kd::lowest_key> block_argmin(const kd::key_of_slot<Protector, HighestFirst>& from_state,
                                                       std::int32_t len) {
  using traits = sh::cuda::select_traits;
  std::vector<kd::lowest_key> mine(traits::threads);
  for (int thread = 0; thread < traits::threads; ++thread) {
    kd::lowest_key& k = mine[thread];
    k = {sh::cuda::block::ignored_key, -1, 0};
    kd::lowest_of_thread<traits::threads, traits::argmin_items>(from_state, thread, len, k.key, k.slot, k.count);
  }
  const kd::lowest_key_op op;
  kd::lowest_key backwards = mine.back();
  for (int thread = traits::threads - 2; thread >= 0; --thread) backwards = op(backwards, mine[thread]);
  std::vector<kd::lowest_key> tree = mine;
  for (std::size_t width = 1; width < tree.size(); width *= 2)
    for (std::size_t i = 0; i + width < tree.size(); i += 2 * width) tree[i] = op(tree[i], tree[i + width]);
  return {backwards, tree[0]};
}

struct argmin_case {
  int len;
  int recent, sinks;
  int pool;                  // pool_width (> 1: preserve_order)
  bool shuffled;             // positions out of slot order (fill_holes leaves them so)
  bool few_scores;           // scores from 4 values: keys tie on the score, the position decides
  bool duplicate_positions;  // a damaged state: every slot at one position, equal keys
};

template <class Policy>
void check_argmin(check_tally& tally, std::mt19937_64& rng, const argmin_case& c) {
  constexpr bool highest = sh::evicts_highest<typename Policy::observation>;
  using protector = typename Policy::protector;
  Policy policy;
  policy.config.recent = c.recent;
  policy.config.sinks = c.sinks;
  policy.config.evict_count = 1;
  policy.config.pool_width = c.pool;
  if (c.pool > 1) policy.config.compaction_mode = sh::compaction::preserve_order;
  constexpr int H = 2, D = 1;
  const int len = c.len;
  const sh::state_shape shape{1, H, len, policy.ring_words()};
  aligned_bytes state_buf(sh::state_bytes(shape));
  const auto st = sh::make_state(state_buf.span(), shape);
  sh::host::reset_state(st);
  // Distinct positions with gaps (earlier evictions), next_position past them.
  std::vector<std::int32_t> positions(static_cast<std::size_t>(len));
  std::uniform_int_distribution<int> gap(1, 3), values(0, 3), counts(0, 400), one_in(0, 49);
  std::uniform_real_distribution<float> u(-1.0f, 3.0f);
  for (int t = 0, p = 0; t < len; ++t, p += gap(rng)) positions[t] = c.duplicate_positions ? 7 : p;
  const std::int32_t next = c.duplicate_positions ? 7 + c.recent + 1 : positions[len - 1] + gap(rng);
  st.next_position[0] = next;
  st.tracked[0] = len;
  st.step[0] = 1000;
  for (int h = 0; h < H; ++h) {
    std::vector<std::int32_t> p = positions;
    if (c.shuffled) std::shuffle(p.begin(), p.end(), rng);
    for (int t = 0; t < len; ++t) {
      const std::int64_t i = st.row_index(0, h, t);
      st.positions[i] = p[t];
      const int pick = one_in(rng);
      st.scores[i] = c.duplicate_positions ? 1.0f
                     : pick == 0           ? std::numeric_limits<float>::quiet_NaN()
                     : pick == 1           ? 0.0f
                     : c.few_scores        ? static_cast<float>(values(rng))
                                           : u(rng);
      st.observed[i] = c.duplicate_positions ? 4.0f : one_in(rng) < 5 ? 0.0f : static_cast<float>(counts(rng));
    }
  }
  // Before host::compress moves anything: the simulated block per head.
  kd::lowest_key got[H], got_tree[H];
  int unprotected[H] = {};
  for (int h = 0; h < H; ++h) {
    const std::int64_t base = st.row_index(0, h, 0);
    const kd::key_of_slot<protector, highest> from_state{
        policy.config, st.positions + base, st.scores + base, st.observed + base, next, len};
    std::tie(got[h], got_tree[h]) = block_argmin(from_state, len);
    for (int t = 0; t < len; ++t)
      unprotected[h] += protector::is_protected(st.positions[base + t], next, policy.config) ? 0 : 1;
  }
  std::string what = std::string(highest ? "highest" : "lowest") + " first, length " + std::to_string(len) +
                     ", recent " + std::to_string(c.recent) + ", sinks " + std::to_string(c.sinks) + ", pool " +
                     std::to_string(c.pool) + (c.shuffled ? ", shuffled" : "") + (c.few_scores ? ", tied scores" : "") +
                     (c.duplicate_positions ? ", one position everywhere" : "");
  for (int h = 0; h < H; ++h)
    tally.host(got[h].key == got_tree[h].key && got[h].slot == got_tree[h].slot && got[h].count == got_tree[h].count,
               what + ", head " + std::to_string(h) + ": both reduction orders agree (slots " +
                   std::to_string(got[h].slot) + " and " + std::to_string(got_tree[h].slot) + ")");
  if (c.duplicate_positions) {
    // Equal keys: lowest_key_op's tie rule gives the lowest unprotected slot.
    for (int h = 0; h < H; ++h)
      tally.host(got[h].slot == 0 && got[h].count == len,
                 what + ", head " + std::to_string(h) + ": slot " + std::to_string(got[h].slot) + " of " +
                     std::to_string(got[h].count) + " keys, want slot 0 of " + std::to_string(len));
    return;
  }
  if (unprotected[0] == 0) {
    // select_kernel flags status_positions; the host refuses the state.
    for (int h = 0; h < H; ++h)
      tally.host(got[h].count == 0 && got[h].slot == -1,
                 what + ", head " + std::to_string(h) + ": every token protected gives no slot and count 0, got slot " +
                     std::to_string(got[h].slot) + " count " + std::to_string(got[h].count));
    return;
  }
  // The host's choice: compress at budget = length evicts one token a head;
  // its position is the one missing afterwards.
  std::vector<float> k(static_cast<std::size_t>(H) * len * D, 0.0f), v = k;
  const std::int32_t lengths[1] = {len};
  std::int32_t new_length[1] = {-1};
  const auto view =
      sh::make_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                       sh::host_span<const std::int32_t>(lengths, 1), 1, H, D, len, sh::named_layout::nhd);
  aligned_bytes ws(sh::host::compress_workspace_bytes(view));
  std::vector<std::int32_t> before(st.positions, st.positions + std::int64_t{H} * len);
  sh::host::compress(policy, view, st, len, ws.span(), {sh::host_span<std::int32_t>(new_length, 1), {}});
  for (int h = 0; h < H; ++h) {
    const std::int32_t* was = before.data() + std::int64_t{h} * len;
    std::vector<std::int32_t> kept(st.positions + st.row_index(0, h, 0), st.positions + st.row_index(0, h, len - 1));
    std::sort(kept.begin(), kept.end());
    int want = -1;
    for (int t = 0; t < len && want < 0; ++t)
      if (!std::binary_search(kept.begin(), kept.end(), was[t])) want = t;
    tally.host(new_length[0] == len - 1 && got[h].slot == want && got[h].count == unprotected[h],
               what + ", head " + std::to_string(h) + ": slot " + std::to_string(got[h].slot) + " of " +
                   std::to_string(got[h].count) + " keys, host::compress evicts slot " + std::to_string(want) + " of " +
                   std::to_string(unprotected[h]) + " unprotected");
  }
}

inline int run() {
  check_tally tally{"argmin"};
  std::mt19937_64 rng(20261205);
  using traits = sh::cuda::select_traits;
  constexpr int pass = traits::threads * traits::argmin_items;  // slots one pass of the block covers
  for (int len : {7, 9, 31, traits::threads - 1, traits::threads, traits::threads + 1, pass - 1, pass, pass + 1,
                  2 * pass + 37, traits::tile_keys + 3})
    for (int pool : {1, 3})
      for (int variant = 0; variant < 3; ++variant) {
        argmin_case c{len, 4, variant == 2 ? 2 : 0, pool, pool == 1 && variant != 0, variant == 1, false};
        check_argmin<sh::scissorhands_policy>(tally, rng, c);  // evicts its highest scores
        check_argmin<sh::h2o_policy>(tally, rng, c);           // its lowest
      }
  // Every token protected: the recent window covers the row (positions
  // span at most 3 x length), or sinks and recent window together.
  check_argmin<sh::h2o_policy>(tally, rng, {1, 4, 0, 1, false, false, false});
  check_argmin<sh::h2o_policy>(tally, rng, {6, 20, 2, 1, true, false, false});
  check_argmin<sh::scissorhands_policy>(tally, rng, {300, 1000, 0, 3, false, false, false});
  // Equal keys everywhere, across threads and passes.
  for (int len : {5, traits::threads + 3, pass + 5})
    check_argmin<sh::h2o_policy>(tally, rng, {len, 0, 0, 1, false, false, true});
  return tally.report();
}

}  // namespace argmin_tests
