// One sequence, one head, H2O: observe a step, compress to a budget of 4,
// check that the least-attended unprotected token went; then a bad budget
// must come back as an error naming it.
#if __cplusplus != 201703L || defined(__cpp_exceptions)
#error "the consumer must compile as C++17 with -fno-exceptions"
#endif
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine_scissorhands.h"

namespace br = scissorhands::bridge;
namespace sh = engine::h2o_f32;

int main() {
  constexpr std::int32_t capacity = 8, head_dim = 4;
  std::vector<float> k(capacity * head_dim), v(capacity * head_dim);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i / head_dim);  // row t holds t
  const std::int32_t lengths[1] = {5};
  const auto layout = br::kv_layout::nhd(capacity, 1, head_dim);
  const sh::contiguous_cache cache{k.data(), k.size(), v.data(), v.size(), layout,  layout,
                                   lengths,  1,        1,        head_dim, capacity};
  br::settings settings;
  bool ok = sh::default_settings(&settings).ok();  // the preset's numbers, then ours
  settings.recent = 1;
  settings.evict_count = 1;

  br::state_shape shape;
  std::size_t bytes = 0;
  ok = ok && sh::make_state_shape(settings, 1, 1, capacity, &shape).ok() && sh::state_bytes(shape, &bytes).ok();
  void* buffer = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  br::state state;
  ok = ok && sh::make_state(buffer, bytes, shape, &state).ok() && sh::reset_state(state).ok();
  const float probs[5] = {0.3f, 0.3f, 0.01f, 0.2f, 0.19f};  // token 2 gets almost nothing
  ok = ok && sh::observe_probabilities(settings, cache, state, br::probabilities::dense(probs, 5, 1, 1, 5)).ok();
  std::vector<std::uint64_t> workspace((sh::compress_workspace_bytes(cache) + 7) / 8);
  std::int32_t new_length = 0;
  ok = ok &&
       sh::compress(settings, cache, state, 5, workspace.data(), workspace.size() * 8, {&new_length, nullptr}).ok();
  ok = ok && new_length == 4;
  for (std::int32_t t = 0; t < new_length; ++t) ok = ok && k[t * head_dim] != 2.0f;

  const br::error refused =
      sh::compress(settings, cache, state, 1, workspace.data(), workspace.size() * 8, {&new_length, nullptr});
  ok = ok && refused.code == br::error_code::invalid_argument && std::strcmp(refused.argument, "budget") == 0;
  std::printf("%s\n", refused.message);
  std::free(buffer);
  std::puts(ok ? "consumer-cxx17: ok" : "consumer-cxx17: FAILED");
  return ok ? 0 : 1;
}
