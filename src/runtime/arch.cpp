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

std::string arch_name(int arch, bool fused) {
  return fused && arch == kFusedArch ? fmt::format("sm_{}a", arch) : fmt::format("sm_{}", arch);
}

int target_arch(std::optional<int> option) {
  if (const char* env = std::getenv("EVTC_ARCH"); env && *env) return parse_arch(env, "EVTC_ARCH");
  if (option) return *option;
  if (const auto device = current_device(); device && device->arch > 0) return device->arch;
  return kFusedArch;
}

std::string arch_refusal(int arch) {
  if (arch == kFusedArch) return {};
  return fmt::format("the target architecture is {} (the GPU's, or CompileOptions::arch / EVTC_ARCH): evtc "
                     "generates fused kernels for {} (Hopper) only",
                     arch_name(arch), arch_name(kFusedArch, true));
}

}  // namespace evtc
