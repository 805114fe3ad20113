#pragma once
// Part of differential.cu (its main translation unit): the device refuses
// what the host refuses, run on the host.
//
//   check_parity  the data checks every CUDA call makes first of a
//                 sequence's length or page-table entries and of its state
//                 row's counters (sequence_table::check_sequence, every
//                 thread of a block in turn, then check_counters), and
//                 observe's checks of its query counts (check_queries):
//                 host and device functions, kernels/check.cuh. Against
//                 host::admit's (or host::observe_probabilities') refusal
//                 of the same bytes, contiguous and paged. Each case
//                 breaks one thing (or sits on a bound and breaks nothing):
//                 the host must refuse it naming the expected argument and
//                 the device set exactly the expected status bit, for the
//                 row or for the batch, or both accept it. Not a device
//                 result: it runs in host-only runs too.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.cuh"

namespace check_parity_tests {

using namespace harness;
namespace sh = scissorhands;
namespace kd = sh::cuda::detail;

// A batch of one sequence of 10 tokens, state row 0 tracking all of them.
// Contiguous: capacity 32. Paged: page size 4, pages 5, 1, 2 of a pool of 8,
// at most 6 pages a sequence (24 tokens). The state has 16 slots.
struct fixture {
  bool paged = false;
  std::vector<std::int32_t> lengths{10};
  std::vector<std::int32_t> indptr{0, 3}, indices{5, 1, 2}, last_page_len{2};
  std::int32_t state_slots = 16;
  std::int64_t step = 5;
  std::int32_t tracked = 10, next_position = 10;
  // Observe from probabilities (host::observe_probabilities; the device's
  // check_queries) instead of admit: uniform q_len, or ragged qo_indptr.
  bool queries = false, ragged = false;
  std::int32_t q_len = 3;
  std::vector<std::int32_t> qo_indptr{0, 3};
  std::int32_t observed_slot = -1;  // a slot a query already saw (observed count 1), or none
};

constexpr int H = 1, D = 1, capacity = 32, page_size = 4, num_pages = 8, max_pages = 6;
constexpr int q_heads = 1, columns = capacity, max_queries = capacity;

struct verdict {
  std::string host_argument;  // empty: accepted
  std::uint32_t own = 0, batch = 0;
};

template <class Policy>
verdict judge(const Policy& policy, const fixture& f) {
  const sh::state_shape shape{1, H, f.state_slots, policy.ring_words()};
  aligned_bytes state_buf(sh::state_bytes(shape));
  const auto st = sh::make_state(state_buf.span(), shape);
  sh::host::reset_state(st);
  st.step[0] = f.step;
  st.tracked[0] = f.tracked;
  st.next_position[0] = f.next_position;
  if (f.observed_slot >= 0) st.observed[st.row_index(0, 0, f.observed_slot)] = 1.0f;
  // The same bytes typed as the device's, read by the device checks on the host.
  const auto dst = sh::make_state(sh::span<std::byte, device_space>(state_buf.data(), state_buf.n), shape);
  const std::size_t elements = f.paged ? std::size_t{num_pages} * page_size * H * D : std::size_t{capacity} * H * D;
  std::vector<float> k(elements, 0.0f), v(elements, 0.0f);
  verdict out;
  // Probabilities of 0.05 for every query a case can have (ragged: token-major).
  std::vector<float> probs(std::size_t{max_queries} * q_heads * columns, 0.05f);
  const auto probs_of = [&](auto space) {
    constexpr auto S = decltype(space)::value;
    const sh::span<const float, S> data(probs.data(), probs.size());
    return f.ragged
               ? sh::probability_view<S>::ragged(
                     data, sh::span<const std::int32_t, S>(f.qo_indptr.data(), f.qo_indptr.size()), q_heads, columns)
               : sh::probability_view<S>::dense(data, q_heads, f.q_len, columns);
  };
  auto host_call = [&](const auto& view) {
    try {
      if (f.queries)
        sh::host::observe_probabilities(policy, view, st,
                                        probs_of(std::integral_constant<sh::memory_space, host_space>{}));
      else
        sh::host::admit(policy, view, st);
    } catch (const sh::invalid_argument& e) {
      out.host_argument = e.argument();
    }
  };
  // The device's checks first, on the bytes the host is given: an accepted
  // host call writes the state. kernels/check.cuh's check_sequence for a
  // live row: the block's threads share the page ids, then the row's
  // counters against the length; then observe_check_kernel's check_queries.
  const kd::sequence_table seqs =
      f.paged
          ? kd::make_sequence_table(sh::make_paged_kv_view(
                sh::span<float, device_space>(k.data(), k.size()), sh::span<float, device_space>(v.data(), v.size()),
                sh::span<const std::int32_t, device_space>(f.indptr.data(), f.indptr.size()),
                sh::span<const std::int32_t, device_space>(f.indices.data(), f.indices.size()),
                sh::span<const std::int32_t, device_space>(f.last_page_len.data(), 1), 1, H, D, page_size, num_pages,
                max_pages))
          : kd::make_sequence_table(sh::make_kv_view(sh::span<float, device_space>(k.data(), k.size()),
                                                     sh::span<float, device_space>(v.data(), v.size()),
                                                     sh::span<const std::int32_t, device_space>(f.lengths.data(), 1), 1,
                                                     H, D, capacity, sh::named_layout::nhd));
  constexpr int threads = sh::cuda::slot_traits::threads;
  kd::sequence_check c;
  for (int thread = 0; thread < threads; ++thread) c.own |= seqs.check_sequence(0, thread, threads, c.length, c.batch);
  c.row = 0;
  c.row_ok = true;
  c.length_ok = c.own == 0;
  c.own |= kd::check_counters(dst, 0, c.length, c.length_ok, c.tracked, c.next_position);
  if (f.queries) {
    const auto device_probs = probs_of(std::integral_constant<sh::memory_space, device_space>{});
    kd::check_queries(kd::make_query_rows(device_probs, q_heads, device_probs.data.size()), 0, c);
    c.own |= kd::check_new_tokens(dst, c, 0, 1);
  }
  if (f.paged)
    host_call(sh::make_paged_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                                     sh::host_span<const std::int32_t>(f.indptr.data(), f.indptr.size()),
                                     sh::host_span<const std::int32_t>(f.indices.data(), f.indices.size()),
                                     sh::host_span<const std::int32_t>(f.last_page_len.data(), 1), 1, H, D, page_size,
                                     num_pages, max_pages));
  else
    host_call(sh::make_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                               sh::host_span<const std::int32_t>(f.lengths.data(), 1), 1, H, D, capacity,
                               sh::named_layout::nhd));
  out.own = c.own;
  out.batch = c.batch;
  return out;
}

struct parity_case {
  const char* what;
  bool paged;
  std::function<void(fixture&)> breaks;
  const char* host_argument;  // "" : accepted
  std::uint32_t own, batch;
};

inline int run() {
  check_tally tally{"check_parity"};
  const sh::scissorhands_policy policy;
  constexpr std::int32_t int32_max = std::numeric_limits<std::int32_t>::max();
  constexpr std::int64_t step_max = std::int64_t{1} << 62;
  std::vector<parity_case> cases;
  for (bool paged : {false, true}) {
    // The row's counters, either layout.
    cases.push_back({"as built", paged, [](fixture&) {}, "", 0, 0});
    cases.push_back({"step -1", paged, [](fixture& f) { f.step = -1; }, "state.step", sh::cuda::status_step, 0});
    cases.push_back({"step 2^62", paged, [](fixture& f) { f.step = step_max; }, "", 0, 0});
    cases.push_back(
        {"step 2^62 + 1", paged, [](fixture& f) { f.step = step_max + 1; }, "state.step", sh::cuda::status_step, 0});
    cases.push_back(
        {"tracked -1", paged, [](fixture& f) { f.tracked = -1; }, "cache length", sh::cuda::status_tracked, 0});
    cases.push_back({"tracked above the length", paged, [](fixture& f) { f.tracked = 11; }, "cache length",
                     sh::cuda::status_tracked, 0});
    cases.push_back({"tracked 0 (all tokens new)", paged, [](fixture& f) { f.tracked = 0; }, "", 0, 0});
    cases.push_back({"next_position -1", paged, [](fixture& f) { f.next_position = -1; }, "state.next_position",
                     sh::cuda::status_position_overflow, 0});
    cases.push_back(
        {"next_position INT32_MAX, no new token", paged, [](fixture& f) { f.next_position = int32_max; }, "", 0, 0});
    cases.push_back({"next_position INT32_MAX, one new token", paged,
                     [](fixture& f) { f.next_position = int32_max, f.tracked = 9; }, "state.next_position",
                     sh::cuda::status_position_overflow, 0});
    cases.push_back({"state one slot short", paged, [](fixture& f) { f.state_slots = 9; }, "state.shape.capacity",
                     sh::cuda::status_state_capacity, 0});
    cases.push_back({"state exactly long enough", paged, [](fixture& f) { f.state_slots = 10; }, "", 0, 0});
  }
  // The length of a contiguous cache.
  cases.push_back({"length -1", false, [](fixture& f) { f.lengths = {-1}, f.tracked = 0; }, "cache length",
                   sh::cuda::status_length, 0});
  cases.push_back({"length above the capacity", false, [](fixture& f) { f.lengths = {capacity + 1}; }, "cache length",
                   sh::cuda::status_length, 0});
  cases.push_back({"length at the capacity", false,
                   [](fixture& f) { f.lengths = {capacity}, f.state_slots = capacity; }, "", 0, 0});
  // A paged cache's table.
  const std::uint32_t table = sh::cuda::status_page_table;
  cases.push_back({"indptr[0] = 1", true,
                   [](fixture& f) {
                     f.indptr = {1, 4}, f.indices = {0, 5, 1, 2};
                   },
                   "cache.indptr", 0, table});
  cases.push_back({"indptr decreasing", true, [](fixture& f) { f.indptr = {0, -1}; }, "cache.indptr", table, 0});
  cases.push_back({"pages above max_pages_per_sequence", true,
                   [](fixture& f) {
                     f.indptr = {0, 7}, f.indices = {0, 1, 2, 3, 4, 5, 6}, f.state_slots = 32;
                   },
                   "cache.indptr", table, 0});
  cases.push_back(
      {"last_page_len 0 on a page", true, [](fixture& f) { f.last_page_len = {0}; }, "cache.last_page_len", table, 0});
  cases.push_back({"last_page_len above page_size", true, [](fixture& f) { f.last_page_len = {5}; },
                   "cache.last_page_len", table, 0});
  cases.push_back({"last_page_len 1 without a page", true,
                   [](fixture& f) {
                     f.indptr = {0, 0}, f.last_page_len = {1}, f.tracked = 0;
                   },
                   "cache.last_page_len", table, 0});
  cases.push_back({"indptr past the indices", true, [](fixture& f) { f.indices = {5, 1}; }, "cache.indices", table, 0});
  cases.push_back({"page id = num_pages", true,
                   [](fixture& f) {
                     f.indices = {5, num_pages, 2};
                   },
                   "cache.indices", table, 0});
  cases.push_back({"page id -1", true, [](fixture& f) { f.indices = {5, 1, -1}; }, "cache.indices", table, 0});
  cases.push_back({"a sequence with no page", true,
                   [](fixture& f) {
                     f.indptr = {0, 0}, f.last_page_len = {0}, f.tracked = 0;
                   },
                   "", 0, 0});
  // Query counts (observe from probabilities), contiguous: the sequence
  // holds 10 tokens, each query is one of them.
  const auto ragged = [](std::vector<std::int32_t> qo) {
    return [qo](fixture& f) { f.queries = f.ragged = true, f.qo_indptr = qo; };
  };
  const auto uniform = [](std::int32_t q) { return [q](fixture& f) { f.queries = true, f.q_len = q; }; };
  const std::uint32_t qo = sh::cuda::status_qo_indptr, too_many = sh::cuda::status_query_length;
  cases.push_back({"q_len 3", false, uniform(3), "", 0, 0});
  cases.push_back({"q_len = length", false, uniform(10), "", 0, 0});
  cases.push_back({"q_len above the length", false, uniform(11), "q_len", too_many, 0});
  cases.push_back({"qo_indptr {0, 3}", false, ragged({0, 3}), "", 0, 0});
  cases.push_back({"qo_indptr {0, 10}", false, ragged({0, 10}), "", 0, 0});
  cases.push_back({"qo_indptr {0, 11}: above the length", false, ragged({0, 11}), "qo_indptr", too_many, 0});
  cases.push_back({"qo_indptr {-1, 2}: negative start", false, ragged({-1, 2}), "qo_indptr", qo, qo});
  cases.push_back({"qo_indptr {3, 2}: decreasing", false, ragged({3, 2}), "qo_indptr", qo, 0});
  cases.push_back({"qo_indptr {0, 0}: no query", false, ragged({0, 0}), "", 0, 0});
  // The observe-step invariant: the queries are the state's new tokens.
  const std::uint32_t stale = sh::cuda::status_new_tokens;
  const auto with = [&](std::int32_t q, auto more) {
    return [q, more](fixture& f) {
      f.queries = true, f.q_len = q;
      more(f);
    };
  };
  cases.push_back({"q_len 3, slot 9 seen by a query (a layer observed twice)", false,
                   with(3, [](fixture& f) { f.observed_slot = 9; }), "cache length", stale, 0});
  cases.push_back({"q_len 3, slot 6 seen (before the queries)", false,
                   with(3, [](fixture& f) { f.observed_slot = 6; }), "", 0, 0});
  cases.push_back({"q_len 3, 5 new tokens after a query (new lengths not applied)", false,
                   with(3, [](fixture& f) { f.tracked = 5; }), "cache length", stale, 0});
  cases.push_back({"q_len 3, 5 new tokens before the row's first query", false,
                   with(3, [](fixture& f) { f.tracked = 5, f.step = 0; }), "", 0, 0});
  cases.push_back({"q_len 5, 5 new tokens after a query", false, with(5, [](fixture& f) { f.tracked = 5; }), "", 0,
                   0});
  for (const parity_case& c : cases) {
    fixture f;
    f.paged = c.paged;
    c.breaks(f);
    const verdict got = judge(policy, f);
    const std::string want_host =
        c.host_argument[0] == 0 ? "accepts" : std::string("refuses '") + c.host_argument + "'";
    const std::string got_host = got.host_argument.empty() ? "accepts" : "refuses '" + got.host_argument + "'";
    const auto bits = [](std::uint32_t word) {
      return word == 0 ? std::string("none") : sh::cuda::describe_status(word);
    };
    tally.host(got_host == want_host && got.own == c.own && got.batch == c.batch,
               std::string(c.paged ? "paged" : "contiguous") + ", " + c.what + ": host " + got_host + " (want " +
                   want_host + "); device row bits " + bits(got.own) + " (want " + bits(c.own) + "), batch bits " +
                   bits(got.batch) + " (want " + bits(c.batch) + ")");
  }
  return tally.report();
}

}  // namespace check_parity_tests
