#pragma once
// Host backend, steps 3-4: when a sequence holds `budget` tokens or more,
// evict from every KV head the lowest-scoring unprotected tokens so that
// budget - m remain, and compact K, V and the state. A shared_heads policy
// evicts the same slots from every head of the layer (granularity.hpp); a
// shared_layers policy uses select (select.hpp) instead.
//
// Two-phase, like CUB: compress_workspace_bytes() first, then compress()
// with a buffer of at least that many bytes. No allocation inside.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../detail/eviction_key.hpp"
#include "detail/eviction.hpp"
#include "observe.hpp"

namespace scissorhands::host {

// Bytes of workspace compress needs for this cache and this state (sized by
// the smaller of the two capacities), and for a plan run in up to `slices`
// slices (each slice chooses in its own scratch).
template <class View>
std::size_t compress_workspace_bytes(const View& cache, const state_shape& state) {
  return detail::workspace_bytes(cache, detail::workspace_slots(cache, state.capacity), 1);
}
template <class View>
std::size_t compress_workspace_bytes(const View& cache, const state_shape& state, std::int32_t slices) {
  return detail::sliced_workspace_bytes("host::compress_workspace_bytes", cache, state.capacity, slices);
}
// The same for any state: sized by the cache's whole capacity.
template <class View>
std::size_t compress_workspace_bytes(const View& cache) {
  return detail::workspace_bytes(cache, detail::workspace_slots(cache, INT32_MAX), 1);
}
// The call both backends share (cuda::compress_workspace_bytes): sized
// from the policy and the shapes only, for any budget; only the view's
// shape fields are read, so a view built before its memory exists sizes it.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t compress_workspace_bytes(const Policy&, const View& cache, const state_shape& state) {
  return compress_workspace_bytes(cache, state);
}

namespace detail {

template <class Policy, class View>
auto plan_compress(const char* fn, const Policy& policy, View cache, eviction_state<memory_space::host> state,
                   std::int32_t budget, host_span<std::byte> workspace, compress_output<memory_space::host> out,
                   std::int32_t slices) {
  static_assert(View::space == memory_space::host, "host::compress needs a host view");
  static_assert(granularity_of<Policy> != granularity_kind::shared_layers,
                "a shared_layers policy evicts one set of slots for the whole model: observe every layer into a "
                "model_state, then host::select once per step and host::compact (or host::forget) per layer");
  constexpr bool shared = granularity_of<Policy> == granularity_kind::shared_heads;
  validate_common(fn, policy, cache, state);
  validate_budget(fn, policy, budget);
  const std::int32_t m = policy.config.evict_count;
  const std::int32_t slots = workspace_slots(cache, state.shape.capacity);
  validate_slices(fn, cache, slots, slices);
  const std::size_t need = workspace_bytes(cache, slots, slices);
  require(workspace.size() >= need, fn, "workspace", "holds ", workspace.size(),
          " bytes, below compress_workspace_bytes(cache, state.shape, slices = ", slices, ") = ", need);
  require(workspace.data() != nullptr, fn, "workspace", "must not be null");
  require(reinterpret_cast<std::uintptr_t>(workspace.data()) % alignof(candidate) == 0, fn, "workspace",
          "must be aligned to ", alignof(candidate), " bytes");
  constexpr bool paged = requires { cache.page_size; };
  validate_output(fn, cache, state, out, {workspace.data(), workspace.size(), "workspace"});
  validate_workspace_apart(fn, cache, state, {workspace.data(), need, "workspace"});
  // Every sequence that triggers must have state for all its tokens and
  // enough unprotected ones to evict (the state could have been damaged).
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    if (len < budget) continue;
    const std::int32_t r = state.row(b);
    require(state.tracked[r] == len, fn, "state", "tracks ", state.tracked[r], " of the ", len,
            " tokens of sequence ", b, ". Likely causes: tokens were appended and not observed (observe every "
            "layer after appending, before compress), or the previous compress's new_lengths were not applied to the "
            "cache's lengths (the length would then be ", state.tracked[r], "; admit would make stale rows tokens)");
    const std::int32_t evict = len - budget + m;
    const std::int32_t next = state.next_position[r];
    for (std::int32_t h = 0; h < cache.kv_heads; ++h) {
      // Hoisted row and a plain count, so the loop vectorises (it runs
      // before any slice: serial time).
      const std::int32_t* __restrict positions = state.positions + state.row_index(r, h, 0);
      std::int32_t free = 0;
      for (std::int32_t t = 0; t < len; ++t)
        free += Policy::protector::is_protected(positions[t], next, policy.config) ? 0 : 1;
      require(free >= evict, fn, "state.positions", "of sequence ", b, " head ", h, " leave ", free,
              " unprotected tokens, fewer than the ", evict, " to evict: positions are not unique");
      if constexpr (shared) {
        // One choice for all heads reads head 0's positions: every head
        // must hold the same token at every slot.
        const std::int64_t head0 = state.row_index(r, 0, 0), here = state.row_index(r, h, 0);
        for (std::int32_t t = 0; t < len; ++t)
          require(state.positions[here + t] == state.positions[head0 + t], fn, "state.positions", "of sequence ", b,
                  " slot ", t, " differ between head 0 and head ", h,
                  ": a shared_heads policy needs every head to hold the same token at a slot (was the "
                  "state compacted per head?)");
      }
    }
  }
  if constexpr (paged) {
    // A page compress rewrites must be listed once: a page that another
    // sequence (prefix sharing) or the same list also names would see rows
    // move under it. One mark per pool page after the slices' scratch,
    // cleared only where the table points, so the check costs O(pages
    // listed).
    unsigned char* mark = page_marks_of(workspace.data(), slots, slices);
    const std::int32_t listed = cache.indptr[cache.batch];
    for (std::int32_t i = 0; i < listed; ++i) mark[cache.indices[i]] = 0;
    for (std::int32_t b = 0; b < cache.batch; ++b)
      if (cache.length(b) >= budget)
        for (std::int32_t i = cache.indptr[b]; i < cache.indptr[b + 1]; ++i) mark[cache.indices[i]] = 1;
    for (std::int32_t i = 0; i < listed; ++i) {
      unsigned char& seen = mark[cache.indices[i]];
      require(seen != 2, fn, "cache.indices", "[", i, "] = ", cache.indices[i],
              " names a page that compress rewrites (its sequence is at the budget) and that is listed more "
              "than once: shared pages cannot be compacted in place");
      if (seen == 1) seen = 2;
    }
  }
  // What each sequence ends with does not depend on which tokens go: the
  // outputs and tracked counts are written here, the units only move.
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    const std::int32_t kept = len < budget ? len : budget - m;
    out.new_lengths[b] = kept;
    if (!out.freed_pages.empty()) out.freed_pages[b] = cache.pages_of(b) - cache.pages_for(kept);
    if (len >= budget) state.tracked[state.row(b)] = kept;
  }
  // One unit per (sequence, KV head), or per sequence when one choice
  // covers every head.
  const std::int64_t units = shared ? std::int64_t{cache.batch} : std::int64_t{cache.batch} * cache.kv_heads;
  std::byte* const base = workspace.data();
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t part) {
    const eviction_scratch scratch = scratch_of(base, slots, part);
    const settings& cfg = policy.config;
    for (std::int64_t unit = first_unit; unit < end_unit; ++unit) {
      const auto b = static_cast<std::int32_t>(shared ? unit : unit / cache.kv_heads);
      const std::int32_t len = cache.length(b);
      if (len < budget) continue;
      const std::int32_t r = state.row(b);
      const std::int32_t evict = len - budget + m;
      const std::int32_t kept = len - evict;
      if constexpr (shared) {
        choose_shared(policy, scissorhands::detail::single_layer(state), r, len, evict, 0, scratch);
        for_each_move(scratch.evicted, len, kept, cfg.compaction_mode, [&](std::int32_t from, std::int32_t to) {
          for (std::int32_t h = 0; h < cache.kv_heads; ++h) move_token(cache, state, b, h, from, to);
        });
      } else {
        const auto h = static_cast<std::int32_t>(unit % cache.kv_heads);
        const std::int64_t row = state.row_index(r, h, 0);
        const auto key_of = [&](std::int32_t t) {
          return scissorhands::detail::eviction_key(
              scissorhands::detail::pooled_eviction_score(state.scores + row, state.observed + row, t, len, cfg,
                                                          evicts_highest<typename Policy::observation>),
              state.positions[row + t]);
        };
        std::memset(scratch.evicted, 0, static_cast<std::size_t>(len));
        if (evict == 1) {
          // One victim (m = 1 at the budget, the decode-time case): the
          // smallest key in the same pass, no candidate list. Keys are
          // unique and an unprotected token exists (both checked).
          std::uint64_t best = 0;
          std::int32_t victim = -1;
          for (std::int32_t t = 0; t < len; ++t) {
            if (is_protected(policy, state, r, row + t)) continue;
            const std::uint64_t key = key_of(t);
            if (victim < 0 || key < best) best = key, victim = t;
          }
          scratch.evicted[victim] = 1;
        } else {
          std::int32_t count = 0;
          for (std::int32_t t = 0; t < len; ++t)
            if (!is_protected(policy, state, r, row + t)) scratch.candidates[count++] = {key_of(t), t};
          smallest_first(scratch.candidates, count, evict);
          for (std::int32_t k = 0; k < evict; ++k) scratch.evicted[scratch.candidates[k].slot] = 1;
        }
        for_each_move(scratch.evicted, len, kept, cfg.compaction_mode,
                      [&](std::int32_t from, std::int32_t to) { move_token(cache, state, b, h, from, to); });
      }
    }
  }, units, slices);
}

}  // namespace detail

// Evicts and compacts K, V and the state. The cache's lengths and page
// table are not written: out.new_lengths[b] gets every sequence's new length
// and out.freed_pages[b] (pages of several tokens: required; page size 1 and contiguous: optional) the
// trailing pages of its list it no longer uses. Apply them after the last
// layer that shares the table (shrink_page_table for a FlashInfer table).
// The workspace is scratch: its bytes are unspecified after the call,
// refused or not.
template <class Policy, class View>
  requires composed_policy<Policy>
void compress(const Policy& policy, View cache, eviction_state<memory_space::host> state, std::int32_t budget,
              host_span<std::byte> workspace, compress_output<memory_space::host> out) {
  static_assert(kv_rows_view<View>, "host::compress moves K/V rows and a token_table_view holds none: pass a "
                "kv_view / paged_kv_view, or (shared_layers) select once, free the slots and forget per layer");
  if constexpr (kv_rows_view<View>)
    detail::plan_compress("host::compress", policy, cache, state, budget, workspace, out, 1).run();
}

// compress as a plan (plan.hpp) for up to `slices` threads: validates and
// writes `out` and the tracked counts on the calling thread; its units are
// the (sequence, KV head) pairs, or the sequences for shared_heads. The
// workspace holds compress_workspace_bytes(cache, state.shape, slices).
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_compress(const Policy& policy, View cache, eviction_state<memory_space::host> state, std::int32_t budget,
                   host_span<std::byte> workspace, compress_output<memory_space::host> out, std::int32_t slices) {
  static_assert(kv_rows_view<View>, "host::plan_compress moves K/V rows and a token_table_view holds none: pass a "
                "kv_view / paged_kv_view, or (shared_layers) select once, free the slots and forget per layer");
  if constexpr (kv_rows_view<View>)
    return detail::plan_compress("host::plan_compress", policy, cache, state, budget, workspace, out, slices);
}

// Applies compress's new lengths to a FlashInfer page table, in place, once
// after the last layer that shares it: last_page_len is rewritten, the
// trailing pages each sequence no longer needs leave its list (indptr
// shrinks, indices close up), and their ids are written to `released` in
// order for the engine's pool. Returns how many were released. A length
// may only shrink (or stay): new_lengths[b] <= the length the table holds.
inline std::size_t shrink_page_table(host_span<std::int32_t> indptr, host_span<std::int32_t> indices,
                                     host_span<std::int32_t> last_page_len, std::int32_t page_size,
                                     host_span<const std::int32_t> new_lengths, host_span<std::int32_t> released) {
  const char* fn = "host::shrink_page_table";
  detail::require(!indptr.empty() && indptr.data() != nullptr, fn, "indptr", "must hold batch + 1 entries, got ",
                  indptr.size(), indptr.data() == nullptr ? " at a null pointer" : "");
  const std::size_t batch = indptr.size() - 1;
  detail::require(page_size > 0, fn, "page_size", "must be positive, got ", page_size);
  detail::require(new_lengths.size() == batch && (batch == 0 || new_lengths.data() != nullptr), fn, "new_lengths",
                  "must hold indptr.size() - 1 = ", batch, " entries, got ", new_lengths.size());
  detail::require(last_page_len.size() == batch && (batch == 0 || last_page_len.data() != nullptr), fn,
                  "last_page_len", "must hold indptr.size() - 1 = ", batch, " entries, got ", last_page_len.size());
  // The table is read and rewritten in place: it must be a CSR table from 0
  // (a negative start would read before indices).
  detail::require(indptr[0] == 0, fn, "indptr", "must start at 0, got ", indptr[0]);
  std::size_t total = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t pages = std::int64_t{indptr[b + 1]} - indptr[b];  // 64 bits: garbage must not overflow
    detail::require(pages >= 0, fn, "indptr", "must be non-decreasing; indptr[", b + 1, "] = ", indptr[b + 1],
                    " < indptr[", b, "] = ", indptr[b]);
    const std::int64_t held = pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
    detail::require(pages == 0 || (last_page_len[b] >= 1 && last_page_len[b] <= page_size), fn, "last_page_len", "[",
                    b, "] must be in [1, page_size = ", page_size, "], got ", last_page_len[b]);
    detail::require(new_lengths[b] >= 0 && new_lengths[b] <= held, fn, "new_lengths", "[", b, "] must be in [0, ",
                    held, "] (the length the table holds), got ", new_lengths[b]);
    total += static_cast<std::size_t>(pages - (std::int64_t{new_lengths[b]} + page_size - 1) / page_size);
  }
  detail::require(released.size() >= total, fn, "released", "must hold ", total, " entries, got ", released.size());
  detail::require(total == 0 || released.data() != nullptr, fn, "released", "must not be null");
  detail::require(static_cast<std::size_t>(indptr[batch]) <= indices.size(), fn, "indices",
                  "holds fewer entries than indptr[batch] = ", indptr[batch]);
  detail::require(indptr[batch] == 0 || indices.data() != nullptr, fn, "indices", "must not be null");
  // Everything is read while the table and `released` are written: no two
  // of the five arrays may share memory (one scratch buffer reused for two
  // of them would let a write change an input after validation).
  const detail::byte_range ranges[] = {
      detail::range_of(indptr, "indptr"), detail::range_of(indices, "indices"),
      detail::range_of(last_page_len, "last_page_len"), detail::range_of(new_lengths, "new_lengths"),
      {released.data(), total * sizeof(std::int32_t), "released"}};
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < i; ++j)
      detail::require(!detail::overlaps(ranges[i], ranges[j]), fn, ranges[i].name, "must not overlap ",
                      ranges[j].name);
  std::size_t out = 0;
  std::int32_t write = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int32_t begin = indptr[b], end = indptr[b + 1];
    const auto kept = static_cast<std::int32_t>((std::int64_t{new_lengths[b]} + page_size - 1) / page_size);
    indptr[b] = write;
    for (std::int32_t i = begin; i < begin + kept; ++i) indices[write++] = indices[i];
    for (std::int32_t i = begin + kept; i < end; ++i) released[out++] = indices[i];
    last_page_len[b] = kept == 0 ? 0 : new_lengths[b] - (kept - 1) * page_size;
  }
  indptr[batch] = write;
  return out;
}
// The same for the table a paged view (paged_kv_view, token_table_view)
// was made over, with the view's page size: the form to use when there is
// a view, since a page size passed apart from the table is not checked
// against it (told 8 for a table of 4-token pages, the other form releases
// pages that still hold kept tokens). The view's arrays must be the
// engine's writable table.
template <class View>
  requires page_table_view<View>
std::size_t shrink_page_table(const View& cache, host_span<const std::int32_t> new_lengths,
                              host_span<std::int32_t> released) {
  static_assert(View::space == memory_space::host, "host::shrink_page_table needs a host view");
  const auto table = detail::page_table_of("host::shrink_page_table", cache);
  return shrink_page_table(table.indptr, table.indices, table.last_page_len, table.page_size, new_lengths, released);
}

// The same call as cuda::shrink_page_table: the count goes to result[0]
// (status 0: the host throws on bad data instead).
inline void shrink_page_table(host_span<std::int32_t> indptr, host_span<std::int32_t> indices,
                              host_span<std::int32_t> last_page_len, std::int32_t page_size,
                              host_span<const std::int32_t> new_lengths, host_span<std::int32_t> released,
                              host_span<shrink_result> result) {
  detail::require(!result.empty() && result.data() != nullptr, "host::shrink_page_table", "result",
                  "must hold one shrink_result, got ", result.size());
  const std::size_t n = shrink_page_table(indptr, indices, last_page_len, page_size, new_lengths, released);
  result[0] = {static_cast<std::int32_t>(n), 0};
}
template <class View>
  requires page_table_view<View>
void shrink_page_table(const View& cache, host_span<const std::int32_t> new_lengths, host_span<std::int32_t> released,
                       host_span<shrink_result> result) {
  static_assert(View::space == memory_space::host, "host::shrink_page_table needs a host view");
  const auto table = detail::page_table_of("host::shrink_page_table", cache);
  shrink_page_table(table.indptr, table.indices, table.last_page_len, table.page_size, new_lengths, released, result);
}

}  // namespace scissorhands::host
