#pragma once
// Small pieces the engine tests share: a deterministic random source, token
// contents derived from (request, layer, head, position), a 256-byte aligned
// buffer, and byte snapshots. Self-contained on purpose: nothing here comes
// from tests/host or from the library's selection code.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <vector>

namespace engine_test {

// splitmix64's finaliser.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_of(std::initializer_list<std::int64_t> parts) {
  std::uint64_t h = 0xE6617E5Dull;
  for (std::int64_t p : parts) h = mix64(h ^ static_cast<std::uint64_t>(p));
  return h;
}

// A seeded stream (same sequence on every standard library).
struct rng {
  std::uint64_t state;
  explicit rng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() { return mix64(state++ * 0x2545F4914F6CDD1Dull); }
  // Uniform integer in [lo, hi].
  std::int32_t uniform(std::int32_t lo, std::int32_t hi) {
    return lo + static_cast<std::int32_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1p-53 < p; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

// A signed multiple of 2^-22 in [-amplitude, amplitude): exact in fp32.
inline float hashed_value(std::uint64_t h, float amplitude) {
  const auto bits = static_cast<std::int64_t>(h >> 41);  // 23 bits
  return static_cast<float>(bits - (std::int64_t{1} << 22)) * 0x1p-22f * amplitude;
}

// Element d of the K row (kind 0) or the V row (kind 1) of the token at
// logical `position` of request `request`, layer `layer`, KV head `head`.
// The V row names its token: V[0] = position, V[1] = request id, V[2] =
// layer * 64 + head (all exact in fp32), so the checker can tell which token
// a slot holds by reading the cache alone.
inline float token_value(int kind, std::int32_t request, std::int32_t layer, std::int32_t head,
                         std::int32_t position, std::int32_t d) {
  if (kind == 1 && d == 0) return static_cast<float>(position);
  if (kind == 1 && d == 1) return static_cast<float>(request);
  if (kind == 1 && d == 2) return static_cast<float>(layer * 64 + head);
  return hashed_value(hash_of({kind, request, layer, head, position, d}), kind == 0 ? 2.0f : 1.0f);
}

// Element d of query head qh of the query at `position` (the query's token).
inline float query_value(std::int32_t request, std::int32_t layer, std::int32_t qh, std::int32_t position,
                         std::int32_t d) {
  return hashed_value(hash_of({7, request, layer, qh, position, d}), 3.0f);
}

// 256-byte aligned heap bytes (a state buffer must be).
class aligned_buffer {
 public:
  explicit aligned_buffer(std::size_t bytes, unsigned char fill = 0xA5) : size_(bytes) {
    const std::size_t rounded = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    data_ = static_cast<std::byte*>(std::aligned_alloc(256, rounded));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, fill, rounded);
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  aligned_buffer(aligned_buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  ~aligned_buffer() { std::free(data_); }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// The bytes of a buffer, for before/after comparisons.
template <class T>
std::vector<unsigned char> bytes_of(const T* data, std::size_t count) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  return {p, p + count * sizeof(T)};
}

}  // namespace engine_test
