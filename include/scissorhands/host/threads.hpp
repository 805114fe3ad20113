#pragma once
// For callers without a thread pool (examples, benchmarks, tests): runs a
// plan's slices on std::threads, the calling thread doing slice 0, and
// returns when all are done. Engines with their own pool call plan.run
// from it instead (plan.hpp). Each call starts and joins its threads
// (tens of microseconds): a pool is cheaper for per-layer calls.
#include <cstdint>
#include <thread>
#include <vector>

#include "plan.hpp"

namespace scissorhands::host {

template <class Plan>
void run_on_threads(const Plan& plan, std::int32_t threads) {
  scissorhands::detail::require(threads >= 1 && threads <= plan.max_slices(), "host::run_on_threads", "threads",
                  "must be in [1, plan.max_slices() = ", plan.max_slices(), "], got ", threads);
  std::vector<std::jthread> workers;
  workers.reserve(static_cast<std::size_t>(threads - 1));
  for (std::int32_t i = 1; i < threads; ++i) workers.emplace_back([&plan, i, threads] { plan.run({i, threads}); });
  plan.run({0, threads});
}  // the jthreads join here

}  // namespace scissorhands::host
