#pragma once
// Umbrella header with the CUDA backend: everything scissorhands.hpp has,
// plus the device twins of the host backend and the __half /
// __nv_bfloat16 element traits. Needs nvcc (C++20) and CCCL.
//
//   namespace sh = scissorhands;     // not `using namespace`: ::cuda exists too
//   sh::cuda::reset_state(state, stream);
//   sh::cuda::reset_sequence(state, row, start_position, stream);    // also clears the row's status
//   auto st = state.for_batch(d_state_rows);                          // optional: batch position -> row
//   sh::cuda::admit(policy, cache, st, stream);
//   sh::cuda::observe_probabilities(policy, cache, st, probs, stream);
//   sh::cuda::observe_queries(policy, cache, st, queries, lse, softmax_scale, stream);
//   sh::cuda::compress(d_workspace, workspace_bytes, policy, cache, st, budget,
//                      {d_new_lengths, d_freed_pages}, stream);      // d_workspace == nullptr: size query
//   sh::cuda::shrink_page_table(indptr, indices, last_page_len, page_size,
//                               d_new_lengths, released, d_result, stream);   // after the last layer
//
// Token-level eviction (policy/granularity.hpp): a shared_heads policy goes
// through compress as above; a shared_layers policy observes every layer
// into model.layer(l) of a model_state, then per step
//   sh::cuda::select(d_ws, ws_bytes, policy, cache, model, budget, selection, d_pinned, stream);
//   sh::cuda::compact(d_cws, cws_bytes, policy, cache_of_layer(l), model.layer(l), selection, stream);  // each l
//     or sh::cuda::forget(policy, cache, model.layer(l), selection, stream);                         // each l
//   sh::cuda::reset_state(model, stream); sh::cuda::reset_sequence(model, row, start, stream);
//
// Quantized caches (quantized_kv_view.hpp: device_quantized_kv_view,
// device_quantized_paged_kv_view, int8 / int4 codes with per-group fp32
// parameters) go through the same calls: observe_queries and the static
// scorers dequantize K on the fly, compress / compact move each token's
// code rows and parameter rows together, and a non-finite K parameter of
// a row observe reads skips its sequence (status_k_params).
//
// Same views (kv_view / paged_kv_view over device spans, uniform or ragged
// attention views), policies and state layout (make_state over a device
// buffer) as the host backend, and the same results: observe_probabilities,
// compress, select, compact, forget and shrink_page_table bit for bit,
// observe_queries within float rounding of the dot products. Every call
// validates on the host what needs no device memory (throwing
// scissorhands::invalid_argument), checks the rest on the device before
// writing anything (cuda/status.cuh: one status word per state row, so a
// bad sequence is skipped and the others proceed), launches on the
// caller's stream, allocates nothing and never synchronises, so a decode
// step's observe + compress (or select + compact) + shrink_page_table can be
// captured in a CUDA graph.
//
// Bit-exactness assumes IEEE division and square root on the device
// (nvcc's defaults); --use_fast_math or -prec-div=false breaks it.
//
// Each call is a pair of kernels; SCISSORHANDS_PDL=1 in the environment
// launches the second programmatically dependent on the first on sm_90+
// (cuda/launch.cuh: off by default until measured on a GPU).
#include "scissorhands.hpp"

#include "cuda/backend.cuh"
#include "cuda/compress.cuh"
#include "cuda/element.cuh"
#include "cuda/launch.cuh"
#include "cuda/observe.cuh"
#include "cuda/page_table.cuh"
#include "cuda/select.cuh"
#include "cuda/state.cuh"
#include "cuda/status.cuh"
#include "cuda/traits.cuh"
