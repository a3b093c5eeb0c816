// Emits a CUDA translation unit for a grouped (MoE) GEMM with a fused epilogue: CUTLASS's
// Sm90 ptr-array kernel over cutlass::gemm::GroupProblemShape, whose per-group problem
// shapes, pointers and strides a small kernel of the same library builds on the device from
// the groups' end offsets. It exports the C ABI of include/evtc/device/grouped_abi.h.
//
// The epilogue's visitor tree is built by the dense emitter's node emission
// (emit_epilogue_visitors with EpilogueTarget::grouped); only the GEMM around it differs.
#pragma once
#include <string>
#include <vector>

#include "backends/cutlass3/emitter.hpp"

namespace evtc::sm90 {

// The grouped kernel's one output: the [m,n] main output, else a gated [m,n/2] output (a
// half store, written from registers through per-group pointers); empty if neither.
std::string grouped_output_name(const Graph& g);

// Why `g` (after the pass pipeline) cannot be a grouped kernel for `gemm`, one reason per
// operand or output at fault; empty when it can.
std::vector<std::string> grouped_refusals(const Graph& g, const GemmDesc& gemm);

// `g` must have no grouped_refusals.
backend::EmittedKernel emit_grouped_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config);

}  // namespace evtc::sm90
