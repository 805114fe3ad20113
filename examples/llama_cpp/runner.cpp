#include "runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

namespace sh_llama {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// llama.cpp's own context shift, as llama-cli and the server do it: keep
// n_keep tokens (the BOS), discard half of the rest, shift the remaining
// positions back (a K-shift: RoPE re-rotation of every cached key).
void context_shift(llama_memory_t memory, llama_pos& n_past, llama_pos n_keep) {
  const llama_pos n_discard = (n_past - n_keep) / 2;
  llama_memory_seq_rm(memory, 0, n_keep, n_keep + n_discard);
  llama_memory_seq_add(memory, 0, n_keep + n_discard, n_past, -n_discard);
  n_past -= n_discard;
}

// e^x for x in [-87, 0] (below: 2^-126's neighbourhood, far under float's
// share of a sum of 262,144 terms): 2^n e^r with |r| <= ln2/2 and e^r by its
// Taylor series to r^7 (relative error under 1e-7); branch-free so that the
// loop below vectorises. NaN stays NaN (no float-to-int conversion of it).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  // Adding 1.5 * 2^23 rounds to an integer n, which then sits in the low bits.
  constexpr float shifter = 12582912.0f;
  constexpr std::uint32_t shifter_bits = 0x4B400000u;
  const float shifted = x * 1.44269504088896341f + shifter;
  const float n = shifted - shifter;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln 2 in two parts
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  std::uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - shifter_bits + 127u) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace

double negative_log_prob(const float* logits, std::int32_t vocab, llama_token target) {
  // Blocks of 256: e^(x - top) of each in float (a loop the compiler
  // vectorises), summed in float lanes of 16 terms, the lanes in double.
  constexpr std::int32_t block = 256, lanes = 16;
  float top = logits[0];
  for (std::int32_t v = 1; v < vocab; ++v) top = logits[v] > top ? logits[v] : top;
  double sum = 0.0;
  float terms[block];
  for (std::int32_t b = 0; b < vocab; b += block) {
    const std::int32_t n = std::min(block, vocab - b);
    for (std::int32_t v = 0; v < n; ++v) terms[v] = exp_nonpositive(logits[b + v] - top);
    if (n < block) {
      for (std::int32_t v = 0; v < n; ++v) sum += terms[v];
      break;
    }
    float lane[lanes] = {};
    for (std::int32_t v = 0; v < block; v += lanes)
      for (std::int32_t l = 0; l < lanes; ++l) lane[l] += terms[v + l];
    for (std::int32_t l = 0; l < lanes; ++l) sum += lane[l];
  }
  return -(static_cast<double>(logits[target]) - static_cast<double>(top) - std::log(sum));
}

void set_batch(llama_batch& batch, const llama_token* tokens, std::int32_t count, llama_pos first,
               std::int32_t first_logit) {
  batch.n_tokens = count;
  for (std::int32_t j = 0; j < count; ++j) {
    batch.token[j] = tokens[j];
    batch.pos[j] = first + j;
    batch.n_seq_id[j] = 1;
    batch.seq_id[j][0] = 0;
    batch.logits[j] = j >= first_logit || j == count - 1;
  }
}

llama_context* make_context(llama_model* model, std::int32_t n_ctx, std::int32_t ubatch, std::int32_t threads,
                            eviction_glue* glue, bool f32_cache, llama_flash_attn_type flash_attn) {
  llama_context_params params = llama_context_default_params();
  params.n_ctx = static_cast<std::uint32_t>(n_ctx);
  params.n_batch = params.n_ubatch = static_cast<std::uint32_t>(ubatch);  // one ubatch per llama_decode
  params.n_threads = params.n_threads_batch = threads;
  params.n_seq_max = 1;
  params.flash_attn_type = flash_attn;  // the same kernels with and without the glue
  params.no_perf = true;
  if (f32_cache) params.type_k = params.type_v = GGML_TYPE_F32;
  if (glue != nullptr) glue->configure(params);
  return llama_init_from_model(model, params);
}

run_result run_text(llama_model* model, const std::vector<llama_token>& tokens, const method& how,
                    const run_options& run) {
  run_result result;
  const auto start = clock_type::now();
  const std::int32_t total = static_cast<std::int32_t>(tokens.size());
  const std::int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const bool prefill = run.prompt > 0;
  const bool library = how.type == method::kind::library;
  const bool shift = how.type == method::kind::context_shift;

  // SnapKV's observation window: the prompt's last queries, a ubatch of their own.
  const std::int32_t observe_from = library && prefill && how.observe_last > 0 ? run.prompt - how.observe_last : 0;
  std::unique_ptr<eviction_glue> glue;
  if (library || run.on_attention) {
    glue_options options;
    // Decode: evict m = chunk at the budget, so the cache peaks at B.
    // Prefill: one eviction to exactly B (select leaves budget - m).
    bridge::settings settings = how.settings;
    settings.evict_count = prefill ? 1 : run.chunk;
    if (how.recent_percent >= 0.0)
      settings.recent = static_cast<std::int32_t>(std::lround(how.recent_percent / 100.0 * run.budget));
    options.budget = library ? (prefill ? run.budget + 1 : run.budget) : total;
    options.max_step_tokens = run.chunk;
    options.capacity = prefill || !library ? total : 0;
    options.scores = run.scores;
    options.global_layers = run.global_layers;
    options.observe_from = std::max(observe_from, 0);
    options.on_attention = run.on_attention;
    options.record_evictions = run.record_evictions;
    glue = std::make_unique<eviction_glue>(model, library ? how.policy : nullptr, settings, options);
    if (!glue->ok()) {
      result.error = glue->error();
      return result;
    }
  }
  // The full cache (and every prefill run) holds the whole text; context
  // shift and the library hold the budget (llama.cpp pads n_ctx to 256).
  const std::int32_t n_ctx = (how.type == method::kind::full || prefill) ? total : run.budget;
  llama_context* ctx = make_context(model, std::max(n_ctx, run.chunk), run.chunk, run.threads, glue.get(), run.f32_cache,
                                    run.flash_attn);
  if (ctx == nullptr) {
    result.error = "llama_init_from_model failed";
    return result;
  }
  if (glue && !glue->attach(ctx)) {
    result.error = glue->error();
    llama_free(ctx);
    return result;
  }
  llama_memory_t memory = llama_get_memory(ctx);
  llama_batch batch = llama_batch_init(run.chunk, 0, 1);
  llama_pos n_past = 0;
  if (run.keep_logits) result.logits.reserve(static_cast<std::size_t>(total) * static_cast<std::size_t>(vocab));
  result.token_nll.assign(tokens.size(), 0.0);
  const bool may_reuse = run.full_nll != nullptr && run.full_nll->size() == tokens.size() && !prefill &&
                         !run.keep_logits && (library || shift);
  bool shifted = false;

  for (std::int32_t at = 0; at < total;) {
    // Prefill: the prompt's last chunk ends at P exactly. Decode: the step
    // that reaches the budget ends at it, so that the cache never holds more.
    std::int32_t count = std::min(run.chunk, total - at);
    if (prefill && at < run.prompt) count = std::min(count, run.prompt - at);
    if (!prefill && library && at < run.budget) count = std::min(count, run.budget - at);
    if (observe_from > 0 && at < observe_from) count = std::min(count, observe_from - at);
    if (shift && !prefill && n_past + count > run.budget) {
      context_shift(memory, n_past, 1);
      shifted = true;
    }
    // Nothing evicted or shifted yet: the full cache's predictions, reused.
    const bool reuse = may_reuse && !shifted && (!library || glue->evicted() == 0);
    // Logits only where a prediction is computed (prefill: from token P-1 on),
    // or every one for the reads-only check.
    const std::int32_t first_logit =
        reuse ? count - 1 : prefill && !run.keep_logits ? std::max(0, run.prompt - 1 - at) : 0;
    set_batch(batch, tokens.data() + at, count, n_past, first_logit);
    const auto decode_start = clock_type::now();
    if (glue && !glue->before_decode(batch)) {
      result.error = glue->error();
      break;
    }
    const int rc = llama_decode(ctx, batch);
    result.decode_seconds += seconds_since(decode_start);
    if (rc != 0 || (glue && !glue->after_decode())) {
      result.error = glue && !glue->ok() ? glue->error() : "llama_decode returned " + std::to_string(rc);
      break;
    }
    n_past += count;
    const std::int32_t held = glue ? glue->held() : static_cast<std::int32_t>(llama_memory_seq_pos_max(memory, 0) -
                                                                               llama_memory_seq_pos_min(memory, 0) + 1);
    result.peak_cells = std::max(result.peak_cells, held);
    for (std::int32_t j = reuse ? 0 : std::min(first_logit, count - 1); j < count; ++j) {
      const std::int32_t next = at + j + 1;
      const float* logits = reuse ? nullptr : llama_get_logits_ith(ctx, j);
      if (run.keep_logits) result.logits.insert(result.logits.end(), logits, logits + vocab);
      if (next < total && (!prefill || next >= run.prompt)) {
        const auto n = static_cast<std::size_t>(next);
        result.token_nll[n] = reuse ? (*run.full_nll)[n] : negative_log_prob(logits, vocab, tokens[n]);
        result.nll_sum += result.token_nll[n];
        ++result.predictions;
        result.reused += reuse ? 1 : 0;
      }
    }
    at += count;
    // Decode: after every step. Prefill: once, when the prompt is in.
    if (glue && library && (!prefill || at == run.prompt)) {
      const auto evict_start = clock_type::now();
      const bool good = glue->evict();
      result.decode_seconds += seconds_since(evict_start);
      if (!good) {
        result.error = glue->error();
        break;
      }
    }
  }
  if (glue) {
    result.evicted = glue->evicted();
    result.mask_checks = glue->mask_checks();
    result.library_seconds = glue->library_seconds();
    result.removal_seconds = glue->removal_seconds();
    result.callback_seconds = glue->callback_seconds();
    result.evict_seconds = glue->evict_seconds();
    result.evicted_positions = glue->evicted_positions();
    result.flash_attention = glue->flash_attention();
  }
  llama_batch_free(batch);
  llama_free(ctx);
  result.seconds = seconds_since(start);
  return result;
}

interleaved_result run_interleaved(llama_model* model, const std::vector<std::vector<llama_token>>& texts,
                                   const method& how, const run_options& run, std::int32_t sequences, bool unified) {
  interleaved_result result;
  const auto start = clock_type::now();
  if (how.type != method::kind::library) {
    result.error = "run_interleaved: a library preset only";
    return result;
  }
  if (run.prompt > 0) {
    result.error = "run_interleaved: the decode protocol only";
    return result;
  }
  const std::int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  bridge::settings settings = how.settings;
  settings.evict_count = run.chunk;
  if (how.recent_percent >= 0.0)
    settings.recent = static_cast<std::int32_t>(std::lround(how.recent_percent / 100.0 * run.budget));
  glue_options options;
  options.budget = run.budget;
  options.max_step_tokens = run.chunk;
  options.sequences = sequences;
  options.scores = run.scores;
  options.global_layers = run.global_layers;
  options.record_evictions = true;
  eviction_glue glue(model, how.policy, settings, options);
  if (!glue.ok()) {
    result.error = glue.error();
    return result;
  }
  llama_context_params params = llama_context_default_params();
  // Cells for every sequence (llama.cpp splits n_ctx between the streams),
  // each as many as run_text's context has (its steps end at the budget
  // too): a stream of another size places new cells elsewhere, and
  // llama.cpp's flash-attention kernel sums V in cell order.
  params.n_ctx = static_cast<std::uint32_t>(sequences * ((run.budget + 255) / 256 * 256));
  params.n_batch = params.n_ubatch = static_cast<std::uint32_t>(sequences * run.chunk);
  params.n_threads = params.n_threads_batch = run.threads;
  params.flash_attn_type = run.flash_attn;
  params.kv_unified = unified;
  params.no_perf = true;
  if (run.f32_cache) params.type_k = params.type_v = GGML_TYPE_F32;
  glue.configure(params);
  llama_context* ctx = llama_init_from_model(model, params);
  if (ctx == nullptr || !glue.attach(ctx)) {
    result.error = ctx == nullptr ? "llama_init_from_model failed" : glue.error();
    if (ctx != nullptr) llama_free(ctx);
    return result;
  }
  result.texts.resize(texts.size());
  // Per sequence: the text it runs (-1: idle) and how far it is.
  std::vector<std::int32_t> text_of(static_cast<std::size_t>(sequences), -1), at(static_cast<std::size_t>(sequences), 0);
  std::size_t next_text = 0;
  llama_batch batch = llama_batch_init(sequences * run.chunk, 0, 1);
  struct token_ref {
    std::int32_t text, index;  // the logit at this batch row predicts tokens[index + 1] of the text
  };
  std::vector<token_ref> rows;
  for (;;) {
    // Idle sequences take the next texts (a finished one was ended).
    for (llama_seq_id s = 0; s < sequences; ++s) {
      auto& mine = text_of[static_cast<std::size_t>(s)];
      bool ended = false;
      if (mine >= 0 && at[static_cast<std::size_t>(s)] >= static_cast<std::int32_t>(texts[static_cast<std::size_t>(mine)].size())) {
        if (!glue.end_sequence(s)) {
          result.error = glue.error();
          break;
        }
        mine = -1;
        ended = true;
      }
      if (mine < 0 && next_text < texts.size()) {
        mine = static_cast<std::int32_t>(next_text++);
        at[static_cast<std::size_t>(s)] = 0;
        if (ended) ++result.restarts;  // a sequence that ran a text starts another
      }
    }
    if (!result.error.empty()) break;
    // One step of every running text: run_text's decode steps (the step
    // that reaches the budget ends at it).
    batch.n_tokens = 0;
    rows.clear();
    for (llama_seq_id s = 0; s < sequences; ++s) {
      const std::int32_t t = text_of[static_cast<std::size_t>(s)];
      if (t < 0) continue;
      const auto& tokens = texts[static_cast<std::size_t>(t)];
      const std::int32_t from = at[static_cast<std::size_t>(s)];
      std::int32_t count = std::min(run.chunk, static_cast<std::int32_t>(tokens.size()) - from);
      if (from < run.budget) count = std::min(count, run.budget - from);
      for (std::int32_t j = 0; j < count; ++j) {
        const std::int32_t i = batch.n_tokens++;
        batch.token[i] = tokens[static_cast<std::size_t>(from + j)];
        batch.pos[i] = from + j;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = s;
        batch.logits[i] = 1;
        rows.push_back({t, from + j});
      }
      at[static_cast<std::size_t>(s)] += count;
    }
    if (batch.n_tokens == 0) break;  // every text done
    if (!glue.before_decode(batch)) {
      result.error = glue.error();
      break;
    }
    const int rc = llama_decode(ctx, batch);
    ++result.decodes;
    if (rc != 0 || !glue.after_decode()) {
      result.error = !glue.ok() ? glue.error() : "llama_decode returned " + std::to_string(rc);
      break;
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& tokens = texts[static_cast<std::size_t>(rows[i].text)];
      const auto next = static_cast<std::size_t>(rows[i].index + 1);
      if (next >= tokens.size()) continue;
      run_result& r = result.texts[static_cast<std::size_t>(rows[i].text)];
      r.nll_sum += negative_log_prob(llama_get_logits_ith(ctx, static_cast<std::int32_t>(i)), vocab, tokens[next]);
      ++r.predictions;
    }
    for (llama_seq_id s = 0; s < sequences; ++s) {
      const std::int32_t t = text_of[static_cast<std::size_t>(s)];
      if (t >= 0) result.texts[static_cast<std::size_t>(t)].peak_cells =
                      std::max(result.texts[static_cast<std::size_t>(t)].peak_cells, glue.held(s));
    }
    // The evictions of this step, per text: the log grows at the back.
    std::vector<std::size_t> logged(static_cast<std::size_t>(sequences));
    for (llama_seq_id s = 0; s < sequences; ++s) logged[static_cast<std::size_t>(s)] = glue.evicted_positions(s).size();
    if (!glue.evict()) {
      result.error = glue.error();
      break;
    }
    for (llama_seq_id s = 0; s < sequences; ++s) {
      const std::int32_t t = text_of[static_cast<std::size_t>(s)];
      if (t < 0) continue;
      const auto& log = glue.evicted_positions(s);
      auto& mine = result.texts[static_cast<std::size_t>(t)];
      mine.evicted_positions.insert(mine.evicted_positions.end(),
                                    log.begin() + static_cast<std::ptrdiff_t>(logged[static_cast<std::size_t>(s)]),
                                    log.end());
      mine.evicted = static_cast<std::int64_t>(mine.evicted_positions.size());
    }
  }
  llama_batch_free(batch);
  llama_free(ctx);
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace sh_llama
