// Host benchmarks of scissorhands: observe and compress at a Llama-3-8B-like
// layer, and a naive compress baseline in the same run.
//
// Without --benchmark_min_time the binary uses 0.2 s per benchmark (Google
// Benchmark's default, 0.5 s, makes the whole run needlessly long); pass the
// flag to override it (Google Benchmark 1.7.1: a plain number of seconds).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "bench_host.hpp"

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) has_min_time |= std::strncmp(argv[i], "--benchmark_min_time", 20) == 0;
  static char default_min_time[] = "--benchmark_min_time=0.2";
  if (!has_min_time) args.insert(args.begin() + 1, default_min_time);
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);  // argv[argc] is null by convention

  bench_host::register_copy_baseline();
  bench_host::register_observe();
  bench_host::register_compress();
  bench_host::register_select();
  bench_host::register_observe_groups();
  bench_host::register_observe_threads();
  bench_host::register_compress_threads();
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
