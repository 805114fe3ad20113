#pragma once
// Non-owning view of a batch of contiguous per-sequence KV caches. Passed by
// value; the engine owns every byte it points at, lengths included: the
// library reads them and never writes them (compress reports the new
// lengths in its compress_output, and the engine applies them once, after
// the last layer that shares them).
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"
#include "kv_layout.hpp"
#include "span.hpp"

namespace scissorhands {

template <class T, memory_space Space>
struct kv_view {
  using element_type = T;
  static constexpr memory_space space = Space;

  span<T, Space> k;                     // the engine's key buffer
  span<T, Space> v;                     // the engine's value buffer (may use another layout)
  kv_layout k_layout;
  kv_layout v_layout;
  span<const std::int32_t, Space> lengths;  // tokens held per sequence (read only)
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t capacity = 0;            // slots per (sequence, head)

  SCISSORHANDS_HOST_DEVICE std::int32_t num_sequences() const { return batch; }
  SCISSORHANDS_HOST_DEVICE std::int32_t num_kv_heads() const { return kv_heads; }
  SCISSORHANDS_HOST_DEVICE std::int32_t row_size() const { return head_dim; }
  SCISSORHANDS_HOST_DEVICE std::int32_t max_capacity() const { return capacity; }
  SCISSORHANDS_HOST_DEVICE std::int32_t capacity_of(std::int32_t) const { return capacity; }
  SCISSORHANDS_HOST_DEVICE std::int32_t length(std::int32_t b) const { return lengths[b]; }
  SCISSORHANDS_HOST_DEVICE T* k_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return k.data() + k_layout.offset(b, h, t);
  }
  SCISSORHANDS_HOST_DEVICE T* v_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return v.data() + v_layout.offset(b, h, t);
  }
  // Pages a sequence of `length` tokens occupies: none, the cache is contiguous.
  SCISSORHANDS_HOST_DEVICE static constexpr std::int32_t pages_for(std::int32_t) { return 0; }
  SCISSORHANDS_HOST_DEVICE std::int32_t pages_of(std::int32_t) const { return 0; }
};

template <class T>
using host_kv_view = kv_view<T, memory_space::host>;
template <class T>
using device_kv_view = kv_view<T, memory_space::device>;

// Builds a view with one named layout (kv_layout.hpp) for both K and V.

template <class T, memory_space Space>
kv_view<T, Space> make_kv_view(span<T, Space> k, span<T, Space> v,
                               std::type_identity_t<span<const std::int32_t, Space>> lengths,
                               std::int32_t batch, std::int32_t kv_heads, std::int32_t head_dim,
                               std::int32_t capacity, named_layout layout) {
  const kv_layout l = layout == named_layout::nhd ? kv_layout::nhd(capacity, kv_heads, head_dim)
                                                  : kv_layout::hnd(capacity, kv_heads, head_dim);
  return {k, v, l, l, lengths, batch, kv_heads, head_dim, capacity};
}

namespace detail {

// Shape checks that need no access to the data (valid for either space).
// `values`: the call reads or moves V. Calls that only read K (observe)
// pass false, and then V may be absent ({nullptr, 0}): a FlashAttention
// engine's V may be in another format or not at hand.
template <class T, memory_space Space>
void validate_shape(const char* fn, const kv_view<T, Space>& view, bool values = true) {
  require(view.batch > 0, fn, "cache.batch", "must be positive, got ", view.batch);
  require(view.kv_heads > 0, fn, "cache.kv_heads", "must be positive, got ", view.kv_heads);
  require(view.head_dim > 0, fn, "cache.head_dim", "must be positive, got ", view.head_dim);
  require(view.capacity > 0, fn, "cache.capacity", "must be positive, got ", view.capacity);
  require(view.lengths.data() != nullptr, fn, "cache.lengths", "must not be null");
  require(view.lengths.size() == static_cast<std::size_t>(view.batch), fn, "cache.lengths",
          "must hold batch = ", view.batch, " entries, got ", view.lengths.size());
  const std::array<std::int64_t, 3> extents{view.batch, view.kv_heads, view.capacity};
  const struct {
    const char* name;
    const char* layout_name;
    span<T, Space> data;
    kv_layout layout;
  } buffers[2] = {{"cache.k", "cache.k_layout", view.k, view.k_layout},
                  {"cache.v", "cache.v_layout", view.v, view.v_layout}};
  const bool v_absent = !values && view.v.data() == nullptr && view.v.empty();
  for (const auto& buf : buffers) {
    if (v_absent && &buf == &buffers[1]) continue;
    require(buf.data.data() != nullptr, fn, buf.name, "must not be null");
    const std::array<std::int64_t, 3> strides{buf.layout.sequence_stride, buf.layout.head_stride,
                                              buf.layout.token_stride};
    for (auto s : strides)
      require(s >= 0, fn, buf.layout_name, "strides must be non-negative, got ", s);
    require(strides_are_unique(strides, extents, view.head_dim), fn, buf.layout_name,
            "must map every (sequence, head, slot) row to its own ", view.head_dim,
            " elements; strides (sequence ", strides[0], ", head ", strides[1], ", token ", strides[2],
            ") overlap");
    const std::int64_t need = layout_extent(strides, extents, view.head_dim);
    require(static_cast<std::uint64_t>(need) <= buf.data.size(), fn, buf.name, "holds ", buf.data.size(),
            " elements but its layout reaches element ", need);
  }
  require(v_absent || view.k.data() != view.v.data(), fn, "cache.v", "must not alias cache.k");
}

}  // namespace detail
}  // namespace scissorhands
