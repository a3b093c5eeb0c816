// A plain CUTLASS 2.x GEMM (D = A·B in bf16, CUTLASS's default LinearCombination epilogue)
// (and D = A·B + C, the plain epilogue's way to read an [m,n] tensor) in one configuration of
// evtc's sm_80 backend, for bench/sm80_evt.py: the same main loop as
// evtc's fused kernel of that configuration, so their difference is the visitor tree's cost.
// Built by the benchmark with -DTILE_M/N/K, -DWARP_M/N and -DSTAGES.
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/device/gemm_universal.h>

using Gemm = cutlass::gemm::device::GemmUniversal<
    cutlass::bfloat16_t, cutlass::layout::RowMajor, cutlass::bfloat16_t, cutlass::layout::ColumnMajor,
    cutlass::bfloat16_t, cutlass::layout::RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TILE_M, TILE_N, TILE_K>, cutlass::gemm::GemmShape<WARP_M, WARP_N, TILE_K>,
    cutlass::gemm::GemmShape<16, 8, 16>,
    cutlass::epilogue::thread::LinearCombination<cutlass::bfloat16_t, 8, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, STAGES>;

// D (m×n, row-major) = A (m×k, row-major) · B (k×n, column-major: n rows of k) + beta · C (m×n,
// row-major; read only when beta is not 0). Returns 0 on success.
extern "C" int plain_gemm(int m, int n, int k, const void* a, const void* b, const void* c, float beta, void* d,
                          void* stream) {
  typename Gemm::Arguments args(cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k}, 1, {1.0f, beta}, a, b,
                                beta != 0.0f ? c : d, d, 0, 0, 0, 0, k, k, n, n);
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (gemm.initialize(args, nullptr, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess) return 2;
  return gemm.run(static_cast<cudaStream_t>(stream)) == cutlass::Status::kSuccess ? 0 : 3;
}
