// Compile-only checks: the shipped policies satisfy the concepts in
// policy/concepts.hpp and malformed ones do not, so a wrong policy fails
// where it is used. A failing check here fails the build. The one runtime
// test at the end drives a user-defined policy through the host backend.
#include <catch2/catch.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "support.hpp"

namespace {

using namespace sh_test;
using sh::settings;

// ---- the shipped policies ------------------------------------------------
static_assert(sh::attention_observation<sh::attention_mass>);
static_assert(sh::attention_observation<sh::important_indicator>);
static_assert(sh::static_observation<sh::key_norm>);
static_assert(sh::static_observation<sh::recency>);
static_assert(sh::static_observation<sh::random_score>);
static_assert(!sh::static_observation<sh::attention_mass>);
static_assert(!sh::attention_observation<sh::key_norm>);
static_assert(sh::observation_policy<sh::attention_mass> && sh::observation_policy<sh::important_indicator> &&
              sh::observation_policy<sh::key_norm> && sh::observation_policy<sh::recency> &&
              sh::observation_policy<sh::random_score>);
static_assert(sh::history_policy<sh::unbounded_history>);
static_assert(sh::history_policy<sh::sliding_window>);
static_assert(sh::history_policy<sh::exponential_decay>);
static_assert(sh::protector_policy<sh::recent_window>);
static_assert(sh::gqa_reduction<sh::gqa_mean>);
static_assert(sh::gqa_reduction<sh::gqa_max>);
static_assert(sh::budget_allocator<sh::uniform_budget>);
static_assert(sh::budget_allocator<sh::ramp_budget>);
static_assert(sh::budget_allocator<sh::pyramid_budget>);
static_assert(sh::budget_allocator<sh::explicit_budget>);
static_assert(sh::budget_allocator<sh::persistence_budget>);
static_assert(sh::composed_policy<sh::scissorhands_policy>);
static_assert(sh::composed_policy<sh::h2o_policy>);
static_assert(sh::composed_policy<sh::streaming_policy>);
static_assert(sh::composed_policy<sh::random_policy>);
static_assert(sh::composed_policy<sh::key_norm_policy>);
static_assert(sh::composed_policy<sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window,
                                                      sh::gqa_max>>);
static_assert(!sh::composed_policy<int>);
static_assert(!sh::composed_policy<sh::settings>);
static_assert(!sh::composed_policy<sh::attention_mass>);

// Paper defaults and the ring each history needs (1 bit a step for the
// indicator, one word a step for real-valued observations).
static_assert(sh::settings{}.window == 400 && sh::settings{}.recent == 10 && sh::settings{}.sinks == 0);
static_assert(sh::scissorhands_paper_policy{}.ring_words() == 13);
static_assert(sh::important_count_policy{}.ring_words() == 13);
// The measured default: w = 25 (one word), normalised, alpha = 2, r = 10 (docs/quality.md).
static_assert(sh::scissorhands_policy{}.ring_words() == 1 && sh::scissorhands_policy{}.config.normalize &&
              sh::scissorhands_policy{}.config.alpha == 2.0f && sh::scissorhands_policy{}.config.recent == 10);
static_assert(sh::snapkv_policy{}.config.pool_width == 5 && sh::snapkv_policy{}.ring_words() == 0 &&
              sh::snapkv_policy{}.config.compaction_mode == sh::compaction::preserve_order);
static_assert(sh::tova_policy{}.config.window == 1 && sh::tova_policy{}.ring_words() == 1);
static_assert(sh::eviction_policy<sh::attention_mass, sh::sliding_window>{}.ring_words() == 400);
static_assert(sh::h2o_policy{}.ring_words() == 0);
static_assert(sh::eviction_policy<sh::important_indicator, sh::exponential_decay>{}.ring_words() == 0);

// ---- malformed policies --------------------------------------------------
// Most are a well-formed part (checked to be one) with one member changed,
// so each refusal is about that member alone.
// Squared attention mass: sharpens the distinction between heavy and light
// tokens (also the user policy the runtime test below drives).
struct squared_mass {
  static constexpr const char* name = "squared_mass";
  static constexpr bool needs_attention = true;
  static constexpr bool binary = false;
  static float contribution(float p, std::int32_t, const settings&) { return p * p; }
};
static_assert(sh::attention_observation<squared_mass>);
struct nameless_observation {  // squared_mass's members but the name
  static constexpr bool needs_attention = true;
  static constexpr bool binary = false;
  static float contribution(float p, std::int32_t, const settings&) { return p; }
};
struct double_contribution : squared_mass {
  static double contribution(float p, std::int32_t, const settings&) { return p; }
};
struct no_binary_flag {  // squared_mass's members but binary
  static constexpr const char* name = "no_binary";
  static constexpr bool needs_attention = true;
  static float contribution(float p, std::int32_t, const settings&) { return p; }
};
struct static_without_score : squared_mass {  // needs no attention, yet gives no static score
  static constexpr bool needs_attention = false;
};
// One static_assert a part (alike on purpose): a failing build names the part.
static_assert(!sh::observation_policy<nameless_observation>);
static_assert(!sh::observation_policy<double_contribution>);
static_assert(!sh::observation_policy<no_binary_flag>);
static_assert(!sh::observation_policy<static_without_score>);
static_assert(!sh::observation_policy<sh::unbounded_history>);

struct well_formed_history {
  static constexpr const char* name = "well_formed_history";
  static constexpr std::int32_t ring_words(const settings&, bool) { return 0; }
  static void update(float&, float&, sh::history_ring, std::int64_t, float, const settings&, bool) {}
};
static_assert(sh::history_policy<well_formed_history>);
struct update_returns_int : well_formed_history {
  static int update(float&, float&, sh::history_ring, std::int64_t, float, const settings&, bool) { return 0; }
};
struct wide_ring_words : well_formed_history {
  static constexpr std::int64_t ring_words(const settings&, bool) { return 0; }
};
struct score_by_value : well_formed_history {  // cannot write the score back
  static void update(float&&, float&, sh::history_ring, std::int64_t, float, const settings&, bool) {}
};
static_assert(!sh::history_policy<update_returns_int>);
static_assert(!sh::history_policy<wide_ring_words>);
static_assert(!sh::history_policy<score_by_value>);
static_assert(!sh::history_policy<sh::attention_mass>);

struct narrow_protected_count {
  static constexpr const char* name = "narrow";
  static bool is_protected(std::int32_t, std::int32_t, const settings&) { return false; }
  static constexpr int protected_count(const settings&) { return 0; }
};
static_assert(!sh::protector_policy<narrow_protected_count>);

struct gqa_without_finish {
  static constexpr const char* name = "no_finish";
  static constexpr float identity() { return 0.0f; }
  static float combine(float a, float b) { return a + b; }
};
struct gqa_double_identity {
  static constexpr const char* name = "double_identity";
  static constexpr double identity() { return 0.0; }
  static float combine(float a, float b) { return a + b; }
  static float finish(float a, std::int32_t) { return a; }
};
static_assert(!sh::gqa_reduction<gqa_without_finish>);
static_assert(!sh::gqa_reduction<gqa_double_identity>);

struct wide_budget {
  std::vector<std::int64_t> allocate(std::int64_t, std::int32_t) const { return {}; }
};
struct mutable_budget {  // allocate must be callable on a const allocator
  std::vector<std::int32_t> allocate(std::int64_t, std::int32_t) { return {}; }
};
static_assert(!sh::budget_allocator<wide_budget>);
static_assert(!sh::budget_allocator<mutable_budget>);

// eviction_policy itself refuses malformed parts at the point of use.
template <class O, class H = sh::unbounded_history, class P = sh::recent_window, class G = sh::gqa_mean>
concept composable = requires { typename sh::eviction_policy<O, H, P, G>; };
static_assert(composable<sh::attention_mass>);
static_assert(!composable<double_contribution>);
static_assert(!composable<sh::attention_mass, update_returns_int>);
static_assert(!composable<sh::attention_mass, sh::unbounded_history, narrow_protected_count>);
static_assert(!composable<sh::attention_mass, sh::unbounded_history, sh::recent_window, gqa_without_finish>);

// ---- granularities ---------------------------------------------------------
struct reduction_without_finish {
  static constexpr const char* name = "no finish";
  static float identity() { return 0.0f; }
  static float combine(float a, float b) { return a + b; }
};
struct granularity_without_kind {
  static constexpr const char* name = "no kind";
};
static_assert(sh::granularity_policy<sh::per_head>);
static_assert(sh::granularity_policy<sh::shared_heads<sh::max_score>>);
static_assert(sh::granularity_policy<sh::shared_layers<sh::mean_score, sh::max_score>>);
static_assert(!sh::granularity_policy<granularity_without_kind>);
static_assert(!sh::granularity_policy<sh::shared_heads<reduction_without_finish>>);
static_assert(!sh::granularity_policy<sh::shared_layers<sh::mean_score, reduction_without_finish>>);
static_assert(!sh::score_reduction<reduction_without_finish>);
// A preset keeps its settings at another granularity.
static_assert(sh::composed_policy<sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>>);
static_assert(sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>{}.config.window ==
              sh::scissorhands_policy{}.config.window);
static_assert(sh::granularity_of<sh::scissorhands_policy> == sh::granularity_kind::per_head);
static_assert(sh::granularity_of<sh::with_granularity<sh::h2o_policy, sh::shared_heads<>>> ==
              sh::granularity_kind::shared_heads);

// ---- a well-formed user policy (squared_mass, above) ---------------------
static_assert(sh::composed_policy<sh::eviction_policy<squared_mass, sh::unbounded_history>>);

}  // namespace

TEST_CASE("a user-defined observation policy runs through the host backend", "[concepts]") {
  sh::eviction_policy<squared_mass, sh::unbounded_history> policy;
  policy.config.recent = 1;
  contiguous_cache cache = make_contiguous(layout_kind::nhd, 1, 1, 4, 4, 1);
  cache.lengths[0] = 3;
  state_holder st(policy, cache.view());
  const std::vector<float> probs{0.5f, 0.25f, 0.25f};
  sh::host::observe_probabilities(policy, cache.view(), st.state,
                                  sh::probability_view<host>::dense({probs.data(), probs.size()}, 1, 1, 3));
  CHECK(st.state.scores[0] == 0.25f);
  CHECK(st.state.scores[1] == 0.0625f);
  CHECK(st.state.scores[2] == 0.0625f);
}

// The defaults are the library's measured default everywhere: the template
// arguments of eviction_policy<> and the settings it starts from are
// scissorhands_policy's (never important_indicator, which lost to random).
TEST_CASE("eviction_policy<> is the measured default, scissorhands_policy", "[concepts]") {
  using defaulted = sh::eviction_policy<>;
  STATIC_REQUIRE(std::is_same_v<defaulted::observation, sh::scissorhands_policy::observation>);
  STATIC_REQUIRE(std::is_same_v<defaulted::history, sh::scissorhands_policy::history>);
  STATIC_REQUIRE(std::is_same_v<defaulted::observation, sh::unimportant_indicator>);
  const auto mine = defaulted{}.config;
  const auto preset = sh::scissorhands_policy{}.config;
  CHECK(mine.window == preset.window);
  CHECK(mine.alpha == preset.alpha);
  CHECK(mine.normalize == preset.normalize);
  CHECK(mine.recent == preset.recent);
  CHECK(mine.window == 25);
  // The paper's preset still holds the paper's numbers; other compositions
  // keep the field defaults (H2O raw, the important count at w = 400).
  const auto paper = sh::scissorhands_paper_policy{}.config;
  CHECK((paper.window == 400 && paper.alpha == 1.0f && !paper.normalize));
  CHECK(!sh::h2o_policy{}.config.normalize);
  CHECK(sh::important_count_policy{}.config.window == 400);
}
