#pragma once
// The requests of a differential test as a continuous-batching scheduler
// holds them: each keeps its state row and (paged) its pages for its whole
// life, and sits at a batch position; positions no request holds are
// padding. sync() writes the batch the engine hands over -- the state rows
// and, paged, the FlashInfer page table, else the lengths -- on the host
// and on the device. Shared by differential.cuh and token_level.cu.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "harness.cuh"

namespace harness {

// A batch's lengths (contiguous cache) and page table (paged), in one
// memory space.
template <sh::memory_space S>
struct kv_table {
  sh::span<const std::int32_t, S> lengths, indptr, indices, last;
};

struct request_batch {
  int batch = 0, page_size = 1;
  bool paged = false;
  std::vector<int> row_of, pos_of, len;          // per request; pos_of changes only through move_to
  std::vector<std::vector<std::int32_t>> pages;  // per request (paged)
  std::vector<std::int32_t> h_lengths, h_indptr, h_indices, h_last, h_rows;
  device_buffer<std::int32_t> d_lengths, d_indptr, d_indices, d_last, d_rows;

  // `live` requests of length 0 among `rows` state rows. Unmapped, request
  // q is at position q in row q; mapped, rows and positions are shuffled.
  // Paged, each request owns max_pages of the num_pages pool pages.
  template <class Rng>
  request_batch(Rng& rng, int batch_size, int live, int rows, bool mapped, bool is_paged, int page, int max_pages,
                int num_pages)
      : batch(batch_size),
        page_size(page),
        paged(is_paged),
        row_of(live),
        pos_of(live),
        len(live, 0),
        pages(live),
        h_lengths(batch_size),
        h_indptr(batch_size + 1),
        h_indices(std::max(1, batch_size * max_pages)),
        h_last(batch_size),
        h_rows(batch_size),
        d_lengths(batch_size),
        d_indptr(batch_size + 1),
        d_indices(h_indices.size()),
        d_last(batch_size),
        d_rows(batch_size),
        request_at_(batch_size, -1) {
    std::vector<int> first_at(live);  // pos_of is set by move_to, the one place a request moves
    for (int q = 0; q < live; ++q) row_of[q] = first_at[q] = q;
    if (mapped) {
      std::vector<int> r(rows), p(batch_size);
      std::iota(r.begin(), r.end(), 0);
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(r.begin(), r.end(), rng);
      std::shuffle(p.begin(), p.end(), rng);
      for (int q = 0; q < live; ++q) row_of[q] = r[q], first_at[q] = p[q];
    }
    if (paged) {
      std::vector<std::int32_t> ids(num_pages);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int q = 0; q < live; ++q) pages[q].assign(ids.begin() + q * max_pages, ids.begin() + (q + 1) * max_pages);
    }
    move_to(first_at);
  }

  int live() const { return static_cast<int>(len.size()); }
  // Request q moves to batch position p[q] (the scheduler reorders its
  // batch); the position map is kept so that len_at is O(1) in loops.
  void move_to(const std::vector<int>& p) {
    std::fill(request_at_.begin(), request_at_.end(), -1);
    for (int q = 0; q < live(); ++q) request_at_[p[q]] = q, pos_of[q] = p[q];
  }
  // The request at each batch position, -1 for padding.
  const std::vector<int>& at_position() const { return request_at_; }
  int len_at(int b) const {
    const int q = request_at_[b];
    return q < 0 ? 0 : len[q];
  }
  kv_table<host_space> host_table() const {
    return {{h_lengths.data(), h_lengths.size()}, {h_indptr.data(), h_indptr.size()},
            {h_indices.data(), h_indices.size()}, {h_last.data(), h_last.size()}};
  }
  kv_table<device_space> device_table() const {
    return {{d_lengths.data(), d_lengths.size()}, {d_indptr.data(), d_indptr.size()},
            {d_indices.data(), d_indices.size()}, {d_last.data(), d_last.size()}};
  }
  void sync() {
    const auto who = at_position();
    for (int b = 0; b < batch; ++b) h_rows[b] = who[b] < 0 ? -1 : row_of[who[b]];
    d_rows.upload(h_rows);
    if (paged) {
      const int P = page_size;
      h_indptr[0] = 0;
      for (int b = 0; b < batch; ++b) {
        const int l = who[b] < 0 ? 0 : len[who[b]];
        const int used = (l + P - 1) / P;
        for (int i = 0; i < used; ++i) h_indices[h_indptr[b] + i] = pages[who[b]][i];
        h_indptr[b + 1] = h_indptr[b] + used;
        h_last[b] = used == 0 ? 0 : l - (used - 1) * P;
      }
      d_indptr.upload(h_indptr);
      d_indices.upload(h_indices);
      d_last.upload(h_last);
    } else {
      for (int b = 0; b < batch; ++b) h_lengths[b] = who[b] < 0 ? 0 : len[who[b]];
      d_lengths.upload(h_lengths);
    }
  }

 private:
  std::vector<int> request_at_;
};

}  // namespace harness
