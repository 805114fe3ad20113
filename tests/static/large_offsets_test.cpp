// Caches whose element offsets pass 2^31 (and 2^32), checked without
// allocating them: layout maths, validation and index maths only. Where the
// maths is constexpr it is also checked in static_assert, so any signed
// overflow on the way is a compile error (constant evaluation rejects UB).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "../host/support.hpp"

namespace {

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

// A Llama-3-70B-like layer at a long context: batch 64, 8 KV heads,
// head_dim 128, capacity 2^20 tokens per sequence.
constexpr std::int32_t big_batch = 64, big_heads = 8, big_dim = 128, big_capacity = 1 << 20;
constexpr std::int64_t big_sequence = std::int64_t{big_capacity} * big_heads * big_dim;  // 2^30 elements
constexpr std::int64_t big_total = big_sequence * big_batch;                              // 2^36 elements

// NHD and HND offsets, the last row of the last sequence: ~2^36.
static_assert(sh::kv_layout::nhd(big_capacity, big_heads, big_dim).sequence_stride == big_sequence);
static_assert(sh::kv_layout::nhd(big_capacity, big_heads, big_dim)
                  .offset(big_batch - 1, big_heads - 1, big_capacity - 1) == big_total - big_dim);
static_assert(sh::kv_layout::hnd(big_capacity, big_heads, big_dim)
                  .offset(big_batch - 1, big_heads - 1, big_capacity - 1) == big_total - big_dim);
static_assert(sh::kv_layout::hnd(big_capacity, big_heads, big_dim).offset(2, 0, 0) > INT32_MAX);

// The extent a buffer needs, and the uniqueness of rows, at that size.
static_assert(sh::detail::layout_extent({big_sequence, big_dim, std::int64_t{big_heads} * big_dim},
                                        {big_batch, big_heads, big_capacity}, big_dim) == big_total);
static_assert(sh::detail::strides_are_unique({big_sequence, big_dim, std::int64_t{big_heads} * big_dim},
                                             {big_batch, big_heads, big_capacity}, big_dim));
// One element short of a full sequence stride: the last row of one sequence
// overlaps the first of the next.
static_assert(!sh::detail::strides_are_unique({big_sequence - 1, big_dim, std::int64_t{big_heads} * big_dim},
                                              {big_batch, big_heads, big_capacity}, big_dim));
// Extents saturate at 2^62 rather than wrap.
static_assert(sh::detail::layout_extent({std::int64_t{1} << 61, 1, 1}, {big_batch, 1, 1}, 1) ==
              std::int64_t{1} << 62);

// Paged: a pool of 2^22 pages of 16 tokens, 8 heads, head_dim 128: the
// last page starts at 2^36.
constexpr std::int32_t big_pages = 1 << 22, big_page_size = 16;
static_assert(sh::paged_layout::nhd(big_page_size, big_heads, big_dim).offset(big_pages - 1, big_heads - 1, 15) ==
              std::int64_t{big_pages} * big_page_size * big_heads * big_dim - big_dim);
static_assert(sh::paged_layout::hnd(big_page_size, big_heads, big_dim).offset(big_pages - 1, 0, 0) ==
              (std::int64_t{big_pages} - 1) * big_page_size * big_heads * big_dim);

// The state of a batch of 64 x 8 heads x 2^20 slots: 2^29 tokens, and with
// the Scissorhands ring at w = 400 (13 words) its bytes pass 2^34.
constexpr sh::state_shape big_state{big_batch, big_heads, big_capacity, 13};
constexpr std::size_t big_tokens = std::size_t{big_batch} * big_heads * big_capacity;
static_assert(sh::detail::offsets_of(big_state).scores - sh::detail::offsets_of(big_state).positions >=
              big_tokens * 4);
static_assert(sh::detail::offsets_of(big_state).total >= big_tokens * (12 + 4 * 13));
static_assert(sh::detail::offsets_of(big_state).total < big_tokens * (12 + 4 * 13) + 8 * 256);

// Pointers that are never dereferenced: validation reads no K/V data.
// (Two elements, so K and V can differ without leaving the array.)
float* fake_data() {
  static float two[2];
  return two;
}

// The big cache over fake data (`lengths` must outlive the view).
sh::host_kv_view<float> big_view(std::vector<std::int32_t>& lengths, sh::named_layout layout) {
  return sh::make_kv_view<float, host>(
      {fake_data(), static_cast<std::size_t>(big_total)}, {fake_data() + 1, static_cast<std::size_t>(big_total)},
      {lengths.data(), lengths.size()}, big_batch, big_heads, big_dim, big_capacity, layout);
}

using sh_test::refused_argument;

}  // namespace

TEST_CASE("large: a cache past 2^36 elements validates against its exact size", "[large]") {
  std::vector<std::int32_t> lengths(big_batch, 0);
  auto view = big_view(lengths, sh::named_layout::hnd);
  REQUIRE_NOTHROW(sh::detail::validate_shape("test", view));
  view.k = {view.k.data(), static_cast<std::size_t>(big_total - 1)};  // one element short
  CHECK(refused_argument([&] { sh::detail::validate_shape("test", view); }) == "cache.k");
}

TEST_CASE("large: strides past 2^31 that overlap are refused", "[large]") {
  std::vector<std::int32_t> lengths(big_batch, 0);
  auto view = big_view(lengths, sh::named_layout::nhd);
  view.k_layout.sequence_stride = big_sequence - big_dim;  // one row short: 2^30 - 128: sequences overlap
  CHECK(refused_argument([&] { sh::detail::validate_shape("test", view); }) == "cache.k_layout");
}

TEST_CASE("large: 2^31 rows per head address correctly at run time", "[large]") {
  // Run-time (not constexpr) offsets, as the backend computes them.
  const auto l = sh::kv_layout::hnd(INT32_MAX, 2, 64);
  volatile std::int32_t t = INT32_MAX - 1;  // volatile: no constant folding
  CHECK(l.offset(1, 1, t) == (std::int64_t{INT32_MAX} * 2 + std::int64_t{INT32_MAX} + t) * 64);
  const auto p = sh::paged_layout::nhd(16, 8, 128);
  volatile std::int32_t page = big_pages - 1;
  CHECK(p.offset(page, 7, 15) == std::int64_t{big_pages} * 16 * 8 * 128 - 128);
}

TEST_CASE("large: the state index passes 2^32 tokens", "[large]") {
  sh::eviction_state<host> st;
  st.shape = {1 << 12, 32, 1 << 20, 0};  // 2^37 tokens: index maths only
  CHECK(st.index((1 << 12) - 1, 31, (1 << 20) - 1) == (std::int64_t{1} << 37) - 1);
  CHECK(st.index(2048, 0, 0) == std::int64_t{2048} * 32 * (1 << 20));
  // Through a batch mapping: position 1 uses the last row.
  const std::vector<std::int32_t> rows{0, (1 << 12) - 1, -1};
  const auto mapped = st.for_batch({rows.data(), rows.size()});
  CHECK(mapped.row(1) == (1 << 12) - 1);
  CHECK(mapped.index(1, 31, (1 << 20) - 1) == (std::int64_t{1} << 37) - 1);
  CHECK(mapped.row_index((1 << 12) - 1, 31, (1 << 20) - 1) == (std::int64_t{1} << 37) - 1);
  CHECK(mapped.row(2) == -1);
}

TEST_CASE("large: state_bytes of a 2^29-token layer", "[large]") {
  const std::size_t bytes = sh::state_bytes(big_state);
  CHECK(bytes >= big_tokens * (12 + 4 * 13));
  CHECK(bytes > (std::size_t{1} << 35));
  // Beyond what can be addressed: refused, not wrapped.
  CHECK(refused_argument([] { (void)sh::state_bytes({INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX}); }) == "shape");
}

TEST_CASE("large: workspace bytes for 2^30 slots", "[large]") {
  sh::host_kv_view<float> view{};
  view.capacity = 1 << 30;
  const std::size_t bytes = sh::host::compress_workspace_bytes(view);
  CHECK(bytes >= (std::size_t{1} << 30) * 17);
}

TEST_CASE("large: paged capacity at the int32 limit", "[large][regression]") {
  // Regression: max_capacity() multiplied in int32 (overflow on an
  // unvalidated view), and rounding a length up to pages computed
  // new_length + page_size - 1 in int32 (then in paged_kv_view::shrink, now
  // in pages_for and host::shrink_page_table).
  std::vector<std::int32_t> indptr{0, 1}, indices{0}, last{INT32_MAX};
  sh::host_paged_kv_view<float> view{};
  view.indptr = {indptr.data(), indptr.size()};
  view.indices = {indices.data(), indices.size()};
  view.last_page_len = {last.data(), last.size()};
  view.batch = 1;
  view.page_size = INT32_MAX;
  view.max_pages_per_sequence = 1;
  CHECK(view.max_capacity() == INT32_MAX);
  CHECK(view.length(0) == INT32_MAX);
  CHECK(view.pages_for(INT32_MAX) == 1);
  CHECK(view.pages_for(INT32_MAX - 3) == 1);
  CHECK(view.pages_for(1) == 1);
  CHECK(view.pages_for(0) == 0);
  CHECK(sh::length_after_compress(INT32_MAX, INT32_MAX, 1) == INT32_MAX - 1);
  CHECK(sh::length_after_compress(INT32_MAX - 1, INT32_MAX, 1) == INT32_MAX - 1);  // below the budget: unchanged
  // shrink_page_table at the limit: still one page, then none.
  std::vector<std::int32_t> new_lengths{INT32_MAX - 3}, released{-1};
  CHECK(sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                    {last.data(), last.size()}, INT32_MAX, {new_lengths.data(), 1},
                                    {released.data(), released.size()}) == 0);
  CHECK(last[0] == INT32_MAX - 3);
  CHECK(indptr == std::vector<std::int32_t>{0, 1});
  new_lengths[0] = 0;
  CHECK(sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                    {last.data(), last.size()}, INT32_MAX, {new_lengths.data(), 1},
                                    {released.data(), released.size()}) == 1);
  CHECK(last[0] == 0);
  CHECK(indptr == std::vector<std::int32_t>{0, 0});
  CHECK(released[0] == 0);
  view.max_pages_per_sequence = INT32_MAX;  // product ~2^62: clamped, not wrapped
  CHECK(view.max_capacity() == INT32_MAX);
  view.max_pages_per_sequence = -4;
  CHECK(view.max_capacity() == 0);
}

TEST_CASE("large: shrink_page_table with garbage far apart in indptr", "[large]") {
  // Adjacent entries 2^32 apart: their difference is taken in 64 bits and
  // refused, never wrapped into a small positive page count.
  std::vector<std::int32_t> indptr{0, INT32_MAX, INT32_MIN}, indices{0}, last{1, 1}, new_lengths{0, 0}, released(4);
  CHECK(refused_argument([&] {
          (void)sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                            {last.data(), last.size()}, 16, {new_lengths.data(), new_lengths.size()},
                                            {released.data(), released.size()});
        }) == "indptr");
  CHECK(indptr == std::vector<std::int32_t>{0, INT32_MAX, INT32_MIN});  // nothing written
}

TEST_CASE("large: probability views past 2^31 values", "[large]") {
  // 64 query heads x 4096 queries x 2^20 columns per sequence: 2^38 values.
  const auto p = sh::probability_view<host>::dense({fake_data(), 1}, 64, 4096, 1 << 20);
  CHECK(p.sequence_stride == std::int64_t{1} << 38);
  CHECK(sh::host::detail::reach(p, p.sequence_stride, p.head_stride, p.query_stride, 4, 1 << 20) ==
        std::int64_t{4} << 38);
  const auto q = sh::query_view<float, host>::dense({fake_data(), 1}, 64, 1 << 20, 256);
  CHECK(q.sequence_stride == std::int64_t{1} << 34);
  // The last row of sequence 3 starts past 2^39 (the offset row() adds, in 64 bits).
  CHECK(sh::detail::query_offset(p.qo_indptr, p.sequence_stride, p.head_stride, p.query_stride, 3, 63, 4095) ==
        (std::int64_t{4} << 38) - (1 << 20));
}

TEST_CASE("large: ragged views past 2^31 values", "[large]") {
  // FlashInfer's token-major layout: 2^31 - 1 query tokens in all, 64 query
  // heads, 2^20 columns: the last row starts near 2^57; token indices come
  // from qo_indptr (int32) and are multiplied in 64 bits.
  const std::vector<std::int32_t> qo_indptr{0, INT32_MAX - 4096, INT32_MAX};
  const sh::host_span<const std::int32_t> qo(qo_indptr.data(), qo_indptr.size());
  const auto p = sh::probability_view<host>::ragged({fake_data(), 1}, qo, 64, 1 << 20);
  CHECK(p.query_stride == std::int64_t{64} << 20);
  CHECK(p.queries_of(0) == INT32_MAX - 4096);
  CHECK(p.queries_of(1) == 4096);
  const std::int64_t last_row = (std::int64_t{INT32_MAX} - 1) * (std::int64_t{64} << 20) + std::int64_t{63} * (1 << 20);
  CHECK(sh::detail::query_offset(qo, p.sequence_stride, p.head_stride, p.query_stride, 1, 63, 4095) == last_row);
  CHECK(sh::host::detail::reach(p, p.sequence_stride, p.head_stride, p.query_stride, 2, 1 << 20) ==
        last_row + (1 << 20));
  // The same tokens' queries (head_dim 256) and FlashInfer's base-2 lse.
  const auto qv = sh::query_view<float, host>::ragged({fake_data(), 1}, qo, 64, 256);
  CHECK(sh::detail::query_offset(qo, qv.sequence_stride, qv.head_stride, qv.query_stride, 1, 63, 4095) ==
        (std::int64_t{INT32_MAX} - 1) * 64 * 256 + 63 * 256);
  const auto lse = sh::lse_view<host>::ragged({fake_data(), 1}, qo, 64, sh::lse_base::base2);
  CHECK(sh::host::detail::reach(qv, lse.sequence_stride, lse.head_stride, lse.query_stride, 2, 1) ==
        std::int64_t{INT32_MAX} * 64);
  // Uniform token-major lse: [batch * q_len][q_heads].
  const auto tm = sh::lse_view<host>::token_major({fake_data(), 1}, 64, 1 << 20, sh::lse_base::base2);
  CHECK(tm.sequence_stride == std::int64_t{64} << 20);
  CHECK(tm.query_stride == 64);
  CHECK(tm.head_stride == 1);
}
