// The cost model's estimate for a configuration (shared by Kernel and GroupedKernel).
#pragma once
#include "evtc/cost_model.hpp"
#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "runtime/selection/default_config.hpp"

namespace evtc {

// The share of the epilogue's own traffic (outputs written, [m,n] operands read) that the
// main loop does not hide: each tile's epilogue runs after its main loop (cooperative) or
// beside the other warp group's (ping-pong), and its loads and stores then compete with the
// next tile's. Fitted to fused kernels timed alone on the H200 (one and two bf16 outputs, an
// f32 operand and output; docs/backend.md, "Cost model"): within about 15 %.
inline constexpr double kEpilogueExposed = 0.5;

// The share of the epilogue's traffic left exposed for the epilogue `g` on the problem `gemm`:
// kEpilogueExposed, or all of it for an epilogue moving two or more 16-bit [m,n] tensors besides
// D on a problem of at least kLargeEpilogueElements elements (cost_model.cpp says what was measured).
inline constexpr double kLargeEpilogueElements = 64.0 * 1024 * 1024;
double epilogue_exposed_share(const Graph& g, const GemmDesc& gemm);

// `epilogue_bytes`: what the fused kernel's epilogue writes and reads ([m,n] operands);
// `extra_ab_bytes`: main-loop reads beyond one A and one B (a grouped GEMM's other weights);
// `exposed`: the share of `epilogue_bytes` the main loop does not hide.
FusionEstimate estimate_for(const KernelConfig& c, const GemmDesc& g, double epilogue_bytes, double extra_ab_bytes,
                            const UnfusedWork& unfused, double exposed = kEpilogueExposed);

// The GEMMs of a grouped chain's unfused path, torch._grouped_mm (a CUTLASS ptr-array kernel),
// for the dense-equivalent problem `g` (total rows × N × K); `extra_ab_bytes` as above;
// `gemms` side by side over N (UnfusedWork::gemms).
double grouped_mm_us(const GemmDesc& g, double extra_ab_bytes, int gemms);

namespace selection {
// The cost model's margin: a kernel taking `fused_us` is worth running instead of work taking
// `unfused_us` (FusionEstimate::profitable; the tables' entries for GEMMs with nothing to fuse).
bool ahead_by_margin(double fused_us, double unfused_us);
// Whether the table choice `t` for the problem `g` rests on a measurement that holds at `g`
// (FusionEstimate::measured): `g`'s own entry; or the entry's configuration unchanged, with as
// many tiles across `g`'s M as across the entry's, and either the entry's N and K or three
// nearest entries in N and K at the entry's M that all measured evtc ahead by the margin.
bool measured_here(const TableChoice& t, const GemmDesc& g);
// Whether a kernel built with `chosen` runs the main loop the table's `entry` configuration was
// timed with: the same configuration, up to precise_math, which changes only the epilogue's
// arithmetic (a kernel option the tuner adds to whatever configuration it picks).
bool runs_table_entry(const KernelConfig& chosen, const KernelConfig& entry);
}  // namespace selection

}  // namespace evtc
