// Scalar float forms of evtc's ops, shared by the CUTLASS epilogues (through ops.cuh) and
// the plain CUDA fallback epilogue. Plain CUDA: no CUTLASS needed.
//
// Accuracy: by default the transcendental ops use the GPU's fast hardware forms, which is
// what makes a fused epilogue cheap enough to hide behind the main loop:
//   tanh      tanh.approx.f32: max relative error about 2^-11 (below bf16's 2^-8 rounding)
//   sigmoid   0.5 * tanh.approx(0.5 x) + 0.5: absolute error about 2^-12
//   silu      x * sigmoid(x) with the above; gelu_tanh with tanh.approx;
//   exp, log  ex2.approx / lg2.approx (__expf, __logf): relative error about 2^-21
//   gelu      (erf form) x * sigmoid(x * p(x^2)), p a fitted quadratic, with the sigmoid
//             above: one tanh.approx like silu (erff costs about three times as much, which
//             showed in fp8 GEMMs: +27 % over the plain GEMM against silu's +8 %). p makes the
//             form differ from erf's GELU by at most 2.6e-5; with the sigmoid's error the
//             absolute error is at most about 2.6e-5 + |x| * 2^-12.
// Define EVTC_PRECISE_MATH (evtc's `precise` kernel option) for the full-precision forms
// (expf, logf, tanhf, erff and IEEE division). erf itself uses erff in both modes.
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

// GELU, erf form: 0.5 x (1 + erf(x / sqrt 2)).
EVTC_HD float gelu_f(float x) {
#if !defined(EVTC_PRECISE_MATH)
  // x * sigmoid(x * p(x^2)): p's coefficients fitted to erf's GELU on |x| <= 5.5 (maximum
  // error 2.6e-5); x^2 is clamped at 30, where p is still increasing and the sigmoid is 1
  // (or 0) to float precision, so that p's negative x^4 term never turns it around.
  const float x2 = fminf(x * x, 30.0f);
  const float p = 1.59501394f + x2 * (0.0740142853f - 0.000703654893f * x2);
  return x * sigmoid_f(x * p);
#else
  return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f));
#endif
}

EVTC_HD float softplus_f(float x) {
  // log(1 + e^x), linear above 20 like PyTorch.
  return x > 20.0f ? x : ::log1pf(fast_exp(x));
}

EVTC_HD float nan_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
EVTC_HD float nan_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
// log(e^a + e^b), the logsumexp fold: the larger plus the log of 1 + the smaller's share, so
// nothing overflows. A NaN in either gives NaN, both -inf give -inf, a +inf gives +inf. Each
// fold is off by about 2^-21 of the smaller value's share (the fast exp's error) and the add's
// rounding.
EVTC_HD float log_add_exp(float a, float b) {
  if (a != a || b != b) return a + b;
  const float hi = fmaxf(a, b), lo = fminf(a, b);
  if (hi == __builtin_inff() || hi == -__builtin_inff()) return hi;
  // log1pf, not log(1 + e): the increments are small, and a fold adds up their errors.
  return hi + ::log1pf(fast_exp(lo - hi));
}

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
