#pragma once
// Host backend, step 1-2: admit the tokens the engine appended and record
// what this step's attention says about every cached token.
//
// observe_probabilities: the engine hands over attention probabilities.
// observe_queries: the library recomputes them from the queries and the
//   cached keys, with the attention kernel's log-sum-exp when given (one read
//   of K per query) or its own online normaliser (two reads).
// Both admit new tokens first (slots tracked..length-1 get the next
// positions); with a static observation policy (key_norm, recency,
// random_score) that is all they do. Neither allocates; both validate every
// argument, data included, before writing anything.
//
// Continuous batching: the state is seen through the step's batch
// (state.for_batch(state_rows)); a sequence with no cached token (a padding
// slot, or row -1) is skipped, and one with no query this step (ragged
// qo_indptr, q_len(b) = 0) only has its new tokens admitted.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "../attention_view.hpp"
#include "../detail/validate.hpp"
#include "plan.hpp"
#include "../element.hpp"
#include "../eviction_state.hpp"
#include "../kv_view.hpp"
#include "../paged_kv_view.hpp"
#include "../quantized_kv_view.hpp"
#include "../token_table_view.hpp"
#include "../policy/eviction_policy.hpp"

namespace scissorhands::host {

// Queries per KV head above which observe refuses (keeps per-query scratch on the stack).
inline constexpr std::int32_t max_group_size = 128;

namespace detail {
using namespace scissorhands::detail;

// Each query head's natural log-normaliser for query j of sequence b: the
// engine's LSE when given; otherwise an online log-sum-exp that
// `accumulate(run_max, run_sum)` folds every visible key's logit into.
template <class Lse, class Accumulate>
void query_normalisers(const Lse& lse, std::int32_t b, std::int32_t first_head, std::int32_t group, std::int32_t j,
                       float* norm, Accumulate&& accumulate) {
  if (lse.present()) {
    for (std::int32_t g = 0; g < group; ++g) norm[g] = lse.natural(b, first_head + g, j);
    return;
  }
  float run_max[max_group_size];
  float run_sum[max_group_size];
  for (std::int32_t g = 0; g < group; ++g) {
    run_max[g] = -std::numeric_limits<float>::infinity();
    run_sum[g] = 0.0f;
  }
  accumulate(run_max, run_sum);
  for (std::int32_t g = 0; g < group; ++g) norm[g] = run_max[g] + std::log(run_sum[g]);
}

// Float order as a signed integer order (NaN excluded): the bits of a
// negative float count down as it grows, so they are flipped.
constexpr std::int32_t ordered_bits(std::int32_t bits) { return bits ^ ((bits >> 31) & 0x7FFFFFFF); }
// mask ? a : b (mask all ones or all zeros) on the bits: no float
// comparison or branch, which the compiler would not vectorise without
// -fno-trapping-math.
inline float pick(std::int32_t mask, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(a) & mask) | (std::bit_cast<std::int32_t>(b) & ~mask));
}

// exp(x) for the recomputed probabilities: Cephes' single-precision
// polynomial after a two-part ln 2 range reduction (a few ulp), branch-free
// so that a loop of it vectorises (at -O2 too). Below -87.33 (where exp
// leaves the normal floats) it gives 0, above 88.7 +inf; NaN stays NaN.
// Every test on x is an integer test of its bits, and n is rounded by
// adding 1.5 * 2^23 and read from the bits, so no NaN is ever converted to
// an integer (undefined behaviour; found by the fuzz harness) and
// -ffast-math cannot fold the rounding away.
inline float exp_approx(float x) {
  constexpr float lo = -87.33654f, hi = 88.7f;
  const auto bits = std::bit_cast<std::int32_t>(x);
  const std::int32_t nan = -static_cast<std::int32_t>((bits & 0x7FFFFFFF) > 0x7F800000);
  const std::int32_t key = ordered_bits(bits);
  const std::int32_t below = ~nan & -static_cast<std::int32_t>(key < ordered_bits(std::bit_cast<std::int32_t>(lo)));
  const std::int32_t above = ~nan & -static_cast<std::int32_t>(key > ordered_bits(std::bit_cast<std::int32_t>(hi)));
  const float c = pick(nan, 0.0f, pick(below, lo, pick(above, hi, x)));
  const float v = c * 1.44269504088896341f;
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: the sum's low bits hold v rounded to an integer
  const std::int32_t n_int = std::bit_cast<std::int32_t>(v + round_magic) - std::bit_cast<std::int32_t>(round_magic);
  const auto n = static_cast<float>(n_int);
  const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * r) * r + r + 1.0f;
  const float y = e * std::bit_cast<float>((n_int + 127) << 23);
  return pick(nan, x, pick(below, 0.0f, pick(above, std::numeric_limits<float>::infinity(), y)));
}

// a . b over d floats: eight partial sums in a fixed order, so the loop
// vectorises without -ffast-math and gives the same bits on every ISA that
// does not contract to FMA.
inline float dot_lanes(const float* __restrict a, const float* __restrict b, std::int32_t d) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::int32_t x = 0;
  for (; x + 8 <= d; x += 8)
    for (std::int32_t i = 0; i < 8; ++i) acc[i] += a[x + i] * b[x + i];
  float tail = 0.0f;
  for (; x < d; ++x) tail += a[x] * b[x];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + tail;
}

// dot_lanes of four rows of `a` (d floats apart) with each of `Keys` rows
// b[k]: out[4 * k + n] = dot_lanes(a row n, b[k]), the same products summed
// in the same order (bit for bit on an ISA without FMA; with one, the
// compiler may contract the two functions' multiply-adds differently).
// keys_at_a_time is what the ISA's registers hold: with AVX, two keys, so
// each chunk of a row of `a` is loaded once for both and each chunk of a
// key once for the four rows (six loads per eight multiply-adds, which
// then set the pace), the lanes reduced a transpose at a time; with SSE
// one. Written with GCC/Clang vector types, since the auto-vectoriser
// spills or shuffles this shape; elsewhere dot_lanes per pair.
#if defined(__AVX__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
using lanes8 = float __attribute__((vector_size(32)));
using lanes4 = float __attribute__((vector_size(16)));
// Vectors of 8 pass by reference: by value, a 32-byte vector changes the
// calling convention between AVX and non-AVX translation units (-Wpsabi).
inline void load_lanes8(lanes8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
// ((c0 + c4) + (c1 + c5)) + ((c2 + c6) + (c3 + c7)) of four lane sets,
// one per result lane (dot_lanes' order).
inline lanes4 reduce_lanes_4(const lanes8& s0, const lanes8& s1, const lanes8& s2, const lanes8& s3) {
  const lanes8 t01 = __builtin_shufflevector(s0, s1, 0, 8, 1, 9, 4, 12, 5, 13);   // a0 b0 a1 b1 | a4 b4 a5 b5
  const lanes8 t23 = __builtin_shufflevector(s0, s1, 2, 10, 3, 11, 6, 14, 7, 15);  // a2 b2 a3 b3 | a6 b6 a7 b7
  const lanes8 u01 = __builtin_shufflevector(s2, s3, 0, 8, 1, 9, 4, 12, 5, 13);
  const lanes8 u23 = __builtin_shufflevector(s2, s3, 2, 10, 3, 11, 6, 14, 7, 15);
  const lanes8 c0 = __builtin_shufflevector(t01, u01, 0, 1, 8, 9, 4, 5, 12, 13);  // lane 0 | lane 4 of each set
  const lanes8 c1 = __builtin_shufflevector(t01, u01, 2, 3, 10, 11, 6, 7, 14, 15);
  const lanes8 c2 = __builtin_shufflevector(t23, u23, 0, 1, 8, 9, 4, 5, 12, 13);
  const lanes8 c3 = __builtin_shufflevector(t23, u23, 2, 3, 10, 11, 6, 7, 14, 15);
  const auto pair = [](const lanes8& c) {
    return __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
  };
  return (pair(c0) + pair(c1)) + (pair(c2) + pair(c3));
}
// Two keys: sixteen vector registers of eight floats.
inline constexpr std::int32_t keys_at_a_time = 2;
template <std::int32_t Keys>
inline void dot_lanes_4(const float* __restrict a, const float* const* b, std::int32_t d, float* __restrict out) {
  static_assert(Keys == 1 || Keys == 2, "one or two keys at a time (sixteen vector registers)");
  const float* a0 = a;
  const float* a1 = a0 + d;
  const float* a2 = a1 + d;
  const float* a3 = a2 + d;
  const float* b0 = b[0];
  const float* b1 = b[Keys - 1];
  // Named accumulators, not an array: an array is zeroed in memory first.
  lanes8 s00 = {}, s01 = {}, s02 = {}, s03 = {}, s10 = {}, s11 = {}, s12 = {}, s13 = {};
  std::int32_t x = 0;
  for (; x + 8 <= d; x += 8) {
    lanes8 q0, q1, q2, q3, k0;
    load_lanes8(q0, a0 + x);
    load_lanes8(q1, a1 + x);
    load_lanes8(q2, a2 + x);
    load_lanes8(q3, a3 + x);
    load_lanes8(k0, b0 + x);
    s00 += q0 * k0;
    s01 += q1 * k0;
    s02 += q2 * k0;
    s03 += q3 * k0;
    if constexpr (Keys == 2) {
      lanes8 k1;
      load_lanes8(k1, b1 + x);
      s10 += q0 * k1;
      s11 += q1 * k1;
      s12 += q2 * k1;
      s13 += q3 * k1;
    }
  }
  const auto finish = [&](const float* bk, const lanes8& t0, const lanes8& t1, const lanes8& t2, const lanes8& t3,
                          float* o) {
    // Scalar tails, as in dot_lanes: the compiler contracts them to fma
    // alike (a vector's element updates it may not).
    float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f, r3 = 0.0f;
    for (std::int32_t y = x; y < d; ++y) {
      r0 += a0[y] * bk[y];
      r1 += a1[y] * bk[y];
      r2 += a2[y] * bk[y];
      r3 += a3[y] * bk[y];
    }
    const lanes4 tail = {r0, r1, r2, r3};
    const lanes4 sum = reduce_lanes_4(t0, t1, t2, t3) + tail;
    std::memcpy(o, &sum, sizeof sum);
  };
  finish(b0, s00, s01, s02, s03, out);
  if constexpr (Keys == 2) finish(b1, s10, s11, s12, s13, out + 4);
}
#elif defined(__GNUC__) || defined(__clang__)
// 16-byte vectors (SSE): eight floats take two registers, so one key at a
// time (two would need 32) and the lanes reduced per row.
inline constexpr std::int32_t keys_at_a_time = 1;
using lanes4 = float __attribute__((vector_size(16)));
inline lanes4 load_lanes4(const float* p) {
  lanes4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void dot_lanes_4_one(const float* __restrict a, const float* __restrict k, std::int32_t d,
                            float* __restrict out) {
  const float* a0 = a;
  const float* a1 = a0 + d;
  const float* a2 = a1 + d;
  const float* a3 = a2 + d;
  // lo: lanes 0-3 of dot_lanes' eight partial sums, hi: lanes 4-7.
  lanes4 lo0 = {}, hi0 = {}, lo1 = {}, hi1 = {}, lo2 = {}, hi2 = {}, lo3 = {}, hi3 = {};
  std::int32_t x = 0;
  for (; x + 8 <= d; x += 8) {
    const lanes4 kl = load_lanes4(k + x), kh = load_lanes4(k + x + 4);
    lo0 += load_lanes4(a0 + x) * kl;
    hi0 += load_lanes4(a0 + x + 4) * kh;
    lo1 += load_lanes4(a1 + x) * kl;
    hi1 += load_lanes4(a1 + x + 4) * kh;
    lo2 += load_lanes4(a2 + x) * kl;
    hi2 += load_lanes4(a2 + x + 4) * kh;
    lo3 += load_lanes4(a3 + x) * kl;
    hi3 += load_lanes4(a3 + x + 4) * kh;
  }
  const auto finish = [&](lanes4 lo, lanes4 hi, const float* row) {
    const lanes4 pair = lo + hi;  // (c0 + c4), (c1 + c5), (c2 + c6), (c3 + c7)
    float tail = 0.0f;
    for (std::int32_t y = x; y < d; ++y) tail += row[y] * k[y];
    return ((pair[0] + pair[1]) + (pair[2] + pair[3])) + tail;
  };
  out[0] = finish(lo0, hi0, a0);
  out[1] = finish(lo1, hi1, a1);
  out[2] = finish(lo2, hi2, a2);
  out[3] = finish(lo3, hi3, a3);
}
template <std::int32_t Keys>
inline void dot_lanes_4(const float* a, const float* const* b, std::int32_t d, float* out) {
  for (std::int32_t k = 0; k < Keys; ++k) dot_lanes_4_one(a, b[k], d, out + std::ptrdiff_t{4} * k);
}
#else
inline constexpr std::int32_t keys_at_a_time = 1;
template <std::int32_t Keys>
inline void dot_lanes_4(const float* a, const float* const* b, std::int32_t d, float* out) {
  for (std::int32_t k = 0; k < Keys; ++k)
    for (std::int32_t n = 0; n < 4; ++n) out[4 * k + n] = dot_lanes(a + static_cast<std::ptrdiff_t>(n) * d, b[k], d);
}
#endif

// Asks for a row's cache lines ahead of use (a hint; no-op elsewhere).
inline void prefetch_row(const void* row, std::int32_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const auto* p = static_cast<const char*>(row);
  for (std::int32_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
#else
  (void)row, (void)bytes;
#endif
}

// Whether row[0 .. n) are all in [0, 1.001] (-0 included; NaN and negatives
// not): observe_probabilities' check of every probability before it writes.
// Float comparisons in vector types, which the auto-vectoriser would not
// emit under -ftrapping-math; the tail tests the bits, branch-free.
inline bool all_probabilities(const float* __restrict row, std::int32_t n) {
  constexpr float most = 1.001f;
  std::int32_t t = 0;
#if defined(__GNUC__) || defined(__clang__)
#if defined(__AVX__)
  constexpr std::int32_t width = 8;
#else
  constexpr std::int32_t width = 4;
#endif
  using lanes = float __attribute__((vector_size(4 * width)));
  using mask = std::int32_t __attribute__((vector_size(4 * width)));
  const lanes zero = {};
  const lanes top = zero + most;
  // Two vectors an iteration: the loop is a load and four operations a
  // vector, so one a time leaves the load ports idle.
  mask ok = zero <= top;  // all ones (not ~mask{}: nvcc's front end rejects it)
  mask ok2 = ok;
  for (; t + 2 * width <= n; t += 2 * width) {
    lanes v, v2;
    std::memcpy(&v, row + t, sizeof v);
    std::memcpy(&v2, row + t + width, sizeof v2);
    ok &= (v >= zero) & (v <= top);
    ok2 &= (v2 >= zero) & (v2 <= top);
  }
  for (; t + width <= n; t += width) {
    lanes v;
    std::memcpy(&v, row + t, sizeof v);
    ok &= (v >= zero) & (v <= top);
  }
  ok &= ok2;
  std::int32_t all = -1;
  for (std::int32_t i = 0; i < width; ++i) all &= ok[i];
  if (all == 0) return false;
#endif
  constexpr std::uint32_t most_bits = std::bit_cast<std::uint32_t>(most), minus_zero = 0x80000000u;
  std::uint32_t valid = 1;
  for (; t < n; ++t) {
    const auto x = std::bit_cast<std::uint32_t>(row[t]);
    valid &= (x <= most_bits) | (x == minus_zero);
  }
  return valid != 0;
}

// Scratch of observe_queries' blocked path, on the stack: the group's
// queries as floats (group x head_dim), one key row as floats, and a tile
// of logits (group x tile tokens).
inline constexpr std::int32_t query_scratch_floats = 4096;
inline constexpr std::int32_t key_scratch_floats = 512;
inline constexpr std::int32_t logit_tile = 16;
// Without the log-sum-exp the blocked path needs every logit twice (the
// normaliser, then the probabilities): it keeps them on the stack when
// group x visible tokens fit, so K is read and multiplied once; beyond
// that it computes them again.
inline constexpr std::int32_t logit_cache_floats = 8192;
// Slots observe_probabilities combines and records at a time (on the stack).
inline constexpr std::int32_t record_tile = 256;

// `values`: whether the call reads or moves V (an observe call does not,
// and then a kv_view's or paged_kv_view's V may be absent).
template <class T>
void validate_cache(const char* fn, const kv_view<T, memory_space::host>& cache, bool values = true) {
  validate_shape(fn, cache, values);
}
template <class T>
void validate_cache(const char* fn, const paged_kv_view<T, memory_space::host>& cache, bool values = true) {
  validate_shape(fn, cache, values);
  validate_page_table(fn, cache);
}
inline void validate_cache(const char* fn, const token_table_view<memory_space::host>& cache, bool = true) {
  validate_shape(fn, cache);
  validate_page_table(fn, cache);
}
template <class Codes>
void validate_cache(const char* fn, const quantized_kv_view<Codes>& cache, bool = true) {
  static_assert(Codes::space == memory_space::host, "the host backend needs a host view");
  require(cache.head_dim <= key_scratch_floats, fn, "cache.head_dim", "must be at most ", key_scratch_floats,
          " for a quantized cache (a K row is dequantized on the stack), got ", cache.head_dim);
  validate_shape(fn, cache);
  if constexpr (quantized_kv_view<Codes>::paged) validate_page_table(fn, cache.codes());
}

// The K rows a call reads as floats: a float row is used in place, any
// other element type converted into `scratch`, a quantized row
// dequantized into it (scratch holds head_dim floats).
template <class View>
inline const float* key_as_float(const View& cache, std::int32_t b, std::int32_t h, std::int32_t t, float* scratch) {
  if constexpr (is_quantized_view_v<View>) {
    cache.dequantize_k(b, h, t, scratch);
    return scratch;
  } else {
    using T = typename View::element_type;
    const T* k = cache.k_row(b, h, t);
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
      return k;
    } else if constexpr (is_binary16_v<std::remove_const_t<T>>) {
      binary16_to_float(k, cache.head_dim, scratch);  // eight at a time with F16C
      return scratch;
    } else {
      for (std::int32_t x = 0; x < cache.head_dim; ++x) scratch[x] = to_float(k[x]);
      return scratch;
    }
  }
}

// A quantized cache's K parameters of slots [first(b), len) of every
// sequence b must be finite before a call reads them: a NaN scale would
// turn every logit of the row into NaN. Slot-wise first(b): observe from
// queries reads every held row, the static scorers the new ones.
template <class View, class First>
void validate_key_params(const char* fn, const View& cache, First&& first) {
  if constexpr (is_quantized_view_v<View>) {
    const std::int32_t n = cache.params_per_row();
    for (std::int32_t b = 0; b < cache.batch; ++b) {
      const std::int32_t len = cache.length(b);
      for (std::int32_t h = 0; h < cache.kv_heads; ++h)
        for (std::int32_t t = first(b); t < len; ++t) {
          const float* p = cache.k_params_row(b, h, t);
          bool finite = true;
          for (std::int32_t i = 0; i < n; ++i) finite &= std::isfinite(p[i]);
          if (finite) [[likely]]
            continue;
          std::int32_t i = 0;
          while (std::isfinite(p[i])) ++i;
          fail(fn, "cache.k_params", "value ", i, " of (sequence ", b, ", head ", h, ", slot ", t,
               ") must be finite, got ", p[i]);
        }
    }
  }
}

// The state rows a batch maps to must be in range and distinct (-1: a
// padding slot, which must hold no token). Distinctness is checked with
// one mark per row in the host state's status words (scratch on the host,
// zero between calls), so the check allocates nothing and is O(batch).
template <class View>
void validate_rows(const char* fn, const View& cache, const eviction_state<memory_space::host>& state) {
  if (state.state_rows.data() == nullptr) return;  // row b for position b: distinct by construction
  std::int32_t stop = cache.batch, bad = -1, duplicate = -1;
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t r = state.state_rows[b];
    if (r < -1 || r >= state.shape.rows) {
      bad = b;
      stop = b;
      break;
    }
    if (r < 0) continue;
    if (state.status[r] != 0) {
      duplicate = b;
      stop = b;
      break;
    }
    state.status[r] = 1;
  }
  for (std::int32_t b = 0; b < stop; ++b)
    if (state.state_rows[b] >= 0) state.status[state.state_rows[b]] = 0;
  require(bad < 0, fn, "state.state_rows", "[", bad, "] = ", bad < 0 ? 0 : state.state_rows[bad],
          " must be -1 (padding) or a row in [0, shape.rows = ", state.shape.rows, ")");
  require(duplicate < 0, fn, "state.state_rows", "[", duplicate, "] = ",
          duplicate < 0 ? 0 : state.state_rows[duplicate],
          " is the row of an earlier batch position too: each sequence needs its own row");
}

// Everything observe and compress check before touching memory: the cache,
// the settings, the state and its rows, and per sequence
// 0 <= tracked <= length <= capacity (the cache's and the state's).
template <class Policy, class View>
void validate_common(const char* fn, const Policy& policy, const View& cache,
                     const eviction_state<memory_space::host>& state, bool values = true) {
  validate_cache(fn, cache, values);
  validate_settings(fn, policy);
  validate_state_matches(fn, policy, cache, state);
  validate_rows(fn, cache, state);
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t len = cache.length(b);
    require(len >= 0 && len <= cache.capacity_of(b), fn, "cache length", "of sequence ", b, " must be in [0, ",
            cache.capacity_of(b), "], got ", len);
    const std::int32_t r = state.row(b);
    if (r < 0) {
      require(len == 0, fn, "state.state_rows", "[", b, "] is -1 (a padding slot) but sequence ", b, " holds ", len,
              " tokens");
      continue;
    }
    require(len <= state.shape.capacity, fn, "state.shape.capacity", "is ", state.shape.capacity,
            " slots but sequence ", b, " holds ", len,
            " tokens: size it with state_capacity_for(budget, tokens appended between compress calls)");
    require(state.tracked[r] >= 0 && state.tracked[r] <= len, fn, "cache length", "of sequence ", b, " is ", len,
            ", below the ", state.tracked[r], " tokens its state row ", r,
            " tracks. Likely causes: tokens were removed without compress (roll back only before observing), "
            "state_rows maps the sequence to another request's row, or the row was reused without reset_sequence");
    require(state.next_position[r] >= 0 &&
                std::int64_t{state.next_position[r]} + (len - state.tracked[r]) <= std::numeric_limits<std::int32_t>::max(),
            fn, "state.next_position", "[", r, "] = ", state.next_position[r], " leaves no int32 position for ",
            len - state.tracked[r], " new tokens");
    // Steps index the history ring (step mod window): a negative one would
    // write before it, one near INT64_MAX would overflow when q_len is added.
    require(state.step[r] >= 0 && state.step[r] <= (std::int64_t{1} << 62), fn, "state.step", "[", r, "] = ",
            state.step[r], " must be in [0, 2^62]: the state is damaged (reset_sequence to start over)");
  }
}

// A static observation's score of K row (b, h, t); a quantized row is
// scored on its dequantized values.
template <class Obs, class View>
inline float static_score_of(const View& cache, std::int32_t b, std::int32_t h, std::int32_t t,
                             std::int32_t position, const settings& cfg) {
  if constexpr (is_quantized_view_v<View>) {
    float k[key_scratch_floats];
    cache.dequantize_k(b, h, t, k);
    return Obs::static_score(static_cast<const float*>(k), cache.head_dim, position, h, cfg);
  } else if constexpr (!kv_rows_view<View>) {
    // No K to read: only an observation that reads none gets here (admit).
    return Obs::static_score(static_cast<const float*>(nullptr), 0, position, h, cfg);
  } else {
    return Obs::static_score(cache.k_row(b, h, t), cache.head_dim, position, h, cfg);
  }
}

// Before admit: a static scorer reads the new K rows, whose quantization
// parameters must then be finite.
template <class Policy, class View>
void validate_new_key_params(const char* fn, const View& cache, const eviction_state<memory_space::host>& state) {
  if constexpr (!Policy::observation::needs_attention)
    validate_key_params(fn, cache, [&](std::int32_t b) {
      const std::int32_t r = state.row(b);
      return r < 0 ? cache.length(b) : state.tracked[r];
    });
}

// Gives the new tokens of every sequence their positions and fresh state.
template <class Policy, class View>
void admit(const Policy& policy, const View& cache, const eviction_state<memory_space::host>& state) {
  using Obs = typename Policy::observation;
  static_assert(kv_rows_view<View> || !observation_reads_keys<Obs>,
                "this policy's observation (key_norm, ...) scores each token from its K row when admitting it, and "
                "a token_table_view holds no K/V: pass a kv_view or paged_kv_view, or use an observation that "
                "reads no keys (attention, recency, random_score)");
  const std::int32_t words = state.shape.ring_words;
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t r = state.row(b);
    if (r < 0) continue;
    const std::int32_t first = state.tracked[r];
    const std::int32_t len = cache.length(b);
    for (std::int32_t h = 0; h < cache.kv_heads; ++h) {
      for (std::int32_t t = first; t < len; ++t) {
        const std::int64_t i = state.row_index(r, h, t);
        const std::int32_t position = state.next_position[r] + (t - first);
        state.positions[i] = position;
        if constexpr (Obs::needs_attention)
          state.scores[i] = 0.0f;
        else
          state.scores[i] = static_score_of<Obs>(cache, b, h, t, position, policy.config);
        state.observed[i] = 0.0f;
      }
      // The ring is word-major: each word of the new slots is one run.
      std::uint32_t* ring = state.ring_of_head(r, h);
      for (std::int32_t w = 0; w < words && first < len; ++w)
        std::memset(ring + std::int64_t{w} * state.shape.capacity + first, 0,
                    sizeof(std::uint32_t) * static_cast<std::size_t>(len - first));
    }
    state.next_position[r] += len - first;
    state.tracked[r] = len;
  }
}

// acc[u] = Gqa::combine(... Gqa::combine(acc[u], p[0][u]) ..., p[Rows - 1][u])
// for u < n, the rows in order, acc read as Gqa::identity() when Start:
// the same bits as combining one row at a time, in one pass over acc
// instead of Rows. Kept out of line: inlined into the loop over the group's
// heads, GCC unrolls-and-jams that loop nest into a scalar one
// (-floop-unroll-and-jam, on at -O3).
template <class Gqa, std::int32_t Rows, bool Start>
SCISSORHANDS_NOINLINE void combine_rows(float* __restrict acc, const float* const* rows, std::int32_t offset,
                                        std::int32_t n) {
  const float* __restrict p0 = rows[0] + offset;
  const float* __restrict p1 = rows[Rows > 1 ? 1 : 0] + offset;
  const float* __restrict p2 = rows[Rows > 2 ? 2 : 0] + offset;
  const float* __restrict p3 = rows[Rows > 3 ? 3 : 0] + offset;
  for (std::int32_t u = 0; u < n; ++u) {
    float a = Start ? Gqa::identity() : acc[u];
    a = Gqa::combine(a, p0[u]);
    if constexpr (Rows > 1) a = Gqa::combine(a, p1[u]);
    if constexpr (Rows > 2) a = Gqa::combine(a, p2[u]);
    if constexpr (Rows > 3) a = Gqa::combine(a, p3[u]);
    acc[u] = a;
  }
}

// combined[u] = the group's rows[g][offset + u] combined in head order, for
// u < n: four rows a pass.
template <class Gqa>
void combine_group(float* __restrict combined, const float* const* rows, std::int32_t group, std::int32_t offset,
                   std::int32_t n) {
  // combine_rows for k = 1..4 rows, its compile-time row count.
  auto some = [&]<bool Start>(const float* const* r, std::int32_t k) {
    if (k == 4) combine_rows<Gqa, 4, Start>(combined, r, offset, n);
    else if (k == 3) combine_rows<Gqa, 3, Start>(combined, r, offset, n);
    else if (k == 2) combine_rows<Gqa, 2, Start>(combined, r, offset, n);
    else combine_rows<Gqa, 1, Start>(combined, r, offset, n);
  };
  for (std::int32_t g = 0; g < group; g += 4) {
    const std::int32_t k = std::min(4, group - g);
    if (g == 0)
      some.template operator()<true>(rows + g, k);
    else
      some.template operator()<false>(rows + g, k);
  }
}

// Feeds one step's combined probabilities of slots t0 .. t0 + n - 1 of head
// h of row r to their histories, combined[u] the probability of slot
// t0 + u: the slot's pointers advanced in step so that the loop vectorises (the
// window slot of `step` and its ring word are the same for every token,
// and word-major, the words of consecutive slots are adjacent).
template <class Policy>
inline void record_run(const Policy& policy, const eviction_state<memory_space::host>& state, std::int32_t r,
                       std::int32_t h, std::int32_t t0, std::int32_t n, std::int64_t step,
                       const float* __restrict combined, std::int32_t visible) {
  using Obs = typename Policy::observation;
  const settings cfg = policy.config;
  const std::int64_t i0 = state.row_index(r, h, t0);
  float* __restrict scores = state.scores + i0;
  float* __restrict observed = state.observed + i0;
  const history_ring ring = state.ring_of(r, h, t0);
  for (std::int32_t u = 0; u < n; ++u) {
    const float c = Obs::contribution(combined[u], visible, cfg);
    Policy::history::update(scores[u], observed[u], history_ring{ring.word0 + u, ring.stride}, step, c, cfg,
                            Obs::binary);
  }
}

// Which keys a query's sliding window shows: every slot from `first` on
// (window_unit::slots), or, measured in positions, the keys whose position
// is at least `oldest` (`first` then skips the leading slots that are
// outside, all of them when slots are in position order, as token-level
// eviction keeps them). Without a window: every visible slot.
struct query_window {
  std::int32_t first = 0;
  bool by_position = false;
  std::int64_t oldest = 0;
  const std::int32_t* positions = nullptr;  // the (row, head)'s slots' positions

  bool shows(std::int32_t t) const { return !by_position || positions[t] >= oldest; }
};

inline query_window window_of(const attention_options<memory_space::host>& options,
                              const eviction_state<memory_space::host>& state, std::int32_t r, std::int32_t h,
                              std::int32_t i) {
  query_window w;
  if (options.window_left < 0) return w;
  if (options.window_left_unit == window_unit::slots) {
    w.first = i > options.window_left ? i - options.window_left : 0;
    return w;
  }
  w.by_position = true;
  w.positions = state.positions + state.row_index(r, h, 0);
  w.oldest = std::int64_t{w.positions[i]} - options.window_left;
  while (w.first < i && w.positions[w.first] < w.oldest) ++w.first;
  return w;
}

// observe_queries' work after validation and admission, for group x
// head_dim and head_dim within the stack scratch: per (sequence, KV head,
// query) the group's queries converted to float once, then the visible
// keys a tile of logit_tile tokens at a time: every query head's logit
// against each key (dot_lanes, K converted to float once per row), then
// the tile's exponentials in one vectorisable loop (exp_approx), then the
// combined probability recorded per token. Without the log-sum-exp, a first
// pass over the same tiles keeps an online one per query head.
template <class Policy, class View, class Q>
void observe_queries_blocked(const Policy& policy, const View& cache, const eviction_state<memory_space::host>& state,
                             const query_view<Q, memory_space::host>& queries, const lse_view<memory_space::host>& lse,
                             float scale, std::int64_t first_unit, std::int64_t end_unit,
                             const attention_options<memory_space::host>& options) {
  using Gqa = typename Policy::gqa;
  constexpr std::int32_t tile = logit_tile;
  const std::int32_t d = cache.head_dim;
  const std::int32_t group = queries.q_heads / cache.kv_heads;
  float qf[query_scratch_floats];
  float kf[2][key_scratch_floats];
  float z[max_group_size * tile];
  float norm[max_group_size];
  const std::int32_t row_bytes = stored_row_bytes(cache);
  // Two or three heads past the last four (a group of 3, as SmolLM2's; 6,
  // 7): padded with zero rows to four, so dot_lanes_4 takes them with its
  // independent sums instead of one dot_lanes chain per head (a group of 3
  // about a fifth faster with AVX: bench/RESULTS.md). One left over stays
  // with dot_lanes: padding would multiply its work by four.
  const std::int32_t full_fours = group / 4 * 4;
  const bool pad_rest = group - full_fours >= 2 && (full_fours + 4) * d <= query_scratch_floats;
  if (pad_rest)
    std::fill(qf + static_cast<std::ptrdiff_t>(group) * d, qf + static_cast<std::ptrdiff_t>(full_fours + 4) * d, 0.0f);
  // Logits of tokens [t0, t0 + n) into z[g * tile + u], minus `shift[g]`.
  // A head's consecutive keys are a page or more apart in NHD and paged
  // layouts, where the hardware prefetchers stop: the next tile's rows are
  // prefetched by hand while this tile computes.
  const auto tile_logits = [&](std::int32_t b, std::int32_t h, std::int32_t t0, std::int32_t n, const float* shift) {
    const std::int32_t len = cache.length(b);
    // Keys = 2 keys at a time (Keys = 1 for an odd last one), four query
    // heads at a time against them.
    const auto keys = [&]<std::int32_t Keys>(std::int32_t u) {
      // size_t bounds: g++'s -Wsign-conversion flags an int template parameter as one.
      const float* kp[static_cast<std::size_t>(Keys)];
      for (std::int32_t k = 0; k < Keys; ++k) {
        // One row a tile ahead per row computed: a steady stream of misses.
        if (t0 + u + k + tile < len) prefetch_row(cache.k_row(b, h, t0 + u + k + tile), row_bytes);
        kp[k] = key_as_float(cache, b, h, t0 + u + k, kf[k]);
      }
      float dots[static_cast<std::size_t>(4 * Keys)];
      std::int32_t g = 0;
      for (; g + 4 <= group; g += 4) {
        dot_lanes_4<Keys>(qf + static_cast<std::ptrdiff_t>(g) * d, kp, d, dots);
        for (std::int32_t k = 0; k < Keys; ++k)
          for (std::int32_t i = 0; i < 4; ++i) z[(g + i) * tile + u + k] = dots[4 * k + i] * scale - shift[g + i];
      }
      if (pad_rest) {
        dot_lanes_4<Keys>(qf + static_cast<std::ptrdiff_t>(g) * d, kp, d, dots);
        for (std::int32_t k = 0; k < Keys; ++k)
          for (std::int32_t i = 0; i < group - g; ++i)
            z[(g + i) * tile + u + k] = dots[4 * k + i] * scale - shift[g + i];
        g = group;
      }
      for (; g < group; ++g)
        for (std::int32_t k = 0; k < Keys; ++k)
          z[g * tile + u + k] = dot_lanes(qf + static_cast<std::ptrdiff_t>(g) * d, kp[k], d) * scale - shift[g];
    };
    std::int32_t u = 0;
    if constexpr (keys_at_a_time == 2)
      for (; u + 2 <= n; u += 2) keys.template operator()<2>(u);
    for (; u < n; ++u) keys.template operator()<1>(u);
  };
  const float zero[max_group_size] = {};
  // Logits of the whole visible span, kept by the normaliser's pass for the
  // probabilities' (tile k of the span at [k * group * tile]).
  float kept[logit_cache_floats];
  constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
  for (std::int64_t unit = first_unit; unit < end_unit; ++unit) {
    const auto b = static_cast<std::int32_t>(unit / cache.kv_heads);
    const auto h = static_cast<std::int32_t>(unit % cache.kv_heads);
    const std::int32_t len = cache.length(b);
    const std::int32_t q_len = queries.queries_of(b);
    const std::int32_t r = state.row(b);
    if (len == 0 || q_len == 0) continue;
    const std::int64_t first_step = state.step[r] - q_len;  // the plan advanced it
    for (std::int32_t j = 0; j < q_len; ++j) {
      const std::int32_t visible = len - q_len + j + 1;
      const query_window window = window_of(options, state, r, h, visible - 1);
      const std::int32_t first = window.first;
      for (std::int32_t g = 0; g < group; ++g) {
        const Q* q = queries.row(b, h * group + g, j);
        for (std::int32_t x = 0; x < d; ++x) qf[g * d + x] = to_float(q[x]);
      }
      // A tile's logits minus `shift`, keys outside a window by position at -inf.
      const auto window_logits = [&](std::int32_t t0, std::int32_t n, const float* shift) {
        tile_logits(b, h, t0, n, shift);
        if (window.by_position)
          for (std::int32_t u = 0; u < n; ++u)
            if (!window.shows(t0 + u))
              for (std::int32_t g = 0; g < group; ++g) z[g * tile + u] = minus_infinity;
      };
      const bool keep = !lse.present() && std::int64_t{(visible - first + tile - 1) / tile} * group * tile <=
                                              logit_cache_floats;
      // Without the LSE: an online log-sum-exp per query head, a tile at a
      // time: the running sum is rescaled when the tile raises the maximum.
      query_normalisers(lse, b, h * group, group, j, norm, [&](float* run_max, float* run_sum) {
        for (std::int32_t t0 = first; t0 < visible; t0 += tile) {
          const std::int32_t n = std::min(tile, visible - t0);
          window_logits(t0, n, zero);
          if (keep) std::memcpy(kept + static_cast<std::ptrdiff_t>((t0 - first) / tile) * group * tile, z,
                                sizeof(float) * static_cast<std::size_t>(group * tile));
          for (std::int32_t g = 0; g < group; ++g) {
            float m = run_max[g];
            for (std::int32_t u = 0; u < n; ++u) m = std::max(m, z[g * tile + u]);
            if (m == minus_infinity) continue;  // a tile the window hides whole: nothing to add
            if (m > run_max[g]) {
              run_sum[g] *= exp_approx(run_max[g] - m);
              run_max[g] = m;
            }
            for (std::int32_t u = 0; u < n; ++u) run_sum[g] += exp_approx(z[g * tile + u] - m);
          }
        }
      });
      const std::int64_t step = first_step + j;
      // Slots before the window: no attention, recorded as 0 (n stays the
      // causal count, as observe_probabilities counts it).
      for (std::int32_t t0 = 0; t0 < first; t0 += tile)
        record_run(policy, state, r, h, t0, std::min(tile, first - t0), step, zero, visible);
      for (std::int32_t t0 = first; t0 < visible; t0 += tile) {
        const std::int32_t n = std::min(tile, visible - t0);
        if (keep) {
          // As computing them again: (x - 0) - norm == x - norm (the same bits
          // unless the compiler contracts the recomputation to an FMA).
          const float* from = kept + static_cast<std::ptrdiff_t>((t0 - first) / tile) * group * tile;
          for (std::int32_t g = 0; g < group; ++g)
            for (std::int32_t u = 0; u < tile; ++u) z[g * tile + u] = from[g * tile + u] - norm[g];
        } else {
          window_logits(t0, n, norm);
        }
        if (n == tile) {
          // A whole tile: one flat loop the compiler vectorises.
          for (std::int32_t i = 0; i < group * tile; ++i) z[i] = exp_approx(z[i]);
        } else {
          for (std::int32_t g = 0; g < group; ++g)
            for (std::int32_t u = 0; u < n; ++u) z[g * tile + u] = exp_approx(z[g * tile + u]);
        }
        float combined[tile];
        for (std::int32_t u = 0; u < n; ++u) combined[u] = Gqa::identity();
        for (std::int32_t g = 0; g < group; ++g)
          for (std::int32_t u = 0; u < n; ++u) combined[u] = Gqa::combine(combined[u], z[g * tile + u]);
        for (std::int32_t u = 0; u < n; ++u) combined[u] = Gqa::finish(combined[u], group);
        record_run(policy, state, r, h, t0, n, step, combined, visible);
      }
    }
  }
}

// The query heads, and how many queries each sequence has: q_len(b) of a
// sequence with tokens must not exceed its length (each query is a cached
// token); sequences with no token are skipped whatever their count.
template <class View, class Queries>
void validate_query_counts(const char* fn, const View& cache, const Queries& view) {
  require(view.q_heads > 0, fn, "q_heads", "must be positive, got ", view.q_heads);
  require(view.q_heads % cache.kv_heads == 0, fn, "q_heads", "must be a multiple of cache.kv_heads = ",
          cache.kv_heads, " (GQA group size), got ", view.q_heads);
  require(view.q_heads / cache.kv_heads <= max_group_size, fn, "q_heads", "/ kv_heads must be at most ",
          max_group_size, ", got ", view.q_heads / cache.kv_heads);
  // Uniform is {nullptr, 0}; a null pointer with a size is a caller's bug.
  require(view.ragged() || view.qo_indptr.empty(), fn, "qo_indptr", "must not be null when its size is ",
          view.qo_indptr.size());
  if (view.ragged()) {
    require(view.qo_indptr.size() == static_cast<std::size_t>(cache.batch) + 1, fn, "qo_indptr",
            "must hold batch + 1 = ", std::int64_t{cache.batch} + 1, " entries, got ", view.qo_indptr.size());
    require(view.qo_indptr[0] >= 0, fn, "qo_indptr", "[0] must be non-negative, got ", view.qo_indptr[0]);
    for (std::int32_t b = 0; b < cache.batch; ++b) {
      const std::int64_t q = std::int64_t{view.qo_indptr[b + 1]} - view.qo_indptr[b];
      require(q >= 0, fn, "qo_indptr", "must be non-decreasing; qo_indptr[", b + 1, "] = ", view.qo_indptr[b + 1],
              " < qo_indptr[", b, "] = ", view.qo_indptr[b]);
      const std::int32_t len = cache.length(b);
      require(len == 0 || q <= len, fn, "qo_indptr", "gives sequence ", b, " ", q,
              " queries, more than its length ", len, ": each query is a cached token");
    }
  } else {
    require(view.q_len >= 0, fn, "q_len", "must be non-negative, got ", view.q_len);
    for (std::int32_t b = 0; b < cache.batch; ++b)
      require(cache.length(b) == 0 || view.q_len <= cache.length(b), fn, "q_len",
              "must not exceed the length of sequence ", b, " (", cache.length(b),
              "): each query is a cached token, got ", view.q_len);
  }
}

// The observe-step invariant. A call's q queries of a sequence are its
// last q tokens, slots [length - q, length). Each must be new (at or above
// `tracked`) or admitted without a query (`admit`; its observed count is
// still 0): a query token that a query already saw means this layer was
// observed twice this step, or the row holds another request. The tokens
// before the queries that the call would admit, [tracked, length - q), are
// allowed only before the row's first query (after reset_sequence a prompt
// may observe its last window only); later, a step's queries are all its
// new tokens, and more new tokens than queries means the cache's length ran
// ahead of the state (compress's new_lengths not applied). A sequence with
// no query this step is only admitted (paused, or admit's tokens).
// Speculative decoding observes after verification, so it is a step of
// `a` new tokens and `a` queries like any other.
template <class View, class Queries>
void validate_new_tokens(const char* fn, const View& cache, const eviction_state<memory_space::host>& state,
                         const Queries& view) {
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t r = state.row(b), len = cache.length(b), q = view.queries_of(b);
    if (r < 0 || len == 0 || q == 0) continue;
    const std::int32_t tracked = state.tracked[r], first_query = len - q;
    require(first_query <= tracked || state.step[r] == 0, fn, "cache length", "of sequence ", b, " is ", len,
            " and its state row ", r, " tracks ", tracked, ": ", len - tracked, " tokens are new but the call has ",
            q, q == 1 ? " query" : " queries",
            " for it. Once a row has observed a query, each step's queries are all its new tokens; likely causes: "
            "compress's new_lengths were not applied to the cache's lengths, or the row holds another request "
            "(reset_sequence a row before reusing it). Tokens without queries are admitted (admit) before the call");
    for (std::int32_t t = first_query; t < tracked; ++t)
      if (state.observed[state.row_index(r, 0, t)] != 0.0f) [[unlikely]]
        fail(fn, "cache length", "of sequence ", b, " is ", len, " and its state row ", r, " tracks ", tracked,
             ": the call's queries are slots [", first_query, ", ", len, "), and slot ", t,
             " was already observed. Likely causes: this layer was observed twice this step (observe each layer "
             "once per step), the row holds another request (reset_sequence a row before reusing it), or the "
             "lengths were not applied after compress");
  }
}

// How far a sampled query's sum of exp(logit - lse) over its keys may
// stray from 1 before observe_queries refuses the LSE (lse_check). Wide
// enough for a kernel that rounds Q or K to 16 bits before its dot
// products; a base mislabel (each term off by e^(0.31 lse)) once lse
// passes about 0.2, a forgotten softmax_scale or window, or heads that
// do not match the data fall far outside it.
inline constexpr double lse_sum_tolerance = 0.05;
// A row's queries between two sampled checks (besides its first observe):
// a sampled call does about one more call's work, so one in 256 costs
// about 0.5% of observe (bench/RESULTS.md).
inline constexpr std::int64_t lse_check_interval = 256;

// Whether a row that has observed `step` queries checks its LSE this call of `queries` more.
constexpr bool lse_sampled(std::int64_t step, std::int32_t queries) {
  return step == 0 || step / lse_check_interval != (step + queries) / lse_check_interval;
}

// The LSE against the keys it describes (lse_check), before anything is
// written: for each sampled row, the last query of every query head sums
// exp(logit - lse) over the keys it sees, with the call's attention
// options, reading positions as admit will give them. A NaN sum (NaN
// queries or keys) is left to the scores' NaN policy.
template <class View, class Q>
void validate_lse_sums(const char* fn, const View& cache, const eviction_state<memory_space::host>& state,
                       const query_view<Q, memory_space::host>& queries, const lse_view<memory_space::host>& lse,
                       float scale, const attention_options<memory_space::host>& options) {
  if (!lse.present() || lse.check == lse_check::none) return;
  const std::int32_t d = cache.head_dim;
  const std::int32_t group = queries.q_heads / cache.kv_heads;
  // Each K row is read once for the group, as the scoring pass reads it:
  // within the scratch the group's queries as float rows and its dot
  // products four heads at a time (dot_lanes_4); beyond it (a group x
  // head_dim above query_scratch_floats) one element at a time.
  const bool lanes = group * d <= query_scratch_floats && d <= key_scratch_floats;
  const std::int32_t row_bytes = stored_row_bytes(cache);
  float qf[query_scratch_floats];
  float kf[key_scratch_floats];
  float logits[max_group_size];
  double norm[max_group_size];
  double sum[max_group_size];
  for (std::int32_t b = 0; b < cache.batch; ++b) {
    const std::int32_t r = state.row(b), len = cache.length(b), q = queries.queries_of(b);
    if (r < 0 || len == 0 || q == 0 || !lse_sampled(state.step[r], q)) continue;
    const std::int32_t tracked = state.tracked[r], i = len - 1;  // the last query's own slot
    for (std::int32_t h = 0; h < cache.kv_heads; ++h) {
      const auto position = [&](std::int32_t t) {
        return t < tracked ? std::int64_t{state.positions[state.row_index(r, h, t)]}
                           : std::int64_t{state.next_position[r]} + (t - tracked);
      };
      std::int32_t first = 0;
      if (options.window_left >= 0 && options.window_left_unit == window_unit::slots)
        first = std::max(0, i - options.window_left);
      const std::int64_t oldest = position(i) - options.window_left;
      const bool by_position = options.window_left >= 0 && options.window_left_unit == window_unit::positions;
      for (std::int32_t g = 0; g < group; ++g) {
        norm[g] = lse.natural(b, h * group + g, q - 1);
        sum[g] = 0.0;
        if (lanes) {
          const Q* qr = queries.row(b, h * group + g, q - 1);
          for (std::int32_t x = 0; x < d; ++x) qf[static_cast<std::ptrdiff_t>(g) * d + x] = to_float(qr[x]);
        }
      }
      std::int32_t keys = 0;
      for (std::int32_t t = first; t <= i; ++t) {
        if (by_position && position(t) < oldest) continue;
        ++keys;
        if (lanes) {
          // A head's rows are a page or more apart: a tile ahead by hand, as the scoring pass does.
          if (t + logit_tile <= i) prefetch_row(cache.k_row(b, h, t + logit_tile), row_bytes);
          const float* k = key_as_float(cache, b, h, t, kf);
          std::int32_t g = 0;
          for (; g + 4 <= group; g += 4) dot_lanes_4<1>(qf + static_cast<std::ptrdiff_t>(g) * d, &k, d, logits + g);
          for (; g < group; ++g) logits[g] = dot_lanes(qf + static_cast<std::ptrdiff_t>(g) * d, k, d);
        } else {
          if constexpr (is_quantized_view_v<View>) cache.dequantize_k(b, h, t, kf);
          for (std::int32_t g = 0; g < group; ++g) {
            const Q* qr = queries.row(b, h * group + g, q - 1);
            float dot = 0.0f;
            if constexpr (is_quantized_view_v<View>) {
              for (std::int32_t x = 0; x < d; ++x) dot += to_float(qr[x]) * kf[x];
            } else {
              const auto* k = cache.k_row(b, h, t);
              for (std::int32_t x = 0; x < d; ++x) dot += to_float(qr[x]) * to_float(k[x]);
            }
            logits[g] = dot;
          }
        }
        for (std::int32_t g = 0; g < group; ++g) {
          float logit = logits[g] * scale;
          if (!options.alibi_slopes.empty()) logit += options.alibi_slopes[h * group + g] * static_cast<float>(t - i);
          if (options.logits_soft_cap > 0.0f)
            logit = options.logits_soft_cap * std::tanh(logit / options.logits_soft_cap);
          sum[g] += std::exp(double{logit} - norm[g]);
        }
      }
      for (std::int32_t g = 0; g < group; ++g) {
        const bool too_high = sum[g] > 1.0 + lse_sum_tolerance;
        const bool too_low = lse.check == lse_check::sums_to_one && sum[g] < 1.0 - lse_sum_tolerance;
        if (too_high || too_low) [[unlikely]] {
          // The same terms with the value read in the other base: near 1, the base is misnamed.
          constexpr double ln_2 = 0.6931471805599453;
          const bool base2 = lse.base == lse_base::base2;
          const double given = base2 ? norm[g] / ln_2 : norm[g];  // the value as the engine wrote it
          const double other_sum = sum[g] * std::exp(norm[g] - (base2 ? given : given * ln_2));
          fail(fn, "lse", "value at (sequence ", b, ", query head ", h * group + g, ", query ", q - 1, ") is ",
               given, base2 ? " (base 2)" : " (natural)", ", but exp(logit - lse) over the ", keys,
               " keys that query sees sums to ", sum[g],
               lse.check == lse_check::sums_to_one ? ", not 1" : ", above 1", " (tolerance ", lse_sum_tolerance,
               "; read in the other base it would sum to ", other_sum,
               "). Likely causes: lse.base names the wrong base, the attention_options do not match the "
               "engine's kernel (softmax_scale, a sliding window and its unit, logits_soft_cap, ALiBi), or the "
               "query or lse view's heads do not match the data. A softmax with terms outside the cache "
               "(attention sinks) sets lse.check = lse_check::at_most_one");
        }
      }
    }
  }
}

// Largest element index + 1 a uniform view of `row` contiguous elements
// per (sequence, head, query) reaches (both backends).
inline std::int64_t reach_uniform(std::int64_t sequence_stride, std::int64_t head_stride, std::int64_t query_stride,
                                  std::int32_t batch, std::int32_t q_heads, std::int32_t q_len, std::int64_t row) {
  return layout_extent({sequence_stride, head_stride, query_stride}, {batch, q_heads, q_len}, row);
}

// The same for a host view, uniform or ragged (a ragged one reads qo_indptr).
template <class Queries>
std::int64_t reach(const Queries& view, std::int64_t sequence_stride, std::int64_t head_stride,
                   std::int64_t query_stride, std::int32_t batch, std::int64_t row) {
  static_assert(std::remove_cvref_t<decltype(view.qo_indptr)>::space == memory_space::host,
                "detail::reach reads qo_indptr: host views only (reach_uniform for device views)");
  if (view.ragged()) {
    const std::int64_t tokens = view.qo_indptr[static_cast<std::size_t>(batch)];
    return layout_extent({query_stride, head_stride, 0}, {tokens, view.q_heads, 1}, row);
  }
  return reach_uniform(sequence_stride, head_stride, query_stride, batch, view.q_heads, view.q_len, row);
}

// Advances the step counter of every sequence that has queries this call:
// the plan does it once, each unit reads its first step as step - q_len.
template <class View, class Queries>
void advance_steps(const View& cache, const eviction_state<memory_space::host>& state, const Queries& view) {
  for (std::int32_t b = 0; b < cache.batch; ++b)
    if (cache.length(b) > 0 && view.queries_of(b) > 0) state.step[state.row(b)] += view.queries_of(b);
}

template <class Policy, class View>
auto plan_observe_probabilities(const char* fn, const Policy& policy, View cache,
                                eviction_state<memory_space::host> state, probability_view<memory_space::host> probs) {
  static_assert(View::space == memory_space::host, "host::observe_probabilities needs a host view");
  validate_common(fn, policy, cache, state, /*values=*/false);
  using Obs = typename Policy::observation;
  using Gqa = typename Policy::gqa;
  if constexpr (Obs::needs_attention) {
    validate_query_counts(fn, cache, probs);
    std::int32_t max_len = 0;
    for (std::int32_t b = 0; b < cache.batch; ++b) max_len = std::max(max_len, cache.length(b));
    for (auto s : {probs.sequence_stride, probs.head_stride, probs.query_stride})
      require(s >= 0, fn, "probs strides", "must be non-negative, got ", s);
    const std::int64_t need = reach(probs, probs.sequence_stride, probs.head_stride, probs.query_stride,
                                            cache.batch, max_len);
    require(need == 0 || probs.data.data() != nullptr, fn, "probs.data", "must not be null");
    require(static_cast<std::uint64_t>(need) <= probs.data.size(), fn, "probs.data", "holds ",
            probs.data.size(), " values but the view reaches ", need);
    for (std::int32_t b = 0; b < cache.batch; ++b) {
      const std::int32_t len = cache.length(b);
      if (len == 0) continue;
      const std::int32_t q_len = probs.queries_of(b);
      for (std::int32_t qh = 0; qh < probs.q_heads; ++qh)
        for (std::int32_t j = 0; j < q_len; ++j) {
          const float* __restrict row = probs.row(b, qh, j);
          const std::int32_t visible = len - q_len + j + 1;
          if (all_probabilities(row, visible)) [[likely]]
            continue;
          // The slot is looked up only to name it.
          std::int32_t t = 0;
          while (row[t] >= 0.0f && row[t] <= 1.001f) ++t;
          fail(fn, "probs", "value at (sequence ", b, ", query head ", qh, ", query ", j, ", slot ", t,
               ") must be a probability in [0, 1], got ", row[t]);
        }
    }
  }
  // Last: a view's own faults are named before the protocol's.
  if constexpr (Obs::needs_attention) validate_new_tokens(fn, cache, state, probs);
  validate_new_key_params<Policy>(fn, cache, state);
  admit(policy, cache, state);
  if constexpr (Obs::needs_attention) advance_steps(cache, state, probs);
  // One unit per (sequence, KV head) pair.
  const std::int64_t units = Obs::needs_attention ? std::int64_t{cache.batch} * cache.kv_heads : 0;
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t) {
    if constexpr (Obs::needs_attention) {
      const std::int32_t group = probs.q_heads / cache.kv_heads;
      for (std::int64_t unit = first_unit; unit < end_unit; ++unit) {
        const auto b = static_cast<std::int32_t>(unit / cache.kv_heads);
        const auto h = static_cast<std::int32_t>(unit % cache.kv_heads);
        const std::int32_t len = cache.length(b);
        const std::int32_t q_len = probs.queries_of(b);
        if (len == 0 || q_len == 0) continue;
        const std::int32_t r = state.row(b);
        const std::int64_t first_step = state.step[r] - q_len;  // the plan advanced it
        const float* rows[max_group_size];
        float combined[record_tile];
        for (std::int32_t j = 0; j < q_len; ++j) {
          const std::int32_t visible = len - q_len + j + 1;
          for (std::int32_t g = 0; g < group; ++g) rows[g] = probs.row(b, h * group + g, j);
          // A tile of slots at a time: the group combined head by head (in
          // head order, as per slot), then the tile recorded.
          for (std::int32_t t0 = 0; t0 < visible; t0 += record_tile) {
            const std::int32_t n = std::min(record_tile, visible - t0);
            combine_group<Gqa>(combined, rows, group, t0, n);
            for (std::int32_t u = 0; u < n; ++u) combined[u] = Gqa::finish(combined[u], group);
            record_run(policy, state, r, h, t0, n, first_step + j, combined, visible);
          }
        }
      }
    }
  }, units);
}

// observe_queries' work for group x head_dim or head_dim beyond the blocked
// path's stack scratch: one key row at a time against the group.
// It also serves every call whose attention_options are not plain (a
// sliding window, soft-capping, ALiBi): `options` is then applied to each
// logit, and keys outside the window get probability 0.
template <class Policy, class View, class Q>
void observe_queries_unblocked(const Policy& policy, const View& cache, const eviction_state<memory_space::host>& state,
                               const query_view<Q, memory_space::host>& queries,
                               const lse_view<memory_space::host>& lse, float scale, std::int64_t first_unit,
                               std::int64_t end_unit,
                               const attention_options<memory_space::host>& options = {}) {
  using Gqa = typename Policy::gqa;
  const std::int32_t d = cache.head_dim;
  const std::int32_t group = queries.q_heads / cache.kv_heads;
  float norm[max_group_size];
  const Q* q_rows[max_group_size];
  float logits[max_group_size];
  // The group's logits against one key row, computed together so K is read
  // once per row and the group's dot products run as independent chains.
  // A quantized row is dequantized first (head_dim <= key_scratch_floats).
  const auto group_logits = [&](std::int32_t b, std::int32_t h, std::int32_t t) {
    for (std::int32_t g = 0; g < group; ++g) logits[g] = 0.0f;
    const auto accumulate = [&](const auto* k) {
      for (std::int32_t x = 0; x < d; ++x) {
        const float kx = to_float(k[x]);
        for (std::int32_t g = 0; g < group; ++g) logits[g] += to_float(q_rows[g][x]) * kx;
      }
    };
    if constexpr (is_quantized_view_v<View>) {
      float kf[key_scratch_floats];
      cache.dequantize_k(b, h, t, kf);
      accumulate(static_cast<const float*>(kf));
    } else {
      accumulate(cache.k_row(b, h, t));
    }
    for (std::int32_t g = 0; g < group; ++g) logits[g] *= scale;
  };
  const bool alibi = !options.alibi_slopes.empty();
  const float cap = options.logits_soft_cap;
  // ALiBi's bias and the soft cap, for the query at slot i against slot t.
  const auto transform = [&](std::int32_t h, std::int32_t t, std::int32_t i) {
    if (alibi)
      for (std::int32_t g = 0; g < group; ++g)
        logits[g] += options.alibi_slopes[h * group + g] * static_cast<float>(t - i);
    if (cap > 0.0f)
      for (std::int32_t g = 0; g < group; ++g) logits[g] = cap * std::tanh(logits[g] / cap);
  };
  for (std::int64_t unit = first_unit; unit < end_unit; ++unit) {
    const auto b = static_cast<std::int32_t>(unit / cache.kv_heads);
    const auto h = static_cast<std::int32_t>(unit % cache.kv_heads);
    const std::int32_t len = cache.length(b);
    const std::int32_t q_len = queries.queries_of(b);
    if (len == 0 || q_len == 0) continue;
    const std::int32_t r = state.row(b);
    const std::int64_t first_step = state.step[r] - q_len;  // the plan advanced it
    for (std::int32_t j = 0; j < q_len; ++j) {
      const std::int32_t visible = len - q_len + j + 1;
      const std::int32_t i = visible - 1;  // the query's own slot
      // The first slot the window lets the query see (0 without a window).
      const query_window window = window_of(options, state, r, h, i);
      const std::int32_t first = window.first;
      for (std::int32_t g = 0; g < group; ++g) q_rows[g] = queries.row(b, h * group + g, j);
      // Without the LSE: an online log-sum-exp per query head (running
      // max, sum rescaled when the max grows), one extra read of K.
      query_normalisers(lse, b, h * group, group, j, norm, [&](float* run_max, float* run_sum) {
        for (std::int32_t t = first; t < visible; ++t) {
          if (!window.shows(t)) continue;
          group_logits(b, h, t);
          transform(h, t, i);
          for (std::int32_t g = 0; g < group; ++g) {
            if (logits[g] > run_max[g]) {
              run_sum[g] = run_sum[g] * std::exp(run_max[g] - logits[g]) + 1.0f;
              run_max[g] = logits[g];
            } else {
              run_sum[g] += std::exp(logits[g] - run_max[g]);
            }
          }
        }
      });
      const std::int64_t step = first_step + j;
      // Outside the window the query gave no attention: recorded as 0 (n
      // stays the causal count, as observe_probabilities counts it).
      const float nothing = 0.0f;
      for (std::int32_t t = 0; t < first; ++t) record_run(policy, state, r, h, t, 1, step, &nothing, visible);
      for (std::int32_t t = first; t < visible; ++t) {
        if (!window.shows(t)) {
          record_run(policy, state, r, h, t, 1, step, &nothing, visible);
          continue;
        }
        group_logits(b, h, t);
        transform(h, t, i);
        float acc = Gqa::identity();
        for (std::int32_t g = 0; g < group; ++g) acc = Gqa::combine(acc, std::exp(logits[g] - norm[g]));
        const float combined = Gqa::finish(acc, group);
        record_run(policy, state, r, h, t, 1, step, &combined, visible);
      }
    }
  }
}

template <class Policy, class View, class Q>
auto plan_observe_queries(const char* fn, const Policy& policy, View cache, eviction_state<memory_space::host> state,
                          query_view<Q, memory_space::host> queries, lse_view<memory_space::host> lse,
                          attention_options<memory_space::host> options) {
  const float softmax_scale = options.softmax_scale;
  static_assert(View::space == memory_space::host, "host::observe_queries needs a host view");
  static_assert(is_quantized_view_v<View> || float_convertible<typename View::element_type>,
                "specialise scissorhands::element_traits for the cache's element type");
  static_assert(float_convertible<Q>, "specialise scissorhands::element_traits for the query's element type");
  validate_common(fn, policy, cache, state, /*values=*/false);
  using Obs = typename Policy::observation;
  const std::int32_t d = cache.head_dim;
  if constexpr (Obs::needs_attention) {
    validate_query_counts(fn, cache, queries);
    require(queries.head_dim == d, fn, "queries.head_dim", "must equal cache.head_dim = ", d, ", got ",
            queries.head_dim);
    // Typed list: nvcc's front end turns a bare {..} of dependent members into ({..}).
    for (std::int64_t s : std::initializer_list<std::int64_t>{queries.sequence_stride, queries.head_stride,
                                                                queries.query_stride})
      require(s >= 0, fn, "queries strides", "must be non-negative, got ", s);
    const std::int64_t need = reach(queries, queries.sequence_stride, queries.head_stride,
                                            queries.query_stride, cache.batch, d);
    require(need == 0 || queries.data.data() != nullptr, fn, "queries.data", "must not be null");
    require(static_cast<std::uint64_t>(need) <= queries.data.size(), fn, "queries.data", "holds ",
            queries.data.size(), " values but the view reaches ", need);
    require(std::isfinite(softmax_scale) && softmax_scale >= 0.0f, fn, "softmax_scale",
            "must be finite and non-negative (0 means 1/sqrt(head_dim)), got ", softmax_scale);
    require(options.window_left >= -1, fn, "options.window_left",
            "must be -1 (no sliding window) or non-negative, got ", options.window_left);
    require(options.window_left_unit == window_unit::slots || options.window_left_unit == window_unit::positions,
            fn, "options.window_left_unit", "must be window_unit::slots or window_unit::positions, got ",
            static_cast<int>(options.window_left_unit));
    require(std::isfinite(options.logits_soft_cap) && options.logits_soft_cap >= 0.0f, fn,
            "options.logits_soft_cap", "must be finite and non-negative (0: none), got ", options.logits_soft_cap);
    if (!options.alibi_slopes.empty()) {
      require(options.alibi_slopes.size() == static_cast<std::size_t>(queries.q_heads) &&
                  options.alibi_slopes.data() != nullptr,
              fn, "options.alibi_slopes", "must be empty or hold q_heads = ", queries.q_heads,
              " slopes (non-null), got ", options.alibi_slopes.size());
      for (std::int32_t qh = 0; qh < queries.q_heads; ++qh)
        require(std::isfinite(options.alibi_slopes[qh]), fn, "options.alibi_slopes", "[", qh,
                "] must be finite, got ", options.alibi_slopes[qh]);
    }
    // Absent is {nullptr, 0}; a null pointer with a size is a caller's bug, not "no lse".
    require(lse.present() || lse.data.empty(), fn, "lse.data", "must not be null when its size is ",
            lse.data.size());
    if (lse.present()) {
      require(lse.base == lse_base::natural || lse.base == lse_base::base2, fn, "lse.base",
              "must be named: lse_base::natural (FlashAttention) or lse_base::base2 (FlashInfer), got ",
              lse.base == lse_base::unspecified ? "unspecified" : "an unknown value");
      require(lse.check == lse_check::sums_to_one || lse.check == lse_check::at_most_one ||
                  lse.check == lse_check::none,
              fn, "lse.check", "must be lse_check::sums_to_one, at_most_one or none, got ",
              static_cast<int>(lse.check));
      require(lse.qo_indptr.data() == queries.qo_indptr.data() &&
                          lse.qo_indptr.size() == queries.qo_indptr.size(),
              fn, "lse.qo_indptr", "must be the queries' qo_indptr (both ragged over one array, or neither)");
      for (auto s : {lse.sequence_stride, lse.head_stride, lse.query_stride})
        require(s >= 0, fn, "lse strides", "must be non-negative, got ", s);
      const std::int64_t lneed = reach(queries, lse.sequence_stride, lse.head_stride, lse.query_stride,
                                               cache.batch, 1);
      require(static_cast<std::uint64_t>(lneed) <= lse.data.size(), fn, "lse.data", "holds ", lse.data.size(),
              " values but the view reaches ", lneed);
      for (std::int32_t b = 0; b < cache.batch; ++b) {
        if (cache.length(b) == 0) continue;
        for (std::int32_t qh = 0; qh < queries.q_heads; ++qh)
          for (std::int32_t j = 0; j < queries.queries_of(b); ++j)
            require(std::isfinite(lse.natural(b, qh, j)), fn, "lse", "value at (sequence ", b,
                    ", query head ", qh, ", query ", j, ") must be finite, got ", lse.natural(b, qh, j));
      }
    }
    // Every held K row of a sequence with queries is read.
    validate_key_params(fn, cache, [&](std::int32_t b) { return queries.queries_of(b) > 0 ? 0 : cache.length(b); });
  }
  if constexpr (Obs::needs_attention) validate_new_tokens(fn, cache, state, queries);
  validate_new_key_params<Policy>(fn, cache, state);
  const float scale = softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(d));
  if constexpr (Obs::needs_attention) validate_lse_sums(fn, cache, state, queries, lse, scale, options);
  admit(policy, cache, state);
  if constexpr (Obs::needs_attention) advance_steps(cache, state, queries);
  // One unit per (sequence, KV head) pair.
  const std::int64_t units = Obs::needs_attention ? std::int64_t{cache.batch} * cache.kv_heads : 0;
  return work_plan(fn, [=](std::int64_t first_unit, std::int64_t end_unit, std::int32_t) {
    if constexpr (Obs::needs_attention) {
      const std::int32_t group = queries.q_heads / cache.kv_heads;
      // The blocked path serves plain attention and sliding windows; the
      // per-logit transforms (soft cap, ALiBi) take the unblocked one.
      const bool transformed = options.logits_soft_cap != 0.0f || !options.alibi_slopes.empty();
      if (!transformed && group * d <= query_scratch_floats && d <= key_scratch_floats)
        observe_queries_blocked(policy, cache, state, queries, lse, scale, first_unit, end_unit, options);
      else
        observe_queries_unblocked(policy, cache, state, queries, lse, scale, first_unit, end_unit, options);
    }
  }, units);
}

}  // namespace detail

// Both observe calls and their plans (plan.hpp): plan_* validates, admits
// and advances the step counters on the calling thread; its units are the
// (sequence, KV head) pairs (none for a static observation policy, whose
// whole work is the admission). The call is its plan run on one thread.
template <class Policy, class View>
  requires composed_policy<Policy>
auto plan_observe_probabilities(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                                probability_view<memory_space::host> probs) {
  return detail::plan_observe_probabilities("host::plan_observe_probabilities", policy, cache, state, probs);
}
template <class Policy, class View>
  requires composed_policy<Policy>
void observe_probabilities(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                           probability_view<memory_space::host> probs) {
  detail::plan_observe_probabilities("host::observe_probabilities", policy, cache, state, probs).run();
}

// softmax_scale multiplies q.k before the softmax (1/sqrt(head_dim) when 0).
// A model whose attention is not plain causal softmax over every held slot
// (a sliding window, soft-capped logits, ALiBi) passes attention_options
// instead, as its kernel took them (attention_view.hpp); with the plain
// overload its scores are those of plain softmax, i.e. wrong.
// A ragged `queries` needs a ragged `lse` over the same qo_indptr array.
// A token_table_view is refused (it holds no K to recompute attention from);
// the body is then skipped, so the message is the only error.
template <class Policy, class View, class Q>
  requires composed_policy<Policy>
auto plan_observe_queries(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                          query_view<Q, memory_space::host> queries, lse_view<memory_space::host> lse,
                          attention_options<memory_space::host> options) {
  static_assert(kv_rows_view<View>, "host::plan_observe_queries recomputes attention from the cached keys and a "
                "token_table_view holds no K/V: hand over the probabilities (observe_probabilities) or pass a "
                "kv_view / paged_kv_view");
  if constexpr (kv_rows_view<View>)
    return detail::plan_observe_queries("host::plan_observe_queries", policy, cache, state, queries, lse, options);
}
template <class Policy, class View, class Q>
  requires composed_policy<Policy>
auto plan_observe_queries(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                          query_view<Q, memory_space::host> queries, lse_view<memory_space::host> lse = {},
                          float softmax_scale = 0.0f) {
  return plan_observe_queries(policy, cache, state, queries, lse,
                              attention_options<memory_space::host>{softmax_scale, -1, 0.0f, {}, window_unit::slots});
}
template <class Policy, class View, class Q>
  requires composed_policy<Policy>
void observe_queries(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                     query_view<Q, memory_space::host> queries, lse_view<memory_space::host> lse,
                     attention_options<memory_space::host> options) {
  static_assert(kv_rows_view<View>, "host::observe_queries recomputes attention from the cached keys and a "
                "token_table_view holds no K/V: hand over the probabilities (observe_probabilities) or pass a "
                "kv_view / paged_kv_view");
  if constexpr (kv_rows_view<View>)
    detail::plan_observe_queries("host::observe_queries", policy, cache, state, queries, lse, options).run();
}
template <class Policy, class View, class Q>
  requires composed_policy<Policy>
void observe_queries(const Policy& policy, View cache, eviction_state<memory_space::host> state,
                     query_view<Q, memory_space::host> queries, lse_view<memory_space::host> lse = {},
                     float softmax_scale = 0.0f) {
  observe_queries(policy, cache, state, queries, lse,
                  attention_options<memory_space::host>{softmax_scale, -1, 0.0f, {}, window_unit::slots});
}

// For static observation policies: admit new tokens (observe_* do the same).
template <class Policy, class View>
  requires composed_policy<Policy>
void admit(const Policy& policy, View cache, eviction_state<memory_space::host> state) {
  const char* fn = "host::admit";
  detail::validate_common(fn, policy, cache, state, /*values=*/false);
  detail::validate_new_key_params<Policy>(fn, cache, state);
  detail::admit(policy, cache, state);
}

}  // namespace scissorhands::host
