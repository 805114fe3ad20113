#pragma once
// Which cell of one of llama.cpp's KV caches holds which (sequence,
// position), rebuilt from the graph: every layer's K write node
// ("cache_k_l<il> (view)", GGML_OP_SET_ROWS) names the destination cells of
// the ubatch's tokens (src[1], I64: stream * cells per stream + cell), and
// down its src[0] chain the ROPE node's src[1] holds their positions (I32);
// which sequence each token belongs to comes from the batch (the glue's
// before_decode). A cache that overwrites an occupied cell (only the
// sliding-window cache reuses cells whose token left every window) purges
// every older position of that cell's sequence from the cache
// (llama_kv_cache::apply_ubatch); the map mirrors that rule. It rests on
// graph-internal names and that rule: the glue compares it with llama.cpp's
// mask and counts at every step, and a disagreement stops the run.
#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace sh_llama {

struct cell_map {
  // Per cell, over every stream (cell id = stream * cells per stream + cell):
  // the sequence holding it (-1: empty) and its position.
  std::vector<llama_seq_id> seq_of_cell;
  std::vector<llama_pos> pos_of_cell;

  // Writes a ubatch: `cells[i]` receives (`seqs[i]`, `positions[i]`). Grows
  // to `n_cells`. Returns false (and says why) on a cell id out of range.
  bool write(const std::int64_t* cells, const llama_seq_id* seqs, const llama_pos* positions, std::size_t n,
             std::int64_t n_cells, std::string* why);
  // Drops one position of a sequence (llama_memory_seq_rm of one position).
  void remove(llama_seq_id seq, llama_pos p);
  // Drops a whole sequence (llama_memory_seq_rm(seq, -1, -1)).
  void remove_sequence(llama_seq_id seq);
  // Cells the sequence holds.
  std::int32_t held(llama_seq_id seq) const;
  // The sequence's positions in this cache, ascending.
  std::vector<llama_pos> positions(llama_seq_id seq) const;
};

}  // namespace sh_llama
