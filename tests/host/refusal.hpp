#pragma once
// Refusal checks of the host and engine tests, in one place: a call given
// bad input throws scissorhands::invalid_argument from the entry point
// named, names the argument at fault (in its message too, which is what a
// user reads), and writes nothing the caller owns. Also: byte snapshots for "nothing
// written", and test cases registered from a table.
#include <catch2/catch.hpp>

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <scissorhands/scissorhands.hpp>

namespace sh_test {

// The bytes of a contiguous range (a vector, an array, a span).
template <class Range>
std::vector<std::byte> bytes_of(const Range& r) {
  const auto b = std::as_bytes(std::span(r));
  return {b.begin(), b.end()};
}

// Several ranges' bytes, for an owner's snapshot().
template <class... Ranges>
std::vector<std::vector<std::byte>> bytes_of_all(const Ranges&... r) {
  return {bytes_of(r)...};
}

// `call` must throw scissorhands::invalid_argument from `function`, naming
// `argument` (its message starts "scissorhands::<function>: argument
// '<argument>'", which is what a user reads), and leave every byte the
// caller owns as it was: `owner.snapshot()`, or `owner()` where owner is a
// callable (an engine loop's snapshot of its cache, state and tables).
template <class Owner, class Call>
void check_refused(const Owner& owner, const std::string& function, const std::string& argument, Call&& call) {
  const auto snapshot = [&] {
    if constexpr (std::is_invocable_v<const Owner&>)
      return owner();
    else
      return owner.snapshot();
  };
  const auto before = snapshot();
  bool refused = false;
  try {
    call();
  } catch (const scissorhands::invalid_argument& e) {
    refused = true;
    INFO("message: " << e.what());
    CHECK(e.function() == function);
    CHECK(e.argument() == argument);
    CHECK(std::string(e.what()).rfind("scissorhands::" + function + ": argument '" + argument + "'", 0) == 0);
  }
  CHECK(refused);
  const bool untouched = snapshot() == before;  // (a bool: Catch would print every byte)
  CHECK(untouched);
}

// For calls that take nothing they could write (the budget allocators).
template <class Call>
void check_refused(const std::string& function, const std::string& argument, Call&& call) {
  struct nothing {
    int snapshot() const { return 0; }
  };
  check_refused(nothing{}, function, argument, call);
}

// A table of test cases, each registered as a Catch test case of its own
// (so CTest lists each, by its name): for a file of many small cases of
// one shape, where a TEST_CASE each would repeat the same frame. Catch
// reports a case at `file`:`line`, where the table is registered.
struct table_case {
  const char* name;
  std::function<void()> run;
  const char* more_tags = "";  // after the tags every row of the table has
};

inline bool register_cases(const char* file, std::size_t line, const std::string& tags,
                           std::span<const table_case> rows) {
  struct invoker : Catch::ITestInvoker {
    std::function<void()> run;
    explicit invoker(std::function<void()> r) : run(std::move(r)) {}
    void invoke() const override { run(); }
  };
  for (const table_case& row : rows)  // AutoReg owns the invoker from here
    Catch::AutoReg(new invoker(row.run), Catch::SourceLineInfo(file, line), "", {row.name, tags + row.more_tags});
  return true;
}

}  // namespace sh_test
