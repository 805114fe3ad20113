#pragma once
// The policy combinations the simulations run, under short names so the
// CTest names stay readable.
#include <scissorhands/scissorhands.hpp>

namespace sh_test {

namespace sh = scissorhands;

using mass_unbounded = sh::eviction_policy<sh::attention_mass, sh::unbounded_history>;
using mass_window = sh::eviction_policy<sh::attention_mass, sh::sliding_window>;
using mass_decay = sh::eviction_policy<sh::attention_mass, sh::exponential_decay>;
using indicator_unbounded = sh::eviction_policy<sh::important_indicator, sh::unbounded_history>;
using indicator_window = sh::eviction_policy<sh::important_indicator, sh::sliding_window>;
using indicator_decay = sh::eviction_policy<sh::important_indicator, sh::exponential_decay>;
using mass_window_max = sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>;
using indicator_unbounded_max =
    sh::eviction_policy<sh::important_indicator, sh::unbounded_history, sh::recent_window, sh::gqa_max>;
using unimportant_window = sh::eviction_policy<sh::unimportant_indicator, sh::sliding_window>;
using unimportant_unbounded_max =
    sh::eviction_policy<sh::unimportant_indicator, sh::unbounded_history, sh::recent_window, sh::gqa_max>;
using key_norm_static = sh::eviction_policy<sh::key_norm, sh::unbounded_history>;
using recency_static = sh::eviction_policy<sh::recency, sh::unbounded_history>;
// A static score with a ring-carrying history: the ring must move untouched.
using random_static = sh::eviction_policy<sh::random_score, sh::sliding_window>;

}  // namespace sh_test
