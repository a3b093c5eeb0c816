// Row logsumexp for CUTLASS 3.x's column-reduction visitor (Sm90ColReduction), whose fold
// state is one value of its compute type per row and thread: here that value is a pair
// (m, s) standing for log(s) + m, so that each element costs one exp and the fold adds exps
// like a sum instead of taking a log per element.
//
//  - an element x enters as (x, 1) (NumericConverter<LsePair, float>); -inf enters as the
//    empty pair (-inf, 0), which every fold passes over;
//  - two pairs fold to (max m, s_hi + s_lo * e^(m_lo - m_hi)) (LsePairFold), exact up to one
//    exp's and one add's rounding, in any grouping: lanes, warps and tiles combine alike;
//  - a NaN gives (NaN, 1), a +inf gives (inf, 1): both stay through every fold;
//  - each tile writes its rows' pairs to evtc's scratch; finish_reductions folds a row's
//    pairs in tile order and writes m + log(s) (reduce_lse_pair_rows in reduce.cuh).
#pragma once

#include <cutlass/numeric_conversion.h>

#include "evtc/device/reduce.cuh"

namespace evtc::device {

// The fold of a pair into a pair, as the class template CUTLASS's reduction visitors take:
// over LsePair, or an array of them (cutlass::Array: kElements, operator[]).
template <class T>
struct LsePairFold {
  __device__ T operator()(T const& a, T const& b) const { return fold(a, b); }
  static __device__ LsePair fold(LsePair a, LsePair b) { return lse_pair_fold(a, b); }
  template <class Array>
  static __device__ Array fold(Array const& a, Array const& b) {
    Array r;
#pragma unroll
    for (int i = 0; i < int(Array::kElements); ++i) r[i] = lse_pair_fold(a[i], b[i]);
    return r;
  }
};

}  // namespace evtc::device

namespace cutlass {

// An element entering the fold: (x, 1), or the empty pair for -inf (e^-inf adds nothing).
template <FloatRoundStyle Round>
struct NumericConverter<evtc::device::LsePair, float, Round> {
  using result_type = evtc::device::LsePair;
  using source_type = float;
  CUTLASS_HOST_DEVICE static result_type convert(source_type const& x) {
    return x == -cutlass::platform::numeric_limits<float>::infinity() ? result_type{x, 0.0f} : result_type{x, 1.0f};
  }
  CUTLASS_HOST_DEVICE result_type operator()(source_type const& x) const { return convert(x); }
};

// A pair's value: log(s) + m.
template <FloatRoundStyle Round>
struct NumericConverter<float, evtc::device::LsePair, Round> {
  using result_type = float;
  using source_type = evtc::device::LsePair;
  CUTLASS_HOST_DEVICE static result_type convert(source_type const& p) { return evtc::device::lse_pair_value(p); }
  CUTLASS_HOST_DEVICE result_type operator()(source_type const& p) const { return convert(p); }
};

}  // namespace cutlass
