#include "cell_map.h"

#include <algorithm>

namespace sh_llama {

bool cell_map::write(const std::int64_t* cells, const std::int32_t* positions, std::size_t n, std::int64_t n_cells,
                     std::string* why) {
  if (static_cast<std::int64_t>(pos_of_cell.size()) < n_cells) pos_of_cell.resize(static_cast<std::size_t>(n_cells), -1);
  llama_pos overwritten = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (cells[i] < 0 || cells[i] >= static_cast<std::int64_t>(pos_of_cell.size())) {
      *why = "the K write node names cell " + std::to_string(cells[i]) + ", outside the cache's " +
             std::to_string(pos_of_cell.size()) + " cells";
      return false;
    }
    overwritten = std::max(overwritten, pos_of_cell[static_cast<std::size_t>(cells[i])]);
  }
  for (std::size_t i = 0; i < n; ++i) pos_of_cell[static_cast<std::size_t>(cells[i])] = positions[i];
  if (overwritten >= 0) {
    // The purge rule: every other cell at or below the overwritten position leaves.
    std::vector<char> fresh(pos_of_cell.size(), 0);
    for (std::size_t i = 0; i < n; ++i) fresh[static_cast<std::size_t>(cells[i])] = 1;
    for (std::size_t c = 0; c < pos_of_cell.size(); ++c)
      if (!fresh[c] && pos_of_cell[c] >= 0 && pos_of_cell[c] <= overwritten) pos_of_cell[c] = -1;
  }
  return true;
}

void cell_map::remove(llama_pos p) {
  for (auto& q : pos_of_cell)
    if (q == p) q = -1;
}

std::int32_t cell_map::held() const {
  return static_cast<std::int32_t>(std::count_if(pos_of_cell.begin(), pos_of_cell.end(), [](llama_pos p) { return p >= 0; }));
}

}  // namespace sh_llama
