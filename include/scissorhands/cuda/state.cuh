#pragma once
// Device-side lifetime of the eviction state: the twins of host/state.hpp,
// on the caller's stream.
#include <cuda_runtime.h>

#include <cstdint>

#include "../detail/validate.hpp"
#include "../eviction_state.hpp"
#include "../model_state.hpp"

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
  state.blocks_done[row] = 0;
}
// Row `row` of every layer of a model state (one thread per layer).
template <int = 0>
__global__ void reset_model_sequence_kernel(model_state<memory_space::device> model, std::int32_t row,
                                            std::int32_t start_position) {
  for (std::int32_t l = static_cast<std::int32_t>(threadIdx.x); l < model.layers;
       l += static_cast<std::int32_t>(blockDim.x)) {
    const eviction_state<memory_space::device> s = model.layer(l);
    s.step[row] = 0;
    s.next_position[row] = start_position;
    s.tracked[row] = 0;
    s.status[row] = 0;
    s.blocks_done[row] = 0;
  }
}

inline void validate_model_laid_out(const char* fn, const model_state<memory_space::device>& model) {
  scissorhands::detail::require(model.layers > 0 && model.first.step != nullptr, fn, "model",
                                "is not laid out: build it with make_model_state");
  scissorhands::detail::validate_state(fn, model.first.shape, model.first.step);
  scissorhands::detail::require(model.layer_bytes >= scissorhands::detail::offsets_of(model.first.shape).total, fn,
                                "model.layer_bytes", "must be at least state_bytes(shape) = ",
                                scissorhands::detail::offsets_of(model.first.shape).total, ", got ",
                                model.layer_bytes);
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
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}

// The same for every layer of a model state (shared_layers eviction): one
// cudaMemsetAsync when the layers lie back to back (make_model_state), one
// per layer otherwise.
inline cudaError_t reset_state(model_state<memory_space::device> model, cudaStream_t stream = 0) {
  const char* fn = "cuda::reset_state";
  detail::validate_model_laid_out(fn, model);
  const std::size_t bytes = scissorhands::detail::offsets_of(model.first.shape).total;
  if (model.layer_bytes == bytes)
    return cudaMemsetAsync(static_cast<void*>(model.first.step), 0, bytes * static_cast<std::size_t>(model.layers),
                           stream);
  for (std::int32_t l = 0; l < model.layers; ++l)
    if (const cudaError_t err = cudaMemsetAsync(static_cast<void*>(model.layer(l).step), 0, bytes, stream);
        err != cudaSuccess)
      return err;
  return cudaSuccess;
}

// Forgets the tokens of state row `row` in every layer and clears its
// status words (one launch).
inline cudaError_t reset_sequence(model_state<memory_space::device> model, std::int32_t row,
                                  std::int32_t start_position = 0, cudaStream_t stream = 0) {
  const char* fn = "cuda::reset_sequence";
  detail::validate_model_laid_out(fn, model);
  scissorhands::detail::require(row >= 0 && row < model.first.shape.rows, fn, "row", "must be in [0, shape.rows = ",
                                model.first.shape.rows, "), got ", row);
  scissorhands::detail::require(start_position >= 0, fn, "start_position", "must be non-negative, got ",
                                start_position);
  detail::reset_model_sequence_kernel<><<<1, 32, 0, stream>>>(model, row, start_position);
  return cudaPeekAtLastError();  // peek: never clear an error of the engine's own
}

}  // namespace scissorhands::cuda
