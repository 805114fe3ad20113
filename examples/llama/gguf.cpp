#include "gguf.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

namespace llama {

namespace {

template <class... Parts>
[[noreturn]] void fail(const std::string& file, const Parts&... parts) {
  std::ostringstream out;
  out << "gguf: " << file << ": ";
  (out << ... << parts);
  throw gguf_error(out.str());
}

// A bounds-checked little-endian cursor over the file's bytes.
class cursor {
 public:
  cursor(const std::vector<std::uint8_t>& bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  std::uint64_t at() const { return at_; }
  std::uint64_t left() const { return bytes_.size() - at_; }

  void need(std::uint64_t n, const char* what) const {
    if (n > left())
      fail(name_, "truncated: ", what, " at byte ", at_, " needs ", n, " bytes, only ", left(), " left (file size ",
           bytes_.size(), ")");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));  // the format and every host we target are little-endian
    at_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const auto n = read<std::uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), static_cast<std::size_t>(n));
    at_ += n;
    return s;
  }

 private:
  const std::vector<std::uint8_t>& bytes_;
  const std::string& name_;
  std::uint64_t at_ = 0;
};

// Smallest number of bytes one value of a metadata type occupies: bounds an
// array's count by what is left in the file before anything is allocated.
std::uint64_t min_size(gguf_type t) {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: case gguf_type::string: return 8;
    case gguf_type::array: return 12;
  }
  return 1;
}

bool valid_type(std::uint32_t t) { return t <= 12; }

gguf_value read_value(cursor& c, gguf_type type, const std::string& file, const std::string& key, int depth) {
  gguf_value v;
  v.type = type;
  switch (type) {
    case gguf_type::u8: v.data = std::uint64_t{c.read<std::uint8_t>("u8 value")}; break;
    case gguf_type::u16: v.data = std::uint64_t{c.read<std::uint16_t>("u16 value")}; break;
    case gguf_type::u32: v.data = std::uint64_t{c.read<std::uint32_t>("u32 value")}; break;
    case gguf_type::u64: v.data = c.read<std::uint64_t>("u64 value"); break;
    case gguf_type::i8: v.data = std::int64_t{c.read<std::int8_t>("i8 value")}; break;
    case gguf_type::i16: v.data = std::int64_t{c.read<std::int16_t>("i16 value")}; break;
    case gguf_type::i32: v.data = std::int64_t{c.read<std::int32_t>("i32 value")}; break;
    case gguf_type::i64: v.data = c.read<std::int64_t>("i64 value"); break;
    case gguf_type::f32: v.data = double{c.read<float>("f32 value")}; break;
    case gguf_type::f64: v.data = c.read<double>("f64 value"); break;
    case gguf_type::boolean: {
      const auto b = c.read<std::uint8_t>("bool value");
      if (b > 1) fail(file, "metadata '", key, "': bool must be 0 or 1, got ", int{b});
      v.data = b == 1;
      break;
    }
    case gguf_type::string: v.data = c.string("string value"); break;
    case gguf_type::array: {
      if (depth > 4) fail(file, "metadata '", key, "': arrays nested deeper than 4 levels");
      const auto et = c.read<std::uint32_t>("array element type");
      if (!valid_type(et)) fail(file, "metadata '", key, "': array element type must be in [0, 12], got ", et);
      v.element_type = static_cast<gguf_type>(et);
      const auto n = c.read<std::uint64_t>("array length");
      if (n > c.left() / min_size(v.element_type))
        fail(file, "truncated: metadata '", key, "' declares ", n, " array elements but only ", c.left(),
             " bytes are left");
      gguf_array items;
      items.reserve(static_cast<std::size_t>(n));
      for (std::uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, v.element_type, file, key, depth + 1));
      v.data = std::move(items);
      break;
    }
  }
  return v;
}

const char* type_word(gguf_type t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64",
                                "i64", "f64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < 13 ? names[i] : "?";
}

}  // namespace

std::uint64_t tensor_info::elements() const {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::string tensor_type_name(std::uint32_t type) {
  static const char* names[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0",
                                "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",
                                "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32",
                                "I64", "F64", "IQ1_M", "BF16"};
  if (type < std::size(names)) return names[type];
  return "unknown type " + std::to_string(type);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal: shift until the implicit bit appears, adjusting the exponent.
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

gguf_file gguf_file::open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw gguf_error("gguf: cannot open '" + path + "' for reading");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw gguf_error("gguf: error while reading '" + path + "'");
  return parse(std::move(bytes), path);
}

gguf_file gguf_file::parse(std::vector<std::uint8_t> bytes, const std::string& name) {
  gguf_file g;
  g.name_ = name;
  g.bytes_ = std::move(bytes);
  cursor c(g.bytes_, g.name_);
  c.need(4, "magic");
  if (std::memcmp(g.bytes_.data(), "GGUF", 4) != 0) {
    std::ostringstream got;
    for (int i = 0; i < 4; ++i) got << (i ? " " : "") << "0x" << std::hex << int{g.bytes_[static_cast<std::size_t>(i)]};
    fail(name, "bad magic: expected 'GGUF' (0x47 0x47 0x55 0x46), got ", got.str(), ": not a GGUF file");
  }
  c.read<std::uint32_t>("magic");
  g.version_ = c.read<std::uint32_t>("version");
  if (g.version_ != 3) fail(name, "unsupported GGUF version ", g.version_, ": this reader handles version 3");
  const auto tensor_count = c.read<std::uint64_t>("tensor count");
  const auto kv_count = c.read<std::uint64_t>("metadata count");
  // Each key-value pair takes at least 12 bytes, each tensor info at least 24.
  if (kv_count > c.left() / 12) fail(name, "truncated: metadata count ", kv_count, " cannot fit in ", c.left(), " bytes");
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    std::string key = c.string("metadata key");
    const auto t = c.read<std::uint32_t>("metadata type");
    if (!valid_type(t)) fail(name, "metadata '", key, "': value type must be in [0, 12], got ", t);
    gguf_value v = read_value(c, static_cast<gguf_type>(t), name, key, 0);
    if (!g.metadata_.emplace(key, std::move(v)).second) fail(name, "metadata key '", key, "' appears twice");
  }
  if (tensor_count > c.left() / 24)
    fail(name, "truncated: tensor count ", tensor_count, " cannot fit in ", c.left(), " bytes");
  if (const gguf_value* a = g.find("general.alignment")) {
    const auto* u = std::get_if<std::uint64_t>(&a->data);
    if (!u || *u == 0 || (*u & (*u - 1)) != 0 || *u > (1u << 20))
      fail(name, "general.alignment must be an unsigned power of two up to 2^20");
    g.alignment_ = *u;
  }
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    tensor_info t;
    t.name = c.string("tensor name");
    const auto n_dims = c.read<std::uint32_t>("tensor dimension count");
    if (n_dims < 1 || n_dims > 4) fail(name, "tensor '", t.name, "': dimension count must be in [1, 4], got ", n_dims);
    std::uint64_t elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto n = c.read<std::uint64_t>("tensor dimension");
      if (n == 0 || n > (std::uint64_t{1} << 40) || elements > (std::uint64_t{1} << 40) / n)
        fail(name, "tensor '", t.name, "': dimension ", d, " = ", n, " is zero or makes the tensor larger than 2^40 elements");
      elements *= n;
      t.dims.push_back(n);
    }
    t.type = c.read<std::uint32_t>("tensor type");
    t.offset = c.read<std::uint64_t>("tensor offset");
    if (t.offset % g.alignment_ != 0)
      fail(name, "tensor '", t.name, "': offset ", t.offset, " is not a multiple of the alignment ", g.alignment_);
    if (!g.tensor_index_.emplace(t.name, g.tensors_.size()).second) fail(name, "tensor '", t.name, "' appears twice");
    g.tensors_.push_back(std::move(t));
  }
  g.data_start_ = (c.at() + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  if (g.data_start_ > g.bytes_.size())
    fail(name, "truncated: the tensor data section starts at byte ", g.data_start_, ", past the end (", g.bytes_.size(),
         " bytes)");
  // Sizes are checked here for the types we read; other types are refused
  // when read, with their name, so metadata-only use of a file still works.
  const std::uint64_t data_size = g.bytes_.size() - g.data_start_;
  for (const auto& t : g.tensors_) {
    if (t.type > 1) continue;
    const std::uint64_t size = t.elements() * (t.type == 0 ? 4 : 2);
    if (t.offset > data_size || size > data_size - t.offset)
      fail(name, "truncated: tensor '", t.name, "' needs bytes [", t.offset, ", ", t.offset + size,
           ") of the data section, which holds ", data_size);
  }
  return g;
}

const gguf_value* gguf_file::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

bool gguf_file::has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }

const tensor_info& gguf_file::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) fail(name_, "tensor '", name, "' is missing");
  return tensors_[it->second];
}

std::uint64_t gguf_file::get_uint(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) fail(name_, "metadata key '", key, "' is missing");
  if (const auto* u = std::get_if<std::uint64_t>(&v->data)) return *u;
  if (const auto* i = std::get_if<std::int64_t>(&v->data); i && *i >= 0) return static_cast<std::uint64_t>(*i);
  fail(name_, "metadata '", key, "' must be a non-negative integer, got type ", type_word(v->type));
}

std::uint64_t gguf_file::get_uint(const std::string& key, std::uint64_t fallback) const {
  return find(key) ? get_uint(key) : fallback;
}

double gguf_file::get_float(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) fail(name_, "metadata key '", key, "' is missing");
  if (const auto* d = std::get_if<double>(&v->data)) return *d;
  fail(name_, "metadata '", key, "' must be f32 or f64, got type ", type_word(v->type));
}

double gguf_file::get_float(const std::string& key, double fallback) const {
  return find(key) ? get_float(key) : fallback;
}

std::string gguf_file::get_string(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) fail(name_, "metadata key '", key, "' is missing");
  if (const auto* s = std::get_if<std::string>(&v->data)) return *s;
  fail(name_, "metadata '", key, "' must be a string, got type ", type_word(v->type));
}

std::vector<std::string> gguf_file::get_string_array(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) fail(name_, "metadata key '", key, "' is missing");
  const auto* a = std::get_if<gguf_array>(&v->data);
  if (!a || v->element_type != gguf_type::string)
    fail(name_, "metadata '", key, "' must be an array of strings, got type ", type_word(v->type));
  std::vector<std::string> out;
  out.reserve(a->size());
  for (const auto& e : *a) out.push_back(std::get<std::string>(e.data));
  return out;
}

std::vector<double> gguf_file::get_number_array(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) fail(name_, "metadata key '", key, "' is missing");
  const auto* a = std::get_if<gguf_array>(&v->data);
  if (!a) fail(name_, "metadata '", key, "' must be an array of numbers, got type ", type_word(v->type));
  std::vector<double> out;
  out.reserve(a->size());
  for (const auto& e : *a) {
    if (const auto* d = std::get_if<double>(&e.data)) out.push_back(*d);
    else if (const auto* u = std::get_if<std::uint64_t>(&e.data)) out.push_back(static_cast<double>(*u));
    else if (const auto* i = std::get_if<std::int64_t>(&e.data)) out.push_back(static_cast<double>(*i));
    else fail(name_, "metadata '", key, "' must be an array of numbers, got elements of type ", type_word(e.type));
  }
  return out;
}

std::vector<float> gguf_file::read_f32(const std::string& name, const std::vector<std::uint64_t>& dims) const {
  const tensor_info& t = tensor(name);
  if (!dims.empty() && t.dims != dims) {
    std::ostringstream want, got;
    for (auto d : dims) want << "[" << d << "]";
    for (auto d : t.dims) got << "[" << d << "]";
    fail(name_, "tensor '", name, "' must have shape ", want.str(), " (ne0 first), got ", got.str());
  }
  if (t.type > 1)
    fail(name_, "tensor '", name, "' has type ", tensor_type_name(t.type),
         "; this reader handles F32 and F16 only (convert the model with --outtype f32 or f16)");
  const std::uint8_t* src = bytes_.data() + data_start_ + t.offset;
  std::vector<float> out(static_cast<std::size_t>(t.elements()));
  if (t.type == 0) {
    std::memcpy(out.data(), src, out.size() * sizeof(float));
  } else {
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  }
  return out;
}

}  // namespace llama
