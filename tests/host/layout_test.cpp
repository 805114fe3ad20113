// Layout maths (kv_layout, paged_layout, strides_are_unique, layout_extent),
// the views' row addressing, and the spans' memory-space typing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <type_traits>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;
using sh::detail::layout_extent;
using sh::detail::strides_are_unique;

// ---- compile-time: layout maths is constexpr and exact ---------------------
static_assert(sh::kv_layout::nhd(10, 4, 8).offset(1, 2, 3) == ((1 * 10 + 3) * 4 + 2) * 8);
static_assert(sh::kv_layout::hnd(10, 4, 8).offset(1, 2, 3) == ((1 * 4 + 2) * 10 + 3) * 8);
static_assert(sh::paged_layout::nhd(16, 4, 8).offset(5, 2, 3) == ((5 * 16 + 3) * 4 + 2) * 8);
static_assert(sh::paged_layout::hnd(16, 4, 8).offset(5, 2, 3) == ((5 * 4 + 2) * 16 + 3) * 8);
// Strides that do not fit in 32 bits: 2^21 tokens x 32 heads x 256 dims.
static_assert(sh::kv_layout::nhd(1 << 21, 32, 256).sequence_stride == std::int64_t{1} << 34);
static_assert(sh::kv_layout::hnd(1 << 21, 32, 256).head_stride == std::int64_t{1} << 29);
// Constant evaluation rejects signed overflow, so these also prove the
// saturating maths never overflows.
static_assert(layout_extent({std::int64_t{1} << 61, 1, 1}, {4, 1, 1}, 8) == std::int64_t{1} << 62);
static_assert(layout_extent({std::int64_t{1} << 40, std::int64_t{1} << 40, 1}, {1 << 30, 1 << 30, 1}, 1) ==
              std::int64_t{1} << 62);
static_assert(strides_are_unique({std::int64_t{1} << 61, std::int64_t{1} << 40, 1}, {8, 1 << 20, 2}, 1));
static_assert(!strides_are_unique({std::int64_t{1} << 40, std::int64_t{1} << 40, 1}, {1 << 30, 1 << 30, 1}, 1));
static_assert(layout_extent({100, 10, 1}, {0, 5, 5}, 1) == 0);

// ---- compile-time: the memory space is part of a span's type ---------------
static_assert(std::is_convertible_v<sh::host_span<float>, sh::host_span<const float>>);
static_assert(std::is_convertible_v<sh::device_span<float>, sh::device_span<const float>>);
static_assert(!std::is_convertible_v<sh::host_span<const float>, sh::host_span<float>>);
static_assert(!std::is_convertible_v<sh::host_span<float>, sh::device_span<float>>);
static_assert(!std::is_convertible_v<sh::host_span<float>, sh::device_span<const float>>);
static_assert(!std::is_convertible_v<sh::device_span<float>, sh::host_span<float>>);
static_assert(!std::is_convertible_v<sh::device_span<float>, sh::host_span<const float>>);
static_assert(!std::is_constructible_v<sh::device_span<float>, sh::host_span<float>>);
static_assert(!std::is_constructible_v<sh::host_span<float>, sh::device_span<float>>);
static_assert(!std::is_convertible_v<sh::host_span<float>, sh::host_span<double>>);
static_assert(!std::is_convertible_v<sh::host_kv_view<float>, sh::device_kv_view<float>>);
static_assert(!std::is_convertible_v<sh::host_paged_kv_view<float>, sh::device_paged_kv_view<float>>);
static_assert(!std::is_convertible_v<sh::eviction_state<sh::memory_space::host>,
                                     sh::eviction_state<sh::memory_space::device>>);
static_assert(!std::is_convertible_v<sh::probability_view<sh::memory_space::host>,
                                     sh::probability_view<sh::memory_space::device>>);

// Every address a strided (3 levels, rows of `row`) layout touches, counted.
struct addresses {
  std::vector<std::int64_t> all;
  bool unique() const { return std::set<std::int64_t>(all.begin(), all.end()).size() == all.size(); }
  std::int64_t extent() const { return all.empty() ? 0 : *std::max_element(all.begin(), all.end()) + 1; }
};
addresses enumerate(std::array<std::int64_t, 3> s, std::array<std::int64_t, 3> e, std::int64_t row) {
  addresses a;
  for (std::int64_t i = 0; i < e[0]; ++i)
    for (std::int64_t j = 0; j < e[1]; ++j)
      for (std::int64_t k = 0; k < e[2]; ++k)
        for (std::int64_t d = 0; d < row; ++d) a.all.push_back(i * s[0] + j * s[1] + k * s[2] + d);
  return a;
}

}  // namespace

TEST_CASE("named layouts place every row at FlashInfer's offset and tile the buffer", "[layout]") {
  const std::int32_t B = 3, C = 5, H = 4, D = 8;
  const auto nhd = sh::kv_layout::nhd(C, H, D);
  const auto hnd = sh::kv_layout::hnd(C, H, D);
  std::set<std::int64_t> nhd_rows, hnd_rows;
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t t = 0; t < C; ++t) {
        CHECK(nhd.offset(b, h, t) == ((std::int64_t{b} * C + t) * H + h) * D);
        CHECK(hnd.offset(b, h, t) == ((std::int64_t{b} * H + h) * C + t) * D);
        nhd_rows.insert(nhd.offset(b, h, t));
        hnd_rows.insert(hnd.offset(b, h, t));
      }
  // Dense: rows 0, D, 2D, ... with no gap and no overlap.
  for (const auto* rows : {&nhd_rows, &hnd_rows}) {
    REQUIRE(rows->size() == static_cast<std::size_t>(B * C * H));
    std::int64_t expect = 0;
    for (auto o : *rows) {
      CHECK(o == expect);
      expect += D;
    }
  }
  CHECK(layout_extent({nhd.sequence_stride, nhd.head_stride, nhd.token_stride}, {B, H, C}, D) == B * C * H * D);
  CHECK(layout_extent({hnd.sequence_stride, hnd.head_stride, hnd.token_stride}, {B, H, C}, D) == B * C * H * D);
}

TEST_CASE("paged layouts place every row at its offset inside its page", "[layout][paged]") {
  const std::int32_t pages = 4, P = 3, H = 2, D = 4;
  const auto nhd = sh::paged_layout::nhd(P, H, D);
  const auto hnd = sh::paged_layout::hnd(P, H, D);
  for (std::int32_t p = 0; p < pages; ++p)
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t t = 0; t < P; ++t) {
        CHECK(nhd.offset(p, h, t) == ((std::int64_t{p} * P + t) * H + h) * D);
        CHECK(hnd.offset(p, h, t) == ((std::int64_t{p} * H + h) * P + t) * D);
      }
  CHECK(nhd.page_stride == P * H * D);
  CHECK(hnd.page_stride == P * H * D);
}

TEST_CASE("offsets are computed in 64 bits", "[layout]") {
  // Llama-3-8B-like: 8 KV heads, head_dim 128, 131072 tokens, sequence 4000.
  const auto nhd = sh::kv_layout::nhd(131072, 8, 128);
  const std::int64_t want = ((std::int64_t{4000} * 131072 + 131071) * 8 + 7) * 128;
  CHECK(want > INT32_MAX);
  CHECK(nhd.offset(4000, 7, 131071) == want);
  const auto paged = sh::paged_layout::hnd(16, 8, 128);
  CHECK(paged.offset(2000000, 7, 15) == ((std::int64_t{2000000} * 8 + 7) * 16 + 15) * 128);
}

TEST_CASE("strides_are_unique: known layouts", "[layout]") {
  for (std::int32_t C : {1, 7, 64})
    for (std::int32_t H : {1, 2, 8})
      for (std::int32_t D : {1, 8, 128}) {
        const auto nhd = sh::kv_layout::nhd(C, H, D);
        const auto hnd = sh::kv_layout::hnd(C, H, D);
        CHECK(strides_are_unique({nhd.sequence_stride, nhd.head_stride, nhd.token_stride}, {3, H, C}, D));
        CHECK(strides_are_unique({hnd.sequence_stride, hnd.head_stride, hnd.token_stride}, {3, H, C}, D));
      }
  // Rows overlapping the next token's.
  CHECK_FALSE(strides_are_unique({1000, 8, 7}, {2, 1, 4}, 8));
  // Two heads on the same rows.
  CHECK_FALSE(strides_are_unique({1000, 8, 8}, {2, 2, 4}, 8));
  // A zero stride is fine only where the extent is 1.
  CHECK(strides_are_unique({0, 8, 16}, {1, 2, 4}, 8));
  CHECK_FALSE(strides_are_unique({0, 8, 16}, {2, 2, 4}, 8));
  // Sequences interleaved innermost, and padding everywhere.
  CHECK(strides_are_unique({8, 24, 48}, {3, 2, 5}, 8));
  CHECK(strides_are_unique({2 * (5 * 11 + 5) + 7, 5 * 11 + 5, 11}, {4, 2, 5}, 8));
  // The sequence stride too small for capacity x heads.
  CHECK_FALSE(strides_are_unique({8 * 4 * 2 - 8, 8, 16}, {2, 2, 4}, 8));
}

TEST_CASE("strides_are_unique and layout_extent agree with brute force", "[layout]") {
  std::int32_t accepted = 0, rejected_overlap = 0;
  for (std::int64_t trial = 0; trial < 4000; ++trial) {
    const auto r = [&](std::int64_t salt, std::uint64_t n) { return static_cast<std::int64_t>(hash_of({trial, salt}) % n); };
    std::array<std::int64_t, 3> s{r(0, 40), r(1, 40), r(2, 40)};
    std::array<std::int64_t, 3> e{1 + r(3, 4), 1 + r(4, 4), 1 + r(5, 4)};
    const std::int64_t row = 1 + r(6, 5);
    const auto a = enumerate(s, e, row);
    INFO("strides " << s[0] << ' ' << s[1] << ' ' << s[2] << ", extents " << e[0] << ' ' << e[1] << ' ' << e[2]
                    << ", row " << row);
    CHECK(layout_extent(s, e, row) == a.extent());
    const bool lib = strides_are_unique(s, e, row);
    // Sound: whatever it accepts really is overlap-free.
    if (lib) CHECK(a.unique());
    accepted += lib;
    rejected_overlap += !a.unique();
  }
  // Nested layouts (any level order, any padding) are always accepted.
  for (std::int64_t trial = 0; trial < 500; ++trial) {
    const auto r = [&](std::int64_t salt, std::uint64_t n) { return static_cast<std::int64_t>(hash_of({trial, 9, salt}) % n); };
    std::array<std::int64_t, 3> e{1 + r(0, 5), 1 + r(1, 5), 1 + r(2, 5)};
    const std::int64_t row = 1 + r(3, 6);
    std::array<int, 3> order{0, 1, 2};
    for (std::int64_t k = 0; k < r(4, 6); ++k) std::next_permutation(order.begin(), order.end());
    std::array<std::int64_t, 3> s{};
    std::int64_t span = row;
    for (int level : order) {
      s[static_cast<std::size_t>(level)] = span + r(5 + level, 4);  // padding
      span = s[static_cast<std::size_t>(level)] * e[static_cast<std::size_t>(level)];
    }
    INFO("strides " << s[0] << ' ' << s[1] << ' ' << s[2] << ", extents " << e[0] << ' ' << e[1] << ' ' << e[2]);
    CHECK(enumerate(s, e, row).unique());
    CHECK(strides_are_unique(s, e, row));
  }
  // The random trials must have exercised both outcomes.
  CHECK(accepted > 100);
  CHECK(rejected_overlap > 100);
}

TEST_CASE("views address rows through their layouts and page tables", "[layout][paged]") {
  const std::int32_t B = 2, H = 2, D = 4, C = 6;
  std::vector<float> k(static_cast<std::size_t>(B * H * C * D)), v(k.size());
  std::vector<std::int32_t> lengths{3, 5};
  const auto nhd_view = sh::make_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                                         sh::host_span<std::int32_t>(lengths.data(), 2), B, H, D, C,
                                         sh::named_layout::nhd);
  const auto hnd_view = sh::make_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                                         sh::host_span<std::int32_t>(lengths.data(), 2), B, H, D, C,
                                         sh::named_layout::hnd);
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t t = 0; t < C; ++t) {
        CHECK(nhd_view.k_row(b, h, t) - k.data() == ((b * C + t) * H + h) * D);
        CHECK(nhd_view.v_row(b, h, t) - v.data() == ((b * C + t) * H + h) * D);
        CHECK(hnd_view.k_row(b, h, t) - k.data() == ((b * H + h) * C + t) * D);
      }
  CHECK(nhd_view.length(1) == 5);
  CHECK(nhd_view.capacity_of(0) == C);

  // Paged, pages out of order: sequence 0 on pages {5, 2}, sequence 1 on {0, 7, 3}.
  const std::int32_t P = 3, pages = 8;
  std::vector<float> kp(static_cast<std::size_t>(pages * P * H * D)), vp(kp.size());
  std::vector<std::int32_t> indptr{0, 2, 5}, indices{5, 2, 0, 7, 3}, last{1, 3};
  const auto paged = sh::make_paged_kv_view(
      sh::host_span<float>(kp.data(), kp.size()), sh::host_span<float>(vp.data(), vp.size()),
      sh::host_span<const std::int32_t>(indptr.data(), 3), sh::host_span<const std::int32_t>(indices.data(), 5),
      sh::host_span<std::int32_t>(last.data(), 2), B, H, D, P, pages, 3, sh::named_layout::hnd);
  CHECK(paged.length(0) == 4);
  CHECK(paged.length(1) == 9);
  CHECK(paged.capacity_of(0) == 6);
  CHECK(paged.max_capacity() == 9);
  for (std::int32_t b = 0; b < B; ++b)
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t t = 0; t < paged.length(b); ++t) {
        const std::int32_t page = indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + t / P)];
        CHECK(paged.k_row(b, h, t) - kp.data() == ((page * H + h) * P + t % P) * D);
        CHECK(paged.v_row(b, h, t) - vp.data() == ((page * H + h) * P + t % P) * D);
      }
  // Pages a length needs: 2 tokens one page, 9 three, none none.
  CHECK(paged.pages_for(2) == 1);
  CHECK(paged.pages_for(9) == 3);
  CHECK(paged.pages_for(0) == 0);
  CHECK(paged.pages_for(INT32_MAX) == static_cast<std::int32_t>((std::int64_t{INT32_MAX} + P - 1) / P));
}

TEST_CASE("length_after_compress is the data-independent rule", "[layout]") {
  STATIC_REQUIRE(sh::length_after_compress(10, 16, 4) == 10);
  STATIC_REQUIRE(sh::length_after_compress(16, 16, 4) == 12);
  STATIC_REQUIRE(sh::length_after_compress(20, 16, 1) == 15);
  STATIC_REQUIRE(sh::state_capacity_for(1024, 1) == 1024);
  STATIC_REQUIRE(sh::state_capacity_for(1024, 256) == 1279);
}

TEST_CASE("spans convert to const in the same space, keeping data and size", "[span]") {
  std::vector<float> x{1.0f, 2.0f, 3.0f};
  sh::host_span<float> s(x.data(), x.size());
  sh::host_span<const float> c = s;
  CHECK(c.data() == x.data());
  CHECK(c.size() == 3);
  CHECK(c[2] == 3.0f);
  CHECK(!c.empty());
  CHECK(sh::host_span<const float>{}.empty());
  CHECK(c.end() - c.begin() == 3);
}
