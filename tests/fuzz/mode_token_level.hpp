// The token-level mode of the host fuzz harness (fuzz_host.cpp): the
// shared_layers model of 1-3 layers (layers_case); the shared_heads
// policies run the per-head program (mode_per_head.hpp).
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

#include "mode_per_head.hpp"

namespace {

// ---------------------------------------------------------------------------
// Token-level eviction across layers (shared_layers: host::select, compact,
// forget; select.hpp). A model of 1-3 layers, each with its own K and V
// buffers (and its own layout) over one set of lengths (contiguous) or one
// page table (paged), as engines share them, and one model_state. The
// engine's side knows the id of the token at each slot of each layer, and a
// K/V row is a function of (layer, K or V, head, token id), so after every
// eviction the harness checks that every layer and head holds exactly the
// tokens it should, bit for bit. Steps: append tokens; observe (or admit)
// every layer (rarely the engine skips one); evict: select, then either
// compact every layer and apply new_lengths (a copy, or shrink_page_table),
// or forget every layer after the engine removed the selected slots itself
// (page size 1: from its slot lists, the pages back to its pool, as
// SGLang's token pool or llama.cpp's cells; otherwise by moving the rows
// down itself), rarely skipping a layer; swap, retire, roll back, reset
// (every layer, or one), and garbage poked into any layer's state.
//
// Every library call may first be probed with one corruption (the clean
// call follows): a stride too small, an output short, null, or over the
// lengths, the table, the state rows, any layer of the model state, the
// workspace, pinned_prefix or another output; a short, null or misaligned
// workspace; pinned_prefix null, of the wrong size, out of range or leaving
// too few tokens; a garbage budget; a model not laid out; a damaged view or
// batch mapping; for compact and forget a selection with counts beyond the
// length or the stride, slots out of range, not ascending or protected,
// short or null spans, spans over K, V, the state or the workspace, a state
// that does not track the tokens, a page compact would write listed twice
// (refused) or a shared page it only reads (accepted), or a smaller valid
// selection. A probe the library accepts is checked like any call, then
// every byte it wrote is put back. Expectations are computed from the data
// (rows, lengths, tracked, next_position, steps, status words, layers that
// disagree, unprotected unpinned tokens), so a refusal of a valid call and
// the acceptance of an invalid one are both failures.
template <class Policy, bool Paged>
class layers_case {
  using view_type = std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using state_type = sh::eviction_state<memory_space::host>;
  using model_type = sh::model_state<memory_space::host>;
  using selection_type = sh::eviction_selection<memory_space::host>;
  using G = typename Policy::granularity;
  using Obs = typename Policy::observation;
  static_assert(G::kind == sh::granularity_kind::shared_layers);
  static constexpr bool attention = Obs::needs_attention;
  static constexpr bool highest = std::is_same_v<Obs, sh::unimportant_indicator>;
  static constexpr std::int64_t max_elements = std::int64_t{1} << 16;

 public:
  explicit layers_case(byte_source& src) : src_(src) {}

  void run() {
    if (!setup()) return;
    for (int op = 0; op < 24 && !src_.exhausted(); ++op) step();
    check_tokens("end of the program");
  }

 private:
  struct layer_kv {
    strides3 kl, vl;
    std::vector<float> k, v;
  };
  byte_source& src_;
  generator gen_{0};
  Policy policy_{};
  bool clean_settings_ = true;
  common_shape shape_;
  std::int32_t layers_ = 1;
  seq_table<Paged> table_;
  std::vector<layer_kv> kv_;
  std::vector<std::vector<std::vector<std::int64_t>>> ids_;  // [layer][b][slot]: the engine's token at each slot
  std::int64_t next_id_ = 0;
  std::uint64_t value_seed_ = 0;
  sh::state_shape sshape_{};
  aligned_buffer state_buffer_;
  model_type model_{};
  std::vector<std::int32_t> rows_;  // state row of each batch position (-1: padding)
  bool pass_rows_ = false;
  bool respect_capacity_ = true;
  // Arrays the calls' spans point into: part of every snapshot.
  std::vector<std::int32_t> rows_store_, pinned_store_, sel_store_, probe_store_, scratch_;
  std::vector<std::uint64_t> ws_store_;
  std::string damage_note_;

  // ---- the engine's cache ---------------------------------------------------
  view_type make_view(std::int32_t l) {
    layer_kv& kv = kv_[static_cast<std::size_t>(l)];
    return view_of(table_, shape_, kv.k, kv.v, kv.kl, kv.vl);
  }

  // The element of a token's K or V row: a function of the layer, K or V,
  // the head and the engine's token id (rarely a special value).
  [[nodiscard]] float value(std::int32_t l, int kind, std::int32_t h, std::int64_t id, std::int32_t d) const {
    generator g{value_seed_ ^ (static_cast<std::uint64_t>(id) * 0x100000001B3ull) ^
                (static_cast<std::uint64_t>(((l * 2 + kind) * 8 + h) * 64 + d) << 40)};
    const std::uint64_t x = g.next();
    if (x % 97 == 0) {
      constexpr float table[] = {nan_f, inf_f, -inf_f, 0.0f, -0.0f, 3.4e38f};
      return table[(x >> 8) % std::size(table)];
    }
    return -4.0f + 8.0f * static_cast<float>(x >> 40) / 16777216.0f;
  }

  void write_token(std::int32_t l, std::int32_t b, std::int32_t t, std::int64_t id) {
    const view_type v = make_view(l);
    layer_kv& kv = kv_[static_cast<std::size_t>(l)];
    for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
      for (int kind = 0; kind < 2; ++kind) {
        float* row = (kind == 0 ? kv.k : kv.v).data() + row_at(v, kind == 0, b, h, t);
        for (std::int32_t d = 0; d < shape_.head_dim; ++d) row[d] = value(l, kind, h, id, d);
      }
  }

  // Every layer and head holds, at each slot below the length, the rows of
  // the token the engine put there.
  void check_tokens(const char* when) {
    for (std::int32_t l = 0; l < layers_; ++l) {
      const view_type v = make_view(l);
      const layer_kv& kv = kv_[static_cast<std::size_t>(l)];
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const auto& ids = ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)];
        FUZZ_CHECK(static_cast<std::int32_t>(ids.size()) == table_.length(b), std::string("token list length, ") + when);
        for (std::int32_t t = 0; t < table_.length(b); ++t)
          for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
            for (int kind = 0; kind < 2; ++kind) {
              const float* row = (kind == 0 ? kv.k : kv.v).data() + row_at(v, kind == 0, b, h, t);
              for (std::int32_t d = 0; d < shape_.head_dim; ++d) {
                const float want = value(l, kind, h, ids[static_cast<std::size_t>(t)], d);
                FUZZ_CHECK(std::memcmp(&row[d], &want, 4) == 0,
                           std::string("layer ") + std::to_string(l) + " sequence " + std::to_string(b) + " slot " +
                               std::to_string(t) + " head " + std::to_string(h) +
                               " does not hold the engine's token (" + when + ")");
              }
            }
      }
    }
  }

  // ---- set-up ---------------------------------------------------------------
  bool setup() {
    gen_.state = src_.word();
    value_seed_ = gen_.next();
    decode_settings_into(src_, policy_.config);
    clean_settings_ = settings_valid<Policy>(policy_.config);
    layers_ = src_.i32(1, 3);
    common_shape& s = shape_;
    s.batch = src_.i32(1, 3);
    s.kv_heads = src_.i32(1, 3);
    s.head_dim = src_.i32(1, 4);
    const auto nb = static_cast<std::size_t>(s.batch);
    table_.decode(src_, true);
    const std::int32_t e0 = table_.outer_extent(s.batch), e2 = table_.token_extent();
    table_.start(s.batch, gen_);
    kv_.resize(static_cast<std::size_t>(layers_));
    for (layer_kv& kv : kv_)
      for (int kind = 0; kind < 2; ++kind) {
        bool clean = true;  // the engine's own layouts are valid (damage comes per call)
        strides3 st = pick_strides(src_, e0, s.kv_heads, e2, s.head_dim, clean);
        if (!clean) st = {std::int64_t{e2} * s.kv_heads * s.head_dim, s.head_dim, std::int64_t{s.kv_heads} * s.head_dim};
        const std::int64_t x = extent_of(st, e0, s.kv_heads, e2, s.head_dim);
        if (x > max_elements) return false;
        (kind == 0 ? kv.kl : kv.vl) = st;
        std::vector<float>& buf = kind == 0 ? kv.k : kv.v;
        buf.resize(static_cast<std::size_t>(x));
        for (float& f : buf) f = gen_.uniform(-4.0f, 4.0f);  // never-written rows: a pattern
      }
    ids_.assign(static_cast<std::size_t>(layers_), std::vector<std::vector<std::int64_t>>(nb));

    // One model state: a layer state per layer, a row per batch position
    // plus spares, often fewer slots than the cache.
    sshape_ = sh::state_shape_for(policy_, make_view(0));
    sshape_.rows += src_.i32(0, 2);
    if (src_.flag()) sshape_.capacity = std::min(sshape_.capacity, src_.i32(1, 30));
    respect_capacity_ = !src_.rarely();
    const sh::state_shape& ss = sshape_;
    const bool shape_valid =
        ss.ring_words >= 0 && static_cast<double>(ss.rows) * ss.kv_heads * ss.capacity * (12.0 + 4.0 * ss.ring_words) < 4.0e18;
    std::size_t per_layer = 0, bytes = 0;
    try {
      per_layer = sh::state_bytes(ss);
      bytes = sh::model_state_bytes(ss, layers_);
    } catch (const sh::invalid_argument& e) {
      FUZZ_CHECK(!shape_valid, std::string("state_bytes / model_state_bytes refused a valid shape: ") + e.what());
      return false;
    }
    FUZZ_CHECK(shape_valid, "model_state_bytes accepted an invalid shape");
    FUZZ_CHECK(bytes == per_layer * static_cast<std::size_t>(layers_), "model_state_bytes != layers * state_bytes");
    if (bytes > (std::size_t{16} << 20)) return false;
    state_buffer_.allocate(bytes);
    std::memset(state_buffer_.data, 0xA5, bytes);  // reset_state(model) must clear every layer
    // make_model_state refuses no layer, a short, null or misaligned buffer.
    // (A null or misaligned buffer is caught by make_state inside it, and
    // the error names make_state.)
    const auto refused = [&](auto&& call, const char* argument) {
      expect_refusal(call, "make_model_state", argument, "make_state");
    };
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes), ss, 0); }, "layers");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes - 1), ss, layers_); },
            "buffer");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(nullptr, bytes), ss, layers_); }, "buffer");
    refused([&] { (void)sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data + 8, bytes), ss, layers_); },
            "buffer");
    model_ = sh::make_model_state(sh::host_span<std::byte>(state_buffer_.data, bytes), ss, layers_);
    FUZZ_CHECK(model_.layers == layers_ && model_.layer_bytes == per_layer, "make_model_state: layers, layer_bytes");
    for (std::int32_t l = 0; l < layers_; ++l)
      FUZZ_CHECK(reinterpret_cast<std::byte*>(model_.layer(l).step) == state_buffer_.data + per_layer * static_cast<std::size_t>(l),
                 "model_state::layer(l) does not start layer_bytes * l into the buffer");
    sh::host::reset_state(model_);
    FUZZ_CHECK(all_zero(state_buffer_), "reset_state(model) left a non-zero byte");
    pick_mapping(src_, gen_, shape_.batch, sshape_.rows, rows_, pass_rows_);
    append(true);
    FUZZ_TRACE("layers setup: layers %d batch %d heads %d dim %d paged %d page_size %d rows %d state capacity %d "
               "pass_rows %d m %d recent %d sinks %d mode %d\n",
               layers_, s.batch, s.kv_heads, s.head_dim, int(Paged), table_.page_size, sshape_.rows, sshape_.capacity,
               int(pass_rows_), policy_.config.evict_count, policy_.config.recent, policy_.config.sinks,
               int(policy_.config.compaction_mode));
    return true;
  }

  // ---- the engine's side -----------------------------------------------------
  void append(bool initial) {
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      std::int32_t n = initial ? src_.i32(0, 26) : src_.i32(0, 3);
      if (rows_[static_cast<std::size_t>(b)] < 0) continue;  // a padding slot holds no token
      while (n-- > 0) {
        const std::int32_t len = table_.length(b);
        if ((respect_capacity_ && len >= sshape_.capacity) || !table_.grow(b)) break;
        const std::int64_t id = next_id_++;
        for (std::int32_t l = 0; l < layers_; ++l) {
          ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)].push_back(id);
          write_token(l, b, len, id);
        }
      }
    }
    FUZZ_TRACE("  lengths:");
    for (std::int32_t b = 0; b < shape_.batch; ++b) FUZZ_TRACE(" %d", table_.length(b));
    FUZZ_TRACE("\n");
  }

  // Sets the lengths (they only shrink): a copy, or shrink_page_table with
  // the released pages back to the pool.
  void apply_lengths(const std::vector<std::int32_t>& lengths) {
    table_.apply(lengths, "layers");
    for (auto& layer : ids_)
      for (std::int32_t b = 0; b < shape_.batch; ++b)
        layer[static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(lengths[static_cast<std::size_t>(b)]));
  }

  void swap_positions() {
    const std::int32_t b1 = src_.i32(0, shape_.batch - 1), b2 = src_.i32(0, shape_.batch - 1);
    if (b1 == b2) return;
    FUZZ_TRACE("  swap positions %d and %d\n", b1, b2);
    if constexpr (!Paged)
      for (std::int32_t l = 0; l < layers_; ++l)
        swap_sequence_rows(make_view(l), kv_[static_cast<std::size_t>(l)].k, kv_[static_cast<std::size_t>(l)].v, b1, b2);
    table_.swap(b1, b2);
    for (auto& layer : ids_) std::swap(layer[static_cast<std::size_t>(b1)], layer[static_cast<std::size_t>(b2)]);
    swap_mapped_rows(rows_, pass_rows_, b1, b2);
  }

  // A request finishes: its tokens leave, its position becomes padding or
  // takes a new request on its row or a free one, which the engine resets
  // in every layer (rarely it forgets).
  void retire() {
    const retire_step step = decode_retire(src_, shape_.batch);
    std::vector<std::int32_t> lengths = table_.all_lengths();
    lengths[static_cast<std::size_t>(step.position)] = 0;
    apply_lengths(lengths);
    const std::int32_t row = retire_row(step, rows_, pass_rows_, sshape_.rows, gen_);
    if (row >= 0 && !step.forget) reset_rows(row, step.start, -1, expect::ok);
  }

  // Drops a sequence's last tokens without telling the library.
  void rollback() {
    const std::int32_t b = src_.i32(0, shape_.batch - 1);
    const std::int32_t k = src_.i32(1, 3);
    apply_lengths(rolled_back(table_.all_lengths(), b, k));
  }

  // ---- snapshots ------------------------------------------------------------
  struct snapshot {
    std::vector<std::vector<std::uint8_t>> k, v;
    std::vector<std::uint8_t> table, state, sel, probe, other;
    bool operator==(const snapshot&) const = default;
  };
  [[nodiscard]] snapshot take() const {
    snapshot s;
    for (const layer_kv& kv : kv_) {
      s.k.push_back(bytes_of_all(kv.k));
      s.v.push_back(bytes_of_all(kv.v));
    }
    s.table = table_.bytes();
    s.state = bytes_of(state_buffer_.data, state_buffer_.size);
    s.sel = bytes_of_all(sel_store_);
    s.probe = bytes_of_all(probe_store_);
    s.other = bytes_of_all(rows_store_, pinned_store_, scratch_, rows_);
    return s;
  }
  // Puts back what an accepted probe wrote (the arrays have their sizes).
  void restore(const snapshot& s) {
    const auto put = [](auto& vec, const std::vector<std::uint8_t>& bytes) {
      FUZZ_CHECK(bytes.size() == vec.size() * sizeof(vec[0]), "restore: an array changed size");
      if (!bytes.empty()) std::memcpy(vec.data(), bytes.data(), bytes.size());
    };
    for (std::size_t l = 0; l < kv_.size(); ++l) put(kv_[l].k, s.k[l]), put(kv_[l].v, s.v[l]);
    table_.restore(s.table);
    std::memcpy(state_buffer_.data, s.state.data(), s.state.size());
    put(sel_store_, s.sel), put(probe_store_, s.probe);
  }

  template <class Call>
  bool guarded(const char* fn, expect expected, Call&& call) {
    return guarded_call(fn, expected, damage_note_, [this] { return take(); }, std::forward<Call>(call));
  }

  // ---- state accessors (layout from docs/design.md) ---------------------------
  [[nodiscard]] state_type layer(std::int32_t l) const { return model_.layer(l); }
  [[nodiscard]] std::size_t slot(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return state_slot(sshape_, r, h, t);
  }
  [[nodiscard]] std::size_t byte_offset(const void* p) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(p) - state_buffer_.data);
  }
  [[nodiscard]] bool is_protected_at(std::int32_t l, std::int32_t r, std::int32_t h, std::int32_t t) const {
    const state_type s = layer(l);
    return is_protected(s.positions[slot(r, h, t)], s.next_position[r], policy_.config);
  }

  // ---- the batch mapping of one call ---------------------------------------------
  struct call_rows {
    sh::host_span<const std::int32_t> span;  // state_rows as passed ({}: row b)
    bool structural = false;                 // refused whatever the data (size, null, out of range, duplicate)
    std::vector<std::int32_t> used;          // the row of each position
  };
  // The engine's mapping, or rarely a damaged one.
  call_rows pick_rows(bool damage) {
    const std::int32_t batch = shape_.batch, rows = sshape_.rows;
    rows_store_ = rows_;
    call_rows rc;
    bool pass = pass_rows_;
    if (damage) {
      const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
      switch (src_.in(0, 4)) {
        case 0: rows_store_[at] = src_.flag() ? rows + src_.i32(0, 2) : -2; pass = true; break;
        case 1:
          if (batch > 1 && rows_store_[at] >= 0) rows_store_[(at + 1) % static_cast<std::size_t>(batch)] = rows_store_[at];
          pass = true;
          break;
        case 2: rows_store_[at] = -1, pass = true; break;  // padding: fine for a sequence with no token
        case 3:
          if (src_.flag())
            rows_store_.pop_back();
          else
            rows_store_.push_back(-1);
          pass = true;
          break;
        default: pass = false; break;  // no mapping: row b
      }
      damage_note_ = "damaged state_rows";
    }
    rc.span = pass ? sh::host_span<const std::int32_t>(rows_store_.data(), rows_store_.size())
                   : sh::host_span<const std::int32_t>{};
    if (damage && src_.rarely()) rc.span = {nullptr, static_cast<std::size_t>(batch)}, rc.structural = true;
    rc.structural = !resolve_rows(rc.span, batch, rows, rc.used) || rc.structural;
    return rc;
  }

  // What every cache entry point checks per layer from the data
  // (validate_common): padding slots empty, lengths within the state's
  // capacity, 0 <= tracked <= length, positions left, steps in range, the
  // status words of mapped rows zero. True: refused.
  [[nodiscard]] bool layer_refuses(std::int32_t l, const call_rows& rc) const {
    if (rc.structural) return true;
    const state_type s = layer(l);
    for (std::int32_t b = 0; b < shape_.batch; ++b)
      if (row_refuses(s, rc.used[static_cast<std::size_t>(b)], table_.length(b), sshape_.capacity,
                      rc.span.data() != nullptr))
        return true;
    return false;
  }

  // Rarely damages one field of a call's view: expect::refuse when always
  // invalid, unknown when it may describe another valid cache. `for_compact`:
  // the damage may be a page listed twice (a shared prefix page).
  expect corrupt(view_type& v, bool for_compact, bool& shared_page) {
    shared_page = false;
    const std::int32_t batch = shape_.batch;
    const auto which = src_.in(0, 9);
    damage_note_ = "view damage " + std::to_string(which);
    if constexpr (Paged) {
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : batch + 1; return expect::refuse;
        case 1: v.page_size = 0; return expect::refuse;
        case 2: v.indptr = {v.indptr.data(), v.indptr.size() - 1}; return expect::refuse;
        case 3: v.k_pages = {nullptr, v.k_pages.size()}; return expect::refuse;
        case 4: v.v_pages = {v.v_pages.data(), v.v_pages.size() - 1}; return expect::refuse;
        case 5: v.last_page_len = {v.last_page_len.data(), v.last_page_len.size() - 1}; return expect::refuse;
        case 6: v.kv_heads = src_.flag() ? 0 : shape_.kv_heads + 1; return expect::refuse;  // the state's heads differ
        case 7:
          scratch_ = table_.indices;
          if (scratch_.empty()) return expect::ok;
          scratch_[static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1))] =
              src_.flag() ? table_.num_pages : -1;  // a page outside the pool
          v.indices = {scratch_.data(), scratch_.size()};
          return expect::refuse;
        default: {  // a page listed twice: fine to read, refused where compact writes
          scratch_ = table_.indices;
          if (scratch_.size() < 2) return expect::ok;
          const auto i = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1));
          const auto j = static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(scratch_.size()) - 1));
          if (i == j) return expect::ok;
          scratch_[i] = scratch_[j];
          v.indices = {scratch_.data(), scratch_.size()};
          shared_page = true;
          (void)for_compact;
          return expect::unknown;
        }
      }
    } else {
      (void)for_compact;
      switch (which) {
        case 0: v.batch = src_.flag() ? 0 : batch + 1; return expect::refuse;
        case 1: v.kv_heads = src_.flag() ? 0 : shape_.kv_heads + 1; return expect::refuse;
        case 2: v.lengths = {v.lengths.data(), v.lengths.size() - 1}; return expect::refuse;
        case 3: v.lengths = {nullptr, v.lengths.size()}; return expect::refuse;
        case 4: v.k = {nullptr, v.k.size()}; return expect::refuse;
        case 5: v.v = {v.v.data(), v.v.size() - 1}; return expect::refuse;
        case 6: v.v = v.k, v.v_layout = v.k_layout; return expect::refuse;
        case 7: v.capacity = 0; return expect::refuse;
        case 8: v.head_dim = 0; return expect::refuse;
        default:  // a smaller capacity: valid while every length fits
          v.capacity = table_.capacity - 1;
          for (std::int32_t b = 0; b < batch; ++b)
            if (table_.length(b) > v.capacity) return expect::refuse;
          return expect::unknown;
      }
    }
  }

  // Whether two byte ranges share a byte (empty or null ones never do).
  static bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
    if (a == nullptr || b == nullptr || an == 0 || bn == 0) return false;
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    return pa < pb + bn && pb < pa + an;
  }

  // ---- steps ------------------------------------------------------------------
  void step() {
    const auto op = src_.in(0, 15);
    FUZZ_TRACE("layers op %d at byte %zu\n", int(op), src_.position());
    switch (op) {
      case 0: append(false); break;
      case 1:
      case 2:
      case 3: observe_all(); break;
      case 4:
      case 5:
      case 6:
      case 7: evict(); break;
      case 8: reset(); break;
      case 9: poke(); break;
      case 10: swap_positions(); break;
      case 11: retire(); break;
      case 12:
        // Rare: every call is refused afterwards until the row is reset.
        if (src_.rarely()) {
          rollback();
          break;
        }
        [[fallthrough]];
      default:  // append and observe, as a decode step does
        append(false);
        observe_all();
        break;
    }
  }

  // The observe-step invariant (docs/integration.md): q_len queries are a
  // sequence's last tokens, each new or admitted without a query; tokens
  // before them are admitted by the call only before the row's first query.
  bool steps_ok(std::int32_t l, const call_rows& rc, std::int32_t q_len) {
    const auto st = layer(l);
    for (std::int32_t b = 0; b < shape_.batch; ++b)
      if (!row_steps_ok(st, st.shape.rows, rc.used[static_cast<std::size_t>(b)], table_.length(b), q_len))
        return false;
    return true;
  }

  // Observes (or admits) every layer, each with its own probabilities;
  // rarely the engine skips a layer, which select then refuses ('model').
  void observe_all() {
    const bool admit_only = !attention || src_.in(0, 3) == 0;
    const std::int32_t skip = src_.rarely() ? src_.i32(0, layers_ - 1) : -1;
    const std::int32_t group = src_.i32(1, 2);
    const bool through_model = src_.flag();
    std::int32_t q_len = src_.i32(0, 3), max_len = 1;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      if (table_.length(b) > 0) q_len = std::min(q_len, table_.length(b));
      max_len = std::max(max_len, table_.length(b));
    }
    const std::int32_t q_heads = shape_.kv_heads * group;
    const call_rows rc = pick_rows(false);
    // Mostly a query per new token (the observe-step invariant): the first
    // sequence with tokens sets the count.
    if (!src_.rarely())
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t r = rc.used[static_cast<std::size_t>(b)], len = table_.length(b);
        if (r < 0 || len == 0) continue;
        const std::int32_t tracked = layer(0).tracked[r];
        if (tracked >= 0 && tracked < len) q_len = len - tracked;
        break;
      }
    for (std::int32_t b = 0; b < shape_.batch; ++b)
      if (table_.length(b) > 0) q_len = std::min(q_len, table_.length(b));
    const auto nb = static_cast<std::size_t>(shape_.batch);
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (l == skip) {
        FUZZ_TRACE("  layer %d not observed\n", l);
        continue;
      }
      const view_type v = make_view(l);
      // Dense [batch][q_heads][q_len][max_len]; invisible columns NaN.
      std::vector<float> probs(std::max<std::size_t>(nb * static_cast<std::size_t>(q_heads * q_len * max_len), 1), nan_f);
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t len = table_.length(b);
        if (len == 0) continue;
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t j = 0; j < q_len; ++j) {
            float* row = probs.data() + ((static_cast<std::size_t>(b) * static_cast<std::size_t>(q_heads) +
                                          static_cast<std::size_t>(qh)) * static_cast<std::size_t>(q_len) +
                                         static_cast<std::size_t>(j)) * static_cast<std::size_t>(max_len);
            const std::int32_t visible = len - q_len + j + 1;
            float sum = 0.0f;
            for (std::int32_t t = 0; t < visible; ++t) sum += (row[t] = static_cast<float>(gen_.next() % 4 + 1));  // ties
            for (std::int32_t t = 0; t < visible; ++t) row[t] /= sum;
          }
      }
      const auto p = sh::probability_view<memory_space::host>::dense({probs.data(), probs.size()}, q_heads, q_len, max_len);
      const state_type st = through_model ? model_.for_batch(rc.span).layer(l) : layer(l).for_batch(rc.span);
      const expect expected =
          !clean_settings_ || layer_refuses(l, rc) || (!admit_only && !steps_ok(l, rc, q_len)) ? expect::refuse
                                                                                                 : expect::ok;
      const snapshot before = take();
      const char* fn = admit_only ? "host::admit" : "host::observe_probabilities";
      if (!guarded(fn, expected, [&] {
            if (admit_only)
              sh::host::admit(policy_, v, st);
            else
              sh::host::observe_probabilities(policy_, v, st, p);
          }))
        continue;
      // Only layer l's state changed, and its mapped rows track every token.
      const snapshot after = take();
      FUZZ_CHECK(after.k == before.k && after.v == before.v && after.table == before.table && after.other == before.other,
                 "observe (layers) wrote the cache, the table or an argument it only reads");
      const std::size_t lo = model_.layer_bytes * static_cast<std::size_t>(l), hi = lo + model_.layer_bytes;
      FUZZ_CHECK(std::equal(after.state.begin(), after.state.begin() + static_cast<std::ptrdiff_t>(lo), before.state.begin()) &&
                     std::equal(after.state.begin() + static_cast<std::ptrdiff_t>(hi), after.state.end(),
                                before.state.begin() + static_cast<std::ptrdiff_t>(hi)),
                 "observe of one layer wrote another layer's state");
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t r = rc.used[static_cast<std::size_t>(b)];
        if (r >= 0) FUZZ_CHECK(layer(l).tracked[r] == table_.length(b), "observe (layers): tracked != length");
      }
    }
  }

  // reset_sequence of a row in every layer (model), or in one layer.
  // Returns whether the call was accepted.
  bool reset_rows(std::int32_t row, std::int32_t start, std::int32_t only_layer, expect expected) {
    const snapshot before = take();
    if (!guarded("host::reset_sequence", expected, [&] {
          if (only_layer < 0)
            sh::host::reset_sequence(model_, row, start);
          else
            sh::host::reset_sequence(layer(only_layer), row, start);
        }))
      return false;
    std::vector<std::uint8_t> est = before.state;
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (only_layer >= 0 && l != only_layer) continue;
      const state_type s = layer(l);
      FUZZ_CHECK(s.tracked[row] == 0 && s.next_position[row] == start && s.step[row] == 0 && s.status[row] == 0,
                 "reset_sequence (model): a layer's row not reset");
      for (const void* p : {static_cast<const void*>(&s.tracked[row]), static_cast<const void*>(&s.next_position[row]),
                            static_cast<const void*>(&s.status[row])})
        std::memcpy(est.data() + byte_offset(p), p, 4);
      std::memcpy(est.data() + byte_offset(&s.step[row]), &s.step[row], 8);
    }
    FUZZ_CHECK(take().state == est, "reset_sequence (model) wrote other bytes than the rows' counters");
    return true;
  }

  void reset() {
    const std::int32_t row = src_.flag() ? src_.i32(0, sshape_.rows - 1) : garbage_int(src_);
    const std::int32_t start = src_.flag() ? src_.i32(0, 1000) : garbage_int(src_);
    const std::int32_t only = src_.in(0, 3) == 0 ? src_.i32(0, layers_ - 1) : -1;
    const bool valid = row >= 0 && row < sshape_.rows && start >= 0;
    FUZZ_TRACE("  reset row %d start %d layer %d\n", row, start, only);
    reset_rows(row, start, only, valid ? expect::ok : expect::refuse);
    if (src_.rarely()) {
      model_type empty = model_;
      empty.layers = 0;
      guarded("host::reset_state", expect::refuse, [&] { sh::host::reset_state(empty); });
      guarded("host::reset_sequence", expect::refuse, [&] { sh::host::reset_sequence(empty, 0, 0); });
      sh::host::reset_state(model_);
      FUZZ_CHECK(all_zero(state_buffer_), "reset_state(model) left a non-zero byte");
    }
  }

  // Garbage in one layer's state (a head or a layer that disagrees with the
  // others, counters, scores, the status words).
  void poke() {
    const std::int32_t l = src_.i32(0, layers_ - 1);
    const std::int32_t r = src_.i32(0, sshape_.rows - 1);
    const std::int32_t h = src_.i32(0, sshape_.kv_heads - 1);
    const std::int32_t t = src_.i32(0, sshape_.capacity - 1);
    const state_type s = layer(l);
    const std::size_t i = slot(r, h, t);
    const auto what = src_.in(0, 8);
    FUZZ_TRACE("  poke %d layer %d row %d head %d slot %d\n", int(what), l, r, h, t);
    switch (what) {
      // (One off, wrapping: the value may be garbage already.)
      case 0: s.tracked[r] = src_.flag() ? static_cast<std::int32_t>(static_cast<std::uint32_t>(s.tracked[r]) - 1u) : garbage_int(src_); break;
      case 1:
        s.next_position[r] =
            src_.flag() ? static_cast<std::int32_t>(static_cast<std::uint32_t>(s.next_position[r]) + 1u) : garbage_int(src_);
        break;
      case 2: s.step[r] = src_.flag() ? -std::int64_t{src_.word()} - 1 : INT64_MAX - src_.in(0, 3); break;
      case 3: s.positions[i] = src_.flag() ? garbage_int(src_) : s.positions[slot(r, h, src_.i32(0, t))]; break;
      case 4: s.scores[i] = special_value(src_); break;
      case 5: s.observed[i] = special_value(src_); break;
      case 6: s.status[r] = src_.flag() ? 1u : src_.word(); break;
      case 7:  // the same score in every layer and head: ties across the model
        for (std::int32_t ll = 0; ll < layers_; ++ll)
          for (std::int32_t hh = 0; hh < sshape_.kv_heads; ++hh) layer(ll).scores[slot(r, hh, t)] = 0.25f;
        break;
      default:
        if (sshape_.ring_words > 0) s.ring_of(static_cast<std::int64_t>(i))[0] = src_.word();
        break;
    }
  }

  // Moves a call's workspace (`size` bytes, of which the call uses `need`)
  // over something the call reads: the model state (any layer, or layer
  // `l`'s only), K or V of layer l, the lengths the view reads (a copy
  // inside scratch_), the page table's indices (paged: a copy) or the state
  // rows (contiguous, when passed). Returns whether it moved it; `over`:
  // whether the used bytes share a byte with that (refused).
  bool workspace_over(view_type& v, call_rows& rc, std::int32_t l, bool any_layer, sh::host_span<std::byte>& ws,
                      std::size_t need, bool& over) {
    const std::size_t size = ws.size();
    std::byte* at = nullptr;
    std::size_t room = 0;
    const void* tp = nullptr;
    std::size_t tn = 0;
    const auto copy_into_scratch = [&](const std::vector<std::int32_t>& src) {
      // (At the start of the array the workspace starts at: a workspace
      // that did not overlap it would write scratch_, which is compared.)
      scratch_.assign(size / 4 + src.size() + 4, -9);
      std::copy(src.begin(), src.end(), scratch_.begin());
      at = reinterpret_cast<std::byte*>(scratch_.data()), room = 4 * scratch_.size();
      tp = scratch_.data(), tn = 4 * src.size();
      return sh::host_span<const std::int32_t>(scratch_.data(), src.size());
    };
    const auto target = src_.in(0, 4);
    damage_note_ += ", workspace over target " + std::to_string(target);
    switch (target) {
      case 0: {
        const std::size_t off = model_.layer_bytes * static_cast<std::size_t>(any_layer ? src_.i32(0, layers_ - 1) : l);
        at = state_buffer_.data + off, room = state_buffer_.size - off;
        tp = any_layer ? state_buffer_.data : at, tn = any_layer ? state_buffer_.size : model_.layer_bytes;
        break;
      }
      case 1:
      case 2: {
        std::vector<float>& buf = target == 1 ? kv_[static_cast<std::size_t>(l)].k : kv_[static_cast<std::size_t>(l)].v;
        at = reinterpret_cast<std::byte*>(buf.data()), room = 4 * buf.size(), tp = at, tn = room;
        break;
      }
      case 3:
        if constexpr (Paged)
          v.last_page_len = copy_into_scratch(table_.last_page_len);
        else
          v.lengths = copy_into_scratch(table_.lengths);
        break;
      default:
        if constexpr (Paged) {
          v.indices = copy_into_scratch(table_.indices);
        } else if (rc.span.data() != nullptr && rc.span.data() == rows_store_.data()) {
          const std::vector<std::int32_t> rows(rows_store_.begin(), rows_store_.end());
          rows_store_.assign(size / 4 + rows.size() + 4, -9);
          std::copy(rows.begin(), rows.end(), rows_store_.begin());
          rc.span = {rows_store_.data(), rc.span.size()};
          at = reinterpret_cast<std::byte*>(rows_store_.data()), room = 4 * rows_store_.size();
          tp = rows_store_.data(), tn = 4 * rows.size();
        }
        break;
    }
    if (at == nullptr || room < size) return false;
    ws = {at, size};
    over = overlap(at, need, tp, tn);
    return true;
  }

  // ---- select ---------------------------------------------------------------
  struct select_parts {
    std::int32_t view_layer = 0;  // select reads any layer's view (lengths and table)
    std::int32_t budget = 1;
    std::int32_t extra_stride = 0;
    std::int32_t ws_slack = 0;
    bool cache_slots = false;
    bool freed = false;
    std::vector<std::int32_t> pins;  // empty: no pinned_prefix
  };
  struct select_call {
    view_type v{};
    call_rows rc;
    model_type model{};
    std::int32_t budget = 1;
    sh::host_span<std::byte> workspace;
    selection_type sel{};
    sh::host_span<const std::int32_t> pinned;
    expect view_damage = expect::ok;
    bool structural = false;  // refused whatever the data
    std::vector<std::int32_t>* store = nullptr;
  };

  // The selection's spans inside `store`, a guard entry around each.
  static selection_type lay_out(std::vector<std::int32_t>& store, std::int32_t batch, std::int32_t stride,
                                bool cache_slots, bool freed) {
    const auto b = static_cast<std::size_t>(batch);
    const std::size_t e = b * static_cast<std::size_t>(std::max(stride, 0));
    store.assign(3 * b + 2 * e + 6, -7);
    std::int32_t* p = store.data();
    selection_type s{};
    s.stride = stride;
    s.counts = {p + 1, b};
    s.slots = {p + 2 + b, e};
    if (cache_slots) s.cache_slots = {p + 3 + b + e, e};
    s.out.new_lengths = {p + 4 + b + 2 * e, b};
    if (freed) s.out.freed_pages = {p + 5 + 2 * b + 2 * e, b};
    return s;
  }
  // The same spans over another store of the same layout.
  static selection_type rebase(const selection_type& s, const std::vector<std::int32_t>& from,
                               std::vector<std::int32_t>& to) {
    const auto move = [&](sh::host_span<std::int32_t> x) {
      return x.data() == nullptr ? x : sh::host_span<std::int32_t>(to.data() + (x.data() - from.data()), x.size());
    };
    selection_type r = s;
    r.counts = move(s.counts);
    r.slots = move(s.slots);
    r.cache_slots = move(s.cache_slots);
    r.out.new_lengths = move(s.out.new_lengths);
    r.out.freed_pages = move(s.out.freed_pages);
    return r;
  }

  select_call build_select(const select_parts& parts, std::vector<std::int32_t>& store) {
    select_call c;
    c.v = make_view(parts.view_layer);
    c.rc = pick_rows(false);
    c.model = model_.for_batch(c.rc.span);
    c.budget = parts.budget;
    const std::int32_t need = sh::max_evictions(sshape_.capacity, parts.budget, policy_.config.evict_count);
    c.sel = lay_out(store, shape_.batch, std::min(need, 64) + parts.extra_stride, parts.cache_slots, parts.freed);
    c.store = &store;
    const std::size_t ws_need = sh::host::select_workspace_bytes(c.v, sshape_);
    ws_store_.assign(ws_need / 8 + 4, 0xA5A5A5A5A5A5A5A5ull);
    c.workspace = {reinterpret_cast<std::byte*>(ws_store_.data()), ws_need + static_cast<std::size_t>(parts.ws_slack)};
    pinned_store_ = parts.pins;
    if (!pinned_store_.empty()) c.pinned = {pinned_store_.data(), pinned_store_.size()};
    return c;
  }

  void call_select(const select_call& c) {
    sh::host::select(policy_, c.v, c.model, c.budget, c.workspace, c.sel, c.pinned);
  }

  // The slot's score combined over the heads of each layer, then over the
  // layers (granularity.hpp), from the eviction scores.
  [[nodiscard]] float combined(std::int32_t r, std::int32_t t) const {
    std::vector<float> per_layer;
    for (std::int32_t l = 0; l < layers_; ++l) {
      const state_type s = layer(l);
      std::vector<float> per_head;
      for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
        per_head.push_back(eviction_score_of(s.scores[slot(r, h, t)], s.observed[slot(r, h, t)], policy_.config, highest));
      per_layer.push_back(reduce_scores<typename G::head_reduction>(per_head));
    }
    return reduce_scores<typename G::layer_reduction>(per_layer);
  }

  // What select must do with these arguments, from the data.
  [[nodiscard]] expect select_expected(const select_call& c) const {
    if (!clean_settings_ || c.structural || c.rc.structural || c.view_damage == expect::refuse) return expect::refuse;
    if (c.view_damage == expect::unknown) return expect::unknown;
    const sh::settings& cfg = policy_.config;
    const std::int64_t protect = std::int64_t{cfg.recent} + cfg.sinks;
    if (!(c.budget > protect && cfg.evict_count <= c.budget - protect)) return expect::refuse;
    if (c.sel.stride < sh::max_evictions(sshape_.capacity, c.budget, cfg.evict_count)) return expect::refuse;
    for (std::int32_t l = 0; l < layers_; ++l)
      if (layer_refuses(l, c.rc)) return expect::refuse;
    const state_type s0 = layer(0);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t len = table_.length(b);
      const std::int32_t pinned = c.pinned.empty() ? 0 : c.pinned[static_cast<std::size_t>(b)];
      if (pinned < 0 || pinned > len) return expect::refuse;
      if (len < c.budget) continue;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      // Every layer tracks every token, at the same positions in every head.
      for (std::int32_t l = 0; l < layers_; ++l) {
        const state_type s = layer(l);
        if (s.tracked[r] != len || s.next_position[r] != s0.next_position[r]) return expect::refuse;
        for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
          for (std::int32_t t = 0; t < len; ++t)
            if (s.positions[slot(r, h, t)] != s0.positions[slot(r, 0, t)]) return expect::refuse;
      }
      const std::int32_t evict = len - c.budget + cfg.evict_count;
      std::int32_t free = 0;
      for (std::int32_t t = pinned; t < len; ++t)
        free += !is_protected(s0.positions[slot(r, 0, t)], s0.next_position[r], cfg);
      if (free < evict) return expect::refuse;
    }
    return expect::ok;
  }

  // After an accepted select: the oracle's choice (every unprotected,
  // unpinned slot sorted by (combined score, position)), counts, new
  // lengths, freed pages, engine slot ids; nothing else written.
  void check_select(const select_call& c, const snapshot& before) {
    const snapshot after = take();
    const bool in_probe = c.store == &probe_store_;
    FUZZ_CHECK(after.k == before.k && after.v == before.v && after.table == before.table && after.state == before.state &&
                   after.other == before.other && (in_probe ? after.sel == before.sel : after.probe == before.probe),
               "select wrote the cache, the lengths, the table, the model state or an argument it only reads");
    const std::vector<std::uint8_t>& old = in_probe ? before.probe : before.sel;
    std::vector<std::int32_t> want(c.store->size());
    std::memcpy(want.data(), old.data(), old.size());
    const auto at = [&](const std::int32_t* p) { return static_cast<std::size_t>(p - c.store->data()); };
    const selection_type& s = c.sel;
    const sh::settings& cfg = policy_.config;
    const std::int32_t m = cfg.evict_count;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const auto bu = static_cast<std::size_t>(b);
      const std::int32_t len = length_in(c.v, b);
      const std::int32_t pinned = c.pinned.empty() ? 0 : c.pinned[bu];
      const std::int32_t evict = len >= c.budget ? len - c.budget + m : 0;
      const std::int32_t kept = len - evict;
      if (evict > 0) FUZZ_CHECK(kept == sh::length_after_compress(len, c.budget, m), "select: length_after_compress");
      FUZZ_CHECK(s.counts[bu] == evict, "select: counts[b] != length - budget + m (or 0 below the budget)");
      FUZZ_CHECK(s.out.new_lengths[bu] == kept, "select: new_lengths[b]");
      want[at(s.counts.data()) + bu] = evict;
      want[at(s.out.new_lengths.data()) + bu] = kept;
      if (!s.out.freed_pages.empty()) {
        std::int32_t freed = 0;
        if constexpr (Paged)
          if (evict > 0) freed = pages_in(c.v, b) - pages_for(kept, c.v.page_size);
        FUZZ_CHECK(s.out.freed_pages[bu] == freed, "select: freed_pages[b]");
        want[at(s.out.freed_pages.data()) + bu] = freed;
      }
      if (evict == 0) continue;
      const std::int32_t r = c.rc.used[bu];
      const state_type s0 = layer(0);
      std::vector<ranked> cand;
      for (std::int32_t t = std::max(pinned, 0); t < len; ++t) {
        const std::int32_t position = s0.positions[slot(r, 0, t)];
        if (!is_protected(position, s0.next_position[r], cfg)) cand.push_back({combined(r, t), position, t});
      }
      FUZZ_CHECK(static_cast<std::int32_t>(cand.size()) >= evict, "select evicted more than the unprotected, unpinned tokens");
      std::sort(cand.begin(), cand.end(), [](const ranked& x, const ranked& y) {
        const int k = compare_keys(x, y);
        return k != 0 ? k < 0 : x.slot < y.slot;
      });
      const auto ue = static_cast<std::size_t>(evict);
      const bool tie = ue < cand.size() && compare_keys(cand[ue - 1], cand[ue]) == 0;
      const std::int32_t* got = s.slots.data() + bu * static_cast<std::size_t>(s.stride);
      std::vector<std::int32_t> chosen(got, got + evict);
      if (!tie) {
        std::vector<std::int32_t> oracle;
        for (std::size_t e = 0; e < ue; ++e) oracle.push_back(cand[e].slot);
        std::sort(oracle.begin(), oracle.end());
        if (chosen != oracle) {
          // Appended piece by piece: GCC 12 warns (-Wrestrict, a false
          // positive) on `" " + std::to_string(x)` inlined here.
          std::string what = "select: evicted slots differ from the oracle's (sequence ";
          what += std::to_string(b);
          what += "): got";
          for (std::int32_t x : chosen) (what += ' ') += std::to_string(x);
          what += ", want";
          for (std::int32_t x : oracle) (what += ' ') += std::to_string(x);
          fail(__FILE__, __LINE__, what);
        }
      } else {
        // Equal keys at the cut (equal positions: only garbage makes them):
        // any of the tied slots may go; ascending, distinct candidates,
        // with the oracle's keys.
        std::vector<ranked> gone;
        for (std::size_t k = 0; k < chosen.size(); ++k) {
          FUZZ_CHECK(k == 0 || chosen[k] > chosen[k - 1], "select (tied keys): slots not ascending");
          const auto it = std::find_if(cand.begin(), cand.end(), [&](const ranked& x) { return x.slot == chosen[k]; });
          FUZZ_CHECK(it != cand.end(), "select (tied keys): an evicted slot is protected or pinned");
          gone.push_back(*it);
        }
        std::sort(gone.begin(), gone.end(), [](const ranked& x, const ranked& y) { return compare_keys(x, y) < 0; });
        for (std::size_t e = 0; e < ue; ++e)
          FUZZ_CHECK(compare_keys(gone[e], cand[e]) == 0, "select (tied keys): evicted keys differ from the oracle's");
      }
      FUZZ_TRACE("  select b %d row %d length %d pinned %d evicts", b, r, len, pinned);
      for (std::int32_t t : chosen) FUZZ_TRACE(" %d", t);
      FUZZ_TRACE("%s\n", tie ? " (tied keys)" : "");
      for (std::int32_t k = 0; k < evict; ++k) {
        const std::int32_t t = chosen[static_cast<std::size_t>(k)];
        want[at(got) + static_cast<std::size_t>(k)] = t;
        if (!s.cache_slots.empty()) {
          std::int32_t id = t;
          if constexpr (Paged)
            id = c.v.indices[static_cast<std::size_t>(c.v.indptr[bu] + t / c.v.page_size)] * c.v.page_size + t % c.v.page_size;
          want[at(s.cache_slots.data()) + bu * static_cast<std::size_t>(s.stride) + static_cast<std::size_t>(k)] = id;
        }
      }
    }
    FUZZ_CHECK(*c.store == want,
               "select wrote a wrong engine slot id, or outside counts, slots[0, count), cache_slots[0, count), "
               "new_lengths and freed_pages");
  }

  // Moves one output span of a select call over something the call reads or
  // another output; returns whether the spans now share a byte (refused).
  bool overlap_output(select_call& c) {
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    sh::host_span<std::int32_t>* outs[] = {&c.sel.counts, &c.sel.slots, &c.sel.cache_slots, &c.sel.out.new_lengths,
                                           &c.sel.out.freed_pages};
    sh::host_span<std::int32_t>& o = *outs[src_.in(0, 4)];
    if (o.empty()) return false;
    const sh::host_span<std::int32_t> original = o;
    const std::size_t n = o.size();
    const auto over = [&](void* base, std::size_t bytes, std::size_t at_elem) -> bool {
      // Only where the moved span stays inside the array it is moved over.
      if (base == nullptr || 4 * (at_elem + n) > bytes) return false;
      o = {static_cast<std::int32_t*>(base) + at_elem, n};
      return true;
    };
    const auto target = src_.in(0, 7);
    damage_note_ = "output over target " + std::to_string(target);
    bool moved = false;
    const void* tp = nullptr;  // what it must not overlap
    std::size_t tn = 0;
    switch (target) {
      case 0: {  // the lengths the view reads: a copy inside a larger array
        scratch_.assign(3 * nb + 2 + n, -9);
        const std::vector<std::int32_t>& src = Paged ? table_.last_page_len : table_.lengths;
        std::copy(src.begin(), src.end(), scratch_.begin() + static_cast<std::ptrdiff_t>(nb + 1));
        if constexpr (Paged)
          c.v.last_page_len = {scratch_.data() + nb + 1, nb};
        else
          c.v.lengths = {scratch_.data() + nb + 1, nb};
        tp = scratch_.data() + nb + 1, tn = 4 * nb;
        moved = over(scratch_.data(), 4 * scratch_.size(), static_cast<std::size_t>(src_.in(0, 2 * batch + 1)));
        break;
      }
      case 1:
        if constexpr (Paged) {
          tp = table_.indptr.data(), tn = 4 * table_.indptr.size();
          moved = over(table_.indptr.data(), tn, 0);
        }
        break;
      case 2:
        if constexpr (Paged) {
          tp = table_.indices.data(), tn = 4 * table_.indices.size();
          moved = over(table_.indices.data(), tn, 0);
        }
        break;
      case 3:
        if (c.rc.span.data() == rows_store_.data() && rows_store_.data() != nullptr) {
          tp = rows_store_.data(), tn = 4 * rows_store_.size();
          moved = over(rows_store_.data(), tn, 0);
        }
        break;
      case 4: {  // any layer of the model state
        const std::int32_t l = src_.i32(0, layers_ - 1);
        std::byte* base = state_buffer_.data + model_.layer_bytes * static_cast<std::size_t>(l);
        tp = state_buffer_.data, tn = state_buffer_.size;
        moved = over(base, state_buffer_.size - model_.layer_bytes * static_cast<std::size_t>(l),
                     static_cast<std::size_t>(src_.in(0, 64)));
        break;
      }
      case 5:
        tp = c.workspace.data(), tn = c.workspace.size();
        moved = over(c.workspace.data(), c.workspace.size(), 0);
        break;
      case 6:
        if (!c.pinned.empty()) {
          tp = pinned_store_.data(), tn = 4 * pinned_store_.size();
          moved = over(pinned_store_.data(), tn, 0);
        }
        break;
      default: {  // another output, inside the store
        sh::host_span<std::int32_t>& other = *outs[src_.in(0, 4)];
        if (&other == &o || other.empty()) break;
        tp = other.data(), tn = 4 * other.size();
        const auto from = static_cast<std::size_t>(other.data() - c.store->data()) +
                          static_cast<std::size_t>(src_.in(0, static_cast<std::int64_t>(other.size()) - 1));
        moved = over(c.store->data(), 4 * c.store->size(), from);
        break;
      }
    }
    if (!moved) return false;
    if (overlap(o.data(), 4 * o.size(), tp, tn)) return true;
    o = original;  // next to it, not over it: the plain output (so check_select knows where it lies)
    return false;
  }

  // One corrupted select call, checked, its writes put back.
  void select_probe(const select_parts& parts) {
    select_call c = build_select(parts, probe_store_);
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    const std::size_t e = c.sel.slots.size();
    const auto which = src_.in(0, 12);
    damage_note_ = "select probe " + std::to_string(which);
    switch (which) {
      case 0:  // stride below max_evictions
        c.sel.stride = sh::max_evictions(sshape_.capacity, c.budget, policy_.config.evict_count) - 1 - src_.i32(0, 1);
        c.structural = true;
        break;
      case 1:
        c.sel.counts = src_.flag() ? sh::host_span<std::int32_t>{c.sel.counts.data(), nb - 1}
                                   : sh::host_span<std::int32_t>{nullptr, nb};
        c.structural = true;
        break;
      case 2:
        if (e > 0) {
          c.sel.slots = src_.flag() ? sh::host_span<std::int32_t>{c.sel.slots.data(), e - 1}
                                    : sh::host_span<std::int32_t>{nullptr, e};
          c.structural = true;
        }
        break;
      case 3:  // (one entry short of one entry is empty: no cache_slots, which is fine)
        if (e > 0) {
          c.sel.cache_slots = src_.flag() && !c.sel.cache_slots.empty()
                                  ? sh::host_span<std::int32_t>{c.sel.cache_slots.data(), e - 1}
                                  : sh::host_span<std::int32_t>{nullptr, e};
          c.structural = !c.sel.cache_slots.empty();
        }
        break;
      case 4:
        switch (src_.in(0, 2)) {
          case 0: c.sel.out.new_lengths = {c.sel.out.new_lengths.data(), nb - 1}; break;
          case 1: c.sel.out.new_lengths = {c.sel.out.new_lengths.data(), nb + 1}; break;  // the guard after it
          default: c.sel.out.new_lengths = {nullptr, nb}; break;
        }
        c.structural = true;
        break;
      case 5:
        if (src_.flag()) {
          c.sel.out.freed_pages = {nullptr, nb};
          c.structural = true;
        } else {
          // One entry short (contiguous or page size 1, batch 1: empty, which is fine).
          c.sel.out.freed_pages = {c.store->data() + c.store->size() - 1 - nb, nb - 1};
          bool required = false;
          if constexpr (Paged) required = c.v.page_size > 1;
          c.structural = required || nb != 1;
        }
        break;
      case 6: c.structural = overlap_output(c); break;
      case 7:
        switch (src_.in(0, 3)) {
          case 0:
            if (c.workspace.size() > 0) {
              const std::size_t need = sh::host::select_workspace_bytes(c.v, sshape_);
              if (need > 0) c.workspace = {c.workspace.data(), need - 1}, c.structural = true;
            }
            break;
          case 1: c.workspace = {nullptr, c.workspace.size()}, c.structural = true; break;
          case 2: c.workspace = {c.workspace.data() + 4, c.workspace.size()}, c.structural = true; break;
          default: {  // a workspace over something the call reads
            const std::size_t need = sh::host::select_workspace_bytes(c.v, sshape_);
            bool over = false;
            // Over pinned_prefix, which select reads again per sequence
            // after writing the workspace for the ones before (refused
            // since regress-tl-workspace-over-pinned).
            if (!c.pinned.empty() && src_.flag()) {
              pinned_store_.resize(pinned_store_.size() + c.workspace.size() / 4 + 2, 0);
              c.pinned = {pinned_store_.data(), nb};
              c.workspace = {reinterpret_cast<std::byte*>(pinned_store_.data()), c.workspace.size()};
              c.structural = need > 0;
              break;
            }
            if (workspace_over(c.v, c.rc, parts.view_layer, true, c.workspace, need, over)) {
              c.model = model_.for_batch(c.rc.span);
              c.structural = over;
            }
            break;
          }
        }
        break;
      case 8: {  // pinned_prefix
        if (pinned_store_.empty()) pinned_store_.assign(nb, 0);
        c.pinned = {pinned_store_.data(), pinned_store_.size()};
        const auto at = static_cast<std::size_t>(src_.in(0, batch - 1));
        switch (src_.in(0, 3)) {
          case 0: c.pinned = {nullptr, nb}, c.structural = true; break;
          case 1:
            pinned_store_.push_back(0);
            c.pinned = {pinned_store_.data(), src_.flag() ? nb + 1 : nb - 1};  // nb - 1 = 0: no pinned prefix
            c.structural = c.pinned.size() != 0;
            break;
          case 2: pinned_store_[at] = src_.flag() ? -1 : table_.length(static_cast<std::int32_t>(at)) + 1; break;
          default: pinned_store_[at] = table_.length(static_cast<std::int32_t>(at)); break;  // all pinned
        }
        break;
      }
      case 9: c.budget = garbage_int(src_); break;
      case 10:
        switch (src_.in(0, 2)) {
          case 0: c.model.layers = 0; break;
          case 1: c.model.layer_bytes += src_.flag() ? 256 : -256; break;
          default: c.model.first.step = nullptr; break;
        }
        c.structural = true;
        break;
      case 11: {
        bool shared_page = false;
        c.view_damage = corrupt(c.v, false, shared_page);
        if (shared_page) c.view_damage = expect::ok;  // select only reads the table: a page listed twice is fine
        break;
      }
      default:
        c.rc = pick_rows(true);
        c.model = model_.for_batch(c.rc.span);
        break;
    }
    const expect expected = select_expected(c);
    FUZZ_TRACE("  select probe %d: budget %d stride %d expected %d\n", int(which), c.budget, c.sel.stride, int(expected));
    const snapshot before = take();
    if (!guarded("host::select", expected, [&] { call_select(c); })) return;
    check_select(c, before);
    restore(before);
  }

  // ---- compact and forget ------------------------------------------------------
  struct apply_call {
    std::int32_t l = 0;
    view_type v{};
    call_rows rc;
    selection_type sel{};
    sh::host_span<std::byte> workspace;
    bool compact = true;
    expect view_damage = expect::ok;
    bool shared_page = false;
    bool structural = false;
  };

  apply_call build_apply(std::int32_t l, const selection_type& sel, bool compact) {
    apply_call c;
    c.l = l;
    c.v = make_view(l);
    c.rc = pick_rows(false);
    c.sel = sel;
    c.compact = compact;
    if (compact) {
      const std::size_t need = sh::host::compact_workspace_bytes(c.v);
      FUZZ_CHECK(need == (Paged ? static_cast<std::size_t>(table_.num_pages) : 0), "compact_workspace_bytes");
      ws_store_.assign(need / 8 + 2, 0x5A5A5A5A5A5A5A5Aull);
      if (need > 0 || src_.flag()) c.workspace = {reinterpret_cast<std::byte*>(ws_store_.data()), need};
    }
    return c;
  }
  static const char* apply_name(const apply_call& c) { return c.compact ? "host::compact" : "host::forget"; }
  void call_apply(const apply_call& c) {
    const state_type st = layer(c.l).for_batch(c.rc.span);
    if (c.compact)
      sh::host::compact(policy_, c.v, st, c.sel, c.workspace);
    else
      sh::host::forget(policy_, c.v, st, c.sel);
  }

  // What compact / forget must do with this selection, from the data.
  [[nodiscard]] expect apply_expected(const apply_call& c) const {
    if (!clean_settings_ || c.structural || c.rc.structural || c.view_damage == expect::refuse) return expect::refuse;
    if (c.view_damage == expect::unknown && !c.shared_page) return expect::unknown;
    if (layer_refuses(c.l, c.rc)) return expect::refuse;
    const selection_type& s = c.sel;
    const auto nb = static_cast<std::size_t>(shape_.batch);
    if (s.stride < 0) return expect::refuse;
    if (s.counts.size() != nb || s.counts.data() == nullptr) return expect::refuse;
    const std::size_t entries = nb * static_cast<std::size_t>(s.stride);
    if (s.slots.size() < entries || (entries != 0 && s.slots.data() == nullptr)) return expect::refuse;
    const state_type st = layer(c.l);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t count = s.counts[static_cast<std::size_t>(b)];
      const std::int32_t len = table_.length(b);
      if (count < 0 || count > len || count > s.stride) return expect::refuse;
      if (count == 0) continue;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      if (st.tracked[r] != len) return expect::refuse;
      const std::int32_t* slots = s.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride);
      for (std::int32_t k = 0; k < count; ++k) {
        if (slots[k] < 0 || slots[k] >= len || (k > 0 && slots[k] <= slots[k - 1])) return expect::refuse;
        for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
          if (is_protected_at(c.l, r, h, slots[k])) return expect::refuse;
      }
    }
    if (c.compact) {
      const std::size_t need = Paged ? static_cast<std::size_t>(table_.num_pages) : 0;
      if (c.workspace.size() < need || (need != 0 && c.workspace.data() == nullptr)) return expect::refuse;
      if constexpr (Paged) {
        // A page compact writes (a slot in [first evicted, new length)) listed twice.
        const std::int32_t listed = c.v.indptr[nb];
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          const std::int32_t count = s.counts[static_cast<std::size_t>(b)];
          if (count == 0) continue;
          const std::int32_t first = s.slots[static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride)];
          const std::int32_t kept = table_.length(b) - count;
          if (first >= kept) continue;
          for (std::int32_t p = first / table_.page_size; p <= (kept - 1) / table_.page_size; ++p) {
            const std::int32_t page = c.v.indices[static_cast<std::size_t>(c.v.indptr[static_cast<std::size_t>(b)] + p)];
            if (std::count(c.v.indices.begin(), c.v.indices.begin() + listed, page) > 1) return expect::refuse;
          }
        }
      }
    }
    return expect::ok;
  }

  [[nodiscard]] std::vector<char> gone_of(const selection_type& s, std::int32_t b, std::int32_t len) const {
    std::vector<char> gone(static_cast<std::size_t>(len), 0);
    const std::int32_t* slots = s.slots.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(s.stride);
    for (std::int32_t k = 0; k < s.counts[static_cast<std::size_t>(b)]; ++k) gone[static_cast<std::size_t>(slots[k])] = 1;
    return gone;
  }

  // After an accepted compact / forget of layer l: that layer's K, V
  // (compact) and state hold exactly the selection applied by the rule,
  // tracked = the new length; nothing else written.
  void check_apply(const apply_call& c, const snapshot& before) {
    const snapshot after = take();
    const char* fn = apply_name(c);
    FUZZ_CHECK(after.table == before.table &&
                   after.sel == before.sel && after.probe == before.probe && after.other == before.other,
               std::string(fn) + " wrote the lengths, the page table, the selection or an argument it only reads");
    const auto ul = static_cast<std::size_t>(c.l);
    for (std::size_t l = 0; l < kv_.size(); ++l)
      if (l != ul || !c.compact)
        FUZZ_CHECK(after.k[l] == before.k[l] && after.v[l] == before.v[l],
                   std::string(fn) + " wrote K or V of another layer (or forget wrote K or V)");
    std::vector<std::uint8_t> ek = before.k[ul], ev = before.v[ul], est = before.state;
    const state_type st = layer(c.l);
    const std::size_t row = 4 * static_cast<std::size_t>(shape_.head_dim);
    const bool fill = c.compact && policy_.config.compaction_mode == sh::compaction::fill_holes;
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      const std::int32_t count = c.sel.counts[static_cast<std::size_t>(b)];
      if (count == 0) continue;
      const std::int32_t len = length_in(c.v, b), kept = len - count;
      const std::int32_t r = c.rc.used[static_cast<std::size_t>(b)];
      const std::vector<std::int32_t> source = compaction_sources(gone_of(c.sel, b, len), len, kept, fill);
      for (std::int32_t t = 0; t < kept; ++t) {
        const std::int32_t from = source[static_cast<std::size_t>(t)];
        for (std::int32_t h = 0; h < shape_.kv_heads; ++h) {
          if (c.compact)
            for (const bool key : {true, false}) {
              std::vector<std::uint8_t>& dst = key ? ek : ev;
              const std::vector<std::uint8_t>& src = key ? before.k[ul] : before.v[ul];
              std::memcpy(dst.data() + 4 * static_cast<std::size_t>(row_at(c.v, key, b, h, t)),
                          src.data() + 4 * static_cast<std::size_t>(row_at(c.v, key, b, h, from)), row);
            }
          const std::size_t to_i = slot(r, h, t), from_i = slot(r, h, from);
          for (const auto* base : {static_cast<const void*>(st.positions), static_cast<const void*>(st.scores),
                                   static_cast<const void*>(st.observed)}) {
            const std::size_t o = byte_offset(base);
            std::memcpy(est.data() + o + 4 * to_i, before.state.data() + o + 4 * from_i, 4);
          }
          for (std::int32_t w = 0; w < sshape_.ring_words; ++w) {
            const std::size_t to_o = byte_offset(&st.ring_of(r, h, t)[w]);
            const std::size_t from_o = byte_offset(&st.ring_of(r, h, from)[w]);
            std::memcpy(est.data() + to_o, before.state.data() + from_o, 4);
          }
        }
      }
      std::memcpy(est.data() + byte_offset(&st.tracked[r]), &kept, 4);
    }
    FUZZ_CHECK(after.k[ul] == ek, std::string(fn) + ": K differs from the selection applied by the compaction rule");
    FUZZ_CHECK(after.v[ul] == ev, std::string(fn) + ": V differs from the selection applied by the compaction rule");
    FUZZ_CHECK(after.state == est, std::string(fn) + ": the model state differs from the selection applied to layer " +
                                       std::to_string(c.l) + " (or another layer was written)");
  }

  // One corrupted compact / forget of layer l, checked, its writes put back.
  void apply_probe(std::int32_t l, const selection_type& clean, bool compact) {
    probe_store_ = sel_store_;
    apply_call c = build_apply(l, rebase(clean, sel_store_, probe_store_), compact);
    selection_type& s = c.sel;
    const std::int32_t batch = shape_.batch;
    const auto nb = static_cast<std::size_t>(batch);
    const std::size_t entries = s.slots.size();
    const std::int32_t b = src_.i32(0, batch - 1);
    const auto bu = static_cast<std::size_t>(b);
    std::int32_t& count = s.counts[bu];
    std::int32_t* slots = s.slots.data() + bu * static_cast<std::size_t>(std::max(s.stride, 0));
    const std::int32_t len = table_.length(b);
    std::int32_t* damaged_tracked = nullptr;
    std::int32_t tracked_was = 0;
    const auto which = src_.in(0, 14);
    damage_note_ = std::string(apply_name(c)) + " probe " + std::to_string(which);
    switch (which) {
      case 0: count = len + 1; break;
      case 1: count = s.stride + 1; break;
      case 2: count = -1; break;
      case 3:
        if (count > 0) slots[src_.in(0, count - 1)] = src_.flag() ? len : -1;
        break;
      case 4:  // not ascending: a slot twice, or two swapped
        if (count >= 2) {
          const auto k = src_.in(0, count - 2);
          if (src_.flag())
            slots[k + 1] = slots[k];
          else
            std::swap(slots[k], slots[k + 1]);
        }
        break;
      case 5: {  // a protected slot of this layer
        const std::int32_t r = rows_[bu];
        if (r < 0 || s.stride < 1) break;
        for (std::int32_t t = 0; t < len; ++t)
          if (is_protected_at(l, r, src_.i32(0, sshape_.kv_heads - 1), t)) {
            count = 1;
            slots[0] = t;
            break;
          }
        break;
      }
      case 6:
        s.counts = src_.flag() ? sh::host_span<std::int32_t>{s.counts.data(), nb - 1} : sh::host_span<std::int32_t>{nullptr, nb};
        c.structural = true;
        break;
      case 7:
        if (entries > 0) {
          s.slots = src_.flag() ? sh::host_span<std::int32_t>{s.slots.data(), entries - 1}
                                : sh::host_span<std::int32_t>{nullptr, entries};
          c.structural = true;
        }
        break;
      case 8: s.stride = -1, c.structural = true; break;
      case 9: {  // counts or slots over what the call writes
        const bool on_counts = src_.flag() || entries == 0;
        sh::host_span<std::int32_t>& span = on_counts ? s.counts : s.slots;
        const std::size_t bytes = 4 * span.size();
        const state_type st = layer(l);
        const std::size_t state_size = model_.layer_bytes;
        void* target = nullptr;
        std::size_t target_bytes = 0;
        switch (c.compact ? src_.in(0, 3) : 2) {
          case 0: target = kv_[static_cast<std::size_t>(l)].k.data(), target_bytes = 4 * kv_[static_cast<std::size_t>(l)].k.size(); break;
          case 1: target = kv_[static_cast<std::size_t>(l)].v.data(), target_bytes = 4 * kv_[static_cast<std::size_t>(l)].v.size(); break;
          case 2: target = st.step, target_bytes = state_size; break;
          default: target = c.workspace.data(), target_bytes = c.workspace.size(); break;
        }
        if (target != nullptr && bytes <= target_bytes) {
          span = {static_cast<std::int32_t*>(target) + src_.in(0, static_cast<std::int64_t>((target_bytes - bytes) / 4)), span.size()};
          c.structural = true;
        }
        break;
      }
      case 10:
        if (c.compact && Paged && src_.flag()) {
          c.workspace = src_.flag() ? sh::host_span<std::byte>{c.workspace.data(), c.workspace.size() - 1}
                                    : sh::host_span<std::byte>{nullptr, c.workspace.size()};
          c.structural = true;
        }
        else if (c.compact && Paged) {  // over something it reads (page marks written over the table, K, ...)
          bool over = false;
          if (workspace_over(c.v, c.rc, l, false, c.workspace, c.workspace.size(), over)) c.structural = over;
        }
        break;
      case 11: {  // the state no longer tracks a sequence that evicts (put back after)
        const std::int32_t r = rows_[bu];
        if (r < 0 || count == 0) break;
        damaged_tracked = &layer(l).tracked[r];
        tracked_was = *damaged_tracked;
        *damaged_tracked = len - src_.i32(1, 2);
        break;
      }
      case 12: c.view_damage = corrupt(c.v, c.compact, c.shared_page); break;
      case 13: c.rc = pick_rows(true); break;
      default:  // a smaller valid selection
        if (count > 0) count = src_.flag() ? 0 : count - 1;
        break;
    }
    const expect expected = apply_expected(c);
    FUZZ_TRACE("  %s probe %d on layer %d: expected %d\n", apply_name(c), int(which), l, int(expected));
    const snapshot before = take();
    if (guarded(apply_name(c), expected, [&] { call_apply(c); })) {
      check_apply(c, before);
      restore(before);
    }
    if (damaged_tracked != nullptr) *damaged_tracked = tracked_was;
  }

  // ---- evict: select, then compact or forget every layer, then the engine ------
  void evict() {
    select_parts parts;
    const sh::settings& cfg = policy_.config;
    parts.view_layer = src_.i32(0, layers_ - 1);
    std::int32_t max_len = 1;
    for (std::int32_t b = 0; b < shape_.batch; ++b) max_len = std::max(max_len, table_.length(b));
    // Mostly a valid budget (above the protected tokens by m at least),
    // near the lengths so that it triggers; rarely any small one.
    const std::int64_t floor = std::clamp<std::int64_t>(std::int64_t{cfg.recent} + cfg.sinks + cfg.evict_count, 1, INT32_MAX);
    if (src_.rarely())
      parts.budget = src_.i32(1, max_len + 1);
    else
      parts.budget = src_.i32(floor, std::max<std::int64_t>(floor, max_len + 1));
    parts.extra_stride = src_.i32(0, 2);
    parts.ws_slack = src_.i32(0, 8);
    parts.cache_slots = src_.flag();
    parts.freed = Paged || src_.flag();
    switch (src_.in(0, 3)) {
      case 0: break;
      case 1:
        for (std::int32_t b = 0; b < shape_.batch; ++b) parts.pins.push_back(src_.i32(0, table_.length(b)));
        break;
      case 2:
        for (std::int32_t b = 0; b < shape_.batch; ++b) parts.pins.push_back(std::min(table_.length(b), src_.i32(0, 3)));
        break;
      default: parts.pins.assign(static_cast<std::size_t>(shape_.batch), 0); break;
    }
    const bool compact = Paged && table_.page_size == 1 ? src_.flag() : src_.in(0, 2) != 0;
    if (src_.rarely()) select_probe(parts);

    select_call c = build_select(parts, sel_store_);
    damage_note_.clear();
    const expect expected = select_expected(c);
    FUZZ_TRACE("  select: budget %d stride %d pinned %d cache_slots %d expected %d, then %s\n", c.budget, c.sel.stride,
               int(!c.pinned.empty()), int(!c.sel.cache_slots.empty()), int(expected), compact ? "compact" : "forget");
    const snapshot before = take();
    if (!guarded("host::select", expected, [&] { call_select(c); })) return;
    check_select(c, before);
    apply_all(c.sel, compact);
  }

  // Applies an accepted selection to every layer (rarely the engine skips
  // one), then the engine's side: new lengths, or its own slot lists.
  void apply_all(const selection_type& sel, bool compact) {
    const std::int32_t skip = src_.rarely() ? src_.i32(0, layers_ - 1) : -1;
    const auto nb = static_cast<std::size_t>(shape_.batch);
    std::vector<std::vector<char>> gone(nb);
    std::vector<std::int32_t> new_lengths(nb);
    for (std::int32_t b = 0; b < shape_.batch; ++b) {
      gone[static_cast<std::size_t>(b)] = gone_of(sel, b, table_.length(b));
      new_lengths[static_cast<std::size_t>(b)] = sel.out.new_lengths[static_cast<std::size_t>(b)];
    }
    for (std::int32_t l = 0; l < layers_; ++l) {
      if (src_.rarely()) apply_probe(l, sel, compact);
      if (l == skip) {
        FUZZ_TRACE("  layer %d not %s\n", l, compact ? "compacted" : "forgotten");
        continue;
      }
      damage_note_.clear();
      const apply_call c = build_apply(l, sel, compact);
      const expect expected = apply_expected(c);
      FUZZ_CHECK(expected == expect::ok, "layers: the clean compact / forget after select is not valid");
      const snapshot before = take();
      guarded(apply_name(c), expected, [&] { call_apply(c); });
      check_apply(c, before);
    }
    // Every layer and head holds one token per slot, the same everywhere.
    if (skip < 0)
      for (std::int32_t b = 0; b < shape_.batch; ++b) {
        const std::int32_t r = rows_[static_cast<std::size_t>(b)];
        if (r < 0 || sel.counts[static_cast<std::size_t>(b)] == 0) continue;
        for (std::int32_t l = 0; l < layers_; ++l)
          for (std::int32_t h = 0; h < sshape_.kv_heads; ++h)
            for (std::int32_t t = 0; t < new_lengths[static_cast<std::size_t>(b)]; ++t)
              FUZZ_CHECK(layer(l).positions[slot(r, h, t)] == layer(0).positions[slot(r, 0, t)],
                         "after select + compact / forget, layers or heads hold different tokens at a slot");
      }
    // The engine's side.
    const bool fill = compact && policy_.config.compaction_mode == sh::compaction::fill_holes;
    if (compact) {
      for (std::int32_t l = 0; l < layers_; ++l) {
        if (l == skip) continue;  // its rows did not move: the first slots keep their tokens
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          auto& ids = ids_[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)];
          const auto len = static_cast<std::int32_t>(ids.size());
          const std::vector<std::int32_t> source = compaction_sources(gone[static_cast<std::size_t>(b)], len, new_lengths[static_cast<std::size_t>(b)], fill);
          std::vector<std::int64_t> next;
          for (std::int32_t from : source) next.push_back(ids[static_cast<std::size_t>(from)]);
          ids = next;
        }
      }
      apply_lengths(new_lengths);
    } else {
      if (Paged && table_.page_size == 1) {
        // A slot-list engine: free the selected cache slots (page ids at
        // page size 1) and drop them from each list, keeping the order.
        std::vector<std::vector<std::int32_t>> lists(nb);
        for (std::int32_t b = 0; b < shape_.batch; ++b) {
          const auto bu = static_cast<std::size_t>(b);
          const std::int32_t* slots = sel.slots.data() + bu * static_cast<std::size_t>(sel.stride);
          for (std::int32_t t = 0; t < table_.length(b); ++t) {
            const std::int32_t page = table_.indices[static_cast<std::size_t>(table_.indptr[bu] + t)];
            if (!gone[bu][static_cast<std::size_t>(t)]) {
              lists[bu].push_back(page);
              continue;
            }
            table_.free_pages.push_back(page);
            if (!sel.cache_slots.empty()) {
              const auto k = static_cast<std::size_t>(std::find(slots, slots + sel.counts[bu], t) - slots);
              FUZZ_CHECK(sel.cache_slots[bu * static_cast<std::size_t>(sel.stride) + k] == page,
                         "select: cache_slots is not the engine's slot of the evicted token");
            }
          }
          FUZZ_CHECK(static_cast<std::int32_t>(lists[bu].size()) == new_lengths[bu], "forget: new length");
        }
        table_.indices.clear();
        for (std::size_t b = 0; b < nb; ++b) {
          table_.indptr[b] = static_cast<std::int32_t>(table_.indices.size());
          table_.indices.insert(table_.indices.end(), lists[b].begin(), lists[b].end());
          table_.last_page_len[b] = lists[b].empty() ? 0 : 1;
        }
        table_.indptr.back() = static_cast<std::int32_t>(table_.indices.size());
      } else {
        // The engine closes the holes itself, keeping the order, in every
        // layer (forget does the same to the state).
        for (std::int32_t l = 0; l < layers_; ++l) {
          const view_type v = make_view(l);
          layer_kv& kv = kv_[static_cast<std::size_t>(l)];
          for (std::int32_t b = 0; b < shape_.batch; ++b) {
            const std::vector<std::int32_t> source =
                compaction_sources(gone[static_cast<std::size_t>(b)], table_.length(b), new_lengths[static_cast<std::size_t>(b)], false);
            for (std::size_t t = 0; t < source.size(); ++t)
              for (std::int32_t h = 0; h < shape_.kv_heads; ++h)
                for (const bool key : {true, false}) {
                  std::vector<float>& buf = key ? kv.k : kv.v;
                  std::memmove(buf.data() + row_at(v, key, b, h, static_cast<std::int32_t>(t)),
                               buf.data() + row_at(v, key, b, h, source[t]), 4 * static_cast<std::size_t>(shape_.head_dim));
                }
          }
        }
      }
      for (auto& layer_ids : ids_)
        for (std::size_t b = 0; b < nb; ++b) {
          std::vector<std::int64_t> next;
          for (std::size_t t = 0; t < layer_ids[b].size(); ++t)
            if (!gone[b][t]) next.push_back(layer_ids[b][t]);
          layer_ids[b] = next;
        }
      if (!(Paged && table_.page_size == 1)) apply_lengths(new_lengths);
    }
    check_tokens("after select and compact / forget");
  }
};

// Token-level mode (its mode byte already read): the next byte picks the
// policy and granularity, the one after it paged or not.
void run_token_level_mode(byte_source& src) {
  using important_decay =
      sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>;
  constexpr case_runner policies[] = {
      // shared_heads: compress evicts one set of slots per sequence for all heads.
      run_case<fuzz_case, sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::mean_score>>>,
      run_case<fuzz_case, sh::with_granularity<sh::h2o_policy, sh::shared_heads<sh::max_score>>>,
      // shared_layers: select once for the model, compact or forget every layer.
      run_case<layers_case, sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<sh::mean_score, sh::mean_score>>>,
      run_case<layers_case, sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<sh::mean_score, sh::mean_score>>>,
      run_case<layers_case, sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score, sh::mean_score>>>,
      run_case<layers_case, sh::with_granularity<sh::h2o_policy, sh::shared_layers<sh::max_score, sh::mean_score>>>,
      run_case<layers_case, sh::with_granularity<important_decay, sh::shared_layers<sh::mean_score, sh::max_score>>>,
      run_case<layers_case, sh::with_granularity<sh::key_norm_policy, sh::shared_layers<sh::max_score, sh::max_score>>>,
  };
  const mode_choice m = decode_choice(src);
  FUZZ_TRACE("token-level mode %d paged %d\n", m.policy, int(m.paged));
  policies[m.policy](src, m.paged);
}

}  // namespace
