#pragma once
// A FlashInfer page table without K/V: for engines whose cache slots are
// handed out by their own allocator and whose K/V the library never needs
// to touch (llama.cpp's cells: page size 1, each sequence's cells listed in
// position order; llama.cpp's V cache is transposed, so a K/V view could not
// even be formed). The table means what paged_kv_view's does.
//
// Enough for the calls that read lengths and the table only: admit (of a
// policy whose observation does not score keys), observe_probabilities,
// select, local_scores and forget. Those that read or move K/V rows
// (observe_queries, compress, compact, a key-scoring admit such as
// key_norm's) refuse it at compile time (kv_rows_view).
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"
#include "span.hpp"

namespace scissorhands {

namespace detail {

// The page-table arithmetic token_table_view and paged_kv_view share.
// max_capacity is in 64 bits and clamped: workspace and state sizes are
// computed from it before validation has bounded the product
// (validate_table_shape refuses one above INT32_MAX).
template <class Table>
SCISSORHANDS_HOST_DEVICE std::int32_t table_max_capacity(const Table& t) {
  const std::int64_t slots = std::int64_t{t.max_pages_per_sequence} * t.page_size;
  return slots > INT32_MAX ? INT32_MAX : (slots < 0 ? 0 : static_cast<std::int32_t>(slots));
}
template <class Table>
SCISSORHANDS_HOST_DEVICE std::int32_t table_length(const Table& t, std::int32_t b) {
  const std::int32_t pages = t.pages_of(b);
  return pages == 0 ? 0 : (pages - 1) * t.page_size + t.last_page_len[b];
}
// In 64 bits: length + page_size - 1 can pass INT32_MAX.
template <class Table>
SCISSORHANDS_HOST_DEVICE std::int32_t table_pages_for(const Table& t, std::int32_t length) {
  return static_cast<std::int32_t>((std::int64_t{length} + t.page_size - 1) / t.page_size);
}

}  // namespace detail

template <memory_space Space>
struct token_table_view {
  static constexpr memory_space space = Space;

  span<const std::int32_t, Space> indptr;         // batch + 1 entries
  span<const std::int32_t, Space> indices;        // slot / page ids, indptr[batch] entries used
  span<const std::int32_t, Space> last_page_len;  // batch entries (read only)
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;               // slots / pages in the pool (bounds the ids)
  std::int32_t max_pages_per_sequence = 0;  // bounds every sequence's page count

  // The same accessors as paged_kv_view's, through the same arithmetic.
  SCISSORHANDS_HOST_DEVICE std::int32_t num_sequences() const { return batch; }
  SCISSORHANDS_HOST_DEVICE std::int32_t num_kv_heads() const { return kv_heads; }
  SCISSORHANDS_HOST_DEVICE std::int32_t max_capacity() const { return detail::table_max_capacity(*this); }
  SCISSORHANDS_HOST_DEVICE std::int32_t pages_of(std::int32_t b) const { return indptr[b + 1] - indptr[b]; }
  SCISSORHANDS_HOST_DEVICE std::int32_t capacity_of(std::int32_t b) const { return pages_of(b) * page_size; }
  SCISSORHANDS_HOST_DEVICE std::int32_t length(std::int32_t b) const { return detail::table_length(*this, b); }
  SCISSORHANDS_HOST_DEVICE std::int32_t pages_for(std::int32_t length) const {
    return detail::table_pages_for(*this, length);
  }
};

using host_token_table_view = token_table_view<memory_space::host>;
using device_token_table_view = token_table_view<memory_space::device>;

template <memory_space Space>
token_table_view<Space> make_token_table_view(span<const std::int32_t, Space> indptr,
                                              std::type_identity_t<span<const std::int32_t, Space>> indices,
                                              std::type_identity_t<span<const std::int32_t, Space>> last_page_len,
                                              std::int32_t batch, std::int32_t kv_heads, std::int32_t page_size,
                                              std::int32_t num_pages, std::int32_t max_pages_per_sequence) {
  return {indptr, indices, last_page_len, batch, kv_heads, page_size, num_pages, max_pages_per_sequence};
}

template <class View>
inline constexpr bool is_token_table_view_v = false;
template <memory_space Space>
inline constexpr bool is_token_table_view_v<token_table_view<Space>> = true;

// A view the library can read K rows from and move K/V rows in: every view
// but token_table_view.
template <class View>
concept kv_rows_view = !is_token_table_view_v<std::remove_cvref_t<View>>;

// A view whose slots live in a FlashInfer page table (indptr, indices,
// last_page_len, page_size): paged_kv_view and token_table_view.
template <class View>
concept page_table_view = requires(const View& v) {
  v.indptr;
  v.indices;
  v.last_page_len;
  v.page_size;
};

namespace detail {

// The page table a view was made over, as shrink_page_table rewrites it:
// the same arrays, writable (the engine owns them; the view only reads),
// and the view's page size, so the two cannot disagree.
template <memory_space Space>
struct writable_page_table {
  span<std::int32_t, Space> indptr, indices, last_page_len;
  std::int32_t page_size = 0;
};
template <class View>
writable_page_table<View::space> page_table_of(const char* fn, const View& view) {
  require(view.batch >= 0 && view.indptr.size() == static_cast<std::size_t>(view.batch) + 1, fn, "cache.indptr",
          "must hold batch + 1 = ", std::int64_t{view.batch} + 1, " entries, got ", view.indptr.size());
  const auto writable = [](auto s) {
    return span<std::int32_t, View::space>(const_cast<std::int32_t*>(s.data()), s.size());
  };
  return {writable(view.indptr), writable(view.indices), writable(view.last_page_len), view.page_size};
}

// The table's shape checks, shared with paged_kv_view (no data read).
template <class View>
void validate_table_shape(const char* fn, const View& view) {
  require(view.batch > 0, fn, "cache.batch", "must be positive, got ", view.batch);
  require(view.kv_heads > 0, fn, "cache.kv_heads", "must be positive, got ", view.kv_heads);
  require(view.page_size > 0, fn, "cache.page_size", "must be positive, got ", view.page_size);
  require(view.num_pages > 0, fn, "cache.num_pages", "must be positive, got ", view.num_pages);
  require(view.max_pages_per_sequence > 0, fn, "cache.max_pages_per_sequence", "must be positive, got ",
          view.max_pages_per_sequence);
  require(std::int64_t{view.max_pages_per_sequence} * view.page_size <= INT32_MAX, fn, "cache.max_pages_per_sequence",
          "times page_size must fit in int32, got ", std::int64_t{view.max_pages_per_sequence} * view.page_size);
  require(view.indptr.data() != nullptr, fn, "cache.indptr", "must not be null");
  require(view.indptr.size() == static_cast<std::size_t>(view.batch) + 1, fn, "cache.indptr",
          "must hold batch + 1 = ", std::int64_t{view.batch} + 1, " entries, got ", view.indptr.size());
  require(view.last_page_len.data() != nullptr, fn, "cache.last_page_len", "must not be null");
  require(view.last_page_len.size() == static_cast<std::size_t>(view.batch), fn, "cache.last_page_len",
          "must hold batch = ", view.batch, " entries, got ", view.last_page_len.size());
}

template <memory_space Space>
void validate_shape(const char* fn, const token_table_view<Space>& view) {
  validate_table_shape(fn, view);
}

// Page-table checks that read the table (host memory only), for
// paged_kv_view and token_table_view alike.
template <class View>
void validate_page_table(const char* fn, const View& view) {
  static_assert(View::space == memory_space::host, "validate_page_table reads the table: host views only");
  require(view.indptr[0] == 0, fn, "cache.indptr", "must start at 0, got ", view.indptr[0]);
  for (std::int32_t b = 0; b < view.batch; ++b) {
    // In 64 bits: a garbage indptr[b + 1] far below indptr[b] overflows int32.
    const std::int64_t pages = std::int64_t{view.indptr[b + 1]} - view.indptr[b];
    require(pages >= 0, fn, "cache.indptr", "must be non-decreasing; indptr[", b + 1, "] = ", view.indptr[b + 1],
            " < indptr[", b, "] = ", view.indptr[b]);
    require(pages <= view.max_pages_per_sequence, fn, "cache.indptr", "gives sequence ", b, " ", pages,
            " pages, above max_pages_per_sequence = ", view.max_pages_per_sequence);
    const std::int32_t last = view.last_page_len[b];
    if (pages == 0)
      require(last == 0, fn, "cache.last_page_len", "[", b, "] must be 0 for a sequence with no page, got ", last);
    else
      require(last >= 1 && last <= view.page_size, fn, "cache.last_page_len", "[", b,
              "] must be in [1, page_size = ", view.page_size, "], got ", last);
  }
  const std::int32_t used = view.indptr[view.batch];
  require(static_cast<std::size_t>(used) <= view.indices.size(), fn, "cache.indices", "holds ", view.indices.size(),
          " entries but indptr[batch] = ", used);
  require(used == 0 || view.indices.data() != nullptr, fn, "cache.indices", "must not be null");
  for (std::int32_t i = 0; i < used; ++i)
    require(view.indices[i] >= 0 && view.indices[i] < view.num_pages, fn, "cache.indices", "[", i,
            "] = ", view.indices[i], " is outside the pool [0, num_pages = ", view.num_pages, ")");
}

}  // namespace detail
}  // namespace scissorhands
