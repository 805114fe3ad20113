// Bad input, one test case per validated condition (docs/errors.md lists
// them all). Every case asserts three things (check_refused, refusal.hpp):
// the call throws scissorhands::invalid_argument, the error names the entry
// point and the argument at fault, and every byte the caller owns (K, V,
// lengths or page table, state, freed_pages) is what it was before the call.
//
// The fixtures hold a real, observed state (not zeroes), so "untouched" is a
// claim about meaningful bytes. Each case is a row of the table at the end:
// most build a fixture, break one argument of a valid call and expect the
// refusal (`refused`, below).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "refusal.hpp"
#include "support.hpp"

namespace {

using namespace sh_test;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

// Deterministic filler.
float value(std::size_t i) { return std::sin(0.37f * static_cast<float>(i) + 0.1f) * 2.0f; }

// Settings for the small fixtures: the paper's r = 10 would protect most
// of their tokens.
sh::settings small_settings() {
  sh::settings s;
  s.recent = 2;
  return s;
}

// What both fixtures share: the policy, K and V, the state, the workspace,
// the outputs, and a valid probability tensor for one decode step.
template <class Policy, class Self>
struct fixture_base {
  Policy policy{};
  std::vector<float> k, v, probs;
  std::vector<std::int32_t> freed, new_lengths;
  std::vector<std::uint64_t> workspace_store;  // 8-byte aligned
  sh::state_shape shape{};
  std::unique_ptr<aligned_bytes> state_mem;
  sh::eviction_state<host> state{};

  // K and V of `elements` each, then the state laid out, reset and
  // observed once: every query head attends uniformly to its sequence's
  // `lengths` tokens.
  void set_up(const sh::settings& s, std::size_t elements, const std::vector<std::int32_t>& lengths) {
    auto& self = static_cast<Self&>(*this);
    policy.config = s;
    k.resize(elements);
    v.resize(elements);
    for (std::size_t i = 0; i < elements; ++i) k[i] = value(i), v[i] = value(i + elements);
    shape = sh::state_shape_for(policy, self.view());
    state_mem = std::make_unique<aligned_bytes>(sh::state_bytes(shape));
    state = sh::make_state(state_mem->span(), shape);
    sh::host::reset_state(state);
    // Dense [batch][q_heads][1][columns].
    const auto columns = static_cast<std::size_t>(Self::columns);
    probs.assign(std::size_t{Self::batch} * Self::q_heads * columns, 0.0f);
    std::size_t row = 0;
    for (const std::int32_t len : lengths)
      for (std::int32_t qh = 0; qh < Self::q_heads; ++qh, ++row)
        for (std::int32_t t = 0; t < len; ++t)
          probs[row * columns + static_cast<std::size_t>(t)] = 1.0f / static_cast<float>(len);
    sh::host::observe_probabilities(policy, self.view(), state, probability());
    workspace_store.assign(sh::host::compress_workspace_bytes(self.view()) / 8 + 1, 0);
    freed.assign(Self::batch, -1);
    new_lengths.assign(Self::batch, -1);
  }
  [[nodiscard]] sh::host_span<std::byte> workspace() {
    return {reinterpret_cast<std::byte*>(workspace_store.data()), workspace_store.size() * 8};
  }
  // Both outputs, at their full size.
  [[nodiscard]] sh::compress_output<host> out() {
    return {{new_lengths.data(), new_lengths.size()}, {freed.data(), freed.size()}};
  }
  [[nodiscard]] sh::probability_view<host> probability() {
    return sh::probability_view<host>::dense({probs.data(), probs.size()}, Self::q_heads, 1, Self::columns);
  }
};

// Contiguous cache: batch 2, 2 KV heads, head_dim 4, capacity 16, NHD,
// lengths {12, 9}, observed once.
template <class Policy = sh::h2o_policy>
struct contiguous_fixture : fixture_base<Policy, contiguous_fixture<Policy>> {
  static constexpr std::int32_t batch = 2, kv_heads = 2, head_dim = 4, capacity = 16, q_heads = 4, columns = capacity,
                                budget = 10;
  std::vector<std::int32_t> lengths{12, 9};

  explicit contiguous_fixture(const sh::settings& s = small_settings()) {
    this->set_up(s, std::size_t{batch} * kv_heads * capacity * head_dim, lengths);
  }
  [[nodiscard]] sh::host_kv_view<float> view() {
    return sh::make_kv_view<float, host>({this->k.data(), this->k.size()}, {this->v.data(), this->v.size()},
                                         {lengths.data(), lengths.size()}, batch, kv_heads, head_dim, capacity,
                                         sh::named_layout::nhd);
  }
  [[nodiscard]] auto snapshot() const {
    return bytes_of_all(this->k, this->v, lengths, this->state_mem->snapshot(), this->freed, this->new_lengths);
  }
  // The engine appends the next step's token to each sequence: what an
  // observe call of one query a sequence needs (each query is a new token).
  void append_one() {
    for (auto& len : lengths) ++len;
  }
};

// Paged cache: batch 2, 2 KV heads, head_dim 4, pages of 4 tokens, a pool
// of 10 pages, at most 4 per sequence; sequence 0 holds pages {7, 2, 5}
// (11 tokens), sequence 1 pages {0, 9} (6 tokens); observed once.
template <class Policy = sh::h2o_policy>
struct paged_fixture : fixture_base<Policy, paged_fixture<Policy>> {
  static constexpr std::int32_t batch = 2, kv_heads = 2, head_dim = 4, page_size = 4, num_pages = 10, max_pages = 4,
                                q_heads = 2, columns = max_pages * page_size, budget = 8;
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{7, 2, 5, 0, 9}, last_page_len{3, 2};

  explicit paged_fixture(const sh::settings& s = small_settings()) {
    this->set_up(s, std::size_t{num_pages} * page_size * kv_heads * head_dim, {11, 6});
  }
  [[nodiscard]] sh::host_paged_kv_view<float> view() {
    return sh::make_paged_kv_view<float, host>({this->k.data(), this->k.size()}, {this->v.data(), this->v.size()},
                                               {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                               {last_page_len.data(), last_page_len.size()}, batch, kv_heads, head_dim,
                                               page_size, num_pages, max_pages);
  }
  [[nodiscard]] auto snapshot() const {
    return bytes_of_all(this->k, this->v, indptr, indices, last_page_len, this->state_mem->snapshot(), this->freed,
                        this->new_lengths);
  }
  // As contiguous_fixture's: both last pages have room for one more token.
  void append_one() {
    for (auto& last : last_page_len) ++last;
  }
};

using contiguous = contiguous_fixture<>;
using windowed = contiguous_fixture<sh::scissorhands_policy>;  // sliding_window: ring_words = 13 at w = 400
using decaying = contiguous_fixture<sh::eviction_policy<sh::attention_mass, sh::exponential_decay>>;
using paged = paged_fixture<>;

// The entry points a case calls.
enum entry { compress, observe, admit, observe_queries };
const char* const function_of[] = {"host::compress", "host::observe_probabilities", "host::admit",
                                   "host::observe_queries"};

// Every argument of a valid call of any entry point on fixture `f`, made
// when the case starts: the case breaks one of them (or f's own data).
template <class F>
struct call_args {
  explicit call_args(F& fixture) : f(fixture) {}
  F& f;
  decltype(f.view()) view = f.view();
  sh::probability_view<host> probs = f.probability();
  sh::eviction_state<host> state = f.state;
  std::int32_t budget = F::budget;
  sh::host_span<std::byte> workspace = f.workspace();
  sh::compress_output<host> out = f.out();
  // One query per sequence, and no LSE (lse_of: a dense natural one of ones).
  std::vector<float> q = std::vector<float>(std::size_t{F::batch} * F::q_heads * F::head_dim, 0.5f);
  std::vector<float> l = std::vector<float>(std::size_t{F::batch} * F::q_heads, 1.0f);
  sh::query_view<float, host> queries =
      sh::query_view<float, host>::dense({q.data(), q.size()}, F::q_heads, 1, F::head_dim);
  sh::lse_view<host> lse{};
  float scale = 0.0f;
  sh::attention_options<host> options{};  // its softmax_scale is `scale`
  std::unique_ptr<aligned_bytes> other_state;

  sh::lse_view<host> lse_of(std::size_t size) const {
    return sh::lse_view<host>::dense({l.data(), size}, F::q_heads, 1, sh::lse_base::natural);
  }
  // The call gets a reset state of f's shape but for one field.
  void use_state(std::int32_t sh::state_shape::*field, std::int32_t value) {
    sh::state_shape s = f.shape;
    s.*field = value;
    other_state = std::make_unique<aligned_bytes>(sh::state_bytes(s));
    state = sh::make_state(other_state->span(), s);
    sh::host::reset_state(state);
  }
  void call(entry e) {
    switch (e) {
      case compress:
        return sh::host::compress(f.policy, view, state, budget, workspace, out);
      case observe:
        return sh::host::observe_probabilities(f.policy, view, state, probs);
      case admit:
        return sh::host::admit(f.policy, view, state);
      case observe_queries: {
        sh::attention_options<host> o = options;
        o.softmax_scale = scale;
        return sh::host::observe_queries(f.policy, view, state, queries, lse, o);
      }
    }
  }
};

// A fixture made with `s`, the call's arguments broken by `breaks`: entry
// point `e` refuses, naming `argument`, and writes nothing.
// An observe call's queries are the step's new tokens: its fixture has
// one appended to each sequence (compress and admit get the fixture as
// observed, every token tracked).
template <class F>
void prepare(F& f, entry e) {
  if (e == observe || e == observe_queries) f.append_one();
}

template <class F = contiguous, class Break>
void refused(entry e, const char* argument, Break&& breaks, const sh::settings& s = small_settings()) {
  F f(s);
  prepare(f, e);
  call_args<F> c(f);
  breaks(c);
  check_refused(f, function_of[e], argument, [&] { c.call(e); });
}

// The same, as a table row's run.
template <class F = contiguous, class Break>
std::function<void()> refusal(entry e, const char* argument, Break breaks, sh::settings s = small_settings()) {
  return [=] { refused<F>(e, argument, breaks, s); };
}

// The contrast: the same kind of change, within the bounds, is accepted.
template <class F = contiguous, class Change>
void accepted(entry e, Change&& change) {
  F f;
  prepare(f, e);
  call_args<F> c(f);
  change(c);
  REQUIRE_NOTHROW(c.call(e));
}

constexpr auto as_made = [](auto&) {};

// The LSE checked against the keys it describes (lse_check). A fresh
// state, so that the call is each row's first observe (a sampled one),
// queries that differ per head, and `describe` sets what the engine's
// kernel did (options, scale, a sink) and the LSE's base; the exact LSE
// of that kernel is then computed here, and `breaks` changes what the
// call is told. `argument` null: the call is accepted.
struct kernel {
  sh::attention_options<host> options{};  // its softmax_scale: 0 is 1/sqrt(head_dim)
  sh::lse_base base = sh::lse_base::natural;
  double sink = -std::numeric_limits<double>::infinity();  // a learned sink's logit: a softmax term outside the cache
};
template <class Break>
void lse_sums(const char* argument, const kernel& k, Break&& breaks) {
  contiguous f;
  prepare(f, observe_queries);
  sh::host::reset_state(f.state);
  call_args<contiguous> c(f);
  for (std::size_t i = 0; i < c.q.size(); ++i) c.q[i] = value(3 * i + 1);
  const std::int32_t group = contiguous::q_heads / contiguous::kv_heads;
  const float scale = k.options.softmax_scale > 0.0f ? k.options.softmax_scale : 0.5f;  // 1/sqrt(4)
  for (std::int32_t b = 0; b < contiguous::batch; ++b) {
    const std::int32_t i = c.view.length(b) - 1;  // the query's slot
    for (std::int32_t qh = 0; qh < contiguous::q_heads; ++qh) {
      double sum = std::exp(k.sink);
      for (std::int32_t t = 0; t <= i; ++t) {
        if (k.options.window_left >= 0 && t < i - k.options.window_left) continue;
        const float* key = c.view.k_row(b, qh / group, t);
        double x = 0.0;
        for (std::int32_t d = 0; d < contiguous::head_dim; ++d)
          x += double{c.q[static_cast<std::size_t>((b * contiguous::q_heads + qh) * contiguous::head_dim + d)]} * key[d];
        x *= scale;
        if (!k.options.alibi_slopes.empty()) x += double{k.options.alibi_slopes[qh]} * (t - i);
        if (k.options.logits_soft_cap > 0.0f) x = k.options.logits_soft_cap * std::tanh(x / k.options.logits_soft_cap);
        sum += std::exp(x);
      }
      const double natural = std::log(sum);
      c.l[static_cast<std::size_t>(b * contiguous::q_heads + qh)] =
          static_cast<float>(k.base == sh::lse_base::base2 ? natural / std::log(2.0) : natural);
    }
  }
  c.lse = sh::lse_view<host>::dense({c.l.data(), c.l.size()}, contiguous::q_heads, 1, k.base);
  c.options = k.options;
  c.scale = k.options.softmax_scale;
  breaks(c);
  if (argument != nullptr)
    check_refused(f, function_of[observe_queries], argument, [&] { c.call(observe_queries); });
  else
    REQUIRE_NOTHROW(c.call(observe_queries));
}
const std::vector<float> alibi_slopes{0.5f, 0.25f, 0.125f, 0.0625f};  // q_heads of them
kernel windowed_kernel() {
  kernel k;
  k.options.window_left = 3;
  return k;
}
kernel capped_kernel() {
  kernel k;
  k.options.softmax_scale = 2.0f;  // logits beyond the cap
  k.options.logits_soft_cap = 3.0f;
  return k;
}
kernel alibi_kernel() {
  kernel k;
  k.options.alibi_slopes = {alibi_slopes.data(), alibi_slopes.size()};
  return k;
}

// shrink_page_table: the engine-side helper rewrites a page table in place.
// Pages of 4: sequence 0 holds 11 tokens on 3 pages, sequence 1 6 on 2.
struct page_table {
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{7, 2, 5, 0, 9}, last_page_len{3, 2}, new_lengths{4, 6},
      released{-1, -1, -1, -1, -1};
  sh::host_span<std::int32_t> into{released.data(), released.size()};  // what the call writes released to
  std::int32_t page_size = 4;

  [[nodiscard]] auto snapshot() const { return bytes_of_all(indptr, indices, last_page_len, new_lengths, released); }
  std::size_t shrink() {
    return sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                       {last_page_len.data(), last_page_len.size()}, page_size,
                                       {new_lengths.data(), new_lengths.size()}, into);
  }
  // The span call both backends share: the count in a shrink_result.
  void shrink_reporting(sh::host_span<sh::shrink_result> result) {
    sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                {last_page_len.data(), last_page_len.size()}, page_size,
                                {new_lengths.data(), new_lengths.size()}, into, result);
  }
};

// A page table as made but for `breaks`: shrink refuses, naming `argument`.
template <class Break>
void shrink_refused(const char* argument, Break&& breaks) {
  page_table t;
  breaks(t);
  check_refused(t, "host::shrink_page_table", argument, [&] { t.shrink(); });
}

// One row a case, laid out by hand (clang-format would split most rows).
// clang-format off
const table_case cases[] = {
  // -------------------------------------------------------------------------
  // Budget and eviction count.
  {"bad input: budget not above the protected tokens",
   refusal(compress, "budget", [](auto& c) { c.budget = 6; }, {.recent = 4, .sinks = 2})},
  {"bad input: budget zero or negative", [] {
     refused(compress, "budget", [](auto& c) { c.budget = 0; });
     refused(compress, "budget", [](auto& c) { c.budget = INT32_MIN; });
   }},
  {"bad input: m above the budget",
   refusal(compress, "settings.evict_count", as_made, {.recent = 2, .evict_count = 11})},
  {"bad input: m above budget minus protected tokens",  // m <= budget 10, m > 10 - r
   refusal(compress, "settings.evict_count", as_made, {.recent = 4, .evict_count = 7})},
  {"bad input: m = 0", [] {
     for (entry e : {compress, observe})
       refused(e, "settings.evict_count", [](auto& c) { c.f.policy.config.evict_count = 0; });
   }},

  // -------------------------------------------------------------------------
  // Settings.
  {"bad input: negative recent window",
   refusal(compress, "settings.recent", [](auto& c) { c.f.policy.config.recent = -1; })},
  {"bad input: negative sink count", refusal(observe, "settings.sinks", [](auto& c) { c.f.policy.config.sinks = -1; })},
  {"bad input: sliding window of zero steps",
   refusal<windowed>(observe, "settings.window", [](auto& c) { c.f.policy.config.window = 0; })},
  {"bad input: threshold alpha NaN or zero or infinite", [] {
     for (float alpha : {nan_f, 0.0f, -1.0f, inf_f})
       refused<windowed>(observe, "settings.alpha", [=](auto& c) { c.f.policy.config.alpha = alpha; });
   }},
  {"bad input: decay not in the half-open unit interval", [] {
     for (float decay : {0.0f, 1.5f, nan_f, -0.5f})
       refused<decaying>(observe, "settings.decay", [=](auto& c) { c.f.policy.config.decay = decay; });
   }},
  {"bad input: unknown compaction mode", refusal(compress, "settings.compaction_mode", [](auto& c) {
     c.f.policy.config.compaction_mode = static_cast<sh::compaction>(7);
   })},
  {"bad input: pooling width even, out of range, or with fill_holes, and an unknown pooling mode", [] {
     for (std::int32_t width : {0, -3, 2, 4, 257, 1001})
       for (entry e : {compress, observe})
         refused(e, "settings.pool_width", [=](auto& c) {
           c.f.policy.config.compaction_mode = sh::compaction::preserve_order;
           c.f.policy.config.pool_width = width;
         });
     refused(compress, "settings.pool_width", [](auto& c) { c.f.policy.config.pool_width = 5; });  // fill_holes
     refused(compress, "settings.pool_mode", [](auto& c) {
       c.f.policy.config.compaction_mode = sh::compaction::preserve_order;
       c.f.policy.config.pool_width = 5;
       c.f.policy.config.pool_mode = static_cast<sh::pooling>(9);
     });
   }},

  // -------------------------------------------------------------------------
  // Zero or mismatched sizes.
  {"bad input: batch 0", refusal(compress, "cache.batch", [](auto& c) { c.view.batch = 0; })},
  {"bad input: kv_heads 0", refusal(observe, "cache.kv_heads", [](auto& c) { c.view.kv_heads = 0; })},
  {"bad input: head_dim 0", refusal(compress, "cache.head_dim", [](auto& c) { c.view.head_dim = 0; })},
  {"bad input: capacity 0", refusal(admit, "cache.capacity", [](auto& c) { c.view.capacity = 0; })},
  {"bad input: lengths span size differs from batch",
   refusal(compress, "cache.lengths", [](auto& c) { c.view.lengths = {c.f.lengths.data(), 1}; })},
  {"bad input: state made for another batch",
   refusal(compress, "state.shape.rows", [](auto& c) { c.use_state(&sh::state_shape::rows, 1); })},
  {"bad input: state made for another head count",
   refusal(observe, "state.shape.kv_heads", [](auto& c) { c.use_state(&sh::state_shape::kv_heads, 1); })},
  {"bad input: state capacity below a sequence's length", [] {
     // The state needs a slot per token held (12 for sequence 0), not the
     // cache's capacity (16): 12 is accepted, 11 refused.
     accepted(admit, [](auto& c) { c.use_state(&sh::state_shape::capacity, 12); });
     refused(admit, "state.shape.capacity", [](auto& c) { c.use_state(&sh::state_shape::capacity, 11); });
   }},
  {"bad input: state made for another policy", [] {
     windowed f;  // its state has a ring, h2o's none
     check_refused(f, "host::compress", "state.shape.ring_words",
                   [&] { sh::host::compress(sh::h2o_policy{}, f.view(), f.state, 10, f.workspace(), f.out()); });
   }},
  {"bad input: state never laid out", refusal(compress, "state", [](auto& c) { c.state = {}; })},
  {"bad input: workspace too small", refusal(compress, "workspace", [](auto& c) {
     c.workspace = {c.workspace.data(), sh::host::compress_workspace_bytes(c.view) - 1};
   })},
  {"bad input: workspace null",
   refusal(compress, "workspace", [](auto& c) { c.workspace = {nullptr, c.workspace.size()}; })},
  {"bad input: workspace misaligned",
   refusal(compress, "workspace", [](auto& c) { c.workspace = {c.workspace.data() + 4, c.workspace.size() - 4}; })},
  {"bad input: freed_pages of the wrong size for a paged cache",
   refusal<paged>(compress, "out.freed_pages", [](auto& c) { c.out.freed_pages = {c.f.freed.data(), 1}; })},
  {"bad input: freed_pages missing for a paged cache",
   refusal<paged>(compress, "out.freed_pages", [](auto& c) { c.out.freed_pages = {}; })},
  {"bad input: freed_pages of the wrong size for a contiguous cache", refusal(compress, "out.freed_pages", [](auto& c) {
     c.f.freed.assign(3, -1);
     c.out = c.f.out();
   })},
  // Regression: this used to pass validation and store through null.
  {"bad input: freed_pages null with a size (contiguous cache)",
   refusal(compress, "out.freed_pages", [](auto& c) { c.out.freed_pages = {nullptr, 2}; }), "[regression]"},
  {"bad input: new_lengths missing, short or null", [] {
     refused(compress, "out.new_lengths", [](auto& c) { c.out = {}; });
     refused(compress, "out.new_lengths", [](auto& c) { c.out = {{c.f.new_lengths.data(), 1}, {}}; });
     refused(compress, "out.new_lengths", [](auto& c) { c.out = {{nullptr, 2}, {}}; });
   }},
  {"bad input: new_lengths overlapping the lengths the view reads", [] {
     // An engine applying lengths in place would make the next layer sharing
     // them read the wrong length: refused, the output is separate.
     refused(compress, "out.new_lengths", [](auto& c) { c.out = {{c.f.lengths.data(), 2}, {}}; });
     refused<paged>(compress, "out.new_lengths",
                    [](auto& c) { c.out = {{c.f.last_page_len.data(), 2}, {c.f.freed.data(), 2}}; });
     refused<paged>(compress, "out.freed_pages",
                    [](auto& c) { c.out = {{c.f.new_lengths.data(), 2}, {c.f.new_lengths.data() + 1, 2}}; });
   }},

  // -------------------------------------------------------------------------
  // Null data with a non-zero length.
  {"bad input: null K data", refusal(compress, "cache.k", [](auto& c) { c.view.k = {nullptr, c.view.k.size()}; })},
  {"bad input: null V data", refusal(compress, "cache.v", [](auto& c) { c.view.v = {nullptr, c.view.v.size()}; })},
  {"bad input: null lengths", refusal(observe, "cache.lengths", [](auto& c) { c.view.lengths = {nullptr, 2}; })},
  {"bad input: null probabilities",
   refusal(observe, "probs.data", [](auto& c) { c.probs.data = {nullptr, c.probs.data.size()}; })},
  {"bad input: null queries",
   refusal(observe_queries, "queries.data", [](auto& c) { c.queries.data = {nullptr, c.q.size()}; })},
  // Regression: this used to be taken for "no lse" silently.
  {"bad input: null lse with a size", refusal(observe_queries, "lse.data", [](auto& c) {
     c.lse = c.lse_of(c.l.size());
     c.lse.data = {nullptr, c.l.size()};
   }), "[regression]"},

  // -------------------------------------------------------------------------
  // Lengths and the state's bookkeeping.
  {"bad input: length above capacity",
   refusal(compress, "cache length", [](auto& c) { c.f.lengths[1] = c.f.capacity + 1; })},
  {"bad input: negative length", refusal(observe, "cache length", [](auto& c) { c.f.lengths[0] = -1; })},
  {"bad input: length below the tokens the state tracks",  // a token removed without compress
   refusal(compress, "cache length", [](auto& c) { c.f.lengths[0] -= 1; })},
  {"bad input: compress before the new tokens were observed",  // appended, not observed
   refusal(compress, "state", [](auto& c) { c.f.lengths[0] += 1; })},
  // The observe-step invariant: each query is a new token (docs/integration.md).
  {"bad input: a layer observed twice in one step", [] {
     contiguous f;
     f.append_one();
     call_args<contiguous> c(f);
     REQUIRE_NOTHROW(c.call(observe));
     check_refused(f, "host::observe_probabilities", "cache length", [&] { c.call(observe); });
     check_refused(f, "host::observe_queries", "cache length", [&] { c.call(observe_queries); });
   }, "[regression]"},
  {"bad input: compress's new lengths not applied before the next step", [] {
     // Compress evicts sequence 0 (12 tokens, budget 10) to 9; the engine
     // keeps its length 12 and appends one: 4 tokens new to the state, one query.
     contiguous f;
     call_args<contiguous> c(f);
     REQUIRE_NOTHROW(c.call(compress));
     REQUIRE(f.new_lengths[0] == 9);
     f.lengths[0] += 1;
     f.lengths[1] = f.new_lengths[1] + 1;
     check_refused(f, "host::observe_probabilities", "cache length", [&] { c.call(observe); });
     f.lengths[0] = f.new_lengths[0] + 1;  // applied: accepted
     REQUIRE_NOTHROW(c.call(observe));
   }, "[regression]"},
  {"bad input: a state row reused for another request without reset_sequence", [] {
     // The new request's 13-token prompt, all 13 queries: its first 12 slots
     // were observed by the row's previous request.
     contiguous f;
     f.lengths[0] = 13;
     call_args<contiguous> c(f);
     const std::vector<std::int32_t> qo{0, 13, 13};
     std::vector<float> probs(std::size_t{13} * contiguous::q_heads * contiguous::columns, 0.0f);
     for (std::size_t j = 0; j < 13; ++j)  // query j sees slots 0..j
       for (std::size_t qh = 0; qh < contiguous::q_heads; ++qh)
         for (std::size_t t = 0; t <= j; ++t)
           probs[(j * contiguous::q_heads + qh) * contiguous::columns + t] = 1.0f / static_cast<float>(j + 1);
     c.probs = sh::probability_view<host>::ragged({probs.data(), probs.size()}, {qo.data(), qo.size()},
                                                  contiguous::q_heads, contiguous::columns);
     check_refused(f, "host::observe_probabilities", "cache length", [&] { c.call(observe); });
     sh::host::reset_sequence(f.state, 0);  // given to the new request: accepted
     REQUIRE_NOTHROW(c.call(observe));
   }, "[regression]"},
  {"bad input: the observe-step exemptions are accepted", [] {
     // Before a row's first query, a prompt may observe its last queries only.
     {
       contiguous f;
       sh::host::reset_sequence(f.state, 0);
       sh::host::reset_sequence(f.state, 1);
       call_args<contiguous> c(f);  // 12 and 9 new tokens, one query each
       REQUIRE_NOTHROW(c.call(observe));
     }
     // Tokens admitted without queries, then observed with them.
     {
       contiguous f;
       f.append_one();
       call_args<contiguous> c(f);
       REQUIRE_NOTHROW(c.call(admit));
       REQUIRE_NOTHROW(c.call(observe));
     }
     // A sequence with no query this step (paused) is only admitted.
     {
       contiguous f;
       f.append_one();
       call_args<contiguous> c(f);
       const std::vector<std::int32_t> qo{0, 0, 1};
       c.probs = sh::probability_view<host>::ragged({f.probs.data(), f.probs.size()}, {qo.data(), qo.size()},
                                                    contiguous::q_heads, contiguous::columns);
       REQUIRE_NOTHROW(c.call(observe));
       CHECK(f.state.tracked[0] == 13);
     }
   }},
  {"bad input: negative tracked count", refusal(observe, "cache length", [](auto& c) { c.state.tracked[1] = -1; })},
  {"bad input: damaged next_position",
   refusal(admit, "state.next_position", [](auto& c) { c.state.next_position[1] = -5; })},
  {"bad input: next_position leaves no room for the new tokens", refusal(admit, "state.next_position", [](auto& c) {
     c.state.next_position[0] = INT32_MAX - 1;
     c.f.lengths[0] += 3;  // three new tokens need positions INT32_MAX - 1 .. INT32_MAX + 1
   })},
  // Regression: a negative step used to index the sliding window's ring
  // before its start (out-of-bounds write).
  {"bad input: negative state.step",
   refusal<windowed>(observe, "state.step", [](auto& c) { c.state.step[0] = -1; }), "[regression]"},
  // Regression: step + q_len used to overflow int64.
  {"bad input: state.step about to overflow",
   refusal(observe, "state.step", [](auto& c) { c.state.step[1] = INT64_MAX; }), "[regression]"},
  {"bad input: positions not unique leave too few tokens to evict", refusal(compress, "state.positions", [](auto& c) {
     // Every slot of sequence 0, head 0 claims the newest position: all protected.
     const std::int32_t newest = c.state.next_position[0] - 1;
     for (std::int32_t t = 0; t < c.f.lengths[0]; ++t) c.state.positions[c.state.index(0, 0, t)] = newest;
   })},

  // -------------------------------------------------------------------------
  // Probabilities and queries.
  {"bad input: NaN probability", refusal(observe, "probs", [](auto& c) { c.f.probs[3] = nan_f; })},
  {"bad input: negative probability",
   refusal(observe, "probs", [](auto& c) { c.f.probs[c.f.capacity + 2] = -0.25f; })},
  {"bad input: infinite or above-one probability", [] {
     for (float x : {inf_f, 1.5f}) refused(observe, "probs", [=](auto& c) { c.f.probs[0] = x; });
   }},
  {"bad input: the probability bounds on the bits (-0 and 1.001 pass, their neighbours fail)", [] {
     // The check runs on the float's bits: pin its edges.
     for (float x : {-0.0f, 0.0f, std::numeric_limits<float>::denorm_min(), 1.001f}) {
       INFO("probability " << x);
       accepted(observe, [=](auto& c) { c.f.probs[1] = x; });
     }
     for (float x : {-std::numeric_limits<float>::denorm_min(), std::nextafter(1.001f, 2.0f), -nan_f, -inf_f}) {
       INFO("probability " << x);
       refused(observe, "probs", [=](auto& c) { c.f.probs[1] = x; });
     }
   }},
  // The contrast case: NaN where no query looks is fine (sequence 0 has 12
  // tokens: column 15 is not visible).
  {"bad input: probabilities past the visible columns are not read",
   [] { accepted(observe, [](auto& c) { c.f.probs[c.f.capacity - 1] = nan_f; }); }},
  {"bad input: GQA group size that does not divide the query heads",  // 2 KV heads
   refusal(observe, "q_heads", [](auto& c) { c.probs.q_heads = 3; })},
  {"bad input: GQA group above the supported size",
   refusal(observe, "q_heads", [](auto& c) { c.probs.q_heads = c.f.kv_heads * (sh::host::max_group_size + 1); })},
  {"bad input: no query heads", refusal(observe, "q_heads", [](auto& c) { c.probs.q_heads = 0; })},
  {"bad input: q_len above a sequence's length",  // sequence 1 holds 10 tokens (9 and the step's)
   refusal(observe, "q_len", [](auto& c) { c.probs.q_len = 11; })},
  {"bad input: q_len negative", refusal(observe, "q_len", [](auto& c) { c.probs.q_len = -1; })},
  {"bad input: probability buffer too small for its strides", [] {
     // Rows need the longest length (13: 12 and the step's token) of
     // columns, not the full capacity (16): cutting the last 3 padding
     // columns is fine, the 4th is not.
     const auto cut = [](auto& c, std::size_t n) { c.probs.data = {c.probs.data.data(), c.probs.data.size() - n}; };
     accepted(observe, [&](auto& c) { cut(c, c.f.capacity - 13); });
     refused(observe, "probs.data", [&](auto& c) { cut(c, c.f.capacity - 13 + 1); });
   }},
  {"bad input: negative probability stride",
   refusal(observe, "probs strides", [](auto& c) { c.probs.head_stride = -1; })},
  {"bad input: queries of another head_dim", refusal(observe_queries, "queries.head_dim", [](auto& c) {
     c.q.assign(static_cast<std::size_t>(c.f.batch * c.f.q_heads * 8), 0.5f);
     c.queries = sh::query_view<float, host>::dense({c.q.data(), c.q.size()}, c.f.q_heads, 1, 8);
   })},
  {"bad input: query buffer too small",
   refusal(observe_queries, "queries.data", [](auto& c) { c.queries.data = {c.q.data(), c.q.size() - 1}; })},
  {"bad input: negative query stride",
   refusal(observe_queries, "queries strides", [](auto& c) { c.queries.query_stride = -c.queries.query_stride; })},
  {"bad input: negative lse stride", refusal(observe_queries, "lse strides", [](auto& c) {
     c.lse = c.lse_of(c.l.size());
     c.lse.head_stride = -1;
   })},
  // The base is the engine's to name: a view built without one (aggregate
  // initialised, or a bridge lse with the default) is refused, never read as
  // natural, whatever the factory used to assume.
  {"bad input: lse base not named", [] {
     for (auto base : {sh::lse_base::unspecified, static_cast<sh::lse_base>(7)})
       refused(observe_queries, "lse.base", [=](auto& c) {
         c.lse = c.lse_of(c.l.size());
         c.lse.base = base;
       });
     CHECK(sh::lse_view<host>{}.base == sh::lse_base::unspecified);
   }},
  {"bad input: softmax scale NaN or negative", [] {
     for (float scale : {nan_f, -1.0f, inf_f})
       refused(observe_queries, "softmax_scale", [=](auto& c) { c.scale = scale; });
   }},
  {"bad input: non-finite lse", refusal(observe_queries, "lse", [](auto& c) {
     c.l[5] = nan_f;
     c.lse = c.lse_of(c.l.size());
   })},
  {"bad input: lse buffer too small",
   refusal(observe_queries, "lse.data", [](auto& c) { c.lse = c.lse_of(c.l.size() - 1); })},
  // The LSE's sums (lse_check): an attention described wrongly.
  {"bad input: lse sums, the exact lse of every kernel is accepted", [] {
     for (const auto& k : {kernel{}, windowed_kernel(), capped_kernel(), alibi_kernel()})
       for (auto base : {sh::lse_base::natural, sh::lse_base::base2}) {
         kernel named = k;
         named.base = base;
         lse_sums(nullptr, named, as_made);
       }
   }},
  {"bad input: lse sums, a natural lse named base 2 or the reverse", [] {
     lse_sums("lse", kernel{}, [](auto& c) { c.lse.base = sh::lse_base::base2; });
     lse_sums("lse", kernel{{}, sh::lse_base::base2}, [](auto& c) { c.lse.base = sh::lse_base::natural; });
   }},
  {"bad input: lse sums, softmax_scale not the kernel's",
   [] { lse_sums("lse", kernel{}, [](auto& c) { c.scale = 0.25f; }); }},
  {"bad input: lse sums, attention options left out", [] {
     for (const auto& k : {windowed_kernel(), capped_kernel(), alibi_kernel()})
       lse_sums("lse", k, [](auto& c) { c.options = {}; });  // the scale stays the kernel's
   }},
  {"bad input: lse sums, a window in positions passed as slots' or the reverse is not told apart without holes",
   [] {
     // Without eviction positions follow slots: both units see the same keys.
     lse_sums(nullptr, windowed_kernel(), [](auto& c) { c.options.window_left_unit = sh::window_unit::positions; });
   }},
  {"bad input: lse sums, query heads in another order than the data's", [] {
     lse_sums("lse", kernel{}, [](auto& c) {
       for (std::int32_t b = 0; b < contiguous::batch; ++b)  // heads 0 and 1 swapped
         std::swap(c.l[static_cast<std::size_t>(b * contiguous::q_heads)],
                   c.l[static_cast<std::size_t>(b * contiguous::q_heads + 1)]);
     });
   }},
  {"bad input: lse sums, attention sinks need at_most_one", [] {
     kernel sinks;
     sinks.sink = 3.0;  // most of the mass goes to the sink
     lse_sums("lse", sinks, as_made);
     lse_sums(nullptr, sinks, [](auto& c) { c.lse.check = sh::lse_check::at_most_one; });
     // at_most_one still refuses sums above 1 (a base named wrong the other way).
     lse_sums("lse", kernel{}, [](auto& c) {
       c.lse.base = sh::lse_base::base2;
       c.lse.check = sh::lse_check::at_most_one;
     });
   }},
  {"bad input: lse sums, none turns the check off", [] {
     lse_sums(nullptr, kernel{}, [](auto& c) {
       c.lse.base = sh::lse_base::base2;
       c.lse.check = sh::lse_check::none;
     });
   }},
  {"bad input: lse check not a named value", [] {
     lse_sums("lse.check", kernel{}, [](auto& c) { c.lse.check = static_cast<sh::lse_check>(5); });
     CHECK(sh::lse_view<host>{}.check == sh::lse_check::sums_to_one);
   }},
  {"bad input: lse sums are sampled, a row's first observe and each 256th query", [] {
     // The fixture's rows have observed one step: a wrong base is not
     // looked at until a call crosses query 256 of the row.
     contiguous f;
     for (std::int32_t step = 1; step <= 255; ++step) {  // the queries the rows observed before the call
       if (f.lengths[0] == contiguous::capacity) {  // keep within the cache
         sh::host::compress(f.policy, f.view(), f.state, contiguous::budget, f.workspace(), f.out());
         f.lengths.assign(f.new_lengths.begin(), f.new_lengths.end());
       }
       f.append_one();
       call_args<contiguous> c(f);
       c.lse = c.lse_of(c.l.size());  // ones: far from the sums' 1
       if (step < 255) {
         REQUIRE_NOTHROW(c.call(observe_queries));
       } else {
         // Query 256 of the rows crosses the interval: refused.
         check_refused(f, function_of[observe_queries], "lse", [&] { c.call(observe_queries); });
       }
     }
   }},

  // -------------------------------------------------------------------------
  // Layouts and buffers.
  {"bad input: overlapping strides (token stride 0)",
   refusal(compress, "cache.k_layout", [](auto& c) { c.view.k_layout.token_stride = 0; })},
  {"bad input: overlapping strides (head stride below head_dim)",
   refusal(compress, "cache.v_layout", [](auto& c) { c.view.v_layout.head_stride = c.f.head_dim - 1; })},
  {"bad input: negative stride",
   refusal(observe, "cache.k_layout", [](auto& c) { c.view.k_layout.sequence_stride *= -1; })},
  {"bad input: K buffer too small for its layout",
   refusal(compress, "cache.k", [](auto& c) { c.view.k = {c.view.k.data(), c.view.k.size() - 1}; })},
  {"bad input: V buffer too small for its layout", refusal(compress, "cache.v", [](auto& c) {
     c.view.v_layout = sh::kv_layout::hnd(c.f.capacity + 1, c.f.kv_heads, c.f.head_dim);  // one slot more per head
   })},
  {"bad input: strides whose offsets pass 2^62",
   refusal(compress, "cache.k", [](auto& c) { c.view.k_layout.sequence_stride = std::int64_t{1} << 62; })},
  {"bad input: V aliasing K", refusal(compress, "cache.v", [](auto& c) { c.view.v = c.view.k; })},

  // -------------------------------------------------------------------------
  // Paged caches (as made: indptr {0, 3, 5}, indices {7, 2, 5, 0, 9},
  // last_page_len {3, 2}).
  {"bad input: paged indptr not starting at 0",
   refusal<paged>(compress, "cache.indptr", [](auto& c) { c.f.indptr[0] = 1; })},
  {"bad input: paged indptr decreasing", refusal<paged>(observe, "cache.indptr", [](auto& c) {
     c.f.indptr[2] = 2;
     c.f.last_page_len[1] = 0;
   })},
  // Regression: indptr[2] - indptr[1] used to overflow int32 (UB) first.
  {"bad input: paged indptr far below its predecessor",
   refusal<paged>(compress, "cache.indptr", [](auto& c) { c.f.indptr[2] = INT32_MIN; }), "[regression]"},
  {"bad input: paged indptr of the wrong size",
   refusal<paged>(compress, "cache.indptr", [](auto& c) { c.view.indptr = {c.f.indptr.data(), 2}; })},
  // Regression: the message's batch + 1 used to overflow int32 (UB).
  {"bad input: paged batch at INT32_MAX",
   refusal<paged>(compress, "cache.indptr", [](auto& c) { c.view.batch = INT32_MAX; }), "[regression]"},
  {"bad input: paged sequence with more pages than allowed",  // sequence 0 lists 3
   refusal<paged>(observe, "cache.indptr", [](auto& c) { c.view.max_pages_per_sequence = 2; })},
  // Regression: max_capacity() used to overflow int32 (UB) when computing
  // the workspace size before validation.
  {"bad input: paged max_pages_per_sequence times page_size above int32",
   refusal<paged>(compress, "cache.max_pages_per_sequence", [](auto& c) {
     c.view.max_pages_per_sequence = INT32_MAX / 2;
     (void)sh::host::compress_workspace_bytes(c.view);  // must not overflow
   }), "[regression]"},
  {"bad input: paged last_page_len 0 for a sequence with pages",
   refusal<paged>(compress, "cache.last_page_len", [](auto& c) { c.f.last_page_len[0] = 0; })},
  {"bad input: paged last_page_len above page_size",
   refusal<paged>(compress, "cache.last_page_len", [](auto& c) { c.f.last_page_len[1] = c.f.page_size + 1; })},
  {"bad input: paged last_page_len for a sequence without pages",
   refusal<paged>(admit, "cache.last_page_len", [](auto& c) {
     c.f.indptr[2] = 3;
     c.f.last_page_len[1] = 1;
   })},
  {"bad input: paged last_page_len of the wrong size",
   refusal<paged>(compress, "cache.last_page_len",
                  [](auto& c) { c.view.last_page_len = {c.f.last_page_len.data(), 1}; })},
  {"bad input: paged page id outside the pool",
   refusal<paged>(compress, "cache.indices", [](auto& c) { c.f.indices[3] = c.f.num_pages; })},
  {"bad input: paged negative page id", refusal<paged>(observe, "cache.indices", [](auto& c) { c.f.indices[1] = -1; })},
  {"bad input: paged indices shorter than the last indptr entry",
   refusal<paged>(compress, "cache.indices", [](auto& c) { c.view.indices = {c.f.indices.data(), 4}; })},
  {"bad input: paged null indices",
   refusal<paged>(compress, "cache.indices", [](auto& c) { c.view.indices = {nullptr, 5}; })},
  // Regression: compress used to compact sequence 0 in place, moving rows of
  // page 2 under sequence 1, which lists it too.
  {"bad input: paged page shared with a sequence compress rewrites",
   refusal<paged>(compress, "cache.indices", [](auto& c) { c.f.indices[3] = 2; }), "[regression]"},
  {"bad input: paged page listed twice by the sequence compress rewrites",
   refusal<paged>(compress, "cache.indices", [](auto& c) { c.f.indices[2] = 7; })},
  {"bad input: paged shared pages are fine where compress does not write", [] {
     // The contrast cases: observe only reads, and a budget no sequence
     // reaches leaves every page alone.
     paged f;
     f.indices[3] = 2;
     f.append_one();
     call_args<paged> c(f);
     REQUIRE_NOTHROW(c.call(observe));
     c.budget = 13;
     REQUIRE_NOTHROW(c.call(compress));
     CHECK(f.freed == std::vector<std::int32_t>{0, 0});
   }},
  {"bad input: paged batch or heads or head_dim zero", [] {
     refused<paged>(compress, "cache.batch", [](auto& c) { c.view.batch = 0; });
     refused<paged>(compress, "cache.kv_heads", [](auto& c) { c.view.kv_heads = 0; });
     refused<paged>(observe, "cache.head_dim", [](auto& c) { c.view.head_dim = 0; });
   }},
  {"bad input: paged null indptr or last_page_len", [] {
     refused<paged>(compress, "cache.indptr", [](auto& c) { c.view.indptr = {nullptr, 3}; });
     refused<paged>(compress, "cache.last_page_len", [](auto& c) { c.view.last_page_len = {nullptr, 2}; });
   }},
  {"bad input: paged V pool aliasing the K pool",
   refusal<paged>(compress, "cache.v_pages", [](auto& c) { c.view.v_pages = c.view.k_pages; })},
  {"bad input: paged negative stride",
   refusal<paged>(compress, "cache.v_layout", [](auto& c) { c.view.v_layout.head_stride = -4; })},
  {"bad input: paged null K pool",
   refusal<paged>(compress, "cache.k_pages", [](auto& c) { c.view.k_pages = {nullptr, c.view.k_pages.size()}; })},
  {"bad input: paged V pool too small", refusal<paged>(compress, "cache.v_pages", [](auto& c) {
     c.view.v_pages = {c.view.v_pages.data(), c.view.v_pages.size() - 1};
   })},
  {"bad input: paged overlapping page layout", refusal<paged>(compress, "cache.k_layout", [](auto& c) {
     c.view.k_layout.page_stride = c.view.k_layout.token_stride;  // pages overlap their neighbours' tokens
   })},
  {"bad input: paged page_size 0 and num_pages 0", [] {
     refused<paged>(compress, "cache.page_size", [](auto& c) { c.view.page_size = 0; });
     refused<paged>(compress, "cache.num_pages", [](auto& c) { c.view.num_pages = 0; });
   }},

  // -------------------------------------------------------------------------
  // State set-up and lifetime.
  {"bad input: state_bytes of an empty shape", [] {
     contiguous f;
     sh::state_shape s = f.shape;
     s.rows = 0;
     check_refused(f, "state_bytes", "shape.rows", [&] { (void)sh::state_bytes(s); });
     s = f.shape;
     s.ring_words = -1;
     check_refused(f, "state_bytes", "shape.ring_words", [&] { (void)sh::state_bytes(s); });
   }},
  {"bad input: state_bytes of a shape beyond addressable memory", [] {
     contiguous f;
     const sh::state_shape s{INT32_MAX, INT32_MAX, INT32_MAX, 0};
     check_refused(f, "state_bytes", "shape", [&] { (void)sh::state_bytes(s); });
   }},
  // Regression: ring_words computed window + 31 in int32 (UB).
  {"bad input: window near INT32_MAX sizes its ring without overflow", [] {
     sh::scissorhands_policy p;
     p.config.window = INT32_MAX;
     CHECK(p.ring_words() == (std::int64_t{INT32_MAX} + 31) / 32);
     p.config.window = INT32_MAX - 5;
     CHECK(p.ring_words() == (std::int64_t{INT32_MAX} - 5 + 31) / 32);
   }, "[regression]"},
  {"bad input: make_state with a short buffer", [] {
     contiguous f;
     aligned_bytes mem(sh::state_bytes(f.shape));
     check_refused(f, "make_state", "buffer",
                   [&] { (void)sh::make_state(sh::host_span<std::byte>(mem.data(), mem.size() - 1), f.shape); });
   }},
  {"bad input: make_state with a misaligned buffer", [] {
     contiguous f;
     aligned_bytes mem(sh::state_bytes(f.shape) + 256);
     check_refused(f, "make_state", "buffer",
                   [&] { (void)sh::make_state(sh::host_span<std::byte>(mem.data() + 16, mem.size() - 16), f.shape); });
   }},
  {"bad input: make_state with a null buffer", [] {
     contiguous f;
     check_refused(f, "make_state", "buffer",
                   [&] { (void)sh::make_state(sh::host_span<std::byte>(nullptr, 1 << 20), f.shape); });
   }},
  {"bad input: reset_sequence out of the batch", [] {
     contiguous f;
     for (std::int32_t row : {2, -1})
       check_refused(f, "host::reset_sequence", "row", [&] { sh::host::reset_sequence(f.state, row); });
   }},
  {"bad input: reset_sequence at a negative start position", [] {
     contiguous f;
     check_refused(f, "host::reset_sequence", "start_position", [&] { sh::host::reset_sequence(f.state, 0, -3); });
   }},
  {"bad input: reset_state of a state never laid out", [] {
     contiguous f;
     check_refused(f, "host::reset_state", "state", [&] { sh::host::reset_state(sh::eviction_state<host>{}); });
   }},

  // -------------------------------------------------------------------------
  // shrink_page_table (as made: pages of 4, indptr {0, 3, 5}, 11 and 6 tokens).
  // Regression (as release_freed_pages): it used to read indices[-2] (heap-buffer-overflow).
  {"bad input: shrink_page_table with a negative indptr start",
   [] { shrink_refused("indptr", [](page_table& t) { t.indptr = {-2, 1, 3}; }); }, "[regression]"},
  // The span call both backends share: the count in a shrink_result, whose
  // span must hold one entry (refused before the table is touched).
  {"shrink_page_table's one-API call reports through a shrink_result", [] {
     page_table t;
     check_refused(t, "host::shrink_page_table", "result", [&] { t.shrink_reporting({}); });
     sh::shrink_result result{-1, 9};
     t.shrink_reporting({&result, 1});
     CHECK(result.released == 2);  // 11 -> 4 tokens: 3 pages -> 1
     CHECK(result.status == 0);
     CHECK(t.released[0] == 2);
     CHECK(t.released[1] == 5);
   }},
  {"bad input: shrink_page_table with a decreasing indptr",
   [] { shrink_refused("indptr", [](page_table& t) { t.indptr = {0, 3, INT32_MIN}; }); }},
  {"bad input: shrink_page_table growing a sequence or a negative length", [] {
     shrink_refused("new_lengths", [](page_table& t) { t.new_lengths = {12, 6}; });  // the table holds 11
     shrink_refused("new_lengths", [](page_table& t) { t.new_lengths = {-1, 6}; });
   }},
  {"bad input: shrink_page_table with new_lengths or last_page_len of the wrong size", [] {
     shrink_refused("new_lengths", [](page_table& t) { t.new_lengths = {4}; });
     shrink_refused("last_page_len", [](page_table& t) { t.last_page_len = {3}; });
   }},
  {"bad input: shrink_page_table with a bad last_page_len or page_size", [] {
     shrink_refused("last_page_len", [](page_table& t) { t.last_page_len = {5, 2}; });
     shrink_refused("page_size", [](page_table& t) { t.page_size = 0; });
   }},
  {"bad input: shrink_page_table into a short or null released", [] {
     for (bool null : {false, true})
       shrink_refused("released", [=](page_table& t) {
         t.new_lengths = {1, 0};  // releases 2 + 2 pages
         t.into = null ? sh::host_span<std::int32_t>{nullptr, 5} : sh::host_span<std::int32_t>{t.released.data(), 3};
       });
   }},
  {"bad input: shrink_page_table with null indices", [] {
     page_table t;
     check_refused(t, "host::shrink_page_table", "indices", [&] {
       sh::host::shrink_page_table({t.indptr.data(), 3}, {nullptr, 5}, {t.last_page_len.data(), 2}, 4,
                                   {t.new_lengths.data(), 2}, {t.released.data(), 5});
     });
   }},
  {"bad input: shrink_page_table with an empty indptr", [] {
     page_table t;
     check_refused(t, "host::shrink_page_table", "indptr",
                   [&] { sh::host::shrink_page_table({}, {t.indices.data(), 5}, {}, 4, {}, {t.released.data(), 5}); });
   }},

  // -------------------------------------------------------------------------
  // Budget allocators (set-up time): nothing of the caller's to write.
  {"bad input: total budget per head not positive", [] {
     check_refused("total_budget::tokens_per_head", "per_layer", [] { (void)sh::total_budget::tokens_per_head(0, 4); });
     check_refused("total_budget::tokens_per_head", "num_layers",
                   [] { (void)sh::total_budget::tokens_per_head(10, 0); });
   }},
  {"bad input: compression ratio not in the half-open unit interval", [] {
     for (double r : {0.0, 1.5, std::nan("")})
       check_refused("total_budget::compression_ratio", "ratio",
                     [&] { (void)sh::total_budget::compression_ratio(r, 100, 4); });
   }},
  {"bad input: total budget below one token per layer",
   [] { check_refused("uniform_budget::allocate", "total", [] { (void)sh::uniform_budget{}.allocate(3, 4); }); }},
  {"bad input: compression ratio of an empty model or context", [] {
     check_refused("total_budget::compression_ratio", "max_sequence_length",
                   [] { (void)sh::total_budget::compression_ratio(0.5, 0, 4); });
     check_refused("total_budget::compression_ratio", "num_layers",
                   [] { (void)sh::total_budget::compression_ratio(0.5, 100, 0); });
   }},
  {"bad input: allocation over no layers or beyond int32 per layer", [] {
     check_refused("uniform_budget::allocate", "num_layers", [] { (void)sh::uniform_budget{}.allocate(100, 0); });
     check_refused("uniform_budget::allocate", "total",
                   [] { (void)sh::uniform_budget{}.allocate(std::int64_t{INT32_MAX} * 4 + 8, 2); });
   }},
  {"bad input: ramp slope not below 1",
   [] { check_refused("ramp_budget::allocate", "slope", [] { (void)sh::ramp_budget{1.0}.allocate(100, 4); }); }},
  {"bad input: explicit budgets of the wrong count or sum", [] {
     check_refused("explicit_budget::allocate", "budgets", [] { (void)sh::explicit_budget{{10, 20}}.allocate(30, 3); });
     check_refused("explicit_budget::allocate", "total", [] { (void)sh::explicit_budget{{10, 20}}.allocate(31, 2); });
     check_refused("explicit_budget::allocate", "budgets", [] { (void)sh::explicit_budget{{10, 0}}.allocate(10, 2); });
   }},
  {"bad input: persistence floor not in the half-open unit interval", [] {
     check_refused("persistence_budget::allocate", "floor",
                   [] { (void)sh::persistence_budget{{0.5, 0.9}, 0.0}.allocate(100, 2); });
     check_refused("persistence_budget::allocate", "persistence",
                   [] { (void)sh::persistence_budget{{0.5}, 0.1}.allocate(100, 2); });
   }},
  // model_state::layer(l): a layer past the model points past its buffer.
  {"bad input: model_state::layer below 0 or at layers and above", [] {
     const sh::state_shape shape{2, 2, 16, 0};
     aligned_bytes mem(sh::model_state_bytes(shape, 3));
     const auto model = sh::make_model_state(mem.span(), shape, 3);
     for (std::int32_t l : {3, -1, INT32_MAX})
       check_refused("model_state::layer", "l", [&] { (void)model.layer(l); });
     CHECK(model.layer(2).step == model.layer(0).step + 2 * model.layer_bytes / sizeof(std::int64_t));
   }, "[regression]"},
  {"bad input: shrink_page_table takes the page size from the view", [] {
     // The same table through the view and through its arrays with the
     // view's page size: the same bytes and the same pages released.
     paged f;
     page_table t;
     f.indptr = t.indptr, f.indices = t.indices, f.last_page_len = t.last_page_len;
     std::vector<std::int32_t> released(5, -1);
     const std::size_t n = sh::host::shrink_page_table(f.view(), {t.new_lengths.data(), t.new_lengths.size()},
                                                       {released.data(), released.size()});
     CHECK(t.shrink() == n);
     CHECK(n == 2);  // 11 -> 4 tokens leaves 1 of 3 pages of 4; 6 -> 6 keeps both
     CHECK((f.indptr == t.indptr && f.indices == t.indices && f.last_page_len == t.last_page_len));
     CHECK(released == t.released);
   }},
  {"bad input: persistence ratio above 1", [] {
     check_refused("persistence_budget::allocate", "persistence",
                   [] { (void)sh::persistence_budget{{0.5, 1.2}}.allocate(100, 2); });
   }},
};
// clang-format on

const bool registered = register_cases(__FILE__, __LINE__, "[bad_input]", cases);

}  // namespace
