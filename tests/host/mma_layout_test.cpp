// observe_queries' tensor-core path (cuda/detail/mma_layout.hpp), checked
// without a GPU: mma.sync.m16n8k16 emulated on the PTX ISA's fragment
// layouts, its registers filled as the kernel fills them (A from the query
// tile by element_of, B from each lane's 16-byte loads of its key row),
// must give every query head's dot product with every key.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <scissorhands/cuda/detail/mma_layout.hpp>

namespace {

namespace ml = scissorhands::cuda::detail::mma_layout;

// What the kernel does with the fp32 results: d[0], d[1] are query head g
// with keys 2c and 2c + 1, d[2], d[3] head g + 8 (observe_queries_kernel's
// p0 .. p3).
static_assert(ml::d_row(5, 0) == 5 && ml::d_col(3, 0) == 6);
static_assert(ml::d_row(5, 1) == 5 && ml::d_col(3, 1) == 7);
static_assert(ml::d_row(5, 2) == 13 && ml::d_col(3, 2) == 6);
static_assert(ml::d_row(5, 3) == 13 && ml::d_col(3, 3) == 7);

}  // namespace

TEST_CASE("mma layout: the k indices of a row's steps are its elements, each once") {
  for (int head_dim : {32, 64, 128, 256}) {
    std::vector<int> seen(static_cast<std::size_t>(head_dim), 0);
    for (int s = 0; s < head_dim / 16; ++s)
      for (int k = 0; k < 16; ++k) {
        const int e = ml::element_of(s, k);
        REQUIRE(e >= 0);
        REQUIRE(e < head_dim);
        ++seen[static_cast<std::size_t>(e)];
      }
    for (int e = 0; e < head_dim; ++e) REQUIRE(seen[static_cast<std::size_t>(e)] == 1);
  }
}

TEST_CASE("mma layout: an emulated m16n8k16 chain fed as the kernel feeds it gives q.k") {
  for (int head_dim : {32, 64, 128, 256}) {
    for (int group : {1, 4, 8, 12, 16}) {
      CAPTURE(head_dim, group);
      // Small integers: every sum is exact in double, so equality is the test.
      std::vector<double> q(16 * static_cast<std::size_t>(head_dim), 0.0), key(8 * static_cast<std::size_t>(head_dim));
      for (int row = 0; row < group; ++row)
        for (int e = 0; e < head_dim; ++e) q[static_cast<std::size_t>(row * head_dim + e)] = (row * 7 + e * 3) % 11 - 5;
      for (int n = 0; n < 8; ++n)
        for (int e = 0; e < head_dim; ++e) key[static_cast<std::size_t>(n * head_dim + e)] = (n * 5 + e * 13) % 9 - 4;

      double d[32][4] = {};  // each lane's accumulator registers
      for (int s = 0; s < head_dim / 16; ++s) {
        // The operands as the lanes hold them.
        double a_reg[32][4][2], b_reg[32][2][2];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int r = 0; r < 4; ++r)  // build_fragments: rows past the group are zero
            for (int h = 0; h < 2; ++h) {
              const int row = ml::a_row(g, r);
              a_reg[lane][r][h] =
                  row < group ? q[static_cast<std::size_t>(row * head_dim + ml::element_of(s, ml::a_k(c, r, h)))] : 0.0;
            }
          // issue_keys: lane (g, c) loads elements [32p + 8c, + 8) of key g,
          // p = s / 2; 32-bit word w of the load holds elements 2w, 2w + 1.
          for (int r = 0; r < 2; ++r)
            for (int h = 0; h < 2; ++h) {
              const int e = 32 * (s / 2) + 8 * c + 2 * ml::b_word(s, r) + h;
              b_reg[lane][r][h] = key[static_cast<std::size_t>(g * head_dim + e)];
            }
        }
        // The instruction: the matrices the PTX layouts say the registers
        // hold, D += A x B.
        double a[16][16] = {}, b[16][8] = {};
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int r = 0; r < 4; ++r)
            for (int h = 0; h < 2; ++h) a[ml::a_row(g, r)][ml::a_k(c, r, h)] = a_reg[lane][r][h];
          for (int r = 0; r < 2; ++r)
            for (int h = 0; h < 2; ++h) b[ml::b_k(c, r, h)][g] = b_reg[lane][r][h];
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int r = 0; r < 4; ++r)
            for (int k = 0; k < 16; ++k) d[lane][r] += a[ml::d_row(g, r)][k] * b[k][ml::d_col(c, r)];
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int r = 0; r < 4; ++r) {
          const int row = ml::d_row(g, r), n = ml::d_col(c, r);
          double expect = 0.0;
          if (row < group)
            for (int e = 0; e < head_dim; ++e)
              expect += q[static_cast<std::size_t>(row * head_dim + e)] * key[static_cast<std::size_t>(n * head_dim + e)];
          REQUIRE(d[lane][r] == expect);
        }
      }
    }
  }
}
