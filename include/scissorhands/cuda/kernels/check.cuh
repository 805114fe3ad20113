#pragma once
// Check kernels: the data-dependent part of the host backend's validation,
// run before any kernel that writes (see status.cuh). They only read, and OR
// status bits into the caller's status word.
#include <cstdint>

#include "../../attention_view.hpp"
#include "../../eviction_state.hpp"
#include "../block/collectives.cuh"
#include "../detail/tables.cuh"
#include "../status.cuh"
#include "../traits.cuh"

namespace scissorhands::cuda::detail {

struct sequence_scalars {
  std::int32_t length = 0;
  std::int32_t tracked = 0;
  std::int32_t next_position = 0;
};

// host::detail::validate_common's checks of sequence b (page table, length,
// tracked, next_position), by the whole block; every thread gets the bits.
__device__ inline std::uint32_t check_sequence(const sequence_table& seqs,
                                               const eviction_state<memory_space::device>& state, std::int32_t b,
                                               sequence_scalars& out) {
  std::uint32_t bits = seqs.check_sequence(b, out.length);
  out.tracked = state.tracked[b];
  out.next_position = state.next_position[b];
  if (!(bits & (status_page_table | status_length))) {
    if (out.tracked < 0 || out.tracked > out.length)
      bits |= status_tracked;
    else if (out.next_position < 0 ||
             std::int64_t{out.next_position} + (out.length - out.tracked) > std::int64_t{INT32_MAX})
      bits |= status_position_overflow;
  }
  return block::block_or(bits);
}

enum class observe_mode { admit, probabilities, queries };

// Grid (q_heads, batch) for the attention modes, (1, batch) for admit.
// Block (qh, b) checks sequence b's scalars (reported by qh == 0) and the
// probabilities or log-sum-exp values of query head qh.
template <observe_mode Mode>
__global__ void __launch_bounds__(slot_traits::threads)
    observe_check_kernel(sequence_table seqs, eviction_state<memory_space::device> state,
                         probability_view<memory_space::device> probs, lse_view<memory_space::device> lse,
                         std::int32_t q_len, std::uint32_t* d_status) {
  const auto b = static_cast<std::int32_t>(blockIdx.y);
  const auto qh = static_cast<std::int32_t>(blockIdx.x);
  sequence_scalars seq;
  std::uint32_t bits = check_sequence(seqs, state, b, seq);
  if (Mode != observe_mode::admit && bits == 0 && q_len > seq.length) bits |= status_query_length;
  std::uint32_t report = qh == 0 ? bits : 0;
  if (bits == 0) {
    if constexpr (Mode == observe_mode::probabilities) {
      // The host's extent rule, with the longest sequence of the batch.
      if (b == 0 && qh == 0) {
        std::int32_t longest = 0;
        for (std::int32_t s = threadIdx.x; s < seqs.batch; s += blockDim.x) {
          const std::int32_t l = seqs.length(s);
          longest = l > longest ? l : longest;
        }
        longest = block::block_max(longest);
        const std::int64_t reach = std::int64_t{seqs.batch - 1} * probs.sequence_stride +
                                   std::int64_t{probs.q_heads - 1} * probs.head_stride +
                                   std::int64_t{q_len - 1} * probs.query_stride + longest;
        if (reach > static_cast<std::int64_t>(probs.data.size())) report |= status_view_extent;
      }
      // Never read past the span, whatever the other sequences say.
      const std::int64_t last = std::int64_t{b} * probs.sequence_stride + std::int64_t{qh} * probs.head_stride +
                                std::int64_t{q_len - 1} * probs.query_stride + seq.length;
      if (last > static_cast<std::int64_t>(probs.data.size())) {
        report |= status_view_extent;
      } else {
        for (std::int32_t j = 0; j < q_len; ++j) {
          const float* row = probs.row(b, qh, j);
          const std::int32_t visible = seq.length - q_len + j + 1;
          for (std::int32_t t = threadIdx.x; t < visible; t += blockDim.x) {
            const float p = row[t];
            if (!(p >= 0.0f && p <= 1.001f)) report |= status_probability;  // NaN fails too
          }
        }
      }
    } else if constexpr (Mode == observe_mode::queries) {
      if (lse.present())
        for (std::int32_t j = threadIdx.x; j < q_len; j += blockDim.x)
          if (!isfinite(lse.natural(b, qh, j))) report |= status_lse;
    }
  }
  report = block::block_or(report);
  if (threadIdx.x == 0 && report != 0) atomicOr(d_status, report);
}

}  // namespace scissorhands::cuda::detail
