// libFuzzer harness for the host backend. The input bytes decode into a
// configuration (policy, shape, layout, paged or not, settings) and a short
// program of steps (append tokens, observe, admit, compress, reset, poke
// garbage into the state or the lengths). After every library call the
// harness checks one of two outcomes:
//  - a scissorhands::invalid_argument, and every byte the caller owns (cache,
//    lengths, page table, state, workspace, freed_pages) equal to a copy
//    taken before the call;
//  - success, and every invariant: cache untouched by observe; positions,
//    counts and lengths as specified; the evicted set equal to a brute-force
//    oracle's; kept K/V rows and their state bit-identical to the originals
//    and in the slots the compaction mode puts them; no other byte written.
// When the harness built a call from clean parts it also knows the call is
// valid, and a refusal is a bug too. Anything else (another exception, a
// sanitizer report, a crash) is a bug.
//
// Built two ways: with clang's -fsanitize=fuzzer (scripts/stages/20-fuzz.sh)
// and, with any compiler, linked with replay_main.cpp to re-run the corpus as
// a CTest test.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
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

// ---------------------------------------------------------------------------
// Input decoding. Past the end every read is 0, and 0 always decodes to the
// plain, valid choice, so truncated inputs stay meaningful.
class byte_source {
 public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool exhausted() const { return pos_ >= size_; }
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

// ---------------------------------------------------------------------------
// Layouts, computed here independently of kv_layout.hpp.
struct strides3 {
  std::int64_t outer = 0;  // sequence (contiguous) or page (paged)
  std::int64_t head = 0;
  std::int64_t token = 0;
};

// Largest element index + 1; negative strides count as 0 (the library must
// refuse them before it reads anything). Saturates far above any allocation.
std::int64_t extent_of(const strides3& s, std::int64_t e0, std::int64_t e1, std::int64_t e2, std::int64_t row) {
  if (e0 <= 0 || e1 <= 0 || e2 <= 0 || row <= 0) return 0;
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
std::int32_t paged_length(std::int32_t pages, std::int32_t page_size, std::int32_t last) {
  if (pages <= 0) return 0;
  const std::int64_t n = (std::int64_t{pages} - 1) * page_size + last;
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(n, INT32_MIN, INT32_MAX));
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
  const std::int32_t p = v.indptr[static_cast<std::size_t>(b) + 1] - v.indptr[static_cast<std::size_t>(b)];
  return paged_length(p, v.page_size, v.last_page_len[static_cast<std::size_t>(b)]);
}

// ---------------------------------------------------------------------------
// The eviction order, written from the specification (docs/design.md): lower
// eviction score first (NaN above +inf, -0 = +0), then smaller position.
float eviction_score_of(float score, float observed, const sh::settings& s) {
  return (s.normalize && observed > 0.0f) ? score / observed : score;
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

// What the harness knows about a call before making it.
enum class expect { ok, unknown, refuse };

// ---------------------------------------------------------------------------
// One fuzz case.
template <class Policy, bool Paged>
class fuzz_case {
  using cache_model = std::conditional_t<Paged, paged_cache, contiguous_cache>;
  using view_type =
      std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using Obs = typename Policy::observation;
  using Hist = typename Policy::history;
  static constexpr bool attention = Obs::needs_attention;
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
  bool clean_state_ = true;     // the state holds only what the library wrote
  bool clean_cache_ = true;     // lengths / last_page_len as the harness set them
  bool clean_shape_ = true;     // the state was made for this cache and policy
  sh::state_shape state_shape_{};
  aligned_buffer state_buffer_;
  sh::eviction_state<memory_space::host> state_{};

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

    // The state, usually for exactly this cache and policy.
    state_shape_ = sh::state_shape_for(policy_, make_view());
    FUZZ_CHECK(state_shape_.ring_words == policy_.ring_words(), "state_shape_for: ring_words");
    if (src_.rarely()) {
      clean_shape_ = false;
      switch (src_.in(0, 3)) {
        case 0: state_shape_.batch += src_.flag() ? 1 : -1; break;
        case 1: state_shape_.kv_heads += src_.flag() ? 1 : -1; break;
        case 2: state_shape_.capacity -= 1; break;
        default:  // (a garbage window can put ring_words at either int32 end)
          state_shape_.ring_words += (src_.flag() && state_shape_.ring_words < INT32_MAX) ||
                                             state_shape_.ring_words == INT32_MIN
                                         ? 1
                                         : -1;
          break;
      }
    }
    std::size_t bytes = 0;
    try {
      bytes = sh::state_bytes(state_shape_);
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(e.function() == "state_bytes", "state_bytes: error names another function");
      const double need = static_cast<double>(state_shape_.batch) * state_shape_.kv_heads * state_shape_.capacity *
                          (12.0 + 4.0 * state_shape_.ring_words);
      FUZZ_CHECK(!clean_settings_ || !clean_shape_ || need > 1e15, "state_bytes refused a valid shape");
      return false;
    }
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

    append_tokens(/*initial=*/true);
    return true;
  }

  void decode_settings() {
    sh::settings& c = policy_.config;
    c.window = src_.i32(1, 70);
    c.recent = src_.i32(0, 4);
    c.sinks = src_.i32(0, 3);
    c.evict_count = src_.i32(1, 6);
    constexpr float alphas[] = {1.0f, 0.5f, 2.0f, 0.01f};
    constexpr float decays[] = {0.95f, 0.5f, 1.0f, 0.01f};
    c.alpha = alphas[src_.in(0, 3)];
    c.decay = decays[src_.in(0, 3)];
    c.normalize = src_.flag();
    c.compaction_mode = src_.flag() ? sh::compaction::preserve_order : sh::compaction::fill_holes;
    c.seed = src_.word();
    if (src_.rarely()) {
      switch (src_.in(0, 6)) {
        case 0: c.window = garbage_int(src_); break;
        case 1: c.recent = garbage_int(src_); break;
        case 2: c.sinks = garbage_int(src_); break;
        case 3: c.evict_count = garbage_int(src_); break;
        case 4: c.alpha = special_value(src_); break;
        case 5: c.decay = special_value(src_); break;
        default: c.compaction_mode = static_cast<sh::compaction>(garbage_int(src_)); break;
      }
    }
    clean_settings_ = settings_valid();
  }

  [[nodiscard]] bool settings_valid() const {
    const sh::settings& c = policy_.config;
    bool ok = c.recent >= 0 && c.sinks >= 0 && c.evict_count >= 1 &&
              (c.compaction_mode == sh::compaction::fill_holes || c.compaction_mode == sh::compaction::preserve_order);
    if (std::is_same_v<Hist, sh::sliding_window>) ok = ok && c.window >= 1;
    if (std::is_same_v<Obs, sh::threshold_indicator>) ok = ok && std::isfinite(c.alpha) && c.alpha > 0.0f;
    if (std::is_same_v<Hist, sh::exponential_decay>) ok = ok && c.decay > 0.0f && c.decay <= 1.0f;
    return ok;
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
      v.last_page_len = sh::host_span<std::int32_t>(cache_.last_page_len.data(), cache_.last_page_len.size());
      v.page_size = cache_.page_size;
      v.num_pages = cache_.num_pages;
      v.max_pages_per_sequence = cache_.max_pages;
    } else {
      v.k = sh::host_span<float>(cache_.k.data(), cache_.k.size());
      v.v = sh::host_span<float>(cache_.v.data(), cache_.v.size());
      v.k_layout = {cache_.kl.outer, cache_.kl.head, cache_.kl.token};
      v.v_layout = {cache_.vl.outer, cache_.vl.head, cache_.vl.token};
      v.lengths = sh::host_span<std::int32_t>(cache_.lengths.data(), cache_.lengths.size());
      v.capacity = cache_.capacity;
    }
    v.batch = s.batch;
    v.kv_heads = s.kv_heads;
    v.head_dim = s.head_dim;
    return v;
  }

  // Scratch the corruptions point spans at; kept alive for the call.
  std::vector<std::int32_t> scratch_i_;
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
        case 5: v.max_pages_per_sequence = src_.flag() ? 0 : INT32_MAX; return refuse;
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
          // the pages it rewrites itself (shares_rewritten_page).
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
          v.last_page_len[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
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
          v.lengths[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
          clean_cache_ = false;
          return expect::ok;
        case 12: v.v_layout.token_stride = 1; return unknown;
        case 13: v.capacity = INT32_MAX; return refuse;
        default: v.k = {v.k.data(), 0}; return refuse;
      }
    }
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
      while (n-- > 0) {
        const std::int32_t len = cache_.length(b);
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
  }

  // ---- snapshots -----------------------------------------------------------
  struct snapshot {
    std::vector<std::uint8_t> k, v, lengths, indptr, indices, state, freed;
    bool operator==(const snapshot&) const = default;
  };

  snapshot take(const view_type& view, sh::host_span<std::byte> workspace, sh::host_span<std::int32_t> freed) const {
    snapshot s;
    s.k = bytes_of(cache_.k.data(), cache_.k.size());
    s.v = bytes_of(cache_.v.data(), cache_.v.size());
    if constexpr (Paged) {
      s.lengths = bytes_of(cache_.last_page_len.data(), cache_.last_page_len.size());
      s.indptr = bytes_of(view.indptr.data(), view.indptr.data() ? view.indptr.size() : 0);
      s.indices = bytes_of(view.indices.data(), view.indices.data() ? view.indices.size() : 0);
    } else {
      s.lengths = bytes_of(cache_.lengths.data(), cache_.lengths.size());
      (void)view;
    }
    s.state = bytes_of(state_buffer_.data, state_buffer_.size);
    (void)workspace;  // scratch: unspecified after any call
    s.freed = bytes_of(freed.data(), freed.data() ? freed.size() : 0);
    return s;
  }

  // Runs `call`. On refusal: the error names `fn`, and nothing changed.
  // Returns whether the call succeeded.
  template <class Call>
  bool guarded(const char* fn, const view_type& view, sh::host_span<std::byte> workspace,
               sh::host_span<std::int32_t> freed, expect expected, Call&& call) {
    const snapshot before = take(view, workspace, freed);
    try {
      call();
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(e.function() == fn, std::string("error names function '") + e.function() + "', not " + fn);
      FUZZ_CHECK(!e.argument().empty(), "error names no argument");
      FUZZ_CHECK(take(view, workspace, freed) == before, std::string(fn) + " wrote before refusing: " + e.what());
      FUZZ_CHECK(expected != expect::ok, std::string(fn) + " refused a valid call: " + e.what());
      damage_note_.clear();
      return false;
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string(fn) + " threw something else than scissorhands::invalid_argument: " + e.what());
    }
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
  [[nodiscard]] std::size_t slot(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return (static_cast<std::size_t>(b) * static_cast<std::size_t>(state_shape_.kv_heads) + static_cast<std::size_t>(h)) *
               static_cast<std::size_t>(state_shape_.capacity) +
           static_cast<std::size_t>(t);
  }
  [[nodiscard]] std::size_t byte_offset(const void* p) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - state_buffer_.data);
  }

  // Every valid-state condition observe/compress rely on, checked here so a
  // refusal of a call built from clean parts is known to be a bug.
  [[nodiscard]] bool state_in_range(const view_type& v) const {
    if (!clean_state_ || !clean_shape_ || !clean_cache_ || !clean_layout_ || !clean_settings_) return false;
    for (std::int32_t b = 0; b < cache_.shape.batch; ++b) {
      const std::int32_t len = length_in(v, b);
      const std::int32_t tracked = state_.tracked[b];
      if (tracked < 0 || tracked > len || state_.next_position[b] < 0) return false;
      if (std::int64_t{state_.next_position[b]} + (len - tracked) > INT32_MAX) return false;
    }
    return true;
  }

  // ---- operations ----------------------------------------------------------
  bool step() {
    switch (src_.in(0, 9)) {
      case 0:
      case 1: append_tokens(false); return true;
      case 2:
      case 3: return observe_probabilities();
      case 4: return observe_queries();
      case 5: return admit();
      case 6:
      case 7: return compress();
      case 8: reset(); return true;
      default: poke(); return true;
    }
  }

  void reset() {
    const std::int32_t b = src_.flag() ? src_.i32(0, cache_.shape.batch - 1) : garbage_int(src_);
    const std::int32_t start = src_.flag() ? src_.i32(0, 1000) : garbage_int(src_);
    const bool valid = b >= 0 && b < state_shape_.batch && start >= 0;
    const view_type v = make_view();
    if (!guarded("host::reset_sequence", v, {}, {}, valid ? expect::ok : expect::refuse,
                 [&] { sh::host::reset_sequence(state_, b, start); }))
      return;
    FUZZ_CHECK(state_.tracked[b] == 0 && state_.next_position[b] == start && state_.step[b] == 0,
               "reset_sequence: sequence not reset");
    if (start > INT32_MAX - 4096) clean_state_ = false;  // later admissions may run out of positions
    if (src_.rarely()) {
      sh::host::reset_state(state_);
      clean_state_ = true;
      for (std::int32_t i = 0; i < state_shape_.batch; ++i)
        FUZZ_CHECK(state_.tracked[i] == 0 && state_.next_position[i] == 0 && state_.step[i] == 0, "reset_state");
    }
  }

  // Garbage in the state: what a caller that scribbles over it produces.
  void poke() {
    clean_state_ = false;
    const std::int32_t b = src_.i32(0, state_shape_.batch - 1);
    const std::int32_t h = src_.i32(0, state_shape_.kv_heads - 1);
    const std::int32_t t = src_.i32(0, state_shape_.capacity - 1);
    const std::size_t i = slot(b, h, t);
    switch (src_.in(0, 6)) {
      case 0: state_.tracked[b] = garbage_int(src_); break;
      case 1: state_.next_position[b] = garbage_int(src_); break;
      case 2: state_.step[b] = src_.flag() ? -std::int64_t{src_.word()} - 1 : INT64_MAX - src_.in(0, 3); break;
      case 3: state_.positions[i] = src_.flag() ? garbage_int(src_) : state_.positions[slot(b, h, src_.i32(0, t))]; break;
      case 4: state_.scores[i] = special_value(src_); break;
      case 5: state_.observed[i] = special_value(src_); break;
      default:
        if (state_shape_.ring_words > 0)
          state_.ring[i * static_cast<std::size_t>(state_shape_.ring_words)] = src_.word();
        break;
    }
  }

  // What observe must do beyond scoring: admit, count, leave the cache alone.
  void check_after_observe(const view_type& v, const snapshot& before, std::int32_t q_len) {
    const snapshot after = take(v, {}, {});
    FUZZ_CHECK(after.k == before.k && after.v == before.v, "observe wrote to the cache");
    FUZZ_CHECK(after.lengths == before.lengths && after.indptr == before.indptr && after.indices == before.indices,
               "observe changed lengths or the page table");
    const auto old_i32 = [&](const std::int32_t* p, std::size_t i) {
      std::int32_t x;
      std::memcpy(&x, before.state.data() + byte_offset(p) + i * 4, 4);
      return x;
    };
    const auto old_i64 = [&](const std::int64_t* p, std::size_t i) {
      std::int64_t x;
      std::memcpy(&x, before.state.data() + byte_offset(p) + i * 8, 8);
      return x;
    };
    const auto old_f32 = [&](const float* p, std::size_t i) {
      float x;
      std::memcpy(&x, before.state.data() + byte_offset(p) + i * 4, 4);
      return x;
    };
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const auto bu = static_cast<std::size_t>(b);
      const std::int32_t len = length_in(v, b);
      const std::int32_t tracked = old_i32(state_.tracked, bu);
      const std::int32_t next = old_i32(state_.next_position, bu);
      FUZZ_CHECK(state_.tracked[b] == len, "observe: tracked != length");
      FUZZ_CHECK(state_.next_position[b] == next + (len - tracked), "observe: next_position");
      FUZZ_CHECK(state_.step[b] == old_i64(state_.step, bu) + q_len, "observe: step");
      for (std::int32_t h = 0; h < v.kv_heads; ++h)
        for (std::int32_t t = 0; t < state_shape_.capacity; ++t) {
          const std::size_t i = slot(b, h, t);
          if (t < tracked) {
            FUZZ_CHECK(state_.positions[i] == old_i32(state_.positions, i), "observe moved an old position");
          } else if (t < len) {
            FUZZ_CHECK(state_.positions[i] == next + (t - tracked), "observe: new token's position");
          } else {
            FUZZ_CHECK(state_.positions[i] == old_i32(state_.positions, i) &&
                           std::memcmp(&state_.scores[i], before.state.data() + byte_offset(state_.scores + i), 4) == 0,
                       "observe wrote a slot past the length");
            continue;
          }
          const bool fresh = t >= tracked;
          const float old_observed = fresh ? 0.0f : old_f32(state_.observed, i);
          // Steps that saw slot t: queries j with t < len - q_len + j + 1.
          const std::int32_t seen = attention ? std::clamp(len - t, 0, q_len) : 0;
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
          if constexpr (!attention) {
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
              FUZZ_CHECK(std::memcmp(&state_.scores[i], &expect, 4) == 0 || (std::isnan(expect) && std::isnan(state_.scores[i])),
                         "static score of a new token");
            } else {
              FUZZ_CHECK(std::memcmp(&state_.scores[i], before.state.data() + byte_offset(state_.scores + i), 4) == 0,
                         "a static score changed after admission");
            }
          }
        }
    }
  }

  // H2O's score after one observe, recomputed in the documented order.
  void check_h2o_scores(const view_type& v, const snapshot& before, const sh::probability_view<memory_space::host>& p) {
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      const std::int32_t group = p.q_heads / v.kv_heads;
      for (std::int32_t b = 0; b < v.batch; ++b) {
        const std::int32_t len = length_in(v, b);
        std::int32_t tracked;
        std::memcpy(&tracked, before.state.data() + byte_offset(state_.tracked + b), 4);
        for (std::int32_t h = 0; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t) {
            const std::size_t i = slot(b, h, t);
            float score = 0.0f;
            if (t < tracked) std::memcpy(&score, before.state.data() + byte_offset(state_.scores + i), 4);
            for (std::int32_t j = 0; j < p.q_len; ++j) {
              if (t >= len - p.q_len + j + 1) continue;
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

  // Query heads per KV head and q_len, usually valid.
  struct query_shape {
    std::int32_t q_heads, q_len, min_len, max_len;
    bool valid;
  };
  query_shape pick_query_shape(const view_type& v) {
    const common_shape& s = cache_.shape;
    std::int32_t min_len = INT32_MAX, max_len = 0;
    for (std::int32_t b = 0; b < s.batch; ++b) {
      min_len = std::min(min_len, length_in(v, b));
      max_len = std::max(max_len, length_in(v, b));
    }
    query_shape q{s.kv_heads * src_.i32(1, 4), std::max(1, std::min(min_len, src_.i32(1, 3))), min_len, max_len, true};
    if (src_.rarely()) {
      switch (src_.in(0, 3)) {
        case 0: q.q_heads = s.kv_heads * 2 + 1; break;  // no whole group when kv_heads > 1
        case 1: q.q_len = min_len < INT32_MAX ? min_len + 1 : min_len; break;
        case 2: q.q_len = src_.flag() ? 0 : -3; break;
        default: q.q_heads = s.kv_heads * (sh::host::max_group_size + 1); break;
      }
    }
    q.valid = q.q_heads > 0 && q.q_heads % s.kv_heads == 0 && q.q_heads / s.kv_heads <= sh::host::max_group_size &&
              q.q_len >= 1 && q.q_len <= min_len;
    return q;
  }

  // The expectation of a call on the model's own view, from the parts it is
  // made of: `extra_ok` for the call's own arguments.
  expect expectation(expect damage, const view_type& v, bool extra_ok) const {
    if (damage == expect::refuse) return expect::refuse;
    if (damage == expect::unknown || !state_in_range(v)) return expect::unknown;
    return extra_ok ? expect::ok : expect::unknown;
  }

  bool observe_probabilities() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_shape q = pick_query_shape(mv);
    // Probabilities: each visible row a normalised distribution; columns the
    // query cannot see hold NaN, which the library must neither read nor check.
    const std::int32_t columns = std::clamp(q.max_len, 1, 1 << 20);
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 1, 64);
    std::int64_t query_stride = columns + src_.in(0, 2);
    std::int64_t head_stride = query_stride * queries + src_.in(0, 2);
    std::int64_t sequence_stride = head_stride * heads + src_.in(0, 2);
    bool values_ok = true, buffer_ok = true, overlapping = false;
    if (src_.rarely()) {
      switch (src_.in(0, 2)) {
        case 0:  // rows shared between sequences and queries: reads may overlap
          query_stride = 0;
          head_stride = columns;
          sequence_stride = 0;
          overlapping = true;
          break;
        case 1: head_stride = -1; buffer_ok = false; break;
        default: sequence_stride = std::int64_t{1} << 40; buffer_ok = s.batch == 1; break;
      }
    }
    const std::int64_t reach = extent_of({sequence_stride, head_stride, query_stride}, s.batch, heads, queries, columns);
    std::int64_t alloc = std::min<std::int64_t>(reach, std::int64_t{1} << 22);
    if (reach > alloc) buffer_ok = false;
    if (src_.rarely()) {
      alloc = std::max<std::int64_t>(alloc - 1, 0);
      buffer_ok = false;
    }
    std::vector<float> probs(static_cast<std::size_t>(alloc), overlapping ? 1.0f / static_cast<float>(columns) : nan_f);
    const bool fill = buffer_ok && q.valid && clean_cache_;
    if (fill && !overlapping) {
      for (std::int32_t b = 0; b < s.batch; ++b)
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < q.q_len; ++j) {
            float* row = probs.data() + b * sequence_stride + qh * head_stride + j * query_stride;
            const std::int32_t visible = length_in(mv, b) - q.q_len + j + 1;
            if (visible <= 0 || visible > columns) continue;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) sum += (row[t] = static_cast<float>(gen_.next() % 64 + 1));
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
            if (src_.rarely()) row[0] = 1.0f;  // a spike: still in [0, 1]
          }
    }
    if (fill && src_.rarely()) {  // an out-of-range value in a visible column
      const std::int32_t b = src_.i32(0, s.batch - 1);
      float* row = probs.data() + b * sequence_stride + src_.i32(0, q.q_heads - 1) * head_stride +
                   (q.q_len - 1) * query_stride;
      const std::int32_t visible = length_in(mv, b);
      if (visible > 0 && visible <= columns) {
        const float x = special_value(src_);
        row[src_.i32(0, visible - 1)] = x;
        values_ok = !(x < 0.0f || x > 1.001f || std::isnan(x));
      }
    }
    sh::probability_view<memory_space::host> p{sh::host_span<const float>(probs.data(), probs.size()), q.q_heads,
                                               q.q_len, sequence_stride, head_stride, query_stride};
    bool null_data = false;
    if (src_.rarely()) {
      p.data = {nullptr, probs.size()};
      null_data = true;
    }
    expect expected = expectation(damage, v, !attention || (q.valid && buffer_ok && values_ok && !null_data));
    // Refusals the harness is sure of, whatever else is wrong.
    if (attention && damage == expect::ok && state_in_range(v) && q.valid && (null_data || !values_ok))
      expected = expect::refuse;
    if (attention && damage == expect::ok && state_in_range(v) && !q.valid && std::int64_t{q.q_len} != std::int64_t{q.min_len} + 1)
      expected = expect::refuse;
    if (std::getenv("FUZZ_DEBUG"))
      std::fprintf(stderr, "observe_probabilities: q_heads %d q_len %d min %d max %d valid %d null %d values %d buffer %d overlap %d strides %lld %lld %lld size %zu damage %d attention %d\n",
                   q.q_heads, q.q_len, q.min_len, q.max_len, q.valid, null_data, values_ok, buffer_ok, overlapping,
                   (long long)sequence_stride, (long long)head_stride, (long long)query_stride, probs.size(), int(damage), int(attention));
    const snapshot before = take(v, {}, {});
    if (!guarded("host::observe_probabilities", v, {}, {}, expected,
                 [&] { sh::host::observe_probabilities(policy_, v, state_, p); }))
      return true;
    check_after_observe(v, before, attention ? q.q_len : 0);
    if (attention) check_h2o_scores(v, before, p);
    return damage == expect::ok;  // the model no longer describes a damaged view
  }

  bool observe_queries() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_shape q = pick_query_shape(mv);
    std::int32_t head_dim = s.head_dim;
    if (src_.rarely()) head_dim += 1;
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 1, 64);
    const std::int64_t reach = std::int64_t{s.batch} * queries * heads * head_dim;
    std::vector<float> qs(static_cast<std::size_t>(reach));
    for (auto& x : qs) x = gen_.uniform(-3.0f, 3.0f);
    auto qv = sh::query_view<float, memory_space::host>::dense({qs.data(), qs.size()}, q.q_heads, q.q_len, head_dim);
    bool ok = q.valid && head_dim == s.head_dim;
    if (src_.rarely()) {
      qv.data = {qs.data(), qs.size() - 1};
      ok = false;
    }
    float scale = 0.0f;
    if (src_.flag()) scale = src_.flag() ? 0.5f : special_value(src_);
    ok = ok && std::isfinite(scale) && scale >= 0.0f;
    // lse: absent, exact (computed here, natural or base 2), or garbage.
    std::vector<float> lse_values;
    sh::lse_view<memory_space::host> lse{};
    const int lse_kind = static_cast<int>(src_.in(0, 2));
    const bool exact_lse_possible = q.valid && head_dim == s.head_dim && clean_layout_ && clean_cache_;
    bool moderate_keys = scale < 100.0f;  // the mass check needs finite logits
    if (lse_kind != 0 && exact_lse_possible) {
      const bool base2 = src_.flag();
      lse_values.resize(static_cast<std::size_t>(s.batch) * static_cast<std::size_t>(heads) *
                        static_cast<std::size_t>(queries));
      const float sc = scale > 0.0f && std::isfinite(scale) ? scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      const std::int32_t group = q.q_heads / s.kv_heads;
      for (std::int32_t b = 0; b < s.batch; ++b)
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < q.q_len; ++j) {
            const std::int32_t visible = length_in(mv, b) - q.q_len + j + 1;
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
            if (!std::isfinite(x)) ok = false;
            lse_values[(static_cast<std::size_t>(b) * static_cast<std::size_t>(heads) + static_cast<std::size_t>(qh)) *
                           static_cast<std::size_t>(queries) +
                       static_cast<std::size_t>(j)] = x;
          }
      lse = sh::lse_view<memory_space::host>::dense({lse_values.data(), lse_values.size()}, q.q_heads, q.q_len,
                                                    base2 ? sh::lse_base::base2 : sh::lse_base::natural);
    }
    bool null_lse = false;
    if (src_.rarely()) {  // {nullptr, n}: a caller's bug, not "no lse"
      lse = {};
      lse.data = {nullptr, static_cast<std::size_t>(src_.in(1, 64))};
      null_lse = true;
    }
    expect expected = expectation(damage, v, !attention || ok);
    if (attention && null_lse) expected = expect::refuse;  // refused whatever else is wrong
    const snapshot before = take(v, {}, {});
    if (!guarded("host::observe_queries", v, {}, {}, expected,
                 [&] { sh::host::observe_queries(policy_, v, state_, qv, lse, scale); }))
      return true;
    check_after_observe(v, before, attention ? q.q_len : 0);
    // With the exact lse the probabilities of a query sum to 1, so a head's
    // tokens gain q_len of mass in all (H2O: mass, unbounded, mean).
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      if (lse_kind == 1 && damage == expect::ok && exact_lse_possible && moderate_keys && clean_state_) {
        for (std::int32_t b = 0; b < s.batch; ++b) {
          std::int32_t tracked;
          std::memcpy(&tracked, before.state.data() + byte_offset(state_.tracked + b), 4);
          for (std::int32_t h = 0; h < s.kv_heads; ++h) {
            float total = 0.0f, magnitude = 0.0f;  // new - old loses ~ulp(old) per token
            for (std::int32_t t = 0; t < length_in(v, b); ++t) {
              float old = 0.0f;
              if (t < tracked) std::memcpy(&old, before.state.data() + byte_offset(state_.scores + slot(b, h, t)), 4);
              total += state_.scores[slot(b, h, t)] - old;
              magnitude += std::fabs(old);
            }
            if (std::getenv("FUZZ_DEBUG"))
              std::fprintf(stderr, "lse check b %d h %d total %g q_len %d len %d scale %g\n", b, h, double(total), q.q_len,
                           length_in(v, b), double(scale));
            if (std::isfinite(total))
              FUZZ_CHECK(std::fabs(total - static_cast<float>(q.q_len)) <=
                             1e-3f * static_cast<float>(q.q_len) + 1e-3f + magnitude * 1e-6f,
                         "observe_queries with the exact lse: mass per query is not 1");
          }
        }
      }
    }
    return damage == expect::ok;
  }

  bool admit() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    const snapshot before = take(v, {}, {});
    if (!guarded("host::admit", v, {}, {}, expectation(damage, v, true), [&] { sh::host::admit(policy_, v, state_); }))
      return true;
    check_after_observe(v, before, 0);
    return damage == expect::ok;
  }

  // ---- compress and its oracle ---------------------------------------------
  bool compress() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const sh::settings& c = policy_.config;
    // Budgets near the lengths trigger; the rest exercise the bounds.
    std::int64_t max_len = 0;
    for (std::int32_t b = 0; b < s.batch; ++b) max_len = std::max<std::int64_t>(max_len, length_in(mv, b));
    const std::int32_t budget =
        src_.rarely() ? garbage_int(src_) : src_.i32(1, std::clamp<std::int64_t>(max_len, 1, 1 << 20) + 1);

    const std::size_t need = sh::host::compress_workspace_bytes(v);
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
    std::vector<std::int32_t> freed_store(static_cast<std::size_t>(s.batch) + 1, -7);
    sh::host_span<std::int32_t> freed;
    bool freed_ok = true;
    if (Paged || src_.flag()) freed = {freed_store.data(), static_cast<std::size_t>(s.batch)};
    if (src_.rarely()) {
      freed_ok = false;
      switch (src_.in(0, 2)) {
        case 0: freed = {freed_store.data(), static_cast<std::size_t>(s.batch) + 1}; break;
        case 1: freed = {nullptr, static_cast<std::size_t>(s.batch)}; break;
        default:
          freed = {freed_store.data(), static_cast<std::size_t>(s.batch) - 1};
          freed_ok = !Paged && s.batch == 1;  // an empty span is fine for a contiguous cache
          break;
      }
    }
    const std::int64_t protect = std::int64_t{c.recent} + c.sinks;
    const bool budget_ok = budget > protect && c.evict_count <= budget - protect;
    bool tracked_ok = true;
    if (damage == expect::ok && state_in_range(v))
      for (std::int32_t b = 0; b < s.batch; ++b)
        if (length_in(v, b) >= budget && state_.tracked[b] != length_in(v, b)) tracked_ok = false;
    expect expected = expectation(damage, v, ws_ok && freed_ok && budget_ok && tracked_ok);
    // Always refused: a budget that leaves nothing to evict, or a bad workspace.
    if (damage == expect::ok && state_in_range(v) && (!budget_ok || !ws_ok || !freed_ok)) expected = expect::refuse;
    if (shared_page_ && rewrites_shared_page(v, budget)) expected = expect::refuse;

    const snapshot before = take(v, workspace, freed);
    if (!guarded("host::compress", v, workspace, freed, expected,
                 [&] { sh::host::compress(policy_, v, state_, budget, workspace, freed); }))
      return true;
    check_after_compress(v, before, budget, freed);
    if (damage != expect::ok) return false;
    if constexpr (Paged) release_pages(freed);
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
                                        std::int32_t h, std::int32_t t) const {
    const std::size_t row = static_cast<std::size_t>(v.head_dim) * sizeof(float);
    std::vector<std::uint8_t> out;
    const auto put = [&](const std::vector<std::uint8_t>& src, std::size_t at, std::size_t n) {
      out.insert(out.end(), src.begin() + static_cast<std::ptrdiff_t>(at), src.begin() + static_cast<std::ptrdiff_t>(at + n));
    };
    put(k, static_cast<std::size_t>(row_at(v, true, b, h, t)) * sizeof(float), row);
    put(vv, static_cast<std::size_t>(row_at(v, false, b, h, t)) * sizeof(float), row);
    const std::size_t i = slot(b, h, t);
    put(st, byte_offset(state_.positions + i), 4);
    put(st, byte_offset(state_.scores + i), 4);
    put(st, byte_offset(state_.observed + i), 4);
    const auto words = static_cast<std::size_t>(state_shape_.ring_words);
    if (words > 0) put(st, byte_offset(state_.ring + i * words), 4 * words);
    return out;
  }

  // Writes a token's identity (from token_bytes) into buffers at slot t.
  void put_token(std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& vv, std::vector<std::uint8_t>& st,
                 const view_type& v, std::int32_t b, std::int32_t h, std::int32_t t,
                 const std::vector<std::uint8_t>& token) const {
    const std::size_t row = static_cast<std::size_t>(v.head_dim) * sizeof(float);
    std::size_t at = 0;
    const auto get = [&](std::vector<std::uint8_t>& dst, std::size_t to, std::size_t n) {
      std::memcpy(dst.data() + to, token.data() + at, n);
      at += n;
    };
    get(k, static_cast<std::size_t>(row_at(v, true, b, h, t)) * sizeof(float), row);
    get(vv, static_cast<std::size_t>(row_at(v, false, b, h, t)) * sizeof(float), row);
    const std::size_t i = slot(b, h, t);
    get(st, byte_offset(state_.positions + i), 4);
    get(st, byte_offset(state_.scores + i), 4);
    get(st, byte_offset(state_.observed + i), 4);
    const auto words = static_cast<std::size_t>(state_shape_.ring_words);
    if (words > 0) get(st, byte_offset(state_.ring + i * words), 4 * words);
  }

  void check_after_compress(const view_type& v, const snapshot& before, std::int32_t budget,
                            sh::host_span<std::int32_t> freed) {
    const sh::settings& c = policy_.config;
    const snapshot after = take(v, {}, {});
    // Expected bytes: start from before, then mark what compress may change.
    std::vector<std::uint8_t> ek = before.k, ev = before.v, est = before.state;
    const std::int32_t m = c.evict_count;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      std::int32_t old_len = 0;  // the length as the call found it
      if constexpr (Paged) {
        std::int32_t last;
        std::memcpy(&last, before.lengths.data() + 4 * static_cast<std::size_t>(b), 4);
        old_len = paged_length(v.indptr[static_cast<std::size_t>(b) + 1] - v.indptr[static_cast<std::size_t>(b)],
                               v.page_size, last);
      } else {
        std::memcpy(&old_len, before.lengths.data() + 4 * static_cast<std::size_t>(b), 4);
      }
      std::int32_t old_next;
      std::memcpy(&old_next, before.state.data() + byte_offset(state_.next_position + b), 4);
      if (old_len < budget) {
        FUZZ_CHECK(length_in(v, b) == old_len, "compress changed a sequence below the budget");
        if (!freed.empty()) FUZZ_CHECK(freed[static_cast<std::size_t>(b)] == 0, "freed_pages of an untouched sequence");
        // Its tokens, read through its own page table, are exactly as they were
        // (a page shared with a compressed sequence would break this).
        for (std::int32_t h = 0; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < old_len; ++t)
            FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, h, t) ==
                           token_bytes(before.k, before.v, before.state, v, b, h, t),
                       "compress changed a token of a sequence below the budget");
        continue;
      }
      const std::int32_t kept = budget - m;
      const std::int32_t evict = old_len - kept;
      if (std::getenv("FUZZ_DEBUG"))
        std::fprintf(stderr, "compress b %d old_len %d budget %d m %d now %d damage '%s' paged %d\n", b, old_len, budget,
                     m, length_in(v, b), damage_note_.c_str(), int(Paged));
      // (A paged length is checked below through last_page_len and
      // freed_pages: indptr only shrinks when the engine releases pages.)
      if constexpr (!Paged) FUZZ_CHECK(length_in(v, b) == kept, "compress: new length != budget - m");
      FUZZ_CHECK(state_.tracked[b] == kept, "compress: tracked != new length");
      std::memcpy(est.data() + byte_offset(state_.tracked + b), &kept, 4);
      if constexpr (Paged) {
        const std::int32_t pages = v.indptr[static_cast<std::size_t>(b) + 1] - v.indptr[static_cast<std::size_t>(b)];
        const std::int32_t used = (kept + v.page_size - 1) / v.page_size;
        FUZZ_CHECK(freed[static_cast<std::size_t>(b)] == pages - used, "freed_pages count");
        FUZZ_CHECK(v.last_page_len[static_cast<std::size_t>(b)] == (used == 0 ? 0 : kept - (used - 1) * v.page_size),
                   "last_page_len after compress");
      } else if (!freed.empty()) {
        FUZZ_CHECK(freed[static_cast<std::size_t>(b)] == 0, "freed_pages of a contiguous cache");
      }
      for (std::int32_t h = 0; h < v.kv_heads; ++h) {
        // The oracle: every unprotected token, fully sorted by its key.
        std::vector<ranked> cand;
        std::vector<std::vector<std::uint8_t>> pre(static_cast<std::size_t>(old_len));
        for (std::int32_t t = 0; t < old_len; ++t) {
          pre[static_cast<std::size_t>(t)] = token_bytes(before.k, before.v, before.state, v, b, h, t);
          float score, observed;
          std::int32_t position;
          const std::size_t i = slot(b, h, t);
          std::memcpy(&position, before.state.data() + byte_offset(state_.positions + i), 4);
          std::memcpy(&score, before.state.data() + byte_offset(state_.scores + i), 4);
          std::memcpy(&observed, before.state.data() + byte_offset(state_.observed + i), 4);
          if (!is_protected(position, old_next, c)) cand.push_back({eviction_score_of(score, observed, c), position, t});
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
          const auto token = token_bytes(after.k, after.v, after.state, v, b, h, t);
          put_token(ek, ev, est, v, b, h, t, token);
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
            FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, h, t) == want,
                       "compress: a kept token's rows or state differ from the oracle's arrangement");
            put_token(ek, ev, est, v, b, h, t, want);
          }
        } else {
          // Equal keys at the cut (only garbage state makes them): any of the
          // tied tokens may go. The kept tokens must be distinct originals,
          // and the evicted keys the oracle's.
          std::vector<std::vector<std::uint8_t>> pool = pre;
          std::vector<char> used(pool.size(), 0);
          for (std::int32_t t = 0; t < kept; ++t) {
            const auto got = token_bytes(after.k, after.v, after.state, v, b, h, t);
            bool found = false;
            for (std::size_t u = 0; u < pool.size() && !found; ++u)
              if (!used[u] && pool[u] == got) used[u] = 1, found = true;
            FUZZ_CHECK(found, "compress (tied keys): a kept token is not an original");
            put_token(ek, ev, est, v, b, h, t, got);
          }
          std::vector<ranked> gone;
          for (const ranked& r : cand)
            if (!used[static_cast<std::size_t>(r.slot)]) gone.push_back(r);
          for (std::int32_t t = 0; t < old_len; ++t) {
            std::int32_t position;
            std::memcpy(&position, before.state.data() + byte_offset(state_.positions + slot(b, h, t)), 4);
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
    FUZZ_CHECK(after.k == ek, "compress wrote K bytes outside the kept rows");
    FUZZ_CHECK(after.v == ev, "compress wrote V bytes outside the kept rows");
    FUZZ_CHECK(after.state == est, "compress wrote state bytes it should not have");
    FUZZ_CHECK(after.indptr == before.indptr && after.indices == before.indices, "compress changed the page table");
  }

  // The engine's side after a paged compress: return the freed pages.
  void release_pages(sh::host_span<std::int32_t> freed) {
    if constexpr (Paged) {
      const std::vector<std::int32_t> old_indptr = cache_.indptr, old_indices = cache_.indices;
      std::vector<std::int32_t> released(cache_.indices.size() + 1, -1);
      const std::size_t n = sh::host::release_freed_pages(
          {cache_.indptr.data(), cache_.indptr.size()}, {cache_.indices.data(), cache_.indices.size()},
          {freed.data(), freed.size()}, {released.data(), released.size()});
      std::size_t expect = 0, out = 0;
      for (std::int32_t b = 0; b < cache_.shape.batch; ++b) {
        const auto bu = static_cast<std::size_t>(b);
        const std::int32_t keep = old_indptr[bu + 1] - old_indptr[bu] - freed[bu];
        FUZZ_CHECK(cache_.indptr[bu + 1] - cache_.indptr[bu] == keep, "release_freed_pages: indptr");
        for (std::int32_t i = 0; i < keep; ++i)
          FUZZ_CHECK(cache_.indices[static_cast<std::size_t>(cache_.indptr[bu] + i)] ==
                         old_indices[static_cast<std::size_t>(old_indptr[bu] + i)],
                     "release_freed_pages: kept page ids");
        for (std::int32_t i = keep; i < old_indptr[bu + 1] - old_indptr[bu]; ++i)
          FUZZ_CHECK(released[out++] == old_indices[static_cast<std::size_t>(old_indptr[bu] + i)],
                     "release_freed_pages: released ids");
        expect += static_cast<std::size_t>(freed[bu]);
      }
      FUZZ_CHECK(cache_.indptr[0] == 0, "release_freed_pages: indptr[0]");
      FUZZ_CHECK(n == expect, "release_freed_pages: count");
      cache_.indices.resize(static_cast<std::size_t>(cache_.indptr.back()));
      for (std::size_t i = 0; i < n; ++i) cache_.free_pages.push_back(released[i]);
    } else {
      (void)freed;
    }
  }
};

template <class Policy>
void run_policy(byte_source& src, bool paged) {
  if (paged) {
    fuzz_case<Policy, true>(src).run();
  } else {
    fuzz_case<Policy, false>(src).run();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source src(data, size);
  const int policy = static_cast<int>(src.in(0, 7));
  const bool paged = src.flag();
  switch (policy) {
    case 0: run_policy<sh::scissorhands_policy>(src, paged); break;
    case 1: run_policy<sh::h2o_policy>(src, paged); break;
    case 2: run_policy<sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>(src, paged); break;
    case 3: run_policy<sh::eviction_policy<sh::threshold_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(src, paged); break;
    case 4: run_policy<sh::eviction_policy<sh::attention_mass, sh::exponential_decay>>(src, paged); break;
    case 5: run_policy<sh::streaming_policy>(src, paged); break;
    case 6: run_policy<sh::random_policy>(src, paged); break;
    default: run_policy<sh::key_norm_policy>(src, paged); break;
  }
  return 0;
}
