#pragma once
// A quantized KV cache: two caches that share one sequence table (lengths,
// or a page table). The codes are a kv_view or paged_kv_view of bytes whose
// rows are the packed codes of one (sequence, head, slot); the parameters
// are rows of floats (the groups' scales, and zero points for int4) at the same
// (sequence, head, slot), in buffers and layouts of their own. compress
// moves a token's code row and its parameter row together; observe from
// queries and the static scorers dequantize K on the fly. Values are
// dequantized as
//
//   int8: x = scale[g] * q              q a signed byte in [-127, 127]
//   int4: x = scale[g] * (q - zero[g])  q an unsigned nibble in [0, 15];
//                                       element 2i in the low nibble of
//                                       byte i, 2i + 1 in the high one
//
// for the group g = x / group_size of the element; a row's parameters are
// [scale_0 .. scale_{G-1}] for int8 and [scale_0, zero_0, scale_1, zero_1,
// ..] for int4 (G = head_dim / group_size); the zero point is a float (the
// code of 0.0), so an asymmetric group loses nothing to its rounding. The library never quantizes a
// cache: quantize_row is the reference an engine (or a test) may use on
// append. Parameters are fp32; an engine storing fp16 scales converts them
// when it fills the parameter rows.
//
// The struct derives from the codes view, so every sequence-table member
// (batch, kv_heads, lengths or indptr/indices/last_page_len, capacity or
// page_size ...) is the codes view's. Its head_dim is the logical row
// length (what the queries have); the codes' layouts are in bytes, rows of
// code_row_bytes() contiguous bytes, and the parameters' layouts in floats,
// rows of params_per_row() contiguous floats.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"
#include "kv_layout.hpp"
#include "kv_view.hpp"
#include "paged_kv_view.hpp"
#include "span.hpp"

namespace scissorhands {

enum class quant_kind : std::int32_t { int8 = 8, int4 = 4 };

inline constexpr const char* name_of(quant_kind k) { return k == quant_kind::int8 ? "int8" : "int4"; }

// How a row of head_dim elements is stored: the code width, and how many
// consecutive elements share one scale (and zero point).
struct kv_quantization {
  quant_kind kind = quant_kind::int8;
  std::int32_t group_size = 32;

  SCISSORHANDS_HOST_DEVICE constexpr std::int32_t bits() const { return static_cast<std::int32_t>(kind); }
  SCISSORHANDS_HOST_DEVICE constexpr std::int32_t code_row_bytes(std::int32_t head_dim) const {
    return kind == quant_kind::int8 ? head_dim : head_dim / 2;
  }
  SCISSORHANDS_HOST_DEVICE constexpr std::int32_t groups(std::int32_t head_dim) const {
    return head_dim / group_size;
  }
  SCISSORHANDS_HOST_DEVICE constexpr std::int32_t params_per_group() const {
    return kind == quant_kind::int8 ? 1 : 2;
  }
  SCISSORHANDS_HOST_DEVICE constexpr std::int32_t params_per_row(std::int32_t head_dim) const {
    return groups(head_dim) * params_per_group();
  }
};

// Element x of a row, from its codes and parameters.
SCISSORHANDS_HOST_DEVICE inline float dequantize_element(const std::uint8_t* codes, const float* params,
                                                         std::int32_t x, kv_quantization q) {
  const std::ptrdiff_t g = x / q.group_size;
  if (q.kind == quant_kind::int8) return params[g] * static_cast<float>(static_cast<std::int8_t>(codes[x]));
  const std::uint8_t byte = codes[x >> 1];
  const std::int32_t code = (x & 1) ? (byte >> 4) : (byte & 0x0F);
  return params[2 * g] * (static_cast<float>(code) - params[2 * g + 1]);
}

// A whole row, in element order, a group at a time (the same bits as
// dequantize_element: a product, or a difference then a product, which no
// compiler contracts into an fma, so every backend and flag set agrees).
SCISSORHANDS_HOST_DEVICE inline void dequantize_row(const std::uint8_t* __restrict codes,
                                                    const float* __restrict params, std::int32_t head_dim,
                                                    kv_quantization q, float* __restrict out) {
  const std::int32_t n = q.group_size;
  if (q.kind == quant_kind::int8) {
    for (std::int32_t g0 = 0, g = 0; g0 < head_dim; g0 += n, ++g) {
      const float scale = params[g];
      for (std::int32_t i = 0; i < n; ++i) out[g0 + i] = scale * static_cast<float>(static_cast<std::int8_t>(codes[g0 + i]));
    }
    return;
  }
  // group_size is even: a group's codes are bytes [g0 / 2, (g0 + n) / 2).
  for (std::ptrdiff_t g0 = 0, g = 0; g0 < head_dim; g0 += n, ++g) {
    const float scale = params[2 * g], zero = params[2 * g + 1];
    const std::uint8_t* c = codes + g0 / 2;
    float* o = out + g0;
    for (std::ptrdiff_t i = 0; i < n / 2; ++i) {
      o[2 * i] = scale * (static_cast<float>(c[i] & 0x0F) - zero);
      o[2 * i + 1] = scale * (static_cast<float>(c[i] >> 4) - zero);
    }
  }
}

// The reference quantizer (round to nearest): int8 symmetric per group
// (scale = max |x| / 127), int4 asymmetric per group (scale = (max - min) /
// 15, zero = -min / scale, the code of 0.0, so that the group's minimum and
// maximum map to codes 0 and 15). A group of zeros gets scale 0; an int4
// group of one repeated value v (or a spread too small for a finite zero
// point) gets scale v (the mid-range), zero 0 and codes 1: exact.
// `x` must be finite.
inline void quantize_row(const float* x, std::int32_t head_dim, kv_quantization q, std::uint8_t* codes,
                         float* params) {
  for (std::ptrdiff_t g0 = 0, g = 0; g0 < head_dim; g0 += q.group_size, ++g) {
    if (q.kind == quant_kind::int8) {
      float most = 0.0f;
      for (std::int32_t i = 0; i < q.group_size; ++i) most = std::fmax(most, std::fabs(x[g0 + i]));
      const float scale = most / 127.0f;
      params[g] = scale;
      for (std::int32_t i = 0; i < q.group_size; ++i) {
        const float c = scale > 0.0f ? std::nearbyint(x[g0 + i] / scale) : 0.0f;
        codes[g0 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::fmax(-127.0f, std::fmin(127.0f, c))));
      }
    } else {
      float lo = x[g0], hi = x[g0];
      for (std::int32_t i = 1; i < q.group_size; ++i) {
        lo = std::fmin(lo, x[g0 + i]);
        hi = std::fmax(hi, x[g0 + i]);
      }
      // A spread too small for a finite zero point is stored as one value.
      const float spread = (hi - lo) / 15.0f;
      const bool flat = !(spread > 0.0f) || !std::isfinite(lo / spread);
      const float scale = flat ? 0.5f * lo + 0.5f * hi : spread;
      const float zero = flat ? 0.0f : -lo / spread;
      params[2 * g] = scale;
      params[2 * g + 1] = zero;
      const auto code = [&](std::ptrdiff_t i) -> std::uint32_t {
        if (flat) return 1u;
        const float c = std::nearbyint(x[i] / scale + zero);
        return static_cast<std::uint32_t>(std::fmax(0.0f, std::fmin(15.0f, c)));
      };
      // group_size is even and g0 a multiple of it: whole bytes.
      for (std::ptrdiff_t i = g0; i < g0 + q.group_size; i += 2)
        codes[i >> 1] = static_cast<std::uint8_t>(code(i) | (code(i + 1) << 4));
    }
  }
}

template <class Codes>
struct quantized_kv_view : Codes {
  static_assert(std::is_same_v<std::remove_const_t<typename Codes::element_type>, std::uint8_t>,
                "quantized_kv_view: the codes are a kv_view or paged_kv_view of std::uint8_t");
  using codes_view = Codes;
  using layout_type = decltype(Codes::k_layout);
  static constexpr memory_space space = Codes::space;
  static constexpr bool paged = std::is_same_v<layout_type, paged_layout>;

  span<float, Codes::space> k_params;  // the engine's key parameter buffer
  span<float, Codes::space> v_params;  // the engine's value parameter buffer
  layout_type k_params_layout;          // in floats
  layout_type v_params_layout;
  kv_quantization quantization;

  SCISSORHANDS_HOST_DEVICE const Codes& codes() const { return *this; }
  SCISSORHANDS_HOST_DEVICE std::int32_t code_row_bytes() const { return quantization.code_row_bytes(this->head_dim); }
  SCISSORHANDS_HOST_DEVICE std::int32_t params_per_row() const { return quantization.params_per_row(this->head_dim); }
  SCISSORHANDS_HOST_DEVICE float* k_params_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return k_params.data() + params_offset(k_params_layout, b, h, t);
  }
  SCISSORHANDS_HOST_DEVICE float* v_params_row(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return v_params.data() + params_offset(v_params_layout, b, h, t);
  }
  // Key row (b, h, t) as head_dim floats.
  SCISSORHANDS_HOST_DEVICE void dequantize_k(std::int32_t b, std::int32_t h, std::int32_t t, float* out) const {
    dequantize_row(this->k_row(b, h, t), k_params_row(b, h, t), this->head_dim, quantization, out);
  }
  SCISSORHANDS_HOST_DEVICE void dequantize_v(std::int32_t b, std::int32_t h, std::int32_t t, float* out) const {
    dequantize_row(this->v_row(b, h, t), v_params_row(b, h, t), this->head_dim, quantization, out);
  }

 private:
  SCISSORHANDS_HOST_DEVICE std::int64_t params_offset(const layout_type& l, std::int32_t b, std::int32_t h,
                                                      std::int32_t t) const {
    if constexpr (paged)
      return l.offset(this->indices[this->indptr[b] + t / this->page_size], h, t % this->page_size);
    else
      return l.offset(b, h, t);
  }
};

template <class T>
inline constexpr bool is_quantized_view_v = false;
template <class Codes>
inline constexpr bool is_quantized_view_v<quantized_kv_view<Codes>> = true;

template <memory_space Space>
using quantized_contiguous_view = quantized_kv_view<kv_view<std::uint8_t, Space>>;
template <memory_space Space>
using quantized_paged_view = quantized_kv_view<paged_kv_view<std::uint8_t, Space>>;
using host_quantized_kv_view = quantized_contiguous_view<memory_space::host>;
using host_quantized_paged_kv_view = quantized_paged_view<memory_space::host>;
using device_quantized_kv_view = quantized_contiguous_view<memory_space::device>;
using device_quantized_paged_kv_view = quantized_paged_view<memory_space::device>;

// Builds a contiguous quantized view with one named layout for codes and
// parameters alike: code rows of code_row_bytes and parameter rows of
// params_per_row, [sequence][token][head][row] (nhd) or
// [sequence][head][token][row] (hnd).
template <memory_space Space>
quantized_contiguous_view<Space> make_quantized_kv_view(
    span<std::uint8_t, Space> k, span<std::uint8_t, Space> v, span<float, Space> k_params,
    span<float, Space> v_params, std::type_identity_t<span<const std::int32_t, Space>> lengths, std::int32_t batch,
    std::int32_t kv_heads, std::int32_t head_dim, std::int32_t capacity, named_layout layout,
    kv_quantization quantization) {
  const auto of = [&](std::int32_t row) {
    return layout == named_layout::nhd ? kv_layout::nhd(capacity, kv_heads, row)
                                       : kv_layout::hnd(capacity, kv_heads, row);
  };
  const kv_layout codes = of(quantization.code_row_bytes(head_dim));
  const kv_layout params = of(quantization.params_per_row(head_dim));
  return {{k, v, codes, codes, lengths, batch, kv_heads, head_dim, capacity},
          k_params, v_params, params, params, quantization};
}

// The same for a paged cache: the parameter pool has the code pool's pages.
template <memory_space Space>
quantized_paged_view<Space> make_quantized_paged_kv_view(
    span<std::uint8_t, Space> k_pages, span<std::uint8_t, Space> v_pages, span<float, Space> k_params,
    span<float, Space> v_params, span<const std::int32_t, Space> indptr, span<const std::int32_t, Space> indices,
    std::type_identity_t<span<const std::int32_t, Space>> last_page_len, std::int32_t batch, std::int32_t kv_heads,
    std::int32_t head_dim, std::int32_t page_size, std::int32_t num_pages, std::int32_t max_pages_per_sequence,
    kv_quantization quantization, named_layout layout = named_layout::nhd) {
  const auto of = [&](std::int32_t row) {
    return layout == named_layout::hnd ? paged_layout::hnd(page_size, kv_heads, row)
                                       : paged_layout::nhd(page_size, kv_heads, row);
  };
  const paged_layout codes = of(quantization.code_row_bytes(head_dim));
  const paged_layout params = of(quantization.params_per_row(head_dim));
  return {{k_pages, v_pages, codes, codes, indptr, indices, last_page_len, batch, kv_heads, head_dim, page_size,
           num_pages, max_pages_per_sequence},
          k_params, v_params, params, params, quantization};
}

// Bytes of one stored K (or V) row: head_dim elements, or a quantized
// row's packed codes (its parameters are a row of their own).
template <class View>
constexpr std::int32_t stored_row_bytes(const View& cache) {
  if constexpr (is_quantized_view_v<View>)
    return cache.code_row_bytes();
  else
    return cache.head_dim * static_cast<std::int32_t>(sizeof(typename View::element_type));
}

namespace detail {

// The format against head_dim: whole groups, whole bytes.
inline void validate_quantization(const char* fn, kv_quantization q, std::int32_t head_dim) {
  require(q.kind == quant_kind::int8 || q.kind == quant_kind::int4, fn, "cache.quantization.kind",
          "must be int8 or int4, got ", static_cast<std::int32_t>(q.kind));
  require(q.group_size > 0, fn, "cache.quantization.group_size", "must be positive, got ", q.group_size);
  require(head_dim % q.group_size == 0, fn, "cache.quantization.group_size", "must divide cache.head_dim = ",
          head_dim, ", got ", q.group_size);
  if (q.kind == quant_kind::int4)
    require(q.group_size % 2 == 0, fn, "cache.quantization.group_size",
            "must be even for int4 (a group's codes are whole bytes), got ", q.group_size);
}

// Shape checks of codes and parameters (no access to the data). The codes
// are checked as a view of bytes with rows of code_row_bytes; the
// parameters like a cache's K and V with rows of params_per_row floats.
template <class Codes>
void validate_shape(const char* fn, const quantized_kv_view<Codes>& view) {
  require(view.head_dim > 0, fn, "cache.head_dim", "must be positive, got ", view.head_dim);
  validate_quantization(fn, view.quantization, view.head_dim);
  Codes codes = view.codes();
  codes.head_dim = view.code_row_bytes();
  validate_shape(fn, codes);
  const std::int32_t row = view.params_per_row();
  std::array<std::int64_t, 3> extents{view.batch, view.kv_heads, 0};
  if constexpr (quantized_kv_view<Codes>::paged)
    extents = {view.num_pages, view.kv_heads, view.page_size};
  else
    extents[2] = view.capacity;
  const struct {
    const char* name;
    const char* layout_name;
    span<float, Codes::space> data;
    typename quantized_kv_view<Codes>::layout_type layout;
  } buffers[2] = {{"cache.k_params", "cache.k_params_layout", view.k_params, view.k_params_layout},
                  {"cache.v_params", "cache.v_params_layout", view.v_params, view.v_params_layout}};
  for (const auto& buf : buffers) {
    require(buf.data.data() != nullptr, fn, buf.name, "must not be null");
    std::array<std::int64_t, 3> strides{0, buf.layout.head_stride, buf.layout.token_stride};
    if constexpr (quantized_kv_view<Codes>::paged)
      strides[0] = buf.layout.page_stride;
    else
      strides[0] = buf.layout.sequence_stride;
    for (auto s : strides) require(s >= 0, fn, buf.layout_name, "strides must be non-negative, got ", s);
    require(strides_are_unique(strides, extents, row), fn, buf.layout_name, "must map every row to its own ", row,
            " parameters (", view.quantization.params_per_group(), " per group of ", view.quantization.group_size,
            "); strides (", strides[0], ", ", strides[1], ", ", strides[2], ") overlap");
    const std::int64_t need = layout_extent(strides, extents, row);
    require(static_cast<std::uint64_t>(need) <= buf.data.size(), fn, buf.name, "holds ", buf.data.size(),
            " floats but its layout reaches float ", need);
  }
  require(view.k_params.data() != view.v_params.data(), fn, "cache.v_params", "must not alias cache.k_params");
}

}  // namespace detail
}  // namespace scissorhands
