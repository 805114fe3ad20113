// scissorhands_cuda_test, __half configurations: the kernels of every policy
// under test for this element type (differential.cuh).
#include "differential.cuh"

namespace differential {
bool run_fp16(const config& c, mismatch_log& log) { return run_typed<__half>(c, log); }
}  // namespace differential
