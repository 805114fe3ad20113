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
enum class allocator_kind { uniform, ramp, pyramid };
std::vector<std::int32_t> allocate_budgets(std::int32_t budget, std::int32_t layers, allocator_kind kind,
                                           double slope);

struct run_result {
  std::string label;                 // policy label, or "full"
  std::string description;           // policy_spec::describe()
  std::int32_t budget = 0;           // mean per layer; 0 for the full cache
  std::vector<std::int32_t> budgets; // per layer
  double nll_sum = 0.0;              // nats
  std::int64_t predictions = 0;
  double kv_fraction = 0.0;          // peak K/V tokens held / a full cache's, averaged over texts
  double kv_bytes = 0.0;             // peak K/V bytes held (all layers, mean over texts)
  double state_bytes = 0.0;          // the library's state buffers (all layers)
  double library_seconds = 0.0;      // observe + compress
  double compress_seconds = 0.0;     // of which compress
  double step_seconds = 0.0;         // whole steps
  double nll() const { return predictions ? nll_sum / static_cast<double>(predictions) : 0.0; }
};

struct eval_options {
  scissorhands::named_layout layout = scissorhands::named_layout::nhd;
  observe_source source = observe_source::probabilities;
  allocator_kind allocator = allocator_kind::uniform;
  double slope = 0.5;
  std::int32_t threads = 1;
};

// NLL of every text under one policy and per-layer budgets (spec null: full
// cache). `tick` is called after each text.
run_result evaluate_nll(const model& m, const std::vector<eval_text>& texts, const policy_spec* spec,
                        const std::vector<std::int32_t>& budgets, const eval_options& options,
                        const std::function<void()>& tick = {});

// The grid: the full cache first, then every policy at every budget.
// `progress(done, total, last)` is called after each run completes.
std::vector<run_result> evaluate_grid(const model& m, const std::vector<eval_text>& texts,
                                      const std::vector<policy_spec>& specs, const std::vector<std::int32_t>& budgets,
                                      const eval_options& options,
                                      const std::function<void(std::size_t, std::size_t, const run_result&)>& progress = {});

}  // namespace llama
