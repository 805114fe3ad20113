#pragma once
// compress: two kernels per call.
//
//   select_kernel   per_head: one block per (sequence, KV head). Checks the
//                   sequence (the host's validate_common and compress
//                   checks; bits go to its row's status word), records its
//                   length and (paged) counts its page listings, decides on
//                   the device whether it triggers (length >= budget),
//                   selects the e = length - budget + m lowest eviction keys
//                   among unprotected slots and writes their slots,
//                   ascending, to the workspace. It writes nothing the
//                   caller owns except status words. shared_heads uses
//                   select_shared_kernel (select.cuh) instead: one block per
//                   sequence, one list for every head.
//   compact_kernel  one block per (sequence, KV head): writes every
//                   sequence's compress_output, then moves K, V (a
//                   quantized cache: their codes and parameters) and state
//                   of the sequences whose row is live (status word still
//                   zero: a sequence with bad data changes nothing) and
//                   whose pages are listed once, and sets their tracked
//                   count.
//
// Why two: a sequence is all-or-nothing, and every head's block must know
// whether any check of the sequence failed before it moves a row; across
// the kernel boundary every status bit of the select kernel (and every page
// listing count) is visible. The compaction kernel reads the length from
// the workspace. compact_rows is shared with compact and forget (select.cuh).
#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "../../detail/eviction_key.hpp"
#include "../../compress_output.hpp"
#include "../../eviction_state.hpp"
#include "../../policy/eviction_policy.hpp"
#include "../block/collectives.cuh"
#include "../block/radix_select.cuh"
#include "../block/row_move.cuh"
#include "../detail/tables.cuh"
#include "../launch.cuh"
#include "../traits.cuh"
#include "check.cuh"

namespace scissorhands::cuda::detail {

// The workspace of compress and select: the length each sequence had at the
// start of the call, per (sequence, list) the evicted slots (max_evict
// entries: the most a sequence within min(cache capacity, state capacity)
// evicts; one list per KV head for per_head eviction, one per sequence for
// the shared granularities), for a paged compress one listing count per
// pool page (the shared-page check), and for the shared granularities the
// keys of sequences too long for the selection's shared-memory tile.
struct compress_workspace {
  std::int32_t* lengths = nullptr;      // [batch]
  std::int32_t* evicted = nullptr;      // [batch][lists][max_evict]
  std::int32_t* page_counts = nullptr;  // [pages] or null
  std::uint64_t* keys = nullptr;        // [batch][key_slots] or null
  std::int32_t max_evict = 0;
  std::int32_t lists = 1;      // kv_heads (per_head) or 1 (shared_heads, shared_layers)
  std::int32_t key_slots = 0;  // 0 unless a sequence may hold more than select_traits::tile_keys slots

  static constexpr std::size_t alignment = 256;

  // What a call needs; bytes() and carve() agree on the layout.
  struct sizes {
    std::int32_t batch = 0, lists = 1, max_evict = 0, pages = 0, key_slots = 0;
  };
  struct offsets {
    std::size_t evicted, page_counts, keys, total;
  };
  static std::size_t align(std::size_t x) { return (x + alignment - 1) / alignment * alignment; }
  static offsets layout(const sizes& n) {
    const auto batch = static_cast<std::size_t>(n.batch);
    offsets o{};
    o.evicted = align(batch * sizeof(std::int32_t));
    o.page_counts = align(o.evicted + batch * static_cast<std::size_t>(n.lists) *
                                          static_cast<std::size_t>(n.max_evict) * sizeof(std::int32_t));
    o.keys = align(o.page_counts + static_cast<std::size_t>(n.pages) * sizeof(std::int32_t));
    o.total = o.keys + batch * static_cast<std::size_t>(n.key_slots) * sizeof(std::uint64_t);
    return o;
  }
  static std::size_t bytes(const sizes& n) { return layout(n).total; }
  static compress_workspace carve(void* base, const sizes& n) {
    const offsets o = layout(n);
    auto* at = static_cast<std::byte*>(base);
    compress_workspace ws;
    ws.lengths = reinterpret_cast<std::int32_t*>(at);
    ws.evicted = reinterpret_cast<std::int32_t*>(at + o.evicted);
    ws.page_counts = n.pages > 0 ? reinterpret_cast<std::int32_t*>(at + o.page_counts) : nullptr;
    ws.keys = n.key_slots > 0 ? reinterpret_cast<std::uint64_t*>(at + o.keys) : nullptr;
    ws.max_evict = n.max_evict;
    ws.lists = n.lists;
    ws.key_slots = n.key_slots;
    return ws;
  }
  // The list of sequence b, head h (every head shares one when lists == 1).
  __device__ std::int32_t* list(std::int32_t b, std::int32_t h) const {
    return evicted + (std::int64_t{b} * lists + (lists == 1 ? 0 : h)) * max_evict;
  }
};

// The eviction key of slot t, or ignored_key for a protected token. Host
// and device, like lowest_of_thread and lowest_key_op below: the
// differential suite's argmin part runs them on the host.
template <class Protector, bool HighestFirst>
struct key_of_slot {
  settings cfg;
  const std::int32_t* positions;
  const float* scores;
  const float* observed;
  std::int32_t next_position;
  std::int32_t length;  // the row's length (pooling reads neighbours up to it)
  SCISSORHANDS_HOST_DEVICE std::uint64_t operator()(std::int32_t t) const {
    const std::int32_t position = positions[t];
    if (Protector::is_protected(position, next_position, cfg)) return block::ignored_key;
    return scissorhands::detail::eviction_key(
        scissorhands::detail::pooled_eviction_score(scores, observed, t, length, cfg, HighestFirst), position);
  }
  // The same from a slot's values already loaded (no pooling: pool_width <= 1).
  SCISSORHANDS_HOST_DEVICE std::uint64_t of(std::int32_t position, float score, float seen) const {
    if (Protector::is_protected(position, next_position, cfg)) return block::ignored_key;
    return scissorhands::detail::eviction_key(scissorhands::detail::eviction_score(score, seen, cfg, HighestFirst),
                                              position);
  }
};

// The lowest key of slots thread, thread + Threads, ... < len (thread is
// threadIdx.x in a kernel), ties to the lower slot, and how many keys were
// not ignored. Without pooling, a thread loads the position, score and
// observed count of `Items` slots before it looks at any, so the loop waits
// on one memory latency per Items x Threads slots (2,048 at the defaults:
// one for a decode-sized head) instead of one or two per slot.
template <int Threads, int Items, class Protector, bool HighestFirst>
SCISSORHANDS_HOST_DEVICE inline void lowest_of_thread(const key_of_slot<Protector, HighestFirst>& from_state,
                                                      std::int32_t thread, std::int32_t len, std::uint64_t& best,
                                                      std::int32_t& slot, std::int32_t& count) {
  auto consider = [&](std::int32_t t, std::uint64_t key) {
    if (key == block::ignored_key) return;
    ++count;
    if (key < best) best = key, slot = t;
  };
  if (from_state.cfg.pool_width > 1) {
    for (std::int32_t t = thread; t < len; t += Threads) consider(t, from_state(t));
    return;
  }
  for (std::int32_t t0 = thread; t0 < len; t0 += Threads * Items) {
    // Not zero-initialised: that costs select_kernel a 16-byte spill
    // (ptxas, sm_90); one guard covers the loads and the uses.
    std::int32_t position[Items];
    float score[Items], seen[Items];
    SCISSORHANDS_UNROLL
    for (int k = 0; k < Items; ++k) {
      const std::int32_t t = t0 + k * Threads;
      if (t < len) {
        position[k] = from_state.positions[t];
        score[k] = from_state.scores[t];
        seen[k] = from_state.observed[t];
      }
    }
    SCISSORHANDS_UNROLL
    for (int k = 0; k < Items; ++k) {
      const std::int32_t t = t0 + k * Threads;
      if (t < len) consider(t, from_state.of(position[k], score[k], seen[k]));
    }
  }
}

// The lowest key and its slot, and how many keys were seen (e == 1).
struct lowest_key {
  std::uint64_t key;
  std::int32_t slot;
  std::int32_t count;
};
struct lowest_key_op {
  // Selects by value: a reference to a or b would take their addresses and
  // push CUB's shuffles through local memory.
  SCISSORHANDS_HOST_DEVICE lowest_key operator()(const lowest_key& a, const lowest_key& b) const {
    const bool take_b = b.key < a.key || (b.key == a.key && b.slot < a.slot);
    return {take_b ? b.key : a.key, take_b ? b.slot : a.slot, a.count + b.count};
  }
};

struct key_in_tile {
  const std::uint64_t* keys;
  __device__ std::uint64_t operator()(std::int32_t t) const { return keys[t]; }
};

template <class Protector, bool HighestFirst>
__global__ void __launch_bounds__(select_traits::threads)
    select_kernel(settings cfg, sequence_table seqs, eviction_state<memory_space::device> state, std::int32_t budget,
                  compress_workspace ws) {
  allow_second_kernel();  // launch.cuh
  using traits = select_traits;
  __shared__ std::uint64_t tile[traits::tile_keys];
  __shared__ block::radix_select_storage<traits::threads> storage;
  __shared__ typename cub::BlockReduce<lowest_key, traits::threads>::TempStorage lowest_storage;
  const auto b = static_cast<std::int32_t>(blockIdx.y), h = static_cast<std::int32_t>(blockIdx.x);
  sequence_check seq = check_sequence(seqs, state, b, h == 0);
  const std::int32_t len = seq.length;
  if (seq.row_ok && seq.own == 0 && len >= budget && seq.tracked != len) seq.own |= status_untracked;
  const std::int32_t e = len - budget + cfg.evict_count;
  if (seq.row_ok && seq.own == 0 && len >= budget && e > ws.max_evict)
    seq.own |= status_state_capacity;  // cannot happen after the checks
  if (h == 0) {
    if (threadIdx.x == 0) ws.lengths[b] = len;  // for the outputs, whatever the checks say
    count_page_listings(seqs, b, seq.length_ok, ws.page_counts);
    report(state, seqs.batch, seq, seq.own, seq.batch);
  }
  // A row already flagged (by an earlier call, or by another block just
  // now) wastes no time; the compaction kernel decides. Read once for the
  // whole block: the word may be changing.
  if (!seq.row_ok || seq.own != 0 || seq.batch != 0 || len < budget) return;
  const std::int32_t r = block_live_row(state, b);
  if (r < 0) return;

  const std::int64_t base = state.row_index(r, h, 0);
  const key_of_slot<Protector, HighestFirst> from_state{cfg, state.positions + base, state.scores + base, state.observed + base,
                                          seq.next_position, len};
  std::int32_t* out = ws.list(b, h);
  if (e == 1) {
    // m = 1 at the budget, the decode steady state: an argmin, one pass.
    lowest_key mine{block::ignored_key, -1, 0};
    lowest_of_thread<traits::threads, select_traits::argmin_items>(from_state, static_cast<std::int32_t>(threadIdx.x),
                                                                   len, mine.key, mine.slot, mine.count);
    const lowest_key all = cub::BlockReduce<lowest_key, traits::threads>(lowest_storage).Reduce(mine, lowest_key_op{});
    if (threadIdx.x == 0) {
      if (all.count < 1)
        atomicOr(&state.status[r], status_positions);
      else
        out[0] = all.slot;
    }
    return;
  }
  std::int32_t listed;
  if (len <= traits::tile_keys) {
    const block::key_stats stats = block::gather_key_stats<traits::threads>(
        from_state, len, [&](std::int32_t t, std::uint64_t key) { tile[t] = key; }, storage);
    if (stats.count < e) {
      if (threadIdx.x == 0) atomicOr(&state.status[r], status_positions);
      return;
    }
    const key_in_tile cached{tile};
    const std::uint64_t threshold = block::radix_select<traits::threads>(cached, len, e, stats, storage);
    listed = block::list_selected<traits::threads>(cached, len, threshold, out, e, storage);
  } else {
    // Beyond shared memory: recompute every key from the state on each pass.
    const block::key_stats stats =
        block::gather_key_stats<traits::threads>(from_state, len, [](std::int32_t, std::uint64_t) {}, storage);
    if (stats.count < e) {
      if (threadIdx.x == 0) atomicOr(&state.status[r], status_positions);
      return;
    }
    const std::uint64_t threshold = block::radix_select<traits::threads>(from_state, len, e, stats, storage);
    listed = block::list_selected<traits::threads>(from_state, len, threshold, out, e, storage);
  }
  // Unique keys (unique positions) list exactly e; duplicates, which only a
  // damaged state has, are clipped to the lowest slots. Defensive only.
  if (listed != e && threadIdx.x == 0) atomicOr(&state.status[r], status_positions);
}

// One row of the state arrays or of K / V, addressed by slot.
struct strided_rows {
  std::byte* base;
  std::int64_t stride;
  __device__ std::byte* operator()(std::int32_t t) const { return base + t * stride; }
};
struct k_rows {
  row_table<std::byte> rows;
  std::int32_t b, h;
  __device__ std::byte* operator()(std::int32_t t) const { return rows.k_row(b, h, t); }
};
struct v_rows {
  row_table<std::byte> rows;
  std::int32_t b, h;
  __device__ std::byte* operator()(std::int32_t t) const { return rows.v_row(b, h, t); }
};

// Closes the holes the `e` evicted slots (`evicted`, ascending, in
// [0, len)) leave in head h of sequence b, state row r: fill_holes moves the
// survivors above len - e into the holes below it, both ascending (the
// host's pairing); `stable` (preserve_order, and forget) shifts every
// survivor down in slot order. Moves the K and V rows of every plane (a
// quantized cache: codes, then parameters) when `move_kv` (compress,
// compact) and always the token state, all with the same slots. All
// threads of the block; tracked is the caller's.
__device__ inline void compact_rows(bool stable, const row_planes& planes, bool move_kv,
                                    const eviction_state<memory_space::device>& state, std::int32_t b, std::int32_t h,
                                    std::int32_t r, std::int32_t len, std::int32_t e, const std::int32_t* evicted) {
  using traits = compact_traits;
  // The shift's stage is the launch's dynamic shared memory
  // (compact_traits::stage_bytes when stable, else none): fill_holes
  // launches do not reserve it.
  extern __shared__ uint4 stage[];
  __shared__ std::int32_t src_slot[traits::pair_batch], dst_slot[traits::shift_group];
  const std::int32_t kept = len - e;
  const std::int64_t base = state.row_index(r, h, 0);
  const std::int32_t words = state.shape.ring_words;
  // A token's history is `words` words capacity x 4 bytes apart (word-major).
  const std::int64_t ring_unit_stride = std::int64_t{state.shape.capacity} * 4;
  const strided_rows pos_at{reinterpret_cast<std::byte*>(state.positions + base), 4};
  const strided_rows score_at{reinterpret_cast<std::byte*>(state.scores + base), 4};
  const strided_rows observed_at{reinterpret_cast<std::byte*>(state.observed + base), 4};
  const strided_rows ring_at{reinterpret_cast<std::byte*>(state.ring_of_head(r, h)), 4};

  if (!stable) {
    // holes: evicted slots below kept (a prefix of the ascending list).
    std::int32_t lo = 0, hi = e;
    while (lo < hi) {
      const std::int32_t mid = (lo + hi) / 2;
      if (evicted[mid] < kept) lo = mid + 1; else hi = mid;
    }
    const std::int32_t holes = lo;
    const std::int32_t* above = evicted + holes;  // evicted slots >= kept
    const std::int32_t n_above = e - holes;
    for (std::int32_t first = 0; first < holes; first += traits::pair_batch) {
      const std::int32_t pairs = holes - first < traits::pair_batch ? holes - first : traits::pair_batch;
      // Pair i: the i-th hole takes the i-th surviving slot above kept, both
      // ascending (the host's pairing). The i-th survivor is kept + i + c,
      // c = #{j : above[j] - kept - j <= i} (evicted slots before it).
      for (std::int32_t p = threadIdx.x; p < pairs; p += traits::threads) {
        const std::int32_t i = first + p;
        std::int32_t l = 0, u = n_above;
        while (l < u) {
          const std::int32_t mid = (l + u) / 2;
          if (above[mid] - kept - mid <= i) l = mid + 1; else u = mid;
        }
        dst_slot[p] = evicted[i];
        src_slot[p] = kept + i + l;
      }
      __syncthreads();
      // Each move starts on the thread after the previous one's last unit:
      // at m = 1 (one pair: a K and a V row, three words, the ring words)
      // every unit is on its own thread and all the loads are in flight at
      // once, rather than thread 0 waiting on six loads one after another.
      std::int64_t used = 0;
      auto move = [&](auto row_at, std::int64_t row_bytes, std::int32_t vec, std::int64_t unit_stride) {
        block::move_rows<traits::threads>(row_at, row_bytes, vec, unit_stride, src_slot, dst_slot, pairs,
                                          static_cast<std::int32_t>(used % traits::threads));
        used += row_bytes / vec * pairs;
      };
      // Unrolled over the planes a view can have, so `planes` stays in the
      // kernel's parameters (a run-time index copies it to local memory).
      if (move_kv)
#pragma unroll
        for (int p = 0; p < row_planes::max_planes; ++p) {
          if (p >= planes.count) break;
          const std::int32_t vec = planes.vec[p];
          move(k_rows{planes.rows[p], b, h}, planes.row_bytes[p], vec, vec);
          move(v_rows{planes.rows[p], b, h}, planes.row_bytes[p], vec, vec);
        }
      move(pos_at, 4, 4, 4);
      move(score_at, 4, 4, 4);
      move(observed_at, 4, 4, 4);
      if (words > 0) move(ring_at, std::int64_t{words} * 4, 4, ring_unit_stride);
      __syncthreads();
    }
  } else {
    // Every array in one staged pass (block::shift_rows): K and V of each
    // plane when they move, then the token state.
    const block::shifted_rows<strided_rows> pos{pos_at, 4, 4, 4}, score{score_at, 4, 4, 4},
        observed{observed_at, 4, 4, 4}, ring{ring_at, std::int64_t{words} * 4, 4, ring_unit_stride};
    auto* staging = reinterpret_cast<std::byte*>(stage);
    auto shift = [&](auto... arrays) {
      block::shift_rows<traits::threads>(evicted, e, len, staging, traits::stage_bytes, dst_slot, traits::shift_group,
                                         arrays..., pos, score, observed, ring);
    };
    // Plane p's K and V rows, by constant index, so `planes` stays in the
    // kernel's parameters (a run-time index copies it to local memory).
    auto kv_of = [&](auto rows_of, int p) {
      return block::shifted_rows<decltype(rows_of)>{rows_of, planes.row_bytes[p], planes.vec[p], planes.vec[p]};
    };
    if (!move_kv || planes.count == 0)
      shift();
    else if (planes.count == 1)
      shift(kv_of(k_rows{planes.rows[0], b, h}, 0), kv_of(v_rows{planes.rows[0], b, h}, 0));
    else
      shift(kv_of(k_rows{planes.rows[0], b, h}, 0), kv_of(v_rows{planes.rows[0], b, h}, 0),
            kv_of(k_rows{planes.rows[1], b, h}, 1), kv_of(v_rows{planes.rows[1], b, h}, 1));
  }
}

template <int = 0>  // a template so every translation unit may define it
__global__ void __launch_bounds__(compact_traits::threads)
    compact_kernel(settings cfg, sequence_table seqs, row_planes planes, eviction_state<memory_space::device> state,
                   std::int32_t budget, compress_workspace ws, std::int32_t* new_lengths, std::int32_t* freed_pages) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  const auto b = static_cast<std::int32_t>(blockIdx.y), h = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t len = ws.lengths[b];
  if (h == 0 && threadIdx.x == 0) {
    // Every sequence, skipped or not: length_after_compress, so that what an
    // engine mirrors on the host and the pages it releases always agree.
    const std::int32_t after = length_after_compress(len, budget, cfg.evict_count);
    new_lengths[b] = after;
    if (freed_pages != nullptr) {
      const std::int32_t freed = len >= budget ? seqs.pages_of(b) - seqs.pages_for(after) : 0;
      freed_pages[b] = freed > 0 ? freed : 0;
    }
  }
  if (len < budget) return;
  // Read once per block: another block of this sequence may be flagging it
  // (shared pages) while this one starts.
  const std::int32_t r = block_live_row(state, b);
  if (r < 0) return;
  // A page of a sequence at the budget listed twice (shared with another
  // sequence, or twice in its own list) would see rows move under the
  // other listing: the sequence is skipped (host: compress refuses). Every
  // block of the sequence finds the same and skips alike.
  if (ws.page_counts != nullptr && pages_listed_twice(seqs, b, 0, seqs.pages_of(b) - 1, ws.page_counts)) {
    if (threadIdx.x == 0) atomicOr(&state.status[r], status_shared_page);
    return;
  }
  const std::int32_t e = len - budget + cfg.evict_count;
  compact_rows(cfg.compaction_mode == compaction::preserve_order, planes, true, state, b, h, r, len, e, ws.list(b, h));
  if (h == 0 && threadIdx.x == 0) state.tracked[r] = len - e;
}

}  // namespace scissorhands::cuda::detail
