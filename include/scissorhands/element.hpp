#pragma once
// Conversion of cache elements to fp32 for the maths that reads K (key norms,
// observe from queries). float is built in; the CUDA backend specialises
// element_traits for __half and __nv_bfloat16, and an engine with its own
// storage type specialises it the same way. A trait (not an overload) so a
// specialisation declared after this header is still found.
#include <bit>
#include <cstdint>
#include <cstring>

#include "config.hpp"

#if defined(__F16C__) && !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SCISSORHANDS_F16C 1
#endif

namespace scissorhands {

template <class T>
struct element_traits;  // no conversion known: specialise to_float for T

template <>
struct element_traits<float> {
  SCISSORHANDS_HOST_DEVICE static float to_float(float x) { return x; }
};

// IEEE binary16 and bfloat16 held as their 16 bits, for host engines that
// store a half-precision cache without a half type (llama.cpp's
// ggml_fp16_t and ggml_bf16_t are uint16_t): a view over such a cache
// casts its pointer to fp16_bits / bf16_bits (one uint16_t each, the same
// size and alignment). Host only: device code reads __half and
// __nv_bfloat16 (cuda/element.cuh).
struct fp16_bits {
  std::uint16_t bits;
};
struct bf16_bits {
  std::uint16_t bits;
};
static_assert(sizeof(fp16_bits) == 2);
static_assert(alignof(fp16_bits) == 2);
static_assert(sizeof(bf16_bits) == 2);

template <>
struct element_traits<fp16_bits> {
  // Every binary16 value exactly, subnormals, infinities and NaN included;
  // branch-free (selects on integers), so a loop over a row vectorises.
  static float to_float(fp16_bits h) {
    const std::uint32_t bits = h.bits;
    const std::uint32_t shifted = (bits & 0x7FFFu) << 13;  // exponent and mantissa in float's places
    const std::uint32_t exponent = shifted & 0x0F800000u;
    const std::uint32_t normal = shifted + ((127u - 15u) << 23);
    // Subnormal (and zero): give it the smallest normal exponent, then
    // subtract that exponent's 1.0 as a float: exact, no subnormal operand.
    const float renormalised = std::bit_cast<float>(normal + (1u << 23)) - std::bit_cast<float>(113u << 23);
    const std::uint32_t magnitude = exponent == 0x0F800000u ? normal + ((128u - 16u) << 23)  // inf, NaN
                                    : exponent == 0         ? std::bit_cast<std::uint32_t>(renormalised)
                                                            : normal;
    return std::bit_cast<float>(magnitude | ((bits & 0x8000u) << 16));
  }
};

// Whether T is IEEE binary16 held as its 16 bits (fp16_bits, or an engine's
// own type of that representation: specialise it to true), so that a row
// converts eight values at a time with F16C where the build has it.
template <class T>
inline constexpr bool is_binary16_v = false;
template <>
inline constexpr bool is_binary16_v<fp16_bits> = true;

// n binary16 values from `from` as floats into `to` (read as bytes: any
// two-byte T whose is_binary16_v is true). The same values as to_float.
template <class T>
inline void binary16_to_float(const T* from, std::int32_t n, float* to) {
  static_assert(sizeof(T) == 2, "binary16_to_float reads two bytes a value");
  std::int32_t i = 0;
#if defined(SCISSORHANDS_F16C)
  for (; i + 8 <= n; i += 8) {
    __m128i h;
    std::memcpy(&h, from + i, sizeof h);
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, from + i, sizeof bits);
    to[i] = element_traits<fp16_bits>::to_float(fp16_bits{bits});
  }
}

template <>
struct element_traits<bf16_bits> {
  static float to_float(bf16_bits h) { return std::bit_cast<float>(std::uint32_t{h.bits} << 16); }
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
