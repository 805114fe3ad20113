#pragma once
// Small block- and warp-wide collectives the agents share. Every function
// here must be called by all threads of the block (or warp) alike.
#include <cstdint>

namespace scissorhands::cuda::block {

inline constexpr unsigned full_mask = 0xFFFFFFFFu;

// OR of every thread's bits, returned to all threads.
__device__ inline std::uint32_t block_or(std::uint32_t bits) {
  __shared__ std::uint32_t shared_bits;
  __syncthreads();  // a previous call's readers are done
  if (threadIdx.x == 0) shared_bits = 0;
  __syncthreads();
  if (bits) atomicOr(&shared_bits, bits);
  __syncthreads();
  return shared_bits;
}

// Max of every thread's value, returned to all threads.
__device__ inline std::int32_t block_max(std::int32_t value) {
  __shared__ std::int32_t shared_max;
  __syncthreads();
  if (threadIdx.x == 0) shared_max = INT32_MIN;
  __syncthreads();
  atomicMax(&shared_max, value);
  __syncthreads();
  return shared_max;
}

// Butterfly sum over aligned groups of `lanes` lanes (a power of two): every
// lane of a group ends with the group's sum.
template <int Lanes>
__device__ inline float group_sum(float x) {
#pragma unroll
  for (int offset = Lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(full_mask, x, offset);
  return x;
}
__device__ inline float group_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(full_mask, x, offset);
  return x;
}

// A running softmax normaliser: the max m and sum s of exp(x - m).
struct softmax_acc {
  float m = -__builtin_huge_valf();  // -inf
  float s = 0.0f;
  __device__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  __device__ static softmax_acc merge(softmax_acc a, softmax_acc b) {
    if (a.s == 0.0f) return b;
    if (b.s == 0.0f) return a;
    softmax_acc r;
    r.m = a.m > b.m ? a.m : b.m;
    r.s = a.s * expf(a.m - r.m) + b.s * expf(b.m - r.m);
    return r;
  }
};

__device__ inline softmax_acc warp_merge(softmax_acc a) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    softmax_acc o;
    o.m = __shfl_xor_sync(full_mask, a.m, offset);
    o.s = __shfl_xor_sync(full_mask, a.s, offset);
    a = softmax_acc::merge(a, o);
  }
  return a;
}

}  // namespace scissorhands::cuda::block
