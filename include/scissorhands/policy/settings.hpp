#pragma once
// Run-time numbers of a policy. Defaults follow the Scissorhands paper
// (history window w = 400, recent window r = 10).
#include <cstdint>

namespace scissorhands {

// How compress closes the gaps the evicted tokens leave.
enum class compaction {
  fill_holes,      // move the kept tokens from the tail into the holes: O(m) row moves (default)
  preserve_order,  // shift every kept token down: O(n) row moves, slot order = insertion order
};

// How compress pools a token's eviction score with its neighbours' (SnapKV's
// 1-D pooling of the vote), when settings.pool_width > 1.
enum class pooling {
  max,   // the highest score in the pool: a token next to an important one is kept too
  mean,  // the mean over the pool
};

struct settings {
  std::int32_t window = 400;       // w: steps a sliding_window history remembers
  std::int32_t recent = 10;        // r: the r most recent tokens are never evicted
  std::int32_t sinks = 0;          // s: tokens at positions 0..s-1 are never evicted
  std::int32_t evict_count = 1;    // m: tokens evicted per trigger (leaves budget - m)
  float alpha = 1.0f;              // important_indicator: a token counts when a >= alpha / n
  float decay = 0.95f;             // exponential_decay: score <- decay * score + observation
  bool normalize = false;          // divide a score by the steps the token was observed
  compaction compaction_mode = compaction::fill_holes;
  std::uint32_t seed = 0;          // random_score: the seed of its hash
  // Pooling: compress ranks slot t by the max or mean eviction score of the
  // slots [t - h, t + h] of its row (h = (pool_width - 1) / 2, clipped to
  // the row's length). Odd, in [1, 255]; 1 = off. Slots are neighbours in
  // position only when the cache keeps insertion order, so pool_width > 1
  // needs compaction_mode = preserve_order.
  std::int32_t pool_width = 1;
  pooling pool_mode = pooling::mean;
};

}  // namespace scissorhands
