#pragma once
// The C++20 TUs' (bridge_tu.cpp, token_tu.cpp) wrapper around a direct call
// into scissorhands::host: the reference hooks are noexcept, so a throw
// becomes false and a printed message the C++17 side counts as a failure.
#include <cstdio>
#include <exception>

namespace cxx17_reference {

template <class F>
bool report(const char* what, F&& call) noexcept {
  try {
    call();
    return true;
  } catch (const std::exception& e) {
    std::printf("reference %s threw: %s\n", what, e.what());
    return false;
  }
}

}  // namespace cxx17_reference
