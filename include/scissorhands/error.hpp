#pragma once
// One error rule for the whole library: every entry point validates all of
// its arguments before it touches the cache or the state. A violation throws
// scissorhands::invalid_argument, whose message names the function, the
// argument and the bound it broke; nothing the caller owns has been written.
// CUDA entry points validate the same way on the host and return cudaError_t
// only for errors of the CUDA runtime itself.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

// The non-throwing path: catch_errors runs a call and turns whatever it
// threw into an error_info, a fixed-size value (no allocation, no
// std::string), so code that must not throw (a CUDA graph capture, a
// noexcept engine hook, the C++17 bridge in bridge/) can still report the
// function, the argument and the message. On success it costs one zeroed
// struct and nothing else.
enum class error_code : std::int32_t {
  ok = 0,
  invalid_argument = 1,  // scissorhands::invalid_argument: nothing the caller owns was written
  out_of_memory = 2,     // std::bad_alloc (only setup-time code allocates)
  internal = 3,          // any other exception: a bug of the library or of the callable
};

struct error_info {
  static constexpr std::size_t name_size = 64;      // function, argument (NUL-terminated, truncated)
  static constexpr std::size_t message_size = 256;  // what() (NUL-terminated, "..." when truncated)
  error_code code = error_code::ok;
  char function[name_size] = {};
  char argument[name_size] = {};
  char message[message_size] = {};

  [[nodiscard]] bool ok() const noexcept { return code == error_code::ok; }
  explicit operator bool() const noexcept { return !ok(); }  // true when something failed
};

namespace detail {

// Copies the NUL-terminated `source` (null: empty) into `out`, always
// NUL-terminated; a string that does not fit ends in "...".
template <std::size_t N>
void copy_truncated(char (&out)[N], const char* source) noexcept {
  static_assert(N >= 4, "room for the truncation mark");
  std::size_t i = 0;
  if (source != nullptr)
    for (; i + 1 < N && source[i] != '\0'; ++i) out[i] = source[i];
  out[i] = '\0';
  if (source != nullptr && source[i] != '\0')
    for (std::size_t k = N - 4; k + 1 < N; ++k) out[k] = '.';
}

inline error_info make_error_info(error_code code, const char* function, const char* argument,
                                  const char* message) noexcept {
  error_info e;
  e.code = code;
  copy_truncated(e.function, function);
  copy_truncated(e.argument, argument);
  copy_truncated(e.message, message);
  return e;
}

}  // namespace detail

// Runs call() and reports what it threw instead of throwing:
//   auto e = scissorhands::catch_errors([&] { host::compress(policy, cache, state, budget, ws, out); });
//   if (e) log(e.message);   // e.code, e.function ("host::compress"), e.argument ("budget")
// What call() returns is discarded (capture results by reference).
template <class F>
[[nodiscard]] error_info catch_errors(F&& call) noexcept {
  try {
    std::forward<F>(call)();
  } catch (const invalid_argument& x) {
    return detail::make_error_info(error_code::invalid_argument, x.function().c_str(), x.argument().c_str(), x.what());
  } catch (const std::bad_alloc& x) {
    return detail::make_error_info(error_code::out_of_memory, "", "", x.what());
  } catch (const std::exception& x) {
    return detail::make_error_info(error_code::internal, "", "", x.what());
  } catch (...) {
    return detail::make_error_info(error_code::internal, "", "", "unknown exception");
  }
  return {};
}

}  // namespace scissorhands
