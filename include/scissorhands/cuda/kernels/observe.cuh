#pragma once
// Observe kernels. Every kernel here first reads the status word of its
// sequence's state row and skips the sequence when the row is -1 or the
// word is non-zero (the check kernel ran before it on the stream), and
// skips sequences that hold no token.
//
// Per-row counters (step, tracked, next_position) are read by every block
// of a sequence and written only by the last of them to finish
// (finish_block), so no block can see a half-updated sequence whatever
// order blocks run in.
#include <cstdint>
#include <type_traits>

#include "../../attention_view.hpp"
#include "../../element.hpp"
#include "../../eviction_state.hpp"
#include "../../policy/eviction_policy.hpp"
#include "../../quantized_kv_view.hpp"
#include "../block/collectives.cuh"
#include "../detail/slot_chunks.hpp"
#include "../detail/tables.cuh"
#include "../detail/validate.cuh"  // max_quantized_key_floats
#include "../launch.cuh"
#include "../traits.cuh"
#include "check.cuh"

namespace scissorhands::cuda::detail {

// A static observation's score of K row (b, h, t): of its elements, or of
// a quantized row's dequantized values (host: static_score_of, the same
// bits). key_norm streams the row through dequantize_element (the same
// values as the host's dequantize_row, summed in the same order);
// recency and random_score never read the key; any other static policy
// gets the row dequantized into a local buffer of max_quantized_key_floats
// (validate_static_key bounds head_dim for it).

template <class Obs, class T>
__device__ inline float static_key_score(const row_table<T>& rows, std::int32_t b, std::int32_t h, std::int32_t t,
                                         std::int32_t head_dim, std::int32_t position, const settings& cfg) {
  return Obs::static_score(rows.k_row(b, h, t), head_dim, position, h, cfg);
}
template <class Obs>
__device__ inline float static_key_score(const quantized_rows& rows, std::int32_t b, std::int32_t h,
                                         std::int32_t t, std::int32_t head_dim, std::int32_t position,
                                         const settings& cfg) {
  if constexpr (std::is_same_v<Obs, recency> || std::is_same_v<Obs, random_score>) {
    return Obs::static_score(static_cast<const float*>(nullptr), head_dim, position, h, cfg);
  } else {
    const std::uint8_t* codes = rows.codes.k_row(b, h, t);
    const float* params = rows.params.k_row(b, h, t);
    if constexpr (std::is_same_v<Obs, key_norm>) {
      // key_norm::static_score on the dequantized row, without the row.
      float sum = 0.0f;
      for (std::int32_t d = 0; d < head_dim; ++d) {
        const float x = dequantize_element(codes, params, d, rows.quantization);
        sum = fmaf(x, x, sum);
      }
      return -sqrtf(sum);
    } else {
      float k[max_quantized_key_floats];
      dequantize_row(codes, params, head_dim, rows.quantization, k);
      return Obs::static_score(static_cast<const float*>(k), head_dim, position, h, cfg);
    }
  }
}

// Admits slot t of head h of sequence b, state row r (host::detail::admit,
// one slot): its position, a fresh history and, for static policies, its
// score. `rows`: a row_table<T> or quantized_rows (static scores read K).
template <class Obs, class Rows>
__device__ inline void admit_slot(const settings& cfg, const Rows& rows, std::int32_t head_dim,
                                  const eviction_state<memory_space::device>& state, std::int32_t b, std::int32_t r,
                                  std::int32_t h, std::int32_t t, std::int32_t first, std::int32_t next_position) {
  const std::int64_t i = state.row_index(r, h, t);
  const std::int32_t position = next_position + (t - first);
  state.positions[i] = position;
  if constexpr (Obs::needs_attention)
    state.scores[i] = 0.0f;
  else
    state.scores[i] = static_key_score<Obs>(rows, b, h, t, head_dim, position, cfg);
  state.observed[i] = 0.0f;
  const history_ring ring = state.ring_of(r, h, t);
  for (std::int32_t w = 0; w < state.shape.ring_words; ++w) ring[w] = 0u;
}

// Per-row counters, after every block of the sequence is done with them:
// as host::detail::admit (next_position, tracked) and observe (step,
// advanced by the sequence's `queries` when it holds tokens). Every block
// of a live row calls this once, at its end, with all its threads; each
// takes a ticket in the row's blocks_done word, and the last of the
// sequence's gridDim.x * gridDim.y blocks updates the counters (which
// every block has read by then) and puts the word back to 0. This saves
// the separate finalize launch of one thread per sequence. Rows that are
// not live are skipped by every block alike (no kernel of the launch
// writes a status word), so their word stays 0.
template <bool Attention>
__device__ inline void finish_block(const eviction_state<memory_space::device>& state, std::int32_t r,
                                    std::int32_t len, std::int32_t queries) {
  __syncthreads();  // every thread of the block is done with the row's counters
  if (threadIdx.x != 0) return;
  __threadfence();  // this block's reads and writes before its ticket
  const unsigned blocks = gridDim.x * gridDim.y;
  if (atomicAdd(&state.blocks_done[r], 1u) != blocks - 1) return;
  __threadfence();  // every other block's, before the counters change
  state.next_position[r] += len - state.tracked[r];
  state.tracked[r] = len;
  if constexpr (Attention)
    if (len > 0) state.step[r] += queries;
  state.blocks_done[r] = 0;
}

// This block's slots of a sequence of len slots in a grid (chunks,
// kv_heads, batch) of a slot kernel (detail/slot_chunks.hpp; min_chunk as
// the host's slot_grid was given).
__device__ inline slot_range block_slots(std::int32_t len, std::int32_t min_chunk = slot_traits::chunk) {
  return chunk_of(len, static_cast<std::int32_t>(gridDim.x), static_cast<std::int32_t>(blockIdx.x), min_chunk);
}

// Admission only (static policies, cuda::admit). Grid (chunks, kv_heads, batch).
template <class Obs, class Rows>
__global__ void __launch_bounds__(slot_traits::threads)
    admit_kernel(settings cfg, sequence_table seqs, Rows rows, std::int32_t head_dim,
                 eviction_state<memory_space::device> state) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  const auto b = static_cast<std::int32_t>(blockIdx.z), h = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t r = live_row(state, b);
  if (r < 0) return;
  const std::int32_t len = seqs.length(b), first = state.tracked[r], next = state.next_position[r];
  const slot_range mine = block_slots(len);
  for (std::int32_t t = (mine.lo > first ? mine.lo : first) + static_cast<std::int32_t>(threadIdx.x); t < mine.hi;
       t += slot_traits::threads)
    admit_slot<Obs>(cfg, rows, head_dim, state, b, r, h, t, first, next);
  finish_block<false>(state, r, len, 0);
}

// Observe from probabilities, fused with admission and the history update.
// One thread per slot: the same float operations in the same order as
// host::observe_probabilities (group combine in head order, finish,
// contribution, history update, steps in order), so the state is
// bit-identical. A sequence with no query this step (ragged, q_len(b) = 0)
// only has its new tokens admitted (the only slots it touches). Grid
// (chunks, kv_heads, batch).
template <class Policy>
__global__ void __launch_bounds__(slot_traits::threads)
    observe_probabilities_kernel(Policy policy, sequence_table seqs, eviction_state<memory_space::device> state,
                                 probability_view<memory_space::device> probs) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  using Obs = typename Policy::observation;
  using Gqa = typename Policy::gqa;
  using History = typename Policy::history;
  const settings& cfg = policy.config;
  const auto b = static_cast<std::int32_t>(blockIdx.z), h = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t r = live_row(state, b);
  if (r < 0) return;
  const std::int32_t len = seqs.length(b), first = state.tracked[r], next = state.next_position[r];
  const std::int32_t q_len = probs.queries_of(b), group = probs.q_heads / state.shape.kv_heads;
  if (len == 0) {
    finish_block<true>(state, r, len, q_len);
    return;
  }
  const std::int64_t step0 = state.step[r];
  const slot_range mine = block_slots(len);
  // Without a query this step only the new tokens change: the held ones
  // are neither loaded nor stored back.
  const std::int32_t lo = q_len > 0 || mine.lo >= first ? mine.lo : first;
  for (std::int32_t t = lo + static_cast<std::int32_t>(threadIdx.x); t < mine.hi; t += slot_traits::threads) {
    const std::int64_t i = state.row_index(r, h, t);
    const history_ring ring = state.ring_of(r, h, t);
    float score, observed;
    if (t >= first) {
      state.positions[i] = next + (t - first);
      score = 0.0f;
      observed = 0.0f;
      for (std::int32_t w = 0; w < state.shape.ring_words; ++w) ring[w] = 0u;
    } else {
      score = state.scores[i];
      observed = state.observed[i];
    }
    // Query j sees slots < len - q_len + j + 1.
    const std::int32_t j0 = t - (len - q_len) > 0 ? t - (len - q_len) : 0;
    for (std::int32_t j = j0; j < q_len; ++j) {
      const std::int32_t visible = len - q_len + j + 1;
      float acc = Gqa::identity();
      for (std::int32_t g = 0; g < group; ++g) acc = Gqa::combine(acc, probs.row(b, h * group + g, j)[t]);
      const float c = Obs::contribution(Gqa::finish(acc, group), visible, cfg);
      History::update(score, observed, ring, step0 + j, c, cfg, Obs::binary);
    }
    state.scores[i] = score;
    state.observed[i] = observed;
  }
  finish_block<true>(state, r, len, q_len);
}

}  // namespace scissorhands::cuda::detail
