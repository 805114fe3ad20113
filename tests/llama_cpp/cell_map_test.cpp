// The glue's cell map on its own: writes, removals, and the purge rule it
// mirrors from llama.cpp (a write over an occupied cell drops every older
// position of that cell's sequence from that cache, and no other
// sequence's). The runs through llama.cpp (run.sh) check the map against
// llama.cpp itself; this one pins the rule.
#include <cstdio>
#include <string>
#include <vector>

#include "cell_map.h"

namespace {
int passed = 0, failed = 0;
void check(bool ok, const char* what) {
  ok ? ++passed : ++failed;
  if (!ok) std::printf("FAILED: %s\n", what);
}
}  // namespace

int main() {
  using sh_llama::cell_map;
  std::string why;
  {
    cell_map m;
    const std::int64_t cells[] = {0, 1, 2, 3};
    const llama_seq_id seqs[] = {0, 0, 0, 0};
    const llama_pos pos[] = {0, 1, 2, 3};
    check(m.write(cells, seqs, pos, 4, 8, &why), "a write into empty cells is accepted");
    check(m.pos_of_cell.size() == 8 && m.held(0) == 4, "the map grows to the cache's cells and holds 4");
    m.remove(0, 1);
    check(m.held(0) == 3 && m.pos_of_cell[1] == -1 && m.seq_of_cell[1] == -1, "remove clears the position's cell");
    const std::int64_t more[] = {1};
    const llama_seq_id zero[] = {0};
    const llama_pos next[] = {4};
    check(m.write(more, zero, next, 1, 8, &why) && m.held(0) == 4, "a freed cell is reused without a purge");
    check(m.pos_of_cell[0] == 0 && m.pos_of_cell[2] == 2, "the others stay");
    check(m.positions(0) == std::vector<llama_pos>({0, 2, 3, 4}), "positions() lists them ascending");
  }
  {
    // A sliding-window cache of 4 cells holding positions 10..13 overwrites
    // cell 1 (position 11) with 14: positions <= 11 leave (10 and 11).
    cell_map m;
    const std::int64_t cells[] = {0, 1, 2, 3};
    const llama_seq_id seqs[] = {0, 0, 0, 0};
    const llama_pos pos[] = {10, 11, 12, 13};
    check(m.write(cells, seqs, pos, 4, 4, &why), "fill");
    const std::int64_t over[] = {1};
    const llama_seq_id zero[] = {0};
    const llama_pos next[] = {14};
    check(m.write(over, zero, next, 1, 4, &why), "overwrite");
    check(m.pos_of_cell[0] == -1, "purge: position 10 (older than the overwritten 11) leaves");
    check(m.pos_of_cell[1] == 14 && m.pos_of_cell[2] == 12 && m.pos_of_cell[3] == 13,
          "purge: the new token and the newer positions stay");
    check(m.held(0) == 3, "3 held after the purge");
  }
  {
    // Two sequences in one cache: overwriting a cell of sequence 1 purges
    // sequence 1's older positions only.
    cell_map m;
    const std::int64_t cells[] = {0, 1, 2, 3, 4, 5};
    const llama_seq_id seqs[] = {0, 1, 0, 1, 0, 1};
    const llama_pos pos[] = {0, 0, 1, 1, 2, 2};
    check(m.write(cells, seqs, pos, 6, 6, &why), "two sequences fill");
    const std::int64_t over[] = {3};
    const llama_seq_id one[] = {1};
    const llama_pos next[] = {3};
    check(m.write(over, one, next, 1, 6, &why), "sequence 1 overwrites its position 1");
    check(m.held(0) == 3, "sequence 0 keeps all three");
    check(m.positions(1) == std::vector<llama_pos>({2, 3}), "sequence 1 keeps 2 and the new 3 (0 and 1 purged)");
    m.remove_sequence(0);
    check(m.held(0) == 0 && m.held(1) == 2, "remove_sequence drops one sequence only");
  }
  {
    cell_map m;
    const std::int64_t bad[] = {5};
    const llama_seq_id zero[] = {0};
    const llama_pos pos[] = {0};
    check(!m.write(bad, zero, pos, 1, 4, &why) && why.find("cell 5") != std::string::npos,
          "a cell id beyond the cache is refused, naming it");
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
