#pragma once
// The engine's bridge to the library. The library composes its policies at
// compile time; an engine that lets its user pick one at run time (as this
// CLI does) instantiates the combinations it offers once and hides them
// behind a small interface: that is all this file does. Everything that
// decides what to evict is the library's (host::observe_*, host::compress).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "kv_format.hpp"

namespace llama {

enum class observation_kind { important, unimportant, mass, key_norm, recency, random };
enum class history_kind { window, unbounded, decay };
enum class gqa_kind { mean, max };
// Eviction granularity (the library's policy/granularity.hpp): which tokens
// leave together. Spelled on the command line as
//   head               per_head: every KV head evicts on its own (default)
//   heads-R            shared_heads<R>: one choice per layer, the same slots
//                      leave every KV head of the layer
//   layers-H[-L]       shared_layers<H, L>: one choice for the whole model,
//                      the same slots leave every head of every layer (H
//                      combines a layer's heads, L the layers; L = H when
//                      omitted)
// where R, H, L are mean or max (mean_score / max_score of the eviction
// scores). "heads" and "layers" alone are the library's defaults
// (shared_heads<>, shared_layers<>).
enum class reduction_kind { mean, max };
struct granularity_spec {
  scissorhands::granularity_kind kind = scissorhands::granularity_kind::per_head;
  reduction_kind heads = reduction_kind::mean;   // shared_heads, shared_layers
  reduction_kind layers = reduction_kind::mean;  // shared_layers
  bool per_head() const { return kind == scissorhands::granularity_kind::per_head; }
  // "head", "heads-mean", "layers-max", "layers-mean-max" (the canonical spelling).
  std::string name() const;
};
// Parses the spellings above; throws std::invalid_argument naming `option`
// (e.g. "--granularity" or "policy 'h2o:gran=x': gran") and what it accepts.
granularity_spec parse_granularity(const std::string& text, const std::string& option);
// The accepted spellings, for --help.
std::string granularity_help();
// Where the probabilities the library observes come from.
enum class observe_source {
  probabilities,  // the engine's own softmax output (host::observe_probabilities)
  queries,        // recomputed by the library from Q and the cached K (host::observe_queries)
  queries_lse,    // the same, given the engine's log-sum-exp (one read of K)
};

struct policy_spec {
  std::string label;  // the name shown in tables ("scissorhands", "h2o", ...)
  observation_kind observation = observation_kind::important;
  history_kind history = history_kind::window;
  gqa_kind gqa = gqa_kind::mean;
  granularity_spec granularity{};
  scissorhands::settings config{};
  // Prefill protocol: observe only the last k prompt queries (SnapKV's
  // observation window), whatever the protocol says; 0: the protocol's k.
  // The decode protocol observes every step's query and ignores it.
  std::int32_t observe_last = 0;

  // "important_indicator+sliding_window w=400 r=10 s=0 m=1 alpha=1 gqa=mean norm=0"
  // (" gran=layers-mean" appended unless per_head).
  std::string describe() const;
};

// Settings given once for every policy of a grid; a policy spec's own keys
// win over these, and these win over the preset's defaults.
struct policy_overrides {
  std::optional<std::int32_t> window, recent, sinks, evict_count;
  std::optional<float> alpha, decay;
  std::optional<bool> normalize;
  std::optional<gqa_kind> gqa;
  std::optional<std::uint32_t> seed;
  std::optional<scissorhands::compaction> compaction_mode;
  std::optional<granularity_spec> granularity;
};

// Parses "preset[:key=value,...]" (policy_help lists the presets and keys). Throws std::invalid_argument
// naming the key and the accepted values. A spec at a granularity other
// than head is labelled "preset/granularity" (e.g. "h2o/layers-max")
// unless it gives a label.
policy_spec parse_policy(const std::string& text, const policy_overrides& overrides = {});
// The list of presets, for --help.
std::string policy_help();

// What one call's attention produced, for the queries the library is to
// observe (the step's token when decoding; all or the last k of a prompt).
// Query j of q_len sits at cache slot length - q_len + j and saw slots
// 0 .. length - q_len + j (causal).
struct attention_batch {
  const float* probs = nullptr;         // row (qh, j): probs + qh * head_stride + j * query_stride; columns are slots
  std::int64_t probs_head_stride = 0;
  std::int64_t probs_query_stride = 0;
  std::size_t probs_size = 0;           // floats reachable from probs
  const float* queries = nullptr;       // token-major [q_len][q_heads][head_dim], after RoPE
  const float* lse = nullptr;           // token-major [q_len][q_heads], natural log-sum-exp of the scaled logits
  std::int32_t q_heads = 0;
  std::int32_t q_len = 1;
};

// The compressors take the cache in its stored format (cache_view: fp32,
// bf16, or int8/int4 codes with their parameters); a compressor is built
// for the format of the caches make_compressor was given and refuses
// another (std::logic_error).
class kv_compressor {
 public:
  virtual ~kv_compressor() = default;

  // After the step's K/V were appended and attention ran over `cache`:
  // hand the step's attention to the library (host::observe_probabilities
  // or host::observe_queries, per source()). Admits the new tokens first.
  virtual void observe(std::int32_t layer, const cache_view& cache, const attention_batch& att) = 0;
  // Evicts when the layer's cache holds `budget` tokens or more, down to
  // budget - m (the library decides which) and returns the layer's new
  // length: the lengths are the engine's, and it applies it. The one-
  // argument form uses the layer's budget. Per layer: per_head and
  // shared_heads (host::compress); a shared_layers compressor throws
  // std::logic_error (use compress_model).
  virtual std::int32_t compress(std::int32_t layer, const cache_view& cache, std::int32_t budget) = 0;
  std::int32_t compress(std::int32_t layer, const cache_view& cache) { return compress(layer, cache, budget(layer)); }
  // shared_layers (model_wide()): once per step, after every layer was
  // observed, evicts the same slots from every head of every layer
  // (host::select once, then host::compact per layer) and returns the new
  // length, the same for every layer; the engine applies it to all.
  // `caches` lists every layer's view, lengths before the call. Others
  // throw std::logic_error.
  virtual std::int32_t compress_model(const std::vector<cache_view>& caches, std::int32_t budget) = 0;
  std::int32_t compress_model(const std::vector<cache_view>& caches) { return compress_model(caches, budget(0)); }
  // True for a shared_layers granularity: compress_model, not compress.
  bool model_wide() const { return spec_.granularity.kind == scissorhands::granularity_kind::shared_layers; }
  // Forgets every token (a new text).
  virtual void reset() = 0;
  // The library's state of a layer (tests inspect it).
  virtual scissorhands::eviction_state<scissorhands::memory_space::host> state(std::int32_t layer) const = 0;

  const policy_spec& spec() const { return spec_; }
  std::int32_t budget(std::int32_t layer) const { return budgets_[static_cast<std::size_t>(layer)]; }
  const std::vector<std::int32_t>& budgets() const { return budgets_; }
  std::size_t state_bytes(std::int32_t layer) const { return state_bytes_[static_cast<std::size_t>(layer)]; }
  observe_source source() const { return source_; }

 protected:
  policy_spec spec_;
  std::vector<std::int32_t> budgets_;
  std::vector<std::size_t> state_bytes_;
  observe_source source_ = observe_source::probabilities;
};

// One compressor for all layers of a cache; `caches` gives each layer's view
// (for the workspace size, and the state's capacity unless
// `state_capacity` > 0 gives it: the most tokens a layer holds when the
// library is called). Budgets and settings are validated by the library
// when compress runs (the engine's validate_budgets calls it on an empty
// cache up front). A shared_layers spec needs one budget for every layer
// (one set of slots for the whole model): other budgets are refused with
// std::invalid_argument. A bf16 or quantized cache runs the policies whose
// compressors are instantiated for it (low_precision_policies(); per_head
// granularity): others are refused with std::invalid_argument naming the
// policy and --kv-bits.
std::unique_ptr<kv_compressor> make_compressor(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                               const std::vector<cache_view>& caches,
                                               observe_source source = observe_source::probabilities,
                                               std::int32_t state_capacity = 0);

// Whether make_compressor builds `spec` for a cache stored as `format`
// (fp32: every policy; bf16, int8/int4: low_precision_policies()).
bool runs_on(const policy_spec& spec, const kv_format& format);
// The compositions (and the presets that give them) a bf16 or int8/int4
// cache runs, for --help and refusals.
std::string low_precision_policies();

}  // namespace llama
