#pragma once
// A reader for GGUF v3 files (metadata, tensor infos, aligned tensor data).
// The whole file is read into memory and every count, offset and size is
// checked against the bytes actually there, so a truncated or malformed file
// fails with a gguf_error naming the file, the field and the bound.
// Tensors: F32 and F16 (converted to float); any other type is refused.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace llama {

class gguf_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// GGUF metadata value types, numbered as in the file.
enum class gguf_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

struct gguf_value;
using gguf_array = std::vector<gguf_value>;

struct gguf_value {
  gguf_type type = gguf_type::u32;
  gguf_type element_type = gguf_type::u32;  // arrays only
  // Unsigned integers, signed integers, floats, bools, strings, arrays.
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, gguf_array> data;
};

// ggml tensor types this reader converts; the rest are named in errors only.
enum class tensor_type : std::uint32_t { f32 = 0, f16 = 1 };

struct tensor_info {
  std::string name;
  std::vector<std::uint64_t> dims;  // ne[0] (fastest) first, as in the file
  std::uint32_t type = 0;
  std::uint64_t offset = 0;         // from the start of the data section
  std::uint64_t elements() const;
};

class gguf_file {
 public:
  // Reads and validates the whole file.
  static gguf_file open(const std::string& path);
  // Parses bytes already in memory; `name` is used in error messages.
  static gguf_file parse(std::vector<std::uint8_t> bytes, const std::string& name);

  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  const std::map<std::string, gguf_value>& metadata() const { return metadata_; }
  const std::vector<tensor_info>& tensors() const { return tensors_; }

  const gguf_value* find(const std::string& key) const;
  bool has_tensor(const std::string& name) const;
  const tensor_info& tensor(const std::string& name) const;

  // Typed metadata access: throws gguf_error when the key is missing or has
  // another type; integers of any width are accepted if they fit.
  std::uint64_t get_uint(const std::string& key) const;
  std::uint64_t get_uint(const std::string& key, std::uint64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_number_array(const std::string& key) const;

  // The tensor's elements as float (F32 copied, F16 converted). When `dims`
  // is given the tensor's shape must equal it.
  std::vector<float> read_f32(const std::string& name, const std::vector<std::uint64_t>& dims = {}) const;

 private:
  std::string name_;
  std::vector<std::uint8_t> bytes_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_start_ = 0;
  std::map<std::string, gguf_value> metadata_;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

// IEEE binary16 to float, subnormals, infinities and NaN included.
float half_to_float(std::uint16_t h);
// Name of a ggml tensor type number ("Q4_0", ...), for error messages.
std::string tensor_type_name(std::uint32_t type);

}  // namespace llama
