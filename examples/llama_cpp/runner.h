#pragma once
// Running texts and prompts through llama.cpp with a bounded cache: the
// library's presets through the eviction glue, and the peers the program
// compares them with (the full cache, llama.cpp's own context shift).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "eviction_glue.h"
#include "llama.h"

namespace sh_llama {

// What holds the cache to its budget.
struct method {
  enum class kind { full, context_shift, library } type = kind::full;
  const preset* policy = nullptr;  // library
  bridge::settings settings;       // library: the preset's defaults with the run's overrides
  double recent_percent = -1.0;    // library, >= 0: r = this % of each run's budget (replaces settings.recent)
  std::int32_t observe_last = 0;   // library, prefill: observe only the prompt's last queries (SnapKV)
  std::string label;
};

struct run_options {
  std::int32_t threads = 1;
  std::int32_t chunk = 1;        // tokens per llama_decode (and m, evicted per trigger)
  std::int32_t budget = 0;       // cells held at most
  std::int32_t prompt = 0;       // prefill protocol: P (0: decode protocol)
  scored_layers scores = scored_layers::all;
  std::vector<std::int32_t> global_layers;
  bool keep_logits = false;      // keep every logit row (the reads-only check)
  bool f32_cache = false;        // K and V cached as F32 (llama.cpp's default: F16)
  // Flash attention as llama.cpp's context takes it: AUTO (its default: on,
  // the CPU included) or ENABLED scores from the queries, DISABLED from
  // llama.cpp's probabilities (the reference path).
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
  bool record_evictions = false; // keep the evicted positions (run_result::evicted_positions)
  // Decode protocol, bounded methods: the full cache's NLL of each token
  // (run_result::token_nll of its run on the same text). The predictions made
  // before the first eviction (or context shift) are the full cache's own
  // computation, so they are taken from here instead of recomputed; null:
  // every prediction is computed.
  const std::vector<double>* full_nll = nullptr;
  // With the full cache: a reads-only glue hands every layer's attention
  // here (glue_options::on_attention); positions through `glue_positions`.
  std::function<void(std::int32_t, const float*, std::int32_t, std::int32_t, std::int32_t)> on_attention;
};

struct run_result {
  double nll_sum = 0.0;
  std::int64_t predictions = 0;
  std::int32_t peak_cells = 0;   // most cells of the full-attention cache held after a decode
  std::int64_t evicted = 0;
  std::int64_t mask_checks = 0;
  double seconds = 0.0, decode_seconds = 0.0, library_seconds = 0.0, removal_seconds = 0.0, callback_seconds = 0.0,
         evict_seconds = 0.0;
  std::int64_t removals = 0;
  std::vector<float> logits;     // keep_logits: [token][vocab]
  std::vector<double> token_nll; // [t]: NLL of token t where it was predicted (computed or reused), else 0
  std::int64_t reused = 0;       // predictions taken from run_options::full_nll
  std::vector<llama_pos> evicted_positions;  // record_evictions: in eviction order
  int flash_attention = -1;      // the path the glue observed: 1 flash attention, 0 probabilities, -1 none
  std::string error;             // non-empty: the run stopped
  double nll() const { return predictions > 0 ? nll_sum / static_cast<double>(predictions) : 0.0; }
};

// Teacher-forced NLL of `tokens` under `how`: the decode protocol (chunks
// of run.chunk tokens, eviction after each; the library's steps end at the
// budget, so the cache never holds more than B cells) or, with run.prompt =
// P, the prefill protocol (P tokens in chunks, one eviction to the budget,
// the rest with the cache growing; NLL of tokens P..T-1).
run_result run_text(llama_model* model, const std::vector<llama_token>& tokens, const method& how,
                    const run_options& run);

// -log softmax(logits)[target] over `vocab` logits, in float lanes that
// compilers vectorise (the sweep's hot loop after llama_decode: 262,144
// logits a token on Gemma 3); within 4e-8 of the double-precision value on
// random logits.
double negative_log_prob(const float* logits, std::int32_t vocab, llama_token target);

// Several texts in one context, one sequence each (run_interleaved): every
// llama_decode carries the next step of every text still running, the
// steps of run_text's decode protocol; one evict() after it serves all of
// them. A text that ends frees its sequence (end_sequence) and the next
// text starts in it, so texts beyond `sequences` restart sequences.
// `unified`: one cache for all sequences (kv_unified), else one stream each.
struct interleaved_result {
  std::vector<run_result> texts;  // per text: nll_sum, predictions, peak_cells, evicted, evicted_positions
  std::int64_t decodes = 0, restarts = 0;  // restarts: sequences that ended a text and started another
  double seconds = 0.0;
  std::string error;
};
interleaved_result run_interleaved(llama_model* model, const std::vector<std::vector<llama_token>>& texts,
                                   const method& how, const run_options& run, std::int32_t sequences, bool unified);

// Fills `batch` with tokens[0..count) of seq 0 at positions first.., with
// logits for tokens first_logit.. and the last one.
void set_batch(llama_batch& batch, const llama_token* tokens, std::int32_t count, llama_pos first,
               std::int32_t first_logit);

// A context for `n_ctx` cells (flash attention as given); the glue's
// callback when given (configure() may override flash attention).
llama_context* make_context(llama_model* model, std::int32_t n_ctx, std::int32_t ubatch, std::int32_t threads,
                            eviction_glue* glue, bool f32_cache = false,
                            llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO);

}  // namespace sh_llama
