// The cost model's estimate for a configuration (shared by Kernel and GroupedKernel).
#pragma once
#include "evtc/cost_model.hpp"
#include "evtc/gemm.hpp"
#include "evtc/kernel.hpp"

namespace evtc {

// `out_bytes`: what the fused kernel writes (and reads beyond A and B).
FusionEstimate estimate_for(const KernelConfig& c, const GemmDesc& g, double out_bytes, const UnfusedWork& unfused);

}  // namespace evtc
