#pragma once
// Shared set-up of the host benchmarks: a Llama-3-8B-like layer (8 KV heads,
// 32 query heads, head_dim 128, fp32, NHD), its eviction state and scratch,
// all in grow-only buffers that are written once when they grow, so no page
// fault and no allocation ever lands in a timed region.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace bench_host {

namespace sh = scissorhands;
using host_state = sh::eviction_state<sh::memory_space::host>;

inline constexpr std::int32_t kv_heads = 8;
inline constexpr std::int32_t q_heads = 32;
inline constexpr std::int32_t head_dim = 128;
inline constexpr std::int32_t group = q_heads / kv_heads;

// The paper's Scissorhands (threshold indicator, w = 400, r = 10), the
// policy every benchmark uses unless it says otherwise.
inline sh::scissorhands_policy scissorhands_with(std::int32_t evict_count) {
  sh::scissorhands_policy p;
  p.config.window = 400;
  p.config.recent = 10;
  p.config.evict_count = evict_count;
  return p;
}

// xorshift64*: fast, and good enough for benchmark data.
struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float symmetric() { return 2.0f * uniform() - 1.0f; }                                  // [-1, 1)
};

// Grow-only 256-byte-aligned storage (make_state wants 256). Growth writes
// every byte: random floats for K/V-like buffers, zeros otherwise.
class arena_buffer {
 public:
  std::byte* bytes(std::size_t count) {
    grow(count, 0);
    return data_.get();
  }
  float* random_floats(std::size_t count, std::uint64_t seed) {
    grow(count * sizeof(float), seed);
    return reinterpret_cast<float*>(data_.get());
  }

 private:
  struct release {
    void operator()(std::byte* p) const { std::free(p); }
  };
  void grow(std::size_t count, std::uint64_t seed) {
    if (count <= size_) return;
    const std::size_t rounded = (count + 255) / 256 * 256;
    data_.reset();  // the old one goes first: the largest layer is ~0.5 GB
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(256, rounded)));
    if (!data_) throw std::bad_alloc();
    size_ = rounded;
    if (seed == 0) {
      std::memset(data_.get(), 0, rounded);
      return;
    }
    rng r(seed);
    auto* f = reinterpret_cast<float*>(data_.get());
    for (std::size_t i = 0; i < rounded / sizeof(float); ++i) f[i] = r.symmetric();
  }
  std::unique_ptr<std::byte, release> data_;
  std::size_t size_ = 0;
};

struct arenas {
  arena_buffer k, v, state, workspace;
  arena_buffer dst_k, dst_v, dst_state;  // the naive baseline's fresh buffers
  std::vector<std::int32_t> lengths;      // the engine's lengths (the view reads them, never writes)
  std::vector<std::int32_t> new_lengths;  // compress_output::new_lengths
};
inline arenas& storage() {
  static arenas a;
  return a;
}

// One layer: the engine's cache (capacity slots per sequence and head), its
// lengths and the output compress writes the new ones into, and the
// library's state and workspace for it.
struct layer {
  sh::host_kv_view<float> cache;
  sh::host_span<std::int32_t> lengths;  // what cache.lengths reads, as the engine writes it
  sh::compress_output<sh::memory_space::host> out;
  host_state state;
  sh::host_span<std::byte> workspace;
  std::int32_t batch = 0;
  std::int32_t capacity = 0;

  std::size_t tokens() const {  // (sequence, head, slot) triples
    return static_cast<std::size_t>(batch) * kv_heads * static_cast<std::size_t>(capacity);
  }
};

template <class Policy>
layer make_layer(const Policy& policy, std::int32_t batch, std::int32_t capacity) {
  arenas& s = storage();
  const std::size_t elems = static_cast<std::size_t>(batch) * capacity * kv_heads * head_dim;
  s.lengths.assign(static_cast<std::size_t>(batch), 0);
  s.new_lengths.assign(static_cast<std::size_t>(batch), 0);
  layer l;
  l.batch = batch;
  l.capacity = capacity;
  l.lengths = sh::host_span<std::int32_t>(s.lengths.data(), s.lengths.size());
  l.out.new_lengths = sh::host_span<std::int32_t>(s.new_lengths.data(), s.new_lengths.size());  // contiguous: no freed_pages
  l.cache = sh::make_kv_view(sh::host_span<float>(s.k.random_floats(elems, 1), elems),
                             sh::host_span<float>(s.v.random_floats(elems, 2), elems),
                             sh::host_span<const std::int32_t>(s.lengths.data(), s.lengths.size()), batch, kv_heads,
                             head_dim, capacity, sh::named_layout::nhd);
  const sh::state_shape shape = sh::state_shape_for(policy, l.cache);
  const std::size_t state_bytes = sh::state_bytes(shape);
  l.state = sh::make_state(sh::host_span<std::byte>(s.state.bytes(state_bytes), state_bytes), shape);
  sh::host::reset_state(l.state);
  const std::size_t ws = sh::host::compress_workspace_bytes(l.cache);
  l.workspace = sh::host_span<std::byte>(s.workspace.bytes(ws), ws);
  return l;
}

inline void set_lengths(const layer& l, std::int32_t length) {
  for (std::int32_t b = 0; b < l.batch; ++b) l.lengths[static_cast<std::size_t>(b)] = length;
}

// A decode step's token, once more: the state forgets that it tracks each
// sequence's last token, so the next observe admits it and its query is a
// new token's (observe refuses a query whose token a query already saw).
// `batch` integer writes, left in the timed loop: nothing next to a step.
inline void rewind_last_token(const layer& l) {
  for (std::int32_t b = 0; b < l.batch; ++b) l.state.tracked[b] = l.lengths[static_cast<std::size_t>(b)] - 1;
}

// What an engine does after compress (after the last layer that shares the
// lengths): copy the new lengths into its own. O(batch), never timed.
inline void apply_new_lengths(const layer& l) {
  for (std::int32_t b = 0; b < l.batch; ++b) l.lengths[static_cast<std::size_t>(b)] = l.out.new_lengths[static_cast<std::size_t>(b)];
}

// Bytes of the library's per-token state that move with a token.
inline std::size_t state_row_bytes(const host_state& st) {
  return 3 * sizeof(std::int32_t) + sizeof(std::uint32_t) * static_cast<std::size_t>(st.shape.ring_words);
}
inline constexpr std::size_t kv_row_bytes = 2 * sizeof(float) * head_dim;  // one K row and one V row

// CPU time of the calling thread. The machine these figures come from is
// shared: wall time would also count the time other processes held the
// core, CPU time only the call's own work (memory contention stays in).
// Google Benchmark's own timer reports CPU time too (the rates use it).
inline double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall time, for calls that run on several threads.
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace bench_host
