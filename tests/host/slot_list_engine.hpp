#pragma once
// Pieces of a slot-list engine (llama.cpp's cells: page size 1, each
// request's cells in position order) that the token-level tests share
// (host/token_table_test.cpp, cxx17/token_level_test.cpp). C++17 and no
// library header: the C++17 engine includes it too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sh_test {

// The step's table: batch position b lists the cells of request rows[b]
// (none for padding, -1) as a FlashInfer table at page size 1 (indptr,
// indices from 0, last_page_len). Returns the longest list, at least 1 (the
// probabilities' columns).
inline std::int32_t build_cell_table(const std::vector<std::vector<std::int32_t>>& cells_of, const std::int32_t* rows,
                                     std::int32_t batch, std::int32_t* indptr, std::int32_t* indices,
                                     std::int32_t* last_page_len) {
  std::int32_t used = 0, longest = 1;
  indptr[0] = 0;
  for (std::int32_t b = 0; b < batch; ++b) {
    const std::int32_t r = rows[b];
    const auto n = r >= 0 ? static_cast<std::int32_t>(cells_of[static_cast<std::size_t>(r)].size()) : 0;
    for (std::int32_t i = 0; i < n; ++i)
      indices[used + i] = cells_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
    used += n;
    indptr[b + 1] = used;
    last_page_len[b] = n > 0 ? 1 : 0;
    longest = std::max(longest, n);
  }
  return longest;
}

// Fills probs, ragged and token-major [token][q_heads][columns], with rows
// that sum to 1 over what each query sees: query j of the q_len new tokens
// of sequence b (from qo) sees the first len - q_len + j + 1 of its len
// slots (from indptr). weight(b, qh, j, t) > 0 weighs slot t before the
// normalisation; the rest of a row stays 0.
template <class Weight>
void fill_causal_probabilities(std::vector<float>& probs, const std::int32_t* indptr, const std::int32_t* qo,
                               std::int32_t batch, std::int32_t q_heads, std::int32_t columns, Weight&& weight) {
  probs.assign(static_cast<std::size_t>(qo[batch]) * q_heads * columns, 0.0f);
  for (std::int32_t b = 0; b < batch; ++b) {
    const std::int32_t len = indptr[b + 1] - indptr[b], q_len = qo[b + 1] - qo[b];
    for (std::int32_t qh = 0; qh < q_heads; ++qh)
      for (std::int32_t j = 0; j < q_len; ++j) {
        float* row = probs.data() + (static_cast<std::size_t>(qo[b] + j) * q_heads + qh) * columns;
        const std::int32_t visible = len - q_len + j + 1;
        float sum = 0.0f;
        for (std::int32_t t = 0; t < visible; ++t) sum += row[t] = weight(b, qh, j, t);
        for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
      }
  }
}

}  // namespace sh_test
