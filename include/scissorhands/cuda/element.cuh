#pragma once
// element_traits for the CUDA half-precision types, so views over __half and
// __nv_bfloat16 caches (and queries) work on both backends. The conversions
// are exact, so the host reference and the kernels see the same floats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../element.hpp"

namespace scissorhands {

template <>
struct element_traits<__half> {
  SCISSORHANDS_HOST_DEVICE static float to_float(__half x) { return __half2float(x); }
};

template <>
struct element_traits<__nv_bfloat16> {
  SCISSORHANDS_HOST_DEVICE static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
};

}  // namespace scissorhands
