// The quantized mode of the host fuzz harness (fuzz_host.cpp): inputs whose
// first byte is in [161, 177] (a range no input of the committed corpus
// started with when it was added, so every older input keeps its decoding).
//
// A case holds one quantized cache (quantized_kv_view.hpp: int8 or int4
// codes, group parameters; contiguous or paged; NHD, HND, padded or any
// small strides for the code rows and, separately, for the parameter rows)
// and its float twin: a float cache holding, at the same (sequence, head,
// slot), the values the quantized rows dequantize to, with its own state.
// The engine appends tokens (quantize_row of generated values into the
// quantized cache, dequantize_row into the twin), the library observes from
// queries (dense or ragged, with or without a lse, serial or as a plan run
// in slices), admits and compresses (serial or as a plan); the engine
// applies the new lengths (shrink_page_table when paged), retires a
// sequence, writes non-finite or extreme scales into a held row's K or V
// parameters and later repairs them. Decoding (see make_regress.py):
//
//   [first byte] [policy: byte % 8] [paged: byte & 1]
//   setup: generator word (4), settings (decode_settings_into), int4 flag,
//     group size (int8: 1 << byte % 5; int4: 2 << byte % 5), groups per row
//     (1 + byte % 4: head_dim = group * groups), batch (1-3), KV heads (1-3),
//     capacity (1-24) or page size (1-5), max pages (1-6), pool pages (1-12);
//     pick_strides for the K codes, V codes, K parameters, V parameters;
//     state capacity (flag, then 1-30), spare state rows (0-2), mapping
//     (byte % 3: row b, row b passed, shuffled rows passed); the tokens of
//     each sequence (0-26).
//   then up to 24 operations, byte % 10:
//     0-1 append 0-3 tokens per sequence; 2-3 observe_queries; 4 admit;
//     5-6 compress; 7 poke a held row's parameter; 8 repair the pokes;
//     9 retire a sequence.
//   Each library call starts with a damage byte: below 192 none, else one
//   damage to the view of that call (byte % 11 and its own bytes, below).
//
// After every call: either scissorhands::invalid_argument naming the entry
// point (and, when exactly one known cause makes the call invalid, the
// argument of that cause), with every byte the caller owns (codes,
// parameters, lengths or page table, state, outputs, queries, lse, state
// rows) as it was; or success, with the twin run through the same call
// agreeing: the same outputs, the state's bytes equal, every kept code row
// and parameter row bit-identical to what was appended for the token its
// state position names (the twin's row: those values dequantized), no
// other byte of the codes and parameters written, and the token order the
// compaction mode promises. When the harness built the call from clean
// parts a refusal is a bug; when a part is invalid whatever else holds, an
// acceptance is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "models.hpp"

namespace {

// Whether a strided layout gives every (outer, head, token) index rows of
// its own, found by marking the elements (not the library's nesting rule,
// which also refuses some unique layouts): 1 unique, 0 two rows share an
// element, -1 a negative stride (refused whatever the extents).
int rows_unique(const strides3& s, std::int64_t e0, std::int64_t e1, std::int64_t e2, std::int64_t row) {
  if (s.outer < 0 || s.head < 0 || s.token < 0) return -1;
  const std::int64_t n = extent_of(s, e0, e1, e2, row);
  if (n > (std::int64_t{1} << 24)) return 1;  // only the named layouts reach this far, and they are unique
  std::vector<char> used(static_cast<std::size_t>(n), 0);
  for (std::int64_t i0 = 0; i0 < e0; ++i0)
    for (std::int64_t i1 = 0; i1 < e1; ++i1)
      for (std::int64_t i2 = 0; i2 < e2; ++i2) {
        const std::int64_t at = i0 * s.outer + i1 * s.head + i2 * s.token;
        for (std::int64_t x = 0; x < row; ++x) {
          char& u = used[static_cast<std::size_t>(at + x)];
          if (u != 0) return 0;
          u = 1;
        }
      }
  return 1;
}

// Whether two layouts put every row at the same place (strides of levels
// of extent 1 never count).
bool same_rows(const strides3& a, const strides3& b, std::int64_t e0, std::int64_t e1, std::int64_t e2) {
  return (e0 <= 1 || a.outer == b.outer) && (e1 <= 1 || a.head == b.head) && (e2 <= 1 || a.token == b.token);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class Policy, bool Paged>
class quant_case {
  using codes_type = std::conditional_t<Paged, sh::paged_kv_view<std::uint8_t, memory_space::host>,
                                        sh::kv_view<std::uint8_t, memory_space::host>>;
  using qview = sh::quantized_kv_view<codes_type>;
  using fview = std::conditional_t<Paged, sh::host_paged_kv_view<float>, sh::host_kv_view<float>>;
  using layout_type = typename qview::layout_type;
  using state_type = sh::eviction_state<memory_space::host>;
  using Obs = typename Policy::observation;
  static constexpr bool attention = Obs::needs_attention;
  static constexpr std::int64_t max_elements = std::int64_t{1} << 20;
  static constexpr int K = 0, V = 1;
  // The four strided buffers: 0 K codes, 1 V codes, 2 K parameters, 3 V parameters.
  static constexpr const char* layout_names[4] = {"cache.k_layout", "cache.v_layout", "cache.k_params_layout",
                                                  "cache.v_params_layout"};
  static constexpr const char* buffer_names[4] = {Paged ? "cache.k_pages" : "cache.k",
                                                  Paged ? "cache.v_pages" : "cache.v", "cache.k_params",
                                                  "cache.v_params"};

 public:
  explicit quant_case(byte_source& src) : src_(src) {}

  void run() {
    if (!setup()) return;
    for (int op = 0; op < 24 && !src_.exhausted(); ++op)
      if (!step()) return;
  }

 private:
  byte_source& src_;
  generator gen_{0};
  Policy policy_{};
  bool clean_settings_ = true;
  sh::kv_quantization q_{};
  std::int32_t batch_ = 1, heads_ = 1, head_dim_ = 1, code_bytes_ = 1, params_row_ = 1;
  strides3 lay_[4];
  // What the library must make of each layout: nested (named or padded),
  // unique but maybe not nested (it may refuse), rows overlapping, a
  // negative stride (both refused).
  enum class layout_kind { nested, unique, overlapping, negative };
  layout_kind layout_[4] = {layout_kind::nested, layout_kind::nested, layout_kind::nested, layout_kind::nested};
  int layout_bad_ = -1;  // the first layout the library must refuse (in its checking order), or -1
  std::vector<std::uint8_t> codes_[2];
  std::vector<float> params_[2];
  std::vector<float> twin_[2];  // the float twin's K and V (NHD)
  seq_table<Paged> table_;
  sh::state_shape shape_{};
  aligned_buffer sbuf_[2];  // the quantized cache's state, the twin's
  state_type st_[2];
  std::vector<std::int32_t> rows_;  // the state row of each batch position
  bool pass_rows_ = false;

  // The oracle's record of every token appended: its code rows and
  // parameter rows (K and V), by (sequence, head, token id). A token's id
  // is its position: the sequence's tokens are admitted in append order.
  struct token_rec {
    std::vector<std::uint8_t> codes[2];
    std::vector<float> params[2];
  };
  std::map<std::tuple<std::int32_t, std::int32_t, std::int32_t>, token_rec> tokens_;
  std::vector<std::vector<std::vector<std::int32_t>>> slots_;  // [b][h][slot]: the token id held there
  std::vector<std::int32_t> admitted_;  // per sequence: slots with state (what the state row tracks)
  std::vector<std::int32_t> next_id_;
  // Parameters the engine overwrote (poke), to put back (repair).
  struct poke_rec {
    int kind;
    std::int32_t b, h, id;
    std::vector<float> old;
  };
  std::vector<poke_rec> pokes_;

  // A call's arguments the library only reads, and its outputs (in every snapshot).
  std::vector<float> qdata_, lse_;
  std::vector<std::int32_t> qo_, row_store_, out_store_;

  // ---- the model's cache ----------------------------------------------------
  [[nodiscard]] std::int32_t extent0() const { return Paged ? table_.num_pages : batch_; }
  [[nodiscard]] std::int32_t extent2() const { return Paged ? table_.page_size : table_.capacity; }
  [[nodiscard]] std::int32_t row_of(int which) const { return which < 2 ? code_bytes_ : params_row_; }
  // Where row (b, h, t) of strided buffer `which` starts, from the model's table.
  [[nodiscard]] std::int64_t offset(int which, std::int32_t b, std::int32_t h, std::int32_t t) const {
    const strides3& s = lay_[which];
    const auto [outer, token] = table_.place(b, t);
    return std::int64_t{outer} * s.outer + std::int64_t{h} * s.head + std::int64_t{token} * s.token;
  }
  [[nodiscard]] std::int64_t twin_offset(std::int32_t b, std::int32_t h, std::int32_t t) const {
    const auto [outer, token] = table_.place(b, t);
    return ((std::int64_t{outer} * extent2() + token) * heads_ + h) * head_dim_;
  }
  std::uint8_t* code_row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return codes_[kind].data() + offset(kind, b, h, t);
  }
  float* param_row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return params_[kind].data() + offset(2 + kind, b, h, t);
  }
  float* twin_row(int kind, std::int32_t b, std::int32_t h, std::int32_t t) {
    return twin_[kind].data() + twin_offset(b, h, t);
  }

  qview make_qview() {
    qview v{};
    const auto codes = [&](int i) { return sh::host_span<std::uint8_t>(codes_[i].data(), codes_[i].size()); };
    const auto layout = [&](int i) { return layout_type{lay_[i].outer, lay_[i].head, lay_[i].token}; };
    if constexpr (Paged) {
      v.k_pages = codes(K);
      v.v_pages = codes(V);
    } else {
      v.k = codes(K);
      v.v = codes(V);
    }
    table_.describe(v);
    v.k_layout = layout(0);
    v.v_layout = layout(1);
    v.batch = batch_;
    v.kv_heads = heads_;
    v.head_dim = head_dim_;
    v.k_params = sh::host_span<float>(params_[K].data(), params_[K].size());
    v.v_params = sh::host_span<float>(params_[V].data(), params_[V].size());
    v.k_params_layout = layout(2);
    v.v_params_layout = layout(3);
    v.quantization = q_;
    return v;
  }

  fview make_fview() {
    fview v{};
    if constexpr (Paged) {
      v = sh::make_paged_kv_view<float, memory_space::host>(
          {twin_[K].data(), twin_[K].size()}, {twin_[V].data(), twin_[V].size()}, {table_.indptr.data(), table_.indptr.size()},
          {table_.indices.data(), table_.indices.size()}, {table_.last_page_len.data(), table_.last_page_len.size()}, batch_, heads_,
          head_dim_, table_.page_size, table_.num_pages, table_.max_pages);
    } else {
      v = sh::make_kv_view<float, memory_space::host>({twin_[K].data(), twin_[K].size()},
                                                      {twin_[V].data(), twin_[V].size()},
                                                      {table_.lengths.data(), table_.lengths.size()}, batch_, heads_, head_dim_,
                                                      table_.capacity, sh::named_layout::nhd);
    }
    return v;
  }

  [[nodiscard]] state_type call_state(int which) const {
    return st_[which].for_batch(pass_rows_ ? sh::host_span<const std::int32_t>(row_store_.data(), row_store_.size())
                                           : sh::host_span<const std::int32_t>{});
  }
  [[nodiscard]] std::int64_t state_slot(std::int32_t b, std::int32_t h, std::int32_t t) const {
    return st_[0].row_index(rows_[static_cast<std::size_t>(b)], h, t);
  }

  // ---- setup ----------------------------------------------------------------
  bool setup() {
    gen_.state = src_.word();
    decode_settings_into(src_, policy_.config);
    clean_settings_ = settings_valid<Policy>(policy_.config);
    const bool int4 = src_.flag();
    q_.kind = int4 ? sh::quant_kind::int4 : sh::quant_kind::int8;
    q_.group_size = (int4 ? 2 : 1) << src_.in(0, 4);
    head_dim_ = q_.group_size * src_.i32(1, 4);
    batch_ = src_.i32(1, 3);
    heads_ = src_.i32(1, 3);
    code_bytes_ = q_.code_row_bytes(head_dim_);
    params_row_ = q_.params_per_row(head_dim_);
    FUZZ_CHECK(code_bytes_ == (int4 ? head_dim_ / 2 : head_dim_) &&
                   params_row_ == (head_dim_ / q_.group_size) * (int4 ? 2 : 1),
               "kv_quantization: code_row_bytes or params_per_row");
    table_.decode(src_, false);
    for (int i = 0; i < 4; ++i) {
      bool clean = true;
      lay_[i] = pick_strides(src_, extent0(), heads_, extent2(), row_of(i), clean);
      if (!clean) {
        const int unique = rows_unique(lay_[i], extent0(), heads_, extent2(), row_of(i));
        layout_[i] = unique > 0 ? layout_kind::unique : unique == 0 ? layout_kind::overlapping : layout_kind::negative;
        if (unique <= 0 && layout_bad_ < 0) layout_bad_ = i;
      }
      if (extent_of(lay_[i], extent0(), heads_, extent2(), row_of(i)) > max_elements) return false;
    }
    // Rows never written hold a pattern, so a stray read shows in the results.
    for (int kind = 0; kind < 2; ++kind) {
      codes_[kind].resize(static_cast<std::size_t>(extent_of(lay_[kind], extent0(), heads_, extent2(), code_bytes_)));
      params_[kind].resize(
          static_cast<std::size_t>(extent_of(lay_[2 + kind], extent0(), heads_, extent2(), params_row_)));
      twin_[kind].resize(static_cast<std::size_t>(std::int64_t{extent0()} * extent2() * heads_ * head_dim_));
      for (auto& x : codes_[kind]) x = static_cast<std::uint8_t>(gen_.next());
      for (auto& x : params_[kind]) x = gen_.uniform(-2.0f, 2.0f);
      for (auto& x : twin_[kind]) x = gen_.uniform(-4.0f, 4.0f);
    }
    table_.start(batch_, gen_);

    // Two states of one shape: the twin has the quantized cache's capacity.
    shape_ = sh::state_shape_for(policy_, make_qview());
    const sh::state_shape twin_shape = sh::state_shape_for(policy_, make_fview());
    FUZZ_CHECK(twin_shape.rows == shape_.rows && twin_shape.kv_heads == shape_.kv_heads &&
                   twin_shape.capacity == shape_.capacity && twin_shape.ring_words == shape_.ring_words,
               "state_shape_for: a quantized cache and its float twin differ");
    FUZZ_CHECK(shape_.capacity == (Paged ? table_.max_pages * table_.page_size : table_.capacity), "state_shape_for: capacity");
    if (src_.flag()) shape_.capacity = std::min(shape_.capacity, src_.i32(1, 30));
    shape_.rows += src_.i32(0, 2);
    std::size_t bytes = 0;
    try {
      bytes = sh::state_bytes(shape_);
    } catch (const sh::invalid_argument&) {
      return false;  // garbage settings (a window) the main mode covers
    }
    if (bytes > (std::size_t{16} << 20)) return false;
    for (int i = 0; i < 2; ++i) {
      sbuf_[i].allocate(bytes);
      st_[i] = sh::make_state(sh::host_span<std::byte>(sbuf_[i].data, bytes), shape_);
      sh::host::reset_state(st_[i]);
    }
    const auto mapping = src_.in(0, 2);
    rows_.resize(static_cast<std::size_t>(batch_));
    std::vector<std::int32_t> pool;
    for (std::int32_t r = 0; r < shape_.rows; ++r) pool.push_back(r);
    if (mapping == 2)
      for (std::size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[gen_.next() % i]);
    for (std::int32_t b = 0; b < batch_; ++b) rows_[static_cast<std::size_t>(b)] = pool[static_cast<std::size_t>(b)];
    pass_rows_ = mapping != 0;

    slots_.assign(static_cast<std::size_t>(batch_),
                  std::vector<std::vector<std::int32_t>>(static_cast<std::size_t>(heads_)));
    admitted_.assign(static_cast<std::size_t>(batch_), 0);
    next_id_.assign(static_cast<std::size_t>(batch_), 0);
    FUZZ_TRACE("quantized setup: %s group %d head_dim %d (rows of %d code bytes, %d parameters) batch %d heads %d "
               "%s %d; strides",
               sh::name_of(q_.kind), q_.group_size, head_dim_, code_bytes_, params_row_, batch_, heads_,
               Paged ? "paged, pages of" : "contiguous, capacity", Paged ? table_.page_size : table_.capacity);
    constexpr const char* strides_of[4] = {" codes K", " V", " params K", " V"};
    for (int i = 0; i < 4; ++i)
      FUZZ_TRACE("%s (%lld %lld %lld)", strides_of[i], static_cast<long long>(lay_[i].outer),
                 static_cast<long long>(lay_[i].head), static_cast<long long>(lay_[i].token));
    FUZZ_TRACE("; layout bad %d unknown %d; settings valid %d (m %d recent %d sinks %d %s); state capacity %d rows %d "
               "mapping %d\n",
               layout_bad_, int(std::count(layout_, layout_ + 4, layout_kind::unique)), int(clean_settings_),
               policy_.config.evict_count, policy_.config.recent, policy_.config.sinks,
               policy_.config.compaction_mode == sh::compaction::preserve_order ? "preserve_order" : "fill_holes",
               shape_.capacity, shape_.rows, int(mapping));
    append_all(true);
    return true;
  }

  // ---- the engine's side ----------------------------------------------------
  // The reference dequantization, written here from the header's formula
  // (int8: scale[g] * q; int4: scale[g] * (q - zero[g]), q the nibble).
  void check_dequantized(const std::uint8_t* codes, const float* params, const float* values) const {
    for (std::int32_t x = 0; x < head_dim_; ++x) {
      const std::int32_t g = x / q_.group_size;
      float want = 0.0f;
      if (q_.kind == sh::quant_kind::int8) {
        want = params[g] * static_cast<float>(static_cast<std::int8_t>(codes[x]));
      } else {
        const std::int32_t code = (x & 1) != 0 ? codes[x >> 1] >> 4 : codes[x >> 1] & 0x0F;
        want = params[2 * g] * (static_cast<float>(code) - params[2 * g + 1]);
      }
      FUZZ_CHECK(same_bits(want, values[x]), "dequantize_row: element " + std::to_string(x) + " differs from the formula");
    }
  }

  void append_all(bool initial) {
    for (std::int32_t b = 0; b < batch_; ++b) {
      std::int32_t n = initial ? src_.i32(0, 26) : src_.i32(0, 3);
      while (n-- > 0)
        if (!append_one(b)) break;
    }
    FUZZ_TRACE("  lengths:");
    for (std::int32_t b = 0; b < batch_; ++b) FUZZ_TRACE(" %d", table_.length(b));
    FUZZ_TRACE("\n");
  }

  // One token at the end of sequence b: quantized into the cache (codes and
  // parameters), its dequantized values into the twin.
  bool append_one(std::int32_t b) {
    if (layout_bad_ >= 0) return false;  // the rows' addresses may leave the buffers
    const std::int32_t len = table_.length(b);
    if (len >= shape_.capacity) return false;  // the engine keeps within the state's capacity
    if (!table_.grow(b)) return false;
    const std::int32_t id = next_id_[static_cast<std::size_t>(b)]++;
    std::vector<float> x(static_cast<std::size_t>(head_dim_));
    for (std::int32_t h = 0; h < heads_; ++h) {
      token_rec rec;
      for (int kind = 0; kind < 2; ++kind) {
        const bool flat = gen_.next() % 16 == 0;  // a row of one value: scale 0
        const float c = gen_.uniform(-4.0f, 4.0f);
        for (std::int32_t d = 0; d < head_dim_; ++d)
          x[static_cast<std::size_t>(d)] = flat ? c : gen_.uniform(-4.0f, 4.0f) * static_cast<float>(1 + d % 5);
        std::uint8_t* codes = code_row(kind, b, h, len);
        float* params = param_row(kind, b, h, len);
        sh::quantize_row(x.data(), head_dim_, q_, codes, params);
        float* f = twin_row(kind, b, h, len);
        sh::dequantize_row(codes, params, head_dim_, q_, f);
        check_dequantized(codes, params, f);
        rec.codes[kind].assign(codes, codes + code_bytes_);
        rec.params[kind].assign(params, params + params_row_);
      }
      tokens_[{b, h, id}] = std::move(rec);
      auto& ids = slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)];
      FUZZ_CHECK(static_cast<std::int32_t>(ids.size()) == len, "quantized model: slots out of step");
      ids.push_back(id);
    }
    return true;
  }

  // The engine writes a non-finite or extreme value over one parameter of a
  // held row (K or V); the oracle's record and the twin follow.
  void poke() {
    const std::int32_t b = src_.i32(0, batch_ - 1), h = src_.i32(0, heads_ - 1);
    const int kind = src_.flag() ? V : K;
    const std::int32_t i = src_.i32(0, params_row_ - 1);
    constexpr float values[] = {nan_f, inf_f, -inf_f, 3.4e38f, -3.4e38f, 1e-45f, -0.0f, 0.0f};
    const float x = values[src_.in(0, std::size(values) - 1)];
    const std::int32_t pick = src_.i32(0, 255);
    const std::int32_t len = table_.length(b);
    if (len == 0 || layout_bad_ >= 0) return;
    const std::int32_t t = pick % len;
    const std::int32_t id = slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)][static_cast<std::size_t>(t)];
    token_rec& rec = tokens_.at({b, h, id});
    pokes_.push_back({kind, b, h, id, rec.params[kind]});
    float* p = param_row(kind, b, h, t);
    p[i] = x;
    rec.params[kind][static_cast<std::size_t>(i)] = x;
    sh::dequantize_row(code_row(kind, b, h, t), p, head_dim_, q_, twin_row(kind, b, h, t));
    FUZZ_TRACE("  poke %s parameter %d of (sequence %d, head %d, slot %d, token %d) = %g\n", kind == K ? "K" : "V", i,
               b, h, t, id, static_cast<double>(x));
  }

  // The engine rewrites the poked rows that are still held (last poke first).
  void repair() {
    for (auto it = pokes_.rbegin(); it != pokes_.rend(); ++it) {
      const auto& ids = slots_[static_cast<std::size_t>(it->b)][static_cast<std::size_t>(it->h)];
      const auto at = std::find(ids.begin(), ids.end(), it->id);
      if (at == ids.end()) continue;  // evicted
      const auto t = static_cast<std::int32_t>(at - ids.begin());
      token_rec& rec = tokens_.at({it->b, it->h, it->id});
      rec.params[it->kind] = it->old;
      float* p = param_row(it->kind, it->b, it->h, t);
      std::copy(it->old.begin(), it->old.end(), p);
      sh::dequantize_row(code_row(it->kind, it->b, it->h, t), p, head_dim_, q_, twin_row(it->kind, it->b, it->h, t));
    }
    FUZZ_TRACE("  repair %zu pokes\n", pokes_.size());
    pokes_.clear();
  }

  // A request finishes: its tokens leave, its state row is reset (both
  // states), a new request starts there empty.
  void retire() {
    const std::int32_t b = src_.i32(0, batch_ - 1);
    if (layout_bad_ >= 0) return;
    std::vector<std::int32_t> lengths;
    for (std::int32_t s = 0; s < batch_; ++s) lengths.push_back(s == b ? 0 : table_.length(s));
    table_.apply(lengths, "quantized apply_lengths");
    const std::int32_t r = rows_[static_cast<std::size_t>(b)];
    for (int i = 0; i < 2; ++i) {
      try {
        sh::host::reset_sequence(st_[i], r, 0);
      } catch (const std::exception& e) {
        fail(__FILE__, __LINE__, std::string("reset_sequence refused a valid row: ") + e.what());
      }
    }
    for (std::int32_t h = 0; h < heads_; ++h) {
      for (const std::int32_t id : slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)]) tokens_.erase({b, h, id});
      slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)].clear();
    }
    admitted_[static_cast<std::size_t>(b)] = 0;
    next_id_[static_cast<std::size_t>(b)] = 0;
    pokes_.erase(std::remove_if(pokes_.begin(), pokes_.end(), [&](const poke_rec& p) { return p.b == b; }),
                 pokes_.end());
    FUZZ_TRACE("  retire sequence %d (row %d)\n", b, r);
  }

  // ---- expectations ----------------------------------------------------------
  struct verdict {
    expect e = expect::ok;
    int causes = 0;      // known reasons the call must be refused
    bool vague = false;  // a part the library may refuse, naming what it likes
    bool model = true;   // the view passed is the harness's cache
    std::vector<std::string> names;  // what the one cause's refusal names ("x*": a prefix)
    std::string note;

    void refuse(const std::string& why, std::initializer_list<const char*> args) {
      e = expect::refuse;
      if (++causes == 1) names.assign(args.begin(), args.end());
      note += why + "; ";
    }
    void unknown(const std::string& why, bool same_view) {
      if (e != expect::refuse) e = expect::unknown;
      vague = true;
      model = model && same_view;
      note += why + "; ";
    }
    [[nodiscard]] bool exact() const { return e == expect::refuse && causes == 1 && !vague && !names.empty(); }
    [[nodiscard]] bool allows(const std::string& arg) const {
      for (const std::string& n : names) {
        if (n == arg) return true;
        if (!n.empty() && n.back() == '*' && arg.rfind(n.substr(0, n.size() - 1), 0) == 0) return true;
      }
      return false;
    }
  };

  // What the case's settings and layouts add to a call's verdict, after its
  // damage (corrupt: which layout it replaced, whether it changed the rows'
  // sizes, under which an overlapping layout may no longer overlap).
  void add_base(verdict& vd) const {
    if (!clean_settings_) vd.refuse("invalid settings", {"settings.*"});
    for (int i = 0; i < 4; ++i) {
      if (i == replaced_) continue;
      const std::string what = std::string("the case's ") + layout_names[i];
      if (layout_[i] == layout_kind::negative)
        vd.refuse(what + " has a negative stride", {layout_names[i]});
      else if (layout_[i] == layout_kind::overlapping && !rows_changed_)
        vd.refuse(what + " overlaps", {layout_names[i]});
      else if (layout_[i] != layout_kind::nested)
        vd.unknown(what + " is unique but not nested, or overlaps at other row sizes", true);
    }
  }

  // Whether a K parameter of slots [from, length) of sequence b is not finite.
  bool key_params_bad(std::int32_t b, std::int32_t from) {
    for (std::int32_t h = 0; h < heads_; ++h)
      for (std::int32_t t = std::max(from, 0); t < table_.length(b); ++t) {
        const float* p = param_row(K, b, h, t);
        for (std::int32_t i = 0; i < params_row_; ++i)
          if (!std::isfinite(p[i])) return true;
      }
    return false;
  }

  // A static observation policy admits the new rows: key_norm scores them
  // from their dequantized K (refused when a K parameter there is not
  // finite); recency and random scores never read K, and the library may
  // refuse or accept (today it checks for every static policy).
  void new_key_params_verdict(verdict& vd) {
    for (std::int32_t b = 0; b < batch_; ++b)
      if (key_params_bad(b, admitted_[static_cast<std::size_t>(b)])) {
        const std::string why = "a non-finite K parameter in a new row, sequence " + std::to_string(b);
        if (std::is_same_v<Obs, sh::key_norm>)
          vd.refuse(why, {"cache.k_params"});
        else
          vd.unknown(why + " (a scorer that does not read K)", true);
        return;
      }
  }

  static sh::host_span<std::uint8_t>& code_span(qview& v, int kind) {
    if constexpr (Paged)
      return kind == K ? v.k_pages : v.v_pages;
    else
      return kind == K ? v.k : v.v;
  }
  static void set_layout(qview& v, int which, const strides3& s) {
    const layout_type l{s.outer, s.head, s.token};
    switch (which) {
      case 0: v.k_layout = l; break;
      case 1: v.v_layout = l; break;
      case 2: v.k_params_layout = l; break;
      default: v.v_params_layout = l; break;
    }
  }

  enum class damage { none, out_over_params, ws_over_params };
  struct call_damage {
    damage kind = damage::none;
    int buffer = K;      // whose parameters the output or workspace lies over
    bool first = true;   // new_lengths (else freed_pages)
  };

  // One damage to the view of one call (a damage byte of 192 or more).
  int replaced_ = -1;          // the layout the call's damage replaced
  bool rows_changed_ = false;  // the call's damage changed code_row_bytes or params_per_row

  call_damage corrupt(qview& v, bool compressing, verdict& vd) {
    call_damage cd;
    replaced_ = -1;
    rows_changed_ = false;
    if (src_.byte() < 192) return cd;
    const auto which = src_.in(0, 10);
    const bool int4 = q_.kind == sh::quant_kind::int4;
    switch (which) {
      case 0: {  // the group size: 0, negative, not dividing head_dim, odd for int4; or another valid one
        const auto sub = src_.in(0, 4);
        const auto choice = src_.byte();
        std::int32_t g = 0;
        if (sub == 1) g = -q_.group_size;
        if (sub == 2) g = head_dim_ + 1;
        if (sub == 3) g = int4 ? 1 : 2 * head_dim_;
        if (sub == 4) {
          std::vector<std::int32_t> other;
          for (std::int32_t d = 1; d <= head_dim_; ++d)
            if (head_dim_ % d == 0 && d != q_.group_size && (!int4 || d % 2 == 0)) other.push_back(d);
          if (other.empty()) return cd;
          g = other[choice % other.size()];
          v.quantization.group_size = g;
          rows_changed_ = true;
          vd.unknown("another valid group size " + std::to_string(g), false);
          return cd;
        }
        v.quantization.group_size = g;
        vd.refuse("group size " + std::to_string(g), {"cache.quantization.group_size"});
        return cd;
      }
      case 1: {  // the kind: not int8 or int4; or the other one
        const auto sub = src_.in(0, 2);
        if (sub < 2) {
          const std::int32_t k = sub == 0 ? 0 : garbage_int(src_);
          if (k == 4 || k == 8) return cd;
          v.quantization.kind = static_cast<sh::quant_kind>(k);
          vd.refuse("kind " + std::to_string(k), {"cache.quantization.kind"});
          return cd;
        }
        v.quantization.kind = int4 ? sh::quant_kind::int8 : sh::quant_kind::int4;
        rows_changed_ = true;
        if (!int4 && q_.group_size % 2 != 0)
          vd.refuse("int4 over odd groups", {"cache.quantization.group_size"});
        else
          vd.unknown("the other kind", false);
        return cd;
      }
      case 2:
      case 3: {  // a parameter buffer null or short
        const int kind = which == 2 ? K : V;
        sh::host_span<float>& p = kind == K ? v.k_params : v.v_params;
        const bool null = src_.flag();
        const auto cut = static_cast<std::size_t>(src_.in(1, 256));
        p = null ? sh::host_span<float>(nullptr, p.size())
                 : sh::host_span<float>(p.data(), p.size() - std::min(cut, p.size()));
        vd.refuse(std::string(null ? "null " : "short ") + buffer_names[2 + kind], {buffer_names[2 + kind]});
        return cd;
      }
      case 4:  // V parameters aliasing K's, or K's aliasing V's
        if (src_.flag()) {
          v.v_params = v.k_params;
          vd.refuse("cache.v_params aliases cache.k_params", {"cache.v_params"});
        } else {
          v.k_params = v.v_params;
          vd.refuse("cache.k_params aliases cache.v_params", {"cache.k_params", "cache.v_params"});
        }
        return cd;
      case 5:
      case 6: {  // a layout of codes (6) or parameters (5) whose rows overlap, or any small strides
        const int buf = (which == 5 ? 2 : 0) + (src_.flag() ? 1 : 0);
        strides3 s = lay_[buf];
        switch (src_.in(0, 2)) {
          case 0: s.token = 0; break;
          case 1: s.head = 0; break;
          default: s = {src_.in(-1, 40), src_.in(-1, 40), src_.in(-1, 40)}; break;
        }
        set_layout(v, buf, s);
        replaced_ = buf;
        const int unique = rows_unique(s, extent0(), heads_, extent2(), row_of(buf));
        const std::string what = std::string(layout_names[buf]) + " (" + std::to_string(s.outer) + ", " +
                                 std::to_string(s.head) + ", " + std::to_string(s.token) + ")";
        if (unique <= 0)
          vd.refuse(what + (unique < 0 ? " negative" : " overlapping"), {layout_names[buf]});
        else if (layout_[buf] != layout_kind::nested || !same_rows(s, lay_[buf], extent0(), heads_, extent2()))
          vd.unknown(what + " unique", layout_[buf] == layout_kind::unique && same_rows(s, lay_[buf], extent0(), heads_, extent2()));
        return cd;
      }
      case 7: {  // a code buffer null, short, or aliasing the other
        const int kind = src_.flag() ? V : K;
        const auto sub = src_.in(0, 2);
        const auto cut = static_cast<std::size_t>(src_.in(1, 256));
        sh::host_span<std::uint8_t>& c = code_span(v, kind);
        if (sub == 0) {
          c = {nullptr, c.size()};
          vd.refuse(std::string("null ") + buffer_names[kind], {buffer_names[kind]});
        } else if (sub == 1) {
          c = {c.data(), c.size() - std::min(cut, c.size())};
          vd.refuse(std::string("short ") + buffer_names[kind], {buffer_names[kind]});
        } else {
          c = code_span(v, 1 - kind);
          vd.refuse("code buffers alias", {buffer_names[0], buffer_names[1]});
        }
        return cd;
      }
      case 8: {  // head_dim above 512 (a quantized K row is dequantized on the stack) or not positive
        const auto sub = src_.in(0, 2);
        const auto more = src_.i32(0, 255);
        if (sub == 0) {
          v.head_dim = 1024;
          v.quantization.group_size = 1024;  // a format that fits: only the size is wrong
        } else if (sub == 1) {
          v.head_dim = 513 + more;
        } else {
          v.head_dim = more % 2 == 0 ? 0 : -head_dim_;
        }
        vd.refuse("head_dim " + std::to_string(v.head_dim), {"cache.head_dim"});
        return cd;
      }
      case 9:  // compress: an output over the parameters
        cd.buffer = src_.flag() ? V : K;
        cd.first = src_.flag();
        if (compressing) cd.kind = damage::out_over_params;
        return cd;
      default:  // compress: the workspace over the parameters
        cd.buffer = src_.flag() ? V : K;
        if (compressing) cd.kind = damage::ws_over_params;
        return cd;
    }
  }

  // ---- snapshots ---------------------------------------------------------------
  struct snapshot {
    std::vector<std::uint8_t> k_codes, v_codes, k_params, v_params, table, state, out, reads;
    bool operator==(const snapshot&) const = default;
  };
  [[nodiscard]] snapshot take() const {
    snapshot s;
    s.k_codes = codes_[K];
    s.v_codes = codes_[V];
    s.k_params = bytes_of_all(params_[K]);
    s.v_params = bytes_of_all(params_[V]);
    s.table = table_.bytes();
    s.state = bytes_of(sbuf_[0].data, sbuf_[0].size);
    s.out = bytes_of_all(out_store_);
    s.reads = bytes_of_all(qdata_, lse_, qo_, row_store_);
    return s;
  }

  // Runs `call`; returns whether it succeeded. A refusal must name `fn`
  // (and the one known cause's argument) and leave every byte as it was.
  template <class Call>
  bool guarded(const char* fn, const verdict& vd, Call&& call) {
    const snapshot before = take();
    try {
      call();
    } catch (const sh::invalid_argument& e) {
      FUZZ_TRACE("  %s refused (expected %d): %s\n", fn, int(vd.e), e.what());
      FUZZ_CHECK(e.function() == fn, std::string("error names function '") + e.function() + "', not " + fn);
      FUZZ_CHECK(!e.argument().empty(), "error names no argument");
      FUZZ_CHECK(take() == before, std::string(fn) + " wrote before refusing: " + e.what());
      FUZZ_CHECK(vd.e != expect::ok, std::string(fn) + " refused a valid call on a quantized cache: " + e.what());
      if (vd.exact())
        FUZZ_CHECK(vd.allows(e.argument()), std::string(fn) + " refused '" + e.argument() + "', not " + vd.names[0] +
                                                " (" + vd.note + "): " + e.what());
      return false;
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string(fn) + " threw something else than scissorhands::invalid_argument: " + e.what());
    }
    FUZZ_TRACE("  %s accepted (expected %d)\n", fn, int(vd.e));
    FUZZ_CHECK(vd.e != expect::refuse, std::string(fn) + " accepted an invalid argument on a quantized cache (" + vd.note + ")");
    return true;
  }

  // After a call that must not touch the cache or what it only reads.
  void check_reads(const snapshot& before, const char* fn, bool cache_too) const {
    const snapshot after = take();
    if (cache_too)
      FUZZ_CHECK(after.k_codes == before.k_codes && after.v_codes == before.v_codes &&
                     after.k_params == before.k_params && after.v_params == before.v_params,
                 std::string(fn) + " wrote to the quantized cache");
    FUZZ_CHECK(after.table == before.table && after.reads == before.reads,
               std::string(fn) + " changed the lengths, the page table or an argument it only reads");
  }

  // The float twin through the same call: it must accept.
  template <class Call>
  static void twin(const char* fn, Call&& call) {
    try {
      call();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("the float twin's ") + fn + " refused: " + e.what());
    }
  }

  void check_states(const char* fn) const {
    FUZZ_CHECK(std::memcmp(sbuf_[0].data, sbuf_[1].data, sbuf_[0].size) == 0,
               std::string(fn) + ": the quantized cache's state differs from its float twin's");
  }

  // Every held slot's state position is the id of the token the model puts there.
  void check_positions(const char* fn) const {
    for (std::int32_t b = 0; b < batch_; ++b)
      for (std::int32_t h = 0; h < heads_; ++h)
        for (std::int32_t t = 0; t < admitted_[static_cast<std::size_t>(b)]; ++t)
          FUZZ_CHECK(st_[0].positions[state_slot(b, h, t)] ==
                         slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)][static_cast<std::size_t>(t)],
                     std::string(fn) + ": a slot's position is not its token's");
  }

  // ---- operations --------------------------------------------------------------
  bool step() {
    const auto op = src_.in(0, 9);
    FUZZ_TRACE("op %d at byte %zu\n", int(op), src_.position());
    switch (op) {
      case 0:
      case 1: append_all(false); return true;
      case 2:
      case 3: return observe_queries();
      case 4: return admit();
      case 5:
      case 6: return compress();
      case 7: poke(); return true;
      case 8: repair(); return true;
      default: retire(); return true;
    }
  }

  void after_observe(const char* fn) {
    check_states(fn);
    for (std::int32_t b = 0; b < batch_; ++b) {
      FUZZ_CHECK(st_[0].tracked[rows_[static_cast<std::size_t>(b)]] == table_.length(b), std::string(fn) + ": tracked != length");
      admitted_[static_cast<std::size_t>(b)] = table_.length(b);
    }
    check_positions(fn);
  }

  // Tokens sequence b holds that its row does not track yet (-1: no row).
  std::int32_t new_tokens(std::int32_t b) const {
    const std::int32_t r = rows_[static_cast<std::size_t>(b)], len = table_.length(b);
    if (r < 0) return -1;
    const std::int32_t tracked = st_[0].tracked[r];
    return tracked >= 0 && tracked <= len ? len - tracked : -1;
  }
  // The observe-step invariant (docs/integration.md): a sequence's q queries
  // are its last q tokens, each new or admitted without a query; tokens
  // before them are admitted by the call only before the row's first query.
  bool steps_ok(const std::vector<std::int32_t>& counts) const {
    for (std::int32_t b = 0; b < batch_; ++b)
      if (!row_steps_ok(st_[0], st_[0].shape.rows, rows_[static_cast<std::size_t>(b)], table_.length(b),
                        counts[static_cast<std::size_t>(b)]))
        return false;
    return true;
  }

  bool observe_queries() {
    qview v = make_qview();
    verdict vd;
    corrupt(v, false, vd);
    add_base(vd);
    // Queries: q_heads a multiple of the KV heads, counts within the lengths.
    const std::int32_t group = src_.i32(1, 3);
    const std::int32_t q_heads = heads_ * group;
    const bool ragged = src_.flag();
    std::vector<std::int32_t> counts(static_cast<std::size_t>(batch_), 0);
    std::int32_t q_len = 0;
    qo_.assign(1, 0);
    // Mostly a query per new token (the observe-step invariant).
    const bool per_new_token = !src_.rarely();
    if (ragged) {
      for (std::int32_t b = 0; b < batch_; ++b) {
        const std::int32_t n = new_tokens(b);
        const std::int32_t c = per_new_token && n >= 0 ? n : std::min(src_.i32(0, 3), table_.length(b));
        counts[static_cast<std::size_t>(b)] = c;
        qo_.push_back(qo_.back() + c);
      }
    } else {
      q_len = src_.i32(0, 3);
      for (std::int32_t b = 0; per_new_token && b < batch_; ++b)
        if (const std::int32_t n = new_tokens(b); n > 0) {
          q_len = n;
          break;
        }
      for (std::int32_t b = 0; b < batch_; ++b)
        if (table_.length(b) > 0) q_len = std::min(q_len, table_.length(b));
      std::fill(counts.begin(), counts.end(), q_len);
    }
    const std::int64_t total = ragged ? qo_.back() : std::int64_t{batch_} * q_len;
    const auto reach = static_cast<std::size_t>(total * q_heads * head_dim_);
    qdata_.assign(std::max<std::size_t>(reach, 1), 0.0f);
    for (auto& x : qdata_) x = gen_.uniform(-3.0f, 3.0f);
    const auto qv =
        ragged ? sh::query_view<float, memory_space::host>::ragged({qdata_.data(), reach}, {qo_.data(), qo_.size()},
                                                                   q_heads, head_dim_)
               : sh::query_view<float, memory_space::host>::dense({qdata_.data(), reach}, q_heads, q_len, head_dim_);
    // A lse (any finite values: the twin gets the same) or none. Made up,
    // not the queries' own, so its sums are not checked (lse_check::none;
    // the per-head mode fuzzes the check).
    sh::lse_view<memory_space::host> lse{};
    lse_.clear();
    if (src_.flag() && total > 0) {
      lse_.resize(static_cast<std::size_t>(total * q_heads));
      for (auto& x : lse_) x = gen_.uniform(-2.0f, 6.0f);
      lse = ragged ? sh::lse_view<memory_space::host>::ragged({lse_.data(), lse_.size()}, {qo_.data(), qo_.size()},
                                                              q_heads, sh::lse_base::natural)
                   : sh::lse_view<memory_space::host>::dense({lse_.data(), lse_.size()}, q_heads, q_len,
                                                             sh::lse_base::natural);
      lse.check = sh::lse_check::none;
    }
    const float scale = src_.flag() ? 0.5f : 0.0f;
    const bool plan = src_.flag();
    const std::int32_t slices = plan ? src_.i32(1, 3) : 1;
    const bool reverse = plan && src_.flag();
    const char* fn = plan ? "host::plan_observe_queries" : "host::observe_queries";
    // Which K rows the call reads: every held row of a sequence with
    // queries (attention), the new rows (a static scorer).
    if (vd.model) {
      if constexpr (attention) {
        for (std::int32_t b = 0; b < batch_; ++b)
          if (counts[static_cast<std::size_t>(b)] > 0 && key_params_bad(b, 0)) {
            vd.refuse("a non-finite K parameter in a row it reads, sequence " + std::to_string(b), {"cache.k_params"});
            break;
          }
      } else {
        new_key_params_verdict(vd);
      }
    }
    // Checked last by the library: a view's own faults are named first.
    if constexpr (attention)
      if (vd.model && !steps_ok(counts))
        vd.refuse("a query that is not a new token, or new tokens without queries after the first", {"cache length"});
    row_store_ = rows_;
    FUZZ_TRACE("  observe_queries: %s, q_heads %d, counts", ragged ? "ragged" : "dense", q_heads);
    for (const std::int32_t c : counts) FUZZ_TRACE(" %d", c);
    FUZZ_TRACE(", lse %d, %s %d slices; expected %d (%s)\n", int(lse.present()), plan ? "plan" : "serial", slices,
               int(vd.e), vd.note.c_str());
    const snapshot before = take();
    const bool accepted = guarded(fn, vd, [&] {
      if (plan) {
        const auto p = sh::host::plan_observe_queries(policy_, v, call_state(0), qv, lse, scale);
        for (std::int32_t i = 0; i < slices; ++i) p.run({reverse ? slices - 1 - i : i, slices});
      } else {
        sh::host::observe_queries(policy_, v, call_state(0), qv, lse, scale);
      }
    });
    if (!accepted) return true;
    if (!vd.model) return false;  // the call saw another cache: the twin cannot follow
    check_reads(before, fn, true);
    twin("observe_queries", [&] { sh::host::observe_queries(policy_, make_fview(), call_state(1), qv, lse, scale); });
    after_observe(fn);
    return true;
  }

  bool admit() {
    qview v = make_qview();
    verdict vd;
    corrupt(v, false, vd);
    add_base(vd);
    if (vd.model && !attention) new_key_params_verdict(vd);
    qdata_.clear();
    lse_.clear();
    qo_.clear();
    row_store_ = rows_;
    FUZZ_TRACE("  admit: expected %d (%s)\n", int(vd.e), vd.note.c_str());
    const snapshot before = take();
    if (!guarded("host::admit", vd, [&] { sh::host::admit(policy_, v, call_state(0)); })) return true;
    if (!vd.model) return false;
    check_reads(before, "host::admit", true);
    twin("admit", [&] { sh::host::admit(policy_, make_fview(), call_state(1)); });
    after_observe("host::admit");
    return true;
  }

  bool compress() {
    qview v = make_qview();
    verdict vd;
    const call_damage cd = corrupt(v, true, vd);
    add_base(vd);
    qview mv = make_qview();
    std::int32_t max_len = 0;
    for (std::int32_t b = 0; b < batch_; ++b) max_len = std::max(max_len, table_.length(b));
    const bool garbage_budget = src_.rarely();
    const std::int32_t budget = garbage_budget ? garbage_int(src_) : src_.i32(1, max_len + 1);
    const bool plan = src_.flag();
    const std::int32_t slices = plan ? src_.i32(1, 3) : 1;
    const bool reverse = plan && src_.flag();
    const char* fn = plan ? "host::plan_compress" : "host::compress";
    const std::size_t need = plan ? sh::host::compress_workspace_bytes(mv, shape_, slices)
                                  : sh::host::compress_workspace_bytes(mv, shape_);
    const std::size_t size = need + static_cast<std::size_t>(src_.in(0, 8));
    std::vector<std::uint64_t> ws_store(size / 8 + 2, 0xA5A5A5A5A5A5A5A5ull);
    sh::host_span<std::byte> workspace(reinterpret_cast<std::byte*>(ws_store.data()), size);
    const auto n = static_cast<std::size_t>(batch_);
    out_store_.assign(3 * n + 4, -7);
    std::int32_t* store = out_store_.data();
    sh::host_span<std::int32_t> new_lengths(store + 1, n), freed;
    if (Paged || src_.flag()) freed = {store + n + 2, n};
    qdata_.clear();
    lse_.clear();
    qo_.clear();
    row_store_ = rows_;
    // An output or the workspace over a parameter buffer: the call moves
    // parameter rows while writing them, so it must refuse, as it does
    // for an output or a workspace over the codes.
    if (cd.kind == damage::out_over_params) {
      std::vector<float>& p = params_[cd.buffer];
      if (p.size() >= n) {
        (cd.first ? new_lengths : freed) = sh::host_span<std::int32_t>(reinterpret_cast<std::int32_t*>(p.data()), n);
        const char* name = cd.first ? "out.new_lengths" : "out.freed_pages";
        vd.refuse(std::string(name) + " over " + buffer_names[2 + cd.buffer], {name});
      }
    } else if (cd.kind == damage::ws_over_params) {
      std::vector<float>& p = params_[cd.buffer];
      workspace = {reinterpret_cast<std::byte*>(p.data()), std::min(size, p.size() * sizeof(float))};
      vd.refuse(std::string("the workspace over ") + buffer_names[2 + cd.buffer], {"workspace"});
    }
    const sh::settings& c = policy_.config;
    const std::int64_t protect = std::int64_t{c.recent} + c.sinks;
    const bool budget_ok = budget > protect && c.evict_count <= budget - protect;
    if (!budget_ok) vd.refuse("budget " + std::to_string(budget), {"budget", "settings.evict_count"});
    // A sequence at the budget must have state for every token it holds.
    if (budget_ok && clean_settings_)
      for (std::int32_t b = 0; b < batch_; ++b)
        if (table_.length(b) >= budget && admitted_[static_cast<std::size_t>(b)] != table_.length(b)) {
          vd.refuse("sequence " + std::to_string(b) + " at the budget has unadmitted tokens", {"state"});
          break;
        }
    FUZZ_TRACE("  compress: budget %d m %d, %s %d slices, freed %d; expected %d (%s)\n", budget, c.evict_count,
               plan ? "plan" : "serial", slices, int(!freed.empty()), int(vd.e), vd.note.c_str());
    const snapshot before = take();
    const sh::compress_output<memory_space::host> out{new_lengths, freed};
    const bool accepted = guarded(fn, vd, [&] {
      if (plan) {
        const auto p = sh::host::plan_compress(policy_, v, call_state(0), budget, workspace, out, slices);
        for (std::int32_t i = 0; i < slices; ++i) p.run({reverse ? slices - 1 - i : i, slices});
      } else {
        sh::host::compress(policy_, v, call_state(0), budget, workspace, out);
      }
    });
    if (!accepted) return true;
    if (!vd.model) return false;
    check_reads(before, fn, false);

    // The twin, through the same call.
    const fview fv = make_fview();
    std::vector<std::int32_t> twin_new(n, -7), twin_freed(n, -7);
    std::vector<std::uint64_t> twin_ws(sh::host::compress_workspace_bytes(fv, shape_) / 8 + 1);
    twin("compress", [&] {
      sh::host::compress(policy_, fv, call_state(1), budget,
                         {reinterpret_cast<std::byte*>(twin_ws.data()), twin_ws.size() * 8},
                         {{twin_new.data(), n},
                          freed.empty() ? sh::host_span<std::int32_t>{} : sh::host_span<std::int32_t>(twin_freed.data(), n)});
    });
    check_states(fn);
    // Outputs: the twin's, and the documented lengths; nothing else of the store written.
    std::vector<std::int32_t> want_store(3 * n + 4, -7);
    const std::int32_t m = c.evict_count;
    for (std::size_t b = 0; b < n; ++b) {
      const std::int32_t len = table_.length(static_cast<std::int32_t>(b));
      const std::int32_t kept = len < budget ? len : budget - m;
      FUZZ_CHECK(new_lengths[b] == kept && twin_new[b] == kept, "compress: a new length");
      want_store[1 + b] = kept;
      if (!freed.empty()) {
        const std::int32_t f = Paged ? table_.pages(static_cast<std::int32_t>(b)) - pages_for(kept, table_.page_size) : 0;
        FUZZ_CHECK(freed[b] == f && twin_freed[b] == f, "compress: freed pages");
        want_store[n + 2 + b] = f;
      }
    }
    FUZZ_CHECK(out_store_ == want_store, "compress wrote outside its output spans");

    // The codes and parameters: rows of sequences at the budget below their
    // old length may change (each kept slot must hold its token's rows);
    // no other byte.
    const snapshot after = take();
    std::vector<char> may[4];
    const std::vector<std::uint8_t>* was[4] = {&before.k_codes, &before.v_codes, &before.k_params, &before.v_params};
    const std::vector<std::uint8_t>* now[4] = {&after.k_codes, &after.v_codes, &after.k_params, &after.v_params};
    for (int i = 0; i < 4; ++i) may[i].assign(was[i]->size(), 0);
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (table_.length(b) < budget) continue;
      for (std::int32_t h = 0; h < heads_; ++h)
        for (std::int32_t t = 0; t < table_.length(b); ++t)
          for (int i = 0; i < 4; ++i) {
            const std::size_t bytes = i < 2 ? static_cast<std::size_t>(code_bytes_) : sizeof(float) * static_cast<std::size_t>(params_row_);
            const std::size_t at = static_cast<std::size_t>(offset(i, b, h, t)) * (i < 2 ? 1 : sizeof(float));
            std::fill_n(may[i].begin() + static_cast<std::ptrdiff_t>(at), bytes, 1);
          }
    }
    for (int i = 0; i < 4; ++i)
      for (std::size_t x = 0; x < may[i].size(); ++x)
        if (may[i][x] == 0)
          FUZZ_CHECK((*now[i])[x] == (*was[i])[x], std::string("compress wrote ") + buffer_names[i] +
                                                       " outside the rows of the sequences it compacts");
    std::vector<float> deq(static_cast<std::size_t>(head_dim_));
    for (std::int32_t b = 0; b < batch_; ++b) {
      const std::int32_t len = table_.length(b);
      if (len < budget) continue;
      const std::int32_t kept = budget - m;
      for (std::int32_t h = 0; h < heads_; ++h) {
        auto& old_ids = slots_[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)];
        std::vector<std::int32_t> ids;
        for (std::int32_t t = 0; t < kept; ++t) {
          const std::int32_t id = st_[0].positions[state_slot(b, h, t)];
          FUZZ_CHECK(std::find(old_ids.begin(), old_ids.end(), id) != old_ids.end() &&
                         std::find(ids.begin(), ids.end(), id) == ids.end(),
                     "compress: a kept slot names a token the sequence did not hold, or one twice");
          ids.push_back(id);
          const token_rec& rec = tokens_.at({b, h, id});
          for (int kind = 0; kind < 2; ++kind) {
            FUZZ_CHECK(std::memcmp(code_row(kind, b, h, t), rec.codes[kind].data(), rec.codes[kind].size()) == 0,
                       std::string("compress: a kept ") + (kind == K ? "K" : "V") + " code row is not its token's");
            FUZZ_CHECK(std::memcmp(param_row(kind, b, h, t), rec.params[kind].data(),
                                   rec.params[kind].size() * sizeof(float)) == 0,
                       std::string("compress: a kept ") + (kind == K ? "K" : "V") + " parameter row is not its token's");
            sh::dequantize_row(rec.codes[kind].data(), rec.params[kind].data(), head_dim_, q_, deq.data());
            FUZZ_CHECK(std::memcmp(twin_row(kind, b, h, t), deq.data(), deq.size() * sizeof(float)) == 0,
                       "compress: the twin's kept row is not its token's dequantized values");
          }
        }
        // The compaction mode's order: preserve_order keeps the survivors in
        // order; fill_holes leaves a survivor below the new length in place.
        std::vector<std::int32_t> survivors;
        for (const std::int32_t id : old_ids)
          if (std::find(ids.begin(), ids.end(), id) != ids.end()) survivors.push_back(id);
        if (c.compaction_mode == sh::compaction::preserve_order)
          FUZZ_CHECK(survivors == ids, "compress (preserve_order): the kept tokens changed order");
        else
          for (std::int32_t t = 0; t < kept; ++t)
            if (std::find(ids.begin(), ids.end(), old_ids[static_cast<std::size_t>(t)]) != ids.end())
              FUZZ_CHECK(ids[static_cast<std::size_t>(t)] == old_ids[static_cast<std::size_t>(t)],
                         "compress (fill_holes): a kept token below the new length moved");
        for (const std::int32_t id : old_ids)
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) tokens_.erase({b, h, id});
        old_ids = ids;
      }
      admitted_[static_cast<std::size_t>(b)] = kept;
      FUZZ_TRACE("  sequence %d: %d -> %d tokens\n", b, len, kept);
    }
    for (const poke_rec& pk : pokes_) {
      const auto& ids = slots_[static_cast<std::size_t>(pk.b)][static_cast<std::size_t>(pk.h)];
      const auto at = std::find(ids.begin(), ids.end(), pk.id);
      if (at != ids.end() && table_.length(pk.b) >= budget)
        FUZZ_TRACE("  the poked %s parameters of token %d (sequence %d, head %d) moved with it to slot %d\n",
                   pk.kind == K ? "K" : "V", pk.id, pk.b, pk.h, static_cast<int>(at - ids.begin()));
    }
    table_.apply(std::vector<std::int32_t>(new_lengths.begin(), new_lengths.end()), "quantized apply_lengths");
    check_positions(fn);
    return true;
  }
};

// Quantized mode (its mode byte already read): the next byte picks the
// policy, the one after it paged or not.
void run_quantized_mode(byte_source& src) {
  constexpr case_runner policies[] = {
      run_case<quant_case, sh::scissorhands_policy>,
      run_case<quant_case, sh::h2o_policy>,
      run_case<quant_case, sh::key_norm_policy>,
      run_case<quant_case, sh::eviction_policy<sh::attention_mass, sh::sliding_window, sh::recent_window, sh::gqa_max>>,
      run_case<quant_case, sh::with_granularity<sh::scissorhands_policy, sh::shared_heads<sh::mean_score>>>,
      run_case<quant_case, sh::streaming_policy>,
      run_case<quant_case,
               sh::eviction_policy<sh::important_indicator, sh::exponential_decay, sh::recent_window, sh::gqa_max>>,
      run_case<quant_case, sh::key_norm_policy>,
  };
  const mode_choice m = decode_choice(src);
  FUZZ_TRACE("quantized mode: policy %d paged %d\n", m.policy, int(m.paged));
  policies[m.policy](src, m.paged);
}

}  // namespace
