#pragma once
// Check kernels: the data-dependent part of the host backend's validation,
// run before any kernel that writes (see status.cuh). They only read, and OR
// status bits into the status words of the state's rows.
#include <cstdint>

#include "../../attention_view.hpp"
#include "../../eviction_state.hpp"
#include "../block/collectives.cuh"
#include "../detail/tables.cuh"
#include "../launch.cuh"
#include "../status.cuh"
#include "../traits.cuh"

namespace scissorhands::cuda::detail {

// Where the rows of a probability, query or log-sum-exp view are, without
// their element type, so one check kernel serves every view. Ragged views
// read qo_indptr on the device.
struct query_rows {
  const std::int32_t* qo_indptr = nullptr;  // [batch + 1] when ragged
  std::int32_t q_len = 0;                   // uniform views
  std::int32_t q_heads = 0;
  std::int64_t sequence_stride = 0, head_stride = 0, query_stride = 0;
  std::uint64_t size = 0;  // elements in the view's span

  SCISSORHANDS_HOST_DEVICE bool ragged() const { return qo_indptr != nullptr; }
  SCISSORHANDS_HOST_DEVICE std::int32_t queries_of(std::int32_t b) const {
    return ragged() ? qo_indptr[b + 1] - qo_indptr[b] : q_len;
  }
  // One past the last element that the rows of sequence b's first q
  // queries reach, rows of `row` elements (strides are non-negative, so the
  // last query of the last head reaches furthest).
  SCISSORHANDS_HOST_DEVICE std::int64_t reach(std::int32_t b, std::int32_t q, std::int64_t row) const {
    const span<const std::int32_t, memory_space::device> indptr(qo_indptr, qo_indptr ? 1 : 0);
    return scissorhands::detail::query_offset(indptr, sequence_stride, head_stride, query_stride, b, q_heads - 1,
                                              q - 1) +
           row;
  }
};

template <class View>
query_rows make_query_rows(const View& view, std::int32_t q_heads, std::uint64_t size) {
  query_rows r;
  r.qo_indptr = view.qo_indptr.data();
  r.q_len = r.qo_indptr != nullptr ? 0 : view.q_len;
  r.q_heads = q_heads;
  r.sequence_stride = view.sequence_stride;
  r.head_stride = view.head_stride;
  r.query_stride = view.query_stride;
  r.size = size;
  return r;
}
// The log-sum-exp view has no q_len of its own: the queries' counts.
inline query_rows make_query_rows(const lse_view<memory_space::device>& lse, const query_rows& queries) {
  query_rows r = queries;
  r.sequence_stride = lse.sequence_stride;
  r.head_stride = lse.head_stride;
  r.query_stride = lse.query_stride;
  r.size = lse.data.size();
  return r;
}

// The state row the work kernels may write for batch position b, or -1: a
// padding slot, a row out of range (the check kernel flagged the batch), or
// a row whose status word is non-zero. Uniform over a block.
__device__ inline std::int32_t live_row(const eviction_state<memory_space::device>& state, std::int32_t b) {
  const std::int32_t r = state.row(b);
  if (r < 0 || r >= state.shape.rows) return -1;
  return state.status[r] == 0 ? r : -1;
}

// live_row read by thread 0 and shared with the block: every thread sees
// the same value even while another block ORs bits into the word (a plain
// read by every thread could diverge, and a block that returns in part
// never reaches its next barrier). All threads of the block.
__device__ inline std::int32_t block_live_row(const eviction_state<memory_space::device>& state, std::int32_t b) {
  __shared__ std::int32_t shared_row;
  __syncthreads();  // a previous call's readers are done
  if (threadIdx.x == 0) shared_row = live_row(state, b);
  __syncthreads();
  return shared_row;
}

// Everything the check of one sequence found, the same in every thread.
struct sequence_check {
  std::int32_t row = -1;  // the state row; meaningful when row_ok
  bool row_ok = false;    // row in [0, rows): its counters were read and it can be flagged
  bool length_ok = false; // the sequence's length (paged: its page-table entries) passed the checks
  std::int32_t length = 0, tracked = 0, next_position = 0;
  std::int32_t queries = 0;  // queries_of(b), when checked and sane
  std::uint32_t own = 0;     // bits for the sequence's row
  std::uint32_t batch = 0;   // bits for every row of the batch
};

// The checks of one state row's counters against the sequence's length
// (host::detail::validate_common): step in [0, 2^62], and when the length
// is known, length <= capacity, 0 <= tracked <= length, and next_position
// leaving int32 room for the new tokens. Returns the row's bits; `tracked`
// and `next_position` get the counters. Host and device (check_parity).
SCISSORHANDS_HOST_DEVICE inline std::uint32_t check_counters(const eviction_state<memory_space::device>& state,
                                                             std::int32_t r, std::int32_t length, bool length_ok,
                                                             std::int32_t& tracked, std::int32_t& next_position) {
  std::uint32_t own = 0;
  tracked = state.tracked[r];
  next_position = state.next_position[r];
  const std::int64_t step = state.step[r];
  if (step < 0 || step > (std::int64_t{1} << 62)) own |= status_step;
  if (length_ok) {
    if (length > state.shape.capacity) own |= status_state_capacity;
    if (tracked < 0 || tracked > length)
      own |= status_tracked;
    else if (next_position < 0 || std::int64_t{next_position} + (length - tracked) > std::int64_t{INT32_MAX})
      own |= status_position_overflow;
  }
  return own;
}

// host::detail::validate_common's and validate_rows' checks of sequence b
// (page table, length, its state row, tracked, next_position, step), by the
// whole block. `scan_rows`: also look for another batch position using the
// same row (O(batch), done by one block per sequence).
__device__ inline sequence_check check_sequence(const sequence_table& seqs,
                                                const eviction_state<memory_space::device>& state, std::int32_t b,
                                                bool scan_rows) {
  sequence_check c;
  std::uint32_t batch_bits = 0;
  std::uint32_t own = block::block_or(seqs.check_sequence(b, static_cast<std::int32_t>(threadIdx.x),
                                                          static_cast<std::int32_t>(blockDim.x), c.length, batch_bits));
  c.length_ok = own == 0;
  const std::int32_t r = state.row(b);
  if (r < -1 || r >= state.shape.rows) {
    batch_bits |= status_state_rows | own;
    own = 0;
  } else if (r == -1) {
    // A padding slot must hold no token; whatever is wrong with it cannot
    // be pinned on a row.
    batch_bits |= own;
    if (own == 0 && c.length != 0) batch_bits |= status_state_rows;
    own = 0;
  } else {
    c.row = r;
    c.row_ok = true;
    if (scan_rows && state.state_rows.data() != nullptr) {
      std::uint32_t twice = 0;
      for (std::int32_t o = threadIdx.x; o < seqs.batch; o += blockDim.x)
        if (o != b && state.state_rows[o] == r) twice = status_state_rows;
      batch_bits |= block::block_or(twice);
    }
    own |= check_counters(state, r, c.length, c.length_ok, c.tracked, c.next_position);
  }
  c.own = own;
  c.batch = batch_bits;
  return c;
}

// host::detail::validate_query_counts for sequence b: qo_indptr sane at b,
// and no more queries than tokens (unless the sequence holds none). Host
// and device (check_parity).
SCISSORHANDS_HOST_DEVICE inline void check_queries(const query_rows& counts, std::int32_t b, sequence_check& c) {
  std::int64_t q = counts.q_len;
  if (counts.ragged()) {
    const std::int32_t start = counts.qo_indptr[b];
    q = std::int64_t{counts.qo_indptr[b + 1]} - start;
    if (b == 0 && start < 0) c.batch |= status_qo_indptr;
    if (start < 0 || q < 0) {
      c.own |= status_qo_indptr;
      q = 0;
    }
  }
  if (c.length != 0 && q > c.length) c.own |= status_query_length;
  c.queries = static_cast<std::int32_t>(q);
  if (!c.row_ok) {  // a padding slot's (or a bad row's) problems belong to the batch
    c.batch |= c.own;
    c.own = 0;
  }
}

// host::detail::validate_new_tokens for sequence b, after check_queries:
// its q queries are its last q tokens, each new or admitted without a
// query (observed count 0 at head 0), and tokens before them are new only
// before the row's first query. Slots thread, thread + threads, ... of the
// query tokens already tracked (the block's threads on the device, one
// thread on the host). Host and device (check_parity).
SCISSORHANDS_HOST_DEVICE inline std::uint32_t check_new_tokens(const eviction_state<memory_space::device>& state,
                                                               const sequence_check& c, std::int32_t thread,
                                                               std::int32_t threads) {
  if (!c.row_ok || c.own != 0 || c.length <= 0 || c.queries <= 0 || c.queries > c.length) return 0;
  if (c.tracked < 0 || c.tracked > c.length) return 0;
  const std::int32_t first = c.length - c.queries;
  std::uint32_t bits = 0;
  if (first > c.tracked && state.step[c.row] != 0) bits = status_new_tokens;
  for (std::int32_t t = first + thread; t < c.tracked; t += threads)
    if (state.observed[state.row_index(c.row, 0, t)] != 0.0f) bits = status_new_tokens;
  return bits;
}

// ORs `bits` into the status word of every row of the batch (rows outside
// [0, rows) are never written). All threads of the block.
__device__ inline void flag_batch(const eviction_state<memory_space::device>& state, std::int32_t batch,
                                  std::uint32_t bits) {
  for (std::int32_t b = threadIdx.x; b < batch; b += blockDim.x) {
    const std::int32_t r = state.row(b);
    if (r >= 0 && r < state.shape.rows) atomicOr(&state.status[r], bits);
  }
}

// Reports the (block-uniform) bits of a check. All threads of the block.
__device__ inline void report(const eviction_state<memory_space::device>& state, std::int32_t batch,
                              const sequence_check& c, std::uint32_t own, std::uint32_t batch_bits) {
  if (threadIdx.x == 0 && own != 0 && c.row_ok) atomicOr(&state.status[c.row], own);
  if (batch_bits != 0) flag_batch(state, batch, batch_bits);
}

// Counts, in page_counts[num_pages] (zeroed before the launch), how often
// each pool page is listed: sequence b adds its own entries, when they
// passed the checks (a sequence with a bad entry is flagged itself). After
// the kernel, page_counts[p] > 1 means p is listed more than once in
// indices[0, indptr[batch]) (host: compress's and compact's shared-page
// check). All threads of the block.
__device__ inline void count_page_listings(const sequence_table& seqs, std::int32_t b, bool length_ok,
                                           std::int32_t* page_counts) {
  if (page_counts == nullptr || !seqs.paged || !length_ok) return;
  const std::int32_t begin = seqs.indptr[b], end = seqs.indptr[b + 1];
  for (std::int32_t i = begin + static_cast<std::int32_t>(threadIdx.x); i < end;
       i += static_cast<std::int32_t>(blockDim.x))
    atomicAdd(&page_counts[seqs.indices[i]], 1);
}

// Whether any of pages [first, last] of sequence b's list (indices into its
// list, not page ids) is listed more than once, by count_page_listings'
// counts. Block-uniform; all threads of the block.
__device__ inline bool pages_listed_twice(const sequence_table& seqs, std::int32_t b, std::int32_t first,
                                          std::int32_t last, const std::int32_t* page_counts) {
  std::uint32_t twice = 0;
  const std::int32_t at = seqs.indptr[b];
  for (std::int32_t p = first + static_cast<std::int32_t>(threadIdx.x); p <= last;
       p += static_cast<std::int32_t>(blockDim.x))
    if (page_counts[seqs.indices[at + p]] > 1) twice = 1;
  return block::block_or(twice) != 0;
}

enum class observe_mode { admit, probabilities, queries };

// A quantized cache's K parameters an observe call reads, which must be
// finite (host: validate_key_params, "cache.k_params"): every held row of
// a sequence with queries (observe from queries), or the new rows
// [tracked, length) (static scorers). `per_row` == 0: nothing to check (a
// cache that is not quantized, or a call that reads no K).
struct key_params_check {
  row_table<float> params;
  std::int32_t per_row = 0;
  bool every_row = false;
};

template <class View>
key_params_check make_key_params_check(const View& cache, bool every_row) {
  key_params_check k;
  if constexpr (is_quantized_view_v<View>) {
    k.params = make_params_table<float>(cache);
    k.per_row = cache.params_per_row();
    k.every_row = every_row;
  }
  return k;
}

// Whether any K parameter of the rows `check` names of sequence b is not
// finite: heads blockIdx.x, blockIdx.x + gridDim.x, ... (the block's share),
// slots [first, len). All threads of the block; the result is the thread's.
__device__ inline bool k_params_not_finite(const key_params_check& check, std::int32_t kv_heads, std::int32_t b,
                                           std::int32_t first, std::int32_t len) {
  bool bad = false;
  for (std::int32_t h = static_cast<std::int32_t>(blockIdx.x); h < kv_heads; h += static_cast<std::int32_t>(gridDim.x))
    for (std::int32_t t = first + static_cast<std::int32_t>(threadIdx.x); t < len;
         t += static_cast<std::int32_t>(blockDim.x)) {
      const float* p = check.params.k_row(b, h, t);
      for (std::int32_t i = 0; i < check.per_row; ++i) bad |= !isfinite(p[i]);
    }
  return bad;
}

// Grid (heads, batch): block (x, b) checks sequence b (reported by x == 0)
// and the probabilities, or the log-sum-exp values and the ragged extents,
// of query heads x, x + heads, ..., and a quantized cache's K parameters of
// its share of the KV heads (`key_params`). The launch picks `heads`: one
// per query head where there are many values to read (probabilities), one
// per KV head for a quantized cache's parameters, else 1 (a decode step's
// log-sum-exp is a few values a sequence). `counts` are the queries'
// (probabilities: the probability view's).
template <observe_mode Mode>
__global__ void __launch_bounds__(slot_traits::threads)
    observe_check_kernel(sequence_table seqs, eviction_state<memory_space::device> state, query_rows counts,
                         probability_view<memory_space::device> probs, query_rows lse_rows,
                         lse_view<memory_space::device> lse, std::int32_t head_dim, key_params_check key_params) {
  allow_second_kernel();  // launch.cuh
  const auto b = static_cast<std::int32_t>(blockIdx.y);
  const bool first = blockIdx.x == 0;
  sequence_check c = check_sequence(seqs, state, b, first);
  if constexpr (Mode != observe_mode::admit) check_queries(counts, b, c);
  std::uint32_t values = 0;
  const std::int32_t q = c.queries, len = c.length;
  if (Mode != observe_mode::admit && c.own == 0 && c.batch == 0 && c.row_ok && len > 0 && q > 0) {
    values |= check_new_tokens(state, c, static_cast<std::int32_t>(threadIdx.x), static_cast<std::int32_t>(blockDim.x));
    if constexpr (Mode == observe_mode::probabilities) {
      // Never read past the span: this sequence's rows hold `len` columns.
      if (counts.reach(b, q, len) > static_cast<std::int64_t>(counts.size)) {
        values |= status_view_extent;
      } else {
        for (auto qh = static_cast<std::int32_t>(blockIdx.x); qh < counts.q_heads; qh += static_cast<std::int32_t>(gridDim.x))
          for (std::int32_t j = 0; j < q; ++j) {
            const float* row = probs.row(b, qh, j);
            const std::int32_t visible = len - q + j + 1;
            for (std::int32_t t = threadIdx.x; t < visible; t += blockDim.x) {
              const float p = row[t];
              if (!(p >= 0.0f && p <= 1.001f)) values |= status_probability;  // NaN fails too
            }
          }
      }
    } else if constexpr (Mode == observe_mode::queries) {
      // Uniform views were bounded on the host; ragged ones only now.
      if (counts.ragged() && counts.reach(b, q, head_dim) > static_cast<std::int64_t>(counts.size))
        values |= status_view_extent;
      if (lse.present()) {
        if (lse_rows.ragged() && lse_rows.reach(b, q, 1) > static_cast<std::int64_t>(lse_rows.size))
          values |= status_view_extent;
        else
          for (auto qh = static_cast<std::int32_t>(blockIdx.x); qh < counts.q_heads; qh += static_cast<std::int32_t>(gridDim.x))
            for (std::int32_t j = threadIdx.x; j < q; j += blockDim.x)
              if (!isfinite(lse.natural(b, qh, j))) values |= status_lse;
      }
    }
  }
  // The K rows observe will read: every held row of a sequence with
  // queries, or (static scorers) the new ones.
  if (key_params.per_row > 0 && c.own == 0 && c.batch == 0 && c.row_ok && len > 0 &&
      (key_params.every_row ? q > 0 : c.tracked < len) &&
      k_params_not_finite(key_params, state.shape.kv_heads, b, key_params.every_row ? 0 : c.tracked, len))
    values |= status_k_params;
  values = block::block_or(values);
  report(state, seqs.batch, c, (first ? c.own : 0u) | values, first ? c.batch : 0u);
}

}  // namespace scissorhands::cuda::detail
