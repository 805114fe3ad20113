// The engine's only C++20 translation unit.
#if __cplusplus < 202002L || !defined(__cpp_exceptions)
#error "the bridge TU must compile as C++20 with exceptions"
#endif
#include <scissorhands/bridge/bridge_impl.hpp>

#include "engine_scissorhands.h"

SCISSORHANDS_BRIDGE_DEFINE(engine::h2o_f32, float, scissorhands::h2o_policy);
