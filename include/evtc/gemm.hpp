// What the GEMM around an epilogue looks like: shapes, operand dtypes and layouts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

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
  // fp8 A/B only: block-scaled operands in DeepSeek-V3's format, applied inside the main loop
  // (the accumulator the epilogue sees is already scaled). A has one f32 scale per row and
  // 128 of K, given as an M × ceil(K/128) matrix whose M is adjacent (column-major, PyTorch's
  // 1×128 layout); B one per 128×128 block, given as a ceil(K/128) × ceil(N/128) row-major
  // matrix. Each 128-wide K block's partial product is multiplied by its two scales and added
  // in fp32. Excludes fp8_fast_accum. Arguments::scale_a / scale_b carry the scales.
  bool fp8_blockwise = false;
  // The target architecture (compute capability × 10; 90 = Hopper, sm_90a). Kernel and
  // GroupedKernel set it from evtc::target_arch (evtc/arch.hpp): CompileOptions::arch,
  // EVTC_ARCH or the current device.
  int sm = 90;
};

// The layout of a rows×cols matrix view (strides in elements): row-major when its columns
// are adjacent, column-major when its rows are, nullopt when neither (a copy is needed).
// The K (and N) extent of one block of fp8_blockwise's scales.
inline constexpr int64_t kFp8ScaleBlock = 128;
// ceil(x / kFp8ScaleBlock): the number of scale blocks along an extent.
inline constexpr int64_t fp8_scale_blocks(int64_t x) { return (x + kFp8ScaleBlock - 1) / kFp8ScaleBlock; }

// Why `gemm` cannot be block-scaled (empty when it can, or when it is not block-scaled): the
// one rule every front end checks, with the text of its UserError.
std::string fp8_blockwise_refusal(const GemmDesc& gemm);

std::optional<Layout> matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

}  // namespace evtc
