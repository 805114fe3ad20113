// The llama example on all three models of ../shared/models (stories260K,
// tinystories656k, babyllama105): exit 77 (CTest: skipped) when one is
// absent. Checks each model's trained context (where it comes from, and the
// refusal of a length beyond it) and the prefill protocol: a full-cache
// prefill gives the token-by-token logits bit for bit; a budget B >= P
// gives the full cache's NLL bit for bit, under every observation path and
// with the last-k observation window; B < P keeps exactly B tokens per
// head and changes the NLL.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compressor.hpp"
#include "context.hpp"
#include "engine.hpp"
#include "evaluate.hpp"
#include "gguf.hpp"
#include "model.hpp"
#include "model_path.hpp"

namespace {

namespace sh = scissorhands;
using namespace llama;

const char* const model_names[] = {"stories260K", "tinystories656k", "babyllama105"};

struct fixture {
  std::string path;
  model weights;
  context_info context;
};

const fixture& loaded(const std::string& name) {
  static std::map<std::string, std::unique_ptr<fixture>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const std::string path = find_shared_model(name + ".gguf");
    auto f = std::make_unique<fixture>();
    f->path = path;
    f->weights = model::load(gguf_file::open(path));
    f->context = resolve_context(f->weights.config, path);
    slot = std::move(f);
  }
  return *slot;
}

std::vector<std::vector<float>> step_logits(engine& e, const std::vector<std::int32_t>& tokens, std::size_t from) {
  std::vector<std::vector<float>> out;
  const auto vocab = static_cast<std::size_t>(e.weights().config.vocab);
  for (std::size_t t = from; t < tokens.size(); ++t) {
    const float* l = e.step(tokens[t]);
    out.emplace_back(l, l + vocab);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("context: each model's trained context and where it comes from", "[context]") {
  const auto& s = loaded("stories260K").context;
  CHECK(s.model == "stories260K");
  CHECK(s.file_tokens == 2048);  // the converter's default
  CHECK(s.tokens == 512);        // what it was trained on: the known-models table
  CHECK(s.source.find("known-models table") != std::string::npos);
  const auto& t = loaded("tinystories656k").context;
  CHECK(t.model == "tinystories656k");
  CHECK(t.tokens == 512);
  CHECK(t.source == "GGUF llama.context_length");
  const auto& b = loaded("babyllama105").context;
  CHECK(b.model == "babyllama105");
  CHECK(b.tokens == 256);
  CHECK(b.source == "GGUF llama.context_length");
  // --context overrides both the table and the file, and says so.
  const auto o = resolve_context(loaded("stories260K").weights.config, "x.gguf", 300);
  CHECK(o.tokens == 300);
  CHECK(o.source.rfind("--context", 0) == 0);
  // The fingerprint is the metadata, not the file name: a renamed copy is
  // still stories260K; another shape that claims 2048 keeps 2048.
  CHECK(resolve_context(loaded("stories260K").weights.config, "/tmp/renamed.gguf").tokens == 512);
  model_config other = loaded("stories260K").weights.config;
  other.hidden += 1;
  const auto u = resolve_context(other, "/tmp/stories260K.gguf");
  CHECK(u.tokens == 2048);
  CHECK(u.model == "stories260K");  // the file's stem, for the CSV
  // A file with no context_length and no table entry needs --context.
  other.context = 0;
  CHECK_THROWS_WITH(resolve_context(other, "/tmp/y.gguf"), Catch::Contains("pass --context N"));
  CHECK(resolve_context(other, "/tmp/y.gguf", 128).tokens == 128);
}

TEST_CASE("context: a length beyond the trained context is refused, naming the option, the value and the context",
          "[context]") {
  for (const char* name : model_names) {
    const auto& ctx = loaded(name).context;
    INFO(name);
    CHECK_NOTHROW(require_within_context("--length", ctx.tokens, ctx));
    const std::string expected = "--length " + std::to_string(ctx.tokens + 1) + " is beyond " + name +
                                 "'s trained context of " + std::to_string(ctx.tokens) + " tokens";
    CHECK_THROWS_WITH(require_within_context("--length", ctx.tokens + 1, ctx), Catch::StartsWith(expected));
    CHECK_THROWS_WITH(require_within_context("--length", ctx.tokens + 1, ctx),
                      Catch::Contains("use at most " + std::to_string(ctx.tokens)));
  }
}

TEST_CASE("prefill: a full-cache prefill gives the token-by-token logits bit for bit", "[prefill]") {
  for (const char* name : model_names) {
    INFO(name);
    const model& m = loaded(name).weights;
    const auto text = sample_texts(m, 1, 80, 21, 1.0f, 0.9f).front().tokens;
    const auto T = static_cast<std::int32_t>(text.size());
    engine ref(m, T);
    const auto reference = step_logits(ref, text, 0);
    for (const std::int32_t P : {1, 2, 37, T - 1}) {
      INFO("P = " << P);
      engine e(m, T);
      e.set_policy(nullptr, {}, observe_source::probabilities, prefill_plan{P, 0});
      const float* l = e.prefill(text.data(), P);
      const std::vector<float> last(l, l + m.config.vocab);
      CHECK(same_bits(last, reference[static_cast<std::size_t>(P) - 1]));
      const auto rest = step_logits(e, text, static_cast<std::size_t>(P));
      bool same = true;
      for (std::size_t i = 0; i < rest.size(); ++i) same = same && same_bits(rest[i], reference[static_cast<std::size_t>(P) + i]);
      CHECK(same);
    }
  }
}

TEST_CASE("prefill: B >= P gives the full cache's NLL bit for bit, B < P keeps B tokens and differs", "[prefill]") {
  struct variant {
    const char* policy;
    observe_source source;
    std::int32_t last_k;
  };
  const variant variants[] = {{"scissorhands", observe_source::probabilities, 0},
                              {"h2o:norm=1", observe_source::probabilities, 0},
                              {"h2o", observe_source::queries, 0},
                              {"scissorhands:w=50,norm=1", observe_source::queries_lse, 0},
                              {"h2o", observe_source::probabilities, 8},
                              {"streaming", observe_source::probabilities, 0},
                              {"random", observe_source::probabilities, 0}};
  for (const char* name : model_names) {
    const model& m = loaded(name).weights;
    const auto texts = sample_texts(m, 2, 96, 31, 1.0f, 0.9f);
    const std::int32_t P = 48;
    eval_options o;
    protocol full_how;
    full_how.type = protocol::kind::prefill;
    full_how.prompt = P;
    const run_result full = evaluate_nll(m, texts, nullptr, {}, o, full_how);
    CHECK(full.predictions == 2 * (96 - P));
    CHECK(full.prompt_kv_fraction == 1.0);
    // The same targets decoded token by token give the same sum, bit for bit.
    {
      engine e(m, 96);
      double sum = 0.0;
      for (const auto& t : texts) {
        e.reset();
        for (std::size_t i = 0; i + 1 < t.tokens.size(); ++i) {
          const float* l = e.step(t.tokens[i]);
          if (static_cast<std::int32_t>(i) + 1 < P) continue;
          const float mx = *std::max_element(l, l + m.config.vocab);
          double s = 0.0;
          for (std::int32_t v = 0; v < m.config.vocab; ++v) s += std::exp(static_cast<double>(l[v]) - mx);
          sum += (static_cast<double>(mx) + std::log(s)) - l[t.tokens[i + 1]];
        }
      }
      CHECK(sum == full.nll_sum);
    }
    for (const auto& v : variants) {
      INFO(name << ": " << v.policy << ", source " << static_cast<int>(v.source) << ", last k " << v.last_k);
      const policy_spec spec = parse_policy(v.policy);
      o.source = v.source;
      protocol how = full_how;
      how.observe_last = v.last_k;
      for (const std::int32_t B : {P, P + 10}) {
        const run_result r = evaluate_nll(m, texts, &spec, std::vector<std::int32_t>(static_cast<std::size_t>(m.config.layers), B), o, how);
        CHECK(r.nll_sum == full.nll_sum);
        CHECK(r.prompt_kv_fraction == 1.0);
        CHECK(r.protocol == how.label());
      }
      const std::int32_t B = 20;
      const run_result r = evaluate_nll(m, texts, &spec, std::vector<std::int32_t>(static_cast<std::size_t>(m.config.layers), B), o, how);
      CHECK(r.nll_sum != full.nll_sum);
      CHECK(r.prompt_kv_fraction == Approx(static_cast<double>(B) / P));
      CHECK(r.predictions == full.predictions);
    }
  }
}

TEST_CASE("prefill: one observe of q_len P (or k) and one compress to B, protected tokens kept", "[prefill]") {
  const model& m = loaded("stories260K").weights;
  const model_config& c = m.config;
  const auto text = sample_texts(m, 1, 90, 41, 1.0f, 0.9f).front().tokens;
  const std::int32_t P = 60, B = 24;
  for (const char* name : {"scissorhands", "h2o", "streaming"})
    for (const std::int32_t k : {0, 16}) {
      INFO(name << ", last k " << k);
      const policy_spec spec = parse_policy(name);
      engine e(m, static_cast<std::int32_t>(text.size()));
      e.set_policy(&spec, std::vector<std::int32_t>(static_cast<std::size_t>(c.layers), B),
                   observe_source::probabilities, prefill_plan{P, k});
      // The state covers the prompt: P slots.
      CHECK(e.compressor()->state(0).shape.capacity == P);
      // What compress will do, from the state observe left.
      std::vector<std::vector<std::set<std::int32_t>>> expected(static_cast<std::size_t>(c.layers));
      std::int64_t steps_seen = -1;
      e.before_compress = [&](std::int32_t layer) {
        const auto st = e.compressor()->state(layer);
        steps_seen = st.step[0];
        CHECK(e.length(layer) == P);
        auto& keep = expected[static_cast<std::size_t>(layer)];
        keep.assign(static_cast<std::size_t>(c.kv_heads), {});
        for (std::int32_t h = 0; h < c.kv_heads; ++h) {
          std::vector<std::pair<float, std::int32_t>> ranked;
          for (std::int32_t t = 0; t < P; ++t) {
            const auto i = st.index(0, h, t);
            const std::int32_t pos = st.positions[i];
            if (pos >= st.next_position[0] - spec.config.recent || pos < spec.config.sinks) {
              keep[static_cast<std::size_t>(h)].insert(pos);
              continue;
            }
            float score = st.scores[i];
            if (spec.config.normalize && st.observed[i] > 0.0f) score /= st.observed[i];
            // The paper's count of unimportant steps goes highest first.
            if (spec.observation == observation_kind::unimportant) score = -score;
            ranked.emplace_back(score, pos);
          }
          std::sort(ranked.begin(), ranked.end());
          // Keep the highest B - protected: evict the P - B lowest (score, position).
          for (std::size_t j = static_cast<std::size_t>(P - B); j < ranked.size(); ++j)
            keep[static_cast<std::size_t>(h)].insert(ranked[j].second);
        }
      };
      e.prefill(text.data(), P);
      const std::int64_t observed = spec.observation == observation_kind::recency ? 0 : (k ? k : P);
      CHECK(steps_seen == observed);  // one observe call with q_len = P (or k)
      for (std::int32_t l = 0; l < c.layers; ++l) {
        CHECK(e.length(l) == B);
        const auto st = e.compressor()->state(l);
        for (std::int32_t h = 0; h < c.kv_heads; ++h) {
          std::set<std::int32_t> kept;
          for (std::int32_t t = 0; t < B; ++t) kept.insert(st.positions[st.index(0, h, t)]);
          CHECK(kept == expected[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
        }
      }
      // Then the cache grows, with no further eviction.
      e.before_compress = nullptr;
      for (std::size_t t = static_cast<std::size_t>(P); t + 1 < text.size(); ++t) e.step(text[t]);
      for (std::int32_t l = 0; l < c.layers; ++l)
        CHECK(e.length(l) == B + static_cast<std::int32_t>(text.size()) - 1 - P);
    }
}

// Every (layer, head) of `layers` holds the same positions at every slot as
// layer `layers.front()` head 0.
static bool same_tokens(engine& e, const std::vector<std::int32_t>& layers) {
  const auto first = e.compressor()->state(layers.front());
  const std::int32_t len = e.length(layers.front());
  for (const std::int32_t l : layers) {
    if (e.length(l) != len) return false;
    const auto st = e.compressor()->state(l);
    for (std::int32_t h = 0; h < st.shape.kv_heads; ++h)
      for (std::int32_t t = 0; t < len; ++t)
        if (st.positions[st.index(0, h, t)] != first.positions[first.index(0, 0, t)]) return false;
  }
  return true;
}

TEST_CASE("granularity: spellings, labels and the refusal of per-layer budgets at layers-*", "[granularity]") {
  CHECK(parse_granularity("head", "--granularity").per_head());
  const auto hm = parse_granularity("heads-max", "--granularity");
  CHECK(hm.kind == sh::granularity_kind::shared_heads);
  CHECK(hm.name() == "heads-max");
  const auto lmm = parse_granularity("layers-max-mean", "--granularity");
  CHECK(lmm.kind == sh::granularity_kind::shared_layers);
  CHECK(lmm.heads == reduction_kind::max);
  CHECK(lmm.layers == reduction_kind::mean);
  CHECK(parse_granularity("layers-max", "--granularity").name() == "layers-max");
  CHECK(parse_granularity("layers-mean-max", "--granularity").name() == "layers-mean-max");
  CHECK(parse_granularity("layers", "--granularity").kind == sh::granularity_kind::shared_layers);
  CHECK_THROWS_WITH(parse_granularity("layer-mean", "--granularity"),
                    Catch::StartsWith("--granularity must be") && Catch::Contains("got 'layer-mean'"));
  CHECK_THROWS_WITH(parse_granularity("heads-mean-max", "--granularity"), Catch::Contains("got 'heads-mean-max'"));
  // Labels and descriptions: unchanged at head.
  const policy_spec plain = parse_policy("scissorhands");
  CHECK(parse_policy("scissorhands:gran=head").label == "scissorhands");
  CHECK(parse_policy("scissorhands:gran=head").describe() == plain.describe());
  CHECK(parse_policy("h2o:gran=layers-max").label == "h2o/layers-max");
  CHECK(parse_policy("h2o:gran=layers-max").describe().find(" gran=layers-max") != std::string::npos);
  CHECK(parse_policy("h2o:gran=heads-mean,label=x").label == "x");
  policy_overrides o;
  o.granularity = parse_granularity("layers-mean", "--granularity");
  CHECK(parse_policy("random", o).label == "random/layers-mean");
  CHECK(parse_policy("random:gran=head", o).label == "random");  // the spec's key wins
  CHECK_THROWS_WITH(parse_policy("h2o:gran=rows"), Catch::Contains("gran must be"));
  // One set of slots for the whole model needs one budget.
  const model& m = loaded("stories260K").weights;
  engine e(m, 64);
  const policy_spec layers = parse_policy("scissorhands:gran=layers-mean");
  CHECK_THROWS_WITH(e.set_policy(&layers, allocate_budgets(24, m.config.layers, allocator_kind::ramp, 0.5)),
                    Catch::Contains("every layer needs the same budget"));
  const policy_spec heads = parse_policy("scissorhands:gran=heads-mean");
  CHECK_NOTHROW(e.set_policy(&heads, allocate_budgets(24, m.config.layers, allocator_kind::ramp, 0.5)));
}

TEST_CASE("snapkv: the preset, the pool/poolmode/k keys, the policy's own observation window, refusals",
          "[snapkv]") {
  const policy_spec snap = parse_policy("snapkv");
  CHECK(snap.config.pool_width == 5);
  CHECK(snap.config.pool_mode == sh::pooling::mean);
  CHECK(snap.config.compaction_mode == sh::compaction::preserve_order);
  CHECK(snap.config.recent == 10);
  CHECK(snap.observe_last == 32);
  CHECK(snap.describe().find(" pool=5 poolmode=mean k=32") != std::string::npos);
  const policy_spec mx = parse_policy("h2o:pool=3,poolmode=max,compaction=order,k=8");
  CHECK(mx.config.pool_width == 3);
  CHECK(mx.config.pool_mode == sh::pooling::max);
  CHECK(mx.observe_last == 8);
  CHECK_THROWS_WITH(parse_policy("h2o:poolmode=median"), Catch::Contains("poolmode must be mean or max"));
  CHECK_THROWS_WITH(parse_policy("h2o:k=-1"), Catch::Contains("k"));

  const model& m = loaded("stories260K").weights;
  const auto texts = sample_texts(m, 2, 96, 41, 1.0f, 0.9f);
  const std::vector<std::int32_t> budgets(static_cast<std::size_t>(m.config.layers), 20);
  eval_options o;
  protocol how;
  how.type = protocol::kind::prefill;
  how.prompt = 48;
  // A policy's k wins over the protocol's: snapkv (k = 32) under prefill:48
  // is bit for bit snapkv:k=0 under prefill:48:32, and differs from k = 0.
  const policy_spec own = parse_policy("snapkv:k=0");
  protocol last32 = how;
  last32.observe_last = 32;
  const run_result a = evaluate_nll(m, texts, &snap, budgets, o, how);
  const run_result b = evaluate_nll(m, texts, &own, budgets, o, last32);
  const run_result c = evaluate_nll(m, texts, &own, budgets, o, how);
  CHECK(a.nll_sum == b.nll_sum);
  CHECK(a.nll_sum != c.nll_sum);
  // k beyond the prompt, and pooling with fill_holes, are refused by name.
  protocol short_prompt = how;
  short_prompt.prompt = 16;
  CHECK_THROWS_WITH(evaluate_nll(m, texts, &snap, budgets, o, short_prompt),
                    Catch::Contains("observes the last k = 32 prompt queries, more than the prompt P = 16"));
  const policy_spec fill = parse_policy("h2o:pool=3");
  CHECK_THROWS_WITH(evaluate_nll(m, texts, &fill, budgets, o, how), Catch::Contains("settings.pool_width"));
  const policy_spec even = parse_policy("h2o:pool=4,compaction=order");
  CHECK_THROWS_WITH(evaluate_nll(m, texts, &even, budgets, o, how), Catch::Contains("must be odd"));
}

TEST_CASE("allocators: persistence splits by 1 - ratio per layer, at the same total", "[allocator]") {
  const auto b = allocate_budgets(24, 5, allocator_kind::persistence, 0.5, {0.9, 0.5, 0.5, 0.5, 0.1});
  std::int32_t sum = 0;
  for (auto x : b) sum += x;
  CHECK(sum == 24 * 5);
  CHECK(b[0] < b[1]);
  CHECK(b[1] == b[2]);
  CHECK(b[4] > b[3]);
  // Equal ratios give the uniform split.
  CHECK(allocate_budgets(24, 5, allocator_kind::persistence, 0.5, std::vector<double>(5, 0.99)) ==
        allocate_budgets(24, 5, allocator_kind::uniform, 0.5));
  CHECK_THROWS_WITH(allocate_budgets(24, 5, allocator_kind::persistence, 0.5, {0.5, 0.5}),
                    Catch::Contains("persistence"));
}

TEST_CASE("granularity: heads share slots within a layer, layers-* across the model, both protocols", "[granularity]") {
  const model& m = loaded("stories260K").weights;
  const model_config& c = m.config;
  const auto text = sample_texts(m, 1, 96, 7, 1.0f, 0.9f).front().tokens;
  const std::int32_t B = 24;
  const std::vector<std::int32_t> budgets(static_cast<std::size_t>(c.layers), B);
  std::vector<std::int32_t> all;
  for (std::int32_t l = 0; l < c.layers; ++l) all.push_back(l);
  const policy_spec per_head = parse_policy("scissorhands");
  for (const char* gran : {"head", "heads-mean", "heads-max", "layers-mean", "layers-max", "layers-mean-max",
                           "layers-max-mean"}) {
    INFO(gran);
    const policy_spec spec = parse_policy(std::string("scissorhands:gran=") + gran);
    const bool layers = spec.granularity.kind == sh::granularity_kind::shared_layers;
    // Decode: the cache never holds more than B; shared slots after every step.
    engine e(m, static_cast<std::int32_t>(text.size()));
    e.set_policy(&spec, budgets);
    CHECK(e.compressor()->model_wide() == layers);
    bool shared = true, within = true;
    for (std::size_t t = 0; t + 1 < text.size(); ++t) {
      e.step(text[t]);
      for (std::int32_t l = 0; l < c.layers; ++l) {
        within = within && e.length(l) <= B;
        if (!spec.granularity.per_head()) shared = shared && same_tokens(e, {l});
      }
      if (layers) shared = shared && same_tokens(e, all);
    }
    CHECK(within);
    CHECK(shared);
    CHECK(e.length(0) == B - 1);  // compressed at B to B - m: the last step evicted
    if (spec.granularity.per_head()) {
      // gran=head is the default policy, step for step.
      engine a(m, static_cast<std::int32_t>(text.size())), b(m, static_cast<std::int32_t>(text.size()));
      a.set_policy(&spec, budgets);
      b.set_policy(&per_head, budgets);
      CHECK(step_logits(a, text, 0) == step_logits(b, text, 0));
      // Per head, the heads of a layer part ways.
      CHECK_FALSE(same_tokens(e, {c.layers - 1}));
    }
    // Prefill: every layer keeps exactly B of the P prompt tokens.
    const std::int32_t P = 60;
    engine p(m, static_cast<std::int32_t>(text.size()));
    p.set_policy(&spec, budgets, observe_source::probabilities, prefill_plan{P, 0});
    p.prefill(text.data(), P);
    for (std::int32_t l = 0; l < c.layers; ++l) {
      CHECK(p.length(l) == B);
      if (!spec.granularity.per_head()) CHECK(same_tokens(p, {l}));
    }
    if (layers) CHECK(same_tokens(p, all));
    for (std::size_t t = static_cast<std::size_t>(P); t + 1 < text.size(); ++t) p.step(text[t]);
    CHECK(p.length(0) == B + static_cast<std::int32_t>(text.size()) - 1 - P);
  }
}

TEST_CASE("protocol and budget specs parse and resolve, with messages naming the option", "[protocol]") {
  CHECK(parse_protocol("decode").type == protocol::kind::decode);
  const protocol p = parse_protocol("prefill:50%:16");
  CHECK(p.type == protocol::kind::prefill);
  CHECK(p.prompt_percent == 50.0);
  CHECK(p.observe_last == 16);
  const protocol r = resolve_protocol(p, 500);
  CHECK(r.prompt == 250);
  CHECK(r.label() == "prefill:250:16");
  CHECK(parse_protocol("prefill:100").label() == "prefill:100");
  CHECK_THROWS_WITH(parse_protocol("prefil:10"), Catch::StartsWith("--protocol 'prefil:10'"));
  CHECK_THROWS_WITH(parse_protocol("prefill:0"), Catch::Contains("P must be"));
  CHECK_THROWS_WITH(parse_protocol("prefill:10:x"), Catch::Contains("k must be"));
  CHECK_THROWS_WITH(resolve_protocol(parse_protocol("prefill:500"), 500), Catch::Contains("[1, 499]"));
  CHECK_THROWS_WITH(resolve_protocol(parse_protocol("prefill:10:11"), 500), Catch::Contains("must not exceed the prompt"));
  CHECK(resolve_budget(parse_budget("3.125%"), 500) == 16);
  CHECK(resolve_budget(parse_budget("12.5%"), 256) == 32);
  CHECK(resolve_budget(parse_budget("64"), 256) == 64);
  CHECK_THROWS_WITH(parse_budget("0"), Catch::StartsWith("--budgets: '0'"));
  CHECK_THROWS_WITH(parse_budget("120%"), Catch::StartsWith("--budgets: '120%'"));
}

int main(int argc, char* argv[]) {
  // Listing must work without the models (catch_discover_tests lists at build time).
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing)
    for (const char* name : model_names)
      if (find_shared_model(std::string(name) + ".gguf").empty()) {
        std::cerr << "test_llama_models: skipped, ../shared/models/" << name
                  << ".gguf not found (../shared/models/README.md lists the three models)\n";
        return 77;
      }
  return Catch::Session().run(argc, argv);
}
