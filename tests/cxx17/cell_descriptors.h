#pragma once
// The bridge descriptors the token-level tests (token_level_test.cpp,
// token_compact_test.cpp) build over a page-size-1 cell table, as
// llama.cpp's cells are handed over: the table, the K (and V) cells as a
// paged cache over it, and select's outputs as a selection. C++17.
#include <cstddef>
#include <cstdint>

#include <scissorhands/bridge/bridge.h>

namespace cxx17_cells {

namespace br = scissorhands::bridge;

struct cell_geometry {
  std::int32_t batch, kv_heads, head_dim, cells, capacity;
};

// Memory: the step's indptr, indices and last_page_len pointers.
template <class Memory>
br::token_table cell_table(const Memory& m, const cell_geometry& g) {
  br::token_table t;
  t.indptr = m.indptr;
  t.indices = m.indices;
  t.indices_size = g.cells;
  t.last_page_len = m.last_page_len;
  t.batch = g.batch;
  t.kv_heads = g.kv_heads;
  t.page_size = 1;
  t.num_pages = g.cells;
  t.max_pages_per_sequence = g.capacity;
  return t;
}

// One layer's K cells (and V cells, when given) over the step's table.
template <class Memory, class T>
br::paged_cache<T> cell_cache(const Memory& m, const cell_geometry& g, T* k, std::size_t k_size, T* v = nullptr,
                              std::size_t v_size = 0) {
  br::paged_cache<T> c;
  c.k_pages = k;
  c.k_size = k_size;
  c.k_layout = br::paged_layout::nhd(1, g.kv_heads, g.head_dim);
  if (v != nullptr) {
    c.v_pages = v;
    c.v_size = v_size;
    c.v_layout = c.k_layout;
  }
  c.indptr = m.indptr;
  c.indices = m.indices;
  c.indices_size = g.cells;
  c.last_page_len = m.last_page_len;
  c.batch = g.batch;
  c.kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.page_size = 1;
  c.num_pages = g.cells;
  c.max_pages_per_sequence = g.capacity;
  return c;
}

// Selection: select's outputs as raw pointers (stride, counts, slots,
// cache_slots, new_lengths, freed_pages).
template <class Selection>
br::selection selection_of(const Selection& s) {
  br::selection out;
  out.stride = s.stride;
  out.counts = s.counts;
  out.slots = s.slots;
  out.cache_slots = s.cache_slots;
  out.out = {s.new_lengths, s.freed_pages};
  return out;
}

}  // namespace cxx17_cells
