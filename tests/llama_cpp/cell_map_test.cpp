// The glue's cell map on its own: writes, removals, and the purge rule it
// mirrors from llama.cpp (a write over an occupied cell drops every older
// position of the sequence from that cache). The runs through llama.cpp
// (run.sh) check the map against llama.cpp itself; this one pins the rule.
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
    const std::int32_t pos[] = {0, 1, 2, 3};
    check(m.write(cells, pos, 4, 8, &why), "a write into empty cells is accepted");
    check(m.pos_of_cell.size() == 8 && m.held() == 4, "the map grows to the cache's cells and holds 4");
    m.remove(1);
    check(m.held() == 3 && m.pos_of_cell[1] == -1, "remove clears the position's cell");
    const std::int64_t more[] = {1};
    const std::int32_t next[] = {4};
    check(m.write(more, next, 1, 8, &why) && m.held() == 4, "a freed cell is reused without a purge");
    check(m.pos_of_cell[0] == 0 && m.pos_of_cell[2] == 2, "the others stay");
  }
  {
    // A sliding-window cache of 4 cells holding positions 10..13 overwrites
    // cell 1 (position 11) with 14: positions <= 11 leave (10 and 11).
    cell_map m;
    const std::int64_t cells[] = {0, 1, 2, 3};
    const std::int32_t pos[] = {10, 11, 12, 13};
    check(m.write(cells, pos, 4, 4, &why), "fill");
    const std::int64_t over[] = {1};
    const std::int32_t next[] = {14};
    check(m.write(over, next, 1, 4, &why), "overwrite");
    check(m.pos_of_cell[0] == -1, "purge: position 10 (older than the overwritten 11) leaves");
    check(m.pos_of_cell[1] == 14 && m.pos_of_cell[2] == 12 && m.pos_of_cell[3] == 13,
          "purge: the new token and the newer positions stay");
    check(m.held() == 3, "3 held after the purge");
  }
  {
    cell_map m;
    const std::int64_t bad[] = {5};
    const std::int32_t pos[] = {0};
    check(!m.write(bad, pos, 1, 4, &why) && why.find("cell 5") != std::string::npos,
          "a cell id beyond the cache is refused, naming it");
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
