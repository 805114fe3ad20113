// The README's integration section, compiled verbatim: CMake extracts its
// ```cpp blocks into readme_snippet.cpp (tests/readme/CMakeLists.txt) and
// this engine drives them (the template over the memory space, here for
// the host backend; tests/cuda/token_level.cu's one_api part runs an
// engine of the same shape on both): two layers over their own page pools and ONE
// page table, requests joining, leaving and moving between batch slots,
// prefill chunks and decode tokens in one ragged step, queries and a base-2
// log-sum-exp computed here. Checks what an engine relies on: every layer
// reports the same new lengths, equal to length_after_compress; pages are
// conserved; a request never holds more than the state's capacity; kept
// rows are rows that were appended for that request, at most once each.
#include "readme_snippet.cpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

namespace {

constexpr auto host = sh::memory_space::host;  // the README's engine, instantiated for the host backend
constexpr std::int32_t num_layers = 2, kv_heads = 2, q_heads = 4, head_dim = 8, page_size = 4, num_pages = 96,
                       max_requests = 4, slots = 3, budget = 24, chunk = 8, max_pages = 16;

int failures = 0;
void expect(bool ok, const char* what, int step) {
  if (!ok) {
    ++failures;
    std::printf("FAILED at step %d: %s\n", step, what);
  }
}

// K/V element d of (request, layer, head, position): identifies the token.
float token_value(int kind, int request, int layer, int head, int position, int d) {
  return static_cast<float>(((((kind * 7 + request) * 3 + layer) * 5 + head) * 1000 + position) % 9973) * 1e-3f +
         static_cast<float>(d) * 1e-4f;
}

struct request {
  int id = 0, row = 0, prompt = 0, produced = 0, next_position = 0;
  std::vector<std::int32_t> pages;
  int length = 0;
};

}  // namespace

int main() {
  const std::size_t pool = std::size_t{num_pages} * page_size * kv_heads * head_dim;
  std::vector<std::vector<float>> k(num_layers, std::vector<float>(pool)), v = k;
  std::vector<std::int32_t> free_pages(num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::reverse(free_pages.begin(), free_pages.end());

  // The compress workspace is sized from a view of the largest table.
  std::vector<std::int32_t> indptr(slots + 1, 0), indices(slots * max_pages, 0), last_page_len(slots, 0);
  const auto layer_view = [&](int l) {
    return sh::make_paged_kv_view<float, host>({k[l].data(), k[l].size()}, {v[l].data(), v[l].size()},
                                               {indptr.data(), indptr.size()}, {indices.data(), indices.size()},
                                               {last_page_len.data(), last_page_len.size()}, slots, kv_heads,
                                               head_dim, page_size, num_pages, max_pages);
  };
  // The engine's memory for the states and the workspace, sized first.
  using engine_eviction = eviction<host>;
  const sh::state_shape shape = engine_eviction::layer_shape(max_requests, kv_heads, budget, chunk);
  const std::size_t state_memory_bytes = num_layers * sh::state_bytes(shape);
  std::unique_ptr<std::byte, decltype(&std::free)> state_memory(
      static_cast<std::byte*>(std::aligned_alloc(256, state_memory_bytes)), &std::free);
  std::vector<std::byte> workspace(engine_eviction::workspace_bytes(layer_view(0), shape));
  engine_eviction ev(sh::backend<host>{}, num_layers, budget, shape, {state_memory.get(), state_memory_bytes},
                     {workspace.data(), workspace.size()});

  std::vector<request> running;
  std::vector<int> free_rows{3, 2, 1, 0};
  int next_id = 0, finished = 0;
  std::uint32_t rng = 12345;
  const auto rand = [&] { return rng = rng * 1664525u + 1013904223u, static_cast<int>(rng >> 8); };

  for (int step = 0; step < 120; ++step) {
    // Join, leave, and shuffle batch slots.
    if (running.size() < static_cast<std::size_t>(slots) && rand() % 3 == 0 && !free_rows.empty()) {
      request r;
      r.id = next_id++;
      r.row = free_rows.back();
      free_rows.pop_back();
      r.prompt = 5 + rand() % 30;
      ev.start_request(r.row, 0);
      running.push_back(r);
    }
    for (std::size_t i = 0; i < running.size();)
      if (running[i].produced > 40 + running[i].id % 20) {
        free_pages.insert(free_pages.end(), running[i].pages.begin(), running[i].pages.end());
        free_rows.push_back(running[i].row);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        ++finished;
      } else {
        ++i;
      }
    for (std::size_t i = running.size(); i > 1; --i) std::swap(running[i - 1], running[static_cast<std::size_t>(rand()) % i]);

    // Batch slots: running requests, then padding (row -1, no pages).
    std::vector<std::int32_t> rows(slots, -1), qo(slots + 1, 0), lengths(slots, 0);
    for (int b = 0; b < slots; ++b) {
      int tokens = 0;
      if (b < static_cast<int>(running.size())) {
        request& r = running[static_cast<std::size_t>(b)];
        rows[static_cast<std::size_t>(b)] = r.row;
        tokens = r.next_position < r.prompt ? std::min(chunk, r.prompt - r.next_position) : 1;
        for (int t = 0; t < tokens; ++t, ++r.length, ++r.next_position) {
          if (r.length == static_cast<int>(r.pages.size()) * page_size) {
            r.pages.push_back(free_pages.back());
            free_pages.pop_back();
          }
          const std::int32_t page = r.pages[static_cast<std::size_t>(r.length / page_size)];
          for (int l = 0; l < num_layers; ++l)
            for (int h = 0; h < kv_heads; ++h)
              for (int d = 0; d < head_dim; ++d) {
                const std::size_t at =
                    ((static_cast<std::size_t>(page) * page_size + r.length % page_size) * kv_heads + h) * head_dim + d;
                k[l][at] = token_value(0, r.id, l, h, r.next_position, d);
                v[l][at] = token_value(1, r.id, l, h, r.next_position, d);
              }
        }
        if (r.next_position > r.prompt) ++r.produced;
        lengths[static_cast<std::size_t>(b)] = r.length;
      }
      qo[static_cast<std::size_t>(b) + 1] = qo[static_cast<std::size_t>(b)] + tokens;
    }
    // The shared table.
    indices.assign(indices.size(), 0);
    for (int b = 0; b < slots; ++b) {
      indptr[static_cast<std::size_t>(b) + 1] = indptr[static_cast<std::size_t>(b)];
      last_page_len[static_cast<std::size_t>(b)] = 0;
      if (b < static_cast<int>(running.size())) {
        const request& r = running[static_cast<std::size_t>(b)];
        for (std::int32_t p : r.pages) indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b) + 1]++)] = p;
        last_page_len[static_cast<std::size_t>(b)] = r.length - (static_cast<int>(r.pages.size()) - 1) * page_size;
      }
    }
    const int tokens = qo[slots];
    std::vector<float> q(static_cast<std::size_t>(tokens) * q_heads * head_dim);
    for (float& x : q) x = static_cast<float>(rand() % 2001 - 1000) * 1e-3f;

    std::vector<std::vector<std::int32_t>> new_lengths(num_layers, std::vector<std::int32_t>(slots, -1));
    std::vector<std::int32_t> freed(slots, -1);
    for (int l = 0; l < num_layers; ++l) {
      const auto cache = layer_view(l);
      // The attention kernel's log-sum-exp, base 2, [token][q_head].
      std::vector<float> lse(static_cast<std::size_t>(tokens) * q_heads, 0.0f);
      for (int b = 0; b < slots; ++b) {
        const int q_len = qo[static_cast<std::size_t>(b) + 1] - qo[static_cast<std::size_t>(b)];
        for (int j = 0; j < q_len; ++j)
          for (int qh = 0; qh < q_heads; ++qh) {
            const int token = qo[static_cast<std::size_t>(b)] + j;
            const int visible = lengths[static_cast<std::size_t>(b)] - q_len + j + 1;
            double m = -1e300, sum = 0.0;
            std::vector<double> logits;
            for (int t = 0; t < visible; ++t) {
              const float* key = cache.k_row(b, qh / (q_heads / kv_heads), t);
              double dot = 0.0;
              for (int d = 0; d < head_dim; ++d)
                dot += double{q[(static_cast<std::size_t>(token) * q_heads + qh) * head_dim + d]} * key[d];
              logits.push_back(dot / std::sqrt(double{head_dim}));
              m = std::max(m, logits.back());
            }
            for (double x : logits) sum += std::exp(x - m);
            lse[static_cast<std::size_t>(token) * q_heads + qh] = static_cast<float>((m + std::log(sum)) / std::log(2.0));
          }
      }
      ev.after_attention(l, cache, {rows.data(), rows.size()}, {qo.data(), qo.size()}, {q.data(), q.size()},
                         {lse.data(), lse.size()}, q_heads, {new_lengths[l].data(), slots}, {freed.data(), freed.size()});
    }
    for (int b = 0; b < slots; ++b)
      expect(new_lengths[1][static_cast<std::size_t>(b)] == new_lengths[0][static_cast<std::size_t>(b)] &&
                 new_lengths[0][static_cast<std::size_t>(b)] ==
                     sh::length_after_compress(lengths[static_cast<std::size_t>(b)], budget, ev.policy.config.evict_count),
             "layers agree on the new lengths, and they follow length_after_compress", step);
    std::vector<std::int32_t> released(static_cast<std::size_t>(num_pages), -1);
    sh::shrink_result result{-1, 7};
    ev.end_of_step(layer_view(0), {new_lengths[0].data(), new_lengths[0].size()}, {released.data(), released.size()},
                   {&result, 1});
    expect(result.status == 0, "the host's shrink_result status is 0", step);
    const auto n = static_cast<std::size_t>(result.released);
    std::size_t expected_release = 0;
    for (int b = 0; b < static_cast<int>(running.size()); ++b) {
      request& r = running[static_cast<std::size_t>(b)];
      r.length = new_lengths[0][static_cast<std::size_t>(b)];
      const std::size_t keep = static_cast<std::size_t>((r.length + page_size - 1) / page_size);
      expected_release += r.pages.size() - keep;
      r.pages.resize(keep);
      expect(r.length <= sh::state_capacity_for(budget, chunk), "a request fits the state's capacity", step);
      // Kept rows: appended for this request, each position at most once.
      for (int l = 0; l < num_layers; ++l)
        for (int h = 0; h < kv_heads; ++h) {
          std::set<int> seen;
          for (int t = 0; t < r.length; ++t) {
            const std::int32_t page = r.pages[static_cast<std::size_t>(t / page_size)];
            const std::size_t at = ((static_cast<std::size_t>(page) * page_size + t % page_size) * kv_heads + h) * head_dim;
            int found = -1;
            for (int p = 0; p < r.next_position && found < 0; ++p)
              if (k[l][at] == token_value(0, r.id, l, h, p, 0) && v[l][at + 1] == token_value(1, r.id, l, h, p, 1))
                found = p;
            expect(found >= 0 && seen.insert(found).second, "a kept row is one of the request's tokens, once", step);
          }
        }
    }
    expect(n == expected_release, "shrink_page_table released the trailing pages", step);
    free_pages.insert(free_pages.end(), released.begin(), released.begin() + static_cast<std::ptrdiff_t>(n));
    std::size_t in_use = 0;
    for (const request& r : running) in_use += r.pages.size();
    expect(in_use + free_pages.size() == static_cast<std::size_t>(num_pages), "pages are conserved", step);
  }
  expect(finished > 2, "requests finished and their rows were reused", 120);
  std::printf("readme integration: %d requests, %d finished; %s\n", next_id, finished, failures ? "FAILED" : "ok");
  std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
