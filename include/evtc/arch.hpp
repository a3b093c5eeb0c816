// The GPU architecture evtc builds kernels for: the one place that decides it and the one
// spelling of it (EVTC_ARCH, CompileOptions::arch, the CLI's --arch, the Python `arch=`).
//
// An architecture is its compute capability × 10 (80 = sm_80, 90 = Hopper, 120 = sm_120).
// Fused kernels come from four backends:
//  - sm_80 (Ampere-class: A100, A10/L4/L40S, RTX 30xx/40xx, i.e. 80, 86, 89): CUTLASS 2.x's
//    multistage mma.sync GEMM with its epilogue visitor tree, built as sm_XX machine code plus
//    compute_80 PTX; run and tested on Hopper through EVTC_ARCH=sm80 (sm_80 code runs there);
//  - sm_90a (Hopper, 90): CUTLASS 3.x TMA warp-specialized wgmma kernels, every feature;
//  - sm_100a (B200/GB200) and sm_120a (RTX 50xx / RTX PRO 6000): CUTLASS 4.2's Blackwell
//    kernels, compile-checked only: no such GPU has run them.
// ArchFeatures says what each can fuse; on any other architecture, and for what an
// architecture cannot fuse, evtc refuses fusion with a reason naming it and runs cuBLASLt +
// the plain epilogue, which it compiles for that architecture.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "evtc/types.hpp"

namespace evtc {

// The architecture whose fused kernels are tested on a GPU (and the only one with grouped
// kernels and autotuning).
inline constexpr int kVerifiedArch = 90;

// What an architecture's fused kernels can do: the one table (src/target/arch.cpp) that
// legality, the kernel configurations and the emitter ask.
struct ArchFeatures {
  bool fused = false;          // fused kernels exist
  bool verified = false;       // run and tested on such a GPU; otherwise compile-checked only
  bool sixteen_bit = false;    // bf16/f16 A and B
  bool fp8 = false;            // f8e4m3/f8e5m2 A and B
  bool fp8_blockwise = false;  // block-scaled fp8 main loops
  bool gated = false;          // gated [m,n/2] outputs (evtc's half-width store node)
  bool reductions = false;     // row, column and whole-matrix reductions (evtc's partial-result nodes)
  // The index leaves m and n (evtc's index node) and integer [m]/[n] operands (CUTLASS's
  // broadcasts of int32/int64 elements, converted to f32).
  bool indices = false;
  bool aux_tensors = false;    // [m,n] operands and [m,n] outputs besides D
  bool column_major_mn = false;  // [m,n] operands in column-major order
  bool pingpong = false;       // the ping-pong schedule
  bool clusters = false;       // thread-block clusters larger than 1×1
  bool stream_k = false;       // the stream-K tile scheduler
  bool two_level_fp8 = false;  // fp8 accumulation in two levels (promotion interval, fast accumulation)
  // fp8's two-level main loop with two temporary accumulator sets, so that each promotion
  // overlaps the next K tile's WGMMAs (evtc/device/sm90_fp8_mainloop.cuh; overlapped_fp8_promotion).
  bool overlapped_fp8_promotion = false;
  // CTA tiles of any multiple of 16 columns up to 256 (otherwise 64, 128, 192 or 256), and
  // split-K through the stream-K scheduler.
  bool any_tile_n = false;
  // Transposed GEMMs (KernelConfig::swap_ab): column-major C and D, the epilogue rewritten by
  // evtc::swap_ab.
  bool swap_ab = false;
  // K in parts: a batch of fp32 partial products added by a second kernel that runs the
  // epilogue (KernelConfig::k_parts).
  bool k_parts = false;
  // One MMA on the two SMs of a cluster pair for 256-row tiles (tcgen05's two-SM UMMA): tiles of
  // 64, 128 or 256 rows, the last with an even cluster M.
  bool two_sm_mma = false;
  const char* family = "";     // e.g. "Hopper", "Blackwell B200/GB200"
  // The backend that builds the kernels (80, 90, 100, 120): which emitter, and how nvcc
  // targets them (sm_80 code for every 8.x architecture; architecture-specific sm_XXa others).
  int backend = 0;
};
// Every field false for an architecture without fused kernels.
const ArchFeatures& arch_features(int arch);
// The backend that builds `arch`'s fused kernels for A and B of type `ab`: the architecture's
// own, except that 16-bit GEMMs on sm_120 (whose sm_120a kernels multiply fp8 only) take the
// sm_80 backend, whose code runs there. Legality, the configurations and the emitter ask this.
const ArchFeatures& backend_features(int arch, DType ab);

// The most shared memory one thread block can opt into on `arch`, in bytes (A100: 163 KiB;
// sm_86/89/120: 99 KiB; H100/H200, B200: 227 KiB).
int64_t max_shared_memory_per_block(int arch);

// "sm80", "sm_80", "80" (a trailing 'a' is accepted: "sm_90a") -> 80. Anything else is a
// UserError naming `what` (the option or variable) and the accepted spellings.
int parse_arch(std::string_view text, std::string_view what);
// nvcc's name of a target: "sm_90a", "sm_100a", "sm_120a" for fused kernels of the backends
// that use architecture-specific features, "sm_86" otherwise.
std::string arch_name(int arch, bool fused = false);
// Whether a GPU of `device_arch` runs the kernels evtc builds for `arch`: the same architecture
// for the sm_90a/100a/120a ones, the same or a newer one for the others (their PTX is built in).
bool code_runs_on(int arch, int device_arch);
// The architecture kernels are built for: EVTC_ARCH when set, else `option`, else the
// current device's, else 90 (no device: a machine that only compiles).
int target_arch(std::optional<int> option = std::nullopt);
// Why fusion is refused on `arch`, naming it; empty for an architecture with fused kernels.
std::string arch_refusal(int arch);
// Why `arch`'s fused kernels (for A and B of type `ab`) cannot do `what` (e.g. "gated [m,n/2]
// outputs"), naming the backend: for legality's reasons.
std::string arch_lacks(int arch, std::string_view what, DType ab = DType::bf16);

}  // namespace evtc
