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

// The plain epilogue's device code and launch helpers, for a library of its own (above) or one
// that computes the product itself (a fused kernel with K in parts, KernelConfig::k_parts): in
// namespace evtc_plain, Params, params_of(args, m, n, scratch), scratch_floats(m, n) and
// epilogue_blocks(m, n, threads, sms); the kernels, with C names so that a library built in two
// parts finds them in its cubin (compiled unless EVTC_PART is 2):
//   evtc_plain_epilogue(Params, const float* acc, int64_t part_stride)
// evaluates the graph on the sum of `parts` m×n row-major fp32 products part_stride floats apart
// (all loaded, then added in order; it first waits for a grid it is a programmatic dependent of),
// and evtc_plain_init_reductions / evtc_plain_finish_reductions(Params) set the
// reductions' fp32 accumulators to their identities and write them out.
std::string epilogue_device_code(const Graph& g, const KernelSignature& sig, int parts);

}  // namespace evtc::cuda
