// The GGUF reader against small files written here: a valid one read back
// exactly, and malformed ones (every truncation, bad magic, wrong version,
// unsupported tensor type, misaligned offset, absurd counts) refused with a
// gguf_error that says what is wrong. No model file needed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "model.hpp"

namespace {

using llama::gguf_error;
using llama::gguf_file;

// Builds GGUF v3 bytes field by field.
struct writer {
  std::vector<std::uint8_t> bytes;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void kv_string(const std::string& k, const std::string& v) {
    str(k);
    put<std::uint32_t>(8);
    str(v);
  }
  void kv_u32(const std::string& k, std::uint32_t v) {
    str(k);
    put<std::uint32_t>(4);
    put(v);
  }
  void kv_f32(const std::string& k, float v) {
    str(k);
    put<std::uint32_t>(6);
    put(v);
  }
  void pad(std::size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }
};

struct tensor_spec {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type;
  std::uint64_t offset;
};

// A valid file: 4 metadata entries (one an array), an F32 [3][2] tensor and
// an F16 [4] one, default alignment 32.
std::vector<std::uint8_t> valid_file(std::uint32_t second_type = 1, std::uint64_t second_offset = 32,
                                     std::uint32_t version = 3) {
  writer w;
  w.bytes = {'G', 'G', 'U', 'F'};
  w.put<std::uint32_t>(version);
  w.put<std::uint64_t>(2);  // tensors
  w.put<std::uint64_t>(4);  // metadata
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.block_count", 5);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.str("tokenizer.ggml.tokens");
  w.put<std::uint32_t>(9);
  w.put<std::uint32_t>(8);
  w.put<std::uint64_t>(3);
  w.str("<unk>");
  w.str("<s>");
  w.str("\xE2\x96\x81the");
  const tensor_spec tensors[] = {{"a", {3, 2}, 0, 0}, {"b", {4}, second_type, second_offset}};
  for (const auto& t : tensors) {
    w.str(t.name);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) w.put<std::uint64_t>(d);
    w.put<std::uint32_t>(t.type);
    w.put<std::uint64_t>(t.offset);
  }
  w.pad(32);
  for (int i = 0; i < 6; ++i) w.put<float>(0.5f * static_cast<float>(i) - 1.0f);
  w.pad(32);
  for (std::uint16_t h : {std::uint16_t{0x3C00}, std::uint16_t{0xC000}, std::uint16_t{0x7BFF}, std::uint16_t{0x0001}})
    w.put<std::uint16_t>(h);
  return w.bytes;
}

std::string parse_error(std::vector<std::uint8_t> bytes) {
  try {
    gguf_file::parse(std::move(bytes), "test.gguf");
  } catch (const gguf_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gguf: a valid file is read back exactly", "[gguf]") {
  const gguf_file f = gguf_file::parse(valid_file(), "valid.gguf");
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.block_count") == 5);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == Approx(1e-5));
  CHECK(f.get_uint("missing.key", 7) == 7);
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 3);
  CHECK(tokens[2] == "\xE2\x96\x81the");
  const auto a = f.read_f32("a", {3, 2});
  REQUIRE(a.size() == 6);
  for (int i = 0; i < 6; ++i) CHECK(a[static_cast<std::size_t>(i)] == 0.5f * static_cast<float>(i) - 1.0f);
  const auto b = f.read_f32("b");
  REQUIRE(b.size() == 4);
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -2.0f);
  CHECK(b[2] == 65504.0f);
  CHECK(b[3] == std::ldexp(1.0f, -24));  // the smallest subnormal half
}

TEST_CASE("gguf: half conversion covers every class", "[gguf]") {
  CHECK(llama::half_to_float(0x0000) == 0.0f);
  CHECK(std::signbit(llama::half_to_float(0x8000)));
  CHECK(llama::half_to_float(0x3555) == Approx(0.333251953125f));
  CHECK(llama::half_to_float(0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(llama::half_to_float(0x0400) == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(std::isinf(llama::half_to_float(0x7C00)));
  CHECK(std::isinf(llama::half_to_float(0xFC00)));
  CHECK(std::isnan(llama::half_to_float(0x7E00)));
}

TEST_CASE("gguf: every truncation of a valid file is refused", "[gguf]") {
  const auto good = valid_file();
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::string why = parse_error(std::vector<std::uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)));
    INFO("prefix of " << n << " of " << good.size() << " bytes");
    REQUIRE(!why.empty());
    CHECK(why.find("test.gguf") != std::string::npos);
    CHECK(why.find("truncated") != std::string::npos);
  }
}

TEST_CASE("gguf: bad magic and unsupported versions are refused", "[gguf]") {
  auto bytes = valid_file();
  bytes[3] = 'L';
  CHECK_THAT(parse_error(bytes), Catch::Contains("bad magic") && Catch::Contains("not a GGUF file"));
  CHECK_THAT(parse_error(valid_file(1, 32, 2)), Catch::Contains("unsupported GGUF version 2"));
}

TEST_CASE("gguf: unsupported tensor types are named when read", "[gguf]") {
  // Q4_0 data of 4 elements would be one 18-byte block; the reader must
  // refuse it by name rather than misread it.
  const gguf_file f = gguf_file::parse(valid_file(2), "quant.gguf");
  CHECK_THROWS_AS(f.read_f32("b"), gguf_error);
  CHECK_THROWS_WITH(f.read_f32("b"), Catch::Contains("Q4_0") && Catch::Contains("F32 and F16 only"));
  CHECK_THROWS_WITH(f.read_f32("a", {2, 3}), Catch::Contains("must have shape [2][3]"));
  CHECK_THROWS_WITH(f.read_f32("nope"), Catch::Contains("tensor 'nope' is missing"));
  CHECK_THROWS_WITH(f.get_uint("general.architecture"), Catch::Contains("must be a non-negative integer"));
}

TEST_CASE("gguf: malformed headers are refused before anything is allocated", "[gguf]") {
  SECTION("misaligned tensor offset") {
    CHECK_THAT(parse_error(valid_file(1, 30)), Catch::Contains("not a multiple of the alignment 32"));
  }
  SECTION("tensor past the end of the data") {
    CHECK_THAT(parse_error(valid_file(1, 64)), Catch::Contains("truncated: tensor 'b'"));
  }
  SECTION("absurd metadata count") {
    auto bytes = valid_file();
    const std::uint64_t huge = std::uint64_t{1} << 60;
    std::memcpy(bytes.data() + 16, &huge, 8);
    CHECK_THAT(parse_error(bytes), Catch::Contains("metadata count"));
  }
  SECTION("absurd string length") {
    auto bytes = valid_file();
    const std::uint64_t huge = std::uint64_t{1} << 62;
    std::memcpy(bytes.data() + 24, &huge, 8);  // the first key's length
    CHECK_THAT(parse_error(bytes), Catch::Contains("truncated: metadata key"));
  }
  SECTION("unknown metadata value type") {
    auto bytes = valid_file();
    const std::uint32_t bad = 13;
    std::memcpy(bytes.data() + 24 + 8 + 20, &bad, 4);  // after "general.architecture"
    CHECK_THAT(parse_error(bytes), Catch::Contains("value type must be in [0, 12], got 13"));
  }
}

TEST_CASE("gguf: a file that is not a llama model is refused by the model loader", "[gguf]") {
  const gguf_file f = gguf_file::parse(valid_file(), "tiny.gguf");
  // The architecture is right but the hyper-parameters are missing.
  CHECK_THROWS_WITH(llama::model::load(f), Catch::Contains("llama.embedding_length") && Catch::Contains("missing"));
}

TEST_CASE("gguf: a missing file is a clear error", "[gguf]") {
  const auto path = (std::filesystem::temp_directory_path() / "scissorhands_no_such_model.gguf").string();
  CHECK_THROWS_WITH(gguf_file::open(path), Catch::Contains("cannot open") && Catch::Contains(path));
}
