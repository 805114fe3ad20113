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
__global__ void reset_sequence_kernel(eviction_state<memory_space::device> state, std::int32_t b,
                                      std::int32_t start_position) {
  state.step[b] = 0;
  state.next_position[b] = start_position;
  state.tracked[b] = 0;
}
}  // namespace detail

// Zeroes every sequence: no token tracked, positions start at 0.
inline cudaError_t reset_state(eviction_state<memory_space::device> state, cudaStream_t stream = 0) {
  scissorhands::detail::validate_state("cuda::reset_state", state.shape, state.step);
  return cudaMemsetAsync(static_cast<void*>(state.step), 0, scissorhands::detail::offsets_of(state.shape).total,
                         stream);
}

// Forgets sequence b's tokens; its next admitted token gets start_position.
// Does not look at the status word: this is how a caller recovers a
// sequence before clearing the word.
inline cudaError_t reset_sequence(eviction_state<memory_space::device> state, std::int32_t b,
                                  std::int32_t start_position = 0, cudaStream_t stream = 0) {
  const char* fn = "cuda::reset_sequence";
  scissorhands::detail::validate_state(fn, state.shape, state.step);
  scissorhands::detail::require(b >= 0 && b < state.shape.batch, fn, "b", "must be in [0, batch = ",
                                state.shape.batch, "), got ", b);
  scissorhands::detail::require(start_position >= 0, fn, "start_position", "must be non-negative, got ",
                                start_position);
  detail::reset_sequence_kernel<><<<1, 1, 0, stream>>>(state, b, start_position);
  return cudaGetLastError();
}

}  // namespace scissorhands::cuda
