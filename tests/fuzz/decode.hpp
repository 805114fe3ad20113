// The host fuzz harness's shared decoding (see fuzz_host.cpp): the failure
// and trace macros, the byte source every mode reads its input from, the
// generator of bulk data, the special values, the settings (the same bytes
// decode to the same settings in every mode) and the strided layouts.
// Not a stand-alone header: the harness is one translation unit, so its
// helpers live in anonymous namespaces.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace {

namespace sh = scissorhands;
using sh::memory_space;

[[noreturn]] void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz_host: invariant broken: %s\n", file, line, what.c_str());
  std::abort();
}
#define FUZZ_CHECK(cond, what)                    \
  do {                                            \
    if (!(cond)) fail(__FILE__, __LINE__, (what)); \
  } while (0)

bool tracing() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}
#define FUZZ_TRACE(...)                                  \
  do {                                                   \
    if (tracing()) std::fprintf(stderr, __VA_ARGS__);    \
  } while (0)

// ---------------------------------------------------------------------------
// Input decoding. Past the end every read is 0, and 0 always decodes to the
// plain, valid choice, so truncated inputs stay meaningful.
class byte_source {
 public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool exhausted() const { return pos_ >= size_; }
  [[nodiscard]] std::size_t position() const { return pos_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::int64_t in(std::int64_t lo, std::int64_t hi) {
    const auto range = static_cast<std::uint64_t>(hi - lo) + 1;
    std::uint64_t x = byte();
    if (range > 256) x |= std::uint64_t{byte()} << 8;
    if (range > 65536) x |= std::uint64_t{byte()} << 16 | std::uint64_t{byte()} << 24;
    return lo + static_cast<std::int64_t>(x % range);
  }
  std::int32_t i32(std::int64_t lo, std::int64_t hi) { return static_cast<std::int32_t>(in(lo, hi)); }
  bool flag() { return (byte() & 1) != 0; }
  bool rarely() { return byte() >= 236; }  // about 1 in 12
  std::uint32_t word() {
    std::uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x = x << 8 | byte();
    return x;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Bulk data (K/V rows, queries) comes from a seeded generator, not from the
// input, so small inputs still fill whole caches.
struct generator {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.0f; }
};

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

// Values no caller should pass where a probability or score goes.
float special_value(byte_source& src) {
  constexpr float table[] = {nan_f, inf_f, -inf_f, -1.0f, -1e-30f, -0.0f, 1.5f, 1.0011f, 3.4e38f, 1e-45f, 0.0f, 1.0f};
  return table[src.in(0, std::size(table) - 1)];
}

std::int32_t garbage_int(byte_source& src) {
  constexpr std::int32_t table[] = {-1, 0, 1, 2, 7, 1000, INT32_MAX, INT32_MAX - 1, INT32_MIN, -100000, 65536, 31};
  return table[src.in(0, std::size(table) - 1)];
}

// The settings of a case (shared by every mode: the same bytes decode to the
// same settings), rarely one of them garbage.
void decode_settings_into(byte_source& src, sh::settings& c) {
  c.window = src.i32(1, 70);
  c.recent = src.i32(0, 4);
  c.sinks = src.i32(0, 3);
  c.evict_count = src.i32(1, 6);
  constexpr float alphas[] = {1.0f, 0.5f, 2.0f, 0.01f};
  constexpr float decays[] = {0.95f, 0.5f, 1.0f, 0.01f};
  c.alpha = alphas[src.in(0, 3)];
  c.decay = decays[src.in(0, 3)];
  c.normalize = src.flag();
  c.compaction_mode = src.flag() ? sh::compaction::preserve_order : sh::compaction::fill_holes;
  c.seed = src.word();
  if (src.rarely()) {
    switch (src.in(0, 8)) {
      case 0: c.window = garbage_int(src); break;
      case 1: c.recent = garbage_int(src); break;
      case 2: c.sinks = garbage_int(src); break;
      case 3: c.evict_count = garbage_int(src); break;
      case 4: c.alpha = special_value(src); break;
      case 5: c.decay = special_value(src); break;
      case 6: c.compaction_mode = static_cast<sh::compaction>(garbage_int(src)); break;
      case 7: {
        // Only refused widths: the harness's oracles rank without pooling
        // (pooling itself is checked against tests/host's oracle).
        constexpr std::int32_t widths[] = {0, 2, -1, 256, 1000, INT32_MIN, INT32_MAX};
        c.pool_width = widths[src.in(0, std::size(widths) - 1)];
        break;
      }
      default: c.pool_mode = static_cast<sh::pooling>(garbage_int(src)); break;
    }
  }
}

// What every mode reads first (after its mode byte, where it has one):
// which of its eight policies, and paged or not.
struct mode_choice {
  int policy = 0;
  bool paged = false;
};
mode_choice decode_choice(byte_source& src) {
  mode_choice c;
  c.policy = static_cast<int>(src.in(0, 7));
  c.paged = src.flag();
  return c;
}

// Runs one case of a mode (fuzz_case, layers_case, quant_case) for a policy,
// paged or contiguous. Each mode keeps a table of eight, one per policy.
template <template <class, bool> class Case, class Policy>
void run_case(byte_source& src, bool paged) {
  if (paged) {
    Case<Policy, true>(src).run();
  } else {
    Case<Policy, false>(src).run();
  }
}
using case_runner = void (*)(byte_source&, bool);

// Whether settings pass validation for this policy.
template <class Policy>
bool settings_valid(const sh::settings& c) {
  using Obs = typename Policy::observation;
  using Hist = typename Policy::history;
  bool ok = c.recent >= 0 && c.sinks >= 0 && c.evict_count >= 1 &&
            (c.compaction_mode == sh::compaction::fill_holes || c.compaction_mode == sh::compaction::preserve_order) &&
            c.pool_width == 1 && (c.pool_mode == sh::pooling::max || c.pool_mode == sh::pooling::mean);
  if (std::is_same_v<Hist, sh::sliding_window>) ok = ok && c.window >= 1;
  if (std::is_same_v<Obs, sh::important_indicator> || std::is_same_v<Obs, sh::unimportant_indicator>)
    ok = ok && std::isfinite(c.alpha) && c.alpha > 0.0f;
  if (std::is_same_v<Hist, sh::exponential_decay>) ok = ok && c.decay > 0.0f && c.decay <= 1.0f;
  return ok;
}

// ---------------------------------------------------------------------------
// Layouts, computed here independently of kv_layout.hpp.
struct strides3 {
  std::int64_t outer = 0;  // sequence (contiguous) or page (paged)
  std::int64_t head = 0;
  std::int64_t token = 0;
};

// Largest element index + 1 (0 when an extent is 0; `row` may be 0, as
// for a probability view over sequences that are all empty); negative
// strides count as 0 (the library must refuse them before it reads
// anything). Saturates far above any allocation.
std::int64_t extent_of(const strides3& s, std::int64_t e0, std::int64_t e1, std::int64_t e2, std::int64_t row) {
  if (e0 <= 0 || e1 <= 0 || e2 <= 0 || row < 0) return 0;
  const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 0); };
  const double last = static_cast<double>(pos(s.outer)) * static_cast<double>(e0 - 1) +
                      static_cast<double>(pos(s.head)) * static_cast<double>(e1 - 1) +
                      static_cast<double>(pos(s.token)) * static_cast<double>(e2 - 1) + static_cast<double>(row);
  return last > 1e15 ? std::int64_t{1} << 50 : static_cast<std::int64_t>(last);
}

// Picks named or custom strides for (outer, head, token) levels of extents
// (e0, e1, e2). Clears `clean` when the strides may overlap.
strides3 pick_strides(byte_source& src, std::int32_t e0, std::int32_t e1, std::int32_t e2, std::int32_t row,
                      bool& clean) {
  const std::int64_t r = row;
  switch (src.in(0, 3)) {
    case 0:  // NHD: [outer][token][head][dim]
      return {std::int64_t{e2} * e1 * r, r, std::int64_t{e1} * r};
    case 1:  // HND: [outer][head][token][dim]
      return {std::int64_t{e1} * e2 * r, std::int64_t{e2} * r, r};
    case 2: {  // levels nested in any order, each padded
      const std::int64_t extents[3] = {e0, e1, e2};
      int order[3] = {0, 1, 2};
      const int perm = static_cast<int>(src.in(0, 5));
      for (int i = 0; i < perm; ++i) std::next_permutation(order, order + 3);
      std::int64_t strides[3] = {0, 0, 0};
      std::int64_t spanned = r;
      for (int level : order) {
        strides[level] = spanned + src.in(0, 3);
        spanned = strides[level] * std::max<std::int64_t>(extents[level], 1);
      }
      return {strides[0], strides[1], strides[2]};
    }
    default:  // anything small: may overlap, may be negative
      clean = false;
      return {src.in(-1, 40), src.in(-1, 40), src.in(-1, 40)};
  }
}

}  // namespace
