// The host fuzz harness's models of what an engine owns (see fuzz_host.cpp):
// buffers, contiguous and paged caches and their row addressing, the
// eviction order and score reductions written from the specification, and
// the FlashInfer page-table maths of shrink_page_table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <new>

#include "decode.hpp"

namespace {

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

// The bytes of several arrays, one after another (for snapshots).
template <class... Arrays>
std::vector<std::uint8_t> bytes_of_all(const Arrays&... arrays) {
  std::vector<std::uint8_t> out;
  const auto add = [&out](const auto& a) {
    const auto x = bytes_of(a.data(), a.size());
    out.insert(out.end(), x.begin(), x.end());
  };
  (add(arrays), ...);
  return out;
}

// Slot (r, h, t) of a state's per-slot arrays (layout from docs/design.md).
std::size_t state_slot(const sh::state_shape& s, std::int32_t r, std::int32_t h, std::int32_t t) {
  return (static_cast<std::size_t>(r) * static_cast<std::size_t>(s.kv_heads) + static_cast<std::size_t>(h)) *
             static_cast<std::size_t>(s.capacity) +
         static_cast<std::size_t>(t);
}

struct common_shape {
  std::int32_t batch = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 1;
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

// The engine's sequence table, as every mode keeps it: lengths within a
// capacity (contiguous) or a FlashInfer page table over a pool of pages
// (paged; pool pages in no sequence's list are free).
template <bool Paged>
struct seq_table {
  std::int32_t capacity = 1;
  std::vector<std::int32_t> lengths;
  std::int32_t page_size = 1, num_pages = 1, max_pages = 1;
  std::vector<std::int32_t> indptr, indices, last_page_len, free_pages;

  // Decodes the sizes: 1-24 slots, or pages of 1-5 tokens, 1-6 a sequence,
  // 1-12 in the pool (`slot_lists`, the token-level mode's: often pages of
  // one token, as a slot-list engine; 1-8 a sequence, 1-16 in the pool).
  void decode(byte_source& src, bool slot_lists) {
    if constexpr (Paged) {
      page_size = slot_lists ? (src.flag() ? 1 : src.i32(1, 4)) : src.i32(1, 5);
      max_pages = src.i32(1, slot_lists ? 8 : 6);
      num_pages = src.i32(1, slot_lists ? 16 : 12);
    } else {
      capacity = src.i32(1, 24);
    }
  }
  // The extents of a strided buffer's (outer, token) levels: (pages, page
  // size) or (sequences, capacity).
  [[nodiscard]] std::int32_t outer_extent(std::int32_t batch) const { return Paged ? num_pages : batch; }
  [[nodiscard]] std::int32_t token_extent() const { return Paged ? page_size : capacity; }
  // Empty sequences; paged, the pool shuffled (page ids out of order).
  void start(std::int32_t batch, generator& gen) {
    const auto nb = static_cast<std::size_t>(batch);
    if constexpr (Paged) {
      indptr.assign(nb + 1, 0);
      last_page_len.assign(nb, 0);
      for (std::int32_t p = 0; p < num_pages; ++p) free_pages.push_back(p);
      for (std::size_t i = free_pages.size(); i > 1; --i) std::swap(free_pages[i - 1], free_pages[gen.next() % i]);
    } else {
      lengths.assign(nb, 0);
    }
  }
  [[nodiscard]] std::int32_t pages(std::int32_t b) const {
    return indptr[static_cast<std::size_t>(b) + 1] - indptr[static_cast<std::size_t>(b)];
  }
  [[nodiscard]] std::int32_t length(std::int32_t b) const {
    if constexpr (Paged)
      return paged_length(pages(b), page_size, last_page_len[static_cast<std::size_t>(b)]);
    else
      return lengths[static_cast<std::size_t>(b)];
  }
  [[nodiscard]] std::int32_t capacity_of(std::int32_t b) const { return Paged ? pages(b) * page_size : capacity; }
  [[nodiscard]] std::vector<std::int32_t> all_lengths() const {
    std::vector<std::int32_t> out;
    for (std::size_t b = 0; b < (Paged ? last_page_len.size() : lengths.size()); ++b)
      out.push_back(length(static_cast<std::int32_t>(b)));
    return out;
  }
  // Where slot t of sequence b lies: (page, slot in the page) or (b, t).
  [[nodiscard]] std::pair<std::int32_t, std::int32_t> place(std::int32_t b, std::int32_t t) const {
    if constexpr (Paged)
      return {indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + t / page_size)], t % page_size};
    else
      return {b, t};
  }
  // One more token at the end of sequence b (a new page when the last is
  // full); false when the cache has no room.
  bool grow(std::int32_t b) {
    const auto bu = static_cast<std::size_t>(b);
    if constexpr (Paged) {
      if (length(b) == capacity_of(b)) {
        if (free_pages.empty() || pages(b) == max_pages) return false;
        const std::int32_t page = free_pages.back();
        free_pages.pop_back();
        indices.insert(indices.begin() + indptr[bu + 1], page);
        for (std::size_t i = bu + 1; i < indptr.size(); ++i) ++indptr[i];
        last_page_len[bu] = 0;
      }
      ++last_page_len[bu];
    } else {
      if (lengths[bu] == capacity) return false;
      ++lengths[bu];
    }
    return true;
  }
  // New lengths (they only shrink): a copy, or shrink_page_table (checked)
  // with the released pages back to the pool. `who` names the caller.
  void apply(const std::vector<std::int32_t>& to, const char* who);
  // Positions b1 and b2 trade lengths (contiguous; the caller moves the
  // rows) or page lists (paged).
  void swap(std::int32_t b1, std::int32_t b2);
  // The table fields of a view (float or quantized, the same names).
  template <class View>
  void describe(View& v) const {
    if constexpr (Paged) {
      v.indptr = sh::host_span<const std::int32_t>(indptr.data(), indptr.size());
      v.indices = sh::host_span<const std::int32_t>(indices.data(), indices.size());
      v.last_page_len = sh::host_span<const std::int32_t>(last_page_len.data(), last_page_len.size());
      v.page_size = page_size;
      v.num_pages = num_pages;
      v.max_pages_per_sequence = max_pages;
    } else {
      v.lengths = sh::host_span<const std::int32_t>(lengths.data(), lengths.size());
      v.capacity = capacity;
    }
  }
  // Every byte of the table, for snapshots.
  [[nodiscard]] std::vector<std::uint8_t> bytes() const { return bytes_of_all(lengths, indptr, indices, last_page_len); }
  // Puts back bytes() (the arrays have their sizes).
  void restore(const std::vector<std::uint8_t>& from) {
    FUZZ_CHECK(from.size() == bytes().size(), "restore: the table changed size");
    std::size_t at = 0;
    for (auto* a : {&lengths, &indptr, &indices, &last_page_len}) {
      if (!a->empty()) std::memcpy(a->data(), from.data() + at, 4 * a->size());
      at += 4 * a->size();
    }
  }
};

template <bool Paged>
using float_view = std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;

// A float cache's view: its buffers and layouts over the table.
template <bool Paged>
float_view<Paged> view_of(const seq_table<Paged>& t, const common_shape& s, std::vector<float>& k,
                          std::vector<float>& v, const strides3& kl, const strides3& vl) {
  float_view<Paged> out{};
  if constexpr (Paged) {
    out.k_pages = sh::host_span<float>(k.data(), k.size());
    out.v_pages = sh::host_span<float>(v.data(), v.size());
  } else {
    out.k = sh::host_span<float>(k.data(), k.size());
    out.v = sh::host_span<float>(v.data(), v.size());
  }
  out.k_layout = {kl.outer, kl.head, kl.token};
  out.v_layout = {vl.outer, vl.head, vl.token};
  t.describe(out);
  out.batch = s.batch;
  out.kv_heads = s.kv_heads;
  out.head_dim = s.head_dim;
  return out;
}

// The per-head mode's cache: one float K and V over the table.
template <bool Paged>
struct cache_model : seq_table<Paged> {
  common_shape shape;
  strides3 kl, vl;
  std::vector<float> k, v;
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
// eviction score first (NaN below -inf, -0 = +0), then smaller position.
// A count of unimportant steps counts against the token: negated, so its
// highest counts go first.
float eviction_score_of(float score, float observed, const sh::settings& s, bool highest_first) {
  const float v = (s.normalize && observed > 0.0f) ? score / observed : score;
  return highest_first ? -v : v;
}
int compare_scores(float a, float b) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na == nb ? 0 : (na ? -1 : 1);
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

// The observe-step invariant for one sequence, as observe checks it
// (host::detail::validate_new_tokens): row r of `st` (of `rows` rows), a
// cache length `len` and `n` queries. True where the library accepts, or
// refuses first for another reason (a row, count or length out of range:
// their slots are not there to read).
template <class State>
bool row_steps_ok(const State& st, std::int32_t rows, std::int32_t r, std::int32_t len, std::int32_t n) {
  if (r < 0 || r >= rows || len <= 0 || n <= 0 || n > len) return true;
  const std::int32_t tracked = st.tracked[r], first = len - n;
  if (tracked < 0 || tracked > len || len > st.shape.capacity) return true;
  if (first > tracked && st.step[r] != 0) return false;  // more new tokens than queries after the first call
  for (std::int32_t t = first; t < tracked; ++t)
    if (st.observed[st.row_index(r, 0, t)] != 0.0f) return false;  // a query already observed
  return true;
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

// Runs `call`, which must be refused by `fn` (or by `inner`, a function
// it calls that checks first) naming `argument`.
template <class Call>
void expect_refusal(Call&& call, const char* fn, const char* argument, const char* inner = "") {
  try {
    call();
  } catch (const sh::invalid_argument& e) {
    FUZZ_CHECK((e.function() == fn || e.function() == inner) && e.argument() == argument,
               std::string(fn) + ": unexpected refusal: " + e.what());
    return;
  }
  fail(__FILE__, __LINE__, std::string(fn) + " accepted a bad '" + argument + "'");
}

// What the harness knows about a call before making it.
enum class expect { ok, unknown, refuse };

// Runs `call`, the library entry point `fn`, and checks the outcome the
// harness expected. On refusal: the error names `fn` and an argument, and
// `take()` (every byte the caller owns) is as before the call. Returns
// whether the call succeeded. `note` names the damage an acceptance missed.
template <class Take, class Call>
bool guarded_call(const char* fn, expect expected, const std::string& note, const Take& take, Call&& call) {
  const auto before = take();
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
  FUZZ_CHECK(expected != expect::refuse, std::string(fn) + " accepted an invalid argument (" + note + ")");
  return true;
}

// ---------------------------------------------------------------------------
// Continuous batching: the state row of each batch position (-1: a padding
// slot, which holds no token), and whether calls pass the mapping
// (state.for_batch) or rely on row b for position b.

// Decodes the mapping: row b (not passed), the same passed explicitly, or a
// shuffle of the rows with padding slots where rows run out (or where the
// input asks for one).
void pick_mapping(byte_source& src, generator& gen, std::int32_t batch, std::int32_t state_rows,
                  std::vector<std::int32_t>& rows, bool& pass) {
  rows.assign(static_cast<std::size_t>(batch), -1);
  const auto mode = src.in(0, 3);
  if (mode <= 1 && state_rows >= batch) {
    for (std::int32_t b = 0; b < batch; ++b) rows[static_cast<std::size_t>(b)] = b;
    pass = mode == 1;
    return;
  }
  std::vector<std::int32_t> pool;
  for (std::int32_t r = 0; r < state_rows; ++r) pool.push_back(r);
  for (std::size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[gen.next() % i]);
  for (std::int32_t b = 0; b < batch; ++b) {
    if (pool.empty() || (mode == 3 && src.flag())) continue;  // a padding slot
    rows[static_cast<std::size_t>(b)] = pool.back();
    pool.pop_back();
  }
  pass = true;
}

bool mapping_is_identity(const std::vector<std::int32_t>& rows) {
  for (std::size_t b = 0; b < rows.size(); ++b)
    if (rows[b] != static_cast<std::int32_t>(b)) return false;
  return true;
}

// Rows no batch position uses.
std::vector<std::int32_t> free_rows(const std::vector<std::int32_t>& rows, std::int32_t state_rows) {
  std::vector<std::int32_t> out;
  for (std::int32_t r = 0; r < state_rows; ++r)
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) out.push_back(r);
  return out;
}

// The scheduler swaps two requests' batch positions: their rows move with them.
void swap_mapped_rows(std::vector<std::int32_t>& rows, bool& pass, std::int32_t b1, std::int32_t b2) {
  std::swap(rows[static_cast<std::size_t>(b1)], rows[static_cast<std::size_t>(b2)]);
  pass = pass || !mapping_is_identity(rows);
}

// A request retires (decoded by decode_retire); its position b becomes a
// padding slot (choice 0), keeps its row (1; a padding slot takes a free
// row) or takes a free row (2). Returns b's new row.
struct retire_step {
  std::int32_t position = 0;
  std::int64_t choice = 0;
  bool forget = false;  // the engine does not reset the new row
  std::int32_t start = 0;
};
retire_step decode_retire(byte_source& src, std::int32_t batch) {
  retire_step r;
  r.position = src.i32(0, batch - 1);
  r.choice = src.in(0, 2);
  r.forget = src.rarely();
  r.start = src.flag() ? 0 : src.i32(0, 1000);
  return r;
}
std::int32_t retire_row(const retire_step& step, std::vector<std::int32_t>& rows, bool& pass, std::int32_t state_rows,
                        generator& gen) {
  std::int32_t& row = rows[static_cast<std::size_t>(step.position)];
  const std::vector<std::int32_t> spare = free_rows(rows, state_rows);
  if (step.choice == 0) {
    row = -1;
  } else if (step.choice == 2 || row < 0) {
    if (!spare.empty()) row = spare[gen.next() % spare.size()];
  }
  pass = pass || !mapping_is_identity(rows);
  FUZZ_TRACE("  retire position %d: row %d%s\n", step.position, row, step.forget ? " (not reset)" : "");
  return row;
}

// The lengths after sequence b drops its last k tokens (a rollback).
std::vector<std::int32_t> rolled_back(std::vector<std::int32_t> lengths, std::int32_t b, std::int32_t k) {
  std::int32_t& len = lengths[static_cast<std::size_t>(b)];
  len = std::max(0, len - k);
  FUZZ_TRACE("  rollback position %d to %d\n", b, len);
  return lengths;
}

// The row each position uses under a call's state_rows (`span`; {}: row b)
// and whether the library accepts the mapping: one entry per position,
// each -1 or a row of the state, rows distinct.
bool resolve_rows(sh::host_span<const std::int32_t> span, std::int32_t batch, std::int32_t rows,
                  std::vector<std::int32_t>& used) {
  used.assign(static_cast<std::size_t>(batch), -1);
  if (span.data() == nullptr) {
    for (std::int32_t b = 0; b < batch; ++b) used[static_cast<std::size_t>(b)] = b;
    return rows >= batch;
  }
  bool ok = span.size() == static_cast<std::size_t>(batch);
  std::vector<char> seen(static_cast<std::size_t>(rows), 0);
  for (std::size_t b = 0; b < std::min(span.size(), static_cast<std::size_t>(batch)); ++b) {
    const std::int32_t r = span[b];
    if (r < -1 || r >= rows) {
      ok = false;
      continue;
    }
    if (r >= 0 && std::exchange(seen[static_cast<std::size_t>(r)], 1) != 0) ok = false;
    used[b] = r;
  }
  return ok;
}

// What every cache entry point checks of position b's row from the data
// (validate_common): a padding slot (r < 0) empty; the length within the
// state's capacity, 0 <= tracked <= length, positions left, steps in
// range, the status word zero when a mapping is passed. True: refused.
bool row_refuses(const sh::eviction_state<memory_space::host>& s, std::int32_t r, std::int32_t len,
                 std::int32_t capacity, bool mapped) {
  if (r < 0) return len != 0;
  if (len > capacity) return true;
  const std::int32_t tracked = s.tracked[r];
  if (tracked < 0 || tracked > len) return true;
  const std::int32_t next = s.next_position[r];
  if (next < 0 || std::int64_t{next} + (len - tracked) > INT32_MAX) return true;
  if (s.step[r] < 0 || s.step[r] > (std::int64_t{1} << 62)) return true;
  return mapped && s.status[r] != 0;
}

// Whether reset_state left every byte of the state zero.
bool all_zero(const aligned_buffer& state) {
  return std::all_of(state.data, state.data + state.size, [](std::byte x) { return x == std::byte{0}; });
}

// ---------------------------------------------------------------------------
// Moving sequences between batch positions, as the engine does.

// Swaps the page lists (and last page lengths) of positions b1 and b2.
void swap_page_lists(std::vector<std::int32_t>& indptr, std::vector<std::int32_t>& indices,
                     std::vector<std::int32_t>& last_page_len, std::int32_t b1, std::int32_t b2) {
  const std::size_t batch = last_page_len.size();
  std::vector<std::vector<std::int32_t>> lists(batch);
  for (std::size_t b = 0; b < batch; ++b) lists[b].assign(indices.begin() + indptr[b], indices.begin() + indptr[b + 1]);
  std::swap(lists[static_cast<std::size_t>(b1)], lists[static_cast<std::size_t>(b2)]);
  indices.clear();
  for (std::size_t b = 0; b < batch; ++b) {
    indptr[b] = static_cast<std::int32_t>(indices.size());
    indices.insert(indices.end(), lists[b].begin(), lists[b].end());
  }
  indptr.back() = static_cast<std::int32_t>(indices.size());
  std::swap(last_page_len[static_cast<std::size_t>(b1)], last_page_len[static_cast<std::size_t>(b2)]);
}

template <bool Paged>
void seq_table<Paged>::apply(const std::vector<std::int32_t>& to, const char* who) {
  if constexpr (Paged)
    apply_page_lengths(indptr, indices, last_page_len, page_size, to, free_pages, who);
  else
    lengths = to, (void)who;
}
template <bool Paged>
void seq_table<Paged>::swap(std::int32_t b1, std::int32_t b2) {
  if constexpr (Paged)
    swap_page_lists(indptr, indices, last_page_len, b1, b2);
  else
    std::swap(lengths[static_cast<std::size_t>(b1)], lengths[static_cast<std::size_t>(b2)]);
}

// Swaps every K and V row (each head, each slot up to the capacity) of
// sequences b1 and b2 of a contiguous cache whose view is `v`.
void swap_sequence_rows(const sh::host_kv_view<float>& v, std::vector<float>& k, std::vector<float>& vv,
                        std::int32_t b1, std::int32_t b2) {
  for (std::int32_t h = 0; h < v.kv_heads; ++h)
    for (std::int32_t t = 0; t < v.capacity; ++t)
      for (const bool key : {true, false}) {
        std::vector<float>& buf = key ? k : vv;
        std::swap_ranges(buf.begin() + row_at(v, key, b1, h, t), buf.begin() + row_at(v, key, b1, h, t) + v.head_dim,
                         buf.begin() + row_at(v, key, b2, h, t));
      }
}

// Where each kept slot's token comes from (`gone` marks the evicted slots of
// a sequence of `len`, `kept` survive): compact's rule (fill_holes: holes
// below the new length take the survivors above it, both ascending;
// preserve_order: survivors shift down), forget's (the order kept whatever
// the mode).
std::vector<std::int32_t> compaction_sources(const std::vector<char>& gone, std::int32_t len, std::int32_t kept,
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

}  // namespace
