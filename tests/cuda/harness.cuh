#pragma once
// Helpers of the CUDA differential test: device buffers, aligned host
// buffers, element conversion, failure reporting.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.cuh>

namespace harness {

namespace sh = scissorhands;

// A CUDA runtime error ends the run: it is never a data mismatch.
inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, cudaGetErrorString(err));
    std::exit(1);
  }
}
#define CUDA_CHECK(expr) ::harness::check_cuda((expr), #expr, __FILE__, __LINE__)

// Exit 77 (CTest: skipped) when there is no device to run on.
inline void require_device_or_skip(const char* binary) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device (%s): skipping\n", binary,
                err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    std::exit(77);
  }
}

// Prints the device a suite runs on, its seed, and whether the second
// kernel of each call is launched programmatically dependent on the first
// (SCISSORHANDS_PDL=1 on sm_90+, cuda/launch.cuh).
inline void print_device(std::uint64_t seed) {
  cudaDeviceProp prop{};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const char* pdl = !sh::cuda::programmatic_launch_requested() ? "off"
                    : prop.major >= 9                           ? "on"
                                                                : "requested, sm < 90: off";
  std::printf("device %d: %s (sm_%d%d), seed %llu, programmatic dependent launch (SCISSORHANDS_PDL=1): %s\n", device,
              prop.name, prop.major, prop.minor, static_cast<unsigned long long>(seed), pdl);
}

// Whether --only (one part or a comma-separated list; empty: every part)
// selects `part`.
inline bool selected(const std::string& only, const char* part) {
  return only.empty() || ("," + only + ",").find(std::string(",") + part + ",") != std::string::npos;
}

// Runs one part of a suite when --only selects it and returns its failures:
// an exception (a host reference call refusing its arguments, say) fails
// that part, reported, and the suite goes on to the next instead of
// terminating.
template <class Part>
int run_part(const std::string& only, const char* name, Part&& part) {
  if (!selected(only, name)) return 0;
  try {
    return part();
  } catch (const std::exception& e) {
    std::printf("%s: FAILED with an exception: %s\n", name, e.what());
    return 1;
  }
}

template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_buffer() {
    if (p_) cudaFree(p_);
  }
  T* data() const { return p_; }
  std::size_t size() const { return n_; }
  sh::device_span<T> span() const { return {p_, n_}; }
  void upload(const T* src, std::size_t n) const { CUDA_CHECK(cudaMemcpy(p_, src, n * sizeof(T), cudaMemcpyHostToDevice)); }
  void upload(const std::vector<T>& v) const { upload(v.data(), v.size()); }
  void download(T* dst, std::size_t n) const { CUDA_CHECK(cudaMemcpy(dst, p_, n * sizeof(T), cudaMemcpyDeviceToHost)); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    download(v.data(), n_);
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// 256-byte aligned host memory, as make_state wants.
struct aligned_bytes {
  struct free_deleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, free_deleter> p;
  std::size_t n = 0;
  explicit aligned_bytes(std::size_t bytes) : n(bytes) {
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    p.reset(static_cast<std::byte*>(std::aligned_alloc(256, rounded == 0 ? 256 : rounded)));
    std::memset(p.get(), 0, rounded == 0 ? 256 : rounded);
  }
  std::byte* data() const { return p.get(); }
  sh::host_span<std::byte> span() const { return {p.get(), n}; }
};

template <class T>
T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline __half from_float<__half>(float x) {
  return __float2half(x);
}
template <>
inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

template <class T>
const char* dtype_name();
template <>
inline const char* dtype_name<float>() {
  return "fp32";
}
template <>
inline const char* dtype_name<__half>() {
  return "fp16";
}
template <>
inline const char* dtype_name<__nv_bfloat16>() {
  return "bf16";
}

// Collects the first few mismatches of one check.
struct mismatch_log {
  std::ostringstream text;
  std::size_t count = 0;
  template <class... Parts>
  void add(const Parts&... parts) {
    if (count++ < 5) {
      (text << ... << parts);
      text << "\n";
    }
  }
  bool ok() const { return count == 0; }
};

}  // namespace harness
