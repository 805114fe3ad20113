#pragma once
// Fused observe from queries: per (sequence, KV head), q.k for the group's
// query heads, probabilities exp(q.k * scale - lse), GQA combine,
// observation and history update, in one pass over K.
//
// Fast paths (head_dim 64/128/256, 16-byte aligned rows), two kinds. With
// queries of the cache's 16-bit type (bf16, fp16), q.k runs on tensor
// cores (mma_qk below: a warp scores 8 keys a round with head_dim / 16
// mma.sync; the launch sends groups of more than 16 query heads a KV head
// to the generic kernel). Otherwise (fp32 or mixed types) on FMAs: a lane
// group issues the 16-byte loads of `rows` K rows at once, multiplies them
// with a tile of query heads, and reduce-scatters the rows x queries
// partial dots (each butterfly step halves what a lane keeps, 15
// shuffles instead of 64 for 16 values over 16 lanes). Each lane then
// computes the exp of the value(s) it holds, and lane r of the group
// gathers row r's probabilities in head order, combines them and updates
// that row's state: no divergent per-row loop. Both fast paths are
// software-pipelined: the next round's K loads are issued before this
// round's arithmetic, and the state the round will update (score,
// observed, the ring word, into L1) at the round's start, so a round waits
// on at most one memory latency instead of two in a row; the FMA path
// reads the queries from shared memory, its registers holding the K in
// flight.
// Generic paths: one row a round, queries read from shared memory, plain
// butterflies.
//
// A quantized cache (quantized_rows) takes the generic paths: each lane
// loads 16 bytes of packed codes (16 int8 or 32 int4 elements) and
// dequantizes them in registers with its group's scale (and zero point), so
// the codes are read once and never expanded in memory; the format is a
// run-time value, so int8 and int4 share one kernel per path.
//
// With the log-sum-exp given, blocks split a head's slots in chunks (one
// read of K). Without, one block per head first computes the normaliser
// (online max / sum of exp: a second read of K), as the host does. Prefill
// (q_len > 1) loops over the queries in order, so each slot sees its steps
// in the host's order; with a ragged view each block reads its sequence's
// count from qo_indptr (the grid never depends on it). Rows are visited in
// warp-uniform rounds so the shuffles never diverge.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../attention_view.hpp"
#include "../../element.hpp"
#include "../../eviction_state.hpp"
#include "../../host/observe.hpp"
#include "../../quantized_kv_view.hpp"
#include "../block/collectives.cuh"
#include "../detail/mma_layout.hpp"
#include "../detail/tables.cuh"
#include "../element.cuh"
#include "../launch.cuh"
#include "../traits.cuh"
#include "observe.cuh"

namespace scissorhands::cuda::detail {

// 16 bytes of elements to floats (exact conversions).
template <class T, int N>
__device__ inline void unpack(const uint4& raw, float* out) {
  static_assert(N * sizeof(T) == 16);
  T e[N];
  static_assert(sizeof(e) == sizeof(raw));
  __builtin_memcpy(e, &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
}

// Reduce-scatter over aligned groups of Lanes lanes: on entry every lane
// has V partial values; on exit the lane with group rank `rank` holds the
// group sums of values [first(rank), first(rank) + held) in v[0..held).
template <int V, int Lanes>
__device__ inline void reduce_scatter(float (&v)[V], int rank) {
  int count = V;
#pragma unroll
  for (int offset = Lanes / 2; offset > 0; offset /= 2) {
    if (count > 1) {
      const bool upper = (rank & offset) != 0;
      const int half = count / 2;
#pragma unroll
      for (int i = 0; i < V / 2; ++i) {
        if (i >= half) break;
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(block::full_mask, send, offset);
      }
      count = half;
    } else {
      v[0] += __shfl_xor_sync(block::full_mask, v[0], offset);
    }
  }
}

struct lane_geometry {
  int lanes, rank, group_in_warp, group_lane0, rows_per_warp;
};

// Fast path: everything known at compile time.
template <class T, int HeadDim>
struct fixed_qk {
  using traits = qk_traits<T, HeadDim>;
  static constexpr int NQ = traits::max_queries, R = traits::rows, V = traits::values;
  static constexpr int slice = traits::per_lane * traits::vec;

  using packed_rows = uint4[R][traits::per_lane];

  // Issues this lane's 16-byte loads of R rows (zeros for invalid rows);
  // they stay packed, and in flight, until unpack_rows.
  __device__ static void issue_rows(const T* const (&krow)[R], const bool (&valid)[R], int rank, packed_rows& raw) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < traits::per_lane; ++i)
        raw[r][i] = valid[r] ? __ldg(reinterpret_cast<const uint4*>(krow[r]) + rank + i * traits::lanes)
                             : make_uint4(0u, 0u, 0u, 0u);
  }
  __device__ static void unpack_rows(const packed_rows& raw, float (&kf)[R][slice]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < traits::per_lane; ++i) unpack<T, traits::vec>(raw[r][i], &kf[r][i * traits::vec]);
  }
  // Loads this lane's part of R rows (zeros for invalid rows).
  __device__ static void load_rows(const T* const (&krow)[R], const bool (&valid)[R], int rank,
                                   float (&kf)[R][slice]) {
    packed_rows raw;
    issue_rows(krow, valid, rank, raw);
    unpack_rows(raw, kf);
  }

  // v[r * NQ + q] after the scatter (see reduce_scatter): the R rows' dot
  // products with the first nq query heads of the tile, read from shared
  // memory (q_tile: [nq][head_dim]) rather than held in registers, which go
  // to the K rows in flight instead (two 16-byte loads per query, bf16).
  __device__ static void dots(const float (&kf)[R][slice], const float* q_tile, int nq, int head_dim, int rank,
                              float (&v)[V]) {
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
      float qv[slice];
#pragma unroll
      for (int i = 0; i < traits::per_lane; ++i)
#pragma unroll
        for (int e = 0; e < traits::vec; e += 4) {
          const float4 x = q < nq ? *reinterpret_cast<const float4*>(q_tile + q * head_dim +
                                                                     (rank + i * traits::lanes) * traits::vec + e)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          qv[i * traits::vec + e] = x.x;
          qv[i * traits::vec + e + 1] = x.y;
          qv[i * traits::vec + e + 2] = x.z;
          qv[i * traits::vec + e + 3] = x.w;
        }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int x = 0; x < slice; ++x) acc = fmaf(qv[x], kf[r][x], acc);
        v[r * NQ + q] = acc;
      }
    }
    reduce_scatter<V, traits::lanes>(v, rank);
  }
  // The first value index a lane holds, and which lane holds index idx.
  __device__ static int first_held(int rank) {
    return traits::values >= traits::lanes ? rank * traits::held : rank / traits::copies;
  }
  __device__ static int holder(int idx) {
    return traits::values >= traits::lanes ? idx / traits::held : idx * traits::copies;
  }
};

// Tensor-core q.k for the fast paths when the queries are of the cache's
// 16-bit type (bf16 or fp16, as an engine's attention has them): a warp
// multiplies the tile's query heads (up to 16, zero-padded: the A operand
// of mma.sync.m16n8k16) with 8 keys (B) per round, head_dim / 16 mmas with
// fp32 accumulation, instead of ~130 FMAs and a reduce-scatter per lane.
// The products of two 16-bit values are exact in fp32, so the scores match
// the host's fp32 dot products within float rounding, as the FMA paths do.
//
// The k index is permuted so each lane loads 16 contiguous bytes of its key
// row at a time: lane (g = lane / 4, c = lane % 4) loads key g's elements
// [32p + 8c, 32p + 8c + 8) for p < head_dim / 32, and uses them as the B
// fragment of mma steps 2p (elements 0-3) and 2p + 1 (4-7); the queries'
// A fragments are built with the same permutation (both operands map
// logical k to the same element), once per query into shared memory. The
// layouts and the permutation are in detail/mma_layout.hpp, checked on the
// host by emulating the instruction (tests/host/mma_layout_test.cpp).
template <class T, class Q, int HeadDim>
struct mma_qk {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  static constexpr bool arch = false;  // mma.sync with bf16 needs sm_80
#else
  static constexpr bool arch = true;
#endif
  static constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  static constexpr bool available =
      arch && HeadDim > 0 && HeadDim % 32 == 0 && std::is_same_v<T, Q> && (bf16 || std::is_same_v<T, __half>);
  static constexpr int max_group = 16;          // query heads one m16 tile holds
  static constexpr int keys = 8;                // keys a warp scores per round (n8)
  static constexpr int steps = HeadDim / 16;    // mma k-steps
  static constexpr int pairs = HeadDim >= 32 ? HeadDim / 32 : 1;  // 16-byte loads per lane and key (1: unused)
  static constexpr int frag_vectors = steps * 32;  // uint4 A fragments: one per (step, lane)

  // Shared memory the kernel needs beyond the query tile (host and device agree).
  __host__ __device__ static constexpr std::size_t extra_shared_bytes(std::int32_t group) {
    return available && group <= max_group ? sizeof(uint4) * frag_vectors : 0;
  }

  __device__ static std::uint32_t pack(float lo, float hi) {
    if constexpr (bf16)
      return std::uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(lo))} |
             (std::uint32_t{__bfloat16_as_ushort(__float2bfloat16_rn(hi))} << 16);
    else
      return std::uint32_t{__half_as_ushort(__float2half_rn(lo))} |
             (std::uint32_t{__half_as_ushort(__float2half_rn(hi))} << 16);
  }
  // A fragments of every step for every lane, from the float query tile
  // (exact: the floats came from T), laid out by mma_layout. All threads of
  // the block.
  __device__ static void build_fragments(const float* q_tile, int group, int head_dim, uint4* frag) {
    namespace ml = mma_layout;
    for (int x = static_cast<int>(threadIdx.x); x < frag_vectors; x += static_cast<int>(blockDim.x)) {
      const int s = x / 32, lane = x % 32, g = lane / 4, c = lane % 4;
      // Register r: halves k = a_k(c, r, 0) and a_k(c, r, 1) of row a_row(g, r).
      auto reg = [&](int r) {
        const int row = ml::a_row(g, r);
        auto at = [&](int h) {
          return row < group ? q_tile[row * head_dim + ml::element_of(s, ml::a_k(c, r, h))] : 0.0f;
        };
        return pack(at(0), at(1));
      };
      frag[x] = make_uint4(reg(0), reg(1), reg(2), reg(3));
    }
  }
  // This lane's 16-byte loads of its key row (zeros without one): elements
  // [32p + 8c, + 8) for p < pairs (mma_layout::element_of).
  __device__ static void issue_keys(const T* krow, int c, uint4 (&raw)[pairs]) {
#pragma unroll
    for (int p = 0; p < pairs; ++p)
      raw[p] = krow != nullptr ? __ldg(reinterpret_cast<const uint4*>(krow) + p * 4 + c) : make_uint4(0u, 0u, 0u, 0u);
  }
  // d[r]: query head mma_layout::d_row(g, r) with key d_col(c, r), i.e.
  // d[0], d[1]: head g with keys 2c and 2c + 1; d[2], d[3]: head g + 8.
  __device__ static void scores(const uint4* frag, int lane, const uint4 (&raw)[pairs], float (&d)[4]) {
    d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
    for (int s = 0; s < steps; ++s) {
      const uint4 a = frag[s * 32 + lane];
      const std::uint32_t words[4] = {raw[s / 2].x, raw[s / 2].y, raw[s / 2].z, raw[s / 2].w};
      const std::uint32_t b0 = words[mma_layout::b_word(s, 0)], b1 = words[mma_layout::b_word(s, 1)];
      if constexpr (bf16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
      else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
    }
  }
};

// How the kernels read K rows, by row table: a plain cache's elements
// (row_table<T>) or a quantized cache's codes and parameters
// (quantized_rows). key_traits<Rows>::element sizes qk_traits' vectors;
// key_traits<Rows>::row is what a row pointer is.
template <class Rows>
struct key_traits;
template <class T>
struct key_traits<row_table<T>> {
  using element = T;
  using row = const T*;
};
template <>
struct key_traits<quantized_rows> {
  using element = std::uint8_t;  // 16 bytes of codes a vector
  using row = quantized_row;
};

template <class T>
__device__ inline const T* key_row(const row_table<T>& rows, std::int32_t b, std::int32_t h, std::int32_t t) {
  return rows.k_row(b, h, t);
}
__device__ inline quantized_row key_row(const quantized_rows& rows, std::int32_t b, std::int32_t h, std::int32_t t) {
  return {rows.codes.k_row(b, h, t), rows.params.k_row(b, h, t)};
}

// 16-byte vectors in a row (vectorised paths only).
template <class T>
__device__ inline int key_vectors(const row_table<T>&, int head_dim) {
  return head_dim / (16 / static_cast<int>(sizeof(T)));
}
__device__ inline int key_vectors(const quantized_rows& rows, int head_dim) {
  return rows.quantization.code_row_bytes(head_dim) / 16;
}

// Element d of a row as a float (scalar paths).
template <class T>
__device__ inline float key_element(const row_table<T>&, const T* k, int d) {
  return to_float(k[d]);
}
__device__ inline float key_element(const quantized_rows& rows, const quantized_row& k, int d) {
  return dequantize_element(k.codes, k.params, d, rows.quantization);
}

// acc[q] += the tile's query q . elements [x0, x0 + N) of the row, given as kf.
template <int N, int NQ>
__device__ inline void add_dots(const float (&kf)[N], int x0, const float* q_tile, int nq, int head_dim,
                                float (&acc)[NQ]) {
#pragma unroll
  for (int q = 0; q < NQ; ++q)
    if (q < nq) {
      const float* qv = q_tile + q * head_dim + x0;
#pragma unroll
      for (int e = 0; e < N; ++e) acc[q] = fmaf(qv[e], kf[e], acc[q]);
    }
}

// acc[q] += query q . the row's 16-byte vector v (vectorised paths).
template <int NQ, class T>
__device__ inline void add_vector_dots(const row_table<T>&, const T* k, int v, const float* q_tile, int nq,
                                       int head_dim, float (&acc)[NQ]) {
  constexpr int vec = 16 / static_cast<int>(sizeof(T));
  float kf[vec];
  unpack<T, vec>(__ldg(reinterpret_cast<const uint4*>(k) + v), kf);
  add_dots(kf, v * vec, q_tile, nq, head_dim, acc);
}
// A quantized row: 16 bytes of codes, dequantized as dequantize_element
// does (the same expressions, so the same values). A vector within one
// group (group_size a multiple of the elements a vector holds, the usual
// case) reads its parameters once; otherwise element by element.
template <int NQ>
__device__ inline void add_vector_dots(const quantized_rows& rows, const quantized_row& k, int v,
                                       const float* q_tile, int nq, int head_dim, float (&acc)[NQ]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(k.codes) + v);
  std::uint8_t c[16];
  __builtin_memcpy(c, &raw, sizeof(raw));
  const int gs = rows.quantization.group_size;
  if (rows.quantization.kind == quant_kind::int8) {
    const int x0 = v * 16, g0 = x0 / gs;
    float kf[16];
    if ((x0 + 15) / gs == g0) {
      const float scale = __ldg(k.params + g0);
#pragma unroll
      for (int e = 0; e < 16; ++e) kf[e] = scale * static_cast<float>(static_cast<std::int8_t>(c[e]));
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e)
        kf[e] = __ldg(k.params + (x0 + e) / gs) * static_cast<float>(static_cast<std::int8_t>(c[e]));
    }
    add_dots(kf, x0, q_tile, nq, head_dim, acc);
  } else {
    const int x0 = v * 32, g0 = x0 / gs;
    float kf[32];
    if ((x0 + 31) / gs == g0) {
      const float scale = __ldg(k.params + 2 * g0), zero = __ldg(k.params + 2 * g0 + 1);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        kf[2 * i] = scale * (static_cast<float>(c[i] & 0x0F) - zero);
        kf[2 * i + 1] = scale * (static_cast<float>(c[i] >> 4) - zero);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int g = (x0 + 2 * i) / gs;  // group_size is even: both nibbles share it
        const float scale = __ldg(k.params + 2 * g), zero = __ldg(k.params + 2 * g + 1);
        kf[2 * i] = scale * (static_cast<float>(c[i] & 0x0F) - zero);
        kf[2 * i + 1] = scale * (static_cast<float>(c[i] >> 4) - zero);
      }
    }
    add_dots(kf, x0, q_tile, nq, head_dim, acc);
  }
}

// Generic paths: one row a round; queries from shared memory.
template <class Rows, int HeadDim>
__device__ inline void generic_dots(const Rows& rows, const typename key_traits<Rows>::row& krow, bool valid,
                                    const float* q_tile, int nq, int head_dim, const lane_geometry& geo,
                                    float (&out)[qk_traits<typename key_traits<Rows>::element, HeadDim>::max_queries]) {
  using traits = qk_traits<typename key_traits<Rows>::element, HeadDim>;
  constexpr int NQ = traits::max_queries;
  float acc[NQ];
#pragma unroll
  for (int q = 0; q < NQ; ++q) acc[q] = 0.0f;
  if (valid) {
    if constexpr (traits::scalar) {
      for (int d = geo.rank; d < head_dim; d += geo.lanes) {
        const float k = key_element(rows, krow, d);
#pragma unroll
        for (int q = 0; q < NQ; ++q)
          if (q < nq) acc[q] = fmaf(q_tile[q * head_dim + d], k, acc[q]);
      }
    } else {
      const int nv = key_vectors(rows, head_dim);
      for (int v = geo.rank; v < nv; v += geo.lanes) add_vector_dots(rows, krow, v, q_tile, nq, head_dim, acc);
    }
  }
#pragma unroll
  for (int q = 0; q < NQ; ++q) out[q] = block::group_sum(acc[q], geo.lanes);
}

// Grid (chunks, kv_heads, batch); dynamic shared memory: group * head_dim floats.
// `Rows`: a row_table<T> of elements (every path) or quantized_rows (the
// generic paths, HeadDim 0 and -1).
template <class Policy, class Rows, class Q, int HeadDim>
__global__ void __launch_bounds__(qk_traits<typename key_traits<Rows>::element, HeadDim>::threads,
                                  qk_traits<typename key_traits<Rows>::element, HeadDim>::min_blocks)
    observe_queries_kernel(Policy policy, sequence_table seqs, Rows rows, std::int32_t head_dim,
                           eviction_state<memory_space::device> state, query_view<Q, memory_space::device> queries,
                           lse_view<memory_space::device> lse, float scale) {
  wait_for_first_kernel();  // launch.cuh: before any memory access
  using T = typename key_traits<Rows>::element;
  using KRow = typename key_traits<Rows>::row;
  using traits = qk_traits<T, HeadDim>;
  using fixed = fixed_qk<T, HeadDim>;
  static_assert(!traits::fixed || std::is_same_v<Rows, row_table<T>>, "the fast paths read elements");
  using Obs = typename Policy::observation;
  using Gqa = typename Policy::gqa;
  using History = typename Policy::history;
  using mma = mma_qk<T, Q, HeadDim>;
  constexpr int NQ = traits::max_queries;
  constexpr int R = traits::rows;
  // [group][head_dim]: this step's queries (read as float4); then, on the
  // tensor-core path, the A fragments (mma_qk::extra_shared_bytes).
  extern __shared__ __align__(16) float q_tile[];
  __shared__ float norm[host::max_group_size];
  // Per-warp normaliser parts of a tile's query heads (all of them on the
  // tensor-core path).
  constexpr int tile_heads = mma::available ? mma::max_group : NQ;
  __shared__ float warp_m[traits::warps][tile_heads], warp_s[traits::warps][tile_heads];

  const settings& cfg = policy.config;
  const auto b = static_cast<std::int32_t>(blockIdx.z), h = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t row = live_row(state, b);
  if (row < 0) return;
  const std::int32_t len = seqs.length(b), first = state.tracked[row], next = state.next_position[row];
  const std::int64_t step0 = state.step[row];
  // Ragged: this sequence's count (0: admission only); len 0: nothing at all.
  const std::int32_t q_len = queries.queries_of(b), group = queries.q_heads / state.shape.kv_heads;
  const bool given = lse.present();
  // Without the log-sum-exp the grid has one block a head: its chunk is the head.
  const slot_range mine = block_slots(len, qk_chunk_traits::min_chunk);
  const std::int32_t lo = mine.lo, hi = mine.hi;
  if (lo >= hi) {
    finish_block<true>(state, row, len, q_len);
    return;
  }

  for (std::int32_t t = (lo > first ? lo : first) + static_cast<std::int32_t>(threadIdx.x); t < hi;
       t += traits::threads)
    admit_slot<Obs>(cfg, rows, head_dim, state, b, row, h, t, first, next);

  lane_geometry geo;
  if constexpr (traits::fixed || traits::scalar) {
    geo.lanes = traits::lanes;
  } else {
    const int nv = key_vectors(rows, head_dim);
    geo.lanes = 1;
    while (geo.lanes * 2 <= (nv < 32 ? nv : 32)) geo.lanes *= 2;
  }
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  geo.rank = lane % geo.lanes;
  geo.group_in_warp = lane / geo.lanes;
  geo.group_lane0 = lane - geo.rank;
  geo.rows_per_warp = (32 / geo.lanes) * R;
  const std::int32_t rows_per_round = geo.rows_per_warp * traits::warps;

  // The R rows from t0 a lane group reads, those below `to` valid.
  auto rows_from = [&](std::int32_t t0, std::int32_t to, bool (&valid)[R], KRow (&krow)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      valid[r] = t0 + r < to;
      krow[r] = valid[r] ? key_row(rows, b, h, t0 + r) : KRow{};
    }
  };
  // Visits rows [from, to) in warp-uniform rounds: body(first row of the
  // lane's group, rows valid, row pointers).
  auto for_rows = [&](std::int32_t from, std::int32_t to, auto&& body) {
    for (std::int32_t base = from + warp * geo.rows_per_warp; base < to; base += rows_per_round) {
      const std::int32_t t0 = base + geo.group_in_warp * R;
      bool valid[R];
      KRow krow[R];
      rows_from(t0, to, valid, krow);
      body(t0, valid, krow);
    }
  };
  // Merges the warps' normaliser parts of tile heads [0, nq) (warp_m,
  // warp_s) into norm[g0 + q]. All threads of the block.
  auto merge_warps = [&](std::int32_t g0, int nq) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < nq) {
      block::softmax_acc all;
      for (int w = 0; w < traits::warps; ++w) {
        block::softmax_acc part;
        part.m = warp_m[w][threadIdx.x];
        part.s = warp_s[w][threadIdx.x];
        all = block::softmax_acc::merge(all, part);
      }
      norm[g0 + threadIdx.x] = all.m + logf(all.s);
    }
    __syncthreads();
  };
  // Merges every lane's normaliser for tile query q into norm[g0 + q].
  auto finish_normaliser = [&](block::softmax_acc (&acc)[NQ], std::int32_t g0, int nq) {
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
      const block::softmax_acc w = block::warp_merge(acc[q]);
      if (lane == 0) {
        warp_m[warp][q] = w.m;
        warp_s[warp][q] = w.s;
      }
    }
    merge_warps(g0, nq);
  };
  // The state update of slot t (index i, its score and observed count
  // already loaded) with its combined probability.
  auto record_loaded = [&](std::int64_t i, std::int32_t t, float score, float observed, float combined,
                           std::int64_t step, std::int32_t visible) {
    const float c = Obs::contribution(Gqa::finish(combined, group), visible, cfg);
    History::update(score, observed, state.ring_of(row, h, t), step, c, cfg, Obs::binary);
    state.scores[i] = score;
    state.observed[i] = observed;
  };
  auto record = [&](std::int32_t t, float combined, std::int64_t step, std::int32_t visible) {
    const std::int64_t i = state.row_index(row, h, t);
    record_loaded(i, t, state.scores[i], state.observed[i], combined, step, visible);
  };
  // Which ring word of a token the update of `step` reads and writes, for
  // a history policy that says (History::ring_word: sliding_window), else
  // -1; prefetch_history brings it to L1 ahead of the update.
  constexpr bool ring_word_known = requires(std::int64_t step) {
    { History::ring_word(step, cfg, Obs::binary) } -> std::same_as<std::int32_t>;
  };
  auto history_word = [&](std::int64_t step) -> std::int32_t {
    if constexpr (ring_word_known)
      return History::ring_word(step, cfg, Obs::binary);
    else
      return -1;
  };
  auto prefetch_history = [&](std::int32_t t, std::int32_t word) {
    if constexpr (ring_word_known) {
      const std::uint32_t* p = &state.ring_of(row, h, t)[word];
      asm volatile("prefetch.L1 [%0];" ::"l"(p));  // generic address: no space conversion
    }
  };

  // The tensor-core path (mma_qk) replaces the FMA fast path in the
  // instantiations where it is available; the launch sends a group too
  // large for it to the generic kernel, and sized shared memory for its
  // fragments (mma_qk::extra_shared_bytes).
  constexpr bool use_mma = mma::available;
  constexpr bool fma_fixed = traits::fixed && !use_mma;
  auto* a_frag = reinterpret_cast<uint4*>(q_tile + group * head_dim);
  const int mma_g = lane / 4, mma_c = lane % 4;  // the lane's query head (and + 8) and key pair
  uint4 mma_raw[use_mma ? mma::pairs : 1];
  // Loads key base + mma_g of a round (none at or past `to`).
  auto mma_issue = [&](std::int32_t base, std::int32_t to) {
    if constexpr (use_mma) {
      const std::int32_t t = base + mma_g;
      mma::issue_keys(t < to ? key_row(rows, b, h, t) : nullptr, mma_c, mma_raw);
    }
  };

  for (std::int32_t j = 0; j < q_len; ++j) {
    const std::int32_t visible = len - q_len + j + 1;
    __syncthreads();  // admission done; the previous step's tile is no longer read
    for (std::int32_t x = threadIdx.x; x < group * head_dim; x += traits::threads) {
      const std::int32_t g = x / head_dim;
      q_tile[x] = to_float(queries.row(b, h * group + g, j)[x - g * head_dim]);
    }
    if (given)
      for (std::int32_t g = threadIdx.x; g < group; g += traits::threads) norm[g] = lse.natural(b, h * group + g, j);
    __syncthreads();
    if constexpr (use_mma) {
      mma::build_fragments(q_tile, group, head_dim, a_frag);
      __syncthreads();
    }

    if (!given) {
      if constexpr (use_mma) {
        // The normaliser of every query head of the group over its visible
        // slots: lane (g, c) keeps heads g and g + 8 over keys 2c, 2c + 1.
        constexpr std::int32_t keys_per_round = mma::keys * traits::warps;
        block::softmax_acc acc_lo, acc_hi;
        mma_issue(warp * mma::keys, visible);
        for (std::int32_t base = warp * mma::keys; base < visible; base += keys_per_round) {
          float d[4];
          mma::scores(a_frag, lane, mma_raw, d);
          if (base + keys_per_round < visible) mma_issue(base + keys_per_round, visible);
          const std::int32_t t = base + 2 * mma_c;
          if (mma_g < group) {
            if (t < visible) acc_lo.add(d[0] * scale);
            if (t + 1 < visible) acc_lo.add(d[1] * scale);
          }
          if (mma_g + 8 < group) {
            if (t < visible) acc_hi.add(d[2] * scale);
            if (t + 1 < visible) acc_hi.add(d[3] * scale);
          }
        }
        // Merge the four lanes of each head, then the warps.
#pragma unroll
        for (int offset = 1; offset < 4; offset *= 2) {
          block::softmax_acc o;
          o.m = __shfl_xor_sync(block::full_mask, acc_lo.m, offset);
          o.s = __shfl_xor_sync(block::full_mask, acc_lo.s, offset);
          acc_lo = block::softmax_acc::merge(acc_lo, o);
          o.m = __shfl_xor_sync(block::full_mask, acc_hi.m, offset);
          o.s = __shfl_xor_sync(block::full_mask, acc_hi.s, offset);
          acc_hi = block::softmax_acc::merge(acc_hi, o);
        }
        if (mma_c == 0) {
          warp_m[warp][mma_g] = acc_lo.m;
          warp_s[warp][mma_g] = acc_lo.s;
          warp_m[warp][mma_g + 8] = acc_hi.m;
          warp_s[warp][mma_g + 8] = acc_hi.s;
        }
        merge_warps(0, group);
      } else {
        // The normaliser of each query head over its visible slots.
        for (std::int32_t g0 = 0; g0 < group; g0 += NQ) {
          const int nq = group - g0 < NQ ? group - g0 : NQ;
          const float* tile = q_tile + g0 * head_dim;
          block::softmax_acc acc[NQ];
          if constexpr (fma_fixed) {
            const int first_idx = fixed::first_held(geo.rank);
            for_rows(0, visible, [&](std::int32_t t0, const bool(&valid)[R], const KRow(&krow)[R]) {
              float kf[R][fixed::slice];
              fixed::load_rows(krow, valid, geo.rank, kf);
              float v[traits::values];
              fixed::dots(kf, tile, nq, head_dim, geo.rank, v);
              if (geo.rank % traits::copies == 0)  // one copy of each value counts
#pragma unroll
                for (int i = 0; i < traits::held; ++i) {
                  const int idx = first_idx + i, r = idx / NQ, q = idx % NQ;
#pragma unroll
                  for (int qq = 0; qq < NQ; ++qq)  // static register index
                    if (qq == q && q < nq && t0 + r < visible) acc[qq].add(v[i] * scale);
                }
            });
          } else {
            for_rows(0, visible, [&](std::int32_t, const bool(&valid)[R], const KRow(&krow)[R]) {
              float d[NQ];
              generic_dots<Rows, HeadDim>(rows, krow[0], valid[0], tile, nq, head_dim, geo, d);
              if (geo.rank == 0 && valid[0])
#pragma unroll
                for (int q = 0; q < NQ; ++q)
                  if (q < nq) acc[q].add(d[q] * scale);
            });
          }
          finish_normaliser(acc, g0, nq);
        }
      }
    }

    const std::int32_t end = hi < visible ? hi : visible;
    if (end <= lo) continue;
    const std::int64_t step = step0 + j;
    if constexpr (use_mma) {
      // A warp scores 8 keys a round: lane (g, c) loads key g and gets the
      // probabilities of heads g and g + 8 with keys 2c and 2c + 1; lanes
      // g = 0 and g = 1 then record keys 2c and 2c + 1, the group combined
      // in head order. Pipelined as the FMA path below.
      const int g = mma_g, c = mma_c;
      const float norm_lo = g < group ? norm[g] : 0.0f, norm_hi = g + 8 < group ? norm[g + 8] : 0.0f;
      const std::int32_t word = history_word(step);
      constexpr std::int32_t keys_per_round = mma::keys * traits::warps;
      mma_issue(lo + warp * mma::keys, end);
      for (std::int32_t base = lo + warp * mma::keys; base < end; base += keys_per_round) {
        const std::int32_t mine = base + 2 * c + (g & 1);  // the slot lanes g < 2 record
        const bool records = g < 2 && mine < end;
        std::int64_t at = 0;
        float score = 0.0f, observed = 0.0f;
        if (records) {
          at = state.row_index(row, h, mine);
          score = state.scores[at];
          observed = state.observed[at];
          prefetch_history(mine, word);
        }
        float d[4];
        mma::scores(a_frag, lane, mma_raw, d);
        if (base + keys_per_round < end) mma_issue(base + keys_per_round, end);
        const float p0 = g < group ? expf(d[0] * scale - norm_lo) : 0.0f;
        const float p1 = g < group ? expf(d[1] * scale - norm_lo) : 0.0f;
        const float p2 = g + 8 < group ? expf(d[2] * scale - norm_hi) : 0.0f;
        const float p3 = g + 8 < group ? expf(d[3] * scale - norm_hi) : 0.0f;
        float combined = Gqa::identity();
        for (std::int32_t q = 0; q < group; ++q) {  // uniform
          const int src = (q % 8) * 4 + c;
          const float x0 = __shfl_sync(block::full_mask, q < 8 ? p0 : p2, src);
          const float x1 = __shfl_sync(block::full_mask, q < 8 ? p1 : p3, src);
          combined = Gqa::combine(combined, (g & 1) != 0 ? x1 : x0);
        }
        if (records) record_loaded(at, mine, score, observed, combined, step, visible);
      }
    } else if constexpr (fma_fixed) {
      const int first_idx = fixed::first_held(geo.rank);
      // Software pipeline: the K rows of the next round are loaded while
      // this round's are multiplied, and the state a lane records is loaded
      // with them, so a round waits on at most one memory latency, and
      // usually none (before, a round waited on K, then on the state).
      typename fixed::packed_rows raw;
      auto issue = [&](std::int32_t t0) {
        bool valid[R];
        KRow krow[R];
        rows_from(t0, end, valid, krow);
        fixed::issue_rows(krow, valid, geo.rank, raw);
      };
      const std::int32_t word = history_word(step);
      const std::int32_t first_t0 = lo + warp * geo.rows_per_warp + geo.group_in_warp * R;
      issue(first_t0);
      // Warp-uniform rounds (base), so the shuffles never diverge.
      for (std::int32_t base = lo + warp * geo.rows_per_warp, t0 = first_t0; base < end;
           base += rows_per_round, t0 += rows_per_round) {
        const bool records = geo.rank < R && t0 + geo.rank < end;  // lane rank < R: row t0 + rank
        std::int64_t at = 0;  // the recorded slot's token index
        float score = 0.0f, observed = 0.0f;
        if (records) {
          at = state.row_index(row, h, t0 + geo.rank);
          score = state.scores[at];
          observed = state.observed[at];
          prefetch_history(t0 + geo.rank, word);
        }
        float kf[R][fixed::slice];
        fixed::unpack_rows(raw, kf);
        if (base + rows_per_round < end) issue(t0 + rows_per_round);
        float combined = Gqa::identity();
        for (std::int32_t g0 = 0; g0 < group; g0 += NQ) {
          const int nq = group - g0 < NQ ? group - g0 : NQ;
          float v[traits::values];
          fixed::dots(kf, q_tile + g0 * head_dim, nq, head_dim, geo.rank, v);
          float p[traits::held];
#pragma unroll
          for (int i = 0; i < traits::held; ++i) {
            const int q = (first_idx + i) % NQ;
            p[i] = q < nq ? expf(v[i] * scale - norm[g0 + q]) : 0.0f;
          }
          // Row `rank`'s probabilities, gathered in head order.
          const int my_row = geo.rank < R ? geo.rank : 0;
#pragma unroll
          for (int q = 0; q < NQ; ++q) {
            if (q >= nq) break;  // uniform
            const int idx = my_row * NQ + q;
            const int src = geo.group_lane0 + fixed::holder(idx);
            float mine = 0.0f;
#pragma unroll
            for (int i = 0; i < traits::held; ++i) {
              const float x = __shfl_sync(block::full_mask, p[i], src);
              if (i == idx - fixed::first_held(fixed::holder(idx))) mine = x;
            }
            combined = Gqa::combine(combined, mine);
          }
        }
        if (records) record_loaded(at, t0 + geo.rank, score, observed, combined, step, visible);
      }
    } else {
      for_rows(lo, end, [&](std::int32_t t0, const bool (&valid)[R], const KRow (&krow)[R]) {
        float combined = Gqa::identity();
        for (std::int32_t g0 = 0; g0 < group; g0 += NQ) {
          const int nq = group - g0 < NQ ? group - g0 : NQ;
          float d[NQ];
          generic_dots<Rows, HeadDim>(rows, krow[0], valid[0], q_tile + g0 * head_dim, nq, head_dim, geo, d);
#pragma unroll
          for (int q = 0; q < NQ; ++q)
            if (q < nq) combined = Gqa::combine(combined, expf(d[q] * scale - norm[g0 + q]));
        }
        if (geo.rank == 0 && valid[0]) record(t0, combined, step, visible);
      });
    }
  }
  finish_block<true>(state, row, len, q_len);
}

}  // namespace scissorhands::cuda::detail
