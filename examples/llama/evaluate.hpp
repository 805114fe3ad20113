#pragma once
// Evaluation texts and teacher-forced negative log-likelihood under a
// policy and budget grid.
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <scissorhands/kv_view.hpp>

#include "compressor.hpp"
#include "kv_format.hpp"
#include "model.hpp"

namespace llama {

class tokenizer;

struct eval_text {
  std::string name;
  std::vector<std::int32_t> tokens;  // BOS first for encoded or sampled texts
};

// Temperature / top-p sampling; temperature 0 is greedy (lowest id on ties).
class sampler {
 public:
  sampler(float temperature, float top_p, std::uint64_t seed);
  std::int32_t operator()(const float* logits, std::int32_t vocab);

 private:
  float temperature_, top_p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, std::int32_t>> scratch_;
};

// `count` texts of `length` tokens sampled from the full-cache model from
// BOS, text k with seed `seed + k`; sampling runs through story boundaries
// (the model emits BOS between stories, as it was trained).
std::vector<eval_text> sample_texts(const model& m, std::int32_t count, std::int32_t length, std::uint64_t seed,
                                    float temperature, float top_p);
// A UTF-8 file, encoded with BOS first.
eval_text read_text_file(const std::string& path, const tokenizer& tok);
// Whitespace-separated token ids (no BOS added: the file says what it means).
eval_text read_token_file(const std::string& path, std::int32_t vocab);

// How the budgets are split across layers: `budget` is the mean per layer.
// persistence: the library's persistence_budget over `persistence` (one
// ratio per layer, measured beforehand).
enum class allocator_kind { uniform, ramp, pyramid, persistence };
std::vector<std::int32_t> allocate_budgets(std::int32_t budget, std::int32_t layers, allocator_kind kind,
                                           double slope, const std::vector<double>& persistence = {});

// How a text is run (docs/llama.md):
//  decode             one token per step, prompt included; the library observes
//                     every step and compresses at B (the cache never holds
//                     more than B). NLL of every token after the first.
//  prefill:P[:k]      the first P tokens in one pass (causal attention among
//                     them); the library observes all P queries (or the last
//                     k, as SnapKV) and compresses each layer to B in one go;
//                     the remaining tokens are teacher-forced one a step with
//                     the cache growing and no further eviction. NLL of
//                     tokens P .. T-1 (what follows the prompt).
// P may be given as a percentage of the text length ("prefill:50%"), resolved
// against the shortest text by resolve_protocol.
struct protocol {
  enum class kind { decode, prefill };
  kind type = kind::decode;
  std::int32_t prompt = 0;        // P
  double prompt_percent = 0.0;    // P as a % of the text length, until resolved (0: P is given)
  std::int32_t observe_last = 0;  // k; 0 observes all P queries
  std::string label() const;      // "decode", "prefill:250", "prefill:250:32"
};
// Parses "decode", "prefill:P", "prefill:P:k", "prefill:P%[:k]"; throws
// std::invalid_argument naming --protocol and what it accepts.
protocol parse_protocol(const std::string& text);
// Resolves a percentage and checks 1 <= P < shortest text (at least one token
// follows the prompt) and k <= P; throws std::invalid_argument naming
// --protocol, the value and the bound.
protocol resolve_protocol(protocol p, std::int32_t shortest_text);

// A budget as tokens ("64") or as a percentage of the evaluated text length
// ("12.5%"), so that models with different contexts compare.
struct budget_spec {
  std::int32_t tokens = 0;
  double percent = 0.0;  // > 0: a percentage
  std::string text;      // as given
};
budget_spec parse_budget(const std::string& text);  // throws std::invalid_argument naming --budgets
// round(percent / 100 * length), at least 1; tokens as they are.
std::int32_t resolve_budget(const budget_spec& b, std::int32_t length);

struct run_result {
  std::string label;                 // policy label, or "full"
  std::string protocol = "decode";   // protocol::label()
  std::int32_t prompt = 0;           // P (prefill)
  double prompt_kv_fraction = 0.0;   // prefill: tokens kept after compress / P, mean over layers and texts (1 for full)
  std::string description;           // policy_spec::describe()
  std::int32_t budget = 0;           // mean per layer; 0 for the full cache
  std::vector<std::int32_t> budgets; // per layer
  double nll_sum = 0.0;              // nats
  std::int64_t predictions = 0;
  std::int64_t tokens_fed = 0;       // tokens through the model (prompt + steps)
  double kv_fraction = 0.0;          // peak K/V tokens held / a full cache's, averaged over texts
  double kv_bytes = 0.0;             // peak K/V bytes held: values or codes (all layers, mean over texts)
  double param_bytes = 0.0;          // their quantization parameters at that peak (0 for fp32 and bf16)
  double state_bytes = 0.0;          // the library's state buffers (all layers)
  double state_slot_bytes = 0.0;     // of which per (head, slot): engine::state_slot_bytes
  std::int32_t kv_bits = 32;         // the stored format (kv_format)
  std::int32_t kv_group = 0;         // elements per scale (8 and 4 bits)
  double nll_fp32 = 0.0;             // the full fp32 cache's NLL on the same texts and protocol (evaluate_grid)
  double library_seconds = 0.0;      // observe + compress
  double compress_seconds = 0.0;     // of which compress
  double step_seconds = 0.0;         // whole steps
  double nll() const { return predictions ? nll_sum / static_cast<double>(predictions) : 0.0; }
  double total_bytes() const { return kv_bytes + param_bytes + state_bytes; }
};

struct eval_options {
  scissorhands::named_layout layout = scissorhands::named_layout::nhd;
  observe_source source = observe_source::probabilities;
  allocator_kind allocator = allocator_kind::uniform;
  double slope = 0.5;
  std::vector<double> persistence;  // allocator_kind::persistence: one ratio per layer
  std::int32_t threads = 1;
  kv_format format;  // how the cache stores K and V (head_dim 0: resolved for the model)
};

// NLL of every text under one policy and per-layer budgets (spec null: full
// cache) and a protocol (resolved). `tick` is called after each text.
run_result evaluate_nll(const model& m, const std::vector<eval_text>& texts, const policy_spec* spec,
                        const std::vector<std::int32_t>& budgets, const eval_options& options,
                        const protocol& how = {}, const std::function<void()>& tick = {});

// A (policy, budget) cell the library refused (its message), when the grid
// was asked to skip such cells rather than fail.
struct skipped_cell {
  std::string label;
  std::int32_t budget = 0;
  std::string reason;
};

// The grid: the full cache first, then every policy at every budget, under
// one protocol. With a format other than fp32 the full fp32 cache runs too,
// as the reference every row's nll_fp32 gives (it is not a row). Every cell's budgets and settings are checked by the library
// before any work: a refusal throws, or with `skipped` given, drops the cell
// and lists it there. `progress(done, total, last)` is called after each run.
std::vector<run_result> evaluate_grid(const model& m, const std::vector<eval_text>& texts,
                                      const std::vector<policy_spec>& specs, const std::vector<std::int32_t>& budgets,
                                      const eval_options& options, const protocol& how = {},
                                      const std::function<void(std::size_t, std::size_t, const run_result&)>& progress = {},
                                      std::vector<skipped_cell>* skipped = nullptr);

}  // namespace llama
