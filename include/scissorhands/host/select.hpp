#pragma once
// Host backend, shared_layers eviction (granularity.hpp): one choice of
// slots per sequence for every head of every layer, as engines whose cache
// slot is one token for the whole model need (vLLM's block table, SGLang's
// token pool, llama.cpp's cells).
//
//   per step:  observe layer l into model.layer(l), for every layer
//              select(policy, cache, model, budget, workspace, selection)
//   then either (block-table engines: vLLM, FlashInfer)
//              compact(policy, cache_of_layer(l), model.layer(l), selection, ...) for every layer
//              shrink_page_table(..., selection.out.new_lengths, ...) once
//   or (slot-allocator engines: SGLang, llama.cpp)
//              free selection.cache_slots in the engine's allocator and
//              remove them from the sequence's token list, keeping the order
//              forget(policy, cache, model.layer(l), selection) for every layer
//
// select moves no data and writes only the selection; compact and forget
// apply one selection to one layer. Each validates everything it reads
// before writing anything; none allocates.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../model_state.hpp"
#include "../partial_scores.hpp"
#include "../selection.hpp"
#include "detail/eviction.hpp"
#include "observe.hpp"

namespace scissorhands::host {

// Bytes of workspace select needs for this cache and this state shape (the
// shape of one layer), for a plan run in up to `slices` slices.
template <class View>
std::size_t select_workspace_bytes(const View& cache, const state_shape& state) {
  return detail::workspace_bytes(cache, detail::workspace_slots(cache, state.capacity), 1);
}
template <class View>
std::size_t select_workspace_bytes(const View& cache, const state_shape& state, std::int32_t slices) {
  return detail::sliced_workspace_bytes("host::select_workspace_bytes", cache, state.capacity, slices);
}
// The call both backends share (cuda::select_workspace_bytes): the policy
// and the shapes only, for any budget.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t select_workspace_bytes(const Policy&, const View& cache, const state_shape& state) {
  return select_workspace_bytes(cache, state);
}

// Bytes of workspace compact needs: one mark per pool page (paged caches,
// for the shared-page check); 0 for a contiguous cache.
template <class View>
std::size_t compact_workspace_bytes(const View& cache) {
  if constexpr (requires { cache.num_pages; })
    return static_cast<std::size_t>(std::max(cache.num_pages, 0));
  else
    return 0;
}

namespace detail {

// The selection compact and forget read: counts per sequence within
// [0, length] and the stride, slots strictly ascending in [0, length), none
// protected in this layer's state, and the state tracking every token.
template <class Policy, class View>
void validate_selection_input(const char* fn, const Policy& policy, const View& cache,
                              const eviction_state<memory_space::host>& state,
                              const eviction_selection<memory_space::host>& sel) {
  require(sel.stride >= 0, fn, "selection.stride", "must be non-negative, got ", sel.stride);
  require(sel.counts.size() == static_cast<std::size_t>(cache.batch) && (cache.batch == 0 || sel.counts.data()), fn,
          "selection.counts", "must hold batch = ", cache.batch, " entries (non-null), got ", sel.counts.size());
  const std::size_t entries = static_cast<std::size_t>(cache.batch) * static_cast<std::size_t>(sel.stride);
  require(sel.slots.size() >= entries && (entries == 0 || sel.slots.data() != nullptr), fn, "selection.slots",
          "must hold batch * stride = ", entries, " entries (non-null), got ", sel.slots.size());
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t count = sel.counts[b];
    const std::int32_t len = cache.length(b);
    require(count >= 0 && count <= len && count <= sel.stride, fn, "selection.counts", "[", b,
            "] must be in [0, min(length ", len, ", stride ", sel.stride, ")], got ", count);
    if (count == 0) continue;
    const std::int32_t r = state.row(b);
    require(state.tracked[r] == len, fn, "state", "tracks ", state.tracked[r], " of the ", len,
            " tokens of sequence ", b, ": apply a selection to the state it was made from");
    const std::int32_t* slots = sel.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(sel.stride);
    for (std::int32_t k = 0; k < count; ++k) {
      require(slots[k] >= 0 && slots[k] < len && (k == 0 || slots[k] > slots[k - 1]), fn, "selection.slots", "[",
              std::int64_t{b} * sel.stride + k, "] = ", slots[k], " must be in [0, ", len,
              ") and above the entry before it (each sequence's slots ascending, no slot twice)");
      for (std::int32_t h = 0; h < state.shape.kv_heads; ++h)
        require(!is_protected(policy, state, r, state.row_index(r, h, slots[k])), fn, "selection.slots", "[",
                std::int64_t{b} * sel.stride + k, "] = ", slots[k], " is a protected token of sequence ", b,
                " (head ", h, ", position ", state.positions[state.row_index(r, h, slots[k])],
                "): was the selection made for another step or state?");
    }
  }
}

// Applies the selection to sequences [first, end) of one layer:
// `Move(b, from, to)` moves one slot for every head; slots keep their
// order when `stable`.
template <class View, class Move>
void apply_selection(const View& cache, const eviction_state<memory_space::host>& state,
                     const eviction_selection<memory_space::host>& sel, bool stable, std::int32_t first,
                     std::int32_t end, Move&& move) {
  for (std::int32_t b = first; b < end; ++b) {
    const std::int32_t count = sel.counts[b];
    if (count == 0) continue;
    const std::int32_t len = cache.length(b);
    const std::int32_t kept = len - count;
    const std::int32_t* slots = sel.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(sel.stride);
    if (!stable) {
      // fill_holes without flags: the holes below `kept` are the first
      // entries of the ascending list, the survivors above it are the slots
      // of [kept, len) the rest of the list does not name.
      std::int32_t next = 0;  // entries of the list below kept come first
      while (next < count && slots[next] < kept) ++next;
      std::int32_t above = next, source = kept;
      for (std::int32_t k = 0; k < next; ++k) {
        while (above < count && slots[above] == source) ++above, ++source;
        move(b, source, slots[k]);
        ++source;
      }
    } else {
      std::int32_t to = slots[0], k = 0;
      for (std::int32_t from = slots[0]; from < len; ++from) {
        if (k < count && slots[k] == from) {
          ++k;
          continue;
        }
        move(b, from, to++);
      }
    }
    state.tracked[state.row(b)] = kept;
  }
}

}  // namespace detail

namespace detail {

// What select and local_scores check of the model: laid out, every layer
// valid for the cache and the policy, the budget, and for every sequence at
// the budget: every layer tracks all its tokens at the same positions in
// every head, and enough of them are neither protected nor pinned.
template <class Policy, class View>
void validate_model_for_select(const char* fn, const Policy& policy, const View& cache,
                               const model_state<memory_space::host>& model, std::int32_t budget,
                               host_span<const std::int32_t> pinned_prefix) {
  static_assert(View::space == memory_space::host, "host::select needs a host view");
  static_assert(granularity_of<Policy> == granularity_kind::shared_layers,
                "host::select chooses one set of slots for the whole model: give the policy a shared_layers "
                "granularity (with_granularity<Policy, shared_layers<>>); per_head and shared_heads policies "
                "evict layer by layer with host::compress");
  require(model.layers > 0 && model.first.step != nullptr, fn, "model", "is not laid out: build it with "
          "make_model_state");
  require(model.layer_bytes == state_bytes(model.first.shape), fn, "model.layer_bytes",
          "must be state_bytes(shape) = ", state_bytes(model.first.shape), " (make_model_state sets it), got ",
          model.layer_bytes);
  for (std::int32_t l = 0; l < model.layers; ++l) validate_common(fn, policy, cache, model.layer(l));
  validate_budget(fn, policy, budget);
  const std::int32_t m = policy.config.evict_count;
  const state_shape& shape = model.first.shape;
  // Read below, before select's other output checks.
  validate_pinned_prefix_span(fn, pinned_prefix, static_cast<std::size_t>(cache.batch));
  // Every sequence that triggers: every layer tracks all its tokens, at the
  // same positions in every head and layer, and enough of them are neither
  // protected nor pinned.
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    const std::int32_t pinned = pinned_prefix.empty() ? 0 : pinned_prefix[b];
    require(pinned >= 0 && pinned <= len, fn, "pinned_prefix", "[", b, "] must be in [0, ", len,
            "] (the sequence's length), got ", pinned);
    if (len < budget) continue;
    const std::int32_t r = model.first.row(b);
    const eviction_state<memory_space::host> first = model.first;
    const std::int64_t base = first.row_index(r, 0, 0);
    for (std::int32_t l = 0; l < model.layers; ++l) {
      const eviction_state<memory_space::host> s = model.layer(l);
      require(s.tracked[r] == len, fn, "model", "layer ", l, " tracks ", s.tracked[r], " of the ", len,
              " tokens of sequence ", b, ". Likely causes: a layer was not observed after appending (observe, or admit "
              "for tokens without queries, every layer before select), or the previous step's new lengths were not "
              "applied to the cache's lengths");
      require(s.next_position[r] == first.next_position[r], fn, "model", "layer ", l,
              " has next_position ", s.next_position[r], " for sequence ", b, ", layer 0 has ",
              first.next_position[r], ": every layer must see the same tokens");
      for (std::int32_t h = 0; h < shape.kv_heads; ++h) {
        const std::int32_t* __restrict here = s.positions + s.row_index(r, h, 0);
        const std::int32_t* __restrict there = first.positions + base;
        // A branch-free pass (vectorised); the slot is looked up only to
        // name it in the error.
        std::int32_t differ = 0;
        for (std::int32_t t = 0; t < len; ++t) differ |= here[t] ^ there[t];
        if (differ == 0) [[likely]]
          continue;
        std::int32_t t = 0;
        while (here[t] == there[t]) ++t;
        fail(fn, "model", "layer ", l, " head ", h, " holds position ", here[t], " at slot ", t,
             " of sequence ", b, ", layer 0 head 0 holds ", there[t],
             ": shared_layers needs one token per slot in every layer and head (was a layer compressed on "
             "its own?)");
      }
    }
    const std::int32_t evict = len - budget + m;
    std::int32_t free = 0;
    for (std::int32_t t = pinned; t < len; ++t) free += !is_protected(policy, first, r, base + t);
    require(free >= evict, fn, pinned > 0 ? "pinned_prefix" : "state.positions", "of sequence ", b,
            " leave ", free, " tokens that are neither protected nor pinned, fewer than the ", evict,
            " to evict (pinned ", pinned, ", budget ", budget, ")");
  }

}

template <class Policy, class View>
auto plan_local_scores(const char* fn, const Policy& policy, View cache, model_state<memory_space::host> model,
                       std::int32_t budget, partial_scores<memory_space::host> partial) {
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "local_scores splits the head reduction across ranks: the granularity's head_reduction needs "
                "`static constexpr all_reduce_op all_reduce` (mean_score and max_score have it)");
  validate_model_for_select(fn, policy, cache, model, budget, {});
  validate_partial_scores(fn, "partial", partial, cache, model);
  validate_workspace_apart(fn, cache, model.first.state_rows, model_range(model),
                           {partial.values.data(), partial.values.size() * sizeof(float), "partial.values"});
  using Heads = typename Policy::granularity::head_reduction;
  // One unit per sequence: its rows of every layer.
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t) {
    for (auto b = static_cast<std::int32_t>(first_unit); b < end_unit; ++b) {
      const std::int32_t len = cache.length(b);
      const std::int32_t filled = len >= budget ? len : 0;  // sequences below the budget: identity
      const std::int32_t r = model.first.row(b);
      for (std::int32_t l = 0; l < model.layers; ++l) {
        float* row = partial.row(l, b);
        if (filled > 0) head_partial(policy, model.layer(l), r, filled, row);
        std::fill(row + filled, row + partial.capacity, Heads::identity());
      }
    }
  }, std::int64_t{cache.batch});
}

template <class Policy, class View>
auto plan_select(const char* fn, const Policy& policy, View cache, model_state<memory_space::host> model,
                 std::int32_t budget, host_span<std::byte> workspace, eviction_selection<memory_space::host> selection,
                 host_span<const std::int32_t> pinned_prefix, std::int32_t slices,
                 const partial_scores<memory_space::host>* reduced = nullptr) {
  constexpr bool paged = requires { cache.page_size; };
  validate_model_for_select(fn, policy, cache, model, budget, pinned_prefix);
  const std::int32_t m = policy.config.evict_count;
  const state_shape& shape = model.first.shape;
  // Workspace.
  const std::int32_t slots = workspace_slots(cache, shape.capacity);
  validate_slices(fn, cache, slots, slices);
  const std::size_t need = workspace_bytes(cache, slots, slices);
  require(workspace.size() >= need, fn, "workspace", "holds ", workspace.size(),
          " bytes, below select_workspace_bytes(cache, shape, slices = ", slices, ") = ", need);
  require(workspace.data() != nullptr, fn, "workspace", "must not be null");
  require(reinterpret_cast<std::uintptr_t>(workspace.data()) % alignof(candidate) == 0, fn,
          "workspace", "must be aligned to ", alignof(candidate), " bytes");
  const bool from_reduced = reduced != nullptr;
  const partial_scores<memory_space::host> scores = from_reduced ? *reduced : partial_scores<memory_space::host>{};
  if (from_reduced) validate_partial_scores(fn, "reduced", scores, cache, model);
  validate_selection_output(fn, cache, model, budget, m, selection, pinned_prefix,
                            {workspace.data(), need, "workspace"},
                            {scores.values.data(), scores.values.size() * sizeof(float), "reduced.values"});
  // One unit per sequence; each writes only its own entries of the selection.
  std::byte* const base = workspace.data();
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t part) {
    const eviction_scratch scratch = scratch_of(base, slots, part);
    for (auto b = static_cast<std::int32_t>(first_unit); b < end_unit; ++b) {
      const std::int32_t len = cache.length(b);
      selection.out.new_lengths[b] = len;
      if (!selection.out.freed_pages.empty()) selection.out.freed_pages[b] = 0;
      selection.counts[b] = 0;
      if (len < budget) continue;
      const std::int32_t r = model.first.row(b);
      const std::int32_t evict = len - budget + m;
      const std::int32_t pinned = pinned_prefix.empty() ? 0 : pinned_prefix[b];
      if (from_reduced) {
        combine_reduced_scores<Policy>(scores, b, len, scratch);
        choose_lowest(policy, model.first, r, len, evict, pinned, scratch);
      } else {
        choose_shared(policy, model, r, len, evict, pinned, scratch);
      }
      const std::size_t at = static_cast<std::size_t>(b) * static_cast<std::size_t>(selection.stride);
      std::size_t k = 0;
      for (std::int32_t t = 0; t < len; ++t) {
        if (!scratch.evicted[t]) continue;
        selection.slots[at + k] = t;
        if (!selection.cache_slots.empty()) {
          if constexpr (paged)
            selection.cache_slots[at + k] =
                cache.indices[cache.indptr[b] + t / cache.page_size] * cache.page_size + t % cache.page_size;
          else
            selection.cache_slots[at + k] = t;
        }
        ++k;
      }
      selection.counts[b] = evict;
      selection.out.new_lengths[b] = len - evict;
      if (!selection.out.freed_pages.empty()) selection.out.freed_pages[b] = cache.pages_of(b) - cache.pages_for(len - evict);
    }
  }, std::int64_t{cache.batch}, slices);
}

}  // namespace detail

// Chooses, for every sequence holding `budget` tokens or more, the
// length - budget + m slots to evict from the whole model: each slot's
// eviction score is combined over the heads of every layer of `model`
// (Policy::granularity, a shared_layers<HeadReduction, LayerReduction>),
// the protector's tokens and the first pinned_prefix[b] slots of sequence b
// (a prefix shared with other requests, e.g. SGLang's radix cache) are
// never chosen, and ties go to the older token. Writes, for every
// sequence, selection.counts, the ascending slots (and cache_slots when
// given) and out.new_lengths / out.freed_pages; moves nothing. `cache` is
// any layer's view: select reads its lengths and page table only.
template <class Policy, class View>
  requires composed_policy<Policy>
void select(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
            host_span<std::byte> workspace, eviction_selection<memory_space::host> selection,
            host_span<const std::int32_t> pinned_prefix = {}) {
  detail::plan_select("host::select", policy, cache, model, budget, workspace, selection, pinned_prefix, 1).run();
}
// select as a plan (plan.hpp) for up to `slices` threads: validates on the
// calling thread; its units are the sequences. The workspace holds
// select_workspace_bytes(cache, shape, slices).
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_select(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
                 host_span<std::byte> workspace, eviction_selection<memory_space::host> selection,
                 host_span<const std::int32_t> pinned_prefix, std::int32_t slices) {
  return detail::plan_select("host::plan_select", policy, cache, model, budget, workspace, selection, pinned_prefix,
                             slices);
}

// Tensor parallelism (partial_scores.hpp, docs/tensor_parallel.md): this
// rank's share of select. Writes `partial` (layers x batch x capacity
// floats): for every sequence at the budget, each layer's head reduction
// of this rank's heads' eviction scores, before finish; the reduction's
// identity elsewhere. Checks what select checks of the model; moves
// nothing. The engine then all-reduces `partial` over the ranks with
// all_reduce_op_of<Policy> and passes it to select below.
template <class Policy, class View>
  requires composed_policy<Policy>
void local_scores(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
                  partial_scores<memory_space::host> partial) {
  detail::plan_local_scores("host::local_scores", policy, cache, model, budget, partial).run();
}
// local_scores as a plan (plan.hpp); its units are the sequences.
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_local_scores(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
                       partial_scores<memory_space::host> partial) {
  return detail::plan_local_scores("host::plan_local_scores", policy, cache, model, budget, partial);
}

// select from the all-reduced partial scores of every rank: each layer's
// head reduction finished over reduced.kv_heads heads, then select's
// layer reduction, protection, pinning and tie-break, on this rank's
// model (its positions and lengths). Ranks given the same reduced bits
// choose the same slots. With one rank (reduced = this rank's
// local_scores, kv_heads its own) the same as select above, bit for bit.
template <class Policy, class View>
  requires composed_policy<Policy>
void select(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
            partial_scores<memory_space::host> reduced, host_span<std::byte> workspace,
            eviction_selection<memory_space::host> selection, host_span<const std::int32_t> pinned_prefix = {}) {
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "select from reduced scores needs a head_reduction with `static constexpr all_reduce_op all_reduce`");
  detail::plan_select("host::select", policy, cache, model, budget, workspace, selection, pinned_prefix, 1, &reduced)
      .run();
}
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_select(const Policy& policy, View cache, model_state<memory_space::host> model, std::int32_t budget,
                 partial_scores<memory_space::host> reduced, host_span<std::byte> workspace,
                 eviction_selection<memory_space::host> selection, host_span<const std::int32_t> pinned_prefix,
                 std::int32_t slices) {
  static_assert(splittable_reduction<typename Policy::granularity::head_reduction>,
                "select from reduced scores needs a head_reduction with `static constexpr all_reduce_op all_reduce`");
  return detail::plan_select("host::plan_select", policy, cache, model, budget, workspace, selection, pinned_prefix,
                             slices, &reduced);
}

namespace detail {

template <class Policy, class View>
auto plan_compact(const char* fn, const Policy& policy, View cache, eviction_state<memory_space::host> state,
                  eviction_selection<memory_space::host> selection, host_span<std::byte> workspace) {
  static_assert(View::space == memory_space::host, "host::compact needs a host view");
  constexpr bool paged = requires { cache.page_size; };
  validate_common(fn, policy, cache, state);
  validate_selection_input(fn, policy, cache, state, selection);
  const std::size_t need = compact_workspace_bytes(cache);
  require(workspace.size() >= need && (need == 0 || workspace.data() != nullptr), fn, "workspace", "holds ",
          workspace.size(), " bytes, below compact_workspace_bytes(cache) = ", need);
  validate_workspace_apart(fn, cache, state, {workspace.data(), need, "workspace"});
  {
    byte_range kv[2], params[2];
    kv_ranges(cache, kv);
    params_ranges(cache, params);
    const byte_range written[] = {kv[0], kv[1], params[0], params[1],
                                  {state.step, offsets_of(state.shape).total, "the state"},
                                  {workspace.data(), workspace.size(), "workspace"}};
    const std::size_t entries = static_cast<std::size_t>(cache.batch) * static_cast<std::size_t>(selection.stride);
    const byte_range read[] = {range_of(selection.counts, "selection.counts"),
                               {selection.slots.data(), entries * sizeof(std::int32_t), "selection.slots"}};
    for (const byte_range& w : written)
      for (const byte_range& r : read)
        require(!overlaps(w, r), fn, r.name, "must not overlap ", w.name,
                " (the call reads it while writing)");
  }
  if constexpr (paged) {
    // Pages that will be written: those holding a slot of [first evicted,
    // kept) of a sequence that evicts. They must be listed once.
    auto* mark = reinterpret_cast<unsigned char*>(workspace.data());
    const std::int32_t listed = cache.indptr[cache.batch];
    for (std::int32_t i = 0; i < listed; ++i) mark[cache.indices[i]] = 0;
    const auto written_pages = [&](std::int32_t b, auto&& each) {
      const std::int32_t count = selection.counts[b];
      if (count == 0) return;
      const std::int32_t first = selection.slots[static_cast<std::size_t>(b) * static_cast<std::size_t>(selection.stride)];
      const std::int32_t kept = cache.length(b) - count;
      if (first >= kept) return;  // only the tail goes: nothing is written
      for (std::int32_t p = first / cache.page_size; p <= (kept - 1) / cache.page_size; ++p)
        each(cache.indptr[b] + p);
    };
    for (std::int32_t b = 0; b < cache.batch; ++b) written_pages(b, [&](std::int32_t i) { mark[cache.indices[i]] = 1; });
    for (std::int32_t i = 0; i < listed; ++i) {
      unsigned char& seen = mark[cache.indices[i]];
      require(seen != 2, fn, "cache.indices", "[", i, "] = ", cache.indices[i],
              " names a page that compact rewrites and that is listed more than once: shared pages can only "
              "lie below a sequence's first evicted slot (pin them in select)");
      if (seen == 1) seen = 2;
    }
  }
  // One unit per sequence.
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t) {
    apply_selection(cache, state, selection, policy.config.compaction_mode == compaction::preserve_order,
                    static_cast<std::int32_t>(first_unit), static_cast<std::int32_t>(end_unit),
                    [&](std::int32_t b, std::int32_t from, std::int32_t to) {
                      for (std::int32_t h = 0; h < cache.kv_heads; ++h) move_token(cache, state, b, h, from, to);
                    });
  }, std::int64_t{cache.batch});
}

}  // namespace detail

// Applies a selection to one layer: evicts its slots from every head and
// closes the holes in K, V and the layer's state (settings.compaction_mode,
// as compress). Call it for every layer with the same selection, then apply
// selection.out once (shrink_page_table). Lengths and the page table are
// read, not written. A page that would be written (one holding a slot in
// [first evicted slot, new length) of its sequence) must be listed once;
// pages wholly below a sequence's first evicted slot, such as a shared
// prefix pinned in select, may be shared.
template <class Policy, class View>
  requires composed_policy<Policy>
void compact(const Policy& policy, View cache, eviction_state<memory_space::host> state,
             eviction_selection<memory_space::host> selection, host_span<std::byte> workspace = {}) {
  static_assert(kv_rows_view<View>, "host::compact moves K/V rows and a token_table_view holds none: free "
                "selection.cache_slots in the engine's allocator and call host::forget per layer instead");
  if constexpr (kv_rows_view<View>)
    detail::plan_compact("host::compact", policy, cache, state, selection, workspace).run();
}
// compact as a plan (plan.hpp): validates on the calling thread; its units
// are the sequences.
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_compact(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                  eviction_selection<memory_space::host> selection, host_span<std::byte> workspace = {}) {
  static_assert(kv_rows_view<View>, "host::plan_compact moves K/V rows and a token_table_view holds none: free "
                "selection.cache_slots in the engine's allocator and call host::plan_forget per layer instead");
  if constexpr (kv_rows_view<View>)
    return detail::plan_compact("host::plan_compact", policy, cache, state, selection, workspace);
}

namespace detail {

template <class Policy, class View>
auto plan_forget(const char* fn, const Policy& policy, View cache, eviction_state<memory_space::host> state,
                 eviction_selection<memory_space::host> selection) {
  static_assert(View::space == memory_space::host, "host::forget needs a host view");
  validate_common(fn, policy, cache, state);
  validate_selection_input(fn, policy, cache, state, selection);
  const std::size_t entries = static_cast<std::size_t>(cache.batch) * static_cast<std::size_t>(selection.stride);
  const byte_range the_state{state.step, offsets_of(state.shape).total, "the state"};
  const byte_range read[] = {range_of(selection.counts, "selection.counts"),
                             {selection.slots.data(), entries * sizeof(std::int32_t), "selection.slots"}};
  for (const byte_range& r : read)
    require(!overlaps(the_state, r), fn, r.name, "must not overlap the state");
  // One unit per sequence.
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t) {
    apply_selection(cache, state, selection, true, static_cast<std::int32_t>(first_unit),
                    static_cast<std::int32_t>(end_unit), [&](std::int32_t b, std::int32_t from, std::int32_t to) {
                      for (std::int32_t h = 0; h < cache.kv_heads; ++h)
                        move_state(state, state.row(b), h, from, to);
                    });
  }, std::int64_t{cache.batch});
}

}  // namespace detail

// Applies a selection to one layer's state only, for an engine that freed
// the slots in its own allocator (selection.cache_slots) and removed them
// from each sequence's token list keeping the others in order: the state
// drops the same slots and keeps its order too, whatever
// settings.compaction_mode says. K and V are not touched; `cache` gives
// the lengths before the removal.
template <class Policy, class View>
  requires composed_policy<Policy>
void forget(const Policy& policy, View cache, eviction_state<memory_space::host> state,
            eviction_selection<memory_space::host> selection) {
  detail::plan_forget("host::forget", policy, cache, state, selection).run();
}
// forget as a plan (plan.hpp): validates on the calling thread; its units
// are the sequences.
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_forget(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                 eviction_selection<memory_space::host> selection) {
  return detail::plan_forget("host::plan_forget", policy, cache, state, selection);
}

}  // namespace scissorhands::host
