#include "eviction_glue.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

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

// The K cache view a FLASH_ATTN_EXT node reads: its src[1], or below the
// F16 cast llama.cpp inserts for an F32 cache ("cache_k_l<il> (view)
// (permuted)", [head_dim, n_kv, n_head_kv, streams]). Null if the graph
// has another shape.
const ggml_tensor* key_view_of(const ggml_tensor* flash) {
  const ggml_tensor* k = flash->src[1];
  for (int depth = 0; k != nullptr && depth < 4 && (k->op == GGML_OP_CPY || k->op == GGML_OP_CONT); ++depth)
    k = k->src[0];
  return k != nullptr && starts_with(k->name, "cache_k_l") ? k : nullptr;
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

// x rounded to the nearest binary16 value (ties to even), as a float: what
// llama.cpp's flash-attention kernel multiplies K with (it converts each
// query row to the K cache's dot type, f16, before the dot products).
float round_to_half(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) return x;  // inf, NaN
  if (magnitude >= 0x477FF000u) return std::copysign(INFINITY, x);  // rounds above 65504
  if (magnitude < 0x38800000u)  // below 2^-14: half's subnormal step, 2^-24
    return std::nearbyint(x * 16777216.0f) * (1.0f / 16777216.0f);
  std::uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
  rounded &= ~0x1FFFu;
  rounded |= bits & 0x80000000u;
  float y;
  std::memcpy(&y, &rounded, sizeof y);
  return y;
}

// Whether an F16 mask entry hides its cell (-inf).
bool hidden16(std::uint16_t bits) { return bits == 0xFC00u; }
bool hidden32(float x) { return std::isinf(x) && x < 0; }

const std::vector<llama_pos> no_positions;

constexpr std::int32_t most_sequences = 256;  // llama.cpp's LLAMA_MAX_SEQ (not in its public header)

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
  // Caches the glue cannot map: refused here, before any context exists.
  const std::string arch = architecture_of(model);
  char rank[32] = {};
  if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
    fail("the model (architecture '" + arch +
         "') keeps recurrent state: its memory has no KV cells for the glue to map and evict");
    return;
  }
  if (llama_model_has_encoder(model)) {
    fail("the model (architecture '" + arch + "') is an encoder-decoder: the glue maps decoder-only KV caches");
    return;
  }
  if (llama_model_meta_val_str(model, (arch + ".attention.kv_lora_rank").c_str(), rank, sizeof rank) >= 0) {
    fail("the model (architecture '" + arch +
         "') uses multi-head latent attention (MLA): its cache holds compressed latents, not per-head K rows, "
         "which the glue cannot score");
    return;
  }
  if (n_head_kv_ <= 0 || n_head_ % n_head_kv_ != 0) {
    fail("the model has " + std::to_string(n_head_) + " query heads and " + std::to_string(n_head_kv_) +
         " KV heads: the glue needs a whole number of query heads per KV head");
    return;
  }
  if (options_.sequences < 1 || options_.sequences > most_sequences) {
    fail("sequences must be in [1, " + std::to_string(most_sequences) + "], got " +
         std::to_string(options_.sequences));
    return;
  }
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
  first_layer_ = 0;
  if (owner_[0] < 0) {
    fail("the model has no full-attention layer: a budget of cells has no cache to bound");
    return;
  }
  if (options_.budget <= 0 || options_.max_step_tokens <= 0) {
    fail("budget and max_step_tokens must be positive, got " + std::to_string(options_.budget) + " and " +
         std::to_string(options_.max_step_tokens));
    return;
  }
  // What select would refuse at the first eviction, refused before any run:
  // the budget must leave room for the protected tokens and one step's m.
  const std::int64_t protected_tokens = std::int64_t{settings_.recent} + settings_.sinks;
  if (policy_ != nullptr && (options_.budget <= protected_tokens ||
                             settings_.evict_count > options_.budget - protected_tokens)) {
    fail("budget " + std::to_string(options_.budget) + " must exceed the protected tokens (recent " +
         std::to_string(settings_.recent) + " + sinks " + std::to_string(settings_.sinks) + ") by at least m = " +
         std::to_string(settings_.evict_count) + ", the tokens evicted at once");
    return;
  }
  if (options_.on_attention && options_.sequences != 1) {
    fail("on_attention serves one sequence, got sequences = " + std::to_string(options_.sequences));
    return;
  }
  const auto n = static_cast<std::size_t>(options_.sequences);
  held_.assign(n, {});
  evicted_log_.assign(n, {});
  batch_of_sequence_.assign(n, {});
  sequence_cursor_.assign(n, 0);
  if (policy_ == nullptr) return;
  const std::int32_t capacity = options_.capacity > 0
                                    ? options_.capacity
                                    : bridge::state_capacity_for(options_.budget, options_.max_step_tokens);
  if (library("make_state_shape",
              policy_->make_state_shape(settings_, options_.sequences, n_head_kv_, capacity, &shape_)))
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
  if (options_.shadow_queries) {
    shadow_buffer_.assign(bytes + 256, 0);
    const std::uintptr_t shadow_base = reinterpret_cast<std::uintptr_t>(shadow_buffer_.data());
    void* shadow_aligned = shadow_buffer_.data() + ((256 - shadow_base % 256) % 256);
    if (library("make_model_state", policy_->make_model_state(shadow_aligned, bytes, shape_,
                                                              static_cast<std::int32_t>(scored_.size()), &shadow_)))
      return;
    if (library("reset_state", policy_->reset_state(shadow_))) return;
  }
  stride_ = bridge::max_evictions(shape_.capacity, options_.budget, settings_.evict_count);
  counts_.assign(n, 0);
  slots_.assign(n * static_cast<std::size_t>(std::max(stride_, 1)), 0);
  cache_slots_.assign(slots_.size(), 0);
  new_lengths_.assign(n, 0);
  freed_pages_.assign(n, 0);
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

const std::vector<llama_pos>& eviction_glue::positions(llama_seq_id seq) const {
  return seq >= 0 && seq < static_cast<llama_seq_id>(held_.size()) ? held_[static_cast<std::size_t>(seq)]
                                                                    : no_positions;
}

const std::vector<llama_pos>& eviction_glue::evicted_positions(llama_seq_id seq) const {
  return seq >= 0 && seq < static_cast<llama_seq_id>(evicted_log_.size()) ? evicted_log_[static_cast<std::size_t>(seq)]
                                                                          : no_positions;
}

void eviction_glue::configure(llama_context_params& params) {
  params.cb_eval = &eviction_glue::callback;
  params.cb_eval_user_data = this;
  params.n_seq_max = static_cast<std::uint32_t>(options_.sequences);
  if (options_.source == attention_source::probabilities || options_.on_attention)
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  else if (options_.source == attention_source::queries)
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  type_k_ = params.type_k;
  type_v_ = params.type_v;
  flash_type_ = params.flash_attn_type;
  configured_ = true;
  check_key_type();
}

bool eviction_glue::check_key_type() {
  // Flash attention off: llama.cpp transposes V and cannot hold it quantized.
  if (flash_type_ == LLAMA_FLASH_ATTN_TYPE_DISABLED && ggml_is_quantized(type_v_))
    return fail(std::string("the V cache type is ") + ggml_type_name(type_v_) +
                ": with flash attention off llama.cpp keeps V transposed and cannot quantize it (the context would "
                "fail): use flash attention, or an f16 or f32 V cache");
  if (flash_type_ == LLAMA_FLASH_ATTN_TYPE_DISABLED || type_k_ == GGML_TYPE_F16 || type_k_ == GGML_TYPE_F32)
    return true;
  return fail(std::string("the K cache type is ") + ggml_type_name(type_k_) +
              ": with flash attention on the glue reads K as f16 or f32 only (llama.cpp's quantized blocks, scales "
              "interleaved with the codes, are not the library's quantized view): use an f16 or f32 K cache, or "
              "flash attention off");
}

bool eviction_glue::attach(llama_context* ctx) {
  if (!ok()) return false;
  if (ctx == nullptr) return fail("attach: no context (llama_init_from_model failed)");
  if (!configured_)
    return fail("attach: the context was not created with parameters that configure() filled (its callback, "
                "n_seq_max, flash attention): nothing would be observed");
  ctx_ = ctx;
  memory_ = llama_get_memory(ctx);
  if (memory_ == nullptr) return fail("attach: the context has no memory (KV cache) to bound");
  const std::int64_t n_seq_max = llama_n_seq_max(ctx);
  if (n_seq_max != options_.sequences)
    return fail("the context serves n_seq_max = " + std::to_string(n_seq_max) + " sequences, the glue " +
                std::to_string(options_.sequences) + ": create it with configure()'s parameters");
  // One stream per sequence (kv_unified off) shows as a per-sequence context size below n_ctx.
  const std::int64_t n_ctx = llama_n_ctx(ctx), n_ctx_seq = llama_n_ctx_seq(ctx);
  streams_ = options_.sequences > 1 && n_ctx_seq < n_ctx ? options_.sequences : 1;
  // The cells a sequence reaches: the budget, or the capacity asked for
  // (an engine that steps past the budget must give llama.cpp room for it).
  const std::int64_t most = options_.capacity > 0 ? options_.capacity : options_.budget;
  const std::int64_t cells = streams_ > 1 ? n_ctx_seq : n_ctx;
  const std::int64_t need = streams_ > 1 ? most : most * options_.sequences;
  if (cells < need)
    return fail("n_ctx " + std::to_string(n_ctx) + (streams_ > 1 ? " (" + std::to_string(n_ctx_seq) + " per sequence)" : "") +
                " cannot hold the " + std::to_string(most) + " tokens each of the " +
                std::to_string(options_.sequences) + " sequences reaches");
  return check_key_type();
}

bool eviction_glue::forget_sequence(llama_seq_id seq) {
  const auto s = static_cast<std::size_t>(seq);
  caches_[0].remove_sequence(seq);
  caches_[1].remove_sequence(seq);
  held_[s].clear();
  return true;
}

bool eviction_glue::end_sequence(llama_seq_id seq) {
  if (!ok()) return false;
  if (seq < 0 || seq >= options_.sequences)
    return fail("end_sequence: sequence " + std::to_string(seq) + " is outside [0, " +
                std::to_string(options_.sequences) + ")");
  if (batch_open_) return fail("end_sequence: a batch is open (before_decode without after_decode)");
  if (!llama_memory_seq_rm(memory_, seq, -1, -1))
    return fail("llama_memory_seq_rm refused to remove sequence " + std::to_string(seq));
  return forget_sequence(seq);
}

bool eviction_glue::before_decode(const llama_batch& batch) {
  if (!ok()) return false;
  if (ctx_ == nullptr) return fail("before_decode: attach() the context first");
  if (batch_open_)
    return fail("before_decode: the previous batch was not closed by after_decode (a failed llama_decode leaves "
                "llama.cpp's cache and the glue apart: end the sequences and start again)");
  if (batch.n_tokens <= 0) return fail("before_decode: the batch holds no token");
  const auto n_seq = static_cast<std::size_t>(options_.sequences);
  // What llama.cpp holds against what the glue holds, before anything changes.
  std::vector<llama_seq_id> removed;
  for (llama_seq_id s = 0; s < options_.sequences; ++s) {
    const llama_pos newest = llama_memory_seq_pos_max(memory_, s);
    const auto& held = held_[static_cast<std::size_t>(s)];
    if (held.empty() && newest >= 0)
      return fail("sequence " + std::to_string(s) + " holds positions up to " + std::to_string(newest) +
                  " in llama.cpp that the glue never saw appended (llama_memory_seq_cp, or a llama_decode without "
                  "before_decode): sequences that share or copy cells are not supported");
    if (!held.empty() && newest < 0) {
      removed.push_back(s);  // the caller removed the whole sequence: forget it
    } else if (!held.empty() && newest != held.back()) {
      return fail("sequence " + std::to_string(s) + ": llama.cpp's newest position is " + std::to_string(newest) +
                  ", the glue's " + std::to_string(held.back()) +
                  ": positions were removed or shifted behind the glue (llama_memory_seq_rm of a range, "
                  "llama_memory_seq_add, a context shift)");
    }
  }
  std::vector<std::vector<std::int32_t>> of_sequence(n_seq);
  std::vector<llama_seq_id> seqs(static_cast<std::size_t>(batch.n_tokens));
  std::vector<llama_pos> positions(seqs.size());
  for (std::int32_t i = 0; i < batch.n_tokens; ++i) {
    const std::int32_t count = batch.n_seq_id != nullptr ? batch.n_seq_id[i] : 1;
    if (count != 1)
      return fail("batch token " + std::to_string(i) + " belongs to " + std::to_string(count) +
                  " sequences: tokens shared by several sequences (one prompt for parallel sampling) are not "
                  "supported");
    const llama_seq_id s = batch.seq_id != nullptr ? batch.seq_id[i][0] : 0;
    if (s < 0 || s >= options_.sequences)
      return fail("batch token " + std::to_string(i) + ": sequence id " + std::to_string(s) + " is outside [0, " +
                  std::to_string(options_.sequences) + ") (the context's n_seq_max)");
    auto& mine = of_sequence[static_cast<std::size_t>(s)];
    const auto& held = held_[static_cast<std::size_t>(s)];
    const bool gone = std::find(removed.begin(), removed.end(), s) != removed.end();
    llama_pos expected = -1;
    if (!mine.empty())
      expected = positions[static_cast<std::size_t>(mine.back())] + 1;
    else if (!held.empty() && !gone)
      expected = held.back() + 1;
    const llama_pos p = batch.pos != nullptr ? batch.pos[i] : (expected >= 0 ? expected : 0);
    if (p < 0 || (expected >= 0 && p != expected))
      return fail("batch token " + std::to_string(i) + " of sequence " + std::to_string(s) + " has position " +
                  std::to_string(p) + (expected >= 0 ? ", not the next one, " + std::to_string(expected) : "") +
                  ": the glue needs each sequence's positions in order, without gaps");
    mine.push_back(i);
    seqs[static_cast<std::size_t>(i)] = s;
    positions[static_cast<std::size_t>(i)] = p;
    if (static_cast<std::int32_t>(mine.size()) > options_.max_step_tokens)
      return fail("the batch appends more than max_step_tokens = " + std::to_string(options_.max_step_tokens) +
                  " tokens to sequence " + std::to_string(s) + " (the library's state holds budget + " +
                  "max_step_tokens - 1 tokens a sequence)");
  }
  // Accepted: forget the removed sequences, start the new ones' rows.
  for (llama_seq_id s : removed) forget_sequence(s);
  for (llama_seq_id s = 0; s < options_.sequences; ++s) {
    const auto& mine = of_sequence[static_cast<std::size_t>(s)];
    if (mine.empty() || !held_[static_cast<std::size_t>(s)].empty() || policy_ == nullptr) continue;
    if (library("reset_sequence",
                policy_->reset_sequence(model_, s, positions[static_cast<std::size_t>(mine.front())])))
      return false;
    if (options_.shadow_queries &&
        library("reset_sequence", policy_->reset_sequence(shadow_, s, positions[static_cast<std::size_t>(mine.front())])))
      return false;
  }
  batch_seqs_ = std::move(seqs);
  batch_positions_ = std::move(positions);
  batch_of_sequence_ = std::move(of_sequence);
  std::fill(sequence_cursor_.begin(), sequence_cursor_.end(), 0);
  consumed_ = 0;
  batch_open_ = true;
  return true;
}

bool eviction_glue::callback(ggml_tensor* t, bool ask, void* self) {
  auto* glue = static_cast<eviction_glue*>(self);
  const bool k_write = t->op == GGML_OP_SET_ROWS && starts_with(t->name, "cache_k_l");
  const bool flash = t->op == GGML_OP_FLASH_ATTN_EXT;
  const bool probabilities = starts_with(t->name, "kq_soft_max-");
  if (!k_write && !flash && !probabilities) return false;
  if (ask) return true;
  if (!glue->ok()) return false;  // stops the graph: llama_decode fails, the caller reads error()
  const auto start = clock_type::now();
  bool good = false;
  if (k_write) {
    good = glue->on_k_write(t, std::atoi(t->name + 9));
  } else if (flash) {
    const ggml_tensor* k = key_view_of(t);
    good = k != nullptr ? glue->on_attention_node(t, std::atoi(k->name + 9), true)
                        : glue->fail(std::string("llama.cpp's graph changed: the flash-attention node '") + t->name +
                                     "' does not read a 'cache_k_l<il>' K cache view");
  } else {
    good = glue->on_attention_node(t, std::atoi(t->name + 12), false);
  }
  glue->callback_seconds_ += seconds_since(start);
  return good;
}

std::int32_t eviction_glue::stream_of(std::int32_t cache, std::int64_t cell) const {
  return streams_ > 1 ? static_cast<std::int32_t>(cell / cells_per_stream_[cache]) : 0;
}

bool eviction_glue::start_ubatch(std::size_t n, std::int64_t cells_per_stream) {
  if (!batch_open_)
    return fail("llama_decode ran without before_decode(batch): the glue must see each batch's sequences and "
                "positions");
  ++ubatch_;
  ubatch_tokens& u = current_;
  u.seqs.assign(n, -1);
  u.positions.assign(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t index = 0;
    if (streams_ == 1) {
      // A unified cache: llama.cpp splits the batch in order (split_simple).
      index = consumed_ + i;
      if (index >= batch_seqs_.size())
        return fail("llama.cpp computes more tokens than the batch before_decode saw");
    } else {
      // One stream per sequence: the destination cell names the stream, and
      // so the sequence; its tokens come in batch order (split_equal).
      const auto s = static_cast<llama_seq_id>(cells_scratch_[i] / cells_per_stream);
      if (s < 0 || s >= options_.sequences)
        return fail("ubatch token " + std::to_string(i) + " is written to stream " + std::to_string(s) +
                    ", outside the glue's " + std::to_string(options_.sequences) + " sequences");
      auto& cursor = sequence_cursor_[static_cast<std::size_t>(s)];
      const auto& mine = batch_of_sequence_[static_cast<std::size_t>(s)];
      if (cursor >= static_cast<std::int32_t>(mine.size()))
        return fail("llama.cpp computes more tokens of sequence " + std::to_string(s) + " than the batch holds");
      index = static_cast<std::size_t>(mine[static_cast<std::size_t>(cursor++)]);
    }
    u.seqs[i] = batch_seqs_[index];
    u.positions[i] = batch_positions_[index];
    if (u.positions[i] != positions_scratch_[i])
      return fail("ubatch token " + std::to_string(i) + " has position " + std::to_string(positions_scratch_[i]) +
                  " in llama.cpp's graph where the glue expects position " + std::to_string(u.positions[i]) +
                  " of sequence " + std::to_string(u.seqs[i]) +
                  ": llama.cpp split the batch in an order the glue does not mirror");
  }
  consumed_ += n;
  // The sequences it touches, first seen first, and its queries sequence-major.
  u.sequences.clear();
  for (llama_seq_id s : u.seqs)
    if (std::find(u.sequences.begin(), u.sequences.end(), s) == u.sequences.end()) u.sequences.push_back(s);
  u.qo_indptr.assign(u.sequences.size() + 1, 0);
  u.order.clear();
  for (std::size_t b = 0; b < u.sequences.size(); ++b) {
    for (std::size_t i = 0; i < n; ++i)
      if (u.seqs[i] == u.sequences[b]) u.order.push_back(static_cast<std::int32_t>(i));
    u.qo_indptr[b + 1] = static_cast<std::int32_t>(u.order.size());
  }
  if (streams_ > 1) {
    // llama.cpp's views span the streams of consecutive sequence ids.
    const auto [low, high] = std::minmax_element(u.sequences.begin(), u.sequences.end());
    u.first_stream = *low;
    u.streams = *high - *low + 1;
  } else {
    u.first_stream = 0;
    u.streams = 1;
  }
  // The tokens join their sequences (in order: before_decode checked it).
  for (std::size_t i = 0; i < n; ++i) {
    auto& held = held_[static_cast<std::size_t>(u.seqs[i])];
    if (!held.empty() && u.positions[i] != held.back() + 1)
      return fail("sequence " + std::to_string(u.seqs[i]) + " appends position " + std::to_string(u.positions[i]) +
                  " after " + std::to_string(held.back()) + ": llama.cpp computed its tokens out of order");
    held.push_back(u.positions[i]);
  }
  return true;
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
  ggml_backend_tensor_get(cells, cells_scratch_.data(), 0, ggml_nbytes(cells));
  // The positions are read at the ubatch's first layer only: after the last
  // layer's ROPE, llama.cpp's allocator may hand their memory to a later
  // node (the cells are the K write's own input, alive when it is reported).
  if (layer == first_layer_) {
    positions_scratch_.resize(static_cast<std::size_t>(ggml_nelements(positions)));
    ggml_backend_tensor_get(positions, positions_scratch_.data(), 0, ggml_nbytes(positions));
    positions_scratch_.resize(n);  // M-RoPE stores more position rows; the first is the token's
  }
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;
  // The destination: [n_embd_k_gqa, cells] (one stream) or reshaped over
  // every stream's cells.
  const std::int64_t n_cells = t->ne[1] * t->ne[2];
  if (n_cells % streams_ != 0)
    return fail("layer " + std::to_string(layer) + ": the K cache's " + std::to_string(n_cells) +
                " cells do not split into " + std::to_string(streams_) + " streams");
  const std::int64_t per_stream = n_cells / streams_;

  if (layer == first_layer_) {
    if (!start_ubatch(n, per_stream)) return false;
  } else if (n != current_.positions.size()) {
    return fail("layer " + std::to_string(layer) + " writes " + std::to_string(n) + " tokens where layer " +
                std::to_string(first_layer_) + " wrote " + std::to_string(current_.positions.size()) +
                " in the same ubatch: the glue does not follow this graph");
  }
  if (layer == owner_[cache]) {
    std::string why;
    if (!caches_[cache].write(cells_scratch_.data(), current_.seqs.data(), current_.positions.data(), n, n_cells,
                              &why))
      return fail("layer " + std::to_string(layer) + ": " + why);
    cells_per_stream_[cache] = per_stream;
    last_cells_[cache] = cells_scratch_;
    current_.cells[cache] = cells_scratch_;
    slot_cells_[cache].ubatch = -1;
  } else if (cells_scratch_ != last_cells_[cache]) {
    return fail("layer " + std::to_string(layer) + " wrote other cells than layer " + std::to_string(owner_[cache]) +
                " of the same cache: the layers' cache assignment is not what the glue assumed (--global-layers)");
  }
  return true;
}

const eviction_glue::slot_cells& eviction_glue::cells_of_slots(std::int32_t cache) {
  slot_cells& sc = slot_cells_[cache];
  if (sc.ubatch == ubatch_) return sc;
  sc.ubatch = ubatch_;
  const auto& seqs = current_.sequences;
  sc.of_sequence.resize(seqs.size());
  std::vector<std::int32_t> index_of(static_cast<std::size_t>(options_.sequences), -1);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    index_of[static_cast<std::size_t>(seqs[b])] = static_cast<std::int32_t>(b);
    sc.of_sequence[b].assign(held_[static_cast<std::size_t>(seqs[b])].size(), -1);
  }
  const cell_map& map = caches_[cache];
  for (std::size_t c = 0; c < map.pos_of_cell.size(); ++c) {
    const llama_seq_id s = map.seq_of_cell[c];
    if (s < 0 || index_of[static_cast<std::size_t>(s)] < 0) continue;
    const auto& held = held_[static_cast<std::size_t>(s)];
    const auto it = std::lower_bound(held.begin(), held.end(), map.pos_of_cell[c]);
    if (it == held.end() || *it != map.pos_of_cell[c]) {
      fail("cache " + std::to_string(cache) + ": cell " + std::to_string(c) + " holds position " +
           std::to_string(map.pos_of_cell[c]) + " of sequence " + std::to_string(s) +
           ", which the sequence no longer holds");
      return sc;
    }
    sc.of_sequence[static_cast<std::size_t>(index_of[static_cast<std::size_t>(s)])]
                  [static_cast<std::size_t>(it - held.begin())] = static_cast<std::int32_t>(c);
  }
  return sc;
}

bool eviction_glue::check_mask(const ggml_tensor* mask, std::int32_t layer, std::int64_t n_kv,
                               std::int64_t tokens_per_stream, std::int32_t streams) {
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;
  if (mask == nullptr || (mask->type != GGML_TYPE_F16 && mask->type != GGML_TYPE_F32) || mask->ne[0] != n_kv ||
      mask->ne[1] < tokens_per_stream || mask->ne[3] != streams || mask->nb[0] != ggml_type_size(mask->type))
    return fail("layer " + std::to_string(layer) +
                ": the attention's mask is not an F16/F32 [n_kv, tokens, 1, streams] tensor");
  const bool f16 = mask->type == GGML_TYPE_F16;
  if (f16)
    mask16_.resize(ggml_nbytes(mask) / 2), ggml_backend_tensor_get(mask, mask16_.data(), 0, ggml_nbytes(mask));
  else
    mask32_.resize(ggml_nbytes(mask) / 4), ggml_backend_tensor_get(mask, mask32_.data(), 0, ggml_nbytes(mask));
  const cell_map& map = caches_[cache];
  const std::int64_t per_stream = cells_per_stream_[cache];
  const std::size_t element = ggml_type_size(mask->type);
  for (std::size_t u = 0; u < current_.seqs.size(); ++u) {
    const std::int64_t local_stream = static_cast<std::int64_t>(u) / tokens_per_stream;
    const std::int64_t row = static_cast<std::int64_t>(u) % tokens_per_stream;
    const std::size_t at = static_cast<std::size_t>(local_stream * mask->nb[3] + row * mask->nb[1]) / element;
    const llama_seq_id seq = current_.seqs[u];
    const llama_pos query = current_.positions[u];
    const std::int64_t base = streams_ > 1 ? (current_.first_stream + local_stream) * per_stream : 0;
    for (std::int64_t c = 0; c < per_stream; ++c) {
      const auto g = static_cast<std::size_t>(base + c);
      const llama_pos p = map.pos_of_cell[g];
      const bool expect = map.seq_of_cell[g] == seq && p <= query && (cache == 0 || query - p < n_swa_);
      const bool visible = c < n_kv && !(f16 ? hidden16(mask16_[at + static_cast<std::size_t>(c)])
                                             : hidden32(mask32_[at + static_cast<std::size_t>(c)]));
      if (visible != expect)
        return fail("layer " + std::to_string(layer) + " (" + (cache ? "sliding-window" : "full-attention") +
                    " cache): llama.cpp's mask " + (visible ? "shows" : "hides") + " cell " + std::to_string(c) +
                    (streams_ > 1 ? " of stream " + std::to_string(current_.first_stream + local_stream) : "") +
                    " to the query of sequence " + std::to_string(seq) + " at position " + std::to_string(query) +
                    ", where the cell map holds " +
                    (map.seq_of_cell[g] < 0 ? std::string("nothing")
                                            : "position " + std::to_string(p) + " of sequence " +
                                                  std::to_string(map.seq_of_cell[g])) +
                    " and expects it " + (expect ? "visible" : "hidden") +
                    ": llama.cpp's graph or cache rules are not what this glue mirrors");
    }
  }
  ++mask_checks_;
  return true;
}

bool eviction_glue::on_attention_node(ggml_tensor* t, std::int32_t layer, bool flash) {
  if (layer < 0 || layer >= n_layer_) return fail(std::string("attention node '") + t->name + "' names no layer");
  if (current_.seqs.empty() || !batch_open_)
    return fail(std::string("attention node '") + t->name + "' before any K write of the ubatch");
  flash_attention_ = flash ? 1 : 0;
  const int cache = sliding_[static_cast<std::size_t>(layer)] ? 1 : 0;
  const ggml_tensor* mask = flash ? t->src[3] : t->src[1];
  // Tokens per stream: the queries' second dimension.
  const ggml_tensor* shaped = flash ? t->src[0] : t;
  const std::int64_t n_kv = flash ? t->src[1]->ne[1] : t->ne[0];
  const std::int64_t per_stream = shaped->ne[1];
  if (shaped->ne[3] != current_.streams || per_stream * current_.streams != static_cast<std::int64_t>(current_.seqs.size()))
    return fail(std::string("'") + t->name + "' (layer " + std::to_string(layer) + ") computes " +
                std::to_string(per_stream) + " tokens in " + std::to_string(shaped->ne[3]) +
                " streams, where the ubatch has " + std::to_string(current_.seqs.size()) + " tokens in " +
                std::to_string(current_.streams));
  if (options_.check_every_layer || checked_ubatch_[cache] != ubatch_) {
    if (!check_mask(mask, layer, n_kv, per_stream, current_.streams)) return false;
    checked_ubatch_[cache] = ubatch_;
  }
  const std::int32_t model_layer = model_layer_of_[static_cast<std::size_t>(layer)];
  const llama_pos newest = *std::max_element(current_.positions.begin(), current_.positions.end());
  const bool observe = policy_ != nullptr && model_layer >= 0 && newest >= options_.observe_from;
  if (!observe && !options_.on_attention) return true;
  const auto start = clock_type::now();
  const bool good = flash ? observe_queries(t, layer, cache) : observe_probabilities(t, layer, cache);
  library_seconds_ += seconds_since(start);
  return good;
}

bool eviction_glue::observe_queries(const ggml_tensor* t, std::int32_t layer, std::int32_t cache) {
  float params[3] = {0.0f, 0.0f, 0.0f};  // scale, ALiBi max_bias, logit soft-cap
  std::memcpy(params, t->op_params, sizeof params);
  const std::string where = "layer " + std::to_string(layer) + " (flash attention): ";
  if (t->src[4] != nullptr)
    return fail(where + "attention sinks add a per-head logit to the softmax that the glue does not score");
  return observe_keys(t->src[0], key_view_of(t), params, layer, cache, model_, where);
}

bool eviction_glue::observe_keys(const ggml_tensor* q, const ggml_tensor* k, const float* params, std::int32_t layer,
                                 std::int32_t cache, const bridge::model_state& into, const std::string& where) {
  if (params[1] != 0.0f)
    return fail(where + "ALiBi (max_bias " + std::to_string(params[1]) +
                ") biases by position distance; the library's ALiBi measures slots: not supported");
  if (k == nullptr) return fail(where + "no K cache view below the attention node");
  if (q == nullptr || q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float) || q->ne[2] != n_head_ ||
      k->ne[2] != n_head_kv_ || q->ne[0] != k->ne[0] || k->ne[3] != q->ne[3])
    return fail(where + "the queries are not F32 [head_dim, tokens, " + std::to_string(n_head_) +
                " heads, streams] against a K view of " + std::to_string(n_head_kv_) + " KV heads");
  if (k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32)
    return fail(where + "the K cache is " + ggml_type_name(k->type) +
                ": the glue reads K as f16 or f32 only (use an f16 or f32 K cache, or flash attention off)");
  const std::size_t element = ggml_type_size(k->type);
  const auto d = static_cast<std::int32_t>(k->ne[0]);
  if (k->nb[0] != element || k->nb[1] % element != 0 || k->nb[2] % element != 0 || k->nb[3] % element != 0 ||
      (current_.streams > 1 && k->nb[3] != cells_per_stream_[cache] * k->nb[1]))
    return fail(where + "the K view's strides are not whole rows of one cache");
  const slot_cells& sc = cells_of_slots(cache);
  if (!ok()) return false;
  const auto& seqs = current_.sequences;
  const std::int64_t first_cell = current_.first_stream * cells_per_stream_[cache];
  const std::int64_t pages = current_.streams > 1 ? current_.streams * cells_per_stream_[cache] : k->ne[1];
  rows_.assign(seqs.begin(), seqs.end());
  indptr_.assign(seqs.size() + 1, 0);
  indices_.clear();
  last_page_len_.assign(seqs.size(), 1);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    // A slot whose position left this cache (outside every window of the
    // ubatch) is never read: it points at its stream's first cell.
    const std::int64_t fallback = (seqs[b] - current_.first_stream) * (current_.streams > 1 ? cells_per_stream_[cache] : 0);
    for (std::int32_t cell : sc.of_sequence[b]) {
      const std::int64_t page = cell >= 0 ? cell - first_cell : fallback;
      if (page < 0 || page >= pages)
        return fail(where + "cell " + std::to_string(cell) + " of sequence " + std::to_string(seqs[b]) +
                    " lies outside the " + std::to_string(pages) + " cells the flash-attention node reads");
      indices_.push_back(static_cast<std::int32_t>(page));
    }
    indptr_[b + 1] = static_cast<std::int32_t>(indices_.size());
  }
  // The queries, sequence-major: [query][head][head_dim], rounded to f16 as
  // the kernel rounds them before its dot products with K.
  const std::int64_t per_stream = q->ne[1];
  const auto n_queries = current_.order.size();
  queries_.resize(n_queries * static_cast<std::size_t>(n_head_) * static_cast<std::size_t>(d));
  for (std::size_t j = 0; j < n_queries; ++j) {
    const std::int64_t u = current_.order[j];
    const char* row = static_cast<const char*>(q->data) + (u / per_stream) * q->nb[3] + (u % per_stream) * q->nb[1];
    for (std::int32_t h = 0; h < n_head_; ++h) {
      float* out = queries_.data() + (j * static_cast<std::size_t>(n_head_) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(d);
      std::memcpy(out, row + h * q->nb[2], static_cast<std::size_t>(d) * sizeof(float));
      for (std::int32_t x = 0; x < d; ++x) out[x] = round_to_half(out[x]);
    }
  }
  bridge::attention attention;
  attention.softmax_scale = params[0];
  attention.logits_soft_cap = params[2];
  if (cache == 1) {
    // llama.cpp masks key p for query p1 when p1 - p >= n_swa: a window of n_swa - 1 positions back.
    attention.window_left = n_swa_ - 1;
    attention.window_left_unit = bridge::window_unit::positions;
  }
  const auto page_stride = static_cast<std::int64_t>(k->nb[1] / element);
  const auto head_stride = static_cast<std::int64_t>(k->nb[2] / element);
  const std::size_t reach = static_cast<std::size_t>((pages - 1) * page_stride + (n_head_kv_ - 1) * head_stride + d);
  const bridge::queries<float> qv = bridge::queries<float>::ragged(queries_.data(), queries_.size(),
                                                                    current_.qo_indptr.data(), n_head_, d);
  const bridge::state state = into.layer(model_layer_of_[static_cast<std::size_t>(layer)]).for_batch(rows_.data());
  const auto table_of = [&](auto* data) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(data)>>;
    bridge::paged_cache<T> keys;
    keys.k_pages = data;
    keys.k_size = reach;
    keys.k_layout = {page_stride, head_stride, page_stride};
    keys.v_layout = keys.k_layout;  // V absent (v_pages null): observe reads only K
    keys.indptr = indptr_.data();
    keys.indices = indices_.data();
    keys.indices_size = indices_.size();
    keys.last_page_len = last_page_len_.data();
    keys.batch = static_cast<std::int32_t>(seqs.size());
    keys.kv_heads = n_head_kv_;
    keys.head_dim = d;
    keys.page_size = 1;
    keys.num_pages = static_cast<std::int32_t>(pages);
    keys.max_pages_per_sequence = shape_.capacity;
    return keys;
  };
  if (k->type == GGML_TYPE_F16)
    return !library("observe_queries",
                    policy_->observe_queries_f16(settings_, table_of(static_cast<bridge::fp16_bits*>(k->data)), state,
                                                 qv, bridge::lse{}, attention));
  return !library("observe_queries", policy_->observe_queries_f32(settings_, table_of(static_cast<float*>(k->data)),
                                                                  state, qv, bridge::lse{}, attention));
}

bool eviction_glue::observe_probabilities(const ggml_tensor* t, std::int32_t layer, std::int32_t cache) {
  const std::int64_t n_kv = t->ne[0], per_stream = t->ne[1], heads = t->ne[2];
  if (t->type != GGML_TYPE_F32 || heads != n_head_ || !ggml_is_contiguous(t))
    return fail(std::string("'") + t->name + "' is not an F32 [n_kv, tokens, n_head, streams] tensor");
  const slot_cells& sc = cells_of_slots(cache);
  if (!ok()) return false;
  const auto& seqs = current_.sequences;
  std::int32_t columns = 0;
  for (llama_seq_id s : seqs) columns = std::max(columns, held(s));
  gathered_.resize(static_cast<std::size_t>(ggml_nelements(t)));
  ggml_backend_tensor_get(t, gathered_.data(), 0, ggml_nbytes(t));
  // [query (sequence-major)][head][slot]: the library's ragged layout.
  const auto n_queries = current_.order.size();
  dense_.assign(n_queries * static_cast<std::size_t>(n_head_) * static_cast<std::size_t>(columns), 0.0f);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const std::int64_t base = streams_ > 1 ? seqs[b] * cells_per_stream_[cache] : 0;
    const auto& cells = sc.of_sequence[b];
    for (auto j = static_cast<std::size_t>(current_.qo_indptr[b]); j < static_cast<std::size_t>(current_.qo_indptr[b + 1]); ++j) {
      const std::int64_t u = current_.order[j];
      const std::int64_t local_stream = u / per_stream, row = u % per_stream;
      for (std::int64_t h = 0; h < heads; ++h) {
        const float* in = gathered_.data() + ((local_stream * heads + h) * per_stream + row) * n_kv;
        float* out = dense_.data() + (j * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(columns);
        for (std::size_t s = 0; s < cells.size(); ++s) {
          if (cells[s] < 0) continue;
          const std::int64_t c = cells[s] - base;
          if (c < 0 || c >= n_kv)
            return fail("layer " + std::to_string(layer) + ": cell " + std::to_string(cells[s]) +
                        " lies outside the " + std::to_string(n_kv) + " cells of the probabilities");
          out[s] = in[c];
        }
      }
    }
  }
  if (options_.on_attention) {
    // One sequence: [head][query][slot].
    const auto q_len = static_cast<std::int32_t>(n_queries);
    queries_.assign(dense_.size(), 0.0f);
    for (std::int32_t j = 0; j < q_len; ++j)
      for (std::int32_t h = 0; h < n_head_; ++h)
        std::memcpy(queries_.data() + (static_cast<std::size_t>(h) * q_len + j) * static_cast<std::size_t>(columns),
                    dense_.data() + (static_cast<std::size_t>(j) * n_head_ + h) * static_cast<std::size_t>(columns),
                    static_cast<std::size_t>(columns) * sizeof(float));
    options_.on_attention(layer, queries_.data(), n_head_, q_len, columns);
  }
  if (policy_ == nullptr || model_layer_of_[static_cast<std::size_t>(layer)] < 0) return true;
  // Observe reads only the sequences' lengths from the table: each sequence's
  // slots get ids of their own.
  rows_.assign(seqs.begin(), seqs.end());
  indptr_.assign(seqs.size() + 1, 0);
  indices_.clear();
  last_page_len_.assign(seqs.size(), 1);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    for (std::int32_t s = 0; s < held(seqs[b]); ++s) indices_.push_back(static_cast<std::int32_t>(indices_.size()));
    indptr_[b + 1] = static_cast<std::int32_t>(indices_.size());
  }
  const bridge::token_table table = rows_table(static_cast<std::int32_t>(indices_.size()));
  const bridge::probabilities probs = bridge::probabilities::ragged(dense_.data(), dense_.size(),
                                                                    current_.qo_indptr.data(), n_head_, columns);
  if (library("observe_probabilities", policy_->observe_probabilities(
                                           settings_, table, layer_state(layer).for_batch(rows_.data()), probs)))
    return false;
  if (!options_.shadow_queries) return true;
  // The shadow: the same layer observed from the queries and K cells that
  // llama.cpp multiplied (kq = mul_mat(k, q) below the softmax), as the
  // flash-attention path observes them.
  const ggml_tensor* kq = t->src[0];
  for (int depth = 0; kq != nullptr && depth < 4 && kq->op != GGML_OP_MUL_MAT; ++depth) {
    if (kq->op == GGML_OP_UNARY)  // tanh: soft-capped logits
      return fail("layer " + std::to_string(layer) + ": the shadow does not mirror soft-capped logits");
    kq = kq->src[0];
  }
  if (kq == nullptr || kq->op != GGML_OP_MUL_MAT)
    return fail("layer " + std::to_string(layer) + ": no kq = mul_mat(k, q) below '" + t->name + "'");
  float params[3] = {0.0f, 0.0f, 0.0f};
  std::memcpy(params, t->op_params, 2 * sizeof(float));  // soft_max_ext: scale, max_bias
  return observe_keys(kq->src[1], kq->src[0], params, layer, cache, shadow_,
                      "layer " + std::to_string(layer) + " (shadow of " + t->name + "): ");
}

bridge::state eviction_glue::layer_state(std::int32_t layer) const {
  return model_.layer(model_layer_of_[static_cast<std::size_t>(layer)]);
}

bool eviction_glue::after_decode() {
  if (!ok()) return false;
  if (!batch_open_) return fail("after_decode without before_decode");
  batch_open_ = false;
  if (consumed_ == 0)
    return fail("llama_decode ran no graph the glue saw: the context was not created with configure()'s parameters "
                "(its cb_eval callback)");
  if (consumed_ != batch_seqs_.size())
    return fail("the glue saw " + std::to_string(consumed_) + " of the batch's " +
                std::to_string(batch_seqs_.size()) + " tokens computed");
  std::vector<char> touched(static_cast<std::size_t>(options_.sequences), 0);
  for (llama_seq_id s : batch_seqs_) touched[static_cast<std::size_t>(s)] = 1;
  for (llama_seq_id s = 0; s < options_.sequences; ++s) {
    if (!touched[static_cast<std::size_t>(s)]) continue;
    const auto& held = held_[static_cast<std::size_t>(s)];
    const std::string seq = "sequence " + std::to_string(s) + ": ";
    // What llama.cpp reports must agree with the maps.
    const llama_pos pos_max = llama_memory_seq_pos_max(memory_, s);
    const llama_pos pos_min = llama_memory_seq_pos_min(memory_, s);
    if (held.empty() || pos_max != held.back())
      return fail(seq + "llama_memory_seq_pos_max says " + std::to_string(pos_max) + ", the glue's newest position is " +
                  std::to_string(held.empty() ? -1 : held.back()));
    // An iSWA cache reports the sliding-window cache's oldest position.
    llama_pos expected_min = held.front();
    if (owner_[1] >= 0) {
      const auto in_window = caches_[1].positions(s);
      expected_min = in_window.empty() ? -1 : in_window.front();
    }
    if (pos_min != expected_min)
      return fail(seq + "llama_memory_seq_pos_min says " + std::to_string(pos_min) + ", the cell map expects " +
                  std::to_string(expected_min));
    if (caches_[0].positions(s) != held)
      return fail(seq + "the full-attention cache's cells hold " + std::to_string(caches_[0].held(s)) +
                  " positions, the sequence " + std::to_string(held.size()) + ": they differ");
  }
  return true;
}

bridge::token_table eviction_glue::budget_table() {
  rows_.clear();
  for (llama_seq_id s = 0; s < options_.sequences; ++s)
    if (held(s) >= options_.budget) rows_.push_back(s);
  const auto batch = rows_.size();
  indptr_.assign(batch + 1, 0);
  last_page_len_.assign(batch, 1);
  std::vector<std::int32_t> index_of(static_cast<std::size_t>(options_.sequences), -1);
  for (std::size_t b = 0; b < batch; ++b) {
    index_of[static_cast<std::size_t>(rows_[b])] = static_cast<std::int32_t>(b);
    indptr_[b + 1] = indptr_[b] + held(rows_[b]);
  }
  indices_.assign(static_cast<std::size_t>(indptr_[batch]), -1);
  const cell_map& map = caches_[0];
  for (std::size_t c = 0; c < map.pos_of_cell.size(); ++c) {
    const llama_seq_id s = map.seq_of_cell[c];
    if (s < 0 || index_of[static_cast<std::size_t>(s)] < 0) continue;
    const auto& mine = held_[static_cast<std::size_t>(s)];
    const auto slot = std::lower_bound(mine.begin(), mine.end(), map.pos_of_cell[c]) - mine.begin();
    indices_[static_cast<std::size_t>(indptr_[static_cast<std::size_t>(index_of[static_cast<std::size_t>(s)])] + slot)] =
        static_cast<std::int32_t>(c);
  }
  return rows_table(static_cast<std::int32_t>(map.pos_of_cell.size()));
}

bridge::token_table eviction_glue::rows_table(std::int32_t num_pages) const {
  bridge::token_table table;
  table.indptr = indptr_.data();
  table.indices = indices_.data();
  table.indices_size = indices_.size();
  table.last_page_len = last_page_len_.data();
  table.batch = static_cast<std::int32_t>(rows_.size());
  table.kv_heads = n_head_kv_;
  table.page_size = 1;
  table.num_pages = std::max<std::int32_t>(1, num_pages);
  table.max_pages_per_sequence = shape_.capacity;
  return table;
}

bridge::selection eviction_glue::selection_buffers() {
  bridge::selection selection;
  selection.stride = stride_;
  selection.counts = counts_.data();
  selection.slots = slots_.data();
  selection.cache_slots = cache_slots_.data();
  selection.out.new_lengths = new_lengths_.data();
  selection.out.freed_pages = freed_pages_.data();
  return selection;
}

bool eviction_glue::apply_selection(const bridge::token_table& table, const bridge::selection& selection,
                                    bool check_cells) {
  // The engine's part: remove the chosen positions from every cache.
  const auto removal = clock_type::now();
  for (std::size_t b = 0; b < rows_.size(); ++b) {
    const llama_seq_id s = rows_[b];
    const auto& mine = held_[static_cast<std::size_t>(s)];
    for (std::int32_t e = 0; e < counts_[b]; ++e) {
      const std::size_t at = b * static_cast<std::size_t>(stride_) + static_cast<std::size_t>(e);
      const auto slot = static_cast<std::size_t>(slots_[at]);
      const llama_pos p = mine[slot];
      const std::int32_t cell = indices_[static_cast<std::size_t>(indptr_[b]) + slot];
      if (check_cells && cache_slots_[at] != cell)
        return fail("select named cell " + std::to_string(cache_slots_[at]) + " for slot " + std::to_string(slot) +
                    " of sequence " + std::to_string(s) + ", whose cell is " + std::to_string(cell));
      if (!llama_memory_seq_rm(memory_, s, p, p + 1))
        return fail("llama_memory_seq_rm refused position " + std::to_string(p) + " of sequence " + std::to_string(s));
      caches_[0].remove(s, p);
      caches_[1].remove(s, p);
    }
  }
  removal_seconds_ += seconds_since(removal);
  const auto forget_start = clock_type::now();
  for (std::int32_t layer : scored_) {  // the table of before the removal: forget reads the old lengths
    const std::int32_t l = model_layer_of_[static_cast<std::size_t>(layer)];
    if (library("forget", policy_->forget(settings_, table, model_.layer(l).for_batch(rows_.data()), selection)))
      return false;
    if (options_.shadow_queries &&
        library("forget", policy_->forget(settings_, table, shadow_.layer(l).for_batch(rows_.data()), selection)))
      return false;
  }
  for (std::size_t b = 0; b < rows_.size(); ++b) {
    const llama_seq_id s = rows_[b];
    auto& mine = held_[static_cast<std::size_t>(s)];
    // Drop the evicted positions (slots ascending: erase from the back).
    for (std::int32_t e = counts_[b] - 1; e >= 0; --e) {
      const auto slot = static_cast<std::size_t>(slots_[b * static_cast<std::size_t>(stride_) + static_cast<std::size_t>(e)]);
      if (options_.record_evictions) evicted_log_[static_cast<std::size_t>(s)].push_back(mine[slot]);
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(slot));
    }
    evicted_ += counts_[b];
  }
  library_seconds_ += seconds_since(forget_start);
  return true;
}

bool eviction_glue::choose(std::vector<std::vector<llama_pos>>* chosen, bool shadow) {
  if (!ok()) return false;
  if (shadow && !options_.shadow_queries) return fail("choose: the glue keeps no shadow (glue_options::shadow_queries)");
  if (batch_open_) return fail("choose: a batch is open (before_decode without after_decode)");
  chosen->assign(static_cast<std::size_t>(options_.sequences), {});
  if (policy_ == nullptr) return true;
  const bridge::token_table table = budget_table();
  if (rows_.empty()) return true;
  const std::size_t bytes = policy_->select_workspace_bytes(table, shape_);
  if (workspace_.size() < bytes + 256) workspace_.assign(bytes + 256, 0);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(workspace_.data());
  void* workspace = workspace_.data() + ((256 - base % 256) % 256);
  if (library("select", policy_->select(settings_, table, (shadow ? shadow_ : model_).for_batch(rows_.data()),
                                        options_.budget, workspace, bytes, selection_buffers(), nullptr)))
    return false;
  for (std::size_t b = 0; b < rows_.size(); ++b)
    for (std::int32_t e = 0; e < counts_[b]; ++e)
      (*chosen)[static_cast<std::size_t>(rows_[b])].push_back(
          held_[static_cast<std::size_t>(rows_[b])][static_cast<std::size_t>(
              slots_[b * static_cast<std::size_t>(stride_) + static_cast<std::size_t>(e)])]);
  return true;
}

bool eviction_glue::evict() {
  const auto start = clock_type::now();
  bool good = ok();
  if (good && batch_open_) good = fail("evict: a batch is open (before_decode without after_decode)");
  if (good && policy_ != nullptr) {
    // The sequences at their budget, each with its full-attention cells in
    // position order: a page-size-1 table, as a slot allocator keeps it.
    const auto lib_start = clock_type::now();
    const bridge::token_table table = budget_table();
    if (!rows_.empty()) {
      const std::size_t bytes = policy_->select_workspace_bytes(table, shape_);
      if (workspace_.size() < bytes + 256) workspace_.assign(bytes + 256, 0);
      const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(workspace_.data());
      void* workspace = workspace_.data() + ((256 - base % 256) % 256);
      const bridge::selection selection = selection_buffers();
      good = !library("select", policy_->select(settings_, table, model_.for_batch(rows_.data()), options_.budget,
                                                workspace, bytes, selection, nullptr));
      library_seconds_ += seconds_since(lib_start);
      good = good && apply_selection(table, selection, true);
      for (std::size_t b = 0; good && b < rows_.size(); ++b)
        if (held(rows_[b]) != new_lengths_[b])
          good = fail("sequence " + std::to_string(rows_[b]) + " holds " + std::to_string(held(rows_[b])) +
                      " positions after eviction, select said " + std::to_string(new_lengths_[b]));
    }
  }
  evict_seconds_ += seconds_since(start);
  return good;
}

bool eviction_glue::evict_positions(const std::vector<std::vector<llama_pos>>& positions) {
  if (!ok()) return false;
  if (batch_open_) return fail("evict_positions: a batch is open (before_decode without after_decode)");
  if (policy_ == nullptr) return fail("evict_positions: the glue has no policy (reads only)");
  // Every sequence with positions to remove, as a selection of its slots.
  rows_.clear();
  for (llama_seq_id s = 0; s < options_.sequences && static_cast<std::size_t>(s) < positions.size(); ++s)
    if (!positions[static_cast<std::size_t>(s)].empty()) rows_.push_back(s);
  if (rows_.empty()) return true;
  const std::vector<llama_seq_id> seqs = rows_;
  // budget_table lists the sequences at their budget: list these instead.
  const std::int32_t budget = options_.budget;
  options_.budget = 1;
  bridge::token_table table = budget_table();
  options_.budget = budget;
  std::vector<std::int32_t> index_of(static_cast<std::size_t>(options_.sequences), -1);
  for (std::size_t b = 0; b < rows_.size(); ++b) index_of[static_cast<std::size_t>(rows_[b])] = static_cast<std::int32_t>(b);
  std::fill(counts_.begin(), counts_.end(), 0);
  for (llama_seq_id s : seqs) {
    const auto b = static_cast<std::size_t>(index_of[static_cast<std::size_t>(s)]);
    const auto& mine = held_[static_cast<std::size_t>(s)];
    const auto& wanted = positions[static_cast<std::size_t>(s)];
    if (static_cast<std::int32_t>(wanted.size()) > stride_)
      return fail("evict_positions: " + std::to_string(wanted.size()) + " positions of sequence " + std::to_string(s) +
                  ", above the " + std::to_string(stride_) + " one eviction can remove");
    for (std::size_t e = 0; e < wanted.size(); ++e) {
      const auto it = std::lower_bound(mine.begin(), mine.end(), wanted[e]);
      if (it == mine.end() || *it != wanted[e] || (e > 0 && wanted[e] <= wanted[e - 1]))
        return fail("evict_positions: position " + std::to_string(wanted[e]) + " of sequence " + std::to_string(s) +
                    " is not held, or the positions are not ascending");
      slots_[b * static_cast<std::size_t>(stride_) + e] = static_cast<std::int32_t>(it - mine.begin());
    }
    counts_[b] = static_cast<std::int32_t>(wanted.size());
  }
  return apply_selection(table, selection_buffers(), false);
}

bool eviction_glue::eviction_scores(std::vector<float>* values, std::vector<llama_seq_id>* sequences, bool shadow) {
  if (!ok()) return false;
  if (shadow && !options_.shadow_queries)
    return fail("eviction_scores: the glue keeps no shadow (glue_options::shadow_queries)");
  values->clear();
  sequences->clear();
  if (policy_ == nullptr) return true;
  const bridge::token_table table = budget_table();
  if (rows_.empty()) return true;
  *sequences = rows_;
  const auto layers = static_cast<std::int32_t>(scored_.size());
  values->assign(static_cast<std::size_t>(layers) * rows_.size() * static_cast<std::size_t>(shape_.capacity), 0.0f);
  bridge::partial_scores partial;
  partial.values = values->data();
  partial.size = values->size();
  partial.layers = layers;
  partial.batch = static_cast<std::int32_t>(rows_.size());
  partial.capacity = shape_.capacity;
  partial.kv_heads = n_head_kv_;
  return !library("local_scores", policy_->local_scores(settings_, table,
                                                        (shadow ? shadow_ : model_).for_batch(rows_.data()),
                                                        options_.budget, partial));
}

}  // namespace sh_llama
