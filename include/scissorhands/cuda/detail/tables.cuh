#pragma once
// What the kernels see of a cache view. Both view kinds (contiguous and
// paged) reduce to two plain structs passed by value:
//
//   sequence_table  lengths and the page table (read only: the library never
//                   writes them), no element type: the select, check and
//                   bookkeeping kernels compile once for both views and
//                   every dtype.
//   row_table<T>    where the K and V rows are; row_table<std::byte> holds
//                   byte strides, so compaction compiles once for all dtypes.
//   quantized_rows  a quantized cache's K and V: a row_table of codes and
//                   one of parameters (quantized_kv_view.hpp).
//   row_planes      the rows compaction moves with each token, as bytes: K
//                   and V, plus for a quantized cache their parameter rows,
//                   a run-time count, so no kernel is built per format.
//
// A run-time `paged` flag costs one uniform branch per row address and
// halves the kernels nvcc must build.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../kv_view.hpp"
#include "../../paged_kv_view.hpp"
#include "../../quantized_kv_view.hpp"
#include "../status.cuh"

namespace scissorhands::cuda::detail {

struct sequence_table {
  std::int32_t batch = 0;
  bool paged = false;
  // contiguous views
  const std::int32_t* lengths = nullptr;
  std::int32_t capacity = 0;
  // paged views
  const std::int32_t* indptr = nullptr;
  const std::int32_t* indices = nullptr;
  std::int64_t indices_size = 0;
  const std::int32_t* last_page_len = nullptr;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;
  std::int32_t max_pages = 0;

  __device__ std::int32_t pages_of(std::int32_t b) const { return paged ? indptr[b + 1] - indptr[b] : 0; }
  __device__ std::int32_t length(std::int32_t b) const {
    if (!paged) return lengths[b];
    const std::int32_t pages = pages_of(b);
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
  }
  // Pages a sequence of `length` tokens occupies (paged_kv_view::pages_for).
  __device__ std::int32_t pages_for(std::int32_t length) const {
    if (!paged) return 0;
    return static_cast<std::int32_t>((std::int64_t{length} + page_size - 1) / page_size);
  }

  // The checks host::detail::validate_page_table and validate_common make on
  // sequence b's entries. A block shares the page ids: thread `thread` of
  // `threads` checks ids thread, thread + threads, ... (the caller ORs the
  // threads' bits); the rest is the same in every thread. Returns the bits
  // of sequence b; `batch_bits` gets what concerns the whole table
  // (indptr[0] != 0). `length` is only meaningful when both are zero. Host
  // and device: the differential suite's check_parity part runs it on the
  // host against the host backend's refusals.
  SCISSORHANDS_HOST_DEVICE std::uint32_t check_sequence(std::int32_t b, std::int32_t thread, std::int32_t threads,
                                                        std::int32_t& length, std::uint32_t& batch_bits) const {
    std::uint32_t bits = 0;
    length = 0;
    if (!paged) {
      length = lengths[b];
      if (length < 0 || length > capacity) bits |= status_length;
      return bits;
    }
    const std::int32_t begin = indptr[b], end = indptr[b + 1];
    if (b == 0 && begin != 0) batch_bits |= status_page_table;
    // In 64 bits: garbage entries must not overflow.
    const std::int64_t pages = std::int64_t{end} - begin;
    if (begin < 0 || pages < 0 || pages > max_pages || std::int64_t{end} > indices_size)
      return bits | status_page_table;
    const std::int32_t last = last_page_len[b];
    if (pages == 0 ? last != 0 : (last < 1 || last > page_size)) return bits | status_page_table;
    for (std::int32_t i = begin + thread; i < end; i += threads)
      if (indices[i] < 0 || indices[i] >= num_pages) bits |= status_page_table;
    length = pages == 0 ? 0 : static_cast<std::int32_t>(pages - 1) * page_size + last;
    return bits;
  }
};

template <class T>
struct row_table {
  T* k = nullptr;
  T* v = nullptr;
  // (sequence or page, head, token) strides in units of T
  std::int64_t k_stride[3] = {0, 0, 0};
  std::int64_t v_stride[3] = {0, 0, 0};
  const std::int32_t* indptr = nullptr;
  const std::int32_t* indices = nullptr;
  std::int32_t page_size = 1;
  bool paged = false;

  __device__ std::int64_t offset(const std::int64_t (&s)[3], std::int32_t b, std::int32_t h, std::int32_t t) const {
    if (!paged) return std::int64_t{b} * s[0] + std::int64_t{h} * s[1] + std::int64_t{t} * s[2];
    const std::int32_t page = indices[indptr[b] + t / page_size];
    return std::int64_t{page} * s[0] + std::int64_t{h} * s[1] + std::int64_t{t % page_size} * s[2];
  }
  __device__ T* k_row(std::int32_t b, std::int32_t h, std::int32_t t) const { return k + offset(k_stride, b, h, t); }
  __device__ T* v_row(std::int32_t b, std::int32_t h, std::int32_t t) const { return v + offset(v_stride, b, h, t); }
};

template <class T>
sequence_table make_sequence_table(const kv_view<T, memory_space::device>& view) {
  sequence_table s;
  s.batch = view.batch;
  s.paged = false;
  s.lengths = view.lengths.data();
  s.capacity = view.capacity;
  return s;
}

template <class T>
sequence_table make_sequence_table(const paged_kv_view<T, memory_space::device>& view) {
  sequence_table s;
  s.batch = view.batch;
  s.paged = true;
  s.indptr = view.indptr.data();
  s.indices = view.indices.data();
  s.indices_size = static_cast<std::int64_t>(view.indices.size());
  s.last_page_len = view.last_page_len.data();
  s.page_size = view.page_size;
  s.num_pages = view.num_pages;
  s.max_pages = view.max_pages_per_sequence;
  return s;
}

// Rows of K and V (or of a quantized cache's K and V parameters) of
// element type E, over a view's sequence table, in units of U: U = E
// (kernels that read elements) or U = std::byte (compaction, which only
// moves bytes).
template <class U, class E, class Layout, class View>
row_table<U> rows_of(E* k, E* v, const Layout& kl, const Layout& vl, const View& view) {
  static_assert(std::is_same_v<U, E> || std::is_same_v<U, std::byte>);
  constexpr std::int64_t scale = std::is_same_v<U, E> ? 1 : static_cast<std::int64_t>(sizeof(E));
  row_table<U> r;
  r.k = reinterpret_cast<U*>(k);
  r.v = reinterpret_cast<U*>(v);
  if constexpr (std::is_same_v<Layout, paged_layout>) {
    r.k_stride[0] = kl.page_stride * scale;
    r.v_stride[0] = vl.page_stride * scale;
    r.indptr = view.indptr.data();
    r.indices = view.indices.data();
    r.page_size = view.page_size;
    r.paged = true;
  } else {
    r.k_stride[0] = kl.sequence_stride * scale;
    r.v_stride[0] = vl.sequence_stride * scale;
    r.paged = false;
  }
  r.k_stride[1] = kl.head_stride * scale;
  r.k_stride[2] = kl.token_stride * scale;
  r.v_stride[1] = vl.head_stride * scale;
  r.v_stride[2] = vl.token_stride * scale;
  return r;
}
template <class U, class T>
row_table<U> make_row_table(const kv_view<T, memory_space::device>& view) {
  return rows_of<U>(view.k.data(), view.v.data(), view.k_layout, view.v_layout, view);
}
template <class U, class T>
row_table<U> make_row_table(const paged_kv_view<T, memory_space::device>& view) {
  return rows_of<U>(view.k_pages.data(), view.v_pages.data(), view.k_layout, view.v_layout, view);
}

// Largest power of two <= 16 dividing the address of every row of the table
// (element size, base pointers and byte strides): the widest vector a row
// move or a row load may use.
template <class T>
int row_alignment(const row_table<T>& r, std::int32_t row_elements, bool include_v) {
  std::uint64_t acc = static_cast<std::uint64_t>(row_elements) * sizeof(T) | reinterpret_cast<std::uintptr_t>(r.k) | 16u;
  for (auto s : r.k_stride) acc |= static_cast<std::uint64_t>(s) * sizeof(T);
  if (include_v) {
    acc |= reinterpret_cast<std::uintptr_t>(r.v);
    for (auto s : r.v_stride) acc |= static_cast<std::uint64_t>(s) * sizeof(T);
  }
  return static_cast<int>(acc & (~acc + 1));  // lowest set bit
}

// A quantized cache's parameter rows (K: k_params, V: v_params) in units of
// U: float (kernels that read them) or std::byte (compaction). They share
// the codes' sequence table and have layouts of their own.
template <class U, class Codes>
row_table<U> make_params_table(const quantized_kv_view<Codes>& view) {
  return rows_of<U>(view.k_params.data(), view.v_params.data(), view.k_params_layout, view.v_params_layout, view);
}

// A quantized cache's rows as the observe kernels read K: the codes (byte
// strides) and the parameters (float strides) of each (sequence, head,
// slot), and the format. The kind is a run-time value (one uniform branch
// per 16 bytes of codes), so int8 and int4 share their kernels.
struct quantized_rows {
  row_table<std::uint8_t> codes;
  row_table<float> params;
  kv_quantization quantization;
};
// One quantized row: its codes and its parameters.
struct quantized_row {
  const std::uint8_t* codes = nullptr;
  const float* params = nullptr;
};

// The rows the observe kernels read K from: a row_table<T> of elements, or
// a quantized cache's quantized_rows.
template <class T>
row_table<T> make_key_rows(const kv_view<T, memory_space::device>& view) {
  return make_row_table<T>(view);
}
template <class T>
row_table<T> make_key_rows(const paged_kv_view<T, memory_space::device>& view) {
  return make_row_table<T>(view);
}
template <class Codes>
quantized_rows make_key_rows(const quantized_kv_view<Codes>& view) {
  quantized_rows q;
  q.codes = make_row_table<std::uint8_t>(view.codes());
  q.params = make_params_table<float>(view);
  q.quantization = view.quantization;
  return q;
}

// Whether the K rows the observe kernels read take 16-byte loads.
template <class T>
bool key_rows_vectorised(const row_table<T>& rows, std::int32_t head_dim) {
  return row_alignment(rows, head_dim, false) >= 16;
}
inline bool key_rows_vectorised(const quantized_rows& rows, std::int32_t head_dim) {
  return row_alignment(rows.codes, rows.quantization.code_row_bytes(head_dim), false) >= 16;
}

// The rows compaction moves with a token, by plane (K and V each): the
// cache's rows, then (quantized) its parameter rows, each with its row
// size and the widest unit row_move may use. Moved with the same source
// and destination slots as the state.
struct row_planes {
  static constexpr int max_planes = 2;
  row_table<std::byte> rows[max_planes];
  std::int32_t row_bytes[max_planes] = {0, 0};
  std::int32_t vec[max_planes] = {1, 1};
  std::int32_t count = 0;

  void add(const row_table<std::byte>& r, std::int32_t bytes) {
    rows[count] = r;
    row_bytes[count] = bytes;
    vec[count] = row_alignment(r, bytes, true);
    ++count;
  }
};

template <class View>
row_planes make_row_planes(const View& cache) {
  row_planes p;
  if constexpr (is_quantized_view_v<View>) {
    p.add(make_row_table<std::byte>(cache.codes()), cache.code_row_bytes());
    p.add(make_params_table<std::byte>(cache), cache.params_per_row() * static_cast<std::int32_t>(sizeof(float)));
  } else {
    p.add(make_row_table<std::byte>(cache), stored_row_bytes(cache));
  }
  return p;
}

}  // namespace scissorhands::cuda::detail
