// Emits the plain CUDA epilogue used when fusion is not possible: one thread per output
// element reads the fp32 product (computed by cuBLASLt) and evaluates the whole graph;
// reductions use atomics into fp32 outputs set to their identity by an init kernel first.
// No CUTLASS: it compiles in seconds.
#pragma once
#include <string>

#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::cuda {

// The library exports, besides evtc_abi_version and evtc_kernel_signature:
//   size_t evtc_fallback_scratch_floats(int64_t m, int64_t n)
//   int evtc_fallback_run(const evtc_gemm_args* a, const float* acc, float* scratch, void* stream)
// where acc is the m×n row-major fp32 product, scratch holds evtc_fallback_scratch_floats
// floats (the reductions' fp32 accumulators), and a->d, a->c, a->ptrs, a->scalars are as
// for the fused kernel (a->a, a->b unused).
// A block-scaled fp8 GEMM (GemmDesc::fp8_blockwise, `gemm` given) also exports
//   int evtc_fallback_scale_operands(const evtc_gemm_args* a, float* a32, float* b32, void* stream)
// which writes A·scale_a (m×k, row-major) and B·scale_b (n×k, row-major: B's K-major layout)
// in fp32 for an fp32 GEMM of the block-scaled product.
std::string emit_fallback_kernel(const Graph& g, const KernelSignature& sig, const GemmDesc* gemm = nullptr);

}  // namespace evtc::cuda
