// The engine loop of tests/engine/one_api_engine.hpp, written once against
// scissorhands::backend<Space>, through the host backend: what the host
// half of the one-API test can assert without a device. The CUDA test
// (tests/cuda/token_level.cu, part "one_api") runs the same source on the
// device and requires the same transcript bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <set>
#include <vector>

#include "../engine/one_api_engine.hpp"

namespace {

namespace sh = scissorhands;

template <class Policy>
void check_transcript(const Policy& policy) {
  const one_api::transcript t = one_api::run(sh::backend<sh::memory_space::host>{}, policy);
  REQUIRE(t.new_lengths.size() == std::size_t{one_api::steps});
  // Lengths: every step's new lengths follow length_after_compress of the
  // lengths the requests reached (the test's own count of appended tokens).
  std::vector<std::int32_t> length(one_api::batch, 0);
  std::int32_t evictions = 0, released = 0;
  for (std::int32_t s = 0; s < one_api::steps; ++s) {
    for (std::int32_t b = 0; b < one_api::batch; ++b) {
      auto& len = length[std::size_t(b)];
      len += one_api::appended(b, s);
      const std::int32_t want = sh::length_after_compress(len, one_api::budget, policy.config.evict_count);
      INFO("step " << s << ", request " << b);
      REQUIRE(t.new_lengths[std::size_t(s)][std::size_t(b)] == want);
      evictions += want < len;
      len = want;
    }
    released += t.released[std::size_t(s)];
  }
  CHECK(evictions >= 4);
  CHECK(released > 0);
  // The table holds those lengths, each page once, and the pages in use
  // plus the released ones never exceed the pool.
  std::set<std::int32_t> pages(t.indices.begin(), t.indices.end());
  CHECK(pages.size() == t.indices.size());
  for (std::int32_t b = 0; b < one_api::batch; ++b) {
    const std::int32_t n = t.indptr[std::size_t(b) + 1] - t.indptr[std::size_t(b)];
    CHECK(n == (length[std::size_t(b)] + one_api::page_size - 1) / one_api::page_size);
    if (n > 0)
      CHECK((n - 1) * one_api::page_size + t.last_page_len[std::size_t(b)] == length[std::size_t(b)]);
  }
  // The kept rows are the requests' own tokens: each kept K row of layer 0
  // holds the value the engine wrote for some position of that request and
  // head (rows are moved, never mixed), and the r newest positions stay.
  one_api::memory<sh::memory_space::host>::array<std::byte> buffer(t.states[0]);  // aligned, as make_state wants
  const auto state = sh::make_state(buffer.span(),
      sh::state_shape{one_api::batch, one_api::kv_heads, sh::state_capacity_for(one_api::budget, 6),
                      policy.ring_words()});
  for (std::int32_t b = 0; b < one_api::batch; ++b)
    for (std::int32_t h = 0; h < one_api::kv_heads; ++h) {
      std::set<std::int32_t> kept;
      for (std::int32_t slot = 0; slot < length[std::size_t(b)]; ++slot) {
        const std::int32_t position = state.positions[state.index(b, h, slot)];
        kept.insert(position);
        const std::int32_t page = t.indices[std::size_t(t.indptr[std::size_t(b)] + slot / one_api::page_size)];
        const std::size_t row =
            ((std::size_t(page) * one_api::page_size + std::size_t(slot % one_api::page_size)) * one_api::kv_heads +
             std::size_t(h)) * one_api::head_dim;
        for (std::int32_t d = 0; d < one_api::head_dim; ++d)
          REQUIRE(t.k[0][row + std::size_t(d)] == one_api::value_of(1, std::uint64_t(b),
                                                                    std::uint64_t(position) * 16 + std::uint64_t(h),
                                                                    std::uint64_t(d)));
      }
      CHECK(kept.size() == std::size_t(length[std::size_t(b)]));
      const std::int32_t newest = state.next_position[b] - 1;
      for (std::int32_t r = 0; r < policy.config.recent; ++r) CHECK(kept.count(newest - r) == 1);
    }
}

}  // namespace

TEST_CASE("one API: the engine loop written against backend<Space> runs on the host backend", "[one_api]") {
  sh::h2o_policy h2o;
  h2o.config.recent = 2;
  h2o.config.evict_count = 4;  // 12 -> 8 tokens: a page of 4 released
  check_transcript(h2o);
  sh::scissorhands_policy counter;
  counter.config.recent = 3;
  counter.config.evict_count = 5;
  check_transcript(counter);
}

TEST_CASE("one API: backend<host> returns host_status::success and takes HeadDim", "[one_api]") {
  const sh::backend<sh::memory_space::host> be;
  static_assert(std::is_same_v<decltype(be.reset_state(sh::eviction_state<sh::memory_space::host>{})),
                               sh::host_status>);
  STATIC_REQUIRE(sh::succeeded(sh::host_status::success));
  // One sequence of 3 tokens, one KV head of head_dim 4, one query.
  constexpr std::int32_t D = 4, C = 8;
  std::vector<float> k(std::size_t{C} * D, 0.5f), v(k.size(), 0.25f), q(D, 1.0f);
  std::vector<std::int32_t> lengths{3};
  const auto cache = sh::make_kv_view<float, sh::memory_space::host>({k.data(), k.size()}, {v.data(), v.size()},
                                                                     {lengths.data(), 1}, 1, 1, D, C,
                                                                     sh::named_layout::nhd);
  sh::h2o_policy policy;
  const sh::state_shape shape{1, 1, C, policy.ring_words()};
  std::vector<std::byte> bytes(sh::state_bytes(shape) + 256);
  auto* at = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(bytes.data()) + 255) / 256 * 256);
  const auto state = sh::make_state(sh::host_span<std::byte>(at, sh::state_bytes(shape)), shape);
  REQUIRE(sh::succeeded(be.reset_state(state)));
  const auto queries = sh::query_view<float, sh::memory_space::host>::dense({q.data(), q.size()}, 1, 1, D);
  // The device compiles only HeadDim's kernel; both backends refuse a cache of another head_dim.
  try {
    (void)be.observe_queries<64>(policy, cache, state, queries, {});
    FAIL("observe_queries<64> accepted a cache of head_dim 4");
  } catch (const sh::invalid_argument& e) {
    CHECK(e.argument() == "cache.head_dim");
  }
  CHECK(state.tracked[0] == 0);  // refused before anything was written
  CHECK(sh::succeeded(be.observe_queries(policy, cache, state, queries, {})));
  CHECK(state.tracked[0] == 3);
}
