// Scalar float forms of evtc's ops, shared by the CUTLASS epilogues (through ops.cuh) and
// the plain CUDA fallback epilogue. Plain CUDA: no CUTLASS needed.
//
// Accuracy: by default the transcendental ops use the GPU's fast hardware forms, which is
// what makes a fused epilogue cheap enough to hide behind the main loop:
//   tanh      tanh.approx.f32: max relative error about 2^-11 (below bf16's 2^-8 rounding)
//   sigmoid   0.5 * tanh.approx(0.5 x) + 0.5: absolute error about 2^-12
//   silu      x * sigmoid(x) with the above; gelu_tanh with tanh.approx;
//   exp, log  ex2.approx / lg2.approx (__expf, __logf): relative error about 2^-21
// Define EVTC_PRECISE_MATH (evtc's `precise` kernel option) for the full-precision forms
// (expf, logf, tanhf and IEEE division). gelu (erf form) uses erff in both modes.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define EVTC_HD __host__ __device__ __forceinline__
#else
#define EVTC_HD inline
#endif

namespace evtc::device {

// --- scalar math ------------------------------------------------------------------------

EVTC_HD float fast_tanh(float x) {
#if defined(__CUDA_ARCH__) && !defined(EVTC_PRECISE_MATH)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return ::tanhf(x);
#endif
}

EVTC_HD float fast_exp(float x) {
#if defined(__CUDA_ARCH__) && !defined(EVTC_PRECISE_MATH)
  return __expf(x);
#else
  return ::expf(x);
#endif
}

EVTC_HD float fast_log(float x) {
#if defined(__CUDA_ARCH__) && !defined(EVTC_PRECISE_MATH)
  return __logf(x);
#else
  return ::logf(x);
#endif
}

EVTC_HD float fast_div(float a, float b) {
#if defined(__CUDA_ARCH__) && !defined(EVTC_PRECISE_MATH)
  return __fdividef(a, b);
#else
  return a / b;
#endif
}

EVTC_HD float sigmoid_f(float x) {
#if !defined(EVTC_PRECISE_MATH)
  return 0.5f * fast_tanh(0.5f * x) + 0.5f;
#else
  return 1.0f / (1.0f + ::expf(-x));
#endif
}

EVTC_HD float softplus_f(float x) {
  // log(1 + e^x), linear above 20 like PyTorch.
  return x > 20.0f ? x : ::log1pf(fast_exp(x));
}

EVTC_HD float nan_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
EVTC_HD float nan_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }

// One functor per op of the op table (src/ir/ops.cpp, column cuda_functor + "Fn").
#define EVTC_UNARY_FN(NAME, EXPR) \
  struct NAME##Fn {               \
    EVTC_HD float operator()(float x) const { return EXPR; } \
  };
#define EVTC_BINARY_FN(NAME, EXPR) \
  struct NAME##Fn {                \
    EVTC_HD float operator()(float a, float b) const { return EXPR; } \
  };
#define EVTC_TERNARY_FN(NAME, EXPR) \
  struct NAME##Fn {                 \
    EVTC_HD float operator()(float a, float b, float c) const { return EXPR; } \
  };
#include "evtc/device/op_list.inc"
#undef EVTC_UNARY_FN
#undef EVTC_BINARY_FN
#undef EVTC_TERNARY_FN

struct LeakyReluFn {
  EVTC_HD float operator()(float x, float alpha) const { return x > 0.0f ? x : x * alpha; }
};

}  // namespace evtc::device
