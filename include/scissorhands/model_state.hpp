#pragma once
// The state of a whole model for shared_layers eviction: one eviction_state
// per layer, laid out back to back in one caller-owned buffer at a fixed
// stride (model_state_bytes / make_model_state), so a single select (host or
// CUDA) can read every layer's scores from one base pointer.
//
// Each layer is an ordinary eviction_state: observe layer l into
// state.layer(l) as for per-head eviction. Every layer must see the same
// lengths and be observed (or admitted) at every step, so all layers track
// the same tokens at the same slots; select checks that they do.
#include <cstddef>
#include <cstdint>

#include "config.hpp"
#include "error.hpp"
#include "eviction_state.hpp"
#include "span.hpp"

namespace scissorhands {

template <memory_space Space>
struct model_state {
  static constexpr memory_space space = Space;
  eviction_state<Space> first;    // layer 0; layer l lies layer_bytes * l further
  std::int32_t layers = 0;
  std::size_t layer_bytes = 0;    // state_bytes(first.shape)

  // Layer l's state, seen through the same batch mapping. On the host (where
  // an engine picks the layer to hand to observe, of either backend) l
  // outside [0, layers) is refused: it would point past the state buffer.
  // Device code only reaches it in loops bounded by `layers`.
  SCISSORHANDS_HOST_DEVICE eviction_state<Space> layer(std::int32_t l) const {
#if !defined(__CUDA_ARCH__)
    detail::require(l >= 0 && l < layers, "model_state::layer", "l", "must be in [0, layers = ", layers, "), got ", l);
#endif
    eviction_state<Space> s = first;
    const std::size_t shift = layer_bytes * static_cast<std::size_t>(l);
    const auto at = [shift](auto* p) {
      return reinterpret_cast<decltype(p)>(reinterpret_cast<std::byte*>(p) + shift);
    };
    s.step = at(s.step);
    s.next_position = at(s.next_position);
    s.tracked = at(s.tracked);
    s.status = at(s.status);
    s.blocks_done = at(s.blocks_done);
    s.positions = at(s.positions);
    s.scores = at(s.scores);
    s.observed = at(s.observed);
    s.ring = at(s.ring);
    return s;
  }
  // Every layer seen through this step's batch (eviction_state::for_batch).
  model_state for_batch(span<const std::int32_t, Space> rows_of_batch) const {
    model_state m = *this;
    m.first = first.for_batch(rows_of_batch);
    return m;
  }
  const state_shape& shape() const { return first.shape; }
};

namespace detail {
inline void validate_layers(const char* fn, std::int32_t layers, std::size_t layer_bytes) {
  require(layers > 0, fn, "layers", "must be positive, got ", layers);
  require(static_cast<double>(layer_bytes) * layers < 4.0e18, fn, "layers", "times ", layer_bytes,
          " bytes per layer is beyond what can be addressed");
}
// A one-layer model over one layer's state: compress at shared_heads
// chooses its slots through the model path, as select does.
template <memory_space Space>
model_state<Space> single_layer(const eviction_state<Space>& state) {
  model_state<Space> m;
  m.first = state;
  m.layers = 1;
  m.layer_bytes = 0;
  return m;
}
}  // namespace detail

// Bytes of a model state: `layers` layer states of this shape.
inline std::size_t model_state_bytes(const state_shape& shape, std::int32_t layers) {
  detail::validate_state_shape("model_state_bytes", shape);
  const std::size_t per_layer = detail::offsets_of(shape).total;
  detail::validate_layers("model_state_bytes", layers, per_layer);
  return per_layer * static_cast<std::size_t>(layers);
}

// Lays a model state out over the caller's buffer (256-byte aligned, at least
// model_state_bytes); reset it (host::reset_state / cuda::reset_state) before
// first use.
template <memory_space Space>
model_state<Space> make_model_state(span<std::byte, Space> buffer, const state_shape& shape, std::int32_t layers) {
  const char* fn = "make_model_state";
  detail::validate_state_shape(fn, shape);
  detail::require(buffer.data() != nullptr, fn, "buffer", "must not be null");
  detail::require(reinterpret_cast<std::uintptr_t>(buffer.data()) % detail::state_alignment == 0, fn, "buffer",
                  "must be aligned to ", detail::state_alignment, " bytes");
  const std::size_t per_layer = detail::offsets_of(shape).total;
  detail::validate_layers(fn, layers, per_layer);
  const std::size_t total = per_layer * static_cast<std::size_t>(layers);
  detail::require(buffer.size() >= total, fn, "buffer", "holds ", buffer.size(),
                  " bytes, below model_state_bytes = ", total);
  model_state<Space> m;
  m.first = make_state(span<std::byte, Space>(buffer.data(), per_layer), shape);
  m.layers = layers;
  m.layer_bytes = per_layer;
  return m;
}

}  // namespace scissorhands
