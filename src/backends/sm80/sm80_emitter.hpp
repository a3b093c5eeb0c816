// Emits a CUDA translation unit that instantiates one CUTLASS 2.x multistage (cp.async +
// mma.sync) GEMM whose epilogue is the graph, as CUTLASS 2.x's epilogue visitor tree
// (Sm80EVT / Sm80TopologicalVisitor over the OutputTileThreadLayout thread map), and exports
// evtc's C ABI (include/evtc/device/abi.h). The visitor plan is the shared one
// (backends/visitor_lowering.hpp); every output, D included, is a store node of the tree.
#pragma once
#include <string>

#include "backends/emitted_kernel.hpp"
#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::sm80 {

// The warp tile of a multistage configuration's CTA tile: 64×64 warps for tiles of 128 rows
// and columns or more (4 or 8 warps), 32×64 for 64-row ones, 32×32 for 64×64.
struct WarpShape {
  int m, n;
};
WarpShape warp_shape(const KernelConfig& config);

// `g` must have been through the pass pipeline and be legal for `gemm` on an sm_80-backend
// architecture; `config` a multistage one.
backend::EmittedKernel emit_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config);

}  // namespace evtc::sm80
