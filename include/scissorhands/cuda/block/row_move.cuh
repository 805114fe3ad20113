#pragma once
// Row moves for compaction. A row is `row_bytes / vec` units of `vec` bytes
// (16, 8, 4, 2 or 1: the widest that divides every row address and the row
// size, so K/V rows of aligned caches move 16 bytes at a time), unit u at
// byte u * unit_stride from the row's start: unit_stride = vec for a
// contiguous row, the state's capacity x 4 for a token's word-major history
// ring (eviction_state.hpp).
#include <cstddef>
#include <climits>
#include <cstdint>

namespace scissorhands::cuda::block {

// Copies the `vec`-byte unit at dst from the one at src.
__device__ inline void copy_unit(std::byte* dst, const std::byte* src, int vec) {
  switch (vec) {
    case 16:
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      break;
    case 8:
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
      break;
    case 4:
      *reinterpret_cast<std::uint32_t*>(dst) = *reinterpret_cast<const std::uint32_t*>(src);
      break;
    case 2:
      *reinterpret_cast<std::uint16_t*>(dst) = *reinterpret_cast<const std::uint16_t*>(src);
      break;
    default:
      *dst = *src;
  }
}

// Calls f(row, unit) for every unit of `count` rows, the block's threads
// striding over rows x units, thread `first_thread` (in [0, Threads)) taking
// the first: consecutive calls that start where the previous one ended
// spread a few small moves over distinct threads, so their loads are in
// flight together instead of one call's after another's on the same low
// threads. Consecutive threads take consecutive units of a row, or, with
// `rows_fastest`, the same unit of consecutive rows: for a word-major
// history ring (a row's units capacity x 4 bytes apart, a unit's rows 4
// bytes apart) that keeps a warp's accesses in one or two sectors instead
// of one sector each. The index is split with a 32-bit division when the
// range fits (the usual case): a 64-bit division is a called routine of ~70
// instructions, a 32-bit one a few inline.
template <int Threads, class F>
__device__ inline void for_each_unit(std::int64_t units, std::int64_t count, F&& f, std::int32_t first_thread = 0,
                                     bool rows_fastest = false) {
  const std::int64_t total = units * count;
  const auto me = static_cast<std::uint32_t>((static_cast<std::int32_t>(threadIdx.x) + Threads - first_thread) % Threads);
  if (total <= INT32_MAX) {
    const auto inner = static_cast<std::uint32_t>(rows_fastest ? count : units);
    for (std::uint32_t i = me; i < static_cast<std::uint32_t>(total); i += Threads) {
      const std::uint32_t outer = i / inner, in = i - outer * inner;
      if (rows_fastest)
        f(static_cast<std::int32_t>(in), static_cast<std::int64_t>(outer));
      else
        f(static_cast<std::int32_t>(outer), static_cast<std::int64_t>(in));
    }
  } else {
    const std::int64_t inner = rows_fastest ? count : units;
    for (std::int64_t i = me; i < total; i += Threads) {
      const std::int64_t outer = i / inner, in = i - outer * inner;
      if (rows_fastest)
        f(static_cast<std::int32_t>(in), outer);
      else
        f(static_cast<std::int32_t>(outer), in);
    }
  }
}

// Moves `pairs` rows, pair p from row_at(src[p]) to row_at(dst[p]), with all
// the block's threads, the first unit on thread `first_thread`. Sources and
// destinations must be distinct rows. Strided units (a history ring) go
// row-fastest (for_each_unit).
template <int Threads, class RowAt>
__device__ void move_rows(RowAt row_at, std::int64_t row_bytes, int vec, std::int64_t unit_stride,
                          const std::int32_t* src, const std::int32_t* dst, std::int32_t pairs,
                          std::int32_t first_thread = 0) {
  const std::int64_t units = row_bytes / vec;
  for_each_unit<Threads>(
      units, pairs,
      [&](std::int32_t p, std::int64_t unit) {
        copy_unit(row_at(dst[p]) + unit * unit_stride, row_at(src[p]) + unit * unit_stride, vec);
      },
      first_thread, unit_stride != vec);
}

// One array the order-preserving shift moves: row t at row_at(t), of
// row_bytes bytes in units of `vec` bytes, unit u at u * unit_stride (see
// move_rows). row_bytes == 0: absent (skipped).
template <class RowAt>
struct shifted_rows {
  RowAt row_at;
  std::int64_t row_bytes;
  int vec;
  std::int64_t unit_stride;
};

namespace detail {
// Each array's part of the stage starts 16-byte aligned.
__device__ inline std::int64_t stage_align(std::int64_t bytes) { return (bytes + 15) / 16 * 16; }

// Copies the group's kept rows [start, start + count) of one array into
// its part of the stage (at `at`), or (out) from there to their
// destinations; advances `at` past the part. Contiguous units go
// row-major, strided ones (a history ring) row-fastest and unit-major, so
// that consecutive threads touch consecutive words in memory and stage.
template <int Threads, class RowAt>
__device__ void stage_rows(shifted_rows<RowAt> a, bool out, std::int32_t start, std::int32_t count,
                           const std::int32_t* dst_slot, std::byte* stage, std::int64_t& at) {
  if (a.row_bytes == 0) return;
  const std::int64_t units = a.row_bytes / a.vec;
  const bool rows_fastest = a.unit_stride != a.vec;
  std::byte* part = stage + at;
  for_each_unit<Threads>(
      units, count,
      [&](std::int32_t r, std::int64_t unit) {
        if (dst_slot[r] < 0) return;
        std::byte* staged = part + (rows_fastest ? (unit * count + r) * a.vec : r * a.row_bytes + unit * a.vec);
        if (out)
          copy_unit(a.row_at(dst_slot[r]) + unit * a.unit_stride, staged, a.vec);
        else
          copy_unit(staged, a.row_at(start + r) + unit * a.unit_stride, a.vec);
      },
      0, rows_fastest);
  at += stage_align(count * a.row_bytes);
}

// One array whose row is larger than the stage: row by row, straight, in
// slot order. No barrier: a thread moves the same units of every row, so
// the units of row t that a later row overwrites were read by that same
// thread, earlier.
template <int Threads, class RowAt>
__device__ void shift_unstaged(shifted_rows<RowAt> a, const std::int32_t* evicted, std::int32_t e,
                               std::int32_t len) {
  if (a.row_bytes == 0) return;
  const std::int64_t units = a.row_bytes / a.vec;
  std::int32_t next = 1;  // the next evicted slot above evicted[0]; also #evicted below t
  for (std::int32_t t = evicted[0] + 1; t < len; ++t) {
    if (next < e && evicted[next] == t) {
      ++next;
      continue;
    }
    for (std::int64_t i = threadIdx.x; i < units; i += Threads)
      copy_unit(a.row_at(t - next) + i * a.unit_stride, a.row_at(t) + i * a.unit_stride, a.vec);
  }
}
}  // namespace detail

// Shifts the kept rows of every array down in slot order, together: slot t
// (not evicted, t < len) goes to t - #{evicted slots below t}. `evicted` is
// the ascending list of the e evicted slots. The rows of a group of slots,
// of every array, are staged through shared memory `stage`: every source
// of a group is read before any destination is written, and a destination
// is never a later group's source (it is at or below its slot), so the
// shift is safe in place. One rank search and three barriers a group for
// all the arrays, the group as many slots as the stage holds rows of all
// of them (at most max_group: `dst_slot` holds that many ints). If not
// even one slot's rows of all the arrays fit, each array is shifted on its
// own, and one whose single row does not fit, one row at a time.
template <int Threads, class... RowAt>
__device__ void shift_rows(const std::int32_t* evicted, std::int32_t e, std::int32_t len, std::byte* stage,
                           std::int64_t stage_bytes, std::int32_t* dst_slot, std::int32_t max_group,
                           shifted_rows<RowAt>... arrays) {
  if (e == 0) return;
  const std::int64_t row_bytes = (arrays.row_bytes + ... + 0);
  if (row_bytes == 0) return;
  // Room for each part's alignment padding.
  const std::int64_t fit = (stage_bytes - 16 * std::int64_t{sizeof...(RowAt)}) / row_bytes;
  if (fit < 1) {
    if constexpr (sizeof...(RowAt) > 1) {
      (shift_rows<Threads>(evicted, e, len, stage, stage_bytes, dst_slot, max_group, arrays), ...);
    } else {
      (detail::shift_unstaged<Threads>(arrays, evicted, e, len), ...);
    }
    return;
  }
  const std::int32_t group = static_cast<std::int32_t>(fit < max_group ? fit : max_group);
  for (std::int32_t start = evicted[0] + 1; start < len; start += group) {
    const std::int32_t count = len - start < group ? len - start : group;
    // dst_slot[i] for slot start + i: -1 if evicted; else start + i - rank.
    for (std::int32_t i = threadIdx.x; i < count; i += Threads) {
      const std::int32_t t = start + i;
      std::int32_t lo = 0, hi = e;  // rank = #evicted < t
      while (lo < hi) {
        const std::int32_t mid = (lo + hi) / 2;
        if (evicted[mid] < t) lo = mid + 1; else hi = mid;
      }
      dst_slot[i] = (lo < e && evicted[lo] == t) ? -1 : t - lo;
    }
    __syncthreads();
    std::int64_t at = 0;
    (detail::stage_rows<Threads>(arrays, false, start, count, dst_slot, stage, at), ...);
    __syncthreads();
    at = 0;
    (detail::stage_rows<Threads>(arrays, true, start, count, dst_slot, stage, at), ...);
    __syncthreads();
  }
}

}  // namespace scissorhands::cuda::block
