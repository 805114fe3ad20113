#pragma once
// How the engine stores its KV cache (--kv-bits, --kv-group;
// docs/quantization.md):
//   32  fp32, as the model computes it (the default; what every other
//       measurement of this example uses)
//   16  bf16: each element rounded to nearest even on append
//   8   int8 codes, one fp32 scale per group of --kv-group elements
//       (scissorhands::quantize_row, symmetric)
//   4   int4 codes, an fp32 scale and zero point per group (asymmetric)
// The library is handed the cache in its stored form: a host_kv_view of
// float or of bf16, or a host_quantized_kv_view (codes and parameters),
// so that compress moves what is actually stored.
#include <bit>
#include <cstdint>
#include <string>
#include <variant>

#include <scissorhands/element.hpp>
#include <scissorhands/kv_view.hpp>
#include <scissorhands/quantized_kv_view.hpp>

namespace llama {

// The engine's bf16: the upper 16 bits of an fp32, rounded to nearest even
// (the conversion tests/host/element_test.cpp checks the library against).
struct bf16 {
  std::uint16_t bits = 0;
};

inline bf16 to_bf16(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  return {static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

inline float from_bf16(bf16 x) { return std::bit_cast<float>(std::uint32_t{x.bits} << 16); }

}  // namespace llama

// How the library reads a bf16 key (observe from queries, key norms).
template <>
struct scissorhands::element_traits<llama::bf16> {
  static float to_float(llama::bf16 x) { return llama::from_bf16(x); }
};

namespace llama {

// The cache as the library sees it, per stored format.
using cache_view = std::variant<scissorhands::host_kv_view<float>, scissorhands::host_kv_view<bf16>,
                                scissorhands::host_quantized_kv_view>;

struct kv_format {
  std::int32_t bits = 32;        // 32, 16, 8 or 4
  std::int32_t group_size = 0;   // 8 and 4: elements sharing one scale (and zero point); 0 otherwise
  std::int32_t head_dim = 0;

  bool quantized() const { return bits == 8 || bits == 4; }
  scissorhands::kv_quantization quantization() const {
    return {bits == 8 ? scissorhands::quant_kind::int8 : scissorhands::quant_kind::int4, group_size};
  }
  // Bytes of one stored K (or V) row of head_dim elements: the values or
  // codes, and the quantization parameters beside them (fp32 scales, and
  // zero points for int4).
  std::int64_t row_bytes() const {
    if (quantized()) return quantization().code_row_bytes(head_dim);
    return static_cast<std::int64_t>(head_dim) * (bits == 16 ? 2 : 4);
  }
  std::int64_t param_row_bytes() const {
    return quantized() ? static_cast<std::int64_t>(sizeof(float)) * quantization().params_per_row(head_dim) : 0;
  }
  // "fp32", "bf16", "int8/g16", "int4/g8".
  std::string name() const;
  // The index of this format's alternative in cache_view.
  std::size_t view_index() const { return bits == 32 ? 0 : bits == 16 ? 1 : 2; }
};

// The format for --kv-bits `bits` and --kv-group `group` (0: not given,
// which means min(32, head_dim) for 8 and 4 bits) on a model of head_dim.
// Throws std::invalid_argument naming the option, the value and the bound:
// bits not in {32, 16, 8, 4}; a group given with 32 or 16 bits; a group
// that does not divide head_dim, or an odd one with 4 bits (a group's
// codes are whole bytes).
kv_format resolve_kv_format(std::int32_t bits, std::int32_t group, std::int32_t head_dim);

// The format a view holds (its bits, group and head_dim).
kv_format format_of(const cache_view& view);

}  // namespace llama
