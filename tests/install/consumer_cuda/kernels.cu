// An engine's CUDA translation unit: includes a scissorhands .cuh header
// (C++20) and instantiates one of its kernels. Compiled only.
#include <scissorhands/cuda/state.cuh>

static_assert(__cplusplus >= 202002L, "a translation unit that links scissorhands::cuda must compile as C++20");

namespace sh = scissorhands;

cudaError_t engine_forget_row(sh::eviction_state<sh::memory_space::device> state, std::int32_t row,
                              cudaStream_t stream) {
  return sh::cuda::reset_sequence(state, row, 0, stream);
}
