#pragma once
// The device-side status word: how the CUDA backend reports what only the
// device can check.
//
// The host validates everything it can without reading device memory (shapes,
// settings, strides, sizes, budget against the protected tokens) and throws
// scissorhands::invalid_argument exactly like the host backend. What depends
// on device data (lengths, page tables, state counters, probability values,
// log-sum-exp values) is checked on the device, before anything is written:
//
//   * Every entry point that writes the cache or the state takes
//     `std::uint32_t* d_status`, one caller-owned word in device memory. The
//     caller zeroes it once (cudaMemsetAsync) and reads it whenever it likes
//     (after a sync, at the end of a graph replay, every N steps).
//   * Each call first runs a check kernel that ORs a status_flag bit into the
//     word for every violated condition (the same conditions for which the
//     host backend throws). The kernels that write run after it on the same
//     stream and do nothing at all if the word is non-zero. So the launch
//     that found bad data leaves cache, state and freed_pages untouched, as
//     the host backend does when it throws.
//   * The word is sticky: once non-zero, every later call given that word is
//     a no-op too, until the caller clears it (typically after
//     cuda::reset_sequence of the offending sequence). A cache whose data
//     went bad is frozen rather than compounded, and a captured graph needs
//     no host round trip to stay safe.
//   * Use one word per stream (one per layer works too): a word shared with
//     launches on another stream that run concurrently can turn non-zero in
//     the middle of a call, leaving it half applied.
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
  status_query_length = 1u << 4,       // q_len above a sequence's length
  status_probability = 1u << 5,        // a probability NaN or outside [0, 1.001]
  status_lse = 1u << 6,                // a log-sum-exp that is not finite
  status_view_extent = 1u << 7,        // the probability view reaches past its span for these lengths
  status_untracked = 1u << 8,          // compress: a sequence at budget whose new tokens were never observed
  status_positions = 1u << 9,          // compress: fewer unprotected tokens than to evict (positions not unique)
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
      {status_query_length, "q_len exceeds a sequence's length"},
      {status_probability, "a probability is NaN or outside [0, 1]"},
      {status_lse, "a log-sum-exp value is not finite"},
      {status_view_extent, "the probability view reaches past its span for the cache lengths"},
      {status_untracked, "compress: a sequence at its budget has tokens observe never admitted"},
      {status_positions, "compress: fewer unprotected tokens than to evict (positions are not unique)"},
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
