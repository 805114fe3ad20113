// scissorhands_cuda_test, float configurations: the kernels of every policy
// under test for this element type (differential.cuh).
#include "differential.cuh"

namespace differential {
bool run_fp32(const config& c, mismatch_log& log) { return run_typed<float>(c, log); }
}  // namespace differential
