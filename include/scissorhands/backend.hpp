#pragma once
// One spelling of the per-step calls for both backends, so that an engine
// with a host and a CUDA path writes its integration once, as a template
// over the memory space:
//
//   template <scissorhands::memory_space Space>
//   void after_attention(scissorhands::backend<Space> be, ...) {
//     be.observe_queries(policy, cache, state, queries, lse);
//     be.compress(policy, cache, state, budget, workspace, out);
//   }
//
// backend<memory_space::host> (host/backend.hpp) forwards to host::,
// backend<memory_space::device> (cuda/backend.cuh) to cuda:: on the stream
// it was made with. Arguments are the same on both: views and spans of the
// backend's space, workspaces as spans in the same place, sized by the
// static *_workspace_bytes from the policy and shapes only (each backend
// its own size: query the one you run). Bad input throws
// scissorhands::invalid_argument on both; the device's calls return the
// launch's cudaError_t (data only the device can check sets the state's
// status words: cuda/status.cuh), the host's host_status::success (the
// host has no launch to fail). Both are [[nodiscard]]: code written for
// both checks a result one way, `if (!sh::succeeded(be.compress(...)))`.
#include "span.hpp"

namespace scissorhands {

template <memory_space Space>
struct backend;

// What backend<memory_space::host>'s calls return (every error throws).
enum class [[nodiscard]] host_status { success = 0 };

// Whether a backend call succeeded: its status is the value-initialised
// one (host_status::success, cudaSuccess), whatever the header order.
template <class Status>
constexpr bool succeeded(Status status) noexcept {
  return status == Status{};
}

}  // namespace scissorhands
