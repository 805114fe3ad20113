// scissorhands_cuda_test, __nv_bfloat16 configurations: the kernels of every policy
// under test for this element type (differential.cuh).
#include "differential.cuh"

namespace differential {
bool run_bf16(const config& c, mismatch_log& log) { return run_typed<__nv_bfloat16>(c, log); }
}  // namespace differential
