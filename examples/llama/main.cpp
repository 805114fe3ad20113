// scissorhands_llama: a small Llama decoder whose KV cache the library keeps
// within budget. Modes: generate, evaluate (NLL over a policy x budget grid),
// persistence (the paper's persistence ratio per layer), info.
// See docs/llama.md.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "compressor.hpp"
#include "context.hpp"
#include "engine.hpp"
#include "evaluate.hpp"
#include "gguf.hpp"
#include "model.hpp"
#include "model_path.hpp"
#include "persistence.hpp"
#include "tokenizer.hpp"

namespace {

namespace sh = scissorhands;
using namespace llama;

// Exit status when --require-model is given and no model is found: CTest's
// SKIP_RETURN_CODE, so a test that needs the model reports "skipped".
constexpr int exit_no_model = 77;

struct common_options {
  std::string model_path;
  std::string layout = "nhd";
  std::string observe = "probs";
  bool require_model = false;
  std::int32_t threads = 0;  // 0: all hardware threads
  std::int32_t context = 0;  // --context: the trained context, overriding the table and the file (0: none)
  std::int32_t kv_bits = 32;  // --kv-bits: the cache's stored format
  std::int32_t kv_group = 0;  // --kv-group (0: not given)
};

struct policy_options {
  policy_overrides overrides;
  std::string allocator = "uniform";
  double slope = 0.5;
  std::int32_t calibration = 8;
  persistence_options calibration_options;
  bool normalize_flag = false;
  std::string gqa;
  std::string compaction;
  std::string granularity;
};

// The default sampled text length: 500 tokens (8000 predictions over 16
// texts), or the model's whole trained context when it is shorter
// (babyllama105: 256).
constexpr std::int32_t default_length = 500;

struct text_options {
  std::vector<std::string> text_files, token_files;
  std::int32_t samples = 16;
  std::int32_t length = 0;  // 0: min(default_length, trained context)
  std::uint64_t sample_seed = 1;
  float sample_temperature = 1.0f;
  float sample_top_p = 0.9f;
};

void add_policy_options(CLI::App* app, policy_options& p) {
  auto& o = p.overrides;
  app->add_option("--window,-w", o.window, "sliding-window history w (steps); default 400 (the paper)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--recent,-r", o.recent, "recent window r: the r newest tokens are never evicted; default 10")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--sinks,-s", o.sinks, "attention sinks s: positions 0..s-1 never evicted; default 0 (streaming: 4)")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--evict,-m", o.evict_count, "m: tokens evicted per trigger (leaves B - m); default 1")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--alpha", o.alpha, "important_indicator: a token counts when a >= alpha / n; default 1");
  app->add_option("--decay", o.decay, "exponential_decay factor in (0, 1]; default 0.95");
  app->add_option("--normalize", o.normalize, "divide scores by the steps observed (0/1); default 0");
  app->add_option("--gqa", p.gqa, "GQA reduction of a group's probabilities: mean (default) or max")
      ->check(CLI::IsMember({"mean", "max"}));
  app->add_option("--policy-seed", o.seed, "seed of the random policy's hash; default 0");
  app->add_option("--compaction", p.compaction, "fill (O(m) moves, default) or order (keeps slot order)")
      ->check(CLI::IsMember({"fill", "order"}));
  app->add_option("--allocator", p.allocator,
                  "split of the budget across layers: uniform, ramp (later layers more), pyramid, persistence "
                  "(persistence_budget over each layer's persistence ratio, measured first on --calibration texts "
                  "sampled apart from the evaluated ones), persistence-chance (the same over the ratio's excess "
                  "above chance, (p - c) / (1 - c)); a layers-* granularity needs uniform")
      ->check(CLI::IsMember({"uniform", "ramp", "pyramid", "persistence", "persistence-chance"}));
  app->add_option("--calibration", p.calibration,
                  "persistence allocators: texts sampled to measure persistence (seeds from --sample-seed + 1000, "
                  "the evaluated texts' length)")
      ->check(CLI::Range(1, 1000));
  app->add_option("--calibration-min-age", p.calibration_options.min_age,
                  "persistence allocators: the measurement's --min-age (0: the paper's definition)")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--calibration-min-fraction", p.calibration_options.min_fraction,
                  "persistence allocators: the measurement's --min-fraction (0: the paper's definition)")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--granularity", p.granularity,
                  "which tokens leave together, for every policy (a spec's gran= key wins): " + granularity_help() +
                      ". Labels gain /granularity (scissorhands/layers-max) unless head");
  app->add_option("--slope", p.slope, "ramp/pyramid slope in [0, 1); default 0.5");
}

void finish_policy_options(policy_options& p) {
  if (p.gqa == "mean") p.overrides.gqa = gqa_kind::mean;
  if (p.gqa == "max") p.overrides.gqa = gqa_kind::max;
  if (p.compaction == "fill") p.overrides.compaction_mode = sh::compaction::fill_holes;
  if (p.compaction == "order") p.overrides.compaction_mode = sh::compaction::preserve_order;
  if (!p.granularity.empty()) p.overrides.granularity = parse_granularity(p.granularity, "--granularity");
}

// A layers-* granularity evicts the same slots from every layer: it needs
// one budget for all of them. Refused up front, before any work.
void check_granularity_allocator(const std::vector<policy_spec>& specs, const std::string& allocator) {
  if (allocator == "uniform") return;
  for (const auto& s : specs)
    if (s.granularity.kind == sh::granularity_kind::shared_layers)
      throw std::invalid_argument("policy " + s.label + " has granularity " + s.granularity.name() +
                                  ": one set of slots for the whole model needs the same budget in every layer, "
                                  "and --allocator " + allocator +
                                  " gives the layers different budgets (use --allocator uniform, or a head or heads "
                                  "granularity)");
}

// A bf16 or int8/int4 cache runs a few policies (compressor.hpp):
// the others are refused up front, naming --kv-bits.
void check_format(const std::vector<policy_spec>& specs, const kv_format& format) {
  for (const auto& s : specs)
    if (!runs_on(s, format))
      throw std::invalid_argument("--kv-bits " + std::to_string(format.bits) + ": policy " + s.label + " (" +
                                  s.describe() + ") is not built for a cache stored as " + format.name() +
                                  " (such a cache runs " + low_precision_policies() + "); use --kv-bits 32 for it");
}

// "8 bytes of codes and 8 of parameters per K or V row of 16 elements (1.00 byte per element, 25.0% of fp32)".
std::string describe_kv_format(const kv_format& f, const model_config& c) {
  std::ostringstream o;
  const double row = static_cast<double>(f.row_bytes() + f.param_row_bytes());
  o << f.row_bytes() << " bytes of " << (f.quantized() ? "codes" : "values");
  if (f.quantized()) o << " and " << f.param_row_bytes() << " of parameters";
  o << " per K or V row of " << c.head_dim << " elements (" << std::fixed << std::setprecision(2)
    << row / c.head_dim << " bytes per element, " << std::setprecision(1)
    << 100.0 * row / (4.0 * c.head_dim) << "% of fp32)";
  return o.str();
}

allocator_kind allocator_of(const std::string& s) {
  if (s == "ramp") return allocator_kind::ramp;
  if (s == "pyramid") return allocator_kind::pyramid;
  if (s.starts_with("persistence")) return allocator_kind::persistence;
  return allocator_kind::uniform;
}

void add_text_options(CLI::App* app, text_options& t) {
  app->add_option("--text", t.text_files, "UTF-8 text file(s) to evaluate (encoded with BOS first)")
      ->check(CLI::ExistingFile);
  app->add_option("--tokens", t.token_files, "token-id file(s): whitespace-separated ids, used as they are")
      ->check(CLI::ExistingFile);
  app->add_option("--samples", t.samples, "texts sampled from the full-cache model when no file is given")->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app->add_option("--length", t.length,
                  "tokens per sampled text (BOS included); default min(500, the model's trained context); more than "
                  "the trained context is refused")
      ->check(CLI::Range(2, 1 << 20));
  app->add_option("--sample-seed", t.sample_seed, "seed of the first sampled text (text k uses seed + k)")->capture_default_str();
  app->add_option("--sample-temperature", t.sample_temperature, "temperature of the sampled texts")->capture_default_str()
      ->check(CLI::Range(0.0f, 10.0f));
  app->add_option("--sample-top-p", t.sample_top_p, "top-p of the sampled texts")->capture_default_str()->check(CLI::Range(0.01f, 1.0f));
}

// A text longer than the trained context is cut to it, with a note naming
// the option, the file, its length and the context.
void clamp_to_context(eval_text& text, const std::string& option, const context_info& ctx) {
  if (static_cast<std::int64_t>(text.tokens.size()) <= ctx.tokens) return;
  std::cerr << "note: " << option << " " << text.name << " holds " << text.tokens.size() << " tokens, beyond "
            << describe_context(ctx) << ": evaluating its first " << ctx.tokens << "\n";
  text.tokens.resize(static_cast<std::size_t>(ctx.tokens));
}

std::vector<eval_text> load_texts(const text_options& t, const model& m, const tokenizer* tok, const context_info& ctx,
                                  std::string& what) {
  std::vector<eval_text> texts;
  for (const auto& f : t.text_files) {
    if (!tok) throw std::runtime_error("--text needs a tokenizer (the model file has none)");
    texts.push_back(read_text_file(f, *tok));
    clamp_to_context(texts.back(), "--text", ctx);
  }
  for (const auto& f : t.token_files) {
    texts.push_back(read_token_file(f, m.config.vocab));
    clamp_to_context(texts.back(), "--tokens", ctx);
  }
  std::ostringstream o;
  if (texts.empty()) {
    // An explicit --length past the trained context is refused; the default fits.
    if (t.length > 0) require_within_context("--length", t.length, ctx);
    const std::int32_t length = t.length > 0 ? t.length : std::min(default_length, ctx.tokens);
    texts = sample_texts(m, t.samples, length, t.sample_seed, t.sample_temperature, t.sample_top_p);
    o << t.samples << " texts of " << length << " tokens sampled from the full-cache model (seeds " << t.sample_seed
      << ".." << t.sample_seed + static_cast<std::uint64_t>(t.samples) - 1 << ", temperature " << t.sample_temperature
      << ", top-p " << t.sample_top_p << ")";
  } else {
    std::size_t total = 0;
    for (const auto& x : texts) total += x.tokens.size();
    o << texts.size() << " text file(s), " << total << " tokens";
  }
  what = o.str();
  return texts;
}

sh::named_layout layout_of(const std::string& s) { return s == "hnd" ? sh::named_layout::hnd : sh::named_layout::nhd; }

observe_source source_of(const std::string& s) {
  if (s == "queries") return observe_source::queries;
  if (s == "queries-lse") return observe_source::queries_lse;
  return observe_source::probabilities;
}

std::int32_t thread_count(std::int32_t requested) {
  if (requested > 0) return requested;
  return static_cast<std::int32_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

std::string fixed(double x, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << x;
  return o.str();
}

// The persistence allocators' input: each layer's persistence ratio (the
// `persistence` subcommand's defaults, per KV head), measured on texts
// sampled with seeds apart from the evaluated ones so that the split is not
// fitted to the texts it is judged on; persistence-chance uses the excess
// above chance, (p - c) / (1 - c) clipped to [0, 1]. Empty for the others.
std::vector<double> calibrate_persistence(const model& m, const policy_options& p, const text_options& t,
                                          std::int32_t length) {
  if (!p.allocator.starts_with("persistence")) return {};
  const std::uint64_t seed = t.sample_seed + 1000;
  const auto texts = sample_texts(m, p.calibration, length, seed, t.sample_temperature, t.sample_top_p);
  const auto layers = measure_persistence(m, texts, p.calibration_options);
  const bool over_chance = p.allocator == "persistence-chance";
  std::vector<double> ratios;
  std::cout << "persistence per layer (" << p.calibration << " calibration texts of " << length << " tokens, seeds "
            << seed << ".." << seed + static_cast<std::uint64_t>(p.calibration) - 1 << ", min-age "
            << p.calibration_options.min_age << ", min-fraction " << p.calibration_options.min_fraction << "):";
  for (const auto& l : layers) {
    double r = l.ratio;
    if (over_chance) r = l.chance < 1.0 ? std::clamp((l.ratio - l.chance) / (1.0 - l.chance), 0.0, 1.0) : 0.0;
    ratios.push_back(r);
    std::cout << " " << fixed(100 * l.ratio, 1) << "%";
    if (over_chance) std::cout << " (chance " << fixed(100 * l.chance, 1) << "%, excess " << fixed(100 * r, 1) << "%)";
  }
  std::cout << "\n";
  return ratios;
}


std::string kib(double bytes) { return fixed(bytes / 1024.0, 1) + " KiB"; }

void describe_model(const model& m, const std::string& path, const context_info& ctx) {
  const model_config& c = m.config;
  std::cout << "model: " << path << " (" << ctx.model << ")\n  " << c.layers << " layers, dim " << c.dim << ", "
            << c.q_heads << " query heads / " << c.kv_heads << " KV heads, head_dim " << c.head_dim
            << ", SwiGLU hidden " << c.hidden << ", vocab " << c.vocab << ", RMSNorm eps " << c.rms_eps
            << ", RoPE theta " << c.rope_theta
            << (m.tied_output ? ", output tied to the embedding" : ", separate output matrix") << "\n  trained context "
            << ctx.tokens << " tokens (" << ctx.source << ")\n";
}

// The table of one protocol: one row per policy, one column per budget,
// NLL and its relative increase over the full cache ("-": a cell not run).
void print_table(std::ostream& out, const std::vector<run_result>& results, const std::vector<std::int32_t>& budgets,
                 std::int32_t length) {
  const run_result& full = results.front();
  const bool prefill = full.prompt > 0;
  std::vector<std::string> labels;
  std::map<std::pair<std::string, std::int32_t>, const run_result*> cell;
  for (std::size_t i = 1; i < results.size(); ++i) {
    const auto& r = results[i];
    if (std::find(labels.begin(), labels.end(), r.label) == labels.end()) labels.push_back(r.label);
    cell[{r.label, r.budget}] = &r;
  }
  const auto any_at = [&](std::int32_t b) -> const run_result* {
    for (const auto& l : labels)
      if (const auto it = cell.find({l, b}); it != cell.end()) return it->second;
    return nullptr;
  };
  std::size_t w0 = 14;
  for (const auto& l : labels) w0 = std::max(w0, l.size() + 1);
  const int w = 17;
  const kv_format format{full.kv_bits, full.kv_group, 0};
  out << "\nProtocol " << full.protocol
      << (prefill ? " (prompt of " + std::to_string(full.prompt) + " tokens prefilled and compressed to B, the rest "
                    "teacher-forced with the cache growing)"
                  : " (one token a step, compress at B)")
      << ": mean NLL (nats/token) over " << full.predictions
      << " predictions; in brackets the increase over the full cache (" << fixed(full.nll(), 4) << ")\n";
  if (format.bits != 32)
    out << "KV cache stored as " << format.name() << ": the full " << format.name() << " cache's NLL is "
        << fixed(full.nll(), 4) << ", the full fp32 cache's " << fixed(full.nll_fp32, 4) << " ("
        << (full.nll() >= full.nll_fp32 ? "+" : "") << fixed(100.0 * (full.nll() - full.nll_fp32) / full.nll_fp32, 2)
        << "% from storage alone)\n";
  const auto row_label = [&](const std::string& l) { out << std::left << std::setw(static_cast<int>(w0)) << l << std::right; };
  row_label("budget B");
  for (auto b : budgets) out << std::setw(w) << b;
  out << std::setw(w) << "full" << "\n";
  row_label("B / length");
  for (auto b : budgets) out << std::setw(w) << fixed(100.0 * b / length, 1) + "%";
  out << std::setw(w) << "" << "\n";
  row_label("KV held");
  for (auto b : budgets) {
    const run_result* any = any_at(b);
    out << std::setw(w) << (any ? fixed(100.0 * any->kv_fraction, 1) + "%" : "-");
  }
  out << std::setw(w) << "100.0%" << "\n";
  if (prefill) {
    row_label("prompt kept");
    for (auto b : budgets) {
      const run_result* any = any_at(b);
      out << std::setw(w) << (any ? fixed(100.0 * any->prompt_kv_fraction, 1) + "%" : "-");
    }
    out << std::setw(w) << "100.0%" << "\n";
  }
  for (const auto& l : labels) {
    row_label(l);
    for (auto b : budgets) {
      const auto it = cell.find({l, b});
      if (it == cell.end()) {
        out << std::setw(w) << "-";
        continue;
      }
      const run_result* r = it->second;
      const double rel = 100.0 * (r->nll() - full.nll()) / full.nll();
      out << std::setw(w) << (fixed(r->nll(), 4) + " (" + (rel >= 0 ? "+" : "") + fixed(rel, 1) + "%)");
    }
    out << std::setw(w) << fixed(full.nll(), 4) << "\n";
  }
  // What each cell holds: the K/V values or codes and their parameters at
  // the peak (the same for every policy at a budget), then per policy the
  // total with its state buffers.
  out << "KV memory held (KiB, all layers, peak): K+V " << (format.quantized() ? "codes" : "values") << " as "
      << format.name()
      << (format.quantized() ? std::string(", their fp32 scales") + (format.bits == 4 ? " and offsets" : "") : "")
      << "; per policy the total with the library's state (state in brackets)\n";
  const auto kib_of = [](double bytes) { return fixed(bytes / 1024.0, 1); };
  const auto pick = [&](const std::string& l, std::int32_t b) -> const run_result* {
    const auto it = cell.find({l, b});
    return it == cell.end() ? nullptr : it->second;
  };
  const auto memory_row = [&](const std::string& label, double run_result::*field) {
    row_label(label);
    for (auto b : budgets) {
      const run_result* any = any_at(b);
      out << std::setw(w) << (any ? kib_of(any->*field) : std::string("-"));
    }
    out << std::setw(w) << kib_of(full.*field) << "\n";
  };
  memory_row("K+V " + format.name(), &run_result::kv_bytes);
  if (format.quantized()) memory_row("parameters", &run_result::param_bytes);
  for (const auto& l : labels) {
    row_label(l);
    for (auto b : budgets) {
      const run_result* r = pick(l, b);
      out << std::setw(w) << (r ? kib_of(r->total_bytes()) + " (" + kib_of(r->state_bytes) + ")" : std::string("-"));
    }
    out << std::setw(w) << kib_of(full.total_bytes()) << "\n";
  }
}

// Every protocol's rows, each relative to its own full cache. The columns
// before `description` are those of earlier versions; `model`, `protocol`,
// `prompt`, `prompt_kv_fraction` and `budget_fraction` (B / text length)
// follow it, then the stored format: `kv_bits`, `kv_group`,
// `kv_param_kib` (quantization parameters; kv_kib holds the values or
// codes), `total_kib` (kv_kib + kv_param_kib + state_kib), `nll_fp32`
// (the full fp32 cache's NLL on the same texts and protocol) and
// `state_slot_kib` (state_kib less its fixed per-row part and alignment:
// what the state costs per token at scale).
void write_csv(const std::string& path, const std::vector<std::vector<run_result>>& protocols,
               const std::string& model_name, std::int32_t length) {
  std::ofstream o(path);
  if (!o) throw std::runtime_error("cannot write CSV '" + path + "'");
  o << "policy,budget,kv_fraction,kv_kib,state_kib,predictions,nll,nll_full,relative_increase,library_s,compress_s,"
       "step_s,library_fraction,description,model,protocol,prompt,prompt_kv_fraction,budget_fraction,kv_bits,kv_group,"
       "kv_param_kib,total_kib,nll_fp32,state_slot_kib\n";
  for (const auto& results : protocols) {
    const double full = results.front().nll();
    for (const auto& r : results) {
      o << r.label << "," << r.budget << "," << fixed(r.kv_fraction, 6) << "," << fixed(r.kv_bytes / 1024.0, 3) << ","
        << fixed(r.state_bytes / 1024.0, 3) << "," << r.predictions << "," << fixed(r.nll(), 6) << ","
        << fixed(full, 6) << "," << fixed((r.nll() - full) / full, 6) << "," << fixed(r.library_seconds, 6) << ","
        << fixed(r.compress_seconds, 6) << "," << fixed(r.step_seconds, 6) << ","
        << fixed(r.step_seconds > 0 ? r.library_seconds / r.step_seconds : 0.0, 6) << ",\"" << r.description << "\","
        << model_name << "," << r.protocol << "," << r.prompt << ","
        << fixed(r.prompt > 0 ? r.prompt_kv_fraction : 0.0, 6) << ","
        << fixed(static_cast<double>(r.budget) / length, 6) << "," << r.kv_bits << "," << r.kv_group << ","
        << fixed(r.param_bytes / 1024.0, 3) << "," << fixed(r.total_bytes() / 1024.0, 3) << ","
        << fixed(r.nll_fp32, 6) << "," << fixed(r.state_slot_bytes / 1024.0, 3) << "\n";
    }
  }
}

void print_library_time(std::ostream& out, const std::vector<run_result>& results) {
  const bool prefill = !results.empty() && results.front().prompt > 0;
  double lib = 0.0, step = 0.0, full_step = 0.0;
  std::int64_t full_tokens = 0, tokens = 0;
  for (const auto& r : results) {
    if (r.budget == 0) {
      full_step += r.step_seconds;
      full_tokens += r.tokens_fed;
      continue;
    }
    lib += r.library_seconds;
    step += r.step_seconds;
    tokens += r.tokens_fed;
  }
  out << "\nLibrary time (host::observe_* + host::compress, every layer) in the compressed runs, protocol "
      << (results.empty() ? std::string("decode") : results.front().protocol) << ": " << fixed(lib, 3) << " s of "
      << fixed(step, 3) << (prefill ? " s of prefill and steps (" : " s of decode steps (")
      << fixed(step > 0 ? 100.0 * lib / step : 0.0, 1)
      << "%); " << fixed(tokens ? 1e6 * lib / static_cast<double>(tokens) : 0.0, 1) << " us of "
      << fixed(tokens ? 1e6 * step / static_cast<double>(tokens) : 0.0, 1)
      << " us per token fed (full cache, no library: "
      << fixed(full_tokens ? 1e6 * full_step / static_cast<double>(full_tokens) : 0.0, 1) << " us per token)\n";
  // Per policy, since the static ones never read attention.
  struct sums {
    double library = 0, compress = 0, step = 0;
  };
  std::map<std::string, sums> per;
  for (const auto& r : results)
    if (r.budget != 0) {
      per[r.label].library += r.library_seconds;
      per[r.label].compress += r.compress_seconds;
      per[r.label].step += r.step_seconds;
    }
  std::size_t width = 0;
  for (const auto& [label, t] : per) width = std::max(width, label.size() + 2);
  for (const auto& [label, t] : per)
    out << "  " << std::left << std::setw(static_cast<int>(width)) << label << std::right << std::setw(5)
        << fixed(100.0 * t.library / t.step, 1) << "% of step time (observe " << fixed(100.0 * (t.library - t.compress) / t.step, 1)
        << "%, compress " << fixed(100.0 * t.compress / t.step, 1) << "%)\n";
}

int run_plot(const std::string& csv, const std::string& png) {
  const std::string script = repo_root() + "/scripts/plot_nll.sh";
  if (!std::filesystem::exists(script)) {
    std::cerr << "plot: " << script << " not found; skipping the plot\n";
    return 1;
  }
  const std::string cmd = "bash '" + script + "' '" + csv + "' '" + png + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) std::cerr << "plot: '" << cmd << "' failed (is gnuplot installed? scripts/setup.sh installs it)\n";
  return rc;
}

// The synthetic fallback: the same engine and library on a random-weight
// model of the same shape. Random models show no persistence of
// importance, so this demonstrates the mechanics, not the quality.
int synthetic_demo() {
  std::cerr << "Falling back to the synthetic demo: a random-weight model of stories260K's shape, random text.\n"
               "(For the synthetic workload without a model see also the scissorhands_synthetic example.)\n";
  const model_config c{
      .dim = 64, .layers = 2, .q_heads = 8, .kv_heads = 4, .head_dim = 8, .hidden = 172, .vocab = 512, .context = 512};
  const model m = model::random(c, 7);
  const auto texts = sample_texts(m, 2, 160, 1, 1.0f, 1.0f);
  std::vector<policy_spec> specs;
  for (const char* p : {"scissorhands", "h2o", "streaming", "random"}) specs.push_back(parse_policy(p));
  const std::vector<std::int32_t> budgets{32, 64};
  eval_options o;
  const auto results = evaluate_grid(m, texts, specs, budgets, o);
  std::cout << "synthetic demo: random 2-layer model, 2 random texts of 160 tokens (random weights have no\n"
               "persistence of importance, so the policies are expected to tie; this shows the mechanics only)\n";
  print_table(std::cout, results, budgets, 160);
  print_library_time(std::cout, results);
  return 0;
}

struct loaded {
  model weights;
  std::unique_ptr<tokenizer> tok;
  std::string path;
  context_info context;
};

std::unique_ptr<loaded> load_model(const common_options& c, int& exit_code) {
  const model_location where = find_model(c.model_path);
  if (where.path.empty()) {
    std::cerr << missing_model_help(where);
    exit_code = c.require_model ? exit_no_model : synthetic_demo();
    return nullptr;
  }
  auto l = std::make_unique<loaded>();
  const gguf_file f = gguf_file::open(where.path);
  l->weights = model::load(f);
  if (f.find("tokenizer.ggml.tokens")) l->tok = std::make_unique<tokenizer>(f);
  l->path = where.path;
  l->context = resolve_context(l->weights.config, where.path, c.context);
  return l;
}

class progress_line {
 public:
  explicit progress_line(std::string what) : what_(std::move(what)), tty_(isatty(2) != 0), start_(clock::now()) {}
  void update(std::size_t done, std::size_t total, const std::string& last) {
    const double s = std::chrono::duration<double>(clock::now() - start_).count();
    std::cerr << (tty_ ? "\r" : "") << "[" << what_ << "] " << done << "/" << total << " runs, " << fixed(s, 1)
              << " s, last: " << last << (tty_ ? "          " : "\n") << std::flush;
  }
  ~progress_line() {
    if (tty_) std::cerr << "\n";
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string what_;
  bool tty_;
  clock::time_point start_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scissorhands_llama: a Llama decoder with a KV cache kept within budget by scissorhands"};
  app.require_subcommand(1);
  app.fallthrough();
  common_options common;
  app.add_option("--model", common.model_path,
                 "GGUF model (default: $SCISSORHANDS_MODEL, else ../shared/models/stories260K.gguf beside the repo)");
  app.add_option("--layout", common.layout, "the engine's KV layout: nhd or hnd")->capture_default_str()->check(CLI::IsMember({"nhd", "hnd"}));
  app.add_option("--observe", common.observe,
                 "what the library observes: probs (the engine's softmax), queries (recomputed from Q and K), "
                 "queries-lse (with the engine's log-sum-exp)")->capture_default_str()
      ->check(CLI::IsMember({"probs", "queries", "queries-lse"}));
  app.add_flag("--require-model", common.require_model, "exit 77 (CTest: skipped) when no model is found");
  app.add_option("--threads", common.threads, "worker threads for the evaluate grid (0: hardware, at most 8)")
      ->check(CLI::Range(0, 256));
  app.add_option("--kv-bits", common.kv_bits,
                 "how the KV cache stores K and V (generate, evaluate): 32 = fp32 (default), 16 = bf16, 8 = int8 "
                 "codes, 4 = int4 codes (docs/quantization.md); 16, 8 and 4 run " + low_precision_policies());
  app.add_option("--kv-group", common.kv_group,
                 "--kv-bits 8 and 4: elements per quantization group (one fp32 scale, and an fp32 offset for int4); must "
                 "divide head_dim; default min(32, head_dim)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--context", common.context,
                 "the model's trained context in tokens, overriding the known-models table and the file's "
                 "context_length (docs/llama.md: how it is determined)")
      ->check(CLI::Range(2, 1 << 24));

  // generate
  auto* gen = app.add_subcommand("generate", "prompt in, text out, under a policy and budget");
  std::string prompt;
  std::int32_t steps = 200, gen_budget = 64;
  float temperature = 0.0f, top_p = 0.9f;
  std::uint64_t seed = 1;
  std::string gen_policy = "scissorhands";
  bool no_stop = false;
  policy_options gen_opts;
  gen->add_option("--prompt,-p", prompt, "prompt text (empty: start from BOS alone)");
  gen->add_option("--steps,-n", steps, "tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  gen->add_option("--temperature,-t", temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0f, 10.0f));
  gen->add_option("--top-p", top_p, "nucleus sampling mass")->capture_default_str()->check(CLI::Range(0.01f, 1.0f));
  gen->add_option("--seed", seed, "sampling seed")->capture_default_str();
  gen->add_option("--policy", gen_policy, "policy spec, or 'full' for an uncompressed cache. " + policy_help())->capture_default_str();
  gen->add_option("--budget,-B", gen_budget, "KV budget B: tokens per head and layer (mean over layers)")->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  gen->add_flag("--no-stop", no_stop, "keep going past BOS/EOS (the model emits BOS between stories)");
  add_policy_options(gen, gen_opts);

  // evaluate
  auto* ev = app.add_subcommand("evaluate", "teacher-forced NLL over texts for a policy x budget grid");
  // The paper's settings for each, plus Scissorhands and H2O with scores
  // divided by the steps observed (the brief: measure, don't assume).
  // The library's default (scissorhands_policy), the paper's exact setting,
  // the important-step count, H2O raw and normalised, TOVA, StreamingLLM and
  // random: what practitioners compare (docs/quality.md).
  std::vector<std::string> policies{"scissorhands", "scissorhands-paper", "scissorhands-important",
                                    "h2o",          "h2o:norm=1,label=h2o-norm", "tova", "snapkv",
                                    "streaming",    "random"};
  // Fractions of the evaluated text length, so that models of different
  // contexts compare (500 tokens: B = 16, 31, 63, 125, 250).
  std::vector<std::string> budget_texts{"3.125%", "6.25%", "12.5%", "25%", "50%"};
  std::vector<std::string> protocol_texts{"decode"};
  std::string csv = "llama_nll.csv", png = "llama_nll.png";
  bool no_plot = false;
  policy_options ev_opts;
  text_options ev_texts;
  ev->add_option("--policies", policies, "policy specs (space-separated). " + policy_help())->capture_default_str();
  ev->add_option("--budgets", budget_texts,
                 "budgets B (mean tokens per head and layer), comma-separated: a token count, or a percentage of the "
                 "text length (a percentage a policy cannot run, e.g. not above its protected tokens, is skipped "
                 "and reported; a token count is refused)")
      ->capture_default_str()
      ->delimiter(',');
  ev->add_option("--protocol", protocol_texts,
                 "decode (one token a step, compress at B), and/or prefill:P[:k] (P prompt tokens in one pass, the "
                 "library observes all P queries or the last k, compresses each layer to B, the rest is "
                 "teacher-forced with no further eviction); P may be a percentage of the text length (prefill:50%)")
      ->capture_default_str();
  ev->add_option("--csv", csv, "where to write the CSV")->capture_default_str();
  ev->add_option("--plot", png, "where to draw the plot (PNG, via scripts/plot_nll.sh and gnuplot)")->capture_default_str();
  ev->add_flag("--no-plot", no_plot, "skip the plot");
  add_policy_options(ev, ev_opts);
  add_text_options(ev, ev_texts);

  // persistence
  auto* pe = app.add_subcommand("persistence", "the persistence ratio of pivotal tokens per layer (docs/llama.md)");
  text_options pe_texts;
  persistence_options pe_opts;
  std::string pe_gqa = "mean";
  add_text_options(pe, pe_texts);
  pe->add_option("--split", pe_opts.split, "the earlier stretch is steps [0, split * T)->capture_default_str()")->check(CLI::Range(0.01, 0.99));
  pe->add_option("--min-fraction", pe_opts.min_fraction,
                 "pivotal in a stretch = above average at >= this fraction of its steps (0: at least one step)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  pe->add_option("--alpha", pe_opts.alpha, "pivotal at a step: a > alpha / n")->capture_default_str();
  pe->add_option("--min-age", pe_opts.min_age,
                 "count a token as pivotal only at steps at least this many after its own (0: every step, the "
                 "paper; 10 = the recent window r)")->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  pe->add_flag("--per-query-head", pe_opts.per_query_head, "per query head instead of per KV head");
  pe->add_option("--gqa", pe_gqa, "reduction over a KV head's query heads: mean or max")
      ->check(CLI::IsMember({"mean", "max"}));

  auto* info = app.add_subcommand("info", "print the model's shape and a tokenizer round trip");

  CLI11_PARSE(app, argc, argv);

  try {
    // --kv-bits is checked before anything loads; --kv-group against the model's head_dim below.
    resolve_kv_format(common.kv_bits, 0, 32);
    if (*pe && (common.kv_bits != 32 || common.kv_group != 0))
      throw std::invalid_argument("--kv-bits and --kv-group apply to generate and evaluate (persistence measures the "
                                  "model's own fp32 attention)");
    int exit_code = 0;
    auto l = load_model(common, exit_code);
    if (!l) return exit_code;
    const model& m = l->weights;
    const context_info& ctx = l->context;
    describe_model(m, l->path, ctx);
    const kv_format format = resolve_kv_format(common.kv_bits, common.kv_group, m.config.head_dim);
    if (format.bits != 32)
      std::cout << "KV cache stored as " << format.name() << ": " << describe_kv_format(format, m.config) << "\n";

    if (*info) {
      if (l->tok) {
        const std::string s = "Once upon a time, there was a little girl named Lily.";
        const auto ids = l->tok->encode(s);
        std::cout << "tokenizer: " << l->tok->size() << " pieces; \"" << s << "\" -> " << ids.size() << " tokens:";
        for (auto id : ids) std::cout << " " << id;
        std::cout << "\n  decoded: \"" << l->tok->decode(ids) << "\"\n";
      }
      return 0;
    }

    if (*gen) {
      finish_policy_options(gen_opts);
      // The engine never runs past the trained context: a prompt beyond it is
      // refused, and --steps is clamped to what is left of it.
      engine e(m, ctx.tokens, sh::named_layout::nhd, format);
      const bool full = gen_policy == "full";
      policy_spec spec;
      std::vector<std::int32_t> layer_budgets;
      if (!full) {
        spec = parse_policy(gen_policy, gen_opts.overrides);
        check_granularity_allocator({spec}, gen_opts.allocator);
        check_format({spec}, format);
        const auto ratios = calibrate_persistence(m, gen_opts, text_options{}, std::min(default_length, ctx.tokens));
        layer_budgets =
            allocate_budgets(gen_budget, m.config.layers, allocator_of(gen_opts.allocator), gen_opts.slope, ratios);
        e.set_policy(&spec, layer_budgets, source_of(common.observe));
      }
      std::vector<std::int32_t> tokens = l->tok ? l->tok->encode(prompt, true) : std::vector<std::int32_t>{1};
      if (static_cast<std::int64_t>(tokens.size()) >= ctx.tokens)
        throw std::invalid_argument("--prompt encodes to " + std::to_string(tokens.size()) +
                                    " tokens (BOS included), leaving no room within " + describe_context(ctx) +
                                    ": shorten it, or --context N to override");
      if (static_cast<std::int64_t>(tokens.size()) + steps > ctx.tokens) {
        const auto left = ctx.tokens - static_cast<std::int32_t>(tokens.size());
        std::cerr << "note: --steps " << steps << " after a " << tokens.size() << "-token prompt would run past "
                  << describe_context(ctx) << ": generating at most " << left << "\n";
        steps = left;
      }
      sampler next(temperature, top_p, seed);
      std::cout << "policy: " << (full ? "full cache" : spec.label + " (" + spec.describe() + ")") << "\n\n";
      if (l->tok) std::cout << l->tok->decode(tokens) << std::flush;
      const float* logits = nullptr;
      for (auto t : tokens) logits = e.step(t);
      std::int32_t peak = 0;
      for (std::int32_t i = 0; i < steps && e.position() < e.max_tokens(); ++i) {
        const std::int32_t t = next(logits, m.config.vocab);
        if (!no_stop && (t == 1 || t == 2)) break;
        if (l->tok) std::cout << l->tok->piece_text(tokens.back(), t) << std::flush;
        else std::cout << " " << t;
        tokens.push_back(t);
        logits = e.step(t);
      }
      for (std::int32_t layer = 0; layer < m.config.layers; ++layer)
        peak += full ? e.position() : std::min(e.position(), e.capacity(layer));
      const model_config& c = m.config;
      // K and V of a token in one layer as stored (values or codes and
      // their parameters); the full cache for comparison is fp32.
      const double row = 2.0 * c.kv_heads * static_cast<double>(format.row_bytes() + format.param_row_bytes());
      const double full_bytes = 2.0 * c.kv_heads * c.head_dim * sizeof(float) * c.layers * e.position();
      std::cout << "\n\n" << e.position() << " tokens; KV cache held at most " << kib(row * peak) << " ("
                << fixed(static_cast<double>(peak) / c.layers, 1) << " tokens per head and layer"
                << (format.bits != 32 ? ", stored as " + format.name() : std::string()) << ") against "
                << kib(full_bytes) << " for the full fp32 cache ("
                << fixed(full_bytes > 0 ? 100.0 * row * peak / full_bytes : 0.0, 1) << "%)";
      if (!full) std::cout << "; library state " << kib(static_cast<double>(e.state_bytes()));
      const auto& tm = e.times();
      std::cout << "\nlibrary (observe + compress): "
                << fixed(100.0 * std::chrono::duration<double>(tm.library).count() /
                             std::max(1e-12, std::chrono::duration<double>(tm.total).count()), 1)
                << "% of step time\n";
      return 0;
    }

    if (*ev) {
      finish_policy_options(ev_opts);
      if (format.bits != 32 && ev->count("--policies") == 0) {
        // The default grid, less the policies a bf16 or int8/int4 cache does not run.
        std::vector<std::string> kept;
        for (const auto& p : policies)
          if (runs_on(parse_policy(p, ev_opts.overrides), format)) kept.push_back(p);
        policies = kept;
      }
      {
        // Specs are parsed (and the granularity and format checked) before any work.
        std::vector<policy_spec> early;
        for (const auto& p : policies) early.push_back(parse_policy(p, ev_opts.overrides));
        check_granularity_allocator(early, ev_opts.allocator);
        check_format(early, format);
      }
      std::vector<protocol> protocols;
      for (const auto& p : protocol_texts) protocols.push_back(parse_protocol(p));
      std::vector<budget_spec> budget_specs;
      bool percentages = false;
      for (const auto& b : budget_texts) {
        budget_specs.push_back(parse_budget(b));
        percentages = percentages || budget_specs.back().percent > 0.0;
      }
      std::string what;
      const auto texts = load_texts(ev_texts, m, l->tok.get(), ctx, what);
      std::int32_t longest = 0, shortest = std::numeric_limits<std::int32_t>::max();
      for (const auto& t : texts) {
        longest = std::max(longest, static_cast<std::int32_t>(t.tokens.size()));
        shortest = std::min(shortest, static_cast<std::int32_t>(t.tokens.size()));
      }
      for (auto& p : protocols) p = resolve_protocol(p, shortest);
      // Budgets: token counts as given; percentages of the evaluated length
      // (the longest text's tokens).
      std::vector<std::int32_t> budgets;
      for (const auto& b : budget_specs) budgets.push_back(resolve_budget(b, longest));
      std::sort(budgets.begin(), budgets.end());
      budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
      std::vector<policy_spec> specs;
      for (const auto& p : policies) specs.push_back(parse_policy(p, ev_opts.overrides));
      eval_options o;
      o.layout = layout_of(common.layout);
      o.source = source_of(common.observe);
      o.allocator = allocator_of(ev_opts.allocator);
      o.slope = ev_opts.slope;
      o.persistence = calibrate_persistence(m, ev_opts, ev_texts, longest);
      o.threads = thread_count(common.threads);
      o.format = format;
      std::cout << "texts: " << what << "\n";
      std::cout << "budgets:";
      for (auto b : budgets) std::cout << " " << b;
      std::cout << " (" << (percentages ? "percentages of " : "") << "the evaluated length " << longest
                << "); layout " << common.layout << ", observe " << common.observe << ", budgets split "
                << ev_opts.allocator << " across layers\nprotocols:";
      for (const auto& p : protocols) std::cout << " " << p.label();
      std::cout << "\npolicies:\n";
      std::size_t width = 0;
      for (const auto& s : specs) width = std::max(width, s.label.size() + 2);
      for (const auto& s : specs)
        std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << s.label << std::right << s.describe()
                  << "\n";
      // (Percentages: the prefill cells with B >= P are skipped and listed below the table.)
      for (const auto& p : protocols)
        for (auto b : percentages ? std::vector<std::int32_t>{} : budgets) {
          const std::int32_t reach = p.type == protocol::kind::prefill ? p.prompt : longest;
          if (b >= reach)
            std::cerr << "note: " << p.label() << ": budget " << b << " is not below the "
                      << (p.type == protocol::kind::prefill ? "prompt (" : "longest text (") << reach
                      << " tokens): it never evicts\n";
        }
      std::cout << std::flush;
      std::vector<std::vector<run_result>> all;
      for (const auto& p : protocols) {
        progress_line bar("evaluate " + p.label());
        std::vector<skipped_cell> skipped;
        all.push_back(evaluate_grid(
            m, texts, specs, budgets, o, p,
            [&](std::size_t done, std::size_t total, const run_result& r) {
              bar.update(done, total, r.label + (r.budget ? " B=" + std::to_string(r.budget) : ""));
            },
            percentages ? &skipped : nullptr));
        print_table(std::cout, all.back(), budgets, longest);
        // Skipped cells, one line per budget and reason.
        std::map<std::pair<std::int32_t, std::string>, std::vector<std::string>> why;
        for (const auto& c : skipped) why[{c.budget, c.reason}].push_back(c.label);
        for (const auto& [key, labels] : why) {
          std::cout << "  not run at B = " << key.first << " (";
          for (std::size_t i = 0; i < labels.size(); ++i) std::cout << (i ? ", " : "") << labels[i];
          std::cout << "): " << key.second << "\n";
        }
        print_library_time(std::cout, all.back());
      }
      write_csv(csv, all, ctx.model, longest);
      std::cout << "\nCSV: " << csv << "\n";
      std::cout << std::flush;
      if (!no_plot && run_plot(csv, png) == 0) std::cout << "plot: " << png << "\n";
      return 0;
    }

    if (*pe) {
      pe_opts.gqa = pe_gqa == "max" ? gqa_kind::max : gqa_kind::mean;
      std::string what;
      const auto texts = load_texts(pe_texts, m, l->tok.get(), ctx, what);
      std::cout << "texts: " << what << "\n";
      std::cout << "pivotal: a(t,i) > " << pe_opts.alpha << "/n_t, per "
                << (pe_opts.per_query_head ? "query head" : "KV head (" + pe_gqa + " over its query heads)")
                << (pe_opts.min_age > 0 ? ", from age " + std::to_string(pe_opts.min_age) + " steps on" : "")
                << "; earlier stretch: steps [0, " << pe_opts.split << " T); pivotal in a stretch: at "
                << (pe_opts.min_fraction > 0 ? ">= " + fixed(100 * pe_opts.min_fraction, 0) + "% of its steps" : "least one step")
                << "\n\n";
      const auto layers = measure_persistence(m, texts, pe_opts);
      std::cout << "layer  persistence  chance=|E|/S  |L|/S   |E&L|   S      pivotal/step (% of n)\n";
      for (std::size_t i = 0; i < layers.size(); ++i) {
        const auto& p = layers[i];
        std::cout << std::setw(5) << i << std::setw(12) << fixed(100 * p.ratio, 1) << "%" << std::setw(13)
                  << fixed(100 * p.chance, 1) << "%" << std::setw(7) << fixed(100 * p.late_size / p.tokens, 1) << "%" << std::setw(8)
                  << fixed(p.overlap, 1) << std::setw(7) << fixed(p.tokens, 0) << std::setw(9)
                  << fixed(p.step_pivotal, 1) << " (" << fixed(100 * p.step_fraction, 1) << "%)\n";
      }
      std::cout << "\npersistence = |E & L| / |L| pooled over heads and texts; chance = |E| / S, the ratio if L\n"
                   "were drawn at random; sizes are means per head and text (docs/llama.md).\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
