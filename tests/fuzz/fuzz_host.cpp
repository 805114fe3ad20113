// libFuzzer harness for the host backend. The input bytes decode into a
// configuration (policy, shape, layout, paged or not, settings, the state's
// rows and capacity, which state row each batch position uses) and a short
// program of steps: the engine appends tokens, swaps batch positions,
// retires a request and starts another in its slot, rolls tokens back; the
// library observes (uniform or ragged queries), admits, compresses (the
// engine then applies compress_output: copies the new lengths, or rewrites
// its page table with shrink_page_table); the state is reset or garbage is
// poked into it; shrink_page_table is also called on its own random tables.
// After every library call the harness checks one of two outcomes:
//  - a scissorhands::invalid_argument naming the entry point and an
//    argument, and every byte the caller owns (cache, lengths, page table,
//    state, compress outputs, every scratch array) equal to a copy taken
//    before the call;
//  - success, and every invariant: cache untouched by observe; positions,
//    counts, steps and lengths as specified, per state row; the evicted set
//    equal to a brute-force oracle's; kept K/V rows and their state
//    bit-identical to the originals and in the slots the compaction mode
//    puts them; the lengths and page table never written; no other byte
//    written (state rows the batch does not map, slots past a length, output
//    entries outside the spans).
// Inputs whose first byte is in [97, 118] or [198, 217] exercise token-level
// eviction instead (granularity.hpp): the program above with a shared_heads
// policy (compress checked against one oracle per sequence, by the score
// combined over the heads), or a shared_layers model of 1-3 layers driven
// through select, compact and forget (layers_case, below). Inputs whose
// first byte is in [161, 177] drive a quantized cache (int8 / int4 codes
// with group parameters) and its float twin through the same calls
// (quant_case, fuzz_quantized.hpp).
// When the harness built a call from clean parts it knows the call is valid,
// and a refusal is a bug; when a part is invalid whatever else holds (a bad
// row, a short output, a length above the state's capacity, ...) an
// acceptance is a bug. Anything else (another exception, a sanitizer report,
// a crash) is a bug.
//
// Built two ways: with clang's -fsanitize=fuzzer (scripts/stages/20-fuzz.sh)
// and, with any compiler, linked with replay_main.cpp to re-run the corpus as
// a CTest test. FUZZ_TRACE=1 in the environment prints the decoded program.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace {

namespace sh = scissorhands;
using sh::memory_space;

[[noreturn]] void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz_host: invariant broken: %s\n", file, line, what.c_str());
  std::abort();
}
#define FUZZ_CHECK(cond, what)                    \
  do {                                            \
    if (!(cond)) fail(__FILE__, __LINE__, (what)); \
  } while (0)

bool tracing() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}
#define FUZZ_TRACE(...)                                  \
  do {                                                   \
    if (tracing()) std::fprintf(stderr, __VA_ARGS__);    \
  } while (0)

// ---------------------------------------------------------------------------
// Input decoding. Past the end every read is 0, and 0 always decodes to the
// plain, valid choice, so truncated inputs stay meaningful.
class byte_source {
 public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool exhausted() const { return pos_ >= size_; }
  [[nodiscard]] std::size_t position() const { return pos_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::int64_t in(std::int64_t lo, std::int64_t hi) {
    const auto range = static_cast<std::uint64_t>(hi - lo) + 1;
    std::uint64_t x = byte();
    if (range > 256) x |= std::uint64_t{byte()} << 8;
    if (range > 65536) x |= std::uint64_t{byte()} << 16 | std::uint64_t{byte()} << 24;
    return lo + static_cast<std::int64_t>(x % range);
  }
  std::int32_t i32(std::int64_t lo, std::int64_t hi) { return static_cast<std::int32_t>(in(lo, hi)); }
  bool flag() { return (byte() & 1) != 0; }
  bool rarely() { return byte() >= 236; }  // about 1 in 12
  std::uint32_t word() {
    std::uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x = x << 8 | byte();
    return x;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Bulk data (K/V rows, queries) comes from a seeded generator, not from the
// input, so small inputs still fill whole caches.
struct generator {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.0f; }
};

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

// Values no caller should pass where a probability or score goes.
float special_value(byte_source& src) {
  constexpr float table[] = {nan_f, inf_f, -inf_f, -1.0f, -1e-30f, -0.0f, 1.5f, 1.0011f, 3.4e38f, 1e-45f, 0.0f, 1.0f};
  return table[src.in(0, std::size(table) - 1)];
}

std::int32_t garbage_int(byte_source& src) {
  constexpr std::int32_t table[] = {-1, 0, 1, 2, 7, 1000, INT32_MAX, INT32_MAX - 1, INT32_MIN, -100000, 65536, 31};
  return table[src.in(0, std::size(table) - 1)];
}

// The settings of a case (shared by every mode: the same bytes decode to the
// same settings), rarely one of them garbage.
void decode_settings_into(byte_source& src, sh::settings& c) {
  c.window = src.i32(1, 70);
  c.recent = src.i32(0, 4);
  c.sinks = src.i32(0, 3);
  c.evict_count = src.i32(1, 6);
  constexpr float alphas[] = {1.0f, 0.5f, 2.0f, 0.01f};
  constexpr float decays[] = {0.95f, 0.5f, 1.0f, 0.01f};
  c.alpha = alphas[src.in(0, 3)];
  c.decay = decays[src.in(0, 3)];
  c.normalize = src.flag();
  c.compaction_mode = src.flag() ? sh::compaction::preserve_order : sh::compaction::fill_holes;
  c.seed = src.word();
  if (src.rarely()) {
    switch (src.in(0, 8)) {
      case 0: c.window = garbage_int(src); break;
      case 1: c.recent = garbage_int(src); break;
      case 2: c.sinks = garbage_int(src); break;
      case 3: c.evict_count = garbage_int(src); break;
      case 4: c.alpha = special_value(src); break;
      case 5: c.decay = special_value(src); break;
      case 6: c.compaction_mode = static_cast<sh::compaction>(garbage_int(src)); break;
      case 7: {
        // Only refused widths: the harness's oracles rank without pooling
        // (pooling itself is checked against tests/host's oracle).
        constexpr std::int32_t widths[] = {0, 2, -1, 256, 1000, INT32_MIN, INT32_MAX};
        c.pool_width = widths[src.in(0, std::size(widths) - 1)];
        break;
      }
      default: c.pool_mode = static_cast<sh::pooling>(garbage_int(src)); break;
    }
  }
}

// Whether settings pass validation for this policy.
template <class Policy>
bool settings_valid(const sh::settings& c) {
  using Obs = typename Policy::observation;
  using Hist = typename Policy::history;
  bool ok = c.recent >= 0 && c.sinks >= 0 && c.evict_count >= 1 &&
            (c.compaction_mode == sh::compaction::fill_holes || c.compaction_mode == sh::compaction::preserve_order) &&
            c.pool_width == 1 && (c.pool_mode == sh::pooling::max || c.pool_mode == sh::pooling::mean);
  if (std::is_same_v<Hist, sh::sliding_window>) ok = ok && c.window >= 1;
  if (std::is_same_v<Obs, sh::important_indicator> || std::is_same_v<Obs, sh::unimportant_indicator>)
    ok = ok && std::isfinite(c.alpha) && c.alpha > 0.0f;
  if (std::is_same_v<Hist, sh::exponential_decay>) ok = ok && c.decay > 0.0f && c.decay <= 1.0f;
  return ok;
}

// ---------------------------------------------------------------------------
// Layouts, computed here independently of kv_layout.hpp.
struct strides3 {
  std::int64_t outer = 0;  // sequence (contiguous) or page (paged)
  std::int64_t head = 0;
  std::int64_t token = 0;
};

// Largest element index + 1 (0 when an extent is 0; `row` may be 0, as
// for a probability view over sequences that are all empty); negative
// strides count as 0 (the library must refuse them before it reads
// anything). Saturates far above any allocation.
std::int64_t extent_of(const strides3& s, std::int64_t e0, std::int64_t e1, std::int64_t e2, std::int64_t row) {
  if (e0 <= 0 || e1 <= 0 || e2 <= 0 || row < 0) return 0;
  const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 0); };
  const double last = static_cast<double>(pos(s.outer)) * static_cast<double>(e0 - 1) +
                      static_cast<double>(pos(s.head)) * static_cast<double>(e1 - 1) +
                      static_cast<double>(pos(s.token)) * static_cast<double>(e2 - 1) + static_cast<double>(row);
  return last > 1e15 ? std::int64_t{1} << 50 : static_cast<std::int64_t>(last);
}

// Picks named or custom strides for (outer, head, token) levels of extents
// (e0, e1, e2). Clears `clean` when the strides may overlap.
strides3 pick_strides(byte_source& src, std::int32_t e0, std::int32_t e1, std::int32_t e2, std::int32_t row,
                      bool& clean) {
  const std::int64_t r = row;
  switch (src.in(0, 3)) {
    case 0:  // NHD: [outer][token][head][dim]
      return {std::int64_t{e2} * e1 * r, r, std::int64_t{e1} * r};
    case 1:  // HND: [outer][head][token][dim]
      return {std::int64_t{e1} * e2 * r, std::int64_t{e2} * r, r};
    case 2: {  // levels nested in any order, each padded
      const std::int64_t extents[3] = {e0, e1, e2};
      int order[3] = {0, 1, 2};
      const int perm = static_cast<int>(src.in(0, 5));
      for (int i = 0; i < perm; ++i) std::next_permutation(order, order + 3);
      std::int64_t strides[3] = {0, 0, 0};
      std::int64_t spanned = r;
      for (int level : order) {
        strides[level] = spanned + src.in(0, 3);
        spanned = strides[level] * std::max<std::int64_t>(extents[level], 1);
      }
      return {strides[0], strides[1], strides[2]};
    }
    default:  // anything small: may overlap, may be negative
      clean = false;
      return {src.in(-1, 40), src.in(-1, 40), src.in(-1, 40)};
  }
}

// ---------------------------------------------------------------------------
// Buffers owned by "the engine".
// 256-byte aligned, exactly `size` bytes long (so ASan sees any overrun).
struct aligned_buffer {
  std::byte* data = nullptr;
  std::size_t size = 0;
  aligned_buffer() = default;
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() { release(); }
  void allocate(std::size_t n) {
    release();
    size = n;
    data = static_cast<std::byte*>(::operator new(std::max<std::size_t>(n, 1), std::align_val_t{256}));
    std::memset(data, 0, n);
  }
  void release() {
    if (data != nullptr) ::operator delete(data, std::align_val_t{256});
    data = nullptr;
  }
};

template <class T>
std::vector<std::uint8_t> bytes_of(const T* p, std::size_t n) {
  std::vector<std::uint8_t> out(n * sizeof(T));
  if (n != 0) std::memcpy(out.data(), p, out.size());
  return out;
}

struct common_shape {
  std::int32_t batch = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 1;
};

struct contiguous_cache {
  common_shape shape;
  std::int32_t capacity = 1;
  strides3 kl, vl;
  std::vector<float> k, v;
  std::vector<std::int32_t> lengths;

  [[nodiscard]] std::int32_t length(std::int32_t b) const { return lengths[static_cast<std::size_t>(b)]; }
  [[nodiscard]] std::int32_t capacity_of(std::int32_t) const { return capacity; }
};

// A paged sequence's length, clamped: garbage last_page_len must not
// overflow the harness itself.
std::int32_t paged_length(std::int64_t pages, std::int32_t page_size, std::int32_t last) {
  if (pages <= 0) return 0;
  const std::int64_t n = (pages - 1) * page_size + last;
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(n, INT32_MIN, INT32_MAX));
}

// Pages that `length` tokens occupy.
std::int32_t pages_for(std::int64_t length, std::int32_t page_size) {
  return static_cast<std::int32_t>((length + page_size - 1) / page_size);
}

struct paged_cache {
  common_shape shape;
  std::int32_t page_size = 1;
  std::int32_t num_pages = 1;
  std::int32_t max_pages = 1;
  strides3 kl, vl;
  std::vector<float> k, v;
  std::vector<std::int32_t> indptr, indices, last_page_len;
  std::vector<std::int32_t> free_pages;  // pool pages in no sequence's list

  [[nodiscard]] std::int32_t pages(std::int32_t b) const {
    return indptr[static_cast<std::size_t>(b) + 1] - indptr[static_cast<std::size_t>(b)];
  }
  [[nodiscard]] std::int32_t length(std::int32_t b) const {
    return paged_length(pages(b), page_size, last_page_len[static_cast<std::size_t>(b)]);
  }
  [[nodiscard]] std::int32_t capacity_of(std::int32_t b) const { return pages(b) * page_size; }
};

// Row addressing from the view actually passed (which may differ from the
// harness's own model when a call was given a corrupted copy).
std::int64_t row_at(const sh::host_kv_view<float>& v, bool key, std::int32_t b, std::int32_t h, std::int32_t t) {
  const sh::kv_layout& l = key ? v.k_layout : v.v_layout;
  return std::int64_t{b} * l.sequence_stride + std::int64_t{h} * l.head_stride + std::int64_t{t} * l.token_stride;
}
std::int64_t row_at(const sh::host_paged_kv_view<float>& v, bool key, std::int32_t b, std::int32_t h,
                    std::int32_t t) {
  const sh::paged_layout& l = key ? v.k_layout : v.v_layout;
  const std::int32_t page = v.indices[static_cast<std::size_t>(v.indptr[static_cast<std::size_t>(b)] + t / v.page_size)];
  return std::int64_t{page} * l.page_stride + std::int64_t{h} * l.head_stride +
         std::int64_t{t % v.page_size} * l.token_stride;
}
std::int32_t length_in(const sh::host_kv_view<float>& v, std::int32_t b) { return v.lengths[static_cast<std::size_t>(b)]; }
std::int32_t length_in(const sh::host_paged_kv_view<float>& v, std::int32_t b) {
  const std::int64_t p = std::int64_t{v.indptr[static_cast<std::size_t>(b) + 1]} - v.indptr[static_cast<std::size_t>(b)];
  return paged_length(p, v.page_size, v.last_page_len[static_cast<std::size_t>(b)]);
}
std::int64_t capacity_in(const sh::host_kv_view<float>& v, std::int32_t) { return v.capacity; }
std::int64_t capacity_in(const sh::host_paged_kv_view<float>& v, std::int32_t b) {
  return (std::int64_t{v.indptr[static_cast<std::size_t>(b) + 1]} - v.indptr[static_cast<std::size_t>(b)]) * v.page_size;
}
std::int32_t pages_in(const sh::host_paged_kv_view<float>& v, std::int32_t b) {
  return v.indptr[static_cast<std::size_t>(b) + 1] - v.indptr[static_cast<std::size_t>(b)];
}

// ---------------------------------------------------------------------------
// The eviction order, written from the specification (docs/design.md): lower
// eviction score first (NaN above +inf, -0 = +0), then smaller position.
// A count of unimportant steps counts against the token: negated, so its
// highest counts go first.
float eviction_score_of(float score, float observed, const sh::settings& s, bool highest_first) {
  const float v = (s.normalize && observed > 0.0f) ? score / observed : score;
  return highest_first ? -v : v;
}
int compare_scores(float a, float b) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na == nb ? 0 : (na ? 1 : -1);
  return a < b ? -1 : (b < a ? 1 : 0);
}

struct ranked {
  float score;
  std::int32_t position;
  std::int32_t slot;
};
int compare_keys(const ranked& a, const ranked& b) {
  if (const int c = compare_scores(a.score, b.score); c != 0) return c;
  return a.position < b.position ? -1 : (b.position < a.position ? 1 : 0);
}

bool is_protected(std::int32_t position, std::int32_t next_position, const sh::settings& s) {
  return std::int64_t{position} >= std::int64_t{next_position} - s.recent || position < s.sinks;
}

// A shared slot's score (docs/design.md, "Granularity"): the eviction scores
// of its heads (or the per-layer results) reduced in order: mean_score sums
// then divides once; max_score takes the largest, NaN when any is NaN.
template <class Reduction>
float reduce_scores(const std::vector<float>& xs) {
  if constexpr (std::is_same_v<Reduction, sh::max_score>) {
    float acc = -inf_f;
    for (const float x : xs) {
      if (std::isnan(acc) || std::isnan(x)) return nan_f;
      if (x > acc) acc = x;
    }
    return acc;
  } else {
    static_assert(std::is_same_v<Reduction, sh::mean_score>);
    float acc = 0.0f;
    for (const float x : xs) acc += x;
    return acc / static_cast<float>(xs.size());
  }
}

// ---------------------------------------------------------------------------
// FlashInfer page-table maths, written from the contract of
// host::shrink_page_table (host/compress.hpp) independently of it.
struct table_spans {
  sh::host_span<std::int32_t> indptr, indices, last_page_len;
  std::int32_t page_size = 0;
  sh::host_span<const std::int32_t> new_lengths;
  sh::host_span<std::int32_t> released;
};

// Whether shrink_page_table must accept these arguments.
bool shrink_valid(const table_spans& t) {
  if (t.indptr.empty() || t.indptr.data() == nullptr) return false;
  const std::size_t batch = t.indptr.size() - 1;
  if (t.page_size <= 0) return false;
  if (t.new_lengths.size() != batch || (batch != 0 && t.new_lengths.data() == nullptr)) return false;
  if (t.last_page_len.size() != batch || (batch != 0 && t.last_page_len.data() == nullptr)) return false;
  if (t.indptr[0] != 0) return false;
  std::int64_t total = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t pages = std::int64_t{t.indptr[b + 1]} - t.indptr[b];
    if (pages < 0) return false;
    if (pages != 0 && (t.last_page_len[b] < 1 || t.last_page_len[b] > t.page_size)) return false;
    const std::int64_t held = pages == 0 ? 0 : (pages - 1) * t.page_size + t.last_page_len[b];
    if (t.new_lengths[b] < 0 || t.new_lengths[b] > held) return false;
    total += pages - pages_for(t.new_lengths[b], t.page_size);
  }
  if (t.released.size() < static_cast<std::size_t>(total)) return false;
  if (total != 0 && t.released.data() == nullptr) return false;
  if (static_cast<std::size_t>(t.indptr[batch]) > t.indices.size()) return false;
  if (t.indptr[batch] != 0 && t.indices.data() == nullptr) return false;
  // No two of the five arrays share a byte (of `released`, the entries written).
  struct range {
    std::uintptr_t at;
    std::size_t bytes;
  };
  const auto of = [](const void* p, std::size_t n) { return range{reinterpret_cast<std::uintptr_t>(p), 4 * n}; };
  const range r[] = {of(t.indptr.data(), t.indptr.size()), of(t.indices.data(), t.indices.size()),
                     of(t.last_page_len.data(), t.last_page_len.size()), of(t.new_lengths.data(), t.new_lengths.size()),
                     of(t.released.data(), static_cast<std::size_t>(total))};
  for (std::size_t i = 0; i < std::size(r); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (r[i].at != 0 && r[j].at != 0 && r[i].bytes != 0 && r[j].bytes != 0 && r[i].at < r[j].at + r[j].bytes &&
          r[j].at < r[i].at + r[i].bytes)
        return false;
  return true;
}

// The table after shrinking (valid arguments): each list keeps its leading
// pages_for(new length) pages, the rest are released in table order.
struct shrunk_table {
  std::vector<std::int32_t> indptr, indices, last_page_len, released;
};
shrunk_table shrink_model(const table_spans& t) {
  const std::size_t batch = t.indptr.size() - 1;
  shrunk_table out;
  out.indptr.push_back(0);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int32_t keep = pages_for(t.new_lengths[b], t.page_size);
    for (std::int32_t i = t.indptr[b]; i < t.indptr[b + 1]; ++i)
      (i - t.indptr[b] < keep ? out.indices : out.released).push_back(t.indices[static_cast<std::size_t>(i)]);
    out.indptr.push_back(static_cast<std::int32_t>(out.indices.size()));
    out.last_page_len.push_back(keep == 0 ? 0 : t.new_lengths[b] - (keep - 1) * t.page_size);
  }
  return out;
}

// Calls shrink_page_table on valid arguments and checks the table it leaves
// and the pages it releases against shrink_model.
std::vector<std::int32_t> shrink_and_check(const table_spans& t) {
  const shrunk_table want = shrink_model(t);
  // (A null span with a size is valid where nothing is read or written.)
  const auto copy = [](sh::host_span<std::int32_t> x) {
    return x.data() == nullptr ? std::vector<std::int32_t>{} : std::vector<std::int32_t>(x.begin(), x.end());
  };
  const std::vector<std::int32_t> indices_before = copy(t.indices), released_before = copy(t.released);
  std::size_t n = 0;
  try {
    n = sh::host::shrink_page_table(t.indptr, t.indices, t.last_page_len, t.page_size, t.new_lengths, t.released);
  } catch (const std::exception& e) {
    fail(__FILE__, __LINE__, std::string("shrink_page_table refused a valid call: ") + e.what());
  }
  FUZZ_CHECK(n == want.released.size(), "shrink_page_table: count of released pages");
  FUZZ_CHECK(std::equal(t.indptr.begin(), t.indptr.end(), want.indptr.begin(), want.indptr.end()),
             "shrink_page_table: indptr");
  FUZZ_CHECK(std::equal(t.last_page_len.begin(), t.last_page_len.end(), want.last_page_len.begin(),
                        want.last_page_len.end()),
             "shrink_page_table: last_page_len");
  FUZZ_CHECK(std::equal(want.indices.begin(), want.indices.end(), t.indices.begin()),
             "shrink_page_table: kept page ids");
  const std::vector<std::int32_t> indices_after = copy(t.indices), released_after = copy(t.released);
  FUZZ_CHECK(indices_after.size() == indices_before.size() && released_after.size() == released_before.size(),
             "shrink_and_check: spans");
  FUZZ_CHECK(std::equal(indices_after.begin() + static_cast<std::ptrdiff_t>(want.indices.size()), indices_after.end(),
                        indices_before.begin() + static_cast<std::ptrdiff_t>(want.indices.size())),
             "shrink_page_table wrote indices past the new indptr[batch]");
  FUZZ_CHECK(std::equal(want.released.begin(), want.released.end(), released_after.begin()),
             "shrink_page_table: released page ids");
  FUZZ_CHECK(std::equal(released_after.begin() + static_cast<std::ptrdiff_t>(n), released_after.end(),
                        released_before.begin() + static_cast<std::ptrdiff_t>(n)),
             "shrink_page_table wrote released entries past the count it returned");
  return want.released;
}
// The engine applies new lengths (they only shrink) to its FlashInfer
// table: shrink_page_table on a table the harness knows valid, checked,
// the released pages back to the pool. `who` names the caller in a failure.
void apply_page_lengths(std::vector<std::int32_t>& indptr, std::vector<std::int32_t>& indices,
                        std::vector<std::int32_t>& last_page_len, std::int32_t page_size,
                        const std::vector<std::int32_t>& lengths, std::vector<std::int32_t>& free_pages,
                        const char* who) {
  std::vector<std::int32_t> released(indices.size() + 1, -1);
  const table_spans t{{indptr.data(), indptr.size()},
                      {indices.data(), indices.size()},
                      {last_page_len.data(), last_page_len.size()},
                      page_size,
                      {lengths.data(), lengths.size()},
                      {released.data(), released.size()}};
  FUZZ_CHECK(shrink_valid(t), std::string(who) + ": the harness built an invalid page-table update");
  const std::vector<std::int32_t> gone = shrink_and_check(t);
  indices.resize(static_cast<std::size_t>(indptr.back()));
  free_pages.insert(free_pages.end(), gone.begin(), gone.end());
}

// What the harness knows about a call before making it.
enum class expect { ok, unknown, refuse };

// ---------------------------------------------------------------------------
// One fuzz case.
template <class Policy, bool Paged>
class fuzz_case {
  using cache_model = std::conditional_t<Paged, paged_cache, contiguous_cache>;
  using view_type =
      std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using state_type = sh::eviction_state<memory_space::host>;
  using Obs = typename Policy::observation;
  using Hist = typename Policy::history;
  static constexpr bool attention = Obs::needs_attention;
  // shared_heads: compress makes one choice per sequence for all the heads.
  static constexpr bool shared = sh::granularity_of<Policy> == sh::granularity_kind::shared_heads;
  static constexpr std::size_t max_elements = std::size_t{1} << 18;

 public:
  explicit fuzz_case(byte_source& src) : src_(src) {}

  void run() {
    if (!setup()) return;
    for (int op = 0; op < 24 && !src_.exhausted(); ++op) {
      if (!step()) return;
    }
  }

 private:
  byte_source& src_;
  generator gen_{0};
  Policy policy_{};
  cache_model cache_;
  bool clean_settings_ = true;  // the settings pass validation
  bool clean_layout_ = true;    // strides unique and buffers large enough
  bool clean_state_ = true;     // positions, scores, counts, ring hold only what the library wrote
  bool clean_cache_ = true;     // lengths / last_page_len as the harness set them
  bool clean_shape_ = true;     // the state's kv_heads and ring_words fit this cache and policy
  sh::state_shape state_shape_{};
  aligned_buffer state_buffer_;
  state_type state_{};

  // Continuous batching: the state row of each batch position (-1: a
  // padding slot, which holds no token), and whether calls pass the mapping
  // (state.for_batch) or rely on row b for position b.
  std::vector<std::int32_t> rows_;
  bool pass_rows_ = false;
  bool respect_capacity_ = true;  // the engine keeps lengths within the state's capacity

  // ---- setup ---------------------------------------------------------------
  bool setup() {
    gen_.state = src_.word();
    decode_settings();
    common_shape& s = cache_.shape;
    s.batch = src_.i32(1, 3);
    s.kv_heads = src_.i32(1, 3);
    s.head_dim = src_.i32(1, 6);
    if constexpr (Paged) {
      cache_.page_size = src_.i32(1, 5);
      cache_.max_pages = src_.i32(1, 6);
      cache_.num_pages = src_.i32(1, 12);
      cache_.kl = pick_strides(src_, cache_.num_pages, s.kv_heads, cache_.page_size, s.head_dim, clean_layout_);
      cache_.vl = pick_strides(src_, cache_.num_pages, s.kv_heads, cache_.page_size, s.head_dim, clean_layout_);
      const std::int64_t kx = extent_of(cache_.kl, cache_.num_pages, s.kv_heads, cache_.page_size, s.head_dim);
      const std::int64_t vx = extent_of(cache_.vl, cache_.num_pages, s.kv_heads, cache_.page_size, s.head_dim);
      if (kx > static_cast<std::int64_t>(max_elements) || vx > static_cast<std::int64_t>(max_elements)) return false;
      cache_.k.resize(static_cast<std::size_t>(kx));
      cache_.v.resize(static_cast<std::size_t>(vx));
      cache_.indptr.assign(static_cast<std::size_t>(s.batch) + 1, 0);
      cache_.last_page_len.assign(static_cast<std::size_t>(s.batch), 0);
      for (std::int32_t p = 0; p < cache_.num_pages; ++p) cache_.free_pages.push_back(p);
      for (std::size_t i = cache_.free_pages.size(); i > 1; --i)  // shuffled: page ids out of order
        std::swap(cache_.free_pages[i - 1], cache_.free_pages[gen_.next() % i]);
    } else {
      cache_.capacity = src_.i32(1, 24);
      cache_.kl = pick_strides(src_, s.batch, s.kv_heads, cache_.capacity, s.head_dim, clean_layout_);
      cache_.vl = pick_strides(src_, s.batch, s.kv_heads, cache_.capacity, s.head_dim, clean_layout_);
      const std::int64_t kx = extent_of(cache_.kl, s.batch, s.kv_heads, cache_.capacity, s.head_dim);
      const std::int64_t vx = extent_of(cache_.vl, s.batch, s.kv_heads, cache_.capacity, s.head_dim);
      if (kx > static_cast<std::int64_t>(max_elements) || vx > static_cast<std::int64_t>(max_elements)) return false;
      cache_.k.resize(static_cast<std::size_t>(kx));
      cache_.v.resize(static_cast<std::size_t>(vx));
      cache_.lengths.assign(static_cast<std::size_t>(s.batch), 0);
    }
    // Unwritten rows hold a pattern, so a stray read of one shows in the results.
    for (auto& x : cache_.k) x = gen_.uniform(-4.0f, 4.0f);
    for (auto& x : cache_.v) x = gen_.uniform(-4.0f, 4.0f);
    check_named_layouts();

    // The state: by default a row per batch position and a slot per cache
    // slot (state_shape_for); rarely made for another cache or policy.
    state_shape_ = sh::state_shape_for(policy_, make_view());
    FUZZ_CHECK(state_shape_.ring_words == policy_.ring_words(), "state_shape_for: ring_words");
    FUZZ_CHECK(state_shape_.rows == s.batch && state_shape_.kv_heads == s.kv_heads, "state_shape_for: rows, heads");
    if (src_.rarely()) {
      switch (src_.in(0, 3)) {
        case 0: state_shape_.rows += src_.flag() ? 1 : -1; break;  // fewer rows: some positions are padding
        case 1:
          state_shape_.kv_heads += src_.flag() ? 1 : -1;
          clean_shape_ = false;
          break;
        case 2: state_shape_.capacity -= 1; break;  // below the cache's: the engine must compress in time
        default:  // (a garbage window can put ring_words at either int32 end)
          state_shape_.ring_words += (src_.flag() && state_shape_.ring_words < INT32_MAX) ||
                                             state_shape_.ring_words == INT32_MIN
                                         ? 1
                                         : -1;
          clean_shape_ = false;
          break;
      }
    }
    // Continuous batching: spare rows, and a state sized by the budget
    // (state_capacity_for) rather than by the cache.
    state_shape_.rows += src_.i32(0, 2);
    if (src_.flag()) state_shape_.capacity = std::min(state_shape_.capacity, src_.i32(1, 30));
    respect_capacity_ = !src_.rarely();
    std::size_t bytes = 0;
    const sh::state_shape& ss = state_shape_;
    const double need = static_cast<double>(ss.rows) * ss.kv_heads * ss.capacity * (12.0 + 4.0 * ss.ring_words);
    const bool shape_valid = ss.rows > 0 && ss.kv_heads > 0 && ss.capacity > 0 && ss.ring_words >= 0 && need < 4.0e18;
    try {
      bytes = sh::state_bytes(state_shape_);
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(e.function() == "state_bytes", "state_bytes: error names another function");
      FUZZ_CHECK(!shape_valid, std::string("state_bytes refused a valid shape: ") + e.what());
      return false;
    }
    FUZZ_CHECK(shape_valid, "state_bytes accepted an invalid shape");
    if (bytes > (std::size_t{64} << 20)) return false;  // valid, but too big to fuzz quickly
    state_buffer_.allocate(bytes);
    state_ = sh::make_state(sh::host_span<std::byte>(state_buffer_.data, bytes), state_shape_);
    sh::host::reset_state(state_);
    // make_state refuses a short or misaligned buffer.
    expect_refusal([&] { (void)sh::make_state(sh::host_span<std::byte>(state_buffer_.data, bytes - 1), state_shape_); },
                   "make_state", "buffer");
    expect_refusal(
        [&] { (void)sh::make_state(sh::host_span<std::byte>(state_buffer_.data + 8, bytes - 8), state_shape_); },
        "make_state", "buffer");

    pick_mapping();
    append_tokens(/*initial=*/true);
    FUZZ_TRACE("setup: batch %d heads %d dim %d paged %d rows %d state capacity %d pass_rows %d mapping",
               s.batch, s.kv_heads, s.head_dim, int(Paged), state_shape_.rows, state_shape_.capacity, int(pass_rows_));
    for (std::int32_t r : rows_) FUZZ_TRACE(" %d", r);
    FUZZ_TRACE("\n");
    return true;
  }

  // Which state row each batch position uses: row b (no mapping passed),
  // the same passed explicitly, or a shuffle of the rows with padding slots
  // where rows run out (or where the input asks for one).
  void pick_mapping() {
    const std::int32_t batch = cache_.shape.batch;
    rows_.assign(static_cast<std::size_t>(batch), -1);
    const auto mode = src_.in(0, 3);
    if (mode <= 1 && state_shape_.rows >= batch) {
      for (std::int32_t b = 0; b < batch; ++b) rows_[static_cast<std::size_t>(b)] = b;
      pass_rows_ = mode == 1;
      return;
    }
    std::vector<std::int32_t> pool;
    for (std::int32_t r = 0; r < state_shape_.rows; ++r) pool.push_back(r);
    for (std::size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[gen_.next() % i]);
    for (std::int32_t b = 0; b < batch; ++b) {
      if (pool.empty() || (mode == 3 && src_.flag())) continue;  // a padding slot
      rows_[static_cast<std::size_t>(b)] = pool.back();
      pool.pop_back();
    }
    pass_rows_ = true;
  }

  [[nodiscard]] bool mapping_is_identity() const {
    for (std::size_t b = 0; b < rows_.size(); ++b)
      if (rows_[b] != static_cast<std::int32_t>(b)) return false;
    return true;
  }

  // Rows no batch position uses.
  [[nodiscard]] std::vector<std::int32_t> free_rows() const {
    std::vector<std::int32_t> out;
    for (std::int32_t r = 0; r < state_shape_.rows; ++r)
      if (std::find(rows_.begin(), rows_.end(), r) == rows_.end()) out.push_back(r);
    return out;
  }

  void decode_settings() {
    decode_settings_into(src_, policy_.config);
    clean_settings_ = settings_valid<Policy>(policy_.config);
  }

  // The library's named layouts must equal the ones written here.
  void check_named_layouts() const {
    const common_shape& s = cache_.shape;
    std::int32_t e2 = 0;
    if constexpr (Paged)
      e2 = cache_.page_size;
    else
      e2 = cache_.capacity;
    const auto nhd = sh::kv_layout::nhd(e2, s.kv_heads, s.head_dim);
    const auto hnd = sh::kv_layout::hnd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(nhd.head_stride == s.head_dim && nhd.token_stride == std::int64_t{s.kv_heads} * s.head_dim &&
                   nhd.sequence_stride == std::int64_t{e2} * s.kv_heads * s.head_dim,
               "kv_layout::nhd");
    FUZZ_CHECK(hnd.token_stride == s.head_dim && hnd.head_stride == std::int64_t{e2} * s.head_dim &&
                   hnd.sequence_stride == std::int64_t{e2} * s.kv_heads * s.head_dim,
               "kv_layout::hnd");
    const auto pn = sh::paged_layout::nhd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(pn.page_stride == nhd.sequence_stride && pn.head_stride == nhd.head_stride &&
                   pn.token_stride == nhd.token_stride,
               "paged_layout::nhd");
    const auto ph = sh::paged_layout::hnd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(ph.page_stride == hnd.sequence_stride && ph.head_stride == hnd.head_stride &&
                   ph.token_stride == hnd.token_stride,
               "paged_layout::hnd");
  }

  // ---- views ----------------------------------------------------------------
  view_type make_view() {
    const common_shape& s = cache_.shape;
    view_type v{};
    if constexpr (Paged) {
      v.k_pages = sh::host_span<float>(cache_.k.data(), cache_.k.size());
      v.v_pages = sh::host_span<float>(cache_.v.data(), cache_.v.size());
      v.k_layout = {cache_.kl.outer, cache_.kl.head, cache_.kl.token};
      v.v_layout = {cache_.vl.outer, cache_.vl.head, cache_.vl.token};
      v.indptr = sh::host_span<const std::int32_t>(cache_.indptr.data(), cache_.indptr.size());
      v.indices = sh::host_span<const std::int32_t>(cache_.indices.data(), cache_.indices.size());
      v.last_page_len = sh::host_span<const std::int32_t>(cache_.last_page_len.data(), cache_.last_page_len.size());
      v.page_size = cache_.page_size;
      v.num_pages = cache_.num_pages;
      v.max_pages_per_sequence = cache_.max_pages;
    } else {
      v.k = sh::host_span<float>(cache_.k.data(), cache_.k.size());
      v.v = sh::host_span<float>(cache_.v.data(), cache_.v.size());
      v.k_layout = {cache_.kl.outer, cache_.kl.head, cache_.kl.token};
      v.v_layout = {cache_.vl.outer, cache_.vl.head, cache_.vl.token};
      v.lengths = sh::host_span<const std::int32_t>(cache_.lengths.data(), cache_.lengths.size());
      v.capacity = cache_.capacity;
    }
    v.batch = s.batch;
    v.kv_heads = s.kv_heads;
    v.head_dim = s.head_dim;
    return v;
  }

  // Scratch that the calls' spans point at, kept alive for the call and
  // part of every snapshot.
  std::vector<std::int32_t> scratch_i_;    // a damaged copy of indptr or indices
  std::vector<std::int32_t> scratch_len_;  // a copy of the lengths the view reads instead of the model's
  std::vector<std::int32_t> out_store_;    // compress_output spans point in here
  std::vector<std::int32_t> qo_store_;     // ragged qo_indptr of observe (and a copy for the lse)
  std::string damage_note_;  // which damage the current call's view carries
  bool shared_page_ = false;  // the damage lists one page twice

  // Rarely damages one field of the view for one call: expect::ok when it
  // did nothing, refuse when the damage is always invalid, unknown when it
  // may happen to describe another valid cache.
  expect corrupt(view_type& v) {
    damage_note_.clear();
    shared_page_ = false;
    if (!src_.rarely()) return expect::ok;
    const common_shape& s = cache_.shape;
    const expect refuse = expect::refuse, unknown = expect::unknown;
    if constexpr (Paged) {
      const auto which = src_.in(0, 15);
      damage_note_ = "paged view damage " + std::to_string(which);
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : (src_.flag() ? -1 : INT32_MAX); return refuse;
        case 1: v.kv_heads = 0; return refuse;
        case 2: v.head_dim = 0; return refuse;
        case 3:
          if (src_.flag()) return v.page_size = 0, refuse;
          v.page_size = cache_.page_size + 1;
          return unknown;
        case 4:
          if (src_.flag()) return v.num_pages = 0, refuse;
          v.num_pages = cache_.num_pages - 1;
          return unknown;
        case 5:  // (INT32_MAX pages of one token is a valid bound: the state needs no slot per bound)
          if (src_.flag()) return v.max_pages_per_sequence = 0, refuse;
          v.max_pages_per_sequence = INT32_MAX;
          return v.page_size > 1 ? refuse : unknown;
        case 6: v.indptr = {v.indptr.data(), v.indptr.size() - 1}; return refuse;
        case 7: v.k_pages = {nullptr, v.k_pages.size()}; return refuse;
        case 8: v.v_pages = {v.v_pages.data(), v.v_pages.size() - 1}; return refuse;
        case 9:
          if (src_.flag()) return v.k_layout.token_stride = -1, refuse;
          v.k_layout.token_stride = 0;
          return v.page_size > 1 ? refuse : unknown;
        case 10: v.v_pages = v.k_pages; return refuse;
        case 11: {  // a page id outside the pool, or one listed twice
          scratch_i_ = cache_.indices;
          if (scratch_i_.empty()) return expect::ok;
          const auto at = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_i_.size()) - 1));
          v.indices = {scratch_i_.data(), scratch_i_.size()};
          if (src_.flag()) {
            scratch_i_[at] = garbage_int(src_);
            return scratch_i_[at] < 0 || scratch_i_[at] >= cache_.num_pages ? refuse : unknown;
          }
          // Shared pages are fine to read (prefix sharing); compress checks
          // the pages it rewrites itself (rewrites_shared_page).
          scratch_i_[at] = scratch_i_[(at + 1) % scratch_i_.size()];
          shared_page_ = scratch_i_.size() > 1;
          return shared_page_ ? unknown : expect::ok;
        }
        case 12: {  // indptr not starting at 0, decreasing, or past indices
          scratch_i_ = cache_.indptr;
          const auto at = static_cast<std::size_t>(src_.in(0, s.batch));
          v.indptr = {scratch_i_.data(), scratch_i_.size()};
          if (src_.flag()) return scratch_i_[at] = garbage_int(src_), unknown;
          scratch_i_[at] += 1;
          return at == 0 || at == static_cast<std::size_t>(s.batch) ? refuse : unknown;
        }
        case 13:  // persistent: the model's own array
          cache_.last_page_len[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
          clean_cache_ = false;
          return expect::ok;
        case 14:
          v.indices = {nullptr, v.indices.size()};
          return v.indices.empty() ? unknown : refuse;
        default: v.last_page_len = {v.last_page_len.data(), v.last_page_len.size() - 1}; return refuse;
      }
    } else {
      const auto which = src_.in(0, 14);
      damage_note_ = "view damage " + std::to_string(which);
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : s.batch + 1; return refuse;
        case 1:
          if (src_.flag()) return v.kv_heads = 0, refuse;
          v.kv_heads = s.kv_heads + 1;
          return unknown;  // a damaged state shape may match it
        case 2:
          if (src_.flag()) return v.head_dim = 0, refuse;
          v.head_dim = s.head_dim + 1;
          return unknown;
        case 3:
          if (src_.flag()) return v.capacity = 0, refuse;
          v.capacity = cache_.capacity - 1;
          return unknown;
        case 4: v.lengths = {v.lengths.data(), v.lengths.size() - 1}; return refuse;
        case 5: v.lengths = {nullptr, v.lengths.size()}; return refuse;
        case 6: v.k = {nullptr, v.k.size()}; return refuse;
        case 7: v.v = {v.v.data(), v.v.size() - 1}; return refuse;
        case 8:
          if (src_.flag()) {
            v.k_layout.head_stride = 0;
            return s.kv_heads > 1 ? refuse : unknown;
          }
          v.k_layout.head_stride = -v.k_layout.head_stride;
          return v.k_layout.head_stride < 0 ? refuse : unknown;
        case 9: v.v = v.k; v.v_layout = v.k_layout; return refuse;
        case 10:
          v.k_layout.sequence_stride = std::int64_t{1} << src_.in(31, 62);
          return s.batch > 1 ? refuse : unknown;
        case 11:  // persistent: the model's own array
          cache_.lengths[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
          clean_cache_ = false;
          return expect::ok;
        case 12: v.v_layout.token_stride = 1; return unknown;
        case 13: v.capacity = INT32_MAX; return refuse;
        default: v.k = {v.k.data(), 0}; return refuse;
      }
    }
  }

  // ---- the state's rows for one call -------------------------------------------
  struct call_rows {
    std::vector<std::int32_t> storage;       // what state_rows points at
    sh::host_span<const std::int32_t> span;  // state_rows as passed ({} : row b)
    expect damage = expect::ok;              // refuse: invalid whatever else; unknown: not the model's mapping
    std::vector<std::int32_t> used;          // the row the library uses for each position (when in_range)
    bool in_range = true;                    // one entry per position, each -1 or a row, rows distinct
    bool null_with_size = false;             // state_rows = {nullptr, batch}: refused
  };
  call_rows rc_;

  [[nodiscard]] state_type call_state() const { return state_.for_batch(rc_.span); }

  // The mapping for one call: the model's, or rarely a damaged one.
  void pick_rows() {
    const std::int32_t batch = cache_.shape.batch;
    const std::int32_t rows = state_shape_.rows;
    call_rows& rc = rc_;
    rc.storage = rows_;
    rc.damage = expect::ok;
    rc.null_with_size = false;
    bool pass = pass_rows_;
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
      switch (src_.in(0, 5)) {
        case 0: {  // a row outside [-1, rows), or garbage that may land inside
          const std::int32_t r = src_.flag() ? rows + src_.i32(0, 2) : (src_.flag() ? -2 : garbage_int(src_));
          rc.storage[at] = r;
          pass = true;
          rc.damage = r < -1 || r >= rows ? expect::refuse : expect::unknown;
          break;
        }
        case 1: {  // two positions on one row
          const auto other = (at + 1) % static_cast<std::size_t>(batch);
          if (batch > 1 && rc.storage[at] >= 0) {
            rc.storage[other] = rc.storage[at];
            pass = true;
            rc.damage = expect::refuse;
          }
          break;
        }
        case 2:  // a padding slot: fine for a sequence with no token, refused for one with tokens
          rc.storage[at] = -1;
          pass = true;
          break;
        case 3:  // one entry too few or too many
          if (src_.flag())
            rc.storage.pop_back();
          else
            rc.storage.push_back(-1);
          pass = true;
          rc.damage = expect::refuse;
          break;
        case 4:
          // state_rows = {nullptr, batch}: a caller's bug, not "no
          // mapping" (as for lse): refused.
          rc.null_with_size = true;
          rc.damage = expect::refuse;
          break;
        default:  // no mapping passed where the model has one: row b is used
          if (pass) rc.damage = expect::unknown;
          pass = false;
          break;
      }
    }
    rc.span = pass ? sh::host_span<const std::int32_t>(rc.storage.data(), rc.storage.size())
                   : sh::host_span<const std::int32_t>{};
    if (rc.null_with_size) rc.span = {nullptr, static_cast<std::size_t>(batch)};
    rc.used.assign(static_cast<std::size_t>(batch), -1);
    if (rc.span.data() == nullptr) {
      for (std::int32_t b = 0; b < batch; ++b) rc.used[static_cast<std::size_t>(b)] = b;
      rc.in_range = rows >= batch;
    } else {
      rc.in_range = rc.span.size() == static_cast<std::size_t>(batch);
      std::vector<char> seen(static_cast<std::size_t>(rows), 0);
      for (std::size_t b = 0; b < std::min(rc.span.size(), static_cast<std::size_t>(batch)); ++b) {
        const std::int32_t r = rc.span[b];
        if (r < -1 || r >= rows) {
          rc.in_range = false;
          continue;
        }
        if (r >= 0) {
          if (seen[static_cast<std::size_t>(r)] != 0) rc.in_range = false;
          seen[static_cast<std::size_t>(r)] = 1;
        }
        rc.used[b] = r;
      }
    }
    if (rc.damage == expect::unknown && rc.in_range && rc.used == rows_) rc.damage = expect::ok;  // same mapping
    if (rc.damage != expect::ok) FUZZ_TRACE("  rows damaged (%d), in range %d\n", int(rc.damage), int(rc.in_range));
  }

  // ---- the engine's side ---------------------------------------------------
  void write_row(std::vector<float>& buf, std::int64_t at) {
    const bool odd = src_.rarely();
    for (std::int32_t d = 0; d < cache_.shape.head_dim; ++d) {
      float x = gen_.uniform(-4.0f, 4.0f);
      if (odd && d == 0) x = special_value(src_);
      buf[static_cast<std::size_t>(at + d)] = x;
    }
  }

  void append_tokens(bool initial) {
    if (!clean_cache_ || !clean_layout_) return;  // the model's addressing may be meaningless
    const common_shape& s = cache_.shape;
    for (std::int32_t b = 0; b < s.batch; ++b) {
      std::int32_t n = initial ? src_.i32(0, 26) : src_.i32(0, 3);
      if (rows_[static_cast<std::size_t>(b)] < 0) continue;  // a padding slot holds no token
      while (n-- > 0) {
        const std::int32_t len = cache_.length(b);
        if (respect_capacity_ && len >= state_shape_.capacity) break;
        if constexpr (Paged) {
          if (len == cache_.capacity_of(b)) {  // needs a new page
            if (cache_.free_pages.empty() || cache_.pages(b) == cache_.max_pages) break;
            const std::int32_t page = cache_.free_pages.back();
            cache_.free_pages.pop_back();
            const auto end = static_cast<std::size_t>(cache_.indptr[static_cast<std::size_t>(b) + 1]);
            cache_.indices.insert(cache_.indices.begin() + static_cast<std::ptrdiff_t>(end), page);
            for (std::size_t i = static_cast<std::size_t>(b) + 1; i < cache_.indptr.size(); ++i) ++cache_.indptr[i];
            cache_.last_page_len[static_cast<std::size_t>(b)] = 0;
          }
          ++cache_.last_page_len[static_cast<std::size_t>(b)];
        } else {
          if (len == cache_.capacity) break;
          ++cache_.lengths[static_cast<std::size_t>(b)];
        }
        const view_type v = make_view();
        for (std::int32_t h = 0; h < s.kv_heads; ++h) {
          write_row(cache_.k, row_at(v, true, b, h, len));
          write_row(cache_.v, row_at(v, false, b, h, len));
        }
      }
    }
    FUZZ_TRACE("  lengths:");
    for (std::int32_t b = 0; b < s.batch; ++b) FUZZ_TRACE(" %d", cache_.length(b));
    FUZZ_TRACE("\n");
  }

  // Sets the model's lengths: contiguous, a copy; paged, through
  // shrink_page_table (lengths may only shrink), its pages back to the pool.
  void apply_lengths(const std::vector<std::int32_t>& lengths) {
    if constexpr (Paged) {
      apply_page_lengths(cache_.indptr, cache_.indices, cache_.last_page_len, cache_.page_size, lengths,
                         cache_.free_pages, "apply_lengths");
    } else {
      cache_.lengths = lengths;
    }
  }

  [[nodiscard]] std::vector<std::int32_t> model_lengths() const {
    std::vector<std::int32_t> out;
    for (std::int32_t b = 0; b < cache_.shape.batch; ++b) out.push_back(cache_.length(b));
    return out;
  }

  // The scheduler moves two requests to each other's batch positions: their
  // K/V rows (contiguous) or page lists (paged) and their state rows move
  // with them; the state itself stays where it is.
  void swap_positions() {
    const common_shape& s = cache_.shape;
    const std::int32_t b1 = src_.i32(0, s.batch - 1), b2 = src_.i32(0, s.batch - 1);
    if (!clean_cache_ || !clean_layout_ || b1 == b2) return;
    FUZZ_TRACE("  swap positions %d and %d\n", b1, b2);
    if constexpr (Paged) {
      std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(s.batch));
      for (std::int32_t b = 0; b < s.batch; ++b)
        lists[static_cast<std::size_t>(b)].assign(cache_.indices.begin() + cache_.indptr[static_cast<std::size_t>(b)],
                                                  cache_.indices.begin() + cache_.indptr[static_cast<std::size_t>(b) + 1]);
      std::swap(lists[static_cast<std::size_t>(b1)], lists[static_cast<std::size_t>(b2)]);
      cache_.indices.clear();
      for (std::int32_t b = 0; b < s.batch; ++b) {
        cache_.indptr[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(cache_.indices.size());
        cache_.indices.insert(cache_.indices.end(), lists[static_cast<std::size_t>(b)].begin(),
                              lists[static_cast<std::size_t>(b)].end());
      }
      cache_.indptr.back() = static_cast<std::int32_t>(cache_.indices.size());
      std::swap(cache_.last_page_len[static_cast<std::size_t>(b1)], cache_.last_page_len[static_cast<std::size_t>(b2)]);
    } else {
      const view_type v = make_view();
      for (std::int32_t h = 0; h < s.kv_heads; ++h)
        for (std::int32_t t = 0; t < cache_.capacity; ++t)
          for (const bool key : {true, false}) {
            std::vector<float>& buf = key ? cache_.k : cache_.v;
            std::swap_ranges(buf.begin() + row_at(v, key, b1, h, t), buf.begin() + row_at(v, key, b1, h, t) + s.head_dim,
                             buf.begin() + row_at(v, key, b2, h, t));
          }
      std::swap(cache_.lengths[static_cast<std::size_t>(b1)], cache_.lengths[static_cast<std::size_t>(b2)]);
    }
    std::swap(rows_[static_cast<std::size_t>(b1)], rows_[static_cast<std::size_t>(b2)]);
    pass_rows_ = pass_rows_ || !mapping_is_identity();
  }

  // A request finishes: its tokens leave the cache (paged: its pages go
  // back to the pool through shrink_page_table), and its batch position
  // becomes a padding slot or takes a new request on its row or a free
  // one, which the engine resets first (rarely it forgets: every call is
  // then refused until the row's length catches up with what it tracks).
  bool retire() {
    const common_shape& s = cache_.shape;
    const std::int32_t b = src_.i32(0, s.batch - 1);
    const auto choice = src_.in(0, 2);
    const bool forget = src_.rarely();
    const std::int32_t start = src_.flag() ? 0 : src_.i32(0, 1000);
    if (!clean_cache_ || !clean_layout_) return true;
    std::vector<std::int32_t> lengths = model_lengths();
    lengths[static_cast<std::size_t>(b)] = 0;
    apply_lengths(lengths);
    std::int32_t& row = rows_[static_cast<std::size_t>(b)];
    const std::vector<std::int32_t> spare = free_rows();
    if (choice == 0) {
      row = -1;
    } else if (choice == 2 || row < 0) {
      if (!spare.empty()) row = spare[gen_.next() % spare.size()];
    }
    pass_rows_ = pass_rows_ || !mapping_is_identity();
    FUZZ_TRACE("  retire position %d: row %d%s\n", b, row, forget ? " (not reset)" : "");
    if (row < 0 || forget) return true;
    return reset_row(row, start, expect::ok);
  }

  // The engine drops a sequence's last tokens without telling the library
  // (a rejected speculation): its row tracks more tokens than it holds, and
  // every call is refused until the row is reset or the length catches up.
  void rollback() {
    const common_shape& s = cache_.shape;
    const std::int32_t b = src_.i32(0, s.batch - 1);
    const std::int32_t k = src_.i32(1, 3);
    if (!clean_cache_ || !clean_layout_) return;
    std::vector<std::int32_t> lengths = model_lengths();
    std::int32_t& len = lengths[static_cast<std::size_t>(b)];
    len = std::max(0, len - k);
    FUZZ_TRACE("  rollback position %d to %d\n", b, len);
    apply_lengths(lengths);
  }

  // ---- snapshots -----------------------------------------------------------
  struct snapshot {
    std::vector<std::uint8_t> k, v, lengths, indptr, indices, state, scratch, out;
    bool operator==(const snapshot&) const = default;
  };

  [[nodiscard]] snapshot take() const {
    snapshot s;
    s.k = bytes_of(cache_.k.data(), cache_.k.size());
    s.v = bytes_of(cache_.v.data(), cache_.v.size());
    if constexpr (Paged) {
      s.lengths = bytes_of(cache_.last_page_len.data(), cache_.last_page_len.size());
      s.indptr = bytes_of(cache_.indptr.data(), cache_.indptr.size());
      s.indices = bytes_of(cache_.indices.data(), cache_.indices.size());
    } else {
      s.lengths = bytes_of(cache_.lengths.data(), cache_.lengths.size());
    }
    s.state = bytes_of(state_buffer_.data, state_buffer_.size);
    for (const auto* scratch : {&scratch_i_, &scratch_len_, &qo_store_, &rc_.storage, &rows_}) {
      const auto b = bytes_of(scratch->data(), scratch->size());
      s.scratch.insert(s.scratch.end(), b.begin(), b.end());
    }
    s.out = bytes_of(out_store_.data(), out_store_.size());
    return s;
  }

  // Runs `call`. On refusal: the error names `fn` and an argument, and
  // nothing the caller owns changed (the workspace is scratch). Returns
  // whether the call succeeded.
  template <class Call>
  bool guarded(const char* fn, expect expected, Call&& call) {
    const snapshot before = take();
    try {
      call();
    } catch (const sh::invalid_argument& e) {
      FUZZ_TRACE("  %s refused: %s\n", fn, e.what());
      FUZZ_CHECK(e.function() == fn, std::string("error names function '") + e.function() + "', not " + fn);
      FUZZ_CHECK(!e.argument().empty(), "error names no argument");
      FUZZ_CHECK(take() == before, std::string(fn) + " wrote before refusing: " + e.what());
      FUZZ_CHECK(expected != expect::ok, std::string(fn) + " refused a valid call: " + e.what());
      damage_note_.clear();
      return false;
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string(fn) + " threw something else than scissorhands::invalid_argument: " + e.what());
    }
    FUZZ_TRACE("  %s accepted (expected %d)\n", fn, int(expected));
    FUZZ_CHECK(expected != expect::refuse, std::string(fn) + " accepted an invalid argument (" + damage_note_ + ")");
    return true;
  }

  template <class Call>
  void expect_refusal(Call&& call, const char* fn, const char* argument) {
    try {
      call();
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(e.function() == fn && e.argument() == argument, std::string("unexpected refusal: ") + e.what());
      return;
    }
    fail(__FILE__, __LINE__, std::string(fn) + " accepted a bad '" + argument + "'");
  }

  // ---- state accessors (layout from docs/design.md) -------------------------
  [[nodiscard]] std::size_t slot(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return (static_cast<std::size_t>(r) * static_cast<std::size_t>(state_shape_.kv_heads) + static_cast<std::size_t>(h)) *
               static_cast<std::size_t>(state_shape_.capacity) +
           static_cast<std::size_t>(t);
  }
  [[nodiscard]] std::size_t byte_offset(const void* p) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - state_buffer_.data);
  }
  template <class T>
  [[nodiscard]] T old_value(const snapshot& before, const T* p) const {
    T x;
    std::memcpy(&x, before.state.data() + byte_offset(p), sizeof(T));
    return x;
  }
  template <class T>
  void set_value(std::vector<std::uint8_t>& state_bytes, const T* p, const T& x) const {
    std::memcpy(state_bytes.data() + byte_offset(p), &x, sizeof(T));
  }
  void copy_value(std::vector<std::uint8_t>& state_bytes, const void* p, std::size_t n) const {
    std::memcpy(state_bytes.data() + byte_offset(p), p, n);
  }

  // The conditions on the state and its rows that every cache entry point
  // checks from the data (rows in range and distinct, padding slots empty,
  // lengths within the cache's and the state's capacity, tracked, positions
  // left, steps, the row marks), evaluated on what the call passes, for a
  // view that is the model's. True: the call must be refused.
  [[nodiscard]] bool state_refuses(const view_type& v) const {
    if (!rc_.in_range) return true;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      const std::int32_t len = length_in(v, b);
      if (len < 0 || len > capacity_in(v, b)) return true;
      if (r < 0) {
        if (len != 0) return true;
        continue;
      }
      if (len > state_shape_.capacity) return true;
      const std::int32_t tracked = state_.tracked[r];
      if (tracked < 0 || tracked > len) return true;
      const std::int32_t next = state_.next_position[r];
      if (next < 0 || std::int64_t{next} + (len - tracked) > INT32_MAX) return true;
      if (state_.step[r] < 0 || state_.step[r] > (std::int64_t{1} << 62)) return true;
      if (rc_.span.data() != nullptr && state_.status[r] != 0) return true;
    }
    return false;
  }

  // The expectation of a cache entry point: `always_refuse` for arguments
  // invalid whatever the view (a bad budget, workspace or output),
  // `args_refuse` for ones invalid for the model's view, `args_ok` when the
  // call's own arguments are valid for it.
  [[nodiscard]] expect expectation(expect damage, const view_type& v, bool args_ok, bool always_refuse,
                                   bool args_refuse) const {
    if (always_refuse || !clean_settings_ || damage == expect::refuse || rc_.damage == expect::refuse)
      return expect::refuse;
    if (damage == expect::unknown) return expect::unknown;
    if (!clean_shape_ || args_refuse || state_refuses(v)) return expect::refuse;
    if (!clean_layout_ || !clean_cache_) return expect::unknown;
    return args_ok ? expect::ok : expect::unknown;
  }

  // ---- operations ----------------------------------------------------------
  bool step() {
    const auto op = src_.in(0, 13);
    FUZZ_TRACE("op %d at byte %zu\n", int(op), src_.position());
    switch (op) {
      case 0:
      case 1: append_tokens(false); return true;
      case 2:
      case 3: return observe_probabilities();
      case 4: return observe_queries();
      case 5: return admit();
      case 6:
      case 7: return compress();
      case 8: return reset();
      case 9: poke(); return true;
      case 10: swap_positions(); return true;
      case 11: return retire();
      case 12: shrink_alone(); return true;
      default: rollback(); return true;
    }
  }

  // host::reset_sequence on `row`; checks that only that row's counters
  // changed. Returns false when the call was refused.
  bool reset_row(std::int32_t row, std::int32_t start, expect expected) {
    const snapshot before = take();
    if (!guarded("host::reset_sequence", expected, [&] { sh::host::reset_sequence(state_, row, start); })) return true;
    FUZZ_CHECK(state_.tracked[row] == 0 && state_.next_position[row] == start && state_.step[row] == 0 &&
                   state_.status[row] == 0,
               "reset_sequence: row not reset");
    std::vector<std::uint8_t> est = before.state;
    copy_value(est, &state_.tracked[row], 4);
    copy_value(est, &state_.next_position[row], 4);
    copy_value(est, &state_.step[row], 8);
    copy_value(est, &state_.status[row], 4);
    FUZZ_CHECK(take().state == est, "reset_sequence wrote other state bytes than the row's counters");
    return true;
  }

  bool reset() {
    const std::int32_t row = src_.flag() ? src_.i32(0, state_shape_.rows - 1) : garbage_int(src_);
    const std::int32_t start = src_.flag() ? src_.i32(0, 1000) : garbage_int(src_);
    const bool valid = row >= 0 && row < state_shape_.rows && start >= 0;
    FUZZ_TRACE("  reset row %d start %d\n", row, start);
    reset_row(row, start, valid ? expect::ok : expect::refuse);
    if (src_.rarely()) {
      sh::host::reset_state(state_);
      clean_state_ = true;
      FUZZ_CHECK(std::all_of(state_buffer_.data, state_buffer_.data + state_buffer_.size,
                             [](std::byte x) { return x == std::byte{0}; }),
                 "reset_state left a non-zero byte");
    }
    return true;
  }

  // Garbage in the state: what a caller that scribbles over it produces.
  void poke() {
    clean_state_ = false;
    const std::int32_t r = src_.i32(0, state_shape_.rows - 1);
    const std::int32_t h = src_.i32(0, state_shape_.kv_heads - 1);
    const std::int32_t t = src_.i32(0, state_shape_.capacity - 1);
    const std::size_t i = slot(r, h, t);
    const auto what = src_.in(0, 7);
    FUZZ_TRACE("  poke %d row %d head %d slot %d\n", int(what), r, h, t);
    switch (what) {
      case 0: state_.tracked[r] = garbage_int(src_); break;
      case 1: state_.next_position[r] = garbage_int(src_); break;
      case 2: state_.step[r] = src_.flag() ? -std::int64_t{src_.word()} - 1 : INT64_MAX - src_.in(0, 3); break;
      case 3: state_.positions[i] = src_.flag() ? garbage_int(src_) : state_.positions[slot(r, h, src_.i32(0, t))]; break;
      case 4: state_.scores[i] = special_value(src_); break;
      case 5: state_.observed[i] = special_value(src_); break;
      case 6: state_.status[r] = src_.flag() ? 1u : src_.word(); break;
      default:
        if (state_shape_.ring_words > 0)
          state_.ring_of(static_cast<std::int64_t>(i))[0] = src_.word();
        break;
    }
  }

  // What observe and admit must do beyond scoring: admit, count, step, and
  // write nothing but the mapped rows' counters and their slots below the
  // length. counts[b]: the queries of sequence b (0 for admit and static
  // policies).
  void check_after_observe(const view_type& v, const snapshot& before, const std::vector<std::int32_t>& counts) {
    const snapshot after = take();
    FUZZ_CHECK(after.k == before.k && after.v == before.v, "observe wrote to the cache");
    FUZZ_CHECK(after.lengths == before.lengths && after.indptr == before.indptr && after.indices == before.indices &&
                   after.scratch == before.scratch && after.out == before.out,
               "observe changed lengths, the page table or an argument it only reads");
    std::vector<std::uint8_t> est = before.state;
    const auto words = static_cast<std::size_t>(std::max(state_shape_.ring_words, 0));
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      if (r < 0) continue;
      const std::int32_t len = length_in(v, b);
      const std::int32_t tracked = old_value(before, &state_.tracked[r]);
      const std::int32_t next = old_value(before, &state_.next_position[r]);
      const std::int32_t q = attention && len > 0 ? counts[static_cast<std::size_t>(b)] : 0;
      FUZZ_CHECK(state_.tracked[r] == len, "observe: tracked != length");
      FUZZ_CHECK(state_.next_position[r] == next + (len - tracked), "observe: next_position");
      FUZZ_CHECK(state_.step[r] == old_value(before, &state_.step[r]) + q, "observe: step");
      copy_value(est, &state_.tracked[r], 4);
      copy_value(est, &state_.next_position[r], 4);
      copy_value(est, &state_.step[r], 8);
      for (std::int32_t h = 0; h < v.kv_heads; ++h)
        for (std::int32_t t = 0; t < len; ++t) {
          const std::size_t i = slot(r, h, t);
          const bool fresh = t >= tracked;
          if (!fresh) {
            FUZZ_CHECK(state_.positions[i] == old_value(before, &state_.positions[i]), "observe moved an old position");
          } else {
            FUZZ_CHECK(state_.positions[i] == next + (t - tracked), "observe: new token's position");
            copy_value(est, &state_.positions[i], 4);
          }
          // Queries j with t < len - q + j + 1 saw slot t.
          const std::int32_t seen = std::clamp(len - t, 0, q);
          if (seen == 0) {
            // Not observed: an old token is untouched, a new one starts empty.
            if (!fresh) continue;
            FUZZ_CHECK(state_.observed[i] == 0.0f && !std::signbit(state_.observed[i]), "observe: a new token's count");
            for (std::size_t w = 0; w < words; ++w)
              FUZZ_CHECK(state_.ring_of(static_cast<std::int64_t>(i))[static_cast<std::int32_t>(w)] == 0u,
                         "observe: a new token's history");
          }
          const float old_observed = fresh ? 0.0f : old_value(before, &state_.observed[i]);
          if constexpr (std::is_same_v<Hist, sh::unbounded_history>) {
            float count = old_observed;
            for (std::int32_t n = 0; n < seen; ++n) count += 1.0f;
            FUZZ_CHECK(std::memcmp(&count, &state_.observed[i], 4) == 0 || (std::isnan(count) && std::isnan(state_.observed[i])),
                       "observe: observed count (unbounded)");
          } else if constexpr (std::is_same_v<Hist, sh::sliding_window>) {
            float count = old_observed;
            const auto w = static_cast<float>(policy_.config.window);
            for (std::int32_t n = 0; n < seen; ++n) count = count + 1.0f < w ? count + 1.0f : w;
            FUZZ_CHECK(std::memcmp(&count, &state_.observed[i], 4) == 0 || (std::isnan(count) && std::isnan(state_.observed[i])),
                       "observe: observed count (sliding window)");
          }
          if (fresh) {
            float expect = 0.0f;
            if constexpr (std::is_same_v<Obs, sh::key_norm>) {
              const float* k = cache_.k.data() + row_at(v, true, b, h, t);
              float sum = 0.0f;
              for (std::int32_t d = 0; d < v.head_dim; ++d) sum = std::fma(k[d], k[d], sum);
              expect = -std::sqrt(sum);
            } else if constexpr (std::is_same_v<Obs, sh::random_score>) {
              expect = state_.scores[i];
              FUZZ_CHECK(expect >= 0.0f && expect < 1.0f, "random_score outside [0, 1)");
            }
            if (seen == 0 || !attention)
              FUZZ_CHECK(std::memcmp(&state_.scores[i], &expect, 4) == 0 || (std::isnan(expect) && std::isnan(state_.scores[i])),
                         "score of a new token");
          }
          copy_value(est, &state_.scores[i], 4);
          copy_value(est, &state_.observed[i], 4);
          for (std::size_t w = 0; w < words; ++w)
            copy_value(est, &state_.ring_of(static_cast<std::int64_t>(i))[static_cast<std::int32_t>(w)], 4);
        }
    }
    FUZZ_CHECK(after.state == est, "observe wrote state bytes outside the batch's rows, counters and slots");
  }

  // H2O's score after one observe, recomputed in the documented order.
  void check_h2o_scores(const view_type& v, const snapshot& before, const sh::probability_view<memory_space::host>& p) {
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      const std::int32_t group = p.q_heads / v.kv_heads;
      for (std::int32_t b = 0; b < v.batch; ++b) {
        const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
        const std::int32_t len = length_in(v, b);
        if (r < 0 || len == 0) continue;
        const std::int32_t q_len = p.queries_of(b);
        const std::int32_t tracked = old_value(before, &state_.tracked[r]);
        for (std::int32_t h = 0; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t) {
            const std::size_t i = slot(r, h, t);
            float score = 0.0f;
            if (t < tracked) score = old_value(before, &state_.scores[i]);
            for (std::int32_t j = 0; j < q_len; ++j) {
              if (t >= len - q_len + j + 1) continue;
              float acc = 0.0f;
              for (std::int32_t g = 0; g < group; ++g) acc += p.row(b, h * group + g, j)[t];
              score += acc / static_cast<float>(group);
            }
            FUZZ_CHECK(std::memcmp(&score, &state_.scores[i], 4) == 0 || (std::isnan(score) && std::isnan(state_.scores[i])),
                       "h2o score differs from the recomputed sum");
          }
      }
    } else {
      (void)v;
      (void)before;
      (void)p;
    }
  }

  // ---- queries: uniform q_len or ragged qo_indptr -----------------------------
  struct query_plan {
    std::int32_t q_heads = 1;
    std::int32_t q_len = 0;              // uniform
    bool ragged = false;
    sh::host_span<const std::int32_t> qo;  // ragged: qo_indptr as passed (into qo_store_)
    std::vector<std::int32_t> counts;    // per sequence, as the library reads them (valid plans)
    std::int64_t tokens = 0;             // ragged: qo_indptr[batch] (rows from token 0)
    std::int32_t max_len = 0;
    bool valid = true;                   // every check of q_heads and the counts passes
  };

  query_plan pick_queries(const view_type& mv) {
    const common_shape& s = cache_.shape;
    const auto batch = static_cast<std::size_t>(s.batch);
    query_plan q;
    std::int32_t min_len = INT32_MAX;  // over sequences with tokens: empty ones are skipped
    for (std::int32_t b = 0; b < s.batch; ++b) {
      const std::int32_t len = length_in(mv, b);
      if (len > 0) min_len = std::min(min_len, len);
      q.max_len = std::max(q.max_len, len);
    }
    q.q_heads = s.kv_heads * src_.i32(1, 4);
    q.ragged = src_.flag();
    qo_store_.assign(2 * (batch + 2), 0);  // the second half: room for a copy (observe_queries)
    if (!q.ragged) {
      q.q_len = std::min(min_len, src_.i32(1, 3));
    } else {
      if (src_.rarely()) qo_store_[0] = src_.i32(1, 3);  // queries need not start at token 0
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        qo_store_[b + 1] = qo_store_[b] + src_.i32(0, std::clamp(len, 1, 4));  // an empty sequence may get one
      }
    }
    std::size_t qo_size = batch + 1;
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, s.batch - 1));
      switch (src_.in(0, 5)) {
        case 0: q.q_heads = s.kv_heads * 2 + 1; break;  // no whole group when kv_heads > 1
        case 1: {                                       // more queries than a sequence's tokens
          const std::int32_t len = length_in(mv, static_cast<std::int32_t>(at));
          if (!q.ragged) {
            q.q_len = min_len < INT32_MAX ? min_len + 1 : min_len;
          } else if (len > 0 && len < 1000) {
            const std::int32_t add = len + 1 - (qo_store_[at + 1] - qo_store_[at]);
            for (std::size_t i = at + 1; i <= batch; ++i) qo_store_[i] += add;
          }
          break;
        }
        case 2:
          if (!q.ragged)
            q.q_len = src_.flag() ? 0 : -3;  // no query at all is fine; a negative count is not
          else
            qo_store_[0] = src_.flag() ? -1 : garbage_int(src_);
          break;
        case 3: q.q_heads = s.kv_heads * (sh::host::max_group_size + 1); break;
        case 4:
          if (q.ragged) qo_size = src_.flag() ? batch : batch + 2;
          break;
        default:
          if (q.ragged) qo_store_[at + 1] = qo_store_[at] - 1;  // decreasing
          break;
      }
    }
    if (q.ragged) q.qo = {qo_store_.data(), qo_size};
    q.valid = q.q_heads > 0 && q.q_heads % s.kv_heads == 0 && q.q_heads / s.kv_heads <= sh::host::max_group_size;
    q.counts.assign(batch, 0);
    if (!q.ragged) {
      q.valid = q.valid && q.q_len >= 0;
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        q.valid = q.valid && (len == 0 || q.q_len <= len);
        q.counts[b] = q.q_len;
      }
    } else {
      q.valid = q.valid && qo_size == batch + 1 && qo_store_[0] >= 0;
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int64_t n = std::int64_t{qo_store_[b + 1]} - qo_store_[b];
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        q.valid = q.valid && n >= 0 && (len == 0 || n <= len);
        q.counts[b] = static_cast<std::int32_t>(std::clamp<std::int64_t>(n, 0, INT32_MAX));
      }
      q.tokens = q.valid ? qo_store_[batch] : 0;
    }
    FUZZ_TRACE("  queries: %s q_heads %d q_len %d valid %d counts", q.ragged ? "ragged" : "uniform", q.q_heads,
               q.q_len, int(q.valid));
    for (std::int32_t n : q.counts) FUZZ_TRACE(" %d", n);
    FUZZ_TRACE("\n");
    return q;
  }

  bool observe_probabilities() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_plan q = pick_queries(mv);
    // Probabilities: each visible row a normalised distribution; columns the
    // query cannot see hold NaN, which the library must neither read nor
    // check. Uniform views are [batch][q_heads][q_len][columns]; ragged ones
    // token-major [token][q_heads][columns], each padded.
    const std::int32_t columns = std::clamp(q.max_len, 1, 1 << 20);
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 1, 64);
    const std::int64_t tokens = std::clamp<std::int64_t>(q.tokens, 0, 4096);
    std::int64_t query_stride = 0, head_stride = 0, sequence_stride = 0;
    if (!q.ragged) {
      query_stride = columns + src_.in(0, 2);
      head_stride = query_stride * queries + src_.in(0, 2);
      sequence_stride = head_stride * heads + src_.in(0, 2);
    } else {
      head_stride = columns + src_.in(0, 2);
      query_stride = head_stride * heads + src_.in(0, 2);
      sequence_stride = src_.flag() ? std::int64_t{1} << 40 : src_.in(0, 2);  // unused by ragged views
    }
    bool overlapping = false;
    if (src_.rarely()) {
      switch (src_.in(0, 2)) {
        case 0:  // rows shared between sequences and queries: reads may overlap
          query_stride = 0;
          head_stride = columns;
          sequence_stride = 0;
          overlapping = true;
          break;
        case 1: head_stride = -1; break;
        default: sequence_stride = std::int64_t{1} << 40; break;
      }
    }
    const bool strides_ok = query_stride >= 0 && head_stride >= 0 && sequence_stride >= 0;
    // The extent the library computes, rows of the longest length: over
    // (token, head) for ragged views.
    const std::int64_t reach =
        q.ragged ? extent_of({query_stride, head_stride, 0}, tokens, heads, 1, q.max_len)
                 : extent_of({sequence_stride, head_stride, query_stride}, s.batch, heads, q.q_len, q.max_len);
    std::int64_t alloc = std::min<std::int64_t>(reach, std::int64_t{1} << 22);
    if (src_.rarely()) alloc = std::max<std::int64_t>(alloc - 1, 0);
    const bool buffer_ok = alloc >= reach;
    std::vector<float> probs(static_cast<std::size_t>(std::max<std::int64_t>(alloc, 1)),
                             overlapping ? 1.0f / static_cast<float>(columns) : nan_f);
    const auto row_of = [&](std::int32_t b, std::int32_t qh, std::int32_t j) {
      const std::int64_t at = q.ragged ? (std::int64_t{qo_store_[static_cast<std::size_t>(b)]} + j) * query_stride +
                                             qh * head_stride
                                       : b * sequence_stride + qh * head_stride + j * query_stride;
      return probs.data() + at;
    };
    bool values_ok = true;
    const bool fill = buffer_ok && strides_ok && q.valid && clean_cache_;
    if (fill && !overlapping) {
      for (std::int32_t b = 0; b < s.batch; ++b) {
        const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
        if (len == 0) continue;
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < n; ++j) {
            float* row = row_of(b, qh, j);
            const std::int32_t visible = len - n + j + 1;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) sum += (row[t] = static_cast<float>(gen_.next() % 64 + 1));
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
            if (src_.rarely()) row[0] = 1.0f;  // a spike: still in [0, 1]
          }
      }
    }
    if (fill && src_.rarely()) {  // an out-of-range value in a visible column of a query the library reads
      const std::int32_t b = src_.i32(0, s.batch - 1);
      const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
      if (len > 0 && n > 0) {
        float* row = row_of(b, src_.i32(0, q.q_heads - 1), n - 1);
        const float x = special_value(src_);
        row[src_.i32(0, len - 1)] = x;
        values_ok = !(x < 0.0f || x > 1.001f || std::isnan(x));
      }
    }
    sh::probability_view<memory_space::host> p{sh::host_span<const float>(probs.data(), static_cast<std::size_t>(alloc)),
                                               q.q_heads,
                                               q.ragged ? 0 : q.q_len,
                                               sequence_stride,
                                               head_stride,
                                               query_stride,
                                               q.qo};
    bool null_bad = false;
    if (src_.rarely()) {
      p.data = {nullptr, p.data.size()};
      null_bad = reach > 0;  // nothing to read: a null buffer is fine
    }
    const bool args_ok = !attention || (q.valid && strides_ok && buffer_ok && values_ok && !null_bad);
    const expect expected = expectation(damage, v, args_ok, false, !args_ok);
    FUZZ_TRACE("  observe_probabilities: reach %lld alloc %lld strides %lld %lld %lld values %d null %d view %d\n",
               static_cast<long long>(reach), static_cast<long long>(alloc), static_cast<long long>(sequence_stride),
               static_cast<long long>(head_stride), static_cast<long long>(query_stride), int(values_ok),
               int(null_bad), int(damage));
    const snapshot before = take();
    if (!guarded("host::observe_probabilities", expected,
                 [&] { sh::host::observe_probabilities(policy_, v, call_state(), p); }))
      return true;
    check_after_observe(v, before, q.counts);
    if (attention) check_h2o_scores(v, before, p);
    return damage == expect::ok && rc_.damage == expect::ok;  // the model no longer describes a damaged call
  }

  bool observe_queries() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_plan q = pick_queries(mv);
    std::int32_t head_dim = s.head_dim;
    if (src_.rarely()) head_dim += 1;
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 0, 64);
    const std::int64_t tokens = std::clamp<std::int64_t>(q.tokens, 0, 4096);
    // Dense [batch][q_len][q_heads][head_dim] or ragged [token][q_heads][head_dim].
    const std::int64_t reach = (q.ragged ? tokens : std::int64_t{s.batch} * queries) * heads * head_dim;
    std::vector<float> qs(static_cast<std::size_t>(std::max<std::int64_t>(reach, 1)));
    for (auto& x : qs) x = gen_.uniform(-3.0f, 3.0f);
    auto qv = q.ragged ? sh::query_view<float, memory_space::host>::ragged({qs.data(), static_cast<std::size_t>(reach)},
                                                                           q.qo, q.q_heads, head_dim)
                       : sh::query_view<float, memory_space::host>::dense({qs.data(), static_cast<std::size_t>(reach)},
                                                                          q.q_heads, q.q_len, head_dim);
    bool ok = q.valid && head_dim == s.head_dim;
    bool sure_bad = !ok;
    // The buffer is cut at 64 queries (4096 tokens) a sequence: a longer
    // view reaches past it, and the library checks a uniform view's reach
    // for every sequence, empty ones included.
    if ((!q.ragged && q.q_len > queries) || (q.ragged && q.tokens > tokens)) ok = false, sure_bad = true;
    if (src_.rarely() && reach > 0) {
      qv.data = {qs.data(), static_cast<std::size_t>(reach) - 1};
      ok = false;
      sure_bad = true;
    }
    float scale = 0.0f;
    if (src_.flag()) scale = src_.flag() ? 0.5f : special_value(src_);
    const bool scale_ok = std::isfinite(scale) && scale >= 0.0f;
    ok = ok && scale_ok;
    sure_bad = sure_bad || !scale_ok;
    // lse: absent, exact (computed here, natural or base 2), or garbage; for
    // uniform queries head-major (dense) or token-major, for ragged ones
    // ragged over the queries' own qo_indptr.
    std::vector<float> lse_values;
    sh::lse_view<memory_space::host> lse{};
    const int lse_kind = static_cast<int>(src_.in(0, 2));
    const bool exact_lse_possible = q.valid && head_dim == s.head_dim && clean_layout_ && clean_cache_;
    bool moderate_keys = scale < 100.0f;  // the mass check needs finite logits
    if (lse_kind != 0 && exact_lse_possible) {
      const bool base2 = src_.flag();
      const bool token_major = !q.ragged && src_.flag();
      const auto base = base2 ? sh::lse_base::base2 : sh::lse_base::natural;
      lse_values.resize(static_cast<std::size_t>((q.ragged ? tokens : std::int64_t{s.batch} * queries) * heads));
      if (q.ragged)
        lse = sh::lse_view<memory_space::host>::ragged({lse_values.data(), lse_values.size()}, q.qo, q.q_heads, base);
      else if (token_major)
        lse = sh::lse_view<memory_space::host>::token_major({lse_values.data(), lse_values.size()}, q.q_heads, q.q_len,
                                                            base);
      else
        lse = sh::lse_view<memory_space::host>::dense({lse_values.data(), lse_values.size()}, q.q_heads, q.q_len, base);
      const float sc = scale > 0.0f && std::isfinite(scale) ? scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      const std::int32_t group = q.q_heads / s.kv_heads;
      for (std::int32_t b = 0; b < s.batch; ++b) {
        const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
        if (len == 0) continue;  // not read
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < n; ++j) {
            const std::int32_t visible = len - n + j + 1;
            double sum = 0.0;
            for (std::int32_t t = 0; t < visible; ++t) {
              const float* k = cache_.k.data() + row_at(mv, true, b, qh / group, t);
              double dot = 0.0;
              for (std::int32_t d = 0; d < s.head_dim; ++d) {
                dot += double{qv.row(b, qh, j)[d]} * double{k[d]};
                moderate_keys = moderate_keys && std::fabs(k[d]) < 1e4f;  // false for NaN and inf too
              }
              sum += std::exp(dot * sc);
            }
            auto x = static_cast<float>(std::log(std::max(sum, 1e-30)));
            if (base2) x = static_cast<float>(static_cast<double>(x) / 0.6931471805599453);
            if (lse_kind == 2) x = src_.flag() ? special_value(src_) : gen_.uniform(-5.0f, 5.0f);
            if (!std::isfinite(x)) ok = false, sure_bad = true;
            const std::int64_t at = q.ragged ? (std::int64_t{qo_store_[static_cast<std::size_t>(b)]} + j) * q.q_heads + qh
                                    : token_major ? (std::int64_t{b} * q.q_len + j) * q.q_heads + qh
                                                  : (std::int64_t{b} * q.q_heads + qh) * q.q_len + j;
            lse_values[static_cast<std::size_t>(at)] = x;
          }
      }
      if (lse.present() && src_.rarely()) {  // a lse that does not fit the queries
        const std::size_t half = qo_store_.size() / 2;
        switch (src_.in(0, 2)) {
          case 0:  // ragged over another array with the same values; uniform queries, ragged lse
            if (q.ragged) {
              std::copy_n(qo_store_.begin(), half, qo_store_.begin() + static_cast<std::ptrdiff_t>(half));
              lse.qo_indptr = {qo_store_.data() + half, q.qo.size()};
            } else {
              lse.qo_indptr = {qo_store_.data(), static_cast<std::size_t>(s.batch) + 1};
            }
            ok = false, sure_bad = true;
            break;
          case 1:  // ragged queries, uniform lse; or an empty span that is not null
            if (q.ragged)
              lse.qo_indptr = {};
            else
              lse.qo_indptr = {qo_store_.data(), 0};
            ok = false, sure_bad = true;
            break;
          default:  // one value short
            if (!lse.data.empty()) {
              lse.data = {lse.data.data(), lse.data.size() - 1};
              ok = false, sure_bad = true;
            }
            break;
        }
      }
    }
    if (src_.rarely()) {  // {nullptr, n}: a caller's bug, not "no lse"
      lse = {};
      lse.data = {nullptr, static_cast<std::size_t>(src_.in(1, 64))};
      ok = false;
      sure_bad = true;
    }
    const bool args_ok = !attention || ok;
    const expect expected = expectation(damage, v, args_ok, false, attention && sure_bad);
    const snapshot before = take();
    if (!guarded("host::observe_queries", expected,
                 [&] { sh::host::observe_queries(policy_, v, call_state(), qv, lse, scale); }))
      return true;
    check_after_observe(v, before, q.counts);
    // With the exact lse the probabilities of a query sum to 1, so a head's
    // tokens gain q_len(b) of mass in all (H2O: mass, unbounded, mean).
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      if (lse_kind == 1 && damage == expect::ok && exact_lse_possible && moderate_keys && clean_state_ && lse.present()) {
        for (std::int32_t b = 0; b < s.batch; ++b) {
          const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
          const std::int32_t len = length_in(v, b);
          if (r < 0 || len == 0) continue;
          const auto n = static_cast<float>(q.counts[static_cast<std::size_t>(b)]);
          const std::int32_t tracked = old_value(before, &state_.tracked[r]);
          for (std::int32_t h = 0; h < s.kv_heads; ++h) {
            float total = 0.0f, magnitude = 0.0f;  // new - old loses ~ulp(old) per token
            for (std::int32_t t = 0; t < len; ++t) {
              const float old = t < tracked ? old_value(before, &state_.scores[slot(r, h, t)]) : 0.0f;
              total += state_.scores[slot(r, h, t)] - old;
              magnitude += std::fabs(old);
            }
            if (std::isfinite(total))
              FUZZ_CHECK(std::fabs(total - n) <= 1e-3f * n + 1e-3f + magnitude * 1e-6f,
                         "observe_queries with the exact lse: mass per query is not 1");
          }
        }
      }
    }
    return damage == expect::ok && rc_.damage == expect::ok;
  }

  bool admit() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const snapshot before = take();
    if (!guarded("host::admit", expectation(damage, v, true, false, false),
                 [&] { sh::host::admit(policy_, v, call_state()); }))
      return true;
    check_after_observe(v, before, std::vector<std::int32_t>(static_cast<std::size_t>(v.batch), 0));
    return damage == expect::ok && rc_.damage == expect::ok;
  }

  // ---- compress and its oracle ---------------------------------------------
  // For the model's view and valid rows: whether a sequence at the budget
  // has state for fewer tokens than it holds, or a head with fewer
  // unprotected tokens than it must evict (damaged positions).
  [[nodiscard]] bool compress_state_refuses(const view_type& v, std::int32_t budget) const {
    const sh::settings& c = policy_.config;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t len = length_in(v, b);
      if (len < budget) continue;
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      if (state_.tracked[r] != len) return true;
      const std::int32_t evict = len - budget + c.evict_count;
      for (std::int32_t h = 0; h < v.kv_heads; ++h) {
        std::int32_t free = 0;
        for (std::int32_t t = 0; t < len; ++t)
          free += !is_protected(state_.positions[slot(r, h, t)], state_.next_position[r], c);
        if (free < evict) return true;
        // shared_heads reads head 0's positions for every head: they must agree.
        if (shared)
          for (std::int32_t t = 0; t < len; ++t)
            if (state_.positions[slot(r, h, t)] != state_.positions[slot(r, 0, t)]) return true;
      }
    }
    return false;
  }

  bool compress() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const sh::settings& c = policy_.config;
    // Budgets near the lengths trigger; the rest exercise the bounds.
    std::int64_t max_len = 0;
    for (std::int32_t b = 0; b < s.batch; ++b) max_len = std::max<std::int64_t>(max_len, length_in(mv, b));
    const std::int32_t budget =
        src_.rarely() ? garbage_int(src_) : src_.i32(1, std::clamp<std::int64_t>(max_len, 1, 1 << 20) + 1);

    const std::size_t need = sh::host::compress_workspace_bytes(v, state_.shape);  // what compress checks
    bool ws_ok = need <= (std::size_t{1} << 24);
    std::size_t ws_size = ws_ok ? need + static_cast<std::size_t>(src_.in(0, 8)) : 64;
    std::size_t ws_shift = 0;
    if (src_.rarely()) {
      ws_ok = false;
      if (src_.flag())
        ws_size = need == 0 ? 0 : std::min(need - 1, ws_size);
      else
        ws_shift = 4;  // misaligned
    }
    std::vector<std::uint64_t> ws_store(ws_size / 8 + 2, 0xA5A5A5A5A5A5A5A5ull);
    sh::host_span<std::byte> workspace(reinterpret_cast<std::byte*>(ws_store.data()) + ws_shift, ws_size);
    if (src_.rarely()) {
      workspace = {nullptr, ws_size};
      ws_ok = false;
    }
    // compress_output: new_lengths [batch]; freed_pages [batch] (paged) or
    // empty or [batch] (contiguous). Both inside out_store_, with room
    // around them so a stray write shows.
    const auto n = static_cast<std::size_t>(s.batch);
    out_store_.assign(3 * n + 4, -7);
    std::int32_t* store = out_store_.data();
    sh::host_span<std::int32_t> new_lengths(store + 1, n), freed;
    if (Paged || src_.flag()) freed = {store + n + 2, n};
    bool out_ok = true;
    if (src_.rarely()) {
      out_ok = false;
      switch (src_.in(0, 7)) {
        case 0: freed = {store + n + 2, n + 1}; break;
        case 1: freed = {nullptr, n}; break;
        case 2: {
          freed = {store + n + 2, n - 1};
          // An empty span is fine for a contiguous cache and for page size 1.
          bool optional = true;
          if constexpr (Paged) optional = v.page_size == 1;
          out_ok = optional && n == 1;
          break;
        }
        case 3: new_lengths = {store + 1, src_.flag() ? n - 1 : n + 1}; break;
        case 4: new_lengths = {nullptr, n}; break;
        case 5: {
          // An output over something the call reads or moves: the lengths,
          // the state, the workspace, K, V, the page table or the state
          // rows (the view's own arrays: only for an undamaged view).
          const bool first = src_.flag();
          sh::host_span<std::int32_t> over;
          const auto as_i32 = [&](void* p, std::size_t bytes) {
            return bytes >= 4 * n ? sh::host_span<std::int32_t>(static_cast<std::int32_t*>(p), n)
                                  : sh::host_span<std::int32_t>{};
          };
          switch (damage == expect::ok ? src_.in(0, 5) : -1) {
            case 0:
              // The view reads a copy of the lengths inside a larger array,
              // so a partial overlap stays in bounds.
              scratch_len_.assign(3 * n + 2, -9);
              if constexpr (Paged) {
                std::copy(cache_.last_page_len.begin(), cache_.last_page_len.end(),
                          scratch_len_.begin() + static_cast<std::ptrdiff_t>(n + 1));
                v.last_page_len = {scratch_len_.data() + n + 1, n};
              } else {
                std::copy(cache_.lengths.begin(), cache_.lengths.end(),
                          scratch_len_.begin() + static_cast<std::ptrdiff_t>(n + 1));
                v.lengths = {scratch_len_.data() + n + 1, n};
              }
              over = {scratch_len_.data() + src_.in(2, 2 * static_cast<std::int64_t>(n)), n};
              break;
            case 1:  // a state row's counters or slots
              over = as_i32(state_buffer_.data + 4 * src_.in(0, 64), state_buffer_.size - 256);
              break;
            case 2:
              if (workspace.data() != nullptr) over = as_i32(workspace.data(), workspace.size());
              break;
            case 3: over = as_i32(cache_.k.data(), cache_.k.size() * sizeof(float)); break;
            case 4: over = as_i32(cache_.v.data(), cache_.v.size() * sizeof(float)); break;
            case 5:
              if constexpr (Paged) {
                over = src_.flag() ? as_i32(cache_.indptr.data(), 4 * cache_.indptr.size())
                                   : as_i32(cache_.indices.data(), 4 * cache_.indices.size());
              } else {
                if (rc_.span.data() == rc_.storage.data()) over = as_i32(rc_.storage.data(), 4 * rc_.storage.size());
              }
              break;
            default: break;
          }
          if (over.data() == nullptr) {
            out_ok = true;  // nothing to overlap: the outputs are the plain ones
            break;
          }
          (first ? new_lengths : freed) = over;
          break;
        }
        case 6: freed = {new_lengths.data() + src_.in(0, static_cast<std::int64_t>(n) - 1), n}; break;
        default:  // adjacent, not overlapping: fine
          freed = {store + 1 + n, n};
          out_ok = true;
          break;
      }
    }
    const std::int64_t protect = std::int64_t{c.recent} + c.sinks;
    const bool budget_ok = budget > protect && c.evict_count <= budget - protect;
    const bool state_bad = damage == expect::ok && rc_.damage != expect::refuse && rc_.in_range && clean_shape_ &&
                           clean_settings_ && budget_ok && !state_refuses(v) && compress_state_refuses(v, budget);
    expect expected = expectation(damage, v, true, !budget_ok || !ws_ok || !out_ok, state_bad);
    if (shared_page_ && rewrites_shared_page(v, budget)) expected = expect::refuse;
    FUZZ_TRACE("  compress: budget %d m %d ws %d out %d state_bad %d expected %d\n", budget, c.evict_count, int(ws_ok),
               int(out_ok), int(state_bad), int(expected));

    const snapshot before = take();
    const sh::compress_output<memory_space::host> out{new_lengths, freed};
    if (!guarded("host::compress", expected,
                 [&] { sh::host::compress(policy_, v, call_state(), budget, workspace, out); }))
      return true;
    check_after_compress(v, before, budget, new_lengths, freed);
    if (damage != expect::ok || rc_.damage != expect::ok) return false;
    // The engine applies the new lengths (one layer: right away).
    apply_lengths(std::vector<std::int32_t>(new_lengths.begin(), new_lengths.end()));
    return true;
  }

  // Whether a sequence at the budget lists a page that is listed elsewhere
  // too: compress would move rows under the other list, so it must refuse.
  bool rewrites_shared_page(const view_type& v, std::int32_t budget) const {
    if constexpr (Paged) {
      const std::int32_t listed = v.indptr[static_cast<std::size_t>(v.batch)];
      for (std::int32_t b = 0; b < v.batch; ++b) {
        if (length_in(v, b) < budget) continue;
        for (std::int32_t i = v.indptr[static_cast<std::size_t>(b)]; i < v.indptr[static_cast<std::size_t>(b) + 1]; ++i)
          if (std::count(v.indices.begin(), v.indices.begin() + listed, v.indices[static_cast<std::size_t>(i)]) > 1)
            return true;
      }
    } else {
      (void)v;
      (void)budget;
    }
    return false;
  }

  // A token's whole identity: its K and V rows and every state field.
  std::vector<std::uint8_t> token_bytes(const std::vector<std::uint8_t>& k, const std::vector<std::uint8_t>& vv,
                                        const std::vector<std::uint8_t>& st, const view_type& v, std::int32_t b,
                                        std::int32_t r, std::int32_t h, std::int32_t t) const {
    const std::size_t row = static_cast<std::size_t>(v.head_dim) * sizeof(float);
    std::vector<std::uint8_t> out;
    const auto put = [&](const std::vector<std::uint8_t>& src, std::size_t at, std::size_t n) {
      out.insert(out.end(), src.begin() + static_cast<std::ptrdiff_t>(at), src.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    put(k, static_cast<std::size_t>(row_at(v, true, b, h, t)) * sizeof(float), row);
    put(vv, static_cast<std::size_t>(row_at(v, false, b, h, t)) * sizeof(float), row);
    const std::size_t i = slot(r, h, t);
    put(st, byte_offset(state_.positions + i), 4);
    put(st, byte_offset(state_.scores + i), 4);
    put(st, byte_offset(state_.observed + i), 4);
    for (std::int32_t w = 0; w < state_shape_.ring_words; ++w)  // word-major: one word at a time
      put(st, byte_offset(&state_.ring_of(static_cast<std::int64_t>(i))[w]), 4);
    return out;
  }

  // Writes a token's identity (from token_bytes) into buffers at slot t.
  void put_token(std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& vv, std::vector<std::uint8_t>& st,
                 const view_type& v, std::int32_t b, std::int32_t r, std::int32_t h, std::int32_t t,
                 const std::vector<std::uint8_t>& token) const {
    const std::size_t row = static_cast<std::size_t>(v.head_dim) * sizeof(float);
    std::size_t at = 0;
    const auto get = [&](std::vector<std::uint8_t>& dst, std::size_t to, std::size_t n) {
      std::memcpy(dst.data() + to, token.data() + at, n);
      at += n;
    };
    get(k, static_cast<std::size_t>(row_at(v, true, b, h, t)) * sizeof(float), row);
    get(vv, static_cast<std::size_t>(row_at(v, false, b, h, t)) * sizeof(float), row);
    const std::size_t i = slot(r, h, t);
    get(st, byte_offset(state_.positions + i), 4);
    get(st, byte_offset(state_.scores + i), 4);
    get(st, byte_offset(state_.observed + i), 4);
    for (std::int32_t w = 0; w < state_shape_.ring_words; ++w)
      get(st, byte_offset(&state_.ring_of(static_cast<std::int64_t>(i))[w]), 4);
  }

  void check_after_compress(const view_type& v, const snapshot& before, std::int32_t budget,
                            sh::host_span<std::int32_t> new_lengths, sh::host_span<std::int32_t> freed) {
    const sh::settings& c = policy_.config;
    const snapshot after = take();
    // The library never writes the lengths or the page table.
    FUZZ_CHECK(after.lengths == before.lengths && after.indptr == before.indptr && after.indices == before.indices &&
                   after.scratch == before.scratch,
               "compress wrote the lengths, the page table or an argument it only reads");
    // Expected bytes: start from before, then mark what compress may change.
    std::vector<std::uint8_t> ek = before.k, ev = before.v, est = before.state, eout = before.out;
    const auto put_out = [&](sh::host_span<std::int32_t> span, std::size_t b, std::int32_t x) {
      const auto at = static_cast<std::size_t>(span.data() - out_store_.data()) + b;  // valid spans lie in out_store_
      std::memcpy(eout.data() + 4 * at, &x, 4);
    };
    const std::int32_t m = c.evict_count;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const auto bu = static_cast<std::size_t>(b);
      const std::int32_t old_len = length_in(v, b);  // the lengths did not change
      const std::int32_t r = rc_.used[bu];
      if (old_len < budget) {
        FUZZ_CHECK(new_lengths[bu] == old_len, "compress: new length of a sequence below the budget");
        put_out(new_lengths, bu, old_len);
        if (!freed.empty()) {
          FUZZ_CHECK(freed[bu] == 0, "freed_pages of an untouched sequence");
          put_out(freed, bu, 0);
        }
        // Its tokens, read through its own page table, are exactly as they were
        // (a page shared with a compressed sequence would break this).
        if (r >= 0)
          for (std::int32_t h = 0; h < v.kv_heads; ++h)
            for (std::int32_t t = 0; t < old_len; ++t)
              FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, r, h, t) ==
                             token_bytes(before.k, before.v, before.state, v, b, r, h, t),
                         "compress changed a token of a sequence below the budget");
        continue;
      }
      const std::int32_t kept = budget - m;
      const std::int32_t evict = old_len - kept;
      const std::int32_t old_next = old_value(before, &state_.next_position[r]);
      FUZZ_TRACE("  compress b %d row %d old_len %d kept %d\n", b, r, old_len, kept);
      FUZZ_CHECK(kept == sh::length_after_compress(old_len, budget, m), "length_after_compress");
      FUZZ_CHECK(new_lengths[bu] == kept, "compress: new length != budget - m");
      put_out(new_lengths, bu, kept);
      FUZZ_CHECK(state_.tracked[r] == kept, "compress: tracked != new length");
      set_value(est, &state_.tracked[r], kept);
      std::int32_t freed_pages = 0;
      if constexpr (Paged) freed_pages = pages_in(v, b) - pages_for(kept, v.page_size);
      if (!freed.empty()) {
        FUZZ_CHECK(freed[bu] == freed_pages, "compress: freed_pages");
        put_out(freed, bu, freed_pages);
      }
      // shared_heads: one oracle for the sequence, by the slot's score
      // combined over the heads (granularity.hpp), head 0's positions.
      std::vector<ranked> shared_cand;
      if constexpr (shared) {
        for (std::int32_t t = 0; t < old_len; ++t) {
          const std::int32_t position = old_value(before, &state_.positions[slot(r, 0, t)]);
          if (is_protected(position, old_next, c)) continue;
          std::vector<float> per_head;
          for (std::int32_t h = 0; h < v.kv_heads; ++h)
            per_head.push_back(eviction_score_of(old_value(before, &state_.scores[slot(r, h, t)]),
                                                 old_value(before, &state_.observed[slot(r, h, t)]), c,
                                                 std::is_same_v<Obs, sh::unimportant_indicator>));
          shared_cand.push_back({reduce_scores<typename Policy::granularity::head_reduction>(per_head), position, t});
        }
      }
      for (std::int32_t h = 0; h < v.kv_heads; ++h) {
        // The oracle: every unprotected token, fully sorted by its key.
        std::vector<ranked> cand = shared_cand;
        std::vector<std::vector<std::uint8_t>> pre(static_cast<std::size_t>(old_len));
        for (std::int32_t t = 0; t < old_len; ++t) {
          pre[static_cast<std::size_t>(t)] = token_bytes(before.k, before.v, before.state, v, b, r, h, t);
          const std::size_t i = slot(r, h, t);
          const std::int32_t position = old_value(before, &state_.positions[i]);
          const float score = old_value(before, &state_.scores[i]), observed = old_value(before, &state_.observed[i]);
          if (!shared && !is_protected(position, old_next, c))
            cand.push_back({eviction_score_of(score, observed, c, std::is_same_v<Obs, sh::unimportant_indicator>),
                            position, t});
        }
        FUZZ_CHECK(static_cast<std::int32_t>(cand.size()) >= evict, "compress evicted more than the unprotected tokens");
        std::sort(cand.begin(), cand.end(), [](const ranked& x, const ranked& y) {
          const int k = compare_keys(x, y);
          return k != 0 ? k < 0 : x.slot < y.slot;
        });
        const bool tie = static_cast<std::size_t>(evict) < cand.size() &&
                         compare_keys(cand[static_cast<std::size_t>(evict) - 1], cand[static_cast<std::size_t>(evict)]) == 0;
        // Slots the compaction leaves behind may hold anything.
        for (std::int32_t t = kept; t < old_len; ++t) {
          const auto token = token_bytes(after.k, after.v, after.state, v, b, r, h, t);
          put_token(ek, ev, est, v, b, r, h, t, token);
        }
        if (!tie) {
          std::vector<char> gone(static_cast<std::size_t>(old_len), 0);
          for (std::int32_t e = 0; e < evict; ++e) gone[static_cast<std::size_t>(cand[static_cast<std::size_t>(e)].slot)] = 1;
          std::vector<std::int32_t> source(static_cast<std::size_t>(kept));
          if (c.compaction_mode == sh::compaction::fill_holes) {
            std::int32_t from = kept;
            for (std::int32_t t = 0; t < kept; ++t) {
              if (!gone[static_cast<std::size_t>(t)]) {
                source[static_cast<std::size_t>(t)] = t;
                continue;
              }
              while (gone[static_cast<std::size_t>(from)]) ++from;
              source[static_cast<std::size_t>(t)] = from++;
            }
          } else {
            std::int32_t to = 0;
            for (std::int32_t t = 0; t < old_len; ++t)
              if (!gone[static_cast<std::size_t>(t)]) source[static_cast<std::size_t>(to++)] = t;
          }
          for (std::int32_t t = 0; t < kept; ++t) {
            const auto& want = pre[static_cast<std::size_t>(source[static_cast<std::size_t>(t)])];
            FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, r, h, t) == want,
                       "compress: a kept token's rows or state differ from the oracle's arrangement");
            put_token(ek, ev, est, v, b, r, h, t, want);
          }
        } else {
          // Equal keys at the cut (only garbage state makes them): any of the
          // tied tokens may go. The kept tokens must be distinct originals,
          // and the evicted keys the oracle's.
          std::vector<std::vector<std::uint8_t>> pool = pre;
          std::vector<char> used(pool.size(), 0);
          for (std::int32_t t = 0; t < kept; ++t) {
            const auto got = token_bytes(after.k, after.v, after.state, v, b, r, h, t);
            bool found = false;
            for (std::size_t u = 0; u < pool.size() && !found; ++u)
              if (!used[u] && pool[u] == got) used[u] = 1, found = true;
            FUZZ_CHECK(found, "compress (tied keys): a kept token is not an original");
            put_token(ek, ev, est, v, b, r, h, t, got);
          }
          std::vector<ranked> gone;
          for (const ranked& x : cand)
            if (!used[static_cast<std::size_t>(x.slot)]) gone.push_back(x);
          for (std::int32_t t = 0; t < old_len; ++t) {
            const std::int32_t position = old_value(before, &state_.positions[slot(r, h, t)]);
            if (is_protected(position, old_next, c))
              FUZZ_CHECK(used[static_cast<std::size_t>(t)], "compress (tied keys): a protected token was evicted");
          }
          FUZZ_CHECK(static_cast<std::int32_t>(gone.size()) == evict, "compress (tied keys): evicted count");
          for (std::int32_t e = 0; e < evict; ++e)
            FUZZ_CHECK(compare_keys(gone[static_cast<std::size_t>(e)], cand[static_cast<std::size_t>(e)]) == 0,
                       "compress (tied keys): evicted keys differ from the oracle's");
        }
      }
    }
    if constexpr (shared) {
      // Every head still holds one token per slot (they did before: compress
      // refuses otherwise).
      for (std::int32_t b = 0; b < v.batch; ++b) {
        const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
        if (r < 0 || length_in(v, b) < budget) continue;
        for (std::int32_t h = 1; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t)
            FUZZ_CHECK(state_.positions[slot(r, h, t)] == state_.positions[slot(r, 0, t)],
                       "shared_heads compress: heads hold different tokens at a kept slot");
      }
    }
    FUZZ_CHECK(after.k == ek, "compress wrote K bytes outside the kept rows");
    FUZZ_CHECK(after.v == ev, "compress wrote V bytes outside the kept rows");
    FUZZ_CHECK(after.state == est, "compress wrote state bytes it should not have");
    FUZZ_CHECK(after.out == eout, "compress wrote output entries outside new_lengths[batch] and freed_pages[batch]");
  }

  // ---- shrink_page_table on its own random tables ---------------------------------
  // A table of 0-4 sequences (0-3 pages each), new lengths at most the held
  // ones, `released` exact or larger; rarely one argument broken. Checks
  // refusal with nothing written, or the rewritten table and released ids.
  void shrink_alone() {
    const std::int32_t batch = src_.i32(0, 4);
    std::int32_t page_size = src_.i32(1, 5);
    const auto nb = static_cast<std::size_t>(batch);
    // Stores larger than the spans, so a damaged span stays in bounds.
    std::vector<std::int32_t> indptr(nb + 2, 0), last(nb + 2, 0), lengths(nb + 2, 0), indices;
    std::int64_t total = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::int32_t pages = src_.i32(0, 3);
      for (std::int32_t i = 0; i < pages; ++i) indices.push_back(static_cast<std::int32_t>(gen_.next() % 64));
      indptr[b + 1] = indptr[b] + pages;
      last[b] = pages == 0 ? 0 : src_.i32(1, page_size);
      const std::int32_t held = paged_length(pages, page_size, last[b]);
      lengths[b] = src_.i32(0, held);
      total += pages - pages_for(lengths[b], page_size);
    }
    indices.resize(indices.size() + static_cast<std::size_t>(src_.in(0, 2)), -5);  // unused entries past indptr[batch]
    indices.push_back(-6);
    std::vector<std::int32_t> released(static_cast<std::size_t>(total) + static_cast<std::size_t>(src_.in(0, 2)) + 1, -1);
    table_spans t{{indptr.data(), nb + 1},
                  {indices.data(), indices.size() - 1},
                  {last.data(), nb},
                  page_size,
                  {lengths.data(), nb},
                  {released.data(), released.size() - 1}};
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, std::max(batch - 1, 0)));
      switch (src_.in(0, 14)) {
        case 0: t.indptr = {nullptr, nb + 1}; break;
        case 1: t.indptr = {indptr.data(), 0}; break;
        case 2: t.page_size = page_size = src_.flag() ? 0 : -1; break;
        case 3: t.new_lengths = src_.flag() ? sh::host_span<const std::int32_t>{lengths.data(), nb + 1}
                                            : sh::host_span<const std::int32_t>{nullptr, nb}; break;
        case 4: t.last_page_len = src_.flag() ? sh::host_span<std::int32_t>{last.data(), nb + 1}
                                              : sh::host_span<std::int32_t>{nullptr, nb}; break;
        case 5: indptr[0] = garbage_int(src_); break;
        case 6:
          if (batch > 0) indptr[at + 1] = indptr[at] - src_.i32(1, 2);
          break;
        case 7:
          if (batch > 0) last[at] = src_.flag() ? 0 : page_size + 1;  // fine for a sequence with no page
          break;
        case 8:
          if (batch > 0) lengths[at] = src_.flag() ? -1 : paged_length(indptr[at + 1] - indptr[at], page_size, last[at]) + 1;
          break;
        case 9:
          if (src_.flag())
            t.released = {released.data(), static_cast<std::size_t>(std::max<std::int64_t>(total - 1, 0))};
          else
            t.released = {nullptr, t.released.size()};
          break;
        case 10:
          if (src_.flag())
            t.indices = {indices.data(), static_cast<std::size_t>(std::max(indptr[nb] - 1, 0))};
          else
            t.indices = {nullptr, t.indices.size()};
          break;
        case 11:  // released over the indices it is read from
          t.released = {indices.data(), std::min(t.released.size(), indices.size())};
          break;
        case 12: t.new_lengths = {last.data() + 1, nb}; break;  // over last_page_len when batch > 1
        case 13: t.last_page_len = {indptr.data() + 1, nb}; break;  // over indptr
        default:
          if (batch > 0 && indptr[at + 1] == indptr[at]) last[at] = garbage_int(src_);  // ignored: no page
          break;
      }
    }
    const bool valid = shrink_valid(t);
    FUZZ_TRACE("  shrink_page_table alone: batch %d page_size %d valid %d\n", batch, page_size, int(valid));
    const auto bytes = [&] {
      std::vector<std::uint8_t> out;
      for (const auto* a : {&indptr, &last, &lengths, &indices, &released}) {
        const auto x = bytes_of(a->data(), a->size());
        out.insert(out.end(), x.begin(), x.end());
      }
      return out;
    };
    const std::vector<std::uint8_t> before = bytes();
    if (valid) {
      (void)shrink_and_check(t);
      return;
    }
    try {
      (void)sh::host::shrink_page_table(t.indptr, t.indices, t.last_page_len, t.page_size, t.new_lengths, t.released);
    } catch (const sh::invalid_argument& e) {
      FUZZ_TRACE("  host::shrink_page_table refused: %s\n", e.what());
      FUZZ_CHECK(e.function() == "host::shrink_page_table" && !e.argument().empty(),
                 std::string("shrink_page_table: error names ") + e.function());
      FUZZ_CHECK(bytes() == before, std::string("shrink_page_table wrote before refusing: ") + e.what());
      return;
    }
    fail(__FILE__, __LINE__, "shrink_page_table accepted an invalid argument");
  }
};

// ---------------------------------------------------------------------------
// Token-level eviction across layers (shared_layers: host::select, compact,
// forget; select.hpp). A model of 1-3 layers, each with its own K and V
// buffers (and its own layout) over one set of lengths (contiguous) or one
// page table (paged), as engines share them, and one model_state. The
// engine's side knows the id of the token at each slot of each layer, and a
// K/V row is a function of (layer, K or V, head, token id), so after every
// eviction the harness checks that every layer and head holds exactly the
// tokens it should, bit for bit. Steps: append tokens; observe (or admit)
// every layer (rarely the engine skips one); evict: select, then either
// compact every layer and apply new_lengths (a copy, or shrink_page_table),
// or forget every layer after the engine removed the selected slots itself
// (page size 1: from its slot lists, the pages back to its pool, as
// SGLang's token pool or llama.cpp's cells; otherwise by moving the rows
// down itself), rarely skipping a layer; swap, retire, roll back, reset
// (every layer, or one), and garbage poked into any layer's state.
//
// Every library call may first be probed with one corruption (the clean
// call follows): a stride too small, an output short, null, or over the
// lengths, the table, the state rows, any layer of the model state, the
// workspace, pinned_prefix or another output; a short, null or misaligned
// workspace; pinned_prefix null, of the wrong size, out of range or leaving
// too few tokens; a garbage budget; a model not laid out; a damaged view or
// batch mapping; for compact and forget a selection with counts beyond the
// length or the stride, slots out of range, not ascending or protected,
// short or null spans, spans over K, V, the state or the workspace, a state
// that does not track the tokens, a page compact would write listed twice
// (refused) or a shared page it only reads (accepted), or a smaller valid
// selection. A probe the library accepts is checked like any call, then
// every byte it wrote is put back. Expectations are computed from the data
// (rows, lengths, tracked, next_position, steps, status words, layers that
// disagree, unprotected unpinned tokens), so a refusal of a valid call and
// the acceptance of an invalid one are both failures.
template <class Policy, bool Paged>
class layers_case {
  using view_type = std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using state_type = sh::eviction_state<memory_space::host>;
  using model_type = sh::model_state<memory_space::host>;
  using selection_type = sh::eviction_selection<memory_space::host>;
  using G = typename Policy::granularity;
  using Obs = typename Policy::observation;
  static_assert(G::kind == sh::granularity_kind::shared_layers);
  static constexpr bool attention = Obs::needs_attention;
  static constexpr bool highest = std::is_same_v<Obs, sh::unimportant_indicator>;
  static constexpr std::int64_t max_elements = std::int64_t{1} << 16;

 public:
  explicit layers_case(byte_source& src) : src_(src) {}

  void run() {
    if (!setup()) return;
    for (int op = 0; op < 24 && !src_.exhausted(); ++op) step();
    check_tokens("end of the program");
  }

 private:
  struct layer_kv {
    strides3 kl, vl;
    std::vector<float> k, v;
  };
  byte_source& src_;
  generator gen_{0};
  Policy policy_{};
  bool clean_settings_ = true;
  common_shape shape_;
  std::int32_t layers_ = 1;
  std::int32_t capacity_ = 1;          // contiguous
  std::vector<std::int32_t> lengths_;  // contiguous
  std::int32_t page_size_ = 1, num_pages_ = 1, max_pages_ = 1;  // paged
  std::vector<std::int32_t> indptr_, indices_, last_page_len_, free_pages_;
  std::vector<layer_kv> kv_;
  std::vector<std::vector<std::vector<std::int64_t>>> ids_;  // [layer][b][slot]: the engine's token at each slot
  std::int64_t next_id_ = 0;
  std::uint64_t value_seed_ = 0;
  sh::state_shape sshape_{};
  aligned_buffer state_buffer_;
  model_type model_{};
  std::vector<std::int32_t> rows_;  // state row of each batch position (-1: padding)
  bool pass_rows_ = false;
  bool respect_capacity_ = true;
  // Arrays the calls' spans point into: part of every snapshot.
  std::vector<std::int32_t> rows_store_, pinned_store_, sel_store_, probe_store_, scratch_;
  std::vector<std::uint64_t> ws_store_;
  std::string damage_note_;

  // ---- the engine's cache ---------------------------------------------------
  [[nodiscard]] std::int32_t pages(std::int32_t b) const {
    return indptr_[static_cast<std::size_t>(b) + 1] - indptr_[static_cast<std::size_t>(b)];
  }
  [[nodiscard]] std::int32_t length(std::int32_t b) const {
    if constexpr (Paged)
      return paged_length(pages(b), page_size_, last_page_len_[static_cast<std::size_t>(b)]);
    else
      return lengths_[static_cast<std::size_t>(b)];
  }
  [[nodiscard]] std::vector<std::int32_t> model_lengths() const {
    std::vector<std::int32_t> out;
    for (std::int32_t b = 0; b < shape_.batch; ++b) out.push_back(length(b));
    return out;
  }

  view_type make_view(std::int32_t l) {
    layer_kv& kv = kv_[static_cast<std::size_t>(l)];
    view_type v{};
    if constexpr (Paged) {
      v.k_pages = sh::host_span<float>(kv.k.data(), kv.k.size());
      v.v_pages = sh::host_span<float>(kv.v.data(), kv.v.size());
      v.k_layout = {kv.kl.outer, kv.kl.head, kv.kl.token};
      v.v_layout = {kv.vl.outer, kv.vl.head, kv.vl.token};
      v.indptr = sh::host_span<const std::int32_t>(indptr_.data(), indptr_.size());
      v.indices = sh::host_span<const std::int32_t>(indices_.data(), indices_.size());
      v.last_page_len = sh::host_span<const std::int32_t>(last_page_len_.data(), last_page_len_.size());
      v.page_size = page_size_;
      v.num_pages = num_pages_;
      v.max_pages_per_sequence = max_pages_;
    } else {
      v.k = sh::host_span<float>(kv.k.data(), kv.k.size());
      v.v = sh::host_span<float>(kv.v.data(), kv.v.size());
      v.k_layout = {kv.kl.outer, kv.kl.head, kv.kl.token};
      v.v_layout = {kv.vl.outer, kv.vl.head, kv.vl.token};
      v.lengths = sh::host_span<const std::int32_t>(lengths_.data(), lengths_.size());
      v.capacity = capacity_;
    }
    v.batch = shape_.batch;
    v.kv_heads = shape_.kv_heads;
    v.head_dim = shape_.head_dim;
    return v;
  }

  // The element of a token's K or V row: a function of the layer, K or V,
  // the head and the engine's token id (rarely a special value).
  [[nodiscard]] float value(std::int32_t l, int kind, std::int32_t h, std::int64_t id, std::int32_t d) const {
    generator g{value_seed_ ^ (static_cast<std::uint64_t>(id) * 0x100000001B3ull) ^
                (static_cast<std::uint64_t>(((l * 2 + kind) * 8 + h) * 64 + d) << 40)};
    const std::uint64_t x = g.next();
    if (x % 97 == 0) {
      constexpr float table[] = {nan_f, inf_f, -inf_f, 0.0f, -0.0f, 3.4e38f};
      return table[(x >> 8) % std::size(table)];
    }
    return -4.0f + 8.0f * static_cast<float>(x >> 40) / 16777216.0f;
  }

  void write_token(std::int32_t l, std::int32_t b, std::int32_t t, std::int64_t id) {
    const view_type v = make_view(l);
    layer_kv& kv = kv_[static_cast<std::size_t>(l)];
    for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
      for (int kind = 0; kind < 2; ++kind) {
        float* row = (kind == 0 ? kv.k : kv.v).data() + row_at(v, kind == 0, b, h, t);
        for (std::int32_t d = 0; d < shape_.head_dim; ++d) row[d] = value(l, kind, h, id, d);
      }
  }

  // Every layer and head holds, at each slot below the length, the rows of
  // the token the engine put there.
  void check_tokens(const char* when) {
    for (std::int32_t l = 0; l < layers_; ++l) {
      const view_type v = make_view(l);
      const layer_kv& kv = kv_[static_cast<std::size_t>(l)];
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const auto& ids = ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)];
        FUZZ_CHECK(static_cast<std::int32_t>(ids.size()) == length(b), std::string("token list length, ") + when);
        for (std::int32_t t = 0; t < length(b); ++t)
          for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
            for (int kind = 0; kind < 2; ++kind) {
              const float* row = (kind == 0 ? kv.k : kv.v).data() + row_at(v, kind == 0, b, h, t);
              for (std::int32_t d = 0; d < shape_.head_dim; ++d) {
                const float want = value(l, kind, h, ids[static_cast<std::size_t>(t)], d);
                FUZZ_CHECK(std::memcmp(&row[d], &want, 4) == 0,
                           std::string("layer ") + std::to_string(l) + " sequence " + std::to_string(b) + " slot " +
                               std::to_string(t) + " head " + std::to_string(h) +
                               " does not hold the engine's token (" + when + ")");
              }
            }
      }
    }
  }

  // ---- set-up ---------------------------------------------------------------
  bool setup() {
    gen_.state = src_.word();
    value_seed_ = gen_.next();
    decode_settings_into(src_, policy_.config);
    clean_settings_ = settings_valid<Policy>(policy_.config);
    layers_ = src_.i32(1, 3);
    common_shape& s = shape_;
    s.batch = src_.i32(1, 3);
    s.kv_heads = src_.i32(1, 3);
    s.head_dim = src_.i32(1, 4);
    std::int32_t e0 = s.batch, e2 = 1;
    const auto nb = static_cast<std::size_t>(s.batch);
    if constexpr (Paged) {
      page_size_ = src_.flag() ? 1 : src_.i32(1, 4);  // page size 1: a slot-list engine
      max_pages_ = src_.i32(1, 8);
      num_pages_ = src_.i32(1, 16);
      e0 = num_pages_;
      e2 = page_size_;
      indptr_.assign(nb + 1, 0);
      last_page_len_.assign(nb, 0);
      for (std::int32_t p = 0; p < num_pages_; ++p) free_pages_.push_back(p);
      for (std::size_t i = free_pages_.size(); i > 1; --i) std::swap(free_pages_[i - 1], free_pages_[gen_.next() % i]);
    } else {
      capacity_ = src_.i32(1, 24);
      e2 = capacity_;
      lengths_.assign(nb, 0);
    }
    kv_.resize(static_cast<std::size_t>(layers_));
    for (layer_kv& kv : kv_)
      for (int kind = 0; kind < 2; ++kind) {
        bool clean = true;  // the engine's own layouts are valid (damage comes per call)
        strides3 st = pick_strides(src_, e0, s.kv_heads, e2, s.head_dim, clean);
        if (!clean) st = {std::int64_t{e2} * s.kv_heads * s.head_dim, s.head_dim, std::int64_t{s.kv_heads} * s.head_dim};
        const std::int64_t x = extent_of(st, e0, s.kv_heads, e2, s.head_dim);
        if (x > max_elements) return false;
        (kind == 0 ? kv.kl : kv.vl) = st;
        std::vector<float>& buf = kind == 0 ? kv.k : kv.v;
        buf.resize(static_cast<std::size_t>(x));
        for (float& f : buf) f = gen_.uniform(-4.0f, 4.0f);  // never-written rows: a pattern
      }
    ids_.assign(static_cast<std::size_t>(layers_), std::vector<std::vector<std::int64_t>>(nb));

    // One model state: a layer state per layer, a row per batch position
    // plus spares, often fewer slots than the cache.
    sshape_ = sh::state_shape_for(policy_, make_view(0));
    sshape_.rows += src_.i32(0, 2);
    if (src_.flag()) sshape_.capacity = std::min(sshape_.capacity, src_.i32(1, 30));
    respect_capacity_ = !src_.rarely();
    const sh::state_shape& ss = sshape_;
    const bool shape_valid =
        ss.ring_words >= 0 && static_cast<double>(ss.rows) * ss.kv_heads * ss.capacity * (12.0 + 4.0 * ss.ring_words) < 4.0e18;
    std::size_t per_layer = 0, bytes = 0;
    try {
      per_layer = sh::state_bytes(ss);
      bytes = sh::model_state_bytes(ss, layers_);
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(!shape_valid, std::string("state_bytes / model_state_bytes refused a valid shape: ") + e.what());
      return false;
    }
    FUZZ_CHECK(shape_valid, "model_state_bytes accepted an invalid shape");
    FUZZ_CHECK(bytes == per_layer * static_cast<std::size_t>(layers_), "model_state_bytes != layers * state_bytes");
    if (bytes > (std::size_t{16} << 20)) return false;
    state_buffer_.allocate(bytes);
    std::memset(state_buffer_.data, 0xA5, bytes);  // reset_state(model) must clear every layer
    // make_model_state refuses no layer, a short, null or misaligned buffer.
    // (A null or misaligned buffer is caught by make_state inside it, and
    // the error names make_state.)
    const auto refused = [&](auto&& call, const char* argument) {
      try {
        call();
      } catch (const sh::invalid_argument& e) {
        const bool named = e.function() == "make_model_state" || e.function() == "make_state";
        FUZZ_CHECK(named && e.argument() == argument, std::string("make_model_state: unexpected refusal: ") + e.what());
        return;
      }
      fail(__FILE__, __LINE__, std::string("make_model_state accepted a bad '") + argument + "'");
    };
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes), ss, 0); }, "layers");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes - 1), ss, layers_); },
            "buffer");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(nullptr, bytes), ss, layers_); }, "buffer");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data + 8, bytes), ss, layers_); },
            "buffer");
    model_ = sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes), ss, layers_);
    FUZZ_CHECK(model_.layers == layers_ && model_.layer_bytes == per_layer, "make_model_state: layers, layer_bytes");
    for (std::int32_t l = 0; l < layers_; ++l)
      FUZZ_CHECK(reinterpret_cast<std::byte*>(model_.layer(l).step) == state_buffer_.data + per_layer * static_cast<std::size_t>(l),
                 "model_state::layer(l) does not start layer_bytes * l into the buffer");
    sh::host::reset_state(model_);
    FUZZ_CHECK(std::all_of(state_buffer_.data, state_buffer_.data + bytes, [](std::byte x) { return x == std::byte{0}; }),
               "reset_state(model) left a non-zero byte");
    pick_mapping();
    append(true);
    FUZZ_TRACE("layers setup: layers %d batch %d heads %d dim %d paged %d page_size %d rows %d state capacity %d "
               "pass_rows %d m %d recent %d sinks %d mode %d\n",
               layers_, s.batch, s.kv_heads, s.head_dim, int(Paged), page_size_, sshape_.rows, sshape_.capacity,
               int(pass_rows_), policy_.config.evict_count, policy_.config.recent, policy_.config.sinks,
               int(policy_.config.compaction_mode));
    return true;
  }

  void pick_mapping() {
    const std::int32_t batch = shape_.batch;
    rows_.assign(static_cast<std::size_t>(batch), -1);
    const auto mode = src_.in(0, 3);
    if (mode <= 1 && sshape_.rows >= batch) {
      for (std::int32_t b = 0; b < batch; ++b) rows_[static_cast<std::size_t>(b)] = b;
      pass_rows_ = mode == 1;
      return;
    }
    std::vector<std::int32_t> pool;
    for (std::int32_t r = 0; r < sshape_.rows; ++r) pool.push_back(r);
    for (std::size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[gen_.next() % i]);
    for (std::int32_t b = 0; b < batch; ++b) {
      if (pool.empty() || (mode == 3 && src_.flag())) continue;
      rows_[static_cast<std::size_t>(b)] = pool.back();
      pool.pop_back();
    }
    pass_rows_ = true;
  }
  [[nodiscard]] bool mapping_is_identity() const {
    for (std::size_t b = 0; b < rows_.size(); ++b)
      if (rows_[b] != static_cast<std::int32_t>(b)) return false;
    return true;
  }
  [[nodiscard]] std::vector<std::int32_t> free_rows() const {
    std::vector<std::int32_t> out;
    for (std::int32_t r = 0; r < sshape_.rows; ++r)
      if (std::find(rows_.begin(), rows_.end(), r) == rows_.end()) out.push_back(r);
    return out;
  }

  // ---- the engine's side -----------------------------------------------------
  void append(bool initial) {
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      std::int32_t n = initial ? src_.i32(0, 26) : src_.i32(0, 3);
      if (rows_[static_cast<std::size_t>(b)] < 0) continue;  // a padding slot holds no token
      while (n-- > 0) {
        const std::int32_t len = length(b);
        if (respect_capacity_ && len >= sshape_.capacity) break;
        if constexpr (Paged) {
          if (len == pages(b) * page_size_) {  // a new page
            if (free_pages_.empty() || pages(b) == max_pages_) break;
            const std::int32_t page = free_pages_.back();
            free_pages_.pop_back();
            indices_.insert(indices_.begin() + indptr_[static_cast<std::size_t>(b) + 1], page);
            for (std::size_t i = static_cast<std::size_t>(b) + 1; i < indptr_.size(); ++i) ++indptr_[i];
            last_page_len_[static_cast<std::size_t>(b)] = 0;
          }
          ++last_page_len_[static_cast<std::size_t>(b)];
        } else {
          if (len == capacity_) break;
          ++lengths_[static_cast<std::size_t>(b)];
        }
        const std::int64_t id = next_id_++;
        for (std::int32_t l = 0; l < layers_; ++l) {
          ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)].push_back(id);
          write_token(l, b, len, id);
        }
      }
    }
    FUZZ_TRACE("  lengths:");
    for (std::int32_t b = 0; b < shape_.batch; ++b) FUZZ_TRACE(" %d", length(b));
    FUZZ_TRACE("\n");
  }

  // Sets the lengths (they only shrink): a copy, or shrink_page_table with
  // the released pages back to the pool.
  void apply_lengths(const std::vector<std::int32_t>& lengths) {
    if constexpr (Paged) {
      apply_page_lengths(indptr_, indices_, last_page_len_, page_size_, lengths, free_pages_, "layers");
    } else {
      lengths_ = lengths;
    }
    for (auto& layer : ids_)
      for (std::int32_t b = 0; b < shape_.batch; ++b)
        layer[static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(lengths[static_cast<std::size_t>(b)]));
  }

  void swap_positions() {
    const std::int32_t b1 = src_.i32(0, shape_.batch - 1), b2 = src_.i32(0, shape_.batch - 1);
    if (b1 == b2) return;
    FUZZ_TRACE("  swap positions %d and %d\n", b1, b2);
    const auto u1 = static_cast<std::size_t>(b1), u2 = static_cast<std::size_t>(b2);
    if constexpr (Paged) {
      std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(shape_.batch));
      for (std::int32_t b = 0; b < shape_.batch; ++b)
        lists[static_cast<std::size_t>(b)].assign(indices_.begin() + indptr_[static_cast<std::size_t>(b)],
                                                  indices_.begin() + indptr_[static_cast<std::size_t>(b) + 1]);
      std::swap(lists[u1], lists[u2]);
      indices_.clear();
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        indptr_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(indices_.size());
        indices_.insert(indices_.end(), lists[static_cast<std::size_t>(b)].begin(), lists[static_cast<std::size_t>(b)].end());
      }
      indptr_.back() = static_cast<std::int32_t>(indices_.size());
      std::swap(last_page_len_[u1], last_page_len_[u2]);
    } else {
      for (std::int32_t l = 0; l < layers_; ++l) {
        const view_type v = make_view(l);
        layer_kv& kv = kv_[static_cast<std::size_t>(l)];
        for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
          for (std::int32_t t = 0; t < capacity_; ++t)
            for (const bool key : {true, false}) {
              std::vector<float>& buf = key ? kv.k : kv.v;
              std::swap_ranges(buf.begin() + row_at(v, key, b1, h, t), buf.begin() + row_at(v, key, b1, h, t) + shape_.head_dim,
                               buf.begin() + row_at(v, key, b2, h, t));
            }
      }
      std::swap(lengths_[u1], lengths_[u2]);
    }
    for (auto& layer : ids_) std::swap(layer[u1], layer[u2]);
    std::swap(rows_[u1], rows_[u2]);
    pass_rows_ = pass_rows_ || !mapping_is_identity();
  }

  // A request finishes: its tokens leave, its position becomes padding or
  // takes a new request on its row or a free one, which the engine resets
  // in every layer (rarely it forgets).
  void retire() {
    const std::int32_t b = src_.i32(0, shape_.batch - 1);
    const auto choice = src_.in(0, 2);
    const bool forget = src_.rarely();
    const std::int32_t start = src_.flag() ? 0 : src_.i32(0, 1000);
    std::vector<std::int32_t> lengths = model_lengths();
    lengths[static_cast<std::size_t>(b)] = 0;
    apply_lengths(lengths);
    std::int32_t& row = rows_[static_cast<std::size_t>(b)];
    const std::vector<std::int32_t> spare = free_rows();
    if (choice == 0) {
      row = -1;
    } else if (choice == 2 || row < 0) {
      if (!spare.empty()) row = spare[gen_.next() % spare.size()];
    }
    pass_rows_ = pass_rows_ || !mapping_is_identity();
    FUZZ_TRACE("  retire position %d: row %d%s\n", b, row, forget ? " (not reset)" : "");
    if (row >= 0 && !forget) reset_rows(row, start, -1, expect::ok);
  }

  // Drops a sequence's last tokens without telling the library.
  void rollback() {
    const std::int32_t b = src_.i32(0, shape_.batch - 1);
    const std::int32_t k = src_.i32(1, 3);
    std::vector<std::int32_t> lengths = model_lengths();
    std::int32_t& len = lengths[static_cast<std::size_t>(b)];
    len = std::max(0, len - k);
    FUZZ_TRACE("  rollback position %d to %d\n", b, len);
    apply_lengths(lengths);
  }

  // ---- snapshots ------------------------------------------------------------
  struct snapshot {
    std::vector<std::vector<std::uint8_t>> k, v;
    std::vector<std::uint8_t> lengths, indptr, indices, state, sel, probe, other;
    bool operator==(const snapshot&) const = default;
  };
  [[nodiscard]] snapshot take() const {
    snapshot s;
    for (const layer_kv& kv : kv_) {
      s.k.push_back(bytes_of(kv.k.data(), kv.k.size()));
      s.v.push_back(bytes_of(kv.v.data(), kv.v.size()));
    }
    if constexpr (Paged) {
      s.lengths = bytes_of(last_page_len_.data(), last_page_len_.size());
      s.indptr = bytes_of(indptr_.data(), indptr_.size());
      s.indices = bytes_of(indices_.data(), indices_.size());
    } else {
      s.lengths = bytes_of(lengths_.data(), lengths_.size());
    }
    s.state = bytes_of(state_buffer_.data, state_buffer_.size);
    s.sel = bytes_of(sel_store_.data(), sel_store_.size());
    s.probe = bytes_of(probe_store_.data(), probe_store_.size());
    for (const auto* a : {&rows_store_, &pinned_store_, &scratch_, &rows_}) {
      const auto b = bytes_of(a->data(), a->size());
      s.other.insert(s.other.end(), b.begin(), b.end());
    }
    return s;
  }
  // Puts back what an accepted probe wrote (the arrays have their sizes).
  void restore(const snapshot& s) {
    const auto put = [](auto& vec, const std::vector<std::uint8_t>& bytes) {
      FUZZ_CHECK(bytes.size() == vec.size() * sizeof(vec[0]), "restore: an array changed size");
      if (!bytes.empty()) std::memcpy(vec.data(), bytes.data(), bytes.size());
    };
    for (std::size_t l = 0; l < kv_.size(); ++l) put(kv_[l].k, s.k[l]), put(kv_[l].v, s.v[l]);
    if constexpr (Paged) {
      put(last_page_len_, s.lengths), put(indptr_, s.indptr), put(indices_, s.indices);
    } else {
      put(lengths_, s.lengths);
    }
    std::memcpy(state_buffer_.data, s.state.data(), s.state.size());
    put(sel_store_, s.sel), put(probe_store_, s.probe);
  }

  template <class Call>
  bool guarded(const char* fn, expect expected, Call&& call) {
    const snapshot before = take();
    try {
      call();
    } catch (const sh::invalid_argument& e) {
      FUZZ_TRACE("  %s refused: %s\n", fn, e.what());
      FUZZ_CHECK(e.function() == fn, std::string("error names function '") + e.function() + "', not " + fn);
      FUZZ_CHECK(!e.argument().empty(), "error names no argument");
      FUZZ_CHECK(take() == before, std::string(fn) + " wrote before refusing: " + e.what());
      FUZZ_CHECK(expected != expect::ok, std::string(fn) + " refused a valid call: " + e.what());
      return false;
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string(fn) + " threw something else than scissorhands::invalid_argument: " + e.what());
    }
    FUZZ_TRACE("  %s accepted (expected %d)\n", fn, int(expected));
    FUZZ_CHECK(expected != expect::refuse, std::string(fn) + " accepted an invalid argument (" + damage_note_ + ")");
    return true;
  }

  // ---- state accessors (layout from docs/design.md) ---------------------------
  [[nodiscard]] state_type layer(std::int32_t l) const { return model_.layer(l); }
  [[nodiscard]] std::size_t slot(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return (static_cast<std::size_t>(r) * static_cast<std::size_t>(sshape_.kv_heads) + static_cast<std::size_t>(h)) *
               static_cast<std::size_t>(sshape_.capacity) +
           static_cast<std::size_t>(t);
  }
  [[nodiscard]] std::size_t byte_offset(const void* p) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - state_buffer_.data);
  }
  [[nodiscard]] bool is_protected_at(std::int32_t l, std::int32_t r, std::int32_t h, std::int32_t t) const {
    const state_type s = layer(l);
    return is_protected(s.positions[slot(r, h, t)], s.next_position[r], policy_.config);
  }

  // ---- the batch mapping of one call ---------------------------------------------
  struct call_rows {
    sh::host_span<const std::int32_t> span;  // state_rows as passed ({}: row b)
    bool structural = false;                 // refused whatever the data (size, null, out of range, duplicate)
    std::vector<std::int32_t> used;          // the row of each position
  };
  // The engine's mapping, or rarely a damaged one.
  call_rows pick_rows(bool damage) {
    const std::int32_t batch = shape_.batch, rows = sshape_.rows;
    rows_store_ = rows_;
    call_rows rc;
    bool pass = pass_rows_;
    if (damage) {
      const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
      switch (src_.in(0, 4)) {
        case 0: rows_store_[at] = src_.flag() ? rows + src_.i32(0, 2) : -2; pass = true; break;
        case 1:
          if (batch > 1 && rows_store_[at] >= 0) rows_store_[(at + 1) % static_cast<std::size_t>(batch)] = rows_store_[at];
          pass = true;
          break;
        case 2: rows_store_[at] = -1, pass = true; break;  // padding: fine for a sequence with no token
        case 3:
          if (src_.flag())
            rows_store_.pop_back();
          else
            rows_store_.push_back(-1);
          pass = true;
          break;
        default: pass = false; break;  // no mapping: row b
      }
      damage_note_ = "damaged state_rows";
    }
    rc.span = pass ? sh::host_span<const std::int32_t>(rows_store_.data(), rows_store_.size())
                   : sh::host_span<const std::int32_t>{};
    if (damage && src_.rarely()) rc.span = {nullptr, static_cast<std::size_t>(batch)}, rc.structural = true;
    rc.used.assign(static_cast<std::size_t>(batch), -1);
    if (rc.span.data() == nullptr) {
      for (std::int32_t b = 0; b < batch; ++b) rc.used[static_cast<std::size_t>(b)] = b;
      rc.structural = rc.structural || rows < batch;
      return rc;
    }
    if (rc.span.size() != static_cast<std::size_t>(batch)) rc.structural = true;
    std::vector<char> seen(static_cast<std::size_t>(rows), 0);
    for (std::size_t b = 0; b < std::min(rc.span.size(), static_cast<std::size_t>(batch)); ++b) {
      const std::int32_t r = rc.span[b];
      if (r < -1 || r >= rows) {
        rc.structural = true;
        continue;
      }
      if (r >= 0) {
        if (seen[static_cast<std::size_t>(r)] != 0) rc.structural = true;
        seen[static_cast<std::size_t>(r)] = 1;
      }
      rc.used[b] = r;
    }
    return rc;
  }

  // What every cache entry point checks per layer from the data
  // (validate_common): padding slots empty, lengths within the state's
  // capacity, 0 <= tracked <= length, positions left, steps in range, the
  // status words of mapped rows zero. True: refused.
  [[nodiscard]] bool layer_refuses(std::int32_t l, const call_rows& rc) const {
    if (rc.structural) return true;
    const state_type s = layer(l);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t r = rc.used[static_cast<std::size_t>(b)];
      const std::int32_t len = length(b);
      if (r < 0) {
        if (len != 0) return true;
        continue;
      }
      if (len > sshape_.capacity) return true;
      const std::int32_t tracked = s.tracked[r];
      if (tracked < 0 || tracked > len) return true;
      const std::int32_t next = s.next_position[r];
      if (next < 0 || std::int64_t{next} + (len - tracked) > INT32_MAX) return true;
      if (s.step[r] < 0 || s.step[r] > (std::int64_t{1} << 62)) return true;
      if (rc.span.data() != nullptr && s.status[r] != 0) return true;
    }
    return false;
  }

  // Rarely damages one field of a call's view: expect::refuse when always
  // invalid, unknown when it may describe another valid cache. `for_compact`:
  // the damage may be a page listed twice (a shared prefix page).
  expect corrupt(view_type& v, bool for_compact, bool& shared_page) {
    shared_page = false;
    const std::int32_t batch = shape_.batch;
    const auto which = src_.in(0, 9);
    damage_note_ = "view damage " + std::to_string(which);
    if constexpr (Paged) {
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : batch + 1; return expect::refuse;
        case 1: v.page_size = 0; return expect::refuse;
        case 2: v.indptr = {v.indptr.data(), v.indptr.size() - 1}; return expect::refuse;
        case 3: v.k_pages = {nullptr, v.k_pages.size()}; return expect::refuse;
        case 4: v.v_pages = {v.v_pages.data(), v.v_pages.size() - 1}; return expect::refuse;
        case 5: v.last_page_len = {v.last_page_len.data(), v.last_page_len.size() - 1}; return expect::refuse;
        case 6: v.kv_heads = src_.flag() ? 0 : shape_.kv_heads + 1; return expect::refuse;  // the state's heads differ
        case 7:
          scratch_ = indices_;
          if (scratch_.empty()) return expect::ok;
          scratch_[static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1))] =
              src_.flag() ? num_pages_ : -1;  // a page outside the pool
          v.indices = {scratch_.data(), scratch_.size()};
          return expect::refuse;
        default: {  // a page listed twice: fine to read, refused where compact writes
          scratch_ = indices_;
          if (scratch_.size() < 2) return expect::ok;
          const auto i = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1));
          const auto j = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1));
          if (i == j) return expect::ok;
          scratch_[i] = scratch_[j];
          v.indices = {scratch_.data(), scratch_.size()};
          shared_page = true;
          (void)for_compact;
          return expect::unknown;
        }
      }
    } else {
      (void)for_compact;
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : batch + 1; return expect::refuse;
        case 1: v.kv_heads = src_.flag() ? 0 : shape_.kv_heads + 1; return expect::refuse;
        case 2: v.lengths = {v.lengths.data(), v.lengths.size() - 1}; return expect::refuse;
        case 3: v.lengths = {nullptr, v.lengths.size()}; return expect::refuse;
        case 4: v.k = {nullptr, v.k.size()}; return expect::refuse;
        case 5: v.v = {v.v.data(), v.v.size() - 1}; return expect::refuse;
        case 6: v.v = v.k, v.v_layout = v.k_layout; return expect::refuse;
        case 7: v.capacity = 0; return expect::refuse;
        case 8: v.head_dim = 0; return expect::refuse;
        default:  // a smaller capacity: valid while every length fits
          v.capacity = capacity_ - 1;
          for (std::int32_t b = 0; b < batch; ++b)
            if (length(b) > v.capacity) return expect::refuse;
          return expect::unknown;
      }
    }
  }

  // Whether two byte ranges share a byte (empty or null ones never do).
  static bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
    if (a == nullptr || b == nullptr || an == 0 || bn == 0) return false;
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    return pa < pb + bn && pb < pa + an;
  }

  // ---- steps ------------------------------------------------------------------
  void step() {
    const auto op = src_.in(0, 15);
    FUZZ_TRACE("layers op %d at byte %zu\n", int(op), src_.position());
    switch (op) {
      case 0: append(false); break;
      case 1:
      case 2:
      case 3: observe_all(); break;
      case 4:
      case 5:
      case 6:
      case 7: evict(); break;
      case 8: reset(); break;
      case 9: poke(); break;
      case 10: swap_positions(); break;
      case 11: retire(); break;
      case 12:
        // Rare: every call is refused afterwards until the row is reset.
        if (src_.rarely()) {
          rollback();
          break;
        }
        [[fallthrough]];
      default:  // append and observe, as a decode step does
        append(false);
        observe_all();
        break;
    }
  }

  // Observes (or admits) every layer, each with its own probabilities;
  // rarely the engine skips a layer, which select then refuses ('model').
  void observe_all() {
    const bool admit_only = !attention || src_.in(0, 3) == 0;
    const std::int32_t skip = src_.rarely() ? src_.i32(0, layers_ - 1) : -1;
    const std::int32_t group = src_.i32(1, 2);
    const bool through_model = src_.flag();
    std::int32_t q_len = src_.i32(0, 3), max_len = 1;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      if (length(b) > 0) q_len = std::min(q_len, length(b));
      max_len = std::max(max_len, length(b));
    }
    const std::int32_t q_heads = shape_.kv_heads * group;
    const call_rows rc = pick_rows(false);
    const auto nb = static_cast<std::size_t>(shape_.batch);
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (l == skip) {
        FUZZ_TRACE("  layer %d not observed\n", l);
        continue;
      }
      const view_type v = make_view(l);
      // Dense [batch][q_heads][q_len][max_len]; invisible columns NaN.
      std::vector<float> probs(std::max<std::size_t>(nb * static_cast<std::size_t>(q_heads * q_len * max_len), 1), nan_f);
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t len = length(b);
        if (len == 0) continue;
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t j = 0; j < q_len; ++j) {
            float* row = probs.data() + ((static_cast<std::size_t>(b) * static_cast<std::size_t>(q_heads) +
                                          static_cast<std::size_t>(qh)) * static_cast<std::size_t>(q_len) +
                                         static_cast<std::size_t>(j)) * static_cast<std::size_t>(max_len);
            const std::int32_t visible = len - q_len + j + 1;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) sum += (row[t] = static_cast<float>(gen_.next() % 4 + 1));  // ties
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
          }
      }
      const auto p = sh::probability_view<memory_space::host>::dense({probs.data(), probs.size()}, q_heads, q_len, max_len);
      const state_type st = through_model ? model_.for_batch(rc.span).layer(l) : layer(l).for_batch(rc.span);
      const expect expected = !clean_settings_ || layer_refuses(l, rc) ? expect::refuse : expect::ok;
      const snapshot before = take();
      const char* fn = admit_only ? "host::admit" : "host::observe_probabilities";
      if (!guarded(fn, expected, [&] {
            if (admit_only)
              sh::host::admit(policy_, v, st);
            else
              sh::host::observe_probabilities(policy_, v, st, p);
          }))
        continue;
      // Only layer l's state changed, and its mapped rows track every token.
      const snapshot after = take();
      FUZZ_CHECK(after.k == before.k && after.v == before.v && after.lengths == before.lengths &&
                     after.indptr == before.indptr && after.indices == before.indices && after.other == before.other,
                 "observe (layers) wrote the cache, the table or an argument it only reads");
      const std::size_t lo = model_.layer_bytes * static_cast<std::size_t>(l), hi = lo + model_.layer_bytes;
      FUZZ_CHECK(std::equal(after.state.begin(), after.state.begin() + static_cast<std::ptrdiff_t>(lo), before.state.begin()) &&
                     std::equal(after.state.begin() + static_cast<std::ptrdiff_t>(hi), after.state.end(),
                                before.state.begin() + static_cast<std::ptrdiff_t>(hi)),
                 "observe of one layer wrote another layer's state");
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t r = rc.used[static_cast<std::size_t>(b)];
        if (r >= 0) FUZZ_CHECK(layer(l).tracked[r] == length(b), "observe (layers): tracked != length");
      }
    }
  }

  // reset_sequence of a row in every layer (model), or in one layer.
  // Returns whether the call was accepted.
  bool reset_rows(std::int32_t row, std::int32_t start, std::int32_t only_layer, expect expected) {
    const snapshot before = take();
    if (!guarded("host::reset_sequence", expected, [&] {
          if (only_layer < 0)
            sh::host::reset_sequence(model_, row, start);
          else
            sh::host::reset_sequence(layer(only_layer), row, start);
        }))
      return false;
    std::vector<std::uint8_t> est = before.state;
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (only_layer >= 0 && l != only_layer) continue;
      const state_type s = layer(l);
      FUZZ_CHECK(s.tracked[row] == 0 && s.next_position[row] == start && s.step[row] == 0 && s.status[row] == 0,
                 "reset_sequence (model): a layer's row not reset");
      for (const void* p : {static_cast<const void*>(&s.tracked[row]), static_cast<const void*>(&s.next_position[row]),
                            static_cast<const void*>(&s.status[row])})
        std::memcpy(est.data() + byte_offset(p), p, 4);
      std::memcpy(est.data() + byte_offset(&s.step[row]), &s.step[row], 8);
    }
    FUZZ_CHECK(take().state == est, "reset_sequence (model) wrote other bytes than the rows' counters");
    return true;
  }

  void reset() {
    const std::int32_t row = src_.flag() ? src_.i32(0, sshape_.rows - 1) : garbage_int(src_);
    const std::int32_t start = src_.flag() ? src_.i32(0, 1000) : garbage_int(src_);
    const std::int32_t only = src_.in(0, 3) == 0 ? src_.i32(0, layers_ - 1) : -1;
    const bool valid = row >= 0 && row < sshape_.rows && start >= 0;
    FUZZ_TRACE("  reset row %d start %d layer %d\n", row, start, only);
    reset_rows(row, start, only, valid ? expect::ok : expect::refuse);
    if (src_.rarely()) {
      model_type empty = model_;
      empty.layers = 0;
      guarded("host::reset_state", expect::refuse, [&] { sh::host::reset_state(empty); });
      guarded("host::reset_sequence", expect::refuse, [&] { sh::host::reset_sequence(empty, 0, 0); });
      sh::host::reset_state(model_);
      FUZZ_CHECK(std::all_of(state_buffer_.data, state_buffer_.data + state_buffer_.size,
                             [](std::byte x) { return x == std::byte{0}; }),
                 "reset_state(model) left a non-zero byte");
    }
  }

  // Garbage in one layer's state (a head or a layer that disagrees with the
  // others, counters, scores, the status words).
  void poke() {
    const std::int32_t l = src_.i32(0, layers_ - 1);
    const std::int32_t r = src_.i32(0, sshape_.rows - 1);
    const std::int32_t h = src_.i32(0, sshape_.kv_heads - 1);
    const std::int32_t t = src_.i32(0, sshape_.capacity - 1);
    const state_type s = layer(l);
    const std::size_t i = slot(r, h, t);
    const auto what = src_.in(0, 8);
    FUZZ_TRACE("  poke %d layer %d row %d head %d slot %d\n", int(what), l, r, h, t);
    switch (what) {
      // (One off, wrapping: the value may be garbage already.)
      case 0: s.tracked[r] = src_.flag() ? static_cast<std::int32_t>(static_cast<std::uint32_t>(s.tracked[r]) - 1u) : garbage_int(src_); break;
      case 1:
        s.next_position[r] =
            src_.flag() ? static_cast<std::int32_t>(static_cast<std::uint32_t>(s.next_position[r]) + 1u) : garbage_int(src_);
        break;
      case 2: s.step[r] = src_.flag() ? -std::int64_t{src_.word()} - 1 : INT64_MAX - src_.in(0, 3); break;
      case 3: s.positions[i] = src_.flag() ? garbage_int(src_) : s.positions[slot(r, h, src_.i32(0, t))]; break;
      case 4: s.scores[i] = special_value(src_); break;
      case 5: s.observed[i] = special_value(src_); break;
      case 6: s.status[r] = src_.flag() ? 1u : src_.word(); break;
      case 7:  // the same score in every layer and head: ties across the model
        for (std::int32_t ll = 0; ll < layers_; ++ll)
          for (std::int32_t hh = 0; hh < sshape_.kv_heads; ++hh) layer(ll).scores[slot(r, hh, t)] = 0.25f;
        break;
      default:
        if (sshape_.ring_words > 0) s.ring_of(static_cast<std::int64_t>(i))[0] = src_.word();
        break;
    }
  }

  // Moves a call's workspace (`size` bytes, of which the call uses `need`)
  // over something the call reads: the model state (any layer, or layer
  // `l`'s only), K or V of layer l, the lengths the view reads (a copy
  // inside scratch_), the page table's indices (paged: a copy) or the state
  // rows (contiguous, when passed). Returns whether it moved it; `over`:
  // whether the used bytes share a byte with that (refused).
  bool workspace_over(view_type& v, call_rows& rc, std::int32_t l, bool any_layer, sh::host_span<std::byte>& ws,
                      std::size_t need, bool& over) {
    const std::size_t size = ws.size();
    std::byte* at = nullptr;
    std::size_t room = 0;
    const void* tp = nullptr;
    std::size_t tn = 0;
    const auto copy_into_scratch = [&](const std::vector<std::int32_t>& src) {
      // (At the start of the array the workspace starts at: a workspace
      // that did not overlap it would write scratch_, which is compared.)
      scratch_.assign(size / 4 + src.size() + 4, -9);
      std::copy(src.begin(), src.end(), scratch_.begin());
      at = reinterpret_cast<std::byte*>(scratch_.data()), room = 4 * scratch_.size();
      tp = scratch_.data(), tn = 4 * src.size();
      return sh::host_span<const std::int32_t>(scratch_.data(), src.size());
    };
    const auto target = src_.in(0, 4);
    damage_note_ += ", workspace over target " + std::to_string(target);
    switch (target) {
      case 0: {
        const std::size_t off = model_.layer_bytes * static_cast<std::size_t>(any_layer ? src_.i32(0, layers_ - 1) : l);
        at = state_buffer_.data + off, room = state_buffer_.size - off;
        tp = any_layer ? state_buffer_.data : at, tn = any_layer ? state_buffer_.size : model_.layer_bytes;
        break;
      }
      case 1:
      case 2: {
        std::vector<float>& buf = target == 1 ? kv_[static_cast<std::size_t>(l)].k : kv_[static_cast<std::size_t>(l)].v;
        at = reinterpret_cast<std::byte*>(buf.data()), room = 4 * buf.size(), tp = at, tn = room;
        break;
      }
      case 3:
        if constexpr (Paged)
          v.last_page_len = copy_into_scratch(last_page_len_);
        else
          v.lengths = copy_into_scratch(lengths_);
        break;
      default:
        if constexpr (Paged) {
          v.indices = copy_into_scratch(indices_);
        } else if (rc.span.data() != nullptr && rc.span.data() == rows_store_.data()) {
          const std::vector<std::int32_t> rows(rows_store_.begin(), rows_store_.end());
          rows_store_.assign(size / 4 + rows.size() + 4, -9);
          std::copy(rows.begin(), rows.end(), rows_store_.begin());
          rc.span = {rows_store_.data(), rc.span.size()};
          at = reinterpret_cast<std::byte*>(rows_store_.data()), room = 4 * rows_store_.size();
          tp = rows_store_.data(), tn = 4 * rows.size();
        }
        break;
    }
    if (at == nullptr || room < size) return false;
    ws = {at, size};
    over = overlap(at, need, tp, tn);
    return true;
  }

  // ---- select ---------------------------------------------------------------
  struct select_parts {
    std::int32_t view_layer = 0;  // select reads any layer's view (lengths and table)
    std::int32_t budget = 1;
    std::int32_t extra_stride = 0;
    std::int32_t ws_slack = 0;
    bool cache_slots = false;
    bool freed = false;
    std::vector<std::int32_t> pins;  // empty: no pinned_prefix
  };
  struct select_call {
    view_type v{};
    call_rows rc;
    model_type model{};
    std::int32_t budget = 1;
    sh::host_span<std::byte> workspace;
    selection_type sel{};
    sh::host_span<const std::int32_t> pinned;
    expect view_damage = expect::ok;
    bool structural = false;  // refused whatever the data
    std::vector<std::int32_t>* store = nullptr;
  };

  // The selection's spans inside `store`, a guard entry around each.
  static selection_type lay_out(std::vector<std::int32_t>& store, std::int32_t batch, std::int32_t stride,
                                bool cache_slots, bool freed) {
    const auto b = static_cast<std::size_t>(batch);
    const std::size_t e = b * static_cast<std::size_t>(std::max(stride, 0));
    store.assign(3 * b + 2 * e + 6, -7);
    std::int32_t* p = store.data();
    selection_type s{};
    s.stride = stride;
    s.counts = {p + 1, b};
    s.slots = {p + 2 + b, e};
    if (cache_slots) s.cache_slots = {p + 3 + b + e, e};
    s.out.new_lengths = {p + 4 + b + 2 * e, b};
    if (freed) s.out.freed_pages = {p + 5 + 2 * b + 2 * e, b};
    return s;
  }
  // The same spans over another store of the same layout.
  static selection_type rebase(const selection_type& s, const std::vector<std::int32_t>& from,
                               std::vector<std::int32_t>& to) {
    const auto move = [&](sh::host_span<std::int32_t> x) {
      return x.data() == nullptr ? x : sh::host_span<std::int32_t>(to.data() + (x.data() - from.data()), x.size());
    };
    selection_type r = s;
    r.counts = move(s.counts);
    r.slots = move(s.slots);
    r.cache_slots = move(s.cache_slots);
    r.out.new_lengths = move(s.out.new_lengths);
    r.out.freed_pages = move(s.out.freed_pages);
    return r;
  }

  select_call build_select(const select_parts& parts, std::vector<std::int32_t>& store) {
    select_call c;
    c.v = make_view(parts.view_layer);
    c.rc = pick_rows(false);
    c.model = model_.for_batch(c.rc.span);
    c.budget = parts.budget;
    const std::int32_t need = sh::max_evictions(sshape_.capacity, parts.budget, policy_.config.evict_count);
    c.sel = lay_out(store, shape_.batch, std::min(need, 64) + parts.extra_stride, parts.cache_slots, parts.freed);
    c.store = &store;
    const std::size_t ws_need = sh::host::select_workspace_bytes(c.v, sshape_);
    ws_store_.assign(ws_need / 8 + 4, 0xA5A5A5A5A5A5A5A5ull);
    c.workspace = {reinterpret_cast<std::byte*>(ws_store_.data()), ws_need + static_cast<std::size_t>(parts.ws_slack)};
    pinned_store_ = parts.pins;
    if (!pinned_store_.empty()) c.pinned = {pinned_store_.data(), pinned_store_.size()};
    return c;
  }

  void call_select(const select_call& c) {
    sh::host::select(policy_, c.v, c.model, c.budget, c.workspace, c.sel, c.pinned);
  }

  // The slot's score combined over the heads of each layer, then over the
  // layers (granularity.hpp), from the eviction scores.
  [[nodiscard]] float combined(std::int32_t r, std::int32_t t) const {
    std::vector<float> per_layer;
    for (std::int32_t l = 0; l < layers_; ++l) {
      const state_type s = layer(l);
      std::vector<float> per_head;
      for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
        per_head.push_back(eviction_score_of(s.scores[slot(r, h, t)], s.observed[slot(r, h, t)], policy_.config, highest));
      per_layer.push_back(reduce_scores<typename G::head_reduction>(per_head));
    }
    return reduce_scores<typename G::layer_reduction>(per_layer);
  }

  // What select must do with these arguments, from the data.
  [[nodiscard]] expect select_expected(const select_call& c) const {
    if (!clean_settings_ || c.structural || c.rc.structural || c.view_damage == expect::refuse) return expect::refuse;
    if (c.view_damage == expect::unknown) return expect::unknown;
    const sh::settings& cfg = policy_.config;
    const std::int64_t protect = std::int64_t{cfg.recent} + cfg.sinks;
    if (!(c.budget > protect && cfg.evict_count <= c.budget - protect)) return expect::refuse;
    if (c.sel.stride < sh::max_evictions(sshape_.capacity, c.budget, cfg.evict_count)) return expect::refuse;
    for (std::int32_t l = 0; l < layers_; ++l)
      if (layer_refuses(l, c.rc)) return expect::refuse;
    const state_type s0 = layer(0);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t len = length(b);
      const std::int32_t pinned = c.pinned.empty() ? 0 : c.pinned[static_cast<std::size_t>(b)];
      if (pinned < 0 || pinned > len) return expect::refuse;
      if (len < c.budget) continue;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      // Every layer tracks every token, at the same positions in every head.
      for (std::int32_t l = 0; l < layers_; ++l) {
        const state_type s = layer(l);
        if (s.tracked[r] != len || s.next_position[r] != s0.next_position[r]) return expect::refuse;
        for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t)
            if (s.positions[slot(r, h, t)] != s0.positions[slot(r, 0, t)]) return expect::refuse;
      }
      const std::int32_t evict = len - c.budget + cfg.evict_count;
      std::int32_t free = 0;
      for (std::int32_t t = pinned; t < len; ++t)
        free += !is_protected(s0.positions[slot(r, 0, t)], s0.next_position[r], cfg);
      if (free < evict) return expect::refuse;
    }
    return expect::ok;
  }

  // After an accepted select: the oracle's choice (every unprotected,
  // unpinned slot sorted by (combined score, position)), counts, new
  // lengths, freed pages, engine slot ids; nothing else written.
  void check_select(const select_call& c, const snapshot& before) {
    const snapshot after = take();
    const bool in_probe = c.store == &probe_store_;
    FUZZ_CHECK(after.k == before.k && after.v == before.v && after.lengths == before.lengths &&
                   after.indptr == before.indptr && after.indices == before.indices && after.state == before.state &&
                   after.other == before.other && (in_probe ? after.sel == before.sel : after.probe == before.probe),
               "select wrote the cache, the lengths, the table, the model state or an argument it only reads");
    const std::vector<std::uint8_t>& old = in_probe ? before.probe : before.sel;
    std::vector<std::int32_t> want(c.store->size());
    std::memcpy(want.data(), old.data(), old.size());
    const auto at = [&](const std::int32_t* p) { return static_cast<std::size_t>(p - c.store->data()); };
    const selection_type& s = c.sel;
    const sh::settings& cfg = policy_.config;
    const std::int32_t m = cfg.evict_count;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const auto bu = static_cast<std::size_t>(b);
      const std::int32_t len = length_in(c.v, b);
      const std::int32_t pinned = c.pinned.empty() ? 0 : c.pinned[bu];
      const std::int32_t evict = len >= c.budget ? len - c.budget + m : 0;
      const std::int32_t kept = len - evict;
      if (evict > 0) FUZZ_CHECK(kept == sh::length_after_compress(len, c.budget, m), "select: length_after_compress");
      FUZZ_CHECK(s.counts[bu] == evict, "select: counts[b] != length - budget + m (or 0 below the budget)");
      FUZZ_CHECK(s.out.new_lengths[bu] == kept, "select: new_lengths[b]");
      want[at(s.counts.data()) + bu] = evict;
      want[at(s.out.new_lengths.data()) + bu] = kept;
      if (!s.out.freed_pages.empty()) {
        std::int32_t freed = 0;
        if constexpr (Paged)
          if (evict > 0) freed = pages_in(c.v, b) - pages_for(kept, c.v.page_size);
        FUZZ_CHECK(s.out.freed_pages[bu] == freed, "select: freed_pages[b]");
        want[at(s.out.freed_pages.data()) + bu] = freed;
      }
      if (evict == 0) continue;
      const std::int32_t r = c.rc.used[bu];
      const state_type s0 = layer(0);
      std::vector<ranked> cand;
      for (std::int32_t t = std::max(pinned, 0); t < len; ++t) {
        const std::int32_t position = s0.positions[slot(r, 0, t)];
        if (!is_protected(position, s0.next_position[r], cfg)) cand.push_back({combined(r, t), position, t});
      }
      FUZZ_CHECK(static_cast<std::int32_t>(cand.size()) >= evict, "select evicted more than the unprotected, unpinned tokens");
      std::sort(cand.begin(), cand.end(), [](const ranked& x, const ranked& y) {
        const int k = compare_keys(x, y);
        return k != 0 ? k < 0 : x.slot < y.slot;
      });
      const auto ue = static_cast<std::size_t>(evict);
      const bool tie = ue < cand.size() && compare_keys(cand[ue - 1], cand[ue]) == 0;
      const std::int32_t* got = s.slots.data() + bu * static_cast<std::size_t>(s.stride);
      std::vector<std::int32_t> chosen(got, got + evict);
      if (!tie) {
        std::vector<std::int32_t> oracle;
        for (std::size_t e = 0; e < ue; ++e) oracle.push_back(cand[e].slot);
        std::sort(oracle.begin(), oracle.end());
        if (chosen != oracle) {
          // Appended piece by piece: GCC 12 warns (-Wrestrict, a false
          // positive) on `" " + std::to_string(x)` inlined here.
          std::string what = "select: evicted slots differ from the oracle's (sequence ";
          what += std::to_string(b);
          what += "): got";
          for (std::int32_t x : chosen) (what += ' ') += std::to_string(x);
          what += ", want";
          for (std::int32_t x : oracle) (what += ' ') += std::to_string(x);
          fail(__FILE__, __LINE__, what);
        }
      } else {
        // Equal keys at the cut (equal positions: only garbage makes them):
        // any of the tied slots may go; ascending, distinct candidates,
        // with the oracle's keys.
        std::vector<ranked> gone;
        for (std::size_t k = 0; k < chosen.size(); ++k) {
          FUZZ_CHECK(k == 0 || chosen[k] > chosen[k - 1], "select (tied keys): slots not ascending");
          const auto it = std::find_if(cand.begin(), cand.end(), [&](const ranked& x) { return x.slot == chosen[k]; });
          FUZZ_CHECK(it != cand.end(), "select (tied keys): an evicted slot is protected or pinned");
          gone.push_back(*it);
        }
        std::sort(gone.begin(), gone.end(), [](const ranked& x, const ranked& y) { return compare_keys(x, y) < 0; });
        for (std::size_t e = 0; e < ue; ++e)
          FUZZ_CHECK(compare_keys(gone[e], cand[e]) == 0, "select (tied keys): evicted keys differ from the oracle's");
      }
      FUZZ_TRACE("  select b %d row %d length %d pinned %d evicts", b, r, len, pinned);
      for (std::int32_t t : chosen) FUZZ_TRACE(" %d", t);
      FUZZ_TRACE("%s\n", tie ? " (tied keys)" : "");
      for (std::int32_t k = 0; k < evict; ++k) {
        const std::int32_t t = chosen[static_cast<std::size_t>(k)];
        want[at(got) + static_cast<std::size_t>(k)] = t;
        if (!s.cache_slots.empty()) {
          std::int32_t id = t;
          if constexpr (Paged)
            id = c.v.indices[static_cast<std::size_t>(c.v.indptr[bu] + t / c.v.page_size)] * c.v.page_size + t % c.v.page_size;
          want[at(s.cache_slots.data()) + bu * static_cast<std::size_t>(s.stride) + static_cast<std::size_t>(k)] = id;
        }
      }
    }
    FUZZ_CHECK(*c.store == want,
               "select wrote a wrong engine slot id, or outside counts, slots[0, count), cache_slots[0, count), "
               "new_lengths and freed_pages");
  }

  // Moves one output span of a select call over something the call reads or
  // another output; returns whether the spans now share a byte (refused).
  bool overlap_output(select_call& c) {
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    sh::host_span<std::int32_t>* outs[] = {&c.sel.counts, &c.sel.slots, &c.sel.cache_slots, &c.sel.out.new_lengths,
                                           &c.sel.out.freed_pages};
    sh::host_span<std::int32_t>& o = *outs[src_.in(0, 4)];
    if (o.empty()) return false;
    const sh::host_span<std::int32_t> original = o;
    const std::size_t n = o.size();
    const auto over = [&](void* base, std::size_t bytes, std::size_t at_elem) -> bool {
      // Only where the moved span stays inside the array it is moved over.
      if (base == nullptr || 4 * (at_elem + n) > bytes) return false;
      o = {static_cast<std::int32_t*>(base) + at_elem, n};
      return true;
    };
    const auto target = src_.in(0, 7);
    damage_note_ = "output over target " + std::to_string(target);
    bool moved = false;
    const void* tp = nullptr;  // what it must not overlap
    std::size_t tn = 0;
    switch (target) {
      case 0: {  // the lengths the view reads: a copy inside a larger array
        scratch_.assign(3 * nb + 2 + n, -9);
        const std::vector<std::int32_t>& src = Paged ? last_page_len_ : lengths_;
        std::copy(src.begin(), src.end(), scratch_.begin() + static_cast<std::ptrdiff_t>(nb + 1));
        if constexpr (Paged)
          c.v.last_page_len = {scratch_.data() + nb + 1, nb};
        else
          c.v.lengths = {scratch_.data() + nb + 1, nb};
        tp = scratch_.data() + nb + 1, tn = 4 * nb;
        moved = over(scratch_.data(), 4 * scratch_.size(), static_cast<std::size_t>(src_.in(0, 2 * batch + 1)));
        break;
      }
      case 1:
        if constexpr (Paged) {
          tp = indptr_.data(), tn = 4 * indptr_.size();
          moved = over(indptr_.data(), tn, 0);
        }
        break;
      case 2:
        if constexpr (Paged) {
          tp = indices_.data(), tn = 4 * indices_.size();
          moved = over(indices_.data(), tn, 0);
        }
        break;
      case 3:
        if (c.rc.span.data() == rows_store_.data() && rows_store_.data() != nullptr) {
          tp = rows_store_.data(), tn = 4 * rows_store_.size();
          moved = over(rows_store_.data(), tn, 0);
        }
        break;
      case 4: {  // any layer of the model state
        const std::int32_t l = src_.i32(0, layers_ - 1);
        std::byte* base = state_buffer_.data + model_.layer_bytes * static_cast<std::size_t>(l);
        tp = state_buffer_.data, tn = state_buffer_.size;
        moved = over(base, state_buffer_.size - model_.layer_bytes * static_cast<std::size_t>(l),
                     static_cast<std::size_t>(src_.in(0, 64)));
        break;
      }
      case 5:
        tp = c.workspace.data(), tn = c.workspace.size();
        moved = over(c.workspace.data(), c.workspace.size(), 0);
        break;
      case 6:
        if (!c.pinned.empty()) {
          tp = pinned_store_.data(), tn = 4 * pinned_store_.size();
          moved = over(pinned_store_.data(), tn, 0);
        }
        break;
      default: {  // another output, inside the store
        sh::host_span<std::int32_t>& other = *outs[src_.in(0, 4)];
        if (&other == &o || other.empty()) break;
        tp = other.data(), tn = 4 * other.size();
        const auto from = static_cast<std::size_t>(other.data() - c.store->data()) +
                          static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(other.size()) - 1));
        moved = over(c.store->data(), 4 * c.store->size(), from);
        break;
      }
    }
    if (!moved) return false;
    if (overlap(o.data(), 4 * o.size(), tp, tn)) return true;
    o = original;  // next to it, not over it: the plain output (so check_select knows where it lies)
    return false;
  }

  // One corrupted select call, checked, its writes put back.
  void select_probe(const select_parts& parts) {
    select_call c = build_select(parts, probe_store_);
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    const std::size_t e = c.sel.slots.size();
    const auto which = src_.in(0, 12);
    damage_note_ = "select probe " + std::to_string(which);
    switch (which) {
      case 0:  // stride below max_evictions
        c.sel.stride = sh::max_evictions(sshape_.capacity, c.budget, policy_.config.evict_count) - 1 - src_.i32(0, 1);
        c.structural = true;
        break;
      case 1:
        c.sel.counts = src_.flag() ? sh::host_span<std::int32_t>{c.sel.counts.data(), nb - 1}
                                   : sh::host_span<std::int32_t>{nullptr, nb};
        c.structural = true;
        break;
      case 2:
        if (e > 0) {
          c.sel.slots = src_.flag() ? sh::host_span<std::int32_t>{c.sel.slots.data(), e - 1}
                                    : sh::host_span<std::int32_t>{nullptr, e};
          c.structural = true;
        }
        break;
      case 3:  // (one entry short of one entry is empty: no cache_slots, which is fine)
        if (e > 0) {
          c.sel.cache_slots = src_.flag() && !c.sel.cache_slots.empty()
                                  ? sh::host_span<std::int32_t>{c.sel.cache_slots.data(), e - 1}
                                  : sh::host_span<std::int32_t>{nullptr, e};
          c.structural = !c.sel.cache_slots.empty();
        }
        break;
      case 4:
        switch (src_.in(0, 2)) {
          case 0: c.sel.out.new_lengths = {c.sel.out.new_lengths.data(), nb - 1}; break;
          case 1: c.sel.out.new_lengths = {c.sel.out.new_lengths.data(), nb + 1}; break;  // the guard after it
          default: c.sel.out.new_lengths = {nullptr, nb}; break;
        }
        c.structural = true;
        break;
      case 5:
        if (src_.flag()) {
          c.sel.out.freed_pages = {nullptr, nb};
          c.structural = true;
        } else {
          // One entry short (contiguous or page size 1, batch 1: empty, which is fine).
          c.sel.out.freed_pages = {c.store->data() + c.store->size() - 1 - nb, nb - 1};
          bool required = false;
          if constexpr (Paged) required = c.v.page_size > 1;
          c.structural = required || nb != 1;
        }
        break;
      case 6: c.structural = overlap_output(c); break;
      case 7:
        switch (src_.in(0, 3)) {
          case 0:
            if (c.workspace.size() > 0) {
              const std::size_t need = sh::host::select_workspace_bytes(c.v, sshape_);
              if (need > 0) c.workspace = {c.workspace.data(), need - 1}, c.structural = true;
            }
            break;
          case 1: c.workspace = {nullptr, c.workspace.size()}, c.structural = true; break;
          case 2: c.workspace = {c.workspace.data() + 4, c.workspace.size()}, c.structural = true; break;
          default: {  // a workspace over something the call reads
            const std::size_t need = sh::host::select_workspace_bytes(c.v, sshape_);
            bool over = false;
            // Over pinned_prefix, which select reads again per sequence
            // after writing the workspace for the ones before (refused
            // since regress-tl-workspace-over-pinned).
            if (!c.pinned.empty() && src_.flag()) {
              pinned_store_.resize(pinned_store_.size() + c.workspace.size() / 4 + 2, 0);
              c.pinned = {pinned_store_.data(), nb};
              c.workspace = {reinterpret_cast<std::byte*>(pinned_store_.data()), c.workspace.size()};
              c.structural = need > 0;
              break;
            }
            if (workspace_over(c.v, c.rc, parts.view_layer, true, c.workspace, need, over)) {
              c.model = model_.for_batch(c.rc.span);
              c.structural = over;
            }
            break;
          }
        }
        break;
      case 8: {  // pinned_prefix
        if (pinned_store_.empty()) pinned_store_.assign(nb, 0);
        c.pinned = {pinned_store_.data(), pinned_store_.size()};
        const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
        switch (src_.in(0, 3)) {
          case 0: c.pinned = {nullptr, nb}, c.structural = true; break;
          case 1:
            pinned_store_.push_back(0);
            c.pinned = {pinned_store_.data(), src_.flag() ? nb + 1 : nb - 1};  // nb - 1 = 0: no pinned prefix
            c.structural = c.pinned.size() != 0;
            break;
          case 2: pinned_store_[at] = src_.flag() ? -1 : length(static_cast<std::int32_t>(at)) + 1; break;
          default: pinned_store_[at] = length(static_cast<std::int32_t>(at)); break;  // all pinned
        }
        break;
      }
      case 9: c.budget = garbage_int(src_); break;
      case 10:
        switch (src_.in(0, 2)) {
          case 0: c.model.layers = 0; break;
          case 1: c.model.layer_bytes += src_.flag() ? 256 : -256; break;
          default: c.model.first.step = nullptr; break;
        }
        c.structural = true;
        break;
      case 11: {
        bool shared_page = false;
        c.view_damage = corrupt(c.v, false, shared_page);
        if (shared_page) c.view_damage = expect::ok;  // select only reads the table: a page listed twice is fine
        break;
      }
      default:
        c.rc = pick_rows(true);
        c.model = model_.for_batch(c.rc.span);
        break;
    }
    const expect expected = select_expected(c);
    FUZZ_TRACE("  select probe %d: budget %d stride %d expected %d\n", int(which), c.budget, c.sel.stride, int(expected));
    const snapshot before = take();
    if (!guarded("host::select", expected, [&] { call_select(c); })) return;
    check_select(c, before);
    restore(before);
  }

  // ---- compact and forget ------------------------------------------------------
  struct apply_call {
    std::int32_t l = 0;
    view_type v{};
    call_rows rc;
    selection_type sel{};
    sh::host_span<std::byte> workspace;
    bool compact = true;
    expect view_damage = expect::ok;
    bool shared_page = false;
    bool structural = false;
  };

  apply_call build_apply(std::int32_t l, const selection_type& sel, bool compact) {
    apply_call c;
    c.l = l;
    c.v = make_view(l);
    c.rc = pick_rows(false);
    c.sel = sel;
    c.compact = compact;
    if (compact) {
      const std::size_t need = sh::host::compact_workspace_bytes(c.v);
      FUZZ_CHECK(need == (Paged ? static_cast<std::size_t>(num_pages_) : 0), "compact_workspace_bytes");
      ws_store_.assign(need / 8 + 2, 0x5A5A5A5A5A5A5A5Aull);
      if (need > 0 || src_.flag()) c.workspace = {reinterpret_cast<std::byte*>(ws_store_.data()), need};
    }
    return c;
  }
  static const char* apply_name(const apply_call& c) { return c.compact ? "host::compact" : "host::forget"; }
  void call_apply(const apply_call& c) {
    const state_type st = layer(c.l).for_batch(c.rc.span);
    if (c.compact)
      sh::host::compact(policy_, c.v, st, c.sel, c.workspace);
    else
      sh::host::forget(policy_, c.v, st, c.sel);
  }

  // What compact / forget must do with this selection, from the data.
  [[nodiscard]] expect apply_expected(const apply_call& c) const {
    if (!clean_settings_ || c.structural || c.rc.structural || c.view_damage == expect::refuse) return expect::refuse;
    if (c.view_damage == expect::unknown && !c.shared_page) return expect::unknown;
    if (layer_refuses(c.l, c.rc)) return expect::refuse;
    const selection_type& s = c.sel;
    const auto nb = static_cast<std::size_t>(shape_.batch);
    if (s.stride < 0) return expect::refuse;
    if (s.counts.size() != nb || s.counts.data() == nullptr) return expect::refuse;
    const std::size_t entries = nb * static_cast<std::size_t>(s.stride);
    if (s.slots.size() < entries || (entries != 0 && s.slots.data() == nullptr)) return expect::refuse;
    const state_type st = layer(c.l);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t count = s.counts[static_cast<std::size_t>(b)];
      const std::int32_t len = length(b);
      if (count < 0 || count > len || count > s.stride) return expect::refuse;
      if (count == 0) continue;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      if (st.tracked[r] != len) return expect::refuse;
      const std::int32_t* slots = s.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride);
      for (std::int32_t k = 0; k < count; ++k) {
        if (slots[k] < 0 || slots[k] >= len || (k > 0 && slots[k] <= slots[k - 1])) return expect::refuse;
        for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
          if (is_protected_at(c.l, r, h, slots[k])) return expect::refuse;
      }
    }
    if (c.compact) {
      const std::size_t need = Paged ? static_cast<std::size_t>(num_pages_) : 0;
      if (c.workspace.size() < need || (need != 0 && c.workspace.data() == nullptr)) return expect::refuse;
      if constexpr (Paged) {
        // A page compact writes (a slot in [first evicted, new length)) listed twice.
        const std::int32_t listed = c.v.indptr[nb];
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          const std::int32_t count = s.counts[static_cast<std::size_t>(b)];
          if (count == 0) continue;
          const std::int32_t first = s.slots[static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride)];
          const std::int32_t kept = length(b) - count;
          if (first >= kept) continue;
          for (std::int32_t p = first / page_size_; p <= (kept - 1) / page_size_; ++p) {
            const std::int32_t page = c.v.indices[static_cast<std::size_t>(c.v.indptr[static_cast<std::size_t>(b)] + p)];
            if (std::count(c.v.indices.begin(), c.v.indices.begin() + listed, page) > 1) return expect::refuse;
          }
        }
      }
    }
    return expect::ok;
  }

  // Where each kept slot's token comes from: compact's rule (fill_holes:
  // holes below the new length take the survivors above it, both
  // ascending; preserve_order: survivors shift down), forget's (the order
  // kept whatever the mode).
  static std::vector<std::int32_t> sources(const std::vector<char>& gone, std::int32_t len, std::int32_t kept,
                                           bool fill_holes) {
    std::vector<std::int32_t> source(static_cast<std::size_t>(kept));
    if (fill_holes) {
      std::int32_t from = kept;
      for (std::int32_t t = 0; t < kept; ++t) {
        if (!gone[static_cast<std::size_t>(t)]) {
          source[static_cast<std::size_t>(t)] = t;
          continue;
        }
        while (gone[static_cast<std::size_t>(from)]) ++from;
        source[static_cast<std::size_t>(t)] = from++;
      }
    } else {
      std::int32_t to = 0;
      for (std::int32_t t = 0; t < len; ++t)
        if (!gone[static_cast<std::size_t>(t)]) source[static_cast<std::size_t>(to++)] = t;
    }
    return source;
  }
  [[nodiscard]] std::vector<char> gone_of(const selection_type& s, std::int32_t b, std::int32_t len) const {
    std::vector<char> gone(static_cast<std::size_t>(len), 0);
    const std::int32_t* slots = s.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride);
    for (std::int32_t k = 0; k < s.counts[static_cast<std::size_t>(b)]; ++k) gone[static_cast<std::size_t>(slots[k])] = 1;
    return gone;
  }

  // After an accepted compact / forget of layer l: that layer's K, V
  // (compact) and state hold exactly the selection applied by the rule,
  // tracked = the new length; nothing else written.
  void check_apply(const apply_call& c, const snapshot& before) {
    const snapshot after = take();
    const char* fn = apply_name(c);
    FUZZ_CHECK(after.lengths == before.lengths && after.indptr == before.indptr && after.indices == before.indices &&
                   after.sel == before.sel && after.probe == before.probe && after.other == before.other,
               std::string(fn) + " wrote the lengths, the page table, the selection or an argument it only reads");
    const auto ul = static_cast<std::size_t>(c.l);
    for (std::size_t l = 0; l < kv_.size(); ++l)
      if (l != ul || !c.compact)
        FUZZ_CHECK(after.k[l] == before.k[l] && after.v[l] == before.v[l],
                   std::string(fn) + " wrote K or V of another layer (or forget wrote K or V)");
    std::vector<std::uint8_t> ek = before.k[ul], ev = before.v[ul], est = before.state;
    const state_type st = layer(c.l);
    const std::size_t row = 4 * static_cast<std::size_t>(shape_.head_dim);
    const bool fill = c.compact && policy_.config.compaction_mode == sh::compaction::fill_holes;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t count = c.sel.counts[static_cast<std::size_t>(b)];
      if (count == 0) continue;
      const std::int32_t len = length_in(c.v, b), kept = len - count;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      const std::vector<std::int32_t> source = sources(gone_of(c.sel, b, len), len, kept, fill);
      for (std::int32_t t = 0; t < kept; ++t) {
        const std::int32_t from = source[static_cast<std::size_t>(t)];
        for (std::int32_t h = 0; h < shape_.kv_heads; ++h) {
          if (c.compact)
            for (const bool key : {true, false}) {
              std::vector<std::uint8_t>& dst = key ? ek : ev;
              const std::vector<std::uint8_t>& src = key ? before.k[ul] : before.v[ul];
              std::memcpy(dst.data() + 4 * static_cast<std::size_t>(row_at(c.v, key, b, h, t)),
                          src.data() + 4 * static_cast<std::size_t>(row_at(c.v, key, b, h, from)), row);
            }
          const std::size_t to_i = slot(r, h, t), from_i = slot(r, h, from);
          for (const auto* base : {static_cast<const void*>(st.positions), static_cast<const void*>(st.scores),
                                   static_cast<const void*>(st.observed)}) {
            const std::size_t o = byte_offset(base);
            std::memcpy(est.data() + o + 4 * to_i, before.state.data() + o + 4 * from_i, 4);
          }
          for (std::int32_t w = 0; w < sshape_.ring_words; ++w) {
            const std::size_t to_o = byte_offset(&st.ring_of(r, h, t)[w]);
            const std::size_t from_o = byte_offset(&st.ring_of(r, h, from)[w]);
            std::memcpy(est.data() + to_o, before.state.data() + from_o, 4);
          }
        }
      }
      std::memcpy(est.data() + byte_offset(&st.tracked[r]), &kept, 4);
    }
    FUZZ_CHECK(after.k[ul] == ek, std::string(fn) + ": K differs from the selection applied by the compaction rule");
    FUZZ_CHECK(after.v[ul] == ev, std::string(fn) + ": V differs from the selection applied by the compaction rule");
    FUZZ_CHECK(after.state == est, std::string(fn) + ": the model state differs from the selection applied to layer " +
                                       std::to_string(c.l) + " (or another layer was written)");
  }

  // One corrupted compact / forget of layer l, checked, its writes put back.
  void apply_probe(std::int32_t l, const selection_type& clean, bool compact) {
    probe_store_ = sel_store_;
    apply_call c = build_apply(l, rebase(clean, sel_store_, probe_store_), compact);
    selection_type& s = c.sel;
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    const std::size_t entries = s.slots.size();
    const std::int32_t b = src_.i32(0, batch - 1);
    const auto bu = static_cast<std::size_t>(b);
    std::int32_t& count = s.counts[bu];
    std::int32_t* slots = s.slots.data() + bu * static_cast<std::size_t>(std::max(s.stride, 0));
    const std::int32_t len = length(b);
    std::int32_t* damaged_tracked = nullptr;
    std::int32_t tracked_was = 0;
    const auto which = src_.in(0, 14);
    damage_note_ = std::string(apply_name(c)) + " probe " + std::to_string(which);
    switch (which) {
      case 0: count = len + 1; break;
      case 1: count = s.stride + 1; break;
      case 2: count = -1; break;
      case 3:
        if (count > 0) slots[src_.in(0, count - 1)] = src_.flag() ? len : -1;
        break;
      case 4:  // not ascending: a slot twice, or two swapped
        if (count >= 2) {
          const auto k = src_.in(0, count - 2);
          if (src_.flag())
            slots[k + 1] = slots[k];
          else
            std::swap(slots[k], slots[k + 1]);
        }
        break;
      case 5: {  // a protected slot of this layer
        const std::int32_t r = rows_[bu];
        if (r < 0 || s.stride < 1) break;
        for (std::int32_t t = 0; t < len; ++t)
          if (is_protected_at(l, r, src_.i32(0, sshape_.kv_heads - 1), t)) {
            count = 1;
            slots[0] = t;
            break;
          }
        break;
      }
      case 6:
        s.counts = src_.flag() ? sh::host_span<std::int32_t>{s.counts.data(), nb - 1} : sh::host_span<std::int32_t>{nullptr, nb};
        c.structural = true;
        break;
      case 7:
        if (entries > 0) {
          s.slots = src_.flag() ? sh::host_span<std::int32_t>{s.slots.data(), entries - 1}
                                : sh::host_span<std::int32_t>{nullptr, entries};
          c.structural = true;
        }
        break;
      case 8: s.stride = -1, c.structural = true; break;
      case 9: {  // counts or slots over what the call writes
        const bool on_counts = src_.flag() || entries == 0;
        sh::host_span<std::int32_t>& span = on_counts ? s.counts : s.slots;
        const std::size_t bytes = 4 * span.size();
        const state_type st = layer(l);
        const std::size_t state_size = model_.layer_bytes;
        void* target = nullptr;
        std::size_t target_bytes = 0;
        switch (c.compact ? src_.in(0, 3) : 2) {
          case 0: target = kv_[static_cast<std::size_t>(l)].k.data(), target_bytes = 4 * kv_[static_cast<std::size_t>(l)].k.size(); break;
          case 1: target = kv_[static_cast<std::size_t>(l)].v.data(), target_bytes = 4 * kv_[static_cast<std::size_t>(l)].v.size(); break;
          case 2: target = st.step, target_bytes = state_size; break;
          default: target = c.workspace.data(), target_bytes = c.workspace.size(); break;
        }
        if (target != nullptr && bytes <= target_bytes) {
          span = {static_cast<std::int32_t*>(target) + src_.in(0, static_cast<std::int64_t>((target_bytes - bytes) / 4)), span.size()};
          c.structural = true;
        }
        break;
      }
      case 10:
        if (c.compact && Paged && src_.flag()) {
          c.workspace = src_.flag() ? sh::host_span<std::byte>{c.workspace.data(), c.workspace.size() - 1}
                                    : sh::host_span<std::byte>{nullptr, c.workspace.size()};
          c.structural = true;
        }
        else if (c.compact && Paged) {  // over something it reads (page marks written over the table, K, ...)
          bool over = false;
          if (workspace_over(c.v, c.rc, l, false, c.workspace, c.workspace.size(), over)) c.structural = over;
        }
        break;
      case 11: {  // the state no longer tracks a sequence that evicts (put back after)
        const std::int32_t r = rows_[bu];
        if (r < 0 || count == 0) break;
        damaged_tracked = &layer(l).tracked[r];
        tracked_was = *damaged_tracked;
        *damaged_tracked = len - src_.i32(1, 2);
        break;
      }
      case 12: c.view_damage = corrupt(c.v, c.compact, c.shared_page); break;
      case 13: c.rc = pick_rows(true); break;
      default:  // a smaller valid selection
        if (count > 0) count = src_.flag() ? 0 : count - 1;
        break;
    }
    const expect expected = apply_expected(c);
    FUZZ_TRACE("  %s probe %d on layer %d: expected %d\n", apply_name(c), int(which), l, int(expected));
    const snapshot before = take();
    if (guarded(apply_name(c), expected, [&] { call_apply(c); })) {
      check_apply(c, before);
      restore(before);
    }
    if (damaged_tracked != nullptr) *damaged_tracked = tracked_was;
  }

  // ---- evict: select, then compact or forget every layer, then the engine ------
  void evict() {
    select_parts parts;
    const sh::settings& cfg = policy_.config;
    parts.view_layer = src_.i32(0, layers_ - 1);
    std::int32_t max_len = 1;
    for (std::int32_t b = 0; b < shape_.batch; ++b) max_len = std::max(max_len, length(b));
    // Mostly a valid budget (above the protected tokens by m at least),
    // near the lengths so that it triggers; rarely any small one.
    const std::int64_t floor = std::clamp<std::int64_t>(std::int64_t{cfg.recent} + cfg.sinks + cfg.evict_count, 1, INT32_MAX);
    if (src_.rarely())
      parts.budget = src_.i32(1, max_len + 1);
    else
      parts.budget = src_.i32(floor, std::max<std::int64_t>(floor, max_len + 1));
    parts.extra_stride = src_.i32(0, 2);
    parts.ws_slack = src_.i32(0, 8);
    parts.cache_slots = src_.flag();
    parts.freed = Paged || src_.flag();
    switch (src_.in(0, 3)) {
      case 0: break;
      case 1:
        for (std::int32_t b = 0; b < shape_.batch; ++b) parts.pins.push_back(src_.i32(0, length(b)));
        break;
      case 2:
        for (std::int32_t b = 0; b < shape_.batch; ++b) parts.pins.push_back(std::min(length(b), src_.i32(0, 3)));
        break;
      default: parts.pins.assign(static_cast<std::size_t>(shape_.batch), 0); break;
    }
    const bool compact = Paged && page_size_ == 1 ? src_.flag() : src_.in(0, 2) != 0;
    if (src_.rarely()) select_probe(parts);

    select_call c = build_select(parts, sel_store_);
    damage_note_.clear();
    const expect expected = select_expected(c);
    FUZZ_TRACE("  select: budget %d stride %d pinned %d cache_slots %d expected %d, then %s\n", c.budget, c.sel.stride,
               int(!c.pinned.empty()), int(!c.sel.cache_slots.empty()), int(expected), compact ? "compact" : "forget");
    const snapshot before = take();
    if (!guarded("host::select", expected, [&] { call_select(c); })) return;
    check_select(c, before);
    apply_all(c.sel, compact);
  }

  // Applies an accepted selection to every layer (rarely the engine skips
  // one), then the engine's side: new lengths, or its own slot lists.
  void apply_all(const selection_type& sel, bool compact) {
    const std::int32_t skip = src_.rarely() ? src_.i32(0, layers_ - 1) : -1;
    const auto nb = static_cast<std::size_t>(shape_.batch);
    std::vector<std::vector<char>> gone(nb);
    std::vector<std::int32_t> new_lengths(nb);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      gone[static_cast<std::size_t>(b)] = gone_of(sel, b, length(b));
      new_lengths[static_cast<std::size_t>(b)] = sel.out.new_lengths[static_cast<std::size_t>(b)];
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (src_.rarely()) apply_probe(l, sel, compact);
      if (l == skip) {
        FUZZ_TRACE("  layer %d not %s\n", l, compact ? "compacted" : "forgotten");
        continue;
      }
      damage_note_.clear();
      const apply_call c = build_apply(l, sel, compact);
      const expect expected = apply_expected(c);
      FUZZ_CHECK(expected == expect::ok, "layers: the clean compact / forget after select is not valid");
      const snapshot before = take();
      guarded(apply_name(c), expected, [&] { call_apply(c); });
      check_apply(c, before);
    }
    // Every layer and head holds one token per slot, the same everywhere.
    if (skip < 0)
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t r = rows_[static_cast<std::size_t>(b)];
        if (r < 0 || sel.counts[static_cast<std::size_t>(b)] == 0) continue;
        for (std::int32_t l = 0; l < layers_; ++l)
          for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
            for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t)
              FUZZ_CHECK(layer(l).positions[slot(r, h, t)] == layer(0).positions[slot(r, 0, t)],
                         "after select + compact / forget, layers or heads hold different tokens at a slot");
      }
    // The engine's side.
    const bool fill = compact && policy_.config.compaction_mode == sh::compaction::fill_holes;
    if (compact) {
      for (std::int32_t l = 0; l < layers_; ++l) {
        if (l == skip) continue;  // its rows did not move: the first slots keep their tokens
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          auto& ids = ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)];
          const auto len = static_cast<std::int32_t>(ids.size());
          const std::vector<std::int32_t> source = sources(gone[static_cast<std::size_t>(b)], len, new_lengths[static_cast<std::size_t>(b)], fill);
          std::vector<std::int64_t> next;
          for (std::int32_t from : source) next.push_back(ids[static_cast<std::size_t>(from)]);
          ids = next;
        }
      }
      apply_lengths(new_lengths);
    } else {
      if (Paged && page_size_ == 1) {
        // A slot-list engine: free the selected cache slots (page ids at
        // page size 1) and drop them from each list, keeping the order.
        std::vector<std::vector<std::int32_t>> lists(nb);
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          const auto bu = static_cast<std::size_t>(b);
          const std::int32_t* slots = sel.slots.data() + bu * static_cast<std::size_t>(sel.stride);
          for (std::int32_t t = 0; t < length(b); ++t) {
            const std::int32_t page = indices_[static_cast<std::size_t>(indptr_[bu] + t)];
            if (!gone[bu][static_cast<std::size_t>(t)]) {
              lists[bu].push_back(page);
              continue;
            }
            free_pages_.push_back(page);
            if (!sel.cache_slots.empty()) {
              const auto k = static_cast<std::size_t>(std::find(slots, slots + sel.counts[bu], t) - slots);
              FUZZ_CHECK(sel.cache_slots[bu * static_cast<std::size_t>(sel.stride) + k] == page,
                         "select: cache_slots is not the engine's slot of the evicted token");
            }
          }
          FUZZ_CHECK(static_cast<std::int32_t>(lists[bu].size()) == new_lengths[bu], "forget: new length");
        }
        indices_.clear();
        for (std::size_t b = 0; b < nb; ++b) {
          indptr_[b] = static_cast<std::int32_t>(indices_.size());
          indices_.insert(indices_.end(), lists[b].begin(), lists[b].end());
          last_page_len_[b] = lists[b].empty() ? 0 : 1;
        }
        indptr_.back() = static_cast<std::int32_t>(indices_.size());
      } else {
        // The engine closes the holes itself, keeping the order, in every
        // layer (forget does the same to the state).
        for (std::int32_t l = 0; l < layers_; ++l) {
          const view_type v = make_view(l);
          layer_kv& kv = kv_[static_cast<std::size_t>(l)];
          for (std::int32_t b = 0; b < shape_.batch; ++b) {
            const std::vector<std::int32_t> source =
                sources(gone[static_cast<std::size_t>(b)], length(b), new_lengths[static_cast<std::size_t>(b)], false);
            for (std::size_t t = 0; t < source.size(); ++t)
              for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
                for (const bool key : {true, false}) {
                  std::vector<float>& buf = key ? kv.k : kv.v;
                  std::memmove(buf.data() + row_at(v, key, b, h, static_cast<std::int32_t>(t)),
                               buf.data() + row_at(v, key, b, h, source[t]), 4 * static_cast<std::size_t>(shape_.head_dim));
                }
          }
        }
      }
      for (auto& layer_ids : ids_)
        for (std::size_t b = 0; b < nb; ++b) {
          std::vector<std::int64_t> next;
          for (std::size_t t = 0; t < layer_ids[b].size(); ++t)
            if (!gone[b][t]) next.push_back(layer_ids[b][t]);
          layer_ids[b] = next;
        }
      if (!(Paged && page_size_ == 1)) apply_lengths(new_lengths);
    }
    check_tokens("after select and compact / forget");
  }
};

template <class Policy>
void run_layers(byte_source& src, bool paged) {
  if (paged) {
    layers_case<Policy, true>(src).run();
  } else {
    layers_case<Policy, false>(src).run();
  }
}

template <class Policy>
void run_policy(byte_source& src, bool paged) {
  if (paged) {
    fuzz_case<Policy, true>(src).run();
  } else {
    fuzz_case<Policy, false>(src).run();
  }
}

// Quantized caches: a first byte in [161, 177] (quant_case).
#include "fuzz_quantized.hpp"

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source src(data, size);
  // Token-level eviction: a first byte in [97, 118] or [198, 217], two
  // ranges no input of the committed corpus starts with (so every one of
  // them keeps its decoding). The next byte picks the policy and
  // granularity, the one after it paged or not.
  if (size > 0 && ((data[0] >= 97 && data[0] <= 118) || (data[0] >= 198 && data[0] <= 217))) {
    src.byte();
    const int mode = static_cast<int>(src.in(0, 7));
    const bool paged = src.flag();
    FUZZ_TRACE("token-level mode %d paged %d\n", mode, int(paged));
    switch (mode) {
      // shared_heads: compress evicts one set of slots per sequence for all heads.
      case 0: run_policy<sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::mean_score>>>(src, paged); break;
      case 1: run_policy<sh::with_granularity<sh::h2o_policy, sh::shared_heads<sh::max_score>>>(src, paged); break;
      // shared_layers: select once for the model, compact or forget every layer.
      case 2:
      case 3:
        run_layers<sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<sh::mean_score, sh::mean_score>>>(src, paged);
        break;
      case 4:
      case 5: run_layers<sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score, sh::mean_score>>>(src, paged); break;
      case 6:
        run_layers<sh::with_granularity<
            sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>,
            sh::shared_layers<sh::mean_score, sh::max_score>>>(src, paged);
        break;
      default: run_layers<sh::with_granularity<sh::key_norm_policy, sh::shared_layers<sh::max_score, sh::max_score>>>(src, paged); break;
    }
    return 0;
  }
  // Quantized caches (fuzz_quantized.hpp): a first byte in [161, 177],
  // another range no committed input started with. The next byte picks the
  // policy, the one after it paged or not.
  if (size > 0 && data[0] >= 161 && data[0] <= 177) {
    src.byte();
    const int policy = static_cast<int>(src.in(0, 7));
    const bool paged = src.flag();
    FUZZ_TRACE("quantized mode: policy %d paged %d\n", policy, int(paged));
    switch (policy) {
      case 0: run_quantized<sh::scissorhands_policy>(src, paged); break;
      case 1: run_quantized<sh::h2o_policy>(src, paged); break;
      case 2: run_quantized<sh::key_norm_policy>(src, paged); break;
      case 3: run_quantized<sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>(src, paged); break;
      case 4: run_quantized<sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::mean_score>>>(src, paged); break;
      case 5: run_quantized<sh::streaming_policy>(src, paged); break;
      case 6:
        run_quantized<sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(src, paged);
        break;
      default: run_quantized<sh::key_norm_policy>(src, paged); break;
    }
    return 0;
  }
  const int policy = static_cast<int>(src.in(0, 7));
  const bool paged = src.flag();
  switch (policy) {
    case 0: run_policy<sh::scissorhands_policy>(src, paged); break;
    case 1: run_policy<sh::h2o_policy>(src, paged); break;
    case 2: run_policy<sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>(src, paged); break;
    case 3: run_policy<sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(src, paged); break;
    case 4: run_policy<sh::eviction_policy<sh::attention_mass, sh::exponential_decay>>(src, paged); break;
    case 5: run_policy<sh::streaming_policy>(src, paged); break;
    case 6: run_policy<sh::random_policy>(src, paged); break;
    default: run_policy<sh::key_norm_policy>(src, paged); break;
  }
  return 0;
}
