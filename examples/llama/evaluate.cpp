#include "evaluate.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <scissorhands/policy/budget.hpp>

#include "engine.hpp"
#include "tokenizer.hpp"

namespace llama {

namespace sh = scissorhands;

sampler::sampler(float temperature, float top_p, std::uint64_t seed)
    : temperature_(temperature), top_p_(top_p), rng_(seed) {
  if (!(temperature >= 0.0f)) throw std::invalid_argument("sampler: temperature must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw std::invalid_argument("sampler: top_p must be in (0, 1]");
}

std::int32_t sampler::operator()(const float* logits, std::int32_t vocab) {
  if (temperature_ == 0.0f) return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
  const float mx = *std::max_element(logits, logits + vocab);
  scratch_.clear();
  double sum = 0.0;
  for (std::int32_t i = 0; i < vocab; ++i) {
    const float p = std::exp((logits[i] - mx) / temperature_);
    scratch_.emplace_back(p, i);
    sum += p;
  }
  // Nucleus: the smallest set of most likely tokens whose mass reaches top_p.
  std::sort(scratch_.begin(), scratch_.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  double kept = 0.0;
  std::size_t n = 0;
  while (n < scratch_.size() && kept < top_p_ * sum) kept += scratch_[n++].first;
  std::uniform_real_distribution<double> u(0.0, kept);
  double r = u(rng_);
  for (std::size_t i = 0; i < n; ++i) {
    r -= scratch_[i].first;
    if (r <= 0.0) return scratch_[i].second;
  }
  return scratch_[n - 1].second;
}

std::vector<eval_text> sample_texts(const model& m, std::int32_t count, std::int32_t length, std::uint64_t seed,
                                    float temperature, float top_p) {
  if (count < 0 || length < 2) throw std::invalid_argument("sample_texts: need count >= 0 and length >= 2");
  engine e(m, length);
  std::vector<eval_text> out;
  for (std::int32_t k = 0; k < count; ++k) {
    sampler next(temperature, top_p, seed + static_cast<std::uint64_t>(k));
    e.reset();
    eval_text t;
    t.name = "sample(seed=" + std::to_string(seed + static_cast<std::uint64_t>(k)) + ")";
    t.tokens.push_back(1);  // BOS
    while (static_cast<std::int32_t>(t.tokens.size()) < length)
      t.tokens.push_back(next(e.step(t.tokens.back()), m.config.vocab));
    out.push_back(std::move(t));
  }
  return out;
}

eval_text read_text_file(const std::string& path, const tokenizer& tok) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open text file '" + path + "'");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  eval_text t{path, tok.encode(s, true)};
  if (t.tokens.size() < 2) throw std::runtime_error("text file '" + path + "' encodes to fewer than 2 tokens");
  return t;
}

eval_text read_token_file(const std::string& path, std::int32_t vocab) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open token file '" + path + "'");
  eval_text t{path, {}};
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long id = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || id < 0 || id >= vocab)
      throw std::runtime_error("token file '" + path + "': '" + word + "' (token " + std::to_string(t.tokens.size()) +
                               ") is not a token id in [0, " + std::to_string(vocab) + ")");
    t.tokens.push_back(static_cast<std::int32_t>(id));
  }
  if (t.tokens.size() < 2) throw std::runtime_error("token file '" + path + "' holds fewer than 2 tokens");
  return t;
}

std::vector<std::int32_t> allocate_budgets(std::int32_t budget, std::int32_t layers, allocator_kind kind,
                                           double slope) {
  const auto total = sh::total_budget::tokens_per_head(budget, layers);
  switch (kind) {
    case allocator_kind::uniform: return sh::allocate(sh::uniform_budget{}, total, layers);
    case allocator_kind::ramp: return sh::allocate(sh::ramp_budget{slope}, total, layers);
    case allocator_kind::pyramid: return sh::allocate(sh::pyramid_budget{slope}, total, layers);
  }
  throw std::invalid_argument("allocate_budgets: unknown allocator");
}

run_result evaluate_nll(const model& m, const std::vector<eval_text>& texts, const policy_spec* spec,
                        const std::vector<std::int32_t>& budgets, const eval_options& options,
                        const std::function<void()>& tick) {
  std::int32_t longest = 2;
  for (const auto& t : texts) longest = std::max(longest, static_cast<std::int32_t>(t.tokens.size()));
  engine e(m, longest, options.layout);
  e.set_policy(spec, budgets, options.source);
  run_result r;
  r.label = spec ? spec->label : "full";
  r.description = spec ? spec->describe() : "full cache";
  r.budgets = spec ? budgets : std::vector<std::int32_t>{};
  if (spec) {
    std::int64_t sum = 0;
    for (auto b : budgets) sum += b;
    r.budget = static_cast<std::int32_t>(sum / static_cast<std::int64_t>(budgets.size()));
  }
  r.state_bytes = static_cast<double>(e.state_bytes());
  const model_config& c = m.config;
  const double row_bytes = 2.0 * c.kv_heads * c.head_dim * sizeof(float);  // K and V of one token, one layer
  std::vector<std::int32_t> peak(static_cast<std::size_t>(c.layers));
  for (const auto& text : texts) {
    e.reset();
    std::fill(peak.begin(), peak.end(), 0);
    for (std::size_t t = 0; t + 1 < text.tokens.size(); ++t) {
      const float* logits = e.step(text.tokens[t]);
      // Peak occupancy is right after the append, before compress: t + 1
      // tokens until the budget is reached, then B (compress leaves B - m
      // and the next appends refill it).
      for (std::int32_t l = 0; l < c.layers; ++l) {
        const std::int32_t held = spec ? std::min<std::int32_t>(static_cast<std::int32_t>(t) + 1, e.capacity(l))
                                       : static_cast<std::int32_t>(t) + 1;
        peak[static_cast<std::size_t>(l)] = std::max(peak[static_cast<std::size_t>(l)], held);
      }
      const float mx = *std::max_element(logits, logits + c.vocab);
      double sum = 0.0;
      for (std::int32_t i = 0; i < c.vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
      r.nll_sum += (static_cast<double>(mx) + std::log(sum)) - logits[text.tokens[t + 1]];
      ++r.predictions;
    }
    double held = 0.0;
    for (auto p : peak) held += p;
    const double full = static_cast<double>(c.layers) * static_cast<double>(text.tokens.size() - 1);
    r.kv_fraction += held / full / static_cast<double>(texts.size());
    r.kv_bytes += held * row_bytes / static_cast<double>(texts.size());
    if (tick) tick();
  }
  r.library_seconds = std::chrono::duration<double>(e.times().library).count();
  r.compress_seconds = std::chrono::duration<double>(e.times().compress).count();
  r.step_seconds = std::chrono::duration<double>(e.times().total).count();
  return r;
}

std::vector<run_result> evaluate_grid(const model& m, const std::vector<eval_text>& texts,
                                      const std::vector<policy_spec>& specs, const std::vector<std::int32_t>& budgets,
                                      const eval_options& options,
                                      const std::function<void(std::size_t, std::size_t, const run_result&)>& progress) {
  struct job {
    const policy_spec* spec;
    std::vector<std::int32_t> budgets;
  };
  std::vector<job> jobs{{nullptr, {}}};
  for (const auto& s : specs)
    for (auto b : budgets) jobs.push_back({&s, allocate_budgets(b, m.config.layers, options.allocator, options.slope)});
  // Build every compressor once up front so an invalid budget or setting
  // fails before minutes of work, with the library's message.
  {
    engine probe(m, 2, options.layout);
    for (const auto& j : jobs)
      if (j.spec) probe.set_policy(j.spec, j.budgets, options.source);
  }
  std::vector<run_result> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::size_t done = 0;
  std::mutex mu;
  std::exception_ptr error;
  const auto worker = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= jobs.size()) return;
      try {
        run_result r = evaluate_nll(m, texts, jobs[i].spec, jobs[i].budgets, options);
        std::lock_guard<std::mutex> lock(mu);
        results[i] = std::move(r);
        ++done;
        if (progress) progress(done, jobs.size(), results[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = jobs.size();
      }
    }
  };
  const auto n = static_cast<std::size_t>(std::max(1, options.threads));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < std::min(n, jobs.size()); ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return results;
}

}  // namespace llama
