// The per-head mode of the host fuzz harness (fuzz_host.cpp): one cache,
// contiguous or paged, and a program of engine steps and library calls
// (fuzz_case), for per-head policies and, through token-level mode, for
// shared_heads ones.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "models.hpp"

namespace {

// ---------------------------------------------------------------------------
// One fuzz case.
template <class Policy, bool Paged>
class fuzz_case {
  using view_type =
      std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using state_type = sh::eviction_state<memory_space::host>;
  using Obs = typename Policy::observation;
  using Hist = typename Policy::history;
  static constexpr bool attention = Obs::needs_attention;
  // shared_heads: compress makes one choice per sequence for all the heads.
  static constexpr bool shared = sh::granularity_of<Policy> == sh::granularity_kind::shared_heads;
  static constexpr std::size_t max_elements = std::size_t{1} << 18;

 public:
  explicit fuzz_case(byte_source& src) : src_(src) {}

  void run() {
    if (!setup()) return;
    for (int op = 0; op < 24 && !src_.exhausted(); ++op) {
      if (!step()) return;
    }
  }

 private:
  byte_source& src_;
  generator gen_{0};
  Policy policy_{};
  cache_model<Paged> cache_;
  bool clean_settings_ = true;  // the settings pass validation
  bool clean_layout_ = true;    // strides unique and buffers large enough
  bool clean_state_ = true;     // positions, scores, counts, ring hold only what the library wrote
  bool clean_cache_ = true;     // lengths / last_page_len as the harness set them
  bool clean_shape_ = true;     // the state's kv_heads and ring_words fit this cache and policy
  sh::state_shape state_shape_{};
  aligned_buffer state_buffer_;
  state_type state_{};

  // Continuous batching: the state row of each batch position (-1: a
  // padding slot, which holds no token), and whether calls pass the mapping
  // (state.for_batch) or rely on row b for position b.
  std::vector<std::int32_t> rows_;
  bool pass_rows_ = false;
  bool respect_capacity_ = true;  // the engine keeps lengths within the state's capacity

  // ---- setup ---------------------------------------------------------------
  bool setup() {
    gen_.state = src_.word();
    decode_settings();
    common_shape& s = cache_.shape;
    s.batch = src_.i32(1, 3);
    s.kv_heads = src_.i32(1, 3);
    s.head_dim = src_.i32(1, 6);
    cache_.decode(src_, false);
    const std::int32_t e0 = cache_.outer_extent(s.batch), e2 = cache_.token_extent();
    cache_.kl = pick_strides(src_, e0, s.kv_heads, e2, s.head_dim, clean_layout_);
    cache_.vl = pick_strides(src_, e0, s.kv_heads, e2, s.head_dim, clean_layout_);
    const std::int64_t kx = extent_of(cache_.kl, e0, s.kv_heads, e2, s.head_dim);
    const std::int64_t vx = extent_of(cache_.vl, e0, s.kv_heads, e2, s.head_dim);
    if (kx > static_cast<std::int64_t>(max_elements) || vx > static_cast<std::int64_t>(max_elements)) return false;
    cache_.k.resize(static_cast<std::size_t>(kx));
    cache_.v.resize(static_cast<std::size_t>(vx));
    cache_.start(s.batch, gen_);
    // Unwritten rows hold a pattern, so a stray read of one shows in the results.
    for (auto& x : cache_.k) x = gen_.uniform(-4.0f, 4.0f);
    for (auto& x : cache_.v) x = gen_.uniform(-4.0f, 4.0f);
    check_named_layouts();

    // The state: by default a row per batch position and a slot per cache
    // slot (state_shape_for); rarely made for another cache or policy.
    state_shape_ = sh::state_shape_for(policy_, make_view());
    FUZZ_CHECK(state_shape_.ring_words == policy_.ring_words(), "state_shape_for: ring_words");
    FUZZ_CHECK(state_shape_.rows == s.batch && state_shape_.kv_heads == s.kv_heads, "state_shape_for: rows, heads");
    if (src_.rarely()) {
      switch (src_.in(0, 3)) {
        case 0: state_shape_.rows += src_.flag() ? 1 : -1; break;  // fewer rows: some positions are padding
        case 1:
          state_shape_.kv_heads += src_.flag() ? 1 : -1;
          clean_shape_ = false;
          break;
        case 2: state_shape_.capacity -= 1; break;  // below the cache's: the engine must compress in time
        default:  // (a garbage window can put ring_words at either int32 end)
          state_shape_.ring_words += (src_.flag() && state_shape_.ring_words < INT32_MAX) ||
                                             state_shape_.ring_words == INT32_MIN
                                         ? 1
                                         : -1;
          clean_shape_ = false;
          break;
      }
    }
    // Continuous batching: spare rows, and a state sized by the budget
    // (state_capacity_for) rather than by the cache.
    state_shape_.rows += src_.i32(0, 2);
    if (src_.flag()) state_shape_.capacity = std::min(state_shape_.capacity, src_.i32(1, 30));
    respect_capacity_ = !src_.rarely();
    std::size_t bytes = 0;
    const sh::state_shape& ss = state_shape_;
    const double need = static_cast<double>(ss.rows) * ss.kv_heads * ss.capacity * (12.0 + 4.0 * ss.ring_words);
    const bool shape_valid = ss.rows > 0 && ss.kv_heads > 0 && ss.capacity > 0 && ss.ring_words >= 0 && need < 4.0e18;
    try {
      bytes = sh::state_bytes(state_shape_);
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(e.function() == "state_bytes", "state_bytes: error names another function");
      FUZZ_CHECK(!shape_valid, std::string("state_bytes refused a valid shape: ") + e.what());
      return false;
    }
    FUZZ_CHECK(shape_valid, "state_bytes accepted an invalid shape");
    if (bytes > (std::size_t{64} << 20)) return false;  // valid, but too big to fuzz quickly
    state_buffer_.allocate(bytes);
    state_ = sh::make_state(sh::host_span<std::byte>(state_buffer_.data, bytes), state_shape_);
    sh::host::reset_state(state_);
    // make_state refuses a short or misaligned buffer.
    expect_refusal([&] { (void)sh::make_state(sh::host_span<std::byte>(state_buffer_.data, bytes - 1), state_shape_); },
                   "make_state", "buffer");
    expect_refusal(
        [&] { (void)sh::make_state(sh::host_span<std::byte>(state_buffer_.data + 8, bytes - 8), state_shape_); },
        "make_state", "buffer");

    pick_mapping(src_, gen_, cache_.shape.batch, state_shape_.rows, rows_, pass_rows_);
    append_tokens(/*initial=*/true);
    FUZZ_TRACE("setup: batch %d heads %d dim %d paged %d rows %d state capacity %d pass_rows %d mapping",
               s.batch, s.kv_heads, s.head_dim, int(Paged), state_shape_.rows, state_shape_.capacity, int(pass_rows_));
    for (std::int32_t r : rows_) FUZZ_TRACE(" %d", r);
    FUZZ_TRACE("\n");
    return true;
  }

  void decode_settings() {
    decode_settings_into(src_, policy_.config);
    clean_settings_ = settings_valid<Policy>(policy_.config);
  }

  // The library's named layouts must equal the ones written here.
  void check_named_layouts() const {
    const common_shape& s = cache_.shape;
    const std::int32_t e2 = cache_.token_extent();
    const auto nhd = sh::kv_layout::nhd(e2, s.kv_heads, s.head_dim);
    const auto hnd = sh::kv_layout::hnd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(nhd.head_stride == s.head_dim && nhd.token_stride == std::int64_t{s.kv_heads} * s.head_dim &&
                   nhd.sequence_stride == std::int64_t{e2} * s.kv_heads * s.head_dim,
               "kv_layout::nhd");
    FUZZ_CHECK(hnd.token_stride == s.head_dim && hnd.head_stride == std::int64_t{e2} * s.head_dim &&
                   hnd.sequence_stride == std::int64_t{e2} * s.kv_heads * s.head_dim,
               "kv_layout::hnd");
    const auto pn = sh::paged_layout::nhd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(pn.page_stride == nhd.sequence_stride && pn.head_stride == nhd.head_stride &&
                   pn.token_stride == nhd.token_stride,
               "paged_layout::nhd");
    const auto ph = sh::paged_layout::hnd(e2, s.kv_heads, s.head_dim);
    FUZZ_CHECK(ph.page_stride == hnd.sequence_stride && ph.head_stride == hnd.head_stride &&
                   ph.token_stride == hnd.token_stride,
               "paged_layout::hnd");
  }

  // ---- views ----------------------------------------------------------------
  view_type make_view() { return view_of(cache_, cache_.shape, cache_.k, cache_.v, cache_.kl, cache_.vl); }

  // Scratch that the calls' spans point at, kept alive for the call and
  // part of every snapshot.
  std::vector<std::int32_t> scratch_i_;    // a damaged copy of indptr or indices
  std::vector<std::int32_t> scratch_len_;  // a copy of the lengths the view reads instead of the model's
  std::vector<std::int32_t> out_store_;    // compress_output spans point in here
  std::vector<std::int32_t> qo_store_;     // ragged qo_indptr of observe (and a copy for the lse)
  std::string damage_note_;  // which damage the current call's view carries
  bool shared_page_ = false;  // the damage lists one page twice

  // Rarely damages one field of the view for one call: expect::ok when it
  // did nothing, refuse when the damage is always invalid, unknown when it
  // may happen to describe another valid cache.
  expect corrupt(view_type& v) {
    damage_note_.clear();
    shared_page_ = false;
    if (!src_.rarely()) return expect::ok;
    const common_shape& s = cache_.shape;
    const expect refuse = expect::refuse, unknown = expect::unknown;
    if constexpr (Paged) {
      const auto which = src_.in(0, 15);
      damage_note_ = "paged view damage " + std::to_string(which);
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : (src_.flag() ? -1 : INT32_MAX); return refuse;
        case 1: v.kv_heads = 0; return refuse;
        case 2: v.head_dim = 0; return refuse;
        case 3:
          if (src_.flag()) return v.page_size = 0, refuse;
          v.page_size = cache_.page_size + 1;
          return unknown;
        case 4:
          if (src_.flag()) return v.num_pages = 0, refuse;
          v.num_pages = cache_.num_pages - 1;
          return unknown;
        case 5:  // (INT32_MAX pages of one token is a valid bound: the state needs no slot per bound)
          if (src_.flag()) return v.max_pages_per_sequence = 0, refuse;
          v.max_pages_per_sequence = INT32_MAX;
          return v.page_size > 1 ? refuse : unknown;
        case 6: v.indptr = {v.indptr.data(), v.indptr.size() - 1}; return refuse;
        case 7: v.k_pages = {nullptr, v.k_pages.size()}; return refuse;
        case 8: v.v_pages = {v.v_pages.data(), v.v_pages.size() - 1}; return refuse;
        case 9:
          if (src_.flag()) return v.k_layout.token_stride = -1, refuse;
          v.k_layout.token_stride = 0;
          return v.page_size > 1 ? refuse : unknown;
        case 10: v.v_pages = v.k_pages; return refuse;
        case 11: {  // a page id outside the pool, or one listed twice
          scratch_i_ = cache_.indices;
          if (scratch_i_.empty()) return expect::ok;
          const auto at = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_i_.size()) - 1));
          v.indices = {scratch_i_.data(), scratch_i_.size()};
          if (src_.flag()) {
            scratch_i_[at] = garbage_int(src_);
            return scratch_i_[at] < 0 || scratch_i_[at] >= cache_.num_pages ? refuse : unknown;
          }
          // Shared pages are fine to read (prefix sharing); compress checks
          // the pages it rewrites itself (rewrites_shared_page).
          scratch_i_[at] = scratch_i_[(at + 1) % scratch_i_.size()];
          shared_page_ = scratch_i_.size() > 1;
          return shared_page_ ? unknown : expect::ok;
        }
        case 12: {  // indptr not starting at 0, decreasing, or past indices
          scratch_i_ = cache_.indptr;
          const auto at = static_cast<std::size_t>(src_.in(0, s.batch));
          v.indptr = {scratch_i_.data(), scratch_i_.size()};
          if (src_.flag()) return scratch_i_[at] = garbage_int(src_), unknown;
          scratch_i_[at] += 1;
          return at == 0 || at == static_cast<std::size_t>(s.batch) ? refuse : unknown;
        }
        case 13:  // persistent: the model's own array
          cache_.last_page_len[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
          clean_cache_ = false;
          return expect::ok;
        case 14:
          v.indices = {nullptr, v.indices.size()};
          return v.indices.empty() ? unknown : refuse;
        default: v.last_page_len = {v.last_page_len.data(), v.last_page_len.size() - 1}; return refuse;
      }
    } else {
      const auto which = src_.in(0, 14);
      damage_note_ = "view damage " + std::to_string(which);
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : s.batch + 1; return refuse;
        case 1:
          if (src_.flag()) return v.kv_heads = 0, refuse;
          v.kv_heads = s.kv_heads + 1;
          return unknown;  // a damaged state shape may match it
        case 2:
          if (src_.flag()) return v.head_dim = 0, refuse;
          v.head_dim = s.head_dim + 1;
          return unknown;
        case 3:
          if (src_.flag()) return v.capacity = 0, refuse;
          v.capacity = cache_.capacity - 1;
          return unknown;
        case 4: v.lengths = {v.lengths.data(), v.lengths.size() - 1}; return refuse;
        case 5: v.lengths = {nullptr, v.lengths.size()}; return refuse;
        case 6: v.k = {nullptr, v.k.size()}; return refuse;
        case 7: v.v = {v.v.data(), v.v.size() - 1}; return refuse;
        case 8:
          if (src_.flag()) {
            v.k_layout.head_stride = 0;
            return s.kv_heads > 1 ? refuse : unknown;
          }
          v.k_layout.head_stride = -v.k_layout.head_stride;
          return v.k_layout.head_stride < 0 ? refuse : unknown;
        case 9: v.v = v.k; v.v_layout = v.k_layout; return refuse;
        case 10:
          v.k_layout.sequence_stride = std::int64_t{1} << src_.in(31, 62);
          return s.batch > 1 ? refuse : unknown;
        case 11:  // persistent: the model's own array
          cache_.lengths[static_cast<std::size_t>(src_.in(0, s.batch - 1))] = garbage_int(src_);
          clean_cache_ = false;
          return expect::ok;
        case 12: v.v_layout.token_stride = 1; return unknown;
        case 13: v.capacity = INT32_MAX; return refuse;
        default: v.k = {v.k.data(), 0}; return refuse;
      }
    }
  }

  // ---- the state's rows for one call -------------------------------------------
  struct call_rows {
    std::vector<std::int32_t> storage;       // what state_rows points at
    sh::host_span<const std::int32_t> span;  // state_rows as passed ({} : row b)
    expect damage = expect::ok;              // refuse: invalid whatever else; unknown: not the model's mapping
    std::vector<std::int32_t> used;          // the row the library uses for each position (when in_range)
    bool in_range = true;                    // one entry per position, each -1 or a row, rows distinct
    bool null_with_size = false;             // state_rows = {nullptr, batch}: refused
  };
  call_rows rc_;

  [[nodiscard]] state_type call_state() const { return state_.for_batch(rc_.span); }

  // The mapping for one call: the model's, or rarely a damaged one.
  void pick_rows() {
    const std::int32_t batch = cache_.shape.batch;
    const std::int32_t rows = state_shape_.rows;
    call_rows& rc = rc_;
    rc.storage = rows_;
    rc.damage = expect::ok;
    rc.null_with_size = false;
    bool pass = pass_rows_;
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
      switch (src_.in(0, 5)) {
        case 0: {  // a row outside [-1, rows), or garbage that may land inside
          const std::int32_t r = src_.flag() ? rows + src_.i32(0, 2) : (src_.flag() ? -2 : garbage_int(src_));
          rc.storage[at] = r;
          pass = true;
          rc.damage = r < -1 || r >= rows ? expect::refuse : expect::unknown;
          break;
        }
        case 1: {  // two positions on one row
          const auto other = (at + 1) % static_cast<std::size_t>(batch);
          if (batch > 1 && rc.storage[at] >= 0) {
            rc.storage[other] = rc.storage[at];
            pass = true;
            rc.damage = expect::refuse;
          }
          break;
        }
        case 2:  // a padding slot: fine for a sequence with no token, refused for one with tokens
          rc.storage[at] = -1;
          pass = true;
          break;
        case 3:  // one entry too few or too many
          if (src_.flag())
            rc.storage.pop_back();
          else
            rc.storage.push_back(-1);
          pass = true;
          rc.damage = expect::refuse;
          break;
        case 4:
          // state_rows = {nullptr, batch}: a caller's bug, not "no
          // mapping" (as for lse): refused.
          rc.null_with_size = true;
          rc.damage = expect::refuse;
          break;
        default:  // no mapping passed where the model has one: row b is used
          if (pass) rc.damage = expect::unknown;
          pass = false;
          break;
      }
    }
    rc.span = pass ? sh::host_span<const std::int32_t>(rc.storage.data(), rc.storage.size())
                   : sh::host_span<const std::int32_t>{};
    if (rc.null_with_size) rc.span = {nullptr, static_cast<std::size_t>(batch)};
    rc.in_range = resolve_rows(rc.span, batch, rows, rc.used);
    if (rc.damage == expect::unknown && rc.in_range && rc.used == rows_) rc.damage = expect::ok;  // same mapping
    if (rc.damage != expect::ok) FUZZ_TRACE("  rows damaged (%d), in range %d\n", int(rc.damage), int(rc.in_range));
  }

  // ---- the engine's side ---------------------------------------------------
  void write_row(std::vector<float>& buf, std::int64_t at) {
    const bool odd = src_.rarely();
    for (std::int32_t d = 0; d < cache_.shape.head_dim; ++d) {
      float x = gen_.uniform(-4.0f, 4.0f);
      if (odd && d == 0) x = special_value(src_);
      buf[static_cast<std::size_t>(at + d)] = x;
    }
  }

  void append_tokens(bool initial) {
    if (!clean_cache_ || !clean_layout_) return;  // the model's addressing may be meaningless
    const common_shape& s = cache_.shape;
    for (std::int32_t b = 0; b < s.batch; ++b) {
      std::int32_t n = initial ? src_.i32(0, 26) : src_.i32(0, 3);
      if (rows_[static_cast<std::size_t>(b)] < 0) continue;  // a padding slot holds no token
      while (n-- > 0) {
        const std::int32_t len = cache_.length(b);
        if ((respect_capacity_ && len >= state_shape_.capacity) || !cache_.grow(b)) break;
        const view_type v = make_view();
        for (std::int32_t h = 0; h < s.kv_heads; ++h) {
          write_row(cache_.k, row_at(v, true, b, h, len));
          write_row(cache_.v, row_at(v, false, b, h, len));
        }
      }
    }
    FUZZ_TRACE("  lengths:");
    for (std::int32_t b = 0; b < s.batch; ++b) FUZZ_TRACE(" %d", cache_.length(b));
    FUZZ_TRACE("\n");
  }

  // The scheduler moves two requests to each other's batch positions: their
  // K/V rows (contiguous) or page lists (paged) and their state rows move
  // with them; the state itself stays where it is.
  void swap_positions() {
    const common_shape& s = cache_.shape;
    const std::int32_t b1 = src_.i32(0, s.batch - 1), b2 = src_.i32(0, s.batch - 1);
    if (!clean_cache_ || !clean_layout_ || b1 == b2) return;
    FUZZ_TRACE("  swap positions %d and %d\n", b1, b2);
    if constexpr (!Paged) swap_sequence_rows(make_view(), cache_.k, cache_.v, b1, b2);
    cache_.swap(b1, b2);
    swap_mapped_rows(rows_, pass_rows_, b1, b2);
  }

  // A request finishes: its tokens leave the cache (paged: its pages go
  // back to the pool through shrink_page_table), and its batch position
  // becomes a padding slot or takes a new request on its row or a free
  // one, which the engine resets first (rarely it forgets: every call is
  // then refused until the row's length catches up with what it tracks).
  bool retire() {
    const retire_step step = decode_retire(src_, cache_.shape.batch);
    if (!clean_cache_ || !clean_layout_) return true;
    std::vector<std::int32_t> lengths = cache_.all_lengths();
    lengths[static_cast<std::size_t>(step.position)] = 0;
    cache_.apply(lengths, "retire");
    const std::int32_t row = retire_row(step, rows_, pass_rows_, state_shape_.rows, gen_);
    if (row < 0 || step.forget) return true;
    return reset_row(row, step.start, expect::ok);
  }

  // The engine drops a sequence's last tokens without telling the library
  // (a rejected speculation): its row tracks more tokens than it holds, and
  // every call is refused until the row is reset or the length catches up.
  void rollback() {
    const common_shape& s = cache_.shape;
    const std::int32_t b = src_.i32(0, s.batch - 1);
    const std::int32_t k = src_.i32(1, 3);
    if (!clean_cache_ || !clean_layout_) return;
    cache_.apply(rolled_back(cache_.all_lengths(), b, k), "rollback");
  }

  // ---- snapshots -----------------------------------------------------------
  struct snapshot {
    std::vector<std::uint8_t> k, v, table, state, scratch, out;
    bool operator==(const snapshot&) const = default;
  };

  [[nodiscard]] snapshot take() const {
    snapshot s;
    s.k = bytes_of_all(cache_.k);
    s.v = bytes_of_all(cache_.v);
    s.table = cache_.bytes();
    s.state = bytes_of(state_buffer_.data, state_buffer_.size);
    s.scratch = bytes_of_all(scratch_i_, scratch_len_, qo_store_, rc_.storage, rows_);
    s.out = bytes_of_all(out_store_);
    return s;
  }

  // Runs `call`. On refusal: the error names `fn` and an argument, and
  // nothing the caller owns changed (the workspace is scratch). Returns
  // whether the call succeeded.
  template <class Call>
  bool guarded(const char* fn, expect expected, Call&& call) {
    const bool ok = guarded_call(fn, expected, damage_note_, [this] { return take(); }, std::forward<Call>(call));
    if (!ok) damage_note_.clear();
    return ok;
  }

  // ---- state accessors (layout from docs/design.md) -------------------------
  [[nodiscard]] std::size_t slot(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return state_slot(state_shape_, r, h, t);
  }
  [[nodiscard]] std::size_t byte_offset(const void* p) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - state_buffer_.data);
  }
  template <class T>
  [[nodiscard]] T old_value(const snapshot& before, const T* p) const {
    T x;
    std::memcpy(&x, before.state.data() + byte_offset(p), sizeof(T));
    return x;
  }
  template <class T>
  void set_value(std::vector<std::uint8_t>& state_bytes, const T* p, const T& x) const {
    std::memcpy(state_bytes.data() + byte_offset(p), &x, sizeof(T));
  }
  void copy_value(std::vector<std::uint8_t>& state_bytes, const void* p, std::size_t n) const {
    std::memcpy(state_bytes.data() + byte_offset(p), p, n);
  }

  // The conditions on the state and its rows that every cache entry point
  // checks from the data (rows in range and distinct, padding slots empty,
  // lengths within the cache's and the state's capacity, tracked, positions
  // left, steps, the row marks), evaluated on what the call passes, for a
  // view that is the model's. True: the call must be refused.
  [[nodiscard]] bool state_refuses(const view_type& v) const {
    if (!rc_.in_range) return true;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      const std::int32_t len = length_in(v, b);
      if (len < 0 || len > capacity_in(v, b)) return true;
      if (row_refuses(state_, r, len, state_shape_.capacity, rc_.span.data() != nullptr)) return true;
    }
    return false;
  }

  // The expectation of a cache entry point: `always_refuse` for arguments
  // invalid whatever the view (a bad budget, workspace or output),
  // `args_refuse` for ones invalid for the model's view, `args_ok` when the
  // call's own arguments are valid for it.
  [[nodiscard]] expect expectation(expect damage, const view_type& v, bool args_ok, bool always_refuse,
                                   bool args_refuse) const {
    if (always_refuse || !clean_settings_ || damage == expect::refuse || rc_.damage == expect::refuse)
      return expect::refuse;
    if (damage == expect::unknown) return expect::unknown;
    if (!clean_shape_ || args_refuse || state_refuses(v)) return expect::refuse;
    if (!clean_layout_ || !clean_cache_) return expect::unknown;
    return args_ok ? expect::ok : expect::unknown;
  }

  // ---- operations ----------------------------------------------------------
  bool step() {
    const auto op = src_.in(0, 13);
    FUZZ_TRACE("op %d at byte %zu\n", int(op), src_.position());
    switch (op) {
      case 0:
      case 1: append_tokens(false); return true;
      case 2:
      case 3: return observe_probabilities();
      case 4: return observe_queries();
      case 5: return admit();
      case 6:
      case 7: return compress();
      case 8: return reset();
      case 9: poke(); return true;
      case 10: swap_positions(); return true;
      case 11: return retire();
      case 12: shrink_alone(); return true;
      default: rollback(); return true;
    }
  }

  // host::reset_sequence on `row`; checks that only that row's counters
  // changed. Returns false when the call was refused.
  bool reset_row(std::int32_t row, std::int32_t start, expect expected) {
    const snapshot before = take();
    if (!guarded("host::reset_sequence", expected, [&] { sh::host::reset_sequence(state_, row, start); })) return true;
    FUZZ_CHECK(state_.tracked[row] == 0 && state_.next_position[row] == start && state_.step[row] == 0 &&
                   state_.status[row] == 0,
               "reset_sequence: row not reset");
    std::vector<std::uint8_t> est = before.state;
    copy_value(est, &state_.tracked[row], 4);
    copy_value(est, &state_.next_position[row], 4);
    copy_value(est, &state_.step[row], 8);
    copy_value(est, &state_.status[row], 4);
    FUZZ_CHECK(take().state == est, "reset_sequence wrote other state bytes than the row's counters");
    return true;
  }

  bool reset() {
    const std::int32_t row = src_.flag() ? src_.i32(0, state_shape_.rows - 1) : garbage_int(src_);
    const std::int32_t start = src_.flag() ? src_.i32(0, 1000) : garbage_int(src_);
    const bool valid = row >= 0 && row < state_shape_.rows && start >= 0;
    FUZZ_TRACE("  reset row %d start %d\n", row, start);
    reset_row(row, start, valid ? expect::ok : expect::refuse);
    if (src_.rarely()) {
      sh::host::reset_state(state_);
      clean_state_ = true;
      FUZZ_CHECK(all_zero(state_buffer_), "reset_state left a non-zero byte");
    }
    return true;
  }

  // Garbage in the state: what a caller that scribbles over it produces.
  void poke() {
    clean_state_ = false;
    const std::int32_t r = src_.i32(0, state_shape_.rows - 1);
    const std::int32_t h = src_.i32(0, state_shape_.kv_heads - 1);
    const std::int32_t t = src_.i32(0, state_shape_.capacity - 1);
    const std::size_t i = slot(r, h, t);
    const auto what = src_.in(0, 7);
    FUZZ_TRACE("  poke %d row %d head %d slot %d\n", int(what), r, h, t);
    switch (what) {
      case 0: state_.tracked[r] = garbage_int(src_); break;
      case 1: state_.next_position[r] = garbage_int(src_); break;
      case 2: state_.step[r] = src_.flag() ? -std::int64_t{src_.word()} - 1 : INT64_MAX - src_.in(0, 3); break;
      case 3: state_.positions[i] = src_.flag() ? garbage_int(src_) : state_.positions[slot(r, h, src_.i32(0, t))]; break;
      case 4: state_.scores[i] = special_value(src_); break;
      case 5: state_.observed[i] = special_value(src_); break;
      case 6: state_.status[r] = src_.flag() ? 1u : src_.word(); break;
      default:
        if (state_shape_.ring_words > 0)
          state_.ring_of(static_cast<std::int64_t>(i))[0] = src_.word();
        break;
    }
  }

  // What observe and admit must do beyond scoring: admit, count, step, and
  // write nothing but the mapped rows' counters and their slots below the
  // length. counts[b]: the queries of sequence b (0 for admit and static
  // policies).
  void check_after_observe(const view_type& v, const snapshot& before, const std::vector<std::int32_t>& counts) {
    const snapshot after = take();
    FUZZ_CHECK(after.k == before.k && after.v == before.v, "observe wrote to the cache");
    FUZZ_CHECK(after.table == before.table &&
                   after.scratch == before.scratch && after.out == before.out,
               "observe changed lengths, the page table or an argument it only reads");
    std::vector<std::uint8_t> est = before.state;
    const auto words = static_cast<std::size_t>(std::max(state_shape_.ring_words, 0));
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      if (r < 0) continue;
      const std::int32_t len = length_in(v, b);
      const std::int32_t tracked = old_value(before, &state_.tracked[r]);
      const std::int32_t next = old_value(before, &state_.next_position[r]);
      const std::int32_t q = attention && len > 0 ? counts[static_cast<std::size_t>(b)] : 0;
      FUZZ_CHECK(state_.tracked[r] == len, "observe: tracked != length");
      FUZZ_CHECK(state_.next_position[r] == next + (len - tracked), "observe: next_position");
      FUZZ_CHECK(state_.step[r] == old_value(before, &state_.step[r]) + q, "observe: step");
      copy_value(est, &state_.tracked[r], 4);
      copy_value(est, &state_.next_position[r], 4);
      copy_value(est, &state_.step[r], 8);
      for (std::int32_t h = 0; h < v.kv_heads; ++h)
        for (std::int32_t t = 0; t < len; ++t) {
          const std::size_t i = slot(r, h, t);
          const bool fresh = t >= tracked;
          if (!fresh) {
            FUZZ_CHECK(state_.positions[i] == old_value(before, &state_.positions[i]), "observe moved an old position");
          } else {
            FUZZ_CHECK(state_.positions[i] == next + (t - tracked), "observe: new token's position");
            copy_value(est, &state_.positions[i], 4);
          }
          // Queries j with t < len - q + j + 1 saw slot t.
          const std::int32_t seen = std::clamp(len - t, 0, q);
          if (seen == 0) {
            // Not observed: an old token is untouched, a new one starts empty.
            if (!fresh) continue;
            FUZZ_CHECK(state_.observed[i] == 0.0f && !std::signbit(state_.observed[i]), "observe: a new token's count");
            for (std::size_t w = 0; w < words; ++w)
              FUZZ_CHECK(state_.ring_of(static_cast<std::int64_t>(i))[static_cast<std::int32_t>(w)] == 0u,
                         "observe: a new token's history");
          }
          const float old_observed = fresh ? 0.0f : old_value(before, &state_.observed[i]);
          if constexpr (std::is_same_v<Hist, sh::unbounded_history>) {
            float count = old_observed;
            for (std::int32_t n = 0; n < seen; ++n) count += 1.0f;
            FUZZ_CHECK(std::memcmp(&count, &state_.observed[i], 4) == 0 || (std::isnan(count) && std::isnan(state_.observed[i])),
                       "observe: observed count (unbounded)");
          } else if constexpr (std::is_same_v<Hist, sh::sliding_window>) {
            float count = old_observed;
            const auto w = static_cast<float>(policy_.config.window);
            for (std::int32_t n = 0; n < seen; ++n) count = count + 1.0f < w ? count + 1.0f : w;
            FUZZ_CHECK(std::memcmp(&count, &state_.observed[i], 4) == 0 || (std::isnan(count) && std::isnan(state_.observed[i])),
                       "observe: observed count (sliding window)");
          }
          if (fresh) {
            float expect = 0.0f;
            if constexpr (std::is_same_v<Obs, sh::key_norm>) {
              const float* k = cache_.k.data() + row_at(v, true, b, h, t);
              float sum = 0.0f;
              for (std::int32_t d = 0; d < v.head_dim; ++d) sum = std::fma(k[d], k[d], sum);
              expect = -std::sqrt(sum);
            } else if constexpr (std::is_same_v<Obs, sh::random_score>) {
              expect = state_.scores[i];
              FUZZ_CHECK(expect >= 0.0f && expect < 1.0f, "random_score outside [0, 1)");
            }
            if (seen == 0 || !attention)
              FUZZ_CHECK(std::memcmp(&state_.scores[i], &expect, 4) == 0 || (std::isnan(expect) && std::isnan(state_.scores[i])),
                         "score of a new token");
          }
          copy_value(est, &state_.scores[i], 4);
          copy_value(est, &state_.observed[i], 4);
          for (std::size_t w = 0; w < words; ++w)
            copy_value(est, &state_.ring_of(static_cast<std::int64_t>(i))[static_cast<std::int32_t>(w)], 4);
        }
    }
    FUZZ_CHECK(after.state == est, "observe wrote state bytes outside the batch's rows, counters and slots");
  }

  // H2O's score after one observe, recomputed in the documented order.
  void check_h2o_scores(const view_type& v, const snapshot& before, const sh::probability_view<memory_space::host>& p) {
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      const std::int32_t group = p.q_heads / v.kv_heads;
      for (std::int32_t b = 0; b < v.batch; ++b) {
        const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
        const std::int32_t len = length_in(v, b);
        if (r < 0 || len == 0) continue;
        const std::int32_t q_len = p.queries_of(b);
        const std::int32_t tracked = old_value(before, &state_.tracked[r]);
        for (std::int32_t h = 0; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t) {
            const std::size_t i = slot(r, h, t);
            float score = 0.0f;
            if (t < tracked) score = old_value(before, &state_.scores[i]);
            for (std::int32_t j = 0; j < q_len; ++j) {
              if (t >= len - q_len + j + 1) continue;
              float acc = 0.0f;
              for (std::int32_t g = 0; g < group; ++g) acc += p.row(b, h * group + g, j)[t];
              score += acc / static_cast<float>(group);
            }
            FUZZ_CHECK(std::memcmp(&score, &state_.scores[i], 4) == 0 || (std::isnan(score) && std::isnan(state_.scores[i])),
                       "h2o score differs from the recomputed sum");
          }
      }
    } else {
      (void)v;
      (void)before;
      (void)p;
    }
  }

  // ---- queries: uniform q_len or ragged qo_indptr -----------------------------
  struct query_plan {
    std::int32_t q_heads = 1;
    std::int32_t q_len = 0;              // uniform
    bool ragged = false;
    sh::host_span<const std::int32_t> qo;  // ragged: qo_indptr as passed (into qo_store_)
    std::vector<std::int32_t> counts;    // per sequence, as the library reads them (valid plans)
    std::int64_t tokens = 0;             // ragged: qo_indptr[batch] (rows from token 0)
    std::int32_t max_len = 0;
    bool valid = true;                   // every check of q_heads and the counts passes
  };

  // Tokens sequence b holds that its state row does not track yet (-1 when
  // the row or the length is not one the library accepts).
  std::int32_t new_tokens(const view_type& mv, std::int32_t b) const {
    const state_type st = call_state();
    const std::int32_t r = st.row(b), len = length_in(mv, b);
    if (r < 0 || r >= state_shape_.rows || len < 0) return -1;
    const std::int32_t tracked = st.tracked[r];
    return tracked >= 0 && tracked <= len ? len - tracked : -1;
  }
  // The observe-step invariant (docs/integration.md, "The per-step
  // protocol"): a sequence's q queries are its last q tokens, each new or
  // admitted without a query (observed count 0); tokens before them that
  // the call would admit are allowed only before the row's first query.
  bool steps_ok(const view_type& mv, const std::vector<std::int32_t>& counts) const {
    const state_type st = call_state();
    for (std::int32_t b = 0; b < cache_.shape.batch; ++b)
      if (!row_steps_ok(st, state_shape_.rows, st.row(b), length_in(mv, b), counts[static_cast<std::size_t>(b)]))
        return false;
    return true;
  }

  query_plan pick_queries(const view_type& mv) {
    const common_shape& s = cache_.shape;
    const auto batch = static_cast<std::size_t>(s.batch);
    query_plan q;
    std::int32_t min_len = INT32_MAX;  // over sequences with tokens: empty ones are skipped
    for (std::int32_t b = 0; b < s.batch; ++b) {
      const std::int32_t len = length_in(mv, b);
      if (len > 0) min_len = std::min(min_len, len);
      q.max_len = std::max(q.max_len, len);
    }
    q.q_heads = s.kv_heads * src_.i32(1, 4);
    q.ragged = src_.flag();
    qo_store_.assign(2 * (batch + 2), 0);  // the second half: room for a copy (observe_queries)
    // Mostly a query per new token (the observe-step invariant), else any
    // count the other checks allow.
    const bool per_new_token = !src_.rarely();
    if (!q.ragged) {
      q.q_len = std::min(min_len, src_.i32(1, 3));
      for (std::int32_t b = 0; per_new_token && b < s.batch; ++b)
        if (const std::int32_t n = new_tokens(mv, b); n > 0) {
          q.q_len = n;
          break;
        }
    } else {
      if (src_.rarely()) qo_store_[0] = src_.i32(1, 3);  // queries need not start at token 0
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        const std::int32_t n = new_tokens(mv, static_cast<std::int32_t>(b));
        qo_store_[b + 1] = qo_store_[b] + (per_new_token && n >= 0 ? std::min(n, 64)
                                                                    : src_.i32(0, std::clamp(len, 1, 4)));  // an empty sequence may get one
      }
    }
    std::size_t qo_size = batch + 1;
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, s.batch - 1));
      switch (src_.in(0, 5)) {
        case 0: q.q_heads = s.kv_heads * 2 + 1; break;  // no whole group when kv_heads > 1
        case 1: {                                       // more queries than a sequence's tokens
          const std::int32_t len = length_in(mv, static_cast<std::int32_t>(at));
          if (!q.ragged) {
            q.q_len = min_len < INT32_MAX ? min_len + 1 : min_len;
          } else if (len > 0 && len < 1000) {
            const std::int32_t add = len + 1 - (qo_store_[at + 1] - qo_store_[at]);
            for (std::size_t i = at + 1; i <= batch; ++i) qo_store_[i] += add;
          }
          break;
        }
        case 2:
          if (!q.ragged)
            q.q_len = src_.flag() ? 0 : -3;  // no query at all is fine; a negative count is not
          else
            qo_store_[0] = src_.flag() ? -1 : garbage_int(src_);
          break;
        case 3: q.q_heads = s.kv_heads * (sh::host::max_group_size + 1); break;
        case 4:
          if (q.ragged) qo_size = src_.flag() ? batch : batch + 2;
          break;
        default:
          if (q.ragged) qo_store_[at + 1] = qo_store_[at] - 1;  // decreasing
          break;
      }
    }
    if (q.ragged) q.qo = {qo_store_.data(), qo_size};
    q.valid = q.q_heads > 0 && q.q_heads % s.kv_heads == 0 && q.q_heads / s.kv_heads <= sh::host::max_group_size;
    q.counts.assign(batch, 0);
    if (!q.ragged) {
      q.valid = q.valid && q.q_len >= 0;
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        q.valid = q.valid && (len == 0 || q.q_len <= len);
        q.counts[b] = q.q_len;
      }
    } else {
      q.valid = q.valid && qo_size == batch + 1 && qo_store_[0] >= 0;
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int64_t n = std::int64_t{qo_store_[b + 1]} - qo_store_[b];
        const std::int32_t len = length_in(mv, static_cast<std::int32_t>(b));
        q.valid = q.valid && n >= 0 && (len == 0 || n <= len);
        q.counts[b] = static_cast<std::int32_t>(std::clamp<std::int64_t>(n, 0, INT32_MAX));
      }
      q.tokens = q.valid ? qo_store_[batch] : 0;
    }
    q.valid = q.valid && steps_ok(mv, q.counts);
    FUZZ_TRACE("  queries: %s q_heads %d q_len %d valid %d counts", q.ragged ? "ragged" : "uniform", q.q_heads,
               q.q_len, int(q.valid));
    for (std::int32_t n : q.counts) FUZZ_TRACE(" %d", n);
    FUZZ_TRACE("\n");
    return q;
  }

  bool observe_probabilities() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_plan q = pick_queries(mv);
    // Probabilities: each visible row a normalised distribution; columns the
    // query cannot see hold NaN, which the library must neither read nor
    // check. Uniform views are [batch][q_heads][q_len][columns]; ragged ones
    // token-major [token][q_heads][columns], each padded.
    const std::int32_t columns = std::clamp(q.max_len, 1, 1 << 20);
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 1, 64);
    const std::int64_t tokens = std::clamp<std::int64_t>(q.tokens, 0, 4096);
    std::int64_t query_stride = 0, head_stride = 0, sequence_stride = 0;
    if (!q.ragged) {
      query_stride = columns + src_.in(0, 2);
      head_stride = query_stride * queries + src_.in(0, 2);
      sequence_stride = head_stride * heads + src_.in(0, 2);
    } else {
      head_stride = columns + src_.in(0, 2);
      query_stride = head_stride * heads + src_.in(0, 2);
      sequence_stride = src_.flag() ? std::int64_t{1} << 40 : src_.in(0, 2);  // unused by ragged views
    }
    bool overlapping = false;
    if (src_.rarely()) {
      switch (src_.in(0, 2)) {
        case 0:  // rows shared between sequences and queries: reads may overlap
          query_stride = 0;
          head_stride = columns;
          sequence_stride = 0;
          overlapping = true;
          break;
        case 1: head_stride = -1; break;
        default: sequence_stride = std::int64_t{1} << 40; break;
      }
    }
    const bool strides_ok = query_stride >= 0 && head_stride >= 0 && sequence_stride >= 0;
    // The extent the library computes, rows of the longest length: over
    // (token, head) for ragged views.
    const std::int64_t reach =
        q.ragged ? extent_of({query_stride, head_stride, 0}, tokens, heads, 1, q.max_len)
                 : extent_of({sequence_stride, head_stride, query_stride}, s.batch, heads, q.q_len, q.max_len);
    std::int64_t alloc = std::min<std::int64_t>(reach, std::int64_t{1} << 22);
    if (src_.rarely()) alloc = std::max<std::int64_t>(alloc - 1, 0);
    const bool buffer_ok = alloc >= reach;
    std::vector<float> probs(static_cast<std::size_t>(std::max<std::int64_t>(alloc, 1)),
                             overlapping ? 1.0f / static_cast<float>(columns) : nan_f);
    const auto row_of = [&](std::int32_t b, std::int32_t qh, std::int32_t j) {
      const std::int64_t at = q.ragged ? (std::int64_t{qo_store_[static_cast<std::size_t>(b)]} + j) * query_stride +
                                             qh * head_stride
                                       : b * sequence_stride + qh * head_stride + j * query_stride;
      return probs.data() + at;
    };
    bool values_ok = true;
    const bool fill = buffer_ok && strides_ok && q.valid && clean_cache_;
    if (fill && !overlapping) {
      for (std::int32_t b = 0; b < s.batch; ++b) {
        const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
        if (len == 0) continue;
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < n; ++j) {
            float* row = row_of(b, qh, j);
            const std::int32_t visible = len - n + j + 1;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) sum += (row[t] = static_cast<float>(gen_.next() % 64 + 1));
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
            if (src_.rarely()) row[0] = 1.0f;  // a spike: still in [0, 1]
          }
      }
    }
    if (fill && src_.rarely()) {  // an out-of-range value in a visible column of a query the library reads
      const std::int32_t b = src_.i32(0, s.batch - 1);
      const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
      if (len > 0 && n > 0) {
        float* row = row_of(b, src_.i32(0, q.q_heads - 1), n - 1);
        const float x = special_value(src_);
        row[src_.i32(0, len - 1)] = x;
        values_ok = !(x < 0.0f || x > 1.001f || std::isnan(x));
      }
    }
    sh::probability_view<memory_space::host> p{sh::host_span<const float>(probs.data(), static_cast<std::size_t>(alloc)),
                                               q.q_heads,
                                               q.ragged ? 0 : q.q_len,
                                               sequence_stride,
                                               head_stride,
                                               query_stride,
                                               q.qo};
    bool null_bad = false;
    if (src_.rarely()) {
      p.data = {nullptr, p.data.size()};
      null_bad = reach > 0;  // nothing to read: a null buffer is fine
    }
    const bool args_ok = !attention || (q.valid && strides_ok && buffer_ok && values_ok && !null_bad);
    const expect expected = expectation(damage, v, args_ok, false, !args_ok);
    FUZZ_TRACE("  observe_probabilities: reach %lld alloc %lld strides %lld %lld %lld values %d null %d view %d\n",
               static_cast<long long>(reach), static_cast<long long>(alloc), static_cast<long long>(sequence_stride),
               static_cast<long long>(head_stride), static_cast<long long>(query_stride), int(values_ok),
               int(null_bad), int(damage));
    const snapshot before = take();
    if (!guarded("host::observe_probabilities", expected,
                 [&] { sh::host::observe_probabilities(policy_, v, call_state(), p); }))
      return true;
    check_after_observe(v, before, q.counts);
    if (attention) check_h2o_scores(v, before, p);
    return damage == expect::ok && rc_.damage == expect::ok;  // the model no longer describes a damaged call
  }

  bool observe_queries() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const query_plan q = pick_queries(mv);
    std::int32_t head_dim = s.head_dim;
    if (src_.rarely()) head_dim += 1;
    const std::int32_t heads = std::clamp(q.q_heads, 1, 1 << 12), queries = std::clamp(q.q_len, 0, 64);
    const std::int64_t tokens = std::clamp<std::int64_t>(q.tokens, 0, 4096);
    // Dense [batch][q_len][q_heads][head_dim] or ragged [token][q_heads][head_dim].
    const std::int64_t reach = (q.ragged ? tokens : std::int64_t{s.batch} * queries) * heads * head_dim;
    std::vector<float> qs(static_cast<std::size_t>(std::max<std::int64_t>(reach, 1)));
    for (auto& x : qs) x = gen_.uniform(-3.0f, 3.0f);
    auto qv = q.ragged ? sh::query_view<float, memory_space::host>::ragged({qs.data(), static_cast<std::size_t>(reach)},
                                                                           q.qo, q.q_heads, head_dim)
                       : sh::query_view<float, memory_space::host>::dense({qs.data(), static_cast<std::size_t>(reach)},
                                                                          q.q_heads, q.q_len, head_dim);
    bool ok = q.valid && head_dim == s.head_dim;
    bool sure_bad = !ok;
    // The buffer is cut at 64 queries (4096 tokens) a sequence: a longer
    // view reaches past it, and the library checks a uniform view's reach
    // for every sequence, empty ones included.
    if ((!q.ragged && q.q_len > queries) || (q.ragged && q.tokens > tokens)) ok = false, sure_bad = true;
    if (src_.rarely() && reach > 0) {
      qv.data = {qs.data(), static_cast<std::size_t>(reach) - 1};
      ok = false;
      sure_bad = true;
    }
    float scale = 0.0f;
    if (src_.flag()) scale = src_.flag() ? 0.5f : special_value(src_);
    const bool scale_ok = std::isfinite(scale) && scale >= 0.0f;
    ok = ok && scale_ok;
    sure_bad = sure_bad || !scale_ok;
    // lse: absent, exact (computed here, natural or base 2), or garbage; for
    // uniform queries head-major (dense) or token-major, for ragged ones
    // ragged over the queries' own qo_indptr.
    std::vector<float> lse_values;
    sh::lse_view<memory_space::host> lse{};
    const int lse_kind = static_cast<int>(src_.in(0, 2));
    const bool exact_lse_possible = q.valid && head_dim == s.head_dim && clean_layout_ && clean_cache_;
    bool moderate_keys = scale < 100.0f;  // the mass check needs finite logits
    // The largest sum of |q_x k_x| times the scale: up to 1000 the library's
    // float logits are within 1% of the exact ones here, so the exact lse's
    // sums pass its check (lse_check) for sure.
    double magnitude = 0.0;
    if (lse_kind != 0 && exact_lse_possible) {
      const bool base2 = src_.flag();
      const bool token_major = !q.ragged && src_.flag();
      const auto base = base2 ? sh::lse_base::base2 : sh::lse_base::natural;
      lse_values.resize(static_cast<std::size_t>((q.ragged ? tokens : std::int64_t{s.batch} * queries) * heads));
      if (q.ragged)
        lse = sh::lse_view<memory_space::host>::ragged({lse_values.data(), lse_values.size()}, q.qo, q.q_heads, base);
      else if (token_major)
        lse = sh::lse_view<memory_space::host>::token_major({lse_values.data(), lse_values.size()}, q.q_heads, q.q_len,
                                                            base);
      else
        lse = sh::lse_view<memory_space::host>::dense({lse_values.data(), lse_values.size()}, q.q_heads, q.q_len, base);
      const float sc = scale > 0.0f && std::isfinite(scale) ? scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      const std::int32_t group = q.q_heads / s.kv_heads;
      for (std::int32_t b = 0; b < s.batch; ++b) {
        const std::int32_t len = length_in(mv, b), n = q.counts[static_cast<std::size_t>(b)];
        if (len == 0) continue;  // not read
        for (std::int32_t qh = 0; qh < q.q_heads; ++qh)
          for (std::int32_t j = 0; j < n; ++j) {
            const std::int32_t visible = len - n + j + 1;
            double sum = 0.0;
            for (std::int32_t t = 0; t < visible; ++t) {
              const float* k = cache_.k.data() + row_at(mv, true, b, qh / group, t);
              double dot = 0.0, size = 0.0;
              for (std::int32_t d = 0; d < s.head_dim; ++d) {
                dot += double{qv.row(b, qh, j)[d]} * double{k[d]};
                size += std::fabs(double{qv.row(b, qh, j)[d]} * double{k[d]});
                moderate_keys = moderate_keys && std::fabs(k[d]) < 1e4f;  // false for NaN and inf too
              }
              magnitude = std::max(magnitude, std::isnan(size) ? HUGE_VAL : size * sc);
              sum += std::exp(dot * sc);
            }
            auto x = static_cast<float>(std::log(std::max(sum, 1e-30)));
            if (base2) x = static_cast<float>(static_cast<double>(x) / 0.6931471805599453);
            if (lse_kind == 2) x = src_.flag() ? special_value(src_) : gen_.uniform(-5.0f, 5.0f);
            if (!std::isfinite(x)) ok = false, sure_bad = true;
            const std::int64_t at = q.ragged ? (std::int64_t{qo_store_[static_cast<std::size_t>(b)]} + j) * q.q_heads + qh
                                    : token_major ? (std::int64_t{b} * q.q_len + j) * q.q_heads + qh
                                                  : (std::int64_t{b} * q.q_heads + qh) * q.q_len + j;
            lse_values[static_cast<std::size_t>(at)] = x;
          }
      }
      // The sums' check (lse_check): the exact lse with moderate logits
      // passes either bound; a garbage one is refused or not, as its sums
      // fall (unknown), unless the check is off. Large logits: off. (The
      // choice reads no input byte, so the corpus decodes as before.)
      const auto check = static_cast<int>(lse_values.size() % 3);
      if (lse_kind == 1 && magnitude > 1000.0) {
        lse.check = sh::lse_check::none;
      } else if (lse_kind == 1) {
        lse.check = check == 0 ? sh::lse_check::at_most_one : sh::lse_check::sums_to_one;
      } else {
        lse.check = check == 0 ? sh::lse_check::none : sh::lse_check::sums_to_one;
        if (lse.check != sh::lse_check::none) ok = false;
      }
      if (lse.present() && src_.rarely()) {  // a lse that does not fit the queries
        const std::size_t half = qo_store_.size() / 2;
        switch (src_.in(0, 2)) {
          case 0:  // ragged over another array with the same values; uniform queries, ragged lse
            if (q.ragged) {
              std::copy_n(qo_store_.begin(), half, qo_store_.begin() + static_cast<std::ptrdiff_t>(half));
              lse.qo_indptr = {qo_store_.data() + half, q.qo.size()};
            } else {
              lse.qo_indptr = {qo_store_.data(), static_cast<std::size_t>(s.batch) + 1};
            }
            ok = false, sure_bad = true;
            break;
          case 1:  // ragged queries, uniform lse; or an empty span that is not null
            if (q.ragged)
              lse.qo_indptr = {};
            else
              lse.qo_indptr = {qo_store_.data(), 0};
            ok = false, sure_bad = true;
            break;
          default:  // one value short
            if (!lse.data.empty()) {
              lse.data = {lse.data.data(), lse.data.size() - 1};
              ok = false, sure_bad = true;
            }
            break;
        }
      }
    }
    if (src_.rarely()) {  // {nullptr, n}: a caller's bug, not "no lse"
      lse = {};
      lse.data = {nullptr, static_cast<std::size_t>(src_.in(1, 64))};
      ok = false;
      sure_bad = true;
    }
    const bool args_ok = !attention || ok;
    const expect expected = expectation(damage, v, args_ok, false, attention && sure_bad);
    const snapshot before = take();
    if (!guarded("host::observe_queries", expected,
                 [&] { sh::host::observe_queries(policy_, v, call_state(), qv, lse, scale); }))
      return true;
    check_after_observe(v, before, q.counts);
    // With the exact lse the probabilities of a query sum to 1, so a head's
    // tokens gain q_len(b) of mass in all (H2O: mass, unbounded, mean).
    if constexpr (std::is_same_v<Obs, sh::attention_mass> && std::is_same_v<Hist, sh::unbounded_history> &&
                  std::is_same_v<typename Policy::gqa, sh::gqa_mean>) {
      if (lse_kind == 1 && damage == expect::ok && exact_lse_possible && moderate_keys && clean_state_ && lse.present()) {
        for (std::int32_t b = 0; b < s.batch; ++b) {
          const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
          const std::int32_t len = length_in(v, b);
          if (r < 0 || len == 0) continue;
          const auto n = static_cast<float>(q.counts[static_cast<std::size_t>(b)]);
          const std::int32_t tracked = old_value(before, &state_.tracked[r]);
          for (std::int32_t h = 0; h < s.kv_heads; ++h) {
            float total = 0.0f, magnitude = 0.0f;  // new - old loses ~ulp(old) per token
            for (std::int32_t t = 0; t < len; ++t) {
              const float old = t < tracked ? old_value(before, &state_.scores[slot(r, h, t)]) : 0.0f;
              total += state_.scores[slot(r, h, t)] - old;
              magnitude += std::fabs(old);
            }
            if (std::isfinite(total))
              FUZZ_CHECK(std::fabs(total - n) <= 1e-3f * n + 1e-3f + magnitude * 1e-6f,
                         "observe_queries with the exact lse: mass per query is not 1");
          }
        }
      }
    }
    return damage == expect::ok && rc_.damage == expect::ok;
  }

  bool admit() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const snapshot before = take();
    if (!guarded("host::admit", expectation(damage, v, true, false, false),
                 [&] { sh::host::admit(policy_, v, call_state()); }))
      return true;
    check_after_observe(v, before, std::vector<std::int32_t>(static_cast<std::size_t>(v.batch), 0));
    return damage == expect::ok && rc_.damage == expect::ok;
  }

  // ---- compress and its oracle ---------------------------------------------
  // For the model's view and valid rows: whether a sequence at the budget
  // has state for fewer tokens than it holds, or a head with fewer
  // unprotected tokens than it must evict (damaged positions).
  [[nodiscard]] bool compress_state_refuses(const view_type& v, std::int32_t budget) const {
    const sh::settings& c = policy_.config;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const std::int32_t len = length_in(v, b);
      if (len < budget) continue;
      const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
      if (state_.tracked[r] != len) return true;
      const std::int32_t evict = len - budget + c.evict_count;
      for (std::int32_t h = 0; h < v.kv_heads; ++h) {
        std::int32_t free = 0;
        for (std::int32_t t = 0; t < len; ++t)
          free += !is_protected(state_.positions[slot(r, h, t)], state_.next_position[r], c);
        if (free < evict) return true;
        // shared_heads reads head 0's positions for every head: they must agree.
        if (shared)
          for (std::int32_t t = 0; t < len; ++t)
            if (state_.positions[slot(r, h, t)] != state_.positions[slot(r, 0, t)]) return true;
      }
    }
    return false;
  }

  bool compress() {
    view_type v = make_view();
    const expect damage = corrupt(v);
    pick_rows();
    const view_type mv = make_view();
    const common_shape& s = cache_.shape;
    const sh::settings& c = policy_.config;
    // Budgets near the lengths trigger; the rest exercise the bounds.
    std::int64_t max_len = 0;
    for (std::int32_t b = 0; b < s.batch; ++b) max_len = std::max<std::int64_t>(max_len, length_in(mv, b));
    const std::int32_t budget =
        src_.rarely() ? garbage_int(src_) : src_.i32(1, std::clamp<std::int64_t>(max_len, 1, 1 << 20) + 1);

    const std::size_t need = sh::host::compress_workspace_bytes(v, state_.shape);  // what compress checks
    bool ws_ok = need <= (std::size_t{1} << 24);
    std::size_t ws_size = ws_ok ? need + static_cast<std::size_t>(src_.in(0, 8)) : 64;
    std::size_t ws_shift = 0;
    if (src_.rarely()) {
      ws_ok = false;
      if (src_.flag())
        ws_size = need == 0 ? 0 : std::min(need - 1, ws_size);
      else
        ws_shift = 4;  // misaligned
    }
    std::vector<std::uint64_t> ws_store(ws_size / 8 + 2, 0xA5A5A5A5A5A5A5A5ull);
    sh::host_span<std::byte> workspace(reinterpret_cast<std::byte*>(ws_store.data()) + ws_shift, ws_size);
    if (src_.rarely()) {
      workspace = {nullptr, ws_size};
      ws_ok = false;
    }
    // compress_output: new_lengths [batch]; freed_pages [batch] (paged) or
    // empty or [batch] (contiguous). Both inside out_store_, with room
    // around them so a stray write shows.
    const auto n = static_cast<std::size_t>(s.batch);
    out_store_.assign(3 * n + 4, -7);
    std::int32_t* store = out_store_.data();
    sh::host_span<std::int32_t> new_lengths(store + 1, n), freed;
    if (Paged || src_.flag()) freed = {store + n + 2, n};
    bool out_ok = true;
    if (src_.rarely()) {
      out_ok = false;
      switch (src_.in(0, 7)) {
        case 0: freed = {store + n + 2, n + 1}; break;
        case 1: freed = {nullptr, n}; break;
        case 2: {
          freed = {store + n + 2, n - 1};
          // An empty span is fine for a contiguous cache and for page size 1.
          bool optional = true;
          if constexpr (Paged) optional = v.page_size == 1;
          out_ok = optional && n == 1;
          break;
        }
        case 3: new_lengths = {store + 1, src_.flag() ? n - 1 : n + 1}; break;
        case 4: new_lengths = {nullptr, n}; break;
        case 5: {
          // An output over something the call reads or moves: the lengths,
          // the state, the workspace, K, V, the page table or the state
          // rows (the view's own arrays: only for an undamaged view).
          const bool first = src_.flag();
          sh::host_span<std::int32_t> over;
          const auto as_i32 = [&](void* p, std::size_t bytes) {
            return bytes >= 4 * n ? sh::host_span<std::int32_t>(static_cast<std::int32_t*>(p), n)
                                  : sh::host_span<std::int32_t>{};
          };
          switch (damage == expect::ok ? src_.in(0, 5) : -1) {
            case 0:
              // The view reads a copy of the lengths inside a larger array,
              // so a partial overlap stays in bounds.
              scratch_len_.assign(3 * n + 2, -9);
              if constexpr (Paged) {
                std::copy(cache_.last_page_len.begin(), cache_.last_page_len.end(),
                          scratch_len_.begin() + static_cast<std::ptrdiff_t>(n + 1));
                v.last_page_len = {scratch_len_.data() + n + 1, n};
              } else {
                std::copy(cache_.lengths.begin(), cache_.lengths.end(),
                          scratch_len_.begin() + static_cast<std::ptrdiff_t>(n + 1));
                v.lengths = {scratch_len_.data() + n + 1, n};
              }
              over = {scratch_len_.data() + src_.in(2, 2 * static_cast<std::int64_t>(n)), n};
              break;
            case 1:  // a state row's counters or slots
              over = as_i32(state_buffer_.data + 4 * src_.in(0, 64), state_buffer_.size - 256);
              break;
            case 2:
              if (workspace.data() != nullptr) over = as_i32(workspace.data(), workspace.size());
              break;
            case 3: over = as_i32(cache_.k.data(), cache_.k.size() * sizeof(float)); break;
            case 4: over = as_i32(cache_.v.data(), cache_.v.size() * sizeof(float)); break;
            case 5:
              if constexpr (Paged) {
                over = src_.flag() ? as_i32(cache_.indptr.data(), 4 * cache_.indptr.size())
                                   : as_i32(cache_.indices.data(), 4 * cache_.indices.size());
              } else {
                if (rc_.span.data() == rc_.storage.data()) over = as_i32(rc_.storage.data(), 4 * rc_.storage.size());
              }
              break;
            default: break;
          }
          if (over.data() == nullptr) {
            out_ok = true;  // nothing to overlap: the outputs are the plain ones
            break;
          }
          (first ? new_lengths : freed) = over;
          break;
        }
        case 6: freed = {new_lengths.data() + src_.in(0, static_cast<std::int64_t>(n) - 1), n}; break;
        default:  // adjacent, not overlapping: fine
          freed = {store + 1 + n, n};
          out_ok = true;
          break;
      }
    }
    const std::int64_t protect = std::int64_t{c.recent} + c.sinks;
    const bool budget_ok = budget > protect && c.evict_count <= budget - protect;
    const bool state_bad = damage == expect::ok && rc_.damage != expect::refuse && rc_.in_range && clean_shape_ &&
                           clean_settings_ && budget_ok && !state_refuses(v) && compress_state_refuses(v, budget);
    expect expected = expectation(damage, v, true, !budget_ok || !ws_ok || !out_ok, state_bad);
    if (shared_page_ && rewrites_shared_page(v, budget)) expected = expect::refuse;
    FUZZ_TRACE("  compress: budget %d m %d ws %d out %d state_bad %d expected %d\n", budget, c.evict_count, int(ws_ok),
               int(out_ok), int(state_bad), int(expected));

    const snapshot before = take();
    const sh::compress_output<memory_space::host> out{new_lengths, freed};
    if (!guarded("host::compress", expected,
                 [&] { sh::host::compress(policy_, v, call_state(), budget, workspace, out); }))
      return true;
    check_after_compress(v, before, budget, new_lengths, freed);
    if (damage != expect::ok || rc_.damage != expect::ok) return false;
    // The engine applies the new lengths (one layer: right away).
    cache_.apply(std::vector<std::int32_t>(new_lengths.begin(), new_lengths.end()), "compress");
    return true;
  }

  // Whether a sequence at the budget lists a page that is listed elsewhere
  // too: compress would move rows under the other list, so it must refuse.
  bool rewrites_shared_page(const view_type& v, std::int32_t budget) const {
    if constexpr (Paged) {
      const std::int32_t listed = v.indptr[static_cast<std::size_t>(v.batch)];
      for (std::int32_t b = 0; b < v.batch; ++b) {
        if (length_in(v, b) < budget) continue;
        for (std::int32_t i = v.indptr[static_cast<std::size_t>(b)]; i < v.indptr[static_cast<std::size_t>(b) + 1]; ++i)
          if (std::count(v.indices.begin(), v.indices.begin() + listed, v.indices[static_cast<std::size_t>(i)]) > 1)
            return true;
      }
    } else {
      (void)v;
      (void)budget;
    }
    return false;
  }

  // The byte ranges of a token's whole identity, in order: its K row, its V
  // row (0, 1: in the K or V buffer) and every state field (2), each as
  // f(buffer, offset, bytes).
  template <class F>
  void token_ranges(const view_type& v, std::int32_t b, std::int32_t r, std::int32_t h, std::int32_t t, F&& f) const {
    const std::size_t row = static_cast<std::size_t>(v.head_dim) * sizeof(float);
    f(0, static_cast<std::size_t>(row_at(v, true, b, h, t)) * sizeof(float), row);
    f(1, static_cast<std::size_t>(row_at(v, false, b, h, t)) * sizeof(float), row);
    const std::size_t i = slot(r, h, t);
    f(2, byte_offset(state_.positions + i), 4);
    f(2, byte_offset(state_.scores + i), 4);
    f(2, byte_offset(state_.observed + i), 4);
    for (std::int32_t w = 0; w < state_shape_.ring_words; ++w)  // word-major: one word at a time
      f(2, byte_offset(&state_.ring_of(static_cast<std::int64_t>(i))[w]), 4);
  }

  // A token's whole identity: its K and V rows and every state field.
  std::vector<std::uint8_t> token_bytes(const std::vector<std::uint8_t>& k, const std::vector<std::uint8_t>& vv,
                                        const std::vector<std::uint8_t>& st, const view_type& v, std::int32_t b,
                                        std::int32_t r, std::int32_t h, std::int32_t t) const {
    std::vector<std::uint8_t> out;
    const std::vector<std::uint8_t>* const from[] = {&k, &vv, &st};
    token_ranges(v, b, r, h, t, [&](int buf, std::size_t at, std::size_t n) {
      const auto begin = from[buf]->begin() + static_cast<std::ptrdiff_t>(at);
      out.insert(out.end(), begin, begin + static_cast<std::ptrdiff_t>(n));
    });
    return out;
  }

  // Writes a token's identity (from token_bytes) into buffers at slot t.
  void put_token(std::vector<std::uint8_t>& k, std::vector<std::uint8_t>& vv, std::vector<std::uint8_t>& st,
                 const view_type& v, std::int32_t b, std::int32_t r, std::int32_t h, std::int32_t t,
                 const std::vector<std::uint8_t>& token) const {
    std::size_t next = 0;
    std::vector<std::uint8_t>* const to[] = {&k, &vv, &st};
    token_ranges(v, b, r, h, t, [&](int buf, std::size_t at, std::size_t n) {
      std::memcpy(to[buf]->data() + at, token.data() + next, n);
      next += n;
    });
  }

  void check_after_compress(const view_type& v, const snapshot& before, std::int32_t budget,
                            sh::host_span<std::int32_t> new_lengths, sh::host_span<std::int32_t> freed) {
    const sh::settings& c = policy_.config;
    const snapshot after = take();
    // The library never writes the lengths or the page table.
    FUZZ_CHECK(after.table == before.table &&
                   after.scratch == before.scratch,
               "compress wrote the lengths, the page table or an argument it only reads");
    // Expected bytes: start from before, then mark what compress may change.
    std::vector<std::uint8_t> ek = before.k, ev = before.v, est = before.state, eout = before.out;
    const auto put_out = [&](sh::host_span<std::int32_t> span, std::size_t b, std::int32_t x) {
      const auto at = static_cast<std::size_t>(span.data() - out_store_.data()) + b;  // valid spans lie in out_store_
      std::memcpy(eout.data() + 4 * at, &x, 4);
    };
    const std::int32_t m = c.evict_count;
    for (std::int32_t b = 0; b < v.batch; ++b) {
      const auto bu = static_cast<std::size_t>(b);
      const std::int32_t old_len = length_in(v, b);  // the lengths did not change
      const std::int32_t r = rc_.used[bu];
      if (old_len < budget) {
        FUZZ_CHECK(new_lengths[bu] == old_len, "compress: new length of a sequence below the budget");
        put_out(new_lengths, bu, old_len);
        if (!freed.empty()) {
          FUZZ_CHECK(freed[bu] == 0, "freed_pages of an untouched sequence");
          put_out(freed, bu, 0);
        }
        // Its tokens, read through its own page table, are exactly as they were
        // (a page shared with a compressed sequence would break this).
        if (r >= 0)
          for (std::int32_t h = 0; h < v.kv_heads; ++h)
            for (std::int32_t t = 0; t < old_len; ++t)
              FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, r, h, t) ==
                             token_bytes(before.k, before.v, before.state, v, b, r, h, t),
                         "compress changed a token of a sequence below the budget");
        continue;
      }
      const std::int32_t kept = budget - m;
      const std::int32_t evict = old_len - kept;
      const std::int32_t old_next = old_value(before, &state_.next_position[r]);
      FUZZ_TRACE("  compress b %d row %d old_len %d kept %d\n", b, r, old_len, kept);
      FUZZ_CHECK(kept == sh::length_after_compress(old_len, budget, m), "length_after_compress");
      FUZZ_CHECK(new_lengths[bu] == kept, "compress: new length != budget - m");
      put_out(new_lengths, bu, kept);
      FUZZ_CHECK(state_.tracked[r] == kept, "compress: tracked != new length");
      set_value(est, &state_.tracked[r], kept);
      std::int32_t freed_pages = 0;
      if constexpr (Paged) freed_pages = pages_in(v, b) - pages_for(kept, v.page_size);
      if (!freed.empty()) {
        FUZZ_CHECK(freed[bu] == freed_pages, "compress: freed_pages");
        put_out(freed, bu, freed_pages);
      }
      // shared_heads: one oracle for the sequence, by the slot's score
      // combined over the heads (granularity.hpp), head 0's positions.
      std::vector<ranked> shared_cand;
      if constexpr (shared) {
        for (std::int32_t t = 0; t < old_len; ++t) {
          const std::int32_t position = old_value(before, &state_.positions[slot(r, 0, t)]);
          if (is_protected(position, old_next, c)) continue;
          std::vector<float> per_head;
          for (std::int32_t h = 0; h < v.kv_heads; ++h)
            per_head.push_back(eviction_score_of(old_value(before, &state_.scores[slot(r, h, t)]),
                                                 old_value(before, &state_.observed[slot(r, h, t)]), c,
                                                 std::is_same_v<Obs, sh::unimportant_indicator>));
          shared_cand.push_back({reduce_scores<typename Policy::granularity::head_reduction>(per_head), position, t});
        }
      }
      for (std::int32_t h = 0; h < v.kv_heads; ++h) {
        // The oracle: every unprotected token, fully sorted by its key.
        std::vector<ranked> cand = shared_cand;
        std::vector<std::vector<std::uint8_t>> pre(static_cast<std::size_t>(old_len));
        for (std::int32_t t = 0; t < old_len; ++t) {
          pre[static_cast<std::size_t>(t)] = token_bytes(before.k, before.v, before.state, v, b, r, h, t);
          const std::size_t i = slot(r, h, t);
          const std::int32_t position = old_value(before, &state_.positions[i]);
          const float score = old_value(before, &state_.scores[i]), observed = old_value(before, &state_.observed[i]);
          if (!shared && !is_protected(position, old_next, c))
            cand.push_back({eviction_score_of(score, observed, c, std::is_same_v<Obs, sh::unimportant_indicator>),
                            position, t});
        }
        FUZZ_CHECK(static_cast<std::int32_t>(cand.size()) >= evict, "compress evicted more than the unprotected tokens");
        std::sort(cand.begin(), cand.end(), [](const ranked& x, const ranked& y) {
          const int k = compare_keys(x, y);
          return k != 0 ? k < 0 : x.slot < y.slot;
        });
        const bool tie = static_cast<std::size_t>(evict) < cand.size() &&
                         compare_keys(cand[static_cast<std::size_t>(evict) - 1], cand[static_cast<std::size_t>(evict)]) == 0;
        // Slots the compaction leaves behind may hold anything.
        for (std::int32_t t = kept; t < old_len; ++t) {
          const auto token = token_bytes(after.k, after.v, after.state, v, b, r, h, t);
          put_token(ek, ev, est, v, b, r, h, t, token);
        }
        if (!tie) {
          std::vector<char> gone(static_cast<std::size_t>(old_len), 0);
          for (std::int32_t e = 0; e < evict; ++e) gone[static_cast<std::size_t>(cand[static_cast<std::size_t>(e)].slot)] = 1;
          const std::vector<std::int32_t> source =
              compaction_sources(gone, old_len, kept, c.compaction_mode == sh::compaction::fill_holes);
          for (std::int32_t t = 0; t < kept; ++t) {
            const auto& want = pre[static_cast<std::size_t>(source[static_cast<std::size_t>(t)])];
            FUZZ_CHECK(token_bytes(after.k, after.v, after.state, v, b, r, h, t) == want,
                       "compress: a kept token's rows or state differ from the oracle's arrangement");
            put_token(ek, ev, est, v, b, r, h, t, want);
          }
        } else {
          // Equal keys at the cut (only garbage state makes them): any of the
          // tied tokens may go. The kept tokens must be distinct originals,
          // and the evicted keys the oracle's.
          std::vector<std::vector<std::uint8_t>> pool = pre;
          std::vector<char> used(pool.size(), 0);
          for (std::int32_t t = 0; t < kept; ++t) {
            const auto got = token_bytes(after.k, after.v, after.state, v, b, r, h, t);
            bool found = false;
            for (std::size_t u = 0; u < pool.size() && !found; ++u)
              if (!used[u] && pool[u] == got) used[u] = 1, found = true;
            FUZZ_CHECK(found, "compress (tied keys): a kept token is not an original");
            put_token(ek, ev, est, v, b, r, h, t, got);
          }
          std::vector<ranked> gone;
          for (const ranked& x : cand)
            if (!used[static_cast<std::size_t>(x.slot)]) gone.push_back(x);
          for (std::int32_t t = 0; t < old_len; ++t) {
            const std::int32_t position = old_value(before, &state_.positions[slot(r, h, t)]);
            if (is_protected(position, old_next, c))
              FUZZ_CHECK(used[static_cast<std::size_t>(t)], "compress (tied keys): a protected token was evicted");
          }
          FUZZ_CHECK(static_cast<std::int32_t>(gone.size()) == evict, "compress (tied keys): evicted count");
          for (std::int32_t e = 0; e < evict; ++e)
            FUZZ_CHECK(compare_keys(gone[static_cast<std::size_t>(e)], cand[static_cast<std::size_t>(e)]) == 0,
                       "compress (tied keys): evicted keys differ from the oracle's");
        }
      }
    }
    if constexpr (shared) {
      // Every head still holds one token per slot (they did before: compress
      // refuses otherwise).
      for (std::int32_t b = 0; b < v.batch; ++b) {
        const std::int32_t r = rc_.used[static_cast<std::size_t>(b)];
        if (r < 0 || length_in(v, b) < budget) continue;
        for (std::int32_t h = 1; h < v.kv_heads; ++h)
          for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t)
            FUZZ_CHECK(state_.positions[slot(r, h, t)] == state_.positions[slot(r, 0, t)],
                       "shared_heads compress: heads hold different tokens at a kept slot");
      }
    }
    FUZZ_CHECK(after.k == ek, "compress wrote K bytes outside the kept rows");
    FUZZ_CHECK(after.v == ev, "compress wrote V bytes outside the kept rows");
    FUZZ_CHECK(after.state == est, "compress wrote state bytes it should not have");
    FUZZ_CHECK(after.out == eout, "compress wrote output entries outside new_lengths[batch] and freed_pages[batch]");
  }

  // ---- shrink_page_table on its own random tables ---------------------------------
  // A table of 0-4 sequences (0-3 pages each), new lengths at most the held
  // ones, `released` exact or larger; rarely one argument broken. Checks
  // refusal with nothing written, or the rewritten table and released ids.
  void shrink_alone() {
    const std::int32_t batch = src_.i32(0, 4);
    std::int32_t page_size = src_.i32(1, 5);
    const auto nb = static_cast<std::size_t>(batch);
    // Stores larger than the spans, so a damaged span stays in bounds.
    std::vector<std::int32_t> indptr(nb + 2, 0), last(nb + 2, 0), lengths(nb + 2, 0), indices;
    std::int64_t total = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::int32_t pages = src_.i32(0, 3);
      for (std::int32_t i = 0; i < pages; ++i) indices.push_back(static_cast<std::int32_t>(gen_.next() % 64));
      indptr[b + 1] = indptr[b] + pages;
      last[b] = pages == 0 ? 0 : src_.i32(1, page_size);
      const std::int32_t held = paged_length(pages, page_size, last[b]);
      lengths[b] = src_.i32(0, held);
      total += pages - pages_for(lengths[b], page_size);
    }
    indices.resize(indices.size() + static_cast<std::size_t>(src_.in(0, 2)), -5);  // unused entries past indptr[batch]
    indices.push_back(-6);
    std::vector<std::int32_t> released(static_cast<std::size_t>(total) + static_cast<std::size_t>(src_.in(0, 2)) + 1, -1);
    table_spans t{{indptr.data(), nb + 1},
                  {indices.data(), indices.size() - 1},
                  {last.data(), nb},
                  page_size,
                  {lengths.data(), nb},
                  {released.data(), released.size() - 1}};
    if (src_.rarely()) {
      const auto at = static_cast<std::size_t>(src_.in(0, std::max(batch - 1, 0)));
      switch (src_.in(0, 14)) {
        case 0: t.indptr = {nullptr, nb + 1}; break;
        case 1: t.indptr = {indptr.data(), 0}; break;
        case 2: t.page_size = page_size = src_.flag() ? 0 : -1; break;
        case 3: t.new_lengths = src_.flag() ? sh::host_span<const std::int32_t>{lengths.data(), nb + 1}
                                            : sh::host_span<const std::int32_t>{nullptr, nb}; break;
        case 4: t.last_page_len = src_.flag() ? sh::host_span<std::int32_t>{last.data(), nb + 1}
                                              : sh::host_span<std::int32_t>{nullptr, nb}; break;
        case 5: indptr[0] = garbage_int(src_); break;
        case 6:
          if (batch > 0) indptr[at + 1] = indptr[at] - src_.i32(1, 2);
          break;
        case 7:
          if (batch > 0) last[at] = src_.flag() ? 0 : page_size + 1;  // fine for a sequence with no page
          break;
        case 8:
          if (batch > 0) lengths[at] = src_.flag() ? -1 : paged_length(indptr[at + 1] - indptr[at], page_size, last[at]) + 1;
          break;
        case 9:
          if (src_.flag())
            t.released = {released.data(), static_cast<std::size_t>(std::max<std::int64_t>(total - 1, 0))};
          else
            t.released = {nullptr, t.released.size()};
          break;
        case 10:
          if (src_.flag())
            t.indices = {indices.data(), static_cast<std::size_t>(std::max(indptr[nb] - 1, 0))};
          else
            t.indices = {nullptr, t.indices.size()};
          break;
        case 11:  // released over the indices it is read from
          t.released = {indices.data(), std::min(t.released.size(), indices.size())};
          break;
        case 12: t.new_lengths = {last.data() + 1, nb}; break;  // over last_page_len when batch > 1
        case 13: t.last_page_len = {indptr.data() + 1, nb}; break;  // over indptr
        default:
          if (batch > 0 && indptr[at + 1] == indptr[at]) last[at] = garbage_int(src_);  // ignored: no page
          break;
      }
    }
    const bool valid = shrink_valid(t);
    FUZZ_TRACE("  shrink_page_table alone: batch %d page_size %d valid %d\n", batch, page_size, int(valid));
    const auto bytes = [&] { return bytes_of_all(indptr, last, lengths, indices, released); };
    const std::vector<std::uint8_t> before = bytes();
    if (valid) {
      (void)shrink_and_check(t);
      return;
    }
    try {
      (void)sh::host::shrink_page_table(t.indptr, t.indices, t.last_page_len, t.page_size, t.new_lengths, t.released);
    } catch (const sh::invalid_argument& e) {
      FUZZ_TRACE("  host::shrink_page_table refused: %s\n", e.what());
      FUZZ_CHECK(e.function() == "host::shrink_page_table" && !e.argument().empty(),
                 std::string("shrink_page_table: error names ") + e.function());
      FUZZ_CHECK(bytes() == before, std::string("shrink_page_table wrote before refusing: ") + e.what());
      return;
    }
    fail(__FILE__, __LINE__, "shrink_page_table accepted an invalid argument");
  }
};

// The default mode: the first byte picks the policy, the next paged or not.
void run_per_head_mode(byte_source& src) {
  constexpr case_runner policies[] = {
      run_case<fuzz_case, sh::scissorhands_policy>,
      run_case<fuzz_case, sh::h2o_policy>,
      run_case<fuzz_case, sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>,
      run_case<fuzz_case,
               sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>,
      run_case<fuzz_case, sh::eviction_policy<sh::attention_mass, sh::exponential_decay>>,
      run_case<fuzz_case, sh::streaming_policy>,
      run_case<fuzz_case, sh::random_policy>,
      run_case<fuzz_case, sh::key_norm_policy>,
  };
  const mode_choice m = decode_choice(src);
  policies[m.policy](src, m.paged);
}

}  // namespace
