#pragma once
// Non-owning view of a paged KV cache in FlashInfer's convention: a pool of
// pages of page_size tokens, and per sequence b the pages
// indices[indptr[b] .. indptr[b+1]) in order, the last one holding
// last_page_len[b] tokens (1..page_size; 0 only for a sequence with no page).
//
// The table is the engine's and the library never writes it: one table may
// serve every layer. compress reports each sequence's new length and, in
// freed_pages[b], how many trailing pages of its list are now empty:
// indices[indptr[b+1] - freed_pages[b] .. indptr[b+1]). After the last layer
// the engine applies them once (host::shrink_page_table or
// cuda::shrink_page_table do it for a FlashInfer table) before appending.
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"
#include "kv_layout.hpp"
#include "span.hpp"
#include "token_table_view.hpp"

namespace scissorhands {

template <class T, memory_space Space>
struct paged_kv_view {
  using element_type = T;
  static constexpr memory_space space = Space;

  span<T, Space> k_pages;                  // the engine's key page pool
  span<T, Space> v_pages;                  // the engine's value page pool
  paged_layout k_layout;
  paged_layout v_layout;
  span<const std::int32_t, Space> indptr;  // batch + 1 entries
  span<const std::int32_t, Space> indices; // page ids, indptr[batch] entries used
  span<const std::int32_t, Space> last_page_len; // batch entries (read only)
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;              // pages in the pool (bounds the ids)
  std::int32_t max_pages_per_sequence = 0; // bounds every sequence's page count

  SCISSORHANDS_HOST_DEVICE std::int32_t num_sequences() const { return batch; }
  SCISSORHANDS_HOST_DEVICE std::int32_t num_kv_heads() const { return kv_heads; }
  SCISSORHANDS_HOST_DEVICE std::int32_t row_size() const { return head_dim; }
  SCISSORHANDS_HOST_DEVICE std::int32_t max_capacity() const { return detail::table_max_capacity(*this); }
  SCISSORHANDS_HOST_DEVICE std::int32_t pages_of(std::int32_t b) const { return indptr[b + 1] - indptr[b]; }
  SCISSORHANDS_HOST_DEVICE std::int32_t capacity_of(std::int32_t b) const { return pages_of(b) * page_size; }
  SCISSORHANDS_HOST_DEVICE std::int32_t length(std::int32_t b) const { return detail::table_length(*this, b); }
  SCISSORHANDS_HOST_DEVICE T* k_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return k_pages.data() + k_layout.offset(indices[indptr[b] + t / page_size], h, t % page_size);
  }
  SCISSORHANDS_HOST_DEVICE T* v_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return v_pages.data() + v_layout.offset(indices[indptr[b] + t / page_size], h, t % page_size);
  }
  // Pages a sequence of `length` tokens occupies.
  SCISSORHANDS_HOST_DEVICE std::int32_t pages_for(std::int32_t length) const {
    return detail::table_pages_for(*this, length);
  }
};

template <class T>
using host_paged_kv_view = paged_kv_view<T, memory_space::host>;
template <class T>
using device_paged_kv_view = paged_kv_view<T, memory_space::device>;

template <class T, memory_space Space>
paged_kv_view<T, Space> make_paged_kv_view(span<T, Space> k_pages, span<T, Space> v_pages,
                                           span<const std::int32_t, Space> indptr,
                                           span<const std::int32_t, Space> indices,
                                           std::type_identity_t<span<const std::int32_t, Space>> last_page_len,
                                           std::int32_t batch,
                                           std::int32_t kv_heads, std::int32_t head_dim, std::int32_t page_size,
                                           std::int32_t num_pages, std::int32_t max_pages_per_sequence,
                                           named_layout layout = named_layout::nhd) {
  const paged_layout l = layout == named_layout::hnd ? paged_layout::hnd(page_size, kv_heads, head_dim)
                                                     : paged_layout::nhd(page_size, kv_heads, head_dim);
  return {k_pages, v_pages, l, l, indptr, indices, last_page_len, batch, kv_heads, head_dim,
          page_size, num_pages, max_pages_per_sequence};
}

namespace detail {

// `values`: the call reads or moves V. Calls that only read K (observe)
// pass false, and then V may be absent ({nullptr, 0}): a FlashAttention
// engine's V may be in another format or not at hand.
template <class T, memory_space Space>
void validate_shape(const char* fn, const paged_kv_view<T, Space>& view, bool values = true) {
  validate_table_shape(fn, view);
  require(view.head_dim > 0, fn, "cache.head_dim", "must be positive, got ", view.head_dim);
  const std::array<std::int64_t, 3> extents{view.num_pages, view.kv_heads, view.page_size};
  const struct {
    const char* name;
    const char* layout_name;
    span<T, Space> data;
    paged_layout layout;
  } buffers[2] = {{"cache.k_pages", "cache.k_layout", view.k_pages, view.k_layout},
                  {"cache.v_pages", "cache.v_layout", view.v_pages, view.v_layout}};
  const bool v_absent = !values && view.v_pages.data() == nullptr && view.v_pages.empty();
  for (const auto& buf : buffers) {
    if (v_absent && &buf == &buffers[1]) continue;
    require(buf.data.data() != nullptr, fn, buf.name, "must not be null");
    const std::array<std::int64_t, 3> strides{buf.layout.page_stride, buf.layout.head_stride,
                                              buf.layout.token_stride};
    for (auto s : strides)
      require(s >= 0, fn, buf.layout_name, "strides must be non-negative, got ", s);
    require(strides_are_unique(strides, extents, view.head_dim), fn, buf.layout_name,
            "must map every (page, head, slot) row to its own ", view.head_dim,
            " elements; strides (page ", strides[0], ", head ", strides[1], ", token ", strides[2], ") overlap");
    const std::int64_t need = layout_extent(strides, extents, view.head_dim);
    require(static_cast<std::uint64_t>(need) <= buf.data.size(), fn, buf.name, "holds ", buf.data.size(),
            " elements but its layout reaches element ", need);
  }
  require(v_absent || view.k_pages.data() != view.v_pages.data(), fn, "cache.v_pages",
          "must not alias cache.k_pages");
}

// validate_page_table (token_table_view.hpp) checks the table itself.

}  // namespace detail
}  // namespace scissorhands
