#pragma once
// The eviction glue between llama.cpp and scissorhands, written as it could
// live inside llama.cpp: C++17, no exceptions across it, the library reached
// through its C++17 bridge only (presets.h). One sequence (seq_id 0).
//
// Per llama_decode (docs/llama_cpp.md has the protocol):
//   during the graph (cb_eval): each layer's K write node updates the cell
//     map of its cache; each layer's kq_soft_max-<il> (flash attention off)
//     is gathered from cells into the sequence's slot order and observed into
//     the library's model_state (shared_layers: one choice for every layer);
//     the mask's visible cells are compared with the cell map;
//   after the decode (after_decode): llama.cpp's own counts are compared with
//     the map; at the budget, select once, llama_memory_seq_rm each chosen
//     position, forget on every observed layer.
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

// Which layers of `model` attend through a sliding window (1) and which
// see every cell (0): the GGUF's window with llama.cpp's own layout for
// gemma2/gemma3, or `global_layers` when given. Empty with `*error` set when
// neither says.
std::vector<char> sliding_layers(const llama_model* model, const std::vector<std::int32_t>& global_layers,
                                 std::string* error);

struct glue_options {
  std::int32_t budget = 0;           // evict() brings a sequence holding budget or more cells to budget - m
  std::int32_t max_step_tokens = 1;  // most tokens one llama_decode appends (n_ubatch)
  std::int32_t capacity = 0;         // most tokens held at once (the library's state capacity); 0: budget + step - 1
  scored_layers scores = scored_layers::all;
  std::vector<std::int32_t> global_layers;  // sliding-window models: the full-attention layers (empty: by architecture)
  bool check_every_layer = false;           // mask check on every layer, not one layer per cache
  // Observe only the ubatches whose newest position is at least this (SnapKV:
  // the prompt's last queries, given as a ubatch of their own); 0: every one.
  llama_pos observe_from = 0;
  // Called for every layer and ubatch with its attention in the library's
  // dense layout [head][query][slot] (slot t: positions()[t]; 0 where the
  // layer cannot see the slot): what the persistence measurement reads.
  std::function<void(std::int32_t layer, const float* probabilities, std::int32_t heads, std::int32_t queries,
                     std::int32_t slots)>
      on_attention;
};

class eviction_glue {
 public:
  // `policy` null: observe nothing and never evict (the reads-only check:
  // the callback reads tensors, checks the map, writes nothing).
  eviction_glue(const llama_model* model, const preset* policy, const bridge::settings& settings,
                const glue_options& options);
  eviction_glue(const eviction_glue&) = delete;
  eviction_glue& operator=(const eviction_glue&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // Before llama_init_from_model: flash attention off (no probabilities
  // exist otherwise), the callback, the ubatch size.
  void configure(llama_context_params& params);
  // After llama_init_from_model; refuses a context it cannot serve.
  bool attach(llama_context* ctx);
  // After every successful llama_decode of seq 0: llama.cpp's counts against the map.
  bool after_decode();
  // At the budget: select once, llama_memory_seq_rm each chosen position,
  // forget on every observed layer. Below it: nothing.
  bool evict();
  bool evict_once();

  const std::vector<llama_pos>& positions() const { return held_; }  // held positions, ascending
  std::int32_t held() const { return static_cast<std::int32_t>(held_.size()); }
  std::int64_t evicted() const { return evicted_; }
  std::int64_t mask_checks() const { return mask_checks_; }
  double library_seconds() const { return library_seconds_; }    // gather + observe + select + forget
  double removal_seconds() const { return removal_seconds_; }    // llama_memory_seq_rm calls
  double callback_seconds() const { return callback_seconds_; }  // everything inside cb_eval
  double evict_seconds() const { return evict_seconds_; }        // everything inside evict()
  bool is_sliding(std::int32_t layer) const { return sliding_[static_cast<std::size_t>(layer)] != 0; }
  std::int32_t scored_layer_count() const { return static_cast<std::int32_t>(scored_.size()); }
  std::int32_t window() const { return n_swa_; }  // sliding-window layers' n_swa (0: none)
  // The positions the current ubatch appends (valid inside on_attention).
  const std::vector<llama_pos>& ubatch_positions() const { return ubatch_positions_; }

 private:
  static bool callback(ggml_tensor* t, bool ask, void* self);
  bool on_k_write(ggml_tensor* t, std::int32_t layer);
  bool on_probabilities(ggml_tensor* t, std::int32_t layer);
  bool check_mask(const ggml_tensor* mask, std::int32_t layer, std::int64_t n_kv, std::int64_t n_tokens);
  bool fail(std::string message);
  bool library(const char* what, const bridge::error& e);
  bridge::token_table table(const std::vector<std::int32_t>& indices);
  bridge::state layer_state(std::int32_t layer) const;

  const preset* policy_;
  bridge::settings settings_;
  glue_options options_;
  std::int32_t n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, n_swa_ = 0;
  std::vector<char> sliding_;           // per layer: sliding-window attention
  std::vector<std::int32_t> scored_;    // layers observed, in order; index in the model_state = position here
  std::vector<std::int32_t> model_layer_of_;  // per layer: its index in the model_state, -1 if not scored
  std::int32_t owner_[2] = {-1, -1};    // per cache (0: full attention, 1: sliding window): the layer that updates its map
  cell_map caches_[2];
  std::vector<std::int64_t> last_cells_[2];
  std::vector<std::int32_t> last_positions_[2];
  std::vector<llama_pos> ubatch_positions_;  // positions of the tokens the current ubatch appends
  std::int64_t ubatch_ = 0;                  // ubatches seen
  std::int64_t checked_ubatch_[2] = {-1, -1};

  llama_context* ctx_ = nullptr;
  llama_memory_t memory_ = nullptr;
  std::vector<llama_pos> held_;  // the sequence's positions, ascending: slot t holds held_[t]

  // library state
  bridge::state_shape shape_;
  std::vector<unsigned char> model_buffer_;  // over-allocated: the state starts 256-byte aligned inside
  bridge::model_state model_;
  std::vector<unsigned char> workspace_;
  std::vector<float> gathered_;
  std::vector<float> buffer_, mask_;
  std::vector<std::int64_t> cells_scratch_;
  std::vector<std::int32_t> positions_scratch_, identity_, cell_of_slot_[2];
  std::int32_t stride_ = 0;
  std::int32_t indptr_[2] = {0, 0};
  std::vector<std::int32_t> counts_, slots_, cache_slots_, new_lengths_, freed_pages_;

  std::int64_t evicted_ = 0, mask_checks_ = 0;
  double library_seconds_ = 0, removal_seconds_ = 0, callback_seconds_ = 0, evict_seconds_ = 0;
  std::string error_;
};

}  // namespace sh_llama
