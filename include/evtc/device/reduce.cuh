// Final stages of the fused reductions. The fused kernel writes partial results to a
// workspace, each slot by exactly one warp or CTA; these kernels fold the partials in a fixed
// order, so a reduction gives the same bits on every run.
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
struct LogAddExpOp {
  __device__ float operator()(float a, float b) const { return log_add_exp(a, b); }
};
// The logsumexp fold in the form CUTLASS 3.x's reduction visitors take: a class template
// over the value type, float or an array of floats (cutlass::Array: kElements, operator[]).
template <class T>
struct LogAddExpFn {
  __device__ T operator()(T const& a, T const& b) const { return fold(a, b); }
  static __device__ float fold(float a, float b) { return log_add_exp(a, b); }
  template <class Array>
  static __device__ Array fold(Array const& a, Array const& b) {
    Array r;
#pragma unroll
    for (int i = 0; i < int(Array::kElements); ++i) r[i] = log_add_exp(a[i], b[i]);
    return r;
  }
};

// A row logsumexp's partial result in fused kernels (evtc/device/sm90_logsumexp.cuh): the
// value m + log(s). (-inf, 0) is the empty pair.
struct alignas(8) LsePair {
  float m, s;
  __host__ __device__ constexpr LsePair() : m(-__builtin_inff()), s(0.0f) {}
  __host__ __device__ constexpr LsePair(float m_, float s_) : m(m_), s(s_) {}
};
__host__ __device__ inline float lse_pair_value(LsePair p) {
  return p.s == 0.0f ? -__builtin_inff() : p.m + logf(p.s);
}
// (m_hi, s_hi + s_lo e^(m_lo - m_hi)): the empty pair adds nothing, a +inf m wins, a NaN s
// stays NaN. m is never NaN (the fused node never moves m to a NaN).
__device__ __forceinline__ LsePair lse_pair_fold(LsePair a, LsePair b) {
  const bool a_hi = a.m >= b.m;
  const LsePair hi = a_hi ? a : b, lo = a_hi ? b : a;
  const float scale = lo.m == hi.m ? 1.0f : fast_exp(lo.m - hi.m);
  return {hi.m, hi.s + lo.s * scale};
}

// Row logsumexps from pair partials: the fused kernel wrote `parts` rows of pairs, row p at
// partials + 2 * p * stride; out[i] folds pairs p = 0, 1, ... of row i and writes log(s) + m.
template <class Out>
__global__ void reduce_lse_pair_rows(const float* partials, int64_t length, int64_t stride, int64_t parts, Out* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= length) return;
  const LsePair* pairs = reinterpret_cast<const LsePair*>(partials);
  LsePair v{-__builtin_inff(), 0.0f};
  for (int64_t p = 0; p < parts; ++p) v = lse_pair_fold(v, pairs[p * stride + i]);
  out[i] = Out(lse_pair_value(v));
}

// Whole-matrix reductions: folds `count` partials into one output. Launch with one block of a
// multiple of 32 threads (at most 1024).
template <class Op, class Out>
__global__ void reduce_partials(const float* partials, int64_t count, Out* out, float identity) {
  __shared__ float warp_results[32];
  float v = identity;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) v = Op{}(v, partials[i]);
  for (int o = 16; o > 0; o /= 2) v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_results[threadIdx.x] : identity;
    for (int o = 16; o > 0; o /= 2) v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) *out = Out(v);
  }
}

// Row and column reductions: the fused kernel wrote `parts` rows of partial results, row p
// at partials + p * stride (CUTLASS's per-tile reduction buffers: one row of the padded M
// per tile column for a row reduction, one row of the padded N per tile row for a column
// reduction). out[i] folds partials[p * stride + i] in the order p = 0, 1, ...
template <class Op, class Out>
__global__ void reduce_partial_rows(const float* partials, int64_t length, int64_t stride,
                                    int64_t parts, Out* out, float identity) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= length) return;
  float v = identity;
  for (int64_t p = 0; p < parts; ++p) v = Op{}(v, partials[p * stride + i]);
  out[i] = Out(v);
}

}  // namespace evtc::device
