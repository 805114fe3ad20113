#pragma once
// The plain harness the C++17 engines share (engine_test.cpp,
// token_level_test.cpp): the build-mode checks, pass/fail counting with the
// "N passed, M failed" line CTest reads, 256-byte aligned buffers and byte
// snapshots. C++17 without exceptions; no library header but bridge.h.
#if __cplusplus != 201703L
#error \
    "the tests/cxx17 engines must compile as C++17: CXX_STANDARD 17 did not apply (a C++20 usage requirement leaked in?)"
#endif
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#error "the tests/cxx17 engines must compile with -fno-exceptions"
#endif
#if defined(__GNUC__) && !defined(__STRICT_ANSI__)
#error "the tests/cxx17 engines must compile with -std=c++17, not the compiler's gnu++ default (CXX_EXTENSIONS OFF)"
#endif

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <scissorhands/bridge/bridge.h>

namespace cxx17_check {

inline int passed = 0, failed = 0;

inline void check(bool ok, const char* what, const char* detail = "") {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED: %s %s\n", what, detail);
  }
}

inline void check_ok(const scissorhands::bridge::error& e, const char* what) { check(e.ok(), what, e.message); }

// main's last line: the tally (CTest matches it) and the exit status.
inline int finish() {
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// Appends the bytes of v's elements: snapshots compare buffers byte for byte
// (a refused call must leave them byte-identical, NaN and -0 included).
template <class T>
void append_bytes(std::vector<unsigned char>& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

// 256-byte aligned memory (a state buffer needs it), every byte `fill`.
struct aligned_bytes {
  void* data = nullptr;
  std::size_t size = 0;
  aligned_bytes(std::size_t n, unsigned char fill) : size(n) {
    const std::size_t rounded = (n + 255) / 256 * 256;
    data = std::aligned_alloc(256, rounded);
    if (data == nullptr) std::abort();
    std::memset(data, fill, rounded);
  }
  ~aligned_bytes() { std::free(data); }
  aligned_bytes(const aligned_bytes&) = delete;
  aligned_bytes& operator=(const aligned_bytes&) = delete;
  std::vector<unsigned char> bytes() const {
    const auto* p = static_cast<const unsigned char*>(data);
    return {p, p + size};
  }
};

}  // namespace cxx17_check
