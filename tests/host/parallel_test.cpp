// The plan_* entry points (host/plan.hpp) run in slices: for every policy,
// contiguous and paged caches, NHD and HND layouts, per_head, shared_heads
// and shared_layers eviction, running the n slices of a plan once each, in
// any order, on one thread or on n (host/threads.hpp), must give exactly
// what the serial call gives: the same K and V bytes, every byte of the
// eviction state, the same outputs and selections.
//
// Each scenario drives two identical engines in lock step ("serial" and
// "sliced"): a ragged prefill then chunked decode steps over a batch with a
// padding slot (state row -1) and scrambled state rows, observe through
// probabilities, queries, and queries with their log-sum-exp, then compress
// (or select + compact / forget) every step. The serial engine calls the
// ordinary functions, the sliced one the plans with slice counts cycling
// through {1, 2, 3, 5, 8, units + 3}; after every call both are compared
// byte for byte. The serial functions are checked against the brute-force
// oracle elsewhere (simulation_*, granularity_test.cpp), so equality here
// is correctness. Refusals of plans, slices and thread counts, and the
// documented units, are checked at the end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <scissorhands/host/threads.hpp>

#include "policies.hpp"
#include "refusal.hpp"
#include "support.hpp"

namespace {

using namespace sh_test;

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return to_bf16(x);
}

template <class V>
bool same_bytes(const V& a, const V& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

// A contiguous cache of bf16 rows (NHD or HND), with the interface of
// support.hpp's caches that the driver below uses.
struct bf16_cache {
  std::int32_t batch, kv_heads, head_dim, capacity;
  sh::kv_layout layout;
  std::vector<engine_bf16> data[2];
  std::vector<std::int32_t> lengths, reported, freed;

  bf16_cache(std::int32_t batch_, std::int32_t kv_heads_, std::int32_t head_dim_, std::int32_t capacity_, bool hnd,
             std::uint64_t seed)
      : batch(batch_), kv_heads(kv_heads_), head_dim(head_dim_), capacity(capacity_),
        layout(hnd ? sh::kv_layout::hnd(capacity_, kv_heads_, head_dim_)
                   : sh::kv_layout::nhd(capacity_, kv_heads_, head_dim_)),
        lengths(static_cast<std::size_t>(batch_), 0), reported(static_cast<std::size_t>(batch_), -7),
        freed(static_cast<std::size_t>(batch_), -7) {
    const std::size_t n = static_cast<std::size_t>(batch) * kv_heads * capacity * head_dim;
    for (int kind = 0; kind < 2; ++kind) {
      data[kind].resize(n);
      for (std::size_t i = 0; i < n; ++i) data[kind][i] = to_bf16(background_value(seed, kind, i) - 100.0f);
    }
  }
  engine_bf16* row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return data[kind].data() + layout.offset(b, h, t);
  }
  std::int32_t length(std::int32_t b) const { return lengths[static_cast<std::size_t>(b)]; }
  std::int32_t max_capacity() const { return capacity; }
  std::int32_t append(std::int32_t b) { return lengths[static_cast<std::size_t>(b)]++; }
  sh::host_kv_view<engine_bf16> view() {
    return {{data[0].data(), data[0].size()}, {data[1].data(), data[1].size()}, layout, layout,
            sh::host_span<const std::int32_t>(lengths.data(), lengths.size()), batch, kv_heads, head_dim, capacity};
  }
  sh::compress_output<host> output() {
    std::fill(reported.begin(), reported.end(), -7);
    std::fill(freed.begin(), freed.end(), -7);
    return {{reported.data(), reported.size()}, {freed.data(), freed.size()}};
  }
  std::string after_compress(const std::vector<std::int32_t>& new_lengths) {
    if (reported != new_lengths) return "compress reported other new lengths than expected";
    for (std::int32_t f : freed)
      if (f != 0) return "a contiguous cache reported freed pages";
    lengths = reported;
    return "";
  }
};

// How a plan's slices are run.
enum class run_mode { shuffled, threads };

const char* name_of(run_mode m) { return m == run_mode::shuffled ? "slices shuffled on this thread" : "run_on_threads"; }

enum class apply_kind { compress, compact, forget };

struct spec {
  std::int32_t layers = 1, kv_heads = 2, group = 2, head_dim = 8;
  std::int32_t budget = 12, evict = 3, recent = 3, sinks = 0, chunk = 3, steps = 24;
  std::vector<std::int32_t> prefill{13, 6, 0, 9};  // 0: a padding slot (state row -1) that never fills
  std::int32_t page_size = 0;                      // 0: contiguous
  bool hnd = false;                                // layer 0's layout (odd layers get the other one)
  sh::compaction mode = sh::compaction::fill_holes;
  apply_kind apply = apply_kind::compress;
  run_mode run = run_mode::shuffled;
  std::int32_t pinned = 0;  // select: first tokens of sequence 0 pinned
  std::uint64_t seed = 1;

  std::int32_t batch() const { return static_cast<std::int32_t>(prefill.size()); }
  std::int32_t state_capacity() const {
    return std::max(sh::state_capacity_for(budget, chunk), *std::max_element(prefill.begin(), prefill.end()));
  }
  std::string describe() const {
    std::ostringstream s;
    s << "layers " << layers << ", kv_heads " << kv_heads << ", group " << group << ", head_dim " << head_dim
      << ", budget " << budget << ", m " << evict << ", r " << recent << ", sinks " << sinks << ", chunk " << chunk
      << ", " << (page_size ? "paged, page size " + std::to_string(page_size) : std::string("contiguous")) << ", "
      << (hnd ? "hnd" : "nhd") << ", " << (mode == sh::compaction::fill_holes ? "fill_holes" : "preserve_order")
      << ", " << (apply == apply_kind::compress ? "compress" : apply == apply_kind::compact ? "select + compact"
                                                                                            : "select + forget")
      << ", " << name_of(run) << ", pinned " << pinned << ", seed " << seed;
    return s.str();
  }
};

// Runs a plan's `count` slices, each once: in a scrambled order on this
// thread, or on `count` threads.
struct slicer {
  run_mode mode;
  std::uint64_t seed;
  std::int64_t calls = 0;
  std::int64_t sliced_calls = 0;  // calls with 2 or more slices
  std::int64_t empty_calls = 0;   // calls with more slices than units (some slices empty)

  template <class Plan>
  void run(const Plan& plan, std::int32_t count) {
    ++calls;
    if (count > 1) ++sliced_calls;
    if (count > plan.units()) ++empty_calls;
    if (mode == run_mode::threads) {
      sh::host::run_on_threads(plan, count);
      return;
    }
    std::vector<std::int32_t> order(static_cast<std::size_t>(count));
    std::iota(order.begin(), order.end(), 0);
    scramble(order, hash_of({static_cast<std::int64_t>(seed), calls}));
    for (std::int32_t i : order) plan.run({i, count});
  }
};

// The slice counts the plans are run in, cycled per kind of call.
std::int32_t slice_count(std::int64_t& counter, std::int64_t units) {
  const std::int32_t choices[] = {1, 2, 3, 5, 8, static_cast<std::int32_t>(units) + 3};
  return choices[static_cast<std::size_t>(counter++ % 6)];
}

template <class Policy>
Policy configured(const spec& sp) {
  Policy p;
  p.config.recent = sp.recent;
  p.config.sinks = sp.sinks;
  p.config.evict_count = sp.evict;
  p.config.compaction_mode = p.config.pool_width > 1 ? sh::compaction::preserve_order : sp.mode;
  // A short window wraps its ring within the run (TOVA's stays 1).
  if constexpr (std::is_same_v<typename Policy::history, sh::sliding_window>)
    p.config.window = std::min(p.config.window, 6);
  return p;
}

// Two identical engines, one calling the serial functions and one the plans.
template <class Policy, class Q, class Cache>
class twin_engines {
  using T = typename decltype(std::declval<Cache&>().view())::element_type;
  static constexpr bool shared_layers = sh::granularity_of<Policy> == sh::granularity_kind::shared_layers;
  static constexpr bool shared_heads = sh::granularity_of<Policy> == sh::granularity_kind::shared_heads;
  static constexpr bool attention = Policy::observation::needs_attention;
  static constexpr bool paged = requires(Cache c) { c.page_size; };

 public:
  template <class Make>
  twin_engines(const spec& sp, Make&& make)
      : sp_(sp), policy_(configured<Policy>(sp)), B_(sp.batch()), H_(sp.kv_heads),
        shape_{B_ + 2, H_, sp.state_capacity(), policy_.ring_words()},
        rows_(static_cast<std::size_t>(B_)), next_pos_(static_cast<std::size_t>(B_), 0),
        slicer_{sp.run, sp.seed * 31 + 7} {
    for (int t = 0; t < 2; ++t)
      for (std::int32_t l = 0; l < sp.layers; ++l) caches_[t].push_back(make(l));
    // Scrambled state rows; a padding slot maps to -1.
    std::vector<std::int32_t> perm(static_cast<std::size_t>(B_ + 2));
    std::iota(perm.begin(), perm.end(), 0);
    scramble(perm, sp.seed + 3);
    for (std::int32_t b = 0; b < B_; ++b)
      rows_[static_cast<std::size_t>(b)] = sp.prefill[static_cast<std::size_t>(b)] == 0 ? -1 : perm[static_cast<std::size_t>(b)];
    const sh::host_span<const std::int32_t> rows{rows_.data(), rows_.size()};
    for (int t = 0; t < 2; ++t) {
      mem_[t] = std::make_unique<aligned_bytes>(sh::model_state_bytes(shape_, sp.layers));
      model_[t] = sh::make_model_state(mem_[t]->span(), shape_, sp.layers);
      sh::host::reset_state(model_[t]);
      model_[t] = model_[t].for_batch(rows);
    }
    const auto view = caches_[0][0].view();
    max_slices_ = std::max(8, B_ * H_ + 3);  // the most slice_count() asks for
    if constexpr (shared_layers) {
      serial_ws_ = std::make_unique<aligned_bytes>(sh::host::select_workspace_bytes(view, shape_));
      sliced_ws_ = std::make_unique<aligned_bytes>(sh::host::select_workspace_bytes(view, shape_, max_slices_));
    } else {
      serial_ws_ = std::make_unique<aligned_bytes>(sh::host::compress_workspace_bytes(view, shape_));
      sliced_ws_ = std::make_unique<aligned_bytes>(sh::host::compress_workspace_bytes(view, shape_, max_slices_));
    }
    for (int t = 0; t < 2; ++t) compact_ws_[t] = std::make_unique<aligned_bytes>(sh::host::compact_workspace_bytes(view));
  }

  void run() {
    INFO(sp_.describe());
    // On threads, half the steps (every slice count still comes twice):
    // each call starts and joins its threads.
    const std::int32_t steps = sp_.run == run_mode::threads ? std::max(8, sp_.steps / 2) : sp_.steps;
    for (std::int32_t s = 0; s < steps; ++s) {
      INFO("step " << s);
      step(s);
    }
    // The runs must have evicted, sliced and left slices empty, or they
    // proved little.
    CHECK(evictions_ > 0);
    CHECK(slicer_.sliced_calls > 0);
    CHECK(slicer_.empty_calls > 0);
    if constexpr (attention) {
      // Observation reached the scores (not only admission).
      const auto st = model_[0].layer(0);
      bool scored = false;
      for (std::int32_t b = 0; b < B_; ++b)
        for (std::int32_t h = 0; h < H_; ++h)
          for (std::int32_t t = 0; t < caches_[0][0].length(b); ++t) scored = scored || st.scores[st.index(b, h, t)] != 0.0f;
      CHECK(scored);
    }
  }

 private:
  void step(std::int32_t s) {
    std::vector<std::int32_t> appended(static_cast<std::size_t>(B_)), q_len(static_cast<std::size_t>(B_));
    for (std::int32_t b = 0; b < B_; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      if (sp_.prefill[ub] == 0) continue;  // padding
      appended[ub] = s == 0 ? sp_.prefill[ub]
                            : 1 + static_cast<std::int32_t>(hash_of({static_cast<std::int64_t>(sp_.seed), s, b}) %
                                                             static_cast<std::uint64_t>(sp_.chunk));
      // The prefill observes its last 4 queries; now and then sequence 1
      // has no query (its tokens are admitted only).
      q_len[ub] = s == 0 ? std::min(appended[ub], 4) : appended[ub];
      if (s > 0 && b == 1 && hash_of({static_cast<std::int64_t>(sp_.seed), s, 99}) % 4 == 0) q_len[ub] = 0;
    }
    // Append the K/V rows to every layer of both engines.
    bool fits = true;
    for (int t = 0; t < 2; ++t)
      for (std::int32_t l = 0; l < sp_.layers; ++l) {
        auto& c = caches_[t][static_cast<std::size_t>(l)];
        for (std::int32_t b = 0; b < B_; ++b)
          for (std::int32_t i = 0; i < appended[static_cast<std::size_t>(b)]; ++i) {
            const std::int32_t slot = c.append(b);
            fits = fits && slot < c.max_capacity();
            if (!fits) break;
            for (std::int32_t h = 0; h < H_; ++h)
              for (int kind = 0; kind < 2; ++kind)
                for (std::int32_t d = 0; d < sp_.head_dim; ++d)
                  c.row(kind, b, h, slot)[d] =
                      from_float<T>(token_value(kind, b, l * 16 + h, next_pos_[static_cast<std::size_t>(b)] + i, d));
          }
      }
    REQUIRE(fits);
    for (std::int32_t b = 0; b < B_; ++b) next_pos_[static_cast<std::size_t>(b)] += appended[static_cast<std::size_t>(b)];
    std::vector<std::int32_t> qo(1, 0);
    for (std::int32_t n : q_len) qo.push_back(qo.back() + n);

    for (std::int32_t l = 0; l < sp_.layers; ++l) {
      INFO("observe, layer " << l);
      observe(s, l, qo);
    }
    if constexpr (shared_layers) {
      select_and_apply();
    } else {
      for (std::int32_t l = 0; l < sp_.layers; ++l) {
        INFO("compress, layer " << l);
        compress(l);
      }
    }
  }

  void observe(std::int32_t s, std::int32_t l, const std::vector<std::int32_t>& qo) {
    const std::int32_t QH = H_ * sp_.group, D = sp_.head_dim, tokens = qo.back();
    auto& c0 = caches_[0][static_cast<std::size_t>(l)];
    const auto view0 = c0.view();
    const auto view1 = caches_[1][static_cast<std::size_t>(l)].view();
    const auto st0 = model_[0].layer(l), st1 = model_[1].layer(l);
    const sh::host_span<const std::int32_t> qos{qo.data(), qo.size()};
    const auto queries_of = [&](std::int32_t b) { return qo[static_cast<std::size_t>(b) + 1] - qo[static_cast<std::size_t>(b)]; };
    const std::int32_t count = slice_count(observe_counter_, std::int64_t{B_} * H_);
    const auto seed = static_cast<std::int64_t>(sp_.seed);
    const int kind = static_cast<int>((static_cast<std::uint64_t>(s + l) + sp_.seed) % 3);
    if (kind == 0) {
      // Probabilities [token][q_head][columns]; NaN where no query looks.
      const std::int32_t columns = c0.max_capacity();
      std::vector<float> probs(static_cast<std::size_t>(tokens) * QH * columns, std::numeric_limits<float>::quiet_NaN());
      for (std::int32_t b = 0; b < B_; ++b)
        for (std::int32_t j = 0; j < queries_of(b); ++j)
          for (std::int32_t qh = 0; qh < QH; ++qh) {
            const std::int32_t visible = c0.length(b) - queries_of(b) + j + 1;
            float* row = probs.data() + (static_cast<std::size_t>(qo[static_cast<std::size_t>(b)] + j) * QH + qh) * columns;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t)
              sum += row[t] = 0.05f + static_cast<float>(hash_of({seed, s, l, b, qh, j, t}) % 8);
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
          }
      const auto pv = sh::probability_view<host>::ragged({probs.data(), probs.size()}, qos, QH, columns);
      sh::host::observe_probabilities(policy_, view0, st0, pv);
      const auto plan = sh::host::plan_observe_probabilities(policy_, view1, st1, pv);
      if constexpr (attention) REQUIRE(plan.units() == std::int64_t{B_} * H_);
      slicer_.run(plan, count);
    } else {
      std::vector<Q> q(static_cast<std::size_t>(tokens) * QH * D);
      for (std::size_t i = 0; i < q.size(); ++i)
        q[i] = from_float<Q>(3.0f * (static_cast<float>(unit(hash_of({seed, s, l, static_cast<std::int64_t>(i), 5}))) - 0.5f));
      const auto qv = sh::query_view<Q, host>::ragged({q.data(), q.size()}, qos, QH, D);
      // A custom softmax scale on some steps (0: 1/sqrt(head_dim)).
      const float scale = s % 2 ? 0.0f : 0.41f;
      std::vector<float> lse;
      sh::lse_view<host> lv{};
      if (kind == 2) {
        // FlashInfer's base-2 log-sum-exp, computed here in double.
        const double sc = scale > 0.0f ? scale : 1.0 / std::sqrt(static_cast<double>(D));
        lse.assign(static_cast<std::size_t>(tokens) * QH, 0.0f);
        for (std::int32_t b = 0; b < B_; ++b)
          for (std::int32_t j = 0; j < queries_of(b); ++j)
            for (std::int32_t qh = 0; qh < QH; ++qh) {
              const std::int32_t visible = c0.length(b) - queries_of(b) + j + 1;
              const std::size_t token = static_cast<std::size_t>(qo[static_cast<std::size_t>(b)] + j);
              std::vector<double> logits;
              double top = -1e300;
              for (std::int32_t t = 0; t < visible; ++t) {
                double dot = 0.0;
                for (std::int32_t d = 0; d < D; ++d)
                  dot += static_cast<double>(sh::to_float(q[(token * QH + static_cast<std::size_t>(qh)) * D + static_cast<std::size_t>(d)])) *
                         static_cast<double>(sh::to_float(c0.row(0, b, qh / sp_.group, t)[d]));
                logits.push_back(dot * sc);
                top = std::max(top, logits.back());
              }
              double sum = 0.0;
              for (double x : logits) sum += std::exp(x - top);
              lse[token * QH + static_cast<std::size_t>(qh)] = static_cast<float>((top + std::log(sum)) / std::log(2.0));
            }
        lv = sh::lse_view<host>::ragged({lse.data(), lse.size()}, qos, QH, sh::lse_base::base2);
      }
      sh::host::observe_queries(policy_, view0, st0, qv, lv, scale);
      const auto plan = sh::host::plan_observe_queries(policy_, view1, st1, qv, lv, scale);
      if constexpr (attention) REQUIRE(plan.units() == std::int64_t{B_} * H_);
      slicer_.run(plan, count);
    }
    INFO("observe through " << (kind == 0 ? "probabilities" : kind == 1 ? "queries" : "queries and lse") << ", "
                            << count << " slices");
    REQUIRE(twins_equal() == "");
  }

  void compress(std::int32_t l) {
    auto& c0 = caches_[0][static_cast<std::size_t>(l)];
    auto& c1 = caches_[1][static_cast<std::size_t>(l)];
    const auto view0 = c0.view();
    const auto view1 = c1.view();
    const std::int64_t units = shared_heads ? B_ : std::int64_t{B_} * H_;
    const std::int32_t slices = slice_count(compress_counter_, units);
    // Now and then fewer slices than the workspace was sized for.
    const std::int32_t count = compress_counter_ % 4 == 3 ? std::max(1, slices / 2) : slices;
    std::vector<std::int32_t> expect;
    for (std::int32_t b = 0; b < B_; ++b) {
      expect.push_back(sh::length_after_compress(c0.length(b), sp_.budget, sp_.evict));
      if (c0.length(b) >= sp_.budget) evictions_ += c0.length(b) - expect.back();
    }
    sh::host::compress(policy_, view0, model_[0].layer(l), sp_.budget, serial_ws_->span(), c0.output());
    const sh::host_span<std::byte> ws{sliced_ws_->data(), sh::host::compress_workspace_bytes(view1, shape_, slices)};
    poison_beyond(ws.size());
    const auto plan = sh::host::plan_compress(policy_, view1, model_[1].layer(l), sp_.budget, ws, c1.output(), slices);
    REQUIRE(plan.units() == units);
    REQUIRE(plan.max_slices() == slices);
    slicer_.run(plan, count);
    INFO("compress in " << count << " of " << slices << " slices");
    REQUIRE(untouched_beyond(ws.size()));
    REQUIRE(c0.reported == c1.reported);
    REQUIRE(c0.freed == c1.freed);
    REQUIRE(twins_equal() == "");
    REQUIRE(c0.after_compress(expect) == "");
    REQUIRE(c1.after_compress(expect) == "");
  }

  void select_and_apply() {
    const std::int32_t m = sp_.evict;
    const std::int32_t stride = sh::max_evictions(shape_.capacity, sp_.budget, m);
    std::vector<std::int32_t> counts[2], slots[2], cache_slots[2];
    sh::eviction_selection<host> sel[2];
    std::vector<std::int32_t> pinned(static_cast<std::size_t>(B_), 0);
    pinned[0] = std::min(sp_.pinned, caches_[0][0].length(0));
    std::vector<std::int32_t> expect;
    for (std::int32_t b = 0; b < B_; ++b) {
      expect.push_back(sh::length_after_compress(caches_[0][0].length(b), sp_.budget, m));
      evictions_ += caches_[0][0].length(b) - expect.back();
    }
    for (int t = 0; t < 2; ++t) {
      counts[t].assign(static_cast<std::size_t>(B_), -5);
      slots[t].assign(static_cast<std::size_t>(B_ * stride), -5);
      cache_slots[t].assign(static_cast<std::size_t>(B_ * stride), -5);
      sel[t] = {stride, {counts[t].data(), counts[t].size()}, {slots[t].data(), slots[t].size()},
                {cache_slots[t].data(), cache_slots[t].size()}, caches_[t][0].output()};
    }
    const sh::host_span<const std::int32_t> pins{pinned.data(), pinned.size()};
    {
      const std::int32_t slices = slice_count(select_counter_, B_);
      const std::int32_t count = select_counter_ % 4 == 3 ? std::max(1, slices / 2) : slices;
      const auto view0 = caches_[0][0].view();
      const auto view1 = caches_[1][0].view();
      sh::host::select(policy_, view0, model_[0], sp_.budget, serial_ws_->span(), sel[0], pins);
      const sh::host_span<std::byte> ws{sliced_ws_->data(), sh::host::select_workspace_bytes(view1, shape_, slices)};
      poison_beyond(ws.size());
      const auto plan = sh::host::plan_select(policy_, view1, model_[1], sp_.budget, ws, sel[1], pins, slices);
      REQUIRE(plan.units() == B_);
      REQUIRE(plan.max_slices() == slices);
      slicer_.run(plan, count);
      INFO("select in " << count << " of " << slices << " slices");
      REQUIRE(untouched_beyond(ws.size()));
      REQUIRE(counts[0] == counts[1]);
      REQUIRE(slots[0] == slots[1]);
      REQUIRE(cache_slots[0] == cache_slots[1]);
      REQUIRE(caches_[0][0].reported == caches_[1][0].reported);
      REQUIRE(caches_[0][0].freed == caches_[1][0].freed);
      REQUIRE(caches_[0][0].reported == expect);
      REQUIRE(twins_equal() == "");
    }
    for (std::int32_t l = 0; l < sp_.layers; ++l) {
      const std::int32_t count = slice_count(apply_counter_, B_);
      const auto view0 = caches_[0][static_cast<std::size_t>(l)].view();
      const auto view1 = caches_[1][static_cast<std::size_t>(l)].view();
      INFO((sp_.apply == apply_kind::compact ? "compact" : "forget") << ", layer " << l << ", " << count << " slices");
      if (sp_.apply == apply_kind::compact) {
        sh::host::compact(policy_, view0, model_[0].layer(l), sel[0], compact_ws_[0]->span());
        const auto plan = sh::host::plan_compact(policy_, view1, model_[1].layer(l), sel[1], compact_ws_[1]->span());
        REQUIRE(plan.units() == B_);
        REQUIRE(plan.max_slices() == std::numeric_limits<std::int32_t>::max());
        slicer_.run(plan, count);
      } else {
        sh::host::forget(policy_, view0, model_[0].layer(l), sel[0]);
        const auto plan = sh::host::plan_forget(policy_, view1, model_[1].layer(l), sel[1]);
        REQUIRE(plan.units() == B_);
        REQUIRE(plan.max_slices() == std::numeric_limits<std::int32_t>::max());
        slicer_.run(plan, count);
      }
      REQUIRE(twins_equal() == "");
    }
    // Apply the lengths as the engine does: block tables through
    // shrink_page_table, slot lists by dropping the evicted entries.
    for (int t = 0; t < 2; ++t)
      for (std::int32_t l = 0; l < sp_.layers; ++l) {
        auto& c = caches_[t][static_cast<std::size_t>(l)];
        if (sp_.apply == apply_kind::compact) {
          c.reported = caches_[t][0].reported;
          c.freed = caches_[t][0].freed;
          REQUIRE(c.after_compress(expect) == "");
        } else if constexpr (paged) {
          for (std::int32_t b = 0; b < B_; ++b) {
            auto& list = c.pages[static_cast<std::size_t>(b)];
            const std::int32_t* gone = slots[t].data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(stride);
            for (std::int32_t k = counts[t][static_cast<std::size_t>(b)] - 1; k >= 0; --k) {
              c.free_list.push_back(list[static_cast<std::size_t>(gone[k])]);
              list.erase(list.begin() + gone[k]);
            }
            c.lengths[static_cast<std::size_t>(b)] = expect[static_cast<std::size_t>(b)];
          }
        } else {
          FAIL("forget needs a paged (slot-list) cache");
        }
      }
  }

  // The sliced workspace past the bytes a call was given: no slice may
  // write there.
  void poison_beyond(std::size_t given) {
    std::memset(sliced_ws_->data() + given, 0x5A, sliced_ws_->size() - given);
  }
  bool untouched_beyond(std::size_t given) const {
    for (std::size_t i = given; i < sliced_ws_->size(); ++i)
      if (sliced_ws_->data()[i] != std::byte{0x5A}) return false;
    return true;
  }

  // "" when both engines hold the same bytes everywhere.
  std::string twins_equal() {
    for (std::int32_t l = 0; l < sp_.layers; ++l) {
      const auto& a = caches_[0][static_cast<std::size_t>(l)];
      const auto& b = caches_[1][static_cast<std::size_t>(l)];
      for (int kind = 0; kind < 2; ++kind)
        if (!same_bytes(a.data[kind], b.data[kind]))
          return std::string(kind ? "V" : "K") + " of layer " + std::to_string(l) + " differs";
      if (a.lengths != b.lengths) return "lengths of layer " + std::to_string(l) + " differ";
    }
    if (!mem_[0]->equals(mem_[1]->snapshot())) {
      // Name the first differing array for the report.
      const auto off = sh::detail::offsets_of(shape_);
      const auto x = mem_[0]->snapshot(), y = mem_[1]->snapshot();
      std::size_t i = 0;
      while (x[i] == y[i]) ++i;
      const std::size_t at = i % off.total;
      const char* what = at >= off.ring       ? "ring"
                         : at >= off.observed ? "observed"
                         : at >= off.scores   ? "scores"
                         : at >= off.positions ? "positions"
                         : at >= off.status    ? "status"
                         : at >= off.tracked   ? "tracked"
                         : at >= off.next_position ? "next_position"
                                                   : "step";
      return std::string("state differs: layer ") + std::to_string(i / off.total) + ", " + what + ", byte " +
             std::to_string(at);
    }
    return "";
  }

  spec sp_;
  Policy policy_;
  std::int32_t B_, H_;
  sh::state_shape shape_;
  std::vector<std::int32_t> rows_, next_pos_;
  std::vector<Cache> caches_[2];
  std::unique_ptr<aligned_bytes> mem_[2];
  sh::model_state<host> model_[2];
  std::int32_t max_slices_ = 1;
  std::unique_ptr<aligned_bytes> serial_ws_, sliced_ws_, compact_ws_[2];
  slicer slicer_;
  std::int64_t observe_counter_ = 0, compress_counter_ = 0, select_counter_ = 0, apply_counter_ = 0;
  std::int64_t evictions_ = 0;
};

// Both engines of a scenario in both run modes, layer l's caches made by
// make(sp, l).
template <class Policy, class Q = float, class Make>
void run_twins(spec sp, Make&& make) {
  for (run_mode mode : {run_mode::shuffled, run_mode::threads}) {
    sp.run = mode;
    const auto make_layer = [&](std::int32_t l) { return make(sp, l); };
    twin_engines<Policy, Q, decltype(make_layer(0))> engines(sp, make_layer);
    engines.run();
  }
}

// Layer l's layout: the scenario's for even layers, the other one for odd.
bool hnd_at(const spec& sp, std::int32_t l) { return sp.hnd != (l % 2 == 1); }

// Over contiguous fp32 caches.
template <class Policy, class Q = float>
void contiguous(const spec& sp) {
  run_twins<Policy, Q>(sp, [](const spec& s, std::int32_t l) {
    return make_contiguous(hnd_at(s, l) ? layout_kind::hnd : layout_kind::nhd, s.batch(), s.kv_heads, s.head_dim,
                           s.state_capacity() + 2, s.seed);
  });
}

// Over FlashInfer-style paged caches whose pool hands out pages in a
// scrambled order (the same order in every layer: one shared table).
template <class Policy, class Q = float>
void paged(const spec& sp) {
  run_twins<Policy, Q>(sp, [](const spec& s, std::int32_t l) {
    const auto layout = hnd_at(s, l) ? sh::paged_layout::hnd(s.page_size, s.kv_heads, s.head_dim)
                                     : sh::paged_layout::nhd(s.page_size, s.kv_heads, s.head_dim);
    return paged_cache(s.batch(), s.kv_heads, s.head_dim, s.page_size, s.state_capacity() + s.page_size, layout,
                       layout, s.seed);
  });
}

template <class Base, class G>
using at = sh::with_granularity<Base, G>;

}  // namespace

TEST_CASE("parallel: per_head plans in slices equal the serial calls, contiguous NHD and HND", "[parallel]") {
  for (bool hnd : {false, true}) {
    // Each policy sees both compaction modes (pooling forces preserve_order).
    spec sp{.hnd = hnd, .mode = hnd ? sh::compaction::preserve_order : sh::compaction::fill_holes, .seed = 1u + hnd};
    contiguous<sh::scissorhands_policy>(sp);
    contiguous<sh::h2o_policy>(sp);
    contiguous<sh::tova_policy>(sp);
    contiguous<sh::snapkv_policy>(sp);
    contiguous<mass_window_max>(sp);
    contiguous<mass_decay>(sp);
    contiguous<sh::key_norm_policy>(sp);
    contiguous<random_static>(sp);
    sp.sinks = 2;
    contiguous<sh::streaming_policy>(sp);
    contiguous<unimportant_unbounded_max>(sp);
  }
}

TEST_CASE("parallel: per_head plans in slices equal the serial calls, paged (page size 1 and 4)", "[parallel]") {
  for (std::int32_t page_size : {1, 4})
    for (bool hnd : {false, true}) {
      spec sp{.layers = 2, .steps = 16, .page_size = page_size, .hnd = hnd,  // one table: layer 1 the other layout
              .mode = hnd ? sh::compaction::fill_holes : sh::compaction::preserve_order,
              .seed = 10u + static_cast<std::uint32_t>(page_size) + hnd};
      paged<sh::scissorhands_policy>(sp);
      paged<sh::snapkv_policy>(sp);
      paged<sh::key_norm_policy>(sp);
      sp.group = 4;  // the blocked path's four-row dot products
      sp.kv_heads = 3;
      paged<sh::h2o_policy>(sp);
    }
}

TEST_CASE("parallel: shared_heads compress in slices equals the serial call", "[parallel]") {
  for (bool hnd : {false, true}) {
    spec sp{.layers = 2, .kv_heads = 3, .steps = 16, .hnd = hnd,
            .mode = hnd ? sh::compaction::preserve_order : sh::compaction::fill_holes, .seed = 20u + hnd};
    contiguous<at<sh::scissorhands_policy, sh::shared_heads<>>>(sp);
    contiguous<at<sh::h2o_policy, sh::shared_heads<sh::max_score>>>(sp);
    contiguous<at<sh::snapkv_policy, sh::shared_heads<>>>(sp);
    contiguous<at<sh::key_norm_policy, sh::shared_heads<>>>(sp);
    sp.page_size = 4;
    paged<at<sh::scissorhands_policy, sh::shared_heads<sh::max_score>>>(sp);
    paged<at<sh::tova_policy, sh::shared_heads<>>>(sp);
  }
}

TEST_CASE("parallel: shared_layers select + compact in slices equal the serial calls", "[parallel]") {
  for (auto mode : {sh::compaction::fill_holes, sh::compaction::preserve_order}) {
    spec sp{.layers = 3, .steps = 16, .mode = mode, .apply = apply_kind::compact, .pinned = 3,
            .seed = 30 + static_cast<std::uint64_t>(mode)};
    contiguous<at<sh::scissorhands_policy, sh::shared_layers<>>>(sp);
    contiguous<at<mass_decay, sh::shared_layers<sh::max_score, sh::mean_score>>>(sp);
    contiguous<at<sh::snapkv_policy, sh::shared_layers<>>>(sp);
    contiguous<at<sh::random_policy, sh::shared_layers<>>>(sp);
    sp.layers = 2;
    for (std::int32_t page_size : {1, 4}) {
      sp.page_size = page_size;
      sp.hnd = page_size == 4;
      paged<at<sh::scissorhands_policy, sh::shared_layers<>>>(sp);
      paged<at<indicator_window, sh::shared_layers<sh::max_score, sh::max_score>>>(sp);
    }
  }
}

TEST_CASE("parallel: shared_layers select + forget in slices equal the serial calls", "[parallel]") {
  spec sp{.layers = 3, .steps = 16, .page_size = 1, .apply = apply_kind::forget, .pinned = 2, .seed = 40};
  paged<at<sh::scissorhands_policy, sh::shared_layers<>>>(sp);
  paged<at<mass_window_max, sh::shared_layers<sh::max_score>>>(sp);
  sp.mode = sh::compaction::preserve_order;
  paged<at<sh::snapkv_policy, sh::shared_layers<>>>(sp);
}

TEST_CASE("parallel: bf16 caches and queries, whole logit tiles, a head_dim tail and the unblocked path",
          "[parallel]") {
  // bf16 K/V and queries; budget 40: observe sees whole 16-token tiles.
  for (bool hnd : {false, true}) {
    spec sp{.budget = 40, .evict = 6, .chunk = 4, .steps = 14, .prefill = {43, 20, 0, 35}, .hnd = hnd,
            .mode = hnd ? sh::compaction::preserve_order : sh::compaction::fill_holes, .seed = 50u + hnd};
    const auto make = [](const spec& s, std::int32_t) {
      return bf16_cache(s.batch(), s.kv_heads, s.head_dim, s.state_capacity() + 2, s.hnd, s.seed);
    };
    run_twins<sh::h2o_policy, engine_bf16>(sp, make);
    run_twins<sh::scissorhands_policy, engine_bf16>(sp, make);
    run_twins<at<sh::tova_policy, sh::shared_heads<>>, float>(sp, make);
  }
  // fp32 cache, bf16 queries, head_dim 13 (dot products with a tail), GQA 5
  // (four-row dot products and one more).
  contiguous<sh::h2o_policy, engine_bf16>({.group = 5, .head_dim = 13, .seed = 52});
  // head_dim above the blocked path's key scratch: the unblocked path.
  contiguous<mass_window_max>({.kv_heads = 1, .group = 2, .head_dim = 520, .steps = 10, .seed = 53});
}

// ---------------------------------------------------------------------------
// Refusals and units.

namespace {

// One layer at the budget: a contiguous cache of 4 sequences over
// scrambled rows (with_padding: position 2 is a padding slot, row -1),
// observed twice, so a refusal has real bytes to leave alone.
template <class Policy>
struct fixture {
  static constexpr std::int32_t B = 4, H = 2, G = 2, D = 8, C = 12, budget = 10;
  Policy policy;
  contiguous_cache cache;
  sh::state_shape shape;
  aligned_bytes mem;
  std::vector<std::int32_t> rows, qo, active;
  sh::eviction_state<host> state;
  std::vector<float> probs;

  explicit fixture(bool with_padding = true)
      : policy(make_policy()), cache(make_contiguous(layout_kind::nhd, B, H, D, C, 9)),
        shape{B, H, C, policy.ring_words()}, mem(sh::state_bytes(shape)),
        rows(with_padding ? std::vector<std::int32_t>{2, 0, -1, 3} : std::vector<std::int32_t>{2, 0, 1, 3}),
        qo(with_padding ? std::vector<std::int32_t>{0, 1, 2, 2, 3} : std::vector<std::int32_t>{0, 1, 2, 3, 4}),
        active(with_padding ? std::vector<std::int32_t>{0, 1, 3} : std::vector<std::int32_t>{0, 1, 2, 3}),
        state(sh::make_state(mem.span(), shape).for_batch({rows.data(), rows.size()})) {
    sh::host::reset_state(sh::make_state(mem.span(), shape));
    for (const std::int32_t len : {budget - 1, budget}) {
      for (std::int32_t b : active)
        while (cache.length(b) < len) append(b);
      make_probs();
      sh::host::observe_probabilities(policy, cache.view(), state, probability());
    }
  }
  void append(std::int32_t b) {
    const std::int32_t t = cache.append(b);
    for (std::int32_t h = 0; h < H; ++h)
      for (std::int32_t d = 0; d < D; ++d) {
        cache.row(0, b, h, t)[d] = token_value(0, b, h, t, d);
        cache.row(1, b, h, t)[d] = token_value(1, b, h, t, d);
      }
  }
  // The next decode step: a token appended to each active sequence and its
  // query's probabilities, what another observe call needs (each query is
  // a new token).
  void next_step() {
    for (std::int32_t b : active) append(b);
    make_probs();
  }
  static Policy make_policy() {
    Policy p;
    p.config.recent = 2;
    p.config.evict_count = 2;
    return p;
  }
  std::int32_t tokens() const { return static_cast<std::int32_t>(active.size()); }
  // One query per active sequence, uniform over its tokens.
  void make_probs() {
    probs.assign(static_cast<std::size_t>(tokens() * H * G * C), 0.0f);
    std::int32_t token = 0;
    for (std::int32_t b : active) {
      for (std::int32_t qh = 0; qh < H * G; ++qh)
        for (std::int32_t t = 0; t < cache.length(b); ++t)
          probs[static_cast<std::size_t>((token * H * G + qh) * C + t)] = 1.0f / static_cast<float>(cache.length(b));
      ++token;
    }
  }
  sh::probability_view<host> probability() const {
    return sh::probability_view<host>::ragged({probs.data(), probs.size()}, {qo.data(), qo.size()}, H * G, C);
  }
  // Everything a call may write.
  std::vector<std::vector<std::byte>> snapshot() const {
    return bytes_of_all(mem.snapshot(), cache.data[0], cache.data[1], cache.lengths, cache.reported, cache.freed);
  }
  // The serial compress of this fixture, with its own workspace.
  void compress() {
    aligned_bytes ws(sh::host::compress_workspace_bytes(cache.view(), shape));
    sh::host::compress(policy, cache.view(), state, budget, ws.span(), cache.output());
  }
};

}  // namespace

TEST_CASE("parallel: refused plans, slices and thread counts write nothing", "[parallel]") {
  fixture<sh::h2o_policy> f;
  auto& p = f.policy;
  const auto view = f.cache.view();
  const std::size_t one = sh::host::compress_workspace_bytes(view, f.shape);
  const std::size_t two = sh::host::compress_workspace_bytes(view, f.shape, 2);
  REQUIRE(two > one);
  REQUIRE(sh::host::compress_workspace_bytes(view, f.shape, 3) > two);
  aligned_bytes ws(two);
  const auto out = f.cache.output();

  SECTION("a workspace sized for one slice, asked for two") {
    check_refused(f, "host::plan_compress", "workspace",
            [&] { (void)sh::host::plan_compress(p, view, f.state, f.budget, {ws.data(), one}, out, 2); });
    // The same bytes are enough for one slice.
    CHECK_NOTHROW(sh::host::plan_compress(p, view, f.state, f.budget, {ws.data(), one}, out, 1).run());
  }
  SECTION("zero slices") {
    check_refused(f, "host::plan_compress", "slices",
            [&] { (void)sh::host::plan_compress(p, view, f.state, f.budget, ws.span(), out, 0); });
    check_refused(f, "host::compress_workspace_bytes", "slices",
            [&] { (void)sh::host::compress_workspace_bytes(view, f.shape, 0); });
    check_refused(f, "host::select_workspace_bytes", "slices",
            [&] { (void)sh::host::select_workspace_bytes(view, f.shape, 0); });
  }
  SECTION("a slice outside the plan, and thread counts outside [1, max_slices]") {
    const auto plan = sh::host::plan_compress(p, view, f.state, f.budget, ws.span(), out, 2);
    REQUIRE(plan.max_slices() == 2);
    // The plan wrote the outputs; its slices have not run.
    REQUIRE(f.cache.reported == std::vector<std::int32_t>{8, 8, 0, 8});
    check_refused(f, "host::plan_compress", "slice.index", [&] { plan.run({2, 2}); });
    check_refused(f, "host::plan_compress", "slice.index", [&] { plan.run({-1, 2}); });
    check_refused(f, "host::plan_compress", "slice.count", [&] { plan.run({0, 0}); });
    check_refused(f, "host::plan_compress", "slice.count", [&] { plan.run({0, -3}); });
    check_refused(f, "host::plan_compress", "slice.count", [&] { plan.run({0, plan.max_slices() + 1}); });
    check_refused(f, "host::run_on_threads", "threads", [&] { sh::host::run_on_threads(plan, 0); });
    check_refused(f, "host::run_on_threads", "threads", [&] { sh::host::run_on_threads(plan, plan.max_slices() + 1); });
    // The plan still runs after the refusals, and gives the serial call's bytes.
    fixture<sh::h2o_policy> serial;
    serial.compress();
    REQUIRE(serial.snapshot() != f.snapshot());  // the slices' work is still to do
    sh::host::run_on_threads(plan, 2);
    CHECK(serial.snapshot() == f.snapshot());
  }
  SECTION("observe plans refuse bad slices, and have no slice limit") {
    f.next_step();
    const auto plan = sh::host::plan_observe_probabilities(p, view, f.state, f.probability());
    REQUIRE(plan.max_slices() == std::numeric_limits<std::int32_t>::max());
    check_refused(f, "host::plan_observe_probabilities", "slice.index", [&] { plan.run({5, 5}); });
    check_refused(f, "host::plan_observe_probabilities", "slice.count", [&] { plan.run({0, 0}); });
    check_refused(f, "host::run_on_threads", "threads", [&] { sh::host::run_on_threads(plan, -1); });
  }
  SECTION("a refused plan_observe_* writes nothing") {
    f.rows = {2, 0, -1, 2};  // row 2 twice
    check_refused(f, "host::plan_observe_probabilities", "state.state_rows",
            [&] { (void)sh::host::plan_observe_probabilities(p, view, f.state, f.probability()); });
    f.rows = {2, 0, -1, 3};
    f.probs[5] = 1.5f;  // sequence 0, query head 0, slot 5: above 1
    check_refused(f, "host::plan_observe_probabilities", "probs",
            [&] { (void)sh::host::plan_observe_probabilities(p, view, f.state, f.probability()); });
    std::vector<float> q(static_cast<std::size_t>(f.tokens() * f.H * f.G * f.D), 0.25f);
    std::vector<float> lse(static_cast<std::size_t>(f.tokens() * f.H * f.G), 1.0f);
    lse[3] = std::numeric_limits<float>::infinity();
    const sh::host_span<const std::int32_t> qo{f.qo.data(), f.qo.size()};
    const auto qv = sh::query_view<float, host>::ragged({q.data(), q.size()}, qo, f.H * f.G, f.D);
    check_refused(f, "host::plan_observe_queries", "lse", [&] {
      (void)sh::host::plan_observe_queries(p, view, f.state, qv,
                                           sh::lse_view<host>::ragged({lse.data(), lse.size()}, qo, f.H * f.G, sh::lse_base::base2));
    });
    check_refused(f, "host::plan_observe_queries", "softmax_scale",
            [&] { (void)sh::host::plan_observe_queries(p, view, f.state, qv, {}, -1.0f); });
    f.rows = {2, 0, -1, 0};
    check_refused(f, "host::plan_observe_queries", "state.state_rows",
            [&] { (void)sh::host::plan_observe_queries(p, view, f.state, qv); });
  }
}

TEST_CASE("parallel: refused select, compact and forget plans write nothing", "[parallel]") {
  using policy_t = at<sh::scissorhands_policy, sh::shared_layers<>>;
  policy_t p;
  p.config.recent = 2;
  p.config.evict_count = 2;
  constexpr std::int32_t L = 2, B = 3, H = 2, D = 4, budget = 8;
  const sh::state_shape shape{B, H, budget, p.ring_words()};
  aligned_bytes mem(sh::model_state_bytes(shape, L));
  const auto model = sh::make_model_state(mem.span(), shape, L);
  sh::host::reset_state(model);
  std::vector<contiguous_cache> caches;
  for (std::int32_t l = 0; l < L; ++l) caches.push_back(make_contiguous(layout_kind::hnd, B, H, D, budget, 4));
  for (std::int32_t l = 0; l < L; ++l) {
    for (std::int32_t b = 0; b < B; ++b)
      for (std::int32_t i = 0; i < budget - b; ++i) caches[static_cast<std::size_t>(l)].append(b);
    sh::host::admit(p, caches[static_cast<std::size_t>(l)].view(), model.layer(l));
  }
  const std::int32_t stride = sh::max_evictions(shape.capacity, budget, 2);
  std::vector<std::int32_t> counts(B, -1), slots(static_cast<std::size_t>(B * stride), -1), lens(B, -1), freed(B, -1);
  const sh::eviction_selection<host> sel{stride, {counts.data(), counts.size()}, {slots.data(), slots.size()}, {},
                                         {{lens.data(), lens.size()}, {freed.data(), freed.size()}}};
  const auto view = caches[0].view();
  const std::size_t one = sh::host::select_workspace_bytes(view, shape);
  REQUIRE(sh::host::select_workspace_bytes(view, shape, 2) > one);
  REQUIRE(sh::host::select_workspace_bytes(view, shape, 3) > sh::host::select_workspace_bytes(view, shape, 2));
  aligned_bytes ws(sh::host::select_workspace_bytes(view, shape, 3));
  struct everything {
    const aligned_bytes& mem;
    const std::vector<std::int32_t>& counts;
    const std::vector<std::int32_t>& slots;
    const std::vector<std::int32_t>& lens;
    const std::vector<contiguous_cache>& caches;
    std::vector<std::vector<std::byte>> snapshot() const {
      auto s = bytes_of_all(mem.snapshot(), counts, slots, lens);
      for (const auto& c : caches) s.push_back(bytes_of(c.data[0])), s.push_back(bytes_of(c.data[1]));
      return s;
    }
  } f{mem, counts, slots, lens, caches};

  check_refused(f, "host::plan_select", "workspace",
          [&] { (void)sh::host::plan_select(p, view, model, budget, {ws.data(), one}, sel, {}, 2); });
  check_refused(f, "host::plan_select", "slices",
          [&] { (void)sh::host::plan_select(p, view, model, budget, ws.span(), sel, {}, 0); });
  const auto plan = sh::host::plan_select(p, view, model, budget, ws.span(), sel, {}, 3);
  REQUIRE(plan.units() == B);
  REQUIRE(plan.max_slices() == 3);
  check_refused(f, "host::plan_select", "slice.count", [&] { plan.run({0, 4}); });
  check_refused(f, "host::plan_select", "slice.index", [&] { plan.run({3, 3}); });
  check_refused(f, "host::run_on_threads", "threads", [&] { sh::host::run_on_threads(plan, 4); });
  sh::host::run_on_threads(plan, 3);
  REQUIRE(counts == std::vector<std::int32_t>{2, 0, 0});  // lengths 8, 7, 6: only sequence 0 is at the budget
  REQUIRE(slots[0] < slots[1]);
  // Compact and forget plans refuse slices too, and a bad selection writes nothing.
  const auto compact_plan = sh::host::plan_compact(p, caches[1].view(), model.layer(1), sel);
  check_refused(f, "host::plan_compact", "slice.index", [&] { compact_plan.run({1, 1}); });
  const auto forget_plan = sh::host::plan_forget(p, caches[1].view(), model.layer(1), sel);
  check_refused(f, "host::plan_forget", "slice.count", [&] { forget_plan.run({0, 0}); });
  std::swap(slots[0], slots[1]);  // not ascending
  check_refused(f, "host::plan_compact", "selection.slots",
          [&] { (void)sh::host::plan_compact(p, caches[0].view(), model.layer(0), sel); });
  check_refused(f, "host::plan_forget", "selection.slots",
          [&] { (void)sh::host::plan_forget(p, caches[0].view(), model.layer(0), sel); });
}

TEST_CASE("parallel: plan units are as documented, a slice is a contiguous share of them, empty slices do nothing",
          "[parallel]") {
  constexpr std::int64_t B = 4, H = 2;
  SECTION("observe: one unit per (sequence, KV head), padding slots included") {
    fixture<sh::h2o_policy> f;
    f.next_step();
    const auto plan = sh::host::plan_observe_probabilities(f.policy, f.cache.view(), f.state, f.probability());
    CHECK(plan.units() == B * H);
    // The same step observed from queries, on a state of its own (a state
    // observes a step once).
    fixture<sh::h2o_policy> g;
    g.next_step();
    std::vector<float> q(static_cast<std::size_t>(g.tokens() * g.H * g.G * g.D), 0.25f);
    const auto qv = sh::query_view<float, host>::ragged({q.data(), q.size()}, {g.qo.data(), g.qo.size()}, g.H * g.G, g.D);
    CHECK(sh::host::plan_observe_queries(g.policy, g.cache.view(), g.state, qv).units() == B * H);
  }
  SECTION("a lone slice i of n does a contiguous, balanced share, in slice order") {
    // Which (sequence, head) units slice i of n changed alone, from the
    // scores of an observe plan (every unit adds to every score it holds).
    for (std::int32_t n : {1, 2, 3, 5, 8, 11}) {
      INFO(n << " slices");
      std::int64_t next = 0, smallest = B * H, largest = 0, nonempty = 0;
      for (std::int32_t i = 0; i < n; ++i) {
        INFO("slice " << i);
        fixture<sh::h2o_policy> g(false);
        g.next_step();
        const auto plan = sh::host::plan_observe_probabilities(g.policy, g.cache.view(), g.state, g.probability());
        REQUIRE(plan.units() == B * H);
        const auto before = g.mem.snapshot();
        plan.run({i, n});
        const auto* old_scores = reinterpret_cast<const float*>(before.data() + sh::detail::offsets_of(g.shape).scores);
        std::vector<std::int64_t> changed;
        for (std::int64_t u = 0; u < B * H; ++u) {
          const std::int64_t first = g.state.index(static_cast<std::int32_t>(u / H), static_cast<std::int32_t>(u % H), 0);
          if (std::memcmp(old_scores + first, g.state.scores + first, sizeof(float) * static_cast<std::size_t>(g.C)) != 0)
            changed.push_back(u);
        }
        const auto size = static_cast<std::int64_t>(changed.size());
        if (size > 0) {
          CHECK(changed.front() == next);                     // starts where the slice before ended
          CHECK(changed.back() - changed.front() + 1 == size);  // contiguous
          next = changed.back() + 1;
          ++nonempty;
        }
        smallest = std::min(smallest, size);
        largest = std::max(largest, size);
      }
      CHECK(next == B * H);  // every unit done
      CHECK(largest - smallest <= 1);
      CHECK(nonempty == std::min<std::int64_t>(n, B * H));
    }
  }
  SECTION("compress: (sequence, head) units per_head, sequences for shared_heads, as many slices as its workspace") {
    fixture<sh::h2o_policy> f;
    aligned_bytes ws(sh::host::compress_workspace_bytes(f.cache.view(), f.shape, 4));
    const auto plan = sh::host::plan_compress(f.policy, f.cache.view(), f.state, f.budget, ws.span(), f.cache.output(), 4);
    CHECK(plan.units() == B * H);
    CHECK(plan.max_slices() == 4);
    fixture<at<sh::h2o_policy, sh::shared_heads<>>> g, serial;
    const auto shared = sh::host::plan_compress(g.policy, g.cache.view(), g.state, g.budget, ws.span(), g.cache.output(), 4);
    CHECK(shared.units() == B);
    serial.compress();
    CHECK(serial.snapshot() != g.snapshot());  // the plan alone does not evict: its slices do
    sh::host::run_on_threads(shared, 4);
    CHECK(serial.snapshot() == g.snapshot());
  }
  SECTION("more slices than units: the empty ones change nothing") {
    fixture<sh::scissorhands_policy> g, serial;
    const std::int32_t n = static_cast<std::int32_t>(B * H) + 5;
    aligned_bytes ws(sh::host::compress_workspace_bytes(g.cache.view(), g.shape, n));
    const auto plan = sh::host::plan_compress(g.policy, g.cache.view(), g.state, g.budget, ws.span(), g.cache.output(), n);
    REQUIRE(plan.units() < n);
    for (std::int32_t i = n - 1; i >= 0; --i) plan.run({i, n});
    serial.compress();
    CHECK(serial.snapshot() == g.snapshot());
    // Threads too, on an observe plan: n threads over B * H units.
    fixture<sh::scissorhands_policy> a, b;
    a.next_step();
    b.next_step();
    sh::host::observe_probabilities(a.policy, a.cache.view(), a.state, a.probability());
    sh::host::run_on_threads(sh::host::plan_observe_probabilities(b.policy, b.cache.view(), b.state, b.probability()), n);
    CHECK(a.snapshot() == b.snapshot());
  }
}
