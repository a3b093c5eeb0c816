// The GPU architecture evtc builds kernels for: the one place that decides it and the one
// spelling of it (EVTC_ARCH, CompileOptions::arch, the CLI's --arch, the Python `arch=`).
//
// An architecture is its compute capability × 10 (80 = sm_80, 90 = Hopper, 120 = sm_120).
// Fused kernels are generated for Hopper (90, built as sm_90a), and for Blackwell's sm_100a
// (B200/GB200) and sm_120a (RTX 50xx / RTX PRO 6000), which are compile-checked only: no such GPU
// has run them. ArchFeatures says what each can fuse; on any other architecture, and for what
// an architecture cannot fuse, evtc refuses fusion with a reason naming it and runs cuBLASLt +
// the plain epilogue, which it compiles for that architecture.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace evtc {

// The architecture whose fused kernels are tested on a GPU (and the only one with grouped
// kernels and autotuning).
inline constexpr int kFusedArch = 90;

// What an architecture's fused kernels can do: the one table (src/runtime/arch.cpp) that
// legality, the kernel configurations and the emitter ask.
struct ArchFeatures {
  bool fused = false;          // fused kernels exist
  bool verified = false;       // run and tested on such a GPU; otherwise compile-checked only
  bool sixteen_bit = false;    // bf16/f16 A and B
  bool fp8 = false;            // f8e4m3/f8e5m2 A and B
  bool fp8_blockwise = false;  // block-scaled fp8 main loops
  bool evtc_nodes = false;     // evtc's own visitor nodes: gated [m,n/2] outputs, reductions
  bool aux_tensors = false;    // [m,n] operands and [m,n] outputs besides D (TMA-staged)
  bool pingpong = false;       // the ping-pong schedule
  bool clusters = false;       // thread-block clusters larger than 1×1
  bool stream_k = false;       // the stream-K tile scheduler
  bool two_level_fp8 = false;  // fp8 accumulation in two levels (promotion interval, fast accumulation)
  const char* family = "";     // e.g. "Hopper", "Blackwell B200/GB200"
};
// Every field false for an architecture without fused kernels.
const ArchFeatures& arch_features(int arch);

// "sm80", "sm_80", "80" (a trailing 'a' is accepted: "sm_90a") -> 80. Anything else is a
// UserError naming `what` (the option or variable) and the accepted spellings.
int parse_arch(std::string_view text, std::string_view what);
// nvcc's name of a target: "sm_90a", "sm_100a", "sm_120a" for fused kernels (their
// architecture-specific features), "sm_86" otherwise.
std::string arch_name(int arch, bool fused = false);
// The architecture kernels are built for: EVTC_ARCH when set, else `option`, else the
// current device's, else 90 (no device: a machine that only compiles).
int target_arch(std::optional<int> option = std::nullopt);
// Why fusion is refused on `arch`, naming it; empty for an architecture with fused kernels.
std::string arch_refusal(int arch);
// Why `arch`'s fused kernels cannot do `what` (e.g. "gated [m,n/2] outputs"), naming the
// architecture: for legality's reasons.
std::string arch_lacks(int arch, std::string_view what);

}  // namespace evtc
