// CUDA backend benchmarks at Llama-3-8B shapes: 32 query heads, 8 KV heads,
// head_dim 128, bf16 K/V, NHD, Scissorhands policy (w = 400, r = 10), batch
// 1/8/32/64, budget 512/2048/8192, every sequence holding `budget` tokens.
//
//   copy                   cudaMemcpyAsync device to device of the layer's K
//                          and V: the bandwidth every figure is compared to,
//                          measured in the same run (bytes read + written).
//   observe_queries        decode step (q_len 1) with the log-sum-exp given:
//                          one read of K (bf16 queries: the tensor-core
//                          path).
//   observe_probabilities  decode step from [batch][32][budget] fp32
//                          probabilities.
//                          Both observe the last token as a new one each
//                          call (layer::rewind_last_token, untimed): it is
//                          admitted, then scored with the others.
//   compress m=1 / m=B/16  each timed call triggers on every sequence
//                          (length == budget, e = m) on a state restored
//                          (untimed) from a pristine copy: positions 0..B-1,
//                          Scissorhands-like window counts floor(401 u^3)
//                          as scores (many ties), so selection does real work.
//   compress_paged         compress on the same K and V seen as a FlashInfer
//                          paged cache (page size 16, NHD, each sequence's
//                          pages consecutive in the pool; batch 1 and 32,
//                          B = 2048): adds the listing counts' memset and
//                          the shared-page check.
//   compress_select        compress's first kernel alone (selection, no
//                          moves; batch 1 and 32, B = 2048): with compress
//                          at the same shape, how a call splits between
//                          selecting and compacting plus the gap between
//                          the two kernels.
//   compress_ordered       compress with compaction::preserve_order (batch 1
//                          and 32, B = 2048): the order-preserving shift
//                          (also what compact and forget run), with the
//                          rows it shifted counted.
//   compress_shared_heads  compress with a shared_heads policy (every head
//                          of a sequence evicts the same slots, whole pages
//                          free) on the paged view (batch 1 and 32,
//                          B = 2048): selection by select_shared_kernel.
//   select_model           select with a shared_layers policy over a model
//                          of 32 layers (each the layer's state) on the
//                          paged view: the once-per-m-steps choice a paged
//                          engine makes for the whole model.
//   select_model_split     the same selection as local_scores (a grid over
//                          chunks, layers and sequences) then select from
//                          those scores: the tensor-parallel path on one
//                          rank, chosen bit for bit as select_model does.
//   compact                compact of one layer with select_model's
//                          selection: what an engine then calls per layer
//                          (select_model + 32 x compact is a model's
//                          token-level eviction).
//   launch_pair            an empty first kernel that lets the second start
//                          (griddepcontrol.launch_dependents) and an empty
//                          second that waits for it, 256 blocks of 256
//                          threads each: one kernel alone, the pair launched
//                          the ordinary way, and the pair with programmatic
//                          dependent launch (sm_90+). pair - one is what a
//                          second launch costs a call, the figure that
//                          decides whether fusing compress's two kernels
//                          (issue 11) is worth its complexity.
//   shrink_page_table      applying compress m=B/16's new lengths to a
//                          FlashInfer table (page size 16, every sequence
//                          at the budget), restored untimed before each call.
//
// The state is sized as an engine sizes it, by the budget
// (state_capacity_for(budget, 1) slots: decode appends one token between
// compress calls), and mapped through state_rows in reverse order. The
// /state:32768 variants of observe (batch 32, B = 2048) size the cache and
// the state for a 32k prompt instead, the sequences still at the budget:
// the grids are sized by the 32k the host must assume, capped, and each
// sequence spread over its blocks (cuda/detail/slot_chunks.hpp).
//
// Timing: manual, with CUDA events around one call on a stream kept busy by
// a short spin kernel while the host enqueues it, so the host's launch
// overhead is not counted but the gaps between the call's own kernels are;
// before each timed call (after its untimed preparation) a write of twice
// the L2's size evicts the cache, so K, V, the state and the inputs come
// from DRAM as they do in an engine's step (SCISSORHANDS_BENCH_WARM=1 skips
// it); a fixed number of iterations (200; SCISSORHANDS_BENCH_ITERATIONS).
// The reported time is the mean of those calls. Counters:
//   us_per_call   the same mean, in microseconds;
//   us_back_to_back  observe: mean of 20 calls issued back to back, all
//                 enqueued behind a spin kernel long enough that the host's
//                 launches are done before the first runs (device-bound; L2
//                 warm after the first), each after its rewind (a copy of
//                 `batch` integers, timed alone as us_rewind);
//   GBps          effective bandwidth: the bytes the call must move (reads +
//                 writes, listed per benchmark) per second;
//   pct_copy      GBps as a percentage of the copy bandwidth (a 512 MiB
//                 cudaMemcpyAsync, bytes read + written, measured at start);
//   k_pct_copy    observe_queries: bytes of K read per second as a
//                 percentage of the copy bandwidth (target >= 70%);
//   floor_us      the layer's K and V at `budget` divided by the copy
//                 bandwidth: reading the layer once, the floor of any
//                 decode attention;
//   frac_floor    call time / floor (target, compress m = 1: < 0.10);
//   frac_floor_per_step  compress: call time / m / floor (target, m = 128
//                 at B = 2048: < 0.02).
// Without a CUDA device the binary prints why and exits 77. With
// --host-only (CTest: cuda.bench.host_only, in every CI run) it runs each
// benchmark once with no device: host memory for the arrays, CUDA errors
// ignored, nothing timed; what it checks is that the library accepts every
// benchmark's arguments, so the first GPU run does not end on a refusal.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <scissorhands/scissorhands.cuh>

namespace {

namespace sh = scissorhands;
using T = __nv_bfloat16;
constexpr int kv_heads = 8, q_heads = 32, head_dim = 128;

// --host-only: no device (CUDA_VISIBLE_DEVICES emptied); "device" arrays
// are host memory, every CUDA error is expected and ignored, and each
// benchmark runs once, so what runs is the library's host side: every
// call's argument checks, which throw (and end the run) on a refusal.
bool g_host_only = false;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess && !g_host_only) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
#define CHECK(x) check((x), #x)

template <class X>
struct device_array {
  X* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    const std::size_t bytes = std::max<std::size_t>(1, n) * sizeof(X);
    if (g_host_only)  // never read on the host: its pages are never touched
      p = static_cast<X*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
    else
      CHECK(cudaMalloc(&p, bytes));
  }
  ~device_array() {
    if (g_host_only)
      std::free(p);
    else
      cudaFree(p);
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
};

__device__ inline std::uint32_t hash32(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<std::uint32_t>((x ^ (x >> 31)) >> 32);
}
__device__ inline float unit(std::uint64_t x) { return static_cast<float>(hash32(x) >> 8) * (1.0f / 16777216.0f); }

__global__ void fill_bf16(T* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16(2.0f * unit(seed + i) - 1.0f);
}
__global__ void fill_float(float* p, std::size_t n, float lo, float hi, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = lo + (hi - lo) * unit(seed + i);
}
__global__ void fill_int(std::int32_t* p, std::size_t n, std::int32_t value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = value;
}
// A mid-decode state: every slot tracked, positions 0..budget-1 per head,
// scores as Scissorhands window counts, observed min(age, w).
__global__ void fill_state(sh::eviction_state<sh::memory_space::device> st, std::int32_t budget, std::int32_t window) {
  const std::size_t tokens = std::size_t{static_cast<unsigned>(st.shape.rows)} * st.shape.kv_heads * st.shape.capacity;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < tokens; i += std::size_t{gridDim.x} * blockDim.x) {
    const auto t = static_cast<std::int32_t>(i % st.shape.capacity);
    const float u = unit(i * 7 + 3);
    st.positions[i] = t;
    st.scores[i] = floorf(401.0f * u * u * u);
    st.observed[i] = static_cast<float>(min(budget - t, window));
    for (int w = 0; w < st.shape.ring_words; ++w) st.ring_of(static_cast<std::int64_t>(i))[w] = hash32(i * 131 + w);
  }
  for (std::size_t b = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; b < static_cast<std::size_t>(st.shape.rows);
       b += std::size_t{gridDim.x} * blockDim.x) {
    st.step[b] = 1000;
    st.next_position[b] = budget;
    st.tracked[b] = budget;
  }
}
// Keeps the stream busy while the host enqueues the timed call.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

constexpr int fill_blocks = 1024, fill_threads = 256;

// After the stream's work: any status word set in any of `layers` is the
// benchmark's error.
void require_clear(benchmark::State& s, cudaStream_t stream,
                   const std::vector<sh::eviction_state<sh::memory_space::device>>& layers) {
  CHECK(cudaStreamSynchronize(stream));
  std::uint32_t any = 0;
  for (const auto& st : layers) {
    std::vector<std::uint32_t> w(static_cast<std::size_t>(st.shape.rows));
    CHECK(cudaMemcpy(w.data(), st.status, sizeof(std::uint32_t) * w.size(), cudaMemcpyDeviceToHost));
    for (auto x : w) any |= x;
  }
  if (any != 0) s.SkipWithError(("status words: " + sh::cuda::describe_status(any)).c_str());
}

// One layer at (batch, budget): cache, state, inputs.
struct layer {
  int batch, budget, capacity;
  sh::scissorhands_policy policy;
  std::size_t kv_elements;
  device_array<T> k, v, queries;
  device_array<std::int32_t> lengths, new_lengths, rows;
  device_array<float> probs, lse;
  std::unique_ptr<device_array<std::byte>> state_buf, pristine, workspace;
  sh::eviction_state<sh::memory_space::device> state;  // seen through `rows`
  std::size_t state_size = 0, workspace_bytes = 0;
  cudaStream_t stream = nullptr;

  // state_slots > 0: the cache and the state sized for sequences of that
  // many slots (a state sized for the longest prompt), the sequences still
  // holding `budget` tokens.
  layer(int batch_, int budget_, int state_slots = 0)
      : batch(batch_),
        budget(budget_),
        capacity(state_slots > 0 ? state_slots : budget_ + 16),
        kv_elements(static_cast<std::size_t>(batch_) * capacity * kv_heads * head_dim),
        k(kv_elements),
        v(kv_elements),
        queries(static_cast<std::size_t>(batch_) * q_heads * head_dim),
        lengths(batch_),
        new_lengths(batch_),
        rows(batch_),
        probs(static_cast<std::size_t>(batch_) * q_heads * budget_),
        lse(static_cast<std::size_t>(batch_) * q_heads) {
    policy.config.window = 400;
    policy.config.recent = 10;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fill_bf16<<<fill_blocks, fill_threads, 0, stream>>>(k.p, k.n, 1);
    fill_bf16<<<fill_blocks, fill_threads, 0, stream>>>(v.p, v.n, 2);
    fill_bf16<<<fill_blocks, fill_threads, 0, stream>>>(queries.p, queries.n, 3);
    fill_float<<<fill_blocks, fill_threads, 0, stream>>>(probs.p, probs.n, 0.0f, 2.0f / budget, 4);
    fill_float<<<fill_blocks, fill_threads, 0, stream>>>(lse.p, lse.n, 4.0f, 8.0f, 5);
    fill_int<<<fill_blocks, fill_threads, 0, stream>>>(lengths.p, lengths.n, budget);
    std::vector<std::int32_t> reversed(batch);
    for (int b = 0; b < batch; ++b) reversed[b] = batch - 1 - b;
    CHECK(cudaMemcpyAsync(rows.p, reversed.data(), sizeof(std::int32_t) * batch, cudaMemcpyHostToDevice, stream));
    const sh::state_shape shape{batch, kv_heads, state_slots > 0 ? state_slots : sh::state_capacity_for(budget, 1),
                                policy.ring_words()};
    state_size = sh::state_bytes(shape);
    state_buf = std::make_unique<device_array<std::byte>>(state_size);
    pristine = std::make_unique<device_array<std::byte>>(state_size);
    state = sh::make_state(sh::device_span<std::byte>(state_buf->p, state_size), shape)
                .for_batch(sh::device_span<const std::int32_t>(rows.p, rows.n));
    const auto clean = sh::make_state(sh::device_span<std::byte>(pristine->p, state_size), shape);
    // cudaMalloc's memory may be an earlier benchmark's: the words
    // fill_state leaves alone (status, the observe ticket) start at 0.
    CHECK(sh::cuda::reset_state(clean, stream));
    fill_state<<<fill_blocks, fill_threads, 0, stream>>>(clean, budget, policy.config.window);
    CHECK(cudaMemcpyAsync(state_buf->p, pristine->p, state_size, cudaMemcpyDeviceToDevice, stream));
    CHECK(sh::cuda::compress(nullptr, workspace_bytes, policy, view(), state, budget, {}, stream));
    workspace = std::make_unique<device_array<std::byte>>(workspace_bytes);
    CHECK(cudaStreamSynchronize(stream));
  }
  ~layer() { cudaStreamDestroy(stream); }

  sh::device_kv_view<T> view() const {
    return sh::make_kv_view(sh::device_span<T>(k.p, k.n), sh::device_span<T>(v.p, v.n),
                            sh::device_span<const std::int32_t>(lengths.p, lengths.n), batch, kv_heads, head_dim,
                            capacity, sh::named_layout::nhd);
  }
  // The same K and V as a FlashInfer paged cache: page size 16, NHD, so
  // page b * pages_per_sequence + j is sequence b's slots 16j .. 16j + 15
  // of the contiguous layout; each sequence lists its budget / 16 pages.
  static constexpr int page_size = 16;
  std::unique_ptr<device_array<std::int32_t>> indptr, indices, last_page_len;
  sh::device_paged_kv_view<T> paged_view() {
    const int per_sequence = capacity / page_size, used = budget / page_size;
    if (!indptr) {
      std::vector<std::int32_t> ptr(batch + 1), ids(static_cast<std::size_t>(batch) * used), last(batch, page_size);
      for (int b = 0; b <= batch; ++b) ptr[b] = b * used;
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < used; ++j) ids[static_cast<std::size_t>(b) * used + j] = b * per_sequence + j;
      auto up = [](std::unique_ptr<device_array<std::int32_t>>& d, const std::vector<std::int32_t>& h) {
        d = std::make_unique<device_array<std::int32_t>>(h.size());
        CHECK(cudaMemcpy(d->p, h.data(), sizeof(std::int32_t) * h.size(), cudaMemcpyHostToDevice));
      };
      up(indptr, ptr);
      up(indices, ids);
      up(last_page_len, last);
    }
    return sh::make_paged_kv_view(sh::device_span<T>(k.p, k.n), sh::device_span<T>(v.p, v.n),
                                  sh::device_span<const std::int32_t>(indptr->p, indptr->n),
                                  sh::device_span<const std::int32_t>(indices->p, indices->n),
                                  sh::device_span<const std::int32_t>(last_page_len->p, last_page_len->n), batch,
                                  kv_heads, head_dim, page_size, batch * per_sequence, per_sequence);
  }
  std::size_t tokens() const { return static_cast<std::size_t>(batch) * kv_heads * budget; }
  double kv_bytes() const { return 2.0 * tokens() * head_dim * sizeof(T); }  // the layer's K and V at `budget`
  double k_bytes() const { return tokens() * head_dim * sizeof(T); }
  // The library never writes the lengths: only the state needs restoring.
  void restore() { CHECK(cudaMemcpyAsync(state_buf->p, pristine->p, state_size, cudaMemcpyDeviceToDevice, stream)); }
  void require_ok(benchmark::State& s) { require_clear(s, stream, {state}); }
  // A decode step's token, once more: every row tracks `budget - 1` slots,
  // so the next observe admits the last token and its query is a new
  // token's (observe flags status_new_tokens for a query whose token a
  // query already saw). One copy of `batch` integers on the stream.
  std::unique_ptr<device_array<std::int32_t>> before_last;
  void rewind_last_token() {
    if (!before_last) {
      before_last = std::make_unique<device_array<std::int32_t>>(static_cast<std::size_t>(batch));
      const std::vector<std::int32_t> h(static_cast<std::size_t>(batch), budget - 1);
      CHECK(cudaMemcpy(before_last->p, h.data(), sizeof(std::int32_t) * h.size(), cudaMemcpyHostToDevice));
    }
    CHECK(cudaMemcpyAsync(state.tracked, before_last->p, sizeof(std::int32_t) * before_last->n,
                          cudaMemcpyDeviceToDevice, stream));
  }
};

double g_copy_bandwidth = 0.0;  // bytes read + written per second
long long g_spin_cycles = 0;
std::byte* g_flush = nullptr;  // 2 x L2 bytes, written before each timed call
std::size_t g_flush_bytes = 0;

void flush_l2(cudaStream_t stream) {
  static int value = 0;
  if (g_flush_bytes > 0) CHECK(cudaMemsetAsync(g_flush, ++value & 0xFF, g_flush_bytes, stream));
}
int g_iterations = 200;  // SCISSORHANDS_BENCH_ITERATIONS overrides

// Times `call` once per iteration between events, the stream kept busy by
// a spin kernel while the host enqueues it; `prepare` runs untimed before.
// Returns the mean seconds per call.
template <class Prepare, class Call>
double time_calls(benchmark::State& s, cudaStream_t stream, Prepare&& prepare, Call&& call) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  double total = 0.0;
  std::int64_t calls = 0;
  for (auto _ : s) {
    prepare();
    flush_l2(stream);
    spin<<<1, 1, 0, stream>>>(g_spin_cycles);
    CHECK(cudaEventRecord(start, stream));
    call();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    s.SetIterationTime(ms * 1e-3);
    total += ms * 1e-3;
    ++calls;
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return total / static_cast<double>(std::max<std::int64_t>(1, calls));
}

// Mean seconds per call of `calls` back-to-back calls (no gap between them).
template <class Call>
double time_back_to_back(cudaStream_t stream, int calls, Call&& call) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  // ~60 us of spin per call: every launch is enqueued before the first runs.
  spin<<<1, 1, 0, stream>>>(g_spin_cycles * 2 * calls);
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < calls; ++i) call();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms * 1e-3 / calls;
}

void report(benchmark::State& s, const layer& l, double bytes_moved, double seconds_per_call) {
  const double floor = l.kv_bytes() / g_copy_bandwidth;
  s.counters["us_per_call"] = seconds_per_call * 1e6;
  s.counters["GBps"] = bytes_moved / seconds_per_call * 1e-9;
  s.counters["pct_copy"] = 100.0 * bytes_moved / seconds_per_call / g_copy_bandwidth;
  s.counters["frac_floor"] = seconds_per_call / floor;
  s.counters["floor_us"] = floor * 1e6;
}

void bm_copy(benchmark::State& s, int batch, int budget) {
  layer l(batch, budget);
  const std::size_t bytes = l.kv_elements * sizeof(T);
  device_array<std::byte> dst(2 * bytes);
  const double t = time_calls(s, l.stream, [] {}, [&] {
    CHECK(cudaMemcpyAsync(dst.p, l.k.p, bytes, cudaMemcpyDeviceToDevice, l.stream));
    CHECK(cudaMemcpyAsync(dst.p + bytes, l.v.p, bytes, cudaMemcpyDeviceToDevice, l.stream));
  });
  report(s, l, 4.0 * bytes, t);
}

// Bytes observe must move per call besides K or the probabilities: each
// token's score and observed count read and written, and one ring word read
// and written (one step of the window; word-major, so the words of
// consecutive tokens are adjacent and these are the bytes DRAM moves).
double observe_state_bytes(const layer& l) { return l.tokens() * (2.0 * 8 + 2.0 * 4); }

// Observe steps back to back, each after the rewind that makes its token
// new again: us_back_to_back counts the rewind's copy, us_rewind the copy
// alone (the same run), so the step is their difference. The status words
// are checked after (a step skipped as observed twice would time nothing).
template <class Call>
void back_to_back_steps(benchmark::State& s, layer& l, Call&& call) {
  s.counters["us_back_to_back"] = time_back_to_back(l.stream, 20, [&] {
    l.rewind_last_token();
    call();
  }) * 1e6;
  l.require_ok(s);
  s.counters["us_rewind"] = time_back_to_back(l.stream, 20, [&] { l.rewind_last_token(); }) * 1e6;
}

void bm_observe_queries(benchmark::State& s, int batch, int budget, int state_slots) {
  layer l(batch, budget, state_slots);
  const auto q = sh::query_view<T, sh::memory_space::device>::dense({l.queries.p, l.queries.n}, q_heads, 1, head_dim);
  const auto lse = sh::lse_view<sh::memory_space::device>::dense({l.lse.p, l.lse.n}, q_heads, 1, sh::lse_base::natural);
  auto call = [&] { CHECK(sh::cuda::observe_queries(l.policy, l.view(), l.state, q, lse, 0.0f, l.stream)); };
  const double t = time_calls(s, l.stream, [&] { l.rewind_last_token(); }, call);
  l.require_ok(s);
  report(s, l, l.k_bytes() + observe_state_bytes(l), t);
  s.counters["k_pct_copy"] = 100.0 * l.k_bytes() / t / g_copy_bandwidth;
  back_to_back_steps(s, l, call);
}

void bm_observe_probabilities(benchmark::State& s, int batch, int budget, int state_slots) {
  layer l(batch, budget, state_slots);
  const auto pv = sh::probability_view<sh::memory_space::device>::dense({l.probs.p, l.probs.n}, q_heads, 1, budget);
  auto call = [&] { CHECK(sh::cuda::observe_probabilities(l.policy, l.view(), l.state, pv, l.stream)); };
  const double t = time_calls(s, l.stream, [&] { l.rewind_last_token(); }, call);
  l.require_ok(s);
  // The check kernel reads the probabilities too: counted twice.
  report(s, l, 2.0 * l.probs.n * sizeof(float) + observe_state_bytes(l), t);
  back_to_back_steps(s, l, call);
}

// Bytes compress (fill_holes) must move: position, score and observed
// count of every token read (selection), and (compaction_bytes, also
// compact's) per evicted token its hole filled: K and V rows and its state (12 bytes + ring) read and written.
// The ring is word-major (a token's words capacity x 4 bytes apart) and
// moved row-fastest: the holes are scattered, so each word written is a
// 32-byte DRAM sector; the sources (survivors above the new length) are
// consecutive, 4 bytes a word read, but a lone source (m = 1) is a sector
// too.
double compaction_bytes(const layer& l, int m) {
  const double ring = (m == 1 ? 64.0 : 36.0) * l.state.shape.ring_words;
  return static_cast<double>(l.batch) * kv_heads * m * (2.0 * (2.0 * head_dim * sizeof(T) + 12.0) + ring);
}
double compress_bytes(const layer& l, int m) { return l.tokens() * 12.0 + compaction_bytes(l, m); }

// Bytes compress with preserve_order moves: the keys read, and each
// shifted row's K and V rows, position, score, observed count and ring
// words read and written (runs of consecutive slots: the ring coalesced, 4
// bytes a word). The shifted rows are counted from the positions before
// and after the last call (positions are unique in a head: the first slot
// whose position changed is the first evicted); `shifted` gets them per
// head.
double ordered_bytes(const layer& l, int m, double& shifted) {
  struct free_deleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  const std::size_t rounded = (l.state_size + 255) / 256 * 256;
  std::unique_ptr<std::byte, free_deleter> before(static_cast<std::byte*>(std::aligned_alloc(256, rounded))),
      after(static_cast<std::byte*>(std::aligned_alloc(256, rounded)));
  std::memset(before.get(), 0, rounded);
  std::memset(after.get(), 0, rounded);
  CHECK(cudaMemcpy(before.get(), l.pristine->p, l.state_size, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(after.get(), l.state_buf->p, l.state_size, cudaMemcpyDeviceToHost));
  const auto b0 = sh::make_state(sh::host_span<std::byte>(before.get(), l.state_size), l.state.shape);
  const auto b1 = sh::make_state(sh::host_span<std::byte>(after.get(), l.state_size), l.state.shape);
  const int kept = l.budget - m;
  double rows = 0.0;
  for (int r = 0; r < l.state.shape.rows; ++r)
    for (int h = 0; h < kv_heads; ++h) {
      int first = kept;
      for (int t = 0; t < kept; ++t)
        if (b0.positions[b0.row_index(r, h, t)] != b1.positions[b1.row_index(r, h, t)]) {
          first = t;
          break;
        }
      rows += kept - first;
    }
  shifted = rows / (static_cast<double>(l.state.shape.rows) * kv_heads);
  const double row = 2.0 * head_dim * sizeof(T) + 12.0 + 4.0 * l.state.shape.ring_words;
  return l.tokens() * 12.0 + rows * 2.0 * row;
}

// compress on the contiguous cache (Paged: the same K and V as a paged
// cache), fill_holes or (ordered) preserve_order; per head, or with another
// granularity (shared_heads: every head of a sequence evicts the same
// slots, so a paged engine frees whole pages).
template <bool Paged, bool Ordered = false, class Granularity = sh::per_head>
void bm_compress(benchmark::State& s, int batch, int budget, int m) {
  using policy_t = std::conditional_t<std::is_same_v<Granularity, sh::per_head>, sh::scissorhands_policy,
                                      sh::with_granularity<sh::scissorhands_policy, Granularity>>;
  layer l(batch, budget);
  policy_t policy;
  policy.config = l.policy.config;
  policy.config.evict_count = m;
  if constexpr (Ordered) policy.config.compaction_mode = sh::compaction::preserve_order;
  const auto view = [&] {
    if constexpr (Paged) return l.paged_view();
    else return l.view();
  }();
  // m (and a paged cache's listing counts) change the workspace size.
  CHECK(sh::cuda::compress(nullptr, l.workspace_bytes, policy, view, l.state, budget, {}, l.stream));
  l.workspace = std::make_unique<device_array<std::byte>>(l.workspace_bytes);
  device_array<std::int32_t> freed(Paged ? static_cast<std::size_t>(batch) : 0);
  const sh::compress_output<sh::memory_space::device> out{
      sh::device_span<std::int32_t>(l.new_lengths.p, l.new_lengths.n),
      Paged ? sh::device_span<std::int32_t>(freed.p, freed.n) : sh::device_span<std::int32_t>{}};
  const double t = time_calls(
      s, l.stream, [&] { l.restore(); },
      [&] {
        CHECK(sh::cuda::compress(l.workspace->p, l.workspace_bytes, policy, view, l.state, budget, out, l.stream));
      });
  l.require_ok(s);
  if constexpr (Ordered) {
    double shifted = 0.0;
    report(s, l, ordered_bytes(l, m, shifted), t);
    s.counters["shifted_rows_per_head"] = shifted;
  } else {
    report(s, l, compress_bytes(l, m), t);
  }
  s.counters["frac_floor_per_step"] = t / m / (l.kv_bytes() / g_copy_bandwidth);
}

// compress's selection kernel alone, launched as compress launches it
// (contiguous cache); bytes: every token's position, score and observed
// count read.
void bm_compress_select(benchmark::State& s, int batch, int budget, int m) {
  namespace d = sh::cuda::detail;
  layer l(batch, budget);
  l.policy.config.evict_count = m;
  const auto view = l.view();
  const d::compress_workspace::sizes sizes = d::compress_sizes(l.policy, view, l.state, budget);
  l.workspace = std::make_unique<device_array<std::byte>>(d::compress_workspace::bytes(sizes));
  const d::compress_workspace ws = d::compress_workspace::carve(l.workspace->p, sizes);
  const d::sequence_table seqs = d::make_sequence_table(view);
  using protector = sh::scissorhands_policy::protector;
  constexpr bool highest = sh::evicts_highest<sh::scissorhands_policy::observation>;
  const double t = time_calls(s, l.stream, [&] { l.restore(); }, [&] {
    d::select_kernel<protector, highest><<<dim3(kv_heads, batch), sh::cuda::select_traits::threads, 0, l.stream>>>(
        l.policy.config, seqs, l.state, budget, ws);
    CHECK(cudaPeekAtLastError());
  });
  l.require_ok(s);
  report(s, l, l.tokens() * 12.0, t);
}

// Token-level eviction across the model, as a paged engine frees pages:
// select over model_layers layers with a shared_layers policy (every layer
// and head of a sequence evicts the same slots) on the paged view, and
// compact, which an engine then calls once per layer with that selection.
// Every layer's state is the layer's pristine state (identical layers: the
// selection does the work it does on distinct ones). Bytes: select reads
// each token's position, score and observed count in every layer and head
// (an upper bound: the positions of one head may be all it needs of them);
// compact moves as compress does.
constexpr int model_layers = 32;  // Llama-3-8B
using layers_policy = sh::with_granularity<sh::scissorhands_policy, sh::shared_layers<>>;
struct model_selection {
  layers_policy policy;
  sh::device_paged_kv_view<T> view;
  std::int32_t stride;
  device_array<std::byte> model_buf;
  device_array<std::int32_t> counts, slots, new_lengths, freed;
  sh::model_state<sh::memory_space::device> model;
  sh::eviction_selection<sh::memory_space::device> selection;
  std::unique_ptr<device_array<std::byte>> workspace;
  std::size_t workspace_bytes = 0;
  model_selection(layer& l, int m)
      : view(l.paged_view()),
        stride(sh::max_evictions(l.state.shape.capacity, l.budget, m)),
        model_buf(l.state_size * model_layers),
        counts(l.batch),
        slots(static_cast<std::size_t>(l.batch) * stride),
        new_lengths(l.batch),
        freed(l.batch) {
    policy.config = l.policy.config;
    policy.config.evict_count = m;
    for (int i = 0; i < model_layers; ++i)
      CHECK(cudaMemcpyAsync(model_buf.p + l.state_size * i, l.pristine->p, l.state_size, cudaMemcpyDeviceToDevice,
                            l.stream));
    model = sh::make_model_state(sh::device_span<std::byte>(model_buf.p, model_buf.n), l.state.shape, model_layers)
                .for_batch(l.state.state_rows);
    selection.stride = stride;
    selection.counts = {counts.p, counts.n};
    selection.slots = {slots.p, slots.n};
    selection.out = {{new_lengths.p, new_lengths.n}, {freed.p, freed.n}};
    CHECK(sh::cuda::select(nullptr, workspace_bytes, policy, view, model, l.budget, selection, {}, l.stream));
    workspace = std::make_unique<device_array<std::byte>>(workspace_bytes);
  }
  cudaError_t select(const layer& l) {
    return sh::cuda::select(workspace->p, workspace_bytes, policy, view, model, l.budget, selection, {}, l.stream);
  }
  // Any status word of any layer set: the benchmark's error.
  void require_ok(benchmark::State& s, const layer& l) {
    std::vector<sh::eviction_state<sh::memory_space::device>> layers;
    for (int i = 0; i < model_layers; ++i) layers.push_back(model.layer(i));
    require_clear(s, l.stream, layers);
  }
};

// Split: the same selection in two calls, local_scores (a grid over chunks,
// layers and sequences writes each layer's head-reduced scores) then
// select from those scores, the tensor-parallel path on one rank; select
// alone runs one block per sequence over every layer and head. Bytes of
// the split add the partial scores written and read (4 per slot a layer).
template <bool Split>
void bm_select_model(benchmark::State& s, int batch, int budget, int m) {
  layer l(batch, budget);
  model_selection sel(l, m);
  const std::int32_t capacity = l.state.shape.capacity;
  device_array<float> partial(Split ? sh::partial_score_count(model_layers, batch, capacity) : 0);
  const sh::partial_scores<sh::memory_space::device> reduced{
      {partial.p, partial.n}, model_layers, batch, capacity, kv_heads};
  // select writes no state (status words only on a fault): nothing to restore.
  const double t = time_calls(
      s, l.stream, [] {},
      [&] {
        if constexpr (Split) {
          CHECK(sh::cuda::local_scores(sel.policy, sel.view, sel.model, budget, reduced, l.stream));
          CHECK(sh::cuda::select(sel.workspace->p, sel.workspace_bytes, sel.policy, sel.view, sel.model, budget,
                                 reduced, sel.selection, {}, l.stream));
        } else {
          CHECK(sel.select(l));
        }
      });
  sel.require_ok(s, l);
  const double partial_bytes = Split ? 2.0 * 4.0 * model_layers * batch * capacity : 0.0;
  report(s, l, l.tokens() * 12.0 * model_layers + partial_bytes, t);
  s.counters["frac_floor_per_step"] = t / m / (l.kv_bytes() / g_copy_bandwidth);
}

// compact of layer 0 with select's selection (made once, untimed); the
// layer's state restored before each call (untimed).
void bm_compact(benchmark::State& s, int batch, int budget, int m) {
  layer l(batch, budget);
  model_selection sel(l, m);
  CHECK(sel.select(l));
  std::size_t bytes = 0;
  CHECK(sh::cuda::compact(nullptr, bytes, sel.policy, sel.view, sel.model.layer(0), sel.selection, l.stream));
  device_array<std::byte> workspace(bytes);
  const auto restore = [&] {
    CHECK(cudaMemcpyAsync(sel.model_buf.p, l.pristine->p, l.state_size, cudaMemcpyDeviceToDevice, l.stream));
  };
  const double t = time_calls(s, l.stream, restore, [&] {
    CHECK(sh::cuda::compact(workspace.p, bytes, sel.policy, sel.view, sel.model.layer(0), sel.selection, l.stream));
  });
  sel.require_ok(s, l);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(batch));
  CHECK(cudaMemcpy(counts.data(), sel.counts.p, sizeof(std::int32_t) * counts.size(), cudaMemcpyDeviceToHost));
  if (!g_host_only && std::any_of(counts.begin(), counts.end(), [&](std::int32_t c) { return c != m; }))
    s.SkipWithError("select did not evict m tokens from every sequence");
  report(s, l, compaction_bytes(l, m), t);
  s.counters["frac_floor_per_step"] = t / m / (l.kv_bytes() / g_copy_bandwidth);
}

// Two empty kernels in stream order, the second depending on the first
// (each block's first thread writes one word): the cost of a call's second
// launch, without the work.
__global__ void pair_first(std::int32_t* words) {
  sh::cuda::detail::allow_second_kernel();
  if (threadIdx.x == 0) words[blockIdx.x] = 1;
}
__global__ void pair_second(std::int32_t* words) {
  sh::cuda::detail::wait_for_first_kernel();
  if (threadIdx.x == 0) words[blockIdx.x] += 1;
}
enum class pair_mode { one_kernel, ordinary, programmatic };
void bm_launch_pair(benchmark::State& s, pair_mode mode) {
  constexpr unsigned blocks = 256, threads = 256;
  device_array<std::int32_t> words(blocks);
  int device = 0, major = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (mode == pair_mode::programmatic && major < 9) {
    s.SkipWithError("programmatic dependent launch needs compute capability 9.0 or more");
    for (auto _ : s) {
    }
    return;
  }
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double t = time_calls(s, stream, [] {}, [&] {
    pair_first<<<blocks, threads, 0, stream>>>(words.p);
    if (mode == pair_mode::ordinary) pair_second<<<blocks, threads, 0, stream>>>(words.p);
    if (mode == pair_mode::programmatic)
      sh::cuda::detail::launch_programmatic(pair_second, blocks, threads, 0, stream, words.p);
    CHECK(cudaPeekAtLastError());
  });
  s.counters["us_per_call"] = t * 1e6;
  CHECK(cudaStreamDestroy(stream));
}

// Applying compress m = budget/16's new lengths to a FlashInfer table of
// `batch` sequences at the budget (page size 16). Bytes: every page id read
// and written, indptr, last_page_len and the new lengths.
void bm_shrink_page_table(benchmark::State& s, int batch, int budget) {
  constexpr int page = 16;
  const int pages = (budget + page - 1) / page, m = budget / 16;
  std::vector<std::int32_t> indptr(batch + 1), indices(static_cast<std::size_t>(batch) * pages), last(batch),
      new_lengths(batch, budget - m);
  for (int b = 0; b <= batch; ++b) indptr[b] = b * pages;
  for (int b = 0; b < batch; ++b) last[b] = budget - (pages - 1) * page;
  for (std::size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<std::int32_t>(i);
  device_array<std::int32_t> d_indptr(indptr.size()), d_indices(indices.size()), d_last(last.size()),
      p_indptr(indptr.size()), p_indices(indices.size()), p_last(last.size()), d_new(new_lengths.size()),
      d_released(indices.size());
  device_array<sh::cuda::shrink_result> d_result(1);
  auto up = [](device_array<std::int32_t>& d, const std::vector<std::int32_t>& h) {
    CHECK(cudaMemcpy(d.p, h.data(), sizeof(std::int32_t) * h.size(), cudaMemcpyHostToDevice));
  };
  up(p_indptr, indptr);
  up(p_indices, indices);
  up(p_last, last);
  up(d_new, new_lengths);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto restore = [&] {
    CHECK(cudaMemcpyAsync(d_indptr.p, p_indptr.p, sizeof(std::int32_t) * indptr.size(), cudaMemcpyDeviceToDevice, stream));
    CHECK(cudaMemcpyAsync(d_indices.p, p_indices.p, sizeof(std::int32_t) * indices.size(), cudaMemcpyDeviceToDevice,
                          stream));
    CHECK(cudaMemcpyAsync(d_last.p, p_last.p, sizeof(std::int32_t) * last.size(), cudaMemcpyDeviceToDevice, stream));
  };
  const double t = time_calls(s, stream, restore, [&] {
    CHECK(sh::cuda::shrink_page_table({d_indptr.p, d_indptr.n}, {d_indices.p, d_indices.n}, {d_last.p, d_last.n}, page,
                                      sh::device_span<const std::int32_t>(d_new.p, d_new.n),
                                      {d_released.p, d_released.n}, d_result.p, stream));
  });
  sh::cuda::shrink_result r{};
  CHECK(cudaMemcpy(&r, d_result.p, sizeof r, cudaMemcpyDeviceToHost));
  if (r.status != 0) s.SkipWithError(("shrink_page_table: " + sh::cuda::describe_status(r.status)).c_str());
  const double bytes = 8.0 * indices.size() + 4.0 * (indptr.size() + 2.0 * batch);
  s.counters["us_per_call"] = t * 1e6;
  s.counters["GBps"] = bytes / t * 1e-9;
  CHECK(cudaStreamDestroy(stream));
}

// The copy bandwidth every figure is compared to: 512 MiB device to device.
double measure_copy_bandwidth() {
  const std::size_t bytes = std::size_t{512} << 20;
  device_array<std::byte> a(bytes), b(bytes);
  CHECK(cudaMemset(a.p, 1, bytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 12; ++i) {
    CHECK(cudaEventRecord(start));
    CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2] * 1e-3;
  return 2.0 * bytes / median;  // read + write
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--host-only") {
      g_host_only = true;
      std::copy(argv + i + 1, argv + argc, argv + i);  // not a Google Benchmark flag
      --argc;
      break;
    }
  if (g_host_only) {
    ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // before the runtime's first call reads it
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
      std::fprintf(stderr, "%s --host-only: %d CUDA device(s) still visible: refusing to run\n", argv[0], count);
      return 2;
    }
    std::printf("%s: host-only run: every benchmark's calls once, for the library's argument checks (no timing)\n",
                argv[0]);
  }
  const cudaError_t err = g_host_only ? cudaSuccess : cudaGetDeviceCount(&count);
  if (err != cudaSuccess || (count == 0 && !g_host_only)) {
    std::printf("%s: no CUDA device (%s): skipping\n", argv[0], err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  g_spin_cycles = static_cast<long long>(clock_khz) * 30 / 1000;  // ~30 us
  if (const char* it = std::getenv("SCISSORHANDS_BENCH_ITERATIONS")) g_iterations = std::max(1, std::atoi(it));
  if (g_host_only) g_iterations = 1;
  g_copy_bandwidth = g_host_only ? 1.0 : measure_copy_bandwidth();  // host-only: the counters mean nothing
  const char* warm = std::getenv("SCISSORHANDS_BENCH_WARM");
  if (!g_host_only && !(warm && std::string(warm) == "1")) {
    g_flush_bytes = 2 * static_cast<std::size_t>(std::max(prop.l2CacheSize, 1 << 20));
    CHECK(cudaMalloc(&g_flush, g_flush_bytes));
  }
  benchmark::AddCustomContext("l2_flush_bytes", std::to_string(g_flush_bytes));
  std::printf("device: %s (sm_%d%d, %d SMs); copy bandwidth (read + write): %.0f GB/s\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, g_copy_bandwidth * 1e-9);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("programmatic_launch",
                              sh::cuda::programmatic_launch_requested() && prop.major >= 9 ? "on" : "off");
  benchmark::AddCustomContext("copy_GBps", std::to_string(g_copy_bandwidth * 1e-9));

  // Fixed iteration counts: each iteration syncs, and a time-based count
  // would run 10^5 iterations of a 5 us call.
  auto setup = [](benchmark::internal::Benchmark* b) {
    b->UseManualTime()->Unit(benchmark::kMicrosecond)->Iterations(g_iterations);
  };
  for (int batch : {1, 8, 32, 64})
    for (int budget : {512, 2048, 8192}) {
      const std::string shape = "/batch:" + std::to_string(batch) + "/budget:" + std::to_string(budget);
      setup(benchmark::RegisterBenchmark(("copy" + shape).c_str(), bm_copy, batch, budget));
      setup(benchmark::RegisterBenchmark(("observe_queries" + shape).c_str(), bm_observe_queries, batch, budget, 0));
      setup(benchmark::RegisterBenchmark(("observe_probabilities" + shape).c_str(), bm_observe_probabilities, batch,
                                         budget, 0));
      if (batch == 32 && budget == 2048) {
        // The same step with the cache and state sized for a 32k prompt:
        // the grid is capped and each sequence spread over the blocks it
        // has (cuda/detail/slot_chunks.hpp), so this should match the line
        // above.
        const std::string big = shape + "/state:32768";
        setup(benchmark::RegisterBenchmark(("observe_queries" + big).c_str(), bm_observe_queries, batch, budget,
                                           32768));
        setup(benchmark::RegisterBenchmark(("observe_probabilities" + big).c_str(), bm_observe_probabilities, batch,
                                           budget, 32768));
      }
      for (int m : {1, budget / 16}) {
        const std::string with_m = shape + "/m:" + std::to_string(m);
        setup(benchmark::RegisterBenchmark(("compress" + with_m).c_str(), bm_compress<false>, batch, budget, m));
        if (budget == 2048 && (batch == 1 || batch == 32)) {
          setup(benchmark::RegisterBenchmark(("compress_paged" + with_m).c_str(), bm_compress<true>, batch, budget,
                                             m));
          setup(benchmark::RegisterBenchmark(("compress_select" + with_m).c_str(), bm_compress_select, batch,
                                             budget, m));
          setup(benchmark::RegisterBenchmark(("compress_ordered" + with_m).c_str(), bm_compress<false, true>, batch,
                                             budget, m));
          setup(benchmark::RegisterBenchmark(("compress_shared_heads" + with_m).c_str(),
                                             bm_compress<true, false, sh::shared_heads<>>, batch, budget, m));
          setup(benchmark::RegisterBenchmark(("select_model" + with_m).c_str(), bm_select_model<false>, batch, budget,
                                             m));
          setup(benchmark::RegisterBenchmark(("select_model_split" + with_m).c_str(), bm_select_model<true>, batch,
                                             budget, m));
          setup(benchmark::RegisterBenchmark(("compact" + with_m).c_str(), bm_compact, batch, budget, m));
        }
      }
      setup(benchmark::RegisterBenchmark(("shrink_page_table" + shape).c_str(), bm_shrink_page_table, batch, budget));
    }
  setup(benchmark::RegisterBenchmark("launch_pair/kernels:1", bm_launch_pair, pair_mode::one_kernel));
  setup(benchmark::RegisterBenchmark("launch_pair/kernels:2", bm_launch_pair, pair_mode::ordinary));
  setup(benchmark::RegisterBenchmark("launch_pair/kernels:2/programmatic", bm_launch_pair, pair_mode::programmatic));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
