// scissorhands::catch_errors (error.hpp), the non-throwing path C++20 code
// can use directly: each kind of exception becomes its code, names are
// copied, long texts are truncated with "...", success is a zero value.
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include <scissorhands/scissorhands.hpp>

namespace sh = scissorhands;

namespace {

int passed = 0, failed = 0;

void check(bool ok, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED: %s\n", what);
  }
}

}  // namespace

int main() {
  static_assert(noexcept(sh::catch_errors([] { throw 1; })));

  const sh::error_info ok = sh::catch_errors([] {});
  check(ok.ok() && !ok && ok.code == sh::error_code::ok && ok.function[0] == '\0' && ok.argument[0] == '\0' &&
            ok.message[0] == '\0',
        "success: a zero error_info");

  // A real refusal from the library: the budget at the protected tokens.
  sh::h2o_policy policy;
  policy.config.recent = 4;
  const sh::error_info refused = sh::catch_errors([&] { sh::detail::validate_budget("host::compress", policy, 4); });
  check(refused.code == sh::error_code::invalid_argument && bool(refused), "invalid_argument: its code");
  check(std::strcmp(refused.function, "host::compress") == 0 && std::strcmp(refused.argument, "budget") == 0,
        "invalid_argument: function and argument");
  check(std::strncmp(refused.message, "scissorhands::host::compress: argument 'budget' must exceed", 59) == 0,
        "invalid_argument: the message is what()");

  // Texts longer than the buffers are cut, NUL-terminated, marked "...".
  const std::string long_name(200, 'f'), long_argument(100, 'a'), long_detail(1000, 'd');
  const sh::error_info cut =
      sh::catch_errors([&] { sh::detail::fail(long_name.c_str(), long_argument.c_str(), long_detail); });
  check(std::strlen(cut.function) == sh::error_info::name_size - 1 &&
            std::strlen(cut.argument) == sh::error_info::name_size - 1 &&
            std::strlen(cut.message) == sh::error_info::message_size - 1,
        "truncation: every buffer full and NUL-terminated");
  check(std::strcmp(cut.argument + sh::error_info::name_size - 4, "...") == 0 &&
            std::strcmp(cut.message + sh::error_info::message_size - 4, "...") == 0,
        "truncation: marked with ...");
  const std::string exact(sh::error_info::name_size - 1, 'x');
  const sh::error_info fits = sh::catch_errors([&] { sh::detail::fail("fn", exact.c_str(), "d"); });
  check(exact == fits.argument, "a name of exactly name_size - 1 characters is kept whole");

  const sh::error_info oom = sh::catch_errors([] { throw std::bad_alloc(); });
  check(oom.code == sh::error_code::out_of_memory && oom.argument[0] == '\0' && oom.message[0] != '\0',
        "std::bad_alloc: out_of_memory");
  const sh::error_info other = sh::catch_errors([] { throw std::runtime_error("boom"); });
  check(other.code == sh::error_code::internal && std::strcmp(other.message, "boom") == 0,
        "another std::exception: internal, its what()");
  const sh::error_info unknown = sh::catch_errors([] { throw 42; });
  check(unknown.code == sh::error_code::internal && std::strcmp(unknown.message, "unknown exception") == 0,
        "a non-exception: internal");

  // Results come back through captures; a mutable callable is accepted.
  int calls = 0;
  const sh::error_info counted = sh::catch_errors([&]() mutable { ++calls; });
  check(counted.ok() && calls == 1, "the callable runs exactly once");

  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
