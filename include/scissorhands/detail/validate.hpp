#pragma once
// Checks shared by both backends that need no access to device memory.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../compress_output.hpp"
#include "eviction_key.hpp"
#include "../error.hpp"
#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../model_state.hpp"
#include "../paged_kv_view.hpp"
#include "../partial_scores.hpp"
#include "../policy/eviction_policy.hpp"
#include "../selection.hpp"

namespace scissorhands::detail {

template <class Policy>
void validate_settings(const char* fn, const Policy& policy) {
  const settings& s = policy.config;
  require(s.recent >= 0, fn, "settings.recent", "must be non-negative, got ", s.recent);
  require(s.sinks >= 0, fn, "settings.sinks", "must be non-negative, got ", s.sinks);
  require(s.evict_count >= 1, fn, "settings.evict_count", "must be at least 1, got ", s.evict_count);
  if constexpr (std::is_same_v<typename Policy::history, sliding_window>)
    require(s.window >= 1, fn, "settings.window", "must be at least 1, got ", s.window);
  if constexpr (std::is_same_v<typename Policy::observation, important_indicator> ||
                std::is_same_v<typename Policy::observation, unimportant_indicator>)
    require(std::isfinite(s.alpha) && s.alpha > 0.0f, fn, "settings.alpha", "must be finite and positive, got ",
            s.alpha);
  if constexpr (std::is_same_v<typename Policy::history, exponential_decay>)
    require(s.decay > 0.0f && s.decay <= 1.0f, fn, "settings.decay", "must be in (0, 1], got ", s.decay);
  require(s.compaction_mode == compaction::fill_holes || s.compaction_mode == compaction::preserve_order, fn,
          "settings.compaction_mode", "must be fill_holes or preserve_order, got ",
          static_cast<int>(s.compaction_mode));
  require(s.pool_width >= 1 && s.pool_width <= max_pool_width && s.pool_width % 2 == 1, fn, "settings.pool_width",
          "must be odd and in [1, ", max_pool_width, "] (1 = no pooling), got ", s.pool_width);
  require(s.pool_mode == pooling::max || s.pool_mode == pooling::mean, fn, "settings.pool_mode",
          "must be pooling::max or pooling::mean, got ", static_cast<int>(s.pool_mode));
  require(s.pool_width == 1 || s.compaction_mode == compaction::preserve_order, fn, "settings.pool_width",
          "> 1 pools each token with its neighbouring slots, which hold its neighbouring positions only when "
          "compaction keeps insertion order: set settings.compaction_mode = compaction::preserve_order (got pool_width ",
          s.pool_width, " with fill_holes)");
}

template <class Policy>
void validate_budget(const char* fn, const Policy& policy, std::int32_t budget) {
  const settings& s = policy.config;
  const std::int64_t protect = Policy::protector::protected_count(s);
  require(budget > protect, fn, "budget", "must exceed the protected tokens (recent ", s.recent, " + sinks ", s.sinks,
          " = ", protect, "), got ", budget);
  require(s.evict_count <= budget - protect, fn, "settings.evict_count", "must be at most budget - protected = ",
          budget, " - ", protect, " = ", budget - protect, ", got ", s.evict_count);
}

// The state must have been made for this cache and this policy. What needs
// the data (rows in range and distinct, lengths within the state's capacity)
// is checked per backend: the host reads it, the device checks it itself.
template <class Policy, class View, memory_space Space>
void validate_state_matches(const char* fn, const Policy& policy, const View& cache, const eviction_state<Space>& st) {
  validate_state(fn, st.shape, st.step);
  // No mapping is {nullptr, 0}; a null pointer with a size is a caller's bug.
  require(st.state_rows.data() != nullptr || st.state_rows.empty(), fn, "state.state_rows",
          "must not be null when its size is ", st.state_rows.size());
  if (st.state_rows.data() == nullptr)
    require(st.shape.rows >= cache.batch, fn, "state.shape.rows",
            "must be at least cache.batch = ", cache.batch, " when no state_rows map the batch, got ", st.shape.rows);
  else
    require(st.state_rows.size() == static_cast<std::size_t>(cache.batch), fn, "state.state_rows",
            "must hold batch = ", cache.batch, " entries, got ", st.state_rows.size());
  require(st.shape.kv_heads == cache.kv_heads, fn, "state.shape.kv_heads", "must equal cache.kv_heads = ",
          cache.kv_heads, ", got ", st.shape.kv_heads);
  require(st.shape.ring_words == policy.ring_words(), fn, "state.shape.ring_words",
          "must equal policy.ring_words() = ", policy.ring_words(), " (was the state made for another policy?), got ",
          st.shape.ring_words);
}

// A byte range a call reads or writes, for the overlap checks.
struct byte_range {
  const void* data;
  std::size_t bytes;
  const char* name;
};

template <class T, memory_space Space>
byte_range range_of(const span<T, Space>& s, const char* name) {
  return {s.data(), s.size() * sizeof(T), name};
}

// True when two byte ranges share a byte (empty or null ranges never do).
inline bool overlaps(const byte_range& a, const byte_range& b) {
  if (a.data == nullptr || b.data == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a.data), pb = reinterpret_cast<std::uintptr_t>(b.data);
  return pa < pb + b.bytes && pb < pa + a.bytes;
}

// The parameter buffers of a quantized cache (empty ranges otherwise):
// moved with the codes, so the overlap checks treat them as K and V.
template <class View>
void params_ranges(const View& cache, byte_range (&r)[2]) {
  if constexpr (requires { cache.k_params; }) {
    r[0] = range_of(cache.k_params, "cache.k_params");
    r[1] = range_of(cache.v_params, "cache.v_params");
  } else {
    r[0] = r[1] = byte_range{nullptr, 0, ""};
  }
}

// K and V (empty ranges for a token_table_view, which has none).
template <class View>
void kv_ranges(const View& cache, byte_range (&r)[2]) {
  if constexpr (requires { cache.k_pages; }) {
    r[0] = range_of(cache.k_pages, "cache.k_pages");
    r[1] = range_of(cache.v_pages, "cache.v_pages");
  } else if constexpr (requires { cache.k; }) {
    r[0] = range_of(cache.k, "cache.k");
    r[1] = range_of(cache.v, "cache.v");
  } else {
    r[0] = r[1] = byte_range{nullptr, 0, ""};
  }
}

// compress's outputs: new_lengths one entry per sequence; freed_pages one
// per sequence for a paged cache with pages of several tokens, empty or one
// per sequence otherwise (contiguous: all 0; page size 1: the trailing
// slots a compaction emptied, which equal length - new length, and which a
// slot-allocator engine must not free: it frees selection.cache_slots). Neither may overlap anything the call reads or moves (lengths, page
// table, state rows, the state, K, V and a quantized cache's parameters,
// the workspace) nor each other: writing
// an output would otherwise change an input under the call.
template <class View, memory_space Space>
void validate_output(const char* fn, const View& cache, const eviction_state<Space>& state,
                     const compress_output<Space>& out, byte_range workspace,
                     const char* new_lengths_name = "out.new_lengths",
                     const char* freed_pages_name = "out.freed_pages") {
  constexpr bool paged = requires { cache.page_size; };
  require(out.new_lengths.size() == static_cast<std::size_t>(cache.batch) && out.new_lengths.data() != nullptr, fn,
          new_lengths_name, "must hold batch = ", cache.batch, " entries (non-null), got ", out.new_lengths.size(),
          out.new_lengths.data() == nullptr ? " at a null pointer" : "");
  std::int32_t page_size = 0;  // 0: contiguous
  if constexpr (paged) page_size = cache.page_size;
  if (page_size > 1)
    require(out.freed_pages.size() == static_cast<std::size_t>(cache.batch) && out.freed_pages.data() != nullptr, fn,
            freed_pages_name, "must hold batch = ", cache.batch, " entries for a paged cache of page_size ",
            page_size, " > 1, got ", out.freed_pages.size());
  else
    require(out.freed_pages.empty() ||
                (out.freed_pages.size() == static_cast<std::size_t>(cache.batch) && out.freed_pages.data() != nullptr),
            fn, freed_pages_name, "must be empty or hold batch = ", cache.batch, " entries (non-null), got ",
            out.freed_pages.size(), out.freed_pages.data() == nullptr ? " at a null pointer" : "");
  const byte_range state_bytes_range{state.step, state.step == nullptr ? 0 : offsets_of(state.shape).total,
                                     "the state"};
  byte_range kv[2], params[2];
  kv_ranges(cache, kv);
  params_ranges(cache, params);
  const byte_range inputs[] = {
      [&] {
        if constexpr (paged) return range_of(cache.last_page_len, "cache.last_page_len");
        else return range_of(cache.lengths, "cache.lengths");
      }(),
      [&] {
        if constexpr (paged) return range_of(cache.indptr, "cache.indptr");
        else return byte_range{nullptr, 0, ""};
      }(),
      [&] {
        if constexpr (paged) return range_of(cache.indices, "cache.indices");
        else return byte_range{nullptr, 0, ""};
      }(),
      range_of(state.state_rows, "state.state_rows"),
      state_bytes_range,
      kv[0],
      kv[1],
      params[0],
      params[1],
      workspace,
  };
  const byte_range outputs[] = {range_of(out.new_lengths, new_lengths_name),
                                range_of(out.freed_pages, freed_pages_name)};
  for (const byte_range& o : outputs)
    for (const byte_range& i : inputs)
      require(!overlaps(o, i), fn, o.name, "must not overlap ", i.name,
              " (the call reads it while writing its outputs; apply new lengths after the call)");
  require(!overlaps(outputs[0], outputs[1]), fn, freed_pages_name, "must not overlap ", new_lengths_name);
}

// A workspace is written while the call reads the cache (a quantized
// cache's parameters too), the table, the state rows and the state: it must
// share no byte with any of them (page
// marks written over `indices` would change the table mid-call).
// What a call reads of the cache besides K and V: the lengths (contiguous)
// or last_page_len, indptr and indices (paged).
template <class View>
void table_ranges(const View& cache, byte_range (&r)[3]) {
  if constexpr (requires { cache.page_size; }) {
    r[0] = range_of(cache.last_page_len, "cache.last_page_len");
    r[1] = range_of(cache.indptr, "cache.indptr");
    r[2] = range_of(cache.indices, "cache.indices");
  } else {
    r[0] = range_of(cache.lengths, "cache.lengths");
    r[1] = r[2] = byte_range{nullptr, 0, ""};
  }
}

template <memory_space Space>
byte_range model_range(const model_state<Space>& model) {
  return {model.first.step,
          model.first.step == nullptr ? 0 : model.layer_bytes * static_cast<std::size_t>(model.layers),
          "the model state"};
}

template <class View, memory_space Space>
void validate_workspace_apart(const char* fn, const View& cache, const span<const std::int32_t, Space>& state_rows,
                              byte_range state, byte_range workspace) {
  byte_range table[3], kv[2], params[2];
  table_ranges(cache, table);
  kv_ranges(cache, kv);
  params_ranges(cache, params);
  const byte_range read[] = {table[0], table[1], table[2], kv[0], kv[1], params[0], params[1],
                             range_of(state_rows, "state.state_rows"), state};
  for (const byte_range& r : read)
    require(!overlaps(workspace, r), fn, workspace.name, "must not overlap ", r.name,
            " (the call writes its workspace while reading it)");
}
template <class View, memory_space Space>
void validate_workspace_apart(const char* fn, const View& cache, const eviction_state<Space>& state,
                              byte_range workspace) {
  const byte_range the_state{state.step, state.step == nullptr ? 0 : offsets_of(state.shape).total, "the state"};
  validate_workspace_apart(fn, cache, state.state_rows, the_state, workspace);
}

// pinned_prefix's span (select, and local_scores through the same model
// checks): empty, or batch entries at a non-null address.
template <memory_space Space>
void validate_pinned_prefix_span(const char* fn, const span<const std::int32_t, Space>& pinned_prefix,
                                 std::size_t batch) {
  require(pinned_prefix.data() != nullptr || pinned_prefix.empty(), fn, "pinned_prefix",
          "must not be null when its size is ", pinned_prefix.size());
  require(pinned_prefix.empty() || pinned_prefix.size() == batch, fn, "pinned_prefix",
          "must be empty or hold batch = ", batch, " entries, got ", pinned_prefix.size());
}

// select's outputs and pinned_prefix (and the reduced scores of a
// tensor-parallel select), on either backend: sizes (stride at
// least max_evictions, counts per sequence, slots and cache_slots per
// stride entry), and no output sharing a byte with what select reads (the
// table, the state rows, the whole model state, the workspace,
// pinned_prefix) or with another output.
template <class View, memory_space Space>
void validate_selection_output(const char* fn, const View& cache, const model_state<Space>& model,
                               std::int32_t budget, std::int32_t evict_count,
                               const eviction_selection<Space>& selection,
                               const span<const std::int32_t, Space>& pinned_prefix, byte_range workspace,
                               byte_range reduced = {nullptr, 0, "reduced.values"}) {
  const state_shape& shape = model.first.shape;
  const std::int32_t stride_need = max_evictions(shape.capacity, budget, evict_count);
  require(selection.stride >= stride_need, fn, "selection.stride", "must be at least max_evictions(capacity ",
          shape.capacity, ", budget ", budget, ", m ", evict_count, ") = ", stride_need, ", got ", selection.stride);
  const auto batch = static_cast<std::size_t>(cache.batch);
  const std::size_t entries = batch * static_cast<std::size_t>(selection.stride);
  require(selection.counts.size() == batch && (batch == 0 || selection.counts.data() != nullptr), fn,
          "selection.counts", "must hold batch = ", batch, " entries (non-null), got ", selection.counts.size());
  require(selection.slots.size() >= entries && (entries == 0 || selection.slots.data() != nullptr), fn,
          "selection.slots", "must hold batch * stride = ", entries, " entries (non-null), got ",
          selection.slots.size());
  require(selection.cache_slots.empty() ||
              (selection.cache_slots.size() >= entries && selection.cache_slots.data() != nullptr),
          fn, "selection.cache_slots", "must be empty or hold batch * stride = ", entries, " entries (non-null), got ",
          selection.cache_slots.size());
  if constexpr (requires { cache.page_size; })
    require(selection.cache_slots.empty() || std::int64_t{cache.num_pages} * cache.page_size <= INT32_MAX, fn,
            "selection.cache_slots", "are int32: num_pages * page_size = ",
            std::int64_t{cache.num_pages} * cache.page_size, " slot ids do not fit");
  validate_pinned_prefix_span(fn, pinned_prefix, batch);
  // validate_output checks out.* against the cache, layer 0 and the
  // workspace; the whole model and the other outputs are checked here.
  validate_output(fn, cache, model.first, selection.out, workspace, "selection.out.new_lengths",
                  "selection.out.freed_pages");
  validate_workspace_apart(fn, cache, model.first.state_rows, model_range(model), workspace);
  // select reads pinned_prefix again per sequence after writing the
  // workspace for the ones before.
  require(!overlaps(workspace, range_of(pinned_prefix, "pinned_prefix")), fn, workspace.name,
          "must not overlap pinned_prefix (the call writes its workspace while reading it)");
  // select from reduced scores (tensor parallelism) reads them throughout;
  // it writes the workspace and, on the device, the model's status words.
  for (const byte_range& w : {workspace, model_range(model)})
    require(!overlaps(reduced, w), fn, w.name, "must not overlap reduced.values (the call reads them while writing)");
  byte_range table[3];
  table_ranges(cache, table);
  const byte_range inputs[] = {table[0],
                               table[1],
                               table[2],
                               range_of(model.first.state_rows, "state.state_rows"),
                               model_range(model),
                               workspace,
                               range_of(pinned_prefix, "pinned_prefix"),
                               reduced};
  const byte_range outputs[] = {
      range_of(selection.counts, "selection.counts"),
      {selection.slots.data(), entries * sizeof(std::int32_t), "selection.slots"},
      {selection.cache_slots.data(), selection.cache_slots.empty() ? 0 : entries * sizeof(std::int32_t),
       "selection.cache_slots"},
      range_of(selection.out.new_lengths, "selection.out.new_lengths"),
      range_of(selection.out.freed_pages, "selection.out.freed_pages")};
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    for (const byte_range& in : inputs)
      require(!overlaps(outputs[i], in), fn, outputs[i].name, "must not overlap ", in.name);
    for (std::size_t j = 0; j < i; ++j)
      require(!overlaps(outputs[i], outputs[j]), fn, outputs[i].name, "must not overlap ", outputs[j].name);
  }
}

// The state shape a policy needs for a cache: a row per batch position and
// a slot for every slot of the cache. With a budget, state_capacity_for()
// gives a much smaller capacity (eviction_state.hpp).
template <class Policy, class View>
state_shape state_shape_for(const Policy& policy, const View& cache) {
  return {cache.batch, cache.kv_heads, cache.max_capacity(), policy.ring_words()};
}

// Bytes of state per (sequence, head, slot) a policy needs.
template <class Policy>
constexpr std::size_t state_bytes_per_token(const Policy& policy) {
  return state_bytes_per_slot(policy.ring_words());
}

// A partial_scores buffer for this cache and model: its shape, its size,
// and a head count that includes this rank's heads.
template <memory_space Space, class View>
void validate_partial_scores(const char* fn, const char* name, const partial_scores<Space>& p, const View& cache,
                             const model_state<Space>& model) {
  const std::string arg(name);
  require(p.layers == model.layers, fn, (arg + ".layers").c_str(), "must equal model.layers = ", model.layers,
          ", got ", p.layers);
  require(p.batch == cache.batch, fn, (arg + ".batch").c_str(), "must equal cache.batch = ", cache.batch, ", got ",
          p.batch);
  require(p.capacity == model.first.shape.capacity, fn, (arg + ".capacity").c_str(),
          "must equal the state's shape.capacity = ", model.first.shape.capacity, ", got ", p.capacity);
  require(p.kv_heads >= model.first.shape.kv_heads, fn, (arg + ".kv_heads").c_str(),
          "counts the KV heads of a layer over all ranks: at least this rank's ", model.first.shape.kv_heads,
          ", got ", p.kv_heads);
  const std::size_t need = partial_score_count(p.layers, p.batch, p.capacity);
  require(p.values.size() >= need && (need == 0 || p.values.data() != nullptr), fn, (arg + ".values").c_str(),
          "must hold layers x batch x capacity = ", need, " floats (non-null), got ", p.values.size());
}

}  // namespace scissorhands::detail

namespace scissorhands {
using detail::state_bytes_per_token;
using detail::state_shape_for;
}
