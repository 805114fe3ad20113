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

// Shifts the kept rows of [first, len) down in slot order: slot t (not
// evicted) goes to dst_of(t) <= t. `evicted` is the ascending list of the
// e evicted slots. Rows are staged through shared memory `stage` a group at
// a time: every source of a group is read before any of its destinations is
// written, and a destination is never a later group's source (dst_of(t) <=
// t), so the shift is safe in place. `dst_slot` holds `max_group` ints.
// The stage holds rows contiguously, strided ones (a ring) unit-major.
template <int Threads, class RowAt>
__device__ void shift_rows(RowAt row_at, std::int64_t row_bytes, int vec, std::int64_t unit_stride,
                           const std::int32_t* evicted,
                           std::int32_t e, std::int32_t len, std::byte* stage, std::int64_t stage_bytes,
                           std::int32_t* dst_slot, std::int32_t max_group) {
  if (e == 0) return;
  const std::int64_t units = row_bytes / vec;
  std::int64_t fit = stage_bytes / row_bytes;
  const bool staged = fit >= 1;
  const std::int32_t group = staged ? static_cast<std::int32_t>(fit < max_group ? fit : max_group) : 1;
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
    if (staged) {
      // Strided units (a history ring) row-fastest, and staged unit-major so
      // that consecutive threads use consecutive shared-memory words too.
      const bool rows_fastest = unit_stride != vec;
      auto staged_at = [&](std::int32_t r, std::int64_t unit) {
        return stage + (rows_fastest ? (unit * count + r) * vec : r * row_bytes + unit * vec);
      };
      for_each_unit<Threads>(
          units, count,
          [&](std::int32_t r, std::int64_t unit) {
            if (dst_slot[r] >= 0) copy_unit(staged_at(r, unit), row_at(start + r) + unit * unit_stride, vec);
          },
          0, rows_fastest);
      __syncthreads();
      for_each_unit<Threads>(
          units, count,
          [&](std::int32_t r, std::int64_t unit) {
            if (dst_slot[r] >= 0) copy_unit(row_at(dst_slot[r]) + unit * unit_stride, staged_at(r, unit), vec);
          },
          0, rows_fastest);
    } else if (dst_slot[0] >= 0) {
      // A row larger than the stage: one at a time, straight (its
      // destination's token has already moved, and the rows are distinct).
      for (std::int64_t i = threadIdx.x; i < units; i += Threads)
        copy_unit(row_at(dst_slot[0]) + i * unit_stride, row_at(start) + i * unit_stride, vec);
    }
    __syncthreads();
  }
}

}  // namespace scissorhands::cuda::block
