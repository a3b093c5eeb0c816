// The final stage of a whole-matrix reduction in a fused kernel: the epilogue reduced each
// row into M fp32 partials; one block reduces those in a fixed order (so the result is the
// same bits on every run) and writes the scalar output.
#pragma once

#include <cstdint>

#include "evtc/device/math.cuh"

namespace evtc::device {

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return nan_max(a, b); }
};
struct MinOp {
  __device__ float operator()(float a, float b) const { return nan_min(a, b); }
};

// Launch with one block of a multiple of 32 threads (at most 1024).
template <class Op, class Out>
__global__ void reduce_partials(const float* partials, int64_t m, Out* out, float identity) {
  __shared__ float warp_results[32];
  float v = identity;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) v = Op{}(v, partials[i]);
  for (int o = 16; o > 0; o /= 2) v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_results[threadIdx.x] : identity;
    for (int o = 16; o > 0; o /= 2) v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) *out = Out(v);
  }
}

}  // namespace evtc::device
