#pragma once
// Registration entry points of the host benchmark binary.
namespace bench_host {
void register_observe();
void register_compress();
}  // namespace bench_host
