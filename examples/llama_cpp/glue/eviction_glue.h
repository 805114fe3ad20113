#pragma once
// The eviction glue between llama.cpp and scissorhands, written as it could
// live inside llama.cpp: C++17, no exceptions across it, the library reached
// through its C++17 bridge only (presets.h). A small library
// (scissorhands_llama_cpp_glue) that the CLI and a llama-server patch link.
//
// Per llama_decode (docs/llama_cpp.md has the protocol):
//   before the decode (before_decode): the batch's sequences and positions,
//     checked against what llama.cpp holds;
//   during the graph (cb_eval), per ubatch: each layer's K write node
//     updates the cell map of its cache; each scored layer is observed into
//     the library's model_state, one row per sequence (shared_layers: one
//     choice of cells for every layer and head):
//       flash attention on (FLASH_ATTN_EXT): the library recomputes the
//         scores from the node's queries and the K cells (observe_queries,
//         a sliding-window layer's window measured in positions);
//       flash attention off (kq_soft_max-<il>): llama.cpp's probabilities,
//         gathered from cells into each sequence's slot order;
//     the mask's visible cells are compared with the cell maps;
//   after the decode (after_decode): llama.cpp's counts against the maps;
//   at the budget (evict): select once for every sequence at its budget,
//     llama_memory_seq_rm each chosen position, forget on every observed layer.
// Any disagreement with llama.cpp stops the run with a message: a changed
// graph name or cache rule must never evict the wrong token.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cell_map.h"
#include "llama.h"
#include "presets.h"

struct ggml_tensor;

namespace sh_llama {

// Which layers' attention counts towards a token's score.
enum class scored_layers {
  all,     // every layer (a sliding-window layer gives 0 to tokens outside its window)
  global,  // full-attention layers only (all of them in a model without sliding windows)
};

// Where the scores come from.
enum class attention_source {
  automatic,      // as the context computes attention (llama.cpp's default, AUTO, turns flash attention on)
  queries,        // flash attention on: recomputed from the queries and the K cells
  probabilities,  // flash attention off: llama.cpp's kq_soft_max (the reference)
};

// Which layers of `model` attend through a sliding window (1) and which
// see every cell (0): the GGUF's window with llama.cpp's own layout for
// gemma2/gemma3, or `global_layers` when given. Empty with `*error` set when
// neither says.
std::vector<char> sliding_layers(const llama_model* model, const std::vector<std::int32_t>& global_layers,
                                 std::string* error);

struct glue_options {
  std::int32_t budget = 0;           // evict() brings a sequence holding budget or more cells to budget - m
  std::int32_t max_step_tokens = 1;  // most tokens one llama_decode appends to one sequence
  std::int32_t capacity = 0;         // most tokens a sequence holds at once; 0: budget + max_step_tokens - 1
  std::int32_t sequences = 1;        // sequence ids 0 .. sequences - 1 (the context's n_seq_max, up to 8)
  scored_layers scores = scored_layers::all;
  attention_source source = attention_source::automatic;
  std::vector<std::int32_t> global_layers;  // sliding-window models: the full-attention layers (empty: by architecture)
  bool check_every_layer = false;           // mask check on every layer, not one layer per cache and ubatch
  bool record_evictions = false;            // keep every evicted position (evicted_positions)
  // Flash attention off: also observe every layer from the queries and K
  // cells llama.cpp multiplied, into a second state (the flash-attention
  // path's observation of the same inputs): choose(…, true) and
  // eviction_scores(…, true) read it; evictions apply to both.
  bool shadow_queries = false;
  // Observe only the ubatches whose newest position is at least this (SnapKV:
  // the prompt's last queries, given as a ubatch of their own); 0: every one.
  llama_pos observe_from = 0;
  // One sequence, flash attention off: called for every layer and ubatch
  // with its attention in the library's dense layout [head][query][slot]
  // (slot t: positions()[t]; 0 where the layer cannot see the slot): what
  // the persistence measurement reads.
  std::function<void(std::int32_t layer, const float* probabilities, std::int32_t heads, std::int32_t queries,
                     std::int32_t slots)>
      on_attention;
};

class eviction_glue {
 public:
  // `policy` null: observe nothing and never evict (the reads-only check:
  // the callback reads tensors, checks the maps, writes nothing).
  eviction_glue(const llama_model* model, const preset* policy, const bridge::settings& settings,
                const glue_options& options);
  eviction_glue(const eviction_glue&) = delete;
  eviction_glue& operator=(const eviction_glue&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // Before llama_init_from_model: the callback, n_seq_max, flash attention
  // as options.source says (automatic leaves the caller's choice). A K cache
  // type the flash-attention path cannot read is refused here (ok() false).
  void configure(llama_context_params& params);
  // After llama_init_from_model; refuses a context it cannot serve.
  bool attach(llama_context* ctx);
  // Before every llama_decode: which sequence and position each token has.
  // Refuses a sequence id outside 0 .. sequences - 1, a token of several
  // sequences, positions that do not continue a sequence, more than
  // max_step_tokens for one sequence, and a sequence llama.cpp holds that
  // the glue never saw (llama_memory_seq_cp). A sequence llama.cpp no
  // longer holds at all (llama_memory_seq_rm(seq, -1, -1)) is forgotten.
  bool before_decode(const llama_batch& batch);
  // After every successful llama_decode: llama.cpp's counts against the maps.
  bool after_decode();
  // Every sequence holding its budget or more: select once, remove each
  // chosen position (llama_memory_seq_rm), forget on every observed layer.
  bool evict();
  // The sequence ends: llama_memory_seq_rm(seq, -1, -1) and the glue forgets it.
  bool end_sequence(llama_seq_id seq);
  // What evict() would remove, per sequence (positions ascending; empty
  // below the budget), without removing anything.
  bool choose(std::vector<std::vector<llama_pos>>* chosen, bool shadow = false);
  // Removes the given positions (per sequence, ascending, held and not
  // protected) as evict() removes its own choice: an engine's choice, or
  // another glue's in a comparison.
  bool evict_positions(const std::vector<std::vector<llama_pos>>& positions);
  // Every sequence at its budget: each token's score per observed layer
  // before the layers are combined (what select ranks), [layer][sequence at
  // budget][slot], slots past a sequence's length 0; *sequences lists them.
  bool eviction_scores(std::vector<float>* values, std::vector<llama_seq_id>* sequences, bool shadow = false);

  const std::vector<llama_pos>& positions(llama_seq_id seq = 0) const;  // held positions, ascending
  std::int32_t held(llama_seq_id seq = 0) const { return static_cast<std::int32_t>(positions(seq).size()); }
  // Every position evicted from the sequence, in eviction order (record_evictions).
  const std::vector<llama_pos>& evicted_positions(llama_seq_id seq = 0) const;
  std::int64_t evicted() const { return evicted_; }
  std::int64_t mask_checks() const { return mask_checks_; }
  std::int64_t ubatches() const { return ubatch_; }
  // Which path observed the last ubatch: 1 flash attention (queries), 0 probabilities, -1 none yet.
  int flash_attention() const { return flash_attention_; }
  double library_seconds() const { return library_seconds_; }    // gather + observe + select + forget
  double removal_seconds() const { return removal_seconds_; }    // llama_memory_seq_rm calls
  double callback_seconds() const { return callback_seconds_; }  // everything inside cb_eval
  double evict_seconds() const { return evict_seconds_; }        // everything inside evict()
  bool is_sliding(std::int32_t layer) const { return sliding_[static_cast<std::size_t>(layer)] != 0; }
  std::int32_t scored_layer_count() const { return static_cast<std::int32_t>(scored_.size()); }
  std::int32_t window() const { return n_swa_; }  // sliding-window layers' n_swa (0: none)
  // The positions the current ubatch appends (valid inside on_attention).
  const std::vector<llama_pos>& ubatch_positions() const { return current_.positions; }

 private:
  // The tokens of the ubatch being computed: sequence and position of each
  // (in llama.cpp's ubatch order), the sequences it touches (first seen
  // first), and each token's index among its sequence's queries.
  struct ubatch_tokens {
    std::vector<llama_seq_id> seqs;
    std::vector<llama_pos> positions;
    std::vector<std::int64_t> cells[2];  // the destination cells per cache (owner layer's write)
    std::vector<llama_seq_id> sequences;
    std::vector<std::int32_t> qo_indptr;  // per sequence of `sequences`, + 1
    std::vector<std::int32_t> order;      // ubatch token of each query, sequence-major
    std::int32_t streams = 1;             // streams the graph's attention views span
    llama_seq_id first_stream = 0;
  };
  // Per cache, for each sequence of the ubatch, the cell of each held slot
  // (-1: the slot's position is not in this cache, e.g. outside a sliding
  // window), built once per cache and ubatch.
  struct slot_cells {
    std::int64_t ubatch = -1;
    std::vector<std::vector<std::int32_t>> of_sequence;  // [index in ubatch.sequences][slot]
  };

  static bool callback(ggml_tensor* t, bool ask, void* self);
  bool on_k_write(ggml_tensor* t, std::int32_t layer);
  bool start_ubatch(std::size_t n, std::int64_t cells_per_stream);
  bool on_attention_node(ggml_tensor* t, std::int32_t layer, bool flash);
  bool observe_queries(const ggml_tensor* t, std::int32_t layer, std::int32_t cache);
  bool observe_probabilities(const ggml_tensor* t, std::int32_t layer, std::int32_t cache);
  // observe_queries into `into` from the queries q ([head_dim, tokens, heads,
  // streams], F32) and the K cache view k; params: scale, ALiBi max_bias,
  // logit soft-cap.
  bool observe_keys(const ggml_tensor* q, const ggml_tensor* k, const float* params, std::int32_t layer,
                    std::int32_t cache, const bridge::model_state& into, const std::string& where);
  bool check_mask(const ggml_tensor* mask, std::int32_t layer, std::int64_t n_kv, std::int64_t tokens_per_stream,
                  std::int32_t streams);
  const slot_cells& cells_of_slots(std::int32_t cache);
  bool fail(std::string message);
  bool library(const char* what, const bridge::error& e);
  bool forget_sequence(llama_seq_id seq);
  bool check_key_type();
  // The sequences at their budget (rows_) and their full-attention cells in
  // position order as a page-size-1 table over indptr_/indices_.
  bridge::token_table budget_table();
  // The page-size-1 table over rows_, indptr_, indices_ and last_page_len_.
  bridge::token_table rows_table(std::int32_t num_pages) const;
  // Removes counts_/slots_ from llama.cpp, the maps and every observed
  // layer's state (forget with `table`, the table of before the removal).
  bool apply_selection(const bridge::token_table& table, const bridge::selection& selection, bool check_cells);
  bridge::selection selection_buffers();
  bridge::state layer_state(std::int32_t layer) const;
  std::int32_t stream_of(std::int32_t cache, std::int64_t cell) const;

  const preset* policy_;
  bridge::settings settings_;
  glue_options options_;
  std::int32_t n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, n_swa_ = 0;
  std::vector<char> sliding_;                 // per layer: sliding-window attention
  std::vector<std::int32_t> scored_;          // layers observed, in order; index in the model_state = position here
  std::vector<std::int32_t> model_layer_of_;  // per layer: its index in the model_state, -1 if not scored
  std::int32_t owner_[2] = {-1, -1};          // per cache (0: full attention, 1: sliding window): the layer that updates its map
  std::int32_t first_layer_ = 0;              // the first layer with a K write: a ubatch starts there
  cell_map caches_[2];
  std::int64_t cells_per_stream_[2] = {0, 0};
  std::vector<std::int64_t> last_cells_[2];
  slot_cells slot_cells_[2];
  ubatch_tokens current_;
  std::int64_t ubatch_ = 0;  // ubatches seen
  std::int64_t checked_ubatch_[2] = {-1, -1};
  int flash_attention_ = -1;

  // configure() and attach()
  bool configured_ = false;
  ggml_type type_k_ = GGML_TYPE_F16, type_v_ = GGML_TYPE_F16;
  llama_flash_attn_type flash_type_ = LLAMA_FLASH_ATTN_TYPE_AUTO;
  std::int32_t streams_ = 1;  // 1: unified cache; sequences: one stream per sequence
  llama_context* ctx_ = nullptr;
  llama_memory_t memory_ = nullptr;

  // the batch before_decode saw: per token its sequence and position; how
  // far the ubatches have consumed it (in order, or per sequence with streams)
  std::vector<llama_seq_id> batch_seqs_;
  std::vector<llama_pos> batch_positions_;
  std::vector<std::vector<std::int32_t>> batch_of_sequence_;  // [seq]: batch indices in order
  std::vector<std::int32_t> sequence_cursor_;
  std::size_t consumed_ = 0;
  bool batch_open_ = false;

  std::vector<std::vector<llama_pos>> held_;     // [seq]: positions, ascending; slot t holds held_[seq][t]
  std::vector<std::vector<llama_pos>> evicted_log_;

  // library state
  bridge::state_shape shape_;
  std::vector<unsigned char> model_buffer_;  // over-allocated: the state starts 256-byte aligned inside
  bridge::model_state model_;
  std::vector<unsigned char> shadow_buffer_;  // shadow_queries: the flash-attention path's state
  bridge::model_state shadow_;
  std::vector<unsigned char> workspace_;
  // scratch of the hot path, kept between calls
  std::vector<float> gathered_, queries_, dense_;
  std::vector<std::int32_t> rows_, indptr_, indices_, last_page_len_;
  std::vector<std::int64_t> cells_scratch_;
  std::vector<std::int32_t> positions_scratch_;
  std::vector<std::uint16_t> mask16_;
  std::vector<float> mask32_;
  std::int32_t stride_ = 0;
  std::vector<std::int32_t> counts_, slots_, cache_slots_, new_lengths_, freed_pages_;

  std::int64_t evicted_ = 0, mask_checks_ = 0;
  double library_seconds_ = 0, removal_seconds_ = 0, callback_seconds_ = 0, evict_seconds_ = 0;
  std::string error_;
};

}  // namespace sh_llama
