#pragma once
// Device-side lifetime of the eviction state: the twins of host/state.hpp,
// on the caller's stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "../detail/validate.hpp"
#include "../eviction_state.hpp"

namespace scissorhands::cuda {

namespace detail {
// A template so that every translation unit may define it (header-only).
template <int = 0>
__global__ void reset_sequence_kernel(eviction_state<memory_space::device> state, std::int32_t row,
                                      std::int32_t start_position) {
  state.step[row] = 0;
  state.next_position[row] = start_position;
  state.tracked[row] = 0;
  state.status[row] = 0;
}
}  // namespace detail

// Zeroes every row: no token tracked, positions start at 0, status words 0.
inline cudaError_t reset_state(eviction_state<memory_space::device> state, cudaStream_t stream = 0) {
  scissorhands::detail::validate_state("cuda::reset_state", state.shape, state.step);
  return cudaMemsetAsync(static_cast<void*>(state.step), 0, scissorhands::detail::offsets_of(state.shape).total,
                         stream);
}

// Forgets the tokens of state row `row` (a sequence's row, not its batch
// position) and clears its status word; the next token admitted to it gets
// start_position. This is how an engine gives a row to a new request, and
// how it recovers a row whose status word a device check set.
inline cudaError_t reset_sequence(eviction_state<memory_space::device> state, std::int32_t row,
                                  std::int32_t start_position = 0, cudaStream_t stream = 0) {
  const char* fn = "cuda::reset_sequence";
  scissorhands::detail::validate_state(fn, state.shape, state.step);
  scissorhands::detail::require(row >= 0 && row < state.shape.rows, fn, "row", "must be in [0, shape.rows = ",
                                state.shape.rows, "), got ", row);
  scissorhands::detail::require(start_position >= 0, fn, "start_position", "must be non-negative, got ",
                                start_position);
  detail::reset_sequence_kernel<><<<1, 1, 0, stream>>>(state, row, start_position);
  return cudaGetLastError();
}

}  // namespace scissorhands::cuda
