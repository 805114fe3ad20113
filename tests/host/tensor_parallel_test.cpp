// Tensor-parallel shared-slot eviction (partial_scores.hpp), simulated: R
// ranks, each a thread holding its shard of every layer's KV heads (its own
// caches and model state), run observe, local_scores, an all-reduce written
// here, select from the reduced scores and compact, step after step. Every
// rank must choose exactly the slots the others choose, and the slots a
// single rank holding all heads chooses; afterwards each shard must equal
// its heads of the single-rank model, so one block table still describes
// every rank's cache. A last case shows what a reduction that sums in a
// different order on different ranks does.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <scissorhands/host/threads.hpp>

#include "refusal.hpp"
#include "support.hpp"

namespace {

using namespace sh_test;

// One simulated participant: `heads` KV heads of every layer, from global
// head `first_head` on.
struct rank_shard {
  std::int32_t first_head, heads;
  std::vector<contiguous_cache> caches;  // one per layer
  sh::state_shape shape;
  aligned_bytes model_buffer;
  sh::model_state<host> model;
  std::unique_ptr<aligned_bytes> workspace;
  aligned_bytes compact_ws;
  std::vector<float> partial;
  std::vector<std::int32_t> counts, slots, cache_slots, new_lengths;

  rank_shard(std::int32_t first_head_, std::int32_t heads_, std::int32_t layers, std::int32_t batch,
             std::int32_t head_dim, std::int32_t capacity, std::int32_t ring_words, std::int32_t stride)
      : first_head(first_head_),
        heads(heads_),
        shape{batch, heads_, capacity, ring_words},
        model_buffer(sh::model_state_bytes(shape, layers)),
        model(sh::make_model_state(model_buffer.span(), shape, layers)),
        compact_ws(8),
        partial(sh::partial_score_count(layers, batch, capacity), -99.0f),
        counts(static_cast<std::size_t>(batch)),
        slots(static_cast<std::size_t>(batch * stride)),
        cache_slots(static_cast<std::size_t>(batch * stride)),
        new_lengths(static_cast<std::size_t>(batch)) {
    for (std::int32_t l = 0; l < layers; ++l)
      caches.push_back(make_contiguous(layout_kind::nhd, batch, heads, head_dim, capacity, 7));
    workspace = std::make_unique<aligned_bytes>(sh::host::select_workspace_bytes(caches[0].view(), shape) + 64);
    sh::host::reset_state(model);
  }
  sh::partial_scores<host> scores(std::int32_t total_heads) {
    return {{partial.data(), partial.size()}, model.layers, shape.rows, shape.capacity, total_heads};
  }
  // Everything a call may write but the workspace.
  auto snapshot() const {
    auto s = bytes_of_all(model_buffer.snapshot(), partial, counts, slots, cache_slots, new_lengths);
    for (const auto& c : caches) s.push_back(bytes_of(c.data[0])), s.push_back(bytes_of(c.data[1]));
    return s;
  }
  sh::eviction_selection<host> selection(std::int32_t stride) {
    return {stride,
            {counts.data(), counts.size()},
            {slots.data(), slots.size()},
            {cache_slots.data(), cache_slots.size()},
            {{new_lengths.data(), new_lengths.size()}, {}}};
  }
};

struct tp_scenario {
  std::int32_t layers = 3, batch = 3, kv_heads = 8, group = 2, head_dim = 4, budget = 20, steps = 48;
};

// K/V and attention depend on the global head and the token's position
// only, so every rank sees what the single rank sees for its heads.
float probability(std::int32_t l, std::int32_t b, std::int32_t q_head, std::int32_t position, std::int32_t step,
                  std::int32_t visible) {
  const double u = unit(hash_of({l, b, q_head, position, step}));
  return static_cast<float>(std::min(1.0, u * u * 3.0 / visible));  // about a third above 1 / visible
}

// Appends one token to every sequence of a shard and observes every layer.
template <class Policy>
void append_and_observe(const Policy& policy, rank_shard& s, const tp_scenario& sc,
                        const std::vector<std::vector<std::int32_t>>& slot_pos, std::int32_t step) {
  const std::int32_t q_heads = s.heads * sc.group;
  for (std::int32_t l = 0; l < sc.layers; ++l) {
    contiguous_cache& c = s.caches[static_cast<std::size_t>(l)];
    for (std::int32_t b = 0; b < sc.batch; ++b) {
      // A sequence gets a token when the shared map has one more than the cache.
      if (static_cast<std::int32_t>(slot_pos[static_cast<std::size_t>(b)].size()) == c.length(b)) continue;
      const std::int32_t slot = c.append(b);
      const std::int32_t position = slot_pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(slot)];
      for (std::int32_t h = 0; h < s.heads; ++h)
        for (int kind = 0; kind < 2; ++kind)
          for (std::int32_t d = 0; d < sc.head_dim; ++d)
            c.row(kind, b, h, slot)[d] = token_value(kind, b, (s.first_head + h) + 16 * l, position, d);
    }
    const std::int32_t cap = c.capacity;
    std::vector<float> probs(static_cast<std::size_t>(sc.batch * q_heads * cap), 0.0f);
    for (std::int32_t b = 0; b < sc.batch; ++b) {
      const std::int32_t len = c.length(b);
      for (std::int32_t qh = 0; qh < q_heads; ++qh)
        for (std::int32_t t = 0; t < len; ++t)
          probs[static_cast<std::size_t>((b * q_heads + qh) * cap + t)] =
              probability(l, b, s.first_head * sc.group + qh, slot_pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)],
                          step, len);
    }
    const auto view = sh::probability_view<host>::dense({probs.data(), probs.size()}, q_heads, 1, cap);
    sh::host::observe_probabilities(policy, c.view(), s.model.layer(l), view);
  }
}

using shard_list = std::vector<std::unique_ptr<rank_shard>>;

// One thread per call, joined; the first exception a rank threw is
// rethrown here (so a refused call fails the test instead of terminating).
class rank_threads {
 public:
  template <class F>
  void start(F&& f) {
    errors_.push_back(std::make_unique<std::exception_ptr>());
    threads_.emplace_back([error = errors_.back().get(), f = std::forward<F>(f)]() mutable {
      try {
        f();
      } catch (...) {
        *error = std::current_exception();
      }
    });
  }
  void join() {
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::vector<std::unique_ptr<std::exception_ptr>> errors;
    errors.swap(errors_);
    for (auto& e : errors)
      if (*e) std::rethrow_exception(*e);
  }

 private:
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<std::exception_ptr>> errors_;  // stable addresses while threads run
};

std::vector<rank_shard*> all_shards(rank_shard& whole, shard_list& ranks) {
  std::vector<rank_shard*> all{&whole};
  for (auto& r : ranks) all.push_back(r.get());
  return all;
}

// Runs the scenario with the single rank and with R ranks side by side;
// `exact`: the reduced sums are exact, so the choice must match the single
// rank's too (always for a max).
template <class Policy>
void run_ranks(const Policy& policy, const tp_scenario& sc, std::int32_t R, bool exact) {
  using Heads = typename Policy::granularity::head_reduction;
  const std::int32_t capacity = sh::state_capacity_for(sc.budget, 1);
  const std::int32_t m = policy.config.evict_count;
  const std::int32_t stride = sh::max_evictions(capacity, sc.budget, m);
  rank_shard whole(0, sc.kv_heads, sc.layers, sc.batch, sc.head_dim, capacity, policy.ring_words(), stride);
  shard_list ranks;
  const std::int32_t per = sc.kv_heads / R;
  for (std::int32_t k = 0; k < R; ++k)
    ranks.push_back(std::make_unique<rank_shard>(k * per, per, sc.layers, sc.batch, sc.head_dim, capacity,
                                                 policy.ring_words(), stride));
  const std::size_t floats = sh::partial_score_count(sc.layers, sc.batch, capacity);
  std::vector<float> reduced(floats);

  // The shared block table's view of every sequence: slot -> position.
  std::vector<std::vector<std::int32_t>> slot_pos(static_cast<std::size_t>(sc.batch));
  std::vector<std::int32_t> next_position(static_cast<std::size_t>(sc.batch), 0);
  std::int32_t evictions = 0;
  for (std::int32_t step = 0; step < sc.steps; ++step) {
    for (std::int32_t b = 0; b < sc.batch; ++b)
      // Sequence b joins at step 4 b (continuous batching's staggered lengths).
      if (step >= 4 * b) slot_pos[static_cast<std::size_t>(b)].push_back(next_position[static_cast<std::size_t>(b)]++);
    rank_threads threads;
    for (rank_shard* s : all_shards(whole, ranks))
      threads.start([&, s] { append_and_observe(policy, *s, sc, slot_pos, step); });
    threads.join();

    // Single rank: select over all heads.
    auto whole_sel = whole.selection(stride);
    sh::host::select(policy, whole.caches[0].view(), whole.model, sc.budget, whole.workspace->span(), whole_sel);

    // Ranks: local scores on their own threads, then the all-reduce (here:
    // rank order, the same bits delivered to every rank).
    for (auto& r : ranks)
      threads.start([&, rp = r.get()] {
        sh::host::local_scores(policy, rp->caches[0].view(), rp->model, sc.budget, rp->scores(sc.kv_heads));
      });
    threads.join();
    {
      // The plan in slices on threads writes the same bits as the serial call.
      rank_shard& r0 = *ranks[0];
      std::vector<float> sliced(floats, -5.0f);
      sh::partial_scores<host> out = r0.scores(sc.kv_heads);
      out.values = {sliced.data(), sliced.size()};
      sh::host::run_on_threads(sh::host::plan_local_scores(policy, r0.caches[0].view(), r0.model, sc.budget, out), 2);
      for (std::size_t i = 0; i < floats; ++i) REQUIRE(same_bits(sliced[i], r0.partial[i]));
    }
    for (std::size_t i = 0; i < floats; ++i) {
      float acc = ranks[0]->partial[i];
      for (std::int32_t k = 1; k < R; ++k) acc = Heads::combine(acc, ranks[static_cast<std::size_t>(k)]->partial[i]);
      reduced[i] = acc;
    }
    for (auto& r : ranks) r->partial = reduced;
    for (auto& r : ranks)
      threads.start([&, rp = r.get()] {
        sh::host::select(policy, rp->caches[0].view(), rp->model, sc.budget, rp->scores(sc.kv_heads),
                         rp->workspace->span(), rp->selection(stride));
      });
    threads.join();

    INFO("R = " << R << ", step " << step);
    for (std::int32_t k = 0; k < R; ++k) {
      const rank_shard& r = *ranks[static_cast<std::size_t>(k)];
      INFO("rank " << k);
      // Identical across ranks, bit for bit.
      REQUIRE(r.counts == ranks[0]->counts);
      REQUIRE(r.new_lengths == ranks[0]->new_lengths);
      for (std::int32_t b = 0; b < sc.batch; ++b)
        for (std::int32_t j = 0; j < r.counts[static_cast<std::size_t>(b)]; ++j)
          REQUIRE(r.slots[static_cast<std::size_t>(b * stride + j)] == ranks[0]->slots[static_cast<std::size_t>(b * stride + j)]);
    }
    if (exact) {
      REQUIRE(ranks[0]->counts == whole.counts);
      for (std::int32_t b = 0; b < sc.batch; ++b)
        for (std::int32_t j = 0; j < whole.counts[static_cast<std::size_t>(b)]; ++j)
          REQUIRE(ranks[0]->slots[static_cast<std::size_t>(b * stride + j)] == whole.slots[static_cast<std::size_t>(b * stride + j)]);
    }

    // Apply: every rank compacts its layers with its selection, the
    // single rank with its own; the shared table's map follows rank 0.
    for (rank_shard* s : all_shards(whole, ranks))
      threads.start([&, s] {
        const auto sel = s->selection(stride);
        for (std::int32_t l = 0; l < sc.layers; ++l) {
          contiguous_cache& c = s->caches[static_cast<std::size_t>(l)];
          sh::host::compact(policy, c.view(), s->model.layer(l), sel, s->compact_ws.span());
        }
      });
    threads.join();
    for (std::int32_t b = 0; b < sc.batch; ++b) {
      const std::int32_t count = ranks[0]->counts[static_cast<std::size_t>(b)];
      evictions += count;
      const auto first = ranks[0]->slots.begin() + b * stride;
      compact_slot_map(slot_pos[static_cast<std::size_t>(b)], std::vector<std::int32_t>(first, first + count),
                       policy.config.compaction_mode);  // fill_holes, the default
    }
    for (rank_shard* s : all_shards(whole, ranks))
      for (auto& c : s->caches) c.lengths = s->new_lengths;

    // Every shard: lengths, positions (the shared table's map), and, when
    // the choice matched the single rank's, state and K/V equal to its
    // heads of the single-rank model.
    for (const auto& rank : ranks)
      for (std::int32_t l = 0; l < sc.layers; ++l) {
        rank_shard& r = *rank;
        const auto st = r.model.layer(l);
        const auto whole_st = whole.model.layer(l);
        for (std::int32_t b = 0; b < sc.batch; ++b) {
          const auto& map = slot_pos[static_cast<std::size_t>(b)];
          REQUIRE(r.caches[static_cast<std::size_t>(l)].length(b) == static_cast<std::int32_t>(map.size()));
          for (std::int32_t h = 0; h < r.heads; ++h)
            for (std::int32_t t = 0; t < static_cast<std::int32_t>(map.size()); ++t) {
              REQUIRE(st.positions[st.index(b, h, t)] == map[static_cast<std::size_t>(t)]);
              if (!exact) continue;
              const std::int64_t w = whole_st.index(b, r.first_head + h, t);
              REQUIRE(same_bits(st.scores[st.index(b, h, t)], whole_st.scores[w]));
              REQUIRE(same_bits(st.observed[st.index(b, h, t)], whole_st.observed[w]));
              auto& rc = r.caches[static_cast<std::size_t>(l)];
              for (int kind = 0; kind < 2; ++kind)
                for (std::int32_t d = 0; d < sc.head_dim; ++d)
                  REQUIRE(same_bits(rc.row(kind, b, h, t)[d],
                                    whole.caches[static_cast<std::size_t>(l)].row(kind, b, r.first_head + h, t)[d]));
            }
        }
      }
  }
  CHECK(evictions > 0);  // the scenario reached the budget
}

// The default scenario on 2, 4 and 8 ranks, with one of the policy's
// settings changed.
template <class Policy>
void on_2_4_8_ranks(std::int32_t sh::settings::*setting, std::int32_t value, bool exact) {
  Policy policy;
  policy.config.*setting = value;
  for (std::int32_t R : {2, 4, 8}) run_ranks(policy, tp_scenario{}, R, exact);
}

template <class Base, class... Reductions>
using shared = sh::with_granularity<Base, sh::shared_layers<Reductions...>>;

}  // namespace

TEST_CASE("tensor parallel: ranks agree with each other and with one rank (max over heads: exact)", "[tensor_parallel]") {
  on_2_4_8_ranks<shared<sh::scissorhands_policy, sh::max_score, sh::max_score>>(&sh::settings::evict_count, 2, true);
}

TEST_CASE("tensor parallel: mean over heads of integer window counts is exact", "[tensor_parallel]") {
  // The paper's policy: unimportant-step counts, not normalised: every
  // partial sum is an integer below 2^24, so any summation order gives the
  // same bits.
  on_2_4_8_ranks<shared<sh::scissorhands_paper_policy>>(&sh::settings::window, 12, true);
}

TEST_CASE("tensor parallel: real-valued means: ranks agree with each other", "[tensor_parallel]") {
  // H2O's attention mass: sums in rank order round differently from one
  // rank's head order, so only agreement between ranks is promised.
  on_2_4_8_ranks<shared<sh::h2o_policy>>(&sh::settings::evict_count, 3, false);
}

TEST_CASE("tensor parallel: one rank through local_scores is select, bit for bit", "[tensor_parallel]") {
  using P = shared<sh::h2o_policy>;
  P policy;
  run_ranks(policy, tp_scenario{}, 1, true);
}

TEST_CASE("tensor parallel: a reduction that sums in another order on each rank makes ranks diverge",
          "[tensor_parallel]") {
  // Three ranks, one KV head each, one layer, one sequence. Slot 0's
  // eviction scores on the three heads are 1e8, -1e8 and 1: summed in rank
  // order, (1e8 + -1e8) + 1 = 1; starting from rank 1, (-1e8 + 1) + 1e8 = 0
  // (-1e8 + 1 rounds to -1e8). Slot 1 scores 0.2 on every head. With m = 1
  // a rank that got 1 evicts slot 1 (mean 0.2 < 1/3), one that got 0 evicts
  // slot 0: the same model, two block tables.
  using P = shared<sh::h2o_policy>;
  P policy;
  policy.config.recent = 2;
  const std::int32_t R = 3, len = 6, budget = len;
  const std::int32_t capacity = len, stride = sh::max_evictions(capacity, budget, 1);
  shard_list ranks;
  for (std::int32_t k = 0; k < R; ++k)
    ranks.push_back(std::make_unique<rank_shard>(k, 1, 1, 1, 4, capacity, policy.ring_words(), stride));
  const float head_scores[3][len] = {{1e8f, 0.2f, 50, 50, 50, 50}, {-1e8f, 0.2f, 50, 50, 50, 50}, {1, 0.2f, 50, 50, 50, 50}};
  for (std::int32_t k = 0; k < R; ++k) {
    rank_shard& r = *ranks[static_cast<std::size_t>(k)];
    contiguous_cache& c = r.caches[0];
    for (std::int32_t t = 0; t < len; ++t) c.append(0);
    sh::host::admit(policy, c.view(), r.model.layer(0));
    const auto st = r.model.layer(0);
    for (std::int32_t t = 0; t < len; ++t) st.scores[st.index(0, 0, t)] = head_scores[k][t];
    sh::host::local_scores(policy, c.view(), r.model, budget, r.scores(R));
  }
  const auto reduce_from = [&](std::int32_t start) {
    std::vector<float> out(ranks[0]->partial.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      float acc = 0.0f;
      for (std::int32_t n = 0; n < R; ++n) acc += ranks[static_cast<std::size_t>((start + n) % R)]->partial[i];
      out[i] = acc;
    }
    return out;
  };
  // The slot each rank evicts when rank k is given reduced_for(k).
  const auto choices = [&](const auto& reduced_for) {
    std::vector<std::int32_t> chosen;
    for (std::int32_t k = 0; k < R; ++k) {
      rank_shard& r = *ranks[static_cast<std::size_t>(k)];
      std::vector<float> reduced = reduced_for(k);
      const sh::partial_scores<host> scores{{reduced.data(), reduced.size()}, 1, 1, capacity, R};
      sh::host::select(policy, r.caches[0].view(), r.model, budget, scores, r.workspace->span(), r.selection(stride));
      REQUIRE(r.counts[0] == 1);
      chosen.push_back(r.slots[0]);
    }
    return chosen;
  };
  // Each rank sums starting with itself: they diverge.
  CHECK(choices(reduce_from) == std::vector<std::int32_t>{1, 0, 0});
  // The same bits to every rank (rank 0's order delivered to all) agree.
  CHECK(choices([&](std::int32_t) { return reduce_from(0); }) == std::vector<std::int32_t>{1, 1, 1});
}

TEST_CASE("tensor parallel: bad partial scores are refused, naming the argument", "[tensor_parallel][bad_input]") {
  using P = shared<sh::h2o_policy>;
  P policy;
  policy.config.recent = 2;
  const std::int32_t len = 6, capacity = 8;
  rank_shard r(0, 2, 2, 1, 4, capacity, policy.ring_words(), 8);
  for (auto& c : r.caches) {
    for (std::int32_t t = 0; t < len; ++t) c.append(0);
  }
  for (std::int32_t l = 0; l < 2; ++l) sh::host::admit(policy, r.caches[static_cast<std::size_t>(l)].view(), r.model.layer(l));
  // local_scores (select, when `selecting`) with rank r's scores but for
  // `breaks` refuses, naming `argument`, and writes nothing.
  const auto refused = [&](const char* argument, auto&& breaks, bool selecting = false) {
    auto bad = r.scores(4);
    breaks(bad);
    if (selecting)
      check_refused(r, "host::select", argument, [&] {
        sh::host::select(policy, r.caches[0].view(), r.model, 4, bad, r.workspace->span(), r.selection(8));
      });
    else
      check_refused(r, "host::local_scores", argument,
                    [&] { sh::host::local_scores(policy, r.caches[0].view(), r.model, 4, bad); });
  };
  using scores = sh::partial_scores<host>;
  refused("partial.layers", [](scores& s) { s.layers = 1; });
  refused("partial.batch", [](scores& s) { s.batch = 2; });
  refused("partial.capacity", [&](scores& s) { s.capacity = capacity - 1; });
  refused("partial.kv_heads", [](scores& s) { s.kv_heads = 1; });  // fewer heads than this rank holds
  refused("partial.values", [](scores& s) { s.values = {s.values.data(), s.values.size() - 1}; });
  // The reduced buffer must not share bytes with what select writes.
  refused("workspace", [&](scores& s) { s.values = {reinterpret_cast<float*>(r.workspace->data()), s.values.size()}; },
          true);
  refused("reduced.kv_heads", [](scores& s) { s.kv_heads = 0; }, true);
}
