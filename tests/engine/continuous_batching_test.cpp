// A multi-layer host decode loop run the way an inference engine runs it,
// checked against an independent model (reference_model.hpp):
//
//  - L layers, GQA (8 query heads on 2 KV heads), fp32; one FlashInfer page
//    pool per layer, but ONE page table and ONE page allocator for all
//    layers; page sizes 1, 4 and 16.
//  - continuous batching: requests join (a fresh state row, reset on every
//    layer), leave (pages back to the pool, row freed), move around the
//    batch every step (state.for_batch), padding slots (row -1) come and go;
//    each step mixes prefill chunks, decode tokens, idle requests and
//    admit-only chunks through a ragged qo_indptr.
//  - per step and layer: append K/V, attention (the test's own, in double),
//    observe (probabilities, or queries with FlashInfer's token-major base-2
//    LSE, or queries alone), compress into this layer's compress_output;
//    every layer must report the same new lengths and freed pages, equal to
//    length_after_compress; after the last layer the table is shrunk once
//    with host::shrink_page_table and the released pages go back.
//  - after every step: every kept K/V row is bit-identical to what its token
//    was appended with, the state's positions, counters and scores match the
//    model, protected tokens are all there, no token twice, pages conserved.
//  - refused calls (bad rows, bad query counts, a too-small state, bad
//    outputs, bad shrink arguments) throw scissorhands::invalid_argument
//    naming the argument, and leave cache, state, table and outputs
//    byte-identical.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "engine_support.hpp"
#include "reference_model.hpp"
#include "token_reference.hpp"

namespace {

using namespace engine_test;
namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

constexpr std::int32_t q_heads = 8;
constexpr std::int32_t kv_heads = 2;
constexpr std::int32_t group = q_heads / kv_heads;
constexpr std::int32_t state_rows = 6;  // sequences the states hold at once
constexpr std::int32_t max_active = 5;  // requests in flight
constexpr std::int32_t max_padding = 2;
constexpr std::int32_t max_batch = max_active + max_padding;
constexpr std::int32_t table_capacity_tokens = 256;  // what the page table allows a sequence

enum class feed { probabilities, queries_lse, queries_own_norm };

const char* name_of(feed f) {
  switch (f) {
    case feed::probabilities:
      return "probabilities";
    case feed::queries_lse:
      return "queries + base-2 lse";
    case feed::queries_own_norm:
      return "queries, library's own normaliser";
  }
  return "?";
}

struct config {
  feed input = feed::probabilities;
  std::int32_t layers = 3;
  std::int32_t head_dim = 16;
  bool hnd = false;
  std::int32_t budget = 20;
  std::int32_t chunk = 6;  // C: most tokens a request appends in one step
  sh::settings settings{};
  float softmax_scale = 0.0f;  // 0: the library's default 1/sqrt(head_dim)
  std::int32_t steps = 80;
  std::uint64_t seed = 1;

  std::string describe(std::int32_t page_size) const {
    std::ostringstream o;
    o << name_of(input) << ", page_size " << page_size << ", layers " << layers << ", head_dim " << head_dim
      << (hnd ? ", HND" : ", NHD") << ", budget " << budget << ", chunk " << chunk << ", " << settings_text(settings)
      << ", seed " << seed;
    return o.str();
  }
};

struct stats {
  std::int64_t triggers = 0, evicted = 0, joins = 0, leaves = 0, padding = 0, reused_rows = 0, prefill_chunks = 0,
               decode_tokens = 0, idle = 0, admit_only = 0, shifted_starts = 0, refused = 0, released_pages = 0,
               moved_in_batch = 0;
};

template <class Policy>
class engine {
 public:
  using rules_t = model_rules<Policy>;
  using view_t = sh::host_paged_kv_view<float>;
  using state_t = sh::eviction_state<host>;

  struct request {
    std::int32_t id = 0, row = 0, length = 0, start = 0;
    std::vector<std::int32_t> pages;
    std::int32_t prompt_left = 0, decode_left = 0;
    // Model: next position, steps observed, tokens per (layer, head) in slot order.
    std::int32_t next_position = 0;
    std::int64_t step = 0;
    std::vector<std::vector<model_token>> heads;
    // This step.
    std::int32_t n_new = 0, q_len = 0, base = 0, last_batch_position = -1;
  };

  engine(const config& c, std::int32_t page_size)
      : cfg_(c), ps_(page_size), rules_{c.settings}, rng_(c.seed * 1000003 + static_cast<std::uint64_t>(page_size)) {
    policy_.config = c.settings;
    d_ = c.head_dim;
    state_capacity_ = sh::state_capacity_for(c.budget, c.chunk);
    max_pages_ = (table_capacity_tokens + ps_ - 1) / ps_;
    // Enough pages for every request at the state's capacity, and a few spare.
    num_pages_ = max_active * ((state_capacity_ + ps_ - 1) / ps_) + 3;
    page_elems_ = std::int64_t{ps_} * kv_heads * d_;
    for (std::int32_t l = 0; l < c.layers; ++l) {
      for (int kind = 0; kind < 2; ++kind)
        pools_[kind].push_back(background(static_cast<std::size_t>(num_pages_ * page_elems_), 1000.0f, kind, l));
      const sh::state_shape shape{state_rows, kv_heads, state_capacity_, policy_.ring_words()};
      auto& buf = state_buffers_.emplace_back(sh::state_bytes(shape));
      states_.push_back(sh::make_state(buf.span(), shape));
      sh::host::reset_state(states_.back());
      new_lengths_.emplace_back(max_batch, -7);
      freed_.emplace_back(max_batch, -7);
    }
    // A state one slot deep, for the refused "length above the state's capacity" calls.
    const sh::state_shape small{state_rows, kv_heads, 1, policy_.ring_words()};
    small_buffer_ = std::make_unique<aligned_buffer>(sh::state_bytes(small));
    small_state_ = sh::make_state(small_buffer_->span(), small);
    sh::host::reset_state(small_state_);

    indptr_.assign(max_batch + 1, 0);
    indices_.assign(static_cast<std::size_t>(num_pages_ + 4), -1);
    last_page_len_.assign(max_batch, 0);
    qo_.assign(max_batch + 1, 0);
    rows_.assign(max_batch + 1, -1);
    released_.assign(indices_.size(), -1);
    for (std::int32_t p = 0; p < num_pages_; ++p) free_pages_.push_back(p);
    rng_.shuffle(free_pages_);
    for (std::int32_t r = 0; r < state_rows; ++r) free_rows_.push_back(r);

    const view_t probe = view(1);
    // Sized by the state (a quarter of the table's capacity or less), not the cache.
    workspace_ = std::make_unique<aligned_buffer>(sh::host::compress_workspace_bytes(probe, states_[0].shape));
    REQUIRE(sh::host::compress_workspace_bytes(probe, states_[0].shape) < sh::host::compress_workspace_bytes(probe));
  }

  void run() {
    INFO(cfg_.describe(ps_));
    // The state is sized by what is kept, not by what the table allows.
    REQUIRE(states_[0].shape.capacity == cfg_.budget + cfg_.chunk - 1);
    REQUIRE(states_[0].shape.capacity * 4 <= view(1).max_capacity());
    for (std::int32_t s = 0; s < cfg_.steps; ++s) {
      INFO("step " << s);
      step(s);
    }
    // Pages are released whenever a compress can cross a page boundary.
    const std::int32_t longest = state_capacity_, kept = cfg_.budget - cfg_.settings.evict_count;
    const bool crosses = (longest + ps_ - 1) / ps_ > (kept + ps_ - 1) / ps_;
    check_counters(cfg_.describe(ps_), {{"triggers", stats_.triggers, 20},
                                        {"evicted", stats_.evicted},
                                        {"joins", stats_.joins, 6},
                                        {"leaves", stats_.leaves, 3},
                                        {"padding", stats_.padding, 5},
                                        {"reused rows", stats_.reused_rows, 1},
                                        {"prefill chunks", stats_.prefill_chunks, 5},
                                        {"decode", stats_.decode_tokens, 20},
                                        {"idle", stats_.idle, 1},
                                        {"admit-only", stats_.admit_only, 1},
                                        {"shifted starts", stats_.shifted_starts, 1},
                                        {"refused calls", stats_.refused, 40},
                                        {"moved", stats_.moved_in_batch, 5},
                                        {"released pages", stats_.released_pages, crosses ? 1 : -1}});
  }

  const stats& counters() const { return stats_; }

 private:
  // ---- engine side ---------------------------------------------------------

  view_t view(std::int32_t batch, std::int32_t l = 0) {
    const auto ul = static_cast<std::size_t>(l);
    return paged_view(mspan(pools_[0][ul]), mspan(pools_[1][ul]), indptr_, indices_, last_page_len_, batch, kv_heads,
                      d_, ps_, num_pages_, max_pages_, cfg_.hnd);
  }
  view_t layer_view(std::int32_t l) { return view(batch_, l); }
  state_t layer_state(std::int32_t l) {
    return states_[static_cast<std::size_t>(l)].for_batch(cspan(rows_, static_cast<std::size_t>(batch_)));
  }
  sh::compress_output<host> output(std::int32_t l) {
    auto& nl = new_lengths_[static_cast<std::size_t>(l)];
    auto& fr = freed_[static_cast<std::size_t>(l)];
    std::fill(nl.begin(), nl.end(), -7);
    std::fill(fr.begin(), fr.end(), -7);
    return {{nl.data(), static_cast<std::size_t>(batch_)}, {fr.data(), static_cast<std::size_t>(batch_)}};
  }

  // Where row (page, head, in-page slot) starts, by the test's own maths.
  std::int64_t row_offset(std::int32_t page, std::int32_t h, std::int32_t t) const {
    return cfg_.hnd ? page * page_elems_ + (std::int64_t{h} * ps_ + t) * d_
                    : page * page_elems_ + (std::int64_t{t} * kv_heads + h) * d_;
  }
  float* row(int kind, std::int32_t l, const request& q, std::int32_t h, std::int32_t slot) {
    const std::int32_t page = q.pages[static_cast<std::size_t>(slot / ps_)];
    return pools_[kind][static_cast<std::size_t>(l)].data() + row_offset(page, h, slot % ps_);
  }

  void join() {
    request q;
    q.id = next_id_++;
    q.row = take_row(rng_, free_rows_, used_rows_, stats_.reused_rows);
    q.start = rng_.chance(0.25) ? rng_.uniform(1, 40) : 0;
    if (q.start > 0) ++stats_.shifted_starts;
    for (auto& st : states_) sh::host::reset_sequence(st, q.row, q.start);
    q.next_position = q.start;
    q.prompt_left = rng_.uniform(1, 45);
    q.decode_left = rng_.uniform(2, 40);
    q.heads.resize(static_cast<std::size_t>(cfg_.layers * kv_heads));
    active_.push_back(std::move(q));
    ++stats_.joins;
  }

  void leave(std::size_t i) {
    for (std::int32_t p : active_[i].pages) give_back(p);
    free_rows_.push_back(active_[i].row);
    active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    ++stats_.leaves;
  }

  void give_back(std::int32_t page) {
    const std::size_t at = rng_.next() % (free_pages_.size() + 1);
    free_pages_.insert(free_pages_.begin() + static_cast<std::ptrdiff_t>(at), page);
  }

  // Who leaves, who joins, the batch order, what each request appends.
  void schedule() {
    for (std::size_t i = active_.size(); i-- > 0;) {
      const auto& q = active_[i];
      if ((q.prompt_left == 0 && q.decode_left == 0) || rng_.chance(0.02)) leave(i);
    }
    while (static_cast<std::int32_t>(active_.size()) < max_active && !free_rows_.empty() &&
           rng_.chance(active_.empty() ? 1.0 : 0.35))
      join();
    order_.clear();
    for (std::size_t i = 0; i < active_.size(); ++i) order_.push_back(static_cast<std::int32_t>(i));
    const std::int32_t pads = rng_.chance(0.4) ? rng_.uniform(1, max_padding) : 0;
    for (std::int32_t i = 0; i < pads; ++i) order_.push_back(-1);
    if (order_.empty()) order_.push_back(-1);
    rng_.shuffle(order_);
    batch_ = static_cast<std::int32_t>(order_.size());
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (order_[static_cast<std::size_t>(b)] < 0) {
        ++stats_.padding;
        continue;
      }
      auto& q = active_[static_cast<std::size_t>(order_[static_cast<std::size_t>(b)])];
      plan_step(q, b, cfg_.chunk, rng_, stats_);
      const std::int32_t need = (q.length + q.n_new + ps_ - 1) / ps_;
      while (static_cast<std::int32_t>(q.pages.size()) < need) {
        REQUIRE(!free_pages_.empty());
        q.pages.push_back(free_pages_.back());
        free_pages_.pop_back();
      }
    }
  }

  request* at(std::int32_t b) {
    const std::int32_t i = order_[static_cast<std::size_t>(b)];
    return i < 0 ? nullptr : &active_[static_cast<std::size_t>(i)];
  }

  // The step's table (lengths after this step's appends), rows and qo_indptr.
  void build_table() {
    std::fill(indices_.begin(), indices_.end(), -1);
    indptr_[0] = 0;
    qo_[0] = 0;
    for (std::int32_t b = 0; b < batch_; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      request* q = at(b);
      std::int32_t used = indptr_[ub];
      if (q == nullptr) {
        last_page_len_[ub] = 0;
        rows_[ub] = -1;
        qo_[ub + 1] = qo_[ub];
      } else {
        for (std::int32_t p : q->pages) indices_[static_cast<std::size_t>(used++)] = p;
        const std::int32_t len = q->length + q->n_new;
        last_page_len_[ub] = len == 0 ? 0 : len - (static_cast<std::int32_t>(q->pages.size()) - 1) * ps_;
        rows_[ub] = q->row;
        qo_[ub + 1] = qo_[ub] + q->q_len;
      }
      indptr_[ub + 1] = used;
    }
    tokens_ = qo_[static_cast<std::size_t>(batch_)];
    max_len_ = 0;
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = at(b)) max_len_ = std::max(max_len_, q->length + q->n_new);
    columns_ = max_len_ + 3;  // a padded row stride
  }

  void append_kv(std::int32_t l) {
    for (std::int32_t b = 0; b < batch_; ++b) {
      request* q = at(b);
      if (q == nullptr) continue;
      for (std::int32_t i = 0; i < q->n_new; ++i)
        for (std::int32_t h = 0; h < kv_heads; ++h)
          for (int kind = 0; kind < 2; ++kind) {
            float* dst = row(kind, l, *q, h, q->length + i);
            for (std::int32_t x = 0; x < d_; ++x) dst[x] = token_value(kind, q->id, l, h, q->base + i, x);
          }
    }
  }

  // The engine's attention, in double over the cached keys: fills the
  // queries, the base-2 LSE (token-major) and the probabilities (fp32 for
  // the library, double for the model).
  void attention(std::int32_t l) {
    const auto t = static_cast<std::size_t>(tokens_);
    queries_.assign(t * q_heads * static_cast<std::size_t>(d_), 0.0f);
    lse_.assign(t * q_heads, 0.0f);
    probs_.assign(std::max<std::size_t>(1, t * q_heads * static_cast<std::size_t>(columns_)), -1.0f);  // poison
    probs_d_.assign(probs_.size(), std::numeric_limits<double>::quiet_NaN());
    const double scale =
        cfg_.softmax_scale > 0.0f ? static_cast<double>(cfg_.softmax_scale) : 1.0 / std::sqrt(static_cast<double>(d_));
    std::vector<double> logits(static_cast<std::size_t>(max_len_ + 1));
    for (std::int32_t b = 0; b < batch_; ++b) {
      request* q = at(b);
      if (q == nullptr || q->q_len == 0) continue;
      const std::int32_t len = q->length + q->n_new;
      for (std::int32_t j = 0; j < q->q_len; ++j) {
        const std::int32_t token = qo_[static_cast<std::size_t>(b)] + j;
        const std::int32_t position = q->base + q->n_new - q->q_len + j;
        const std::int32_t visible = len - q->q_len + j + 1;
        for (std::int32_t qh = 0; qh < q_heads; ++qh) {
          float* qrow = queries_.data() + (static_cast<std::size_t>(token) * q_heads + qh) * d_;
          for (std::int32_t x = 0; x < d_; ++x) qrow[x] = query_value(q->id, l, qh, position, x);
          double top = -std::numeric_limits<double>::infinity();
          for (std::int32_t s = 0; s < visible; ++s) {
            const float* k = row(0, l, *q, qh / group, s);
            double dot = 0.0;
            for (std::int32_t x = 0; x < d_; ++x) dot += static_cast<double>(qrow[x]) * k[x];
            logits[static_cast<std::size_t>(s)] = dot * scale;
            top = std::max(top, dot * scale);
          }
          double sum = 0.0;
          for (std::int32_t s = 0; s < visible; ++s) sum += std::exp(logits[static_cast<std::size_t>(s)] - top);
          const double lse = top + std::log(sum);
          lse_[static_cast<std::size_t>(token) * q_heads + qh] = static_cast<float>(lse / std::log(2.0));
          const std::size_t base = (static_cast<std::size_t>(token) * q_heads + qh) * columns_;
          for (std::int32_t s = 0; s < visible; ++s) {
            const double p = std::exp(logits[static_cast<std::size_t>(s)] - lse);
            probs_d_[base + s] = p;
            probs_[base + s] = static_cast<float>(p);
          }
        }
      }
    }
  }

  sh::host_span<const std::int32_t> qo_span() const { return {qo_.data(), static_cast<std::size_t>(batch_) + 1}; }

  void observe(const view_t& v, const state_t& st, sh::host_span<const std::int32_t> qo) {
    const sh::host_span<const float> q(queries_.data(), queries_.size());
    switch (cfg_.input) {
      case feed::probabilities:
        sh::host::observe_probabilities(policy_, v, st,
                                        sh::probability_view<host>::ragged(cspan(probs_), qo, q_heads, columns_));
        break;
      case feed::queries_lse:
        sh::host::observe_queries(policy_, v, st, sh::query_view<float, host>::ragged(q, qo, q_heads, d_),
                                  sh::lse_view<host>::ragged(cspan(lse_), qo, q_heads, sh::lse_base::base2),
                                  cfg_.softmax_scale);
        break;
      case feed::queries_own_norm:
        sh::host::observe_queries(policy_, v, st, sh::query_view<float, host>::ragged(q, qo, q_heads, d_), {},
                                  cfg_.softmax_scale);
        break;
    }
  }

  // ---- the model -----------------------------------------------------------

  bool exact() const { return cfg_.input == feed::probabilities || !rules_t::attention; }

  void model_observe(std::int32_t l) {
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = at(b))
        rules_.replay(*q, l, q->length + q->n_new, qo_[static_cast<std::size_t>(b)],
                      {kv_heads, group, columns_, probs_.data(), probs_d_.data()});
  }

  // After this layer's compress: which tokens the library evicted (read from
  // the cache), whether the model agrees they were the ones to evict, and
  // where the survivors must now sit.
  void model_compress(std::int32_t l, std::vector<std::string>& errors) {
    const std::int32_t m = cfg_.settings.evict_count;
    for (std::int32_t b = 0; b < batch_; ++b) {
      request* q = at(b);
      if (q == nullptr) continue;
      const std::int32_t len = q->length + q->n_new;
      if (len < cfg_.budget) continue;
      const std::int32_t kept = cfg_.budget - m;
      const std::int32_t evict = len - kept;
      const std::int32_t next = q->base + q->n_new;
      if (l == 0) {
        ++stats_.triggers;
        stats_.evicted += evict;
      }
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        auto& slots = q->heads[static_cast<std::size_t>(l * kv_heads + h)];
        std::ostringstream where;
        where << "layer " << l << ", request " << q->id << " (batch " << b << ", row " << q->row << "), head " << h
              << ": ";
        if (static_cast<std::int32_t>(slots.size()) != len) {
          errors.push_back(where.str() + "model and cache disagree on the length");
          continue;
        }
        // Positions the library kept, read from the V rows.
        std::set<std::int32_t> kept_positions;
        for (std::int32_t s = 0; s < kept; ++s) {
          const float* v = row(1, l, *q, h, s);
          kept_positions.insert(static_cast<std::int32_t>(v[0]));
        }
        std::vector<char> gone(static_cast<std::size_t>(len), 0);
        std::int32_t evicted_count = 0;
        for (std::int32_t s = 0; s < len; ++s)
          if (!kept_positions.count(slots[static_cast<std::size_t>(s)].position)) {
            gone[static_cast<std::size_t>(s)] = 1;
            ++evicted_count;
          }
        if (static_cast<std::int32_t>(kept_positions.size()) != kept || evicted_count != evict) {
          errors.push_back(where.str() + "kept " + std::to_string(kept_positions.size()) + " distinct known tokens, " +
                           std::to_string(evicted_count) + " evicted; expected " + std::to_string(kept) + " and " +
                           std::to_string(evict));
          continue;
        }
        for (std::int32_t s = 0; s < len; ++s)
          if (gone[static_cast<std::size_t>(s)] &&
              rules_.is_protected(slots[static_cast<std::size_t>(s)].position, next))
            errors.push_back(where.str() + "evicted protected position " +
                             std::to_string(slots[static_cast<std::size_t>(s)].position));
        if (exact()) {
          // The model's own choice: full sort on (eviction score, position).
          const auto want =
              token_reference<Policy>{rules_, cfg_.layers, kv_heads}.per_head_victims(q->heads, l, h, next, evict);
          if (want != gone)
            errors.push_back(where.str() + "evicted positions " + positions_text(slots, gone) + ", the model evicts " +
                             positions_text(slots, want));
        } else {
          // No evicted token may have scored clearly above a kept candidate.
          for (std::int32_t x = 0; x < len; ++x) {
            if (!gone[static_cast<std::size_t>(x)]) continue;
            const auto& e = slots[static_cast<std::size_t>(x)];
            const auto [elo, ehi] = rules_.eviction_bounds(e);
            for (std::int32_t y = 0; y < len; ++y) {
              const auto& k = slots[static_cast<std::size_t>(y)];
              if (gone[static_cast<std::size_t>(y)] || rules_.is_protected(k.position, next)) continue;
              const auto [klo, khi] = rules_.eviction_bounds(k);
              const bool above = elo > khi + rules_.tolerance(std::max(std::abs(ehi), std::abs(khi)));
              const bool tie_wrong = elo == ehi && klo == khi && elo == klo && e.position > k.position;
              if (above || tie_wrong) {
                std::ostringstream m_;
                m_ << where.str() << "evicted position " << e.position << " (score in [" << elo << ", " << ehi
                   << "]) but kept position " << k.position << " (score in [" << klo << ", " << khi << "])";
                errors.push_back(m_.str());
              }
            }
          }
        }
        // Where the survivors must sit now.
        slots = after_eviction(std::move(slots), gone, cfg_.settings.compaction_mode == sh::compaction::preserve_order);
      }
    }
  }

  // ---- checks --------------------------------------------------------------

  void check_outputs(std::int32_t l, std::vector<std::string>& errors) {
    const auto& nl = new_lengths_[static_cast<std::size_t>(l)];
    const auto& fr = freed_[static_cast<std::size_t>(l)];
    for (std::int32_t b = 0; b < batch_; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      const request* q = at(b);
      const std::int32_t len = q == nullptr ? 0 : q->length + q->n_new;
      const std::int32_t want = len >= cfg_.budget ? cfg_.budget - cfg_.settings.evict_count : len;
      const std::int32_t pages = q == nullptr ? 0 : static_cast<std::int32_t>(q->pages.size());
      const std::int32_t want_freed = pages - (want + ps_ - 1) / ps_;
      if (nl[ub] != want || nl[ub] != sh::length_after_compress(len, cfg_.budget, cfg_.settings.evict_count))
        errors.push_back("layer " + std::to_string(l) + ": new_lengths[" + std::to_string(b) +
                         "] = " + std::to_string(nl[ub]) + ", expected " + std::to_string(want));
      if (fr[ub] != want_freed)
        errors.push_back("layer " + std::to_string(l) + ": freed_pages[" + std::to_string(b) +
                         "] = " + std::to_string(fr[ub]) + ", expected " + std::to_string(want_freed));
      if (l > 0 && (nl[ub] != new_lengths_[0][ub] || fr[ub] != freed_[0][ub]))
        errors.push_back("layer " + std::to_string(l) + " reports other new lengths or freed pages than layer 0 at " +
                         std::to_string(b));
    }
    for (std::size_t i = static_cast<std::size_t>(batch_); i < nl.size(); ++i)
      if (nl[i] != -7 || fr[i] != -7) errors.push_back("compress wrote past the batch in its outputs");
  }

  void shrink(std::vector<std::string>& errors) {
    std::vector<std::int32_t> expect;
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = at(b)) {
        const std::int32_t keep = (new_lengths_[0][static_cast<std::size_t>(b)] + ps_ - 1) / ps_;
        expect.insert(expect.end(), q->pages.begin() + keep, q->pages.end());
      }
    const std::size_t n =
        shrink_table(indptr_, indices_, last_page_len_, batch_, ps_, new_lengths_[0], released_, expect, "", errors);
    for (std::int32_t b = 0; b < batch_; ++b) {
      request* q = at(b);
      if (q == nullptr) continue;
      const auto ub = static_cast<std::size_t>(b);
      const std::int32_t len = new_lengths_[0][ub];
      const std::int32_t keep = (len + ps_ - 1) / ps_;
      const std::vector<std::int32_t> now(indices_.begin() + indptr_[ub], indices_.begin() + indptr_[ub + 1]);
      if (static_cast<std::int32_t>(now.size()) != keep || !std::equal(now.begin(), now.end(), q->pages.begin()))
        errors.push_back("shrink_page_table did not keep the leading pages of batch position " + std::to_string(b));
      const std::int32_t table_len =
          now.empty() ? 0 : (static_cast<std::int32_t>(now.size()) - 1) * ps_ + last_page_len_[ub];
      if (table_len != len)
        errors.push_back("the shrunk table gives batch position " + std::to_string(b) + " a wrong length");
      q->pages = now;
      q->length = len;
      q->next_position = q->base + q->n_new;
      if (rules_t::attention) q->step += q->q_len;
    }
    for (std::size_t i = 0; i < std::min(n, released_.size()); ++i) give_back(released_[i]);
    stats_.released_pages += static_cast<std::int64_t>(n);
  }

  void check_all(std::vector<std::string>& errors) {
    std::vector<const std::vector<std::int32_t>*> held;
    for (const auto& q : active_) {
      if (static_cast<std::int32_t>(q.pages.size()) != (q.length + ps_ - 1) / ps_)
        errors.push_back("request " + std::to_string(q.id) + " holds a wrong number of pages");
      held.push_back(&q.pages);
    }
    check_pages("", num_pages_, held, free_pages_, errors);

    const bool ordered = cfg_.settings.compaction_mode == sh::compaction::preserve_order;
    for (auto& q : active_)
      for (std::int32_t l = 0; l < cfg_.layers; ++l)
        check_layer(
            rules_, states_[static_cast<std::size_t>(l)], q.heads,
            {l, q.id, q.row, q.length, kv_heads, d_, state_capacity_, q.start, q.next_position, q.step, ordered,
             exact()},
            [&](int kind, std::int32_t h, std::int32_t t) { return row(kind, l, q, h, t); },
            [&](std::int32_t) { return q.id; }, [](auto&&...) {}, errors);
  }

  // ---- refused calls -------------------------------------------------------

  // Every byte the caller owns: K/V, states, outputs, table and batch.
  snapshot_t snapshot() const {
    snapshot_t s;
    push_bytes(s, state_buffers_, *small_buffer_, pools_[0], pools_[1], new_lengths_, freed_, indptr_, indices_,
               last_page_len_, qo_, rows_, released_);
    return s;
  }

  template <class Call>
  void expect_refused(const char* label, const std::string& function, const std::string& argument, Call call) {
    check_refused_call(
        label, [&] { return snapshot(); }, function, argument, call, stats_.refused);
  }

  // Batch positions of sequences holding tokens.
  std::vector<std::int32_t> holding() {
    std::vector<std::int32_t> out;
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = at(b); q != nullptr && q->length + q->n_new > 0) out.push_back(b);
    return out;
  }

  // Whether a sequence at one of `positions` holds more than one token (a
  // one-slot state is too small for it).
  bool longer_than_one(const std::vector<std::int32_t>& positions) {
    return std::ranges::any_of(positions, [&](std::int32_t b) { return at(b)->length + at(b)->n_new > 1; });
  }

  void refused_observe_calls(std::int32_t l) {
    const std::string fn = cfg_.input == feed::probabilities ? "host::observe_probabilities" : "host::observe_queries";
    const view_t v = layer_view(l);
    const state_t& base = states_[static_cast<std::size_t>(l)];
    const auto full = holding();
    std::vector<std::int32_t> rows(rows_.begin(), rows_.begin() + batch_);
    const auto with_rows = [&](const std::vector<std::int32_t>& r) { return base.for_batch(cspan(r)); };
    expect_refused("state_rows one entry too many", fn, "state.state_rows",
                   [&] { observe(v, base.for_batch(cspan(rows_, rows.size() + 1)), qo_span()); });
    if (full.size() >= 2) {
      auto dup = rows;
      dup[static_cast<std::size_t>(full[1])] = dup[static_cast<std::size_t>(full[0])];
      expect_refused("duplicate state rows", fn, "state.state_rows", [&] { observe(v, with_rows(dup), qo_span()); });
    }
    for (std::int32_t bad : {state_rows, -2}) {
      auto out = rows;
      out[rng_.next() % out.size()] = bad;
      expect_refused("a state row out of range", fn, "state.state_rows",
                     [&] { observe(v, with_rows(out), qo_span()); });
    }
    if (!full.empty()) {
      auto pad = rows;
      pad[static_cast<std::size_t>(full.back())] = -1;
      expect_refused("row -1 for a sequence with tokens", fn, "state.state_rows",
                     [&] { observe(v, with_rows(pad), qo_span()); });
      // A state too small for the longest sequence (one slot; every length here is above 1 somewhere).
      if (longer_than_one(full))
        expect_refused("length above the state's capacity", fn, "state.shape.capacity",
                       [&] { observe(v, small_state_.for_batch(cspan(rows_, rows.size())), qo_span()); });
    }
    if (rules_t::attention && !full.empty()) {
      // One more query than the sequence has tokens (attention policies read queries; static ones ignore them).
      const std::int32_t b = full[rng_.next() % full.size()];
      const request* q = at(b);
      std::vector<std::int32_t> qo(qo_.begin(), qo_.begin() + batch_ + 1);
      const std::int32_t extra = q->length + q->n_new + 1 - q->q_len;
      for (std::int32_t i = b + 1; i <= batch_; ++i) qo[static_cast<std::size_t>(i)] += extra;
      expect_refused("q_len above the length", fn, "qo_indptr", [&] { observe(v, layer_state(l), cspan(qo)); });
    }
    expect_refused("reset_sequence of a row out of range", "host::reset_sequence", "row",
                   [&] { sh::host::reset_sequence(base, state_rows); });
    expect_refused("reset_sequence to a negative position", "host::reset_sequence", "start_position",
                   [&] { sh::host::reset_sequence(base, 0, -1); });
  }

  void refused_compress_calls(std::int32_t l) {
    const std::string fn = "host::compress";
    const view_t v = layer_view(l);
    const state_t st = layer_state(l);
    auto& nl = new_lengths_[static_cast<std::size_t>(l)];
    auto& fr = freed_[static_cast<std::size_t>(l)];
    const auto n = static_cast<std::size_t>(batch_);
    const sh::host_span<std::byte> ws = workspace_->span();
    const auto full = holding();
    const sh::compress_output<host> good{{nl.data(), n}, {fr.data(), n}};
    const auto call = [&](const state_t& s, std::int32_t budget, sh::host_span<std::byte> w,
                          sh::compress_output<host> out) { sh::host::compress(policy_, v, s, budget, w, out); };
    if (full.size() >= 2) {
      std::vector<std::int32_t> dup(rows_.begin(), rows_.begin() + batch_);
      dup[static_cast<std::size_t>(full[0])] = dup[static_cast<std::size_t>(full[1])];
      expect_refused("compress: duplicate state rows", fn, "state.state_rows",
                     [&] { call(states_[static_cast<std::size_t>(l)].for_batch(cspan(dup)), cfg_.budget, ws, good); });
    }
    expect_refused("compress: new_lengths over the lengths the view reads", fn, "out.new_lengths", [&] {
      call(st, cfg_.budget, ws, {{last_page_len_.data(), n}, {fr.data(), n}});
    });
    expect_refused("compress: new_lengths one short", fn, "out.new_lengths", [&] {
      call(st, cfg_.budget, ws, {{nl.data(), n - 1}, {fr.data(), n}});
    });
    expect_refused("compress: freed_pages over new_lengths", fn, "out.freed_pages", [&] {
      call(st, cfg_.budget, ws, {{nl.data(), n}, {nl.data(), n}});
    });
    // Optional with page size 1 (it counts trailing slots); required above.
    if (ps_ > 1)
      expect_refused("compress: no freed_pages for a paged cache", fn, "out.freed_pages", [&] {
        call(st, cfg_.budget, ws, {{nl.data(), n}, {}});
      });
    expect_refused("compress: workspace one byte short", fn, "workspace", [&] {
      call(st, cfg_.budget, {ws.data(), ws.size() - 1}, good);
    });
    const std::int32_t protect = cfg_.settings.recent + cfg_.settings.sinks;
    expect_refused("compress: budget not above the protected tokens", fn, "budget",
                   [&] { call(st, protect, ws, good); });
    if (longer_than_one(full))
      expect_refused("compress: length above the state's capacity", fn, "state.shape.capacity",
                     [&] { call(small_state_.for_batch(cspan(rows_, n)), cfg_.budget, ws, good); });
  }

  void refused_shrink_calls() {
    const std::string fn = "host::shrink_page_table";
    const auto n = static_cast<std::size_t>(batch_);
    std::vector<std::int32_t> lengths(new_lengths_[0].begin(), new_lengths_[0].begin() + batch_);
    std::size_t total = 0;
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = at(b))
        total += q->pages.size() - static_cast<std::size_t>((lengths[static_cast<std::size_t>(b)] + ps_ - 1) / ps_);
    const auto call = [&](const std::vector<std::int32_t>& nl, std::size_t released) {
      sh::host::shrink_page_table({indptr_.data(), n + 1}, {indices_.data(), indices_.size()},
                                  {last_page_len_.data(), n}, ps_, cspan(nl), {released_.data(), released});
    };
    for (std::int32_t b : holding()) {
      auto grown = lengths;
      grown[static_cast<std::size_t>(b)] = at(b)->length + at(b)->n_new + 1;
      expect_refused("shrink: a length that grows", fn, "new_lengths", [&] { call(grown, released_.size()); });
      break;
    }
    std::vector<std::int32_t> short_lengths(lengths.begin(), lengths.end() - 1);
    expect_refused("shrink: new_lengths one short", fn, "new_lengths", [&] { call(short_lengths, released_.size()); });
    if (total > 0) expect_refused("shrink: released one short", fn, "released", [&] { call(lengths, total - 1); });
  }

  // ---- one step ------------------------------------------------------------

  void step(std::int32_t s) {
    schedule();
    build_table();
    const bool inject = s % 6 == 3;
    const std::int32_t inject_layer = (s / 6) % cfg_.layers;
    std::vector<std::string> errors;
    for (std::int32_t l = 0; l < cfg_.layers; ++l) {
      INFO("layer " << l);
      append_kv(l);
      attention(l);
      if (inject && l == inject_layer) refused_observe_calls(l);
      observe(layer_view(l), layer_state(l), qo_span());
      model_observe(l);
      if (inject && l == inject_layer) refused_compress_calls(l);
      sh::host::compress(policy_, layer_view(l), layer_state(l), cfg_.budget, workspace_->span(), output(l));
      check_outputs(l, errors);
      model_compress(l, errors);
    }
    if (inject) refused_shrink_calls();
    shrink(errors);
    check_all(errors);
    report_step_errors(errors);
  }

  config cfg_;
  std::int32_t ps_;
  Policy policy_{};
  rules_t rules_;
  rng rng_;
  std::int32_t d_ = 0, state_capacity_ = 0, max_pages_ = 0, num_pages_ = 0;
  std::int64_t page_elems_ = 0;
  std::vector<std::vector<float>> pools_[2];  // [K, V][layer]
  std::vector<aligned_buffer> state_buffers_;
  std::vector<state_t> states_;
  std::unique_ptr<aligned_buffer> small_buffer_;
  state_t small_state_{};
  std::unique_ptr<aligned_buffer> workspace_;
  std::vector<std::vector<std::int32_t>> new_lengths_, freed_;  // [layer][max_batch]
  std::vector<std::int32_t> indptr_, indices_, last_page_len_, qo_, rows_, released_;
  std::vector<std::int32_t> free_pages_, free_rows_, used_rows_;
  std::vector<request> active_;
  std::vector<std::int32_t> order_;  // batch position -> index in active_, -1: padding
  std::int32_t batch_ = 0, tokens_ = 0, max_len_ = 0, columns_ = 1, next_id_ = 1;
  std::vector<float> queries_, lse_, probs_;
  std::vector<double> probs_d_;
  stats stats_;
};

constexpr auto fill_holes = sh::compaction::fill_holes;
constexpr auto preserve_order = sh::compaction::preserve_order;

template <class Policy>
void run_all(const std::vector<config>& configs) {
  for (std::size_t i = 0; i < configs.size(); ++i)
    for (std::int32_t page_size : {1, 4, 16}) {
      DYNAMIC_SECTION("config " << i << ", page size " << page_size) {
        engine<Policy> e(configs[i], page_size);
        e.run();
      }
    }
}

}  // namespace

// Each config runs at page sizes 1, 4 and 16; one row a config, laid out by
// hand (clang-format would split it into a line a field), alike on purpose
// (data, not code).
// clang-format off
TEST_CASE("engine loop: scissorhands policy", "[engine][continuous_batching]") {
  run_all<sh::scissorhands_policy>({
      {.input = feed::probabilities,
       .settings = make_settings(1, 4, 0, 16, false, fill_holes), .seed = 11},
      {.input = feed::queries_lse, .layers = 4, .head_dim = 32, .hnd = true, .budget = 30, .chunk = 8,
       .settings = make_settings(4, 3, 2, 24, true, preserve_order), .seed = 12},
  });
}

TEST_CASE("engine loop: important-step count", "[engine][continuous_batching]") {
  run_all<sh::important_count_policy>({
      {.input = feed::probabilities,
       .settings = make_settings(2, 4, 1, 16, false, fill_holes), .seed = 13},
  });
}

TEST_CASE("engine loop: h2o policy", "[engine][continuous_batching]") {
  run_all<sh::h2o_policy>({
      {.input = feed::queries_lse, .layers = 4, .head_dim = 32, .budget = 22, .chunk = 5,
       .settings = make_settings(1, 4, 0, 400, false, preserve_order), .seed = 21},
      {.input = feed::probabilities, .hnd = true, .budget = 18, .chunk = 7,
       .settings = make_settings(3, 2, 1, 400, true, fill_holes), .seed = 22},
      {.input = feed::queries_own_norm, .head_dim = 24, .budget = 26, .chunk = 6,
       .settings = make_settings(2, 5, 0, 400, false, fill_holes), .softmax_scale = 0.15f, .seed = 23},
  });
}

TEST_CASE("engine loop: h2o with the GQA max reduction", "[engine][continuous_batching]") {
  run_all<sh::eviction_policy<sh::attention_mass, sh::unbounded_history, sh::recent_window, sh::gqa_max>>({
      {.input = feed::probabilities, .layers = 3, .budget = 20, .chunk = 4,
       .settings = make_settings(2, 3, 0, 400, false, preserve_order), .seed = 31},
  });
}

TEST_CASE("engine loop: streaming policy with sinks", "[engine][continuous_batching]") {
  run_all<sh::streaming_policy>({
      {.input = feed::queries_lse, .budget = 16, .chunk = 6,
       .settings = make_settings(1, 6, 4, 400, false, fill_holes), .seed = 41},
      {.input = feed::probabilities, .layers = 4, .hnd = true, .budget = 20, .chunk = 8,
       .settings = make_settings(5, 3, 2, 400, false, preserve_order), .seed = 42},
  });
}
// clang-format on

// ---------------------------------------------------------------------------
// Outputs overlapping what a call reads. Found by this test when compress
// only checked its outputs against the lengths: an output over the page
// table (indptr, indices) or the batch's state rows, or shrink_page_table's
// `released` over its new_lengths, was accepted, wrote into the engine's
// table or mapping, and then read through the damage (ASan:
// heap-buffer-overflow in paged_kv_view::k_row and move_token). Now refused,
// naming the output; these cases keep every sequence below the budget so a
// regression fails cleanly instead of crashing.

namespace {

struct tiny_paged {
  // Two sequences, 7 and 3 tokens, on pages {0, 1} and {2}; budget 16 is not reached.
  std::vector<float> k = std::vector<float>(8 * 4 * 4, 1.0f), v = std::vector<float>(8 * 4 * 4, 2.0f);
  std::vector<std::int32_t> indptr{0, 2, 3}, indices{0, 1, 2, -1}, last_page_len{3, 3}, rows{1, 0};
  std::vector<std::int32_t> new_lengths{-7, -7}, freed{-7, -7};
  sh::h2o_policy policy;
  aligned_buffer buffer;
  sh::eviction_state<host> state;
  std::vector<std::byte> workspace;

  tiny_paged() : buffer(sh::state_bytes({2, 1, 16, 0})) {
    policy.config.recent = 2;
    state = sh::make_state(buffer.span(), {2, 1, 16, 0});
    sh::host::reset_state(state);
    sh::host::admit(policy, view(), batch_state());
    workspace.resize(sh::host::compress_workspace_bytes(view()) + 16);
  }
  sh::host_paged_kv_view<float> view() {
    return paged_view(mspan(k), mspan(v), indptr, indices, last_page_len, 2, 1, 4, 4, 8, 4);
  }
  sh::eviction_state<host> batch_state() { return state.for_batch(cspan(rows)); }
  void compress(sh::compress_output<host> out) {
    sh::host::compress(policy, view(), batch_state(), 16, mspan(workspace), out);
  }
  std::vector<std::vector<std::int32_t>> snapshot() const { return {indptr, indices, last_page_len, rows}; }
};

}  // namespace

TEST_CASE("compress refuses outputs that alias the page table or the state rows", "[engine][aliasing][regression]") {
  tiny_paged t;
  const auto refused = [&](const char* argument, sh::compress_output<host> out) {
    check_refused(t, "host::compress", argument, [&] { t.compress(out); });
  };
  SECTION("new_lengths over indptr") { refused("out.new_lengths", {{t.indptr.data(), 2}, {t.freed.data(), 2}}); }
  SECTION("freed_pages over indices") {
    refused("out.freed_pages", {{t.new_lengths.data(), 2}, {t.indices.data(), 2}});
  }
  SECTION("new_lengths over the batch's state rows") {
    refused("out.new_lengths", {{t.rows.data(), 2}, {t.freed.data(), 2}});
  }
}

TEST_CASE("shrink_page_table refuses released aliasing new_lengths", "[engine][aliasing][regression]") {
  // Sequence 0: 13 tokens on pages {1, 2, 9, 3} shrinks to 5 (pages 9 and 3
  // released); sequence 1: 8 tokens on pages {4, 5} keeps 8. One scratch
  // buffer serves as new_lengths (first 2 entries) and released (4 entries):
  // releasing page 3 into released[1] turns new_lengths[1] into 3 before it
  // is read, so sequence 1 silently loses 5 tokens and page 5. (released
  // holds 4 entries so the damage stays in bounds.)
  std::vector<std::int32_t> indptr{0, 4, 6}, indices{1, 2, 9, 3, 4, 5}, last_page_len{1, 4};
  std::vector<std::int32_t> scratch{5, 8, -1, -1};
  const auto snapshot = [&] { return std::vector<std::vector<std::int32_t>>{indptr, indices, last_page_len}; };
  const auto shrink = [&] {
    (void)sh::host::shrink_page_table({indptr.data(), 3}, {indices.data(), indices.size()}, {last_page_len.data(), 2},
                                      4, cspan(scratch, 2), {scratch.data(), scratch.size()});
  };
  check_refused(snapshot, "host::shrink_page_table", "released", shrink);
}
