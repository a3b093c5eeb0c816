// The compile requests of a Kernel's and a GroupedKernel's code, in one place for the run
// path, ahead-of-time builds (runtime/aot.cpp) and recording (record_kernel).
#pragma once
#include "evtc/grouped.hpp"
#include "evtc/options.hpp"
#include "evtc/runtime.hpp"
#include "jit/kernel_cache.hpp"

namespace evtc::runtime {

// The fused kernel of `graph` (after the pipeline) with `config`.
jit::CompileRequest fused_request(const Graph& graph, const CompileOptions& options, const KernelConfig& config);
// The unfused path's plain epilogue, built for `arch` (evtc/arch.hpp).
// `gemm`, when given, adds what its A and B need (fp8 block scales: the fp32 scaled copies).
jit::CompileRequest fallback_request(const Graph& graph, const KernelSignature& signature, int arch,
                                     const GemmDesc* gemm = nullptr);
// A grouped kernel's code.
jit::CompileRequest grouped_request(const Graph& graph, const GroupedOptions& options, const KernelConfig& config);

// Adds a kernel to the kernel list being recorded (evtc::record_kernels), if one is: a dense
// kernel for problems of m×n×k with `config`, or (grouped) a grouped kernel. Never throws: a
// list that cannot be written is reported once on stderr.
void record_kernel(const Graph& graph, const OptionText& options, bool grouped, int64_t m, int64_t n, int64_t k,
                   const KernelConfig& config);

}  // namespace evtc::runtime
