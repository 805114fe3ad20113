#pragma once
// The per-row status words: how the CUDA backend reports what only the
// device can check.
//
// The host validates everything it can without reading device memory (shapes,
// settings, strides, sizes, budget against the protected tokens, outputs)
// and throws scissorhands::invalid_argument exactly like the host backend.
// What depends on device data (lengths, page tables, state rows and
// counters, qo_indptr, probability and log-sum-exp values, a quantized
// cache's K parameters) is checked on the device, before anything is
// written:
//
//   * The state holds one status word per row, `state.status[rows]` (laid
//     out by make_state, zeroed by cuda::reset_state). The word follows its
//     request wherever the scheduler puts it in the batch, and one bad
//     sequence never holds up the others (nor a replayed CUDA graph).
//   * Each call first runs a check kernel that ORs status_flag bits into
//     state.status[row(b)] for what is wrong with sequence b (the conditions
//     for which the host backend throws). The kernels that write run after
//     it on the same stream and skip every sequence whose row is -1 or whose
//     word is non-zero: the launch that finds bad data writes nothing for
//     that sequence (cache rows, state), while the other sequences proceed.
//   * What cannot be pinned on one sequence flags every row of the batch
//     (those in [0, rows); a row outside that range is never written): a
//     state_rows entry out of range or used twice, a padding slot (row -1)
//     that holds tokens or has a bad page-table or qo_indptr entry, a paged
//     indptr[0] != 0, a qo_indptr[0] < 0. Such a launch writes nothing.
//   * A word is sticky: while non-zero its row is skipped by every call,
//     until cuda::reset_sequence(state, row, ...) (which zeroes it) gives the
//     row to a request again. Read the words whenever convenient (after a
//     sync, at the end of a graph replay, every N steps): cudaMemcpyAsync
//     from state.status, shape.rows words.
//   * compress writes its compress_output for every sequence, skipped ones
//     included (new_lengths[b] = length_after_compress(length, budget, m)),
//     so lengths an engine mirrors on the host and its page pool stay
//     consistent; a skipped sequence's cache was not compacted and its
//     contents are void until its row is reset.
//   * Token-level eviction (select.cuh): select reads every layer of a
//     model_state and flags a sequence at fault in its row's word of every
//     layer (so compact and forget skip it in every layer); it also skips a
//     row flagged in any layer. Its selection gives such a sequence count 0,
//     and new_lengths / freed_pages as for compress. compact and forget flag
//     the row of the one layer they apply to.
//   * Calls on one state must be ordered (one stream, or events): a call on
//     another stream could set a word in the middle of a call.
//
// cuda::shrink_page_table, which works on the engine's page table and not
// on a state, reports its data errors through its shrink_result instead
// (cuda/page_table.cuh), with the same flag values.
//
// cudaError_t return values report errors of the CUDA runtime only (launch
// failures), never data errors.
#include <cstdint>
#include <string>

namespace scissorhands::cuda {

enum status_flag : std::uint32_t {
  status_ok = 0,
  status_length = 1u << 0,             // a cache length outside [0, capacity]
  status_page_table = 1u << 1,         // paged: indptr / last_page_len / indices inconsistent
  status_tracked = 1u << 2,            // state.tracked outside [0, length]: tokens removed without compress
  status_position_overflow = 1u << 3,  // next_position negative or out of int32 room for the new tokens
  status_query_length = 1u << 4,       // more queries than tokens in a sequence (length > 0)
  status_probability = 1u << 5,        // a probability NaN or outside [0, 1.001]
  status_lse = 1u << 6,                // a log-sum-exp that is not finite
  status_view_extent = 1u << 7,        // a probability, query or lse view reaches past its span for a sequence
  status_untracked = 1u << 8,          // compress / select: a sequence at budget whose new tokens were never
                                       //   observed (select: in some layer); compact / forget: a selection for a
                                       //   state that does not track every token
  status_positions = 1u << 9,          // compress / select: fewer unprotected (and unpinned) tokens than to evict
  status_state_rows = 1u << 10,        // state_rows out of [-1, rows), used twice, or a padding slot with tokens
  status_state_capacity = 1u << 11,    // a length above state.shape.capacity
  status_qo_indptr = 1u << 12,         // qo_indptr decreasing at this sequence, or negative
  status_step = 1u << 13,              // state.step outside [0, 2^62]: a damaged state
  status_new_length = 1u << 14,        // shrink_page_table: a new length outside [0, the length the table holds]
  status_released = 1u << 15,          // shrink_page_table: `released` too short for the pages released
  // Token-level eviction (shared_heads compress, select, compact, forget):
  status_slot_mismatch = 1u << 16,     // heads (or layers) hold different tokens at a slot, or layers disagree on
                                       //   next_position: one choice cannot serve them all
  status_pinned_prefix = 1u << 17,     // select: pinned_prefix[b] outside [0, length]
  status_selection = 1u << 18,         // compact / forget: a count outside [0, min(length, stride)], or slots
                                       //   outside [0, length) or not strictly ascending
  status_selection_protected = 1u << 19,  // compact / forget: a selected slot holds a protected token
  status_shared_page = 1u << 20,       // compress / compact: a page it would rewrite is listed more than once
  status_k_params = 1u << 21,          // quantized cache: a K parameter (scale or zero point) of a row observe reads
                                       //   is not finite (queries: every held row; static scorers: the new rows)
  status_new_tokens = 1u << 22,        // observe: a query whose token a query already saw (a layer observed twice, a
                                       //   row of another request), or more new tokens than queries once the row
                                       //   has observed one (new_lengths not applied)
};

// A readable list of the flags set in a status word ("ok" when none).
inline std::string describe_status(std::uint32_t word) {
  if (word == 0) return "ok";
  static constexpr struct {
    std::uint32_t bit;
    const char* text;
  } names[] = {
      {status_length, "a cache length is outside [0, capacity]"},
      {status_page_table, "the page table (indptr, last_page_len, indices) is inconsistent"},
      {status_tracked, "state.tracked is outside [0, length]: tokens were removed without compress"},
      {status_position_overflow, "next_position is negative or leaves no int32 position for the new tokens"},
      {status_query_length, "a sequence has more queries than tokens"},
      {status_probability, "a probability is NaN or outside [0, 1]"},
      {status_lse, "a log-sum-exp value is not finite"},
      {status_view_extent, "a probability, query or log-sum-exp view reaches past its span"},
      {status_untracked, "compress / select / compact: a sequence has tokens observe never admitted (in some layer)"},
      {status_positions, "compress / select: fewer unprotected, unpinned tokens than to evict"},
      {status_state_rows, "state_rows: a row outside [-1, rows), a row used twice, or a padding slot holding tokens"},
      {status_state_capacity, "a sequence holds more tokens than state.shape.capacity"},
      {status_qo_indptr, "qo_indptr is negative or decreasing"},
      {status_step, "state.step is outside [0, 2^62]: the state is damaged"},
      {status_new_length, "shrink_page_table: a new length is negative or above the length the table holds"},
      {status_released, "shrink_page_table: `released` is too short for the pages released"},
      {status_slot_mismatch,
       "shared granularity: heads or layers hold different tokens at a slot, or layers disagree on next_position"},
      {status_pinned_prefix, "select: pinned_prefix is outside [0, length]"},
      {status_selection,
       "compact / forget: a selection count outside [0, min(length, stride)], or slots out of range or not ascending"},
      {status_selection_protected, "compact / forget: a selected slot holds a protected token"},
      {status_shared_page, "compress / compact: a page it would rewrite is listed more than once in the page table"},
      {status_k_params, "cache.k_params: a K scale or zero point of a row observe reads is not finite"},
      {status_new_tokens,
       "observe: the queries are not the state's new tokens (a layer observed twice, a row reused without "
       "reset_sequence, or new_lengths not applied)"},
  };
  std::string out;
  std::uint32_t known = 0;
  for (const auto& n : names) {
    known |= n.bit;
    if (word & n.bit) out += (out.empty() ? "" : "; ") + std::string(n.text);
  }
  if (word & ~known) out += (out.empty() ? "" : "; ") + std::string("unknown flags");
  return out;
}

}  // namespace scissorhands::cuda
