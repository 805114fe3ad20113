// How the CUDA slot kernels split a sequence's slots over blocks
// (cuda/detail/slot_chunks.hpp), checked without a GPU: whatever the grid
// the host picks and whatever length a sequence has on the device, the
// blocks' chunks cover its slots exactly once, in order, and the grid stays
// within its cap.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include <scissorhands/cuda/detail/slot_chunks.hpp>
#include <scissorhands/cuda/traits.cuh>

namespace {

namespace cd = scissorhands::cuda::detail;

std::int64_t share_of(std::int32_t len, std::int32_t blocks) { return (std::int64_t{len} + blocks - 1) / blocks; }

// The chunks of blocks 0..blocks-1 for `len` slots: consecutive, from 0 to
// len, all the same length but the last, that length a multiple of 32 at
// least min_chunk and less than 32 above the even share (or min_chunk);
// returns how many are not empty.
std::int32_t require_cover(std::int32_t len, std::int32_t blocks, std::int32_t min_chunk) {
  const std::int64_t share = share_of(len, blocks);
  std::int64_t next = 0, first_length = -1;
  std::int32_t used = 0;
  for (std::int32_t b = 0; b < blocks; ++b) {
    const cd::slot_range r = cd::chunk_of(len, blocks, b, min_chunk);
    INFO("len " << len << ", blocks " << blocks << ", min_chunk " << min_chunk << ", block " << b << ": [" << r.lo
                << ", " << r.hi << ")");
    REQUIRE(r.lo == next);
    REQUIRE(r.hi >= r.lo);
    REQUIRE(r.hi <= len);
    if (r.hi > r.lo) {
      ++used;
      if (first_length < 0) first_length = r.hi - r.lo;
      if (r.hi < len) {
        REQUIRE(r.hi - r.lo == first_length);
        REQUIRE(first_length % cd::chunk_quantum == 0);
        REQUIRE(first_length >= min_chunk);
        REQUIRE((first_length == min_chunk || first_length - share < cd::chunk_quantum));
      }
    }
    next = r.hi;
  }
  REQUIRE(next == len);
  return used;
}

}  // namespace

TEST_CASE("slot chunks: every slot of every length is in exactly one block's chunk") {
  for (std::int32_t min_chunk : {32, 256, 1024})
    for (std::int32_t blocks : {1, 2, 3, 7, 8, 64, 257})
      for (std::int32_t len : {0, 1, 2, 255, 256, 257, 1000, 1024, 1025, 2048, 5000, 65537, 200000}) {
        const std::int32_t used = require_cover(len, blocks, min_chunk);
        // A sequence that fills n chunks of min_chunk uses min(n, blocks)
        // blocks, but for the rounding to 32 (a few of many blocks).
        const std::int64_t fills = (std::int64_t{len} + min_chunk - 1) / min_chunk;
        if (fills <= blocks) REQUIRE(used == fills);
        else REQUIRE(std::int64_t{used} * (share_of(len, blocks) + cd::chunk_quantum) >= len);
      }
}

TEST_CASE("slot chunks: lengths near the int32 limit neither overflow nor lose slots") {
  const std::int32_t top = std::numeric_limits<std::int32_t>::max();
  for (std::int32_t blocks : {1, 2, 3, 4096})
    for (std::int32_t len : {top, top - 1, top - 255}) {
      const cd::slot_range last = cd::chunk_of(len, blocks, blocks - 1, 256);
      REQUIRE(last.hi == len);
      const cd::slot_range first = cd::chunk_of(len, blocks, 0, 256);
      REQUIRE(first.lo == 0);
      REQUIRE(first.hi > 0);
    }
  // A decode step before compress (B = 2048 plus the new token, 4 blocks a
  // head): four working blocks, not three of 768.
  REQUIRE(cd::chunk_of(2049, 4, 0, 256).hi == 544);
  REQUIRE(cd::chunk_of(2049, 4, 3, 256).lo == 3 * 544);
  REQUIRE(cd::chunk_of(2049, 4, 3, 256).hi == 2049);
  // A block index past the chunks a sequence fills gets nothing.
  REQUIRE(cd::chunk_of(300, 8, 2, 256).lo == 300);
  REQUIRE(cd::chunk_of(300, 8, 2, 256).hi == 300);
  REQUIRE(cd::chunk_of(0, 1, 0, 256).hi == 0);
}

TEST_CASE("slot chunks: the grid is sized by the longest sequence and capped") {
  using scissorhands::cuda::qk_chunk_traits;
  using scissorhands::cuda::slot_traits;
  constexpr auto qk = [](std::int32_t slots, std::int64_t lines) {
    return cd::chunk_blocks(slots, lines, qk_chunk_traits::min_chunk, qk_chunk_traits::max_blocks);
  };
  // Llama-3-8B layer, 8 KV heads. Batch 32, B = 2048: 4 blocks a head of
  // 512 slots, 1,024 blocks (as before the cap). Batch 1: 8 blocks of 256.
  REQUIRE(qk(2048, 8 * 32) == 4);
  REQUIRE(qk(2048, 8) == 8);
  // A state sized for a 32k prompt at batch 32: still 4 blocks a head (each
  // takes a quarter of its own sequence), not 128.
  REQUIRE(qk(32768, 8 * 32) == 4);
  REQUIRE(qk(0, 8) == 1);
  REQUIRE(qk(1, 1) == 1);
  // More lines than the cap: one block each.
  REQUIRE(qk(100000, 4096) == 1);
  REQUIRE(cd::chunk_blocks(100000, 0, 256, 1024) == 1);
  // The bookkeeping kernels: chunks of slot_traits::chunk, about 2048
  // blocks. Batch 32, B = 2048: 2 blocks a head (as before the cap); with a
  // state sized for 32k: 8, not 32.
  const auto slot = [](std::int32_t slots, std::int64_t lines) {
    return cd::chunk_blocks(slots, lines, slot_traits::chunk, slot_traits::max_blocks);
  };
  REQUIRE(slot(2048, 8 * 32) == 2);
  REQUIRE(slot(32768, 8 * 32) == 8);
  REQUIRE(slot(131072, 8 * 64) == 4);
  REQUIRE(slot(131072, 8) == 128);
  REQUIRE(slot(std::numeric_limits<std::int32_t>::max(), 1) == 2048);
  for (std::int32_t slots : {0, 1, 1000, 4096, 1 << 20})
    for (std::int64_t lines : {1, 3, 8, 256, 512, 5000}) {
      const std::int32_t x = qk(slots, lines);
      REQUIRE(x >= 1);
      REQUIRE((x == 1 || x * lines <= qk_chunk_traits::max_blocks));
      // No block that even the longest sequence could not reach.
      REQUIRE((x == 1 || std::int64_t{x - 1} * qk_chunk_traits::min_chunk < slots));
    }
}
