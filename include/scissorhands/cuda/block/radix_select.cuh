#pragma once
// Block-wide selection of the k smallest of n unique 64-bit keys (CCCL 3.0.1
// has no cub::DeviceTopK, and one head's keys are one block's work).
//
// Keys come from a functor key_at(i), i in [0, n): a shared-memory tile, or
// recomputed from global memory on every pass when a head has more slots
// than shared memory holds. `ignored` keys (protected tokens) never count.
//
//   1. key_stats: one pass for the count, min and max of the keys.
//   2. radix_select: the k-th smallest key, most significant digit first,
//      8 bits a pass, starting at the first digit where min and max differ
//      and stopping as soon as a digit's bucket is taken whole. k == 1 is
//      the min (no pass), k == count the max.
//   3. list_selected: the slots whose key <= threshold, ascending, written
//      with a ballot-based stream compaction in slot order.
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "collectives.cuh"

namespace scissorhands::cuda::block {

inline constexpr std::uint64_t ignored_key = ~std::uint64_t{0};

struct key_stats {
  std::uint64_t min = ignored_key;
  std::uint64_t max = 0;
  std::int32_t count = 0;
};

struct key_stats_op {
  __device__ key_stats operator()(const key_stats& a, const key_stats& b) const {
    return {a.min < b.min ? a.min : b.min, a.max > b.max ? a.max : b.max, a.count + b.count};
  }
};

template <int Threads>
struct radix_select_storage {
  typename cub::BlockReduce<key_stats, Threads>::TempStorage reduce;
  std::uint32_t hist[256];
  std::uint32_t digit, before, in_bucket;
  std::int32_t warp_counts[Threads / 32];
};

// Count, min and max of the keys that are not ignored, for all threads.
// `visit(i, key)` sees every key once (the caller may cache it).
template <int Threads, class KeyAt, class Visit>
__device__ key_stats gather_key_stats(KeyAt key_at, std::int32_t n, Visit visit, radix_select_storage<Threads>& s) {
  key_stats mine;
  for (std::int32_t i = threadIdx.x; i < n; i += Threads) {
    const std::uint64_t key = key_at(i);
    visit(i, key);
    if (key == ignored_key) continue;
    mine.min = key < mine.min ? key : mine.min;
    mine.max = key > mine.max ? key : mine.max;
    ++mine.count;
  }
  __shared__ key_stats result;
  const key_stats all = cub::BlockReduce<key_stats, Threads>(s.reduce).Reduce(mine, key_stats_op{});
  if (threadIdx.x == 0) result = all;
  __syncthreads();
  const key_stats out = result;
  __syncthreads();
  return out;
}

// The k-th smallest (1-based, 1 <= k <= stats.count) key that is not
// ignored, for all threads. Keys must be unique.
template <int Threads, class KeyAt>
__device__ std::uint64_t radix_select(KeyAt key_at, std::int32_t n, std::int32_t k, const key_stats& stats,
                                      radix_select_storage<Threads>& s) {
  if (k <= 1) return stats.min;
  if (k >= stats.count) return stats.max;
  const std::uint64_t differ = stats.min ^ stats.max;  // non-zero: count >= 2 unique keys
  int shift = ((63 - __clzll(static_cast<long long>(differ))) / 8) * 8;
  // Bits above the first differing digit are shared by every candidate.
  std::uint64_t prefix = shift + 8 >= 64 ? 0 : stats.min & (~std::uint64_t{0} << (shift + 8));
  std::uint32_t remaining = static_cast<std::uint32_t>(k);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (;;) {
    const std::uint64_t above = shift + 8 >= 64 ? 0 : ~std::uint64_t{0} << (shift + 8);
    for (int i = threadIdx.x; i < 256; i += Threads) s.hist[i] = 0;
    __syncthreads();
    for (std::int32_t i = threadIdx.x; i < n; i += Threads) {
      const std::uint64_t key = key_at(i);
      if (key != ignored_key && (key & above) == prefix)
        atomicAdd(&s.hist[static_cast<std::uint32_t>(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (warp == 0) {
      // 8 bins a lane; an inclusive scan of the lane totals finds the bucket
      // holding the remaining-th key.
      std::uint32_t bins[8], total = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) total += (bins[i] = s.hist[lane * 8 + i]);
      std::uint32_t inclusive = total;
#pragma unroll
      for (int offset = 1; offset < 32; offset *= 2) {
        const std::uint32_t up = __shfl_up_sync(full_mask, inclusive, offset);
        if (lane >= offset) inclusive += up;
      }
      const std::uint32_t exclusive = inclusive - total;
      if (exclusive < remaining && remaining <= inclusive) {
        std::uint32_t before = exclusive;
        int d = lane * 8;  // shared memory, not bins[]: no local-memory array
        while (before + s.hist[d] < remaining) before += s.hist[d++];
        s.digit = static_cast<std::uint32_t>(d);
        s.before = before;
        s.in_bucket = s.hist[d];
      }
    }
    __syncthreads();
    const std::uint32_t digit = s.digit, before = s.before, in_bucket = s.in_bucket;
    __syncthreads();  // everyone has read before the next pass rewrites
    remaining -= before;
    prefix |= static_cast<std::uint64_t>(digit) << shift;
    const std::uint64_t below = shift == 0 ? 0 : (std::uint64_t{1} << shift) - 1;
    if (in_bucket == remaining) return prefix | below;  // the whole bucket goes
    if (shift == 0) return prefix;
    shift -= 8;
  }
}

// Writes, in ascending i, every i whose key is not ignored and <= threshold
// into out[0 .. limit) (at most `limit`; keys are unique so exactly k match).
// Returns how many were written.
template <int Threads, class KeyAt>
__device__ std::int32_t list_selected(KeyAt key_at, std::int32_t n, std::uint64_t threshold, std::int32_t* out,
                                      std::int32_t limit, radix_select_storage<Threads>& s) {
  constexpr int warps = Threads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  std::int32_t written = 0;
  for (std::int32_t base = 0; base < n && written < limit; base += Threads) {
    const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
    bool hit = false;
    if (i < n) {
      const std::uint64_t key = key_at(i);
      hit = key != ignored_key && key <= threshold;
    }
    const unsigned ballot = __ballot_sync(full_mask, hit);
    if (lane == 0) s.warp_counts[warp] = __popc(ballot);
    __syncthreads();
    std::int32_t offset = written, total = 0;
#pragma unroll
    for (int w = 0; w < warps; ++w) {
      if (w < warp) offset += s.warp_counts[w];
      total += s.warp_counts[w];
    }
    offset += __popc(ballot & ((1u << lane) - 1u));
    if (hit && offset < limit) out[offset] = i;
    written += total;
    __syncthreads();  // counts are read before the next round rewrites them
  }
  return written < limit ? written : limit;
}

}  // namespace scissorhands::cuda::block
