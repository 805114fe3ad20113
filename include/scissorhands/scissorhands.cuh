#pragma once
// Umbrella header with the CUDA backend: everything scissorhands.hpp has,
// plus the device twins of the host backend and the __half /
// __nv_bfloat16 element traits. Needs nvcc (C++20) and CCCL.
//
//   namespace sh = scissorhands;     // not `using namespace`: ::cuda exists too
//   sh::cuda::reset_state(state, stream);
//   sh::cuda::reset_sequence(state, b, start_position, stream);
//   sh::cuda::admit(policy, cache, state, d_status, stream);
//   sh::cuda::observe_probabilities(policy, cache, state, probs, d_status, stream);
//   sh::cuda::observe_queries(policy, cache, state, queries, lse, softmax_scale, d_status, stream);
//   sh::cuda::compress(d_workspace, workspace_bytes, policy, cache, state, budget,
//                      freed_pages, d_status, stream);   // d_workspace == nullptr: size query
//
// Same views (kv_view / paged_kv_view over device spans), policies and
// state layout (make_state over a device buffer) as the host backend, and
// the same results: observe_probabilities and compress bit for bit,
// observe_queries within float rounding of the dot products. Every call
// validates on the host what needs no device memory (throwing
// scissorhands::invalid_argument), checks the rest on the device before
// writing anything (cuda/status.cuh: the status word), launches on the
// caller's stream, allocates nothing and never synchronises, so a decode
// step's observe + compress can be captured in a CUDA graph.
//
// Bit-exactness assumes IEEE division and square root on the device
// (nvcc's defaults); --use_fast_math or -prec-div=false breaks it.
#include "scissorhands.hpp"

#include "cuda/compress.cuh"
#include "cuda/element.cuh"
#include "cuda/observe.cuh"
#include "cuda/state.cuh"
#include "cuda/status.cuh"
#include "cuda/traits.cuh"
