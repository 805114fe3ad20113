#pragma once
// Registration entry points of the host benchmark binary.
namespace bench_host {
void register_observe();
void register_compress();
void register_select();
}  // namespace bench_host
