// What the GEMM around an epilogue looks like: shapes, operand dtypes and layouts.
#pragma once
#include <cstdint>
#include <optional>

#include "evtc/graph.hpp"
#include "evtc/types.hpp"

namespace evtc {

// D[m,n] = epilogue(A[m,k] @ B[k,n], ...).
// A row-major is K-major (the layout Hopper's tensor cores read natively); B column-major
// (i.e. B given as an N×K row-major matrix, like nn.Linear's weight) is K-major.
struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;  // 0: not known yet (checked at run time)
  DType a_dtype = DType::bf16;
  DType b_dtype = DType::bf16;
  Layout a_layout = Layout::row_major;
  Layout b_layout = Layout::col_major;
  // fp8 A/B only (ignored otherwise): accumulate in the tensor cores throughout K (CUTLASS's
  // FP8FastAccum main loop, PyTorch's use_fast_accum=True) instead of the default two-level
  // accumulation, which adds the tensor cores' partial sums into fp32 registers every 128 of
  // K. Faster, and less accurate for long K.
  bool fp8_fast_accum = false;
  // The target architecture (compute capability × 10; 90 = Hopper, sm_90a). Kernel and
  // GroupedKernel set it from evtc::target_arch (evtc/arch.hpp): CompileOptions::arch,
  // EVTC_ARCH or the current device.
  int sm = 90;
};

// The layout of a rows×cols matrix view (strides in elements): row-major when its columns
// are adjacent, column-major when its rows are, nullopt when neither (a copy is needed).
std::optional<Layout> matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

}  // namespace evtc
