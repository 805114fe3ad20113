#pragma once
// One error rule for the whole library: every entry point validates all of
// its arguments before it touches the cache or the state. A violation throws
// scissorhands::invalid_argument, whose message names the function, the
// argument and the bound it broke; nothing the caller owns has been written.
// CUDA entry points validate the same way on the host and return cudaError_t
// only for errors of the CUDA runtime itself.
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace scissorhands {

class invalid_argument : public std::invalid_argument {
 public:
  invalid_argument(std::string function, std::string argument, const std::string& detail)
      : std::invalid_argument("scissorhands::" + function + ": argument '" + argument + "' " + detail),
        function_(std::move(function)),
        argument_(std::move(argument)) {}
  // Which entry point refused, and which argument it refused.
  [[nodiscard]] const std::string& function() const noexcept { return function_; }
  [[nodiscard]] const std::string& argument() const noexcept { return argument_; }

 private:
  std::string function_;
  std::string argument_;
};

namespace detail {

// Builds the "detail" part of a message from streamable pieces.
template <class... Parts>
[[nodiscard]] std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Builds and throws the error; out of line from require() so that a check
// that passes costs one branch and never allocates (the message is only
// built when something failed).
template <class... Parts>
[[noreturn]] void fail(const char* function, const char* argument, const Parts&... detail) {
  throw invalid_argument(function, argument, concat(detail...));
}

// require(cond, fn, arg, "must be ...", value...) throws when cond is false.
// Arguments are names (string literals), never built strings, so a passing
// check allocates nothing.
template <class... Parts>
inline void require(bool condition, const char* function, const char* argument, const Parts&... detail) {
  if (!condition) [[unlikely]]
    fail(function, argument, detail...);
}

}  // namespace detail
}  // namespace scissorhands
