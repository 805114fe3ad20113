// engine_slots: token-level eviction in a slot-allocator engine.
//
// A small engine in SGLang's style: one token pool per layer, K and V at
// [slot][kv_heads][head_dim], indexed by slot ids that one allocator hands
// out for every layer (slot 0 is reserved, as SGLang's padding slot); each
// request lists its slots in req_to_token, in position order; a system
// prompt is shared through a radix-style prefix cache (two requests list the
// same slots). The eviction policy has a shared_layers granularity: one
// choice of tokens per request for every head of every layer, because a
// slot is ONE token everywhere in this engine.
//
// Per step the engine
//   1. allocates slots for the new tokens and writes their K/V (after RoPE,
//      at the request's logical positions) in every layer;
//   2. builds the step's page-size-1 table from req_to_token (the kv_indices
//      SGLang's FlashInfer backend builds);
//   3. per layer, after that layer's attention: observe (here
//      observe_queries; pass the kernel's LSE when it returns one);
//   4. after the last layer, once: select -> the slots to evict, as the
//      engine's slot ids (selection.cache_slots);
//   5. gives those slots back to its allocator and drops them from
//      req_to_token, keeping the order;
//   6. calls forget on every layer so the library's state drops the same
//      slots. No K/V row moves, ever.
//
// llama.cpp maps the same way: the cells are the pool, a sequence's view
// lists its cells sorted by cell.pos, cache_slots are cell indices to clear
// for that seq_id (the cell is free when no sequence holds it), and a
// prefix shared with llama_kv_self_seq_cp is pinned exactly like the radix
// prefix here.
//
// The keys of one token in eight point along a direction every query also
// points along, so those "heavy" tokens draw most of the attention, step
// after step; the summary shows the policy keeps them. The program checks
// its own bookkeeping every step and exits 1 if anything is off.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh = scissorhands;

namespace {

constexpr auto host = sh::memory_space::host;

// The model and the engine's limits.
constexpr std::int32_t layers = 4;
constexpr std::int32_t kv_heads = 2;
constexpr std::int32_t q_heads = 8;  // GQA: 4 query heads per KV head
constexpr std::int32_t head_dim = 16;
constexpr std::int32_t max_requests = 4;   // requests in flight at most: the state's rows
constexpr std::int32_t pool_slots = 256;   // token pool: slots 1..255 (0 is the padding slot)
constexpr std::int32_t max_context = 512;  // width of a req_to_token row
constexpr std::int32_t chunk = 16;         // most tokens a request appends in one step (prefill chunk)
constexpr std::int32_t budget = 48;        // tokens a request may hold
constexpr std::int32_t prefix_len = 12;    // the shared system prompt
constexpr std::int32_t max_steps = 400;

// Scissorhands (w = 25, normalised), m = 1, r = 8, one choice for the whole model.
using policy_t = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
float noise(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return static_cast<float>(mix(mix(mix(mix(a) ^ b) ^ c) ^ d) >> 40) / 8388608.0f - 1.0f;  // [-1, 1)
}
bool heavy(std::int32_t position) { return position % 8 == 3; }
float direction(std::int32_t x) { return (x % 3 == 0) ? -1.0f : 1.0f; }  // shared by keys and queries

// The token pool: per-layer K and V, one allocator for every layer.
struct token_pool {
  std::vector<std::vector<float>> k, v;  // [layer][slot * kv_heads * head_dim]
  std::vector<std::int32_t> free_slots;
  std::vector<std::int32_t> position_of;  // for the demo's checks: the position written in each slot
  std::int32_t in_use = 0, peak = 0;

  token_pool() : position_of(pool_slots, -1) {
    const std::size_t elems = std::size_t{pool_slots} * kv_heads * head_dim;
    k.assign(layers, std::vector<float>(elems, 0.0f));
    v.assign(layers, std::vector<float>(elems, 0.0f));
    for (std::int32_t s = pool_slots - 1; s >= 1; --s) free_slots.push_back(s);
  }
  std::int32_t alloc(std::int32_t position) {
    if (free_slots.empty()) {
      std::fprintf(stderr, "engine_slots: the token pool is exhausted\n");
      std::exit(1);
    }
    const std::int32_t s = free_slots.back();
    free_slots.pop_back();
    position_of[static_cast<std::size_t>(s)] = position;
    peak = std::max(peak, ++in_use);
    return s;
  }
  void free(std::int32_t s) {
    position_of[static_cast<std::size_t>(s)] = -1;
    free_slots.push_back(s);
    --in_use;
  }
  float* k_row(std::int32_t l, std::int32_t slot, std::int32_t h) {
    return k[static_cast<std::size_t>(l)].data() +
           (std::size_t{static_cast<std::size_t>(slot)} * kv_heads + h) * head_dim;
  }
  float* v_row(std::int32_t l, std::int32_t slot, std::int32_t h) {
    return v[static_cast<std::size_t>(l)].data() +
           (std::size_t{static_cast<std::size_t>(slot)} * kv_heads + h) * head_dim;
  }
};

struct request {
  std::int32_t id = 0;
  std::int32_t row = 0;                      // its row in the library's state, for its whole life
  std::vector<std::int32_t> req_to_token{};  // its slots, in position order
  std::int32_t next_position = 0;            // logical: keeps counting after evictions (never the length)
  std::int32_t pinned = 0;                   // leading slots shared through the prefix cache: never evicted
  std::int32_t prompt_left = 0, decode_left = 0;
  std::int32_t joins_at = 0;
  bool wants_prefix = false;  // starts with the system prompt: look it up in the prefix cache
  std::int32_t attached = 0;  // prefix slots mapped at join, admitted in its first step
  // This step.
  std::int32_t n_new = 0, q_len = 0;
  bool live = false, done = false;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "engine_slots: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main() {
  policy_t policy;           // scissorhands_policy's settings ...
  policy.config.recent = 8;  // ... with a shorter recent window for this small budget

  // ---- the library's state: one eviction_state per layer, one buffer -------
  // Capacity: the most tokens a request holds when select runs: the budget
  // plus what one step may append minus one (state_capacity_for). Here a
  // step appends a prefill chunk, plus the whole cached prompt in the first
  // step of a prefix hit. Rows: requests in flight, not batch slots.
  const std::int32_t capacity = sh::state_capacity_for(budget, chunk + prefix_len);
  const sh::state_shape shape{max_requests, kv_heads, capacity, policy.ring_words()};
  const std::size_t state_bytes = sh::model_state_bytes(shape, layers);
  std::unique_ptr<std::byte, decltype(&std::free)> state_buffer(
      static_cast<std::byte*>(std::aligned_alloc(256, (state_bytes + 255) / 256 * 256)), &std::free);
  const sh::model_state<host> model =
      sh::make_model_state(sh::host_span<std::byte>(state_buffer.get(), state_bytes), shape, layers);
  sh::host::reset_state(model);

  // What select writes: per request up to `stride` evicted slots.
  const std::int32_t stride = sh::max_evictions(capacity, budget, policy.config.evict_count);
  std::vector<std::int32_t> counts(max_requests), slots(std::size_t{max_requests} * stride), cache_slots(slots.size()),
      new_lengths(max_requests), freed(max_requests);

  // ---- the engine -----------------------------------------------------------
  token_pool pool;
  std::vector<request> requests(3);
  // Request 0 computes the system prompt; request 1 starts with the same
  // prompt (a prefix cache hit); request 2 has a prompt of its own.
  requests[0] = {.id = 0, .row = 0, .prompt_left = prefix_len + 20, .decode_left = 110, .joins_at = 0};
  requests[1] = {
      .id = 1, .row = 1, .prompt_left = prefix_len + 8, .decode_left = 100, .joins_at = 12, .wants_prefix = true};
  requests[2] = {.id = 2, .row = 2, .prompt_left = 40, .decode_left = 80, .joins_at = 30};
  std::vector<std::int32_t> prefix_slots;  // the cached system prompt (request 0 computes it)
  std::int32_t prefix_holders = 0;

  // The step's table and query layout, rebuilt every step.
  std::vector<std::int32_t> indptr, indices, last_page_len, rows, qo_indptr, pinned;
  std::vector<float> queries;
  std::vector<std::byte> workspace;
  std::int64_t evicted = 0, freed_on_exit = 0, select_calls = 0;
  std::int64_t seen = 0, seen_heavy = 0, held = 0, held_heavy = 0;  // for the summary

  std::int32_t step = 0;
  for (; step < max_steps; ++step) {
    // Requests join (a fresh row, reset on every layer) and leave (slots back).
    for (request& q : requests) {
      if (!q.live && !q.done && step == q.joins_at) {
        q.live = true;
        sh::host::reset_sequence(model, q.row, /*first position=*/0);  // every layer's row
        if (q.wants_prefix && prefix_holders > 0) {
          q.req_to_token = prefix_slots;  // mapped, not recomputed
          q.attached = prefix_len;
          q.prompt_left -= prefix_len;
          ++prefix_holders;
        }
      }
      if (q.live && q.prompt_left == 0 && q.decode_left == 0) {
        q.live = false;
        q.done = true;
        // For the summary: which of its evictable tokens (neither pinned nor recent) it kept.
        for (std::int32_t p = q.pinned; p < q.next_position - policy.config.recent; ++p) ++seen, seen_heavy += heavy(p);
        for (std::int32_t slot : q.req_to_token) {
          const std::int32_t p = pool.position_of[static_cast<std::size_t>(slot)];
          if (p >= q.pinned && p < q.next_position - policy.config.recent) ++held, held_heavy += heavy(p);
        }
        // Its slots go back, the shared prompt's only with its last holder.
        const bool last_holder = q.pinned > 0 && --prefix_holders == 0;
        for (std::size_t t = 0; t < q.req_to_token.size(); ++t)
          if (static_cast<std::int32_t>(t) >= q.pinned || last_holder) pool.free(q.req_to_token[t]), ++freed_on_exit;
        q.req_to_token.clear();
      }
    }
    std::vector<request*> batch;
    for (request& q : requests)
      if (q.live) batch.push_back(&q);
    if (batch.empty()) {
      if (std::all_of(requests.begin(), requests.end(), [](const request& q) { return q.done; })) break;
      continue;
    }
    const auto n = static_cast<std::int32_t>(batch.size());

    // 1. New tokens: slots from the allocator, K/V written in every layer.
    qo_indptr.assign(1, 0);
    queries.clear();
    for (request* q : batch) {
      const std::int32_t shared = q->attached;
      q->attached = 0;
      q->n_new = shared + (q->prompt_left > 0 ? std::min(q->prompt_left, chunk) : 1);
      q->q_len = q->n_new - shared;  // the shared prefix is admitted without queries
      if (q->prompt_left > 0)
        q->prompt_left -= q->n_new - shared;
      else
        --q->decode_left;
      for (std::int32_t i = shared; i < q->n_new; ++i) {
        const std::int32_t position = q->next_position + i;
        const std::int32_t slot = pool.alloc(position);
        q->req_to_token.push_back(slot);
        for (std::int32_t l = 0; l < layers; ++l)
          for (std::int32_t h = 0; h < kv_heads; ++h)
            for (std::int32_t x = 0; x < head_dim; ++x) {
              // The owner of a system-prompt token is the prompt, not the request.
              const std::uint64_t who = position < prefix_len && (q->id == 0 || q->wants_prefix) ? 99 : q->id;
              pool.k_row(l, slot, h)[x] =
                  (heavy(position) ? direction(x) : 0.0f) + 0.5f * noise(who, l * 8 + h, position, x);
              pool.v_row(l, slot, h)[x] = noise(who + 1000, l * 8 + h, position, x);
            }
      }
      // Request 0's first prompt_len tokens become the cached system prompt.
      if (q->id == 0 && prefix_slots.empty() && q->next_position + q->n_new >= prefix_len) {
        prefix_slots.assign(q->req_to_token.begin(), q->req_to_token.begin() + prefix_len);
        q->pinned = prefix_len;
        prefix_holders = 1;
      }
      if (shared > 0) q->pinned = prefix_len;
      // The step's queries (after RoPE), [token][q_head][head_dim].
      for (std::int32_t j = 0; j < q->q_len; ++j)
        for (std::int32_t qh = 0; qh < q_heads; ++qh)
          for (std::int32_t x = 0; x < head_dim; ++x)
            queries.push_back(direction(x) +
                              0.5f * noise(7, q->id * 64 + qh, q->next_position + q->n_new - q->q_len + j, x));
      qo_indptr.push_back(qo_indptr.back() + q->q_len);
    }

    // 2. The step's page-size-1 table, from req_to_token (lengths include the new tokens).
    indptr.assign(1, 0);
    indices.clear();
    last_page_len.clear();
    rows.clear();
    pinned.clear();
    for (request* q : batch) {
      indices.insert(indices.end(), q->req_to_token.begin(), q->req_to_token.end());
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last_page_len.push_back(q->req_to_token.empty() ? 0 : 1);
      rows.push_back(q->row);
      pinned.push_back(std::min<std::int32_t>(q->pinned, static_cast<std::int32_t>(q->req_to_token.size())));
    }
    const auto view = [&](std::int32_t l) {
      return sh::make_paged_kv_view(
          sh::host_span<float>(pool.k[static_cast<std::size_t>(l)].data(), pool.k[static_cast<std::size_t>(l)].size()),
          sh::host_span<float>(pool.v[static_cast<std::size_t>(l)].data(), pool.v[static_cast<std::size_t>(l)].size()),
          sh::host_span<const std::int32_t>(indptr.data(), indptr.size()),
          sh::host_span<const std::int32_t>(indices.data(), indices.size()),
          sh::host_span<const std::int32_t>(last_page_len.data(), last_page_len.size()), n, kv_heads, head_dim,
          /*page_size=*/1, /*num_pages=*/pool_slots, /*max_pages_per_sequence=*/max_context);
    };
    // This step's batch, seen through each request's row (batch positions change; rows do not).
    const sh::model_state<host> batch_model =
        model.for_batch(sh::host_span<const std::int32_t>(rows.data(), rows.size()));
    if (workspace.empty()) workspace.resize(sh::host::select_workspace_bytes(view(0), shape));

    // 3. Per layer, after its attention: what this step's queries attended to.
    //    An engine whose kernel returns the log-sum-exp passes it as well
    //    (lse_view::ragged over the same qo_indptr; FlashInfer's is base 2),
    //    so the library reads K once; observe_probabilities takes the
    //    probabilities themselves when the engine has them.
    const sh::host_span<const std::int32_t> qo(qo_indptr.data(), qo_indptr.size());
    for (std::int32_t l = 0; l < layers; ++l)
      sh::host::observe_queries(policy, view(l), batch_model.layer(l),
                                sh::query_view<float, host>::ragged(
                                    sh::host_span<const float>(queries.data(), queries.size()), qo, q_heads, head_dim));

    // 4. After the last layer: one choice of slots per request, for the whole
    //    model. `pinned` keeps each request's shared prefix out of reach: its
    //    slots belong to other requests too. Requests below the budget get
    //    counts[b] = 0.
    sh::eviction_selection<host> selection;
    selection.stride = stride;
    selection.counts = {counts.data(), static_cast<std::size_t>(n)};
    selection.slots = {slots.data(), static_cast<std::size_t>(n) * stride};
    selection.cache_slots = {cache_slots.data(), static_cast<std::size_t>(n) * stride};
    selection.out = {{new_lengths.data(), static_cast<std::size_t>(n)}, {freed.data(), static_cast<std::size_t>(n)}};
    sh::host::select(policy, view(0), batch_model, budget, {workspace.data(), workspace.size()}, selection,
                     sh::host_span<const std::int32_t>(pinned.data(), pinned.size()));
    ++select_calls;

    // 5. The engine frees the named slots and drops them from req_to_token, in order.
    for (std::int32_t b = 0; b < n; ++b) {
      request& q = *batch[static_cast<std::size_t>(b)];
      std::vector<char> gone(q.req_to_token.size(), 0);
      for (std::int32_t k = 0; k < counts[static_cast<std::size_t>(b)]; ++k) {
        const std::size_t at = static_cast<std::size_t>(b) * stride + static_cast<std::size_t>(k);
        if (q.req_to_token[static_cast<std::size_t>(slots[at])] != cache_slots[at])
          return fail("cache_slots disagree with req_to_token");
        gone[static_cast<std::size_t>(slots[at])] = 1;
        pool.free(cache_slots[at]);
        ++evicted;
      }
      std::vector<std::int32_t> kept;
      for (std::size_t t = 0; t < gone.size(); ++t)
        if (!gone[t]) kept.push_back(q.req_to_token[t]);
      q.req_to_token = kept;
      if (static_cast<std::int32_t>(kept.size()) != new_lengths[static_cast<std::size_t>(b)])
        return fail("a request's length is not selection.out.new_lengths");
    }
    // 6. Every layer's state drops the same slots (views of before the removal).
    for (std::int32_t l = 0; l < layers; ++l) sh::host::forget(policy, view(l), batch_model.layer(l), selection);

    // Bookkeeping, and the demo's own checks: the state's position of every
    // slot is the position the engine wrote there; the shared prefix is intact.
    for (request* q : batch) {
      q->next_position += q->n_new;
      const sh::eviction_state<host> layer0 = model.layer(0);
      for (std::size_t t = 0; t < q->req_to_token.size(); ++t)
        if (layer0.positions[layer0.row_index(q->row, 0, static_cast<std::int32_t>(t))] !=
            pool.position_of[static_cast<std::size_t>(q->req_to_token[t])])
          return fail("the state's positions disagree with the engine's slots");
      if (q->pinned > 0 && !std::equal(prefix_slots.begin(), prefix_slots.end(), q->req_to_token.begin()))
        return fail("a shared prefix slot was evicted");
    }
    std::int32_t listed = 0;
    for (const request& q : requests) listed += static_cast<std::int32_t>(q.req_to_token.size());
    if (requests[0].live && requests[1].live && requests[1].pinned > 0) listed -= prefix_len;  // counted twice
    if (listed != pool.in_use || pool.in_use + static_cast<std::int32_t>(pool.free_slots.size()) != pool_slots - 1)
      return fail("token pool slots are not conserved");
  }

  for (const request& q : requests)
    if (!q.done) return fail("a request did not finish: give the demo more steps");
  std::printf("scissorhands engine_slots: an SGLang-style token pool, shared_layers eviction\n");
  std::printf("  %d layers, %d KV heads, budget %d tokens per request, m %d, recent %d, window %d\n", layers, kv_heads,
              budget, policy.config.evict_count, policy.config.recent, policy.config.window);
  std::printf("  state: %d layers x %d rows x %d heads x %d slots = %zu bytes (model_state_bytes)\n", layers,
              max_requests, kv_heads, capacity, state_bytes);
  std::printf("  %zu requests, %d steps (%lld select calls); pool peak %d of %d slots\n", requests.size(), step,
              static_cast<long long>(select_calls), pool.peak, pool_slots - 1);
  std::printf("  %lld slots freed by eviction, %lld when requests finished; the %d-slot shared prompt never evicted\n",
              static_cast<long long>(evicted), static_cast<long long>(freed_on_exit), prefix_len);
  std::printf("  heavy tokens: %.0f%% of the evictable tokens, %.0f%% of those kept to the end\n",
              100.0 * static_cast<double>(seen_heavy) / static_cast<double>(std::max<std::int64_t>(1, seen)),
              100.0 * static_cast<double>(held_heavy) / static_cast<double>(std::max<std::int64_t>(1, held)));
  std::printf("ok\n");
  return 0;
}
