#pragma once
// Build-wide macros. Headers ending in .hpp compile with a plain C++20
// compiler; under nvcc the same functions become __host__ __device__.

#define SCISSORHANDS_VERSION_MAJOR 0
#define SCISSORHANDS_VERSION_MINOR 1
#define SCISSORHANDS_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SCISSORHANDS_HOST_DEVICE __host__ __device__
#define SCISSORHANDS_DEVICE __device__
#else
#define SCISSORHANDS_HOST_DEVICE
#define SCISSORHANDS_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define SCISSORHANDS_ON_DEVICE 1
#else
#define SCISSORHANDS_ON_DEVICE 0
#endif

// Unrolls the next loop in device code. Host and device functions use it:
// a host compiler would warn on an unknown `#pragma unroll`.
#if SCISSORHANDS_ON_DEVICE
#define SCISSORHANDS_UNROLL _Pragma("unroll")
#else
#define SCISSORHANDS_UNROLL
#endif

// Keeps a host function out of line where inlining would cost its
// vectorisation (host/observe.hpp says where); a no-op elsewhere.
#if defined(__GNUC__) || defined(__clang__)
#define SCISSORHANDS_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define SCISSORHANDS_NOINLINE __declspec(noinline)
#else
#define SCISSORHANDS_NOINLINE
#endif
