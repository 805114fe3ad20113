#include "eviction_glue.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ggml-backend.h"
#include "ggml.h"

namespace sh_llama {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

// The ROPE node below a K write: its src[1] holds the ubatch's positions.
const ggml_tensor* rope_below(const ggml_tensor* t) {
  for (int depth = 0; t != nullptr && depth < 8; ++depth, t = t->src[0])
    if (t->op == GGML_OP_ROPE) return t;
  return nullptr;
}

std::string architecture_of(const llama_model* model) {
  char buffer[128] = {};
  if (llama_model_meta_val_str(model, "general.architecture", buffer, sizeof buffer) < 0) return "";
  return buffer;
}

// llama.cpp's own sliding-window layouts (llama-model.cpp, set_swa_pattern),
// for the architectures whose GGUF does not store a per-layer flag. A layout
// found here is still checked against the mask at every step.
bool sliding_by_architecture(const std::string& arch, std::int32_t layer, bool* known) {
  *known = true;
  if (arch == "gemma3") return layer % 6 != 5;  // five sliding-window layers, then one global
  if (arch == "gemma2") return layer % 2 == 0;  // alternating, sliding first
  *known = false;
  return false;
}

}  // namespace

std::vector<char> sliding_layers(const llama_model* model, const std::vector<std::int32_t>& global_layers,
                                 std::string* error) {
  const std::int32_t n_layer = llama_model_n_layer(model);
  std::vector<char> sliding(static_cast<std::size_t>(n_layer), 0);
  if (llama_model_n_swa(model) <= 0) return sliding;
  if (!global_layers.empty()) {
    std::fill(sliding.begin(), sliding.end(), 1);
    for (std::int32_t l : global_layers) {
      if (l < 0 || l >= n_layer) {
        *error = "--global-layers: layer " + std::to_string(l) + " is outside the model's " + std::to_string(n_layer) +
                 " layers";
        return {};
      }
      sliding[static_cast<std::size_t>(l)] = 0;
    }
    return sliding;
  }
  const std::string arch = architecture_of(model);
  for (std::int32_t l = 0; l < n_layer; ++l) {
    bool known = false;
    sliding[static_cast<std::size_t>(l)] = sliding_by_architecture(arch, l, &known);
    if (!known) {
      *error = "the model (architecture '" + arch + "') uses sliding-window attention (window " +
               std::to_string(llama_model_n_swa(model)) +
               ") and llama.cpp's public API does not say which layers: name the full-attention layers with "
               "--global-layers";
      return {};
    }
  }
  return sliding;
}

eviction_glue::eviction_glue(const llama_model* model, const preset* policy, const bridge::settings& settings,
                             const glue_options& options)
    : policy_(policy), settings_(settings), options_(options) {
  n_layer_ = llama_model_n_layer(model);
  n_head_ = llama_model_n_head(model);
  n_head_kv_ = llama_model_n_head_kv(model);
  n_swa_ = llama_model_n_swa(model);
  std::string why;
  sliding_ = sliding_layers(model, options_.global_layers, &why);
  if (!why.empty()) {
    fail(why);
    return;
  }
  model_layer_of_.assign(static_cast<std::size_t>(n_layer_), -1);
  for (std::int32_t l = 0; l < n_layer_; ++l) {
    const int cache = sliding_[static_cast<std::size_t>(l)] ? 1 : 0;
    if (owner_[cache] < 0) owner_[cache] = l;
    if (options_.scores == scored_layers::all || cache == 0) {
      model_layer_of_[static_cast<std::size_t>(l)] = static_cast<std::int32_t>(scored_.size());
      scored_.push_back(l);
    }
  }
  if (owner_[0] < 0) {
    fail("the model has no full-attention layer: a budget of cells has no cache to bound");
    return;
  }
  if (options_.budget <= 0 || options_.max_step_tokens <= 0) {
    fail("budget and max_step_tokens must be positive");
    return;
  }
  if (policy_ == nullptr) return;
  if (library("make_state_shape",
              policy_->make_state_shape(settings_, 1, n_head_kv_,
                                        options_.capacity > 0
                                            ? options_.capacity
                                            : bridge::state_capacity_for(options_.budget, options_.max_step_tokens),
                                        &shape_)))
    return;
  std::size_t bytes = 0;
  if (library("model_state_bytes",
              policy_->model_state_bytes(shape_, static_cast<std::int32_t>(scored_.size()), &bytes)))
    return;
  model_buffer_.assign(bytes + 256, 0);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(model_buffer_.data());
  void* aligned = model_buffer_.data() + ((256 - base % 256) % 256);
  if (library("make_model_state",
              policy_->make_model_state(aligned, bytes, shape_, static_cast<std::int32_t>(scored_.size()), &model_)))
    return;
  if (library("reset_state", policy_->reset_state(model_))) return;
  stride_ = bridge::max_evictions(shape_.capacity, options_.budget, settings_.evict_count);
  counts_.assign(1, 0);
  slots_.assign(static_cast<std::size_t>(std::max(stride_, 1)), 0);
  cache_slots_.assign(slots_.size(), 0);
  new_lengths_.assign(1, 0);
  freed_pages_.assign(1, 0);
  identity_.resize(static_cast<std::size_t>(shape_.capacity));
  for (std::int32_t t = 0; t < shape_.capacity; ++t) identity_[static_cast<std::size_t>(t)] = t;
}

bool eviction_glue::fail(std::string message) {
  if (error_.empty()) error_ = std::move(message);
  return false;
}

// True when the call failed (the error is kept).
bool eviction_glue::library(const char* what, const bridge::error& e) {
  if (e.ok()) return false;
  fail(std::string("scissorhands refused ") + what + ": " + e.message);
  return true;
}

void eviction_glue::configure(llama_context_params& params) {
  params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  params.cb_eval = &eviction_glue::callback;
  params.cb_eval_user_data = this;
  params.n_ubatch = static_cast<std::uint32_t>(options_.max_step_tokens);
  params.n_batch = params.n_ubatch;  // one ubatch per llama_decode: select sees every step
  params.n_seq_max = 1;
}

bool eviction_glue::attach(llama_context* ctx) {
  ctx_ = ctx;
  memory_ = llama_get_memory(ctx);
  const std::int32_t most = options_.capacity > 0 ? options_.capacity : options_.budget;
  if (static_cast<std::int64_t>(llama_n_ctx(ctx)) < std::int64_t{most})
    return fail("n_ctx " + std::to_string(llama_n_ctx(ctx)) + " cannot hold the " + std::to_string(most) +
                " tokens the sequence reaches");
  return ok();
}

bool eviction_glue::callback(ggml_tensor* t, bool ask, void* self) {
  auto* glue = static_cast<eviction_glue*>(self);
  const bool k_write = t->op == GGML_OP_SET_ROWS && starts_with(t->name, "cache_k_l");
  const bool probabilities = starts_with(t->name, "kq_soft_max-");
  if (!k_write && !probabilities) return false;
  if (ask) return true;
  if (!glue->ok()) return false;  // stops the graph: llama_decode fails, the caller reads error()
  const auto start = clock_type::now();
  const bool good = k_write ? glue->on_k_write(t, std::atoi(t->name + 9))
                            : glue->on_probabilities(t, std::atoi(t->name + 12));
  glue->callback_seconds_ += seconds_since(start);
  return good;
}

bool eviction_glue::on_k_write(ggml_tensor* t, std::int32_t layer) {
  if (layer < 0 || layer >= n_layer_) return fail(std::string("K write node '") + t->name + "' names no layer");
  const ggml_tensor* rope = rope_below(t->src[0]);
  const ggml_tensor* positions = rope != nullptr ? rope->src[1] : nullptr;
  const ggml_tensor* cells = t->src[1];
  if (positions == nullptr || positions->type != GGML_TYPE_I32 || cells == nullptr || cells->type != GGML_TYPE_I64 ||
      ggml_nelements(cells) > ggml_nelements(positions))
    return fail(std::string("llama.cpp's graph changed: the K write node '") + t->name +
                "' no longer leads to the destination cells (I64) and a ROPE node's positions (I32)");
  const std::size_t n = static_cast<std::size_t>(ggml_nelements(cells));
  cells_scratch_.resize(n);
  positions_scratch_.resize(static_cast<std::size_t>(ggml_nelements(positions)));
  ggml_backend_tensor_get(cells, cells_scratch_.data(), 0, ggml_nbytes(cells));
  ggml_backend_tensor_get(positions, positions_scratch_.data(), 0, ggml_nbytes(positions));
  positions_scratch_.resize(n);  // M-RoPE stores more position rows; the first is the token's
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;

  // The ubatch's first write (any cache) brings new positions: its tokens
  // join the sequence. Every later write of the ubatch names the same ones.
  if (held_.empty() || positions_scratch_.front() > held_.back()) {
    for (std::size_t i = 1; i < n; ++i)
      if (positions_scratch_[i] != positions_scratch_[i - 1] + 1)
        return fail("the ubatch's positions are not consecutive: the glue serves one sequence decoded in order");
    ubatch_positions_ = positions_scratch_;
    held_.insert(held_.end(), positions_scratch_.begin(), positions_scratch_.end());
    ++ubatch_;
  } else if (positions_scratch_ != ubatch_positions_) {
    return fail("layer " + std::to_string(layer) + " writes positions " + std::to_string(positions_scratch_.front()) +
                ".. that are neither new nor this ubatch's: the glue serves one sequence decoded in order");
  }
  if (layer == owner_[cache]) {
    std::string why;
    if (!caches_[cache].write(cells_scratch_.data(), positions_scratch_.data(), n, t->ne[1], &why))
      return fail("layer " + std::to_string(layer) + ": " + why);
    last_cells_[cache] = cells_scratch_;
    last_positions_[cache] = positions_scratch_;
  } else if (cells_scratch_ != last_cells_[cache] || positions_scratch_ != last_positions_[cache]) {
    return fail("layer " + std::to_string(layer) + " wrote other cells than layer " + std::to_string(owner_[cache]) +
                " of the same cache: the layers' cache assignment is not what the glue assumed (--global-layers)");
  }
  return true;
}

bool eviction_glue::check_mask(const ggml_tensor* mask, std::int32_t layer, std::int64_t n_kv,
                               std::int64_t n_tokens) {
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;
  if (mask == nullptr || mask->type != GGML_TYPE_F32 || mask->ne[0] != n_kv || mask->ne[1] < n_tokens)
    return fail("layer " + std::to_string(layer) + ": the softmax's mask is not an F32 [n_kv, n_tokens] tensor");
  mask_.resize(static_cast<std::size_t>(ggml_nelements(mask)));
  ggml_backend_tensor_get(mask, mask_.data(), 0, ggml_nbytes(mask));
  const auto& pos_of_cell = caches_[cache].pos_of_cell;
  for (std::int64_t q = 0; q < n_tokens; ++q) {
    const llama_pos query = ubatch_positions_[static_cast<std::size_t>(q)];
    const float* row = mask_.data() + q * n_kv;
    std::int64_t expected_visible = 0;
    for (std::size_t c = 0; c < pos_of_cell.size(); ++c) {
      const llama_pos p = pos_of_cell[c];
      const bool expect = p >= 0 && p <= query && (cache == 0 || query - p < n_swa_);
      expected_visible += expect;
      const bool visible = static_cast<std::int64_t>(c) < n_kv && !(std::isinf(row[c]) && row[c] < 0);
      if (visible != expect)
        return fail("layer " + std::to_string(layer) + " (" + (cache ? "sliding-window" : "full-attention") +
                    " cache): llama.cpp's mask " + (visible ? "shows" : "hides") + " cell " + std::to_string(c) +
                    " to the query at position " + std::to_string(query) + ", where the cell map holds position " +
                    std::to_string(p) + " and expects it " + (expect ? "visible" : "hidden") +
                    ": llama.cpp's graph or cache rules are not what this glue mirrors");
    }
    for (std::int64_t c = static_cast<std::int64_t>(pos_of_cell.size()); c < n_kv; ++c)
      if (!(std::isinf(row[c]) && row[c] < 0))
        return fail("layer " + std::to_string(layer) + ": the mask shows cell " + std::to_string(c) +
                    ", beyond every cell the K writes named");
    (void)expected_visible;
  }
  ++mask_checks_;
  return true;
}

bool eviction_glue::on_probabilities(ggml_tensor* t, std::int32_t layer) {
  if (layer < 0 || layer >= n_layer_) return fail(std::string("'") + t->name + "' names no layer");
  const std::int64_t n_kv = t->ne[0], n_tokens = t->ne[1], heads = t->ne[2];
  if (t->type != GGML_TYPE_F32 || heads != n_head_ || t->ne[3] != 1 || !ggml_is_contiguous(t) ||
      n_tokens != static_cast<std::int64_t>(ubatch_positions_.size()))
    return fail(std::string("'") + t->name + "' is not an F32 [n_kv, n_tokens, n_head, 1] tensor for this ubatch");
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;
  if (options_.check_every_layer || checked_ubatch_[cache] != ubatch_) {
    if (!check_mask(t->src[1], layer, n_kv, n_tokens)) return false;
    checked_ubatch_[cache] = ubatch_;
  }
  const std::int32_t model_layer = model_layer_of_[static_cast<std::size_t>(layer)];
  const bool observe = policy_ != nullptr && model_layer >= 0 && ubatch_positions_.back() >= options_.observe_from;
  if (!observe && !options_.on_attention) return true;

  const auto start = clock_type::now();
  buffer_.resize(static_cast<std::size_t>(ggml_nelements(t)));
  ggml_backend_tensor_get(t, buffer_.data(), 0, ggml_nbytes(t));
  // Cell of each slot in this layer's cache (-1: not there, e.g. outside a
  // sliding window's cache), through the ascending held positions.
  auto& cell_of_slot = cell_of_slot_[cache];
  cell_of_slot.assign(held_.size(), -1);
  const auto& pos_of_cell = caches_[cache].pos_of_cell;
  for (std::size_t c = 0; c < pos_of_cell.size() && static_cast<std::int64_t>(c) < n_kv; ++c) {
    if (pos_of_cell[c] < 0) continue;
    const auto it = std::lower_bound(held_.begin(), held_.end(), pos_of_cell[c]);
    if (it == held_.end() || *it != pos_of_cell[c])
      return fail("layer " + std::to_string(layer) + ": cell " + std::to_string(c) + " holds position " +
                  std::to_string(pos_of_cell[c]) + ", which the sequence no longer holds");
    cell_of_slot[static_cast<std::size_t>(it - held_.begin())] = static_cast<std::int32_t>(c);
  }
  // [head][query][slot]: the library's dense probability layout (batch 1).
  const std::size_t slots = held_.size();
  gathered_.assign(static_cast<std::size_t>(heads * n_tokens) * slots, 0.0f);
  for (std::int64_t r = 0; r < heads * n_tokens; ++r) {
    const float* in = buffer_.data() + r * n_kv;
    float* out = gathered_.data() + static_cast<std::size_t>(r) * slots;
    for (std::size_t s = 0; s < slots; ++s)
      if (cell_of_slot[s] >= 0) out[s] = in[cell_of_slot[s]];
  }
  if (options_.on_attention)
    options_.on_attention(layer, gathered_.data(), n_head_, static_cast<std::int32_t>(n_tokens),
                          static_cast<std::int32_t>(slots));
  if (!observe) {
    library_seconds_ += seconds_since(start);
    return true;
  }
  // Observe reads only the sequence's length from the table: slot ids are
  // the identity here (the cells of the full-attention cache are known only
  // after its first layer ran); select and forget get the real cells.
  const bridge::token_table slots_table = table(identity_);
  const bridge::probabilities probs = bridge::probabilities::dense(
      gathered_.data(), gathered_.size(), n_head_, static_cast<std::int32_t>(n_tokens), static_cast<std::int32_t>(slots));
  const bool refused = library("observe_probabilities",
                               policy_->observe_probabilities(settings_, slots_table, layer_state(layer), probs));
  library_seconds_ += seconds_since(start);
  return !refused;
}

bridge::token_table eviction_glue::table(const std::vector<std::int32_t>& indices) {
  static const std::int32_t zero = 0, one = 1;
  bridge::token_table table;
  // indptr {0, held} and last_page_len {held > 0}: page size 1.
  indptr_[1] = held();
  table.indptr = indptr_;
  table.indices = indices.data();
  table.indices_size = indices.size();
  table.last_page_len = held_.empty() ? &zero : &one;
  table.batch = 1;
  table.kv_heads = n_head_kv_;
  table.page_size = 1;
  table.num_pages = std::max<std::int32_t>(static_cast<std::int32_t>(indices.size()),
                                           static_cast<std::int32_t>(caches_[0].pos_of_cell.size()));
  table.max_pages_per_sequence = table.num_pages;
  return table;
}

bridge::state eviction_glue::layer_state(std::int32_t layer) const {
  return model_.layer(model_layer_of_[static_cast<std::size_t>(layer)]);
}

bool eviction_glue::after_decode() {
  if (!ok()) return false;
  // What llama.cpp reports must agree with the map.
  const llama_pos pos_max = llama_memory_seq_pos_max(memory_, 0);
  const llama_pos pos_min = llama_memory_seq_pos_min(memory_, 0);
  if (held_.empty() || pos_max != held_.back())
    return fail("llama_memory_seq_pos_max says " + std::to_string(pos_max) + ", the glue's newest position is " +
                std::to_string(held_.empty() ? -1 : held_.back()));
  // An iSWA cache reports the sliding-window cache's oldest position.
  llama_pos expected_min = held_.front();
  if (owner_[1] >= 0) {
    expected_min = -1;
    for (llama_pos p : caches_[1].pos_of_cell)
      if (p >= 0 && (expected_min < 0 || p < expected_min)) expected_min = p;
  }
  if (pos_min != expected_min)
    return fail("llama_memory_seq_pos_min says " + std::to_string(pos_min) + ", the cell map expects " +
                std::to_string(expected_min));
  std::vector<llama_pos> in_cache;
  for (llama_pos p : caches_[0].pos_of_cell)
    if (p >= 0) in_cache.push_back(p);
  std::sort(in_cache.begin(), in_cache.end());
  if (in_cache != held_)
    return fail("the full-attention cache's cells hold " + std::to_string(in_cache.size()) +
                " positions, the sequence " + std::to_string(held_.size()) + ": they differ");

  return true;
}

bool eviction_glue::evict() {
  const auto start = clock_type::now();
  const bool good = evict_once();
  evict_seconds_ += seconds_since(start);
  return good;
}

bool eviction_glue::evict_once() {
  if (!ok()) return false;
  if (policy_ == nullptr || held() < options_.budget) return true;
  const auto start = clock_type::now();
  // The sequence's cells of the full-attention cache, in position order: a
  // page-size-1 table, as a slot allocator keeps it.
  auto& cells = cell_of_slot_[0];
  cells.assign(held_.size(), -1);
  for (std::size_t c = 0; c < caches_[0].pos_of_cell.size(); ++c) {
    const llama_pos p = caches_[0].pos_of_cell[c];
    if (p < 0) continue;
    cells[static_cast<std::size_t>(std::lower_bound(held_.begin(), held_.end(), p) - held_.begin())] =
        static_cast<std::int32_t>(c);
  }
  const bridge::token_table cell_table = table(cells);
  const std::size_t bytes = policy_->select_workspace_bytes(cell_table, shape_);
  if (workspace_.size() < bytes + 256) workspace_.assign(bytes + 256, 0);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(workspace_.data());
  void* workspace = workspace_.data() + ((256 - base % 256) % 256);
  bridge::selection selection;
  selection.stride = stride_;
  selection.counts = counts_.data();
  selection.slots = slots_.data();
  selection.cache_slots = cache_slots_.data();
  selection.out.new_lengths = new_lengths_.data();
  selection.out.freed_pages = freed_pages_.data();
  if (library("select", policy_->select(settings_, cell_table, model_, options_.budget, workspace, bytes, selection,
                                        nullptr)))
    return false;
  library_seconds_ += seconds_since(start);

  // The engine's part: remove the chosen positions from every cache.
  const auto removal = clock_type::now();
  for (std::int32_t k = 0; k < counts_[0]; ++k) {
    const std::int32_t slot = slots_[static_cast<std::size_t>(k)];
    const llama_pos p = held_[static_cast<std::size_t>(slot)];
    if (cache_slots_[static_cast<std::size_t>(k)] != cells[static_cast<std::size_t>(slot)])
      return fail("select named cell " + std::to_string(cache_slots_[static_cast<std::size_t>(k)]) + " for slot " +
                  std::to_string(slot) + ", whose cell is " + std::to_string(cells[static_cast<std::size_t>(slot)]));
    if (!llama_memory_seq_rm(memory_, 0, p, p + 1))
      return fail("llama_memory_seq_rm refused position " + std::to_string(p));
    caches_[0].remove(p);
    caches_[1].remove(p);
  }
  removal_seconds_ += seconds_since(removal);

  const auto forget_start = clock_type::now();
  for (std::int32_t layer : scored_)  // the table of before the removal: forget reads the old length
    if (library("forget", policy_->forget(settings_, cell_table, layer_state(layer), selection))) return false;
  // Drop the evicted positions (slots ascending: erase from the back).
  for (std::int32_t k = counts_[0] - 1; k >= 0; --k)
    held_.erase(held_.begin() + slots_[static_cast<std::size_t>(k)]);
  evicted_ += counts_[0];
  library_seconds_ += seconds_since(forget_start);
  if (held() != new_lengths_[0])
    return fail("the sequence holds " + std::to_string(held()) + " positions after eviction, select said " +
                std::to_string(new_lengths_[0]));
  return true;
}

}  // namespace sh_llama
