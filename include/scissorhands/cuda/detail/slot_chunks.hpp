#pragma once
// How the slot kernels (admission, observe from probabilities, observe from
// queries with the log-sum-exp given) split a sequence's slots over the
// blocks of one (KV head, sequence).
//
// The host cannot read the lengths (they are device data, and a decode
// step must stay capturable in a CUDA graph), so it sizes the grid by the
// longest a sequence can be at the call (max_slots): enough blocks for
// chunks of `min_chunk` slots, but at most `max_blocks` in all. Each block
// then takes its share of its own sequence's length: chunks of
// ceil(len / blocks) slots rounded up to a warp's 32 (so chunks start on
// 128-byte boundaries of the state's per-slot arrays), and at least
// min_chunk (a short sequence stays on few blocks). So a
// state sized for the longest prompt (far above the decode lengths)
// launches no more blocks than the cap and spreads each sequence over the
// blocks it has, instead of launching a block per min_chunk of capacity
// that finds nothing to do, or giving a whole sequence to one block.
//
// Plain constexpr functions (host and device): a host test
// (tests/host/slot_chunks_test.cpp) checks that the chunks cover every slot
// of every length exactly once, in order.
#include <cstdint>

#include "../../config.hpp"

namespace scissorhands::cuda::detail {

// Slots [lo, hi) of a block; empty when lo == hi.
struct slot_range {
  std::int32_t lo = 0, hi = 0;
};

// Blocks along one (KV head, sequence) of a grid of `lines` of them: as
// many as chunks of min_chunk slots of the longest sequence (`slots`), at
// most max_blocks / lines (so the grid holds about max_blocks blocks), at
// least 1.
constexpr std::int32_t chunk_blocks(std::int32_t slots, std::int64_t lines, std::int32_t min_chunk,
                                    std::int64_t max_blocks) {
  const std::int64_t needed = (std::int64_t{slots} + min_chunk - 1) / min_chunk;
  const std::int64_t cap = lines > 0 && max_blocks / lines > 1 ? max_blocks / lines : 1;
  const std::int64_t n = needed < cap ? needed : cap;
  return n > 1 ? static_cast<std::int32_t>(n) : 1;
}

// Chunks (but the last of a sequence) are multiples of this many slots.
inline constexpr std::int32_t chunk_quantum = 32;

// Block `block` of `blocks`' slots of a sequence of `len` slots (len >= 0,
// blocks >= 1, min_chunk >= 1): the block-th chunk of ceil(len / blocks)
// slots rounded up to a multiple of chunk_quantum, or of min_chunk slots
// if that is more; blocks past the end get an empty range. A 32-bit
// division (one per block): len <= INT32_MAX, so share + 31 stays below
// 2^32.
SCISSORHANDS_HOST_DEVICE constexpr slot_range chunk_of(std::int32_t len, std::int32_t blocks, std::int32_t block,
                                                       std::int32_t min_chunk) {
  const auto n = static_cast<std::uint32_t>(len), b = static_cast<std::uint32_t>(blocks);
  constexpr auto q = static_cast<std::uint32_t>(chunk_quantum);
  const std::uint32_t share = n / b + (n % b != 0 ? 1u : 0u);
  const std::uint32_t rounded = (share + q - 1) / q * q;
  const auto least = static_cast<std::uint32_t>(min_chunk);
  const std::uint32_t chunk = rounded < least ? least : rounded;
  const std::int64_t lo = std::int64_t{block} * chunk, hi = lo + chunk;
  return {static_cast<std::int32_t>(lo < len ? lo : len), static_cast<std::int32_t>(hi < len ? hi : len)};
}

}  // namespace scissorhands::cuda::detail
