// The translation unit clang-tidy checks the headers through
// (scripts/stages/30-clang-tidy.sh): the umbrella header, plus one use of
// every host entry point and policy so that templates are instantiated and
// their bodies analysed, not only declared. Built as part of the tests so it
// also compiles with g++.
#include <scissorhands/scissorhands.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tidy {

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

template <class Policy, class View>
void use_backend(const Policy& policy, View cache, sh::eviction_state<host> state, std::vector<std::byte>& workspace,
                 std::vector<std::int32_t>& freed) {
  sh::host::admit(policy, cache, state);
  const std::vector<float> probs(64, 0.0f);
  sh::host::observe_probabilities(policy, cache, state,
                                  sh::probability_view<host>::dense({probs.data(), probs.size()}, 2, 1, 8));
  sh::host::observe_queries(policy, cache, state,
                            sh::query_view<float, host>::dense({probs.data(), probs.size()}, 2, 1, 4),
                            sh::lse_view<host>::dense({probs.data(), probs.size()}, 2, 1, sh::lse_base::base2));
  sh::host::compress(policy, cache, state, 8, {workspace.data(), workspace.size()}, {freed.data(), freed.size()});
}

template <class Policy>
void use_policy(sh::host_kv_view<float> contiguous, sh::host_paged_kv_view<float> paged, sh::eviction_state<host> state,
                std::vector<std::byte>& workspace, std::vector<std::int32_t>& freed) {
  const Policy policy{};
  use_backend(policy, contiguous, state, workspace, freed);
  use_backend(policy, paged, state, workspace, freed);
}

// Never called: it exists to be compiled and analysed.
void instantiate(sh::host_kv_view<float> contiguous, sh::host_paged_kv_view<float> paged,
                 sh::eviction_state<host> state, std::vector<std::byte>& workspace,
                 std::vector<std::int32_t>& freed, std::vector<std::int32_t>& indptr,
                 std::vector<std::int32_t>& indices) {
  use_policy<sh::scissorhands_policy>(contiguous, paged, state, workspace, freed);
  use_policy<sh::h2o_policy>(contiguous, paged, state, workspace, freed);
  use_policy<sh::streaming_policy>(contiguous, paged, state, workspace, freed);
  use_policy<sh::random_policy>(contiguous, paged, state, workspace, freed);
  use_policy<sh::key_norm_policy>(contiguous, paged, state, workspace, freed);
  use_policy<sh::eviction_policy<sh::attention_mass, sh::exponential_decay, sh::recent_window, sh::gqa_max>>(
      contiguous, paged, state, workspace, freed);
  sh::host::reset_state(state);
  sh::host::reset_sequence(state, 0, 0);
  (void)sh::host::release_freed_pages({indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                      {freed.data(), freed.size()}, {indices.data(), indices.size()});
  (void)sh::host::compress_workspace_bytes(contiguous);
  (void)sh::state_bytes(sh::state_shape_for(sh::scissorhands_policy{}, paged));
  std::vector<std::byte> buffer(4096);
  (void)sh::make_state(sh::host_span<std::byte>(buffer.data(), buffer.size()), state.shape);
  (void)sh::allocate(sh::uniform_budget{}, sh::total_budget::tokens_per_head(512, 32), 32);
  (void)sh::allocate(sh::ramp_budget{}, sh::total_budget::compression_ratio(0.2, 4096, 32), 32);
  (void)sh::allocate(sh::pyramid_budget{}, sh::total_budget::tokens_per_head(512, 32), 32);
  (void)sh::allocate(sh::explicit_budget{{1, 2}}, sh::total_budget{3}, 2);
  (void)sh::allocate(sh::persistence_budget{{0.5, 0.9}}, sh::total_budget{100}, 2);
}

}  // namespace tidy
