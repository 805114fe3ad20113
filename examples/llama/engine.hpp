#pragma once
// A one-token-per-step Llama decoder that owns its KV cache, as an engine
// does, and keeps it within budget through the library.
//
// Decode convention (docs/llama.md; the tests rely on it). At step t the
// token at true position t goes through every layer:
//   1. q, k, v = projections of the normed input; RoPE at position t on q, k.
//   2. k and v are appended to the layer's cache at slot len (keys are cached
//      after RoPE, so attention never needs a slot's position).
//   3. attention of the step's query over slots 0..len (causal by
//      construction: the cache only holds the past and the present).
//   4. the library observes that step's attention (host::observe_*), then
//      host::compress evicts m tokens if the cache now holds its budget B.
// So a head's cache never holds more than B tokens, and the step's output
// was computed before anything was evicted. A shared_layers policy
// (compressor granularity layers-*) observes every layer the same way but
// evicts once per step, after the last layer: host::select chooses the
// slots for the whole model and host::compact applies them to every layer
// (the same tokens in every head of every layer; the outputs are those of
// a per-layer compress at the same point, since each layer's attention had
// already run).
//
// Prefill (the press-style protocol, evaluate --protocol prefill:P[:k]):
// prefill() feeds P tokens in one pass. Per layer, every token's K and V are
// appended, each of the P queries attends causally (query i over slots
// 0..i), the library observes all P queries (or the last k) in one call
// with q_len > 1, and compresses the layer to its budget B in one go
// (host::compress at budget B + m evicts P - B; shared_layers: one select
// after the last layer, compact on every layer). step() then decodes with
// the cache growing and no further eviction. Each token's arithmetic is the
// one step() does, so a prefill that evicts nothing gives every logit of a
// token-by-token run bit for bit.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "compressor.hpp"
#include "kv_format.hpp"
#include "model.hpp"

namespace llama {

// The prefill protocol's plan: the prompt length P and how many of its
// last queries the library observes (0: all P).
struct prefill_plan {
  std::int32_t prompt = 0;
  std::int32_t observe_last = 0;
};

class engine {
 public:
  // max_tokens: the longest sequence this engine will decode (a full cache's
  // capacity). Without a compressor the cache is full; with one, layer l
  // holds at most min(budget_l, max_tokens) slots.
  // `format`: how the cache stores K and V (default fp32); a format whose
  // head_dim is 0 is resolved for the model (resolve_kv_format).
  engine(const model& m, std::int32_t max_tokens, scissorhands::named_layout layout = scissorhands::named_layout::nhd,
         kv_format format = {});

  // Switches to a compressed cache (nullptr: full cache). Rebuilds the cache
  // buffers with the policy's capacities and resets the engine. Without a
  // plan the library runs after every step (decode protocol; B slots per
  // layer); with one, only in prefill() (the cache holds up to max_tokens,
  // the state covers the prompt: capacity P).
  void set_policy(const policy_spec* spec, const std::vector<std::int32_t>& budgets,
                  observe_source source = observe_source::probabilities,
                  std::optional<prefill_plan> plan = std::nullopt);
  void reset();
  // Runs the library's budget and settings checks now, on the empty cache
  // (host::compress validates before it looks at lengths): throws its
  // scissorhands::invalid_argument when a budget cannot be run. Resets.
  void validate_budgets();

  // Feeds one token; returns the logits of the next one (vocab floats,
  // valid until the next call).
  const float* step(std::int32_t token);
  // Feeds n tokens in one pass (causal attention among them); returns the
  // logits after the last one. With a plan, the library observes and
  // compresses each layer (see above); n must not exceed the plan's prompt.
  const float* prefill(const std::int32_t* tokens, std::int32_t n);
  const std::optional<prefill_plan>& plan() const { return plan_; }

  const model& weights() const { return model_; }
  std::int32_t position() const { return position_; }
  std::int32_t max_tokens() const { return max_tokens_; }
  std::int32_t length(std::int32_t layer) const { return lengths_[static_cast<std::size_t>(layer)]; }
  std::int32_t capacity(std::int32_t layer) const { return capacity_[static_cast<std::size_t>(layer)]; }
  const kv_format& format() const { return format_; }
  // The fp32 cache of a layer (std::logic_error for another format: use cache()).
  scissorhands::host_kv_view<float> view(std::int32_t layer);
  std::vector<scissorhands::host_kv_view<float>> views();  // every layer's
  // A layer's cache in its stored format: what the library is handed.
  cache_view cache(std::int32_t layer);
  std::vector<cache_view> caches();  // every layer's
  kv_compressor* compressor() { return compressor_.get(); }
  // Bytes of the cache buffers: K+V values or codes (what a budget or a
  // format saves), their quantization parameters, and the library's state
  // (what eviction costs).
  std::size_t kv_bytes() const;
  std::size_t param_bytes() const;
  std::size_t state_bytes() const;
  // The state without its fixed part (per-row counters and each array's
  // 256-byte alignment): state_bytes_per_slot per (row, head, slot), what
  // it costs per token in an engine holding many sequences.
  std::size_t state_slot_bytes() const;

  // Called after attention, before the library sees it: (layer, probs
  // [q_heads][len] dense, len). Used by persistence and the tests.
  std::function<void(std::int32_t, const float*, std::int32_t)> on_attention;
  // Called between observe and compress (tests check what compress will do).
  std::function<void(std::int32_t)> before_compress;

  // Time spent in the library (observe + compress) and in whole steps.
  struct timing {
    std::chrono::nanoseconds library{0};  // observe + compress
    std::chrono::nanoseconds compress{0};  // of which compress
    std::chrono::nanoseconds total{0};
    std::int64_t steps = 0;
  };
  const timing& times() const { return times_; }
  void clear_times() { times_ = {}; }

 private:
  void allocate_cache();
  // The library on one layer: observes `att`, then compresses the layer to
  // `budget` (its length set to the result), unless the compressor is
  // model-wide (shared_layers: compress_model after the last layer). Time
  // since l0 added to library, compress's own to compress.
  void observe_and_compress(std::int32_t layer, const cache_view& stored, const attention_batch& att,
                            std::int32_t budget, std::chrono::steady_clock::time_point l0,
                            std::chrono::nanoseconds& library, std::chrono::nanoseconds& compress);
  // shared_layers: select + compact every layer at `budget`, every length
  // set to the result; time added to library and compress.
  void compress_model(std::int32_t budget, std::chrono::nanoseconds& library, std::chrono::nanoseconds& compress);
  // One layer's attention for query rows q (q_heads x head_dim) at cache
  // length len: probabilities into p (q_heads rows, row stride p_stride),
  // natural LSE into lse[q_heads], output into out (q_heads x head_dim).
  void attend(const float* q, scissorhands::host_kv_view<float>& cache, std::int32_t len, float* p,
              std::size_t p_stride, float* lse, float* out) const;
  // Stores K and V rows (kv_heads x head_dim floats each) at `slot` of a
  // layer, converted or quantized to the format.
  void append(std::int32_t layer, std::int32_t slot, const float* k, const float* v);
  // The layer's slots [0, len) as fp32, for attention: the cache itself
  // when it is fp32, else dequantized into scratch (same layout).
  scissorhands::host_kv_view<float> readable(std::int32_t layer, std::int32_t len);

  const model& model_;
  std::int32_t max_tokens_;
  scissorhands::named_layout layout_;
  std::int32_t position_ = 0;
  std::vector<std::int32_t> capacity_;
  kv_format format_;
  // The stored cache per layer; only the format's buffers are non-empty:
  // fp32 values, bf16 values, or codes and parameters.
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<std::vector<bf16>> k16_, v16_;
  std::vector<std::vector<std::uint8_t>> k_codes_, v_codes_;
  std::vector<std::vector<float>> k_params_, v_params_;
  std::vector<float> deq_k_, deq_v_;  // readable()'s scratch, the widest layer's size
  std::vector<std::int32_t> lengths_;  // one sequence per layer: each layer's view points at its own entry
  std::unique_ptr<kv_compressor> compressor_;
  std::optional<prefill_plan> plan_;
  // Scratch.
  std::vector<float> x_, xb_, q_, k_, v_, att_out_, hb_, hb2_, probs_, lse_, logits_;
  std::vector<float> rope_freq_, rope_cos_, rope_sin_;  // per pair; cos/sin at the current position
  // Prefill scratch: per token rows of x, xb, q, k, v, attention output,
  // hidden; probabilities [q_heads][n][len]; LSE [n][q_heads].
  std::vector<float> px_, pxb_, pq_, pk_, pv_, patt_, phb_, phb2_, pprobs_, plse_;
  timing times_;
};

}  // namespace llama
