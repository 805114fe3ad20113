#pragma once
// Host backend, steps 3-4: when a sequence holds `budget` tokens or more,
// evict from every KV head the lowest-scoring unprotected tokens so that
// budget - m remain, and compact K, V and the state.
//
// Two-phase, like CUB: compress_workspace_bytes() first, then compress()
// with a buffer of at least that many bytes. No allocation inside.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../detail/eviction_key.hpp"
#include "observe.hpp"

namespace scissorhands::host {

namespace detail {

struct candidate {
  std::uint64_t key;
  std::int32_t slot;
};

// Moves token `from` to slot `to` of head h: K and V rows and all its state.
template <class View>
inline void move_token(const View& cache, const eviction_state<memory_space::host>& state, std::int32_t b,
                       std::int32_t h, std::int32_t from, std::int32_t to) {
  using T = typename View::element_type;
  const std::size_t row = sizeof(T) * static_cast<std::size_t>(cache.head_dim);
  std::memcpy(cache.k_row(b, h, to), cache.k_row(b, h, from), row);
  std::memcpy(cache.v_row(b, h, to), cache.v_row(b, h, from), row);
  const std::int64_t src = state.index(b, h, from);
  const std::int64_t dst = state.index(b, h, to);
  state.positions[dst] = state.positions[src];
  state.scores[dst] = state.scores[src];
  state.observed[dst] = state.observed[src];
  const std::int32_t words = state.shape.ring_words;
  if (words > 0)
    std::memcpy(state.ring_of(dst), state.ring_of(src), sizeof(std::uint32_t) * static_cast<std::size_t>(words));
}

template <class Policy>
inline bool is_protected(const Policy& policy, const eviction_state<memory_space::host>& state, std::int32_t b,
                         std::int64_t i) {
  return Policy::protector::is_protected(state.positions[i], state.next_position[b], policy.config);
}

}  // namespace detail

// Bytes of workspace compress needs for this cache.
template <class View>
std::size_t compress_workspace_bytes(const View& cache) {
  const auto slots = static_cast<std::size_t>(std::max(cache.max_capacity(), 0));
  std::size_t bytes = slots * sizeof(detail::candidate) + slots;  // candidates + evicted flags
  if constexpr (requires { cache.num_pages; })
    bytes += static_cast<std::size_t>(std::max(cache.num_pages, 0));  // one mark per pool page
  return bytes;
}

// Evicts and compacts. `freed_pages` (paged views only; batch entries) gets
// the number of trailing pages each sequence no longer uses. The workspace
// is scratch: its bytes are unspecified after the call, refused or not.
template <class Policy, class View>
  requires composed_policy<Policy>
void compress(const Policy& policy, View cache, eviction_state<memory_space::host> state, std::int32_t budget,
              host_span<std::byte> workspace, host_span<std::int32_t> freed_pages = {}) {
  const char* fn = "host::compress";
  static_assert(View::space == memory_space::host, "host::compress needs a host view");
  detail::validate_common(fn, policy, cache, state);
  detail::validate_budget(fn, policy, budget);
  const std::int32_t m = policy.config.evict_count;
  const std::size_t need = compress_workspace_bytes(cache);
  detail::require(workspace.size() >= need, fn, "workspace", "holds ", workspace.size(),
                  " bytes, below compress_workspace_bytes = ", need);
  detail::require(workspace.data() != nullptr, fn, "workspace", "must not be null");
  detail::require(reinterpret_cast<std::uintptr_t>(workspace.data()) % alignof(detail::candidate) == 0, fn,
                  "workspace", "must be aligned to ", alignof(detail::candidate), " bytes");
  constexpr bool paged = requires { cache.page_size; };
  detail::validate_freed_pages(fn, cache, freed_pages);
  // Every sequence that triggers must have state for all its tokens and
  // enough unprotected ones to evict (the state could have been damaged).
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    if (len < budget) continue;
    detail::require(state.tracked[b] == len, fn, "state", "tracks ", state.tracked[b], " of the ", len,
                    " tokens of sequence ", b, ": call observe (or admit) after appending, before compress");
    const std::int32_t evict = len - budget + m;
    for (std::int32_t h = 0; h < cache.kv_heads; ++h) {
      std::int32_t free = 0;
      for (std::int32_t t = 0; t < len; ++t) free += !detail::is_protected(policy, state, b, state.index(b, h, t));
      detail::require(free >= evict, fn, "state.positions", "of sequence ", b, " head ", h, " leave ", free,
                      " unprotected tokens, fewer than the ", evict, " to evict: positions are not unique");
    }
  }
  if constexpr (paged) {
    // A page compress rewrites must be listed once: a page that another
    // sequence (prefix sharing) or the same list also names would see rows
    // move under it. One mark per pool page in the workspace, cleared only
    // where the table points, so the check costs O(pages listed).
    auto* mark = reinterpret_cast<unsigned char*>(workspace.data()) +
                 static_cast<std::size_t>(cache.max_capacity()) * (sizeof(detail::candidate) + 1);
    const std::int32_t listed = cache.indptr[cache.batch];
    for (std::int32_t i = 0; i < listed; ++i) mark[cache.indices[i]] = 0;
    for (std::int32_t b = 0; b < cache.batch; ++b)
      if (cache.length(b) >= budget)
        for (std::int32_t i = cache.indptr[b]; i < cache.indptr[b + 1]; ++i) mark[cache.indices[i]] = 1;
    for (std::int32_t i = 0; i < listed; ++i) {
      unsigned char& seen = mark[cache.indices[i]];
      detail::require(seen != 2, fn, "cache.indices", "[", i, "] = ", cache.indices[i],
                      " names a page that compress rewrites (its sequence is at the budget) and that is listed more "
                      "than once: shared pages cannot be compacted in place");
      if (seen == 1) seen = 2;
    }
  }

  auto* candidates = reinterpret_cast<detail::candidate*>(workspace.data());
  auto* evicted = reinterpret_cast<unsigned char*>(workspace.data()) +
                  static_cast<std::size_t>(cache.max_capacity()) * sizeof(detail::candidate);
  const settings& cfg = policy.config;
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    if (len < budget) {
      if (!freed_pages.empty()) freed_pages[b] = 0;
      continue;
    }
    const std::int32_t evict = len - budget + m;
    const std::int32_t kept = len - evict;
    for (std::int32_t h = 0; h < cache.kv_heads; ++h) {
      std::int32_t count = 0;
      for (std::int32_t t = 0; t < len; ++t) {
        const std::int64_t i = state.index(b, h, t);
        if (detail::is_protected(policy, state, b, i)) continue;
        candidates[count++] = {
            scissorhands::detail::eviction_key(
                scissorhands::detail::eviction_score(state.scores[i], state.observed[i], cfg), state.positions[i]),
            t};
      }
      // The `evict` smallest keys, in linear time; keys are unique (positions
      // are). One eviction (m = 1 at the budget) is a plain minimum scan,
      // several times cheaper than nth_element's partitioning.
      const auto by_key = [](const detail::candidate& a, const detail::candidate& c) { return a.key < c.key; };
      if (evict == 1)
        std::iter_swap(candidates, std::min_element(candidates, candidates + count, by_key));
      else
        std::nth_element(candidates, candidates + (evict - 1), candidates + count, by_key);
      std::memset(evicted, 0, static_cast<std::size_t>(len));
      for (std::int32_t k = 0; k < evict; ++k) evicted[candidates[k].slot] = 1;
      if (cfg.compaction_mode == compaction::fill_holes) {
        // Holes below `kept` take the surviving tokens above it, both in
        // ascending slot order: O(evict) moves.
        std::int32_t source = kept;
        for (std::int32_t hole = 0; hole < kept; ++hole) {
          if (!evicted[hole]) continue;
          while (evicted[source]) ++source;
          detail::move_token(cache, state, b, h, source, hole);
          ++source;
        }
      } else {
        std::int32_t to = 0;
        for (std::int32_t from = 0; from < len; ++from) {
          if (evicted[from]) continue;
          if (from != to) detail::move_token(cache, state, b, h, from, to);
          ++to;
        }
      }
    }
    const std::int32_t freed = cache.shrink(b, kept);
    if (!freed_pages.empty()) freed_pages[b] = freed;
    state.tracked[b] = kept;
  }
}

// Drops the pages compress reported free from a FlashInfer page table, in
// place: indptr shrinks, indices close up, and the freed page ids are
// written to `released` in order. Returns how many were released.
inline std::size_t release_freed_pages(host_span<std::int32_t> indptr, host_span<std::int32_t> indices,
                                       host_span<const std::int32_t> freed_pages, host_span<std::int32_t> released) {
  const char* fn = "host::release_freed_pages";
  detail::require(!indptr.empty() && indptr.data() != nullptr, fn, "indptr", "must hold batch + 1 entries, got ",
                  indptr.size(), indptr.data() == nullptr ? " at a null pointer" : "");
  detail::require(freed_pages.size() + 1 == indptr.size(), fn, "freed_pages",
                  "must hold indptr.size() - 1 entries, got ", freed_pages.size());
  detail::require(freed_pages.empty() || freed_pages.data() != nullptr, fn, "freed_pages", "must not be null");
  // The table is read and rewritten in place: it must be a CSR table from 0
  // (a negative start would read before indices).
  detail::require(indptr[0] == 0, fn, "indptr", "must start at 0, got ", indptr[0]);
  std::size_t total = 0;
  for (std::size_t b = 0; b < freed_pages.size(); ++b) {
    const std::int64_t pages = std::int64_t{indptr[b + 1]} - indptr[b];  // 64 bits: garbage must not overflow
    detail::require(pages >= 0, fn, "indptr", "must be non-decreasing; indptr[", b + 1, "] = ", indptr[b + 1],
                    " < indptr[", b, "] = ", indptr[b]);
    detail::require(freed_pages[b] >= 0 && freed_pages[b] <= pages, fn, "freed_pages", "[", b, "] must be in [0, ",
                    pages, "], got ", freed_pages[b]);
    total += static_cast<std::size_t>(freed_pages[b]);
  }
  detail::require(released.size() >= total, fn, "released", "must hold ", total, " entries, got ", released.size());
  detail::require(total == 0 || released.data() != nullptr, fn, "released", "must not be null");
  detail::require(static_cast<std::size_t>(indptr[freed_pages.size()]) <= indices.size(), fn, "indices",
                  "holds fewer entries than indptr[batch] = ", indptr[freed_pages.size()]);
  detail::require(indptr[freed_pages.size()] == 0 || indices.data() != nullptr, fn, "indices", "must not be null");
  std::size_t out = 0;
  std::int32_t write = 0;
  for (std::size_t b = 0; b < freed_pages.size(); ++b) {
    const std::int32_t begin = indptr[b], end = indptr[b + 1];
    const std::int32_t keep_end = end - freed_pages[b];
    indptr[b] = write;
    for (std::int32_t i = begin; i < keep_end; ++i) indices[write++] = indices[i];
    for (std::int32_t i = keep_end; i < end; ++i) released[out++] = indices[i];
  }
  indptr[freed_pages.size()] = write;
  return out;
}

}  // namespace scissorhands::host
