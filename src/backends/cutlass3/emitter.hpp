// Emits a CUDA translation unit that instantiates one CUTLASS 3.x/4.x TMA warp-specialised
// GEMM whose epilogue is the graph, as an Epilogue Visitor Tree, and exports evtc's C ABI
// (include/evtc/device/abi.h): the core every CUTLASS 3.x backend shares. What differs per
// architecture (sm_90a, sm_100a, sm_120a) is its Target (cutlass3/target.hpp), in the
// architecture's own folder.
//
// Lowering (see plan_visitors in the .cpp):
//  - a graph whose values are each used once and that has one output becomes nested
//    Sm90EVT trees;
//  - otherwise the shared values, the extra outputs and the main output become the ops of
//    one Sm90TopologicalVisitor, each op being a nested tree of the values only it uses.
// Cheap leaves (acc, C, broadcasts, aux loads) are re-read at each use rather than shared.
#pragma once
#include <string>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "backends/emitted_kernel.hpp"
#include "backends/visitor_lowering.hpp"

namespace evtc::cutlass3 {

// `g` must have been through the pass pipeline and be legal for `gemm` on its architecture
// (gemm.sm, whose backend picks the Target).
backend::EmittedKernel emit_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config);
// A configuration with K in parts (KernelConfig::k_parts): the GEMM writes the parts' fp32
// products (swap-AB applied to it alone), and a second kernel, the plain epilogue of `g`
// (cuda::epilogue_device_code), adds them and evaluates `g` in the caller's M×N.
backend::EmittedKernel emit_parts_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config);

// What a visitor tree is built for: the dense GEMM, or the grouped (ptr-array) GEMM whose
// tiles carry their group as the L coordinate (per-group row vectors and scalar pointers
// then step by `a.group_strides[slot]` per group).
enum class EpilogueTarget { dense, grouped };

// The epilogue visitor tree of a graph without the GEMM around it: the `using Vk = ...`
// declarations (they name TileShape and EpilogueDescriptor, which the assembler defines
// before them), the root visitor's type and an expression of its Arguments over an ABI
// struct `a` with fields `ptrs`, `scalars` (and `group_strides` and `ldy` when grouped, plus
// the group tables `t` whose `ptr_y` holds each group's first output row: a gated [m,n/2]
// output's Sm90HalfStore writes through it).
struct EpilogueVisitors {
  std::string declarations;
  std::string root_type;
  std::string root_args;
  KernelSignature signature;
};
EpilogueVisitors emit_epilogue_visitors(const Graph& g, const GemmDesc& gemm,
                                        const KernelConfig& config, EpilogueTarget target);


}  // namespace evtc::cutlass3
