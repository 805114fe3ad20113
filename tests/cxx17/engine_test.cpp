// A C++17, -fno-exceptions "engine" that uses scissorhands only through
// bridge.h. It runs a paged fp32 layer (GQA, ragged prefill chunks then
// decode steps, base-2 LSE as FlashInfer returns it, continuous-batching
// state rows with a padding slot) through the bridge, and the same steps on
// a second copy through the C++20 host API directly (bridge_tu.cpp); every
// byte the two own must agree after every step. Then bad input: each call
// must come back as an error naming the argument, with the caller's buffers
// byte-identical. Plain main: prints "N passed, M failed", exits non-zero on
// any failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <scissorhands/bridge/bridge.h>

#include "check.h"
#include "scenario.h"

namespace br = scissorhands::bridge;
namespace api = cxx17_test::sh_f32;
using namespace cxx17_test;
using namespace cxx17_check;

namespace {

// Deterministic values in [-1, 1).
struct rng {
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  float next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(s >> 40) / 8388608.0f - 1.0f;
  }
};

// One engine layer: page pool, FlashInfer page table, free list, the
// library's state, compress's workspace and outputs.
struct layer {
  std::vector<float> k = std::vector<float>(pool_elements, 0.0f);
  std::vector<float> v = std::vector<float>(pool_elements, 0.0f);
  std::vector<std::int32_t> indptr = std::vector<std::int32_t>(batch + 1, 0);
  std::vector<std::int32_t> indices = std::vector<std::int32_t>(num_pages, -1);
  std::vector<std::int32_t> last_page_len = std::vector<std::int32_t>(batch, 0);
  std::vector<std::int32_t> free_pages;
  aligned_bytes state;
  std::vector<std::uint64_t> workspace;  // 8-byte aligned, as compress needs
  std::vector<std::int32_t> new_lengths = std::vector<std::int32_t>(batch, -7);
  std::vector<std::int32_t> freed_pages = std::vector<std::int32_t>(batch, -7);

  explicit layer(std::size_t state_bytes) : state(state_bytes, 0) {
    for (std::int32_t p = num_pages - 1; p >= 0; --p) free_pages.push_back(p);
  }
  // A scratch copy of `other`'s cache, page table and state (a call on it leaves `other` alone).
  void copy_from(const layer& other) {
    k = other.k, v = other.v, indptr = other.indptr, indices = other.indices;
    last_page_len = other.last_page_len, free_pages = other.free_pages;
    std::memcpy(state.data, other.state.data, state.size);
  }
  std::int32_t length(std::int32_t b) const {
    const std::int32_t pages = indptr[b + 1] - indptr[b];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
  }
  float* row(std::vector<float>& pool, std::int32_t b, std::int32_t h, std::int32_t t) {
    const std::int32_t page = indices[indptr[b] + t / page_size];
    const auto l = br::paged_layout::nhd(page_size, kv_heads, head_dim);
    return pool.data() + page * l.page_stride + h * l.head_stride + (t % page_size) * l.token_stride;
  }
  br::paged_cache<float> cache() {
    const auto l = br::paged_layout::nhd(page_size, kv_heads, head_dim);
    return {k.data(),
            k.size(),
            v.data(),
            v.size(),
            l,
            l,
            indptr.data(),
            indices.data(),
            indices.size(),
            last_page_len.data(),
            batch,
            kv_heads,
            head_dim,
            page_size,
            num_pages,
            max_pages_per_sequence};
  }
  br::page_table table() {
    return {indptr.data(), indices.data(), indices.size(), last_page_len.data(), batch, page_size};
  }
  layer_memory memory() {
    return {k.data(),
            v.data(),
            indptr.data(),
            indices.data(),
            last_page_len.data(),
            state.data,
            state.size,
            workspace.data(),
            workspace.size() * sizeof(std::uint64_t)};
  }
  // Everything a call could write, to prove a refused call wrote nothing.
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out = state.bytes();
    for (const auto* floats : {&k, &v}) append_bytes(out, *floats);
    for (const auto* ints : {&indptr, &indices, &last_page_len, &new_lengths, &freed_pages}) append_bytes(out, *ints);
    return out;
  }
  // Appends counts[b] tokens to sequence b, taking pages from the free list;
  // `values` holds, per new token in order, K then V rows of every head.
  void append(const std::int32_t* counts, const std::vector<float>& values) {
    std::vector<std::vector<std::int32_t>> lists(batch);
    std::vector<std::int32_t> lengths(batch);
    for (std::int32_t b = 0; b < batch; ++b) {
      lists[b].assign(indices.begin() + indptr[b], indices.begin() + indptr[b + 1]);
      lengths[b] = length(b);
    }
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t n = 0; n < counts[b]; ++n) {
        if (lengths[b] % page_size == 0) {
          lists[b].push_back(free_pages.back());
          free_pages.pop_back();
        }
        ++lengths[b];
      }
    std::int32_t at = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      indptr[b] = at;
      for (std::int32_t p : lists[b]) indices[at++] = p;
      last_page_len[b] =
          lengths[b] == 0 ? 0 : lengths[b] - (static_cast<std::int32_t>(lists[b].size()) - 1) * page_size;
    }
    indptr[batch] = at;
    std::size_t next = 0;
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t t = lengths[b] - counts[b]; t < lengths[b]; ++t)
        for (std::vector<float>* pool : {&k, &v})
          for (std::int32_t h = 0; h < kv_heads; ++h) {
            std::copy_n(values.data() + next, head_dim, row(*pool, b, h, t));
            next += head_dim;
          }
  }
};

br::settings test_settings() {
  br::settings s;
  check_ok(api::default_settings(&s), "default_settings");  // the preset's, then the test's numbers
  set_test_numbers(s);
  return s;
}

// A refused call: invalid_argument, the expected argument named in the
// error and its message, and nothing of the layer written.
template <class Call>
void expect_refused(const char* name, const char* argument, const layer& l, Call&& call) {
  const std::vector<unsigned char> before = l.bytes();
  const br::error e = call();
  const bool named = e.code == br::error_code::invalid_argument && std::strcmp(e.argument, argument) == 0 &&
                     std::strstr(e.message, argument) != nullptr && e.function[0] != '\0';
  check(named, name, e.message);
  if (!named)
    std::printf("  expected argument '%s', got code %d argument '%s'\n", argument, static_cast<int>(e.code),
                e.argument);
  check(l.bytes() == before, name, "(caller's buffers changed)");
}

// Base-2 log-sum-exp of every query's scaled logits over the slots it sees,
// as FlashInfer returns it: [token][q_heads].
std::vector<float> lse2_of(layer& l, const std::int32_t* counts, const std::vector<std::int32_t>& qo_indptr,
                           const std::vector<float>& queries) {
  std::vector<float> out(static_cast<std::size_t>(qo_indptr[batch]) * q_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (std::int32_t b = 0; b < batch; ++b)
    for (std::int32_t j = 0; j < counts[b]; ++j)
      for (std::int32_t qh = 0; qh < q_heads; ++qh) {
        const std::int32_t token = qo_indptr[b] + j;
        const float* q = queries.data() + (static_cast<std::size_t>(token) * q_heads + qh) * head_dim;
        const std::int32_t visible = l.length(b) - counts[b] + j + 1;
        std::vector<double> logits(visible);
        for (std::int32_t t = 0; t < visible; ++t) {
          const float* key = l.row(l.k, b, qh / (q_heads / kv_heads), t);
          double dot = 0.0;
          for (std::int32_t x = 0; x < head_dim; ++x) dot += double{q[x]} * key[x];
          logits[t] = dot * scale;
        }
        const double top = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (double x : logits) sum += std::exp(x - top);
        out[static_cast<std::size_t>(token) * q_heads + qh] = static_cast<float>((top + std::log(sum)) / std::log(2.0));
      }
  return out;
}

// New tokens per batch position at each step: a ragged prefill, then decode
// steps where position 2 sometimes has no token (q_len 0), and a second
// chunk for position 0 midway. Position 3 is the padding slot.
constexpr std::int32_t steps = 14;
constexpr std::int32_t schedule[steps][batch] = {{5, 7, 3, 0}, {1, 1, 1, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 0},
                                                 {1, 1, 0, 0}, {4, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 0, 0}, {1, 1, 1, 0},
                                                 {7, 1, 1, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}};

void run_paged_scenario() {
  const br::settings s = test_settings();
  const std::int32_t capacity = br::state_capacity_for(budget, max_step_tokens);

  br::state_shape shape;
  check_ok(api::make_state_shape(s, state_rows_count, kv_heads, capacity, &shape), "make_state_shape");
  check(shape.ring_words == 1, "make_state_shape: one ring word for a 6-step binary window");
  std::size_t bytes = 0;
  check_ok(api::state_bytes(shape, &bytes), "state_bytes");
  check(bytes == reference_state_bytes() && bytes > 0, "state_bytes matches the C++20 API");

  layer bridged(bytes), reference(bytes);
  br::state state;
  check_ok(api::make_state(bridged.state.data, bridged.state.size, shape, &state), "make_state");
  check_ok(api::reset_state(state), "reset_state");
  check(reference_reset(reference.memory()), "reference reset_state");
  state = state.for_batch(cxx17_test::state_rows);
  // Sized by the state's capacity (what compress checks), at most the cache-wide size.
  const std::size_t ws = api::compress_workspace_bytes(bridged.cache(), shape);
  check(ws > 0 && ws <= api::compress_workspace_bytes(bridged.cache()), "compress_workspace_bytes");
  bridged.workspace.assign((ws + 7) / 8, 0);
  reference.workspace.assign((ws + 7) / 8, 0);

  rng values;
  std::int32_t evictions = 0, released_total = 0;
  for (std::int32_t step = 0; step < steps; ++step) {
    const std::int32_t* counts = schedule[step];
    std::int32_t tokens = 0;
    std::vector<std::int32_t> qo_indptr(batch + 1, 0);
    for (std::int32_t b = 0; b < batch; ++b) qo_indptr[b + 1] = qo_indptr[b] + counts[b];
    tokens = qo_indptr[batch];
    std::vector<float> kv(static_cast<std::size_t>(tokens) * 2 * kv_heads * head_dim);
    for (float& x : kv) x = values.next();
    std::vector<float> queries(static_cast<std::size_t>(tokens) * q_heads * head_dim);
    for (float& x : queries) x = values.next();
    bridged.append(counts, kv);
    reference.append(counts, kv);
    std::vector<std::int32_t> before(batch);
    for (std::int32_t b = 0; b < batch; ++b) before[b] = bridged.length(b);
    const std::vector<float> lse2 = lse2_of(bridged, counts, qo_indptr, queries);

    // The engine's step, through the bridge.
    const br::paged_cache<float> cache = bridged.cache();
    if (step == 0) {
      // Every row's first observe checks the LSE's sums (lse_check): the
      // base-2 LSE named natural is refused, and accepted with the check off
      // on a scratch copy of the layer.
      br::lse misnamed = br::lse::ragged(lse2.data(), lse2.size(), qo_indptr.data(), q_heads, br::lse_base::natural);
      const auto qv = api::queries::ragged(queries.data(), queries.size(), qo_indptr.data(), q_heads, head_dim);
      expect_refused("observe_queries: a base-2 lse named natural", "lse", bridged,
                     [&] { return api::observe_queries(s, cache, state, qv, misnamed); });
      check(br::lse{}.check == br::lse_check::sums_to_one, "the bridge's lse checks its sums by default");
      misnamed.check = br::lse_check::none;
      layer scratch(bytes);
      scratch.copy_from(bridged);
      br::state scratch_state = state;
      scratch_state.buffer = scratch.state.data;
      check_ok(api::observe_queries(s, scratch.cache(), scratch_state, qv, misnamed),
               "observe_queries: lse_check::none accepts a misnamed base");
    }
    check_ok(
        api::observe_queries(s, cache, state,
                             api::queries::ragged(queries.data(), queries.size(), qo_indptr.data(), q_heads, head_dim),
                             br::lse::ragged(lse2.data(), lse2.size(), qo_indptr.data(), q_heads, br::lse_base::base2)),
        "observe_queries");
    check_ok(api::compress(s, cache, state, budget, bridged.workspace.data(), ws,
                           {bridged.new_lengths.data(), bridged.freed_pages.data()}),
             "compress");
    // The same step through the C++20 API.
    check(reference_step(reference.memory(), queries.data(), queries.size(), lse2.data(), lse2.size(), qo_indptr.data(),
                         reference.new_lengths.data(), reference.freed_pages.data()),
          "reference step");

    check(bridged.k == reference.k && bridged.v == reference.v, "K and V pools agree with the C++20 API");
    check(std::memcmp(bridged.state.data, reference.state.data, bytes) == 0, "state agrees with the C++20 API");
    check(bridged.new_lengths == reference.new_lengths, "new_lengths agree with the C++20 API");
    check(bridged.freed_pages == reference.freed_pages, "freed_pages agree with the C++20 API");
    for (std::int32_t b = 0; b < batch; ++b) {
      check(bridged.new_lengths[b] == br::length_after_compress(before[b], budget, evict_count),
            "new_lengths = length_after_compress");
      evictions += bridged.new_lengths[b] < before[b];
    }

    // After the last layer: apply the new lengths to the page table.
    std::vector<std::int32_t> released(num_pages, -1), reference_released(num_pages, -1);
    std::size_t count = 0, reference_count = 0;
    check_ok(
        api::shrink_page_table(bridged.table(), bridged.new_lengths.data(), released.data(), released.size(), &count),
        "shrink_page_table");
    check(reference_shrink(reference.indptr.data(), reference.indices.data(), reference.last_page_len.data(),
                           reference.new_lengths.data(), reference_released.data(), &reference_count),
          "reference shrink_page_table");
    check(count == reference_count && released == reference_released, "released pages agree with the C++20 API");
    check(bridged.indptr == reference.indptr && bridged.indices == reference.indices &&
              bridged.last_page_len == reference.last_page_len,
          "page tables agree with the C++20 API");
    for (std::size_t i = 0; i < count; ++i) {
      bridged.free_pages.push_back(released[i]);
      reference.free_pages.push_back(reference_released[i]);
    }
    released_total += static_cast<std::int32_t>(count);
    for (std::int32_t b = 0; b < batch; ++b)
      check(bridged.length(b) == bridged.new_lengths[b], "the shrunk table holds the new lengths");
  }
  check(evictions >= 10 && released_total > 0, "the scenario evicted and released pages");

  // observe_queries with the kernel's attention options: a sliding window
  // of 3 slots gives the C++20 API's state bytes, and not plain softmax's
  // (a copy observed with attention{}).
  {
    // The next step appends a token to each live sequence and observes it
    // (each query is a new token).
    const std::int32_t next_step[] = {1, 1, 1, 0};
    std::vector<float> kv(std::size_t{3} * 2 * kv_heads * head_dim);
    for (float& x : kv) x = values.next();
    bridged.append(next_step, kv);
    reference.append(next_step, kv);
    const std::vector<std::int32_t> qo_indptr{0, 1, 2, 3, 3};  // each live sequence's new token
    std::vector<float> queries(std::size_t{3} * q_heads * head_dim);
    for (float& x : queries) x = values.next();
    const auto q = api::queries::ragged(queries.data(), queries.size(), qo_indptr.data(), q_heads, head_dim);
    br::attention window;
    window.window_left = 3;
    window.window_left_unit = br::window_unit::slots;
    layer plain(bytes);
    plain.k = bridged.k;
    plain.indptr = bridged.indptr;
    plain.indices = bridged.indices;
    plain.last_page_len = bridged.last_page_len;
    std::memcpy(plain.state.data, bridged.state.data, bytes);
    br::state plain_state = state;
    plain_state.buffer = plain.state.data;
    check_ok(api::observe_queries(s, bridged.cache(), state, q, br::lse{}, window),
             "observe_queries with a window in slots");
    check(reference_observe_with(reference.memory(), queries.data(), queries.size(), qo_indptr.data(), window),
          "reference observe_queries with a window in slots");
    check(std::memcmp(bridged.state.data, reference.state.data, bytes) == 0,
          "observe_queries with a window in slots: state agrees with the C++20 API");
    check_ok(api::observe_queries(s, plain.cache(), plain_state, q, br::lse{}, br::attention{}),
             "observe_queries with plain attention");
    check(std::memcmp(bridged.state.data, plain.state.data, bytes) != 0,
          "observe_queries: the window changes the state (the options reach the library)");
  }

  // ---- bad input: an error naming the argument, nothing written ----------
  const br::paged_cache<float> cache = bridged.cache();
  std::vector<std::int32_t> qo_indptr{0, 1, 2, 3, 3};
  std::vector<float> queries(std::size_t{3} * q_heads * head_dim, 0.25f);
  std::vector<float> lse2(std::size_t{3} * q_heads, 1.0f);
  const auto good_queries = api::queries::ragged(queries.data(), queries.size(), qo_indptr.data(), q_heads, head_dim);
  const auto good_lse = br::lse::ragged(lse2.data(), lse2.size(), qo_indptr.data(), q_heads, br::lse_base::base2);
  // Sanity: these arguments are accepted (on a scratch copy of the layer).
  {
    layer scratch(bytes);
    scratch.copy_from(bridged);
    br::state scratch_state = state;
    scratch_state.buffer = scratch.state.data;
    const std::int32_t next_step[] = {1, 1, 1, 0};  // a new token to observe
    scratch.append(next_step, std::vector<float>(std::size_t{3} * 2 * kv_heads * head_dim, 0.5f));
    check_ok(api::observe_queries(s, scratch.cache(), scratch_state, good_queries, good_lse),
             "the bad-input baseline is accepted");
  }
  bridged.new_lengths.assign(batch, -7);
  bridged.freed_pages.assign(batch, -7);
  const br::compress_output out{bridged.new_lengths.data(), bridged.freed_pages.data()};
  void* const workspace = bridged.workspace.data();

  expect_refused("compress: budget at the protected tokens", "budget", bridged,
                 [&] { return api::compress(s, cache, state, recent + sinks, workspace, ws, out); });
  expect_refused("compress: workspace too small", "workspace", bridged,
                 [&] { return api::compress(s, cache, state, budget, workspace, ws - 1, out); });
  expect_refused("compress: null new_lengths", "out.new_lengths", bridged, [&] {
    return api::compress(s, cache, state, budget, workspace, ws, {nullptr, out.freed_pages});
  });
  expect_refused("compress: paged cache without freed_pages", "out.freed_pages", bridged, [&] {
    return api::compress(s, cache, state, budget, workspace, ws, {out.new_lengths, nullptr});
  });
  expect_refused("compress: evict_count 0", "settings.evict_count", bridged, [&] {
    br::settings bad = s;
    bad.evict_count = 0;
    return api::compress(bad, cache, state, budget, workspace, ws, out);
  });
  const std::int32_t duplicate_rows[batch] = {3, 3, 4, -1};
  expect_refused("compress: two batch positions on one state row", "state.state_rows", bridged,
                 [&] { return api::compress(s, cache, state.for_batch(duplicate_rows), budget, workspace, ws, out); });
  expect_refused("observe_queries: state made for 1 KV head", "state.shape.kv_heads", bridged, [&] {
    br::state bad = state;
    bad.shape.kv_heads = 1;
    return api::observe_queries(s, cache, bad, good_queries, good_lse);
  });
  expect_refused("observe_queries: state made for another window", "state.shape.ring_words", bridged, [&] {
    br::state bad = state;
    bad.shape.ring_words = 0;  // smaller, so the buffer is large enough and the policy check speaks
    return api::observe_queries(s, cache, bad, good_queries, good_lse);
  });
  expect_refused("observe_queries: state buffer smaller than its shape", "state.bytes", bridged, [&] {
    br::state bad = state;
    bad.bytes -= 1;
    return api::observe_queries(s, cache, bad, good_queries, good_lse);
  });
  expect_refused("observe_queries: misaligned state buffer", "state.buffer", bridged, [&] {
    br::state bad = state;
    bad.buffer = static_cast<char*>(bad.buffer) + 8;
    return api::observe_queries(s, cache, bad, good_queries, good_lse);
  });
  expect_refused("observe_queries: q_heads not a multiple of kv_heads", "q_heads", bridged, [&] {
    auto bad = good_queries;
    bad.q_heads = 3;
    return api::observe_queries(s, cache, state, bad, br::lse{});
  });
  expect_refused("observe_queries: lse base not named", "lse.base", bridged, [&] {
    br::lse unnamed = good_lse;
    unnamed.base = br::lse_base::unspecified;
    return api::observe_queries(s, cache, state, good_queries, unnamed);
  });
  expect_refused("observe_queries: decreasing qo_indptr", "qo_indptr", bridged, [&] {
    const std::vector<std::int32_t> decreasing{0, 2, 1, 3, 3};
    return api::observe_queries(
        s, cache, state, api::queries::ragged(queries.data(), queries.size(), decreasing.data(), q_heads, head_dim),
        br::lse::ragged(lse2.data(), lse2.size(), decreasing.data(), q_heads, br::lse_base::base2));
  });
  expect_refused("observe_queries: lse over another qo_indptr array", "lse.qo_indptr", bridged, [&] {
    const std::vector<std::int32_t> copy(qo_indptr.begin(), qo_indptr.end());
    return api::observe_queries(s, cache, state, good_queries,
                                br::lse::ragged(lse2.data(), lse2.size(), copy.data(), q_heads, br::lse_base::base2));
  });
  expect_refused("observe_queries: NaN log-sum-exp", "lse", bridged, [&] {
    std::vector<float> bad = lse2;
    bad[1] = std::nanf("");
    return api::observe_queries(s, cache, state, good_queries,
                                br::lse::ragged(bad.data(), bad.size(), qo_indptr.data(), q_heads, br::lse_base::base2));
  });
  expect_refused("observe_queries: page id outside the pool", "cache.indices", bridged, [&] {
    std::vector<std::int32_t> bad = bridged.indices;
    bad[0] = num_pages;
    br::paged_cache<float> c = cache;
    c.indices = bad.data();
    return api::observe_queries(s, c, state, good_queries, good_lse);
  });
  expect_refused("observe_queries: K pool smaller than its layout", "cache.k_pages", bridged, [&] {
    br::paged_cache<float> c = cache;
    c.k_size -= 1;
    return api::observe_queries(s, c, state, good_queries, good_lse);
  });
  expect_refused("observe_probabilities: no probabilities", "probs.data", bridged, [&] {
    return api::observe_probabilities(s, cache, state, br::probabilities::dense(nullptr, 0, q_heads, 1, 16));
  });
  expect_refused("reset_sequence: row outside the state", "row", bridged,
                 [&] { return api::reset_sequence(state, state_rows_count, 0); });
  expect_refused("make_state: misaligned buffer", "buffer", bridged, [&] {
    br::state ignored;
    return api::make_state(static_cast<char*>(bridged.state.data) + 8, bytes - 8, shape, &ignored);
  });
  // A settings default_settings did not fill holds the paper's numbers, not
  // the preset's: refused by every call, compress and make_state_shape shown.
  expect_refused("compress: settings not from default_settings", "settings", bridged, [&] {
    br::settings by_hand;
    by_hand.window = window;
    return api::compress(by_hand, cache, state, budget, workspace, ws, out);
  });
  expect_refused("make_state_shape: settings not from default_settings", "settings", bridged, [&] {
    br::state_shape ignored;
    return api::make_state_shape(br::settings{}, state_rows_count, kv_heads, capacity, &ignored);
  });
  expect_refused("make_state_shape: window 0", "settings.window", bridged, [&] {
    br::settings bad = s;
    bad.window = 0;
    br::state_shape ignored;
    return api::make_state_shape(bad, state_rows_count, kv_heads, capacity, &ignored);
  });
  expect_refused("state_bytes: no rows", "shape.rows", bridged, [&] {
    std::size_t ignored = 0;
    br::state_shape bad = shape;
    bad.rows = 0;
    return api::state_bytes(bad, &ignored);
  });
  expect_refused("shrink_page_table: a length the table does not hold", "new_lengths", bridged, [&] {
    std::vector<std::int32_t> longer(batch);
    for (std::int32_t b = 0; b < batch; ++b) longer[b] = bridged.length(b);
    longer[0] += 1;
    std::vector<std::int32_t> released(num_pages);
    std::size_t count = 0;
    return api::shrink_page_table(bridged.table(), longer.data(), released.data(), released.size(), &count);
  });

  // A refused call never changes the state, so the layer keeps working.
  check_ok(api::reset_sequence(state, 4, 100), "reset_sequence after refused calls");
}

// The second instantiation: H2O on a contiguous cache, probabilities given,
// preserve_order compaction. Row t of K and V holds the value t.
void run_contiguous_h2o() {
  namespace h2o = cxx17_test::h2o_f32;
  constexpr std::int32_t capacity = 8, dim = 4;
  std::vector<float> k(std::size_t{capacity} * dim), v(std::size_t{capacity} * dim);
  for (std::int32_t t = 0; t < capacity; ++t)
    for (std::int32_t x = 0; x < dim; ++x) k[t * dim + x] = v[t * dim + x] = static_cast<float>(t);
  std::vector<std::int32_t> lengths{5};
  const auto layout = br::kv_layout::nhd(capacity, 1, dim);
  const h2o::contiguous_cache cache{k.data(),       k.size(), v.data(), v.size(), layout,  layout,
                                    lengths.data(), 1,        1,        dim,      capacity};
  br::settings s;
  check_ok(h2o::default_settings(&s), "h2o default_settings");
  check(!s.normalize && s.recent == 10 && s.evict_count == 1, "h2o default_settings are h2o_policy's");
  s.recent = 1;
  s.evict_count = 1;
  s.compaction_mode = br::compaction::preserve_order;

  br::state_shape shape;
  check_ok(h2o::make_state_shape(s, 1, 1, capacity, &shape), "h2o make_state_shape");
  check(shape.ring_words == 0, "h2o keeps no ring");
  std::size_t bytes = 0;
  check_ok(h2o::state_bytes(shape, &bytes), "h2o state_bytes");
  aligned_bytes buffer(bytes, 0);
  br::state state;
  check_ok(h2o::make_state(buffer.data, buffer.size, shape, &state), "h2o make_state");
  check_ok(h2o::reset_state(state), "h2o reset_state");
  const std::vector<float> probs{0.3f, 0.3f, 0.01f, 0.2f, 0.19f};  // token 2 gets almost nothing
  check_ok(h2o::observe_probabilities(s, cache, state, br::probabilities::dense(probs.data(), probs.size(), 1, 1, 5)),
           "h2o observe_probabilities");
  std::vector<std::uint64_t> workspace((h2o::compress_workspace_bytes(cache) + 7) / 8);
  std::int32_t new_length = -1;
  check_ok(h2o::compress(s, cache, state, 5, workspace.data(), workspace.size() * 8, {&new_length, nullptr}),
           "h2o compress (contiguous, no freed_pages)");
  check(new_length == 4 && lengths[0] == 5, "h2o: one token evicted, the engine's length untouched");
  const float kept[4] = {0.0f, 1.0f, 3.0f, 4.0f};  // preserve_order keeps slot order
  bool rows = true;
  for (std::int32_t t = 0; t < 4; ++t)
    rows = rows && k[static_cast<std::size_t>(t) * dim] == kept[t] && v[static_cast<std::size_t>(t) * dim] == kept[t];
  check(rows, "h2o: the least-attended token went, order preserved");
}

void run_error_value() {
  const br::error ok{};
  check(ok.ok() && !ok && ok.function[0] == '\0' && ok.message[0] == '\0', "a default error reads ok");
  check(sizeof(br::error) == 4 + 2 * br::error::name_size + br::error::message_size, "error is one flat block");
}

}  // namespace

int main() {
  run_error_value();
  run_paged_scenario();
  run_contiguous_h2o();
  return finish();
}
