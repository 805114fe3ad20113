// The README's integration block for the CUDA backend: the same template,
// instantiated for memory_space::device in an nvcc translation unit, so
// that "one integration for both backends" is compiled, not only claimed.
// Compiled, never run (the host instantiation is driven by readme_test;
// tests/cuda/token_level.cu's one_api part runs an engine of the same
// shape on a device).
#include <scissorhands/scissorhands.cuh>

#include "readme_snippet.cpp"

template struct eviction<scissorhands::memory_space::device>;

std::size_t readme_device_workspace_bytes(scissorhands::device_paged_kv_view<float> largest,
                                          const scissorhands::state_shape& shape) {
  return eviction<scissorhands::memory_space::device>::workspace_bytes(largest, shape);
}
