#pragma once
// cuda::shrink_page_table: the device twin of host::shrink_page_table. After
// the last layer that shares a FlashInfer page table, it applies compress's
// new lengths in place, on the caller's stream: last_page_len is rewritten,
// the trailing pages each sequence no longer needs leave its list (indptr
// shrinks, indices close up) and their ids go to `released`, in sequence
// order, for the engine's pool. The result (the same table, the same
// released ids in the same order as the host's) is bit-identical to
// host::shrink_page_table.
//
// In place, with one block: sequences are taken in chunks, in ascending
// order, and a chunk's page ids in rounds, ascending; every round reads its
// ids into registers before any thread writes. A kept id only moves down
// (its new index is at most its old one), so no write ever lands on an id
// that is still to be read. indptr entries are read for a chunk before the
// chunk rewrites them.
//
// Data errors (what host::shrink_page_table throws for: indptr not starting
// at 0 or decreasing, last_page_len outside [1, page_size] for a sequence
// with pages, a new length negative or above the length the table holds,
// indptr[batch] above indices.size(), `released` too short) are found
// before anything is written: the table and `released` are left untouched
// and d_result->status says why (status_flag bits). Otherwise d_result gets
// {pages released, 0}. The result is overwritten by every call (not
// sticky), so a replayed graph reports each replay's own outcome; an engine
// reads it with the released count it needs anyway.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "../compress_output.hpp"
#include "../detail/validate.hpp"
#include "../span.hpp"
#include "block/collectives.cuh"
#include "status.cuh"
#include "traits.cuh"

namespace scissorhands::cuda {

// What shrink_page_table reports, in device memory (compress_output.hpp).
using scissorhands::shrink_result;

namespace detail {

struct page_table_args {
  std::int32_t* indptr = nullptr;
  std::int32_t* indices = nullptr;
  std::int64_t indices_size = 0;
  std::int32_t* last_page_len = nullptr;
  std::int32_t batch = 0;
  std::int32_t page_size = 1;
  const std::int32_t* new_lengths = nullptr;
  std::int32_t* released = nullptr;
  std::int64_t released_size = 0;
  shrink_result* result = nullptr;
};

template <int = 0>  // a template so every translation unit may define it
__global__ void __launch_bounds__(page_table_traits::threads) shrink_page_table_kernel(page_table_args a) {
  constexpr int threads = page_table_traits::threads, items = page_table_traits::items;
  using reduce = cub::BlockReduce<long long, threads>;
  using scan = cub::BlockScan<std::int32_t, threads>;
  __shared__ union {
    typename reduce::TempStorage reduce;
    typename scan::TempStorage scan;
  } tmp;
  __shared__ std::uint32_t verdict;
  __shared__ std::int32_t begin_s[threads + 1], kept_s[threads], write_s[threads], rel_s[threads];
  const auto tid = static_cast<std::int32_t>(threadIdx.x);
  const std::int64_t page_size = a.page_size;

  // 1. Check everything (host::shrink_page_table's checks) before writing.
  std::uint32_t bits = 0;
  long long total = 0;  // pages released
  if (tid == 0 && a.indptr[0] != 0) bits |= status_page_table;
  for (std::int32_t b = tid; b < a.batch; b += threads) {
    const std::int64_t pages = std::int64_t{a.indptr[b + 1]} - a.indptr[b];  // 64 bits: garbage must not overflow
    if (pages < 0) {
      bits |= status_page_table;
      continue;
    }
    const std::int32_t last = a.last_page_len[b];
    if (pages > 0 && (last < 1 || last > a.page_size)) {
      bits |= status_page_table;
      continue;
    }
    const std::int64_t held = pages == 0 ? 0 : (pages - 1) * page_size + last;
    const std::int32_t length = a.new_lengths[b];
    if (length < 0 || length > held) {
      bits |= status_new_length;
      continue;
    }
    total += pages - (std::int64_t{length} + page_size - 1) / page_size;  // 64 bits: no overflow near INT32_MAX
  }
  bits = block::block_or(bits);
  total = reduce(tmp.reduce).Sum(total);  // valid in thread 0
  if (tid == 0) {
    if (bits == 0 && a.indptr[a.batch] > a.indices_size) bits |= status_page_table;
    if (bits == 0 && total > a.released_size) bits |= status_released;
    verdict = bits;
    if (bits != 0) *a.result = {0, bits};
  }
  __syncthreads();
  if (verdict != 0) return;

  // 2. Rewrite, a chunk of sequences at a time.
  std::int32_t write_carry = 0, rel_carry = 0;
  for (std::int32_t s0 = 0; s0 < a.batch; s0 += threads) {
    const std::int32_t n = a.batch - s0 < threads ? a.batch - s0 : threads;
    const std::int32_t b = s0 + tid;
    std::int32_t begin = 0, pages = 0, kept = 0, length = 0;
    if (tid < n) {
      begin = a.indptr[b];
      pages = a.indptr[b + 1] - begin;
      length = a.new_lengths[b];
      kept = static_cast<std::int32_t>((std::int64_t{length} + page_size - 1) / page_size);
    }
    std::int32_t kept_before = 0, kept_all = 0, rel_before = 0, rel_all = 0;
    __syncthreads();  // tmp: the previous use is over
    scan(tmp.scan).ExclusiveSum(kept, kept_before, kept_all);
    __syncthreads();
    scan(tmp.scan).ExclusiveSum(pages - kept, rel_before, rel_all);
    if (tid < n) {
      begin_s[tid] = begin;
      kept_s[tid] = kept;
      write_s[tid] = write_carry + kept_before;
      rel_s[tid] = rel_carry + rel_before;
    }
    if (tid == n - 1) begin_s[n] = begin + pages;
    __syncthreads();
    const std::int32_t from = begin_s[0], to = begin_s[n];
    for (std::int32_t round = from; round < to; round += threads * items) {
      std::int32_t value[items], dest[items];  // dest >= 0: indices[dest]; < -1: released[-dest - 2]; -1: none
#pragma unroll
      for (int k = 0; k < items; ++k) {
        const std::int32_t i = round + k * threads + tid;
        dest[k] = -1;
        value[k] = 0;
        if (i < to) {
          // The sequence holding id i: the last s with begin_s[s] <= i.
          std::int32_t lo = 0, hi = n - 1;
          while (lo < hi) {
            const std::int32_t mid = (lo + hi + 1) / 2;
            if (begin_s[mid] <= i) lo = mid; else hi = mid - 1;
          }
          const std::int32_t at = i - begin_s[lo];
          value[k] = a.indices[i];
          dest[k] = at < kept_s[lo] ? write_s[lo] + at : -(rel_s[lo] + at - kept_s[lo]) - 2;
        }
      }
      __syncthreads();  // every id of the round is read before any is written
#pragma unroll
      for (int k = 0; k < items; ++k) {
        if (dest[k] >= 0)
          a.indices[dest[k]] = value[k];
        else if (dest[k] < -1)
          a.released[-dest[k] - 2] = value[k];
      }
      __syncthreads();
    }
    if (tid < n) {
      a.indptr[b] = write_s[tid];
      a.last_page_len[b] = kept == 0 ? 0 : length - (kept - 1) * a.page_size;
    }
    write_carry += kept_all;
    rel_carry += rel_all;
  }
  if (tid == 0) {
    a.indptr[a.batch] = write_carry;
    *a.result = {rel_carry, 0};
  }
}

}  // namespace detail

// Applies compress's new lengths to a FlashInfer page table in device
// memory, in place (see the top of this file): indptr[batch + 1],
// indices (indptr[batch] entries used), last_page_len[batch], and
// new_lengths[batch] from compress_output. The released page ids go to
// `released` (size it for the worst case, e.g. indices.size()), their count
// and any data error to *d_result. One block on the caller's stream; no
// allocation, no synchronisation, capturable in a graph. Run it in stream
// order after the last compress that shares the table and before the
// engine appends. The arrays must not overlap one another.
inline cudaError_t shrink_page_table(device_span<std::int32_t> indptr, device_span<std::int32_t> indices,
                                     device_span<std::int32_t> last_page_len, std::int32_t page_size,
                                     device_span<const std::int32_t> new_lengths, device_span<std::int32_t> released,
                                     shrink_result* d_result, cudaStream_t stream = 0) {
  const char* fn = "cuda::shrink_page_table";
  using scissorhands::detail::byte_range;
  using scissorhands::detail::overlaps;
  using scissorhands::detail::range_of;
  using scissorhands::detail::require;
  require(!indptr.empty() && indptr.data() != nullptr, fn, "indptr", "must hold batch + 1 entries, got ",
          indptr.size(), indptr.data() == nullptr ? " at a null pointer" : "");
  require(indptr.size() - 1 < static_cast<std::size_t>(INT32_MAX), fn, "indptr", "must hold at most INT32_MAX entries, got ",
          indptr.size());
  const std::size_t batch = indptr.size() - 1;
  require(page_size > 0, fn, "page_size", "must be positive, got ", page_size);
  require(new_lengths.size() == batch && (batch == 0 || new_lengths.data() != nullptr), fn, "new_lengths",
          "must hold indptr.size() - 1 = ", batch, " entries, got ", new_lengths.size());
  require(last_page_len.size() == batch && (batch == 0 || last_page_len.data() != nullptr), fn, "last_page_len",
          "must hold indptr.size() - 1 = ", batch, " entries, got ", last_page_len.size());
  require(indices.data() != nullptr || indices.empty(), fn, "indices", "must not be null when it holds entries");
  require(released.data() != nullptr || released.empty(), fn, "released", "must not be null when it holds entries");
  require(d_result != nullptr, fn, "d_result", "must point to a shrink_result in device memory");
  // Rewritten in place from one block: an array overlapping another would
  // be read after it was written.
  const byte_range ranges[] = {range_of(indptr, "indptr"), range_of(indices, "indices"),
                               range_of(last_page_len, "last_page_len"), range_of(new_lengths, "new_lengths"),
                               range_of(released, "released")};
  for (int i = 1; i < 5; ++i)
    for (int j = 0; j < i; ++j)
      require(!overlaps(ranges[i], ranges[j]), fn, ranges[i].name, "must not overlap ", ranges[j].name);
  detail::page_table_args a;
  a.indptr = indptr.data();
  a.indices = indices.data();
  a.indices_size = static_cast<std::int64_t>(indices.size());
  a.last_page_len = last_page_len.data();
  a.batch = static_cast<std::int32_t>(batch);
  a.page_size = page_size;
  a.new_lengths = new_lengths.data();
  a.released = released.data();
  a.released_size = static_cast<std::int64_t>(released.size());
  a.result = d_result;
  detail::shrink_page_table_kernel<><<<1, page_table_traits::threads, 0, stream>>>(a);
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}
// host::shrink_page_table's span call on the device: `result` one
// shrink_result in device memory, then the caller's stream.
inline cudaError_t shrink_page_table(device_span<std::int32_t> indptr, device_span<std::int32_t> indices,
                                     device_span<std::int32_t> last_page_len, std::int32_t page_size,
                                     device_span<const std::int32_t> new_lengths, device_span<std::int32_t> released,
                                     device_span<shrink_result> result, cudaStream_t stream = 0) {
  scissorhands::detail::require(!result.empty() && result.data() != nullptr, "cuda::shrink_page_table", "result",
                                "must hold one shrink_result, got ", result.size());
  return shrink_page_table(indptr, indices, last_page_len, page_size, new_lengths, released, result.data(), stream);
}
// For the table a paged view was made over, with the view's page size
// (host::shrink_page_table's view form: the page size cannot disagree with
// the table). The view's arrays must be the engine's writable table.
template <class View>
  requires page_table_view<View>
cudaError_t shrink_page_table(const View& cache, device_span<const std::int32_t> new_lengths,
                              device_span<std::int32_t> released, shrink_result* d_result, cudaStream_t stream = 0) {
  static_assert(View::space == memory_space::device, "cuda::shrink_page_table needs a device view");
  const auto table = scissorhands::detail::page_table_of("cuda::shrink_page_table", cache);
  return shrink_page_table(table.indptr, table.indices, table.last_page_len, table.page_size, new_lengths, released,
                           d_result, stream);
}
template <class View>
  requires page_table_view<View>
cudaError_t shrink_page_table(const View& cache, device_span<const std::int32_t> new_lengths,
                              device_span<std::int32_t> released, device_span<shrink_result> result,
                              cudaStream_t stream = 0) {
  static_assert(View::space == memory_space::device, "cuda::shrink_page_table needs a device view");
  const auto table = scissorhands::detail::page_table_of("cuda::shrink_page_table", cache);
  return shrink_page_table(table.indptr, table.indices, table.last_page_len, table.page_size, new_lengths, released,
                           result, stream);
}

}  // namespace scissorhands::cuda
