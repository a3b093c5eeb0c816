// The fallback path's GEMM: cuBLASLt computes the fp32 product that the plain CUDA epilogue
// then reads. For 16-bit A/B any layout and any K works here (no alignment rules beyond the
// element size); fp8 A/B must be K-major with K a multiple of 16 on Hopper, as in the fused
// kernels, so no path runs other fp8 problems (see require_runnable_fp8).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "evtc/types.hpp"

namespace evtc::runtime {

struct MatrixOperand {
  const void* data;
  DType dtype;
  bool row_major;  // else column-major
  int64_t ld;      // leading dimension in elements
};

// d (m×n, row-major, leading dimension n, of d_dtype) = A (m×k) @ B (k×n), accumulated in
// fp32, on `stream`. The fallback path asks for an f32 d; benchmarks ask for the dtype of
// the fused kernel's output, which makes this "the plain cuBLAS GEMM" of the same problem.
// fp8 GEMMs run on Hopper only with both operands K-major (A row-major M×K, B column-major,
// i.e. given as N×K) and K, lda and ldb multiples of 16: throws a UserError that says what
// to change otherwise. Sizes of 0 are not checked. A no-op for 16-bit A/B.
void require_runnable_fp8(DType a_dtype, DType b_dtype, bool a_row_major, bool b_row_major,
                          int64_t k = 0, int64_t lda = 0, int64_t ldb = 0);

void cublaslt_matmul(const MatrixOperand& a, const MatrixOperand& b, void* d, DType d_dtype,
                     int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace evtc::runtime
