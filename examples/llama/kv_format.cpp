#include "kv_format.hpp"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace llama {

namespace sh = scissorhands;

std::string kv_format::name() const {
  switch (bits) {
    case 32: return "fp32";
    case 16: return "bf16";
    default: return std::string(bits == 8 ? "int8" : "int4") + "/g" + std::to_string(group_size);
  }
}

kv_format resolve_kv_format(std::int32_t bits, std::int32_t group, std::int32_t head_dim) {
  if (bits != 32 && bits != 16 && bits != 8 && bits != 4)
    throw std::invalid_argument("--kv-bits must be 32 (fp32), 16 (bf16), 8 (int8 codes) or 4 (int4 codes), got " +
                                std::to_string(bits));
  kv_format f;
  f.bits = bits;
  f.head_dim = head_dim;
  if (bits == 32 || bits == 16) {
    if (group != 0)
      throw std::invalid_argument("--kv-group " + std::to_string(group) + " applies to --kv-bits 8 or 4 only (--kv-bits " +
                                  std::to_string(bits) + " stores every element as it is)");
    return f;
  }
  if (group < 0)
    throw std::invalid_argument("--kv-group must be positive, got " + std::to_string(group));
  // Default: groups of 32, or the whole row when the head is narrower.
  f.group_size = group > 0 ? group : std::min(32, head_dim);
  if (head_dim % f.group_size != 0)
    throw std::invalid_argument("--kv-group " + std::to_string(f.group_size) + " must divide the model's head_dim = " +
                                std::to_string(head_dim) + " (a row is whole groups)");
  if (bits == 4 && f.group_size % 2 != 0)
    throw std::invalid_argument("--kv-group " + std::to_string(f.group_size) +
                                " must be even with --kv-bits 4 (two codes a byte, a group's codes are whole bytes)");
  return f;
}

kv_format format_of(const cache_view& view) {
  kv_format f;
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        f.head_dim = v.head_dim;
        if constexpr (std::is_same_v<V, sh::host_quantized_kv_view>) {
          f.bits = v.quantization.bits();
          f.group_size = v.quantization.group_size;
        } else {
          f.bits = std::is_same_v<V, sh::host_kv_view<bf16>> ? 16 : 32;
        }
      },
      view);
  return f;
}

}  // namespace llama
