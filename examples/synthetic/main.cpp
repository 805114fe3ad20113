// scissorhands_synthetic: decodes a synthetic sequence under a KV budget and
// reports how much memory each eviction policy saves and how much of the
// true attention mass its cache still holds.
//
// The attention is built to have what the Scissorhands paper observes in
// trained models: a few "heavy" tokens draw most of the attention, with
// power-law weights, and they stay heavy over many steps (persistence of
// importance), fading with half-lives of 100 to 25,600 steps; a sink at
// position 0; a bump on the last few tokens (recency); light noise per
// query head and per step. Every policy sees exactly the same attention: the
// runs go in lockstep, one synthetic step feeding all of them.
//
// Per step, each run does what an engine's decode loop does: append the new
// token's K/V rows, attend (here: take the true weights of the tokens its
// cache still holds and renormalise them, as softmax over the kept keys
// would), call host::observe_probabilities, then host::compress. The mass
// kept at a step is the share of the true (full-cache) attention mass that
// falls on cached tokens, averaged over query heads.
//
// The K row of each cached token carries the token's index in its first
// element, so the demo can tell which tokens a head kept; it also checks,
// every step, that this index equals the position the library keeps for
// the slot (rows and state move together).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh = scissorhands;

namespace {

constexpr std::int32_t kv_heads = 4;
constexpr std::int32_t q_heads = 8;
constexpr std::int32_t group = q_heads / kv_heads;
constexpr std::int32_t head_dim = 64;
constexpr std::int32_t recent = 10;  // the paper's r
constexpr std::int32_t sinks = 4;    // StreamingLLM's attention sinks
constexpr std::int32_t max_steps = 100000;

// ---------------------------------------------------------------------------
// Synthetic attention

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A uniform number in [0, 1) determined by (seed, a, b, c).
float unit(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t x = mix(mix(mix(seed ^ a) ^ b) ^ c);
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

class synthetic_attention {
 public:
  synthetic_attention(std::int32_t steps, std::uint64_t seed)
      : steps_(steps),
        seed_(seed),
        weight_(static_cast<std::size_t>(kv_heads) * steps),
        fade_(static_cast<std::size_t>(kv_heads) * steps),
        tilt_(static_cast<std::size_t>(q_heads) * steps),
        u_(static_cast<std::size_t>(q_heads) * steps),
        total_(q_heads) {}

  // Token t arrives and is the query of step t: its weights are drawn,
  // older heavy tokens fade by one step, and u(t, i) is computed for i <= t.
  void advance(std::int32_t t) {
    for (std::int32_t h = 0; h < kv_heads; ++h) {
      const std::size_t i = at(h, t);
      if (t == 0) {  // the sink every head attends to
        weight_[i] = 200.0f;
        fade_[i] = 1.0f;
      } else if (unit(seed_, 1, h, t) < heavy_share) {
        // Pareto, shape 1.2, from 4 (capped): a few tokens draw a lot.
        const float u = unit(seed_, 2, h, t);
        weight_[i] = std::min(400.0f, 4.0f * std::pow(1.0f - u, -1.0f / 1.2f));
        const float half_life = 100.0f * std::exp2(8.0f * unit(seed_, 3, h, t));
        fade_[i] = std::exp2(-1.0f / half_life);
      } else {
        weight_[i] = 0.2f + 0.3f * unit(seed_, 4, h, t);
        fade_[i] = 1.0f;
      }
      for (std::int32_t j = 0; j < t; ++j) weight_[at(h, j)] *= fade_[at(h, j)];
    }
    for (std::int32_t qh = 0; qh < q_heads; ++qh)  // each query head sees its KV head a little differently
      tilt_[at(qh, t)] = 0.7f + 0.6f * unit(seed_, 5, qh, t);
    for (std::int32_t qh = 0; qh < q_heads; ++qh) {
      const std::int32_t h = qh / group;
      double sum = 0.0;
      for (std::int32_t i = 0; i <= t; ++i) {
        const std::int32_t age = t - i;
        const float recency = age < 32 ? 40.0f * std::exp(-static_cast<float>(age) / 4.0f) : 0.0f;
        const float jitter = 0.6f + 0.8f * unit(seed_, 6 + std::uint64_t(qh), t, i);
        const float u = (weight_[at(h, i)] * tilt_[at(qh, i)] + recency) * jitter;
        u_[at(qh, i)] = u;
        sum += u;
      }
      total_[static_cast<std::size_t>(qh)] = sum;
    }
  }
  // Unnormalised attention of query head qh at the current step on token i.
  float weight(std::int32_t qh, std::int32_t i) const { return u_[at(qh, i)]; }
  double total(std::int32_t qh) const { return total_[static_cast<std::size_t>(qh)]; }

  // Share of the mass on the top `fraction` of tokens 0..t, mean over query heads.
  double top_share(std::int32_t t, double fraction) const {
    double share = 0.0;
    std::vector<float> row(static_cast<std::size_t>(t) + 1);
    const auto top = std::max<std::size_t>(1, static_cast<std::size_t>(fraction * row.size()));
    for (std::int32_t qh = 0; qh < q_heads; ++qh) {
      std::copy_n(u_.begin() + static_cast<std::ptrdiff_t>(at(qh, 0)), row.size(), row.begin());
      std::nth_element(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(top - 1), row.end(), std::greater<>());
      double s = 0.0;
      for (std::size_t k = 0; k < top; ++k) s += row[k];
      share += s / total(qh);
    }
    return share / q_heads;
  }

  static constexpr float heavy_share = 0.06f;

 private:
  std::size_t at(std::int32_t head, std::int32_t i) const {
    return static_cast<std::size_t>(head) * static_cast<std::size_t>(steps_) + static_cast<std::size_t>(i);
  }
  std::int32_t steps_;
  std::uint64_t seed_;
  std::vector<float> weight_;  // [kv_head][token] current intrinsic weight
  std::vector<float> fade_;    // [kv_head][token] per-step decay of that weight
  std::vector<float> tilt_;    // [q_head][token] fixed per-query-head factor
  std::vector<float> u_;       // [q_head][token] this step's unnormalised attention
  std::vector<double> total_;  // [q_head] this step's full-cache mass
};

// ---------------------------------------------------------------------------
// One policy at one budget, driven like an engine's decode loop.

struct run_result {
  std::string policy;
  std::int32_t budget = 0;
  std::size_t state_bytes = 0;
  double kept_sum = 0.0, kept_after_sum = 0.0, worst = 1.0;
  std::int32_t steps = 0, steps_after = 0;
};

class run_base {
 public:
  virtual ~run_base() = default;
  virtual void step(const synthetic_attention& attention, std::int32_t t) = 0;
  run_result result;
};

template <class Policy>
class policy_run final : public run_base {
 public:
  policy_run(std::string name, Policy policy, std::int32_t budget, std::int32_t steps) : policy_(policy) {
    result.policy = std::move(name);
    result.budget = budget;
    // A sequence never holds more than `budget` tokens: compress runs as
    // soon as it reaches the budget and leaves budget - m.
    capacity_ = std::min(budget, steps);
    const std::size_t elems = static_cast<std::size_t>(capacity_) * kv_heads * head_dim;
    k_.assign(elems, 0.0f);
    v_.assign(elems, 0.0f);
    cache_ = sh::make_kv_view(sh::host_span<float>(k_.data(), k_.size()), sh::host_span<float>(v_.data(), v_.size()),
                              sh::host_span<const std::int32_t>(length_, 1), 1, kv_heads, head_dim, capacity_,
                              sh::named_layout::nhd);
    const sh::state_shape shape = sh::state_shape_for(policy_, cache_);
    result.state_bytes = sh::state_bytes(shape);
    state_buffer_.reset(static_cast<std::byte*>(std::aligned_alloc(256, (result.state_bytes + 255) / 256 * 256)));
    if (!state_buffer_) throw std::bad_alloc();
    state_ = sh::make_state(sh::host_span<std::byte>(state_buffer_.get(), result.state_bytes), shape);
    sh::host::reset_state(state_);
    workspace_.resize((sh::host::compress_workspace_bytes(cache_) + 7) / 8);
    probs_.resize(static_cast<std::size_t>(q_heads) * capacity_);
  }

  void step(const synthetic_attention& attention, std::int32_t t) override {
    // 1. The engine appends the new token's K and V rows.
    std::int32_t len = length_[0];
    for (std::int32_t h = 0; h < kv_heads; ++h) {
      cache_.k_row(0, h, len)[0] = static_cast<float>(t);
      cache_.v_row(0, h, len)[0] = static_cast<float>(t);
    }
    length_[0] = ++len;
    // 2. Its attention over the cached tokens: the true weights, renormalised.
    double kept = 0.0;
    for (std::int32_t qh = 0; qh < q_heads; ++qh) {
      const std::int32_t h = qh / group;
      float* p = probs_.data() + static_cast<std::size_t>(qh) * len;
      double z = 0.0;
      for (std::int32_t slot = 0; slot < len; ++slot) {
        const auto token = static_cast<std::int32_t>(cache_.k_row(0, h, slot)[0]);
        if (slot < len - 1 && state_.positions[state_.index(0, h, slot)] != token)
          throw std::logic_error(result.policy + ": slot " + std::to_string(slot) + " of head " + std::to_string(h) +
                                 " holds token " + std::to_string(token) + " but its state says position " +
                                 std::to_string(state_.positions[state_.index(0, h, slot)]));
        p[slot] = attention.weight(qh, token);
        z += p[slot];
      }
      for (std::int32_t slot = 0; slot < len; ++slot) p[slot] = static_cast<float>(p[slot] / z);
      kept += z / attention.total(qh);
    }
    kept /= q_heads;
    result.kept_sum += kept;
    result.worst = std::min(result.worst, kept);
    ++result.steps;
    if (t >= result.budget) {  // the cache has evicted at least once
      result.kept_after_sum += kept;
      ++result.steps_after;
    }
    // 3. Observe this step's attention, then evict if the budget is reached.
    const auto probs = sh::probability_view<sh::memory_space::host>::dense(
        sh::host_span<const float>(probs_.data(), static_cast<std::size_t>(q_heads) * len), q_heads, 1, len);
    sh::host::observe_probabilities(policy_, cache_, state_, probs);
    // 4. The library reports the new length; the engine owns it and applies it.
    std::int32_t new_length = 0;
    sh::host::compress(policy_, cache_, state_, result.budget,
                       sh::host_span<std::byte>(reinterpret_cast<std::byte*>(workspace_.data()),
                                                workspace_.size() * sizeof(std::uint64_t)),
                       {sh::host_span<std::int32_t>(&new_length, 1), {}});
    length_[0] = new_length;
  }

 private:
  struct release {
    void operator()(std::byte* p) const { std::free(p); }
  };
  Policy policy_;
  std::int32_t capacity_ = 0;
  std::int32_t length_[1] = {0};
  std::vector<float> k_, v_;
  std::unique_ptr<std::byte, release> state_buffer_;
  std::vector<std::uint64_t> workspace_;  // 8-byte aligned, as compress asks
  std::vector<float> probs_;
  sh::host_kv_view<float> cache_{};
  sh::eviction_state<sh::memory_space::host> state_{};
};

template <class Policy>
std::unique_ptr<run_base> make_run(std::string name, Policy policy, std::int32_t budget, std::int32_t steps) {
  policy.config.recent = recent;
  policy.config.evict_count = 1;  // evict every step: constant memory peak
  return std::make_unique<policy_run<Policy>>(std::move(name), policy, budget, steps);
}

std::vector<std::unique_ptr<run_base>> make_runs(std::int32_t budget, std::int32_t steps) {
  std::vector<std::unique_ptr<run_base>> runs;
  sh::scissorhands_policy scissorhands;  // the measured default: w = 25, normalised, alpha = 2, r = 10
  runs.push_back(make_run("scissorhands", scissorhands, budget, steps));
  sh::scissorhands_paper_policy paper;  // w = 400, raw counts, alpha = 1, r = 10
  runs.push_back(make_run("scissorhands-paper", paper, budget, steps));
  sh::h2o_policy h2o;
  runs.push_back(make_run("h2o", h2o, budget, steps));
  h2o.config.normalize = true;
  runs.push_back(make_run("h2o, normalised", h2o, budget, steps));
  sh::streaming_policy streaming;
  streaming.config.sinks = sinks;
  runs.push_back(make_run("streaming (4 sinks)", streaming, budget, steps));
  sh::random_policy random;
  random.config.seed = 1;
  runs.push_back(make_run("random", random, budget, steps));
  return runs;
}

// ---------------------------------------------------------------------------
// Command line

struct options {
  std::int32_t steps = 2048;
  std::vector<std::int32_t> budgets;  // empty: steps/8, steps/4, steps/2
  std::uint64_t seed = 42;
};

constexpr const char* usage =
    "usage: scissorhands_synthetic [--steps N] [--budget B] [--seed S]\n"
    "  --steps N   tokens to decode, 1..100000 (default 2048)\n"
    "  --budget B  tokens each KV head may keep, at least 15 (10 recent + 4 sinks + 1);\n"
    "              repeat for several (default: steps/8, steps/4, steps/2)\n"
    "  --seed S    seed of the synthetic attention (default 42)\n";

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "scissorhands_synthetic: %s\n%s", message.c_str(), usage);
  std::exit(2);
}

template <class Int>
Int parse_int(std::string_view flag, std::string_view text, Int low, Int high) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || (error != std::errc() && error != std::errc::result_out_of_range) ||
      end != text.data() + text.size())
    fail(std::string(flag) + " needs an integer, got '" + std::string(text) + "'");
  if (error == std::errc::result_out_of_range || value < low || value > high)
    fail(std::string(flag) + " must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " +
         std::string(text));
  return value;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    std::string_view flag = arg, value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (flag == "--steps" || flag == "--budget" || flag == "--seed") {
      if (i + 1 >= argc) fail(std::string(flag) + " needs a value");
      value = argv[++i];
    }
    if (flag == "--steps")
      o.steps = parse_int<std::int32_t>(flag, value, 1, max_steps);
    else if (flag == "--budget")
      o.budgets.push_back(parse_int<std::int32_t>(flag, value, recent + sinks + 1, max_steps));
    else if (flag == "--seed")
      o.seed = parse_int<std::uint64_t>(flag, value, 0, UINT64_MAX);
    else
      fail("unknown argument '" + std::string(arg) + "'");
  }
  if (o.budgets.empty())
    for (std::int32_t divisor : {8, 4, 2}) o.budgets.push_back(std::max(recent + sinks + 1, o.steps / divisor));
  std::sort(o.budgets.begin(), o.budgets.end());
  o.budgets.erase(std::unique(o.budgets.begin(), o.budgets.end()), o.budgets.end());
  return o;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);
  const auto start = std::chrono::steady_clock::now();
  try {
    std::vector<std::unique_ptr<run_base>> runs;
    for (std::int32_t budget : opt.budgets)
      for (auto& run : make_runs(budget, opt.steps)) runs.push_back(std::move(run));

    synthetic_attention attention(opt.steps, opt.seed);
    for (std::int32_t t = 0; t < opt.steps; ++t) {
      attention.advance(t);
      for (auto& run : runs) run->step(attention, t);
    }

    const double row_bytes = 2.0 * head_dim * sizeof(float);  // one K and one V row
    const double full_bytes = row_bytes * kv_heads * opt.steps;
    std::printf("scissorhands synthetic decode: %d steps, 1 sequence, %d KV heads, %d query heads (GQA group %d), "
                "head_dim %d, fp32, evicting 1 token per step (m = 1), r = %d\n",
                opt.steps, kv_heads, q_heads, group, head_dim, recent);
    std::printf("attention: %.0f%% heavy tokens (power-law weights, half-lives 100..25600 steps), a sink at 0, "
                "recency, per-head and per-step noise;\n"
                "           at the last step the top 5%% of tokens hold %.1f%% of the mass, the top 20%% %.1f%%\n",
                100.0 * synthetic_attention::heavy_share, 100.0 * attention.top_share(opt.steps - 1, 0.05),
                100.0 * attention.top_share(opt.steps - 1, 0.20));
    std::printf("full cache: %d tokens per head, %.2f MiB of K+V\n\n", opt.steps, mib(full_bytes));
    std::printf("%-26s %7s %9s %10s %10s %10s %8s\n", "policy", "budget", "KV saved", "net saved", "mass kept",
                "mass kept", "worst");
    std::printf("%-26s %7s %9s %10s %10s %10s %8s\n", "", "", "", "(- state)", "all steps", "after 1st", "step");
    std::printf("%-26s %7d %8.1f%% %9.1f%% %9.2f%% %9.2f%% %7.2f%%\n", "full cache", opt.steps, 0.0, 0.0, 100.0,
                100.0, 100.0);
    for (const auto& run : runs) {
      const run_result& r = run->result;
      const double kv = row_bytes * kv_heads * std::min(r.budget, opt.steps);
      const double after = r.steps_after > 0 ? r.kept_after_sum / r.steps_after : 1.0;
      std::printf("%-26s %7d %8.1f%% %9.1f%% %9.2f%% %9.2f%% %7.2f%%\n", r.policy.c_str(), r.budget,
                  100.0 * (1.0 - kv / full_bytes), 100.0 * (1.0 - (kv + static_cast<double>(r.state_bytes)) / full_bytes),
                  100.0 * r.kept_sum / r.steps, 100.0 * after, 100.0 * r.worst);
    }
    std::printf("\nKV saved: 1 - peak K+V held / K+V of the full cache. Net saved: the same with the library's per-token\n"
                "state (positions, scores, history ring: 64 bytes per token and head for scissorhands, 12 for the\n"
                "others) counted against the saving. Mass kept: share of each step's full-cache attention mass\n"
                "on tokens still cached, mean over query heads, then over steps (all, or from the first eviction).\n");
    std::printf("(%.2f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scissorhands_synthetic: %s\n", e.what());
    return 1;
  }
  return 0;
}
