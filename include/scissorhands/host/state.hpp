#pragma once
// Host-side lifetime of the eviction state: reset all, or one row when the
// engine gives it to a new request.
#include <cstring>

#include "../detail/validate.hpp"
#include "../eviction_state.hpp"
#include "../model_state.hpp"

namespace scissorhands::host {

// Zeroes every sequence: no token tracked, positions start at 0.
inline void reset_state(eviction_state<memory_space::host> state) {
  detail::validate_state("host::reset_state", state.shape, state.step);
  std::memset(static_cast<void*>(state.step), 0, detail::offsets_of(state.shape).total);
}

// Forgets the tokens of state row `row` (a sequence's row, not its batch
// position); the next token admitted to it gets start_position.
inline void reset_sequence(eviction_state<memory_space::host> state, std::int32_t row, std::int32_t start_position = 0) {
  const char* fn = "host::reset_sequence";
  detail::validate_state(fn, state.shape, state.step);
  detail::require(row >= 0 && row < state.shape.rows, fn, "row", "must be in [0, shape.rows = ", state.shape.rows,
                  "), got ", row);
  detail::require(start_position >= 0, fn, "start_position", "must be non-negative, got ", start_position);
  state.step[row] = 0;
  state.next_position[row] = start_position;
  state.tracked[row] = 0;
  state.status[row] = 0;
  state.blocks_done[row] = 0;
}

// The same for every layer of a model state (shared_layers eviction).
inline void reset_state(model_state<memory_space::host> model) {
  const char* fn = "host::reset_state";
  detail::require(model.layers > 0 && model.first.step != nullptr, fn, "model",
                  "is not laid out: build it with make_model_state");
  for (std::int32_t l = 0; l < model.layers; ++l) reset_state(model.layer(l));
}
inline void reset_sequence(model_state<memory_space::host> model, std::int32_t row, std::int32_t start_position = 0) {
  const char* fn = "host::reset_sequence";
  detail::require(model.layers > 0 && model.first.step != nullptr, fn, "model",
                  "is not laid out: build it with make_model_state");
  for (std::int32_t l = 0; l < model.layers; ++l) reset_sequence(model.layer(l), row, start_position);
}

}  // namespace scissorhands::host
