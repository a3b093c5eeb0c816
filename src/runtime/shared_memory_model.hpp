// The shared memory of evtc's warp-specialized (sm90-style) kernels: what an epilogue stages
// per CTA, and the main-loop stages left beside it. Legality's refusal, the default
// configuration and the tuner's pruning all ask this one model.
#pragma once
#include <cstddef>
#include <string>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc {

// CUTLASS's sm90 main loops static_assert at least this many stages.
inline constexpr int kMinMainloopStages = 2;

// Bytes of shared memory the epilogue of `g` stages per CTA with configuration `c`.
size_t epilogue_smem_bytes(const Graph& g, const KernelConfig& c);
// Main-loop stages (an A and a B tile each) that fit beside `epilogue_bytes`.
int mainloop_stages(const KernelConfig& c, const GemmDesc& gemm, size_t epilogue_bytes);

}  // namespace evtc
