#include "compressor.hpp"
#include "compressor_factory.hpp"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace llama {

namespace sh = scissorhands;

namespace {

const char* observation_name(observation_kind k) {
  switch (k) {
    case observation_kind::important: return sh::important_indicator::name;
    case observation_kind::unimportant: return sh::unimportant_indicator::name;
    case observation_kind::mass: return sh::attention_mass::name;
    case observation_kind::key_norm: return sh::key_norm::name;
    case observation_kind::recency: return sh::recency::name;
    case observation_kind::random: return sh::random_score::name;
  }
  return "?";
}

const char* history_name(history_kind k) {
  switch (k) {
    case history_kind::window: return sh::sliding_window::name;
    case history_kind::unbounded: return sh::unbounded_history::name;
    case history_kind::decay: return sh::exponential_decay::name;
  }
  return "?";
}

[[noreturn]] void bad(const std::string& spec, const std::string& key, const std::string& why) {
  throw std::invalid_argument("policy '" + spec + "': " + key + " " + why);
}

std::int32_t parse_int(const std::string& spec, const std::string& key, const std::string& v, std::int32_t lo) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > (1L << 30))
    bad(spec, key, "must be an integer in [" + std::to_string(lo) + ", 2^30], got '" + v + "'");
  return static_cast<std::int32_t>(x);
}

float parse_float(const std::string& spec, const std::string& key, const std::string& v) {
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0') bad(spec, key, "must be a number, got '" + v + "'");
  return x;
}

bool parse_bool(const std::string& spec, const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  bad(spec, key, "must be 0/1 (or true/false), got '" + v + "'");
}

// An enumerated key's value; `choices` in the order the refusal lists them.
template <class T>
T pick(const std::string& spec, const std::string& key, const std::string& v,
       std::initializer_list<std::pair<const char*, T>> choices) {
  std::string names;  // "a, b or c"
  std::size_t i = 0;
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
    if (i++ > 0) names += i == choices.size() ? " or " : ", ";
    names += name;
  }
  bad(spec, key, "must be " + names + ", got '" + v + "'");
}

// The presets, in the order the refusal of an unknown one lists them:
// observation, history and settings (the library's own preset's where it
// has one; else the defaults).
struct preset {
  const char* name;
  observation_kind observation;
  history_kind history;
  sh::settings config{};
  std::int32_t observe_last = 0;
};

const std::vector<preset>& presets() {
  static const std::vector<preset> table = [] {
    using o = observation_kind;
    using h = history_kind;
    // The library's preset, with r = 10 as every preset here (the texts'
    // smallest budgets are 16 tokens) and SnapKV's observation window of
    // the last 32 prompt queries in the prefill protocol.
    sh::settings snapkv = sh::snapkv_policy{}.config;
    snapkv.recent = 10;
    sh::settings streaming{};
    streaming.sinks = 4;  // StreamingLLM's default
    return std::vector<preset>{
        {"scissorhands",
         std::is_same_v<sh::scissorhands_policy::observation, sh::unimportant_indicator> ? o::unimportant
                                                                                         : o::important,
         h::window, sh::scissorhands_policy{}.config},
        {"scissorhands-paper", o::unimportant, h::window, sh::scissorhands_paper_policy{}.config},
        {"scissorhands-important", o::important, h::window},
        {"h2o", o::mass, h::unbounded},
        {"tova", o::mass, h::window, sh::tova_policy{}.config},
        {"snapkv", o::mass, h::unbounded, snapkv, 32},
        {"streaming", o::recency, h::unbounded, streaming},
        {"random", o::random, h::unbounded},
        {"keynorm", o::key_norm, h::unbounded},
        {"decay", o::mass, h::decay},
    };
  }();
  return table;
}

const char* reduction_name(reduction_kind r) { return r == reduction_kind::max ? "max" : "mean"; }

template <class Reduction>
constexpr reduction_kind reduction_of() {
  return std::is_same_v<Reduction, sh::max_score> ? reduction_kind::max : reduction_kind::mean;
}

}  // namespace

std::string granularity_spec::name() const {
  switch (kind) {
    case sh::granularity_kind::per_head: return "head";
    case sh::granularity_kind::shared_heads: return std::string("heads-") + reduction_name(heads);
    case sh::granularity_kind::shared_layers:
      return std::string("layers-") + reduction_name(heads) +
             (layers == heads ? std::string() : std::string("-") + reduction_name(layers));
  }
  return "?";
}

std::string granularity_help() {
  return "head (each KV head evicts on its own: the default), heads-mean|heads-max (one choice per layer: the same "
         "slots leave every KV head of the layer), layers-H[-L] with H, L in mean|max (one choice for the whole "
         "model: the same slots leave every head of every layer; H combines a layer's heads, L the layers, L = H "
         "when omitted: layers-mean, layers-max, layers-mean-max, layers-max-mean); heads and layers alone are the "
         "library's defaults (shared_heads<>, shared_layers<>)";
}

granularity_spec parse_granularity(const std::string& text, const std::string& option) {
  const auto reduction = [&](const std::string& v, reduction_kind& out) {
    if (v == "mean") out = reduction_kind::mean;
    else if (v == "max") out = reduction_kind::max;
    else return false;
    return true;
  };
  granularity_spec g;
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, '-')) parts.push_back(item);
  if (!text.empty() && text.back() == '-') parts.push_back("");
  bool ok = false;
  if (parts.size() == 1 && parts[0] == "head") {
    ok = true;
  } else if (!parts.empty() && parts[0] == "heads" && parts.size() <= 2) {
    g.kind = sh::granularity_kind::shared_heads;
    g.heads = reduction_of<sh::shared_heads<>::head_reduction>();
    ok = parts.size() == 1 || reduction(parts[1], g.heads);
  } else if (!parts.empty() && parts[0] == "layers" && parts.size() <= 3) {
    g.kind = sh::granularity_kind::shared_layers;
    g.heads = reduction_of<sh::shared_layers<>::head_reduction>();
    g.layers = reduction_of<sh::shared_layers<>::layer_reduction>();
    ok = true;
    if (parts.size() >= 2) {
      ok = reduction(parts[1], g.heads);
      g.layers = g.heads;
    }
    if (ok && parts.size() == 3) ok = reduction(parts[2], g.layers);
  }
  if (!ok)
    throw std::invalid_argument(option + " must be " + granularity_help() + "; got '" + text + "'");
  return g;
}

std::string policy_spec::describe() const {
  std::ostringstream o;
  o << observation_name(observation) << "+" << history_name(history);
  if (history == history_kind::window) o << " w=" << config.window;
  if (history == history_kind::decay) o << " decay=" << config.decay;
  o << " r=" << config.recent << " s=" << config.sinks << " m=" << config.evict_count;
  const bool indicator = observation == observation_kind::important || observation == observation_kind::unimportant;
  if (indicator) o << " alpha=" << config.alpha;
  if (indicator || observation == observation_kind::mass)
    o << " gqa=" << (gqa == gqa_kind::mean ? "mean" : "max");
  if (observation == observation_kind::random) o << " seed=" << config.seed;
  o << " norm=" << (config.normalize ? 1 : 0);
  if (config.compaction_mode == sh::compaction::preserve_order) o << " compaction=preserve_order";
  if (config.pool_width > 1)
    o << " pool=" << config.pool_width << (config.pool_mode == sh::pooling::max ? " poolmode=max" : " poolmode=mean");
  if (observe_last > 0) o << " k=" << observe_last;
  if (!granularity.per_head()) o << " gran=" << granularity.name();
  return o.str();
}

std::string policy_help() {
  return "presets: scissorhands (the library's scissorhands_policy), scissorhands-paper (unimportant_indicator +\n"
         "  sliding_window, raw counts: the paper's Compress), scissorhands-important (important_indicator +\n"
         "  sliding_window), h2o (attention_mass + unbounded), tova (attention_mass of the last step: sliding_window\n"
         "  w=1), snapkv (the library's snapkv_policy: attention_mass + unbounded, mean-pooled over 5 tokens,\n"
         "  order kept; here r=10 and k=32), streaming (recency + 4 sinks), random (random_score), keynorm (key_norm),\n"
         "  decay (attention_mass + exponential_decay); append :key=value,... with keys w r s m alpha decay norm\n"
         "  gqa(mean|max) seed obs(important|unimportant|mass|keynorm|recency|random) hist(window|unbounded|decay)\n"
         "  compaction(fill|order) pool (odd width, 1 = off; needs compaction=order) poolmode(mean|max)\n"
         "  k (prefill protocol: observe only the last k prompt queries; 0 = the protocol's)\n"
         "  gran(head|heads-mean|heads-max|layers-mean|layers-max|layers-mean-max|layers-max-mean: see --granularity)\n"
         "  label; a spec at a granularity other than head is labelled preset/granularity (h2o/layers-max) unless\n"
         "  it gives a label";
}

policy_spec parse_policy(const std::string& text, const policy_overrides& o) {
  const auto colon = text.find(':');
  const std::string preset = text.substr(0, colon);
  const auto& table = presets();
  const auto found = std::find_if(table.begin(), table.end(), [&](const auto& x) { return preset == x.name; });
  if (found == table.end()) {
    std::string names;
    for (const auto& x : table) names += (names.empty() ? "" : ", ") + std::string(x.name);
    bad(text, "preset", "must be one of " + names + "; got '" + preset + "'");
  }
  policy_spec p;
  p.label = preset;
  p.observation = found->observation;
  p.history = found->history;
  p.config = found->config;
  p.observe_last = found->observe_last;
  sh::settings& c = p.config;
  if (o.window) c.window = *o.window;
  if (o.recent) c.recent = *o.recent;
  if (o.sinks) c.sinks = *o.sinks;
  if (o.evict_count) c.evict_count = *o.evict_count;
  if (o.alpha) c.alpha = *o.alpha;
  if (o.decay) c.decay = *o.decay;
  if (o.normalize) c.normalize = *o.normalize;
  if (o.gqa) p.gqa = *o.gqa;
  if (o.seed) c.seed = *o.seed;
  if (o.compaction_mode) c.compaction_mode = *o.compaction_mode;
  if (o.granularity) p.granularity = *o.granularity;
  bool labelled = false;
  std::stringstream rest(colon == std::string::npos ? std::string() : text.substr(colon + 1));
  std::string item;
  while (std::getline(rest, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) bad(text, "'" + item + "'", "must be key=value");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "w") c.window = parse_int(text, key, v, 1);
    else if (key == "r") c.recent = parse_int(text, key, v, 0);
    else if (key == "s") c.sinks = parse_int(text, key, v, 0);
    else if (key == "m") c.evict_count = parse_int(text, key, v, 1);
    else if (key == "alpha") c.alpha = parse_float(text, key, v);
    else if (key == "decay") c.decay = parse_float(text, key, v);
    else if (key == "norm") c.normalize = parse_bool(text, key, v);
    else if (key == "gqa")
      p.gqa = pick<gqa_kind>(text, key, v, {{"mean", gqa_kind::mean}, {"max", gqa_kind::max}});
    else if (key == "seed") c.seed = static_cast<std::uint32_t>(parse_int(text, key, v, 0));
    else if (key == "label") p.label = v, labelled = true;
    else if (key == "pool") c.pool_width = parse_int(text, key, v, 1);
    else if (key == "k") p.observe_last = parse_int(text, key, v, 0);
    else if (key == "poolmode")
      c.pool_mode = pick<sh::pooling>(text, key, v, {{"mean", sh::pooling::mean}, {"max", sh::pooling::max}});
    else if (key == "gran") p.granularity = parse_granularity(v, "policy '" + text + "': gran");
    else if (key == "compaction")
      c.compaction_mode = pick<sh::compaction>(
          text, key, v, {{"fill", sh::compaction::fill_holes}, {"order", sh::compaction::preserve_order}});
    else if (key == "obs")
      p.observation = pick<observation_kind>(text, key, v,
                                             {{"important", observation_kind::important},
                                              {"unimportant", observation_kind::unimportant},
                                              {"mass", observation_kind::mass},
                                              {"keynorm", observation_kind::key_norm},
                                              {"recency", observation_kind::recency},
                                              {"random", observation_kind::random}});
    else if (key == "hist")
      p.history = pick<history_kind>(
          text, key, v,
          {{"window", history_kind::window}, {"unbounded", history_kind::unbounded}, {"decay", history_kind::decay}});
    else
      bad(text, "key '" + key + "'",
          "is unknown; keys: w r s m alpha decay norm gqa seed obs hist compaction pool poolmode k gran label");
  }
  // A static score is given once and never updated: any history is moot, and
  // a sliding window would only allocate ring memory for nothing.
  if (p.observation == observation_kind::key_norm || p.observation == observation_kind::recency ||
      p.observation == observation_kind::random)
    p.history = history_kind::unbounded;
  if (!labelled && !p.granularity.per_head()) p.label.append("/").append(p.granularity.name());
  return p;
}

namespace {

// The factory functions are defined (and explicitly instantiated for every
// policy this file can ask for) in compressor_head.cpp, compressor_heads.cpp
// and compressor_layers_*.cpp: one translation unit per granularity family,
// so that the build runs them in parallel; the bf16 and int8/int4 ones in
// compressor_low_precision.cpp.
#define LLAMA_IS_LOW_PRECISION(O, H, Q) || std::is_same_v<Base, LLAMA_BASE_POLICY(O, H, Q)>
template <class Base>
constexpr bool low_precision_base = false LLAMA_LOW_PRECISION_POLICIES(LLAMA_IS_LOW_PRECISION);
#undef LLAMA_IS_LOW_PRECISION

template <class Base>
std::unique_ptr<kv_compressor> pick_granularity(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                                const std::vector<cache_view>& caches,
                                                observe_source source, std::int32_t capacity) {
  const detail::compressor_args args{spec, budgets, caches, source, capacity};
  const granularity_spec& g = spec.granularity;
  const std::size_t stored = caches.empty() ? 0 : caches.front().index();
  if (stored != 0) {
    // make_compressor refused the rest already; this keeps the types honest.
    if constexpr (low_precision_base<Base>) {
      if (g.per_head())
        return stored == 1 ? detail::make_at<Base, sh::per_head, detail::bf16_view>(args)
                           : detail::make_at<Base, sh::per_head, detail::quantized_view>(args);
    }
    throw std::logic_error("make_compressor: policy " + spec.label + " has no compressor for a " +
                           format_of(caches.front()).name() + " cache");
  }
  const bool head_max = g.heads == reduction_kind::max, layer_max = g.layers == reduction_kind::max;
  switch (g.kind) {
    case sh::granularity_kind::per_head: return detail::make_at<Base, sh::per_head>(args);
    case sh::granularity_kind::shared_heads:
      return head_max ? detail::make_at<Base, detail::heads_max>(args) : detail::make_at<Base, detail::heads_mean>(args);
    case sh::granularity_kind::shared_layers:
      if (head_max) return layer_max ? detail::make_at<Base, detail::layers_max_max>(args)
                                     : detail::make_at<Base, detail::layers_max_mean>(args);
      return layer_max ? detail::make_at<Base, detail::layers_mean_max>(args)
                       : detail::make_at<Base, detail::layers_mean_mean>(args);
  }
  throw std::invalid_argument("make_compressor: unknown granularity");
}

template <class Obs, class Hist, class Gqa>
std::unique_ptr<kv_compressor> build(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                     const std::vector<cache_view>& caches, observe_source source,
                                     std::int32_t capacity) {
  using policy = sh::eviction_policy<Obs, Hist, sh::recent_window, Gqa>;
  return pick_granularity<policy>(spec, budgets, caches, source, capacity);
}

template <class Obs, class Hist>
std::unique_ptr<kv_compressor> pick_gqa(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                        const std::vector<cache_view>& caches, observe_source source,
                                        std::int32_t capacity) {
  // Static observations never read attention: the reduction is irrelevant.
  if constexpr (!Obs::needs_attention) return build<Obs, Hist, sh::gqa_mean>(spec, budgets, caches, source, capacity);
  else if (spec.gqa == gqa_kind::max) return build<Obs, Hist, sh::gqa_max>(spec, budgets, caches, source, capacity);
  else return build<Obs, Hist, sh::gqa_mean>(spec, budgets, caches, source, capacity);
}

template <class Obs>
std::unique_ptr<kv_compressor> pick_history(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                            const std::vector<cache_view>& caches,
                                            observe_source source, std::int32_t capacity) {
  if constexpr (!Obs::needs_attention) {
    return pick_gqa<Obs, sh::unbounded_history>(spec, budgets, caches, source, capacity);
  } else {
    switch (spec.history) {
      case history_kind::window: return pick_gqa<Obs, sh::sliding_window>(spec, budgets, caches, source, capacity);
      case history_kind::unbounded: return pick_gqa<Obs, sh::unbounded_history>(spec, budgets, caches, source, capacity);
      case history_kind::decay: return pick_gqa<Obs, sh::exponential_decay>(spec, budgets, caches, source, capacity);
    }
  }
  throw std::invalid_argument("make_compressor: unknown history kind");
}

// The kinds of a composition, to match a spec against
// LLAMA_LOW_PRECISION_POLICIES at run time.
template <class O>
constexpr observation_kind observation_of() {
  if constexpr (std::is_same_v<O, sh::important_indicator>) return observation_kind::important;
  else if constexpr (std::is_same_v<O, sh::unimportant_indicator>) return observation_kind::unimportant;
  else if constexpr (std::is_same_v<O, sh::attention_mass>) return observation_kind::mass;
  else if constexpr (std::is_same_v<O, sh::key_norm>) return observation_kind::key_norm;
  else if constexpr (std::is_same_v<O, sh::recency>) return observation_kind::recency;
  else return observation_kind::random;
}
template <class H>
constexpr history_kind history_of() {
  if constexpr (std::is_same_v<H, sh::sliding_window>) return history_kind::window;
  else if constexpr (std::is_same_v<H, sh::unbounded_history>) return history_kind::unbounded;
  else return history_kind::decay;
}

struct composition {
  observation_kind observation;
  history_kind history;
  gqa_kind gqa;
};
#define LLAMA_LOW_ENTRY(O, H, Q)                                      \
  composition{observation_of<sh::O>(), history_of<sh::H>(),           \
              std::is_same_v<sh::Q, sh::gqa_max> ? gqa_kind::max : gqa_kind::mean},
constexpr composition low_precision_compositions[] = {LLAMA_LOW_PRECISION_POLICIES(LLAMA_LOW_ENTRY)};
#undef LLAMA_LOW_ENTRY

}  // namespace

bool runs_on(const policy_spec& spec, const kv_format& format) {
  if (format.bits == 32) return true;
  if (!spec.granularity.per_head()) return false;
  for (const composition& c : low_precision_compositions)
    if (c.observation == spec.observation && c.history == spec.history && c.gqa == spec.gqa) return true;
  return false;
}

std::string low_precision_policies() {
  std::string out;
  for (const composition& c : low_precision_compositions) {
    policy_spec s;
    s.observation = c.observation;
    s.history = c.history;
    s.gqa = c.gqa;
    // The presets that compose to it.
    std::string presets;
    for (const char* p : {"scissorhands", "scissorhands-paper", "scissorhands-important", "h2o", "tova", "snapkv",
                          "streaming", "random", "keynorm", "decay"}) {
      const policy_spec q = parse_policy(p);
      if (q.observation == c.observation && q.history == c.history && q.gqa == c.gqa)
        presets += (presets.empty() ? "" : ", ") + std::string(p);
    }
    out += (out.empty() ? "" : "; ") + std::string(observation_name(c.observation)) + "+" + history_name(c.history) +
           " gqa=" + (c.gqa == gqa_kind::max ? "max" : "mean") + (presets.empty() ? "" : " (" + presets + ")");
  }
  return out + ", at granularity head";
}

std::unique_ptr<kv_compressor> make_compressor(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                                               const std::vector<cache_view>& caches,
                                               observe_source source, std::int32_t capacity) {
  if (!caches.empty()) {
    const kv_format format = format_of(caches.front());
    for (const auto& c : caches)
      if (c.index() != caches.front().index())
        throw std::invalid_argument("make_compressor: every layer's cache must have the same stored format");
    if (!runs_on(spec, format))
      throw std::invalid_argument("policy " + spec.label + " (" + spec.describe() + ") is not built for --kv-bits " +
                                  std::to_string(format.bits) + " (a cache stored as " + format.name() +
                                  "): a bf16 or int8/int4 cache runs " + low_precision_policies() +
                                  "; use --kv-bits 32 for the others");
  }
  switch (spec.observation) {
    case observation_kind::important: return pick_history<sh::important_indicator>(spec, budgets, caches, source, capacity);
    case observation_kind::unimportant:
      return pick_history<sh::unimportant_indicator>(spec, budgets, caches, source, capacity);
    case observation_kind::mass: return pick_history<sh::attention_mass>(spec, budgets, caches, source, capacity);
    case observation_kind::key_norm: return pick_history<sh::key_norm>(spec, budgets, caches, source, capacity);
    case observation_kind::recency: return pick_history<sh::recency>(spec, budgets, caches, source, capacity);
    case observation_kind::random: return pick_history<sh::random_score>(spec, budgets, caches, source, capacity);
  }
  throw std::invalid_argument("make_compressor: unknown observation kind");
}

}  // namespace llama
