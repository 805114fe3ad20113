#pragma once
// Which cell of llama.cpp's KV cache holds which position, rebuilt from the
// public API alone: every layer's K write node ("cache_k_l<il> (view)",
// GGML_OP_SET_ROWS) names the destination cells of the ubatch's tokens
// (src[1], I64) and, down its src[0] chain, the ROPE node whose src[1] holds
// their positions (I32). A cache that overwrites an occupied cell (only the
// sliding-window cache reuses cells whose token left the window) purges
// every older position of the sequence from that cache (llama_kv_cache::
// apply_ubatch); the map mirrors that rule. It rests on graph-internal names
// and that rule: cell_map_check (the glue) compares it with what llama.cpp
// reports every step, and a disagreement stops the run.
#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace sh_llama {

struct cell_map {
  std::vector<llama_pos> pos_of_cell;  // -1: empty (for the one sequence this glue serves)

  // Writes a ubatch: `cells[i]` receives `positions[i]`. Grows to `n_cells`.
  // Returns false (and says why) on a cell id out of range.
  bool write(const std::int64_t* cells, const std::int32_t* positions, std::size_t n, std::int64_t n_cells,
             std::string* why);
  // Drops a position (llama_memory_seq_rm of one position).
  void remove(llama_pos p);
  std::int32_t held() const;
};

}  // namespace sh_llama
