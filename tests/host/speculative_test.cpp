// Speculative decoding: observe after verification. An engine appends k
// draft tokens, runs one verification attention over them, accepts a of
// them, and only then calls observe_queries with the cache holding the
// accepted tokens and the first a rows of the verification's queries and
// LSE (query j of a chunk is step step + j, causal over its own prefix, so
// a verified chunk is exactly a run of single-token decode steps). The
// rejected rows past the length are never read. Observing the drafts first
// and rolling back is refused: the state has admitted them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;

constexpr std::int32_t kv_heads = 2, q_heads = 4, head_dim = 8, capacity = 96;

// Token i's key (one row per KV head) and query (one per query head).
float key_of(std::int32_t i, std::int32_t h, std::int32_t d) {
  return static_cast<float>(unit(hash_of({1, i, h, d})) * 2.0 - 1.0);
}
float query_of(std::int32_t i, std::int32_t qh, std::int32_t d) {
  return static_cast<float>(unit(hash_of({2, i, qh, d})) * 4.0 - 2.0);
}

struct engine {
  contiguous_cache cache = make_contiguous(layout_kind::nhd, 1, kv_heads, head_dim, capacity, 7);
  std::vector<std::int32_t> tokens;  // slot -> token index (what the slot holds)

  void write(std::int32_t slot, std::int32_t token) {
    for (std::int32_t h = 0; h < kv_heads; ++h)
      for (std::int32_t d = 0; d < head_dim; ++d) cache.row(0, 0, h, slot)[d] = key_of(token, h, d);
    if (static_cast<std::size_t>(slot) >= tokens.size()) tokens.resize(static_cast<std::size_t>(slot) + 1);
    tokens[static_cast<std::size_t>(slot)] = token;
  }
  // Queries and natural LSE of the slots [first, first + n), as the
  // verification (or a decode step) computes them: causal over the slots
  // 0 .. slot, scale 1/sqrt(head_dim).
  void attention(std::int32_t first, std::int32_t n, std::vector<float>& q, std::vector<float>& lse) const {
    q.assign(std::size_t(n) * q_heads * head_dim, 0.0f);
    lse.assign(std::size_t(n) * q_heads, 0.0f);
    const double scale = 1.0 / std::sqrt(double(head_dim));
    for (std::int32_t j = 0; j < n; ++j) {
      const std::int32_t slot = first + j;
      const std::int32_t token = tokens[static_cast<std::size_t>(slot)];
      for (std::int32_t qh = 0; qh < q_heads; ++qh) {
        float* row = q.data() + (std::size_t(j) * q_heads + std::size_t(qh)) * head_dim;
        for (std::int32_t d = 0; d < head_dim; ++d) row[d] = query_of(token, qh, d);
        const std::int32_t h = qh / (q_heads / kv_heads);
        double sum = 0.0;
        for (std::int32_t t = 0; t <= slot; ++t) {
          double dot = 0.0;
          for (std::int32_t d = 0; d < head_dim; ++d) dot += double(row[d]) * double(key_of(tokens[std::size_t(t)], h, d));
          sum += std::exp(dot * scale);
        }
        lse[std::size_t(j) * q_heads + std::size_t(qh)] = static_cast<float>(std::log(sum));
      }
    }
  }
};

template <class Policy>
void observe_rows(const Policy& policy, engine& e, state_holder& st, std::int32_t first, std::int32_t n,
                  const std::vector<float>& q, const std::vector<float>& lse) {
  // Only the first n rows of the verification's queries and LSE: the
  // accepted tokens' (a uniform view of q_len n reads exactly those).
  sh::host::observe_queries(policy, e.cache.view(), st.state,
                            sh::query_view<float, host>::dense({q.data(), q.size()}, q_heads, n, head_dim),
                            sh::lse_view<host>::token_major({lse.data(), lse.size()}, q_heads, n,
                                                            sh::lse_base::natural));
  (void)first;
}

std::vector<std::byte> state_bytes_of(const state_holder& st) { return st.buffer.snapshot(); }

template <class Policy>
void check_speculation_equals_decode(const Policy& policy) {
  // Rounds of (drafted, accepted): an all-rejected round, all accepted, partial.
  const std::int32_t prompt = 12;
  const std::vector<std::pair<std::int32_t, std::int32_t>> rounds{{4, 2}, {4, 0}, {3, 3}, {5, 1}, {4, 4}, {6, 3}};

  // The plain engine decodes the accepted tokens one per step.
  engine plain;
  state_holder plain_state(policy, plain.cache.view());
  // The speculating engine verifies drafts and observes the accepted ones.
  engine spec;
  state_holder spec_state(policy, spec.cache.view());

  std::vector<float> q, lse;
  for (engine* e : {&plain, &spec}) {
    for (std::int32_t i = 0; i < prompt; ++i) e->write(i, i);
    e->cache.lengths[0] = prompt;
    e->attention(0, prompt, q, lse);
    observe_rows(policy, *e, e == &plain ? plain_state : spec_state, 0, prompt, q, lse);
  }

  std::int32_t next_token = prompt;  // accepted tokens are numbered in order
  std::int32_t rejected_token = 100000;
  for (const auto& [drafted, accepted] : rounds) {
    // Speculation: the drafts are appended; the rejected ones hold other
    // tokens than will finally sit there.
    const std::int32_t base = spec.cache.length(0);
    for (std::int32_t j = 0; j < drafted; ++j) spec.write(base + j, j < accepted ? next_token + j : rejected_token++);
    spec.cache.lengths[0] = base + drafted;
    spec.attention(base, drafted, q, lse);  // the verification pass
    spec.cache.lengths[0] = base + accepted;  // roll back the rejected rows before observing
    if (accepted > 0) observe_rows(policy, spec, spec_state, base, accepted, q, lse);
    // The same accepted tokens, one decode step each.
    for (std::int32_t j = 0; j < accepted; ++j) {
      const std::int32_t slot = plain.cache.length(0);
      plain.write(slot, next_token + j);
      plain.cache.lengths[0] = slot + 1;
      plain.attention(slot, 1, q, lse);
      observe_rows(policy, plain, plain_state, slot, 1, q, lse);
    }
    next_token += accepted;
    REQUIRE(spec.cache.length(0) == plain.cache.length(0));
    INFO("after a round of " << drafted << " drafts, " << accepted << " accepted");
    REQUIRE(state_bytes_of(spec_state) == state_bytes_of(plain_state));
  }

  // And compress chooses the same tokens.
  const std::int32_t budget = 20;
  std::vector<std::byte> ws_plain(sh::host::compress_workspace_bytes(plain.cache.view(), plain_state.shape));
  std::vector<std::byte> ws_spec(ws_plain.size());
  sh::host::compress(policy, plain.cache.view(), plain_state.state, budget, {ws_plain.data(), ws_plain.size()},
                     plain.cache.output());
  sh::host::compress(policy, spec.cache.view(), spec_state.state, budget, {ws_spec.data(), ws_spec.size()},
                     spec.cache.output());
  REQUIRE(plain.cache.reported == spec.cache.reported);
  REQUIRE(state_bytes_of(spec_state) == state_bytes_of(plain_state));
  for (std::int32_t h = 0; h < kv_heads; ++h)
    for (std::int32_t t = 0; t < plain.cache.reported[0]; ++t)
      REQUIRE(std::memcmp(plain.cache.row(0, 0, h, t), spec.cache.row(0, 0, h, t), sizeof(float) * head_dim) == 0);
}

}  // namespace

TEST_CASE("speculative decoding: observing the accepted tokens after verification equals decoding them",
          "[speculative]") {
  check_speculation_equals_decode(sh::scissorhands_policy{});
  check_speculation_equals_decode(sh::h2o_policy{});
  check_speculation_equals_decode(sh::tova_policy{});
}

TEST_CASE("speculative decoding: observing drafts and then rolling them back is refused", "[speculative]") {
  const sh::scissorhands_policy policy;
  engine e;
  state_holder st(policy, e.cache.view());
  std::vector<float> q, lse;
  for (std::int32_t i = 0; i < 10; ++i) e.write(i, i);
  e.cache.lengths[0] = 10;
  e.attention(0, 10, q, lse);
  observe_rows(policy, e, st, 0, 10, q, lse);
  // Observed before verification: the 4 drafts are admitted and counted.
  for (std::int32_t j = 0; j < 4; ++j) e.write(10 + j, 10 + j);
  e.cache.lengths[0] = 14;
  e.attention(10, 4, q, lse);
  observe_rows(policy, e, st, 10, 4, q, lse);
  const auto before = state_bytes_of(st);
  // Rolling back to 1 accepted draft leaves a length below what the state
  // tracks: every call refuses it, naming the length, and writes nothing.
  e.cache.lengths[0] = 11;
  std::vector<std::byte> ws(sh::host::compress_workspace_bytes(e.cache.view(), st.shape));
  try {
    sh::host::compress(policy, e.cache.view(), st.state, 8, {ws.data(), ws.size()}, e.cache.output());
    FAIL("compress accepted a length below the tracked tokens");
  } catch (const sh::invalid_argument& error) {
    CHECK(error.argument() == "cache length");
  }
  try {
    e.attention(10, 1, q, lse);
    observe_rows(policy, e, st, 10, 1, q, lse);
    FAIL("observe_queries accepted a length below the tracked tokens");
  } catch (const sh::invalid_argument& error) {
    CHECK(error.argument() == "cache length");
  }
  CHECK(state_bytes_of(st) == before);
}
