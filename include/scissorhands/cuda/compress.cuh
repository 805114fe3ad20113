#pragma once
// CUDA backend, steps 3-4: the twin of host::compress, on the caller's stream.
//
// Two-phase, like CUB: call with d_workspace == nullptr to get the bytes it
// needs in workspace_bytes (nothing is launched), then again with a device
// buffer of at least that size. Two kernels per call (see
// kernels/compress.cuh): selection, then compaction gated on *d_status, so
// a launch whose data fails a device check changes nothing (status.cuh).
// Whether a sequence triggers (length >= budget) is decided on the device.
// One workspace serves every layer of a stream (calls run in order); give
// concurrent streams their own.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../paged_kv_view.hpp"
#include "../policy/eviction_policy.hpp"
#include "detail/tables.cuh"
#include "detail/validate.cuh"
#include "kernels/compress.cuh"
#include "status.cuh"
#include "traits.cuh"

namespace scissorhands::cuda {

namespace detail {
template <class Policy, class View>
std::int32_t max_evict(const Policy& policy, const View& cache, std::int32_t budget) {
  const std::int64_t e = std::int64_t{cache.max_capacity()} - budget + policy.config.evict_count;
  return e > 0 ? static_cast<std::int32_t>(e) : 0;
}
}  // namespace detail

// Bytes of workspace compress needs for this cache, policy and budget.
template <class Policy, class View>
  requires composed_policy<Policy>
std::size_t compress_workspace_bytes(const Policy& policy, const View& cache, std::int32_t budget) {
  const char* fn = "cuda::compress_workspace_bytes";
  static_assert(View::space == memory_space::device, "the CUDA backend needs a device view");
  detail::validate_cache(fn, cache);
  detail::validate_settings(fn, policy);
  detail::validate_budget(fn, policy, budget);
  return detail::compress_workspace::bytes(cache.batch, cache.kv_heads, detail::max_evict(policy, cache, budget));
}

// Evicts, from every sequence holding `budget` tokens or more, the
// length - budget + m lowest-scoring unprotected tokens of each KV head, and
// compacts K, V and the state (fill_holes or preserve_order), exactly as
// host::compress. `freed_pages` (paged views: batch entries; contiguous:
// empty or batch entries) gets the trailing pages each sequence no longer
// uses.
template <class Policy, class View>
  requires composed_policy<Policy>
cudaError_t compress(void* d_workspace, std::size_t& workspace_bytes, const Policy& policy, View cache,
                     eviction_state<memory_space::device> state, std::int32_t budget,
                     device_span<std::int32_t> freed_pages, std::uint32_t* d_status, cudaStream_t stream = 0) {
  const char* fn = "cuda::compress";
  using T = typename View::element_type;
  if (d_workspace == nullptr) {
    workspace_bytes = compress_workspace_bytes(policy, cache, budget);
    return cudaSuccess;
  }
  detail::validate_common(fn, policy, cache, state, d_status);
  detail::validate_budget(fn, policy, budget);
  const std::int32_t max_evict = detail::max_evict(policy, cache, budget);
  const std::size_t need = detail::compress_workspace::bytes(cache.batch, cache.kv_heads, max_evict);
  detail::require(workspace_bytes >= need, fn, "workspace_bytes", "is ", workspace_bytes,
                  ", below the ", need, " bytes the workspace query returned");
  detail::require(reinterpret_cast<std::uintptr_t>(d_workspace) % detail::compress_workspace::alignment == 0, fn,
                  "d_workspace", "must be aligned to ", detail::compress_workspace::alignment, " bytes");
  detail::validate_freed_pages(fn, cache, freed_pages);

  const detail::sequence_table seqs = detail::make_sequence_table(cache);
  detail::compress_workspace ws;
  ws.lengths = static_cast<std::int32_t*>(d_workspace);
  ws.evicted = reinterpret_cast<std::int32_t*>(static_cast<std::byte*>(d_workspace) +
                                               detail::compress_workspace::list_offset(cache.batch));
  ws.max_evict = max_evict;
  const dim3 grid(static_cast<unsigned>(cache.kv_heads), static_cast<unsigned>(cache.batch));
  detail::select_kernel<typename Policy::protector>
      <<<grid, select_traits::threads, 0, stream>>>(policy.config, seqs, state, budget, ws, d_status);
  const detail::row_table<std::byte> rows = detail::make_row_table<std::byte>(cache);
  const std::int32_t row_bytes = cache.head_dim * static_cast<std::int32_t>(sizeof(T));
  const int vec = detail::row_alignment(rows, row_bytes, true);
  detail::compact_kernel<><<<grid, compact_traits::threads, 0, stream>>>(
      policy.config, seqs, rows, row_bytes, vec, state, budget, ws, freed_pages.empty() ? nullptr : freed_pages.data(),
      d_status);
  return cudaGetLastError();
}

}  // namespace scissorhands::cuda
