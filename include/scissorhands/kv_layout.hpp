#pragma once
// Layout maths, kept apart from data (as CuTe keeps layout apart from
// tensors). Offsets are in elements and computed in 64 bits: a batch of long
// sequences easily passes 2^31 elements.
#include <algorithm>
#include <array>
#include <cstdint>

#include "config.hpp"

namespace scissorhands {

// The two layouts engines name, for the make_*_view helpers of every view
// (contiguous and paged, plain and quantized): NHD = token-major
// ([.][token][head][dim]), HND = head-major ([.][head][token][dim]).
enum class named_layout { nhd, hnd };

// Where row (sequence b, KV head h, slot t) of a contiguous-per-sequence cache
// starts. The head_dim elements of a row are contiguous (stride 1): row moves
// are plain copies and the CUDA backend moves them 16 bytes at a time.
struct kv_layout {
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t token_stride = 0;

  SCISSORHANDS_HOST_DEVICE constexpr std::int64_t offset(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return std::int64_t{b} * sequence_stride + std::int64_t{h} * head_stride + std::int64_t{t} * token_stride;
  }

  // FlashInfer's NHD: [sequence][token][head][dim].
  static constexpr kv_layout nhd(std::int32_t capacity, std::int32_t kv_heads, std::int32_t head_dim) {
    const std::int64_t row = head_dim;
    return {std::int64_t{capacity} * kv_heads * row, row, std::int64_t{kv_heads} * row};
  }
  // FlashInfer's HND: [sequence][head][token][dim].
  static constexpr kv_layout hnd(std::int32_t capacity, std::int32_t kv_heads, std::int32_t head_dim) {
    const std::int64_t row = head_dim;
    return {std::int64_t{capacity} * kv_heads * row, std::int64_t{capacity} * row, row};
  }
};

// Where row (page p, KV head h, in-page slot t) of a paged cache starts.
struct paged_layout {
  std::int64_t page_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t token_stride = 0;

  SCISSORHANDS_HOST_DEVICE constexpr std::int64_t offset(std::int32_t page, std::int32_t h, std::int32_t t) const {
    return std::int64_t{page} * page_stride + std::int64_t{h} * head_stride + std::int64_t{t} * token_stride;
  }
  // [page][token][head][dim]
  static constexpr paged_layout nhd(std::int32_t page_size, std::int32_t kv_heads, std::int32_t head_dim) {
    return of(kv_layout::nhd(page_size, kv_heads, head_dim));
  }
  // [page][head][token][dim]
  static constexpr paged_layout hnd(std::int32_t page_size, std::int32_t kv_heads, std::int32_t head_dim) {
    return of(kv_layout::hnd(page_size, kv_heads, head_dim));
  }

 private:
  // A page is laid out as one contiguous sequence of page_size slots.
  static constexpr paged_layout of(const kv_layout& page) {
    return {page.sequence_stride, page.head_stride, page.token_stride};
  }
};

namespace detail {

// True when no two distinct (index, element) pairs of a 3-level strided
// layout with rows of `row` contiguous elements share an address: sorted by
// stride, each level must step over everything the levels below it span.
// Levels of extent 1 never step and are ignored. Saturating maths keeps the
// check itself free of overflow.
constexpr bool strides_are_unique(std::array<std::int64_t, 3> strides, std::array<std::int64_t, 3> extents,
                                  std::int64_t row) {
  std::array<std::size_t, 3> order{0, 1, 2};
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return strides[a] < strides[b]; });
  std::int64_t spanned = row;  // elements covered by the levels already seen
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  for (std::size_t i : order) {
    if (extents[i] <= 1) continue;
    if (strides[i] < spanned) return false;
    spanned = strides[i] > limit / extents[i] ? limit : strides[i] * extents[i];
  }
  return true;
}

// Largest element offset + 1 that a layout touches (the size the caller's
// buffer must have), saturating at 2^62.
constexpr std::int64_t layout_extent(std::array<std::int64_t, 3> strides, std::array<std::int64_t, 3> extents,
                                     std::int64_t row) {
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  std::int64_t last = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    if (extents[i] <= 0) return 0;
    const std::int64_t steps = extents[i] - 1;
    if (steps != 0 && strides[i] > (limit - last) / steps) return limit;
    last += strides[i] * steps;
  }
  return last + row;
}

}  // namespace detail
}  // namespace scissorhands
