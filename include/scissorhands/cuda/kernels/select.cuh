#pragma once
// Token-level eviction kernels (policy/granularity.hpp): one choice of slots
// per sequence for every KV head (shared_heads, through compress) or for
// every head of every layer (shared_layers, through select), and the
// kernels that apply a selection to one layer (compact, forget).
//
//   local_scores_kernel       thread per (layer, sequence, slot): a
//                             tensor-parallel rank's partial scores
//                             (partial_scores.hpp).
//   select_shared_kernel      one block per sequence. Checks the sequence in
//                             every layer it reads (bits go to its row's
//                             status word in every layer), combines each
//                             slot's eviction score over the heads (and
//                             layers) in the host's order, and writes the e
//                             lowest keys' slots, ascending, to the
//                             workspace (compress: then compact_kernel;
//                             select: then publish_selection_kernel).
//   publish_selection_kernel  one block per sequence: the selection the
//                             caller sees (counts, slots, cache_slots,
//                             new_lengths, freed_pages); a sequence whose
//                             row is flagged in any layer gets count 0.
//   selection_check_kernel    one block per sequence: compact's and forget's
//                             checks of the selection against one layer
//                             (host::detail::validate_selection_input), and
//                             the page listings for compact's shared-page
//                             check.
//   apply_selection_kernel    one block per (sequence, KV head): moves the
//                             rows of live sequences (compact: K, V and
//                             state; forget: state only, in order).
#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "../../detail/eviction_key.hpp"
#include "../../eviction_state.hpp"
#include "../../model_state.hpp"
#include "../../partial_scores.hpp"
#include "../../policy/eviction_policy.hpp"
#include "../block/collectives.cuh"
#include "../block/radix_select.cuh"
#include "../detail/tables.cuh"
#include "../launch.cuh"
#include "../traits.cuh"
#include "check.cuh"
#include "compress.cuh"

namespace scissorhands::cuda::detail {

// Slot t of state row r of one layer `s`, its KV heads reduced in order
// 0..H-1 and not finished (host::detail::head_partial's acc[t]). With
// `read_scores` false (scores already reduced elsewhere) nothing is
// combined: identity. With `check_positions` every head's position is
// compared with `position`, and `mismatch` set when one holds another
// token. Unpooled (pool_width 1, the default), a group of heads' values
// are all loaded before the first is used: a slot waits on one DRAM
// latency per group, not one per head (the division between heads kept
// each head's loads behind the previous head's use). Host and device: the
// token-level suite's combined_score part runs it on the host.
template <class Heads, bool HighestFirst>
SCISSORHANDS_HOST_DEVICE inline float heads_of_slot(const settings& cfg, const eviction_state<memory_space::device>& s,
                                                    std::int32_t r, std::int32_t t, std::int32_t length,
                                                    bool read_scores, bool check_positions, std::int32_t position,
                                                    bool& mismatch) {
  constexpr std::int32_t group = 8;
  const bool unpooled = cfg.pool_width <= 1;
  const std::int32_t heads = s.shape.kv_heads;
  float acc = Heads::identity();
  for (std::int32_t h0 = 0; h0 < heads; h0 += group) {
    const std::int32_t n = heads - h0 < group ? heads - h0 : group;
    // Zeroed: a host compiler cannot tell the loads' guard from the uses'.
    std::int32_t positions[group] = {};
    float scores[group] = {}, observed[group] = {};
    SCISSORHANDS_UNROLL
    for (std::int32_t k = 0; k < group; ++k)
      if (k < n) {
        const std::int64_t i = s.row_index(r, h0 + k, t);
        if (check_positions) positions[k] = s.positions[i];
        if (read_scores && unpooled) {
          scores[k] = s.scores[i];
          observed[k] = s.observed[i];
        }
      }
    SCISSORHANDS_UNROLL
    for (std::int32_t k = 0; k < group; ++k)
      if (k < n) {
        if (check_positions && positions[k] != position) mismatch = true;
        if (!read_scores) continue;
        const std::int64_t row = s.row_index(r, h0 + k, 0);
        const float v = unpooled ? scissorhands::detail::eviction_score(scores[k], observed[k], cfg, HighestFirst)
                                 : scissorhands::detail::pooled_eviction_score(s.scores + row, s.observed + row, t,
                                                                               length, cfg, HighestFirst);
        acc = Heads::combine(acc, v);
      }
  }
  return acc;
}

// The eviction score of slot t of state row r combined over every KV head
// of every layer of `model` (one layer for shared_heads), exactly as
// host::detail::combine_slot_scores: heads 0..H-1 inside a layer, then
// layers 0..L-1, the same float operations in the same order. With
// `reduced` (tensor parallelism: non-null values) each layer's head
// reduction is read from it, sequence b's row, and finished over
// reduced.kv_heads (host::detail::combine_reduced_scores). `position` is
// layer 0 head 0's token; `mismatch` is set when any head of any layer
// holds another one at slot t. Host and device: the token-level suite
// calls it on the host against the host backend (its combined_score part).
template <class Granularity, bool HighestFirst>
SCISSORHANDS_HOST_DEVICE inline float combined_score(const settings& cfg,
                                                     const model_state<memory_space::device>& model,
                                                     const partial_scores<memory_space::device>& reduced,
                                                     std::int32_t b, std::int32_t r, std::int32_t t,
                                                     std::int32_t length, std::int32_t position, bool& mismatch) {
  using Heads = typename Granularity::head_reduction;
  constexpr bool over_layers = Granularity::kind == granularity_kind::shared_layers;
  const bool from_reduced = reduced.values.data() != nullptr;
  const std::int32_t divisor = from_reduced ? reduced.kv_heads : model.first.shape.kv_heads;
  float layer_acc = 0.0f, combined = 0.0f;
  if constexpr (over_layers) layer_acc = Granularity::layer_reduction::identity();
  for (std::int32_t l = 0; l < model.layers; ++l) {
    float head_acc =
        heads_of_slot<Heads, HighestFirst>(cfg, model.layer(l), r, t, length, !from_reduced, true, position, mismatch);
    if (from_reduced) head_acc = reduced.row(l, b)[t];
    if constexpr (over_layers)
      layer_acc = Granularity::layer_reduction::combine(layer_acc, Heads::finish(head_acc, divisor));
    else
      combined = Heads::finish(head_acc, divisor);
  }
  if constexpr (over_layers) combined = Granularity::layer_reduction::finish(layer_acc, model.layers);
  return combined;
}

// A tensor-parallel rank's partial scores (host::detail::head_partial):
// thread per slot t of sequence b, layer l; grid (chunks, layers, batch).
// Sequences below the budget, slots past the length, and sequences whose
// row is padding, out of range or flagged get the identity, so select on
// the reduced buffer reads nothing undefined; select checks the rest.
template <class Granularity, bool HighestFirst>
__global__ void __launch_bounds__(slot_traits::threads)
    local_scores_kernel(settings cfg, sequence_table seqs, model_state<memory_space::device> model,
                        std::int32_t budget, partial_scores<memory_space::device> partial) {
  using Heads = typename Granularity::head_reduction;
  const auto b = static_cast<std::int32_t>(blockIdx.z), l = static_cast<std::int32_t>(blockIdx.y);
  const eviction_state<memory_space::device> s = model.layer(l);
  const std::int32_t raw_len = seqs.length(b);
  const std::int32_t r = s.row(b);  // state_rows, when given, holds batch entries (checked on the host)
  // Only what the device can trust: a row in range, a length within the
  // state's capacity that this layer tracks, no error flagged on the row.
  const bool usable = r >= 0 && r < s.shape.rows && raw_len >= budget && raw_len <= s.shape.capacity &&
                      s.tracked[r] == raw_len && s.status[r] == 0u;
  const std::int32_t len = usable ? raw_len : 0;
  float* row = partial.row(l, b);
  // This block's chunk of slots, in 64 bits: its end may pass INT32_MAX.
  const std::int64_t lo = std::int64_t{blockIdx.x} * slot_traits::chunk;
  const std::int64_t end = lo + slot_traits::chunk < partial.capacity ? lo + slot_traits::chunk : partial.capacity;
  bool unused = false;  // heads_of_slot's mismatch: no positions are read here
  for (std::int64_t i = lo + threadIdx.x; i < end; i += slot_traits::threads) {
    const auto t = static_cast<std::int32_t>(i);
    row[t] =
        t < len ? heads_of_slot<Heads, HighestFirst>(cfg, s, r, t, len, true, false, 0, unused) : Heads::identity();
  }
}

// ORs `bits` into row r's status word in every layer. One thread.
__device__ inline void flag_layers(const model_state<memory_space::device>& model, std::int32_t r,
                                   std::uint32_t bits) {
  for (std::int32_t l = 0; l < model.layers; ++l) atomicOr(&model.layer(l).status[r], bits);
}

// Grid (batch). `model` is one layer for shared_heads (compress) and the
// whole model for shared_layers (select); `pinned_prefix` is select's
// (null: none).
template <class Protector, bool HighestFirst, class Granularity>
__global__ void __launch_bounds__(select_traits::threads)
    select_shared_kernel(settings cfg, sequence_table seqs, model_state<memory_space::device> model,
                         std::int32_t budget, const std::int32_t* pinned_prefix, compress_workspace ws,
                         partial_scores<memory_space::device> reduced) {
  allow_second_kernel();  // launch.cuh
  using traits = select_traits;
  __shared__ std::uint64_t tile[traits::tile_keys];
  __shared__ block::radix_select_storage<traits::threads> storage;
  const auto b = static_cast<std::int32_t>(blockIdx.x);
  const eviction_state<memory_space::device> first = model.first;

  // 1. Checks: layer 0 as compress does (page table, row, counters), the
  //    counters of every other layer, the pinned prefix, and for a
  //    sequence at the budget every layer tracking all its tokens at the
  //    same next position.
  const sequence_check seq = check_sequence(seqs, first, b, true);
  const std::int32_t len = seq.length;
  std::uint32_t own = seq.own, batch_bits = seq.batch;
  std::uint32_t pin_bits = 0;
  std::int32_t pinned = 0;
  if (pinned_prefix != nullptr && seq.length_ok) {
    pinned = pinned_prefix[b];
    if (pinned < 0 || pinned > len) pin_bits = status_pinned_prefix;  // as the host: padding slots too
  }
  if (seq.row_ok)
    own |= pin_bits;
  else
    batch_bits |= pin_bits;  // a padding slot's (or a bad row's) problems belong to the batch
  const std::int32_t r = seq.row;
  const bool triggers = len >= budget;
  const std::int32_t e = len - budget + cfg.evict_count;
  if (seq.row_ok) {
    if (own == 0 && triggers && seq.tracked != len) own |= status_untracked;
    for (std::int32_t l = 1; l < model.layers; ++l) {
      std::int32_t tracked = 0, next = 0;
      const std::uint32_t bits = check_counters(model.layer(l), r, len, seq.length_ok, tracked, next);
      own |= bits;
      if (own == 0 && triggers) {
        if (tracked != len) own |= status_untracked;
        if (next != seq.next_position) own |= status_slot_mismatch;
      }
    }
    // Cannot happen after the checks (lengths are within both capacities).
    if (own == 0 && triggers && (e > ws.max_evict || (len > traits::tile_keys && len > ws.key_slots)))
      own |= status_state_capacity;
  }
  if (threadIdx.x == 0) ws.lengths[b] = len;  // for the outputs, whatever the checks say
  count_page_listings(seqs, b, seq.length_ok, ws.page_counts);
  if (threadIdx.x == 0 && own != 0 && seq.row_ok) flag_layers(model, r, own);
  if (batch_bits != 0)
    for (std::int32_t l = 0; l < model.layers; ++l) flag_batch(model.layer(l), seqs.batch, batch_bits);
  if (!seq.row_ok || own != 0 || batch_bits != 0 || !triggers) return;

  // A row already flagged in any layer (by an earlier call, or by another
  // block just now) wastes no time; the next kernel decides. Read by one
  // thread for the whole block: the words may be changing.
  std::uint32_t flagged = 0;
  if (threadIdx.x == 0)
    for (std::int32_t l = 0; l < model.layers; ++l) flagged |= model.layer(l).status[r];
  if (block::block_or(flagged) != 0) return;

  // 2. One pass over the state: every slot's key (ignored_key for a
  //    protected or pinned token), cached in shared memory or, beyond the
  //    tile, in the workspace, with the count, min and max of the others.
  std::uint64_t* keys = len <= traits::tile_keys ? tile : ws.keys + std::int64_t{b} * ws.key_slots;
  const std::int64_t base = first.row_index(r, 0, 0);
  const std::int32_t next_position = seq.next_position;
  bool mismatch = false;
  const auto key_at = [&](std::int32_t t) -> std::uint64_t {
    const std::int32_t position = first.positions[base + t];
    const float score =
        combined_score<Granularity, HighestFirst>(cfg, model, reduced, b, r, t, len, position, mismatch);
    if (t < pinned || Protector::is_protected(position, next_position, cfg)) return block::ignored_key;
    return scissorhands::detail::eviction_key(score, position);
  };
  const block::key_stats stats = block::gather_key_stats<traits::threads>(
      key_at, len, [&](std::int32_t t, std::uint64_t key) { keys[t] = key; }, storage);
  if (block::block_or(mismatch ? 1u : 0u) != 0) {
    if (threadIdx.x == 0) flag_layers(model, r, status_slot_mismatch);
    return;
  }
  if (stats.count < e) {
    if (threadIdx.x == 0) flag_layers(model, r, status_positions);
    return;
  }
  // 3. The e-th smallest key, then the slots at or below it, ascending.
  const key_in_tile cached{keys};
  const std::uint64_t threshold = block::radix_select<traits::threads>(cached, len, e, stats, storage);
  const std::int32_t listed = block::list_selected<traits::threads>(cached, len, threshold, ws.list(b, 0), e, storage);
  // Unique keys (unique positions) list exactly e. Defensive only.
  if (listed != e && threadIdx.x == 0) flag_layers(model, r, status_positions);
}

// What select writes, as the kernels see it.
struct selection_out {
  std::int32_t* counts = nullptr;
  std::int32_t* slots = nullptr;
  std::int32_t* cache_slots = nullptr;  // null: not wanted
  std::int32_t stride = 0;
  std::int32_t* new_lengths = nullptr;
  std::int32_t* freed_pages = nullptr;  // null: not wanted
};

// Grid (batch). Every sequence gets new_lengths = length_after_compress and
// its freed pages (as compress's outputs, skipped sequences included); a
// live sequence at the budget gets its count and slots, any other count 0.
template <int = 0>  // a template so every translation unit may define it
__global__ void __launch_bounds__(slot_traits::threads)
    publish_selection_kernel(std::int32_t evict_count, sequence_table seqs,
                             model_state<memory_space::device> model, std::int32_t budget, compress_workspace ws,
                             selection_out out) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  __shared__ std::int32_t live;
  const auto b = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t len = ws.lengths[b];
  const std::int32_t after = length_after_compress(len, budget, evict_count);
  const std::int32_t e = len - budget + evict_count;
  if (threadIdx.x == 0) {
    out.new_lengths[b] = after;
    if (out.freed_pages != nullptr) {
      const std::int32_t freed = len >= budget ? seqs.pages_of(b) - seqs.pages_for(after) : 0;
      out.freed_pages[b] = freed > 0 ? freed : 0;
    }
    const std::int32_t r = model.first.row(b);
    bool ok = len >= budget && r >= 0 && r < model.first.shape.rows;
    for (std::int32_t l = 0; ok && l < model.layers; ++l) ok = model.layer(l).status[r] == 0;
    out.counts[b] = ok ? e : 0;
    live = ok ? 1 : 0;
  }
  __syncthreads();
  if (!live) return;
  const std::int32_t* list = ws.list(b, 0);
  const std::int64_t at = std::int64_t{b} * out.stride;
  for (std::int32_t k = threadIdx.x; k < e; k += slot_traits::threads) {
    const std::int32_t t = list[k];
    out.slots[at + k] = t;
    if (out.cache_slots != nullptr)
      out.cache_slots[at + k] =
          seqs.paged ? seqs.indices[seqs.indptr[b] + t / seqs.page_size] * seqs.page_size + t % seqs.page_size : t;
  }
}

// A selection as compact and forget read it.
struct selection_in {
  const std::int32_t* counts = nullptr;
  const std::int32_t* slots = nullptr;
  std::int32_t stride = 0;
  __device__ const std::int32_t* list(std::int32_t b) const { return slots + std::int64_t{b} * stride; }
};

// Grid (batch). Sequence b's checks (check_sequence) and its selection's:
// count in [0, min(length, stride)], and when non-zero the state tracking
// every token and the slots strictly ascending in [0, length), none holding
// a protected token in any head. With page_counts (compact, paged), also
// counts its page listings.
template <class Protector>
__global__ void __launch_bounds__(slot_traits::threads)
    selection_check_kernel(settings cfg, sequence_table seqs, eviction_state<memory_space::device> state,
                           selection_in sel, std::int32_t* page_counts) {
  allow_second_kernel();  // launch.cuh
  const auto b = static_cast<std::int32_t>(blockIdx.x);
  const sequence_check c = check_sequence(seqs, state, b, true);
  count_page_listings(seqs, b, c.length_ok, page_counts);
  const std::int32_t len = c.length;
  std::uint32_t bits = 0;
  if (c.length_ok) {
    const std::int32_t count = sel.counts[b];
    if (count < 0 || count > len || count > sel.stride) {
      bits |= status_selection;
    } else if (count > 0) {
      // Counters are only meaningful for a row that passed its checks.
      const bool counters_ok = c.row_ok && c.own == 0;
      if (counters_ok && c.tracked != len) bits |= status_untracked;
      const std::int32_t* list = sel.list(b);
      std::uint32_t mine = 0;
      for (std::int32_t k = threadIdx.x; k < count; k += slot_traits::threads) {
        const std::int32_t t = list[k];
        if (t < 0 || t >= len || (k > 0 && t <= list[k - 1])) {
          mine |= status_selection;
        } else if (counters_ok) {
          for (std::int32_t h = 0; h < state.shape.kv_heads; ++h)
            if (Protector::is_protected(state.positions[state.row_index(c.row, h, t)], c.next_position, cfg))
              mine |= status_selection_protected;
        }
      }
      bits |= block::block_or(mine);
    }
  }
  std::uint32_t own = c.own, batch_bits = c.batch;
  if (c.row_ok)
    own |= bits;
  else
    batch_bits |= bits;
  report(state, seqs.batch, c, own, batch_bits);
}

// Grid (kv_heads, batch). Applies the selection to head h of every live
// sequence with a non-zero count: compact (move_kv, fill_holes or
// preserve_order, paged: skipping a sequence whose written pages are listed
// twice) or forget (state only, stable). Sets tracked.
template <int = 0>  // a template so every translation unit may define it
__global__ void __launch_bounds__(compact_traits::threads)
    apply_selection_kernel(bool stable, bool move_kv, sequence_table seqs, row_planes planes,
                           eviction_state<memory_space::device> state, selection_in sel,
                           const std::int32_t* page_counts) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  const auto b = static_cast<std::int32_t>(blockIdx.y), h = static_cast<std::int32_t>(blockIdx.x);
  // Read once per block: another block of this sequence may be flagging it
  // (shared pages) while this one starts.
  const std::int32_t r = block_live_row(state, b);
  if (r < 0) return;
  const std::int32_t count = sel.counts[b];  // checked: the row is live
  if (count <= 0) return;
  const std::int32_t len = seqs.length(b), kept = len - count;
  const std::int32_t* list = sel.list(b);
  // Pages holding a slot of [first evicted, kept) are written: each must be
  // listed once (host::compact). Pages wholly below the first evicted slot,
  // such as a pinned shared prefix, may be shared. Every block of the
  // sequence finds the same and skips alike.
  if (page_counts != nullptr && list[0] < kept &&
      pages_listed_twice(seqs, b, list[0] / seqs.page_size, (kept - 1) / seqs.page_size, page_counts)) {
    if (threadIdx.x == 0) atomicOr(&state.status[r], status_shared_page);
    return;
  }
  compact_rows(stable, planes, move_kv, state, b, h, r, len, count, list);
  if (h == 0 && threadIdx.x == 0) state.tracked[r] = kept;
}

}  // namespace scissorhands::cuda::detail
