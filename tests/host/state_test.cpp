// The state's lifetime and bookkeeping: its layout in the caller's buffer,
// reset_state, reset_sequence (a batch slot reused for a new request, then
// checked against the oracle), shrink_page_table, and host::admit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "policies.hpp"
#include "simulation.hpp"

namespace {

using namespace sh_test;

}  // namespace

TEST_CASE("state arrays lie inside the buffer, aligned and disjoint", "[state]") {
  for (std::int32_t words : {0, 1, 13, 400}) {
    const sh::state_shape shape{3, 5, 37, words};
    INFO("ring words " << words);
    const std::size_t bytes = sh::state_bytes(shape);
    CHECK(bytes % 256 == 0);
    aligned_bytes buf(bytes);
    const auto st = sh::make_state(buf.span(), shape);
    const std::size_t tokens = 3 * 5 * 37;
    struct range {
      const void* p;
      std::size_t n;
    };
    const range r[] = {{st.step, 3 * sizeof(std::int64_t)},       {st.next_position, 3 * sizeof(std::int32_t)},
                       {st.tracked, 3 * sizeof(std::int32_t)},    {st.positions, tokens * sizeof(std::int32_t)},
                       {st.scores, tokens * sizeof(float)},       {st.observed, tokens * sizeof(float)},
                       {st.ring, tokens * words * sizeof(std::uint32_t)}};
    for (std::size_t i = 0; i < std::size(r); ++i) {
      const auto begin = static_cast<const std::byte*>(r[i].p);
      CHECK(reinterpret_cast<std::uintptr_t>(begin) % 256 == 0);
      CHECK(begin >= buf.data());
      CHECK(begin + r[i].n <= buf.data() + bytes);
      if (i + 1 < std::size(r)) CHECK(begin + r[i].n <= static_cast<const std::byte*>(r[i + 1].p));
    }
    CHECK(st.index(2, 4, 36) == static_cast<std::int64_t>(tokens) - 1);
    // Word-major ring: word w of slot t of (r, h) at [((r * H + h) * words + w) * capacity + t].
    if (words > 0) {
      CHECK(&st.ring_of(1)[0] == st.ring + 1);
      CHECK(&st.ring_of(2, 4, 36)[words - 1] == st.ring + ((2 * 5 + 4) * std::int64_t{words} + words - 1) * 37 + 36);
      CHECK(&st.ring_of(st.index(2, 4, 36))[words - 1] == &st.ring_of(2, 4, 36)[words - 1]);
      CHECK(st.ring_of_head(1, 0) == st.ring + 5 * std::int64_t{words} * 37);
    }
  }
  // The shape a policy needs for a cache.
  const auto cache = make_contiguous(layout_kind::nhd, 2, 3, 8, 11, 1);
  auto c = cache;
  CHECK(sh::state_shape_for(sh::scissorhands_paper_policy{}, c.view()) == sh::state_shape{2, 3, 11, 13});
  CHECK(sh::state_shape_for(sh::scissorhands_policy{}, c.view()) == sh::state_shape{2, 3, 11, 1});
}

TEST_CASE("reset_state zeroes every sequence", "[state]") {
  const sh::state_shape shape{2, 2, 8, 3};
  aligned_bytes buf(sh::state_bytes(shape), 0x5A);
  const auto st = sh::make_state(buf.span(), shape);
  sh::host::reset_state(st);
  for (std::size_t i = 0; i < buf.size(); ++i) REQUIRE(buf.data()[i] == std::byte{0});
}

TEST_CASE("reset_sequence forgets one sequence, the others and the oracle carry on", "[state]") {
  sim_spec spec;
  spec.kv_heads = 2;
  spec.group = 2;
  spec.prefill = {14, 9, 11};
  spec.prefill_q = 2;
  spec.budget = 12;
  spec.config.evict_count = 2;
  spec.config.recent = 3;
  spec.config.window = 5;
  spec.seed = 51;
  auto cache = make_contiguous(layout_kind::hnd, 3, 2, 8, spec.capacity(), 2);
  indicator_window policy;
  policy.config = spec.config;
  simulation<indicator_window, contiguous_cache> sim(spec, policy, cache);
  sim.call(spec.prefill, spec.prefill_q);
  for (int i = 0; i < 6; ++i) sim.call({1, 1, 1}, 1);

  auto& st = sim.state();
  const auto before = st.buffer.snapshot();
  // Bad arguments change nothing.
  CHECK(refused_argument([&] { sh::host::reset_sequence(st.state, 3, 0); }) == "row");
  CHECK(refused_argument([&] { sh::host::reset_sequence(st.state, -1, 0); }) == "row");
  CHECK(refused_argument([&] { sh::host::reset_sequence(st.state, 1, -5); }) == "start_position");
  REQUIRE(st.buffer.equals(before));

  // The engine reuses batch slot 1 for a request that starts at position 100.
  sh::host::reset_sequence(st.state, 1, 100);
  CHECK(st.state.step[1] == 0);
  CHECK(st.state.next_position[1] == 100);
  CHECK(st.state.tracked[1] == 0);
  // Sequences 0 and 2 are untouched, byte for byte.
  const auto off = sh::detail::offsets_of(st.shape);
  for (std::int32_t b : {0, 2}) {
    CHECK(std::memcmp(before.data() + off.step + b * sizeof(std::int64_t), &st.state.step[b], sizeof(std::int64_t)) == 0);
    CHECK(std::memcmp(before.data() + off.next_position + b * sizeof(std::int32_t), &st.state.next_position[b], 4) == 0);
    CHECK(std::memcmp(before.data() + off.tracked + b * sizeof(std::int32_t), &st.state.tracked[b], 4) == 0);
  }
  cache.lengths[1] = 0;
  for (std::int32_t h = 0; h < spec.kv_heads; ++h) sim.slots(1, h).clear();
  sim.model().reset(1, 100);
  // A new prefill for sequence 1 only would need q_len <= every length:
  // append 3 to it and 1 to the others, one query each, and go on decoding.
  sim.call({1, 3, 1}, 1);
  for (std::int32_t h = 0; h < spec.kv_heads; ++h) CHECK(sim.slots(1, h) == std::vector<std::int32_t>{100, 101, 102});
  for (int i = 0; i < 20; ++i) sim.call({1, 1, 1}, 1);
  CHECK(st.state.next_position[1] == 123);
  CHECK(st.state.step[1] == 21);
  CHECK(sim.evictions() > 0);
}

TEST_CASE("shrink_page_table applies new lengths to a CSR page table", "[paged]") {
  // Pages of 4: lengths 11 (3 pages), 0, 15 (4 pages), 6 (2 pages).
  std::vector<std::int32_t> indptr{0, 3, 3, 7, 9};
  std::vector<std::int32_t> indices{10, 11, 12, 20, 21, 22, 23, 30, 31, -1};
  std::vector<std::int32_t> last_page_len{3, 0, 3, 2};
  std::vector<std::int32_t> released(8, -1);
  auto shrink = [&](const std::vector<std::int32_t>& new_lengths, std::size_t room) {
    return sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                       {last_page_len.data(), last_page_len.size()}, 4,
                                       {new_lengths.data(), new_lengths.size()}, {released.data(), room});
  };
  SECTION("some freed") {
    CHECK(shrink({8, 0, 5, 0}, 8) == 5);
    CHECK(indptr == std::vector<std::int32_t>{0, 2, 2, 4, 4});
    CHECK(std::vector<std::int32_t>(indices.begin(), indices.begin() + 4) == std::vector<std::int32_t>{10, 11, 20, 21});
    CHECK(last_page_len == std::vector<std::int32_t>{4, 0, 1, 0});
    CHECK(std::vector<std::int32_t>(released.begin(), released.begin() + 5) ==
          std::vector<std::int32_t>{12, 22, 23, 30, 31});
    CHECK(released[5] == -1);
  }
  SECTION("none freed, last pages shorter") {
    const auto indptr0 = indptr;
    const auto indices0 = indices;
    CHECK(shrink({9, 0, 13, 5}, 0) == 0);
    CHECK(indptr == indptr0);
    CHECK(indices == indices0);
    CHECK(last_page_len == std::vector<std::int32_t>{1, 0, 1, 1});
  }
  SECTION("bad input leaves the table alone") {
    const auto indptr0 = indptr;
    const auto indices0 = indices;
    const auto last0 = last_page_len;
    auto call = [&](const std::vector<std::int32_t>& new_lengths, std::size_t room) {
      return refused_argument([&] { shrink(new_lengths, room); });
    };
    CHECK(call({12, 0, 15, 6}, 8) == "new_lengths");  // grows sequence 0
    CHECK(call({8, 0, -1, 6}, 8) == "new_lengths");
    CHECK(call({8, 0, 15}, 8) == "new_lengths");
    CHECK(call({8, 0, 5, 0}, 4) == "released");
    CHECK(indptr == indptr0);
    CHECK(indices == indices0);
    CHECK(last_page_len == last0);
    CHECK(std::count(released.begin(), released.end(), -1) == 8);
  }
}

TEST_CASE("admit gives static scores and positions without observing", "[state]") {
  sh::key_norm_policy policy;
  policy.config.recent = 1;
  auto cache = make_contiguous(layout_kind::nhd, 2, 2, 4, 6, 3);
  state_holder st(policy, cache.view());
  cache.lengths = {2, 3};
  for (std::int32_t b = 0; b < 2; ++b)
    for (std::int32_t h = 0; h < 2; ++h)
      for (std::int32_t t = 0; t < cache.lengths[static_cast<std::size_t>(b)]; ++t)
        for (std::int32_t d = 0; d < 4; ++d) cache.row(0, b, h, t)[d] = static_cast<float>(t + 1 + d * h);
  sh::host::admit(policy, cache.view(), st.state);
  for (std::int32_t b = 0; b < 2; ++b) {
    CHECK(st.state.tracked[b] == cache.lengths[static_cast<std::size_t>(b)]);
    CHECK(st.state.next_position[b] == cache.lengths[static_cast<std::size_t>(b)]);
    CHECK(st.state.step[b] == 0);
    for (std::int32_t h = 0; h < 2; ++h)
      for (std::int32_t t = 0; t < cache.lengths[static_cast<std::size_t>(b)]; ++t) {
        float sum = 0.0f;
        for (std::int32_t d = 0; d < 4; ++d) sum += static_cast<float>((t + 1 + d * h) * (t + 1 + d * h));
        CHECK(st.state.positions[st.at(b, h, t)] == t);
        CHECK(st.state.scores[st.at(b, h, t)] == -std::sqrt(sum));  // small integers: exact either way
        CHECK(st.state.observed[st.at(b, h, t)] == 0.0f);
      }
  }
  // Admitting again admits nothing.
  const auto snap = st.buffer.snapshot();
  sh::host::admit(policy, cache.view(), st.state);
  CHECK(st.buffer.equals(snap));
}

TEST_CASE("compress needs no more workspace than it reports", "[state]") {
  auto cache = make_contiguous(layout_kind::nhd, 2, 2, 4, 20, 4);
  sh::h2o_policy policy;
  policy.config.recent = 2;
  policy.config.evict_count = 3;
  state_holder st(policy, cache.view());
  cache.lengths = {20, 20};
  sh::host::admit(policy, cache.view(), st.state);
  const std::size_t need = sh::host::compress_workspace_bytes(cache.view());
  CHECK(need > 0);
  // Exactly the reported size, with guard bytes after it that must survive.
  aligned_bytes ws(need + 64, 0xCD);
  std::vector<std::int32_t> new_lengths(2, -1);
  sh::host::compress(policy, cache.view(), st.state, 10, {ws.data(), need}, {{new_lengths.data(), 2}, {}});
  CHECK(new_lengths == std::vector<std::int32_t>{7, 7});
  CHECK(cache.lengths == std::vector<std::int32_t>{20, 20});  // the engine's, untouched
  for (std::size_t i = need; i < need + 64; ++i) REQUIRE(ws.data()[i] == std::byte{0xCD});
}
