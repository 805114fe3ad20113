// One sequence, one head: observe three decode steps, compress to a budget
// of 4 and check that the lowest-scoring unprotected token went.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh = scissorhands;

int main() {
  constexpr std::int32_t capacity = 8, head_dim = 4;
  std::vector<float> k(capacity * head_dim), v(capacity * head_dim);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i / head_dim);  // row t holds t
  std::vector<std::int32_t> lengths{5};
  const auto cache = sh::make_kv_view(sh::host_span<float>(k.data(), k.size()), sh::host_span<float>(v.data(), v.size()),
                                      sh::host_span<const std::int32_t>(lengths.data(), 1), 1, 1, head_dim, capacity,
                                      sh::named_layout::nhd);
  sh::h2o_policy policy;
  policy.config.recent = 1;
  policy.config.evict_count = 1;
  const auto shape = sh::state_shape_for(policy, cache);
  const std::size_t bytes = sh::state_bytes(shape);
  void* buffer = std::aligned_alloc(256, bytes);
  const auto state = sh::make_state(sh::host_span<std::byte>(static_cast<std::byte*>(buffer), bytes), shape);
  sh::host::reset_state(state);

  // Token 2 gets almost no attention.
  const std::vector<float> probs{0.3f, 0.3f, 0.01f, 0.2f, 0.19f};
  sh::host::observe_probabilities(policy, cache, state,
                                  sh::probability_view<sh::memory_space::host>::dense({probs.data(), probs.size()}, 1, 1, 5));
  std::vector<std::byte> workspace(sh::host::compress_workspace_bytes(cache) + 16);
  std::vector<std::int32_t> new_lengths(1);
  sh::host::compress(policy, cache, state, 5, {workspace.data(), workspace.size()}, {{new_lengths.data(), 1}, {}});
  lengths = new_lengths;  // the engine applies the lengths compress reports

  bool ok = lengths[0] == 4;
  for (std::int32_t t = 0; t < lengths[0]; ++t) {
    const std::int32_t position = state.positions[t];
    ok = ok && position != 2 && k[static_cast<std::size_t>(t * head_dim)] == static_cast<float>(position);
  }
  std::free(buffer);
  std::puts(ok ? "consumer: ok" : "consumer: FAILED");
  return ok ? 0 : 1;
}
