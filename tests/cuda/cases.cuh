#pragma once
// The random-configuration differential cases of both binaries
// (differential.cuh: one layer state; token_level.cu: a model state) share
// this: the configuration fields and draws they have in common, the policy
// settings they name, the cache views of a request_batch, the steps an
// engine runs between calls, the comparisons of the device's state and
// outputs with the host's, and the loop over configurations.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.cuh"
#include "requests.cuh"

namespace harness {

// ---------------------------------------------------------------------------
// Random draws
template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> options) {
  std::uniform_int_distribution<std::size_t> d(0, options.size() - 1);
  return *(options.begin() + d(rng));
}
inline int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
inline bool coin(std::mt19937_64& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

template <class T>
void fill_random(std::vector<T>& v, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : v) x = from_float<T>(d(rng));
}

// ---------------------------------------------------------------------------
// A configuration: the fields both suites draw (each suite's config adds
// its own).
struct case_config {
  int index = 0;
  int dtype = 0;   // the suite's element types, in its order
  int layout = 0;  // 0 NHD, 1 HND, 2 paged NHD, 3 paged HND
  int policy = 0;
  int batch = 1, kv_heads = 1, group = 1, head_dim = 8;
  int capacity = 16, page_size = 4, budget = 8, m = 1;
  int recent = 0, sinks = 0, window = 8, steps = 3;
  float alpha = 1.0f, decay = 0.9f;
  bool normalize = false, preserve_order = false, ties = false, freed_for_contiguous = false;
  bool mapped = false;       // state_rows: requests move between batch positions, padding slots
  bool tight_state = false;  // state capacity below the cache's
  std::uint32_t seed = 0;
  int pool_width = 1;     // SnapKV pooling (preserve_order only)
  bool pool_max = false;  // max pooling, else mean

  // "config <index>: <what>, batch ...": `what` names the suite's element
  // type, layout and policy, `more` its own fields (", name value" each).
  std::string describe_as(const std::string& what, const std::string& more) const {
    static const char* layouts[] = {"NHD", "HND", "paged-NHD", "paged-HND"};
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "config %d: %s %s, batch %d%s, kv_heads %d, group %d, head_dim %d, capacity %d%s, page %d, "
                  "budget %d, m %d, recent %d, sinks %d, window %d, alpha %g, decay %g, normalize %d, %s, ties %d, "
                  "pool %d %s, steps %d, seed %u",
                  index, layouts[layout], what.c_str(), batch, mapped ? " (state rows)" : "", kv_heads, group,
                  head_dim, capacity, tight_state ? " (tight state)" : "", page_size, budget, m, recent, sinks, window,
                  alpha, decay, normalize, preserve_order ? "preserve_order" : "fill_holes", ties, pool_width,
                  pool_max ? "max" : "mean", steps, seed);
    return buf + more;
  }

  // The policy settings this configuration names.
  void apply(sh::settings& s) const {
    s.window = window;
    s.recent = recent;
    s.sinks = sinks;
    s.evict_count = m;
    s.alpha = alpha;
    s.decay = decay;
    s.normalize = normalize;
    s.compaction_mode = preserve_order ? sh::compaction::preserve_order : sh::compaction::fill_holes;
    s.seed = seed;
    s.pool_width = pool_width;
    s.pool_mode = pool_max ? sh::pooling::max : sh::pooling::mean;
  }
};

// The first draws of a configuration: its element type (of `dtypes`),
// layout and policy (of `policies`).
inline void draw_kind(std::mt19937_64& rng, case_config& c, int index, int dtypes, int policies) {
  c.index = index;
  c.dtype = uniform(rng, 0, dtypes - 1);
  c.layout = uniform(rng, 0, 3);
  c.policy = uniform(rng, 0, policies - 1);
}

// The protected tokens, budget, m, capacity and page size, in the order
// both suites draw them: budget(protect) draws the budget; the capacity is
// the budget plus 200..900 (`long_seq`) or 3..slack slots.
template <class Budget>
void draw_sizes(std::mt19937_64& rng, case_config& c, bool long_seq, int slack, Budget&& budget) {
  c.recent = uniform(rng, 0, 6);
  c.sinks = coin(rng, 0.3) ? uniform(rng, 1, 3) : 0;
  const int protect = c.recent + c.sinks;
  c.budget = budget(protect);
  c.m = coin(rng, 0.4) ? 1 : uniform(rng, 1, c.budget - protect);
  c.capacity = c.budget + (long_seq ? uniform(rng, 200, 900) : uniform(rng, 3, slack));
  c.page_size = pick(rng, {1, 2, 4, 5, 16});
}

// The last draws of a configuration: its seed, and SnapKV pooling for some
// preserve_order ones.
inline void draw_seed_and_pooling(std::mt19937_64& rng, case_config& c) {
  c.seed = static_cast<std::uint32_t>(rng());
  if (c.preserve_order && coin(rng, 0.4)) {
    c.pool_width = pick(rng, {3, 5, 9});
    c.pool_max = coin(rng);
  }
}

// Runs `configs` configurations: make(rng, index) draws one, run(c, log)
// compares the backends on it (an exception fails it, reported), count(c)
// tallies it for the suite's summary. Prints the first 10 failures and
// returns the failures.
template <class Make, class Run, class Count>
int run_configs(int configs, std::uint64_t seed, Make&& make, Run&& run, Count&& count) {
  std::mt19937_64 rng(seed);
  int failed = 0;
  for (int i = 0; i < configs; ++i) {
    const auto c = make(rng, i);
    mismatch_log log;
    bool ok = false;
    try {
      ok = run(c, log);
    } catch (const std::exception& e) {
      log.add_host("unexpected exception: ", e.what());
    }
    if (!ok && ++failed <= 10) std::printf("FAIL %s\n%s", c.describe().c_str(), log.text.str().c_str());
    count(c);
  }
  return failed;
}

// ---------------------------------------------------------------------------
// The cache

// A K/V cache's shape: contiguous (capacity slots a sequence) or paged
// (max_pages pages a sequence from a pool of num_pages); elements: one
// layer's K (or V) elements.
struct cache_geometry {
  int batch = 1, kv_heads = 1, head_dim = 8, page_size = 1, max_pages = 0, num_pages = 0, capacity = 0;
  bool hnd = false;
  bool v_other_layout = false;  // V in the other layout than K
  std::size_t elements = 0;

  // A configuration's cache; paged, the pool holds 3 pages no sequence uses.
  static cache_geometry of(const case_config& c, bool paged, bool v_other_layout = false) {
    cache_geometry g;
    g.batch = c.batch, g.kv_heads = c.kv_heads, g.head_dim = c.head_dim, g.page_size = c.page_size;
    g.max_pages = paged ? (c.capacity + c.page_size - 1) / c.page_size : 0;
    g.num_pages = paged ? c.batch * g.max_pages + 3 : 0;
    g.capacity = paged ? g.max_pages * c.page_size : c.capacity;
    g.hnd = c.layout % 2 == 1;
    g.v_other_layout = v_other_layout;
    g.elements = paged ? static_cast<std::size_t>(g.num_pages) * g.page_size * g.kv_heads * g.head_dim
                       : static_cast<std::size_t>(g.batch) * g.capacity * g.kv_heads * g.head_dim;
    return g;
  }
};

// The view of layer `layer` of K and V (arrays of layers of `elements`
// each) over a batch's lengths (contiguous) or page table (paged).
template <bool Paged, class T, sh::memory_space S>
auto cache_view(const cache_geometry& g, T* k, T* v, const kv_table<S>& t, int layer = 0) {
  const sh::span<T, S> ks(k + g.elements * layer, g.elements), vs(v + g.elements * layer, g.elements);
  const int B = g.batch, H = g.kv_heads, D = g.head_dim, P = g.page_size;
  const auto named = g.hnd ? sh::named_layout::hnd : sh::named_layout::nhd;
  if constexpr (Paged) {
    auto out = sh::make_paged_kv_view(ks, vs, t.indptr, t.indices, t.last, B, H, D, P, g.num_pages, g.max_pages, named);
    if (g.v_other_layout) out.v_layout = g.hnd ? sh::paged_layout::nhd(P, H, D) : sh::paged_layout::hnd(P, H, D);
    return out;
  } else {
    auto out = sh::make_kv_view(ks, vs, t.lengths, B, H, D, g.capacity, named);
    if (g.v_other_layout)
      out.v_layout = g.hnd ? sh::kv_layout::nhd(g.capacity, H, D) : sh::kv_layout::hnd(g.capacity, H, D);
    return out;
  }
}

// A layer state on both backends, and `snapshot`, the host's copy of the
// device's.
struct twin_state {
  sh::state_shape shape;
  std::size_t bytes;
  aligned_bytes host_buf, snapshot_buf;
  device_buffer<std::byte> device_buf;
  sh::eviction_state<host_space> host, snapshot;
  sh::eviction_state<device_space> device;

  explicit twin_state(const sh::state_shape& s)
      : shape(s),
        bytes(sh::state_bytes(s)),
        host_buf(bytes),
        snapshot_buf(bytes),
        device_buf(bytes),
        host(sh::make_state(host_buf.span(), s)),
        snapshot(sh::make_state(snapshot_buf.span(), s)),
        device(sh::make_state(device_buf.span(), s)) {
    sh::host::reset_state(host);
    CUDA_CHECK(sh::cuda::reset_state(device));
  }
  // The device's state copied into snapshot.
  const sh::eviction_state<host_space>& download() const {
    device_buf.download(snapshot_buf.data(), bytes);
    return snapshot;
  }
  // The device's state set to the host's.
  void upload() const { device_buf.upload(host_buf.data(), bytes); }
};

// ---------------------------------------------------------------------------
// What an engine does between calls

// How many tokens request `len` long appends at `step`: up to `most` in all,
// at least one for most requests at step 0, up to 3 later.
inline int draw_append(std::mt19937_64& rng, int step, int most, int len) {
  int add = step == 0 ? uniform(rng, 0, most) : uniform(rng, 0, 3);
  if (step == 0 && coin(rng, 0.8)) add = std::max(add, 1);
  return std::min(add, most - len);
}

// The query counts the observe-step invariant (docs/integration.md) lets
// sequence b of `state` (a batch's view of it) have this step, besides 0:
// [least, most]. Once its row has observed a query, its queries are its
// new tokens and, below them, tokens admitted without a query (observed
// count 0); before, any of its last 1 .. len tokens. Empty (least > most)
// when none is allowed. Read from the host's state, which the device's
// equals after every compare.
struct query_bounds {
  int least = 1, most = 0;
  bool empty() const { return least > most; }
};
inline query_bounds allowed_queries(const sh::eviction_state<host_space>& state, int b, int len) {
  const int r = state.row(b);
  if (r < 0 || len == 0) return {};
  if (state.step[r] == 0) return {1, len};
  const int tracked = state.tracked[r];
  int unseen = 0;  // admitted without a query, just below the new tokens
  while (unseen < tracked && state.observed[state.row_index(r, 0, tracked - 1 - unseen)] == 0.0f) ++unseen;
  return {std::max(1, len - tracked), len - tracked + unseen};
}

// The scheduler reorders the batch; a contiguous cache's K/V rows (each of
// `layers` layers of `elements`) move with their request, `block` elements
// a batch position.
template <bool Paged, class T>
void shuffle_batch(std::mt19937_64& rng, request_batch& reqs, std::vector<T>& hk, std::vector<T>& hv,
                   std::int64_t block, std::size_t elements, int layers) {
  std::vector<int> p(reqs.batch);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  if constexpr (!Paged) {
    const std::vector<T> k_old = hk, v_old = hv;
    for (int l = 0; l < layers; ++l)
      for (int q = 0; q < reqs.live(); ++q) {
        const std::size_t from = elements * l + reqs.pos_of[q] * block, to = elements * l + p[q] * block;
        std::copy_n(k_old.begin() + from, block, hk.begin() + to);
        std::copy_n(v_old.begin() + from, block, hv.begin() + to);
      }
  }
  reqs.move_to(p);
}

// The shortest non-empty sequence (INT_MAX: none) and the longest.
inline std::pair<int, int> length_range(const request_batch& reqs) {
  int shortest = std::numeric_limits<int>::max(), longest = 0;
  for (int b = 0; b < reqs.batch; ++b) {
    const int l = reqs.len_at(b);
    if (l > 0) shortest = std::min(shortest, l);
    longest = std::max(longest, l);
  }
  return {shortest, longest};
}

// One query's attention probabilities over `visible` keys (a softmax of
// `logit` draws); `ties` rounds them to 1/16 (many equal scores).
inline void fill_probabilities(float* row, int visible, std::normal_distribution<float>& logit, std::mt19937_64& rng,
                               bool ties) {
  float total = 0.0f;
  for (int t = 0; t < visible; ++t) total += (row[t] = std::exp(logit(rng)));
  for (int t = 0; t < visible; ++t) {
    row[t] /= total;
    if (ties) row[t] = std::round(row[t] * 16.0f) / 16.0f;
  }
}

// Each request's new length (new_lengths at its batch position).
inline std::vector<int> kept_lengths(const request_batch& reqs, const std::vector<std::int32_t>& h_new) {
  std::vector<int> kept(reqs.live());
  const auto who = reqs.at_position();
  for (int b = 0; b < reqs.batch; ++b)
    if (who[b] >= 0) kept[who[b]] = h_new[b];
  return kept;
}

// ---------------------------------------------------------------------------
// Comparisons

// A state row to compare and how many slots it holds.
struct row_slots {
  int row = 0, slots = 0;
};

// Every live request's state row, with `slots[q]` slots.
inline std::vector<row_slots> live_rows(const request_batch& reqs, const std::vector<int>& slots) {
  std::vector<row_slots> out;
  for (int q = 0; q < reqs.live(); ++q) out.push_back({reqs.row_of[q], slots[q]});
  return out;
}

// How scores compare: bit for bit, or (observe_queries, whose dot products
// are summed in another order) within 1e-4 * max(1, |host|), where 0/1
// scores (binary) may flip for at most 1% of the slots.
struct score_rule {
  bool exact = true;
  bool binary = false;
};

// Each listed row's counters exact, its per-slot positions and observed
// counts bit for bit, its scores within the rule, its ring words (if
// compare_ring) exact; with check_tickets, every row's ticket word back to
// 0 after a launch (finish_block). Returns whether the log holds no
// mismatch.
inline bool compare_state(const std::string& when, const sh::eviction_state<host_space>& h,
                          const sh::eviction_state<host_space>& d, const std::vector<row_slots>& rows,
                          score_rule rule, bool compare_ring, mismatch_log& log, bool check_tickets = true) {
  const auto& shape = h.shape;
  std::size_t compared = 0, flips = 0;
  if (check_tickets)
    for (int r = 0; r < shape.rows; ++r)
      if (d.blocks_done[r] != 0) log.add(when, ": blocks_done[", r, "] is ", d.blocks_done[r], ", not 0");
  for (const row_slots& rs : rows) {
    const int r = rs.row;
    if (h.step[r] != d.step[r]) log.add(when, ": step[", r, "] host ", h.step[r], " device ", d.step[r]);
    if (h.next_position[r] != d.next_position[r])
      log.add(when, ": next_position[", r, "] host ", h.next_position[r], " device ", d.next_position[r]);
    if (h.tracked[r] != d.tracked[r]) log.add(when, ": tracked[", r, "] host ", h.tracked[r], " device ", d.tracked[r]);
    for (int head = 0; head < shape.kv_heads; ++head)
      for (int t = 0; t < rs.slots; ++t) {
        const std::int64_t i = h.row_index(r, head, t);
        ++compared;
        if (h.positions[i] != d.positions[i])
          log.add(when, ": position (row ", r, ",", head, ",", t, ") host ", h.positions[i], " device ",
                  d.positions[i]);
        if (!same_bits(h.observed[i], d.observed[i]))
          log.add(when, ": observed (row ", r, ",", head, ",", t, ") host ", h.observed[i], " device ",
                  d.observed[i]);
        if (rule.exact) {
          if (!same_bits(h.scores[i], d.scores[i]))
            log.add(when, ": score (row ", r, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i]);
        } else {
          const float tol = 1e-4f * std::max(1.0f, std::fabs(h.scores[i]));
          if (!(std::fabs(h.scores[i] - d.scores[i]) <= tol)) {
            if (rule.binary)
              ++flips;
            else
              log.add(when, ": score (row ", r, ",", head, ",", t, ") host ", h.scores[i], " device ", d.scores[i],
                      " beyond tolerance ", tol);
          }
        }
        if (compare_ring)
          for (int w = 0; w < shape.ring_words; ++w)
            if (h.ring_of(i)[w] != d.ring_of(i)[w])
              log.add(when, ": ring word ", w, " of (row ", r, ",", head, ",", t, ") host ", h.ring_of(i)[w],
                      " device ", d.ring_of(i)[w]);
      }
  }
  if (flips > std::max<std::size_t>(1, compared / 100))
    log.add(when, ": ", flips, " of ", compared, " 0/1 scores flipped, above the 1% allowed");
  return log.ok();
}

// The device's status words, all of which must be zero in a valid run.
inline bool status_clear(const std::string& when, const sh::eviction_state<host_space>& d, mismatch_log& log) {
  for (int r = 0; r < d.shape.rows; ++r)
    if (d.status[r] != 0)
      log.add(when, ": status word of row ", r, " is ", d.status[r], " (", sh::cuda::describe_status(d.status[r]), ")");
  return log.ok();
}

// compress's outputs (select's, for a shared_layers policy) against the
// host's: each new length equal and what length_after_compress says, each
// freed page count equal (with_freed).
inline bool check_outputs(const std::string& what, const case_config& c, const request_batch& reqs,
                          const std::vector<std::int32_t>& h_new, const device_buffer<std::int32_t>& d_new,
                          const std::vector<std::int32_t>& h_freed, const device_buffer<std::int32_t>& d_freed,
                          bool with_freed, mismatch_log& log) {
  const auto dev_new = d_new.download(), dev_freed = d_freed.download();
  for (int b = 0; b < reqs.batch; ++b) {
    if (dev_new[b] != h_new[b]) log.add(what, ": new_lengths[", b, "] host ", h_new[b], " device ", dev_new[b]);
    if (h_new[b] != sh::length_after_compress(reqs.len_at(b), c.budget, c.m))
      log.add(what, ": new_lengths[", b, "] ", h_new[b], " is not length_after_compress");
    if (with_freed && dev_freed[b] != h_freed[b])
      log.add(what, ": freed_pages[", b, "] host ", h_freed[b], " device ", dev_freed[b]);
  }
  return log.ok();
}

// Each request's first kept[q] K and V rows in `hview` (over hk, hv) bit for
// bit in the device's copies dev_k, dev_v.
template <class View, class T>
bool check_kept_rows(const std::string& what, const View& hview, const std::vector<T>& hk, const std::vector<T>& hv,
                     const std::vector<T>& dev_k, const std::vector<T>& dev_v, const request_batch& reqs,
                     const std::vector<int>& kept, mismatch_log& log) {
  const int H = hview.kv_heads, D = hview.head_dim;
  for (int q = 0; q < reqs.live(); ++q)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < kept[q]; ++t) {
        const int b = reqs.pos_of[q];
        const std::size_t ko = static_cast<std::size_t>(hview.k_row(b, h, t) - hk.data());
        const std::size_t vo = static_cast<std::size_t>(hview.v_row(b, h, t) - hv.data());
        if (std::memcmp(&hk[ko], &dev_k[ko], sizeof(T) * D) != 0)
          log.add(what, ": K row (request ", q, " at ", b, ",", h, ",", t, ") differs");
        if (std::memcmp(&hv[vo], &dev_v[vo], sizeof(T) * D) != 0)
          log.add(what, ": V row (request ", q, " at ", b, ",", h, ",", t, ") differs");
      }
  return log.ok();
}

}  // namespace harness
