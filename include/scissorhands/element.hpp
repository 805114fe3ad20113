#pragma once
// Conversion of cache elements to fp32 for the maths that reads K (key norms,
// observe from queries). float is built in; the CUDA backend specialises
// element_traits for __half and __nv_bfloat16, and an engine with its own
// storage type specialises it the same way. A trait (not an overload) so a
// specialisation declared after this header is still found.
#include "config.hpp"

namespace scissorhands {

template <class T>
struct element_traits;  // no conversion known: specialise to_float for T

template <>
struct element_traits<float> {
  SCISSORHANDS_HOST_DEVICE static float to_float(float x) { return x; }
};

template <class T>
SCISSORHANDS_HOST_DEVICE inline float to_float(const T& x) {
  return element_traits<T>::to_float(x);
}

template <class T>
concept float_convertible = requires(const T& x) {
  { element_traits<T>::to_float(x) };
};

}  // namespace scissorhands
