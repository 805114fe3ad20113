#pragma once
// The library's own per-token state, kept in one caller-owned buffer per
// layer whose size state_bytes() reports (query first, then hand it over).
//
// The state has `rows` rows, one per sequence it can hold. A sequence keeps
// its row for its whole life, wherever the scheduler puts it in the batch:
// calls take the batch's mapping (state.for_batch(state_rows): batch
// position b uses row state_rows[b]; without one, b uses row b). A batch
// position mapped to row -1 is a padding slot: it must hold no token and is
// skipped.
//
// Per row r:                 step (int64), next_position, tracked (int32),
//                            status (uint32, the CUDA backend's per-sequence
//                            status word, see cuda/status.cuh), blocks_done
//                            (uint32, the CUDA backend's count of a launch's
//                            blocks done with the row; 0 between calls)
// Per (r, head h, slot t):   position (int32), score, observed (fp32),
//                            ring_words 32-bit words of history
//
// Every per-slot array is slot-major within a (row, head), so a step that
// updates every token reads and writes consecutive bytes; the history ring
// too is stored word by word, [row][head][word][slot] (word w of slot t
// of (r, h) at ring_of_head(r, h)[w * capacity + t]): a step touches one
// word of every token, and those words are adjacent (4 bytes a token, not
// a 4-byte word at the ring's stride).
//
// Slot t of head h holds the state of the token in cache slot t of head h;
// compress moves it with the token. `tracked[r]` is how many slots have
// state; observe admits slots tracked[r] .. length(b)-1 as new tokens at
// positions next_position[r], next_position[r] + 1, ...
//
// Capacity: the state needs a slot for every token a sequence holds when
// observe or compress is called, not for the cache's whole capacity. With a
// budget B and at most C tokens appended between two compress calls (C = 1
// when decoding, the chunk size for chunked prefill), B + C - 1 slots suffice:
// state_capacity_for(B, C). Bytes per slot: state_bytes_per_token(policy).
#include <cstddef>
#include <cstdint>

#include "config.hpp"
#include "error.hpp"
#include "history_ring.hpp"
#include "span.hpp"

namespace scissorhands {

struct state_shape {
  std::int32_t rows = 0;        // sequences the state can hold at once
  std::int32_t kv_heads = 0;
  std::int32_t capacity = 0;    // slots per (row, head): the most tokens a sequence holds at a call
  std::int32_t ring_words = 0;  // from the policy: policy.ring_words()

  friend constexpr bool operator==(const state_shape&, const state_shape&) = default;
};

template <memory_space Space>
struct eviction_state {
  static constexpr memory_space space = Space;
  state_shape shape;
  std::int64_t* step = nullptr;           // [rows] steps observed so far
  std::int32_t* next_position = nullptr;  // [rows] position the next admitted token gets
  std::int32_t* tracked = nullptr;        // [rows] slots with state
  std::uint32_t* status = nullptr;        // [rows] CUDA: device-found errors of the row's sequence (status_flag)
  std::uint32_t* blocks_done = nullptr;   // [rows] CUDA: blocks of the running launch done with the row, else 0
  std::int32_t* positions = nullptr;      // [rows][kv_heads][capacity]
  float* scores = nullptr;                // [rows][kv_heads][capacity]
  float* observed = nullptr;              // [rows][kv_heads][capacity]
  std::uint32_t* ring = nullptr;          // [rows][kv_heads][ring_words][capacity]
  span<const std::int32_t, Space> state_rows;  // [batch] row of each batch position; empty: row b

  // The same state seen through this step's batch: position b uses row
  // state_rows[b] (-1: a padding slot). The rows must be distinct.
  eviction_state for_batch(span<const std::int32_t, Space> rows_of_batch) const {
    eviction_state s = *this;
    s.state_rows = rows_of_batch;
    return s;
  }
  SCISSORHANDS_HOST_DEVICE std::int32_t row(std::int32_t b) const {
    return state_rows.data() != nullptr ? state_rows[b] : b;
  }
  SCISSORHANDS_HOST_DEVICE std::int64_t row_index(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return (std::int64_t{r} * shape.kv_heads + h) * shape.capacity + t;
  }
  // Token state of batch position b, head h, slot t.
  SCISSORHANDS_HOST_DEVICE std::int64_t index(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return row_index(row(b), h, t);
  }
  // The history words of head h of row r: word w of slot t at [w * capacity + t].
  SCISSORHANDS_HOST_DEVICE std::uint32_t* ring_of_head(std::int32_t r, std::int32_t h) const {
    return ring + (std::int64_t{r} * shape.kv_heads + h) * shape.ring_words * shape.capacity;
  }
  // The history of slot t of head h of row r.
  SCISSORHANDS_HOST_DEVICE history_ring ring_of(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return {ring_of_head(r, h) + t, shape.capacity};
  }
  // The same from a token index (row_index): a division, for code that
  // holds only the index; loops over slots use the form above.
  SCISSORHANDS_HOST_DEVICE history_ring ring_of(std::int64_t token_index) const {
    const std::int64_t head = token_index / shape.capacity;
    return {ring + head * shape.ring_words * shape.capacity + (token_index - head * shape.capacity), shape.capacity};
  }
};

// Slots a state needs for a budget and the most tokens appended between two
// compress calls (1 when decoding; the chunk size for chunked prefill).
// Throws invalid_argument for a non-positive argument or a sum beyond int32.
constexpr std::int32_t state_capacity_for(std::int32_t budget, std::int32_t max_step_tokens) {
  const char* fn = "state_capacity_for";
  if (budget <= 0) detail::fail(fn, "budget", "must be positive, got ", budget);
  if (max_step_tokens <= 0) detail::fail(fn, "max_step_tokens", "must be positive, got ", max_step_tokens);
  const std::int64_t slots = std::int64_t{budget} + max_step_tokens - 1;
  if (slots > INT32_MAX)
    detail::fail(fn, "max_step_tokens", "plus budget - 1 must fit in int32, got ", slots);
  return static_cast<std::int32_t>(slots);
}

// How long a sequence of `length` tokens is after compress at `budget`
// evicting `evict_count` (m): data-independent, so an engine can mirror
// its lengths on the host without reading anything back from the device.
SCISSORHANDS_HOST_DEVICE constexpr std::int32_t length_after_compress(std::int32_t length, std::int32_t budget,
                                                                      std::int32_t evict_count) {
  return length >= budget ? budget - evict_count : length;
}

namespace detail {

inline constexpr std::size_t state_alignment = 256;

constexpr std::size_t align_up(std::size_t x) { return (x + state_alignment - 1) / state_alignment * state_alignment; }

// Byte offsets of the state's arrays inside the buffer, in declaration order.
struct state_offsets {
  std::size_t step, next_position, tracked, status, blocks_done, positions, scores, observed, ring, total;
};

constexpr state_offsets offsets_of(const state_shape& s) {
  const std::size_t b = static_cast<std::size_t>(s.rows);
  const std::size_t tokens = b * static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.capacity);
  std::size_t at = 0;
  // Each array starts where the previous one ends, aligned.
  const auto next = [&at](std::size_t bytes) {
    const std::size_t start = at;
    at = align_up(at + bytes);
    return start;
  };
  state_offsets o{};
  o.step = next(b * sizeof(std::int64_t));
  o.next_position = next(b * sizeof(std::int32_t));
  o.tracked = next(b * sizeof(std::int32_t));
  o.status = next(b * sizeof(std::uint32_t));
  o.blocks_done = next(b * sizeof(std::uint32_t));
  o.positions = next(tokens * sizeof(std::int32_t));
  o.scores = next(tokens * sizeof(float));
  o.observed = next(tokens * sizeof(float));
  o.ring = next(tokens * static_cast<std::size_t>(s.ring_words) * sizeof(std::uint32_t));
  o.total = at;
  return o;
}

inline void validate_state_shape(const char* fn, const state_shape& s) {
  require(s.rows > 0, fn, "shape.rows", "must be positive, got ", s.rows);
  require(s.kv_heads > 0, fn, "shape.kv_heads", "must be positive, got ", s.kv_heads);
  require(s.capacity > 0, fn, "shape.capacity", "must be positive, got ", s.capacity);
  require(s.ring_words >= 0, fn, "shape.ring_words", "must be non-negative, got ", s.ring_words);
  // Keep every byte count below 2^62 so nothing overflows on any platform.
  const double bytes = static_cast<double>(s.rows) * s.kv_heads * s.capacity * (12.0 + 4.0 * s.ring_words);
  require(bytes < 4.0e18, fn, "shape", "needs ", bytes, " bytes of state, beyond what can be addressed");
}

}  // namespace detail

// Bytes of state each (row, head, slot) takes: position, score, observed
// count and ring_words words of history (plus per-row counters and 256-byte
// alignment padding, which state_bytes adds).
constexpr std::size_t state_bytes_per_slot(std::int32_t ring_words) {
  return std::size_t{12} + std::size_t{4} * static_cast<std::size_t>(ring_words < 0 ? 0 : ring_words);
}

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
  s.status = reinterpret_cast<std::uint32_t*>(base + o.status);
  s.blocks_done = reinterpret_cast<std::uint32_t*>(base + o.blocks_done);
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
