#include "evaluate.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
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
                                           double slope, const std::vector<double>& persistence) {
  const auto total = sh::total_budget::tokens_per_head(budget, layers);
  switch (kind) {
    case allocator_kind::uniform: return sh::allocate(sh::uniform_budget{}, total, layers);
    case allocator_kind::ramp: return sh::allocate(sh::ramp_budget{slope}, total, layers);
    case allocator_kind::pyramid: return sh::allocate(sh::pyramid_budget{slope}, total, layers);
    case allocator_kind::persistence: return sh::allocate(sh::persistence_budget{persistence}, total, layers);
  }
  throw std::invalid_argument("allocate_budgets: unknown allocator");
}

namespace {

[[noreturn]] void bad_protocol(const std::string& text, const std::string& why) {
  throw std::invalid_argument("--protocol '" + text + "': " + why +
                              " (accepted: decode, prefill:P, prefill:P:k, prefill:P%, prefill:P%:k)");
}

// A positive integer, or with allow_percent a percentage in (0, 100).
bool parse_count(const std::string& v, bool allow_percent, std::int32_t& count, double& percent) {
  if (v.empty()) return false;
  char* end = nullptr;
  if (allow_percent && v.back() == '%') {
    const std::string number = v.substr(0, v.size() - 1);
    const double x = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0' || !(x > 0.0 && x < 100.0)) return false;
    percent = x;
    return true;
  }
  const long x = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0' || x < 1 || x > (1L << 24)) return false;
  count = static_cast<std::int32_t>(x);
  return true;
}

double log_softmax_nll(const float* logits, std::int32_t vocab, std::int32_t target) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (std::int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return (static_cast<double>(mx) + std::log(sum)) - logits[target];
}

}  // namespace

std::string protocol::label() const {
  if (type == kind::decode) return "decode";
  std::ostringstream o;
  o << "prefill:";
  if (prompt_percent > 0.0) o << prompt_percent << "%";
  else o << prompt;
  if (observe_last > 0) o << ":" << observe_last;
  return o.str();
}

protocol parse_protocol(const std::string& text) {
  protocol p;
  if (text == "decode") return p;
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ':')) parts.push_back(item);
  if (parts.empty() || parts[0] != "prefill") bad_protocol(text, "unknown protocol");
  if (parts.size() < 2 || parts.size() > 3) bad_protocol(text, "prefill needs P (and optionally k)");
  p.type = protocol::kind::prefill;
  if (!parse_count(parts[1], true, p.prompt, p.prompt_percent))
    bad_protocol(text, "P must be a positive token count or a percentage in (0, 100), got '" + parts[1] + "'");
  double unused = 0.0;
  if (parts.size() == 3 && !parse_count(parts[2], false, p.observe_last, unused))
    bad_protocol(text, "k must be a positive token count, got '" + parts[2] + "'");
  return p;
}

protocol resolve_protocol(protocol p, std::int32_t shortest_text) {
  if (p.type == protocol::kind::decode) return p;
  const std::string given = p.label();
  if (p.prompt_percent > 0.0) {
    p.prompt = static_cast<std::int32_t>(std::lround(p.prompt_percent / 100.0 * shortest_text));
    p.prompt_percent = 0.0;
  }
  if (p.prompt < 1 || p.prompt >= shortest_text)
    throw std::invalid_argument("--protocol " + given + ": the prompt P = " + std::to_string(p.prompt) +
                                " must be in [1, " + std::to_string(shortest_text - 1) +
                                "] so that at least one token of the shortest text (" + std::to_string(shortest_text) +
                                " tokens) follows it");
  if (p.observe_last > p.prompt)
    throw std::invalid_argument("--protocol " + given + ": k = " + std::to_string(p.observe_last) +
                                " observed queries must not exceed the prompt P = " + std::to_string(p.prompt));
  return p;
}

budget_spec parse_budget(const std::string& text) {
  budget_spec b;
  b.text = text;
  if (!parse_count(text, true, b.tokens, b.percent))
    throw std::invalid_argument("--budgets: '" + text +
                                "' must be a token count in [1, 2^24] or a percentage of the text length in (0, 100), "
                                "e.g. 64 or 12.5%");
  return b;
}

std::int32_t resolve_budget(const budget_spec& b, std::int32_t length) {
  if (b.percent <= 0.0) return b.tokens;
  return std::max<std::int32_t>(1, static_cast<std::int32_t>(std::lround(b.percent / 100.0 * length)));
}

run_result evaluate_nll(const model& m, const std::vector<eval_text>& texts, const policy_spec* spec,
                        const std::vector<std::int32_t>& budgets, const eval_options& options, const protocol& how,
                        const std::function<void()>& tick) {
  std::int32_t longest = 2;
  for (const auto& t : texts) longest = std::max(longest, static_cast<std::int32_t>(t.tokens.size()));
  const bool prefill = how.type == protocol::kind::prefill;
  if (prefill && how.prompt_percent > 0.0)
    throw std::invalid_argument("evaluate_nll: resolve the protocol (resolve_protocol) before running it");
  engine e(m, longest, options.layout, options.format);
  std::optional<prefill_plan> plan;
  if (prefill) plan = prefill_plan{how.prompt, how.observe_last};
  e.set_policy(spec, budgets, options.source, plan);
  const kv_format& format = e.format();
  run_result r;
  r.label = spec ? spec->label : "full";
  r.description = spec ? spec->describe() : "full cache";
  r.protocol = how.label();
  r.prompt = prefill ? how.prompt : 0;
  r.budgets = spec ? budgets : std::vector<std::int32_t>{};
  if (spec) {
    std::int64_t sum = 0;
    for (auto b : budgets) sum += b;
    r.budget = static_cast<std::int32_t>(sum / static_cast<std::int64_t>(budgets.size()));
  }
  r.state_bytes = static_cast<double>(e.state_bytes());
  r.state_slot_bytes = static_cast<double>(e.state_slot_bytes());
  r.kv_bits = format.bits;
  r.kv_group = format.group_size;
  const model_config& c = m.config;
  // K and V of one token, one layer, as stored: values or codes, and parameters.
  const double row_bytes = 2.0 * c.kv_heads * static_cast<double>(format.row_bytes());
  const double param_row_bytes = 2.0 * c.kv_heads * static_cast<double>(format.param_row_bytes());
  std::vector<std::int32_t> peak(static_cast<std::size_t>(c.layers));
  for (const auto& text : texts) {
    e.reset();
    std::fill(peak.begin(), peak.end(), 0);
    const auto T = static_cast<std::int32_t>(text.tokens.size());
    std::int32_t first = 0;  // the first token fed one a step
    if (prefill) {
      if (how.prompt >= T)
        throw std::invalid_argument("evaluate_nll: the prompt P = " + std::to_string(how.prompt) +
                                    " leaves nothing to predict in '" + text.name + "' (" + std::to_string(T) +
                                    " tokens)");
      const float* logits = e.prefill(text.tokens.data(), how.prompt);
      double kept = 0.0;
      for (std::int32_t l = 0; l < c.layers; ++l) {
        peak[static_cast<std::size_t>(l)] = how.prompt;  // the whole prompt, before compress
        kept += e.length(l);
      }
      r.prompt_kv_fraction += kept / (static_cast<double>(c.layers) * how.prompt) / static_cast<double>(texts.size());
      r.nll_sum += log_softmax_nll(logits, c.vocab, text.tokens[static_cast<std::size_t>(how.prompt)]);
      ++r.predictions;
      r.tokens_fed += how.prompt;
      first = how.prompt;
    }
    for (std::int32_t t = first; t + 1 < T; ++t) {
      const float* logits = e.step(text.tokens[static_cast<std::size_t>(t)]);
      // Decode: peak occupancy is right after the append, before compress:
      // t + 1 tokens until the budget is reached, then B (compress leaves
      // B - m and the next appends refill it). Prefill: the length now.
      for (std::int32_t l = 0; l < c.layers; ++l) {
        const std::int32_t held = prefill ? e.length(l)
                                  : spec  ? std::min<std::int32_t>(t + 1, e.capacity(l))
                                          : t + 1;
        peak[static_cast<std::size_t>(l)] = std::max(peak[static_cast<std::size_t>(l)], held);
      }
      r.nll_sum += log_softmax_nll(logits, c.vocab, text.tokens[static_cast<std::size_t>(t) + 1]);
      ++r.predictions;
      ++r.tokens_fed;
    }
    double held = 0.0;
    for (auto p : peak) held += p;
    const double full = static_cast<double>(c.layers) * static_cast<double>(T - 1);
    r.kv_fraction += held / full / static_cast<double>(texts.size());
    r.kv_bytes += held * row_bytes / static_cast<double>(texts.size());
    r.param_bytes += held * param_row_bytes / static_cast<double>(texts.size());
    if (tick) tick();
  }
  if (!prefill) r.prompt_kv_fraction = 0.0;
  if (format.bits == 32 && !spec) r.nll_fp32 = r.nll();
  r.library_seconds = std::chrono::duration<double>(e.times().library).count();
  r.compress_seconds = std::chrono::duration<double>(e.times().compress).count();
  r.step_seconds = std::chrono::duration<double>(e.times().total).count();
  return r;
}

std::vector<run_result> evaluate_grid(const model& m, const std::vector<eval_text>& texts,
                                      const std::vector<policy_spec>& specs, const std::vector<std::int32_t>& budgets,
                                      const eval_options& options, const protocol& how,
                                      const std::function<void(std::size_t, std::size_t, const run_result&)>& progress,
                                      std::vector<skipped_cell>* skipped) {
  struct job {
    const policy_spec* spec;
    std::int32_t budget;
    std::vector<std::int32_t> budgets;
    bool fp32_reference = false;  // the full fp32 cache beside a cache of another format
  };
  std::int32_t longest = 2;
  for (const auto& t : texts) longest = std::max(longest, static_cast<std::int32_t>(t.tokens.size()));
  std::optional<prefill_plan> plan;
  if (how.type == protocol::kind::prefill) plan = prefill_plan{how.prompt, how.observe_last};
  // Check every cell with the library up front (host::compress validates
  // budget and settings on the empty cache), so an invalid one fails or is
  // skipped before minutes of work, with the library's message.
  std::vector<job> jobs{{nullptr, 0, {}}};
  {
    engine probe(m, plan ? std::max(longest, plan->prompt) : 2, options.layout, options.format);
    for (const auto& s : specs)
      for (auto b : budgets) {
        job j{&s, b, allocate_budgets(b, m.config.layers, options.allocator, options.slope, options.persistence)};
        // A prefill whose every layer keeps B >= P evicts nothing: its NLL is
        // the full cache's, bit for bit (tests/llama checks it). Only run
        // when asked for by token count.
        if (plan && skipped && *std::min_element(j.budgets.begin(), j.budgets.end()) >= plan->prompt) {
          skipped->push_back({s.label, b,
                              "B >= P = " + std::to_string(plan->prompt) +
                                  " keeps the whole prompt: the full cache's NLL exactly"});
          continue;
        }
        try {
          probe.set_policy(j.spec, j.budgets, options.source, plan);
          probe.validate_budgets();
        } catch (const sh::invalid_argument& e) {
          if (!skipped) throw;
          // The prefill compresses at budget B + m (leaving B): say so, as the
          // library's message names the budget it was given.
          skipped->push_back({s.label, b,
                              (plan ? "prefill compresses at B + m = " + std::to_string(b + s.config.evict_count) + ": "
                                    : std::string()) +
                                  e.what()});
          continue;
        }
        jobs.push_back(std::move(j));
      }
    if (probe.format().bits != 32) jobs.push_back({nullptr, 0, {}, true});
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
        eval_options job_options = options;
        if (jobs[i].fp32_reference) job_options.format = kv_format{};
        run_result r = evaluate_nll(m, texts, jobs[i].spec, jobs[i].budgets, job_options, how);
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
  if (jobs.back().fp32_reference) {
    const double reference = results.back().nll();
    results.pop_back();
    for (auto& r : results) r.nll_fp32 = reference;
  } else {
    for (auto& r : results) r.nll_fp32 = results.front().nll();
  }
  return results;
}

}  // namespace llama
