// CUTLASS-facing device functors for evtc's ops: the scalar forms of math.cuh lifted to
// cutlass::Array, as Sm90Compute instantiates them (T = cutlass::Array<float, N>).
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>
#include <cutlass/functional.h>

#include "evtc/device/math.cuh"

namespace evtc::device {

// --- elementwise lifting to cutlass::Array ----------------------------------------------

namespace detail {
template <class F, class T>
struct Map1 {
  CUTLASS_HOST_DEVICE T operator()(T const& x) const { return F{}(x); }
};
template <class F, class E, int N>
struct Map1<F, cutlass::Array<E, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& x) const {
    cutlass::Array<E, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = F{}(x[i]);
    return y;
  }
};
template <class F, class T>
struct Map2 {
  CUTLASS_HOST_DEVICE T operator()(T const& a, T const& b) const { return F{}(a, b); }
};
template <class F, class E, int N>
struct Map2<F, cutlass::Array<E, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& a,
                                                      cutlass::Array<E, N> const& b) const {
    cutlass::Array<E, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = F{}(a[i], b[i]);
    return y;
  }
};
template <class F, class T>
struct Map3 {
  CUTLASS_HOST_DEVICE T operator()(T const& a, T const& b, T const& c) const { return F{}(a, b, c); }
};
template <class F, class E, int N>
struct Map3<F, cutlass::Array<E, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& a,
                                                      cutlass::Array<E, N> const& b,
                                                      cutlass::Array<E, N> const& c) const {
    cutlass::Array<E, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = F{}(a[i], b[i], c[i]);
    return y;
  }
};
}  // namespace detail

#define EVTC_UNARY_FN(NAME, EXPR) \
  template <class T>              \
  struct NAME : detail::Map1<NAME##Fn, T> {};
#define EVTC_BINARY_FN(NAME, EXPR) \
  template <class T>               \
  struct NAME : detail::Map2<NAME##Fn, T> {};
#define EVTC_TERNARY_FN(NAME, EXPR) \
  template <class T>                \
  struct NAME : detail::Map3<NAME##Fn, T> {};
#include "evtc/device/op_list.inc"
#undef EVTC_UNARY_FN
#undef EVTC_BINARY_FN
#undef EVTC_TERNARY_FN

// leaky_relu carries its slope as a kernel argument (Sm90Compute passes Arguments last).
// One Arguments type for every T: Sm90Compute takes it from LeakyRelu<float> and passes it
// to LeakyRelu<Array<float, N>>.
struct LeakyReluArguments {
  float alpha = 0.01f;
};
template <class T>
struct LeakyRelu {
  using Arguments = LeakyReluArguments;
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& args) const {
    if constexpr (cutlass::platform::is_same<T, float>::value) {
      return LeakyReluFn{}(x, args.alpha);
    } else {
      T y;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < T::kElements; ++i) y[i] = LeakyReluFn{}(x[i], args.alpha);
      return y;
    }
  }
};

}  // namespace evtc::device
