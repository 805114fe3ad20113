#pragma once
// The library's own per-token state, kept in one caller-owned buffer per
// layer whose size state_bytes() reports (query first, then hand it over).
//
// Per sequence b:            step (int64), next_position, tracked (int32)
// Per (b, head h, slot t):   position (int32), score, observed (fp32),
//                            ring_words 32-bit words of history
//
// Slot t of head h holds the state of the token in cache slot t of head h;
// compress moves it with the token. `tracked[b]` is how many slots have
// state; observe admits slots tracked[b] .. length(b)-1 as new tokens at
// positions next_position[b], next_position[b] + 1, ...
#include <cstddef>
#include <cstdint>

#include "config.hpp"
#include "error.hpp"
#include "span.hpp"

namespace scissorhands {

struct state_shape {
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t capacity = 0;    // slots per (sequence, head): at least the cache's
  std::int32_t ring_words = 0;  // from the policy: policy.ring_words()

  friend constexpr bool operator==(const state_shape&, const state_shape&) = default;
};

template <memory_space Space>
struct eviction_state {
  static constexpr memory_space space = Space;
  state_shape shape;
  std::int64_t* step = nullptr;           // [batch] steps observed so far
  std::int32_t* next_position = nullptr;  // [batch] position the next admitted token gets
  std::int32_t* tracked = nullptr;        // [batch] slots with state
  std::int32_t* positions = nullptr;      // [batch][kv_heads][capacity]
  float* scores = nullptr;                // [batch][kv_heads][capacity]
  float* observed = nullptr;              // [batch][kv_heads][capacity]
  std::uint32_t* ring = nullptr;          // [batch][kv_heads][capacity][ring_words]

  SCISSORHANDS_HOST_DEVICE std::int64_t index(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return (std::int64_t{b} * shape.kv_heads + h) * shape.capacity + t;
  }
  SCISSORHANDS_HOST_DEVICE std::uint32_t* ring_of(std::int64_t token_index) const {
    return ring + token_index * shape.ring_words;
  }
};

namespace detail {

inline constexpr std::size_t state_alignment = 256;

constexpr std::size_t align_up(std::size_t x) { return (x + state_alignment - 1) / state_alignment * state_alignment; }

// Byte offsets of the state's arrays inside the buffer, in declaration order.
struct state_offsets {
  std::size_t step, next_position, tracked, positions, scores, observed, ring, total;
};

constexpr state_offsets offsets_of(const state_shape& s) {
  const std::size_t b = static_cast<std::size_t>(s.batch);
  const std::size_t tokens = b * static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.capacity);
  state_offsets o{};
  std::size_t at = 0;
  o.step = at;
  at = align_up(at + b * sizeof(std::int64_t));
  o.next_position = at;
  at = align_up(at + b * sizeof(std::int32_t));
  o.tracked = at;
  at = align_up(at + b * sizeof(std::int32_t));
  o.positions = at;
  at = align_up(at + tokens * sizeof(std::int32_t));
  o.scores = at;
  at = align_up(at + tokens * sizeof(float));
  o.observed = at;
  at = align_up(at + tokens * sizeof(float));
  o.ring = at;
  at = align_up(at + tokens * static_cast<std::size_t>(s.ring_words) * sizeof(std::uint32_t));
  o.total = at;
  return o;
}

inline void validate_state_shape(const char* fn, const state_shape& s) {
  require(s.batch > 0, fn, "shape.batch", "must be positive, got ", s.batch);
  require(s.kv_heads > 0, fn, "shape.kv_heads", "must be positive, got ", s.kv_heads);
  require(s.capacity > 0, fn, "shape.capacity", "must be positive, got ", s.capacity);
  require(s.ring_words >= 0, fn, "shape.ring_words", "must be non-negative, got ", s.ring_words);
  // Keep every byte count below 2^62 so nothing overflows on any platform.
  const double bytes = static_cast<double>(s.batch) * s.kv_heads * s.capacity * (12.0 + 4.0 * s.ring_words);
  require(bytes < 4.0e18, fn, "shape", "needs ", bytes, " bytes of state, beyond what can be addressed");
}

}  // namespace detail

// Bytes the caller must provide for a layer's state (aligned to 256 bytes).
inline std::size_t state_bytes(const state_shape& shape) {
  detail::validate_state_shape("state_bytes", shape);
  return detail::offsets_of(shape).total;
}

// Lays the state out over the caller's buffer (no copy, no allocation). The
// buffer must start 256-byte aligned (cudaMalloc and aligned_alloc(256) do),
// and must be reset (host::reset_state / cuda::reset_state) before first use.
template <memory_space Space>
eviction_state<Space> make_state(span<std::byte, Space> buffer, const state_shape& shape) {
  const char* fn = "make_state";
  detail::validate_state_shape(fn, shape);
  const auto o = detail::offsets_of(shape);
  detail::require(buffer.data() != nullptr, fn, "buffer", "must not be null");
  detail::require(reinterpret_cast<std::uintptr_t>(buffer.data()) % detail::state_alignment == 0, fn, "buffer",
                  "must be aligned to ", detail::state_alignment, " bytes");
  detail::require(buffer.size() >= o.total, fn, "buffer", "holds ", buffer.size(), " bytes, below state_bytes = ",
                  o.total);
  std::byte* base = buffer.data();
  eviction_state<Space> s;
  s.shape = shape;
  s.step = reinterpret_cast<std::int64_t*>(base + o.step);
  s.next_position = reinterpret_cast<std::int32_t*>(base + o.next_position);
  s.tracked = reinterpret_cast<std::int32_t*>(base + o.tracked);
  s.positions = reinterpret_cast<std::int32_t*>(base + o.positions);
  s.scores = reinterpret_cast<float*>(base + o.scores);
  s.observed = reinterpret_cast<float*>(base + o.observed);
  s.ring = reinterpret_cast<std::uint32_t*>(base + o.ring);
  return s;
}

namespace detail {
inline void validate_state(const char* fn, const state_shape& s, const std::int64_t* step) {
  require(step != nullptr, fn, "state", "is not laid out: build it with make_state");
  validate_state_shape(fn, s);
}
}  // namespace detail

}  // namespace scissorhands
