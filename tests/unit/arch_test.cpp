// The target architecture (evtc/arch.hpp): its spelling, who decides it, and what a kernel
// does on an architecture without fused kernels (refuses fusion naming it, builds the unfused
// path's plain epilogue for it).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "cli_runner.hpp"
#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/options.hpp"
#include "evtc/runtime.hpp"
#include "jit/toolchain.hpp"
#include "target/device_info.hpp"
#include "runtime/kernel_requests.hpp"
#include "scoped_env.hpp"

using namespace evtc;
using evtc::test::ScopedEnv;

namespace {

TEST(Arch, SpellingsAndErrors) {
  EXPECT_EQ(parse_arch("sm80", "x"), 80);
  EXPECT_EQ(parse_arch("sm_86", "x"), 86);
  EXPECT_EQ(parse_arch("sm_90a", "x"), 90);
  EXPECT_EQ(parse_arch("120", "x"), 120);
  EXPECT_EQ(parse_arch("sm100", "x"), 100);
  for (const char* bad : {"", "sm", "hopper", "sm70", "sm_9000", "90b", "sm-90", "8.6"}) {
    try {
      parse_arch(bad, "EVTC_ARCH");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("EVTC_ARCH: '") + bad + "' is not a GPU architecture"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(arch_name(90, true), "sm_90a");
  EXPECT_EQ(arch_name(90), "sm_90");
  EXPECT_EQ(arch_name(86, true), "sm_86");  // the sm_80 backend's code is not architecture-specific
  EXPECT_TRUE(arch_refusal(90).empty());
  EXPECT_TRUE(arch_refusal(89).empty());
  EXPECT_NE(arch_refusal(75).find("the target architecture is sm_75"), std::string::npos);
}

TEST(Arch, TheEnvironmentOverridesTheOptionWhichOverridesTheDevice) {
  {
    ScopedEnv env("EVTC_ARCH", std::nullopt);
    const auto device = current_device();
    EXPECT_EQ(target_arch(), device && device->arch > 0 ? device->arch : 90);
    EXPECT_EQ(target_arch(80), 80);
  }
  ScopedEnv env("EVTC_ARCH", "sm_120");
  EXPECT_EQ(target_arch(), 120);
  EXPECT_EQ(target_arch(80), 120);
  ScopedEnv bad("EVTC_ARCH", "ampere");
  try {
    target_arch();
    ADD_FAILURE() << "accepted EVTC_ARCH=ampere";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("EVTC_ARCH: 'ampere' is not a GPU architecture"), std::string::npos)
        << e.what();
  }
}

TEST(Arch, KernelsElsewhereRunUnfusedBuiltForThatArchitecture) {
  ScopedEnv env("EVTC_ARCH", std::nullopt);
  const Graph g = parse_expression("out D: bf16 = silu(acc + bias[n])");
  CompileOptions o;
  o.arch = 75;
  const Kernel k(g, o);
  EXPECT_EQ(k.options().gemm.sm, 75);
  const std::string why = k.fallback_reason(1024, 1024, 1024);
  EXPECT_NE(why.find("sm_75"), std::string::npos) << why;
  EXPECT_NE(why.find("sm_90a"), std::string::npos) << why;
  EXPECT_THROW(const_cast<Kernel&>(k).compile(1024, 1024, 1024), UserError);
  // The unfused path's epilogue is compiled for sm_75; the fused architecture's stays sm_90a.
  const jit::CompileRequest plain = runtime::fallback_request(k.graph(), k.signature(), k.options().gemm.sm);
  EXPECT_EQ(plain.sm, 75);
  const auto flags = jit::code_flags(plain.sm, plain.needs_cutlass);
  EXPECT_NE(std::find(flags.begin(), flags.end(), "-gencode=arch=compute_75,code=[sm_75,compute_75]"), flags.end());
  const auto fused = jit::code_flags(90, true);
  EXPECT_NE(std::find(fused.begin(), fused.end(), "-gencode=arch=compute_90a,code=sm_90a"), fused.end());
  o.arch = 90;
  EXPECT_TRUE(Kernel(g, o).fallback_reason(1024, 1024, 1024).empty());
}

TEST(Arch, AmpereClassArchitecturesFuseWithTheSm80Backend) {
  ScopedEnv env("EVTC_ARCH", std::nullopt);
  const Graph g = parse_expression("out D: bf16 = silu(acc + bias[n])");
  for (int arch : {80, 86, 89}) {
    CompileOptions o;
    o.arch = arch;
    const Kernel k(g, o);
    EXPECT_TRUE(k.fallback_reason(1024, 1024, 1024).empty()) << arch;
    EXPECT_EQ(arch_features(arch).backend, 80);
    // sm_XX machine code and compute_80 PTX, which newer GPUs compile.
    const auto flags = jit::code_flags(arch, true);
    EXPECT_NE(std::find(flags.begin(), flags.end(),
                        fmt::format("-gencode=arch=compute_80,code=[sm_{},compute_80]", arch)),
              flags.end())
        << arch;
  }
  // A100's 163 KiB hold 128×256×64 tiles in three stages; sm_86/89's 99 KiB take K tiles of 32.
  CompileOptions a100;
  a100.arch = 80;
  EXPECT_EQ(Kernel(g, a100).config_for(4096, 4096, 4096).name(), "ms_128x256x64_s3");
  CompileOptions ada;
  ada.arch = 89;
  EXPECT_EQ(Kernel(g, ada).config_for(4096, 4096, 4096).name(), "ms_128x256x32_s3");
  EXPECT_EQ(Kernel(g, ada).config_for(32, 4096, 4096).name(), "ms_64x128x32_s4");
}

TEST(Arch, GroupedKernelsElsewhereAreNotFused) {
  ScopedEnv env("EVTC_ARCH", "sm80");
  const GroupedKernel k(parse_expression("out y: bf16 = gptoss_swiglu(acc + bias[n])"));
  EXPECT_NE(k.shape_reason(264, 136).find("sm_80"), std::string::npos);
  ScopedEnv hopper("EVTC_ARCH", "sm90");
  EXPECT_TRUE(GroupedKernel(parse_expression("out y: bf16 = gptoss_swiglu(acc + bias[n])")).shape_reason(264, 136).empty());
}

TEST(Arch, OptionTextSpellsIt) {
  OptionText o;
  o.arch = "sm89";
  EXPECT_EQ(compile_options(o).arch, 89);
  EXPECT_EQ(grouped_options(o).arch, 89);
  EXPECT_EQ(option_text_from_json(option_text_json(o)).arch, "sm89");
  EXPECT_EQ(option_text_from_json(R"({"arch": null})").arch, std::nullopt);
  o.arch = "volta";
  try {
    compile_options(o);
    ADD_FAILURE() << "accepted arch 'volta'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("arch: 'volta' is not a GPU architecture"), std::string::npos) << e.what();
  }
  try {
    option_text_from_json(R"({"arch": 90})");
    ADD_FAILURE() << "accepted arch 90 as a number";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("option arch: expected an architecture such as \"sm80\", got 90"),
              std::string::npos)
        << e.what();
  }
}

TEST(Arch, CliArchOption) {
  const auto bad = evtc::test::run_cli("compile 'out D = relu(acc)' --arch hopper");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--arch: 'hopper' is not a GPU architecture"), std::string::npos) << bad.output;
  const auto other = evtc::test::run_cli("compile 'out D = relu(acc)' --arch sm75 --emit /dev/null");
  EXPECT_EQ(other.exit_code, 2) << other.output;  // a UserError
  EXPECT_NE(other.output.find("no fused kernel to emit: the target architecture is sm_75"), std::string::npos)
      << other.output;
}

}  // namespace

TEST(Arch, WhichGpusRunTheCodeOfAnArchitecture) {
  // The architecture-specific targets run on their own architecture only.
  EXPECT_TRUE(code_runs_on(90, 90));
  EXPECT_FALSE(code_runs_on(90, 100));
  EXPECT_FALSE(code_runs_on(100, 90));
  EXPECT_FALSE(code_runs_on(120, 100));
  // sm_80-class code carries compute_XX PTX: the same or any newer GPU runs it.
  EXPECT_TRUE(code_runs_on(80, 80));
  EXPECT_TRUE(code_runs_on(80, 89));
  EXPECT_TRUE(code_runs_on(80, 90));
  EXPECT_TRUE(code_runs_on(86, 120));
  EXPECT_FALSE(code_runs_on(89, 86));
  EXPECT_TRUE(code_runs_on(75, 90));
  EXPECT_FALSE(code_runs_on(80, 75));
}
