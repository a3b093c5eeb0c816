#include "evtc/arch.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

#include "evtc/error.hpp"
#include "target/device_info.hpp"
#include "support/environment.hpp"

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
  // sm_80 code (80, 86, 89): CUTLASS 2.x's multistage mma.sync GEMM with its epilogue visitor
  // tree; [m,n] tensors are read and written with 16-byte vectors along N, so row-major only.
  // Run and tested on Hopper (sm_80 code runs there), never on an Ampere GPU, so unverified:
  // a launch failure falls back with its reason.
  static const ArchFeatures sm8x{.fused = true,
                                 .sixteen_bit = true,
                                 .gated = true,
                                 .reductions = true,
                                 .aux_tensors = true,
                                 .family = "Ampere-class, sm_80 code",
                                 .backend = 80};
  // sm_90a: CUTLASS 3.x TMA warp-specialized kernels with wgmma, every feature, tested on H100/H200.
  static const ArchFeatures sm90{.fused = true,
                                 .verified = true,
                                 .sixteen_bit = true,
                                 .fp8 = true,
                                 .fp8_blockwise = true,
                                 .gated = true,
                                 .reductions = true,
                                 .indices = true,
                                 .aux_tensors = true,
                                 .column_major_mn = true,
                                 .pingpong = true,
                                 .clusters = true,
                                 .stream_k = true,
                                 .two_level_fp8 = true,
                                 .overlapped_fp8_promotion = true,
                                 .any_tile_n = true,
                                 .swap_ab = true,
                                 .k_parts = true,
                                 .family = "Hopper",
                                 .backend = 90};
  // sm_100a: CUTLASS 4.2's tcgen05 (UMMA) kernels, one or two SMs per MMA, with its sm90-style
  // visitor tree; evtc's gated store and whole-matrix partials read the epilogue's thread layout
  // from its tiled copy (tensor memory to registers), and kernels without D store into a sink
  // (evtc/device/sm100_epilogue.cuh).
  static const ArchFeatures sm100{.fused = true,
                                  .sixteen_bit = true,
                                  .fp8 = true,
                                  .gated = true,
                                  .reductions = true,
                                  .indices = true,
                                  .aux_tensors = true,
                                  .column_major_mn = true,
                                  .clusters = true,
                                  .two_sm_mma = true,
                                  .family = "Blackwell B200/GB200",
                                  .backend = 100};
  // sm_120a: CUTLASS 4.2's sm120 builder multiplies fp8/fp6/fp4 only (TN), without clusters; its
  // epilogue is Hopper's collective, so evtc's gated store and partials apply as they are.
  static const ArchFeatures sm120{.fused = true,
                                  .fp8 = true,
                                  .gated = true,
                                  .reductions = true,
                                  .indices = true,
                                  .pingpong = true,
                                  .family = "Blackwell RTX 50xx / RTX PRO 6000",
                                  .backend = 120};
  static const ArchFeatures none{};
  switch (arch) {
    case 80: case 86: case 89: return sm8x;
    case 90: return sm90;
    case 100: return sm100;
    case 120: return sm120;
    default: return none;
  }
}

int64_t max_shared_memory_per_block(int arch) {
  switch (arch) {
    case 80: case 87: return 163 * 1024;
    case 90: case 100: case 103: return 227 * 1024;
    default: return 99 * 1024;  // 75 (64 KiB) is below every configuration evtc builds
  }
}

const ArchFeatures& backend_features(int arch, DType ab) {
  // sm_120's 16-bit GEMMs: the sm_80 backend's kernels, built as sm_120 machine code.
  static const ArchFeatures sm120_sixteen_bit = [] {
    ArchFeatures f = arch_features(80);
    f.family = "Blackwell RTX 50xx / RTX PRO 6000, sm_80 code";
    return f;
  }();
  if (arch == 120 && (ab == DType::bf16 || ab == DType::f16)) return sm120_sixteen_bit;
  return arch_features(arch);
}

std::string arch_name(int arch, bool fused) {
  return fused && arch_features(arch).backend >= 90 ? fmt::format("sm_{}a", arch) : fmt::format("sm_{}", arch);
}

bool code_runs_on(int arch, int device_arch) {
  // sm_90a/100a/120a machine code runs on its own architecture only; sm_XX machine code with
  // compute_XX PTX (the sm_80 backend, every plain epilogue of a non-"a" target) on it and,
  // through the driver's PTX compile, on every newer one.
  if (arch_features(arch).backend >= 90) return device_arch == arch;
  return device_arch >= arch;
}

int target_arch(std::optional<int> option) {
  if (const auto env = env_text(Env::arch)) return parse_arch(*env, env_name(Env::arch));
  if (option) return *option;
  if (const auto device = current_device(); device && device->arch > 0) return device->arch;
  return kVerifiedArch;
}

std::string arch_refusal(int arch) {
  if (arch_features(arch).fused) return {};
  return fmt::format("the target architecture is {} (the GPU's, or CompileOptions::arch / EVTC_ARCH): evtc "
                     "generates fused kernels for sm_80/86/89 (Ampere-class), sm_90a (Hopper) and sm_100a / sm_120a "
                     "(Blackwell) only",
                     arch_name(arch));
}

std::string arch_lacks(int arch, std::string_view what, DType ab) {
  const ArchFeatures& f = backend_features(arch, ab);
  return fmt::format("the {} backend ({}) does not fuse {}", f.backend >= 90 ? arch_name(arch, true) : arch_name(arch),
                     f.family, what);
}

}  // namespace evtc
