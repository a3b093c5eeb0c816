// The fallback path's GEMM: cuBLASLt computes the fp32 product that the plain CUDA epilogue
// then reads. Any layout and any K works here (no alignment rules beyond the element size).
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
void cublaslt_matmul(const MatrixOperand& a, const MatrixOperand& b, void* d, DType d_dtype,
                     int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace evtc::runtime
