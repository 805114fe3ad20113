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

namespace llama {

enum class observation_kind { threshold, mass, key_norm, recency, random };
enum class history_kind { window, unbounded, decay };
enum class gqa_kind { mean, max };
// Where the probabilities the library observes come from.
enum class observe_source {
  probabilities,  // the engine's own softmax output (host::observe_probabilities)
  queries,        // recomputed by the library from Q and the cached K (host::observe_queries)
  queries_lse,    // the same, given the engine's log-sum-exp (one read of K)
};

struct policy_spec {
  std::string label;  // the name shown in tables ("scissorhands", "h2o", ...)
  observation_kind observation = observation_kind::threshold;
  history_kind history = history_kind::window;
  gqa_kind gqa = gqa_kind::mean;
  scissorhands::settings config{};

  // "threshold_indicator+sliding_window w=400 r=10 s=0 m=1 alpha=1 gqa=mean norm=0"
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
};

// Parses "preset[:key=value,...]". Presets: scissorhands (threshold +
// sliding window), h2o (attention mass + unbounded), streaming (recency +
// unbounded, 4 sinks), random (random score), keynorm (key norm), tova-like
// "decay" (attention mass + exponential decay). Keys: w r s m alpha decay
// norm gqa seed obs hist compaction label. Throws std::invalid_argument
// naming the key and the accepted values.
policy_spec parse_policy(const std::string& text, const policy_overrides& overrides = {});
// The list of presets, for --help.
std::string policy_help();

class kv_compressor {
 public:
  virtual ~kv_compressor() = default;

  // After the step's K/V were appended and attention ran over `cache`:
  // hand the step's attention to the library. `probs` is dense
  // [q_heads][length], `queries` dense [q_heads][head_dim] (after RoPE),
  // `lse` [q_heads] natural log-sum-exp of the scaled logits.
  virtual void observe(std::int32_t layer, scissorhands::host_kv_view<float> cache, const float* probs,
                       const float* queries, const float* lse, std::int32_t q_heads) = 0;
  // Evicts when the layer's cache holds its budget (the library decides)
  // and returns the layer's new length: the lengths are the engine's, and
  // it applies it.
  virtual std::int32_t compress(std::int32_t layer, scissorhands::host_kv_view<float> cache) = 0;
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
// (for the state shape and workspace size). Throws scissorhands::
// invalid_argument (from the library) when a budget or setting is invalid.
std::unique_ptr<kv_compressor> make_compressor(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                               const std::vector<scissorhands::host_kv_view<float>>& caches,
                                               observe_source source = observe_source::probabilities);

}  // namespace llama
