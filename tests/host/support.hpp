#pragma once
// Shared pieces of the host tests: deterministic hashing, token row
// contents derived from (sequence, head, position), aligned buffers, the
// state and model holders, an engine's own bf16, the argument a refused call names,
// a slot map compacted as compress compacts it, and the two cache models
// (contiguous and paged) the simulations drive. Nothing here calls the
// library's selection code.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh_test {

namespace sh = scissorhands;
inline constexpr auto host = sh::memory_space::host;

// splitmix64's finaliser: a good 64-bit mix, enough for test data.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_of(std::initializer_list<std::int64_t> parts) {
  std::uint64_t h = 0x5C155042D5ull;
  for (std::int64_t p : parts) h = mix64(h ^ static_cast<std::uint64_t>(p));
  return h;
}

// Uniform in [0, 1), 24 bits.
inline double unit(std::uint64_t h) { return static_cast<double>(h >> 40) * 0x1p-24; }

// Element d of the K (kind 0) or V (kind 1) row of token (b, h, position):
// a multiple of 2^-23 in [-1, 1). A row is 8+ such values, so two tokens
// sharing a row is practically impossible: a row identifies its token.
inline float token_value(int kind, std::int32_t b, std::int32_t h, std::int32_t position, std::int32_t d) {
  const auto bits = static_cast<std::int64_t>(hash_of({kind, b, h, position, d}) >> 40);
  return static_cast<float>(bits - (std::int64_t{1} << 23)) * 0x1p-23f;
}

// What fills every buffer element before the test writes any token: also
// unique per element, so an unexpected write is always visible.
inline float background_value(std::uint64_t seed, int kind, std::size_t i) {
  return 100.0f + static_cast<float>(hash_of({static_cast<std::int64_t>(seed), kind, static_cast<std::int64_t>(i)}) >> 44);
}

inline bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

inline bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Fisher-Yates with our own hash, so the order is the same on every library.
template <class T>
void scramble(std::vector<T>& v, std::uint64_t seed) {
  for (std::size_t i = v.size(); i > 1; --i) {
    const std::size_t j = hash_of({static_cast<std::int64_t>(seed), static_cast<std::int64_t>(i)}) % i;
    std::swap(v[i - 1], v[j]);
  }
}

// The argument the library's invalid_argument names, or "(accepted)" when
// the call returned: CHECK(refused_argument([&] { ... }) == "row").
template <class Call>
std::string refused_argument(Call&& call) {
  try {
    call();
  } catch (const sh::invalid_argument& e) {
    return e.argument();
  }
  return "(accepted)";
}

// An engine's own bf16 (the upper half of an fp32): the host backend's only
// non-fp32 element types are the engine's, through element_traits (below).
struct engine_bf16 {
  std::uint16_t bits;
};

inline engine_bf16 to_bf16(float x) {  // round to nearest even
  const auto u = std::bit_cast<std::uint32_t>(x);
  return {static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

// What compress does to a sequence's slots, on the test's own map (slot ->
// whatever it tracks): the evicted slots go; fill_holes moves the last kept
// entries into the holes below the new length, both ascending;
// preserve_order keeps the order.
template <class T>
void compact_slot_map(std::vector<T>& map, const std::vector<std::int32_t>& evicted, sh::compaction mode) {
  std::vector<char> gone(map.size(), 0);
  for (std::int32_t t : evicted) gone[static_cast<std::size_t>(t)] = 1;
  const std::size_t kept = map.size() - evicted.size();
  if (mode == sh::compaction::fill_holes) {
    std::size_t source = kept;
    for (std::size_t hole = 0; hole < kept; ++hole) {
      if (!gone[hole]) continue;
      while (gone[source]) ++source;
      map[hole] = map[source++];
    }
    map.resize(kept);
  } else {
    std::vector<T> next;
    for (std::size_t t = 0; t < map.size(); ++t)
      if (!gone[t]) next.push_back(map[t]);
    map = std::move(next);
  }
}

// A 256-byte aligned heap buffer (the state requires it).
class aligned_bytes {
 public:
  explicit aligned_bytes(std::size_t bytes, unsigned char fill = 0xA5) : size_(bytes) {
    const std::size_t rounded = std::max<std::size_t>(256, (bytes + 255) / 256 * 256);
    data_ = static_cast<std::byte*>(std::aligned_alloc(256, rounded));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, fill, rounded);
  }
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
  ~aligned_bytes() { std::free(data_); }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  sh::host_span<std::byte> span() const { return {data_, size_}; }
  std::vector<std::byte> snapshot() const { return {data_, data_ + size_}; }
  bool equals(const std::vector<std::byte>& other) const {
    return other.size() == size_ && std::memcmp(other.data(), data_, size_) == 0;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// A layer's state laid out over its own buffer, reset and ready.
struct state_holder {
  sh::state_shape shape;
  aligned_bytes buffer;
  sh::eviction_state<host> state;

  template <class Policy, class View>
  state_holder(const Policy& policy, const View& view)
      : shape(sh::state_shape_for(policy, view)),
        buffer(sh::state_bytes(shape)),
        state(sh::make_state(buffer.span(), shape)) {
    sh::host::reset_state(state);
  }
  // Flat index of (b, h, slot), by the documented [batch][kv_heads][capacity] layout.
  std::int64_t at(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return (std::int64_t{b} * shape.kv_heads + h) * shape.capacity + t;
  }
};

// A model state (`layers` layer states) over its own buffer, reset and ready.
struct model_holder {
  sh::state_shape shape;
  aligned_bytes buffer;
  sh::model_state<host> model;

  model_holder(const sh::state_shape& shape_, std::int32_t layers)
      : shape(shape_),
        buffer(sh::model_state_bytes(shape_, layers)),
        model(sh::make_model_state(buffer.span(), shape_, layers)) {
    sh::host::reset_state(model);
  }
};

// ---------------------------------------------------------------------------
// Cache models. Both keep their own record of which row holds what and
// compute row offsets with their own maths.

// A K or V buffer that holds every row offset(i, h, t) starts (i < outer,
// h < heads, t < inner) plus `tail` elements nobody may write, each element
// a background value.
template <class Offset>
std::vector<float> background_buffer(std::int32_t outer, std::int32_t heads, std::int32_t inner, std::int32_t head_dim,
                                     std::int32_t tail, std::uint64_t seed, int kind, Offset&& offset) {
  std::int64_t last = 0;
  for (std::int32_t i = 0; i < outer; ++i)
    for (std::int32_t h = 0; h < heads; ++h)
      for (std::int32_t t = 0; t < inner; ++t) last = std::max(last, offset(i, h, t));
  std::vector<float> data(static_cast<std::size_t>(last + head_dim + tail));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = background_value(seed, kind, i);
  return data;
}

// Contiguous per-sequence cache with any strides for K and V.
struct contiguous_cache {
  std::int32_t batch, kv_heads, head_dim, capacity;
  sh::kv_layout layouts[2];  // K, V
  std::vector<float> data[2];
  std::vector<std::int32_t> lengths;
  std::vector<std::int32_t> reported;  // compress's new_lengths
  std::vector<std::int32_t> freed;     // handed to compress when pass_freed
  bool pass_freed = true;

  contiguous_cache(std::int32_t batch_, std::int32_t kv_heads_, std::int32_t head_dim_, std::int32_t capacity_,
                   sh::kv_layout k_layout, sh::kv_layout v_layout, std::uint64_t seed)
      : batch(batch_), kv_heads(kv_heads_), head_dim(head_dim_), capacity(capacity_), layouts{k_layout, v_layout},
        lengths(static_cast<std::size_t>(batch_), 0), reported(static_cast<std::size_t>(batch_), -7),
        freed(static_cast<std::size_t>(batch_), -7) {
    for (int kind = 0; kind < 2; ++kind)
      data[kind] =
          background_buffer(batch, kv_heads, capacity, head_dim, 5, seed, kind,
                            [&](std::int32_t b, std::int32_t h, std::int32_t t) { return row_offset(kind, b, h, t); });
  }
  std::int64_t row_offset(int kind, std::int32_t b, std::int32_t h, std::int32_t t) const {
    const auto& l = layouts[kind];
    return b * l.sequence_stride + h * l.head_stride + t * l.token_stride;
  }
  float* row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return data[kind].data() + row_offset(kind, b, h, t);
  }
  std::int32_t length(std::int32_t b) const { return lengths[static_cast<std::size_t>(b)]; }
  std::int32_t max_capacity() const { return capacity; }
  std::int32_t append(std::int32_t b) { return lengths[static_cast<std::size_t>(b)]++; }

  sh::host_kv_view<float> view() {
    return {sh::host_span<float>(data[0].data(), data[0].size()), sh::host_span<float>(data[1].data(), data[1].size()),
            layouts[0], layouts[1], sh::host_span<const std::int32_t>(lengths.data(), lengths.size()),
            batch, kv_heads, head_dim, capacity};
  }
  // Fresh output spans for one compress call (poisoned, so unwritten entries show).
  sh::compress_output<sh::memory_space::host> output() {
    std::fill(reported.begin(), reported.end(), -7);
    std::fill(freed.begin(), freed.end(), -7);
    if (!pass_freed) return {{reported.data(), reported.size()}, {}};
    return {{reported.data(), reported.size()}, {freed.data(), freed.size()}};
  }
  // After compress: checks the reported lengths (a contiguous cache frees no
  // pages) and applies them as an engine would. Returns "" when all is well.
  std::string after_compress(const std::vector<std::int32_t>& new_lengths) {
    if (reported != new_lengths) return "compress reported other new lengths than expected";
    if (pass_freed)
      for (std::int32_t f : freed)
        if (f != 0) return "a contiguous cache reported freed pages";
    lengths = reported;
    return "";
  }
};

// FlashInfer-style paged cache over a pool of pages handed out in scrambled
// order; the test keeps each sequence's page list and rebuilds the CSR table.
struct paged_cache {
  std::int32_t batch, kv_heads, head_dim, page_size, max_pages, num_pages;
  sh::paged_layout layouts[2];
  std::vector<float> data[2];
  std::vector<std::vector<std::int32_t>> pages;  // per sequence, in order
  std::vector<std::int32_t> lengths;             // the test's own record
  std::vector<std::int32_t> free_list;
  std::vector<std::int32_t> indptr, indices, last_page_len, reported, freed;
  std::uint64_t seed;

  paged_cache(std::int32_t batch_, std::int32_t kv_heads_, std::int32_t head_dim_, std::int32_t page_size_,
              std::int32_t capacity, sh::paged_layout k_layout, sh::paged_layout v_layout, std::uint64_t seed_)
      : batch(batch_), kv_heads(kv_heads_), head_dim(head_dim_), page_size(page_size_),
        max_pages((capacity + page_size_ - 1) / page_size_), num_pages(batch_ * max_pages + 5),
        layouts{k_layout, v_layout}, pages(static_cast<std::size_t>(batch_)),
        lengths(static_cast<std::size_t>(batch_), 0), seed(seed_) {
    for (int kind = 0; kind < 2; ++kind)
      data[kind] = background_buffer(
          num_pages, kv_heads, page_size, head_dim, 3, seed, kind,
          [&](std::int32_t p, std::int32_t h, std::int32_t t) { return page_row_offset(kind, p, h, t); });
    for (std::int32_t p = 0; p < num_pages; ++p) free_list.push_back(p);
    scramble(free_list, seed);
    build_table();
  }
  std::int64_t page_row_offset(int kind, std::int32_t page, std::int32_t h, std::int32_t t) const {
    const auto& l = layouts[kind];
    return page * l.page_stride + h * l.head_stride + t * l.token_stride;
  }
  std::int64_t row_offset(int kind, std::int32_t b, std::int32_t h, std::int32_t t) const {
    return page_row_offset(kind, pages[static_cast<std::size_t>(b)][static_cast<std::size_t>(t / page_size)], h,
                           t % page_size);
  }
  float* row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return data[kind].data() + row_offset(kind, b, h, t);
  }
  std::int32_t length(std::int32_t b) const { return lengths[static_cast<std::size_t>(b)]; }
  std::int32_t max_capacity() const { return max_pages * page_size; }
  std::int32_t append(std::int32_t b) {
    auto& list = pages[static_cast<std::size_t>(b)];
    auto& len = lengths[static_cast<std::size_t>(b)];
    if (len == static_cast<std::int32_t>(list.size()) * page_size) {
      list.push_back(free_list.back());
      free_list.pop_back();
    }
    return len++;
  }
  void build_table() {
    indptr.assign(1, 0);
    indices.clear();
    last_page_len.clear();
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto& list = pages[static_cast<std::size_t>(b)];
      indices.insert(indices.end(), list.begin(), list.end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      const std::int32_t len = lengths[static_cast<std::size_t>(b)];
      last_page_len.push_back(list.empty() ? 0 : len - (static_cast<std::int32_t>(list.size()) - 1) * page_size);
    }
    indices.resize(indices.size() + 3, -1);  // spare entries the library must ignore
  }
  sh::host_paged_kv_view<float> view() {
    build_table();
    return {{data[0].data(), data[0].size()},
            {data[1].data(), data[1].size()},
            layouts[0],
            layouts[1],
            {indptr.data(), indptr.size()},
            {indices.data(), indices.size()},
            {last_page_len.data(), last_page_len.size()},
            batch,
            kv_heads,
            head_dim,
            page_size,
            num_pages,
            max_pages};
  }
  // Fresh output spans for one compress call (poisoned, so unwritten entries show).
  sh::compress_output<sh::memory_space::host> output() {
    reported.assign(static_cast<std::size_t>(batch), -7);
    freed.assign(static_cast<std::size_t>(batch), -7);
    return {{reported.data(), reported.size()}, {freed.data(), freed.size()}};
  }
  // After compress: checks what the library reported against the expected
  // new lengths, applies them through shrink_page_table, and takes the new
  // table as the test's own. Returns "" when all is well.
  std::string after_compress(const std::vector<std::int32_t>& new_lengths) {
    std::ostringstream err;
    if (reported != new_lengths) return "compress reported other new lengths than expected";
    std::vector<std::int32_t> expect_released;
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto& list = pages[static_cast<std::size_t>(b)];
      const std::int32_t len = new_lengths[static_cast<std::size_t>(b)];
      const std::int32_t keep = (len + page_size - 1) / page_size;
      const std::int32_t want_freed = static_cast<std::int32_t>(list.size()) - keep;
      if (freed[static_cast<std::size_t>(b)] != want_freed)
        err << "sequence " << b << ": freed_pages " << freed[static_cast<std::size_t>(b)] << ", expected "
            << want_freed << "; ";
      for (std::int32_t i = keep; i < static_cast<std::int32_t>(list.size()); ++i)
        expect_released.push_back(list[static_cast<std::size_t>(i)]);
    }
    if (!err.str().empty()) return err.str();
    std::vector<std::int32_t> released(expect_released.size() + 2, -1);
    const std::size_t n = sh::host::shrink_page_table(
        {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
        {last_page_len.data(), last_page_len.size()}, page_size,
        sh::host_span<const std::int32_t>(reported.data(), reported.size()), {released.data(), released.size()});
    released.resize(n);
    if (released != expect_released) return "shrink_page_table released other pages than the trailing ones";
    for (std::int32_t b = 0; b < batch; ++b) {
      auto& list = pages[static_cast<std::size_t>(b)];
      std::vector<std::int32_t> now(indices.begin() + indptr[static_cast<std::size_t>(b)],
                                    indices.begin() + indptr[static_cast<std::size_t>(b) + 1]);
      const std::int32_t len = new_lengths[static_cast<std::size_t>(b)];
      const std::size_t keep = static_cast<std::size_t>((len + page_size - 1) / page_size);
      if (now.size() != keep || !std::equal(now.begin(), now.end(), list.begin()))
        return "shrink_page_table did not keep sequence " + std::to_string(b) + "'s leading pages";
      const std::int32_t table_length =
          now.empty() ? 0
                      : (static_cast<std::int32_t>(now.size()) - 1) * page_size +
                            last_page_len[static_cast<std::size_t>(b)];
      if (table_length != len) return "the page table gives sequence " + std::to_string(b) + " a wrong length";
      list = now;
      lengths[static_cast<std::size_t>(b)] = len;
    }
    // Freed pages go back to the pool at scrambled places.
    for (std::size_t i = 0; i < released.size(); ++i) {
      const std::size_t at = hash_of({static_cast<std::int64_t>(seed), static_cast<std::int64_t>(free_list.size()),
                                      released[i]}) % (free_list.size() + 1);
      free_list.insert(free_list.begin() + static_cast<std::ptrdiff_t>(at), released[i]);
    }
    return "";
  }
};

// Named layouts and a few arbitrary ones for the contiguous cache.
enum class layout_kind { nhd, hnd, padded, mixed, sequence_inner };

inline const char* name_of(layout_kind k) {
  switch (k) {
    case layout_kind::nhd: return "nhd";
    case layout_kind::hnd: return "hnd";
    case layout_kind::padded: return "padded";
    case layout_kind::mixed: return "mixed (K nhd, V hnd)";
    case layout_kind::sequence_inner: return "sequence innermost";
  }
  return "?";
}

inline contiguous_cache make_contiguous(layout_kind kind, std::int32_t batch, std::int32_t kv_heads,
                                        std::int32_t head_dim, std::int32_t capacity, std::uint64_t seed) {
  const auto nhd = sh::kv_layout::nhd(capacity, kv_heads, head_dim);
  const auto hnd = sh::kv_layout::hnd(capacity, kv_heads, head_dim);
  switch (kind) {
    case layout_kind::nhd: return {batch, kv_heads, head_dim, capacity, nhd, nhd, seed};
    case layout_kind::hnd: return {batch, kv_heads, head_dim, capacity, hnd, hnd, seed};
    case layout_kind::padded: {
      // Rows padded to head_dim + 3, heads by 5 more, sequences by 7 more.
      const std::int64_t token = head_dim + 3;
      const std::int64_t head = capacity * token + 5;
      const sh::kv_layout l{kv_heads * head + 7, head, token};
      const sh::kv_layout v{kv_heads * head + 11, head, token};
      return {batch, kv_heads, head_dim, capacity, l, v, seed};
    }
    case layout_kind::mixed: return {batch, kv_heads, head_dim, capacity, nhd, hnd, seed};
    case layout_kind::sequence_inner: {
      // [token][head][sequence][dim]: sequences interleaved row by row.
      const std::int64_t seq = head_dim;
      const sh::kv_layout l{seq, seq * batch, seq * batch * kv_heads};
      return {batch, kv_heads, head_dim, capacity, l, l, seed};
    }
  }
  return {batch, kv_heads, head_dim, capacity, nhd, nhd, seed};
}

}  // namespace sh_test

template <>
struct scissorhands::element_traits<sh_test::engine_bf16> {
  static float to_float(sh_test::engine_bf16 x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }
};
