#pragma once
// Where the operands of mma.sync.aligned.m16n8k16 (16-bit A and B, fp32
// C/D) live, and how observe_queries' tensor-core path (mma_qk in
// kernels/observe_queries.cuh) maps the head_dim elements of a query and a
// key onto the k index. Plain constexpr functions, so that the mapping
// compiles with g++ alone and a host test (tests/host/mma_layout_test.cpp)
// can check, by emulating the instruction on these layouts, that every
// element of a row enters every dot product exactly once.
//
// Lane = 4 g + c (g = groupID 0..7, c = thread in group 0..3). From the PTX
// ISA's fragment layouts for m16n8k16 with .f16/.bf16 operands:
//   A (16 x 16, row-major), 4 registers of 2 halves: register r, half h of
//     lane (g, c) holds A[g + 8 (r & 1)][2c + h + 8 (r >> 1)];
//   B (16 x 8, column-major), 2 registers: register r, half h holds
//     B[2c + h + 8 r][g];
//   C/D (16 x 8, fp32), 4 registers: register r holds
//     D[g + 8 (r >> 1)][2c + (r & 1)].
#include "../../config.hpp"

namespace scissorhands::cuda::detail::mma_layout {

SCISSORHANDS_HOST_DEVICE constexpr int a_row(int g, int r) { return g + 8 * (r & 1); }
SCISSORHANDS_HOST_DEVICE constexpr int a_k(int c, int r, int h) { return 2 * c + h + 8 * (r >> 1); }
SCISSORHANDS_HOST_DEVICE constexpr int b_k(int c, int r, int h) { return 2 * c + h + 8 * r; }
SCISSORHANDS_HOST_DEVICE constexpr int d_row(int g, int r) { return g + 8 * (r >> 1); }
SCISSORHANDS_HOST_DEVICE constexpr int d_col(int c, int r) { return 2 * c + (r & 1); }

// The element of a query or key row that k index `k` of mma step `step`
// stands for. A lane (g, c) meets k in {2c, 2c + 1, 2c + 8, 2c + 9} only,
// and those are elements [32 (step / 2) + 8c + 4 (step % 2), + 4): so the
// lane's B operands of steps 2p and 2p + 1 are the 8 consecutive elements
// [32p + 8c, 32p + 8c + 8) of its key row, one 16-byte load of 16-bit
// elements (the uint4's 32-bit word w holds elements 2w and 2w + 1: B
// register r of step s is word 2 (s % 2) + r).
SCISSORHANDS_HOST_DEVICE constexpr int element_of(int step, int k) {
  const int c = (k % 8) / 2;
  const int j = k % 2 + 2 * (k / 8);
  return 32 * (step / 2) + 8 * c + 4 * (step % 2) + j;
}
// The 32-bit word of a lane's 16-byte key load that holds B register r of
// step s (elements element_of(s, b_k(c, r, 0)) and the next).
SCISSORHANDS_HOST_DEVICE constexpr int b_word(int step, int r) { return 2 * (step % 2) + r; }

}  // namespace scissorhands::cuda::detail::mma_layout
