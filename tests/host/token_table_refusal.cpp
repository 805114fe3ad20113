// Compiled (never run) by token_table_refusals.cmake with -DREFUSE=<n>:
// each call below needs K/V and must be refused at compile time with the
// static_assert naming it. Without REFUSE it compiles (the set-up is valid).
#include <scissorhands/scissorhands.hpp>

namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;

void refuse(const sh::host_token_table_view& table, sh::eviction_state<host> state, sh::model_state<host> model,
            sh::eviction_selection<host> selection, sh::host_span<std::byte> workspace) {
  [[maybe_unused]] const sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>> shared;
  [[maybe_unused]] const sh::scissorhands_policy per_head;
  [[maybe_unused]] const sh::with_granularity<sh::key_norm_policy, sh::shared_layers<>> key_norm;
  [[maybe_unused]] const sh::query_view<float, host> queries{};
  (void)table, (void)state, (void)model, (void)selection, (void)workspace;
#if REFUSE == 1
  sh::host::observe_queries(shared, table, state, queries);
#elif REFUSE == 2
  (void)sh::host::plan_observe_queries(shared, table, state, queries);
#elif REFUSE == 3
  sh::host::compress(per_head, table, state, 8, workspace, {});
#elif REFUSE == 4
  (void)sh::host::plan_compress(per_head, table, state, 8, workspace, {}, 1);
#elif REFUSE == 5
  sh::host::compact(shared, table, state, selection, workspace);
#elif REFUSE == 6
  (void)sh::host::plan_compact(shared, table, state, selection, workspace);
#elif REFUSE == 7
  sh::host::admit(key_norm, table, state);
#elif REFUSE == 8
  sh::host::observe_probabilities(key_norm, table, state, {});
#endif
}
