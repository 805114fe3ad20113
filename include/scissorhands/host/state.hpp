#pragma once
// Host-side lifetime of the eviction state: reset all, or one sequence when
// the engine reuses its batch slot for a new request.
#include <cstring>

#include "../detail/validate.hpp"
#include "../eviction_state.hpp"

namespace scissorhands::host {

// Zeroes every sequence: no token tracked, positions start at 0.
inline void reset_state(eviction_state<memory_space::host> state) {
  detail::validate_state("host::reset_state", state.shape, state.step);
  std::memset(static_cast<void*>(state.step), 0, detail::offsets_of(state.shape).total);
}

// Forgets sequence b's tokens; its next admitted token gets start_position.
inline void reset_sequence(eviction_state<memory_space::host> state, std::int32_t b, std::int32_t start_position = 0) {
  const char* fn = "host::reset_sequence";
  detail::validate_state(fn, state.shape, state.step);
  detail::require(b >= 0 && b < state.shape.batch, fn, "b", "must be in [0, batch = ", state.shape.batch, "), got ",
                  b);
  detail::require(start_position >= 0, fn, "start_position", "must be non-negative, got ", start_position);
  state.step[b] = 0;
  state.next_position[b] = start_position;
  state.tracked[b] = 0;
}

}  // namespace scissorhands::host
