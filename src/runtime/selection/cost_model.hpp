// The cost model's estimate for a configuration (shared by Kernel and GroupedKernel).
#pragma once
#include "evtc/cost_model.hpp"
#include "evtc/gemm.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc {

// `epilogue_bytes`: what the fused kernel's epilogue writes and reads ([m,n] operands);
// `extra_ab_bytes`: main-loop reads beyond one A and one B (a grouped GEMM's other weights).
FusionEstimate estimate_for(const KernelConfig& c, const GemmDesc& g, double epilogue_bytes, double extra_ab_bytes,
                            const UnfusedWork& unfused);

// The GEMMs of a grouped chain's unfused path, torch._grouped_mm (a CUTLASS ptr-array kernel),
// for the dense-equivalent problem `g` (total rows × N × K); `extra_ab_bytes` as above;
// `gemms` side by side over N (UnfusedWork::gemms).
double grouped_mm_us(const GemmDesc& g, double extra_ab_bytes, int gemms);

}  // namespace evtc
