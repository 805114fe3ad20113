#pragma once
// Part of differential.cu (its main translation unit):
// the device-side error checks, cuda::shrink_page_table, and the CUDA graph
// test.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.cuh"

namespace checks {

using namespace harness;
namespace sh = scissorhands;

// ---------------------------------------------------------------------------
// A small batch run on both backends from identical states: three
// sequences at positions 0..2 in state rows {2, 0, 3} of four. A fault is
// put into one sequence's device data; the host runs the same call with
// that sequence as a padding slot (row -1, no token), which is what the
// device must do: skip it and leave it untouched, and give the others
// exactly the host's result.
struct fault_case {
  using policy_t = sh::scissorhands_policy;
  static constexpr int B = 3, rows = 4, H = 2, G = 2, QH = H * G, D = 8, cap = 32, state_cap = 30, budget = 20, m = 2;
  enum class op { observe, admit, compress };
  policy_t policy;
  sh::state_shape shape{};
  std::vector<float> hk, hv, h_probs, d_probs_vals;
  std::vector<std::int32_t> lengths{12, 25, 18}, map{2, 0, 3}, h_new, h_freed;
  device_buffer<float> dk, dv, d_probs;
  device_buffer<std::int32_t> d_len, d_map, d_new, d_freed;
  aligned_bytes h_state, h_ws;
  device_buffer<std::byte> d_state, d_ws;
  sh::eviction_state<host_space> hst0;
  sh::eviction_state<device_space> dst0;
  std::size_t ws_bytes = 0;
  int q_len = 1;
  std::size_t probs_span = 0;  // the device view's span (default: all of it)

  fault_case()
      : dk(B * cap * H * D),
        dv(B * cap * H * D),
        d_probs(B * QH * 2 * cap),
        d_len(B),
        d_map(B),
        d_new(B),
        d_freed(B),
        h_state(sh::state_bytes(shape_of())),
        h_ws(host_ws_bytes()),
        d_state(sh::state_bytes(shape_of())) {
    policy = make_policy();
    std::mt19937_64 rng(7);
    fill_uploaded(hk, dk, rng);
    fill_uploaded(hv, dv, rng);
    h_probs.assign(d_probs.size(), 1.0f / 32.0f);
    d_probs_vals = h_probs;
    d_probs.upload(d_probs_vals);
    probs_span = d_probs.size();
    shape = shape_of();
    hst0 = sh::make_state(h_state.span(), shape);
    dst0 = sh::make_state(d_state.span(), shape);
    sh::host::reset_state(hst0);
    CUDA_CHECK(sh::cuda::reset_state(dst0));
    upload();
    CUDA_CHECK(sh::cuda::compress(nullptr, ws_bytes, policy, device_view(), device_state(), budget, {}));
    d_ws = device_buffer<std::byte>(ws_bytes);
    h_new.assign(B, -7);
    h_freed.assign(B, -7);
    // Warm up: a step on both sides, the new lengths applied, then new
    // tokens: {14, 22, 21} (two sequences above the budget), admitted on
    // both sides, so that a call's one or two queries a sequence are its
    // last tokens, none seen by a query (the observe-step invariant).
    both(op::observe);
    both(op::compress);
    lengths = {h_new[0] + 2, h_new[1] + 4, h_new[2] + 3};
    upload();
    both(op::admit);
  }
  static policy_t make_policy() {
    policy_t p;
    p.config.window = 8;
    p.config.recent = 2;
    p.config.evict_count = m;
    return p;
  }
  static sh::state_shape shape_of() { return {rows, H, state_cap, make_policy().ring_words()}; }
  static std::size_t host_ws_bytes() {
    sh::host_kv_view<float> v;
    v.capacity = cap;
    return sh::host::compress_workspace_bytes(v);
  }
  void upload() {
    d_len.upload(lengths);
    d_map.upload(map);
  }
  sh::host_kv_view<float> host_view_of(const std::vector<std::int32_t>& l) {
    return sh::make_kv_view(sh::host_span<float>(hk.data(), hk.size()), sh::host_span<float>(hv.data(), hv.size()),
                            sh::host_span<const std::int32_t>(l.data(), B), B, H, D, cap, sh::named_layout::nhd);
  }
  sh::device_kv_view<float> device_view() const {
    return sh::make_kv_view(dk.span(), dv.span(), sh::device_span<const std::int32_t>(d_len.data(), B), B, H, D, cap,
                            sh::named_layout::nhd);
  }
  sh::eviction_state<device_space> device_state() const {
    return dst0.for_batch(sh::device_span<const std::int32_t>(d_map.data(), B));
  }
  sh::probability_view<device_space> device_probs() const {
    auto v = sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, q_len, cap);
    v.data = {d_probs.data(), probs_span};
    return v;
  }
  cudaError_t device_call(op o) {
    switch (o) {
      case op::observe: return sh::cuda::observe_probabilities(policy, device_view(), device_state(), device_probs());
      case op::admit: return sh::cuda::admit(policy, device_view(), device_state());
      default:
        return sh::cuda::compress(d_ws.data(), ws_bytes, policy, device_view(), device_state(), budget,
                                  {d_new.span(), {}});
    }
  }
  // The host's run of the same call, with sequence `bad` (if any) a padding slot.
  void host_call(op o, int bad = -1) {
    std::vector<std::int32_t> l = lengths, r = map;
    if (bad >= 0) l[bad] = 0, r[bad] = -1;
    const auto view = host_view_of(l);
    const auto st = hst0.for_batch(sh::host_span<const std::int32_t>(r.data(), B));
    switch (o) {
      case op::observe:
        sh::host::observe_probabilities(
            policy, view, st, sh::probability_view<host_space>::dense({h_probs.data(), h_probs.size()}, QH, q_len, cap));
        break;
      case op::admit: sh::host::admit(policy, view, st); break;
      default:
        sh::host::compress(policy, view, st, budget, h_ws.span(), {sh::host_span<std::int32_t>(h_new.data(), B), {}});
    }
  }
  void both(op o) {
    CUDA_CHECK(device_call(o));
    host_call(o);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<std::byte> device_state_bytes() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::byte> s(d_state.size());
    d_state.download(s.data(), s.size());
    return s;
  }
  std::vector<std::uint32_t> status() const {
    std::vector<std::uint32_t> w(rows);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(w.data(), dst0.status, sizeof(std::uint32_t) * rows, cudaMemcpyDeviceToHost));
    return w;
  }
  // State bytes equal, the status words excepted (blocks_done included:
  // 0 on both backends between calls).
  bool same_state(const std::byte* a, const std::byte* b) const {
    const auto o = sh::detail::offsets_of(shape);
    return std::memcmp(a, b, o.status) == 0 &&
           std::memcmp(a + o.blocks_done, b + o.blocks_done, o.total - o.blocks_done) == 0;
  }
  // Row r's counters and slots equal in two state images.
  bool same_row(const std::byte* a, const std::byte* b, int r) const {
    const auto o = sh::detail::offsets_of(shape);
    auto eq = [&](std::size_t at, std::size_t bytes) { return std::memcmp(a + at, b + at, bytes) == 0; };
    const std::size_t slots = static_cast<std::size_t>(H) * state_cap;
    const std::size_t words = static_cast<std::size_t>(shape.ring_words);
    return eq(o.step + 8 * r, 8) && eq(o.next_position + 4 * r, 4) && eq(o.tracked + 4 * r, 4) &&
           eq(o.positions + 4 * slots * r, 4 * slots) && eq(o.scores + 4 * slots * r, 4 * slots) &&
           eq(o.observed + 4 * slots * r, 4 * slots) && eq(o.ring + 4 * slots * words * r, 4 * slots * words);
  }
  bool same_kv() const { return dk.download() == hk && dv.download() == hv; }
  // A poke into both states (the host's bad row is a padding slot, never read).
  template <class X>
  void poke(X* h_field, X* d_field, int r, X value) const {
    h_field[r] = value;
    CUDA_CHECK(cudaMemcpy(d_field + r, &value, sizeof(X), cudaMemcpyHostToDevice));
  }
  template <class X>
  X peek(const X* d_field, int r) const {
    X x{};
    CUDA_CHECK(cudaMemcpy(&x, d_field + r, sizeof(X), cudaMemcpyDeviceToHost));
    return x;
  }
};

// Queries, log-sum-exp and qo_indptr for observe_queries faults: one query
// per sequence unless told otherwise, token-major, finite lse.
struct query_inputs {
  std::vector<std::int32_t> qo{0, 1, 2, 3};
  std::vector<float> q, lse;
  device_buffer<std::int32_t> d_qo{4};
  device_buffer<float> d_q, d_lse;
  std::size_t q_span = 0, lse_span = 0;
  bool ragged = true;
  void build(int tokens) {
    q.assign(static_cast<std::size_t>(tokens) * fault_case::QH * fault_case::D, 0.25f);
    lse.assign(static_cast<std::size_t>(tokens) * fault_case::QH, 3.0f);
    d_q = device_buffer<float>(q.size());
    d_lse = device_buffer<float>(lse.size());
    q_span = q.size();
    lse_span = lse.size();
  }
  cudaError_t call(fault_case& c) {
    d_qo.upload(qo);
    d_q.upload(q);
    d_lse.upload(lse);
    const sh::device_span<const std::int32_t> qo_span(d_qo.data(), 4);
    sh::query_view<float, device_space> qv;
    sh::lse_view<device_space> lv;
    if (ragged) {
      qv = sh::query_view<float, device_space>::ragged({d_q.data(), q_span}, qo_span, fault_case::QH, fault_case::D);
      lv = sh::lse_view<device_space>::ragged({d_lse.data(), lse_span}, qo_span, fault_case::QH,
                                              sh::lse_base::natural);
    } else {
      qv = sh::query_view<float, device_space>::dense({d_q.data(), q_span}, fault_case::QH, 1, fault_case::D);
      lv = sh::lse_view<device_space>::token_major({d_lse.data(), lse_span}, fault_case::QH, 1, sh::lse_base::natural);
    }
    return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), qv, lv, 0.0f);
  }
};

}  // namespace checks

int run_error_tests() {
  using namespace checks;
  using op = fault_case::op;
  check_tally tally{"errors"};
  auto status_text = [](const std::vector<std::uint32_t>& w) {
    std::string s;
    for (std::size_t r = 0; r < w.size(); ++r)
      s += " row " + std::to_string(r) + ": " + std::to_string(w[r]) + " (" + sh::cuda::describe_status(w[r]) + ")";
    return s;
  };

  // One sequence at fault: its row gets `bit`, it is left untouched, the
  // others get exactly the host's result (the host skipping it).
  auto row_fault = [&](const std::string& what, int bad, std::uint32_t bit, op o, auto&& fault,
                       bool observe_first = false) {
    fault_case c;
    if (observe_first) c.both(op::observe);
    fault(c);
    CUDA_CHECK(c.device_call(o));
    c.host_call(o, bad);
    const auto w = c.status();
    const int bad_row = c.map[bad];
    bool rows_ok = (w[bad_row] & bit) != 0;
    for (int b = 0; b < c.B; ++b)
      if (b != bad) rows_ok = rows_ok && w[c.map[b]] == 0;
    if (!device_fact(rows_ok)) std::printf("  %s:%s\n", what.c_str(), status_text(w).c_str());
    tally.device(rows_ok, what + ": the bit is in the faulty sequence's row only");
    const auto dev = c.device_state_bytes();
    tally.device(c.same_state(dev.data(), c.h_state.data()),
                 what + ": the state equals the host's run without the sequence (its row untouched)");
    tally.device(c.same_kv(), what + ": K and V equal the host's");
    if (o == op::compress) {
      const auto d_new = c.d_new.download();
      bool out_ok = d_new[bad] == sh::length_after_compress(c.lengths[bad], c.budget, c.m);
      for (int b = 0; b < c.B; ++b)
        if (b != bad) out_ok = out_ok && d_new[b] == c.h_new[b];
      tally.device(out_ok, what + ": new_lengths written for every sequence");
    }
  };
  // A condition of the whole batch: every row of the batch flagged, nothing written.
  auto batch_fault = [&](const std::string& what, std::uint32_t bit, std::vector<int> flagged, auto&& fault,
                         auto&& call, bool observe_first = false) {
    fault_case c;
    if (observe_first) c.both(op::observe);
    fault(c);
    const auto before = c.device_state_bytes();
    const auto k_before = c.dk.download(), v_before = c.dv.download();
    CUDA_CHECK(call(c));
    const auto w = c.status();
    bool rows_ok = true;
    for (int r = 0; r < c.rows; ++r) {
      const bool want = std::find(flagged.begin(), flagged.end(), r) != flagged.end();
      rows_ok = rows_ok && (want ? (w[r] & bit) != 0 : w[r] == 0);
    }
    if (!device_fact(rows_ok)) std::printf("  %s:%s\n", what.c_str(), status_text(w).c_str());
    tally.device(rows_ok, what + ": every row of the batch flagged, no other");
    const auto after = c.device_state_bytes();
    tally.device(
        c.same_state(after.data(), before.data()) && c.dk.download() == k_before && c.dv.download() == v_before,
        what + ": nothing written");
  };
  // observe_queries (scores within rounding, so no host twin): the faulty
  // row flagged and untouched, the others observed.
  auto query_fault = [&](const std::string& what, int bad, std::uint32_t bit, auto&& setup) {
    fault_case c;
    query_inputs in;
    setup(c, in);
    const auto before = c.device_state_bytes();
    CUDA_CHECK(in.call(c));
    const auto w = c.status();
    const auto after = c.device_state_bytes();
    bool ok = (w[c.map[bad]] & bit) != 0 && c.same_row(before.data(), after.data(), c.map[bad]);
    for (int b = 0; b < c.B; ++b)
      if (b != bad) ok = ok && w[c.map[b]] == 0 && c.peek(c.dst0.tracked, c.map[b]) == c.lengths[b];
    if (!device_fact(ok)) std::printf("  %s:%s\n", what.c_str(), status_text(w).c_str());
    tally.device(ok, what + ": the faulty row flagged and untouched, the others observed");
  };
  // A call the host refuses: invalid_argument naming `argument`, nothing launched.
  auto expect_throw = [&](fault_case& c, const std::string& what, const std::string& argument, auto&& call) {
    const auto before = c.device_state_bytes();
    tally.refuses(what, argument, call);
    const auto after = c.device_state_bytes();
    tally.device(after == before, what + ": nothing launched");
  };

  {
    fault_case c;
    c.both(op::observe);
    const auto w = c.status();
    const auto dev = c.device_state_bytes();
    tally.device(w == std::vector<std::uint32_t>(c.rows, 0u) && c.same_state(dev.data(), c.h_state.data()),
                 "a valid observe through state rows matches the host and flags nothing");
    c.both(op::compress);
    tally.device(c.status() == std::vector<std::uint32_t>(c.rows, 0u) && c.same_kv() && c.d_new.download() == c.h_new,
                 "a valid compress matches the host");
  }

  // Sequence data (observe_probabilities unless said).
  row_fault("length above capacity", 1, sh::cuda::status_length, op::observe, [](fault_case& c) {
    c.lengths[1] = c.cap + 1;
    c.upload();
  });
  row_fault("length above the state's capacity", 1, sh::cuda::status_state_capacity, op::observe, [](fault_case& c) {
    c.lengths[1] = c.state_cap + 1;
    c.upload();
  });
  for (float bad_p : {std::nanf(""), 1.5f, -0.25f})
    row_fault("probability " + std::to_string(bad_p), 1, sh::cuda::status_probability, op::observe,
              [bad_p](fault_case& c) {
                c.d_probs_vals[(1 * c.QH + 2) * c.cap + 3] = bad_p;  // (b 1, qh 2, j 0, t 3)
                c.d_probs.upload(c.d_probs_vals);
              });
  for (op o : {op::observe, op::admit, op::compress})
    row_fault(std::string("tracked above length (") + (o == op::observe ? "observe" : o == op::admit ? "admit" : "compress") + ")",
              1, sh::cuda::status_tracked, o,
              [](fault_case& c) { c.poke(c.hst0.tracked, c.dst0.tracked, c.map[1], c.lengths[1] + 1); },
              o == op::compress);
  row_fault("next_position overflow", 1, sh::cuda::status_position_overflow, op::observe, [](fault_case& c) {
    c.poke(c.hst0.next_position, c.dst0.next_position, c.map[1], std::int32_t{INT32_MAX - 1});
  });
  row_fault("negative step", 2, sh::cuda::status_step, op::observe,
            [](fault_case& c) { c.poke(c.hst0.step, c.dst0.step, c.map[2], std::int64_t{-1}); });
  row_fault("step above 2^62", 2, sh::cuda::status_step, op::admit,
            [](fault_case& c) { c.poke(c.hst0.step, c.dst0.step, c.map[2], (std::int64_t{1} << 62) + 1); });
  row_fault("q_len above a length", 0, sh::cuda::status_query_length, op::observe, [](fault_case& c) {
    c.q_len = 2;
    c.lengths[0] = 1;
    c.poke(c.hst0.tracked, c.dst0.tracked, c.map[0], 0);
    c.upload();
  });
  row_fault("probability view shorter than the last sequence's rows", 2, sh::cuda::status_view_extent, op::observe,
            [](fault_case& c) {
              // Covers one column of every row (the host check) and all of
              // sequences 0 and 1, not sequence 2's 21 columns.
              const auto full = c.device_probs();
              c.probs_span = static_cast<std::size_t>(2 * full.sequence_stride + 3 * full.head_stride + 10);
            });
  row_fault("compress with unobserved tokens", 1, sh::cuda::status_untracked, op::compress,
            [](fault_case& c) {
              c.lengths[1] += 1;
              c.upload();
            },
            true);
  row_fault("compress with too few unprotected tokens", 1, sh::cuda::status_positions, op::compress,
            [](fault_case& c) {
              const int r = c.map[1];
              const std::int32_t next = c.peek(c.dst0.next_position, r);
              for (int t = 0; t < c.state_cap; ++t)
                c.poke(c.hst0.positions, c.dst0.positions, static_cast<int>(c.hst0.row_index(r, 0, t)), next - 1);
            },
            true);

  // observe_queries: log-sum-exp and ragged views.
  query_fault("infinite log-sum-exp", 1, sh::cuda::status_lse, [](fault_case&, query_inputs& in) {
    in.ragged = false;
    in.build(3);
    in.lse[1 * fault_case::QH + 2] = std::numeric_limits<float>::infinity();  // token-major (b 1, qh 2)
  });
  query_fault("ragged infinite log-sum-exp", 2, sh::cuda::status_lse, [](fault_case&, query_inputs& in) {
    in.qo = {0, 2, 3, 5};
    in.build(5);
    in.lse[4 * fault_case::QH + 1] = -std::numeric_limits<float>::infinity();  // sequence 2's second query
  });
  query_fault("qo_indptr decreasing at a sequence", 1, sh::cuda::status_qo_indptr, [](fault_case&, query_inputs& in) {
    in.qo = {0, 2, 1, 3};
    in.build(3);
  });
  query_fault("ragged queries shorter than their qo_indptr", 2, sh::cuda::status_view_extent,
              [](fault_case&, query_inputs& in) {
                in.build(3);
                in.q_span -= 1;
              });
  query_fault("ragged lse shorter than its qo_indptr", 2, sh::cuda::status_view_extent,
              [](fault_case&, query_inputs& in) {
                in.build(3);
                in.lse_span -= 1;
              });
  query_fault("ragged: more queries than tokens", 0, sh::cuda::status_query_length, [](fault_case& c, query_inputs& in) {
    in.qo = {0, c.lengths[0] + 1, c.lengths[0] + 2, c.lengths[0] + 3};
    in.build(c.lengths[0] + 3);
  });
  {
    // A sequence with no token is skipped whatever its query count, one
    // with no query only has its new tokens admitted.
    fault_case c;
    query_inputs in;
    c.lengths[0] = 0;
    c.poke(c.hst0.tracked, c.dst0.tracked, c.map[0], 0);
    c.upload();
    in.qo = {0, 5, 5, 6};  // 5 queries for the empty sequence, none for sequence 1
    in.build(6);
    const std::int64_t step1 = c.peek(c.dst0.step, c.map[1]), step2 = c.peek(c.dst0.step, c.map[2]);
    CUDA_CHECK(in.call(c));
    const auto w = c.status();
    tally.device(w == std::vector<std::uint32_t>(c.rows, 0u) && c.peek(c.dst0.tracked, c.map[1]) == c.lengths[1] &&
                     c.peek(c.dst0.step, c.map[1]) == step1 && c.peek(c.dst0.step, c.map[2]) == step2 + 1,
                 "ragged: an empty sequence is skipped, one without queries is admitted without a step");
  }

  // The whole batch: a broken state_rows mapping (remap), then one call.
  const auto remap = [](std::vector<std::int32_t> map) {
    return [map](fault_case& c) {
      c.map = map;
      c.upload();
    };
  };
  const auto call = [](op o) { return [o](fault_case& c) { return c.device_call(o); }; };
  const std::uint32_t rows_bit = sh::cuda::status_state_rows;
  batch_fault("state_rows entry out of range", rows_bit, {2, 3}, remap({2, 7, 3}), call(op::observe));
  batch_fault("state_rows entry below -1", rows_bit, {2, 3}, remap({2, -2, 3}), call(op::admit));
  batch_fault("a state row used twice", rows_bit, {0, 2}, remap({2, 0, 2}), call(op::observe));
  batch_fault("a state row used twice (compress)", rows_bit, {0, 2}, remap({2, 0, 2}), call(op::compress), true);
  batch_fault("a padding slot holding tokens", rows_bit, {2, 3}, remap({2, -1, 3}), call(op::observe));
  batch_fault("qo_indptr starting below 0", sh::cuda::status_qo_indptr, {0, 2, 3}, [](fault_case&) {},
              [](fault_case& c) {
                query_inputs in;
                in.qo = {-1, 0, 1, 2};
                in.build(3);
                return in.call(c);
              });

  {
    // Sticky rows: a flagged row stays skipped while the others go on;
    // reset_sequence gives it back.
    fault_case c;
    c.d_probs_vals[(1 * c.QH + 0) * c.cap + 0] = std::nanf("");
    c.d_probs.upload(c.d_probs_vals);
    CUDA_CHECK(c.device_call(op::observe));
    c.host_call(op::observe, 1);
    c.d_probs_vals = c.h_probs;
    c.d_probs.upload(c.d_probs_vals);
    const auto next_token = [&c] {  // a step's new token each: its query is new
      for (auto& l : c.lengths) ++l;
      c.upload();
    };
    next_token();
    CUDA_CHECK(c.device_call(op::observe));  // valid data now, but row map[1] is frozen
    c.host_call(op::observe, 1);
    auto w = c.status();
    auto dev = c.device_state_bytes();
    tally.device(w[c.map[1]] == sh::cuda::status_probability && w[c.map[0]] == 0 && w[c.map[2]] == 0 &&
                     c.same_state(dev.data(), c.h_state.data()),
                 "a flagged row stays skipped; the others match the host");
    sh::host::reset_sequence(c.hst0, c.map[1], 100);
    CUDA_CHECK(sh::cuda::reset_sequence(c.dst0, c.map[1], 100));
    next_token();
    c.both(op::observe);
    w = c.status();
    dev = c.device_state_bytes();
    tally.device(w == std::vector<std::uint32_t>(c.rows, 0u) && c.same_state(dev.data(), c.h_state.data()),
                 "reset_sequence clears the row's word and the row proceeds");
    c.both(op::compress);
    tally.device(c.status() == std::vector<std::uint32_t>(c.rows, 0u) && c.same_kv() && c.d_new.download() == c.h_new,
                 "compress after the recovery matches the host");
  }

  {
    // Host-side refusals.
    fault_case c;
    expect_throw(c, "budget not above the protected tokens", "budget", [&] {
      return sh::cuda::compress(c.d_ws.data(), c.ws_bytes, c.policy, c.device_view(), c.device_state(), 2,
                                {c.d_new.span(), {}});
    });
    expect_throw(c, "workspace below the query", "workspace_bytes", [&] {
      std::size_t small = c.ws_bytes - 4;
      return sh::cuda::compress(c.d_ws.data(), small, c.policy, c.device_view(), c.device_state(), c.budget,
                                {c.d_new.span(), {}});
    });
    expect_throw(c, "new_lengths of the wrong size", "out.new_lengths", [&] {
      return sh::cuda::compress(c.d_ws.data(), c.ws_bytes, c.policy, c.device_view(), c.device_state(), c.budget,
                                {sh::device_span<std::int32_t>(c.d_new.data(), 2), {}});
    });
    // The one API's span call (the host's signature): the workspace refused
    // by name, and its shape-only size covers the budget-specific one.
    {
      auto shape_only = c.device_view();
      shape_only.k = {}, shape_only.v = {}, shape_only.lengths = {};
      const std::size_t any_budget = sh::cuda::compress_workspace_bytes(c.policy, shape_only, c.dst0.shape);
      tally.host(any_budget >= c.ws_bytes, "compress_workspace_bytes(policy, cache, shape) >= the budget's size");
      expect_throw(c, "a span workspace below its size", "workspace", [&] {
        return sh::cuda::compress(c.policy, c.device_view(), c.device_state(), c.budget,
                                  sh::device_span<std::byte>(c.d_ws.data(), c.ws_bytes - 4), {c.d_new.span(), {}});
      });
      expect_throw(c, "a null span workspace", "workspace", [&] {
        return sh::cuda::compress(c.policy, c.device_view(), c.device_state(), c.budget,
                                  sh::device_span<std::byte>(nullptr, c.ws_bytes), {c.d_new.span(), {}});
      });
    }
    expect_throw(c, "new_lengths overlapping the lengths", "out.new_lengths", [&] {
      return sh::cuda::compress(c.d_ws.data(), c.ws_bytes, c.policy, c.device_view(), c.device_state(), c.budget,
                                {c.d_len.span(), {}});
    });
    expect_throw(c, "state made for another policy", "state.shape.ring_words", [&] {
      auto other = c.policy;
      other.config.window = 100;  // more ring words
      return sh::cuda::observe_probabilities(other, c.device_view(), c.device_state(), c.device_probs());
    });
    expect_throw(c, "state_rows of the wrong size", "state.state_rows", [&] {
      return sh::cuda::observe_probabilities(c.policy, c.device_view(),
                                             c.dst0.for_batch(sh::device_span<const std::int32_t>(c.d_map.data(), 2)),
                                             c.device_probs());
    });
    expect_throw(c, "q_heads not a multiple of kv_heads", "q_heads", [&] {
      auto pv = c.device_probs();
      pv.q_heads = 3;
      return sh::cuda::observe_probabilities(c.policy, c.device_view(), c.device_state(), pv);
    });
    expect_throw(c, "negative q_len", "q_len", [&] {
      auto pv = c.device_probs();
      pv.q_len = -1;
      return sh::cuda::observe_probabilities(c.policy, c.device_view(), c.device_state(), pv);
    });
    expect_throw(c, "reset_sequence of a row out of range", "row", [&] {
      return sh::cuda::reset_sequence(c.dst0, c.rows, 0);
    });
    expect_throw(c, "reset_sequence from a negative position", "start_position", [&] {
      return sh::cuda::reset_sequence(c.dst0, 0, -1);
    });
    expect_throw(c, "a state without status words", "state", [&] {
      auto st = c.device_state();
      st.status = nullptr;
      return sh::cuda::observe_probabilities(c.policy, c.device_view(), st, c.device_probs());
    });
    expect_throw(c, "the workspace query with the budget at the protected tokens", "budget", [&] {
      (void)sh::cuda::compress_workspace_bytes(c.policy, c.device_view(), c.device_state(), 2);
      return cudaSuccess;
    });
    // (Shorter than its rows' full length is the device's to find: a row is
    // as long as its sequence, status_view_extent.)
    expect_throw(c, "probabilities buffer that does not reach every row's first column", "probs.data", [&] {
      auto pv = c.device_probs();
      pv.data = {pv.data.data(), 1};
      return sh::cuda::observe_probabilities(c.policy, c.device_view(), c.device_state(), pv);
    });
    expect_throw(c, "a negative probabilities stride", "probs strides", [&] {
      auto pv = c.device_probs();
      pv.head_stride = -1;
      return sh::cuda::observe_probabilities(c.policy, c.device_view(), c.device_state(), pv);
    });
    query_inputs in;
    in.build(3);
    in.d_qo.upload(in.qo);
    device_buffer<std::int32_t> other_qo(4);
    other_qo.upload(in.qo);
    const sh::device_span<const std::int32_t> qo(in.d_qo.data(), 4), qo2(other_qo.data(), 4), qo_short(in.d_qo.data(), 3);
    expect_throw(c, "ragged lse over another qo_indptr", "lse.qo_indptr", [&] {
      return sh::cuda::observe_queries(
          c.policy, c.device_view(), c.device_state(),
          sh::query_view<float, device_space>::ragged({in.d_q.data(), in.q.size()}, qo, c.QH, c.D),
          sh::lse_view<device_space>::ragged({in.d_lse.data(), in.lse.size()}, qo2, c.QH, sh::lse_base::base2), 0.0f);
    });
    expect_throw(c, "qo_indptr of the wrong size", "qo_indptr", [&] {
      return sh::cuda::observe_queries(
          c.policy, c.device_view(), c.device_state(),
          sh::query_view<float, device_space>::ragged({in.d_q.data(), in.q.size()}, qo_short, c.QH, c.D));
    });
    expect_throw(c, "uniform queries buffer below its reach", "queries.data", [&] {
      return sh::cuda::observe_queries(
          c.policy, c.device_view(), c.device_state(),
          sh::query_view<float, device_space>::dense({in.d_q.data(), in.q.size() - 1}, c.QH, 1, c.D));
    });
    const auto dense_q = sh::query_view<float, device_space>::dense({in.d_q.data(), in.q.size()}, c.QH, 1, c.D);
    const auto dense_lse = sh::lse_view<device_space>::dense({in.d_lse.data(), in.lse.size()}, c.QH, 1, sh::lse_base::natural);
    expect_throw(c, "a negative queries stride", "queries strides", [&] {
      auto qv = dense_q;
      qv.query_stride = -1;
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), qv, dense_lse, 0.0f);
    });
    expect_throw(c, "queries of another head_dim", "queries.head_dim", [&] {
      return sh::cuda::observe_queries(
          c.policy, c.device_view(), c.device_state(),
          sh::query_view<float, device_space>::dense({in.d_q.data(), in.q.size()}, c.QH, 1, c.D - 1));
    });
    for (const float scale : {-0.125f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
      expect_throw(c, "softmax_scale " + std::to_string(scale), "softmax_scale", [&] {
        return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, dense_lse, scale);
      });
    expect_throw(c, "a null log-sum-exp with a size (not \"no lse\")", "lse.data", [&] {
      auto lv = dense_lse;
      lv.data = {nullptr, in.lse.size()};
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    expect_throw(c, "log-sum-exp buffer below its reach", "lse.data", [&] {
      auto lv = dense_lse;
      lv.data = {in.d_lse.data(), in.lse.size() - 1};
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    expect_throw(c, "a negative log-sum-exp stride", "lse strides", [&] {
      auto lv = dense_lse;
      lv.head_stride = -1;
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    // Attention the CUDA kernels do not compute (plain causal softmax only)
    // is refused by option rather than scored as plain softmax.
    {
      sh::attention_options<device_space> window, capped, alibi;
      window.window_left = 4;
      capped.logits_soft_cap = 50.0f;
      alibi.alibi_slopes = {in.d_q.data(), static_cast<std::size_t>(c.QH)};  // any device span: refused by size
      expect_throw(c, "a sliding window", "options.window_left", [&] {
        return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, dense_lse, window);
      });
      expect_throw(c, "soft-capped logits", "options.logits_soft_cap", [&] {
        return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, dense_lse, capped);
      });
      expect_throw(c, "ALiBi slopes", "options.alibi_slopes", [&] {
        return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, dense_lse, alibi);
      });
    }
    expect_throw(c, "a log-sum-exp base left unspecified", "lse.base", [&] {
      auto lv = dense_lse;
      lv.base = sh::lse_base::unspecified;
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    expect_throw(c, "a log-sum-exp base that is neither natural nor base2", "lse.base", [&] {
      auto lv = dense_lse;
      lv.base = static_cast<sh::lse_base>(7);
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    expect_throw(c, "a log-sum-exp check that is not a named value", "lse.check", [&] {
      auto lv = dense_lse;
      lv.check = static_cast<sh::lse_check>(5);
      return sh::cuda::observe_queries(c.policy, c.device_view(), c.device_state(), dense_q, lv, 0.0f);
    });
    expect_throw(c, "a compile-time head_dim (64) that is not the cache's (8)", "cache.head_dim", [&] {
      return sh::cuda::observe_queries<64>(
          c.policy, c.device_view(), c.device_state(),
          sh::query_view<float, device_space>::dense({in.d_q.data(), in.q.size()}, c.QH, 1, c.D));
    });
    // Grid dimensions y and z are 16-bit: one past the limit, in a cache of
    // one slot per (sequence, head) so the buffers stay a few MB.
    const int wide = sh::cuda::detail::max_grid_yz + 1;
    {
      device_buffer<float> wk(std::size_t(wide) * c.H * c.D), wv(wk.size());
      device_buffer<std::int32_t> w_len(wide), w_rows(wide);
      expect_throw(c, "cache.batch one above the grid's 65,535", "cache.batch", [&] {
        const auto view =
            sh::make_kv_view(wk.span(), wv.span(), sh::device_span<const std::int32_t>(w_len.data(), wide), wide, c.H,
                             c.D, 1, sh::named_layout::nhd);
        return sh::cuda::admit(c.policy, view,
                               c.dst0.for_batch(sh::device_span<const std::int32_t>(w_rows.data(), wide)));
      });
    }
    {
      device_buffer<float> wk(std::size_t(wide) * c.D), wv(wk.size());
      const sh::state_shape shape{1, wide, 1, c.policy.ring_words()};
      device_buffer<std::byte> w_state(sh::state_bytes(shape));
      expect_throw(c, "cache.kv_heads one above the grid's 65,535", "cache.kv_heads", [&] {
        const auto view = sh::make_kv_view(wk.span(), wv.span(), sh::device_span<const std::int32_t>(c.d_len.data(), 1),
                                           1, wide, c.D, 1, sh::named_layout::nhd);
        return sh::cuda::admit(c.policy, view, sh::make_state(w_state.span(), shape));
      });
    }
  }

  {
    // Paged: a page id outside the pool or an impossible last_page_len is
    // the sequence's; indptr[0] != 0 is the whole batch's.
    using policy_t = sh::h2o_policy;
    policy_t policy;
    policy.config.recent = 1;
    const int H = 1, D = 4, P = 4, pages = 6;
    device_buffer<float> dk(pages * P * H * D), dv(pages * P * H * D), d_probs(2 * 8);
    std::vector<std::int32_t> indptr{0, 1, 3}, indices{0, 1, 6}, last{2, 3};  // page 6 is outside the pool
    device_buffer<std::int32_t> d_indptr(3), d_indices(3), d_last(2);
    std::vector<float> probs(16, 0.1f);
    d_probs.upload(probs);
    const auto view = sh::make_paged_kv_view(dk.span(), dv.span(), sh::device_span<const std::int32_t>(d_indptr.data(), 3),
                                             sh::device_span<const std::int32_t>(d_indices.data(), 3),
                                             sh::device_span<const std::int32_t>(d_last.data(), 2), 2, H, D, P, pages, 2);
    const sh::state_shape shape{2, H, 8, policy.ring_words()};
    device_buffer<std::byte> d_state(sh::state_bytes(shape));
    const auto state = sh::make_state(d_state.span(), shape);
    const auto pv = sh::probability_view<device_space>::dense({d_probs.data(), 16}, 1, 1, 8);
    auto run = [&] {
      d_indptr.upload(indptr);
      d_indices.upload(indices);
      d_last.upload(last);
      CUDA_CHECK(sh::cuda::reset_state(state));
      CUDA_CHECK(sh::cuda::observe_probabilities(policy, view, state, pv));
      std::vector<std::uint32_t> w(2);
      std::vector<std::int32_t> tracked(2);
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(w.data(), state.status, 8, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(tracked.data(), state.tracked, 8, cudaMemcpyDeviceToHost));
      return std::make_pair(w, tracked);
    };
    auto [w, tracked] = run();
    tally.device(w[0] == 0 && (w[1] & sh::cuda::status_page_table) != 0 && tracked[0] == 2 && tracked[1] == 0,
                 "paged: a page id outside the pool flags its sequence only");
    indices[2] = 2;
    std::tie(w, tracked) = run();
    tally.device(w[0] == 0 && w[1] == 0 && tracked[0] == 2 && tracked[1] == 7, "paged: a valid table passes");
    last[1] = 0;
    std::tie(w, tracked) = run();
    tally.device(w[0] == 0 && (w[1] & sh::cuda::status_page_table) != 0 && tracked[0] == 2 && tracked[1] == 0,
                 "paged: last_page_len 0 on a sequence with pages flags its sequence only");
    last[1] = 3;
    indptr = {1, 1, 3};
    std::tie(w, tracked) = run();
    tally.device((w[0] & sh::cuda::status_page_table) != 0 && (w[1] & sh::cuda::status_page_table) != 0 &&
                     tracked[0] == 0 && tracked[1] == 0,
                 "paged: indptr[0] != 0 flags the whole batch");
  }

  return tally.report();
}

// ---------------------------------------------------------------------------
// cuda::shrink_page_table against host::shrink_page_table.

int run_shrink_tests(std::uint64_t seed, bool quick) {
  using namespace checks;
  check_tally tally{"shrink"};
  std::mt19937_64 rng(seed ^ 0x5151);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  struct table {
    std::vector<std::int32_t> indptr, indices, last, new_lengths, released;
    int page_size = 1;
  };
  // A random valid table and new lengths (often unchanged, often shrunk).
  auto random_table = [&](int batch, int page_size, int max_pages) {
    table t;
    t.page_size = page_size;
    t.indptr.assign(batch + 1, 0);
    t.last.assign(batch, 0);
    t.new_lengths.assign(batch, 0);
    for (int b = 0; b < batch; ++b) {
      const int pages = uniform(0, 4) == 0 ? 0 : uniform(1, max_pages);
      t.indptr[b + 1] = t.indptr[b] + pages;
      t.last[b] = pages == 0 ? 0 : uniform(1, page_size);
      const int held = pages == 0 ? 0 : (pages - 1) * page_size + t.last[b];
      const int kind = uniform(0, 3);
      t.new_lengths[b] = kind == 0 ? held : kind == 1 ? uniform(0, held) : std::max(0, held - uniform(0, 2 * page_size));
    }
    t.indices.resize(t.indptr[batch] + uniform(0, 5));
    std::iota(t.indices.begin(), t.indices.end(), 0);
    std::shuffle(t.indices.begin(), t.indices.end(), rng);
    t.released.assign(t.indices.size() + 1, -9);
    return t;
  };
  struct device_table {
    device_buffer<std::int32_t> indptr, indices, last, new_lengths, released;
    device_buffer<sh::cuda::shrink_result> result{1};
    explicit device_table(const table& t)
        : indptr(t.indptr.size()),
          indices(std::max<std::size_t>(1, t.indices.size())),
          last(std::max<std::size_t>(1, t.last.size())),
          new_lengths(std::max<std::size_t>(1, t.new_lengths.size())),
          released(std::max<std::size_t>(1, t.released.size())) {
      indptr.upload(t.indptr);
      if (!t.indices.empty()) indices.upload(t.indices);
      if (!t.last.empty()) last.upload(t.last);
      if (!t.new_lengths.empty()) new_lengths.upload(t.new_lengths);
      released.upload(t.released);
      const sh::cuda::shrink_result poison{-5, 0xdeadu};
      result.upload(&poison, 1);
    }
    cudaError_t run(const table& t, std::size_t released_size) {
      return sh::cuda::shrink_page_table(
          indptr.span(), {indices.data(), t.indices.size()}, {last.data(), t.last.size()}, t.page_size,
          sh::device_span<const std::int32_t>(new_lengths.data(), t.new_lengths.size()),
          {released.data(), released_size}, result.data());
    }
    sh::cuda::shrink_result outcome() const {
      sh::cuda::shrink_result r;
      CUDA_CHECK(cudaDeviceSynchronize());
      result.download(&r, 1);
      return r;
    }
    bool equals(const table& t) const {
      auto get = [](const device_buffer<std::int32_t>& d, std::size_t n) {
        std::vector<std::int32_t> v(n);
        if (n) d.download(v.data(), n);
        return v;
      };
      return get(indptr, t.indptr.size()) == t.indptr && get(indices, t.indices.size()) == t.indices &&
             get(last, t.last.size()) == t.last && get(released, t.released.size()) == t.released;
    }
  };

  const int tables = quick ? 12 : 200;
  int passed = 0;
  for (int i = 0; i < tables; ++i) {
    const int batch = i == 0 ? 0 : i == 1 ? 1 : i % 7 == 2 ? uniform(250, 800) : uniform(1, 40);
    const int page_size = std::initializer_list<int>{1, 3, 16}.begin()[uniform(0, 2)];
    const int max_pages = i % 5 == 3 ? 60 : 8;  // many pages: several rounds per chunk
    table host = random_table(batch, page_size, max_pages);
    device_table dev(host);
    CUDA_CHECK(dev.run(host, host.released.size()));
    const std::size_t n = sh::host::shrink_page_table(
        sh::host_span<std::int32_t>(host.indptr.data(), host.indptr.size()),
        sh::host_span<std::int32_t>(host.indices.data(), host.indices.size()),
        sh::host_span<std::int32_t>(host.last.data(), host.last.size()), page_size,
        sh::host_span<const std::int32_t>(host.new_lengths.data(), host.new_lengths.size()),
        sh::host_span<std::int32_t>(host.released.data(), host.released.size()));
    const auto r = dev.outcome();
    const bool ok = device_fact(r.status == 0 && r.released == static_cast<std::int32_t>(n) && dev.equals(host));
    if (!ok)
      std::printf("  table %d: batch %d, page_size %d: device {%d, %u} host released %zu\n", i, batch, page_size,
                  r.released, r.status, n);
    passed += ok;
  }
  tally.device(passed == tables, std::to_string(tables - passed) + " of " + std::to_string(tables) +
                                     " random tables differ from host::shrink_page_table");

  // Data errors: nothing written, the reason in the result.
  auto refused = [&](const std::string& what, std::uint32_t bit, auto&& spoil, std::size_t released_size = 0) {
    table t = random_table(5, 4, 4);
    t.indptr = {0, 2, 2, 5, 6, 8};
    t.last = {3, 0, 4, 1, 2};
    t.new_lengths = {5, 0, 6, 1, 2};  // releases 2 pages
    t.indices.resize(10);
    t.released.assign(12, -9);
    spoil(t);
    device_table dev(t);
    CUDA_CHECK(dev.run(t, released_size ? released_size : t.released.size()));
    const auto r = dev.outcome();
    tally.device((r.status & bit) != 0 && r.released == 0 && dev.equals(t), what + ": refused, nothing written");
  };
  refused("indptr not starting at 0", sh::cuda::status_page_table, [](table& t) {
    for (auto& x : t.indptr) x += 1;
  });
  refused("indptr decreasing", sh::cuda::status_page_table, [](table& t) { t.indptr[2] = 1; });
  refused("last_page_len 0 for a sequence with pages", sh::cuda::status_page_table, [](table& t) { t.last[2] = 0; });
  refused("last_page_len above page_size", sh::cuda::status_page_table, [](table& t) { t.last[0] = 5; });
  refused("indptr[batch] beyond indices", sh::cuda::status_page_table, [](table& t) { t.indices.resize(7); });
  refused("new length above the table's", sh::cuda::status_new_length, [](table& t) { t.new_lengths[2] = 13; });
  refused("negative new length", sh::cuda::status_new_length, [](table& t) { t.new_lengths[4] = -1; });
  refused("released too short", sh::cuda::status_released, [](table&) {}, 1);

  // Host-side refusals.
  {
    table t = random_table(4, 2, 3);
    device_table dev(t);
    tally.refuses("null result", "d_result", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 2, {dev.new_lengths.data(), 4},
                                         {dev.released.data(), t.released.size()}, nullptr);
    });
    tally.refuses("page_size 0", "page_size", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 0, {dev.new_lengths.data(), 4},
                                         {dev.released.data(), t.released.size()}, dev.result.data());
    });
    tally.refuses("new_lengths of the wrong size", "new_lengths", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 2, {dev.new_lengths.data(), 3},
                                         {dev.released.data(), t.released.size()}, dev.result.data());
    });
    tally.refuses("released overlapping indices", "released", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 2, {dev.new_lengths.data(), 4},
                                         {dev.indices.data(), t.indices.size()}, dev.result.data());
    });
    tally.refuses("empty indptr", "indptr", [&] {
      return sh::cuda::shrink_page_table({}, {}, {}, 2, {}, {}, dev.result.data());
    });
    tally.refuses("last_page_len of the wrong size", "last_page_len", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 3}, 2, {dev.new_lengths.data(), 4},
                                         {dev.released.data(), t.released.size()}, dev.result.data());
    });
    tally.refuses("null indices with entries", "indices", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {nullptr, t.indices.size()}, {dev.last.data(), 4}, 2,
                                         {dev.new_lengths.data(), 4}, {dev.released.data(), t.released.size()},
                                         dev.result.data());
    });
    tally.refuses("null released with entries", "released", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 2, {dev.new_lengths.data(), 4},
                                         {nullptr, t.released.size()}, dev.result.data());
    });
    tally.refuses("new_lengths overlapping last_page_len", "new_lengths", [&] {
      return sh::cuda::shrink_page_table(dev.indptr.span(), {dev.indices.data(), t.indices.size()},
                                         {dev.last.data(), 4}, 2, {dev.last.data(), 4},
                                         {dev.released.data(), t.released.size()}, dev.result.data());
    });
  }
  return tally.report();
}

// ---------------------------------------------------------------------------
// CUDA graph: the engine's append, observe, compress and shrink_page_table
// captured once on a paged cache whose batch maps to state rows (with a
// padding slot), replayed step after step; the host backend runs the same
// steps.

namespace checks {

constexpr int graph_batch = 4, graph_requests = 3, graph_max_pages = 12, graph_page = 4;

// The engine's append (one thread, a toy): one token per request, the
// table rebuilt from the lengths it holds and each request's own pages.
template <class T>
__host__ __device__ void append_step(T* k, T* v, sh::paged_layout kl, sh::paged_layout vl, std::int32_t* indptr,
                                     std::int32_t* indices, std::int32_t* last, const std::int32_t* owner,
                                     const std::int32_t* owned, const T* k_new, const T* v_new, int step, int heads,
                                     int dim) {
  constexpr int P = graph_page;
  int lens[graph_batch];
  for (int b = 0; b < graph_batch; ++b) {
    const int pages = indptr[b + 1] - indptr[b];
    lens[b] = pages == 0 ? 0 : (pages - 1) * P + last[b];
  }
  int at = 0;
  for (int b = 0; b < graph_batch; ++b) {
    const int q = owner[b];
    if (q >= 0) {
      const int t = lens[b]++;
      const int page = owned[q * graph_max_pages + t / P];
      for (int h = 0; h < heads; ++h)
        for (int x = 0; x < dim; ++x) {
          const std::size_t src = ((static_cast<std::size_t>(step) * graph_requests + q) * heads + h) * dim + x;
          k[kl.offset(page, h, t % P) + x] = k_new[src];
          v[vl.offset(page, h, t % P) + x] = v_new[src];
        }
    }
    const int pages = (lens[b] + P - 1) / P;
    indptr[b] = at;
    for (int i = 0; i < pages; ++i) indices[at++] = owned[q * graph_max_pages + i];
    last[b] = pages == 0 ? 0 : lens[b] - (pages - 1) * P;
  }
  indptr[graph_batch] = at;
}

template <class T>
__global__ void graph_append(T* k, T* v, sh::paged_layout kl, sh::paged_layout vl, std::int32_t* indptr,
                             std::int32_t* indices, std::int32_t* last, const std::int32_t* owner,
                             const std::int32_t* owned, const T* k_new, const T* v_new, const int* counter, int heads,
                             int dim) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    append_step(k, v, kl, vl, indptr, indices, last, owner, owned, k_new, v_new, *counter, heads, dim);
}

__global__ void graph_copy_probs(float* probs, const float* all, const int* counter, std::size_t n) {
  const std::size_t base = static_cast<std::size_t>(*counter) * n;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    probs[i] = all[base + i];
}

__global__ void graph_bump(int* counter) { *counter += 1; }

}  // namespace checks

int run_graph_test(int steps) {
  using namespace checks;
  using T = __nv_bfloat16;
  using policy_t = sh::scissorhands_policy;
  policy_t policy;
  policy.config.window = 16;
  policy.config.recent = 4;
  policy.config.evict_count = 3;
  constexpr int B = graph_batch, R = graph_requests, H = 2, G = 4, QH = H * G, D = 64, P = graph_page,
                MP = graph_max_pages, cap = MP * P, budget = 40, num_pages = R * MP + 4;
  const std::size_t elements = static_cast<std::size_t>(num_pages) * P * H * D;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), up(0.0f, 0.1f);

  // Requests 0..2 at positions {0, 1, 3} in state rows {2, 0, 1}; position 2 is padding.
  std::vector<std::int32_t> owner{0, 1, -1, 2}, rows{2, 0, -1, 1}, owned(R * MP);
  std::iota(owned.begin(), owned.end(), 0);
  std::shuffle(owned.begin(), owned.end(), rng);
  std::vector<T> hk(elements), hv(elements), k_new(static_cast<std::size_t>(steps) * R * H * D), v_new(k_new.size());
  for (auto& x : hk) x = from_float<T>(u(rng));
  for (auto& x : hv) x = from_float<T>(u(rng));
  for (auto& x : k_new) x = from_float<T>(u(rng));
  for (auto& x : v_new) x = from_float<T>(u(rng));
  const std::size_t probs_per_step = static_cast<std::size_t>(B) * QH * cap;
  std::vector<float> probs_all(probs_per_step * steps);
  for (auto& x : probs_all) x = up(rng);
  // The starting table: lengths {10, 25, 0, 38}.
  std::vector<std::int32_t> h_indptr(B + 1, 0), h_indices(B * MP, 0), h_last(B, 0), h_new(B), h_freed(B),
      h_released(B * MP);
  {
    const int start[B] = {10, 25, 0, 38};
    for (int b = 0; b < B; ++b) {
      const int pages = (start[b] + P - 1) / P;
      for (int i = 0; i < pages; ++i) h_indices[h_indptr[b] + i] = owned[owner[b] * MP + i];
      h_indptr[b + 1] = h_indptr[b] + pages;
      h_last[b] = pages == 0 ? 0 : start[b] - (pages - 1) * P;
    }
  }

  device_buffer<T> dk(elements), dv(elements), d_knew(k_new.size()), d_vnew(v_new.size());
  device_buffer<float> d_probs_all(probs_all.size()), d_probs(probs_per_step);
  device_buffer<std::int32_t> d_indptr(B + 1), d_indices(B * MP), d_last(B), d_owner(B), d_rows(B), d_owned(R * MP),
      d_new(B), d_freed(B), d_released(B * MP);
  device_buffer<sh::cuda::shrink_result> d_result(1);
  device_buffer<int> counter(1);
  dk.upload(hk);
  dv.upload(hv);
  d_knew.upload(k_new);
  d_vnew.upload(v_new);
  d_probs_all.upload(probs_all);
  d_indptr.upload(h_indptr);
  d_indices.upload(h_indices);
  d_last.upload(h_last);
  d_owner.upload(owner);
  d_rows.upload(rows);
  d_owned.upload(owned);
  CUDA_CHECK(cudaMemset(counter.data(), 0, sizeof(int)));

  const auto hview = sh::make_paged_kv_view(
      sh::host_span<T>(hk.data(), elements), sh::host_span<T>(hv.data(), elements),
      sh::host_span<const std::int32_t>(h_indptr.data(), B + 1),
      sh::host_span<const std::int32_t>(h_indices.data(), h_indices.size()),
      sh::host_span<const std::int32_t>(h_last.data(), B), B, H, D, P, num_pages, MP);
  const auto dview = sh::make_paged_kv_view(
      dk.span(), dv.span(), sh::device_span<const std::int32_t>(d_indptr.data(), B + 1),
      sh::device_span<const std::int32_t>(d_indices.data(), d_indices.size()),
      sh::device_span<const std::int32_t>(d_last.data(), B), B, H, D, P, num_pages, MP);
  // Sized by the budget: decode appends one token between compress calls.
  const sh::state_shape shape{R, H, sh::state_capacity_for(budget, 1), policy.ring_words()};
  const std::size_t bytes = sh::state_bytes(shape);
  aligned_bytes h_state(bytes), snap(bytes), h_ws(sh::host::compress_workspace_bytes(hview));
  device_buffer<std::byte> d_state(bytes);
  const auto hst = sh::make_state(h_state.span(), shape).for_batch(sh::host_span<const std::int32_t>(rows.data(), B));
  const auto dst0 = sh::make_state(d_state.span(), shape);
  const auto dst = dst0.for_batch(sh::device_span<const std::int32_t>(d_rows.data(), B));
  const auto dsnap = sh::make_state(snap.span(), shape);
  sh::host::reset_state(hst);
  CUDA_CHECK(sh::cuda::reset_state(dst0));
  std::size_t ws_bytes = 0;
  CUDA_CHECK(sh::cuda::compress(nullptr, ws_bytes, policy, dview, dst, budget, {}));
  device_buffer<std::byte> d_ws(ws_bytes);
  const auto dp = sh::probability_view<device_space>::dense({d_probs.data(), d_probs.size()}, QH, 1, cap);

  // Capture one decode step.
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  graph_append<T><<<1, 32, 0, stream>>>(dk.data(), dv.data(), dview.k_layout, dview.v_layout, d_indptr.data(),
                                         d_indices.data(), d_last.data(), d_owner.data(), d_owned.data(),
                                         d_knew.data(), d_vnew.data(), counter.data(), H, D);
  graph_copy_probs<<<8, 256, 0, stream>>>(d_probs.data(), d_probs_all.data(), counter.data(), probs_per_step);
  CUDA_CHECK(sh::cuda::observe_probabilities(policy, dview, dst, dp, stream));
  CUDA_CHECK(sh::cuda::compress(d_ws.data(), ws_bytes, policy, dview, dst, budget, {d_new.span(), d_freed.span()},
                                stream));
  CUDA_CHECK(sh::cuda::shrink_page_table(d_indptr.span(), d_indices.span(), d_last.span(), P,
                                         sh::device_span<const std::int32_t>(d_new.data(), B), d_released.span(),
                                         d_result.data(), stream));
  graph_bump<<<1, 1, 0, stream>>>(counter.data());
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  int failures = 0, host_step = 0;
  std::size_t host_released = 0;
  auto host_steps = [&](int until) {
    for (; host_step < until; ++host_step) {
      append_step(hk.data(), hv.data(), hview.k_layout, hview.v_layout, h_indptr.data(), h_indices.data(),
                  h_last.data(), owner.data(), owned.data(), k_new.data(), v_new.data(), host_step, H, D);
      const auto hp = sh::probability_view<host_space>::dense(
          {probs_all.data() + probs_per_step * host_step, probs_per_step}, QH, 1, cap);
      sh::host::observe_probabilities(policy, hview, hst, hp);
      sh::host::compress(policy, hview, hst, budget, h_ws.span(),
                         {sh::host_span<std::int32_t>(h_new.data(), B), sh::host_span<std::int32_t>(h_freed.data(), B)});
      host_released = sh::host::shrink_page_table(
          sh::host_span<std::int32_t>(h_indptr.data(), B + 1),
          sh::host_span<std::int32_t>(h_indices.data(), h_indices.size()),
          sh::host_span<std::int32_t>(h_last.data(), B), P, sh::host_span<const std::int32_t>(h_new.data(), B),
          sh::host_span<std::int32_t>(h_released.data(), h_released.size()));
    }
  };
  auto compare = [&](int at) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    mismatch_log log;
    d_state.download(snap.data(), bytes);
    for (int r = 0; r < R; ++r)
      if (dsnap.status[r] != 0)
        log.add("status word of row ", r, ": ", dsnap.status[r], " (", sh::cuda::describe_status(dsnap.status[r]), ")");
    sh::cuda::shrink_result result;
    d_result.download(&result, 1);
    if (result.status != 0 || result.released != static_cast<std::int32_t>(host_released))
      log.add("shrink result {", result.released, ", ", result.status, "}, host released ", host_released);
    if (d_indptr.download() != h_indptr || d_last.download() != h_last) log.add("page table differs");
    const auto di = d_indices.download();
    if (!std::equal(h_indices.begin(), h_indices.begin() + h_indptr[B], di.begin())) log.add("page ids differ");
    if (d_new.download() != h_new || d_freed.download() != h_freed) log.add("compress outputs differ");
    std::vector<row_slots> live;
    for (int b = 0; b < B; ++b)
      if (rows[b] >= 0) live.push_back({rows[b], hview.length(b)});
    compare_state("graph", hst, dsnap, live, score_rule{}, true, log);
    const auto dev_k = dk.download(), dev_v = dv.download();
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < hview.length(b); ++t) {
          const std::size_t ko = hview.k_row(b, h, t) - hk.data(), vo = hview.v_row(b, h, t) - hv.data();
          if (std::memcmp(&hk[ko], &dev_k[ko], sizeof(T) * D) != 0 || std::memcmp(&hv[vo], &dev_v[vo], sizeof(T) * D) != 0)
            log.add("K/V row (", b, ",", h, ",", t, ") differs");
        }
    if (!log.ok()) {  // device differences only: void in a host-only run
      ++failures;
      std::printf("FAIL graph after %d replays:\n%s", at, log.text.str().c_str());
    }
  };
  const int half = steps / 2;
  for (int s = 0; s < half; ++s) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  host_steps(half);
  compare(half);
  for (int s = half; s < steps; ++s) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  host_steps(steps);
  compare(steps);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("graph: %d replays of append + observe + compress + shrink_page_table (paged, state rows, padding) %s\n",
              steps, failures == 0 ? "match the host backend" : "DIFFER from the host backend");
  return failures;
}
