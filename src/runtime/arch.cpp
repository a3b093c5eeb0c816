#include "evtc/arch.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

#include "evtc/error.hpp"
#include "runtime/device_info.hpp"

namespace evtc {

int parse_arch(std::string_view text, std::string_view what) {
  std::string_view s = text;
  if (s.size() >= 2 && s.substr(0, 2) == "sm") s.remove_prefix(s.size() >= 3 && s[2] == '_' ? 3 : 2);
  if (!s.empty() && s.back() == 'a') s.remove_suffix(1);
  int value = 0;
  bool digits = !s.empty() && s.size() <= 3;
  for (char c : s) {
    digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (digits) value = value * 10 + (c - '0');
  }
  // nvcc 13 targets sm_75 and newer.
  if (!digits || value < 75)
    throw UserError(fmt::format("{}: '{}' is not a GPU architecture (expected sm followed by the compute "
                                "capability × 10, from sm75: e.g. sm80, sm86, sm89, sm90, sm100, sm120)",
                                what, text));
  return value;
}

const ArchFeatures& arch_features(int arch) {
  // sm_90a: CUTLASS 3.x TMA warp-specialized kernels with wgmma, every feature, tested on H100/H200.
  static const ArchFeatures sm90{true, true, true, true, true, true, true, true, true, true, true, "Hopper"};
  // sm_100a: CUTLASS 4.2's tcgen05 (UMMA) kernels, one SM per MMA, with its sm90-style visitor
  // tree. evtc's own nodes assume Hopper's epilogue thread layout (two warp groups reading
  // registers, not tensor memory), so gated outputs and reductions are not offered.
  static const ArchFeatures sm100{true, false, true, true, false, false, true, false, true, false, false,
                                  "Blackwell B200/GB200"};
  // sm_120a: CUTLASS 4.2's sm120 builder multiplies fp8/fp6/fp4 only (TN), without clusters.
  static const ArchFeatures sm120{true, false, false, true, false, false, false, true, false, false, false,
                                  "Blackwell RTX 50xx / RTX PRO 6000"};
  static const ArchFeatures none{};
  return arch == 90 ? sm90 : arch == 100 ? sm100 : arch == 120 ? sm120 : none;
}

std::string arch_name(int arch, bool fused) {
  return fused && arch_features(arch).fused ? fmt::format("sm_{}a", arch) : fmt::format("sm_{}", arch);
}

int target_arch(std::optional<int> option) {
  if (const char* env = std::getenv("EVTC_ARCH"); env && *env) return parse_arch(env, "EVTC_ARCH");
  if (option) return *option;
  if (const auto device = current_device(); device && device->arch > 0) return device->arch;
  return kFusedArch;
}

std::string arch_refusal(int arch) {
  if (arch_features(arch).fused) return {};
  return fmt::format("the target architecture is {} (the GPU's, or CompileOptions::arch / EVTC_ARCH): evtc "
                     "generates fused kernels for sm_90a (Hopper) and sm_100a / sm_120a (Blackwell) only",
                     arch_name(arch));
}

std::string arch_lacks(int arch, std::string_view what) {
  const ArchFeatures& f = arch_features(arch);
  return fmt::format("the {} backend ({}) does not fuse {}", arch_name(arch, true), f.family, what);
}

}  // namespace evtc
