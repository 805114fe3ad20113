#pragma once
// What compress reports, in caller-owned spans: the library never writes the
// engine's lengths or page table, so one table can serve every layer.
//
// After the last layer that shares the lengths, the engine applies them:
// copies new_lengths (contiguous), or for a FlashInfer page table releases
// the freed trailing pages and rewrites last_page_len
// (host::shrink_page_table, cuda::shrink_page_table). new_lengths[b] is
// always length_after_compress(length(b), budget, m) (eviction_state.hpp),
// so an engine may also compute it on the host without a read-back; the
// CUDA backend writes that value even for a sequence it skipped for a
// device-found error (its contents are void until its row is reset).
#include <cstdint>

#include "span.hpp"

namespace scissorhands {

template <memory_space Space>
struct compress_output {
  span<std::int32_t, Space> new_lengths;  // [batch] every sequence's length after the call
  // [batch] trailing pages a compaction emptied. Required for pages of
  // several tokens; optional (empty) for page size 1, where it counts
  // trailing slots (= length - new length) and a slot-allocator engine
  // frees selection.cache_slots instead, and for contiguous caches (all 0).
  span<std::int32_t, Space> freed_pages;
};

// What shrink_page_table reports, in the backend's memory (one entry): the
// same call on both backends. The host refuses bad data by throwing and so
// always writes status 0; the device writes its status_flag bits
// (cuda/status.cuh) for data only it can check.
struct shrink_result {
  std::int32_t released = 0;  // page ids written to `released` (0 when status != 0)
  std::uint32_t status = 0;   // non-zero: nothing else was written
};

}  // namespace scissorhands
