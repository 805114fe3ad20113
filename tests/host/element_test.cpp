// A host engine storing bf16 (or fp16) K/V: the documented pattern is a
// specialisation of scissorhands::element_traits for its own type
// (support.hpp's engine_bf16). The
// library reads such a cache exactly as an fp32 cache holding the same
// values (scores bit-identical), and moves its rows as raw bytes.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "support.hpp"

TEST_CASE("a bf16 host cache scores like an fp32 cache of the same values", "[element]") {
  using namespace sh_test;
  constexpr std::int32_t B = 2, H = 2, D = 16, C = 24, QH = 4;
  const std::size_t n = std::size_t{B} * C * H * D;
  std::vector<engine_bf16> k16(n), v16(n);
  std::vector<float> k32(n), v32(n);
  for (std::size_t i = 0; i < n; ++i) {
    k16[i] = to_bf16(static_cast<float>(unit(hash_of({1, static_cast<std::int64_t>(i)}))) - 0.5f);
    v16[i] = to_bf16(static_cast<float>(unit(hash_of({2, static_cast<std::int64_t>(i)}))) - 0.5f);
    k32[i] = sh::to_float(k16[i]);
    v32[i] = sh::to_float(v16[i]);
  }
  std::vector<std::int32_t> lengths{20, 13};
  const auto view16 = sh::make_kv_view<engine_bf16, host>({k16.data(), n}, {v16.data(), n},
                                                          {lengths.data(), 2}, B, H, D, C, sh::named_layout::nhd);
  const auto view32 = sh::make_kv_view<float, host>({k32.data(), n}, {v32.data(), n}, {lengths.data(), 2}, B, H, D,
                                                    C, sh::named_layout::nhd);
  sh::h2o_policy policy;
  policy.config.recent = 2;
  policy.config.evict_count = 3;
  state_holder s16(policy, view32), s32(policy, view32);
  std::vector<engine_bf16> q16(std::size_t{B} * 2 * QH * D);
  std::vector<float> q32(q16.size());
  for (std::size_t i = 0; i < q16.size(); ++i) {
    q16[i] = to_bf16(static_cast<float>(unit(hash_of({3, static_cast<std::int64_t>(i)}))) - 0.5f);
    q32[i] = sh::to_float(q16[i]);
  }
  sh::host::observe_queries(policy, view16, s16.state,
                            sh::query_view<engine_bf16, host>::dense({q16.data(), q16.size()}, QH, 2, D));
  sh::host::observe_queries(policy, view32, s32.state, sh::query_view<float, host>::dense({q32.data(), q32.size()}, QH, 2, D));
  CHECK(s16.buffer.snapshot() == s32.buffer.snapshot());

  std::vector<std::byte> ws(sh::host::compress_workspace_bytes(view32) + 8);
  auto* w = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 7) / 8 * 8);
  std::vector<std::int32_t> new16(2), new32(2);
  sh::host::compress(policy, view16, s16.state, 16, {w, ws.size() - 8}, {{new16.data(), 2}, {}});
  sh::host::compress(policy, view32, s32.state, 16, {w, ws.size() - 8}, {{new32.data(), 2}, {}});
  CHECK(new16 == std::vector<std::int32_t>{13, 13});
  CHECK(new16 == new32);
  CHECK(s16.buffer.snapshot() == s32.buffer.snapshot());
  // The bf16 rows moved exactly as the fp32 ones.
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(sh::to_float(k16[i]) == k32[i]);
    REQUIRE(sh::to_float(v16[i]) == v32[i]);
  }
}
