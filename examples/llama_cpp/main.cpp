// scissorhands_llamacpp: the library inside stock llama.cpp (the libllama
// that `pip install llama-cpp-python==0.3.36` builds), on any GGUF it loads.
// Subcommands: generate (bounded memory), evaluate (teacher-forced NLL over
// policies x budgets, against the full cache and llama.cpp's context shift),
// check-reads (the glue reads only: logits bit for bit), speed.
// C++17, like llama.cpp; the library through its bridge. docs/llama_cpp.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "llama.h"
#include "runner.h"

namespace {

using namespace sh_llama;

// llama.cpp's "KV buffer size = X MiB" log lines (one per cache; Gemma's
// iSWA memory has two), summed since the last reset: its KV memory as
// allocated.
std::atomic<double> kv_buffer_mib{0.0};

struct common_options {
  std::string model_path;
  std::int32_t threads = 1;
  std::string scores = "all";
  std::string flash_attn = "auto";
  std::vector<std::int32_t> global_layers;
};

// --flash-attn as llama.cpp's context takes it: auto (llama.cpp's default,
// on for the CPU too) and on score from the queries, off from llama.cpp's
// probabilities (the reference path).
llama_flash_attn_type flash_of(const std::string& s) {
  return s == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : s == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                                : LLAMA_FLASH_ATTN_TYPE_AUTO;
}

// A subcommand with the options every one takes.
CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& what, common_options& c) {
  CLI::App* app = parent.add_subcommand(name, what);
  app->add_option("--model,-m", c.model_path, "GGUF file llama.cpp loads")->required()->check(CLI::ExistingFile);
  app->add_option("--threads,-t", c.threads, "llama.cpp threads")->capture_default_str()->check(CLI::Range(1, 256));
  app->add_option("--scores", c.scores,
                  "layers whose attention scores a token: all, or global (full-attention layers only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "global"}));
  app->add_option("--global-layers", c.global_layers,
                  "sliding-window models: the full-attention layers (default: llama.cpp's layout for gemma2/gemma3)");
  app->add_option("--flash-attn", c.flash_attn,
                  "llama.cpp's flash attention: auto (its default: on), on (scores from the queries and the K cells), "
                  "off (scores from llama.cpp's probabilities, the reference)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  return app;
}

// --csv (`rows`: what it holds), --f32-cache and --save-tokens, as evaluate
// and persistence take them.
void add_outputs(CLI::App* app, std::string& csv, const std::string& rows, bool& f32_cache, std::string& save_tokens) {
  app->add_option("--csv", csv, "write the " + rows + " as CSV");
  app->add_flag("--f32-cache", f32_cache, "cache K and V as F32 (llama.cpp's default is F16)");
  app->add_option("--save-tokens", save_tokens, "write each text's token ids to DIR/<name>.tokens")
      ->check(CLI::ExistingDirectory);
}

struct policy_overrides {
  std::int32_t window = -1, recent = -1, sinks = -1;
  float alpha = -1.0f;
  std::int32_t normalize = -1;
};

void add_overrides(CLI::App* app, policy_overrides& o) {
  app->add_option("--window", o.window, "override the preset's window w")->check(CLI::Range(1, 1 << 20));
  app->add_option("--recent", o.recent, "override the preset's recent window r")->check(CLI::Range(0, 1 << 20));
  app->add_option("--sinks", o.sinks, "override the preset's sinks s (streaming defaults to 4)")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--alpha", o.alpha, "override the preset's alpha");
  app->add_option("--normalize", o.normalize, "override the preset's normalisation (0/1)")->check(CLI::Range(0, 1));
}

// A method by spec: "full", "context-shift", or a preset's name with
// optional settings after a colon, "name:key=value/key=value" (keys: window,
// recent (cells, or N% of each run's budget), sinks, alpha, normalize (0/1));
// e.g. "scissorhands:recent=25%", "h2o:normalize=1". Library presets start
// from the preset's own settings (bridge default_settings), then the
// run-wide overrides, then the spec's. The label is the spec.
method method_of(const std::string& spec, const policy_overrides& o) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  method m;
  m.label = spec;
  if ((name == "full" || name == "context-shift") && colon != std::string::npos)
    throw std::invalid_argument("policy '" + spec + "': " + name + " takes no settings");
  if (name == "full") return m;
  if (name == "context-shift") {
    m.type = method::kind::context_shift;
    return m;
  }
  m.type = method::kind::library;
  m.policy = find_preset(name.c_str());
  if (m.policy == nullptr)
    throw std::invalid_argument("policy '" + name + "': not one of full, context-shift, " + preset_names());
  const bridge::error e = m.policy->default_settings(&m.settings);
  if (!e.ok()) throw std::runtime_error(e.message);
  if (name == "streaming") m.settings.sinks = 4;
  if (o.window > 0) m.settings.window = o.window;
  if (o.recent >= 0) m.settings.recent = o.recent;
  if (o.sinks >= 0) m.settings.sinks = o.sinks;
  if (o.alpha > 0) m.settings.alpha = o.alpha;
  if (o.normalize >= 0) m.settings.normalize = o.normalize != 0;
  for (std::size_t at = colon; at != std::string::npos && at < spec.size();) {
    const std::size_t end = std::min(spec.find('/', at + 1), spec.size());
    const std::string item = spec.substr(at + 1, end - at - 1);
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const auto bad = [&](const std::string& why) {
      return std::invalid_argument("policy '" + spec + "': setting '" + item + "' " + why);
    };
    char* rest = nullptr;
    const double number = std::strtod(value.c_str(), &rest);
    const bool percent = rest != nullptr && *rest == '%' && rest[1] == '\0';
    if (value.empty() || rest == value.c_str() || (*rest != '\0' && !percent) || !(number >= 0))
      throw bad("needs a non-negative number (key=value)");
    if (percent && key != "recent") throw bad("takes no % (only recent may be a share of the budget)");
    const bool whole = number == std::floor(number) && number < (1 << 20);
    if (key == "window" && whole && number >= 1) {
      m.settings.window = static_cast<std::int32_t>(number);
    } else if (key == "recent" && percent && number <= 100) {
      m.recent_percent = number;
    } else if (key == "recent" && !percent && whole) {
      m.settings.recent = static_cast<std::int32_t>(number);
    } else if (key == "sinks" && whole) {
      m.settings.sinks = static_cast<std::int32_t>(number);
    } else if (key == "alpha" && number > 0) {
      m.settings.alpha = static_cast<float>(number);
    } else if (key == "normalize" && (number == 0 || number == 1)) {
      m.settings.normalize = number == 1;
    } else {
      throw bad("is not one of window (1..2^20), recent (cells, or 0-100%), sinks, alpha (> 0), normalize (0/1)");
    }
    at = end;
  }
  // SnapKV observes the prompt's last queries, as many as it protects.
  if (name == "snapkv") m.observe_last = m.settings.recent;
  return m;
}

scored_layers scores_of(const std::string& s) { return s == "global" ? scored_layers::global : scored_layers::all; }

struct model_handle {
  llama_model* model = nullptr;
  explicit model_handle(const std::string& path) {
    llama_model_params params = llama_model_default_params();
    params.progress_callback = [](float, void*) { return true; };
    model = llama_model_load_from_file(path.c_str(), params);
    if (model == nullptr) throw std::runtime_error("llama.cpp could not load " + path);
  }
  ~model_handle() { llama_model_free(model); }
};

std::vector<llama_token> tokenize(const llama_model* model, const std::string& text) {
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> out(text.size() + 16);
  int n = llama_tokenize(vocab, text.c_str(), static_cast<std::int32_t>(text.size()), out.data(),
                         static_cast<std::int32_t>(out.size()), true, false);
  if (n < 0) throw std::runtime_error("llama_tokenize failed");
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string piece(const llama_model* model, llama_token t) {
  char buffer[256];
  const int n = llama_token_to_piece(llama_model_get_vocab(model), t, buffer, sizeof buffer, 0, true);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct text {
  std::string name;
  std::vector<llama_token> tokens;
};

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Texts from --text (tokenized by llama.cpp, BOS first), --tokens (ids as
// they are) and --samples (sampled from the model), each cut to --length.
std::vector<text> load_texts(llama_model* model, const std::vector<std::string>& text_files,
                             const std::vector<std::string>& token_files, std::int32_t samples, std::int32_t length,
                             std::int32_t threads, std::uint32_t seed) {
  std::vector<text> texts;
  const auto cut = [&](text& t, const std::string& option) {
    if (length > 0 && static_cast<std::int32_t>(t.tokens.size()) > length) t.tokens.resize(static_cast<std::size_t>(length));
    if (length > 0 && static_cast<std::int32_t>(t.tokens.size()) < length)
      std::cerr << "note: " << option << " " << t.name << " has " << t.tokens.size() << " tokens, below --length "
                << length << "\n";
  };
  for (const auto& f : text_files) {
    texts.push_back({base_name(f), tokenize(model, read_file(f))});
    cut(texts.back(), "--text");
  }
  for (const auto& f : token_files) {
    std::istringstream in(read_file(f));
    text t{base_name(f), {}};
    for (long long id; in >> id;) t.tokens.push_back(static_cast<llama_token>(id));
    texts.push_back(std::move(t));
    cut(texts.back(), "--tokens");
  }
  // Sampled texts: temperature 1, top-p 0.9 from BOS, full cache, seed + k.
  for (std::int32_t k = 0; k < samples; ++k) {
    if (length <= 1) throw std::invalid_argument("--samples needs --length above 1");
    // Flash attention off, as the texts sampled for the measurements so far were.
    llama_context* ctx = make_context(model, length, 1, threads, nullptr, false, LLAMA_FLASH_ATTN_TYPE_DISABLED);
    llama_sampler* sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(sampler, llama_sampler_init_top_p(0.9f, 1));
    llama_sampler_chain_add(sampler, llama_sampler_init_temp(1.0f));
    llama_sampler_chain_add(sampler, llama_sampler_init_dist(seed + static_cast<std::uint32_t>(k)));
    text t{"sample" + std::to_string(seed + static_cast<std::uint32_t>(k)),
           {llama_vocab_bos(llama_model_get_vocab(model))}};
    while (static_cast<std::int32_t>(t.tokens.size()) < length) {
      llama_token last = t.tokens.back();
      if (llama_decode(ctx, llama_batch_get_one(&last, 1)) != 0) throw std::runtime_error("sampling: decode failed");
      t.tokens.push_back(llama_sampler_sample(sampler, ctx, -1));
    }
    llama_sampler_free(sampler);
    llama_free(ctx);
    texts.push_back(std::move(t));
  }
  if (texts.empty()) throw std::invalid_argument("no text: give --text, --tokens or --samples");
  return texts;
}

// Each text's token ids to dir/<name>.tokens (nothing when dir is empty).
void save_tokens(const std::vector<text>& texts, const std::string& dir) {
  if (dir.empty()) return;
  for (const auto& t : texts) {
    std::ofstream out(dir + "/" + t.name + ".tokens");
    for (llama_token id : t.tokens) out << id << "\n";
    if (!out) throw std::runtime_error("cannot write " + dir + "/" + t.name + ".tokens");
  }
}

std::string fixed(double x, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << x;
  return o.str();
}

// ---- evaluate ---------------------------------------------------------------------

struct evaluate_options {
  common_options common;
  policy_overrides overrides;
  std::vector<std::string> text_files, token_files, policies{"scissorhands", "scissorhands-paper", "h2o", "tova",
                                                                 "streaming", "context-shift", "random"};
  std::vector<double> budgets{6.25, 12.5, 25, 50};  // % of the text length
  std::vector<std::int32_t> budget_tokens;          // or tokens
  std::string protocol = "decode";
  std::int32_t chunk = 32, samples = 0, length = 0, jobs = 1;
  std::uint32_t seed = 1;
  std::string csv, texts_csv, save_tokens;
  bool f32_cache = false, no_reuse = false;
};

int evaluate(const evaluate_options& o) {
  for (const auto& name : o.policies) (void)method_of(name, o.overrides);  // refuse a bad spec before any run
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, o.token_files, o.samples, o.length, o.common.threads, o.seed);
  std::int32_t shortest = INT32_MAX;
  std::size_t total_tokens = 0;
  for (const auto& t : texts) shortest = std::min(shortest, static_cast<std::int32_t>(t.tokens.size())), total_tokens += t.tokens.size();
  save_tokens(texts, o.save_tokens);
  const bool prefill = o.protocol == "prefill";
  const std::int32_t prompt = prefill ? shortest / 2 : 0;
  std::cout << "model " << base_name(o.common.model_path) << ": " << texts.size() << " texts, " << total_tokens
            << " tokens (shortest " << shortest << "), protocol " << o.protocol
            << (prefill ? " (prompt " + std::to_string(prompt) + " tokens, compressed once)" : "") << ", "
            << o.chunk << " tokens per llama_decode, scores from " << o.common.scores << " layers, "
            << o.common.threads << " thread(s)\n";

  struct cell {
    std::string policy;
    std::string budget_text;
    std::int32_t budget;
    run_result sum;
    std::vector<run_result> runs;  // per text, token_nll dropped
  };
  std::vector<std::pair<std::string, std::int32_t>> budgets;  // label, tokens (relative to the shortest text)
  if (o.budget_tokens.empty())
    for (double p : o.budgets) budgets.push_back({fixed(p, 2) + "%", std::max(1, static_cast<std::int32_t>(std::lround(p / 100.0 * shortest)))});
  for (std::int32_t b : o.budget_tokens) budgets.push_back({std::to_string(b), b});

  // Every text under `how`, o.jobs of them at once (each in its own context
  // with --threads threads); summed in text order, so no figure depends on
  // --jobs. Under decode the bounded methods reuse the full cache's
  // predictions from before their first eviction (runner.h) unless --no-reuse.
  std::vector<run_result> full_runs;
  const auto run_all = [&](const method& how, std::int32_t budget) {
    run_options run;
    run.threads = o.common.threads;
    run.chunk = o.chunk;
    run.budget = budget;
    run.prompt = prompt;
    run.scores = scores_of(o.common.scores);
    run.global_layers = o.common.global_layers;
    run.f32_cache = o.f32_cache;
    run.flash_attn = flash_of(o.common.flash_attn);
    std::vector<run_result> runs(texts.size());
    std::atomic<std::size_t> next{0};
    const auto work = [&] {
      for (std::size_t i = next++; i < texts.size(); i = next++) {
        run_options mine = run;
        if (!o.no_reuse && i < full_runs.size()) mine.full_nll = &full_runs[i].token_nll;
        runs[i] = run_text(model.model, texts[i].tokens, how, mine);
      }
    };
    const auto wall_start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (std::int32_t j = 1; j < std::min<std::int32_t>(o.jobs, static_cast<std::int32_t>(texts.size())); ++j)
      workers.emplace_back(work);
    work();
    for (auto& w : workers) w.join();
    run_result sum;
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const run_result& r = runs[i];
      if (!r.error.empty()) throw std::runtime_error(how.label + " on " + texts[i].name + ": " + r.error);
      sum.nll_sum += r.nll_sum;
      sum.predictions += r.predictions;
      sum.peak_cells = std::max(sum.peak_cells, r.peak_cells);
      sum.evicted += r.evicted;
      sum.reused += r.reused;
      sum.library_seconds += r.library_seconds;
      sum.decode_seconds += r.decode_seconds;
    }
    return std::make_pair(sum, std::move(runs));
  };
  const auto clock_start = std::chrono::steady_clock::now();
  run_result full;
  std::tie(full, full_runs) = run_all(method_of("full", o.overrides), shortest);
  std::cerr << "full cache: NLL " << fixed(full.nll(), 4) << " (" << fixed(full.seconds, 1) << " s)\n";
  std::vector<cell> cells;
  // Rewritten after every cell, so that a long grid stopped early keeps what it measured.
  const auto write_csv = [&] {
    if (!o.csv.empty()) {
      std::ofstream csv(o.csv);
      csv << "model,protocol,policy,budget,budget_tokens,texts,predictions,nll,nll_full,increase_percent,peak_cells,"
             "evicted,seconds,library_seconds,reused\n";
      csv << base_name(o.common.model_path) << "," << o.protocol << ",full,100%," << shortest << "," << texts.size() << ","
          << full.predictions << "," << fixed(full.nll(), 6) << "," << fixed(full.nll(), 6) << ",0," << full.peak_cells
          << ",0," << fixed(full.seconds, 2) << ",0,0\n";
      for (const auto& c : cells)
        csv << base_name(o.common.model_path) << "," << o.protocol << "," << c.policy << "," << c.budget_text << ","
            << c.budget << "," << texts.size() << "," << c.sum.predictions << "," << fixed(c.sum.nll(), 6) << ","
            << fixed(full.nll(), 6) << "," << fixed(100.0 * (c.sum.nll() / full.nll() - 1.0), 4) << ","
            << c.sum.peak_cells << "," << c.sum.evicted << "," << fixed(c.sum.seconds, 2) << ","
            << fixed(c.sum.library_seconds, 3) << "," << c.sum.reused << "\n";
    }
    // Per text: what paired comparisons of two cells over the same texts need
    // (scripts/gemma_summary.py --texts: bootstrap intervals of their difference).
    if (o.texts_csv.empty()) return;
    std::ofstream per_text(o.texts_csv);
    per_text << "model,protocol,policy,budget,text,predictions,nll_sum,nll_full_sum\n";
    const auto row = [&](const std::string& policy, const std::string& budget, const std::vector<run_result>& runs) {
      for (std::size_t i = 0; i < runs.size(); ++i)
        per_text << base_name(o.common.model_path) << "," << o.protocol << "," << policy << "," << budget << ","
                 << texts[i].name << "," << runs[i].predictions << "," << fixed(runs[i].nll_sum, 6) << ","
                 << fixed(full_runs[i].nll_sum, 6) << "\n";
    };
    row("full", "100%", full_runs);
    for (const auto& c : cells) row(c.policy, c.budget_text, c.runs);
  };
  for (const auto& name : o.policies) {
    if (prefill && name == "context-shift") continue;  // llama.cpp shifts while decoding only
    const method how = method_of(name, o.overrides);
    for (const auto& [label, tokens] : budgets) {
      auto [sum, runs] = run_all(how, tokens);
      for (auto& r : runs) r.token_nll = {};
      cells.push_back({name, label, tokens, sum, std::move(runs)});
      const auto& r = cells.back().sum;
      std::cerr << name << " @ " << label << " (" << tokens << " cells): NLL " << fixed(r.nll(), 4) << " ("
                << fixed(100.0 * (r.nll() / full.nll() - 1.0), 2) << "%), " << fixed(r.seconds, 1) << " s, "
                << r.reused << " of " << r.predictions << " predictions reused, "
                << fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count(), 0)
                << " s so far\n";
      write_csv();
    }
  }
  // Table: rows = policies, columns = budgets; NLL increase over the full cache.
  std::cout << "\nfull cache NLL " << fixed(full.nll(), 4) << " over " << full.predictions << " predictions\n\n| policy |";
  for (const auto& b : budgets) std::cout << " " << b.first << " |";
  std::cout << "\n|---|";
  for (std::size_t i = 0; i < budgets.size(); ++i) std::cout << "---|";
  std::cout << "\n";
  for (const auto& name : o.policies) {
    bool any = false;
    std::ostringstream row;
    row << "| " << name << " |";
    for (const auto& b : budgets)
      for (const auto& c : cells)
        if (c.policy == name && c.budget_text == b.first) {
          const double increase = 100.0 * (c.sum.nll() / full.nll() - 1.0);
          row << (increase < 0 ? " " : " +") << fixed(increase, 2) << "% |";
          any = true;
        }
    if (any) std::cout << row.str() << "\n";
  }
  write_csv();
  if (!o.csv.empty()) std::cout << "wrote " << o.csv << "\n";
  if (!o.texts_csv.empty()) std::cout << "wrote " << o.texts_csv << "\n";
  return 0;
}

// ---- check-reads ------------------------------------------------------------------

struct check_options {
  common_options common;
  std::vector<std::string> text_files, token_files;
  std::int32_t length = 256, chunk = 32;
  std::string policy = "scissorhands";
};

// The glue with a budget above the text: it observes every layer and never
// evicts. Every logit must equal the stock run's (no callback), bit for bit.
int check_reads(const check_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, o.token_files, 0, o.length, o.common.threads, 1);
  std::int64_t compared = 0, differ = 0, checks = 0;
  for (const auto& t : texts) {
    run_options run;
    run.threads = o.common.threads;
    run.chunk = o.chunk;
    run.budget = static_cast<std::int32_t>(t.tokens.size()) + 1;
    run.scores = scores_of(o.common.scores);
    run.global_layers = o.common.global_layers;
    run.keep_logits = true;
    run.flash_attn = flash_of(o.common.flash_attn);
    const run_result stock = run_text(model.model, t.tokens, method_of("full", {}), run);
    run_options with = run;
    const run_result glue = run_text(model.model, t.tokens, method_of(o.policy, {}), with);
    if (!stock.error.empty() || !glue.error.empty())
      throw std::runtime_error(t.name + ": " + stock.error + glue.error);
    if (glue.evicted != 0) throw std::runtime_error("the glue evicted below a budget above the text");
    if (glue.flash_attention != (run.flash_attn == LLAMA_FLASH_ATTN_TYPE_DISABLED ? 0 : 1))
      throw std::runtime_error(std::string("the glue observed ") +
                               (glue.flash_attention == 1 ? "flash attention's queries" : "llama.cpp's probabilities") +
                               " with --flash-attn " + o.common.flash_attn);
    compared += static_cast<std::int64_t>(stock.logits.size());
    checks += glue.mask_checks;
    for (std::size_t i = 0; i < stock.logits.size() && i < glue.logits.size(); ++i)
      differ += std::memcmp(&stock.logits[i], &glue.logits[i], sizeof(float)) != 0;
    differ += static_cast<std::int64_t>(std::max(stock.logits.size(), glue.logits.size()) -
                                        std::min(stock.logits.size(), glue.logits.size()));
    std::cout << t.name << ": " << t.tokens.size() << " tokens, " << stock.logits.size()
              << " logits compared, NLL " << fixed(stock.nll(), 6) << " / " << fixed(glue.nll(), 6) << "\n";
  }
  std::cout << "reads only (" << o.policy << ", flash attention " << o.common.flash_attn << ", observing "
            << o.common.scores << " layers, " << checks
            << " mask checks): " << compared - differ << " of " << compared << " logits identical bit for bit\n";
  return differ == 0 ? 0 : 1;
}

// ---- persistence ------------------------------------------------------------------

struct persistence_options {
  common_options common;
  std::vector<std::string> text_files, token_files;
  std::int32_t samples = 0, length = 0, chunk = 32, min_age = 0;
  std::uint32_t seed = 1;
  double split = 0.5, min_fraction = 0.0;
  float alpha = 1.0f;
  std::string csv, save_tokens;
  bool f32_cache = false;
};

// a / b, or NaN for 0 / 0 (no token pivotal in the later stretch).
double ratio(double a, double b) { return b > 0 ? a / b : std::nan(""); }

// The paper's persistence of importance (§3), per layer, on full-cache runs;
// the definition of examples/llama/persistence.hpp (docs/llama.md), here on
// the attention llama.cpp computes. Step t feeds token t; the query sees n_t
// tokens (t + 1; a sliding-window layer min(t + 1, n_swa)). Token i is
// pivotal at step t when the mean over the KV head's query heads of
// a(t, i) > alpha / n_t and t - i >= min_age. S = floor(split * T); for
// tokens i < S: E = pivotal at some step t < S, L = pivotal at some step
// t >= S. Ratio = sum |E ∩ L| / sum |L| over KV heads and texts; chance =
// sum |E| / sum S (the ratio if L were drawn at random among the S tokens).
// With min_fraction q > 0 a token is in E (L) only when pivotal at
// max(1, ceil(q * n)) of the stretch's n steps at which it is old enough.
int persistence(const persistence_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, o.token_files, o.samples, o.length, o.common.threads, o.seed);
  save_tokens(texts, o.save_tokens);
  std::string why;
  const std::vector<char> sliding = sliding_layers(model.model, o.common.global_layers, &why);
  if (!why.empty()) throw std::invalid_argument(why);
  const std::int32_t n_layer = llama_model_n_layer(model.model), n_head = llama_model_n_head(model.model),
                     n_head_kv = llama_model_n_head_kv(model.model), n_swa = llama_model_n_swa(model.model);
  const std::int32_t group = n_head / n_head_kv;
  struct sums {
    double overlap = 0, late = 0, early = 0, tokens = 0;
  };
  std::vector<sums> layers(static_cast<std::size_t>(n_layer));
  std::size_t total_tokens = 0;
  for (const auto& t : texts) {
    const std::int32_t T = static_cast<std::int32_t>(t.tokens.size());
    const std::int32_t S = static_cast<std::int32_t>(std::floor(o.split * T));
    total_tokens += t.tokens.size();
    // [layer][kv head][token < S]
    // Pivotal steps per stretch.
    std::vector<std::int32_t> early(static_cast<std::size_t>(n_layer * n_head_kv * S), 0), late(early.size(), 0);
    run_options run;
    run.threads = o.common.threads;
    run.chunk = o.chunk;
    run.budget = T;
    run.global_layers = o.common.global_layers;
    run.f32_cache = o.f32_cache;
    run.on_attention = [&](std::int32_t layer, const float* p, std::int32_t heads, std::int32_t queries,
                           std::int32_t slots) {
      // Full cache: slot s holds position s; the ubatch's queries are the newest.
      for (std::int32_t q = 0; q < queries; ++q) {
        const std::int32_t step = slots - queries + q;
        const std::int32_t seen = sliding[static_cast<std::size_t>(layer)] ? std::min(step + 1, n_swa) : step + 1;
        const double threshold = static_cast<double>(o.alpha) / seen;
        std::int32_t* mark = (step < S ? early : late).data() + static_cast<std::size_t>(layer) * n_head_kv * S;
        const std::int32_t last = std::min(S - 1, step - o.min_age);
        for (std::int32_t kv = 0; kv < n_head_kv; ++kv)
          for (std::int32_t i = 0; i <= last; ++i) {
            double a = 0;
            for (std::int32_t h = kv * group; h < (kv + 1) * group && h < heads; ++h)
              a += p[(static_cast<std::size_t>(h) * queries + q) * slots + i];
            if (a / group > threshold) ++mark[static_cast<std::size_t>(kv) * S + i];
          }
      }
    };
    const run_result r = run_text(model.model, t.tokens, method_of("full", {}), run);
    if (!r.error.empty()) throw std::runtime_error(t.name + ": " + r.error);
    for (std::int32_t l = 0; l < n_layer; ++l)
      for (std::int32_t kv = 0; kv < n_head_kv; ++kv) {
        auto& s = layers[static_cast<std::size_t>(l)];
        const std::size_t base = (static_cast<std::size_t>(l) * n_head_kv + kv) * S;
        for (std::int32_t i = 0; i < S; ++i) {
          // Steps of each stretch at which token i is old enough to count.
          const double n_early = std::max(0, S - i - o.min_age), n_late = std::max(0, T - std::max(S, i + o.min_age));
          const bool e = early[base + i] >= std::max(1.0, std::ceil(o.min_fraction * n_early));
          const bool l2 = late[base + i] >= std::max(1.0, std::ceil(o.min_fraction * n_late));
          s.early += e, s.late += l2, s.overlap += e && l2;
        }
        s.tokens += S;
      }
    std::cerr << t.name << ": " << T << " tokens, " << fixed(r.seconds, 1) << " s\n";
  }
  std::cout << "model " << base_name(o.common.model_path) << ": " << texts.size() << " texts, " << total_tokens
            << " tokens; alpha " << o.alpha << ", min age " << o.min_age << ", min fraction " << o.min_fraction
            << ", split " << o.split << "\n\n"
            << "| layer | attention | persistence | chance | |E| | |L| |\n|---|---|---|---|---|---|\n";
  sums pooled[2];
  for (std::int32_t l = 0; l < n_layer; ++l) {
    const auto& s = layers[static_cast<std::size_t>(l)];
    const int kind = sliding[static_cast<std::size_t>(l)] ? 1 : 0;
    pooled[kind].overlap += s.overlap, pooled[kind].late += s.late, pooled[kind].early += s.early,
        pooled[kind].tokens += s.tokens;
    const double per = static_cast<double>(texts.size()) * n_head_kv;
    std::cout << "| " << l << " | " << (kind ? "sliding" : "global") << " | " << fixed(ratio(s.overlap, s.late), 4) << " | "
              << fixed(ratio(s.early, s.tokens), 4) << " | " << fixed(s.early / per, 1) << " | " << fixed(s.late / per, 1)
              << " |\n";
  }
  for (int kind = 0; kind < 2; ++kind)
    if (pooled[kind].tokens > 0)
      std::cout << "| " << (kind ? "all sliding" : "all global") << " | | " << fixed(ratio(pooled[kind].overlap, pooled[kind].late), 4)
                << " | " << fixed(ratio(pooled[kind].early, pooled[kind].tokens), 4) << " | | |\n";
  if (!o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "model,texts,tokens,alpha,min_age,min_fraction,split,layer,attention,persistence,chance,early,late,overlap,tokens_counted\n";
    for (std::int32_t l = 0; l < n_layer; ++l) {
      const auto& s = layers[static_cast<std::size_t>(l)];
      csv << base_name(o.common.model_path) << "," << texts.size() << "," << total_tokens << "," << o.alpha << ","
          << o.min_age << "," << o.min_fraction << "," << o.split << "," << l << "," << (sliding[static_cast<std::size_t>(l)] ? "sliding" : "global")
          << "," << fixed(ratio(s.overlap, s.late), 6) << "," << fixed(ratio(s.early, s.tokens), 6) << "," << s.early << ","
          << s.late << "," << s.overlap << "," << s.tokens << "\n";
    }
    std::cout << "wrote " << o.csv << "\n";
  }
  return 0;
}

// ---- generate ---------------------------------------------------------------------

struct generate_options {
  common_options common;
  policy_overrides overrides;
  std::string prompt = "Once upon a time,";
  std::string policy = "scissorhands";
  std::int32_t tokens = 200, n_ctx = 256, budget = 0;
  std::uint32_t seed = 42;
  float temperature = 0.8f;
  bool quiet = false;
};

// A context of n_ctx cells serving far more generated tokens: one token per
// llama_decode, one eviction a step at the budget (B = n_ctx by default).
int generate(const generate_options& o) {
  model_handle model(o.common.model_path);
  const method how = method_of(o.policy, o.overrides);
  if (how.type != method::kind::library) throw std::invalid_argument("generate: --policy must be a library preset");
  const std::int32_t budget = o.budget > 0 ? o.budget : o.n_ctx;
  glue_options options;
  options.budget = budget;
  options.max_step_tokens = 1;
  options.scores = scores_of(o.common.scores);
  options.global_layers = o.common.global_layers;
  bridge::settings settings = how.settings;
  settings.evict_count = 1;
  const std::vector<llama_token> prompt = tokenize(model.model, o.prompt);
  if (static_cast<std::int32_t>(prompt.size()) >= budget)
    throw std::invalid_argument("the prompt's " + std::to_string(prompt.size()) + " tokens reach the budget " +
                                std::to_string(budget));
  eviction_glue glue(model.model, how.policy, settings, options);
  if (!glue.ok()) throw std::runtime_error(glue.error());
  llama_context* ctx = make_context(model.model, o.n_ctx, 1, o.common.threads, &glue, false,
                                    flash_of(o.common.flash_attn));
  if (ctx == nullptr || !glue.attach(ctx)) throw std::runtime_error("context: " + glue.error());
  llama_sampler* sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
  llama_sampler_chain_add(sampler, llama_sampler_init_top_k(40));
  llama_sampler_chain_add(sampler, llama_sampler_init_penalties(llama_vocab_n_tokens(llama_model_get_vocab(model.model)), 64, 1.3f, 0.0f, 0.0f));
  llama_sampler_chain_add(sampler, llama_sampler_init_temp(o.temperature));
  llama_sampler_chain_add(sampler, llama_sampler_init_dist(o.seed));
  std::int32_t peak = 0, over_budget = 0, failures = 0;
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  llama_pos n_past = 0;
  std::vector<llama_token> feed(prompt);
  for (llama_token t : prompt) out += piece(model.model, t);
  std::int32_t generated = 0;
  double decode_seconds = 0;
  llama_batch batch = llama_batch_init(1, 0, 1);
  while (generated < o.tokens) {
    for (llama_token t : feed) {  // the prompt one token a step too (one ubatch of 1)
      set_batch(batch, &t, 1, n_past, 0);
      const auto d = std::chrono::steady_clock::now();
      if (!glue.before_decode(batch)) throw std::runtime_error(glue.error());
      const int rc = llama_decode(ctx, batch);
      if (rc != 0) {
        ++failures;
        std::cerr << "llama_decode returned " << rc << " at position " << n_past << "\n";
        break;
      }
      if (!glue.after_decode()) throw std::runtime_error(glue.error());
      ++n_past;
      peak = std::max(peak, glue.held());
      over_budget += glue.held() > budget;
      if (!glue.evict()) throw std::runtime_error(glue.error());
      decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - d).count();
    }
    if (failures) break;
    const llama_token next = llama_sampler_sample(sampler, ctx, -1);
    feed.assign(1, next);
    out += piece(model.model, next);
    ++generated;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.quiet) std::cout << out << "\n";
  // The positions the cache holds are the true ones: the newest is the last token's.
  const bool positions_true = glue.positions().back() == n_past - 1 &&
                              llama_memory_seq_pos_max(llama_get_memory(ctx), 0) == n_past - 1;
  std::cout << "generate: " << generated << " tokens after a " << prompt.size() << "-token prompt, n_ctx "
            << llama_n_ctx(ctx) << " cells, budget " << budget << ", policy " << o.policy << ": peak " << peak
            << " cells, " << over_budget << " steps above the budget, " << failures << " decode failures, "
            << glue.evicted() << " evicted, newest position " << n_past - 1
            << (positions_true ? " (true)" : " (WRONG)") << ", " << glue.mask_checks() << " mask checks, scores from "
            << (glue.flash_attention() == 1 ? "flash attention's queries" : "llama.cpp's probabilities") << "; "
            << fixed(n_past / decode_seconds, 1) << " tokens/s, library " << fixed(100 * glue.library_seconds() / decode_seconds, 2)
            << "% of the step (glue in all, callbacks and checks included: "
            << fixed(100 * (glue.callback_seconds() + glue.evict_seconds()) / decode_seconds, 2) << "%), removal " << fixed(1e6 * glue.removal_seconds() / std::max<double>(1, static_cast<double>(glue.evicted())), 2)
            << " us a position, " << fixed(seconds, 1) << " s\n";
  llama_batch_free(batch);
  llama_sampler_free(sampler);
  llama_free(ctx);
  return failures == 0 && over_budget == 0 && positions_true ? 0 : 1;
}

// ---- speed ------------------------------------------------------------------------

struct speed_options {
  common_options common;
  policy_overrides overrides;
  std::vector<std::string> text_files;
  std::int32_t budget = 1024, tokens = 256;
  std::string policy = "scissorhands";
};

// Decode speed at the same n_ctx, with and without eviction: a prompt of
// `budget` tokens (chunks of 256), then `tokens` teacher-forced decode steps
// of one token, timed. Without the glue the cache grows from B to B + n
// cells; with it, it stays at B (one eviction a step).
int speed(const speed_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, {}, 0, o.budget + o.tokens, o.common.threads, 1);
  const auto& t = texts.front().tokens;
  if (static_cast<std::int32_t>(t.size()) < o.budget + o.tokens)
    throw std::invalid_argument("--text holds " + std::to_string(t.size()) + " tokens, below --budget + --tokens");
  constexpr std::int32_t prompt_chunk = 256;
  const std::int32_t n_ctx = o.budget + o.tokens;
  for (const std::string& name : {std::string("full"), o.policy}) {
    const method how = method_of(name, o.overrides);
    std::unique_ptr<eviction_glue> glue;
    if (how.type == method::kind::library) {
      glue_options options;
      options.budget = o.budget;
      options.max_step_tokens = prompt_chunk;
      options.scores = scores_of(o.common.scores);
      options.global_layers = o.common.global_layers;
      bridge::settings settings = how.settings;
      settings.evict_count = 1;
      glue = std::make_unique<eviction_glue>(model.model, how.policy, settings, options);
      if (!glue->ok()) throw std::runtime_error(glue->error());
    }
    llama_context* ctx =
        make_context(model.model, n_ctx, prompt_chunk, o.common.threads, glue.get(), false, flash_of(o.common.flash_attn));
    if (ctx == nullptr || (glue && !glue->attach(ctx))) throw std::runtime_error("context: " + (glue ? glue->error() : ""));
    llama_batch batch = llama_batch_init(prompt_chunk, 0, 1);
    double decode = 0.0, glue_before = 0.0, library_before = 0.0;
    std::int64_t evicted_before = 0;
    double removal_before = 0.0;
    for (std::int32_t at = 0; at < n_ctx;) {
      const bool timed = at >= o.budget;
      if (timed && glue && at == o.budget) {
        glue_before = glue->callback_seconds() + glue->evict_seconds();
        library_before = glue->library_seconds();
        removal_before = glue->removal_seconds();
        evicted_before = glue->evicted();
      }
      const std::int32_t count = timed ? 1 : std::min(prompt_chunk, o.budget - at);
      set_batch(batch, t.data() + at, count, at, count - 1);
      const auto start = std::chrono::steady_clock::now();
      if (glue && !glue->before_decode(batch)) throw std::runtime_error(glue->error());
      if (llama_decode(ctx, batch) != 0) throw std::runtime_error("llama_decode failed");
      if (glue && !(glue->after_decode() && glue->evict())) throw std::runtime_error(glue->error());
      if (timed) decode += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      at += count;
    }
    std::cout << "speed " << name << ": " << o.common.threads << " thread(s), n_ctx " << llama_n_ctx(ctx) << ", "
              << o.tokens << " decode steps after " << o.budget << " tokens: " << fixed(o.tokens / decode, 2)
              << " tokens/s";
    if (glue) {
      const double library = glue->library_seconds() - library_before;
      const double all = glue->callback_seconds() + glue->evict_seconds() - glue_before;
      const double removals = static_cast<double>(glue->evicted() - evicted_before);
      std::cout << ", " << glue->held() << " cells held; library (gather, observe, select, forget) "
                << fixed(100.0 * library / decode, 2) << "% of the step (" << fixed(1e3 * library / o.tokens, 3)
                << " ms), the glue in all (callbacks, tensor reads, checks, removal) " << fixed(100.0 * all / decode, 2)
                << "%, llama_memory_seq_rm " << fixed(1e6 * (glue->removal_seconds() - removal_before) / std::max(1.0, removals), 2)
                << " us a position";
    }
    std::cout << "\n";
    llama_batch_free(batch);
    llama_free(ctx);
  }
  return 0;
}

// ---- interleave -------------------------------------------------------------------

struct interleave_options {
  common_options common;
  policy_overrides overrides;
  std::vector<std::string> text_files, token_files;
  std::int32_t length = 0, chunk = 16, budget = 64, sequences = 4;
  std::string policy = "scissorhands", cache = "both";
  double tolerance = 1e-4;
};

// Several texts decoded interleaved in one context (each llama_decode
// carrying a step of every sequence), against each text run alone: the
// same positions evicted and each text's NLL within --tolerance. Texts
// beyond --sequences restart a sequence a finished text ended.
int interleave(const interleave_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, o.token_files, 0, o.length, o.common.threads, 1);
  const method how = method_of(o.policy, o.overrides);
  if (how.type != method::kind::library) throw std::invalid_argument("interleave: --policy must be a library preset");
  run_options run;
  run.threads = o.common.threads;
  run.chunk = o.chunk;
  run.budget = o.budget;
  run.scores = scores_of(o.common.scores);
  run.global_layers = o.common.global_layers;
  run.flash_attn = flash_of(o.common.flash_attn);
  run.record_evictions = true;
  std::vector<std::vector<llama_token>> tokens;
  std::vector<run_result> alone;
  for (const auto& t : texts) {
    tokens.push_back(t.tokens);
    alone.push_back(run_text(model.model, t.tokens, how, run));
    if (!alone.back().error.empty()) throw std::runtime_error(t.name + " alone: " + alone.back().error);
  }
  bool good = true;
  for (const bool unified : {true, false}) {
    if ((unified && o.cache == "streams") || (!unified && o.cache == "unified")) continue;
    const interleaved_result r = run_interleaved(model.model, tokens, how, run, o.sequences, unified);
    if (!r.error.empty()) throw std::runtime_error(std::string(unified ? "unified" : "streams") + ": " + r.error);
    double worst = 0.0;
    std::int64_t same = 0, evictions = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const double diff = std::fabs(r.texts[i].nll() - alone[i].nll());
      worst = std::max(worst, diff);
      const auto& a = alone[i].evicted_positions;
      const auto& b = r.texts[i].evicted_positions;
      // Positions evicted by both, in the same order (the same eviction).
      std::int64_t matched = 0;
      for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) matched += a[k] == b[k];
      same += matched;
      evictions += static_cast<std::int64_t>(std::max(a.size(), b.size()));
      std::cout << (unified ? "unified" : "streams") << " " << texts[i].name << ": NLL alone " << fixed(alone[i].nll(), 6)
                << ", interleaved " << fixed(r.texts[i].nll(), 6) << " (|diff| " << std::scientific
                << std::setprecision(2) << diff << std::defaultfloat << "), " << b.size() << " evicted, " << matched
                << " at the same positions, peak " << r.texts[i].peak_cells << " cells\n";
      good = good && diff <= o.tolerance && r.texts[i].peak_cells <= o.budget && r.texts[i].predictions == alone[i].predictions;
    }
    const double share = evictions > 0 ? 100.0 * static_cast<double>(same) / static_cast<double>(evictions) : 100.0;
    std::cout << (unified ? "unified cache" : "one stream per sequence") << ": " << texts.size() << " texts in "
              << o.sequences << " sequences (" << r.restarts << " restarts), " << r.decodes
              << " llama_decode calls, flash attention " << o.common.flash_attn << ": largest NLL difference "
              << std::scientific << std::setprecision(2) << worst << std::defaultfloat << ", " << same << " of "
              << evictions << " evictions at the same positions (" << fixed(share, 2) << "%), "
              << fixed(r.seconds, 1) << " s\n";
    good = good && share >= 99.0;
  }
  return good ? 0 : 1;
}

// ---- agree --------------------------------------------------------------------------

struct agree_options {
  common_options common;
  policy_overrides overrides;
  std::vector<std::string> text_files, token_files;
  std::int32_t length = 0, chunk = 32;
  std::vector<std::int32_t> budgets{64};
  std::string policy = "scissorhands";
  double min_agreement = 99.0;
};

// Two observations of the same positions compared at every eviction: their
// eviction scores (per layer, before the layers are combined) and the
// positions each would evict.
struct comparison {
  double worst = 0.0, sum = 0.0, top = 0.0;
  std::int64_t compared = 0, evictions = 0, agreed = 0, ties = 0;

  // reference / other: scores [layer][slot] (one sequence) and choices;
  // `held`: the positions both hold, slot order.
  void add(const std::vector<float>& reference, const std::vector<float>& other, const std::vector<llama_pos>& a,
           const std::vector<llama_pos>& b, const std::vector<llama_pos>& held, std::int32_t layers) {
    for (std::size_t i = 0; i < reference.size() && i < other.size(); ++i) {
      const double d = std::fabs(static_cast<double>(reference[i]) - other[i]);
      worst = std::max(worst, d);
      top = std::max(top, std::fabs(static_cast<double>(reference[i])));
      sum += d;
    }
    compared += static_cast<std::int64_t>(reference.size());
    for (llama_pos p : a) agreed += std::binary_search(b.begin(), b.end(), p);
    evictions += static_cast<std::int64_t>(a.size());
    if (a.empty() || layers <= 0) return;
    // Ties: a position only the other chose whose reference score (summed
    // over the layers, as the layers' mean ranks) equals that of a position
    // only the reference chose: the reference's choice among equals fell
    // to age.
    const std::size_t capacity = reference.size() / static_cast<std::size_t>(layers);
    const auto score = [&](llama_pos p) {
      const auto slot = static_cast<std::size_t>(std::lower_bound(held.begin(), held.end(), p) - held.begin());
      double total = 0.0;
      for (std::int32_t l = 0; l < layers; ++l) total += reference[static_cast<std::size_t>(l) * capacity + slot];
      return total;
    };
    for (llama_pos p : b) {
      if (std::binary_search(a.begin(), a.end(), p)) continue;
      for (llama_pos q : a)
        if (!std::binary_search(b.begin(), b.end(), q) && score(q) == score(p)) {
          ++ties;
          break;
        }
    }
  }
  double share() const {
    return evictions > 0 ? 100.0 * static_cast<double>(agreed) / static_cast<double>(evictions) : 100.0;
  }
  double untied() const {
    return evictions - ties > 0 ? 100.0 * static_cast<double>(agreed) / static_cast<double>(evictions - ties) : 100.0;
  }
  std::string text() const {
    std::ostringstream o;
    o << "largest score difference " << std::scientific << std::setprecision(3) << worst << " (largest score " << top
      << "), mean " << (compared > 0 ? sum / static_cast<double>(compared) : 0.0) << std::defaultfloat << " over "
      << compared << " scores; " << agreed << " of " << evictions << " evictions chose the same positions ("
      << fixed(share(), 2) << "%; " << ties << " differ only among tokens the reference scored equal: "
      << fixed(untied(), 2) << "% of the others)";
    return o.str();
  }
};

// The flash-attention path's observation against the kq_soft_max path's,
// twice. Same inputs: one context with flash attention off; every layer is
// observed from llama.cpp's probabilities and, into a shadow state, from
// the queries and K cells its softmax came from (the flash-attention
// path's code). Two contexts: flash attention off and on, run in lockstep,
// each observing its own attention. Both under the decode protocol; at
// every eviction the reference (flash attention off, probabilities)
// chooses and its choice is removed everywhere, so all hold the same
// positions. Exit 1 when fewer than --min-agreement % of the same-inputs
// evictions agree, ties aside.
int agree(const agree_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, o.token_files, 0, o.length, o.common.threads, 1);
  const method how = method_of(o.policy, o.overrides);
  if (how.type != method::kind::library) throw std::invalid_argument("agree: --policy must be a library preset");
  const std::int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.model));
  comparison same, paths;
  double nll[2] = {0.0, 0.0};
  std::int64_t predictions = 0;
  for (const auto& t : texts)
    for (std::int32_t budget : o.budgets) {
      const auto total = static_cast<std::int32_t>(t.tokens.size());
      bridge::settings settings = how.settings;
      settings.evict_count = o.chunk;
      glue_options options;
      options.budget = budget;
      options.max_step_tokens = o.chunk;
      options.scores = scores_of(o.common.scores);
      options.global_layers = o.common.global_layers;
      std::unique_ptr<eviction_glue> glue[2];
      llama_context* ctx[2] = {nullptr, nullptr};
      for (int path = 0; path < 2; ++path) {
        options.source = path == 0 ? attention_source::probabilities : attention_source::queries;
        options.shadow_queries = path == 0;
        glue[path] = std::make_unique<eviction_glue>(model.model, how.policy, settings, options);
        if (!glue[path]->ok()) throw std::runtime_error(glue[path]->error());
        ctx[path] = make_context(model.model, budget + o.chunk, o.chunk, o.common.threads, glue[path].get());
        if (ctx[path] == nullptr || !glue[path]->attach(ctx[path]))
          throw std::runtime_error("context: " + glue[path]->error());
      }
      llama_batch batch = llama_batch_init(o.chunk, 0, 1);
      for (std::int32_t at = 0; at < total;) {
        std::int32_t count = std::min(o.chunk, total - at);
        if (at < budget) count = std::min(count, budget - at);
        set_batch(batch, t.tokens.data() + at, count, at, 0);
        for (int path = 0; path < 2; ++path) {
          if (!glue[path]->before_decode(batch) || llama_decode(ctx[path], batch) != 0 || !glue[path]->after_decode())
            throw std::runtime_error(t.name + ": " + glue[path]->error());
          for (std::int32_t j = 0; j < count && at + j + 1 < total; ++j) {
            nll[path] += negative_log_prob(llama_get_logits_ith(ctx[path], j), vocab,
                                           t.tokens[static_cast<std::size_t>(at + j + 1)]);
            predictions += path;
          }
        }
        at += count;
        // [0]: reference, [1]: its shadow, [2]: the flash-attention context.
        std::vector<std::vector<llama_pos>> chosen[3];
        std::vector<float> scores[3];
        std::vector<llama_seq_id> seqs;
        for (int k = 0; k < 3; ++k) {
          eviction_glue& g = *glue[k == 2 ? 1 : 0];
          if (!g.choose(&chosen[k], k == 1) || !g.eviction_scores(&scores[k], &seqs, k == 1))
            throw std::runtime_error(t.name + ": " + g.error());
        }
        const auto& held = glue[0]->positions();
        const std::int32_t layers = glue[0]->scored_layer_count();
        same.add(scores[0], scores[1], chosen[0][0], chosen[1][0], held, layers);
        paths.add(scores[0], scores[2], chosen[0][0], chosen[2][0], held, layers);
        for (int path = 0; path < 2; ++path)
          if (!glue[path]->evict_positions(chosen[0])) throw std::runtime_error(t.name + ": " + glue[path]->error());
      }
      llama_batch_free(batch);
      for (int path = 0; path < 2; ++path) {
        if (glue[path]->flash_attention() != path)
          throw std::runtime_error("the glue did not observe through the path asked for");
        llama_free(ctx[path]);
      }
    }
  std::cout << "agree (" << o.policy << ", " << texts.size() << " texts, budgets";
  for (std::int32_t b : o.budgets) std::cout << " " << b;
  std::cout << ", steps of " << o.chunk << ")\n  same inputs (the queries and K cells llama.cpp's softmax came from): "
            << same.text() << "\n  flash attention on against off (two contexts, the same positions): " << paths.text()
            << "; NLL off " << fixed(nll[0] / static_cast<double>(std::max<std::int64_t>(1, predictions)), 6)
            << ", on " << fixed(nll[1] / static_cast<double>(std::max<std::int64_t>(1, predictions)), 6) << "\n";
  return same.untied() >= o.min_agreement ? 0 : 1;
}

// ---- check-refusals -----------------------------------------------------------------

struct refusals_options {
  common_options common;
};

// Engine mistakes the glue must refuse with a message naming them, nothing
// evicted: each case prints its message; exit 1 when one is accepted or its
// message misses what it should name.
int check_refusals(const refusals_options& o) {
  model_handle model(o.common.model_path);
  const preset* policy = find_preset("scissorhands");
  bridge::settings settings;
  if (!policy->default_settings(&settings).ok()) throw std::runtime_error("default_settings");
  std::int32_t failures = 0, cases = 0;
  const auto expect = [&](const std::string& what, bool refused, const std::string& message, const char* names) {
    ++cases;
    const bool named = message.find(names) != std::string::npos;
    std::cout << (refused && named ? "refused: " : "NOT REFUSED AS EXPECTED: ") << what << ": " << message << "\n";
    failures += !(refused && named);
  };
  // A context with two sequences, eviction at 32 cells, steps of 4.
  const auto make = [&](glue_options options, bool configure, bool unified, ggml_type type_k,
                        llama_flash_attn_type flash) {
    auto glue = std::make_unique<eviction_glue>(model.model, policy, settings, options);
    llama_context_params params = llama_context_default_params();
    params.n_ctx = 512;
    params.n_batch = params.n_ubatch = 64;
    params.n_threads = params.n_threads_batch = o.common.threads;
    params.n_seq_max = static_cast<std::uint32_t>(options.sequences);
    params.kv_unified = unified;
    params.type_k = type_k;
    params.flash_attn_type = flash;
    params.no_perf = true;
    if (configure) glue->configure(params);
    llama_context* ctx = llama_init_from_model(model.model, params);
    return std::make_pair(std::move(glue), ctx);
  };
  glue_options base;
  base.budget = 32;
  base.max_step_tokens = 4;
  base.sequences = 2;
  const llama_token bos = llama_vocab_bos(llama_model_get_vocab(model.model));
  llama_batch batch = llama_batch_init(16, 0, 1);
  const auto fill = [&](std::initializer_list<std::pair<llama_seq_id, llama_pos>> tokens) {
    batch.n_tokens = 0;
    for (const auto& [seq, pos] : tokens) {
      const std::int32_t i = batch.n_tokens++;
      batch.token[i] = bos;
      batch.pos[i] = pos;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = seq;
      batch.logits[i] = 1;
    }
  };
  {
    auto [glue, ctx] = make(base, true, true, GGML_TYPE_F16, flash_of(o.common.flash_attn));
    if (ctx == nullptr || !glue->attach(ctx)) throw std::runtime_error("context: " + glue->error());
    fill({{2, 0}});
    expect("a sequence id at n_seq_max", !glue->before_decode(batch), glue->error(), "sequence id 2 is outside [0, 2)");
    llama_free(ctx);
  }
  {
    auto [glue, ctx] = make(base, true, true, GGML_TYPE_F16, flash_of(o.common.flash_attn));
    if (ctx == nullptr || !glue->attach(ctx)) throw std::runtime_error("context: " + glue->error());
    fill({{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}});
    expect("five tokens of one sequence in a step of 4", !glue->before_decode(batch), glue->error(), "max_step_tokens");
    llama_free(ctx);
  }
  {
    auto [glue, ctx] = make(base, true, true, GGML_TYPE_F16, flash_of(o.common.flash_attn));
    if (ctx == nullptr || !glue->attach(ctx)) throw std::runtime_error("context: " + glue->error());
    fill({{0, 0}, {0, 2}});
    expect("a position gap", !glue->before_decode(batch), glue->error(), "has position 2, not the next one, 1");
    llama_free(ctx);
  }
  {
    // llama_memory_seq_cp: sequence 1 shares sequence 0's cells behind the glue.
    auto [glue, ctx] = make(base, true, true, GGML_TYPE_F16, flash_of(o.common.flash_attn));
    if (ctx == nullptr || !glue->attach(ctx)) throw std::runtime_error("context: " + glue->error());
    fill({{0, 0}, {0, 1}});
    if (!glue->before_decode(batch) || llama_decode(ctx, batch) != 0 || !glue->after_decode())
      throw std::runtime_error("seq_cp case: " + glue->error());
    llama_memory_seq_cp(llama_get_memory(ctx), 0, 1, -1, -1);
    fill({{0, 2}, {1, 2}});
    const bool refused = !glue->before_decode(batch);
    expect("llama_memory_seq_cp (parallel sampling)", refused, glue->error(), "llama_memory_seq_cp");
    expect("nothing evicted after the refusals", glue->evicted() == 0 && glue->held(0) == 2,
           "held " + std::to_string(glue->held(0)) + " cells, evicted " + std::to_string(glue->evicted()), "held 2");
    llama_free(ctx);
  }
  {
    auto [glue, ctx] = make(base, false, true, GGML_TYPE_F16, flash_of(o.common.flash_attn));
    expect("a context created without configure()", ctx != nullptr && !glue->attach(ctx), glue->error(),
           "configure()");
    if (ctx != nullptr) llama_free(ctx);
  }
  {
    // Refused by configure(), before llama.cpp creates the context.
    auto [glue, ctx] = make(base, true, true, GGML_TYPE_Q8_0, LLAMA_FLASH_ATTN_TYPE_ENABLED);
    expect("a q8_0 K cache with flash attention", !glue->ok() && (ctx == nullptr || !glue->attach(ctx)),
           glue->error(), "K cache type is q8_0");
    if (ctx != nullptr) llama_free(ctx);
  }
  {
    auto glue = std::make_unique<eviction_glue>(model.model, policy, settings, base);
    llama_context_params params = llama_context_default_params();
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.type_v = GGML_TYPE_Q8_0;
    glue->configure(params);
    expect("a q8_0 V cache with flash attention off", !glue->ok(), glue->error(), "V cache type is q8_0");
  }
  {
    // The state's budget below the recent window plus the step.
    glue_options small = base;
    small.budget = 8;
    bridge::settings wide = settings;
    wide.recent = 8;
    wide.evict_count = 4;
    auto glue = std::make_unique<eviction_glue>(model.model, policy, wide, small);
    expect("a budget of 8 below the recent window (8) plus the step (4)", !glue->ok(), glue->error(), "budget");
  }
  {
    glue_options many = base;
    many.sequences = 2;
    auto glue = std::make_unique<eviction_glue>(model.model, policy, settings, many);
    llama_context_params params = llama_context_default_params();
    params.n_ctx = 512;
    params.n_seq_max = 2;
    glue->configure(params);
    params.n_seq_max = 3;  // changed after configure
    llama_context* ctx = llama_init_from_model(model.model, params);
    expect("n_seq_max changed after configure()", ctx != nullptr && !glue->attach(ctx), glue->error(), "n_seq_max = 3");
    if (ctx != nullptr) llama_free(ctx);
  }
  llama_batch_free(batch);
  std::cout << "check-refusals: " << cases - failures << " of " << cases << " refused with a message naming the mistake\n";
  return failures == 0 ? 0 : 1;
}

// ---- scale ------------------------------------------------------------------------

struct scale_options {
  common_options common;
  policy_overrides overrides;
  std::vector<std::string> text_files;
  std::vector<std::int32_t> lengths{2048, 4096, 8192, 16384};
  std::int32_t budget = 0, ubatch = 256, timed = 256;
  std::string policy = "scissorhands", csv;
};

// Peak and current resident memory of this process, in MiB.
std::pair<double, double> resident_mib() {
  double peak = 0.0, now = 0.0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) peak = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("VmRSS:", 0) == 0) now = std::atof(line.c_str() + 6) / 1024.0;
  }
  return {peak, now};
}

// Decode speed and memory as a text grows (the user's reason to evict):
// the text fed in ubatches of --ubatch tokens up to each length L minus
// --timed, then --timed decode steps of one token, timed; at each length
// the tokens/s of those steps, llama.cpp's KV memory as allocated, the
// cells held and the process's resident memory. Stock (no --budget): one
// context of n_ctx = the largest length, so run one length per process for
// its memory. With --budget B: one context of B + ubatch cells, the glue
// evicting after every llama_decode (m = the step), all lengths in one run.
int scale(const scale_options& o) {
  model_handle model(o.common.model_path);
  const auto texts = load_texts(model.model, o.text_files, {}, 0, 0, o.common.threads, 1);
  std::vector<llama_token> tokens;
  for (const auto& t : texts)  // the texts one after another, each after the first without its BOS
    tokens.insert(tokens.end(), tokens.empty() ? t.tokens.begin() : t.tokens.begin() + 1, t.tokens.end());
  std::vector<std::int32_t> lengths = o.lengths;
  std::sort(lengths.begin(), lengths.end());
  if (lengths.empty() || lengths.front() <= o.timed)
    throw std::invalid_argument("--lengths must exceed --timed = " + std::to_string(o.timed));
  if (static_cast<std::int32_t>(tokens.size()) < lengths.back())
    throw std::invalid_argument("--text holds " + std::to_string(tokens.size()) + " tokens, below the length " +
                                std::to_string(lengths.back()));
  const bool evict = o.budget > 0;
  std::unique_ptr<eviction_glue> glue;
  std::int32_t n_ctx = lengths.back();
  const method how = method_of(evict ? o.policy : "full", o.overrides);
  if (evict) {
    if (how.type != method::kind::library) throw std::invalid_argument("scale: --policy must be a library preset");
    glue_options options;
    options.budget = o.budget;
    options.max_step_tokens = o.ubatch;
    options.scores = scores_of(o.common.scores);
    options.global_layers = o.common.global_layers;
    bridge::settings settings = how.settings;
    settings.evict_count = 1;  // after a ubatch the glue evicts down to B - 1; after a decode step, one
    glue = std::make_unique<eviction_glue>(model.model, how.policy, settings, options);
    if (!glue->ok()) throw std::runtime_error(glue->error());
    n_ctx = o.budget + o.ubatch;
  }
  kv_buffer_mib = 0.0;
  llama_context_params params = llama_context_default_params();
  params.n_ctx = static_cast<std::uint32_t>(n_ctx);
  params.n_batch = params.n_ubatch = static_cast<std::uint32_t>(o.ubatch);
  params.n_threads = params.n_threads_batch = o.common.threads;
  params.flash_attn_type = flash_of(o.common.flash_attn);
  params.swa_full = false;  // as llama-cli and llama-server create it (common_params)
  params.no_perf = true;
  if (glue) glue->configure(params);
  llama_context* ctx = llama_init_from_model(model.model, params);
  if (ctx == nullptr || (glue && !glue->attach(ctx))) throw std::runtime_error("context: " + (glue ? glue->error() : ""));
  const double kv_mib = kv_buffer_mib;
  const std::string name = !evict ? "stock" : how.label + (o.common.scores == "global" ? ":global-layers" : "");
  llama_batch batch = llama_batch_init(o.ubatch, 0, 1);
  std::ofstream csv;
  if (!o.csv.empty()) {
    const bool fresh = !std::ifstream(o.csv).good();
    csv.open(o.csv, std::ios::app);
    if (fresh)
      csv << "model,method,flash_attn,threads,length,n_ctx,tokens_per_s,kv_mib_allocated,cells_held,peak_rss_mib,"
             "rss_mib,library_percent,glue_percent\n";
  }
  llama_memory_t memory = llama_get_memory(ctx);
  std::int32_t at = 0;
  for (std::int32_t length : lengths) {
    // Fed in ubatches up to length - timed (the glue evicts after each).
    while (at < length - o.timed) {
      const std::int32_t count = std::min(o.ubatch, length - o.timed - at);
      set_batch(batch, tokens.data() + at, count, at, count - 1);
      if (glue && !glue->before_decode(batch)) throw std::runtime_error(glue->error());
      if (llama_decode(ctx, batch) != 0) throw std::runtime_error("llama_decode failed at position " + std::to_string(at));
      if (glue && !(glue->after_decode() && glue->evict())) throw std::runtime_error(glue->error());
      at += count;
    }
    const double library_before = glue ? glue->library_seconds() : 0.0;
    const double glue_before = glue ? glue->callback_seconds() + glue->evict_seconds() : 0.0;
    double decode = 0.0;
    for (; at < length; ++at) {
      set_batch(batch, tokens.data() + at, 1, at, 0);
      const auto start = std::chrono::steady_clock::now();
      if (glue && !glue->before_decode(batch)) throw std::runtime_error(glue->error());
      if (llama_decode(ctx, batch) != 0) throw std::runtime_error("llama_decode failed at position " + std::to_string(at));
      if (glue && !(glue->after_decode() && glue->evict())) throw std::runtime_error(glue->error());
      decode += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    const auto [peak, now] = resident_mib();
    const std::int32_t held = glue ? glue->held() : static_cast<std::int32_t>(llama_memory_seq_pos_max(memory, 0) + 1);
    const double library = glue ? 100.0 * (glue->library_seconds() - library_before) / decode : 0.0;
    const double all = glue ? 100.0 * (glue->callback_seconds() + glue->evict_seconds() - glue_before) / decode : 0.0;
    std::cout << "scale " << base_name(o.common.model_path) << " " << name << " (flash attention "
              << o.common.flash_attn << ", " << o.common.threads << " thread(s), n_ctx " << llama_n_ctx(ctx)
              << "): at " << length << " tokens " << fixed(o.timed / decode, 2) << " tokens/s over the last " << o.timed
              << ", KV " << fixed(kv_mib, 1) << " MiB allocated, " << held << " cells held, resident " << fixed(now, 1)
              << " MiB (peak " << fixed(peak, 1) << ")";
    if (glue) std::cout << ", library " << fixed(library, 2) << "% of the step, glue in all " << fixed(all, 2) << "%";
    std::cout << "\n";
    if (csv)
      csv << base_name(o.common.model_path) << "," << name << "," << o.common.flash_attn << ","
          << o.common.threads << "," << length << "," << llama_n_ctx(ctx) << "," << fixed(o.timed / decode, 3) << ","
          << fixed(kv_mib, 2) << "," << held << "," << fixed(peak, 1) << "," << fixed(now, 1) << "," << fixed(library, 3)
          << "," << fixed(all, 3) << "\n";
  }
  llama_batch_free(batch);
  llama_free(ctx);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scissorhands inside stock llama.cpp (docs/llama_cpp.md)"};
  app.require_subcommand(1);
  evaluate_options ev;
  auto* e = add_command(app, "evaluate", "teacher-forced NLL: policies x budgets, against the full cache", ev.common);
  add_overrides(e, ev.overrides);
  e->add_option("--text", ev.text_files, "UTF-8 text files (tokenized by llama.cpp, BOS first)")->check(CLI::ExistingFile);
  e->add_option("--tokens", ev.token_files, "token-id files (whitespace-separated ids)")->check(CLI::ExistingFile);
  e->add_option("--samples", ev.samples, "texts sampled from the model (temperature 1, top-p 0.9)");
  e->add_option("--length", ev.length, "tokens per text (cut; sampled texts' length)");
  e->add_option("--sample-seed", ev.seed, "seed of the first sampled text")->capture_default_str();
  e->add_option("--policies", ev.policies,
                "full, context-shift, " + std::string(preset_names()) +
                    "; a preset may carry settings: name:key=value/key=value (window, recent (cells or N%), sinks, "
                    "alpha, normalize)")
      ->capture_default_str();
  e->add_option("--budgets", ev.budgets, "budgets in % of the shortest text")->capture_default_str();
  e->add_option("--budget-tokens", ev.budget_tokens, "budgets in cells (replaces --budgets when given)");
  e->add_option("--protocol", ev.protocol, "decode or prefill (half the text, compressed once)")
      ->capture_default_str()
      ->check(CLI::IsMember({"decode", "prefill"}));
  e->add_option("--chunk", ev.chunk, "tokens per llama_decode (m: evicted per trigger)")->capture_default_str()->check(CLI::Range(1, 4096));
  e->add_option("--jobs,-j", ev.jobs, "texts run at once, each in its own context with --threads threads")
      ->capture_default_str()->check(CLI::Range(1, 256));
  e->add_flag("--no-reuse", ev.no_reuse,
              "decode: compute every prediction (by default those made before a method's first eviction or "
              "context shift are taken from the full cache's run of the same text: the same computation)");
  add_outputs(e, ev.csv, "cells", ev.f32_cache, ev.save_tokens);
  e->add_option("--texts-csv", ev.texts_csv,
                "write every cell's NLL sum per text (and the full cache's) as CSV, for paired comparisons");

  check_options ck;
  auto* c = add_command(app, "check-reads", "the glue observes and never evicts: logits bit for bit", ck.common);
  c->add_option("--text", ck.text_files, "UTF-8 text files")->check(CLI::ExistingFile);
  c->add_option("--tokens", ck.token_files, "token-id files")->check(CLI::ExistingFile);
  c->add_option("--length", ck.length, "tokens per text")->capture_default_str();
  c->add_option("--chunk", ck.chunk, "tokens per llama_decode")->capture_default_str();
  c->add_option("--policy", ck.policy, "preset observed")->capture_default_str();

  persistence_options pe;
  auto* p = add_command(app, "persistence", "the paper's persistence of importance per layer, full cache", pe.common);
  p->add_option("--text", pe.text_files, "UTF-8 text files")->check(CLI::ExistingFile);
  p->add_option("--tokens", pe.token_files, "token-id files")->check(CLI::ExistingFile);
  p->add_option("--samples", pe.samples, "texts sampled from the model");
  p->add_option("--sample-seed", pe.seed, "seed of the first sampled text")->capture_default_str();
  p->add_option("--length", pe.length, "tokens per text (cut; sampled texts' length)");
  p->add_option("--chunk", pe.chunk, "tokens per llama_decode")->capture_default_str()->check(CLI::Range(1, 4096));
  p->add_option("--alpha", pe.alpha, "pivotal: attention above alpha / n")->capture_default_str()->check(CLI::PositiveNumber);
  p->add_option("--min-age", pe.min_age, "pivotal only at steps at least this many after the token")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  p->add_option("--min-fraction", pe.min_fraction,
                "pivotal in a stretch: at >= this fraction of its steps (0: at least one step, the paper's)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  p->add_option("--split", pe.split, "S = floor(split * T)")->capture_default_str()->check(CLI::Range(0.01, 0.99));
  add_outputs(p, pe.csv, "layers", pe.f32_cache, pe.save_tokens);

  generate_options gen;
  auto* g = add_command(app, "generate", "sample text with the cache held to a budget of cells", gen.common);
  add_overrides(g, gen.overrides);
  g->add_option("--prompt,-p", gen.prompt, "prompt")->capture_default_str();
  g->add_option("--policy", gen.policy, preset_names())->capture_default_str();
  g->add_option("-n,--tokens", gen.tokens, "tokens to generate")->capture_default_str();
  g->add_option("--ctx", gen.n_ctx, "cells in llama.cpp's context")->capture_default_str();
  g->add_option("--budget", gen.budget, "cells kept (default: --ctx)");
  g->add_option("--seed", gen.seed, "sampling seed")->capture_default_str();
  g->add_option("--temperature", gen.temperature, "sampling temperature")->capture_default_str();
  g->add_flag("--quiet", gen.quiet, "print the summary line only");

  speed_options sp;
  auto* s = add_command(app, "speed", "decode tokens/s with and without eviction at the same cache size", sp.common);
  add_overrides(s, sp.overrides);
  s->add_option("--text", sp.text_files, "text file for the prompt")->required()->check(CLI::ExistingFile);
  s->add_option("--budget", sp.budget, "cells")->capture_default_str();
  s->add_option("-n,--tokens", sp.tokens, "decode steps timed")->capture_default_str();
  s->add_option("--policy", sp.policy, preset_names())->capture_default_str();

  interleave_options il;
  auto* i = add_command(app, "interleave",
                        "several texts decoded interleaved in one context against each alone: same evictions, same NLL",
                        il.common);
  add_overrides(i, il.overrides);
  i->add_option("--text", il.text_files, "UTF-8 text files")->check(CLI::ExistingFile);
  i->add_option("--tokens", il.token_files, "token-id files")->check(CLI::ExistingFile);
  i->add_option("--length", il.length, "tokens per text (cut)");
  i->add_option("--chunk", il.chunk, "tokens per sequence per llama_decode (m)")->capture_default_str()->check(CLI::Range(1, 4096));
  i->add_option("--budget", il.budget, "cells per sequence")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  i->add_option("--sequences", il.sequences, "sequences in the context (n_seq_max)")->capture_default_str()->check(CLI::Range(1, 64));
  i->add_option("--policy", il.policy, preset_names())->capture_default_str();
  i->add_option("--cache", il.cache, "unified (one cache), streams (one per sequence) or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"unified", "streams", "both"}));
  i->add_option("--tolerance", il.tolerance, "largest NLL difference allowed")->capture_default_str();

  agree_options ag;
  auto* a = add_command(app, "agree",
                        "flash attention's observation against llama.cpp's probabilities on the same cache", ag.common);
  add_overrides(a, ag.overrides);
  a->add_option("--text", ag.text_files, "UTF-8 text files")->check(CLI::ExistingFile);
  a->add_option("--tokens", ag.token_files, "token-id files")->check(CLI::ExistingFile);
  a->add_option("--length", ag.length, "tokens per text (cut)");
  a->add_option("--chunk", ag.chunk, "tokens per llama_decode (m)")->capture_default_str()->check(CLI::Range(1, 4096));
  a->add_option("--budgets", ag.budgets, "budgets in cells")->capture_default_str();
  a->add_option("--policy", ag.policy, preset_names())->capture_default_str();
  a->add_option("--min-agreement", ag.min_agreement,
                "% of the same-inputs evictions that must choose the same positions, ties aside")
      ->capture_default_str();

  scale_options sc;
  auto* z = add_command(app, "scale", "decode tokens/s, KV memory and resident memory as the text grows", sc.common);
  add_overrides(z, sc.overrides);
  z->add_option("--text", sc.text_files, "text files, fed one after another")->required()->check(CLI::ExistingFile);
  z->add_option("--lengths", sc.lengths, "lengths at which to time the last --timed decode steps")->capture_default_str();
  z->add_option("--budget", sc.budget, "cells kept (0: stock, n_ctx = the largest length)")->capture_default_str();
  z->add_option("--ubatch", sc.ubatch, "tokens per llama_decode while feeding the text")->capture_default_str()->check(CLI::Range(1, 4096));
  z->add_option("--timed", sc.timed, "decode steps timed before each length")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  z->add_option("--policy", sc.policy, preset_names())->capture_default_str();
  z->add_option("--csv", sc.csv, "append a row per length to this CSV");

  refusals_options rf;
  auto* r = add_command(app, "check-refusals", "engine mistakes the glue refuses with a message, nothing evicted",
                        rf.common);

  CLI11_PARSE(app, argc, argv);
  llama_backend_init();
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    if (const char* at = std::strstr(text, "KV buffer size =")) {
      double mib = 0.0;
      if (std::sscanf(at, "KV buffer size = %lf MiB", &mib) == 1) kv_buffer_mib = kv_buffer_mib + mib;
    }
  }, nullptr);
  try {
    int rc = 0;
    if (*e) rc = evaluate(ev);
    if (*c) rc = check_reads(ck);
    if (*p) rc = persistence(pe);
    if (*g) rc = generate(gen);
    if (*s) rc = speed(sp);
    if (*i) rc = interleave(il);
    if (*a) rc = agree(ag);
    if (*z) rc = scale(sc);
    if (*r) rc = check_refusals(rf);
    llama_backend_free();
    return rc;
  } catch (const std::exception& ex) {
    std::cerr << "scissorhands_llamacpp: " << ex.what() << "\n";
    return 2;
  }
}
