#pragma once
// The engine's view of scissorhands: C++17, noexcept.
#include <scissorhands/bridge/bridge.h>

SCISSORHANDS_BRIDGE_DECLARE(engine::h2o_f32, float);
