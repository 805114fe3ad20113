#include "cell_map.h"

#include <algorithm>

namespace sh_llama {

bool cell_map::write(const std::int64_t* cells, const llama_seq_id* seqs, const llama_pos* positions, std::size_t n,
                     std::int64_t n_cells, std::string* why) {
  if (static_cast<std::int64_t>(pos_of_cell.size()) < n_cells) {
    pos_of_cell.resize(static_cast<std::size_t>(n_cells), -1);
    seq_of_cell.resize(static_cast<std::size_t>(n_cells), -1);
  }
  // The largest position each sequence loses to an overwrite.
  std::vector<std::pair<llama_seq_id, llama_pos>> overwritten;
  for (std::size_t i = 0; i < n; ++i) {
    if (cells[i] < 0 || cells[i] >= static_cast<std::int64_t>(pos_of_cell.size())) {
      *why = "the K write node names cell " + std::to_string(cells[i]) + ", outside the cache's " +
             std::to_string(pos_of_cell.size()) + " cells";
      return false;
    }
    const auto c = static_cast<std::size_t>(cells[i]);
    if (seq_of_cell[c] < 0) continue;
    auto it = std::find_if(overwritten.begin(), overwritten.end(),
                           [&](const auto& e) { return e.first == seq_of_cell[c]; });
    if (it == overwritten.end())
      overwritten.push_back({seq_of_cell[c], pos_of_cell[c]});
    else
      it->second = std::max(it->second, pos_of_cell[c]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::size_t>(cells[i]);
    seq_of_cell[c] = seqs[i];
    pos_of_cell[c] = positions[i];
  }
  if (!overwritten.empty()) {
    // The purge rule: every other cell of that sequence at or below the
    // overwritten position leaves.
    std::vector<char> fresh(pos_of_cell.size(), 0);
    for (std::size_t i = 0; i < n; ++i) fresh[static_cast<std::size_t>(cells[i])] = 1;
    for (const auto& [seq, top] : overwritten)
      for (std::size_t c = 0; c < pos_of_cell.size(); ++c)
        if (!fresh[c] && seq_of_cell[c] == seq && pos_of_cell[c] <= top) seq_of_cell[c] = -1, pos_of_cell[c] = -1;
  }
  return true;
}

void cell_map::remove(llama_seq_id seq, llama_pos p) {
  for (std::size_t c = 0; c < pos_of_cell.size(); ++c)
    if (seq_of_cell[c] == seq && pos_of_cell[c] == p) seq_of_cell[c] = -1, pos_of_cell[c] = -1;
}

void cell_map::remove_sequence(llama_seq_id seq) {
  for (std::size_t c = 0; c < pos_of_cell.size(); ++c)
    if (seq_of_cell[c] == seq) seq_of_cell[c] = -1, pos_of_cell[c] = -1;
}

std::int32_t cell_map::held(llama_seq_id seq) const {
  return static_cast<std::int32_t>(std::count(seq_of_cell.begin(), seq_of_cell.end(), seq));
}

std::vector<llama_pos> cell_map::positions(llama_seq_id seq) const {
  std::vector<llama_pos> out;
  for (std::size_t c = 0; c < pos_of_cell.size(); ++c)
    if (seq_of_cell[c] == seq) out.push_back(pos_of_cell[c]);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sh_llama
