#pragma once
// Umbrella header with the CUDA backend: everything scissorhands.hpp has,
// plus cuda::admit / observe_probabilities / observe_queries / compress /
// reset_state / reset_sequence and the __half / __nv_bfloat16 element
// traits. Needs nvcc (or another CUDA compiler) and CCCL.
#include "scissorhands.hpp"

#include "cuda/compress.cuh"
#include "cuda/element.cuh"
#include "cuda/observe.cuh"
#include "cuda/state.cuh"
#include "cuda/status.cuh"
#include "cuda/traits.cuh"
