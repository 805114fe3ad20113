#pragma once
// The C++20 side of the bridge (bridge.h): include it in ONE translation
// unit of the engine, compiled as C++20 with exceptions, and after the
// declarations expand the definitions:
//
//   SCISSORHANDS_BRIDGE_DECLARE(engine::sh_f32, float);  // usually from the engine's own header
//   SCISSORHANDS_BRIDGE_DEFINE(engine::sh_f32, float, scissorhands::scissorhands_policy);
//
// once per (namespace, element type, policy) the engine uses. Each function
// builds the library's views from the plain descriptors (no copy, no
// allocation), calls the host backend inside scissorhands::catch_errors and
// returns what it threw as a bridge::error. Element types other than float
// need their element_traits specialisation visible here (element.hpp).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "../scissorhands.hpp"
#include "bridge.h"

// bridge::fp16_bits is the library's fp16_bits by another name (bridge.h
// includes nothing of the library): the same bits, the same conversion.
template <>
struct scissorhands::element_traits<scissorhands::bridge::fp16_bits> {
  static float to_float(scissorhands::bridge::fp16_bits h) {
    return element_traits<scissorhands::fp16_bits>::to_float(scissorhands::fp16_bits{h.bits});
  }
};

template <>
inline constexpr bool scissorhands::is_binary16_v<scissorhands::bridge::fp16_bits> = true;

namespace scissorhands::bridge::detail {

using scissorhands::detail::require;

static_assert(sizeof(fp16_bits) == sizeof(scissorhands::fp16_bits));
static_assert(alignof(fp16_bits) == alignof(scissorhands::fp16_bits));
static_assert(static_cast<int>(window_unit::slots) == static_cast<int>(scissorhands::window_unit::slots));
static_assert(static_cast<int>(window_unit::positions) == static_cast<int>(scissorhands::window_unit::positions));

// The mirrors in bridge.h must follow the library; these trip when they drift.
static_assert(static_cast<int>(error_code::ok) == static_cast<int>(scissorhands::error_code::ok) &&
              static_cast<int>(error_code::invalid_argument) ==
                  static_cast<int>(scissorhands::error_code::invalid_argument) &&
              static_cast<int>(error_code::out_of_memory) ==
                  static_cast<int>(scissorhands::error_code::out_of_memory) &&
              static_cast<int>(error_code::internal) == static_cast<int>(scissorhands::error_code::internal));
static_assert(error::name_size == error_info::name_size && error::message_size == error_info::message_size);
static_assert(sizeof(settings) == sizeof(scissorhands::settings) + sizeof(std::uint32_t),  // + filled
              "scissorhands::settings changed: mirror the new field in bridge::settings and policy_of()");
static_assert(static_cast<int>(compaction::fill_holes) == static_cast<int>(scissorhands::compaction::fill_holes) &&
              static_cast<int>(compaction::preserve_order) ==
                  static_cast<int>(scissorhands::compaction::preserve_order));
static_assert(static_cast<int>(pooling::max) == static_cast<int>(scissorhands::pooling::max) &&
              static_cast<int>(pooling::mean) == static_cast<int>(scissorhands::pooling::mean));
static_assert(length_after_compress(12, 10, 3) == scissorhands::length_after_compress(12, 10, 3) &&
              length_after_compress(9, 10, 3) == scissorhands::length_after_compress(9, 10, 3) &&
              state_capacity_for(64, 8) == scissorhands::state_capacity_for(64, 8));
static_assert(kv_layout::nhd(7, 3, 5).token_stride == scissorhands::kv_layout::nhd(7, 3, 5).token_stride &&
              kv_layout::hnd(7, 3, 5).head_stride == scissorhands::kv_layout::hnd(7, 3, 5).head_stride &&
              paged_layout::nhd(7, 3, 5).page_stride == scissorhands::paged_layout::nhd(7, 3, 5).page_stride &&
              paged_layout::hnd(7, 3, 5).head_stride == scissorhands::paged_layout::hnd(7, 3, 5).head_stride);

static_assert(max_evictions(20, 16, 2) == scissorhands::max_evictions(20, 16, 2) &&
              max_evictions(10, 16, 2) == scissorhands::max_evictions(10, 16, 2) &&
              max_evictions(INT32_MAX, 0, 5) == scissorhands::max_evictions(INT32_MAX, 0, 5));

// Runs call() and reports what it threw. Success costs the zeroed error.
template <class F>
error guarded(F&& call) noexcept {
  const error_info info = scissorhands::catch_errors(std::forward<F>(call));
  error e;
  if (info.ok()) return e;
  e.code = static_cast<error_code>(info.code);
  std::memcpy(e.function, info.function, sizeof e.function);
  std::memcpy(e.argument, info.argument, sizeof e.argument);
  std::memcpy(e.message, info.message, sizeof e.message);
  return e;
}

// Entries of a per-sequence array of n (or n + 1) values; 0 for a batch the
// library will refuse anyway (it checks batch before reading any array).
constexpr std::size_t entries(std::int32_t n) { return n > 0 ? static_cast<std::size_t>(n) : 0; }
constexpr std::size_t entries_plus_one(std::int32_t n) { return n >= 0 ? static_cast<std::size_t>(n) + 1 : 0; }

inline host_span<const std::int32_t> per_sequence(const std::int32_t* data, std::size_t n) {
  return {data, data != nullptr ? n : 0};  // null stays "absent" (not ragged, no state_rows)
}

// The fields the bridge's settings and the library's share, copied either
// way (the enums hold the same numbers).
template <class To, class From>
void copy_settings(To& to, const From& from) {
  to.window = from.window;
  to.recent = from.recent;
  to.sinks = from.sinks;
  to.evict_count = from.evict_count;
  to.alpha = from.alpha;
  to.decay = from.decay;
  to.normalize = from.normalize;
  to.compaction_mode = static_cast<decltype(to.compaction_mode)>(from.compaction_mode);
  to.seed = from.seed;
  to.pool_width = from.pool_width;
  to.pool_mode = static_cast<decltype(to.pool_mode)>(from.pool_mode);
}

// The marker default_settings writes into `filled`: settings_filled mixed
// with the policy type's name (FNV-1a of the compiler's signature of this
// function), so that settings filled by one namespace's default_settings
// (another policy: other numbers, other meanings) are refused by another
// namespace's calls. Never 0, the unfilled value.
template <class Policy>
std::uint32_t settings_marker() noexcept {
#if defined(_MSC_VER)
  static const char* const signature = __FUNCSIG__;
#else
  static const char* const signature = __PRETTY_FUNCTION__;
#endif
  static const std::uint32_t marker = [] {
    std::uint32_t h = 2166136261u;
    for (const char* c = signature; *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
    h ^= settings_filled;
    return h == 0 ? 1u : h;
  }();
  return marker;
}

// Settings not filled by this policy's default_settings hold the paper's
// numbers (or another preset's) whatever the translation unit's preset is:
// refused rather than run.
template <class Policy>
Policy policy_of(const settings& s) {
  require(s.filled != 0, "bridge", "settings",
          "were not filled by default_settings(): start from ns::default_settings(&settings), the preset's own "
          "numbers, then change fields (a settings{} holds the paper's numbers, not the preset's)");
  require(s.filled == settings_marker<Policy>(), "bridge", "settings",
          "were filled by another namespace's default_settings (another policy, whose numbers these are) or are "
          "damaged: fill them with this namespace's ns::default_settings(&settings)");
  Policy p;
  copy_settings(p.config, s);
  return p;
}

// policy_of's inverse: a policy's settings as the bridge's, marked as its.
template <class Policy>
settings settings_of(const scissorhands::settings& c) {
  settings s;
  copy_settings(s, c);
  s.filled = settings_marker<Policy>();
  return s;
}

template <class T>
host_kv_view<T> view_of(const contiguous_cache<T>& c) {
  const auto layout = [](const kv_layout& l) {
    return scissorhands::kv_layout{l.sequence_stride, l.head_stride, l.token_stride};
  };
  return {host_span<T>(c.k, c.k_size),
          host_span<T>(c.v, c.v_size),
          layout(c.k_layout),
          layout(c.v_layout),
          host_span<const std::int32_t>(c.lengths, entries(c.batch)),
          c.batch,
          c.kv_heads,
          c.head_dim,
          c.capacity};
}

template <class T>
host_paged_kv_view<T> view_of(const paged_cache<T>& c) {
  const auto layout = [](const paged_layout& l) {
    return scissorhands::paged_layout{l.page_stride, l.head_stride, l.token_stride};
  };
  return {host_span<T>(c.k_pages, c.k_size),
          host_span<T>(c.v_pages, c.v_size),
          layout(c.k_layout),
          layout(c.v_layout),
          host_span<const std::int32_t>(c.indptr, entries_plus_one(c.batch)),
          host_span<const std::int32_t>(c.indices, c.indices_size),
          host_span<const std::int32_t>(c.last_page_len, entries(c.batch)),
          c.batch,
          c.kv_heads,
          c.head_dim,
          c.page_size,
          c.num_pages,
          c.max_pages_per_sequence};
}

inline host_token_table_view view_of(const token_table& t) {
  return {host_span<const std::int32_t>(t.indptr, entries_plus_one(t.batch)),
          host_span<const std::int32_t>(t.indices, t.indices_size),
          host_span<const std::int32_t>(t.last_page_len, entries(t.batch)),
          t.batch,
          t.kv_heads,
          t.page_size,
          t.num_pages,
          t.max_pages_per_sequence};
}

template <class T>
query_view<T, memory_space::host> view_of(const queries<T>& q, std::int32_t batch) {
  return {host_span<const T>(q.data, q.size),
          q.q_heads,
          q.q_len,
          q.head_dim,
          q.sequence_stride,
          q.head_stride,
          q.query_stride,
          per_sequence(q.qo_indptr, entries_plus_one(batch))};
}

inline attention_options<memory_space::host> view_of(const attention& a) {
  attention_options<memory_space::host> o;
  o.softmax_scale = a.softmax_scale;
  o.window_left = a.window_left;
  o.window_left_unit = static_cast<scissorhands::window_unit>(a.window_left_unit);
  o.logits_soft_cap = a.logits_soft_cap;
  // Null stays absent; a null pointer with a size is refused by the library.
  o.alibi_slopes = host_span<const float>(a.alibi_slopes, a.alibi_slopes_size);
  return o;
}

static_assert(static_cast<int>(lse_check::sums_to_one) == static_cast<int>(scissorhands::lse_check::sums_to_one) &&
                  static_cast<int>(lse_check::at_most_one) == static_cast<int>(scissorhands::lse_check::at_most_one) &&
                  static_cast<int>(lse_check::none) == static_cast<int>(scissorhands::lse_check::none),
              "bridge::lse_check mirrors scissorhands::lse_check value for value");
inline lse_view<memory_space::host> view_of(const lse& l, std::int32_t batch) {
  return {host_span<const float>(l.data, l.size),
          l.base == lse_base::base2     ? scissorhands::lse_base::base2
          : l.base == lse_base::natural ? scissorhands::lse_base::natural
                                        : scissorhands::lse_base::unspecified,
          l.sequence_stride,
          l.head_stride,
          l.query_stride,
          per_sequence(l.qo_indptr, entries_plus_one(batch)),
          // Same values in both enums; an unknown one stays unknown and is refused.
          static_cast<scissorhands::lse_check>(l.check)};
}

inline probability_view<memory_space::host> view_of(const probabilities& p, std::int32_t batch) {
  return {host_span<const float>(p.data, p.size),
          p.q_heads,
          p.q_len,
          p.sequence_stride,
          p.head_stride,
          p.query_stride,
          per_sequence(p.qo_indptr, entries_plus_one(batch))};
}

inline scissorhands::state_shape shape_of(const state_shape& s) {
  return {s.rows, s.kv_heads, s.capacity, s.ring_words};
}

// The shape, checked, and the caller's buffer for it, checked non-null and
// aligned (`buffer_name` is the argument a refusal names).
inline scissorhands::state_shape checked_layout(const char* fn, const state_shape& s, const void* buffer,
                                                const char* buffer_name) {
  const scissorhands::state_shape shape = shape_of(s);
  scissorhands::detail::validate_state_shape(fn, shape);
  require(buffer != nullptr, fn, buffer_name, "must not be null");
  require(reinterpret_cast<std::uintptr_t>(buffer) % scissorhands::detail::state_alignment == 0, fn, buffer_name,
          "must be aligned to ", scissorhands::detail::state_alignment, " bytes");
  return shape;
}

// The state laid over the caller's buffer, seen through the batch. Checked
// here, under the name of the entry point, so an error names the call that
// was made (make_state would name itself).
inline eviction_state<memory_space::host> state_of(const char* fn, const state& s, std::int32_t batch) {
  // model_state::layer(l) gives a null buffer for l outside [0, layers).
  require(s.buffer != nullptr, fn, "state.buffer",
          "must not be null (model_state::layer(l) gives a state without one for l outside [0, layers))");
  const scissorhands::state_shape shape = checked_layout(fn, s.shape, s.buffer, "state.buffer");
  const std::size_t need = scissorhands::detail::offsets_of(shape).total;
  require(s.bytes >= need, fn, "state.bytes", "is ", s.bytes, ", below state_bytes(shape) = ", need);
  return scissorhands::make_state(host_span<std::byte>(static_cast<std::byte*>(s.buffer), s.bytes), shape)
      .for_batch(per_sequence(s.state_rows, entries(batch)));
}

// The model state laid over the caller's buffer, seen through the batch;
// checked under the entry point's name, as state_of.
inline scissorhands::model_state<memory_space::host> model_of(const char* fn, const model_state& m,
                                                               std::int32_t batch) {
  const scissorhands::state_shape shape = checked_layout(fn, m.shape, m.buffer, "model.buffer");
  const std::size_t per_layer = scissorhands::detail::offsets_of(shape).total;
  require(m.layers > 0, fn, "model.layers", "must be positive, got ", m.layers);
  require(m.layer_bytes == per_layer, fn, "model.layer_bytes", "must be state_bytes(shape) = ", per_layer,
          " (make_model_state fills it), got ", m.layer_bytes);
  require(m.bytes / per_layer >= static_cast<std::size_t>(m.layers), fn, "model.bytes", "is ", m.bytes,
          ", below model_state_bytes(shape, layers = ", m.layers, ")");
  return scissorhands::make_model_state(host_span<std::byte>(static_cast<std::byte*>(m.buffer), m.bytes), shape,
                                        m.layers)
      .for_batch(per_sequence(m.state_rows, entries(batch)));
}

// A selection's spans: arrays given as null stay empty (the library then
// refuses the required ones by name; cache_slots is optional).
inline eviction_selection<memory_space::host> selection_of(const selection& s, std::int32_t batch) {
  const std::size_t n = entries(batch);
  const std::size_t all = n * entries(s.stride);
  const auto span_of = [](std::int32_t* p, std::size_t size) {
    return host_span<std::int32_t>(p, p != nullptr ? size : 0);
  };
  return {s.stride,
          span_of(s.counts, n),
          span_of(s.slots, all),
          span_of(s.cache_slots, all),
          {span_of(s.out.new_lengths, n), span_of(s.out.freed_pages, n)}};
}

// ---- the entry points (SCISSORHANDS_BRIDGE_DEFINE forwards to these) ----------

template <class Policy>
error make_state_shape(const settings& s, std::int32_t rows, std::int32_t kv_heads, std::int32_t capacity,
                       state_shape* out) noexcept {
  return guarded([&] {
    const char* fn = "bridge::make_state_shape";
    const Policy policy = policy_of<Policy>(s);
    scissorhands::detail::validate_settings(fn, policy);
    const scissorhands::state_shape shape{rows, kv_heads, capacity, policy.ring_words()};
    scissorhands::detail::validate_state_shape(fn, shape);
    require(out != nullptr, fn, "shape", "must not be null");
    *out = {shape.rows, shape.kv_heads, shape.capacity, shape.ring_words};
  });
}

inline error state_bytes(const state_shape& shape, std::size_t* bytes) noexcept {
  return guarded([&] {
    const std::size_t n = scissorhands::state_bytes(shape_of(shape));
    require(bytes != nullptr, "state_bytes", "bytes", "must not be null");
    *bytes = n;
  });
}

inline error make_state(void* buffer, std::size_t bytes, const state_shape& shape, state* out) noexcept {
  return guarded([&] {
    (void)scissorhands::make_state(host_span<std::byte>(static_cast<std::byte*>(buffer), bytes), shape_of(shape));
    require(out != nullptr, "make_state", "state", "must not be null");
    *out = {buffer, bytes, shape, nullptr};
  });
}

inline error reset_state(const state& s) noexcept {
  return guarded([&] { host::reset_state(state_of("host::reset_state", s, 0)); });
}

inline error reset_sequence(const state& s, std::int32_t row, std::int32_t start_position) noexcept {
  return guarded([&] { host::reset_sequence(state_of("host::reset_sequence", s, 0), row, start_position); });
}

template <class Policy, class Cache>
error admit(const settings& s, const Cache& cache, const state& st) noexcept {
  return guarded([&] { host::admit(policy_of<Policy>(s), view_of(cache), state_of("host::admit", st, cache.batch)); });
}

template <class Policy, class Cache>
error observe_probabilities(const settings& s, const Cache& cache, const state& st, const probabilities& p) noexcept {
  return guarded([&] {
    host::observe_probabilities(policy_of<Policy>(s), view_of(cache),
                                state_of("host::observe_probabilities", st, cache.batch), view_of(p, cache.batch));
  });
}

template <class Policy, class Cache, class Q>
error observe_queries(const settings& s, const Cache& cache, const state& st, const queries<Q>& q, const lse& l,
                      float softmax_scale) noexcept {
  return guarded([&] {
    host::observe_queries(policy_of<Policy>(s), view_of(cache), state_of("host::observe_queries", st, cache.batch),
                          view_of(q, cache.batch), view_of(l, cache.batch), softmax_scale);
  });
}

// With the kernel's attention options; also the token-level entry point
// (a page-size-1 paged cache over the engine's cells, any K element type).
template <class Policy, class Cache, class Q>
error observe_queries_with(const settings& s, const Cache& cache, const state& st, const queries<Q>& q, const lse& l,
                           const attention& a) noexcept {
  return guarded([&] {
    host::observe_queries(policy_of<Policy>(s), view_of(cache), state_of("host::observe_queries", st, cache.batch),
                          view_of(q, cache.batch), view_of(l, cache.batch), view_of(a));
  });
}

template <class Cache>
std::size_t compress_workspace_bytes(const Cache& cache) noexcept {
  return host::compress_workspace_bytes(view_of(cache));  // shape arithmetic only: cannot throw
}
template <class Cache>
std::size_t compress_workspace_bytes(const Cache& cache, const state_shape& shape) noexcept {
  return host::compress_workspace_bytes(view_of(cache),
                                        ::scissorhands::state_shape{shape.rows, shape.kv_heads, shape.capacity,
                                                                    shape.ring_words});
}

template <class Policy, class Cache>
error compress(const settings& s, const Cache& cache, const state& st, std::int32_t budget, void* workspace,
               std::size_t workspace_bytes, const compress_output& out) noexcept {
  return guarded([&] {
    const std::size_t n = entries(cache.batch);
    const scissorhands::compress_output<memory_space::host> outputs{
        host_span<std::int32_t>(out.new_lengths, out.new_lengths != nullptr ? n : 0),
        host_span<std::int32_t>(out.freed_pages, out.freed_pages != nullptr ? n : 0)};
    host::compress(policy_of<Policy>(s), view_of(cache), state_of("host::compress", st, cache.batch), budget,
                   host_span<std::byte>(static_cast<std::byte*>(workspace), workspace_bytes), outputs);
  });
}

// ---- token level (SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL forwards to these) -------

template <class Policy>
error default_settings(settings* out) noexcept {
  return guarded([&] {
    require(out != nullptr, "bridge::default_settings", "settings", "must not be null");
    *out = settings_of<Policy>(Policy{}.config);
  });
}

inline error model_state_bytes(const state_shape& shape, std::int32_t layers, std::size_t* bytes) noexcept {
  return guarded([&] {
    const std::size_t n = scissorhands::model_state_bytes(shape_of(shape), layers);
    require(bytes != nullptr, "model_state_bytes", "bytes", "must not be null");
    *bytes = n;
  });
}

inline error make_model_state(void* buffer, std::size_t bytes, const state_shape& shape, std::int32_t layers,
                              model_state* out) noexcept {
  return guarded([&] {
    const auto m = scissorhands::make_model_state(host_span<std::byte>(static_cast<std::byte*>(buffer), bytes),
                                                  shape_of(shape), layers);
    require(out != nullptr, "make_model_state", "model", "must not be null");
    *out = {buffer, bytes, shape, layers, m.layer_bytes, nullptr};
  });
}

inline error reset_state(const model_state& m) noexcept {
  return guarded([&] { host::reset_state(model_of("host::reset_state", m, 0)); });
}

inline error reset_sequence(const model_state& m, std::int32_t row, std::int32_t start_position) noexcept {
  return guarded([&] { host::reset_sequence(model_of("host::reset_sequence", m, 0), row, start_position); });
}

inline std::size_t select_workspace_bytes(const token_table& table, const state_shape& shape) noexcept {
  return host::select_workspace_bytes(view_of(table), shape_of(shape));  // shape arithmetic only: cannot throw
}

template <class Policy>
error select(const settings& s, const token_table& table, const model_state& m, std::int32_t budget, void* workspace,
             std::size_t workspace_bytes, const selection& sel, const std::int32_t* pinned_prefix) noexcept {
  return guarded([&] {
    host::select(policy_of<Policy>(s), view_of(table), model_of("host::select", m, table.batch), budget,
                 host_span<std::byte>(static_cast<std::byte*>(workspace), workspace_bytes),
                 selection_of(sel, table.batch), per_sequence(pinned_prefix, entries(table.batch)));
  });
}

template <class Policy>
error local_scores(const settings& s, const token_table& table, const model_state& m, std::int32_t budget,
                   const partial_scores& p) noexcept {
  return guarded([&] {
    const scissorhands::partial_scores<memory_space::host> partial{host_span<float>(p.values, p.size), p.layers,
                                                                   p.batch, p.capacity, p.kv_heads};
    host::local_scores(policy_of<Policy>(s), view_of(table), model_of("host::local_scores", m, table.batch), budget,
                       partial);
  });
}

template <class Cache>
std::size_t compact_workspace_bytes(const Cache& cache) noexcept {
  return host::compact_workspace_bytes(view_of(cache));  // shape arithmetic only: cannot throw
}

// compact takes the descriptor the token-level observe_queries takes (a
// paged_cache over the table's pages), whose V may be absent there; compact
// moves V rows too, so an absent or empty V is refused first, saying why.
template <class Policy, class Cache>
error compact(const settings& s, const Cache& cache, const state& st, const selection& sel, void* workspace,
              std::size_t workspace_bytes) noexcept {
  return guarded([&] {
    const char* fn = "host::compact";
    const Policy policy = policy_of<Policy>(s);
    require(cache.v_pages != nullptr && cache.v_size > 0, fn, "cache.v_pages",
            "must hold the layer's V (non-null, v_size > 0): compact moves V rows with K (only observe_queries "
            "may leave V absent)");
    host::compact(policy, view_of(cache), state_of(fn, st, cache.batch), selection_of(sel, cache.batch),
                  host_span<std::byte>(static_cast<std::byte*>(workspace), workspace_bytes));
  });
}

template <class Policy>
error forget(const settings& s, const token_table& table, const state& st, const selection& sel) noexcept {
  return guarded([&] {
    host::forget(policy_of<Policy>(s), view_of(table), state_of("host::forget", st, table.batch),
                 selection_of(sel, table.batch));
  });
}

inline error shrink_page_table(const page_table& table, const std::int32_t* new_lengths, std::int32_t* released,
                               std::size_t released_capacity, std::size_t* released_count) noexcept {
  return guarded([&] {
    const char* fn = "host::shrink_page_table";
    require(table.batch >= 0, fn, "table.batch", "must be non-negative, got ", table.batch);
    require(released_count != nullptr, fn, "released_count", "must not be null");
    const std::size_t n = entries(table.batch);
    const std::size_t count = host::shrink_page_table(
        host_span<std::int32_t>(table.indptr, table.indptr != nullptr ? n + 1 : 0),
        host_span<std::int32_t>(table.indices, table.indices_size),
        host_span<std::int32_t>(table.last_page_len, table.last_page_len != nullptr ? n : 0), table.page_size,
        host_span<const std::int32_t>(new_lengths, new_lengths != nullptr ? n : 0),
        host_span<std::int32_t>(released, released_capacity));
    *released_count = count;
  });
}

}  // namespace scissorhands::bridge::detail

// Defines the functions SCISSORHANDS_BRIDGE_DECLARE(ns, Element) declared,
// for the policy type given last (commas allowed: eviction_policy<a, b>).
// The declaration must come first (include the engine's header that
// expands DECLARE): definitions are by qualified name, so one that does not
// match its declaration, or a missing declaration, fails to compile here.
#define SCISSORHANDS_BRIDGE_DEFINE(ns, Element, ...)                                                                   \
  namespace ns {                                                                                                       \
  using policy_type = __VA_ARGS__;                                                                                     \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::default_settings(::scissorhands::bridge::settings* s) noexcept {                   \
    return ::scissorhands::bridge::detail::default_settings<ns::policy_type>(s);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::make_state_shape(const ::scissorhands::bridge::settings& s, std::int32_t rows,     \
                                                     std::int32_t kv_heads, std::int32_t capacity,                     \
                                                     ::scissorhands::bridge::state_shape* shape) noexcept {            \
    return ::scissorhands::bridge::detail::make_state_shape<ns::policy_type>(s, rows, kv_heads, capacity, shape);      \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::state_bytes(const ::scissorhands::bridge::state_shape& shape,                      \
                                                std::size_t* bytes) noexcept {                                         \
    return ::scissorhands::bridge::detail::state_bytes(shape, bytes);                                                  \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::make_state(void* buffer, std::size_t bytes,                                        \
                                               const ::scissorhands::bridge::state_shape& shape,                       \
                                               ::scissorhands::bridge::state* out) noexcept {                          \
    return ::scissorhands::bridge::detail::make_state(buffer, bytes, shape, out);                                      \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::reset_state(const ::scissorhands::bridge::state& st) noexcept {                    \
    return ::scissorhands::bridge::detail::reset_state(st);                                                            \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::reset_sequence(const ::scissorhands::bridge::state& st, std::int32_t row,          \
                                                   std::int32_t start_position) noexcept {                             \
    return ::scissorhands::bridge::detail::reset_sequence(st, row, start_position);                                    \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::admit(const ::scissorhands::bridge::settings& s,                                   \
                                          const ::scissorhands::bridge::contiguous_cache<Element>& cache,              \
                                          const ::scissorhands::bridge::state& st) noexcept {                          \
    return ::scissorhands::bridge::detail::admit<ns::policy_type>(s, cache, st);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::admit(const ::scissorhands::bridge::settings& s,                                   \
                                          const ::scissorhands::bridge::paged_cache<Element>& cache,                   \
                                          const ::scissorhands::bridge::state& st) noexcept {                          \
    return ::scissorhands::bridge::detail::admit<ns::policy_type>(s, cache, st);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_probabilities(                                                             \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::probabilities& probs) noexcept {          \
    return ::scissorhands::bridge::detail::observe_probabilities<ns::policy_type>(s, cache, st, probs);                \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_probabilities(                                                             \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<Element>& cache,            \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::probabilities& probs) noexcept {          \
    return ::scissorhands::bridge::detail::observe_probabilities<ns::policy_type>(s, cache, st, probs);                \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<Element>& q,                      \
      const ::scissorhands::bridge::lse& l, float softmax_scale) noexcept {                                            \
    return ::scissorhands::bridge::detail::observe_queries<ns::policy_type>(s, cache, st, q, l, softmax_scale);        \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<Element>& cache,            \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<Element>& q,                      \
      const ::scissorhands::bridge::lse& l, float softmax_scale) noexcept {                                            \
    return ::scissorhands::bridge::detail::observe_queries<ns::policy_type>(s, cache, st, q, l, softmax_scale);        \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<Element>& q,                      \
      const ::scissorhands::bridge::lse& l, const ::scissorhands::bridge::attention& a) noexcept {                     \
    return ::scissorhands::bridge::detail::observe_queries_with<ns::policy_type>(s, cache, st, q, l, a);               \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<Element>& cache,            \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<Element>& q,                      \
      const ::scissorhands::bridge::lse& l, const ::scissorhands::bridge::attention& a) noexcept {                     \
    return ::scissorhands::bridge::detail::observe_queries_with<ns::policy_type>(s, cache, st, q, l, a);               \
  }                                                                                                                    \
  std::size_t ns::compress_workspace_bytes(const ::scissorhands::bridge::contiguous_cache<Element>& cache) noexcept {  \
    return ::scissorhands::bridge::detail::compress_workspace_bytes(cache);                                            \
  }                                                                                                                    \
  std::size_t ns::compress_workspace_bytes(const ::scissorhands::bridge::contiguous_cache<Element>& cache,             \
                                           const ::scissorhands::bridge::state_shape& shape) noexcept {                \
    return ::scissorhands::bridge::detail::compress_workspace_bytes(cache, shape);                                     \
  }                                                                                                                    \
  std::size_t ns::compress_workspace_bytes(const ::scissorhands::bridge::paged_cache<Element>& cache) noexcept {       \
    return ::scissorhands::bridge::detail::compress_workspace_bytes(cache);                                            \
  }                                                                                                                    \
  std::size_t ns::compress_workspace_bytes(const ::scissorhands::bridge::paged_cache<Element>& cache,                  \
                                           const ::scissorhands::bridge::state_shape& shape) noexcept {                \
    return ::scissorhands::bridge::detail::compress_workspace_bytes(cache, shape);                                     \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::compress(                                                                          \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
      const ::scissorhands::bridge::state& st, std::int32_t budget, void* workspace, std::size_t workspace_bytes,      \
      const ::scissorhands::bridge::compress_output& out) noexcept {                                                   \
    return ::scissorhands::bridge::detail::compress<ns::policy_type>(s, cache, st, budget, workspace, workspace_bytes, \
                                                                     out);                                             \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::compress(                                                                          \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<Element>& cache,            \
      const ::scissorhands::bridge::state& st, std::int32_t budget, void* workspace, std::size_t workspace_bytes,      \
      const ::scissorhands::bridge::compress_output& out) noexcept {                                                   \
    return ::scissorhands::bridge::detail::compress<ns::policy_type>(s, cache, st, budget, workspace, workspace_bytes, \
                                                                     out);                                             \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::shrink_page_table(                                                                 \
      const ::scissorhands::bridge::page_table& table, const std::int32_t* new_lengths, std::int32_t* released,        \
      std::size_t released_capacity, std::size_t* released_count) noexcept {                                           \
    return ::scissorhands::bridge::detail::shrink_page_table(table, new_lengths, released, released_capacity,          \
                                                             released_count);                                          \
  }                                                                                                                    \
  static_assert(true, "SCISSORHANDS_BRIDGE_DEFINE(...) takes a trailing semicolon")


// Defines the functions SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(ns)
// declared, for the policy given last, which must evict whole tokens for
// the model: with_granularity<P, shared_layers<>> (P's preset settings are
// what default_settings returns).
#define SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(ns, ...)                                                                \
  namespace ns {                                                                                                       \
  using policy_type = __VA_ARGS__;                                                                                     \
  static_assert(::scissorhands::composed_policy<policy_type> &&                                                        \
                    ::scissorhands::granularity_of<policy_type> == ::scissorhands::granularity_kind::shared_layers,    \
                "SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL chooses one set of slots for the whole model: give the "       \
                "policy a shared_layers granularity, with_granularity<P, scissorhands::shared_layers<>>");             \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::default_settings(::scissorhands::bridge::settings* s) noexcept {                   \
    return ::scissorhands::bridge::detail::default_settings<ns::policy_type>(s);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::make_state_shape(const ::scissorhands::bridge::settings& s, std::int32_t rows,     \
                                                     std::int32_t kv_heads, std::int32_t capacity,                     \
                                                     ::scissorhands::bridge::state_shape* shape) noexcept {            \
    return ::scissorhands::bridge::detail::make_state_shape<ns::policy_type>(s, rows, kv_heads, capacity, shape);      \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::model_state_bytes(const ::scissorhands::bridge::state_shape& shape,                \
                                                      std::int32_t layers, std::size_t* bytes) noexcept {              \
    return ::scissorhands::bridge::detail::model_state_bytes(shape, layers, bytes);                                    \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::make_model_state(void* buffer, std::size_t bytes,                                  \
                                                     const ::scissorhands::bridge::state_shape& shape,                 \
                                                     std::int32_t layers,                                              \
                                                     ::scissorhands::bridge::model_state* out) noexcept {              \
    return ::scissorhands::bridge::detail::make_model_state(buffer, bytes, shape, layers, out);                        \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::reset_state(const ::scissorhands::bridge::model_state& m) noexcept {               \
    return ::scissorhands::bridge::detail::reset_state(m);                                                             \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::reset_sequence(const ::scissorhands::bridge::model_state& m, std::int32_t row,     \
                                                   std::int32_t start_position) noexcept {                             \
    return ::scissorhands::bridge::detail::reset_sequence(m, row, start_position);                                     \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::admit(const ::scissorhands::bridge::settings& s,                                   \
                                          const ::scissorhands::bridge::token_table& table,                            \
                                          const ::scissorhands::bridge::state& st) noexcept {                          \
    return ::scissorhands::bridge::detail::admit<ns::policy_type>(s, table, st);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_probabilities(                                                             \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::token_table& table,                     \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::probabilities& probs) noexcept {          \
    return ::scissorhands::bridge::detail::observe_probabilities<ns::policy_type>(s, table, st, probs);                \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<float>& keys,               \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<float>& q,                        \
      const ::scissorhands::bridge::lse& l, const ::scissorhands::bridge::attention& a) noexcept {                     \
    return ::scissorhands::bridge::detail::observe_queries_with<ns::policy_type>(s, keys, st, q, l, a);                \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::observe_queries(                                                                   \
      const ::scissorhands::bridge::settings& s,                                                                       \
      const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& keys,                              \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::queries<float>& q,                        \
      const ::scissorhands::bridge::lse& l, const ::scissorhands::bridge::attention& a) noexcept {                     \
    return ::scissorhands::bridge::detail::observe_queries_with<ns::policy_type>(s, keys, st, q, l, a);                \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::local_scores(                                                                      \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::token_table& table,                     \
      const ::scissorhands::bridge::model_state& model, std::int32_t budget,                                           \
      const ::scissorhands::bridge::partial_scores& partial) noexcept {                                                \
    return ::scissorhands::bridge::detail::local_scores<ns::policy_type>(s, table, model, budget, partial);            \
  }                                                                                                                    \
  std::size_t ns::select_workspace_bytes(const ::scissorhands::bridge::token_table& table,                             \
                                         const ::scissorhands::bridge::state_shape& shape) noexcept {                  \
    return ::scissorhands::bridge::detail::select_workspace_bytes(table, shape);                                       \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::select(const ::scissorhands::bridge::settings& s,                                  \
                                           const ::scissorhands::bridge::token_table& table,                           \
                                           const ::scissorhands::bridge::model_state& model, std::int32_t budget,      \
                                           void* workspace, std::size_t workspace_bytes,                               \
                                           const ::scissorhands::bridge::selection& sel,                               \
                                           const std::int32_t* pinned_prefix) noexcept {                               \
    return ::scissorhands::bridge::detail::select<ns::policy_type>(s, table, model, budget, workspace,                 \
                                                                   workspace_bytes, sel, pinned_prefix);               \
  }                                                                                                                    \
  std::size_t ns::compact_workspace_bytes(const ::scissorhands::bridge::paged_cache<float>& cache) noexcept {          \
    return ::scissorhands::bridge::detail::compact_workspace_bytes(cache);                                             \
  }                                                                                                                    \
  std::size_t ns::compact_workspace_bytes(                                                                             \
      const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& cache) noexcept {                  \
    return ::scissorhands::bridge::detail::compact_workspace_bytes(cache);                                             \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::compact(                                                                           \
      const ::scissorhands::bridge::settings& s, const ::scissorhands::bridge::paged_cache<float>& cache,              \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::selection& sel, void* workspace,          \
      std::size_t workspace_bytes) noexcept {                                                                          \
    return ::scissorhands::bridge::detail::compact<ns::policy_type>(s, cache, st, sel, workspace, workspace_bytes);    \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::compact(                                                                           \
      const ::scissorhands::bridge::settings& s,                                                                       \
      const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& cache,                             \
      const ::scissorhands::bridge::state& st, const ::scissorhands::bridge::selection& sel, void* workspace,          \
      std::size_t workspace_bytes) noexcept {                                                                          \
    return ::scissorhands::bridge::detail::compact<ns::policy_type>(s, cache, st, sel, workspace, workspace_bytes);    \
  }                                                                                                                    \
  ::scissorhands::bridge::error ns::forget(const ::scissorhands::bridge::settings& s,                                  \
                                           const ::scissorhands::bridge::token_table& table,                           \
                                           const ::scissorhands::bridge::state& st,                                    \
                                           const ::scissorhands::bridge::selection& sel) noexcept {                    \
    return ::scissorhands::bridge::detail::forget<ns::policy_type>(s, table, st, sel);                                 \
  }                                                                                                                    \
  static_assert(true, "SCISSORHANDS_BRIDGE_DEFINE_TOKEN_LEVEL(...) takes a trailing semicolon")
