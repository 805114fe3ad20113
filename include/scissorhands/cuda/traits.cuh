#pragma once
// Kernel traits: every tile constant of the CUDA backend, derived in one
// place and checked with static_asserts (after flash-attention's
// kernel_traits). Policies as structs of constants, as in CUB.
#include <cstddef>
#include <cstdint>

namespace scissorhands::cuda {

namespace detail {
constexpr bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }
}  // namespace detail

// Bookkeeping kernels (checks, admission, observe from probabilities): one
// thread per slot, `items` slots per thread per block.
struct slot_traits {
  static constexpr int threads = 256;
  static constexpr int items = 4;
  static constexpr int chunk = threads * items;  // fewest slots a block takes (detail/slot_chunks.hpp)
  // Most blocks a launch has when the sequences can be long (the chunks
  // grow instead): about two waves at eight blocks an SM on an H100/H200.
  static constexpr std::int64_t max_blocks = 2048;
  static_assert(threads % 32 == 0);
};

// Observe from queries with the log-sum-exp given: how a head's slots are
// split over blocks (detail/slot_chunks.hpp). About four waves at two
// blocks an SM (qk_traits::min_blocks) on an H100/H200; chunks of at least
// min_chunk slots, so a short sequence still spreads over several blocks.
// Without the log-sum-exp a block takes its whole head (it computes the
// head's normaliser first).
struct qk_chunk_traits {
  static constexpr int min_chunk = 256;
  static constexpr std::int64_t max_blocks = 1024;
};

// Observe from queries. A lane group of `lanes` lanes reads `rows` K rows a
// round with 16-byte loads (each lane `per_lane` vectors of `vec` elements
// per row), multiplies them with a tile of `max_queries` query heads, and
// reduce-scatters the rows x queries dot products over the group so each
// lane ends with `held` of them (one for head_dim 128 in 16-bit types).
// HeadDim > 0: a fast path with every count known at compile time.
// HeadDim == 0: any head_dim whose rows are 16-byte aligned multiples of 16
// bytes. HeadDim == -1: scalar loads, any head_dim and alignment. The
// generic paths use one row a round and plain butterflies.
template <class T, int HeadDim>
struct qk_traits {
  static constexpr int threads = 256;
  static constexpr int min_blocks = 2;  // register cap 128: two blocks an SM
  static constexpr int warps = threads / 32;
  static constexpr int max_queries = 4;  // query heads per tile (GQA 8 = two tiles)
  static constexpr int vec = 16 / static_cast<int>(sizeof(T));
  static constexpr bool fixed = HeadDim > 0;
  static constexpr bool scalar = HeadDim < 0;
  static constexpr int vectors = fixed ? HeadDim / vec : 0;
  static constexpr int lanes = fixed ? (vectors < 32 ? vectors : 32) : 32;
  static constexpr int per_lane = fixed ? vectors / lanes : 0;
  static constexpr int rows = fixed ? 4 : 1;  // rows a lane group reads per round
  static constexpr int values = rows * max_queries;
  static constexpr int held = values >= lanes ? values / lanes : 1;  // values a lane keeps after the scatter
  static constexpr int copies = values >= lanes ? 1 : lanes / values;  // lanes holding each value
  static_assert(threads % 32 == 0);
  static_assert(16 % sizeof(T) == 0, "elements must tile a 16-byte vector");
  static_assert(!fixed || HeadDim % vec == 0, "fast-path head_dim must be a multiple of the vector width");
  static_assert(!fixed || vec % 4 == 0, "the fast paths read queries four floats at a time: elements of at most 4 bytes");
  static_assert(!fixed || detail::is_pow2(lanes), "lanes per row must be a power of two");
  static_assert(!fixed || vectors % lanes == 0, "each lane must own the same number of vectors");
  static_assert(detail::is_pow2(values), "the reduce-scatter halves rows x queries values");
  static_assert(!fixed || rows <= lanes, "one lane per row updates the state");
};

// compress, selection: one block per (sequence, KV head). Keys of up to
// tile_keys slots are cached in shared memory; longer heads recompute keys
// from the state on every pass (the path for budgets beyond shared memory).
struct select_traits {
  static constexpr int threads = 256;
  static constexpr int warps = threads / 32;
  static constexpr int tile_keys = 4096;
  static constexpr int argmin_items = 8;  // slots a thread loads before it compares (m = 1)
  static constexpr int radix_bits = 8;
  static constexpr int radix_bins = 1 << radix_bits;
  static constexpr std::size_t key_bytes = tile_keys * sizeof(std::uint64_t);
  static_assert(threads >= radix_bins / 8 && threads % 32 == 0);
  static_assert(64 % radix_bits == 0);
  static_assert(key_bytes + radix_bins * sizeof(std::uint32_t) <= 40 * 1024,
                "static shared memory must stay under the 48 KiB default");
};

// compress, compaction: one block per (sequence, KV head).
struct compact_traits {
  static constexpr int threads = 256;
  static constexpr int pair_batch = threads;     // (hole, source) pairs resolved per round
  // The order-preserving shift stages the rows of up to shift_group slots,
  // of every array it moves, in stage_bytes of dynamic shared memory, given
  // only to launches that shift (stage_for): 40 KiB hold 70 slots of a
  // Llama-3-8B bf16 head (K and V 512 bytes, the state 64), under the
  // 48 KiB a launch may ask without opting in, and four blocks still fit
  // an H100/H200 SM.
  static constexpr int stage_bytes = 40 * 1024;
  static constexpr int shift_group = 1024;  // dst_slot's size: also holds pair_batch pairs' destinations
  static constexpr std::size_t stage_for(bool stable) { return stable ? stage_bytes : 0; }
  // The stage also holds 16 bytes of alignment room for each of the up to
  // eight arrays a shift moves (K and V of two planes, the token state).
  static_assert(shift_group >= pair_batch && stage_bytes > 16 * 8);
  static_assert(stage_bytes % 16 == 0 && threads % 32 == 0);
};

// shrink_page_table: one block walks the whole table (once per step, after
// the last layer), `items` page ids per thread per round.
struct page_table_traits {
  static constexpr int threads = 256;
  static constexpr int items = 4;
  static_assert(threads % 32 == 0);
};

}  // namespace scissorhands::cuda
