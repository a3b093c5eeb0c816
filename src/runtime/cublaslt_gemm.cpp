#include "runtime/cublaslt_gemm.hpp"

#include <cublasLt.h>
#include <fmt/format.h>

#include <mutex>

#include "evtc/error.hpp"

namespace evtc::runtime {
namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw RuntimeError(fmt::format("cuBLASLt {} failed: {}", what, cublasLtGetStatusString(s)));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    case DType::i32: return CUDA_R_32I;
    case DType::i64: return CUDA_R_64I;
  }
  return CUDA_R_32F;
}

cublasLtHandle_t handle() {
  static std::once_flag once;
  static cublasLtHandle_t h = nullptr;
  std::call_once(once, [] { check(cublasLtCreate(&h), "create"); });
  return h;
}

}  // namespace

void require_runnable_fp8(DType a_dtype, DType b_dtype, bool a_row_major, bool b_row_major,
                          int64_t k, int64_t lda, int64_t ldb) {
  if (!is_fp8(a_dtype) && !is_fp8(b_dtype)) return;
  std::string why;
  if (!a_row_major) why += "; A is column-major: pass A as a row-major M×K matrix";
  if (b_row_major)
    why += "; B is row-major K×N: pass B column-major, i.e. the N×K matrix transposed (for a "
           "PyTorch weight w of shape (N, K), w.t())";
  for (auto [what, v] : {std::pair{"K", k}, std::pair{"the leading dimension of A", lda},
                         std::pair{"the leading dimension of B", ldb}})
    if (v != 0 && v % 16 != 0) why += fmt::format("; {} is {}, not a multiple of 16", what, v);
  if (!why.empty())
    throw UserError("fp8 A and B must both be K-major with 16-byte rows (Hopper's fp8 tensor "
                    "cores and cuBLASLt's fp8 GEMM read only that)" + why);
}

void cublaslt_matmul(const MatrixOperand& a, const MatrixOperand& b, void* d, DType d_dtype,
                     int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // Row-major acc (m×n) is column-major acc^T (n×m) = B^T (n×k) · A^T (k×m): pass B first.
  // A row-major M×K with ld is, read column-major, the K×M matrix A^T: no transpose needed.
  const cublasOperation_t op_b = b.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t op_a = a.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lb = nullptr, la = nullptr, lc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
  struct Cleanup {
    cublasLtMatmulDesc_t& d;
    cublasLtMatrixLayout_t &x, &y, &z;
    ~Cleanup() {
      if (x) cublasLtMatrixLayoutDestroy(x);
      if (y) cublasLtMatrixLayoutDestroy(y);
      if (z) cublasLtMatrixLayoutDestroy(z);
      if (d) cublasLtMatmulDescDestroy(d);
    }
  } cleanup{desc, lb, la, lc};
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)), "attribute");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)), "attribute");
  // First operand: n×k after op. Stored (column-major view) as n×k if not transposed, else k×n.
  check(cublasLtMatrixLayoutCreate(&lb, cuda_type(b.dtype), op_b == CUBLAS_OP_N ? n : k,
                                   op_b == CUBLAS_OP_N ? k : n, b.ld),
        "layout of B");
  check(cublasLtMatrixLayoutCreate(&la, cuda_type(a.dtype), op_a == CUBLAS_OP_N ? k : m,
                                   op_a == CUBLAS_OP_N ? m : k, a.ld),
        "layout of A");
  check(cublasLtMatrixLayoutCreate(&lc, cuda_type(d_dtype), n, m, n), "layout of the product");
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(handle(), desc, &alpha, b.data, lb, a.data, la, &beta, d, lc, d, lc,
                       nullptr, nullptr, 0, stream),
        "matmul");
}

}  // namespace evtc::runtime
