#pragma once
// Registration entry points of the host benchmark binary.
namespace bench_host {
void register_observe();
void register_compress();
void register_select();
// observe_queries with 3 and 4 query heads per KV head, over the same K.
void register_observe_groups();
// 1 and 2 threads through the plans (plan.hpp) on a spinning pool (pool.hpp).
void register_observe_threads();
// memcpy at the sizes observe reads: the bandwidth its figures are compared with.
void register_copy_baseline();
void register_compress_threads();
}  // namespace bench_host
