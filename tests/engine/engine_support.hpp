#pragma once
// Small pieces the engine tests share: a deterministic random source, token
// contents derived from (request, layer, head, position), a 256-byte aligned
// buffer, byte snapshots, and the steps every engine loop repeats (settings,
// state rows, batch order, the step's error report). The hash finaliser,
// the byte copies and the refusal check come from tests/host; nothing here
// calls the library's selection code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <ranges>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "../host/refusal.hpp"
#include "../host/support.hpp"

namespace engine_test {

using sh_test::bytes_of;
using sh_test::check_refused;
using sh_test::mix64;

// Another seed than tests/host's hash_of: the engine tests' data stays as it was.
inline std::uint64_t hash_of(std::initializer_list<std::int64_t> parts) {
  std::uint64_t h = 0xE6617E5Dull;
  for (std::int64_t p : parts) h = mix64(h ^ static_cast<std::uint64_t>(p));
  return h;
}

// A seeded stream (same sequence on every standard library).
struct rng {
  std::uint64_t state;
  explicit rng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() { return mix64(state++ * 0x2545F4914F6CDD1Dull); }
  // Uniform integer in [lo, hi].
  std::int32_t uniform(std::int32_t lo, std::int32_t hi) {
    return lo + static_cast<std::int32_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1p-53 < p; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

// A signed multiple of 2^-22 in [-amplitude, amplitude): exact in fp32.
inline float hashed_value(std::uint64_t h, float amplitude) {
  const auto bits = static_cast<std::int64_t>(h >> 41);  // 23 bits
  return static_cast<float>(bits - (std::int64_t{1} << 22)) * 0x1p-22f * amplitude;
}

// Element d of the K row (kind 0) or the V row (kind 1) of the token at
// logical `position` of request `request`, layer `layer`, KV head `head`.
// The V row names its token: V[0] = position, V[1] = request id, V[2] =
// layer * 64 + head (all exact in fp32), so the checker can tell which token
// a slot holds by reading the cache alone.
inline float token_value(int kind, std::int32_t request, std::int32_t layer, std::int32_t head, std::int32_t position,
                         std::int32_t d) {
  if (kind == 1 && d == 0) return static_cast<float>(position);
  if (kind == 1 && d == 1) return static_cast<float>(request);
  if (kind == 1 && d == 2) return static_cast<float>(layer * 64 + head);
  return hashed_value(hash_of({kind, request, layer, head, position, d}), kind == 0 ? 2.0f : 1.0f);
}

// Element d of query head qh of the query at `position` (the query's token).
inline float query_value(std::int32_t request, std::int32_t layer, std::int32_t qh, std::int32_t position,
                         std::int32_t d) {
  return hashed_value(hash_of({7, request, layer, qh, position, d}), 3.0f);
}

// 256-byte aligned heap bytes (a state buffer must be).
class aligned_buffer {
 public:
  explicit aligned_buffer(std::size_t bytes, unsigned char fill = 0xA5) : size_(bytes) {
    const std::size_t rounded = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    data_ = static_cast<std::byte*>(std::aligned_alloc(256, rounded));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, fill, rounded);
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  aligned_buffer(aligned_buffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  ~aligned_buffer() { std::free(data_); }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::byte* begin() const { return data_; }  // a range, for bytes_of and push_bytes
  std::byte* end() const { return data_ + size_; }
  scissorhands::host_span<std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Byte snapshots of everything a refused call must leave alone.
using snapshot_t = std::vector<std::vector<std::byte>>;

// The bytes of a range, or of each range of a group (as per layer), onto the snapshot.
template <class Range>
void push_one(snapshot_t& s, const Range& r) {
  if constexpr (std::ranges::range<std::ranges::range_value_t<Range>>)
    for (const auto& inner : r) push_one(s, inner);
  else
    s.push_back(bytes_of(r));
}
template <class... Ranges>
void push_bytes(snapshot_t& s, const Ranges&... ranges) {
  (push_one(s, ranges), ...);
}

// Spans over a vector: its first n elements, or all of them.
template <class T>
scissorhands::host_span<const T> cspan(const std::vector<T>& v, std::size_t n) {
  return {v.data(), n};
}
template <class T>
scissorhands::host_span<const T> cspan(const std::vector<T>& v) {
  return {v.data(), v.size()};
}
template <class T>
scissorhands::host_span<T> mspan(std::vector<T>& v, std::size_t n) {
  return {v.data(), n};
}
template <class T>
scissorhands::host_span<T> mspan(std::vector<T>& v) {
  return {v.data(), v.size()};
}

// The engine's pools under the first `batch` rows of its CSR page table.
inline scissorhands::host_paged_kv_view<float> paged_view(
    scissorhands::host_span<float> k, scissorhands::host_span<float> v, const std::vector<std::int32_t>& indptr,
    const std::vector<std::int32_t>& indices, const std::vector<std::int32_t>& last_page_len, std::int32_t batch,
    std::int32_t kv_heads, std::int32_t head_dim, std::int32_t page_size, std::int32_t num_pages,
    std::int32_t max_pages, bool hnd = false) {
  const auto n = static_cast<std::size_t>(batch);
  return scissorhands::make_paged_kv_view(k, v, cspan(indptr, n + 1), cspan(indices), cspan(last_page_len, n), batch,
                                          kv_heads, head_dim, page_size, num_pages, max_pages,
                                          hnd ? scissorhands::named_layout::hnd : scissorhands::named_layout::nhd);
}

// host::shrink_page_table over the first `batch` rows of the table, which
// must release `expect` (each row's pages past its new length, in row order)
// into `released` and nothing else; returns how many it released.
inline std::size_t shrink_table(std::vector<std::int32_t>& indptr, std::vector<std::int32_t>& indices,
                                std::vector<std::int32_t>& last_page_len, std::int32_t batch, std::int32_t page_size,
                                const std::vector<std::int32_t>& new_lengths, std::vector<std::int32_t>& released,
                                const std::vector<std::int32_t>& expect, const std::string& what,
                                std::vector<std::string>& errors) {
  const auto n = static_cast<std::size_t>(batch);
  std::fill(released.begin(), released.end(), -9);
  const std::size_t count = scissorhands::host::shrink_page_table(
      mspan(indptr, n + 1), mspan(indices), mspan(last_page_len, n), page_size, cspan(new_lengths, n), mspan(released));
  if (count != expect.size() || !std::equal(expect.begin(), expect.end(), released.begin()))
    errors.push_back(what + "shrink_page_table released " + std::to_string(count) + " pages, not the " +
                     std::to_string(expect.size()) + " trailing ones");
  return count;
}

// A request takes batch position b this step (counted as moved when it sat
// elsewhere last step); its new tokens start at its next position.
template <class Request, class Stats>
void seat(Request& q, std::int32_t b, Stats& stats) {
  if (q.last_batch_position >= 0 && q.last_batch_position != b) ++stats.moved_in_batch;
  q.last_batch_position = b;
  q.base = q.next_position;
}

// seat(), then what the request does: a prefill chunk of up to `chunk`
// tokens (now and then only admitted, without queries, as a prefix cache
// copy is), a decode token, or nothing (idle in the batch).
template <class Request, class Stats>
void plan_step(Request& q, std::int32_t b, std::int32_t chunk, rng& r, Stats& stats) {
  seat(q, b, stats);
  if (q.prompt_left > 0) {
    q.n_new = std::min(q.prompt_left, r.uniform(1, chunk));
    q.prompt_left -= q.n_new;
    q.q_len = r.chance(0.1) ? 0 : q.n_new;
    ++(q.q_len == 0 ? stats.admit_only : stats.prefill_chunks);
  } else if (q.decode_left > 0 && !r.chance(0.12)) {
    q.n_new = q.q_len = 1;
    --q.decode_left;
    ++stats.decode_tokens;
  } else {
    q.n_new = q.q_len = 0;
    ++stats.idle;
  }
}

// A pool's contents before any token is written: per (tag, layer, element),
// an integer of `base` and up, so never a token's value (those are below 4).
inline std::vector<float> background(std::size_t elements, float base, std::int64_t tag, std::int32_t layer) {
  std::vector<float> pool(elements);
  for (std::size_t i = 0; i < elements; ++i)
    pool[i] = base + static_cast<float>(hash_of({tag, layer, static_cast<std::int64_t>(i)}) >> 48);
  return pool;
}

// Settings by the letters the paper uses (m, r, s, w), the rest at their defaults.
inline scissorhands::settings make_settings(std::int32_t m, std::int32_t recent, std::int32_t sinks,
                                            std::int32_t window, bool normalize, scissorhands::compaction mode) {
  return {.window = window,
          .recent = recent,
          .sinks = sinks,
          .evict_count = m,
          .normalize = normalize,
          .compaction_mode = mode};
}

// The settings by those letters, for a run's description: "m 1, r 4, sinks 0, w 16, normalised, fill_holes".
inline std::string settings_text(const scissorhands::settings& s) {
  return "m " + std::to_string(s.evict_count) + ", r " + std::to_string(s.recent) + ", sinks " +
         std::to_string(s.sinks) + ", w " + std::to_string(s.window) + (s.normalize ? ", normalised" : "") +
         (s.compaction_mode == scissorhands::compaction::fill_holes ? ", fill_holes" : ", preserve_order");
}

// A joining request's state row: any free one (so rows get reused out of order).
inline std::int32_t take_row(rng& r, std::vector<std::int32_t>& free_rows, std::vector<std::int32_t>& used_rows,
                             std::int64_t& reused) {
  const std::size_t pick = r.next() % free_rows.size();
  const std::int32_t row = free_rows[pick];
  free_rows.erase(free_rows.begin() + static_cast<std::ptrdiff_t>(pick));
  if (std::find(used_rows.begin(), used_rows.end(), row) != used_rows.end()) ++reused;
  used_rows.push_back(row);
  return row;
}

// 0..n-1 in a random order: the batch positions of an engine that reorders freely.
inline std::vector<std::int32_t> shuffled_order(std::size_t n, rng& r) {
  std::vector<std::int32_t> order;
  for (std::size_t i = 0; i < n; ++i) order.push_back(static_cast<std::int32_t>(i));
  r.shuffle(order);
  return order;
}

// One counter of a run: what it counts and, where `minimum` is not -1,
// how often a run must have done it (it went through what it is meant to).
struct run_counter {
  const char* name;
  std::int64_t value;
  std::int64_t minimum = -1;
};

// Prints the counters under SCISSORHANDS_ENGINE_VERBOSE; checks each minimum.
inline void check_counters(const std::string& title, std::initializer_list<run_counter> counters) {
  if (std::getenv("SCISSORHANDS_ENGINE_VERBOSE") != nullptr) {
    std::ostringstream o;
    o << title << "\n ";
    for (const run_counter& c : counters) o << " " << c.name << " " << c.value << ",";
    std::printf("%s\n", o.str().c_str());
  }
  for (const run_counter& c : counters)
    if (c.minimum >= 0) {
      INFO(c.name << " = " << c.value);
      CHECK(c.value >= c.minimum);
    }
}

// An engine loop's refused call: check_refused against its snapshot,
// described by `label` in a failure, counted in `refused`.
template <class Snapshot, class Call>
void check_refused_call(const char* label, const Snapshot& snapshot, const std::string& function,
                        const std::string& argument, Call&& call, std::int64_t& refused) {
  INFO("refused call: " << label);
  check_refused(snapshot, function, argument, call);
  ++refused;
}

// A slot's K and V rows hold exactly what the token at `position` was
// written with (value(kind, d) gives element d); else the error names the
// token the V row does hold.
template <class Value>
void check_kv_rows(const float* k_row, const float* v_row, std::int32_t head_dim, std::int32_t position, Value value,
                   const std::string& where, std::vector<std::string>& errors) {
  std::vector<float> want(static_cast<std::size_t>(head_dim));
  const float* rows[2] = {k_row, v_row};
  for (int kind = 0; kind < 2; ++kind) {
    for (std::int32_t d = 0; d < head_dim; ++d) want[static_cast<std::size_t>(d)] = value(kind, d);
    if (std::memcmp(rows[kind], want.data(), want.size() * sizeof(float)) != 0) {
      errors.push_back(where + (kind == 0 ? "K" : "V") + " row is not the one position " + std::to_string(position) +
                       " was written with (the V row names position " + std::to_string(v_row[0]) + " of " +
                       std::to_string(v_row[1]) + ")");
      return;
    }
  }
}

// Every protected token ever admitted (the recent window, the sinks) is still
// among `seen`, the positions a head holds.
inline void check_protected(const std::set<std::int32_t>& seen, std::int32_t start, std::int32_t next_position,
                            const scissorhands::settings& s, const std::string& where,
                            std::vector<std::string>& errors) {
  for (std::int32_t p = std::max(start, next_position - s.recent); p < next_position; ++p)
    if (!seen.count(p)) errors.push_back(where + "recent position " + std::to_string(p) + " is gone");
  for (std::int32_t p = start; p < std::min(s.sinks, next_position); ++p)
    if (!seen.count(p)) errors.push_back(where + "sink position " + std::to_string(p) + " is gone");
}

// Pages conserved: each held by one request at most (`held`: each request's
// pages), none both held and free or free twice, held + free = the pool.
inline void check_pages(const std::string& what, std::int32_t num_pages,
                        const std::vector<const std::vector<std::int32_t>*>& held,
                        const std::vector<std::int32_t>& free_pages, std::vector<std::string>& errors) {
  std::vector<char> used(static_cast<std::size_t>(num_pages), 0);
  std::size_t in_use = 0;
  for (const auto* pages : held) {
    for (std::int32_t p : *pages)
      if (p < 0 || p >= num_pages || used[static_cast<std::size_t>(p)])
        errors.push_back(what + "page " + std::to_string(p) + " is out of the pool or held twice");
      else
        used[static_cast<std::size_t>(p)] = 1;
    in_use += pages->size();
  }
  for (std::int32_t p : free_pages)
    if (p < 0 || p >= num_pages || used[static_cast<std::size_t>(p)])
      errors.push_back(what + "free page " + std::to_string(p) + " is also in use or listed twice");
    else
      used[static_cast<std::size_t>(p)] = 2;
  if (in_use + free_pages.size() != static_cast<std::size_t>(num_pages))
    errors.push_back(what + "pages not conserved: " + std::to_string(in_use) + " in use + " +
                     std::to_string(free_pages.size()) + " free != " + std::to_string(num_pages));
}

// The end of a step: its problems (the first 12) as one failure, and no
// further steps, which would only repeat them.
inline void report_step_errors(const std::vector<std::string>& errors) {
  if (errors.empty()) return;
  std::ostringstream all;
  for (std::size_t i = 0; i < std::min<std::size_t>(errors.size(), 12); ++i) all << errors[i] << "\n";
  FAIL_CHECK(errors.size() << " problems after the step:\n" << all.str());
  REQUIRE(errors.empty());
}

}  // namespace engine_test
