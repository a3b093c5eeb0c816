// The one place that picks a dense kernel's emitter: the backend of the target architecture
// (evtc/arch.hpp's ArchFeatures::backend).
#pragma once
#include "backends/cutlass3/emitter.hpp"

namespace evtc::backend {

// The fused kernel's translation unit for `gemm.sm`: CUTLASS 2.x (sm_80 backend) or 3.x/4.x
// (sm_90a, sm_100a, sm_120a). `config` must suit that backend (config_refusal); a transposed
// configuration (KernelConfig::swap_ab) gets the kernel of the problem evtc::swap_ab makes.
backend::EmittedKernel emit_dense_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config);

}  // namespace evtc::backend
