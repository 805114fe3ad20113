#pragma once
// The C++17, exception-free face of scissorhands, for engines that compile
// as C++17 (vLLM's csrc, FlashInfer, TensorRT-LLM, llama.cpp) or with
// -fno-exceptions. See docs/cxx17.md.
//
// The library is C++20 and reports bad input by throwing. An engine keeps
// it out of its own build: ONE C++20 translation unit, compiled with
// exceptions, expands SCISSORHANDS_BRIDGE_DEFINE (bridge_impl.hpp) for the
// element type and policy it needs; everything else includes only this
// header and calls the functions SCISSORHANDS_BRIDGE_DECLARE declares. They
// are noexcept and return an `error` value: code, function, argument and
// message in fixed buffers (no allocation, no std::string). When one fails,
// nothing the caller owns was written (except the compress and compact
// workspaces, which are scratch), as with the throwing API.
//
// Everything here is plain data: pointers, sizes (in elements), strides and
// shapes, the same fields the C++20 views hold and with the same names.
// Arrays with one entry per sequence take no size: they must hold `batch`
// entries (indptr and qo_indptr: batch + 1). No standard library type
// crosses the boundary, so the two sides may use different -std modes and
// exception settings. Nothing in this header may depend on the language
// mode: both sides must see the same definitions.
//
// The functions call the host backend on host memory: nothing is launched
// and nothing is thrown, so they are safe in any context, a CUDA graph
// capture included. A CUDA twin is not written yet (docs/cxx17.md).
#include <cstddef>
#include <cstdint>

namespace scissorhands::bridge {

// ---- errors -----------------------------------------------------------------

// Same values as scissorhands::error_code (error.hpp).
enum class error_code : std::int32_t {
  ok = 0,
  invalid_argument = 1,  // the library refused an argument; nothing the caller owns was written
  out_of_memory = 2,     // std::bad_alloc (no per-step call allocates)
  internal = 3,          // any other exception: a bug, please report it
};

// What every call returns. `function` is the library entry point that
// refused ("host::compress"), `argument` the argument it refused
// ("budget", "state.shape.kv_heads"), `message` the full text
// ("scissorhands::host::compress: argument 'budget' must exceed ...").
// All three are NUL-terminated; a text that does not fit ends in "...".
struct [[nodiscard]] error {
  static constexpr std::size_t name_size = 64;
  static constexpr std::size_t message_size = 256;
  error_code code = error_code::ok;
  char function[name_size] = {};
  char argument[name_size] = {};
  char message[message_size] = {};

  bool ok() const noexcept { return code == error_code::ok; }
  explicit operator bool() const noexcept { return !ok(); }  // true when the call failed
};

// ---- policy settings (mirror of scissorhands::settings) --------------------

enum class compaction { fill_holes, preserve_order };
enum class pooling { max, mean };

// Start from the preset's own numbers, then change fields:
//   bridge::settings s;
//   ns::default_settings(&s);  // what the translation unit's policy holds
//   s.recent = 8;
// The field defaults below are the paper's, not a preset's, so a settings
// that default_settings did not fill is refused by every call (argument
// "settings"): nothing runs silently on numbers nobody chose. The mark is
// the policy's: settings filled by another namespace's default_settings
// (another policy) are refused too.
inline constexpr std::uint32_t settings_filled = 0x5c155e75u;  // mixed with the policy's name into `filled`

struct settings {
  std::int32_t window = 400;     // w: steps a sliding_window history remembers
  std::int32_t recent = 10;      // r: the r most recent tokens are never evicted
  std::int32_t sinks = 0;        // s: tokens at positions 0..s-1 are never evicted
  std::int32_t evict_count = 1;  // m: tokens evicted per trigger (leaves budget - m)
  float alpha = 1.0f;            // important_indicator: a token counts when a >= alpha / n
  float decay = 0.95f;           // exponential_decay
  bool normalize = false;        // divide a score by the steps the token was observed
  compaction compaction_mode = compaction::fill_holes;
  std::uint32_t seed = 0;  // random_score
  std::int32_t pool_width = 1;  // odd, 1 = off; > 1 needs preserve_order (SnapKV pooling)
  pooling pool_mode = pooling::mean;
  std::uint32_t filled = 0;  // the policy's mark once default_settings wrote it (0: not); keep it when copying
};

// ---- caches -----------------------------------------------------------------

// An fp16 (IEEE binary16) cache element held as its bits, for engines whose
// half type is a uint16_t (llama.cpp's ggml_fp16_t): cast the cache's
// pointer to it. The library's scissorhands::fp16_bits on the C++20 side.
struct fp16_bits {
  std::uint16_t bits;
};

// Where row (sequence b, head h, slot t) starts, in elements; the head_dim
// elements of a row are contiguous.
struct kv_layout {
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t token_stride = 0;

  // [sequence][token][head][dim]
  static constexpr kv_layout nhd(std::int32_t capacity, std::int32_t kv_heads, std::int32_t head_dim) noexcept {
    return {std::int64_t{capacity} * kv_heads * head_dim, head_dim, std::int64_t{kv_heads} * head_dim};
  }
  // [sequence][head][token][dim]
  static constexpr kv_layout hnd(std::int32_t capacity, std::int32_t kv_heads, std::int32_t head_dim) noexcept {
    return {std::int64_t{capacity} * kv_heads * head_dim, std::int64_t{capacity} * head_dim, head_dim};
  }
};

// Where row (page p, head h, in-page slot t) starts, in elements.
struct paged_layout {
  std::int64_t page_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t token_stride = 0;

  // [page][token][head][dim] (FlashInfer's NHD)
  static constexpr paged_layout nhd(std::int32_t page_size, std::int32_t kv_heads, std::int32_t head_dim) noexcept {
    return {std::int64_t{page_size} * kv_heads * head_dim, head_dim, std::int64_t{kv_heads} * head_dim};
  }
  // [page][head][token][dim] (FlashInfer's HND)
  static constexpr paged_layout hnd(std::int32_t page_size, std::int32_t kv_heads, std::int32_t head_dim) noexcept {
    return {std::int64_t{page_size} * kv_heads * head_dim, std::int64_t{page_size} * head_dim, head_dim};
  }
};

// One contiguous region per sequence (kv_view).
template <class T>
struct contiguous_cache {
  T* k = nullptr;
  std::size_t k_size = 0;  // elements readable at k
  T* v = nullptr;
  std::size_t v_size = 0;
  kv_layout k_layout;
  kv_layout v_layout;
  const std::int32_t* lengths = nullptr;  // [batch] tokens held, read only
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t capacity = 0;  // slots per (sequence, head)
};

// A FlashInfer page table over a page pool (paged_kv_view): sequence b
// owns pages indices[indptr[b] .. indptr[b + 1]), the last holding
// last_page_len[b] tokens. Read only: compress reports new lengths, and
// shrink_page_table applies them once after the last layer.
template <class T>
struct paged_cache {
  T* k_pages = nullptr;
  std::size_t k_size = 0;  // elements readable at k_pages
  T* v_pages = nullptr;
  std::size_t v_size = 0;
  paged_layout k_layout;
  paged_layout v_layout;
  const std::int32_t* indptr = nullptr;  // [batch + 1]
  const std::int32_t* indices = nullptr;
  std::size_t indices_size = 0;                 // entries readable at indices (>= indptr[batch])
  const std::int32_t* last_page_len = nullptr;  // [batch]
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;               // pages in the pool (bounds the ids)
  std::int32_t max_pages_per_sequence = 0;  // bounds every sequence's page count
};

// A FlashInfer page table without K/V (token_table_view), for token-level
// eviction in an engine that owns its cache slots (llama.cpp's cells: page
// size 1, each sequence's cells in position order). Read only.
struct token_table {
  const std::int32_t* indptr = nullptr;  // [batch + 1]
  const std::int32_t* indices = nullptr;  // each sequence's slot (page) ids in position order
  std::size_t indices_size = 0;           // entries readable at indices (>= indptr[batch])
  const std::int32_t* last_page_len = nullptr;  // [batch]
  std::int32_t batch = 0;
  std::int32_t kv_heads = 0;
  std::int32_t page_size = 1;
  std::int32_t num_pages = 0;               // slots (pages) in the pool (bounds the ids)
  std::int32_t max_pages_per_sequence = 0;  // bounds every sequence's page count
};

// ---- what attention produced --------------------------------------------------
//
// Queries per sequence: q_len each (qo_indptr null), or FlashInfer's ragged
// qo_indptr[batch + 1] (the queries of b are tokens qo_indptr[b] ..
// qo_indptr[b + 1]; sequence_stride unused). Query j of sequence b is cache
// slot length(b) - q_len(b) + j (causal).

// Queries after RoPE, head_dim contiguous (query_view).
template <class T>
struct queries {
  const T* data = nullptr;
  std::size_t size = 0;  // elements
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;
  std::int32_t head_dim = 0;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  const std::int32_t* qo_indptr = nullptr;  // [batch + 1] ragged; null: q_len each

  // [batch][q_len][q_heads][head_dim]
  static constexpr queries dense(const T* data, std::size_t size, std::int32_t q_heads, std::int32_t q_len,
                                 std::int32_t head_dim) noexcept {
    return {data,     size,
            q_heads,  q_len,
            head_dim, std::int64_t{q_len} * q_heads * head_dim,
            head_dim, std::int64_t{q_heads} * head_dim,
            nullptr};
  }
  // [token][q_heads][head_dim], tokens as qo_indptr lists them
  static constexpr queries ragged(const T* data, std::size_t size, const std::int32_t* qo_indptr, std::int32_t q_heads,
                                  std::int32_t head_dim) noexcept {
    return {data, size, q_heads, 0, head_dim, 0, head_dim, std::int64_t{q_heads} * head_dim, qo_indptr};
  }
};

// FlashAttention: natural; FlashInfer: base 2. Named by the engine (no
// default): a present lse with `unspecified` is refused (invalid_argument).
enum class lse_base { unspecified, natural, base2 };

// What observe_queries checks of a given lse (lse_check in the C++20
// headers): sampled queries' exp(logit - lse) over their keys must sum to
// 1 within 5% (sums_to_one), or stay at or below it (at_most_one: the
// kernel's softmax had terms outside the cache, such as attention sinks);
// none turns the check off.
enum class lse_check { sums_to_one, at_most_one, none };

// The attention kernel's log-sum-exp of the scaled logits (lse_view). data
// null: the library computes the normaliser itself (one more read of K).
// A ragged lse must name the queries' qo_indptr array (the same pointer).
struct lse {
  const float* data = nullptr;
  std::size_t size = 0;
  lse_base base = lse_base::unspecified;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  const std::int32_t* qo_indptr = nullptr;
  lse_check check = lse_check::sums_to_one;

  // [batch][q_heads][q_len] (FlashAttention)
  static constexpr lse dense(const float* data, std::size_t size, std::int32_t q_heads, std::int32_t q_len,
                             lse_base base) noexcept {
    return {data, size, base, std::int64_t{q_heads} * q_len, q_len, 1, nullptr};
  }
  // [batch * q_len][q_heads] (FlashInfer, uniform q_len)
  static constexpr lse token_major(const float* data, std::size_t size, std::int32_t q_heads, std::int32_t q_len,
                                   lse_base base) noexcept {
    return {data, size, base, std::int64_t{q_len} * q_heads, 1, q_heads, nullptr};
  }
  // [token][q_heads] (FlashInfer, ragged)
  static constexpr lse ragged(const float* data, std::size_t size, const std::int32_t* qo_indptr, std::int32_t q_heads,
                              lse_base base) noexcept {
    return {data, size, base, 0, 1, q_heads, qo_indptr};
  }
};

// What a sliding window's width counts (attention::window_left_unit):
// cache slots (FlashInfer, FlashAttention) or logical positions
// (llama.cpp's mask, where eviction leaves holes between positions).
enum class window_unit { slots, positions };

// How the attention kernel formed its logits beyond plain causal softmax
// (attention_options): the logit of the query at slot i against the key
// at slot t is softmax_scale * q.k (+ alibi_slopes[qh] * (t - i)), soft-capped
// when logits_soft_cap > 0, and keys outside a sliding window of
// window_left (slots, or positions) get no attention. A model whose
// kernel did any of these must say so, or its scores are plain softmax's.
struct attention {
  float softmax_scale = 0.0f;            // 0: 1/sqrt(head_dim)
  std::int32_t window_left = -1;         // -1: no sliding window
  window_unit window_left_unit = window_unit::slots;
  float logits_soft_cap = 0.0f;          // 0: none
  const float* alibi_slopes = nullptr;   // [q_heads]; null: no ALiBi
  std::size_t alibi_slopes_size = 0;
};

// Attention probabilities, columns = cache slots, contiguous (probability_view).
struct probabilities {
  const float* data = nullptr;
  std::size_t size = 0;
  std::int32_t q_heads = 0;
  std::int32_t q_len = 0;
  std::int64_t sequence_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  const std::int32_t* qo_indptr = nullptr;  // [batch + 1] ragged; null: q_len each

  // [batch][q_heads][q_len][columns]
  static constexpr probabilities dense(const float* data, std::size_t size, std::int32_t q_heads, std::int32_t q_len,
                                       std::int32_t columns) noexcept {
    return {data,    size,   q_heads, q_len, std::int64_t{q_heads} * q_len * columns, std::int64_t{q_len} * columns,
            columns, nullptr};
  }
  // [token][q_heads][columns]
  static constexpr probabilities ragged(const float* data, std::size_t size, const std::int32_t* qo_indptr,
                                        std::int32_t q_heads, std::int32_t columns) noexcept {
    return {data, size, q_heads, 0, 0, columns, std::int64_t{q_heads} * columns, qo_indptr};
  }
};

// ---- the library's state and compress's outputs --------------------------------

struct state_shape {
  std::int32_t rows = 0;  // sequences the state holds at once
  std::int32_t kv_heads = 0;
  std::int32_t capacity = 0;    // slots per (row, head): state_capacity_for(budget, max_step_tokens)
  std::int32_t ring_words = 0;  // from the policy: make_state_shape fills it
};

// One layer's state: a caller-owned buffer, 256-byte aligned, of
// state_bytes(shape) bytes. state_rows maps this step's batch to rows
// (continuous batching; -1: a padding position with no token); null: row b.
struct state {
  void* buffer = nullptr;
  std::size_t bytes = 0;
  state_shape shape;
  const std::int32_t* state_rows = nullptr;  // [batch]

  constexpr state for_batch(const std::int32_t* rows_of_batch) const noexcept {
    state s = *this;
    s.state_rows = rows_of_batch;
    return s;
  }
};

// Token level (shared_layers): every layer's state back to back in one
// caller buffer, 256-byte aligned, of model_state_bytes(shape, layers)
// bytes; make_model_state fills layer_bytes. state_rows as state's.
struct model_state {
  void* buffer = nullptr;
  std::size_t bytes = 0;
  state_shape shape;
  std::int32_t layers = 0;
  std::size_t layer_bytes = 0;               // one layer's state bytes: make_model_state fills it
  const std::int32_t* state_rows = nullptr;  // [batch]

  // Layer l's state, seen through the same batch (admit, observe, compact, forget).
  // Not constexpr: a void* cannot be offset in a constant expression. For l
  // outside [0, layers) it is a state with no buffer, which every call
  // refuses (naming state.buffer and this bound) instead of reading past
  // the model's buffer.
  state layer(std::int32_t l) const noexcept {
    const bool inside = l >= 0 && l < layers;
    state s;
    s.buffer = buffer == nullptr || !inside
                   ? nullptr
                   : static_cast<unsigned char*>(buffer) + layer_bytes * static_cast<std::size_t>(l);
    s.bytes = inside ? layer_bytes : 0;
    s.shape = shape;
    s.state_rows = state_rows;
    return s;
  }
  constexpr model_state for_batch(const std::int32_t* rows_of_batch) const noexcept {
    model_state m = *this;
    m.state_rows = rows_of_batch;
    return m;
  }
};

// compress writes every sequence's new length, and (paged: required;
// contiguous: optional, null) how many trailing pages of its list are empty.
struct compress_output {
  std::int32_t* new_lengths = nullptr;  // [batch]
  std::int32_t* freed_pages = nullptr;  // [batch]
};

// What select writes (eviction_selection): per sequence, the slots that
// leave and its length afterwards; stride >= max_evictions(shape.capacity,
// budget, m). select moves nothing. Either the engine frees cache_slots in
// its allocator, removes them from each sequence's list keeping the others'
// order, and calls forget for every layer; or it calls compact for every
// layer, which moves the kept K/V rows into the holes, and then applies
// out.new_lengths (freeing each sequence's trailing slots).
struct selection {
  std::int32_t stride = 0;
  std::int32_t* counts = nullptr;       // [batch] slots evicted from sequence b
  std::int32_t* slots = nullptr;        // [batch * stride] token indices, ascending per sequence
  std::int32_t* cache_slots = nullptr;  // optional [batch * stride]: indices[...] * page_size + offset (the cell)
  compress_output out;                  // new_lengths [batch] (required), freed_pages [batch] (optional at page size 1)
};

// Each token's eviction score before the layers are combined
// (partial_scores): value (layer l, sequence b, slot t) at
// values[(l * batch + b) * capacity + t], capacity the state's; slots past
// a sequence's length and sequences below the budget hold the head
// reduction's identity. What select ranks, for an engine that compares or
// all-reduces scores (tensor parallelism) before selecting.
struct partial_scores {
  float* values = nullptr;
  std::size_t size = 0;        // floats at values (>= layers * batch * capacity)
  std::int32_t layers = 0;
  std::int32_t batch = 0;
  std::int32_t capacity = 0;   // the state's shape.capacity
  std::int32_t kv_heads = 0;   // KV heads of a layer over all ranks (the mean's divisor)
};

// A FlashInfer page table the engine owns and shrink_page_table rewrites.
struct page_table {
  std::int32_t* indptr = nullptr;  // [batch + 1]
  std::int32_t* indices = nullptr;
  std::size_t indices_size = 0;
  std::int32_t* last_page_len = nullptr;  // [batch]
  std::int32_t batch = 0;
  std::int32_t page_size = 0;
};

// ---- data-independent helpers (the same formulas as the library's) ----------------

// The length a sequence has after compress: the engine can mirror lengths
// on the host without reading anything back.
constexpr std::int32_t length_after_compress(std::int32_t length, std::int32_t budget,
                                             std::int32_t evict_count) noexcept {
  return length >= budget ? budget - evict_count : length;
}

// State slots per (row, head) for a budget and the most tokens appended
// between two compress calls (1 when decoding, the chunk size for prefill).
constexpr std::int32_t state_capacity_for(std::int32_t budget, std::int32_t max_step_tokens) noexcept {
  return budget + max_step_tokens - 1;
}

// Entries per sequence a selection needs (select's stride): the most
// tokens one sequence can lose in a call; 0 when the capacity never reaches
// the budget.
constexpr std::int32_t max_evictions(std::int32_t state_capacity, std::int32_t budget,
                                     std::int32_t evict_count) noexcept {
  const std::int64_t e = std::int64_t{state_capacity} - budget + evict_count;
  return e > 0 ? static_cast<std::int32_t>(e > INT32_MAX ? INT32_MAX : e) : 0;
}

}  // namespace scissorhands::bridge

// Declares, in namespace `ns` (no leading ::, nesting allowed:
// engine::sh_f32), the functions of one instantiation for cache elements of
// type Element (queries have the same type). Every one is noexcept; each
// name matches the C++20 entry point it forwards to (host:: backend), with
// the same argument order. Expand it in a header the engine shares, which
// the C++20 TU includes too: its SCISSORHANDS_BRIDGE_DEFINE defines these
// by qualified name, so a definition that drifts from them cannot compile.
//
//   default_settings(&settings)                   the policy's own settings (its preset's numbers):
//                                                 every other call refuses settings it did not fill
//   make_state_shape(settings, rows, kv_heads, capacity, &shape)  ring_words from the policy
//   state_bytes(shape, &bytes)                    bytes of one layer's state buffer
//   make_state(buffer, bytes, shape, &state)      checks the buffer, fills the descriptor
//   reset_state(state), reset_sequence(state, row, start_position)
//   admit / observe_probabilities / observe_queries(settings, cache, state, ...)
//   compress_workspace_bytes(cache[, state shape]) cannot fail (with the shape:
//                                                 sized by the state's capacity)
//   compress(settings, cache, state, budget, workspace, workspace_bytes, out)
//   shrink_page_table(table, new_lengths, released, released_capacity, &released_count)
#define SCISSORHANDS_BRIDGE_DECLARE(ns, Element)                                                                      \
  namespace ns {                                                                                                      \
  using element_type = Element;                                                                                       \
  using contiguous_cache = ::scissorhands::bridge::contiguous_cache<Element>;                                         \
  using paged_cache = ::scissorhands::bridge::paged_cache<Element>;                                                   \
  using queries = ::scissorhands::bridge::queries<Element>;                                                           \
  ::scissorhands::bridge::error default_settings(::scissorhands::bridge::settings* settings) noexcept;                 \
  ::scissorhands::bridge::error make_state_shape(const ::scissorhands::bridge::settings& settings, std::int32_t rows, \
                                                 std::int32_t kv_heads, std::int32_t capacity,                        \
                                                 ::scissorhands::bridge::state_shape* shape) noexcept;                \
  ::scissorhands::bridge::error state_bytes(const ::scissorhands::bridge::state_shape& shape,                         \
                                            std::size_t* bytes) noexcept;                                             \
  ::scissorhands::bridge::error make_state(void* buffer, std::size_t bytes,                                           \
                                           const ::scissorhands::bridge::state_shape& shape,                          \
                                           ::scissorhands::bridge::state* state) noexcept;                            \
  ::scissorhands::bridge::error reset_state(const ::scissorhands::bridge::state& state) noexcept;                     \
  ::scissorhands::bridge::error reset_sequence(const ::scissorhands::bridge::state& state, std::int32_t row,          \
                                               std::int32_t start_position = 0) noexcept;                             \
  ::scissorhands::bridge::error admit(const ::scissorhands::bridge::settings& settings,                               \
                                      const ::scissorhands::bridge::contiguous_cache<Element>& cache,                 \
                                      const ::scissorhands::bridge::state& state) noexcept;                           \
  ::scissorhands::bridge::error admit(const ::scissorhands::bridge::settings& settings,                               \
                                      const ::scissorhands::bridge::paged_cache<Element>& cache,                      \
                                      const ::scissorhands::bridge::state& state) noexcept;                           \
  ::scissorhands::bridge::error observe_probabilities(const ::scissorhands::bridge::settings& settings,               \
                                                      const ::scissorhands::bridge::contiguous_cache<Element>& cache, \
                                                      const ::scissorhands::bridge::state& state,                     \
                                                      const ::scissorhands::bridge::probabilities& probs) noexcept;   \
  ::scissorhands::bridge::error observe_probabilities(const ::scissorhands::bridge::settings& settings,               \
                                                      const ::scissorhands::bridge::paged_cache<Element>& cache,      \
                                                      const ::scissorhands::bridge::state& state,                     \
                                                      const ::scissorhands::bridge::probabilities& probs) noexcept;   \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                     \
                                                const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
                                                const ::scissorhands::bridge::state& state,                           \
                                                const ::scissorhands::bridge::queries<Element>& queries,              \
                                                const ::scissorhands::bridge::lse& lse = {},                          \
                                                float softmax_scale = 0.0f) noexcept;                                 \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                     \
                                                const ::scissorhands::bridge::paged_cache<Element>& cache,            \
                                                const ::scissorhands::bridge::state& state,                           \
                                                const ::scissorhands::bridge::queries<Element>& queries,              \
                                                const ::scissorhands::bridge::lse& lse = {},                          \
                                                float softmax_scale = 0.0f) noexcept;                                 \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                     \
                                                const ::scissorhands::bridge::contiguous_cache<Element>& cache,       \
                                                const ::scissorhands::bridge::state& state,                           \
                                                const ::scissorhands::bridge::queries<Element>& queries,              \
                                                const ::scissorhands::bridge::lse& lse,                               \
                                                const ::scissorhands::bridge::attention& attention) noexcept;         \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                     \
                                                const ::scissorhands::bridge::paged_cache<Element>& cache,            \
                                                const ::scissorhands::bridge::state& state,                           \
                                                const ::scissorhands::bridge::queries<Element>& queries,              \
                                                const ::scissorhands::bridge::lse& lse,                               \
                                                const ::scissorhands::bridge::attention& attention) noexcept;         \
  std::size_t compress_workspace_bytes(const ::scissorhands::bridge::contiguous_cache<Element>& cache) noexcept;      \
  std::size_t compress_workspace_bytes(const ::scissorhands::bridge::paged_cache<Element>& cache) noexcept;           \
  std::size_t compress_workspace_bytes(const ::scissorhands::bridge::contiguous_cache<Element>& cache,                \
                                       const ::scissorhands::bridge::state_shape& shape) noexcept;                    \
  std::size_t compress_workspace_bytes(const ::scissorhands::bridge::paged_cache<Element>& cache,                     \
                                       const ::scissorhands::bridge::state_shape& shape) noexcept;                    \
  ::scissorhands::bridge::error compress(const ::scissorhands::bridge::settings& settings,                            \
                                         const ::scissorhands::bridge::contiguous_cache<Element>& cache,              \
                                         const ::scissorhands::bridge::state& state, std::int32_t budget,             \
                                         void* workspace, std::size_t workspace_bytes,                                \
                                         const ::scissorhands::bridge::compress_output& out) noexcept;                \
  ::scissorhands::bridge::error compress(const ::scissorhands::bridge::settings& settings,                            \
                                         const ::scissorhands::bridge::paged_cache<Element>& cache,                   \
                                         const ::scissorhands::bridge::state& state, std::int32_t budget,             \
                                         void* workspace, std::size_t workspace_bytes,                                \
                                         const ::scissorhands::bridge::compress_output& out) noexcept;                \
  ::scissorhands::bridge::error shrink_page_table(const ::scissorhands::bridge::page_table& table,                    \
                                                  const std::int32_t* new_lengths, std::int32_t* released,            \
                                                  std::size_t released_capacity,                                      \
                                                  std::size_t* released_count) noexcept;                              \
  }                                                                                                                   \
  static_assert(true, "SCISSORHANDS_BRIDGE_DECLARE(...) takes a trailing semicolon")


// Declares, in namespace `ns`, the token-level (shared_layers) functions of
// one policy: one choice of slots per sequence for every layer. Per step,
// admit or observe every layer (model.layer(l) seen through the batch),
// select once, then one of two endings, with the table as it was before
// anything is removed:
//   - forget, for an engine that owns its cache slots and moves its rows
//     itself (llama.cpp's cells): it frees the chosen cache_slots, keeps the
//     rest of each sequence's list in order, then forgets every layer (the
//     state drops the same slots, in order; K and V are not touched) and
//     applies new_lengths.
//   - compact, for an engine whose K/V rows the library moves (a block table,
//     vLLM's way): compact every layer with that layer's K and V; the library
//     moves the kept rows of K, V and the state into the holes
//     (settings.compaction_mode) and leaves the table alone; then the engine
//     applies new_lengths once: sequence b keeps its first new_lengths[b]
//     slots, and trailing pages left empty are freed (at page size 1, the
//     cells past new_lengths[b]).
// Use its own namespace (not one SCISSORHANDS_BRIDGE_DECLARE also uses).
//
//   default_settings(&settings)                   the policy's own defaults (its preset's numbers)
//   make_state_shape(settings, rows, kv_heads, capacity, &shape)  ring_words from the policy
//   model_state_bytes(shape, layers, &bytes)      bytes of the whole model's state buffer
//   make_model_state(buffer, bytes, shape, layers, &model)
//   reset_state(model), reset_sequence(model, row, start_position)  every layer
//   admit / observe_probabilities(settings, table, model.layer(l), ...)
//   observe_queries(settings, keys, model.layer(l), queries, lse, attention)
//                                                 a FlashAttention engine: the scores recomputed
//                                                 from its queries and its K cells, as a page-size-1
//                                                 paged_cache<float or fp16_bits> (cells as pages, the
//                                                 same indptr/indices as the table; V may be absent:
//                                                 v_pages null, v_size 0); queries fp32
//   local_scores(settings, table, model, budget, partial)  each token's score per layer, before the
//                                                 layers are combined (what select ranks)
//   select_workspace_bytes(table, shape)          cannot fail
//   select(settings, table, model, budget, workspace, workspace_bytes, selection, pinned_prefix)
//   compact_workspace_bytes(cache)                cannot fail (a byte per pool page: cache.num_pages)
//   compact(settings, cache, model.layer(l), selection, workspace, workspace_bytes)
//                                                 the layer's K and V as a paged_cache<float or
//                                                 fp16_bits> over the table's indptr/indices/page
//                                                 size (llama.cpp-like cells: page size 1); V is
//                                                 required (refused: cache.v_pages)
//   forget(settings, table, model.layer(l), selection)
#define SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(ns)                                                                    \
  namespace ns {                                                                                                       \
  ::scissorhands::bridge::error default_settings(::scissorhands::bridge::settings* settings) noexcept;                 \
  ::scissorhands::bridge::error make_state_shape(const ::scissorhands::bridge::settings& settings, std::int32_t rows,  \
                                                 std::int32_t kv_heads, std::int32_t capacity,                         \
                                                 ::scissorhands::bridge::state_shape* shape) noexcept;                 \
  ::scissorhands::bridge::error model_state_bytes(const ::scissorhands::bridge::state_shape& shape,                    \
                                                  std::int32_t layers, std::size_t* bytes) noexcept;                   \
  ::scissorhands::bridge::error make_model_state(void* buffer, std::size_t bytes,                                      \
                                                 const ::scissorhands::bridge::state_shape& shape,                     \
                                                 std::int32_t layers,                                                  \
                                                 ::scissorhands::bridge::model_state* model) noexcept;                 \
  ::scissorhands::bridge::error reset_state(const ::scissorhands::bridge::model_state& model) noexcept;                \
  ::scissorhands::bridge::error reset_sequence(const ::scissorhands::bridge::model_state& model, std::int32_t row,     \
                                               std::int32_t start_position = 0) noexcept;                              \
  ::scissorhands::bridge::error admit(const ::scissorhands::bridge::settings& settings,                                \
                                      const ::scissorhands::bridge::token_table& table,                                \
                                      const ::scissorhands::bridge::state& state) noexcept;                            \
  ::scissorhands::bridge::error observe_probabilities(const ::scissorhands::bridge::settings& settings,                \
                                                      const ::scissorhands::bridge::token_table& table,                \
                                                      const ::scissorhands::bridge::state& state,                      \
                                                      const ::scissorhands::bridge::probabilities& probs) noexcept;    \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                      \
                                                const ::scissorhands::bridge::paged_cache<float>& keys,                \
                                                const ::scissorhands::bridge::state& state,                            \
                                                const ::scissorhands::bridge::queries<float>& queries,                 \
                                                const ::scissorhands::bridge::lse& lse,                                \
                                                const ::scissorhands::bridge::attention& attention) noexcept;          \
  ::scissorhands::bridge::error observe_queries(const ::scissorhands::bridge::settings& settings,                      \
                                                const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& keys, \
                                                const ::scissorhands::bridge::state& state,                            \
                                                const ::scissorhands::bridge::queries<float>& queries,                 \
                                                const ::scissorhands::bridge::lse& lse,                                \
                                                const ::scissorhands::bridge::attention& attention) noexcept;          \
  ::scissorhands::bridge::error local_scores(const ::scissorhands::bridge::settings& settings,                         \
                                             const ::scissorhands::bridge::token_table& table,                         \
                                             const ::scissorhands::bridge::model_state& model, std::int32_t budget,    \
                                             const ::scissorhands::bridge::partial_scores& partial) noexcept;          \
  std::size_t select_workspace_bytes(const ::scissorhands::bridge::token_table& table,                                 \
                                     const ::scissorhands::bridge::state_shape& shape) noexcept;                       \
  ::scissorhands::bridge::error select(const ::scissorhands::bridge::settings& settings,                               \
                                       const ::scissorhands::bridge::token_table& table,                               \
                                       const ::scissorhands::bridge::model_state& model, std::int32_t budget,          \
                                       void* workspace, std::size_t workspace_bytes,                                   \
                                       const ::scissorhands::bridge::selection& selection,                             \
                                       const std::int32_t* pinned_prefix = nullptr) noexcept;                          \
  std::size_t compact_workspace_bytes(const ::scissorhands::bridge::paged_cache<float>& cache) noexcept;               \
  std::size_t compact_workspace_bytes(                                                                                 \
      const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& cache) noexcept;                   \
  ::scissorhands::bridge::error compact(const ::scissorhands::bridge::settings& settings,                              \
                                        const ::scissorhands::bridge::paged_cache<float>& cache,                       \
                                        const ::scissorhands::bridge::state& state,                                    \
                                        const ::scissorhands::bridge::selection& selection, void* workspace,           \
                                        std::size_t workspace_bytes) noexcept;                                         \
  ::scissorhands::bridge::error compact(                                                                               \
      const ::scissorhands::bridge::settings& settings,                                                                \
      const ::scissorhands::bridge::paged_cache<::scissorhands::bridge::fp16_bits>& cache,                             \
      const ::scissorhands::bridge::state& state, const ::scissorhands::bridge::selection& selection,                  \
      void* workspace, std::size_t workspace_bytes) noexcept;                                                          \
  ::scissorhands::bridge::error forget(const ::scissorhands::bridge::settings& settings,                               \
                                       const ::scissorhands::bridge::token_table& table,                               \
                                       const ::scissorhands::bridge::state& state,                                     \
                                       const ::scissorhands::bridge::selection& selection) noexcept;                   \
  }                                                                                                                    \
  static_assert(true, "SCISSORHANDS_BRIDGE_DECLARE_TOKEN_LEVEL(...) takes a trailing semicolon")
