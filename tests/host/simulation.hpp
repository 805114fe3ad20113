#pragma once
// Multi-step decode simulations that drive the host backend and the oracle
// side by side and compare them after every observe and every compress.
//
// Each call appends tokens to every sequence (a ragged prefill first, then
// decode steps), writes their K/V rows from (sequence, head, position),
// hands attention probabilities to observe_probabilities, and compresses.
// After each call the test checks, for every (sequence, head):
//   - the kept positions equal the oracle's, scores and observed counts to the bit;
//   - protected positions (recent r, sinks s) all survived;
//   - every kept K and V row is bit-identical to the row written for its
//     position, i.e. rows and positions moved together;
//   - nothing outside the rows compaction may write changed (other
//     sequences, slots at or beyond the new length, padding, unused pages);
//   - preserve_order: slot order is position order; fill_holes: survivors
//     below the new length did not move;
//   - compress with a budget above every length changes no byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oracle.hpp"
#include "support.hpp"

namespace sh_test {

struct sim_spec {
  std::int32_t kv_heads = 2;
  std::int32_t group = 1;            // query heads per KV head
  std::int32_t head_dim = 8;
  std::vector<std::int32_t> prefill;  // tokens of the first call, per sequence (ragged)
  std::int32_t prefill_q = 1;         // queries of the first call (causal)
  std::int32_t decode_q = 1;          // tokens (and queries) per later call
  std::int32_t calls = 40;            // calls after the prefill
  std::int32_t budget = 16;
  sh::settings config{};
  bool quantized = false;             // probabilities from few levels: many exact ties
  std::uint64_t seed = 1;

  std::int32_t batch() const { return static_cast<std::int32_t>(prefill.size()); }
  // Slots a sequence can reach: the prefill, or budget - 1 plus one call.
  std::int32_t capacity() const {
    const std::int32_t longest = *std::max_element(prefill.begin(), prefill.end());
    return std::max(longest, budget - 1 + decode_q) + 2;
  }
  std::string describe() const {
    std::ostringstream s;
    s << "kv_heads " << kv_heads << ", group " << group << ", head_dim " << head_dim << ", prefill {";
    for (std::size_t i = 0; i < prefill.size(); ++i) s << (i ? "," : "") << prefill[i];
    s << "} q " << prefill_q << ", decode_q " << decode_q << ", budget " << budget << ", m " << config.evict_count
      << ", r " << config.recent << ", s " << config.sinks << ", w " << config.window << ", alpha " << config.alpha
      << ", decay " << config.decay << ", normalize " << config.normalize << ", "
      << (config.compaction_mode == sh::compaction::fill_holes ? "fill_holes" : "preserve_order")
      << ", pool " << config.pool_width << (config.pool_mode == sh::pooling::max ? " max" : " mean")
      << (quantized ? ", quantized" : "") << ", seed " << seed;
    return s.str();
  }
};

// A spec from its numbers, in the order the variant tables list them.
inline sim_spec make_sim_spec(std::int32_t kv_heads, std::int32_t group, std::int32_t head_dim,
                              std::vector<std::int32_t> prefill, std::int32_t prefill_q, std::int32_t decode_q,
                              std::int32_t calls, std::int32_t budget, std::int32_t m, std::int32_t recent,
                              std::int32_t sinks, std::int32_t window, sh::compaction mode, bool normalize,
                              std::uint64_t seed) {
  sim_spec s;
  s.kv_heads = kv_heads;
  s.group = group;
  s.head_dim = head_dim;
  s.prefill = std::move(prefill);
  s.prefill_q = prefill_q;
  s.decode_q = decode_q;
  s.calls = calls;
  s.budget = budget;
  s.config.evict_count = m;
  s.config.recent = recent;
  s.config.sinks = sinks;
  s.config.window = window;
  s.config.compaction_mode = mode;
  s.config.normalize = normalize;
  s.seed = seed;
  return s;
}

// The unnormalised attention weight query head qh gives `position` at step
// `step`: a persistent per-position importance times per-step noise, with
// a few exact zeros and a few uniform steps (every weight equal).
inline double attention_weight(const sim_spec& spec, std::int32_t b, std::int32_t qh, std::int64_t step,
                               std::int32_t position) {
  const auto s = static_cast<std::int64_t>(spec.seed);
  if (hash_of({s, b, step, 17}) % 11 == 0) return 1.0;  // a uniform step: probabilities sit on alpha / n
  const std::uint64_t noise = hash_of({s, b, qh, step, position});
  if (noise % 13 == 0) return 0.0;
  if (spec.quantized) return static_cast<double>(1 + (noise >> 8) % 3);
  const double importance = std::pow(1.0 - unit(hash_of({s, b, qh / 2, position})) * 0.999, -2.0);
  return importance * (0.25 + unit(noise));
}

template <class Cache>
std::vector<std::vector<float>> copy_buffers(const Cache& cache) {
  return {cache.data[0], cache.data[1]};
}

template <class Policy, class Cache>
class simulation {
 public:
  simulation(const sim_spec& spec, Policy policy, Cache& cache)
      : spec_(spec), policy_(policy), cache_(cache), st_(policy, cache.view()),
        oracle_(policy, spec.batch(), spec.kv_heads, spec.group),
        slot_pos_(static_cast<std::size_t>(spec.batch() * spec.kv_heads)),
        workspace_(sh::host::compress_workspace_bytes(cache.view())) {}

  void run() {
    INFO(spec_.describe());
    call(spec_.prefill, spec_.prefill_q);
    for (std::int32_t c = 0; c < spec_.calls; ++c) {
      INFO("call " << c + 1);
      call(std::vector<std::int32_t>(static_cast<std::size_t>(spec_.batch()), spec_.decode_q), spec_.decode_q);
    }
    // The run must have evicted, or it proved nothing.
    REQUIRE(evictions_ > 0);
  }

  std::int64_t evictions() const { return evictions_; }
  state_holder& state() { return st_; }
  oracle<Policy>& model() { return oracle_; }

  // One engine step: append, observe, check, compress, check.
  void call(const std::vector<std::int32_t>& appended, std::int32_t q_len) {
    const std::int32_t batch = spec_.batch();
    const std::int32_t H = spec_.kv_heads;
    // 1. Append K/V rows for the new tokens.
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t first = oracle_.next_position(b);
      for (std::int32_t i = 0; i < appended[static_cast<std::size_t>(b)]; ++i) {
        const std::int32_t slot = cache_.append(b);
        REQUIRE(slot < cache_.max_capacity());
        for (std::int32_t h = 0; h < H; ++h) {
          write_row(b, h, slot, first + i);
          slots(b, h).push_back(first + i);
        }
      }
    }
    // 2. Probabilities over the slots (columns = cache capacity; NaN beyond
    //    what each query sees, so reading them would poison the scores).
    const std::int32_t q_heads = H * spec_.group;
    const std::int32_t columns = cache_.max_capacity();
    std::vector<float> probs;
    std::vector<std::unordered_map<std::int32_t, std::int32_t>> slot_of(static_cast<std::size_t>(batch * H));
    if constexpr (oracle<Policy>::needs_attention()) {
      probs.assign(static_cast<std::size_t>(batch) * q_heads * q_len * columns,
                   std::numeric_limits<float>::quiet_NaN());
      for (std::int32_t b = 0; b < batch; ++b) {
        const std::int32_t len = cache_.length(b);
        for (std::int32_t h = 0; h < H; ++h)
          for (std::int32_t t = 0; t < len; ++t) slot_of[static_cast<std::size_t>(b * H + h)][slots(b, h)[t]] = t;
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t j = 0; j < q_len; ++j) {
            const std::int32_t visible = len - q_len + j + 1;
            const auto& pos = slots(b, qh / spec_.group);
            std::vector<double> w(static_cast<std::size_t>(visible));
            double sum = 0.0;
            for (std::int32_t t = 0; t < visible; ++t) {
              w[t] = attention_weight(spec_, b, qh, oracle_.step(b) + j, pos[t]);
              sum += w[t];
            }
            if (sum == 0.0) std::fill(w.begin(), w.end(), 1.0), sum = visible;
            float* row = probs.data() + ((static_cast<std::size_t>(b) * q_heads + qh) * q_len + j) * columns;
            for (std::int32_t t = 0; t < visible; ++t) row[t] = static_cast<float>(w[t] / sum);
          }
      }
    }
    // 3. Observe; K/V must not change.
    const auto before_observe = copy_buffers(cache_);
    auto view = cache_.view();
    sh::probability_view<host> pv{};
    if constexpr (oracle<Policy>::needs_attention())
      pv = sh::probability_view<host>::dense({probs.data(), probs.size()}, q_heads, q_len, columns);
    sh::host::observe_probabilities(policy_, view, st_.state, pv);
    REQUIRE(same_floats(before_observe[0], cache_.data[0]));
    REQUIRE(same_floats(before_observe[1], cache_.data[1]));

    for (std::int32_t b = 0; b < batch; ++b) {
      oracle_.admit(b, appended[static_cast<std::size_t>(b)], spec_.head_dim,
                    [&](std::int32_t h, std::int32_t position) {
                      key_scratch_.resize(static_cast<std::size_t>(spec_.head_dim));
                      for (std::int32_t d = 0; d < spec_.head_dim; ++d)
                        key_scratch_[static_cast<std::size_t>(d)] = token_value(0, b, h, position, d);
                      return key_scratch_.data();
                    });
      oracle_.observe(b, q_len, [&](std::int32_t qh, std::int32_t j, std::int32_t position) {
        const auto& map = slot_of[static_cast<std::size_t>(b * H + qh / spec_.group)];
        const std::int32_t t = map.at(position);
        return probs[((static_cast<std::size_t>(b) * q_heads + qh) * q_len + j) * columns + t];
      });
    }
    REQUIRE(check_state_against_oracle() == "");

    // 4. A budget above every length: no byte of cache, state or lengths changes.
    {
      const auto cache_before = copy_buffers(cache_);
      const auto state_before = st_.buffer.snapshot();
      std::vector<std::int32_t> len_before;
      for (std::int32_t b = 0; b < batch; ++b) len_before.push_back(cache_.length(b));
      auto out = cache_.output();
      sh::host::compress(policy_, cache_.view(), st_.state, cache_.max_capacity() + 1, workspace_.span(), out);
      REQUIRE(same_floats(cache_before[0], cache_.data[0]));
      REQUIRE(same_floats(cache_before[1], cache_.data[1]));
      REQUIRE(st_.buffer.equals(state_before));
      for (std::int32_t b = 0; b < batch; ++b) REQUIRE(cache_.length(b) == len_before[static_cast<std::size_t>(b)]);
      for (std::size_t b = 0; b < out.freed_pages.size(); ++b) REQUIRE(out.freed_pages[b] == 0);
      for (std::int32_t b = 0; b < batch; ++b) REQUIRE(out.new_lengths[static_cast<std::size_t>(b)] == len_before[static_cast<std::size_t>(b)]);
    }

    // 5. Compress at the budget.
    const auto cache_before = copy_buffers(cache_);
    const auto state_before = st_.buffer.snapshot();
    std::vector<std::vector<std::int32_t>> slots_before = slot_pos_;
    sh::host::compress(policy_, cache_.view(), st_.state, spec_.budget, workspace_.span(), cache_.output());

    std::vector<std::int32_t> new_lengths;
    std::vector<std::vector<std::vector<std::int32_t>>> evicted;
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t len = oracle_.length(b);
      const bool triggers = len >= spec_.budget;
      new_lengths.push_back(triggers ? spec_.budget - spec_.config.evict_count : len);
      evicted.push_back(oracle_.compress(b, spec_.budget));
      for (std::int32_t h = 0; h < H; ++h) {
        // Protected positions, straight from the definition (not the oracle).
        std::vector<std::int32_t> must_keep;
        for (std::int32_t p : slots(b, h))
          if (p >= oracle_.next_position(b) - spec_.config.recent || p < spec_.config.sinks) must_keep.push_back(p);
        const auto kept = library_positions(b, h, new_lengths.back());
        for (std::int32_t p : must_keep) {
          INFO("sequence " << b << " head " << h << ": protected position " << p);
          REQUIRE(std::find(kept.begin(), kept.end(), p) != kept.end());
        }
      }
      if (triggers) evictions_ += static_cast<std::int64_t>(evicted.back()[0].size());
    }
    REQUIRE(cache_.after_compress(new_lengths) == "");
    for (std::int32_t b = 0; b < batch; ++b) {
      INFO("sequence " << b);
      REQUIRE(cache_.length(b) == new_lengths[static_cast<std::size_t>(b)]);
      REQUIRE(st_.state.tracked[b] == new_lengths[static_cast<std::size_t>(b)]);
    }
    REQUIRE(check_kept_sets(evicted, new_lengths) == "");
    // Now take the library's slot order as the engine's (checked above).
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t h = 0; h < H; ++h) slots(b, h) = library_positions(b, h, new_lengths[static_cast<std::size_t>(b)]);
    REQUIRE(check_compaction(slots_before, new_lengths) == "");
    REQUIRE(check_rows() == "");
    REQUIRE(check_untouched(cache_before, state_before, slots_before, new_lengths) == "");
    REQUIRE(check_state_against_oracle() == "");
  }

  std::vector<std::int32_t>& slots(std::int32_t b, std::int32_t h) {
    return slot_pos_[static_cast<std::size_t>(b * spec_.kv_heads + h)];
  }

 private:
  void write_row(std::int32_t b, std::int32_t h, std::int32_t slot, std::int32_t position) {
    for (int kind = 0; kind < 2; ++kind) {
      float* row = cache_.row(kind, b, h, slot);
      for (std::int32_t d = 0; d < spec_.head_dim; ++d) row[d] = token_value(kind, b, h, position, d);
    }
  }

  std::vector<std::int32_t> library_positions(std::int32_t b, std::int32_t h, std::int32_t len) const {
    std::vector<std::int32_t> out;
    for (std::int32_t t = 0; t < len; ++t) out.push_back(st_.state.positions[st_.at(b, h, t)]);
    return out;
  }

  // Per slot: position as the engine knows it, score and observed count as
  // the oracle has them (bitwise), and the bookkeeping counters.
  std::string check_state_against_oracle() {
    std::ostringstream err;
    for (std::int32_t b = 0; b < spec_.batch(); ++b) {
      if (st_.state.tracked[b] != cache_.length(b)) err << "seq " << b << ": tracked " << st_.state.tracked[b] << "; ";
      if (st_.state.next_position[b] != oracle_.next_position(b))
        err << "seq " << b << ": next_position " << st_.state.next_position[b] << " vs " << oracle_.next_position(b)
            << "; ";
      if (st_.state.step[b] != oracle_.step(b))
        err << "seq " << b << ": step " << st_.state.step[b] << " vs " << oracle_.step(b) << "; ";
      if (oracle_.length(b) != cache_.length(b)) err << "seq " << b << ": oracle length differs; ";
      for (std::int32_t h = 0; h < spec_.kv_heads; ++h) {
        const auto& pos = slots(b, h);
        for (std::int32_t t = 0; t < cache_.length(b); ++t) {
          const std::int64_t i = st_.at(b, h, t);
          const std::int32_t p = st_.state.positions[i];
          if (p != pos[static_cast<std::size_t>(t)]) {
            err << "seq " << b << " head " << h << " slot " << t << ": position " << p << ", expected " << pos[t];
            return err.str();
          }
          const auto* tok = oracle_.find(b, h, p);
          if (tok == nullptr) {
            err << "seq " << b << " head " << h << ": position " << p << " unknown to the oracle";
            return err.str();
          }
          if (!same_bits(tok->score, st_.state.scores[i]) || !same_bits(tok->observed, st_.state.observed[i])) {
            err.precision(9);
            err << "seq " << b << " head " << h << " position " << p << ": score " << st_.state.scores[i]
                << " observed " << st_.state.observed[i] << ", oracle " << tok->score << " / " << tok->observed;
            return err.str();
          }
          if constexpr (std::is_same_v<typename Policy::history, sh::sliding_window> &&
                        oracle<Policy>::needs_attention()) {
            // The running window sum against a fresh sum: exact for the
            // indicator (small integers), within rounding otherwise.
            const double fresh = oracle_.window_sum(*tok, oracle_.step(b) - 1);
            const double tol = Policy::observation::binary ? 0.0 : 1e-5 * (1.0 + static_cast<double>(oracle_.step(b)));
            if (std::abs(fresh - static_cast<double>(tok->score)) > tol) {
              err << "seq " << b << " head " << h << " position " << p << ": window sum " << tok->score
                  << " drifted from the fresh sum " << fresh;
              return err.str();
            }
          }
        }
      }
    }
    return err.str();
  }

  std::string check_kept_sets(const std::vector<std::vector<std::vector<std::int32_t>>>& evicted,
                              const std::vector<std::int32_t>& new_lengths) {
    std::ostringstream err;
    for (std::int32_t b = 0; b < spec_.batch(); ++b)
      for (std::int32_t h = 0; h < spec_.kv_heads; ++h) {
        auto got = library_positions(b, h, new_lengths[static_cast<std::size_t>(b)]);
        std::vector<std::int32_t> want;
        for (const auto& t : oracle_.tokens(b, h)) want.push_back(t.position);
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        if (got != want) {
          err << "seq " << b << " head " << h << ": kept {";
          for (auto p : got) err << p << ' ';
          err << "} but the oracle keeps {";
          for (auto p : want) err << p << ' ';
          err << "}, evicting {";
          for (auto p : evicted[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)]) err << p << ' ';
          err << "}";
          return err.str();
        }
      }
    return "";
  }

  std::string check_compaction(const std::vector<std::vector<std::int32_t>>& before,
                               const std::vector<std::int32_t>& new_lengths) {
    for (std::int32_t b = 0; b < spec_.batch(); ++b)
      for (std::int32_t h = 0; h < spec_.kv_heads; ++h) {
        const auto& now = slots(b, h);
        const auto& old = before[static_cast<std::size_t>(b * spec_.kv_heads + h)];
        const auto kept = static_cast<std::size_t>(new_lengths[static_cast<std::size_t>(b)]);
        if (spec_.config.compaction_mode == sh::compaction::preserve_order) {
          if (!std::is_sorted(now.begin(), now.end()) || std::adjacent_find(now.begin(), now.end()) != now.end())
            return "preserve_order left slot order != position order in seq " + std::to_string(b) + " head " +
                   std::to_string(h);
        } else {
          // Hole filling: a kept token already below the new length stays put.
          for (std::size_t t = 0; t < kept && t < old.size(); ++t) {
            const bool survived = std::find(now.begin(), now.end(), old[t]) != now.end();
            if (survived && now[t] != old[t])
              return "fill_holes moved surviving position " + std::to_string(old[t]) + " from slot " +
                     std::to_string(t) + " in seq " + std::to_string(b) + " head " + std::to_string(h);
          }
        }
      }
    return "";
  }

  // Every live row holds exactly the values written for its position.
  std::string check_rows() {
    for (std::int32_t b = 0; b < spec_.batch(); ++b)
      for (std::int32_t h = 0; h < spec_.kv_heads; ++h)
        for (std::int32_t t = 0; t < cache_.length(b); ++t) {
          const std::int32_t p = slots(b, h)[static_cast<std::size_t>(t)];
          for (int kind = 0; kind < 2; ++kind) {
            const float* row = cache_.row(kind, b, h, t);
            for (std::int32_t d = 0; d < spec_.head_dim; ++d)
              if (!same_bits(row[d], token_value(kind, b, h, p, d)))
                return std::string(kind ? "V" : "K") + " row of seq " + std::to_string(b) + " head " +
                       std::to_string(h) + " slot " + std::to_string(t) + " is not the row of position " +
                       std::to_string(p);
          }
        }
    return "";
  }

  // Only rows below the new length of a sequence that compressed may change;
  // the state of sequences that did not compress is unchanged.
  std::string check_untouched(const std::vector<std::vector<float>>& cache_before,
                              const std::vector<std::byte>& state_before,
                              const std::vector<std::vector<std::int32_t>>& slots_before,
                              const std::vector<std::int32_t>& new_lengths) {
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<char> may_change(cache_.data[kind].size(), 0);
      for (std::int32_t b = 0; b < spec_.batch(); ++b) {
        const auto old_len = slots_before[static_cast<std::size_t>(b * spec_.kv_heads)].size();
        if (static_cast<std::size_t>(new_lengths[static_cast<std::size_t>(b)]) == old_len) continue;
        for (std::int32_t h = 0; h < spec_.kv_heads; ++h)
          for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t) {
            const std::int64_t o = cache_.row_offset(kind, b, h, t);
            std::fill_n(may_change.begin() + o, spec_.head_dim, 1);
          }
      }
      for (std::size_t i = 0; i < may_change.size(); ++i)
        if (!may_change[i] && !same_bits(cache_before[kind][i], cache_.data[kind][i]))
          return std::string(kind ? "V" : "K") + " element " + std::to_string(i) +
                 " changed though no kept row of a compressed sequence lives there";
    }
    // State of sequences that did not compress: compare through a state laid
    // over the snapshot.
    std::vector<std::byte> copy = state_before;
    auto* base = copy.data();
    const auto off = sh::detail::offsets_of(st_.shape);
    const auto* pos = reinterpret_cast<const std::int32_t*>(base + off.positions);
    const auto* score = reinterpret_cast<const float*>(base + off.scores);
    const auto* obs = reinterpret_cast<const float*>(base + off.observed);
    auto snapshot = st_.state;
    snapshot.ring = reinterpret_cast<std::uint32_t*>(base + off.ring);
    const auto same_ring = [&](std::int64_t i) {
      for (std::int32_t w = 0; w < st_.shape.ring_words; ++w)
        if (snapshot.ring_of(i)[w] != st_.state.ring_of(i)[w]) return false;
      return true;
    };
    for (std::int32_t b = 0; b < spec_.batch(); ++b) {
      const auto old_len = slots_before[static_cast<std::size_t>(b * spec_.kv_heads)].size();
      if (static_cast<std::size_t>(new_lengths[static_cast<std::size_t>(b)]) != old_len) continue;
      for (std::int32_t h = 0; h < spec_.kv_heads; ++h)
        for (std::int32_t t = 0; t < st_.shape.capacity; ++t) {
          const auto i = st_.at(b, h, t);
          if (pos[i] != st_.state.positions[i] || !same_bits(score[i], st_.state.scores[i]) ||
              !same_bits(obs[i], st_.state.observed[i]) || !same_ring(i))
            return "state of seq " + std::to_string(b) + " (below budget) changed at head " + std::to_string(h) +
                   " slot " + std::to_string(t);
        }
    }
    return "";
  }

  sim_spec spec_;
  Policy policy_;
  Cache& cache_;
  state_holder st_;
  oracle<Policy> oracle_;
  std::vector<std::vector<std::int32_t>> slot_pos_;  // [b * kv_heads + h]: position per slot
  aligned_bytes workspace_;
  std::vector<float> key_scratch_;
  std::int64_t evictions_ = 0;
};

// Builds the policy from a spec and runs a full simulation.
template <class Policy, class Cache>
std::int64_t simulate(const sim_spec& spec, Cache& cache) {
  Policy policy;
  policy.config = spec.config;
  simulation<Policy, Cache> sim(spec, policy, cache);
  sim.run();
  return sim.evictions();
}

}  // namespace sh_test
