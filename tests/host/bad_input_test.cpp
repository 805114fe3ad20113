// Bad input, one test case per validated condition (docs/errors.md lists
// them all). Every case asserts three things: the call throws
// scissorhands::invalid_argument, the error names the entry point and the
// argument at fault, and every byte the caller owns (K, V, lengths or page
// table, state, freed_pages) is what it was before the call.
//
// The fixtures hold a real, observed state (not zeroes), so "untouched" is a
// claim about meaningful bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace {

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

template <class T>
std::vector<std::uint8_t> bytes_of(const T* p, std::size_t n) {
  std::vector<std::uint8_t> out(n * sizeof(T));
  if (n != 0) std::memcpy(out.data(), p, out.size());
  return out;
}

// The state buffer: 256-byte aligned, as make_state requires.
struct state_buffer {
  std::byte* data = nullptr;
  std::size_t size = 0;
  explicit state_buffer(std::size_t n)
      : data(static_cast<std::byte*>(::operator new(n, std::align_val_t{256}))), size(n) {}
  state_buffer(const state_buffer&) = delete;
  state_buffer& operator=(const state_buffer&) = delete;
  ~state_buffer() { ::operator delete(data, std::align_val_t{256}); }
};

// Deterministic filler.
float value(std::size_t i) { return std::sin(0.37f * static_cast<float>(i) + 0.1f) * 2.0f; }

// Settings for the small fixtures: the paper's r = 10 would protect most
// of their tokens.
sh::settings small_settings() {
  sh::settings s;
  s.recent = 2;
  return s;
}

// What both fixtures share: the policy, the state, the workspace, and a
// valid probability tensor for one decode step.
template <class Policy>
struct fixture_base {
  Policy policy{};
  std::vector<std::int32_t> freed;
  std::vector<std::int32_t> new_lengths;
  std::vector<std::uint64_t> workspace_store;  // 8-byte aligned
  std::vector<float> probs;
  sh::state_shape shape{};
  state_buffer* state_mem = nullptr;
  sh::eviction_state<host> state{};

  [[nodiscard]] sh::host_span<std::byte> workspace() {
    return {reinterpret_cast<std::byte*>(workspace_store.data()), workspace_store.size() * 8};
  }
  void make_workspace(std::size_t bytes) { workspace_store.assign(bytes / 8 + 1, 0); }
  [[nodiscard]] sh::host_span<std::int32_t> new_span() { return {new_lengths.data(), new_lengths.size()}; }
  // Both outputs, at their full size.
  [[nodiscard]] sh::compress_output<host> out() { return {new_span(), {freed.data(), freed.size()}}; }
  [[nodiscard]] std::vector<std::uint8_t> state_bytes() const { return bytes_of(state_mem->data, state_mem->size); }
};

// Contiguous cache: batch 2, 2 KV heads, head_dim 4, capacity 16, NHD,
// lengths {12, 9}, observed once.
template <class Policy = sh::h2o_policy>
struct contiguous_fixture : fixture_base<Policy> {
  static constexpr std::int32_t batch = 2, kv_heads = 2, head_dim = 4, capacity = 16, q_heads = 4;
  std::vector<float> k, v;
  std::vector<std::int32_t> lengths{12, 9};
  std::unique_ptr<state_buffer> owned;

  explicit contiguous_fixture(const sh::settings& s = small_settings()) {
    this->policy.config = s;
    const std::size_t n = std::size_t{batch} * kv_heads * capacity * head_dim;
    k.resize(n);
    v.resize(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = value(i), v[i] = value(i + n);
    this->shape = sh::state_shape_for(this->policy, view());
    owned = std::make_unique<state_buffer>(sh::state_bytes(this->shape));
    this->state_mem = owned.get();
    this->state = sh::make_state(sh::host_span<std::byte>(owned->data, owned->size), this->shape);
    sh::host::reset_state(this->state);
    // Dense [batch][q_heads][1][capacity]: uniform over each sequence's tokens.
    this->probs.assign(std::size_t{batch} * q_heads * capacity, 0.0f);
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t qh = 0; qh < q_heads; ++qh)
        for (std::int32_t t = 0; t < lengths[static_cast<std::size_t>(b)]; ++t)
          this->probs[(static_cast<std::size_t>(b) * q_heads + static_cast<std::size_t>(qh)) * capacity +
                      static_cast<std::size_t>(t)] = 1.0f / static_cast<float>(lengths[static_cast<std::size_t>(b)]);
    sh::host::observe_probabilities(this->policy, view(), this->state, probability());
    this->make_workspace(sh::host::compress_workspace_bytes(view()));
    this->freed.assign(batch, -1);
    this->new_lengths.assign(batch, -1);
  }

  [[nodiscard]] sh::host_kv_view<float> view() {
    return sh::make_kv_view<float, host>({k.data(), k.size()}, {v.data(), v.size()}, {lengths.data(), lengths.size()},
                                         batch, kv_heads, head_dim, capacity, sh::named_layout::nhd);
  }
  [[nodiscard]] sh::probability_view<host> probability() {
    return sh::probability_view<host>::dense({this->probs.data(), this->probs.size()}, q_heads, 1, capacity);
  }
  [[nodiscard]] std::vector<std::vector<std::uint8_t>> bytes() const {
    return {bytes_of(k.data(), k.size()), bytes_of(v.data(), v.size()), bytes_of(lengths.data(), lengths.size()),
            this->state_bytes(), bytes_of(this->freed.data(), this->freed.size()),
            bytes_of(this->new_lengths.data(), this->new_lengths.size())};
  }
};

// Paged cache: batch 2, 2 KV heads, head_dim 4, pages of 4 tokens, a pool
// of 10 pages, at most 4 per sequence; sequence 0 holds pages {7, 2, 5}
// (11 tokens), sequence 1 pages {0, 9} (6 tokens); observed once.
template <class Policy = sh::h2o_policy>
struct paged_fixture : fixture_base<Policy> {
  static constexpr std::int32_t batch = 2, kv_heads = 2, head_dim = 4, page_size = 4, num_pages = 10, max_pages = 4,
                                q_heads = 2;
  std::vector<float> k, v;
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{7, 2, 5, 0, 9}, last_page_len{3, 2};
  std::unique_ptr<state_buffer> owned;

  explicit paged_fixture(const sh::settings& s = small_settings()) {
    this->policy.config = s;
    const std::size_t n = std::size_t{num_pages} * page_size * kv_heads * head_dim;
    k.resize(n);
    v.resize(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = value(i), v[i] = value(i + n);
    this->shape = sh::state_shape_for(this->policy, view());
    owned = std::make_unique<state_buffer>(sh::state_bytes(this->shape));
    this->state_mem = owned.get();
    this->state = sh::make_state(sh::host_span<std::byte>(owned->data, owned->size), this->shape);
    sh::host::reset_state(this->state);
    const std::int32_t columns = max_pages * page_size;
    this->probs.assign(std::size_t{batch} * q_heads * static_cast<std::size_t>(columns), 0.0f);
    const std::int32_t lens[2] = {11, 6};
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t qh = 0; qh < q_heads; ++qh)
        for (std::int32_t t = 0; t < lens[b]; ++t)
          this->probs[(static_cast<std::size_t>(b) * q_heads + static_cast<std::size_t>(qh)) *
                          static_cast<std::size_t>(columns) +
                      static_cast<std::size_t>(t)] = 1.0f / static_cast<float>(lens[b]);
    sh::host::observe_probabilities(this->policy, view(), this->state, probability());
    this->make_workspace(sh::host::compress_workspace_bytes(view()));
    this->freed.assign(batch, -1);
    this->new_lengths.assign(batch, -1);
  }

  [[nodiscard]] sh::host_paged_kv_view<float> view() {
    return sh::make_paged_kv_view<float, host>({k.data(), k.size()}, {v.data(), v.size()},
                                               {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                               {last_page_len.data(), last_page_len.size()}, batch, kv_heads,
                                               head_dim, page_size, num_pages, max_pages);
  }
  [[nodiscard]] sh::probability_view<host> probability() {
    return sh::probability_view<host>::dense({this->probs.data(), this->probs.size()}, q_heads, 1,
                                             max_pages * page_size);
  }
  [[nodiscard]] sh::host_span<std::int32_t> freed_span() { return {this->freed.data(), this->freed.size()}; }
  [[nodiscard]] std::vector<std::vector<std::uint8_t>> bytes() const {
    return {bytes_of(k.data(), k.size()),           bytes_of(v.data(), v.size()),
            bytes_of(indptr.data(), indptr.size()), bytes_of(indices.data(), indices.size()),
            bytes_of(last_page_len.data(), last_page_len.size()), this->state_bytes(),
            bytes_of(this->freed.data(), this->freed.size()),
            bytes_of(this->new_lengths.data(), this->new_lengths.size())};
  }
};

// The three claims of every case.
template <class Fixture, class Call>
void check_refused(Fixture& f, const std::string& function, const std::string& argument, Call&& call) {
  const auto before = f.bytes();
  bool refused = false;
  try {
    call();
  } catch (const sh::invalid_argument& e) {
    refused = true;
    INFO("message: " << e.what());
    CHECK(e.function() == function);
    CHECK(e.argument() == argument);
    CHECK(std::string(e.what()).find(argument) != std::string::npos);
  }
  CHECK(refused);
  const bool untouched = f.bytes() == before;  // (a bool: Catch would print every byte)
  CHECK(untouched);
}

// Shorthands for the three entry points on a fixture's own view.
template <class F, class View>
void compress_with(F& f, View view, std::int32_t budget) {
  sh::host::compress(f.policy, view, f.state, budget, f.workspace(), f.out());
}
template <class F, class View>
void observe_with(F& f, View view) {
  sh::host::observe_probabilities(f.policy, view, f.state, f.probability());
}

}  // namespace

// ---------------------------------------------------------------------------
// Budget and eviction count.

TEST_CASE("bad input: budget not above the protected tokens", "[bad_input]") {
  sh::settings s = small_settings();
  s.recent = 4;
  s.sinks = 2;
  contiguous_fixture f(s);
  check_refused(f, "host::compress", "budget", [&] { compress_with(f, f.view(), 6); });
}

TEST_CASE("bad input: budget zero or negative", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::compress", "budget", [&] { compress_with(f, f.view(), 0); });
  check_refused(f, "host::compress", "budget", [&] { compress_with(f, f.view(), INT32_MIN); });
}

TEST_CASE("bad input: m above the budget", "[bad_input]") {
  sh::settings s = small_settings();
  s.evict_count = 11;
  contiguous_fixture f(s);
  check_refused(f, "host::compress", "settings.evict_count", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: m above budget minus protected tokens", "[bad_input]") {
  sh::settings s = small_settings();
  s.recent = 4;
  s.evict_count = 7;  // <= budget 10, > 10 - 4
  contiguous_fixture f(s);
  check_refused(f, "host::compress", "settings.evict_count", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: m = 0", "[bad_input]") {
  contiguous_fixture f;
  f.policy.config.evict_count = 0;
  check_refused(f, "host::compress", "settings.evict_count", [&] { compress_with(f, f.view(), 10); });
  check_refused(f, "host::observe_probabilities", "settings.evict_count", [&] { observe_with(f, f.view()); });
}

// ---------------------------------------------------------------------------
// Settings.

TEST_CASE("bad input: negative recent window", "[bad_input]") {
  contiguous_fixture f;
  f.policy.config.recent = -1;
  check_refused(f, "host::compress", "settings.recent", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: negative sink count", "[bad_input]") {
  contiguous_fixture f;
  f.policy.config.sinks = -1;
  check_refused(f, "host::observe_probabilities", "settings.sinks", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: sliding window of zero steps", "[bad_input]") {
  contiguous_fixture<sh::scissorhands_policy> f;
  f.policy.config.window = 0;
  check_refused(f, "host::observe_probabilities", "settings.window", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: threshold alpha NaN or zero or infinite", "[bad_input]") {
  contiguous_fixture<sh::scissorhands_policy> f;
  for (float alpha : {nan_f, 0.0f, -1.0f, inf_f}) {
    f.policy.config.alpha = alpha;
    check_refused(f, "host::observe_probabilities", "settings.alpha", [&] { observe_with(f, f.view()); });
  }
}

TEST_CASE("bad input: decay not in the half-open unit interval", "[bad_input]") {
  contiguous_fixture<sh::eviction_policy<sh::attention_mass, sh::exponential_decay>> f;
  for (float decay : {0.0f, 1.5f, nan_f, -0.5f}) {
    f.policy.config.decay = decay;
    check_refused(f, "host::observe_probabilities", "settings.decay", [&] { observe_with(f, f.view()); });
  }
}

TEST_CASE("bad input: unknown compaction mode", "[bad_input]") {
  contiguous_fixture f;
  f.policy.config.compaction_mode = static_cast<sh::compaction>(7);
  check_refused(f, "host::compress", "settings.compaction_mode", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: pooling width even, out of range, or with fill_holes, and an unknown pooling mode", "[bad_input]") {
  contiguous_fixture f;
  f.policy.config.compaction_mode = sh::compaction::preserve_order;
  for (std::int32_t width : {0, -3, 2, 4, 257, 1001}) {
    f.policy.config.pool_width = width;
    check_refused(f, "host::compress", "settings.pool_width", [&] { compress_with(f, f.view(), 10); });
    check_refused(f, "host::observe_probabilities", "settings.pool_width", [&] { observe_with(f, f.view()); });
  }
  f.policy.config.pool_width = 5;
  f.policy.config.compaction_mode = sh::compaction::fill_holes;
  check_refused(f, "host::compress", "settings.pool_width", [&] { compress_with(f, f.view(), 10); });
  f.policy.config.compaction_mode = sh::compaction::preserve_order;
  f.policy.config.pool_mode = static_cast<sh::pooling>(9);
  check_refused(f, "host::compress", "settings.pool_mode", [&] { compress_with(f, f.view(), 10); });
}

// ---------------------------------------------------------------------------
// Zero or mismatched sizes.

TEST_CASE("bad input: batch 0", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.batch = 0;
  check_refused(f, "host::compress", "cache.batch", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: kv_heads 0", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.kv_heads = 0;
  check_refused(f, "host::observe_probabilities", "cache.kv_heads", [&] { observe_with(f, view); });
}

TEST_CASE("bad input: head_dim 0", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.head_dim = 0;
  check_refused(f, "host::compress", "cache.head_dim", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: capacity 0", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.capacity = 0;
  check_refused(f, "host::admit", "cache.capacity", [&] { sh::host::admit(f.policy, view, f.state); });
}

TEST_CASE("bad input: lengths span size differs from batch", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.lengths = {f.lengths.data(), 1};
  check_refused(f, "host::compress", "cache.lengths", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: state made for another batch", "[bad_input]") {
  contiguous_fixture f;
  sh::state_shape other = f.shape;
  other.rows = 1;
  state_buffer mem(sh::state_bytes(other));
  auto st = sh::make_state(sh::host_span<std::byte>(mem.data, mem.size), other);
  sh::host::reset_state(st);
  check_refused(f, "host::compress", "state.shape.rows", [&] {
    sh::host::compress(f.policy, f.view(), st, 10, f.workspace(), f.out());
  });
}

TEST_CASE("bad input: state made for another head count", "[bad_input]") {
  contiguous_fixture f;
  sh::state_shape other = f.shape;
  other.kv_heads = 1;
  state_buffer mem(sh::state_bytes(other));
  auto st = sh::make_state(sh::host_span<std::byte>(mem.data, mem.size), other);
  sh::host::reset_state(st);
  check_refused(f, "host::observe_probabilities", "state.shape.kv_heads", [&] {
    sh::host::observe_probabilities(f.policy, f.view(), st, f.probability());
  });
}

TEST_CASE("bad input: state capacity below a sequence's length", "[bad_input]") {
  // The state needs a slot per token held (12 for sequence 0), not the
  // cache's capacity (16): 12 is accepted, 11 refused.
  contiguous_fixture f;
  sh::state_shape enough = f.shape;
  enough.capacity = 12;
  {
    state_buffer mem(sh::state_bytes(enough));
    auto st = sh::make_state(sh::host_span<std::byte>(mem.data, mem.size), enough);
    sh::host::reset_state(st);
    REQUIRE_NOTHROW(sh::host::admit(f.policy, f.view(), st));
  }
  sh::state_shape other = f.shape;
  other.capacity = 11;
  state_buffer mem(sh::state_bytes(other));
  auto st = sh::make_state(sh::host_span<std::byte>(mem.data, mem.size), other);
  sh::host::reset_state(st);
  check_refused(f, "host::admit", "state.shape.capacity", [&] { sh::host::admit(f.policy, f.view(), st); });
}

TEST_CASE("bad input: state made for another policy", "[bad_input]") {
  contiguous_fixture<sh::scissorhands_policy> f;  // ring_words = 13 at w = 400
  const sh::h2o_policy other;                     // ring_words = 0
  check_refused(f, "host::compress", "state.shape.ring_words", [&] {
    sh::host::compress(other, f.view(), f.state, 10, f.workspace(), f.out());
  });
}

TEST_CASE("bad input: state never laid out", "[bad_input]") {
  contiguous_fixture f;
  const sh::eviction_state<host> blank{};
  check_refused(f, "host::compress", "state", [&] {
    sh::host::compress(f.policy, f.view(), blank, 10, f.workspace(), f.out());
  });
}

TEST_CASE("bad input: workspace too small", "[bad_input]") {
  contiguous_fixture f;
  const std::size_t need = sh::host::compress_workspace_bytes(f.view());
  check_refused(f, "host::compress", "workspace",
                [&] { sh::host::compress(f.policy, f.view(), f.state, 10, {f.workspace().data(), need - 1}, f.out()); });
}

TEST_CASE("bad input: workspace null", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::compress", "workspace", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 10, {nullptr, f.workspace().size()}, f.out());
  });
}

TEST_CASE("bad input: workspace misaligned", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::compress", "workspace", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 10, {f.workspace().data() + 4, f.workspace().size() - 4},
                       f.out());
  });
}

TEST_CASE("bad input: freed_pages of the wrong size for a paged cache", "[bad_input]") {
  paged_fixture f;
  check_refused(f, "host::compress", "out.freed_pages", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 8, f.workspace(), {f.new_span(), {f.freed.data(), 1}});
  });
}

TEST_CASE("bad input: freed_pages missing for a paged cache", "[bad_input]") {
  paged_fixture f;
  check_refused(f, "host::compress", "out.freed_pages",
                [&] { sh::host::compress(f.policy, f.view(), f.state, 8, f.workspace(), {f.new_span(), {}}); });
}

TEST_CASE("bad input: freed_pages of the wrong size for a contiguous cache", "[bad_input]") {
  contiguous_fixture f;
  f.freed.assign(3, -1);
  check_refused(f, "host::compress", "out.freed_pages", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: freed_pages null with a size (contiguous cache)", "[bad_input][regression]") {
  // Regression: this used to pass validation and store through null.
  contiguous_fixture f;
  check_refused(f, "host::compress", "out.freed_pages", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 10, f.workspace(), {f.new_span(), {nullptr, 2}});
  });
}

TEST_CASE("bad input: new_lengths missing, short or null", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::compress", "out.new_lengths",
                [&] { sh::host::compress(f.policy, f.view(), f.state, 10, f.workspace(), {}); });
  check_refused(f, "host::compress", "out.new_lengths", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 10, f.workspace(), {{f.new_lengths.data(), 1}, {}});
  });
  check_refused(f, "host::compress", "out.new_lengths",
                [&] { sh::host::compress(f.policy, f.view(), f.state, 10, f.workspace(), {{nullptr, 2}, {}}); });
}

TEST_CASE("bad input: new_lengths overlapping the lengths the view reads", "[bad_input]") {
  // An engine applying lengths in place would make the next layer sharing
  // them read the wrong length: refused, the output is separate.
  contiguous_fixture f;
  check_refused(f, "host::compress", "out.new_lengths", [&] {
    sh::host::compress(f.policy, f.view(), f.state, 10, f.workspace(), {{f.lengths.data(), 2}, {}});
  });
  paged_fixture p;
  check_refused(p, "host::compress", "out.new_lengths", [&] {
    sh::host::compress(p.policy, p.view(), p.state, 8, p.workspace(),
                       {{p.last_page_len.data(), 2}, {p.freed.data(), 2}});
  });
  check_refused(p, "host::compress", "out.freed_pages", [&] {
    sh::host::compress(p.policy, p.view(), p.state, 8, p.workspace(),
                       {{p.new_lengths.data(), 2}, {p.new_lengths.data() + 1, 2}});
  });
}

// ---------------------------------------------------------------------------
// Null data with a non-zero length.

TEST_CASE("bad input: null K data", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.k = {nullptr, view.k.size()};
  check_refused(f, "host::compress", "cache.k", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: null V data", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.v = {nullptr, view.v.size()};
  check_refused(f, "host::compress", "cache.v", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: null lengths", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.lengths = {nullptr, 2};
  check_refused(f, "host::observe_probabilities", "cache.lengths", [&] { observe_with(f, view); });
}

TEST_CASE("bad input: null probabilities", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.data = {nullptr, p.data.size()};
  check_refused(f, "host::observe_probabilities", "probs.data",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: null queries", "[bad_input]") {
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  auto qv = sh::query_view<float, host>::dense({nullptr, q.size()}, f.q_heads, 1, f.head_dim);
  check_refused(f, "host::observe_queries", "queries.data",
                [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv); });
}

TEST_CASE("bad input: null lse with a size", "[bad_input][regression]") {
  // Regression: this used to be taken for "no lse" silently.
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, f.q_heads, 1, f.head_dim);
  auto lse = sh::lse_view<host>::dense({nullptr, std::size_t{f.batch} * f.q_heads}, f.q_heads, 1, sh::lse_base::natural);
  check_refused(f, "host::observe_queries", "lse.data",
                [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv, lse); });
}

// ---------------------------------------------------------------------------
// Lengths and the state's bookkeeping.

TEST_CASE("bad input: length above capacity", "[bad_input]") {
  contiguous_fixture f;
  f.lengths[1] = f.capacity + 1;
  check_refused(f, "host::compress", "cache length", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: negative length", "[bad_input]") {
  contiguous_fixture f;
  f.lengths[0] = -1;
  check_refused(f, "host::observe_probabilities", "cache length", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: length below the tokens the state tracks", "[bad_input]") {
  contiguous_fixture f;
  f.lengths[0] -= 1;  // a token removed without compress
  check_refused(f, "host::compress", "cache length", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: compress before the new tokens were observed", "[bad_input]") {
  contiguous_fixture f;
  f.lengths[0] += 1;  // appended, not observed
  check_refused(f, "host::compress", "state", [&] { compress_with(f, f.view(), 10); });
}

TEST_CASE("bad input: negative tracked count", "[bad_input]") {
  contiguous_fixture f;
  f.state.tracked[1] = -1;
  check_refused(f, "host::observe_probabilities", "cache length", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: damaged next_position", "[bad_input]") {
  contiguous_fixture f;
  f.state.next_position[1] = -5;
  check_refused(f, "host::admit", "state.next_position", [&] { sh::host::admit(f.policy, f.view(), f.state); });
}

TEST_CASE("bad input: next_position leaves no room for the new tokens", "[bad_input]") {
  contiguous_fixture f;
  f.state.next_position[0] = INT32_MAX - 1;
  f.lengths[0] += 3;  // three new tokens need positions INT32_MAX - 1 .. INT32_MAX + 1
  check_refused(f, "host::admit", "state.next_position", [&] { sh::host::admit(f.policy, f.view(), f.state); });
}

TEST_CASE("bad input: negative state.step", "[bad_input][regression]") {
  // Regression: a negative step used to index the sliding window's ring
  // before its start (out-of-bounds write).
  contiguous_fixture<sh::scissorhands_policy> f;
  f.state.step[0] = -1;
  check_refused(f, "host::observe_probabilities", "state.step", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: state.step about to overflow", "[bad_input][regression]") {
  // Regression: step + q_len used to overflow int64.
  contiguous_fixture f;
  f.state.step[1] = INT64_MAX;
  check_refused(f, "host::observe_probabilities", "state.step", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: positions not unique leave too few tokens to evict", "[bad_input]") {
  contiguous_fixture f;
  // Every slot of sequence 0, head 0 claims the newest position: all protected.
  const std::int32_t newest = f.state.next_position[0] - 1;
  for (std::int32_t t = 0; t < f.lengths[0]; ++t) f.state.positions[f.state.index(0, 0, t)] = newest;
  check_refused(f, "host::compress", "state.positions", [&] { compress_with(f, f.view(), 10); });
}

// ---------------------------------------------------------------------------
// Probabilities and queries.

TEST_CASE("bad input: NaN probability", "[bad_input]") {
  contiguous_fixture f;
  f.probs[3] = nan_f;
  check_refused(f, "host::observe_probabilities", "probs", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: negative probability", "[bad_input]") {
  contiguous_fixture f;
  f.probs[f.capacity + 2] = -0.25f;
  check_refused(f, "host::observe_probabilities", "probs", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: infinite or above-one probability", "[bad_input]") {
  contiguous_fixture f;
  for (float x : {inf_f, 1.5f}) {
    f.probs[0] = x;
    check_refused(f, "host::observe_probabilities", "probs", [&] { observe_with(f, f.view()); });
  }
}

TEST_CASE("bad input: the probability bounds on the bits (-0 and 1.001 pass, their neighbours fail)", "[bad_input]") {
  // The check runs on the float's bits: pin its edges.
  for (float x : {-0.0f, 0.0f, std::numeric_limits<float>::denorm_min(), 1.001f}) {
    contiguous_fixture f;
    f.probs[1] = x;
    INFO("probability " << x);
    REQUIRE_NOTHROW(observe_with(f, f.view()));
  }
  for (float x : {-std::numeric_limits<float>::denorm_min(), std::nextafter(1.001f, 2.0f), -nan_f, -inf_f}) {
    contiguous_fixture f;
    f.probs[1] = x;
    INFO("probability " << x);
    check_refused(f, "host::observe_probabilities", "probs", [&] { observe_with(f, f.view()); });
  }
}

TEST_CASE("bad input: probabilities past the visible columns are not read", "[bad_input]") {
  // The contrast case: NaN where no query looks is fine.
  contiguous_fixture f;
  f.probs[f.capacity - 1] = nan_f;  // sequence 0 has 12 tokens: column 15 is not visible
  REQUIRE_NOTHROW(observe_with(f, f.view()));
}

TEST_CASE("bad input: GQA group size that does not divide the query heads", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.q_heads = 3;  // 2 KV heads
  check_refused(f, "host::observe_probabilities", "q_heads",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: GQA group above the supported size", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.q_heads = f.kv_heads * (sh::host::max_group_size + 1);
  check_refused(f, "host::observe_probabilities", "q_heads",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: no query heads", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.q_heads = 0;
  check_refused(f, "host::observe_probabilities", "q_heads",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: q_len above a sequence's length", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.q_len = 10;  // sequence 1 holds 9 tokens
  check_refused(f, "host::observe_probabilities", "q_len",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: q_len negative", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.q_len = -1;
  check_refused(f, "host::observe_probabilities", "q_len",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: probability buffer too small for its strides", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  // Rows need the longest length (12) of columns, not the full capacity
  // (16): cutting the last 4 padding columns is fine, the 5th is not.
  p.data = {p.data.data(), p.data.size() - (f.capacity - 12)};
  REQUIRE_NOTHROW(sh::host::observe_probabilities(f.policy, f.view(), f.state, p));
  p.data = {p.data.data(), p.data.size() - 1};
  check_refused(f, "host::observe_probabilities", "probs.data",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: negative probability stride", "[bad_input]") {
  contiguous_fixture f;
  auto p = f.probability();
  p.head_stride = -1;
  check_refused(f, "host::observe_probabilities", "probs strides",
                [&] { sh::host::observe_probabilities(f.policy, f.view(), f.state, p); });
}

TEST_CASE("bad input: queries of another head_dim", "[bad_input]") {
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * 8, 0.5f);
  auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, f.q_heads, 1, 8);
  check_refused(f, "host::observe_queries", "queries.head_dim",
                [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv); });
}

TEST_CASE("bad input: query buffer too small", "[bad_input]") {
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  auto qv = sh::query_view<float, host>::dense({q.data(), q.size() - 1}, f.q_heads, 1, f.head_dim);
  check_refused(f, "host::observe_queries", "queries.data",
                [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv); });
}

TEST_CASE("bad input: negative query stride", "[bad_input]") {
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, f.q_heads, 1, f.head_dim);
  qv.query_stride = -qv.query_stride;
  check_refused(f, "host::observe_queries", "queries strides",
                [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv); });
}

namespace {
// One query per sequence and a dense natural LSE of ones over the contiguous
// fixture: the LSE refusal cases change one thing each.
struct lse_case {
  contiguous_fixture<> f;
  std::vector<float> q = std::vector<float>(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  std::vector<float> l = std::vector<float>(std::size_t{f.batch} * f.q_heads, 1.0f);
  sh::query_view<float, host> queries() const {
    return sh::query_view<float, host>::dense({q.data(), q.size()}, f.q_heads, 1, f.head_dim);
  }
  sh::lse_view<host> lse(std::size_t size) const {
    return sh::lse_view<host>::dense({l.data(), size}, f.q_heads, 1, sh::lse_base::natural);
  }
  void refused(const sh::lse_view<host>& lse, const char* argument) {
    check_refused(f, "host::observe_queries", argument,
                  [&] { sh::host::observe_queries(f.policy, f.view(), f.state, queries(), lse); });
  }
};
}  // namespace

TEST_CASE("bad input: negative lse stride", "[bad_input]") {
  lse_case c;
  auto lse = c.lse(c.l.size());
  lse.head_stride = -1;
  c.refused(lse, "lse strides");
}

// The base is the engine's to name: a view built without one (aggregate
// initialised, or a bridge lse with the default) is refused, never read as
// natural, whatever the factory used to assume.
TEST_CASE("bad input: lse base not named", "[bad_input]") {
  lse_case c;
  auto lse = c.lse(c.l.size());
  lse.base = sh::lse_base::unspecified;
  c.refused(lse, "lse.base");
  lse.base = static_cast<sh::lse_base>(7);
  c.refused(lse, "lse.base");
  CHECK(sh::lse_view<host>{}.base == sh::lse_base::unspecified);
}

TEST_CASE("bad input: softmax scale NaN or negative", "[bad_input]") {
  contiguous_fixture f;
  std::vector<float> q(std::size_t{f.batch} * f.q_heads * f.head_dim, 0.5f);
  auto qv = sh::query_view<float, host>::dense({q.data(), q.size()}, f.q_heads, 1, f.head_dim);
  for (float scale : {nan_f, -1.0f, inf_f})
    check_refused(f, "host::observe_queries", "softmax_scale",
                  [&] { sh::host::observe_queries(f.policy, f.view(), f.state, qv, {}, scale); });
}

TEST_CASE("bad input: non-finite lse", "[bad_input]") {
  lse_case c;
  c.l[5] = nan_f;
  c.refused(c.lse(c.l.size()), "lse");
}

TEST_CASE("bad input: lse buffer too small", "[bad_input]") {
  lse_case c;
  c.refused(c.lse(c.l.size() - 1), "lse.data");
}

// ---------------------------------------------------------------------------
// Layouts and buffers.

TEST_CASE("bad input: overlapping strides (token stride 0)", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.k_layout.token_stride = 0;
  check_refused(f, "host::compress", "cache.k_layout", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: overlapping strides (head stride below head_dim)", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.v_layout.head_stride = f.head_dim - 1;
  check_refused(f, "host::compress", "cache.v_layout", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: negative stride", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.k_layout.sequence_stride = -view.k_layout.sequence_stride;
  check_refused(f, "host::observe_probabilities", "cache.k_layout", [&] { observe_with(f, view); });
}

TEST_CASE("bad input: K buffer too small for its layout", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.k = {view.k.data(), view.k.size() - 1};
  check_refused(f, "host::compress", "cache.k", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: V buffer too small for its layout", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.v_layout = sh::kv_layout::hnd(f.capacity + 1, f.kv_heads, f.head_dim);  // one slot more per head
  check_refused(f, "host::compress", "cache.v", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: strides whose offsets pass 2^62", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.k_layout.sequence_stride = std::int64_t{1} << 62;
  check_refused(f, "host::compress", "cache.k", [&] { compress_with(f, view, 10); });
}

TEST_CASE("bad input: V aliasing K", "[bad_input]") {
  contiguous_fixture f;
  auto view = f.view();
  view.v = view.k;
  check_refused(f, "host::compress", "cache.v", [&] { compress_with(f, view, 10); });
}

// ---------------------------------------------------------------------------
// Paged caches.

TEST_CASE("bad input: paged indptr not starting at 0", "[bad_input]") {
  paged_fixture f;
  f.indptr = {1, 3, 5};
  check_refused(f, "host::compress", "cache.indptr", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged indptr decreasing", "[bad_input]") {
  paged_fixture f;
  f.indptr = {0, 3, 2};
  f.last_page_len = {3, 0};
  check_refused(f, "host::observe_probabilities", "cache.indptr", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: paged indptr far below its predecessor", "[bad_input][regression]") {
  // Regression: indptr[2] - indptr[1] used to overflow int32 (UB) first.
  paged_fixture f;
  f.indptr = {0, 3, INT32_MIN};
  check_refused(f, "host::compress", "cache.indptr", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged indptr of the wrong size", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.indptr = {f.indptr.data(), 2};
  check_refused(f, "host::compress", "cache.indptr", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged batch at INT32_MAX", "[bad_input][regression]") {
  // Regression: the message's batch + 1 used to overflow int32 (UB).
  paged_fixture f;
  auto view = f.view();
  view.batch = INT32_MAX;
  check_refused(f, "host::compress", "cache.indptr", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged sequence with more pages than allowed", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.max_pages_per_sequence = 2;  // sequence 0 lists 3
  check_refused(f, "host::observe_probabilities", "cache.indptr", [&] { observe_with(f, view); });
}

TEST_CASE("bad input: paged max_pages_per_sequence times page_size above int32", "[bad_input][regression]") {
  // Regression: max_capacity() used to overflow int32 (UB) when computing
  // the workspace size before validation.
  paged_fixture f;
  auto view = f.view();
  view.max_pages_per_sequence = INT32_MAX / 2;
  (void)sh::host::compress_workspace_bytes(view);  // must not overflow
  check_refused(f, "host::compress", "cache.max_pages_per_sequence", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged last_page_len 0 for a sequence with pages", "[bad_input]") {
  paged_fixture f;
  f.last_page_len[0] = 0;
  check_refused(f, "host::compress", "cache.last_page_len", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged last_page_len above page_size", "[bad_input]") {
  paged_fixture f;
  f.last_page_len[1] = f.page_size + 1;
  check_refused(f, "host::compress", "cache.last_page_len", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged last_page_len for a sequence without pages", "[bad_input]") {
  paged_fixture f;
  f.indptr = {0, 3, 3};
  f.last_page_len[1] = 1;
  check_refused(f, "host::admit", "cache.last_page_len", [&] { sh::host::admit(f.policy, f.view(), f.state); });
}

TEST_CASE("bad input: paged last_page_len of the wrong size", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.last_page_len = {f.last_page_len.data(), 1};
  check_refused(f, "host::compress", "cache.last_page_len", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged page id outside the pool", "[bad_input]") {
  paged_fixture f;
  f.indices[3] = f.num_pages;
  check_refused(f, "host::compress", "cache.indices", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged negative page id", "[bad_input]") {
  paged_fixture f;
  f.indices[1] = -1;
  check_refused(f, "host::observe_probabilities", "cache.indices", [&] { observe_with(f, f.view()); });
}

TEST_CASE("bad input: paged indices shorter than the last indptr entry", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.indices = {f.indices.data(), 4};
  check_refused(f, "host::compress", "cache.indices", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged null indices", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.indices = {nullptr, 5};
  check_refused(f, "host::compress", "cache.indices", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged page shared with a sequence compress rewrites", "[bad_input][regression]") {
  // Regression: compress used to compact sequence 0 in place, moving rows of
  // page 2 under sequence 1, which lists it too.
  paged_fixture f;
  f.indices = {7, 2, 5, 2, 9};
  check_refused(f, "host::compress", "cache.indices", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged page listed twice by the sequence compress rewrites", "[bad_input]") {
  paged_fixture f;
  f.indices = {7, 2, 7, 0, 9};
  check_refused(f, "host::compress", "cache.indices", [&] { compress_with(f, f.view(), 8); });
}

TEST_CASE("bad input: paged shared pages are fine where compress does not write", "[bad_input]") {
  // The contrast cases: observe only reads, and a budget no sequence reaches
  // leaves every page alone.
  paged_fixture f;
  f.indices = {7, 2, 5, 2, 9};
  REQUIRE_NOTHROW(observe_with(f, f.view()));
  REQUIRE_NOTHROW(compress_with(f, f.view(), 12));
  CHECK(f.freed == std::vector<std::int32_t>{0, 0});
}

TEST_CASE("bad input: paged batch or heads or head_dim zero", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.batch = 0;
  check_refused(f, "host::compress", "cache.batch", [&] { compress_with(f, view, 8); });
  view = f.view();
  view.kv_heads = 0;
  check_refused(f, "host::compress", "cache.kv_heads", [&] { compress_with(f, view, 8); });
  view = f.view();
  view.head_dim = 0;
  check_refused(f, "host::observe_probabilities", "cache.head_dim", [&] { observe_with(f, view); });
}

TEST_CASE("bad input: paged null indptr or last_page_len", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.indptr = {nullptr, 3};
  check_refused(f, "host::compress", "cache.indptr", [&] { compress_with(f, view, 8); });
  view = f.view();
  view.last_page_len = {nullptr, 2};
  check_refused(f, "host::compress", "cache.last_page_len", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged V pool aliasing the K pool", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.v_pages = view.k_pages;
  check_refused(f, "host::compress", "cache.v_pages", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged negative stride", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.v_layout.head_stride = -4;
  check_refused(f, "host::compress", "cache.v_layout", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged null K pool", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.k_pages = {nullptr, view.k_pages.size()};
  check_refused(f, "host::compress", "cache.k_pages", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged V pool too small", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.v_pages = {view.v_pages.data(), view.v_pages.size() - 1};
  check_refused(f, "host::compress", "cache.v_pages", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged overlapping page layout", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.k_layout.page_stride = view.k_layout.token_stride;  // pages overlap their neighbours' tokens
  check_refused(f, "host::compress", "cache.k_layout", [&] { compress_with(f, view, 8); });
}

TEST_CASE("bad input: paged page_size 0 and num_pages 0", "[bad_input]") {
  paged_fixture f;
  auto view = f.view();
  view.page_size = 0;
  check_refused(f, "host::compress", "cache.page_size", [&] { compress_with(f, view, 8); });
  view = f.view();
  view.num_pages = 0;
  check_refused(f, "host::compress", "cache.num_pages", [&] { compress_with(f, view, 8); });
}

// ---------------------------------------------------------------------------
// State set-up and lifetime.

TEST_CASE("bad input: state_bytes of an empty shape", "[bad_input]") {
  contiguous_fixture f;
  sh::state_shape s = f.shape;
  s.rows = 0;
  check_refused(f, "state_bytes", "shape.rows", [&] { (void)sh::state_bytes(s); });
  s = f.shape;
  s.ring_words = -1;
  check_refused(f, "state_bytes", "shape.ring_words", [&] { (void)sh::state_bytes(s); });
}

TEST_CASE("bad input: state_bytes of a shape beyond addressable memory", "[bad_input]") {
  contiguous_fixture f;
  const sh::state_shape s{INT32_MAX, INT32_MAX, INT32_MAX, 0};
  check_refused(f, "state_bytes", "shape", [&] { (void)sh::state_bytes(s); });
}

TEST_CASE("bad input: window near INT32_MAX sizes its ring without overflow", "[bad_input][regression]") {
  // Regression: ring_words computed window + 31 in int32 (UB).
  sh::scissorhands_policy p;
  p.config.window = INT32_MAX;
  CHECK(p.ring_words() == (std::int64_t{INT32_MAX} + 31) / 32);
  p.config.window = INT32_MAX - 5;
  CHECK(p.ring_words() == (std::int64_t{INT32_MAX} - 5 + 31) / 32);
}

TEST_CASE("bad input: make_state with a short buffer", "[bad_input]") {
  contiguous_fixture f;
  state_buffer mem(sh::state_bytes(f.shape));
  check_refused(f, "make_state", "buffer",
                [&] { (void)sh::make_state(sh::host_span<std::byte>(mem.data, mem.size - 1), f.shape); });
}

TEST_CASE("bad input: make_state with a misaligned buffer", "[bad_input]") {
  contiguous_fixture f;
  state_buffer mem(sh::state_bytes(f.shape) + 256);
  check_refused(f, "make_state", "buffer",
                [&] { (void)sh::make_state(sh::host_span<std::byte>(mem.data + 16, mem.size - 16), f.shape); });
}

TEST_CASE("bad input: make_state with a null buffer", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "make_state", "buffer", [&] { (void)sh::make_state(sh::host_span<std::byte>(nullptr, 1 << 20), f.shape); });
}

TEST_CASE("bad input: reset_sequence out of the batch", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::reset_sequence", "row", [&] { sh::host::reset_sequence(f.state, 2); });
  check_refused(f, "host::reset_sequence", "row", [&] { sh::host::reset_sequence(f.state, -1); });
}

TEST_CASE("bad input: reset_sequence at a negative start position", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::reset_sequence", "start_position", [&] { sh::host::reset_sequence(f.state, 0, -3); });
}

TEST_CASE("bad input: reset_state of a state never laid out", "[bad_input]") {
  contiguous_fixture f;
  check_refused(f, "host::reset_state", "state", [&] { sh::host::reset_state(sh::eviction_state<host>{}); });
}

// ---------------------------------------------------------------------------
// shrink_page_table: the engine-side helper rewrites a page table in place.

namespace {
struct page_table {
  // Pages of 4: sequence 0 holds 11 tokens on 3 pages, sequence 1 6 on 2.
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{7, 2, 5, 0, 9}, last_page_len{3, 2}, new_lengths{4, 6},
      released{-1, -1, -1, -1, -1};
  [[nodiscard]] std::vector<std::vector<std::uint8_t>> bytes() const {
    return {bytes_of(indptr.data(), indptr.size()), bytes_of(indices.data(), indices.size()),
            bytes_of(last_page_len.data(), last_page_len.size()), bytes_of(new_lengths.data(), new_lengths.size()),
            bytes_of(released.data(), released.size())};
  }
  std::size_t shrink(std::int32_t page_size = 4) {
    return sh::host::shrink_page_table({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                       {last_page_len.data(), last_page_len.size()}, page_size,
                                       {new_lengths.data(), new_lengths.size()}, {released.data(), released.size()});
  }
};
}  // namespace

TEST_CASE("bad input: shrink_page_table with a negative indptr start", "[bad_input][regression]") {
  // Regression (as release_freed_pages): it used to read indices[-2] (heap-buffer-overflow).
  page_table t;
  t.indptr = {-2, 1, 3};
  check_refused(t, "host::shrink_page_table", "indptr", [&] { t.shrink(); });
}

// The span call both backends share: the count in a shrink_result, whose
// span must hold one entry (refused before the table is touched).
TEST_CASE("shrink_page_table's one-API call reports through a shrink_result", "[bad_input]") {
  page_table t;
  check_refused(t, "host::shrink_page_table", "result", [&] {
    sh::host::shrink_page_table({t.indptr.data(), t.indptr.size()}, {t.indices.data(), t.indices.size()},
                                {t.last_page_len.data(), t.last_page_len.size()}, 4,
                                {t.new_lengths.data(), t.new_lengths.size()}, {t.released.data(), t.released.size()},
                                {});
  });
  sh::shrink_result result{-1, 9};
  sh::host::shrink_page_table({t.indptr.data(), t.indptr.size()}, {t.indices.data(), t.indices.size()},
                              {t.last_page_len.data(), t.last_page_len.size()}, 4,
                              {t.new_lengths.data(), t.new_lengths.size()}, {t.released.data(), t.released.size()},
                              {&result, 1});
  CHECK(result.released == 2);  // 11 -> 4 tokens: 3 pages -> 1
  CHECK(result.status == 0);
  CHECK(t.released[0] == 2);
  CHECK(t.released[1] == 5);
}

TEST_CASE("bad input: shrink_page_table with a decreasing indptr", "[bad_input]") {
  page_table t;
  t.indptr = {0, 3, INT32_MIN};
  check_refused(t, "host::shrink_page_table", "indptr", [&] { t.shrink(); });
}

TEST_CASE("bad input: shrink_page_table growing a sequence or a negative length", "[bad_input]") {
  page_table t;
  t.new_lengths = {12, 6};  // the table holds 11
  check_refused(t, "host::shrink_page_table", "new_lengths", [&] { t.shrink(); });
  t.new_lengths = {-1, 6};
  check_refused(t, "host::shrink_page_table", "new_lengths", [&] { t.shrink(); });
}

TEST_CASE("bad input: shrink_page_table with new_lengths or last_page_len of the wrong size", "[bad_input]") {
  page_table t;
  t.new_lengths = {4};
  check_refused(t, "host::shrink_page_table", "new_lengths", [&] { t.shrink(); });
  page_table u;
  u.last_page_len = {3};
  check_refused(u, "host::shrink_page_table", "last_page_len", [&] { u.shrink(); });
}

TEST_CASE("bad input: shrink_page_table with a bad last_page_len or page_size", "[bad_input]") {
  page_table t;
  t.last_page_len = {5, 2};
  check_refused(t, "host::shrink_page_table", "last_page_len", [&] { t.shrink(); });
  page_table u;
  check_refused(u, "host::shrink_page_table", "page_size", [&] { u.shrink(0); });
}

TEST_CASE("bad input: shrink_page_table into a short or null released", "[bad_input]") {
  page_table t;
  t.new_lengths = {1, 0};  // releases 2 + 2 pages
  check_refused(t, "host::shrink_page_table", "released", [&] {
    sh::host::shrink_page_table({t.indptr.data(), 3}, {t.indices.data(), 5}, {t.last_page_len.data(), 2}, 4,
                                {t.new_lengths.data(), 2}, {t.released.data(), 3});
  });
  check_refused(t, "host::shrink_page_table", "released", [&] {
    sh::host::shrink_page_table({t.indptr.data(), 3}, {t.indices.data(), 5}, {t.last_page_len.data(), 2}, 4,
                                {t.new_lengths.data(), 2}, {nullptr, 5});
  });
}

TEST_CASE("bad input: shrink_page_table with null indices", "[bad_input]") {
  page_table t;
  check_refused(t, "host::shrink_page_table", "indices", [&] {
    sh::host::shrink_page_table({t.indptr.data(), 3}, {nullptr, 5}, {t.last_page_len.data(), 2}, 4,
                                {t.new_lengths.data(), 2}, {t.released.data(), 5});
  });
}

TEST_CASE("bad input: shrink_page_table with an empty indptr", "[bad_input]") {
  page_table t;
  check_refused(t, "host::shrink_page_table", "indptr", [&] {
    sh::host::shrink_page_table({}, {t.indices.data(), 5}, {}, 4, {}, {t.released.data(), 5});
  });
}

// ---------------------------------------------------------------------------
// Budget allocators (set-up time).

namespace {
struct nothing {
  [[nodiscard]] int bytes() const { return 0; }
};
}  // namespace

TEST_CASE("bad input: total budget per head not positive", "[bad_input]") {
  nothing n;
  check_refused(n, "total_budget::tokens_per_head", "per_layer", [] { (void)sh::total_budget::tokens_per_head(0, 4); });
  check_refused(n, "total_budget::tokens_per_head", "num_layers",
                [] { (void)sh::total_budget::tokens_per_head(10, 0); });
}

TEST_CASE("bad input: compression ratio not in the half-open unit interval", "[bad_input]") {
  nothing n;
  for (double r : {0.0, 1.5, std::nan("")})
    check_refused(n, "total_budget::compression_ratio", "ratio",
                  [&] { (void)sh::total_budget::compression_ratio(r, 100, 4); });
}

TEST_CASE("bad input: total budget below one token per layer", "[bad_input]") {
  nothing n;
  check_refused(n, "uniform_budget::allocate", "total", [] { (void)sh::uniform_budget{}.allocate(3, 4); });
}

TEST_CASE("bad input: compression ratio of an empty model or context", "[bad_input]") {
  nothing n;
  check_refused(n, "total_budget::compression_ratio", "max_sequence_length",
                [] { (void)sh::total_budget::compression_ratio(0.5, 0, 4); });
  check_refused(n, "total_budget::compression_ratio", "num_layers",
                [] { (void)sh::total_budget::compression_ratio(0.5, 100, 0); });
}

TEST_CASE("bad input: allocation over no layers or beyond int32 per layer", "[bad_input]") {
  nothing n;
  check_refused(n, "uniform_budget::allocate", "num_layers", [] { (void)sh::uniform_budget{}.allocate(100, 0); });
  check_refused(n, "uniform_budget::allocate", "total",
                [] { (void)sh::uniform_budget{}.allocate(std::int64_t{INT32_MAX} * 4 + 8, 2); });
}

TEST_CASE("bad input: ramp slope not below 1", "[bad_input]") {
  nothing n;
  check_refused(n, "ramp_budget::allocate", "slope", [] { (void)sh::ramp_budget{1.0}.allocate(100, 4); });
}

TEST_CASE("bad input: explicit budgets of the wrong count or sum", "[bad_input]") {
  nothing n;
  check_refused(n, "explicit_budget::allocate", "budgets",
                [] { (void)sh::explicit_budget{{10, 20}}.allocate(30, 3); });
  check_refused(n, "explicit_budget::allocate", "total", [] { (void)sh::explicit_budget{{10, 20}}.allocate(31, 2); });
  check_refused(n, "explicit_budget::allocate", "budgets", [] { (void)sh::explicit_budget{{10, 0}}.allocate(10, 2); });
}

TEST_CASE("bad input: persistence floor not in the half-open unit interval", "[bad_input]") {
  nothing n;
  check_refused(n, "persistence_budget::allocate", "floor",
                [] { (void)sh::persistence_budget{{0.5, 0.9}, 0.0}.allocate(100, 2); });
  check_refused(n, "persistence_budget::allocate", "persistence",
                [] { (void)sh::persistence_budget{{0.5}, 0.1}.allocate(100, 2); });
}

TEST_CASE("bad input: persistence ratio above 1", "[bad_input]") {
  nothing n;
  check_refused(n, "persistence_budget::allocate", "persistence",
                [] { (void)sh::persistence_budget{{0.5, 1.2}}.allocate(100, 2); });
}
