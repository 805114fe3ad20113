// Token-level eviction (policy/granularity.hpp) driven as four engine
// families drive it, each over its own real cache layout, against an
// independent checker (token_reference.hpp over reference_model.hpp's exact
// fp32 replay):
//
//  - vLLM: per layer one KV tensor [2][num_blocks][block_size][kv_heads]
//    [head_dim] (K then V), ONE padded block table [max_num_seqs]
//    [max_blocks_per_seq] + seq_lens for every layer, a persistent batch
//    that condenses when requests leave (so requests change batch
//    position), a slot_mapping for appends, blocks from a free queue with
//    reference counts (prefix blocks shared by several requests). Per step
//    the FlashInfer CSR view (indptr / indices / last_page_len) is built
//    from the padded table as vLLM's FlashInfer backend builds it;
//    shared_layers: observe every layer -> select -> compact every layer ->
//    shrink_page_table once -> blocks freed, padded table updated.
//  - SGLang: page size 1, one token pool per layer indexed by the engine's
//    slot ids (slot 0 reserved, as SGLang's padding slot), a slot allocator
//    (free list), req_to_token rows, radix-shared prefixes held by several
//    requests; select (pinned_prefix = the shared prefix) -> the evicted
//    cache_slots go back to the engine's allocator and leave req_to_token
//    in order -> forget per layer; K/V are never moved.
//  - llama.cpp: one set of cells for every layer and head, one position and
//    a set of sequence ids per cell; a sequence's view lists its cells in
//    position order (page size 1 CSR); prefixes shared by seq_cp; select
//    names the cells to clear; forget per layer; no data moved, and every
//    cell's position still equals the library's position for its slot.
//  - FlashInfer with a page table PER LAYER (different budgets per layer),
//    per_head and shared_heads, compress per layer: for comparison.
//
// Checked after every step, without calling the library's selection code:
// every kept K/V row bit-identical to what its token was appended with (V
// names the token), no protected token (recent window, sinks) and no pinned
// prefix token evicted, every block / slot / cell / page conserved
// (allocated + free = pool, nothing leaked or double-freed), no token twice,
// the same tokens at the same slots in every layer and head (shared_layers)
// or every head of a layer (shared_heads), lengths = length_after_compress,
// the state (positions, scores, counters) equal to the model's, and the
// evicted tokens exactly the reference's (combined score: mean / max over
// heads in head order, then over layers in layer order; lowest evicted,
// ties older). Refused calls (bad arguments) are injected every few steps:
// each must throw scissorhands::invalid_argument naming the argument and
// leave every caller-owned byte (K/V, state, tables, outputs) unchanged.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.hpp>

#include "engine_support.hpp"
#include "reference_model.hpp"
#include "token_reference.hpp"

namespace {

using namespace engine_test;
namespace sh = scissorhands;
constexpr auto host = sh::memory_space::host;
using view_t = sh::host_paged_kv_view<float>;
using state_t = sh::eviction_state<host>;
using model_t = sh::model_state<host>;

constexpr std::int32_t state_rows = 6;   // requests the state holds at once
constexpr std::int32_t max_active = 5;   // requests in flight
constexpr std::int32_t max_padding = 2;  // padding slots a batch may carry
constexpr std::int32_t max_batch = max_active + max_padding;
constexpr std::int32_t max_context = 64;              // what a table row allows a request (above the state's capacity)
constexpr std::int32_t prefix_content_base = 100000;  // V[1] of a shared prefix's tokens: this + prefix index

inline std::int32_t ceil_div(std::int32_t a, std::int32_t b) { return (a + b - 1) / b; }

struct tl_config {
  std::int32_t layers = 3, kv_heads = 2, q_heads = 4, head_dim = 8;
  std::int32_t budget = 20;            // shared engines: the budget; per-layer tables: layer 0's
  std::int32_t layer_budget_step = 0;  // per-layer tables: layer l's budget = budget + l * step
  std::int32_t chunk = 5;              // C: most tokens a request computes in one step
  std::int32_t page_size = 1;          // vLLM block size, FlashInfer page size (SGLang, llama.cpp: 1)
  std::int32_t prefix_len = 0;         // tokens of a shared prefix (0: no sharing)
  bool hnd = false;                    // FlashInfer pages: HND instead of NHD
  sh::settings settings{};
  std::int32_t steps = 90;
  std::uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream o;
    o << "layers " << layers << ", kv_heads " << kv_heads << ", q_heads " << q_heads << ", head_dim " << head_dim
      << ", budget " << budget;
    if (layer_budget_step != 0) o << " + " << layer_budget_step << " per layer";
    o << ", chunk " << chunk << ", page_size " << page_size << ", prefix " << prefix_len << (hnd ? ", HND" : "") << ", "
      << settings_text(settings) << ", seed " << seed;
    return o.str();
  }
};

struct tl_stats {
  std::int64_t steps = 0, triggers = 0, evicted = 0, pinned_triggers = 0, joins = 0, leaves = 0, reused_rows = 0,
               prefixes_created = 0, prefix_hits = 0, prefixes_dropped = 0, shifted_starts = 0, prefill_chunks = 0,
               decode_tokens = 0, idle = 0, admit_only = 0, moved_in_batch = 0, refused = 0, freed_storage = 0,
               padding = 0, most_holders = 0;
};

struct shared_prefix {
  std::int32_t content = 0;           // the content id its tokens' rows carry
  std::int32_t length = 0;            // P tokens, positions 0..P-1
  std::int32_t holders = 0;           // live requests holding it (its creator included)
  bool ready = false;                 // the creator has computed all P tokens: others may attach
  std::vector<std::int32_t> storage;  // the engine's ids: vLLM blocks, SGLang slots, llama.cpp cells
};

struct request {
  std::int32_t id = 0, row = -1, start = 0, next_position = 0;
  std::int64_t step = 0;
  std::vector<std::int32_t> length;  // per layer: tokens held before this step's appends
  std::int32_t prefix = -1;          // index of the shared prefix it holds, -1: none
  std::int32_t prefix_len = 0;       // its length (positions 0..prefix_len-1), 0: none
  bool creator = false;
  std::int32_t attached = 0;  // prefix tokens mapped at join, admitted in the next step
  std::int32_t prompt_left = 0, decode_left = 0;
  model_heads heads;  // the model: [layer * kv_heads + head] tokens in slot order
  // This step.
  std::int32_t n_new = 0, q_len = 0, base = 0, attached_now = 0, last_batch_position = -1;
  // The engine's handle: vLLM persistent batch index, SGLang req_pool_idx, llama.cpp seq_id.
  std::int32_t handle = -1;
  std::vector<std::vector<std::int32_t>> pages;  // FlashInfer per-layer tables: page list per layer
};

enum class flow { compact, forget, per_layer };

// ===========================================================================
// The engines' own structures. Each computes row addresses and slot ids with
// its own maths (never the library's view) and checks its own bookkeeping.

// vLLM: per-layer [2][num_blocks][block_size][kv_heads][head_dim], one padded
// block table for every layer, a persistent batch, reference-counted blocks.
struct vllm_storage {
  static constexpr const char* name = "vLLM";
  static constexpr flow kind = flow::compact;
  static constexpr bool padding = false;  // the persistent batch is dense
  std::int32_t L, H, D, bs, max_blocks, num_blocks;
  std::int64_t half;                      // elements of K (and of V) per layer
  std::vector<std::vector<float>> kv;     // [layer] K then V
  std::vector<std::int32_t> block_table;  // [state_rows][max_blocks]; entries past a row's blocks are stale
  std::vector<std::int32_t> seq_lens;     // [state_rows]
  std::vector<std::int32_t> req_ids;      // [state_rows] request at each persistent batch index
  std::int32_t num_reqs = 0;
  std::deque<std::int32_t> free_blocks;  // allocated from the front, freed to the back
  std::vector<std::int32_t> ref_count;
  std::vector<std::int32_t> slot_mapping;  // the last allocate's tokens: block * block_size + offset
  std::vector<std::int32_t> indptr, indices, last_page_len, released;  // this step's FlashInfer CSR
  std::int32_t batch = 0;

  vllm_storage(const tl_config& c, std::int32_t capacity, rng& r)
      : L(c.layers),
        H(c.kv_heads),
        D(c.head_dim),
        bs(c.page_size),
        max_blocks(ceil_div(max_context, c.page_size)),
        num_blocks(max_active * ceil_div(capacity, c.page_size) + 3) {
    half = std::int64_t{num_blocks} * bs * H * D;
    for (std::int32_t l = 0; l < L; ++l) kv.push_back(background(static_cast<std::size_t>(2 * half), 1000.0f, 3, l));
    block_table.assign(static_cast<std::size_t>(state_rows * max_blocks), 0);  // vLLM pads with 0
    seq_lens.assign(state_rows, 0);
    req_ids.assign(state_rows, -1);
    std::vector<std::int32_t> ids;
    for (std::int32_t b = 0; b < num_blocks; ++b) ids.push_back(b);
    r.shuffle(ids);
    free_blocks.assign(ids.begin(), ids.end());
    ref_count.assign(static_cast<std::size_t>(num_blocks), 0);
    indptr.assign(max_batch + 1, 0);
    indices.assign(static_cast<std::size_t>(num_blocks + 4), -1);
    last_page_len.assign(max_batch, 0);
    released.assign(static_cast<std::size_t>(num_blocks), -1);
  }
  std::int32_t page_size() const { return bs; }
  std::int32_t& entry(std::int32_t i, std::int32_t j) {
    return block_table[static_cast<std::size_t>(i * max_blocks + j)];
  }
  std::int32_t entry(std::int32_t i, std::int32_t j) const {
    return block_table[static_cast<std::size_t>(i * max_blocks + j)];
  }
  void unref(std::int32_t block) {
    if (--ref_count[static_cast<std::size_t>(block)] == 0) free_blocks.push_back(block);
  }

  void join(request& q) {
    q.handle = num_reqs++;
    req_ids[static_cast<std::size_t>(q.handle)] = q.id;
    seq_lens[static_cast<std::size_t>(q.handle)] = 0;
  }
  void attach_prefix(request& q, const shared_prefix& p) {
    for (std::size_t i = 0; i < p.storage.size(); ++i) {
      entry(q.handle, static_cast<std::int32_t>(i)) = p.storage[i];
      ++ref_count[static_cast<std::size_t>(p.storage[i])];
    }
    seq_lens[static_cast<std::size_t>(q.handle)] = p.length;
  }
  void register_prefix(const request& q, shared_prefix& p) {
    p.storage.clear();
    for (std::int32_t j = 0; j < p.length / bs; ++j) p.storage.push_back(entry(q.handle, j));
  }
  // Frees the request's blocks and condenses the persistent batch: the last
  // request moves into the hole (its block table row and length with it).
  void leave(request& q, bool, std::vector<request>& active) {
    const std::int32_t i = q.handle;
    for (std::int32_t j = 0; j < ceil_div(seq_lens[static_cast<std::size_t>(i)], bs); ++j) unref(entry(i, j));
    const std::int32_t last = num_reqs - 1;
    if (i != last) {
      for (std::int32_t j = 0; j < max_blocks; ++j) entry(i, j) = entry(last, j);
      seq_lens[static_cast<std::size_t>(i)] = seq_lens[static_cast<std::size_t>(last)];
      req_ids[static_cast<std::size_t>(i)] = req_ids[static_cast<std::size_t>(last)];
      for (auto& o : active)
        if (o.handle == last && o.id != q.id) o.handle = i;
    }
    seq_lens[static_cast<std::size_t>(last)] = 0;
    req_ids[static_cast<std::size_t>(last)] = -1;
    --num_reqs;
    q.handle = -1;
  }
  // vLLM runs its persistent batch in index order.
  std::vector<std::int32_t> batch_order(const std::vector<request>& active, rng&) const {
    std::vector<std::int32_t> order(active.size());
    for (std::size_t i = 0; i < active.size(); ++i)
      order[static_cast<std::size_t>(active[i].handle)] = static_cast<std::int32_t>(i);
    return order;
  }
  void allocate(request& q, std::int32_t, std::int32_t count) {
    auto& len = seq_lens[static_cast<std::size_t>(q.handle)];
    slot_mapping.clear();
    for (std::int32_t k = 0; k < count; ++k) {
      const std::int32_t slot = len + k;
      if (slot % bs == 0) {
        REQUIRE(!free_blocks.empty());
        const std::int32_t block = free_blocks.front();
        free_blocks.pop_front();
        ref_count[static_cast<std::size_t>(block)] = 1;
        entry(q.handle, slot / bs) = block;
      }
      slot_mapping.push_back(entry(q.handle, slot / bs) * bs + slot % bs);
    }
    len += count;
  }
  std::int32_t slot_id(const request& q, std::int32_t slot) const {
    return entry(q.handle, slot / bs) * bs + slot % bs;
  }
  // reshape_and_cache's addressing: slot id -> [slot][head][dim] in the K or V half.
  float* at_slot(int kind, std::int32_t l, std::int32_t id, std::int32_t h) {
    return kv[static_cast<std::size_t>(l)].data() + kind * half + (std::int64_t{id} * H + h) * D;
  }
  float* row(int kind, std::int32_t l, const request& q, std::int32_t h, std::int32_t slot) {
    return at_slot(kind, l, slot_id(q, slot), h);
  }
  // The step's CSR, as vLLM's FlashInfer backend derives it from the padded
  // table: ceil(seq_len / block_size) leading entries of each row.
  void build_tables(const std::vector<request*>& b_of) {
    batch = static_cast<std::int32_t>(b_of.size());
    std::fill(indices.begin(), indices.end(), -1);
    indptr[0] = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      REQUIRE(b_of[static_cast<std::size_t>(b)]->handle == b);
      const std::int32_t len = seq_lens[static_cast<std::size_t>(b)];
      const std::int32_t blocks = ceil_div(len, bs);
      for (std::int32_t j = 0; j < blocks; ++j)
        indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + j)] = entry(b, j);
      indptr[static_cast<std::size_t>(b) + 1] = indptr[static_cast<std::size_t>(b)] + blocks;
      last_page_len[static_cast<std::size_t>(b)] = len == 0 ? 0 : len - (blocks - 1) * bs;
    }
  }
  view_t view(std::int32_t l, const std::vector<std::int32_t>* alt_indices = nullptr) {
    float* base = kv[static_cast<std::size_t>(l)].data();
    return paged_view({base, static_cast<std::size_t>(half)}, {base + half, static_cast<std::size_t>(half)}, indptr,
                      alt_indices != nullptr ? *alt_indices : indices, last_page_len, batch, H, D, bs, num_blocks,
                      max_blocks);
  }
  // After compact on every layer: the new lengths go to the CSR once
  // (shrink_page_table), the released blocks back to the free queue, and the
  // padded table's seq_lens follow. Returns the blocks released.
  std::int64_t apply_lengths(const std::vector<request*>& b_of, const std::vector<std::int32_t>& new_lengths,
                             std::vector<std::string>& errors) {
    std::vector<std::int32_t> expect;
    for (std::int32_t b = 0; b < batch; ++b)
      for (std::int32_t j = ceil_div(new_lengths[static_cast<std::size_t>(b)], bs);
           j < ceil_div(seq_lens[static_cast<std::size_t>(b)], bs); ++j)
        expect.push_back(entry(b, j));
    const std::size_t n =
        shrink_table(indptr, indices, last_page_len, batch, bs, new_lengths, released, expect, "vLLM: ", errors);
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t len = new_lengths[static_cast<std::size_t>(b)];
      seq_lens[static_cast<std::size_t>(b)] = len;
      const std::int32_t blocks = ceil_div(len, bs);
      bool same = indptr[static_cast<std::size_t>(b) + 1] - indptr[static_cast<std::size_t>(b)] == blocks;
      for (std::int32_t j = 0; same && j < blocks; ++j)
        same = indices[static_cast<std::size_t>(indptr[static_cast<std::size_t>(b)] + j)] == entry(b, j);
      const std::int32_t csr_len = blocks == 0 ? 0 : (blocks - 1) * bs + last_page_len[static_cast<std::size_t>(b)];
      if (!same || csr_len != len)
        errors.push_back("vLLM: the shrunk CSR of request " + std::to_string(b_of[static_cast<std::size_t>(b)]->id) +
                         " differs from its padded block table row");
    }
    for (std::size_t k = 0; k < std::min(n, released.size()); ++k) unref(released[k]);
    return static_cast<std::int64_t>(n);
  }
  void check(const std::vector<request>& active, const std::vector<shared_prefix>& prefixes,
             std::vector<std::string>& errors) const {
    if (num_reqs != static_cast<std::int32_t>(active.size()))
      errors.push_back("vLLM: num_reqs differs from the requests in flight");
    std::vector<std::int32_t> refs(static_cast<std::size_t>(num_blocks), 0);
    for (std::int32_t i = 0; i < num_reqs; ++i) {
      std::set<std::int32_t> in_row;
      for (std::int32_t j = 0; j < ceil_div(seq_lens[static_cast<std::size_t>(i)], bs); ++j) {
        const std::int32_t b = entry(i, j);
        if (b < 0 || b >= num_blocks || !in_row.insert(b).second) {
          errors.push_back("vLLM: row " + std::to_string(i) + " names block " + std::to_string(b) +
                           " out of the pool or twice");
          continue;
        }
        ++refs[static_cast<std::size_t>(b)];
      }
    }
    std::vector<char> seen(static_cast<std::size_t>(num_blocks), 0);
    for (std::int32_t b : free_blocks) {
      if (b < 0 || b >= num_blocks || seen[static_cast<std::size_t>(b)] || refs[static_cast<std::size_t>(b)] != 0)
        errors.push_back("vLLM: free block " + std::to_string(b) +
                         " is out of the pool, freed twice or still in a table row");
      else
        seen[static_cast<std::size_t>(b)] = 1;
    }
    std::int32_t in_use = 0;
    for (std::int32_t b = 0; b < num_blocks; ++b) {
      if (refs[static_cast<std::size_t>(b)] != ref_count[static_cast<std::size_t>(b)])
        errors.push_back("vLLM: block " + std::to_string(b) + " has ref_count " +
                         std::to_string(ref_count[static_cast<std::size_t>(b)]) + " but " +
                         std::to_string(refs[static_cast<std::size_t>(b)]) + " table references");
      in_use += refs[static_cast<std::size_t>(b)] > 0;
    }
    if (in_use + static_cast<std::int32_t>(free_blocks.size()) != num_blocks)
      errors.push_back("vLLM: blocks not conserved: " + std::to_string(in_use) + " in use + " +
                       std::to_string(free_blocks.size()) + " free != " + std::to_string(num_blocks));
    std::set<std::int32_t> handles;
    for (const auto& q : active) {
      if (q.handle < 0 || q.handle >= num_reqs || !handles.insert(q.handle).second)
        errors.push_back("vLLM: request " + std::to_string(q.id) + " has a bad persistent batch index");
      else if (req_ids[static_cast<std::size_t>(q.handle)] != q.id ||
               seq_lens[static_cast<std::size_t>(q.handle)] != q.length[0])
        errors.push_back("vLLM: the padded table's row " + std::to_string(q.handle) + " is not request " +
                         std::to_string(q.id) + "'s (seq_len " +
                         std::to_string(seq_lens[static_cast<std::size_t>(q.handle)]) + ", the request holds " +
                         std::to_string(q.length[0]) + ")");
    }
    // Shared blocks: exactly the live prefixes', in every holder's row, counted once per holder.
    std::set<std::int32_t> prefix_blocks;
    for (std::size_t pi = 0; pi < prefixes.size(); ++pi) {
      const auto& p = prefixes[pi];
      if (!p.ready || p.holders == 0) continue;
      for (std::int32_t b : p.storage) {
        prefix_blocks.insert(b);
        if (ref_count[static_cast<std::size_t>(b)] != p.holders)
          errors.push_back("vLLM: prefix block " + std::to_string(b) + " has ref_count " +
                           std::to_string(ref_count[static_cast<std::size_t>(b)]) + " for " +
                           std::to_string(p.holders) + " holders");
      }
      for (const auto& q : active)
        if (q.prefix == static_cast<std::int32_t>(pi))
          for (std::size_t j = 0; j < p.storage.size(); ++j)
            if (entry(q.handle, static_cast<std::int32_t>(j)) != p.storage[j])
              errors.push_back("vLLM: request " + std::to_string(q.id) + " no longer maps its shared prefix block " +
                               std::to_string(j));
    }
    for (std::int32_t b = 0; b < num_blocks; ++b)
      if (refs[static_cast<std::size_t>(b)] > 1 && !prefix_blocks.count(b))
        errors.push_back("vLLM: block " + std::to_string(b) + " is in two rows but in no live shared prefix");
  }
  void snapshot_into(snapshot_t& s) const {
    push_bytes(s, kv, block_table, seq_lens, req_ids, ref_count, indptr, indices, last_page_len);
    push_bytes(s, std::vector<std::int32_t>(free_blocks.begin(), free_blocks.end()));
  }
  std::vector<std::int32_t>& csr_indices() { return indices; }
  std::int32_t csr_start(std::int32_t b) const { return indptr[static_cast<std::size_t>(b)]; }
  std::int32_t csr_pages(std::int32_t b) const {
    return indptr[static_cast<std::size_t>(b) + 1] - indptr[static_cast<std::size_t>(b)];
  }
};

// SGLang's and llama.cpp's side in common: per layer a K and a V pool
// [slot id][kv_heads][head_dim], and the page-size-1 CSR their FlashInfer
// backends build from each request's slot ids.
struct token_pools {
  std::int32_t L, H, D, ids;  // slot ids 0..ids-1
  std::vector<std::vector<float>> k, v;
  std::vector<std::int32_t> indptr, indices, last_page_len;
  std::int32_t batch = 0;

  // The pools' background per layer: from k_base (tag k_tag) and v_base (v_tag) up.
  token_pools(const tl_config& c, std::int32_t slot_ids, std::size_t table, float k_base, std::int64_t k_tag,
              float v_base, std::int64_t v_tag)
      : L(c.layers), H(c.kv_heads), D(c.head_dim), ids(slot_ids) {
    const std::size_t elems = static_cast<std::size_t>(ids) * static_cast<std::size_t>(H * D);
    for (std::int32_t l = 0; l < L; ++l) {
      k.push_back(background(elems, k_base, k_tag, l));
      v.push_back(background(elems, v_base, v_tag, l));
    }
    indptr.assign(max_batch + 1, 0);
    indices.assign(table, -1);
    last_page_len.assign(max_batch, 0);
  }
  std::int32_t page_size() const { return 1; }
  std::vector<std::int32_t> batch_order(const std::vector<request>& active, rng& r) const {
    return shuffled_order(active.size(), r);
  }
  float* at_id(int kind, std::int32_t l, std::int32_t id, std::int32_t h) {
    return (kind == 0 ? k : v)[static_cast<std::size_t>(l)].data() + (std::int64_t{id} * H + h) * D;
  }
  // One CSR row a batch position: the request's slot ids (list_of), none for padding.
  template <class ListOf>
  void build_csr(const std::vector<request*>& b_of, ListOf list_of) {
    batch = static_cast<std::int32_t>(b_of.size());
    std::fill(indices.begin(), indices.end(), -1);
    indptr[0] = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      const std::vector<std::int32_t> list = b_of[ub] == nullptr ? std::vector<std::int32_t>{} : list_of(*b_of[ub]);
      std::copy(list.begin(), list.end(), indices.begin() + indptr[ub]);
      indptr[ub + 1] = indptr[ub] + static_cast<std::int32_t>(list.size());
      last_page_len[ub] = list.empty() ? 0 : 1;
    }
  }
  view_t view(std::int32_t l) {
    const auto ul = static_cast<std::size_t>(l);
    return paged_view(mspan(k[ul]), mspan(v[ul]), indptr, indices, last_page_len, batch, H, D, 1, ids, max_context);
  }
  void kv_into(snapshot_t& s) const { push_bytes(s, k, v); }
};

// SGLang: one token pool per layer [slots][kv_heads][head_dim] (slot 0 is the
// padding slot, never handed out), an allocator of slot ids, req_to_token.
struct sglang_storage : token_pools {
  static constexpr const char* name = "SGLang";
  static constexpr flow kind = flow::forget;
  static constexpr bool padding = true;    // CUDA-graph batches padded to a captured size
  std::int32_t pool;                       // usable slots 1..pool
  std::deque<std::int32_t> free_slots;     // TokenToKVPoolAllocator: alloc from the front, free to the back
  std::vector<std::int32_t> req_to_token;  // [state_rows][max_context]
  std::vector<std::int32_t> req_len;       // [state_rows]
  std::vector<std::int32_t> free_reqs;

  sglang_storage(const tl_config& c, std::int32_t capacity, rng& r)
      : token_pools(c, max_active * capacity + 8, static_cast<std::size_t>(state_rows * max_context + 3), 2000.0f, 4,
                    3000.0f, 5),
        pool(max_active * capacity + 7) {
    std::vector<std::int32_t> ids;
    for (std::int32_t s = 1; s <= pool; ++s) ids.push_back(s);
    r.shuffle(ids);
    free_slots.assign(ids.begin(), ids.end());
    req_to_token.assign(static_cast<std::size_t>(state_rows * max_context), 0);
    req_len.assign(state_rows, 0);
    for (std::int32_t i = state_rows; i-- > 0;) free_reqs.push_back(i);
  }
  std::int32_t& token(std::int32_t req, std::int32_t t) {
    return req_to_token[static_cast<std::size_t>(req * max_context + t)];
  }
  std::int32_t token(std::int32_t req, std::int32_t t) const {
    return req_to_token[static_cast<std::size_t>(req * max_context + t)];
  }
  void join(request& q) {
    REQUIRE(!free_reqs.empty());
    q.handle = free_reqs.back();
    free_reqs.pop_back();
    req_len[static_cast<std::size_t>(q.handle)] = 0;
  }
  void attach_prefix(request& q, const shared_prefix& p) {  // a radix cache hit: the prefix's slots, locked
    for (std::size_t t = 0; t < p.storage.size(); ++t) token(q.handle, static_cast<std::int32_t>(t)) = p.storage[t];
    req_len[static_cast<std::size_t>(q.handle)] = p.length;
  }
  void register_prefix(const request& q, shared_prefix& p) {  // inserted into the radix tree
    p.storage.clear();
    for (std::int32_t t = 0; t < p.length; ++t) p.storage.push_back(token(q.handle, t));
  }
  // Frees the request's slots; a shared prefix's only with its last holder.
  void leave(request& q, bool last_holder, std::vector<request>&) {
    const std::int32_t shared = q.prefix >= 0 && !last_holder ? q.prefix_len : 0;
    for (std::int32_t t = shared; t < req_len[static_cast<std::size_t>(q.handle)]; ++t)
      free_slots.push_back(token(q.handle, t));
    for (std::int32_t t = 0; t < max_context; ++t) token(q.handle, t) = 0;
    req_len[static_cast<std::size_t>(q.handle)] = 0;
    free_reqs.push_back(q.handle);
    q.handle = -1;
  }
  void allocate(request& q, std::int32_t, std::int32_t count) {  // out_cache_loc
    auto& len = req_len[static_cast<std::size_t>(q.handle)];
    for (std::int32_t k = 0; k < count; ++k) {
      REQUIRE(!free_slots.empty());
      token(q.handle, len + k) = free_slots.front();
      free_slots.pop_front();
    }
    len += count;
  }
  std::int32_t slot_id(const request& q, std::int32_t slot) const { return token(q.handle, slot); }
  float* row(int kind, std::int32_t l, const request& q, std::int32_t h, std::int32_t slot) {
    return at_id(kind, l, slot_id(q, slot), h);
  }
  // The CSR SGLang's FlashInfer backend builds from req_to_token (page size 1).
  void build_tables(const std::vector<request*>& b_of) {
    build_csr(b_of, [&](const request& q) {
      const auto* first = &req_to_token[static_cast<std::size_t>(q.handle * max_context)];
      return std::vector<std::int32_t>(first, first + req_len[static_cast<std::size_t>(q.handle)]);
    });
  }
  // The library's choice, applied by the engine: each evicted slot id goes
  // back to the allocator and leaves req_to_token, the rest keep their order.
  std::int64_t release(const std::vector<request*>& b_of, const sh::eviction_selection<host>& sel,
                       const std::vector<shared_prefix>& prefixes, std::vector<std::string>& errors) {
    std::int64_t freed = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      const std::int32_t count = sel.counts[static_cast<std::size_t>(b)];
      if (count <= 0 || b_of[static_cast<std::size_t>(b)] == nullptr) continue;
      request& q = *b_of[static_cast<std::size_t>(b)];
      auto& len = req_len[static_cast<std::size_t>(q.handle)];
      std::vector<char> gone(static_cast<std::size_t>(len), 0);
      for (std::int32_t k = 0; k < count; ++k) {
        const std::size_t at =
            static_cast<std::size_t>(b) * static_cast<std::size_t>(sel.stride) + static_cast<std::size_t>(k);
        const std::int32_t t = sel.slots[at], id = sel.cache_slots[at];
        if (t < 0 || t >= len || id != token(q.handle, t) || id == 0) {
          errors.push_back("SGLang: cache_slots entry " + std::to_string(id) + " is not req_to_token[" +
                           std::to_string(q.handle) + "][" + std::to_string(t) + "]");
          continue;
        }
        for (const auto& p : prefixes)
          if (p.holders > 0 && std::find(p.storage.begin(), p.storage.end(), id) != p.storage.end())
            errors.push_back("SGLang: slot " + std::to_string(id) + " of a shared radix prefix was evicted");
        gone[static_cast<std::size_t>(t)] = 1;
        free_slots.push_back(id);
        ++freed;
      }
      std::int32_t w = 0;
      for (std::int32_t t = 0; t < len; ++t)
        if (!gone[static_cast<std::size_t>(t)]) token(q.handle, w++) = token(q.handle, t);
      for (std::int32_t t = w; t < len; ++t) token(q.handle, t) = 0;
      len = w;
    }
    return freed;
  }
  void after_forget(const std::vector<request*>&) {}
  void check(const std::vector<request>& active, const std::vector<shared_prefix>& prefixes,
             std::vector<std::string>& errors) const {
    // owner: -1 unused, a request id, or prefix_content_base + prefix index.
    std::vector<std::int32_t> owner(static_cast<std::size_t>(pool) + 1, -1);
    std::int32_t in_use = 0;
    for (const auto& q : active) {
      const std::int32_t len = req_len[static_cast<std::size_t>(q.handle)];
      if (len != q.length[0])
        errors.push_back("SGLang: req_len of request " + std::to_string(q.id) + " is " + std::to_string(len) +
                         ", it holds " + std::to_string(q.length[0]));
      const bool shares = q.prefix >= 0 && prefixes[static_cast<std::size_t>(q.prefix)].ready;
      for (std::int32_t t = 0; t < len; ++t) {
        const std::int32_t id = token(q.handle, t);
        if (id < 1 || id > pool) {
          errors.push_back("SGLang: request " + std::to_string(q.id) + " maps slot id " + std::to_string(id) +
                           " (padding slot or out of the pool)");
          continue;
        }
        auto& o = owner[static_cast<std::size_t>(id)];
        if (shares && t < q.prefix_len) {
          const auto& p = prefixes[static_cast<std::size_t>(q.prefix)];
          if (p.storage[static_cast<std::size_t>(t)] != id)
            errors.push_back("SGLang: request " + std::to_string(q.id) + " lost its radix prefix slot " +
                             std::to_string(t));
          const std::int32_t mark = prefix_content_base + q.prefix;
          if (o == -1)
            ++in_use, o = mark;
          else if (o != mark)
            errors.push_back("SGLang: prefix slot " + std::to_string(id) + " also used elsewhere");
        } else {
          if (o != -1)
            errors.push_back("SGLang: slot " + std::to_string(id) + " is held twice");
          else
            ++in_use, o = q.id;
        }
      }
    }
    std::int32_t free_count = 0;
    for (std::int32_t id : free_slots) {
      if (id < 1 || id > pool || owner[static_cast<std::size_t>(id)] != -1)
        errors.push_back("SGLang: free slot " + std::to_string(id) +
                         " is the padding slot, out of the pool, freed twice or in use");
      else
        owner[static_cast<std::size_t>(id)] = -2, ++free_count;
    }
    if (in_use + free_count != pool)
      errors.push_back("SGLang: slots not conserved: " + std::to_string(in_use) + " in use + " +
                       std::to_string(free_count) + " free != " + std::to_string(pool));
    for (std::size_t pi = 0; pi < prefixes.size(); ++pi) {
      const auto& p = prefixes[pi];
      if (!p.ready || p.holders == 0) continue;
      std::int32_t holders = 0;
      for (const auto& q : active) holders += q.prefix == static_cast<std::int32_t>(pi);
      if (holders != p.holders) errors.push_back("SGLang: prefix holder count is off");
      for (std::int32_t id : p.storage)
        if (owner[static_cast<std::size_t>(id)] != prefix_content_base + static_cast<std::int32_t>(pi))
          errors.push_back("SGLang: shared prefix slot " + std::to_string(id) + " is free or reused while held");
    }
  }
  void snapshot_into(snapshot_t& s) const {
    push_bytes(s, k, v, req_to_token, req_len, indptr, indices, last_page_len);
    push_bytes(s, std::vector<std::int32_t>(free_slots.begin(), free_slots.end()));
  }
};

// llama.cpp: one set of cells for every layer and head (position + the set
// of sequences holding it), K and V per layer [cell][kv_heads * head_dim].
struct llama_storage : token_pools {
  static constexpr const char* name = "llama.cpp";
  static constexpr flow kind = flow::forget;
  static constexpr bool padding = true;
  struct cell {
    std::int32_t pos = -1;
    std::uint32_t seq = 0;  // bit s: sequence s holds the cell
  };
  std::int32_t n_cells, head = 0;
  std::vector<cell> cells;
  std::vector<std::int32_t> free_seq_ids;
  std::vector<std::vector<std::int32_t>> seq_cells;  // per seq id: its cells in position order

  llama_storage(const tl_config& c, std::int32_t capacity, rng& r)
      : token_pools(c, max_active * capacity + 9, static_cast<std::size_t>(max_active * capacity + 12), 4000.0f, 6,
                    5000.0f, 8),
        n_cells(max_active * capacity + 9) {
    cells.resize(static_cast<std::size_t>(n_cells));
    for (std::int32_t s = 0; s < 16; ++s) free_seq_ids.push_back(s);
    r.shuffle(free_seq_ids);
    seq_cells.resize(16);
  }
  static std::uint32_t bit(std::int32_t seq) { return 1u << seq; }
  // The sequence's cells in position order, read from the cells alone.
  std::vector<std::int32_t> cells_of(std::int32_t seq) const {
    std::vector<std::int32_t> out;
    for (std::int32_t c = 0; c < n_cells; ++c)
      if (cells[static_cast<std::size_t>(c)].seq & bit(seq)) out.push_back(c);
    std::stable_sort(out.begin(), out.end(), [&](std::int32_t a, std::int32_t b) {
      return cells[static_cast<std::size_t>(a)].pos < cells[static_cast<std::size_t>(b)].pos;
    });
    return out;
  }
  void refresh(std::int32_t seq) { seq_cells[static_cast<std::size_t>(seq)] = cells_of(seq); }
  void join(request& q) {
    q.handle = free_seq_ids.back();
    free_seq_ids.pop_back();
    seq_cells[static_cast<std::size_t>(q.handle)].clear();
  }
  void attach_prefix(request& q, const shared_prefix& p) {  // llama_kv_self_seq_cp(holder, q, 0, P)
    for (std::int32_t c : p.storage) cells[static_cast<std::size_t>(c)].seq |= bit(q.handle);
    refresh(q.handle);
  }
  void register_prefix(const request& q, shared_prefix& p) {
    const auto& list = seq_cells[static_cast<std::size_t>(q.handle)];
    p.storage.assign(list.begin(), list.begin() + p.length);
  }
  void leave(request& q, bool, std::vector<request>&) {  // llama_kv_self_seq_rm(q, -1, -1)
    for (auto& c : cells) {
      c.seq &= ~bit(q.handle);
      if (c.seq == 0) c.pos = -1;
    }
    seq_cells[static_cast<std::size_t>(q.handle)].clear();
    free_seq_ids.insert(free_seq_ids.begin(), q.handle);
    q.handle = -1;
  }
  // find_slot: the first empty cells from `head` on, wrapping around.
  void allocate(request& q, std::int32_t offset, std::int32_t count) {
    for (std::int32_t k = 0; k < count; ++k) {
      std::int32_t c = head, tried = 0;
      while (cells[static_cast<std::size_t>(c)].seq != 0 && tried < n_cells) c = (c + 1) % n_cells, ++tried;
      REQUIRE(tried < n_cells);
      cells[static_cast<std::size_t>(c)].pos = q.base + offset + k;
      cells[static_cast<std::size_t>(c)].seq = bit(q.handle);
      head = (c + 1) % n_cells;
    }
    refresh(q.handle);
  }
  std::int32_t slot_id(const request& q, std::int32_t slot) const {
    return seq_cells[static_cast<std::size_t>(q.handle)][static_cast<std::size_t>(slot)];
  }
  float* row(int kind, std::int32_t l, const request& q, std::int32_t h, std::int32_t slot) {
    return at_id(kind, l, slot_id(q, slot), h);
  }
  void build_tables(const std::vector<request*>& b_of) {
    build_csr(b_of, [&](const request& q) { return seq_cells[static_cast<std::size_t>(q.handle)]; });
  }
  // The library names the cells; the engine clears them for that sequence.
  std::int64_t release(const std::vector<request*>& b_of, const sh::eviction_selection<host>& sel,
                       const std::vector<shared_prefix>&, std::vector<std::string>& errors) {
    std::int64_t freed = 0;
    for (std::int32_t b = 0; b < batch; ++b) {
      if (b_of[static_cast<std::size_t>(b)] == nullptr) continue;
      request& q = *b_of[static_cast<std::size_t>(b)];
      const auto& list = seq_cells[static_cast<std::size_t>(q.handle)];
      for (std::int32_t k = 0; k < sel.counts[static_cast<std::size_t>(b)]; ++k) {
        const std::size_t at =
            static_cast<std::size_t>(b) * static_cast<std::size_t>(sel.stride) + static_cast<std::size_t>(k);
        const std::int32_t t = sel.slots[at], c = sel.cache_slots[at];
        if (t < 0 || t >= static_cast<std::int32_t>(list.size()) || list[static_cast<std::size_t>(t)] != c) {
          errors.push_back("llama.cpp: cache_slots entry " + std::to_string(c) + " is not the cell of slot " +
                           std::to_string(t) + " of seq " + std::to_string(q.handle));
          continue;
        }
        auto& cl = cells[static_cast<std::size_t>(c)];
        cl.seq &= ~bit(q.handle);
        if (cl.seq != 0)
          errors.push_back("llama.cpp: cell " + std::to_string(c) + " evicted while other sequences hold it");
        else
          cl.pos = -1, ++freed;
      }
    }
    return freed;
  }
  void after_forget(const std::vector<request*>& b_of) {
    for (const request* q : b_of)
      if (q != nullptr) refresh(q->handle);
  }
  void check(const std::vector<request>& active, const std::vector<shared_prefix>& prefixes,
             std::vector<std::string>& errors) const {
    std::uint32_t live = 0;
    for (const auto& q : active) live |= bit(q.handle);
    for (std::int32_t c = 0; c < n_cells; ++c) {
      const auto& cl = cells[static_cast<std::size_t>(c)];
      if ((cl.seq & ~live) != 0)
        errors.push_back("llama.cpp: cell " + std::to_string(c) + " still held by a sequence that left");
      if ((cl.pos < 0) != (cl.seq == 0))
        errors.push_back("llama.cpp: cell " + std::to_string(c) +
                         " has a position without a sequence or none with one");
    }
    for (const auto& q : active) {
      const auto list = cells_of(q.handle);
      if (list != seq_cells[static_cast<std::size_t>(q.handle)])
        errors.push_back("llama.cpp: the cached cell list of seq " + std::to_string(q.handle) + " is stale");
      if (static_cast<std::int32_t>(list.size()) != q.length[0]) {
        errors.push_back("llama.cpp: seq " + std::to_string(q.handle) + " holds " + std::to_string(list.size()) +
                         " cells, the request " + std::to_string(q.length[0]) + " tokens (leaked or lost cells)");
        continue;
      }
      // Every cell's position is the model's (and so the library's) position of its slot.
      for (std::int32_t t = 0; t < q.length[0]; ++t)
        if (cells[static_cast<std::size_t>(list[static_cast<std::size_t>(t)])].pos !=
            q.heads[0][static_cast<std::size_t>(t)].position)
          errors.push_back(
              "llama.cpp: slot " + std::to_string(t) + " of seq " + std::to_string(q.handle) + " is cell pos " +
              std::to_string(cells[static_cast<std::size_t>(list[static_cast<std::size_t>(t)])].pos) +
              ", the state holds position " + std::to_string(q.heads[0][static_cast<std::size_t>(t)].position));
      // llama_kv_self_seq_pos_max + 1 is where the sequence continues (the newest token is protected).
      if (!list.empty() && cells[static_cast<std::size_t>(list.back())].pos + 1 != q.next_position)
        errors.push_back("llama.cpp: seq_pos_max + 1 of seq " + std::to_string(q.handle) + " is not the next position");
    }
    for (std::size_t pi = 0; pi < prefixes.size(); ++pi) {
      const auto& p = prefixes[pi];
      if (!p.ready || p.holders == 0) continue;
      std::uint32_t holders = 0;
      for (const auto& q : active)
        if (q.prefix == static_cast<std::int32_t>(pi)) holders |= bit(q.handle);
      for (std::size_t t = 0; t < p.storage.size(); ++t) {
        const auto& cl = cells[static_cast<std::size_t>(p.storage[t])];
        if (cl.seq != holders || cl.pos != static_cast<std::int32_t>(t))
          errors.push_back("llama.cpp: shared prefix cell " + std::to_string(p.storage[t]) +
                           " lost a holder or its position");
      }
    }
  }
  void snapshot_into(snapshot_t& s) const { push_bytes(s, k, v, cells, indptr, indices, last_page_len); }
};

// FlashInfer with a page table per layer: each layer has its own pages,
// lengths and free list, and may have its own budget.
struct flashinfer_storage {
  static constexpr const char* name = "FlashInfer per-layer tables";
  static constexpr flow kind = flow::per_layer;
  static constexpr bool padding = true;
  std::int32_t L, H, D, ps, num_pages, max_pages;
  bool hnd;
  std::int64_t page_elems;
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<std::int32_t>> free_pages, indptr, indices, last_page_len;
  std::vector<std::int32_t> released;
  std::int32_t batch = 0;
  rng shuffle_rng;

  flashinfer_storage(const tl_config& c, std::int32_t capacity, rng& r)
      : L(c.layers),
        H(c.kv_heads),
        D(c.head_dim),
        ps(c.page_size),
        num_pages(max_active * ceil_div(capacity, c.page_size) + 3),
        max_pages(ceil_div(max_context, c.page_size)),
        hnd(c.hnd),
        page_elems(std::int64_t{c.page_size} * c.kv_heads * c.head_dim),
        shuffle_rng(r.next()) {
    for (std::int32_t l = 0; l < L; ++l) {
      k.push_back(background(static_cast<std::size_t>(num_pages * page_elems), 6000.0f, 9, l));
      v.push_back(background(static_cast<std::size_t>(num_pages * page_elems), 6000.0f, 10, l));
      auto& f = free_pages.emplace_back();
      for (std::int32_t p = 0; p < num_pages; ++p) f.push_back(p);
      r.shuffle(f);
      indptr.emplace_back(max_batch + 1, 0);
      indices.emplace_back(static_cast<std::size_t>(num_pages + 3), -1);
      last_page_len.emplace_back(max_batch, 0);
    }
    released.assign(static_cast<std::size_t>(num_pages), -1);
  }
  std::int32_t page_size() const { return ps; }
  void join(request& q) { q.pages.assign(static_cast<std::size_t>(L), {}); }
  void attach_prefix(request&, const shared_prefix&) { FAIL("no prefix sharing with per-layer compress"); }
  void register_prefix(const request&, shared_prefix&) { FAIL("no prefix sharing with per-layer compress"); }
  void give_back(std::int32_t l, std::int32_t page) {
    auto& f = free_pages[static_cast<std::size_t>(l)];
    f.insert(f.begin() + static_cast<std::ptrdiff_t>(shuffle_rng.next() % (f.size() + 1)), page);
  }
  void leave(request& q, bool, std::vector<request>&) {
    for (std::int32_t l = 0; l < L; ++l)
      for (std::int32_t p : q.pages[static_cast<std::size_t>(l)]) give_back(l, p);
    q.pages.clear();
  }
  std::vector<std::int32_t> batch_order(const std::vector<request>& active, rng& r) const {
    return shuffled_order(active.size(), r);
  }
  void allocate(request& q, std::int32_t offset, std::int32_t count) {
    for (std::int32_t l = 0; l < L; ++l) {
      auto& list = q.pages[static_cast<std::size_t>(l)];
      auto& f = free_pages[static_cast<std::size_t>(l)];
      for (std::int32_t k = 0; k < count; ++k) {
        const std::int32_t slot = q.length[static_cast<std::size_t>(l)] + offset + k;
        if (slot == static_cast<std::int32_t>(list.size()) * ps) {
          REQUIRE(!f.empty());
          list.push_back(f.back());
          f.pop_back();
        }
      }
    }
  }
  std::int32_t slot_id(const request&, std::int32_t) const { return -1; }
  float* row(int kind, std::int32_t l, const request& q, std::int32_t h, std::int32_t slot) {
    const std::int32_t page = q.pages[static_cast<std::size_t>(l)][static_cast<std::size_t>(slot / ps)];
    const std::int32_t t = slot % ps;
    const std::int64_t off = page * page_elems + (hnd ? (std::int64_t{h} * ps + t) * D : (std::int64_t{t} * H + h) * D);
    return (kind == 0 ? k : v)[static_cast<std::size_t>(l)].data() + off;
  }
  void build_tables(const std::vector<request*>& b_of) {
    batch = static_cast<std::int32_t>(b_of.size());
    for (std::int32_t l = 0; l < L; ++l) {
      auto& ip = indptr[static_cast<std::size_t>(l)];
      auto& ind = indices[static_cast<std::size_t>(l)];
      std::fill(ind.begin(), ind.end(), -1);
      ip[0] = 0;
      for (std::int32_t b = 0; b < batch; ++b) {
        if (b_of[static_cast<std::size_t>(b)] == nullptr) {  // a padding slot: no page
          ip[static_cast<std::size_t>(b) + 1] = ip[static_cast<std::size_t>(b)];
          last_page_len[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)] = 0;
          continue;
        }
        const request& q = *b_of[static_cast<std::size_t>(b)];
        const auto& list = q.pages[static_cast<std::size_t>(l)];
        std::copy(list.begin(), list.end(), ind.begin() + ip[static_cast<std::size_t>(b)]);
        ip[static_cast<std::size_t>(b) + 1] = ip[static_cast<std::size_t>(b)] + static_cast<std::int32_t>(list.size());
        const std::int32_t len = q.length[static_cast<std::size_t>(l)] + q.n_new;
        last_page_len[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)] =
            len == 0 ? 0 : len - (static_cast<std::int32_t>(list.size()) - 1) * ps;
      }
    }
  }
  view_t view(std::int32_t l) {
    const auto ul = static_cast<std::size_t>(l);
    return paged_view(mspan(k[ul]), mspan(v[ul]), indptr[ul], indices[ul], last_page_len[ul], batch, H, D, ps,
                      num_pages, max_pages, hnd);
  }
  // After compress on layer l: this layer's table shrinks, its pages go back.
  std::int64_t apply_layer(std::int32_t l, const std::vector<request*>& b_of,
                           const std::vector<std::int32_t>& new_lengths, std::vector<std::string>& errors) {
    std::vector<std::int32_t> expect;
    for (std::int32_t b = 0; b < batch; ++b) {
      if (b_of[static_cast<std::size_t>(b)] == nullptr) continue;
      const auto& list = b_of[static_cast<std::size_t>(b)]->pages[static_cast<std::size_t>(l)];
      expect.insert(expect.end(), list.begin() + ceil_div(new_lengths[static_cast<std::size_t>(b)], ps), list.end());
    }
    const auto ul = static_cast<std::size_t>(l);
    const std::size_t n = shrink_table(indptr[ul], indices[ul], last_page_len[ul], batch, ps, new_lengths, released,
                                       expect, "FlashInfer layer " + std::to_string(l) + ": ", errors);
    for (std::int32_t b = 0; b < batch; ++b) {
      if (b_of[static_cast<std::size_t>(b)] == nullptr) continue;
      auto& list = b_of[static_cast<std::size_t>(b)]->pages[static_cast<std::size_t>(l)];
      list.resize(static_cast<std::size_t>(ceil_div(new_lengths[static_cast<std::size_t>(b)], ps)));
    }
    for (std::size_t i = 0; i < std::min(n, released.size()); ++i) give_back(l, released[i]);
    return static_cast<std::int64_t>(n);
  }
  void check(const std::vector<request>& active, const std::vector<shared_prefix>&,
             std::vector<std::string>& errors) const {
    for (std::int32_t l = 0; l < L; ++l) {
      const std::string where = "FlashInfer layer " + std::to_string(l) + ": ";
      std::vector<const std::vector<std::int32_t>*> held;
      for (const auto& q : active) {
        const auto& list = q.pages[static_cast<std::size_t>(l)];
        if (static_cast<std::int32_t>(list.size()) != ceil_div(q.length[static_cast<std::size_t>(l)], ps))
          errors.push_back(where + "request " + std::to_string(q.id) + " holds a wrong number of pages");
        held.push_back(&list);
      }
      check_pages(where, num_pages, held, free_pages[static_cast<std::size_t>(l)], errors);
    }
  }
  void snapshot_into(snapshot_t& s) const { push_bytes(s, k, v, free_pages, indptr, indices, last_page_len); }
};

}  // namespace

namespace {

// ===========================================================================
// The engine loop: scheduling, appends, attention, observe, eviction through
// the engine's flow, and the checks. Storage is the engine's side above.
template <class Policy, class Storage>
class token_driver {
 public:
  using rules_t = model_rules<Policy>;
  using granularity = typename Policy::granularity;
  static constexpr sh::granularity_kind gkind = sh::granularity_of<Policy>;
  static constexpr bool shared_layers = gkind == sh::granularity_kind::shared_layers;
  static constexpr bool shared_heads = gkind == sh::granularity_kind::shared_heads;
  static_assert(shared_layers == (Storage::kind != flow::per_layer),
                "one table for every layer needs shared_layers; per-layer tables take per_head or shared_heads");

  explicit token_driver(const tl_config& c)
      : cfg_(c),
        rules_{c.settings},
        rng_(c.seed * 7919 + 17),
        L_(c.layers),
        H_(c.kv_heads),
        QH_(c.q_heads),
        G_(c.q_heads / c.kv_heads),
        D_(c.head_dim) {
    policy_.config = c.settings;
    std::int32_t max_budget = 0;
    for (std::int32_t l = 0; l < L_; ++l) max_budget = std::max(max_budget, budget_of(l));
    capacity_ = sh::state_capacity_for(max_budget, c.chunk);
    stride_ = sh::max_evictions(capacity_, c.budget, c.settings.evict_count);
    // model_state sizing: one eviction_state per layer, one buffer.
    shape_ = {state_rows, H_, capacity_, policy_.ring_words()};
    model_buffer_ = std::make_unique<aligned_buffer>(sh::model_state_bytes(shape_, L_));
    model_ = sh::make_model_state(model_buffer_->span(), shape_, L_);
    sh::host::reset_state(model_);
    store_ = std::make_unique<Storage>(c, capacity_, rng_);
    for (std::int32_t r = 0; r < state_rows; ++r) free_rows_.push_back(r);
    // One entry more than a batch can use: the refused calls pass spans one too long.
    rows_.assign(max_batch + 1, -1);
    qo_.assign(max_batch + 1, 0);
    pinned_.assign(max_batch + 1, 0);
    counts_.assign(max_batch + 1, -7);
    new_lengths_.assign(max_batch + 1, -7);
    freed_.assign(max_batch + 1, -7);
    sel_slots_.assign(static_cast<std::size_t>(max_batch * std::max(stride_, 1)), -7);
    cache_slots_.assign(sel_slots_.size(), -7);
    layer_new_lengths_.assign(static_cast<std::size_t>(L_), std::vector<std::int32_t>(max_batch + 1, -7));
    layer_freed_ = layer_new_lengths_;
    // Workspaces, sized once from a view (they read its capacity and pool size only).
    store_->build_tables({});
    const view_t probe = store_->view(0);
    std::size_t ws = 0;
    if constexpr (shared_layers)
      ws = sh::host::select_workspace_bytes(probe, shape_);
    else
      ws = sh::host::compress_workspace_bytes(probe, shape_);
    workspace_ = std::make_unique<aligned_buffer>(ws);
    compact_ws_ = std::make_unique<aligned_buffer>(sh::host::compact_workspace_bytes(probe));
  }

  void run() {
    INFO(Storage::name << ", " << granularity::name << ": " << cfg_.describe());
    REQUIRE(capacity_ < max_context);
    for (std::int32_t s = 0; s < cfg_.steps; ++s) {
      INFO("step " << s);
      step(s);
    }
    const std::int32_t ps = store_->page_size();
    const bool frees = ceil_div(capacity_, ps) > ceil_div(cfg_.budget - cfg_.settings.evict_count, ps);
    const bool shared = cfg_.prefix_len > 0;  // prefix hits and pinned triggers only then
    check_counters(std::string(Storage::name) + ", " + granularity::name + ": " + cfg_.describe(),
                   {{"triggers", stats_.triggers, 20},
                    {"pinned triggers", stats_.pinned_triggers, shared ? 3 : -1},
                    {"evicted", stats_.evicted},
                    {"joins", stats_.joins, 6},
                    {"leaves", stats_.leaves, 3},
                    {"prefixes created", stats_.prefixes_created},
                    {"prefix hits", stats_.prefix_hits, shared ? 2 : -1},
                    {"prefixes dropped", stats_.prefixes_dropped},
                    {"moved", stats_.moved_in_batch, 3},
                    {"prefill", stats_.prefill_chunks, 5},
                    {"decode", stats_.decode_tokens, 20},
                    {"idle", stats_.idle},
                    {"admit-only", stats_.admit_only, 1},
                    {"shifted", stats_.shifted_starts},
                    {"refused", stats_.refused, 20},
                    {"storage freed", stats_.freed_storage, frees ? 1 : -1},
                    {"padding", stats_.padding, Storage::padding ? 5 : -1},
                    {"most holders", stats_.most_holders, shared ? 3 : -1}});  // a prefix held by three at once
  }

  const tl_stats& counters() const { return stats_; }

 private:
  std::int32_t budget_of(std::int32_t l) const { return cfg_.budget + l * cfg_.layer_budget_step; }
  token_reference<Policy> reference() const { return {rules_, L_, H_}; }
  std::int32_t content_of(const request& q, std::int32_t position) const {
    return q.prefix >= 0 && position < q.prefix_len ? prefixes_[static_cast<std::size_t>(q.prefix)].content : q.id;
  }
  sh::host_span<const std::int32_t> rows_span() const { return cspan(rows_, static_cast<std::size_t>(batch_)); }
  sh::host_span<const std::int32_t> pinned_span() const { return cspan(pinned_, static_cast<std::size_t>(batch_)); }
  state_t layer_state(std::int32_t l) const { return model_.layer(l).for_batch(rows_span()); }
  model_t batch_model() const { return model_.for_batch(rows_span()); }
  sh::host_span<std::byte> workspace() const { return workspace_->span(); }
  sh::host_span<std::byte> compact_workspace() const { return compact_ws_->span(); }
  std::int64_t state_index(std::int32_t r, std::int32_t h, std::int32_t t) const {
    return (std::int64_t{r} * H_ + h) * capacity_ + t;  // the documented [rows][kv_heads][capacity]
  }
  sh::eviction_selection<host> selection() {
    const auto n = static_cast<std::size_t>(batch_);
    sh::eviction_selection<host> s;
    s.stride = stride_;
    s.counts = {counts_.data(), n};
    s.slots = {sel_slots_.data(), n * static_cast<std::size_t>(stride_)};
    s.cache_slots = {cache_slots_.data(), n * static_cast<std::size_t>(stride_)};
    s.out = {{new_lengths_.data(), n}, {freed_.data(), n}};
    return s;
  }

  // ---- scheduling ----------------------------------------------------------

  void join() {
    request q;
    q.id = next_id_++;
    q.row = take_row(rng_, free_rows_, used_rows_, stats_.reused_rows);
    q.length.assign(static_cast<std::size_t>(L_), 0);
    q.heads.resize(static_cast<std::size_t>(L_ * H_));
    q.prompt_left = rng_.uniform(1, 40);
    q.decode_left = rng_.uniform(4, 40);
    if (cfg_.prefix_len > 0) {
      std::vector<std::int32_t> ready;
      for (std::size_t i = 0; i < prefixes_.size(); ++i)
        if (prefixes_[i].ready && prefixes_[i].holders > 0) ready.push_back(static_cast<std::int32_t>(i));
      if (!ready.empty() && rng_.chance(0.6)) {
        // A prefix cache hit: the prefix's storage is mapped, not recomputed.
        q.prefix = ready[rng_.next() % ready.size()];
        q.prefix_len = q.attached = cfg_.prefix_len;
        const std::int32_t holders = ++prefixes_[static_cast<std::size_t>(q.prefix)].holders;
        stats_.most_holders = std::max<std::int64_t>(stats_.most_holders, holders);
        ++stats_.prefix_hits;
      } else if (rng_.chance(0.5)) {
        // This request computes a new shared prefix (its first prefix_len tokens).
        shared_prefix p;
        p.content = prefix_content_base + static_cast<std::int32_t>(prefixes_.size());
        p.length = cfg_.prefix_len;
        p.holders = 1;
        prefixes_.push_back(p);
        q.prefix = static_cast<std::int32_t>(prefixes_.size()) - 1;
        q.prefix_len = cfg_.prefix_len;
        q.creator = true;
        q.prompt_left = cfg_.prefix_len + rng_.uniform(1, 20);
        ++stats_.prefixes_created;
      }
    }
    if (q.prefix < 0 && rng_.chance(0.25)) {
      q.start = rng_.uniform(1, 30);  // positions need not start at 0
      ++stats_.shifted_starts;
    }
    q.next_position = q.start;
    sh::host::reset_sequence(model_, q.row, q.start);  // every layer's row, for the new request
    active_.push_back(std::move(q));
    request& a = active_.back();
    store_->join(a);
    if (a.attached > 0) store_->attach_prefix(a, prefixes_[static_cast<std::size_t>(a.prefix)]);
    ++stats_.joins;
  }

  void leave(std::size_t i) {
    request& q = active_[i];
    bool last = true;
    if (q.prefix >= 0) {
      auto& p = prefixes_[static_cast<std::size_t>(q.prefix)];
      last = --p.holders == 0;
      if (last && p.ready) ++stats_.prefixes_dropped;
    }
    store_->leave(q, last, active_);
    free_rows_.push_back(q.row);
    active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    ++stats_.leaves;
  }

  void schedule() {
    for (std::size_t i = active_.size(); i-- > 0;) {
      const auto& q = active_[i];
      if ((q.prompt_left == 0 && q.decode_left == 0 && q.attached == 0) || rng_.chance(0.03)) leave(i);
    }
    while (static_cast<std::int32_t>(active_.size()) < max_active && !free_rows_.empty() &&
           rng_.chance(active_.empty() ? 1.0 : 0.35))
      join();
    const auto order = store_->batch_order(active_, rng_);
    b_of_.clear();
    for (std::int32_t i : order) b_of_.push_back(&active_[static_cast<std::size_t>(i)]);
    if (Storage::padding && rng_.chance(0.3)) {
      // Padding slots (row -1, no token), as a CUDA-graph batch of a fixed size has.
      for (std::int32_t k = rng_.uniform(1, max_padding); k > 0; --k)
        b_of_.insert(b_of_.begin() + static_cast<std::ptrdiff_t>(rng_.next() % (b_of_.size() + 1)), nullptr);
    }
    batch_ = static_cast<std::int32_t>(b_of_.size());
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (b_of_[static_cast<std::size_t>(b)] == nullptr) {
        ++stats_.padding;
        continue;
      }
      request& q = *b_of_[static_cast<std::size_t>(b)];
      q.attached_now = 0;
      if (q.attached == 0) {
        plan_step(q, b, cfg_.chunk, rng_, stats_);
        continue;
      }
      // First step after a prefix hit: the mapped prefix is admitted (no
      // queries), the rest of the first chunk is computed.
      seat(q, b, stats_);
      const std::int32_t x = std::min(q.prompt_left, rng_.uniform(0, cfg_.chunk));
      q.prompt_left -= x;
      q.attached_now = q.attached;
      q.n_new = q.attached + x;
      q.q_len = x;
      q.attached = 0;
      ++(x > 0 ? stats_.prefill_chunks : stats_.admit_only);
    }
  }

  // The engine allocates storage for the step's new tokens and writes their
  // K/V rows in every layer (a shared prefix's rows are already there).
  void allocate_and_write() {
    for (request* qp : b_of_) {
      if (qp == nullptr) continue;
      request& q = *qp;
      const std::int32_t fresh = q.n_new - q.attached_now;
      if (fresh <= 0) continue;
      store_->allocate(q, q.attached_now, fresh);
      for (std::int32_t l = 0; l < L_; ++l)
        for (std::int32_t i = q.attached_now; i < q.n_new; ++i) {
          const std::int32_t slot = q.length[static_cast<std::size_t>(l)] + i, position = q.base + i;
          for (std::int32_t h = 0; h < H_; ++h)
            for (int kind = 0; kind < 2; ++kind) {
              float* dst = nullptr;
              if constexpr (Storage::kind == flow::compact)  // vLLM: reshape_and_cache through slot_mapping
                dst = store_->at_slot(kind, l, store_->slot_mapping[static_cast<std::size_t>(i - q.attached_now)], h);
              else
                dst = store_->row(kind, l, q, h, slot);
              for (std::int32_t x = 0; x < D_; ++x)
                dst[x] = token_value(kind, content_of(q, position), l, h, position, x);
            }
        }
    }
  }

  void build_batch() {
    qo_[0] = 0;
    std::int32_t max_len = 0;
    for (std::int32_t b = 0; b < batch_; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      if (b_of_[ub] == nullptr) {
        rows_[ub] = -1;
        qo_[ub + 1] = qo_[ub];
        pinned_[ub] = 0;
        continue;
      }
      const request& q = *b_of_[ub];
      rows_[ub] = q.row;
      qo_[ub + 1] = qo_[ub] + q.q_len;
      const std::int32_t len = q.length[0] + q.n_new;
      pinned_[ub] = q.prefix >= 0 ? std::min(q.prefix_len, len) : 0;
      for (std::int32_t l = 0; l < L_; ++l)
        max_len = std::max(max_len, q.length[static_cast<std::size_t>(l)] + q.n_new);
    }
    tokens_ = qo_[static_cast<std::size_t>(batch_)];
    columns_ = max_len + 3;  // a padded row stride
  }

  // ---- attention and observation -------------------------------------------

  // The engine's attention over the cached keys (double), handed to the
  // library as fp32 probabilities [token][q_head][columns].
  void attention(std::int32_t l) {
    probs_.assign(std::max<std::size_t>(1, static_cast<std::size_t>(tokens_) * QH_ * columns_), -1.0f);  // poison
    const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
    std::vector<double> logits;
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (b_of_[static_cast<std::size_t>(b)] == nullptr) continue;
      const request& q = *b_of_[static_cast<std::size_t>(b)];
      if (q.q_len == 0) continue;
      const std::int32_t len = q.length[static_cast<std::size_t>(l)] + q.n_new;
      for (std::int32_t j = 0; j < q.q_len; ++j) {
        const std::int32_t token = qo_[static_cast<std::size_t>(b)] + j;
        const std::int32_t position = q.base + q.n_new - q.q_len + j;
        const std::int32_t visible = len - q.q_len + j + 1;
        for (std::int32_t qh = 0; qh < QH_; ++qh) {
          logits.assign(static_cast<std::size_t>(visible), 0.0);
          double top = -std::numeric_limits<double>::infinity();
          for (std::int32_t s = 0; s < visible; ++s) {
            const float* k = store_->row(0, l, q, qh / G_, s);
            double dot = 0.0;
            for (std::int32_t x = 0; x < D_; ++x)
              dot += static_cast<double>(query_value(q.id, l, qh, position, x)) * k[x];
            logits[static_cast<std::size_t>(s)] = dot * scale;
            top = std::max(top, dot * scale);
          }
          double sum = 0.0;
          for (double z : logits) sum += std::exp(z - top);
          const std::size_t base = (static_cast<std::size_t>(token) * QH_ + qh) * columns_;
          for (std::int32_t s = 0; s < visible; ++s)
            probs_[base + s] = static_cast<float>(std::exp(logits[static_cast<std::size_t>(s)] - top) / sum);
        }
      }
    }
  }

  void observe(std::int32_t l) {
    if (probs_.empty()) probs_.assign(1, 0.0f);
    sh::host::observe_probabilities(
        policy_, store_->view(l), layer_state(l),
        sh::probability_view<host>::ragged(cspan(probs_, probs_.size()),
                                           cspan(qo_, static_cast<std::size_t>(batch_) + 1), QH_, columns_));
  }

  // The model replays the same step from the definition (reference_model.hpp).
  void model_observe(std::int32_t l) {
    for (std::int32_t b = 0; b < batch_; ++b)
      if (request* q = b_of_[static_cast<std::size_t>(b)])
        rules_.replay(*q, l, q->length[static_cast<std::size_t>(l)] + q->n_new, qo_[static_cast<std::size_t>(b)],
                      {H_, G_, columns_, probs_.data()});
  }

  // ---- shared_layers: select, then the engine's flow -------------------------

  // The selection against the reference; false when it cannot be applied.
  bool check_selection() {
    bool ok = true;
    const std::int32_t budget = cfg_.budget, m = cfg_.settings.evict_count, ps = store_->page_size();
    const auto ref = reference();
    for (std::int32_t b = 0; b < batch_; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      if (b_of_[ub] == nullptr) {
        if (counts_[ub] != 0 || new_lengths_[ub] != 0 || freed_[ub] != 0) {
          errors_.push_back("select: padding slot " + std::to_string(b) + " got a count, a length or freed pages");
          ok = false;
        }
        continue;
      }
      const request& q = *b_of_[ub];
      const std::int32_t len = q.length[0] + q.n_new, next = q.base + q.n_new;
      const std::int32_t want = len >= budget ? len - budget + m : 0;
      std::ostringstream where;
      where << "select, request " << q.id << " (batch " << b << ", row " << q.row << ", length " << len << "): ";
      if (counts_[ub] != want) {
        errors_.push_back(where.str() + "counts " + std::to_string(counts_[ub]) + ", expected " + std::to_string(want));
        ok = false;
        continue;
      }
      if (new_lengths_[ub] != sh::length_after_compress(len, budget, m) || new_lengths_[ub] != len - want)
        errors_.push_back(where.str() + "new_lengths " + std::to_string(new_lengths_[ub]));
      if (freed_[ub] != ceil_div(len, ps) - ceil_div(len - want, ps))
        errors_.push_back(where.str() + "freed_pages " + std::to_string(freed_[ub]));
      if (want == 0) continue;
      ++stats_.triggers;
      stats_.evicted += want;
      if (pinned_[ub] > 0) ++stats_.pinned_triggers;
      const std::int32_t* slots = sel_slots_.data() + ub * static_cast<std::size_t>(stride_);
      std::vector<char> got(static_cast<std::size_t>(len), 0);
      for (std::int32_t k = 0; k < want; ++k) {
        if (slots[k] < 0 || slots[k] >= len || (k > 0 && slots[k] <= slots[k - 1])) {
          errors_.push_back(where.str() + "slots not ascending in [0, length)");
          ok = false;
          break;
        }
        got[static_cast<std::size_t>(slots[k])] = 1;
      }
      if (!ok) continue;
      for (std::int32_t k = 0; k < want; ++k) {
        const std::int32_t t = slots[k], position = q.heads[0][static_cast<std::size_t>(t)].position;
        if (rules_.is_protected(position, next))
          errors_.push_back(where.str() + "evicts protected position " + std::to_string(position));
        if (t < pinned_[ub])
          errors_.push_back(where.str() + "evicts slot " + std::to_string(t) + " of the pinned prefix");
        const std::int32_t id = cache_slots_[ub * static_cast<std::size_t>(stride_) + static_cast<std::size_t>(k)];
        if (id != store_->slot_id(q, t))
          errors_.push_back(where.str() + "cache_slots names " + std::to_string(id) + " for slot " + std::to_string(t) +
                            ", the engine's slot id is " + std::to_string(store_->slot_id(q, t)));
      }
      const auto gone = ref.template shared_layers_victims<granularity>(q.heads, pinned_[ub], next, want);
      if (gone.empty()) {
        errors_.push_back(where.str() + "the reference finds fewer than " + std::to_string(want) + " eligible tokens");
      } else if (gone != got) {
        std::ostringstream e;
        e << where.str() << "evicts positions " << positions_text(q.heads[0], got) << ", the reference "
          << positions_text(q.heads[0], gone) << "; combined scores:";
        for (std::int32_t t = 0; t < len; ++t)
          if (got[static_cast<std::size_t>(t)] != gone[static_cast<std::size_t>(t)])
            e << " pos " << q.heads[0][static_cast<std::size_t>(t)].position << " = "
              << ref.template model_score<typename granularity::head_reduction, typename granularity::layer_reduction>(
                     q.heads, t);
        errors_.push_back(e.str());
      }
    }
    return ok;
  }

  void evict_shared() {
    if constexpr (shared_layers) {
      for (auto* v : {&counts_, &sel_slots_, &cache_slots_, &new_lengths_, &freed_})
        std::fill(v->begin(), v->end(), -7);
      if (inject_) refused_select_calls();
      sh::host::select(policy_, store_->view(0), batch_model(), cfg_.budget, workspace(), selection(), pinned_span());
      if (!check_selection()) return;
      if constexpr (Storage::kind == flow::compact)
        apply_compact();
      else
        apply_forget();
      // The model follows what was applied.
      const bool stable =
          Storage::kind == flow::forget || cfg_.settings.compaction_mode == sh::compaction::preserve_order;
      for (std::int32_t b = 0; b < batch_; ++b) {
        const auto ub = static_cast<std::size_t>(b);
        if (b_of_[ub] == nullptr) continue;
        request& q = *b_of_[ub];
        const std::int32_t len = q.length[0] + q.n_new, count = counts_[ub];
        if (count > 0) {
          std::vector<char> gone(static_cast<std::size_t>(len), 0);
          for (std::int32_t k = 0; k < count; ++k)
            gone[static_cast<std::size_t>(
                sel_slots_[ub * static_cast<std::size_t>(stride_) + static_cast<std::size_t>(k)])] = 1;
          for (auto& slots : q.heads) slots = after_eviction(std::move(slots), gone, stable);
        }
        for (auto& n : q.length) n = len - count;
      }
    }
  }

  std::int32_t first_evicting() const {
    for (std::int32_t b = 0; b < batch_; ++b)
      if (counts_[static_cast<std::size_t>(b)] > 0) return b;
    return -1;
  }

  // vLLM: compact every layer with one selection, then the table once.
  void apply_compact() {
    if constexpr (Storage::kind == flow::compact) {
      const bool inject = inject_ && first_evicting() >= 0;
      if (inject) refused_compact_calls();
      for (std::int32_t l = 0; l < L_; ++l) {
        sh::host::compact(policy_, store_->view(l), layer_state(l), selection(), compact_workspace());
        if (inject && l == 0)
          expect_refused("compact: the same selection applied to a layer twice", "host::compact", "state", [&] {
            sh::host::compact(policy_, store_->view(0), layer_state(0), selection(), compact_workspace());
          });
      }
      stats_.freed_storage += store_->apply_lengths(b_of_, new_lengths_, errors_);
    }
  }

  // SGLang, llama.cpp: the engine frees the named slots / cells and drops
  // them from its token lists; forget then drops them from every layer's
  // state. Nothing moves K or V.
  void apply_forget() {
    if constexpr (Storage::kind == flow::forget) {
      const bool inject = inject_ && first_evicting() >= 0;
      if (inject) refused_forget_calls();
      snapshot_t before, after;
      store_->kv_into(before);
      stats_.freed_storage += store_->release(b_of_, selection(), prefixes_, errors_);
      for (std::int32_t l = 0; l < L_; ++l) {
        sh::host::forget(policy_, store_->view(l), layer_state(l), selection());
        if (inject && l == 0)
          expect_refused("forget: the same selection applied to a layer twice", "host::forget", "state",
                         [&] { sh::host::forget(policy_, store_->view(0), layer_state(0), selection()); });
      }
      store_->after_forget(b_of_);
      store_->kv_into(after);
      if (after != before)
        errors_.push_back(std::string(Storage::name) + ": a K/V row changed during release + forget");
    }
  }

  // ---- per-layer tables: compress each layer -------------------------------

  void evict_per_layer() {
    if constexpr (Storage::kind == flow::per_layer) {
      const std::int32_t m = cfg_.settings.evict_count, ps = store_->page_size();
      const auto n = static_cast<std::size_t>(batch_);
      const std::int32_t inject_layer = static_cast<std::int32_t>(stats_.steps % L_);
      for (std::int32_t l = 0; l < L_; ++l) {
        INFO("compress, layer " << l);
        const std::int32_t budget = budget_of(l);
        auto& nl = layer_new_lengths_[static_cast<std::size_t>(l)];
        auto& fr = layer_freed_[static_cast<std::size_t>(l)];
        std::fill(nl.begin(), nl.end(), -7);
        std::fill(fr.begin(), fr.end(), -7);
        const sh::compress_output<host> out{{nl.data(), n}, {fr.data(), n}};
        if (inject_ && l == inject_layer) refused_compress_calls(l, budget, out);
        sh::host::compress(policy_, store_->view(l), layer_state(l), budget, workspace(), out);
        bool ok = true;
        for (std::int32_t b = 0; b < batch_; ++b) {
          const request* qp = b_of_[static_cast<std::size_t>(b)];
          const std::int32_t len = qp == nullptr ? 0 : qp->length[static_cast<std::size_t>(l)] + qp->n_new;
          const std::int32_t want = sh::length_after_compress(len, budget, m);
          if (nl[static_cast<std::size_t>(b)] != want ||
              fr[static_cast<std::size_t>(b)] != ceil_div(len, ps) - ceil_div(want, ps)) {
            errors_.push_back("layer " + std::to_string(l) + ", batch position " + std::to_string(b) +
                              ": compress reports length " + std::to_string(nl[static_cast<std::size_t>(b)]) +
                              " / freed " + std::to_string(fr[static_cast<std::size_t>(b)]) + ", expected " +
                              std::to_string(want));
            ok = false;
          }
        }
        if (!ok) return;
        model_compress_layer(l, budget);
        stats_.freed_storage += store_->apply_layer(l, b_of_, nl, errors_);
        for (std::int32_t b = 0; b < batch_; ++b)
          if (b_of_[static_cast<std::size_t>(b)] != nullptr)
            b_of_[static_cast<std::size_t>(b)]->length[static_cast<std::size_t>(l)] = nl[static_cast<std::size_t>(b)];
      }
    }
  }

  // Which tokens layer l's compress removed (read from the V rows), against
  // the reference per head (per_head) or per layer (shared_heads).
  void model_compress_layer(std::int32_t l, std::int32_t budget) {
    const std::int32_t m = cfg_.settings.evict_count;
    const auto ref = reference();
    const bool stable = cfg_.settings.compaction_mode == sh::compaction::preserve_order;
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (b_of_[static_cast<std::size_t>(b)] == nullptr) continue;
      request& q = *b_of_[static_cast<std::size_t>(b)];
      const std::int32_t len = q.length[static_cast<std::size_t>(l)] + q.n_new, next = q.base + q.n_new;
      if (len < budget) continue;
      const std::int32_t kept = budget - m, evict = len - kept;
      if (l == 0) {
        ++stats_.triggers;
        stats_.evicted += evict;
      }
      std::vector<char> layer_gone;
      if constexpr (shared_heads) layer_gone = ref.template shared_heads_victims<granularity>(q.heads, l, next, evict);
      for (std::int32_t h = 0; h < H_; ++h) {
        auto& slots = q.heads[static_cast<std::size_t>(l * H_ + h)];
        const auto gone = shared_heads ? layer_gone : ref.per_head_victims(q.heads, l, h, next, evict);
        std::ostringstream where;
        where << "compress, layer " << l << " head " << h << ", request " << q.id << ": ";
        if (gone.empty()) {
          errors_.push_back(where.str() + "the reference finds too few eligible tokens");
          continue;
        }
        std::multiset<std::int32_t> library, reference_kept;
        for (std::int32_t s = 0; s < kept; ++s)
          library.insert(static_cast<std::int32_t>(store_->row(1, l, q, h, s)[0]));
        for (std::int32_t s = 0; s < len; ++s)
          if (!gone[static_cast<std::size_t>(s)]) reference_kept.insert(slots[static_cast<std::size_t>(s)].position);
        if (library != reference_kept) {
          std::ostringstream e;
          e << where.str() << "kept positions {";
          for (std::int32_t p : library) e << " " << p;
          e << " }, the reference keeps {";
          for (std::int32_t p : reference_kept) e << " " << p;
          e << " }";
          errors_.push_back(e.str());
        }
        slots = after_eviction(std::move(slots), gone, stable);
      }
    }
  }

  // ---- refused calls -------------------------------------------------------

  snapshot_t snapshot() const {
    snapshot_t s;
    push_bytes(s, *model_buffer_, counts_, sel_slots_, cache_slots_, new_lengths_, freed_, rows_, qo_, pinned_,
               layer_new_lengths_, layer_freed_, probs_);
    store_->snapshot_into(s);
    return s;
  }

  // The call must throw invalid_argument naming `argument` and leave every
  // caller-owned byte (K/V, state, tables, outputs) as it was.
  template <class Call>
  void expect_refused(const char* label, const std::string& function, const std::string& argument, Call call) {
    check_refused_call(
        label, [&] { return snapshot(); }, function, argument, call, stats_.refused);
  }

  void refused_select_calls() {
    const std::string fn = "host::select";
    const auto n = static_cast<std::size_t>(batch_);
    const view_t v = store_->view(0);
    const model_t mm = batch_model();
    const auto ws = workspace();
    const auto good = selection();
    const auto pinned = pinned_span();
    const auto call = [&](const model_t& model, std::int32_t budget, sh::host_span<std::byte> w,
                          sh::eviction_selection<host> sel, sh::host_span<const std::int32_t> pin) {
      sh::host::select(policy_, v, model, budget, w, sel, pin);
    };
    const std::int32_t budget = cfg_.budget;
    // A copy of the good selection, damaged by `damage`.
    const auto refused = [&](const char* label, const std::string& argument, auto damage) {
      auto s = good;
      damage(s);
      expect_refused(label, fn, argument, [&] { call(mm, budget, ws, s, pinned); });
    };
    using selection_t = sh::eviction_selection<host>;
    const std::size_t slots = n * static_cast<std::size_t>(stride_);
    refused("select: stride below max_evictions", "selection.stride", [&](selection_t& s) { s.stride = stride_ - 1; });
    refused("select: counts one entry too many", "selection.counts", [&](selection_t& s) {
      s.counts = {counts_.data(), n + 1};
    });
    refused("select: slots one entry short", "selection.slots", [&](selection_t& s) {
      s.slots = {sel_slots_.data(), slots - 1};
    });
    refused("select: cache_slots one entry short", "selection.cache_slots", [&](selection_t& s) {
      s.cache_slots = {cache_slots_.data(), slots - 1};
    });
    refused("select: cache_slots over slots", "selection.cache_slots", [&](selection_t& s) {
      s.cache_slots = {sel_slots_.data(), slots};
    });
    refused("select: new_lengths over pinned_prefix", "selection.out.new_lengths", [&](selection_t& s) {
      s.out.new_lengths = {pinned_.data(), n};
    });
    // select names its outputs selection.*, out.* included.
    refused("select: new_lengths one entry too many", "selection.out.new_lengths", [&](selection_t& s) {
      s.out.new_lengths = {new_lengths_.data(), n + 1};
    });
    refused("select: freed_pages one entry too many", "selection.out.freed_pages", [&](selection_t& s) {
      s.out.freed_pages = {freed_.data(), n + 1};
    });
    refused("select: counts over the page table's indptr", "selection.counts", [&](selection_t& s) {
      s.counts = {const_cast<std::int32_t*>(v.indptr.data()), n};
    });
    expect_refused("select: workspace one byte short", fn, "workspace", [&] {
      call(mm, budget, {ws.data(), ws.size() - 1}, good, pinned);
    });
    expect_refused("select: budget not above the protected tokens", fn, "budget",
                   [&] { call(mm, cfg_.settings.recent + cfg_.settings.sinks, ws, good, pinned); });
    {
      std::vector<std::int32_t> pin(n + 1, 0);
      expect_refused("select: pinned_prefix one entry too many", fn, "pinned_prefix",
                     [&] { call(mm, budget, ws, good, cspan(pin, pin.size())); });
    }
    bool above = false;
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (b_of_[static_cast<std::size_t>(b)] == nullptr) continue;
      const request& q = *b_of_[static_cast<std::size_t>(b)];
      const std::int32_t len = q.length[0] + q.n_new;
      std::vector<std::int32_t> pin(pinned_.begin(), pinned_.begin() + batch_);
      if (len > 0 && !above) {
        above = true;
        pin[static_cast<std::size_t>(b)] = len + 1;
        expect_refused("select: pinned_prefix above the length", fn, "pinned_prefix",
                       [&] { call(mm, budget, ws, good, cspan(pin, n)); });
      }
      if (len >= budget) {
        pin[static_cast<std::size_t>(b)] = len;
        expect_refused("select: a pinned prefix leaving fewer tokens than to evict", fn, "pinned_prefix",
                       [&] { call(mm, budget, ws, good, cspan(pin, n)); });
        break;
      }
    }
    {
      model_t bad = mm;
      bad.layer_bytes += 256;
      expect_refused("select: model.layer_bytes not state_bytes(shape)", fn, "model.layer_bytes",
                     [&] { call(bad, budget, ws, good, pinned); });
    }
    std::vector<std::size_t> real;
    for (std::int32_t b = 0; b < batch_; ++b)
      if (rows_[static_cast<std::size_t>(b)] >= 0) real.push_back(static_cast<std::size_t>(b));
    if (real.size() >= 2) {
      std::vector<std::int32_t> dup(rows_.begin(), rows_.begin() + batch_);
      dup[real[1]] = dup[real[0]];
      expect_refused("select: two batch positions on one state row", fn, "state.state_rows",
                     [&] { call(model_.for_batch(cspan(dup, n)), budget, ws, good, pinned); });
    }
  }

  // Before the last layer is observed: that layer tracks fewer tokens.
  void refused_select_early() {
    bool any = false;
    for (const request* q : b_of_)
      any = any || (q != nullptr && q->n_new > 0 && q->length.back() + q->n_new >= cfg_.budget);
    if (!any) return;
    expect_refused("select before the last layer was observed", "host::select", "model", [&] {
      sh::host::select(policy_, store_->view(0), batch_model(), cfg_.budget, workspace(), selection(), pinned_span());
    });
  }

  // Each call gets the selection with its slots / counts copied and damaged.
  template <class Apply>
  void refused_apply_calls(const std::string& fn, Apply apply) {
    const std::int32_t b = first_evicting();
    const auto ub = static_cast<std::size_t>(b);
    const request& q = *b_of_[ub];
    const std::int32_t len = q.length[0] + q.n_new, count = counts_[ub];
    const std::size_t at = ub * static_cast<std::size_t>(stride_);
    const auto refused = [&](const char* label, const std::string& argument, auto damage) {
      auto slots = sel_slots_;
      auto counts = counts_;
      damage(slots, counts);
      auto s = selection();
      s.slots = {slots.data(), s.slots.size()};
      s.counts = {counts.data(), s.counts.size()};
      expect_refused(label, fn, argument, [&] { apply(s); });
    };
    using ints = std::vector<std::int32_t>;
    refused("a protected slot (the newest token)", "selection.slots",
            [&](ints& slots, ints&) { slots[at + static_cast<std::size_t>(count) - 1] = len - 1; });
    if (count >= 2)
      refused("slots not ascending", "selection.slots",
              [&](ints& slots, ints&) { std::swap(slots[at], slots[at + 1]); });
    refused("a count above the length", "selection.counts", [&](ints&, ints& counts) { counts[ub] = len + 1; });
  }

  void refused_compact_calls() {
    if constexpr (Storage::kind == flow::compact) {
      const std::string fn = "host::compact";
      refused_apply_calls(fn, [&](sh::eviction_selection<host> s) {
        sh::host::compact(policy_, store_->view(0), layer_state(0), s, compact_workspace());
      });
      const auto ws = compact_workspace();
      expect_refused("compact: workspace one byte short", fn, "workspace", [&] {
        sh::host::compact(policy_, store_->view(0), layer_state(0), selection(), {ws.data(), ws.size() - 1});
      });
      // A block compact rewrites, also listed by another request (prefix
      // caching would do that if the shared blocks were not pinned).
      const std::int32_t b = first_evicting();
      const std::int32_t len =
          b_of_[static_cast<std::size_t>(b)]->length[0] + b_of_[static_cast<std::size_t>(b)]->n_new;
      const std::int32_t first = sel_slots_[static_cast<std::size_t>(b) * static_cast<std::size_t>(stride_)];
      if (first < len - counts_[static_cast<std::size_t>(b)])
        for (std::int32_t other = 0; other < batch_; ++other) {
          if (other == b || store_->csr_pages(other) == 0) continue;
          auto alt = store_->csr_indices();
          alt[static_cast<std::size_t>(store_->csr_start(other))] =
              alt[static_cast<std::size_t>(store_->csr_start(b) + first / store_->page_size())];
          expect_refused("compact: a block it rewrites listed by another request", fn, "cache.indices", [&] {
            sh::host::compact(policy_, store_->view(0, &alt), layer_state(0), selection(), compact_workspace());
          });
          break;
        }
    }
  }

  void refused_forget_calls() {
    if constexpr (Storage::kind == flow::forget)
      refused_apply_calls("host::forget", [&](sh::eviction_selection<host> s) {
        sh::host::forget(policy_, store_->view(0), layer_state(0), s);
      });
  }

  void refused_compress_calls(std::int32_t l, std::int32_t budget, const sh::compress_output<host>& out) {
    const std::string fn = "host::compress";
    const view_t v = store_->view(l);
    const state_t st = layer_state(l);
    const auto ws = workspace();
    const auto n = static_cast<std::size_t>(batch_);
    expect_refused("compress: workspace one byte short", fn, "workspace", [&] {
      sh::host::compress(policy_, v, st, budget, {ws.data(), ws.size() - 1}, out);
    });
    expect_refused("compress: budget not above the protected tokens", fn, "budget",
                   [&] { sh::host::compress(policy_, v, st, cfg_.settings.recent + cfg_.settings.sinks, ws, out); });
    expect_refused("compress: new_lengths over the page table", fn, "out.new_lengths", [&] {
      sh::host::compress(policy_, v, st, budget, ws,
                         {{const_cast<std::int32_t*>(v.last_page_len.data()), n}, out.freed_pages});
    });
    // A damaged copy of the state: positions that leave too few tokens to
    // evict (per_head), or differ between heads (shared_heads).
    for (std::int32_t b = 0; b < batch_; ++b) {
      if (b_of_[static_cast<std::size_t>(b)] == nullptr) continue;
      const request& q = *b_of_[static_cast<std::size_t>(b)];
      const std::int32_t len = q.length[static_cast<std::size_t>(l)] + q.n_new;
      if (len < budget) continue;
      aligned_buffer copy(model_buffer_->size());
      std::memcpy(copy.data(), model_buffer_->data(), model_buffer_->size());
      const model_t alt = sh::make_model_state(copy.span(), shape_, L_);
      const state_t s = alt.layer(l).for_batch(rows_span());
      std::int32_t* pos = s.positions;
      if (shared_heads && H_ >= 2)
        std::swap(pos[state_index(q.row, H_ - 1, 0)], pos[state_index(q.row, H_ - 1, 1)]);
      else
        for (std::int32_t t = 0; t < len; ++t) pos[state_index(q.row, 0, t)] = q.base + q.n_new - 1;
      const auto damaged = bytes_of(copy);
      expect_refused("compress: a damaged state", fn, "state.positions",
                     [&] { sh::host::compress(policy_, v, s, budget, ws, out); });
      CHECK((bytes_of(copy) == damaged));
      break;
    }
  }

  // ---- after the step --------------------------------------------------------

  void finish_step() {
    for (request* qp : b_of_) {
      if (qp == nullptr) continue;
      request& q = *qp;
      q.next_position = q.base + q.n_new;
      if (rules_t::attention) q.step += q.q_len;
      if (q.creator && q.prefix >= 0) {
        auto& p = prefixes_[static_cast<std::size_t>(q.prefix)];
        if (!p.ready && q.next_position >= p.length) {
          store_->register_prefix(q, p);  // now others can hit it
          p.ready = true;
        }
      }
    }
  }

  void check_all() {
    const bool ordered =
        Storage::kind == flow::forget || cfg_.settings.compaction_mode == sh::compaction::preserve_order;
    for (const request& q : active_)
      for (std::int32_t l = 0; l < L_; ++l) {
        // One token per slot across the model (shared_layers) or the layer
        // (shared_heads); every pinned token ever admitted still there.
        const auto more = [&](std::int32_t h, const std::vector<model_token>& slots, const std::set<std::int32_t>& seen,
                              const std::string& where) {
          const auto& first = q.heads[shared_layers ? 0 : static_cast<std::size_t>(l * H_)];
          for (std::size_t t = 0; t < slots.size(); ++t)
            if ((shared_layers || shared_heads) && slots[t].position != first[t].position)
              errors_.push_back(where + "head " + std::to_string(h) + " holds another token than " +
                                (shared_layers ? "layer 0 head 0" : "head 0") + " at slot " + std::to_string(t));
          if (q.prefix >= 0)
            for (std::int32_t p = 0; p < std::min(q.prefix_len, q.next_position); ++p)
              if (!seen.count(p)) errors_.push_back(where + "pinned prefix position " + std::to_string(p) + " is gone");
        };
        check_layer(
            rules_, model_.layer(l), q.heads,
            {l, q.id, q.row, q.length[static_cast<std::size_t>(l)], H_, D_, capacity_, q.start, q.next_position, q.step,
             ordered, /*exact=*/true},
            [&](int kind, std::int32_t h, std::int32_t t) { return store_->row(kind, l, q, h, t); },
            [&](std::int32_t position) { return content_of(q, position); }, more, errors_);
      }
    store_->check(active_, prefixes_, errors_);
  }

  void step(std::int32_t s) {
    ++stats_.steps;
    errors_.clear();
    inject_ = s % 5 == 2;
    schedule();
    allocate_and_write();
    store_->build_tables(b_of_);
    build_batch();
    for (std::int32_t l = 0; l < L_; ++l) {
      INFO("layer " << l);
      if (rules_t::attention) attention(l);
      if constexpr (shared_layers)
        if (inject_ && l == L_ - 1) refused_select_early();
      observe(l);
      model_observe(l);
    }
    if constexpr (Storage::kind == flow::per_layer)
      evict_per_layer();
    else
      evict_shared();
    finish_step();
    check_all();
    report_step_errors(errors_);
  }

  tl_config cfg_;
  Policy policy_{};
  rules_t rules_;
  rng rng_;
  std::int32_t L_, H_, QH_, G_, D_;
  std::int32_t capacity_ = 0, stride_ = 0;
  sh::state_shape shape_{};
  std::unique_ptr<aligned_buffer> model_buffer_;
  model_t model_{};
  std::unique_ptr<Storage> store_;
  std::unique_ptr<aligned_buffer> workspace_, compact_ws_;
  std::vector<request> active_;
  std::vector<shared_prefix> prefixes_;
  std::vector<request*> b_of_;  // batch position -> request
  std::vector<std::int32_t> free_rows_, used_rows_;
  std::int32_t batch_ = 0, next_id_ = 1, columns_ = 1, tokens_ = 0;
  std::vector<std::int32_t> rows_, qo_, pinned_;
  std::vector<float> probs_;
  std::vector<std::int32_t> counts_, sel_slots_, cache_slots_, new_lengths_, freed_;
  std::vector<std::vector<std::int32_t>> layer_new_lengths_, layer_freed_;
  bool inject_ = false;
  tl_stats stats_;
  std::vector<std::string> errors_;
};

template <class Policy, class Storage>
void run_engine(const tl_config& c) {
  token_driver<Policy, Storage> d(c);
  d.run();
}

// One engine run: its name, the policy and engine (the run_engine that
// drives them) and the config; each is a section of its test case.
struct scenario {
  const char* name;
  void (*run)(const tl_config&);
  tl_config config;
};

void run_scenarios(std::initializer_list<scenario> scenarios) {
  for (const scenario& s : scenarios) DYNAMIC_SECTION(s.name) {
      s.run(s.config);
    }
}

template <class Policy, class G>
using at = sh::with_granularity<Policy, G>;
using mean_mean = sh::shared_layers<sh::mean_score, sh::mean_score>;
using max_max = sh::shared_layers<sh::max_score, sh::max_score>;
using mean_max = sh::shared_layers<sh::mean_score, sh::max_score>;
constexpr auto fill_holes = sh::compaction::fill_holes;
constexpr auto preserve_order = sh::compaction::preserve_order;

}  // namespace

// One row a scenario, laid out by hand (clang-format would split each into
// a line a field): the rows are alike on purpose (data, not code).
// clang-format off
TEST_CASE("token level: vLLM padded block table, select + compact + shrink", "[engine][token_level][vllm]") {
  run_scenarios({
      {"scissorhands, block size 4, GQA 4, prefix blocks shared and pinned, fill_holes",
       run_engine<at<sh::scissorhands_policy, mean_mean>, vllm_storage>,
       {.q_heads = 8, .budget = 24, .page_size = 4, .prefix_len = 8,
        .settings = make_settings(1, 4, 0, 16, true, fill_holes), .seed = 101}},
      {"h2o, block size 16, max over heads and layers, sinks, preserve_order",
       run_engine<at<sh::h2o_policy, max_max>, vllm_storage>,
       {.budget = 24, .chunk = 6, .page_size = 16,
        .settings = make_settings(3, 3, 2, 400, false, preserve_order), .seed = 102}},
      {"tova, block size 2, 4 layers, mean over heads then max over layers, shared prefix",
       run_engine<at<sh::tova_policy, mean_max>, vllm_storage>,
       {.layers = 4, .budget = 16, .page_size = 2, .prefix_len = 4,
        .settings = make_settings(2, 2, 0, 1, false, fill_holes), .seed = 103}},
  });
}

TEST_CASE("token level: SGLang token pool, select + free slots + forget", "[engine][token_level][sglang]") {
  run_scenarios({
      {"scissorhands, 3 KV heads, radix prefix of 6 tokens",
       run_engine<at<sh::scissorhands_policy, mean_mean>, sglang_storage>,
       {.kv_heads = 3, .q_heads = 6, .budget = 20, .prefix_len = 6,
        .settings = make_settings(1, 4, 0, 16, true, fill_holes), .seed = 201}},
      {"h2o, m 2, a sink, mean over heads then max over layers, radix prefix of 5 tokens",
       run_engine<at<sh::h2o_policy, mean_max>, sglang_storage>,
       {.budget = 18, .chunk = 6, .prefix_len = 5,
        .settings = make_settings(2, 3, 1, 400, false, preserve_order), .seed = 202}},
  });
}

TEST_CASE("token level: llama.cpp cells, select + clear cells + forget", "[engine][token_level][llama]") {
  run_scenarios({
      {"important-step count, MHA, prefix cells shared by seq_cp",
       run_engine<at<sh::important_count_policy, mean_mean>, llama_storage>,
       {.q_heads = 2, .budget = 18, .prefix_len = 4,
        .settings = make_settings(1, 3, 0, 12, false, fill_holes), .seed = 301}},
      {"streaming with sinks (every score ties: the older token goes)",
       run_engine<at<sh::streaming_policy, mean_mean>, llama_storage>,
       {.budget = 16, .settings = make_settings(2, 5, 3, 400, false, fill_holes), .seed = 302}},
      {"the paper's Scissorhands (w 400), max over heads and layers",
       run_engine<at<sh::scissorhands_paper_policy, max_max>, llama_storage>,
       {.budget = 20, .settings = make_settings(1, 4, 0, 400, false, fill_holes), .seed = 303}},
  });
}

// Per-layer budgets ramp up: layer l keeps budget + l * layer_budget_step.
TEST_CASE("token level: FlashInfer per-layer tables, compress per layer (comparison)",
          "[engine][token_level][flashinfer]") {
  run_scenarios({
      {"per_head, scissorhands, page size 4, NHD",
       run_engine<sh::scissorhands_policy, flashinfer_storage>,
       {.budget = 16, .layer_budget_step = 3, .page_size = 4,
        .settings = make_settings(1, 4, 0, 16, true, fill_holes), .seed = 401}},
      {"shared_heads (mean), h2o, page size 1, preserve_order",
       run_engine<at<sh::h2o_policy, sh::shared_heads<>>, flashinfer_storage>,
       {.budget = 14, .layer_budget_step = 4, .page_size = 1,
        .settings = make_settings(2, 3, 1, 400, false, preserve_order), .seed = 402}},
      {"shared_heads (max), scissorhands, page size 16, HND",
       run_engine<at<sh::scissorhands_policy, sh::shared_heads<sh::max_score>>, flashinfer_storage>,
       {.kv_heads = 4, .q_heads = 8, .budget = 20, .layer_budget_step = 2, .page_size = 16, .hnd = true,
        .settings = make_settings(1, 4, 0, 16, true, fill_holes), .seed = 403}},
  });
}
// clang-format on
