#pragma once
// Programmatic dependent launch (Hopper and later, compute capability 9.0+).
//
// Every CUDA entry point here is a pair of kernels in stream order: a check
// or a selection, then the work that depends on it (observe: check, then
// observe; compress: select, then compact; select: select, then publish;
// compact and forget: check, then apply). Launched the ordinary way the
// second kernel's blocks are scheduled only once the first has finished:
// a gap of a few microseconds, a large part of compress at m = 1. With
// programmatic dependent launch the second kernel is launched while the
// first runs, and each of its blocks waits on the device (PTX
// griddepcontrol.wait, before it touches memory) until the first has
// finished and its writes are visible: the same results, minus the gap.
//
// Off by default until it has been measured on a GPU (bench/RESULTS.md).
// Set the environment variable SCISSORHANDS_PDL=1 (read once a process) to
// turn it on: the second kernels are then launched with cudaLaunchKernelEx
// and cudaLaunchAttributeProgrammaticStreamSerialization on devices of
// compute capability 9.0 or more, the ordinary way on older ones and for a
// kernel whose code the device runs was compiled from PTX below compute_90
// (its wait is compiled out: kernel_waits_on_device). Capturing
// it into a CUDA graph needs CUDA 12.3 or later (programmatic edges). The
// first kernel of a call is always launched the ordinary way, so nothing
// of the engine's that precedes a call can overlap it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace scissorhands::cuda {

// Whether SCISSORHANDS_PDL=1 was set when the library first looked (the
// first call of the process).
inline bool programmatic_launch_requested() {
  static const bool requested = [] {
    const char* value = std::getenv("SCISSORHANDS_PDL");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return requested;
}

namespace detail {

// Whether `kernel`, as the current device runs it, was compiled from PTX for
// compute capability 9.0 or more, so that its wait_for_first_kernel() is
// the griddepcontrol.wait a programmatic launch relies on. An engine built
// with compute_80 PTX only (JIT-compiled on an H100) has the wait compiled
// out, and must get the ordinary launch. Asked once per kernel and device
// (a thread's own list: no lock).
inline bool kernel_waits_on_device(const void* kernel, int device) {
  struct known_kernel {
    const void* kernel;
    int device;
    bool waits;
  };
  thread_local std::vector<known_kernel> known;
  for (const known_kernel& k : known)
    if (k.kernel == kernel && k.device == device) return k.waits;
  cudaFuncAttributes attributes{};
  const bool waits = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
  known.push_back({kernel, device, waits});
  return waits;
}

// Requested, the current device can (asked on each call: the engine may
// switch devices between calls), and `kernel` waits on the device.
inline bool programmatic_launch(const void* kernel) {
  if (!programmatic_launch_requested()) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 9 && kernel_waits_on_device(kernel, device);
}

// Launches `kernel` programmatically dependent on the kernel before it in
// `stream` (cudaLaunchAttributeProgrammaticStreamSerialization): its blocks
// may start while that kernel runs and must wait_for_first_kernel() before
// touching memory. Needs compute capability 9.0 or more. A launch error is
// left for the caller's cudaPeekAtLastError, as with <<<>>>.
template <class... Params, class... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Launches the second kernel of a call: programmatically dependent on the
// kernel before it when programmatic_launch(kernel) says so, else the
// ordinary way.
template <class... Params, class... Args>
void launch_second(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  if (programmatic_launch(reinterpret_cast<const void*>(kernel)))
    launch_programmatic(kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
  else
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
}

// First kernel of a call: lets the second be scheduled now (its blocks wait
// for this grid's end anyway). A no-op before sm_90 and when the second is
// launched the ordinary way.
__device__ inline void allow_second_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Second kernel of a call, before any memory access: waits until the first
// has finished and its writes are visible. A no-op before sm_90 and when
// launched the ordinary way (stream order has already waited).
__device__ inline void wait_for_first_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace detail
}  // namespace scissorhands::cuda
