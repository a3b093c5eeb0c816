// The GPU architecture evtc builds kernels for: the one place that decides it and the one
// spelling of it (EVTC_ARCH, CompileOptions::arch, the CLI's --arch, the Python `arch=`).
//
// An architecture is its compute capability × 10 (80 = sm_80, 90 = Hopper, 120 = sm_120).
// Fused kernels are generated for Hopper (90, built as sm_90a) only; on any other
// architecture evtc refuses fusion with a reason naming it and runs cuBLASLt + the plain
// epilogue, which it compiles for that architecture.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace evtc {

// The architecture that has fused kernels.
inline constexpr int kFusedArch = 90;

// "sm80", "sm_80", "80" (a trailing 'a' is accepted: "sm_90a") -> 80. Anything else is a
// UserError naming `what` (the option or variable) and the accepted spellings.
int parse_arch(std::string_view text, std::string_view what);
// nvcc's name of a target: "sm_90a" for fused Hopper kernels, "sm_86" otherwise.
std::string arch_name(int arch, bool fused = false);
// The architecture kernels are built for: EVTC_ARCH when set, else `option`, else the
// current device's, else 90 (no device: a machine that only compiles).
int target_arch(std::optional<int> option = std::nullopt);
// Why fusion is refused on `arch`, naming it; empty for the fused architecture.
std::string arch_refusal(int arch);

}  // namespace evtc
