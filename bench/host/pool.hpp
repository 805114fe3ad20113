#pragma once
// A minimal spinning thread pool, standing in for an engine's own (e.g.
// ggml's threadpool, which also spins between graph nodes): `threads - 1`
// workers wait on a generation counter; run(plan) hands every thread its
// slice {i, threads}, the caller doing slice 0, and returns when all slices
// are done. Spinning keeps the hand-off to a few hundred nanoseconds, so the
// benchmark measures the library's slices rather than futex wake-ups; after
// a while a waiting thread yields its core instead (other work on the
// machine would otherwise stall the slice it waits for).
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include <scissorhands/host/plan.hpp>

namespace bench_host {

class slice_pool {
 public:
  explicit slice_pool(std::int32_t threads) : threads_(threads) {
    for (std::int32_t i = 1; i < threads; ++i)
      workers_.emplace_back([this, i] {
        std::uint64_t seen = 0;
        for (;;) {
          std::uint64_t now;
          for (std::uint32_t spins = 0; (now = generation_.load(std::memory_order_acquire)) == seen; ++spins) wait(spins);
          seen = now;
          if (stop_.load(std::memory_order_relaxed)) return;
          job_(i);
          pending_.fetch_sub(1, std::memory_order_acq_rel);
        }
      });
  }
  slice_pool(const slice_pool&) = delete;
  slice_pool& operator=(const slice_pool&) = delete;
  ~slice_pool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }  // the jthreads join here

  std::int32_t threads() const { return threads_; }

  template <class Plan>
  void run(const Plan& plan) {
    if (threads_ == 1) {
      plan.run();
      return;
    }
    const std::int32_t n = threads_;
    job_ = [&plan, n](std::int32_t i) { plan.run({i, n}); };
    pending_.store(n - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    plan.run({0, n});
    for (std::uint32_t spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) wait(spins);
  }

 private:
  // Spin a while, then give the core away: on a machine busy with other
  // work a pure spin would hold the core the other slice needs.
  static void wait(std::uint32_t spins) {
    if (spins < 20000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
  std::int32_t threads_;
  std::function<void(std::int32_t)> job_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::int32_t> pending_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::jthread> workers_;  // last: joined before the members they use go
};

}  // namespace bench_host
