#pragma once
// Internal to the llama example: the compressors behind make_compressor, one
// class per way of evicting (compressor_factory.hpp says where each is
// instantiated). Include it only from the compressor_*.cpp files.
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "compressor_factory.hpp"

namespace llama::detail {

// The cache of type View a compressor was built for, from the engine's
// cache_view (another stored format is the engine's bug: logic_error).
template <class View>
const View& cache_as(const cache_view& cache, const char* fn) {
  if (const View* v = std::get_if<View>(&cache)) return *v;
  throw std::logic_error(std::string(fn) + ": the compressor was built for another KV format than the cache's (" +
                         format_of(cache).name() + ")");
}

// Aligned, owned storage for a layer's library state (make_state wants 256).
struct aligned_buffer {
  std::byte* data = nullptr;
  std::size_t size = 0;
  explicit aligned_buffer(std::size_t n) : size(n) {
    const std::size_t rounded = (n + 255) / 256 * 256;
    data = static_cast<std::byte*>(std::aligned_alloc(256, rounded == 0 ? 256 : rounded));
    if (!data) throw std::bad_alloc();
  }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() { std::free(data); }
};

// per_head and shared_heads: one state per layer, host::compress per layer.
// `Base` is the per_head policy; `Gran` the granularity compress runs at;
// `View` the stored format. Observation does not depend on the
// granularity, so it is instantiated once per Base and View
// (host::observe_* with the Base part of the policy).
template <class Base, class Gran, class View>
class compressor_impl final : public kv_compressor {
  using Policy = std::conditional_t<std::is_same_v<Gran, sh::per_head>, Base, sh::with_granularity<Base, Gran>>;
  static_assert(sh::granularity_of<Policy> != sh::granularity_kind::shared_layers);

 public:
  compressor_impl(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                  const std::vector<cache_view>& caches, observe_source source, std::int32_t state_capacity) {
    spec_ = spec;
    budgets_ = budgets;
    source_ = source;
    policy_.config = spec.config;
    if (budgets.size() != caches.size())
      throw std::invalid_argument("make_compressor: budgets has " + std::to_string(budgets.size()) +
                                  " entries but the cache has " + std::to_string(caches.size()) + " layers");
    for (std::size_t l = 0; l < caches.size(); ++l) {
      const View& cache = cache_as<View>(caches[l], "make_compressor");
      sh::state_shape shape = sh::state_shape_for(policy_, cache);
      if (state_capacity > 0) shape.capacity = state_capacity;
      const std::size_t bytes = sh::state_bytes(shape);
      state_bytes_.push_back(bytes);
      buffers_.push_back(std::make_unique<aligned_buffer>(bytes));
      states_.push_back(sh::make_state(sh::host_span<std::byte>(buffers_.back()->data, bytes), shape));
      const std::size_t ws = sh::host::compress_workspace_bytes(cache);
      workspaces_.push_back(std::make_unique<aligned_buffer>(ws));
      workspace_bytes_.push_back(ws);
    }
    reset();
  }

  void observe(std::int32_t layer, const cache_view& cache, const attention_batch& att) override {
    observe_layer<Base, View>(static_cast<const Base&>(policy_), source_, cache_as<View>(cache, "kv_compressor::observe"),
                              states_[static_cast<std::size_t>(layer)], att);
  }

  std::int32_t compress(std::int32_t layer, const cache_view& cache, std::int32_t budget) override {
    const auto l = static_cast<std::size_t>(layer);
    std::int32_t new_length = 0;
    sh::host::compress(policy_, cache_as<View>(cache, "kv_compressor::compress"), states_[l], budget,
                       sh::host_span<std::byte>(workspaces_[l]->data, workspace_bytes_[l]),
                       {sh::host_span<std::int32_t>(&new_length, 1), {}});
    return new_length;
  }

  std::int32_t compress_model(const std::vector<cache_view>&, std::int32_t) override {
    throw std::logic_error("kv_compressor::compress_model: granularity " + spec_.granularity.name() +
                           " evicts layer by layer: call compress for each layer");
  }

  void reset() override {
    for (auto& s : states_) sh::host::reset_state(s);
  }

  sh::eviction_state<sh::memory_space::host> state(std::int32_t layer) const override {
    return states_.at(static_cast<std::size_t>(layer));
  }

 private:
  Policy policy_;
  std::vector<std::unique_ptr<aligned_buffer>> buffers_, workspaces_;
  std::vector<std::size_t> workspace_bytes_;
  std::vector<sh::eviction_state<sh::memory_space::host>> states_;
};

// shared_layers: one model_state for every layer (make_model_state), each
// layer observed into model.layer(l); once per step host::select chooses the
// slots for the whole model and host::compact applies them to every layer.
// fp32 caches only (make_compressor refuses the others).
template <class Base, class Gran>
class model_compressor_impl final : public kv_compressor {
  using Policy = sh::with_granularity<Base, Gran>;
  static_assert(sh::granularity_of<Policy> == sh::granularity_kind::shared_layers);

 public:
  model_compressor_impl(const policy_spec& spec, const std::vector<std::int32_t>& budgets,
                        const std::vector<cache_view>& caches, observe_source source,
                        std::int32_t state_capacity) {
    spec_ = spec;
    budgets_ = budgets;
    source_ = source;
    policy_.config = spec.config;
    if (budgets.size() != caches.size() || caches.empty())
      throw std::invalid_argument("make_compressor: budgets has " + std::to_string(budgets.size()) +
                                  " entries but the cache has " + std::to_string(caches.size()) + " layers");
    for (std::size_t l = 1; l < budgets.size(); ++l)
      if (budgets[l] != budgets[0])
        throw std::invalid_argument(
            "granularity " + spec.granularity.name() + " (policy " + spec.label +
            ") evicts the same slots from every layer, so every layer needs the same budget; got " +
            std::to_string(budgets[0]) + " for layer 0 and " + std::to_string(budgets[l]) + " for layer " +
            std::to_string(l) + " (a non-uniform --allocator cannot apply: use --allocator uniform, or a head/heads "
            "granularity)");
    const fp32_view& first = cache_as<fp32_view>(caches[0], "make_compressor");
    shape_ = sh::state_shape_for(policy_, first);
    if (state_capacity > 0) shape_.capacity = state_capacity;
    for (std::size_t l = 1; l < caches.size(); ++l)
      if (cache_as<fp32_view>(caches[l], "make_compressor").max_capacity() != first.max_capacity())
        throw std::invalid_argument("make_compressor: granularity " + spec.granularity.name() +
                                    " needs every layer's cache to have the same capacity");
    const auto layers = static_cast<std::int32_t>(caches.size());
    const std::size_t bytes = sh::model_state_bytes(shape_, layers);
    state_bytes_.assign(caches.size(), bytes / caches.size());  // state_bytes(shape) per layer
    buffer_ = std::make_unique<aligned_buffer>(bytes);
    model_ = sh::make_model_state(sh::host_span<std::byte>(buffer_->data, bytes), shape_, layers);
    workspace_bytes_ = sh::host::select_workspace_bytes(first, shape_);
    workspace_ = std::make_unique<aligned_buffer>(workspace_bytes_);
    compact_bytes_ = sh::host::compact_workspace_bytes(first);
    compact_workspace_ = std::make_unique<aligned_buffer>(compact_bytes_);
    reset();
  }

  void observe(std::int32_t layer, const cache_view& cache, const attention_batch& att) override {
    observe_layer(static_cast<const Base&>(policy_), source_, cache_as<fp32_view>(cache, "kv_compressor::observe"),
                  model_.layer(layer), att);
  }

  std::int32_t compress(std::int32_t, const cache_view&, std::int32_t) override {
    throw std::logic_error("kv_compressor::compress: granularity " + spec_.granularity.name() +
                           " evicts the same slots from every layer: call compress_model once every layer was "
                           "observed");
  }

  std::int32_t compress_model(const std::vector<cache_view>& caches, std::int32_t budget) override {
    if (caches.size() != static_cast<std::size_t>(model_.layers))
      throw std::invalid_argument("kv_compressor::compress_model: " + std::to_string(caches.size()) +
                                  " caches for a model of " + std::to_string(model_.layers) + " layers");
    // The selection: one sequence, at most max_evictions slots.
    const std::int32_t stride =
        budget >= 1 ? sh::max_evictions(shape_.capacity, budget, policy_.config.evict_count) : 0;
    if (slots_.size() < static_cast<std::size_t>(stride)) slots_.resize(static_cast<std::size_t>(stride));
    std::int32_t count = 0, new_length = 0;
    sh::eviction_selection<sh::memory_space::host> selection;
    selection.stride = stride;
    selection.counts = sh::host_span<std::int32_t>(&count, 1);
    selection.slots = sh::host_span<std::int32_t>(slots_.data(), slots_.size());
    selection.out = {sh::host_span<std::int32_t>(&new_length, 1), {}};
    sh::host::select(policy_, cache_as<fp32_view>(caches[0], "kv_compressor::compress_model"), model_, budget, sh::host_span<std::byte>(workspace_->data, workspace_bytes_),
                     selection);
    if (count > 0)
      for (std::int32_t l = 0; l < model_.layers; ++l)
        sh::host::compact(policy_, cache_as<fp32_view>(caches[static_cast<std::size_t>(l)], "kv_compressor::compress_model"),
                          model_.layer(l), selection,
                          sh::host_span<std::byte>(compact_workspace_->data, compact_bytes_));
    return new_length;
  }

  void reset() override { sh::host::reset_state(model_); }

  sh::eviction_state<sh::memory_space::host> state(std::int32_t layer) const override {
    if (layer < 0 || layer >= model_.layers) throw std::out_of_range("kv_compressor::state: no layer " + std::to_string(layer));
    return model_.layer(layer);
  }

 private:
  Policy policy_;
  sh::state_shape shape_{};
  std::unique_ptr<aligned_buffer> buffer_, workspace_, compact_workspace_;
  std::size_t workspace_bytes_ = 0, compact_bytes_ = 0;
  sh::model_state<sh::memory_space::host> model_{};
  std::vector<std::int32_t> slots_;
};

template <class Base, class Gran, class View>
std::unique_ptr<kv_compressor> make_at(const compressor_args& a) {
  if constexpr (Gran::kind == sh::granularity_kind::shared_layers) {
    static_assert(std::is_same_v<View, fp32_view>, "shared_layers compressors run fp32 caches only");
    return std::make_unique<model_compressor_impl<Base, Gran>>(a.spec, a.budgets, a.caches, a.source,
                                                               a.state_capacity);
  } else {
    return std::make_unique<compressor_impl<Base, Gran, View>>(a.spec, a.budgets, a.caches, a.source,
                                                               a.state_capacity);
  }
}

// Explicit instantiations of make_at<Base, G> (fp32) for every base policy,
// and of make_at<Base, per_head, V> for the low-precision ones.
#define LLAMA_MAKE_AT(O, H, Q, G) \
  template std::unique_ptr<kv_compressor> make_at<LLAMA_BASE_POLICY(O, H, Q), G>(const compressor_args&);
#define LLAMA_MAKE_AT_VIEW(O, H, Q, V)                                                                       \
  template std::unique_ptr<kv_compressor> make_at<LLAMA_BASE_POLICY(O, H, Q), sh::per_head, V>(             \
      const compressor_args&);

}  // namespace llama::detail
