#pragma once
// Helpers of the CUDA differential test: device buffers, aligned host
// buffers, element conversion, failure reporting.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <scissorhands/scissorhands.cuh>

namespace harness {

namespace sh = scissorhands;
constexpr auto host_space = sh::memory_space::host;
constexpr auto device_space = sh::memory_space::device;

// A host-only run (--host-only; CTest's cuda.*.host_only entries, in CI
// on machines without a GPU) hides every device from the CUDA runtime and
// keeps "device" buffers in host memory: every kernel launch and copy
// fails, and its error is ignored. What still runs is everything the host
// decides: the CUDA API's argument checks (each invalid_argument a test
// expects, and none it does not), the host reference of every
// configuration, and the test's own set-up. A check of what the device
// computed is void there (device_fact); a check the host decides alone
// counts in every run. It catches a test made stale by a host change (a
// reference call that now refuses a configuration the test draws) before
// a GPU run does.
inline bool& host_only_run() {
  static bool on = false;
  return on;
}

// A check of the device's results: void (true) in a host-only run.
inline bool device_fact(bool ok) { return ok || host_only_run(); }

// A CUDA runtime error ends the run: it is never a data mismatch. (In a
// host-only run every one is expected: no device.)
inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess && !host_only_run()) {
    std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, cudaGetErrorString(err));
    std::exit(1);
  }
}
#define CUDA_CHECK(expr) ::harness::check_cuda((expr), #expr, __FILE__, __LINE__)

// Starts a suite: a host-only run hides the devices (before the runtime's
// first call reads CUDA_VISIBLE_DEVICES) and refuses to go on if one is
// still visible, since a kernel given host pointers would fault; any other
// run exits 77 (CTest: skipped) without a device, and prints the device,
// the seed, and whether the second kernel of each call is launched
// programmatically dependent on the first (SCISSORHANDS_PDL=1 on sm_90+
// with kernels compiled for it, cuda/launch.cuh).
inline void start(const char* binary, std::uint64_t seed, bool host_only) {
  int count = 0;
  if (host_only) {
    host_only_run() = true;
    ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
      std::fprintf(stderr, "%s --host-only: %d CUDA device(s) still visible: refusing to run\n", binary, count);
      std::exit(2);
    }
    std::printf("%s: host-only run (no device; checks of device results void), seed %llu\n", binary,
                static_cast<unsigned long long>(seed));
    return;
  }
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device (%s): skipping\n", binary,
                err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    std::exit(77);
  }
  cudaDeviceProp prop{};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // The library's own decision, for a second kernel of this binary (every
  // one is compiled for the same architectures).
  const bool programmatic =
      sh::cuda::detail::programmatic_launch(reinterpret_cast<const void*>(&sh::cuda::detail::compact_kernel<>));
  const char* off_here = "requested, off here (sm < 90, or kernels from PTX below compute_90)";
  const char* pdl = !sh::cuda::programmatic_launch_requested() ? "off" : programmatic ? "on" : off_here;
  std::printf("device %d: %s (sm_%d%d), seed %llu, programmatic dependent launch (SCISSORHANDS_PDL=1): %s\n", device,
              prop.name, prop.major, prop.minor, static_cast<unsigned long long>(seed), pdl);
}

// The command line of both binaries: --configs N, --seed S, --only LIST,
// --quick, --long N, --host-only, and what `extra(option, next)` takes (it
// returns whether it took `option`; next() reads its value). Anything else
// prints "usage: <binary> <usage>" and exits 2.
struct suite_options {
  int configs = 0, long_first = 0;
  std::uint64_t seed = 20230517;
  std::string only;
  bool quick = false, host_only = false;
};
template <class Extra>
suite_options parse_options(int argc, char** argv, int configs, const char* usage, Extra&& extra) {
  suite_options o;
  o.configs = configs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--configs") o.configs = std::stoi(next());
    else if (a == "--seed") o.seed = std::stoull(next());
    else if (a == "--only") o.only = next();
    else if (a == "--quick") o.quick = true;
    else if (a == "--host-only") o.host_only = true;
    else if (a == "--long") o.long_first = std::stoi(next());
    else if (!extra(a, next)) {
      std::fprintf(stderr, "usage: %s %s\n", argv[0], usage);
      std::exit(2);
    }
  }
  return o;
}

// Ends a suite: prints its verdict and returns its exit status.
inline int finish(int failures) {
  std::printf(failures == 0 ? "all passed\n" : "%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
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
    if (n_ == 0) return;
    if (host_only_run())
      p_ = static_cast<T*>(host_allocate(n_ * sizeof(T)));
    else
      CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
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
    if (p_ == nullptr) return;
    if (host_only_run())
      std::free(p_);
    else
      cudaFree(p_);
  }
  T* data() const { return p_; }
  std::size_t size() const { return n_; }
  sh::device_span<T> span() const { return {p_, n_}; }
  void upload(const T* src, std::size_t n) const { copy(p_, src, n, cudaMemcpyHostToDevice); }
  void upload(const std::vector<T>& v) const { upload(v.data(), v.size()); }
  void download(T* dst, std::size_t n) const { copy(dst, p_, n, cudaMemcpyDeviceToHost); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    download(v.data(), n_);
    return v;
  }

 private:
  // A host-only run's buffers live in host memory: set-up and read-back
  // work, only the device's part is missing.
  static void* host_allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return p;
  }
  static void copy(T* dst, const T* src, std::size_t n, cudaMemcpyKind kind) {
    if (n == 0) return;
    if (host_only_run())
      std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), n * sizeof(T));
    else
      CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(T), kind));
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// A host array of uniform(-1, 1) draws, uploaded to its device twin.
inline void fill_uploaded(std::vector<float>& h, const device_buffer<float>& d, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  h.resize(d.size());
  for (auto& x : h) x = u(rng);
  d.upload(h);
}

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

// Bitwise equality (NaN-safe).
template <class X>
bool same_bits(const X& a, const X& b) {
  return std::memcmp(&a, &b, sizeof(X)) == 0;
}

// The natural log-sum-exp of scale * dot(t) over keys t < visible, in
// double: what an attention kernel returns beside its output. dot(t) is the
// query's dot product with key t, in whatever precision the caller reads K.
template <class Dot>
double reference_lse(int visible, double scale, Dot&& dot) {
  std::vector<double> logits(static_cast<std::size_t>(visible));
  double most = -std::numeric_limits<double>::infinity();
  for (int t = 0; t < visible; ++t) {
    logits[static_cast<std::size_t>(t)] = dot(t) * scale;
    most = std::max(most, logits[static_cast<std::size_t>(t)]);
  }
  double sum = 0.0;
  for (const double l : logits) sum += std::exp(l - most);
  return most + std::log(sum);
}

// Collects the first few mismatches of one check. add: a difference in
// what the device computed (void in a host-only run); add_host: a failure
// the host decides alone (an exception of a reference call), always.
struct mismatch_log {
  std::ostringstream text;
  std::size_t count = 0;
  template <class... Parts>
  void add(const Parts&... parts) {
    if (!host_only_run()) add_host(parts...);
  }
  template <class... Parts>
  void add_host(const Parts&... parts) {
    if (count++ < 5) {
      (text << ... << parts);
      text << "\n";
    }
  }
  bool ok() const { return count == 0; }
};

// The checks of one part, each failure printed as it happens. device: a
// check of what the device computed (void in a host-only run); host: one
// the host decides alone (a refusal thrown), counted in every run.
struct check_tally {
  const char* part;
  int run = 0, failed = 0;
  void host(bool ok, const std::string& what) {
    ++run;
    if (!ok) {
      ++failed;
      std::printf("FAIL %s: %s\n", part, what.c_str());
    }
  }
  void device(bool ok, const std::string& what) { host(device_fact(ok), what); }
  // `call` must refuse on the host: throw invalid_argument naming
  // `argument` (another argument's refusal would hide a missing check).
  template <class Call>
  void refuses(const std::string& what, const std::string& argument, Call&& call) {
    std::string got = "nothing thrown";
    try {
      (void)call();
    } catch (const sh::invalid_argument& e) {
      got = e.argument() == argument ? "" : std::string("another argument refused: ") + e.what();
    }
    host(got.empty(), what + ": throws invalid_argument naming '" + argument + "'" + (got.empty() ? "" : "; " + got));
  }
  // Prints "<part>: P of N checks passed" and returns the failures.
  int report() const {
    std::printf("%s: %d of %d checks passed\n", part, run - failed, run);
    return failed;
  }
};

}  // namespace harness
