#pragma once
// Host backend on the engine's threads, without the library owning any.
//
// Every host entry point that does per-sequence work has a plan_* twin
// taking the same arguments: it validates everything once, on the calling
// thread, does the little serial bookkeeping the call needs (observe admits
// the new tokens and advances the step counters; compress writes the new
// lengths), and returns a plan. The plan's work is a list of independent
// units (a (sequence, KV head) pair, or a sequence where one choice covers
// every head); plan.run({i, n}) does the i-th of n contiguous, balanced
// ranges of it. Run the n slices on any threads in any order, each once:
// the union is exactly the serial call (bit-identical), because no unit
// reads what another writes. The serial functions are plan_*(...).run().
//
//   auto plan = host::plan_observe_queries(policy, cache, state, queries, lse);
//   pool.parallel_for(n, [&](int i) { plan.run({i, n}); });   // the engine's pool
//   host::run_on_threads(plan, n);                            // or threads.hpp
//
// A plan holds the call's views (non-owning, as the call does): between
// plan_* and the last slice's return nothing the call reads or writes may
// change, and the next call on the same state starts after every slice
// returned. run() never throws for a valid slice: validation is done.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "../detail/validate.hpp"

namespace scissorhands::host {

// Part `index` of `count` equal parts of a plan's work.
struct slice {
  std::int32_t index = 0;
  std::int32_t count = 1;
};

// A validated call, ready to run in slices. Work is called as
// work(first_unit, end_unit, slice_index) on units [first_unit, end_unit).
template <class Work>
class work_plan {
 public:
  work_plan(const char* name, Work work, std::int64_t units,
            std::int32_t max_slices = std::numeric_limits<std::int32_t>::max())
      : name_(name), work_(std::move(work)), units_(units), max_slices_(max_slices) {}

  // Independent units of work (for choosing a slice count; a slice may be empty).
  std::int64_t units() const noexcept { return units_; }
  // Most slices the plan can run in: its workspace holds this many slices'
  // scratch (compress, select), or no limit.
  std::int32_t max_slices() const noexcept { return max_slices_; }

  // Slice index of count: a contiguous range of the units; the ranges'
  // sizes differ by at most one (the first units % count get one more).
  void run(slice part) const {
    const bool limited = max_slices_ < std::numeric_limits<std::int32_t>::max();
    scissorhands::detail::require(part.count >= 1 && part.count <= max_slices_, name_, "slice.count",
                                  "must be in [1, ", max_slices_, "]",
                                  limited ? " (the slices the plan's workspace was sized for)" : "", ", got ",
                                  part.count);
    scissorhands::detail::require(part.index >= 0 && part.index < part.count, name_, "slice.index",
                                  "must be in [0, slice.count = ", part.count, "), got ", part.index);
    const std::int64_t share = units_ / part.count, extra = units_ % part.count;
    const std::int64_t first = share * part.index + std::min<std::int64_t>(part.index, extra);
    const std::int64_t end = first + share + (part.index < extra ? 1 : 0);
    if (first < end) work_(first, end, part.index);
  }
  // All the work on this thread: the serial call.
  void run() const { run({0, 1}); }

 private:
  const char* name_;
  Work work_;
  std::int64_t units_;
  std::int32_t max_slices_;
};

}  // namespace scissorhands::host
