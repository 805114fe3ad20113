#pragma once
// Checks shared by both backends that need no access to device memory.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../error.hpp"
#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../paged_kv_view.hpp"
#include "../policy/eviction_policy.hpp"

namespace scissorhands::detail {

template <class Policy>
void validate_settings(const char* fn, const Policy& policy) {
  const settings& s = policy.config;
  require(s.recent >= 0, fn, "settings.recent", "must be non-negative, got ", s.recent);
  require(s.sinks >= 0, fn, "settings.sinks", "must be non-negative, got ", s.sinks);
  require(s.evict_count >= 1, fn, "settings.evict_count", "must be at least 1, got ", s.evict_count);
  if constexpr (std::is_same_v<typename Policy::history, sliding_window>)
    require(s.window >= 1, fn, "settings.window", "must be at least 1, got ", s.window);
  if constexpr (std::is_same_v<typename Policy::observation, threshold_indicator>)
    require(std::isfinite(s.alpha) && s.alpha > 0.0f, fn, "settings.alpha", "must be finite and positive, got ",
            s.alpha);
  if constexpr (std::is_same_v<typename Policy::history, exponential_decay>)
    require(s.decay > 0.0f && s.decay <= 1.0f, fn, "settings.decay", "must be in (0, 1], got ", s.decay);
  require(s.compaction_mode == compaction::fill_holes || s.compaction_mode == compaction::preserve_order, fn,
          "settings.compaction_mode", "must be fill_holes or preserve_order, got ",
          static_cast<int>(s.compaction_mode));
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

// The state must have been made for this cache and this policy.
template <class Policy, class View, memory_space Space>
void validate_state_matches(const char* fn, const Policy& policy, const View& cache, const eviction_state<Space>& st) {
  validate_state(fn, st.shape, st.step);
  require(st.shape.batch == cache.batch, fn, "state.shape.batch", "must equal cache.batch = ", cache.batch, ", got ",
          st.shape.batch);
  require(st.shape.kv_heads == cache.kv_heads, fn, "state.shape.kv_heads", "must equal cache.kv_heads = ",
          cache.kv_heads, ", got ", st.shape.kv_heads);
  require(st.shape.capacity >= cache.max_capacity(), fn, "state.shape.capacity",
          "must be at least the cache's capacity per sequence, ", cache.max_capacity(), ", got ", st.shape.capacity);
  require(st.shape.ring_words == policy.ring_words(), fn, "state.shape.ring_words",
          "must equal policy.ring_words() = ", policy.ring_words(), " (was the state made for another policy?), got ",
          st.shape.ring_words);
}

// freed_pages must hold one entry per sequence for a paged cache, and be
// empty or hold one per sequence (non-null) for a contiguous one.
template <class View, class Span>
void validate_freed_pages(const char* fn, const View& cache, const Span& freed_pages) {
  constexpr bool paged = requires { cache.page_size; };
  if constexpr (paged)
    require(freed_pages.size() == static_cast<std::size_t>(cache.batch) && freed_pages.data() != nullptr, fn,
            "freed_pages", "must hold batch = ", cache.batch, " entries for a paged cache, got ", freed_pages.size());
  else
    require(freed_pages.empty() ||
                (freed_pages.size() == static_cast<std::size_t>(cache.batch) && freed_pages.data() != nullptr),
            fn, "freed_pages", "must be empty or hold batch = ", cache.batch, " entries (non-null), got ",
            freed_pages.size(), freed_pages.data() == nullptr ? " at a null pointer" : "");
}

// The state shape a policy needs for a cache.
template <class Policy, class View>
state_shape state_shape_for(const Policy& policy, const View& cache) {
  return {cache.batch, cache.kv_heads, cache.max_capacity(), policy.ring_words()};
}

}  // namespace scissorhands::detail

namespace scissorhands {
using detail::state_shape_for;
}
