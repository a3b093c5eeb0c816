// Tests of the sm_80 backend's emitter (src/backends/sm80) and its configurations: which
// CUTLASS 2.x visitor each node becomes, how the shared lowering's trees and topological
// visitors are spelled, and what the multistage configurations accept. tests/nvcc compiles
// representative kernels; the GPU suite runs them all under EVTC_ARCH=sm80.
#include <gtest/gtest.h>

#include <string>

#include "backends/emit.hpp"
#include "backends/sm80/sm80_emitter.hpp"
#include "evtc/arch.hpp"
#include "evtc/expression.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"

using namespace evtc;

namespace {

GemmDesc ampere(int arch = 80) {
  GemmDesc g;
  g.sm = arch;
  g.a_dtype = g.b_dtype = DType::bf16;
  g.a_layout = Layout::row_major;
  g.b_layout = Layout::col_major;
  return g;
}

std::string emit(const std::string& expr, const KernelConfig& config = KernelConfig::multistage_of(128, 256, 64, 3),
                 const GemmDesc& gemm = ampere()) {
  PipelineOptions o;
  o.gemm = gemm;
  return backend::emit_dense_kernel(run_pipeline(parse_expression(expr), o), gemm, config).source;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(Sm80Emitter, OneOutputIsATreeUnderItsStore) {
  const std::string s = emit("out D: bf16 = silu(acc + bias[n])");
  EXPECT_TRUE(has(s, "cutlass::gemm::kernel::DefaultGemmWithVisitor<")) << s;
  EXPECT_TRUE(has(s, "cutlass::arch::Sm80,")) << s;
  EXPECT_TRUE(has(s, "using ThreadblockShape = cutlass::gemm::GemmShape<128, 256, 64>;")) << s;
  EXPECT_TRUE(has(s, "using WarpShape = cutlass::gemm::GemmShape<64, 64, 64>;")) << s;
  EXPECT_TRUE(has(s, "constexpr int kStages = 3;")) << s;
  EXPECT_TRUE(has(s, "cutlass::epilogue::threadblock::VisitorRowBroadcast<OutputTileThreadMap, cutlass::bfloat16_t")) << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80Compute<evtc::device::Silu, float, float")) << s;
  // D is a store node written through the ABI's d and ldd; the root is a tree, not a DAG.
  EXPECT_TRUE(has(s, "VisitorAuxStore<OutputTileThreadMap, cutlass::bfloat16_t")) << s;
  EXPECT_TRUE(has(s, "static_cast<cutlass::bfloat16_t*>(a.d), {int64_t(a.ldd), cute::_1{}, int64_t(0)}")) << s;
  EXPECT_FALSE(has(s, "Sm80TopologicalVisitor")) << s;
}

TEST(Sm80Emitter, SharedValuesAndSeveralOutputsBecomeATopologicalVisitor) {
  const std::string s = emit("input C: bf16\ninput r[m,n]: bf16\nf = acc * alpha + C\nout D: bf16 = relu(f) + r[m,n]\nout P: f32 = f");
  EXPECT_TRUE(has(s, "cutlass::epilogue::threadblock::Sm80TopologicalVisitor<float, cute::tuple<")) << s;
  // C and the [m,n] operand through CUTLASS's aux load.
  EXPECT_TRUE(has(s, "static_cast<const cutlass::bfloat16_t*>(a.c)")) << s;
  EXPECT_TRUE(has(s, "int64_t(a.ldc)")) << s;
  // The extra f32 output, N apart.
  EXPECT_TRUE(has(s, "VisitorAuxStore<OutputTileThreadMap, float")) << s;
  EXPECT_TRUE(has(s, "VisitorScalarBroadcast<float>")) << s;
}

TEST(Sm80Emitter, OpArgumentsGatedOutputsAndReductions) {
  const std::string s = emit(
      "h = acc + bias[n]\nout y: bf16 = swiglu(h)\nout D: bf16 = leaky_relu(h, 0.2)\nout r = row_sum(h)\n"
      "out c = col_max(h)\nout t = amax(h)");
  EXPECT_TRUE(has(s, "evtc::device::Sm80Compute<evtc::device::LeakyRelu")) << s;
  EXPECT_TRUE(has(s, "{float(0.2)}")) << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80HalfStore<OutputTileThreadMap, cutlass::bfloat16_t")) << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80RowPartials<OutputTileThreadMap, evtc::device::SumOp, kTileM>")) << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80ColPartials<OutputTileThreadMap, evtc::device::MaxOp, kTileN, kEpilogueWarps>"))
      << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80ScalarPartials<OutputTileThreadMap, evtc::device::MaxOp, kTileN, "
                     "kEpilogueWarps>"))
      << s;
  EXPECT_TRUE(has(s, "evtc::device::Sm80Compute<evtc::device::Abs, float, float")) << s;  // amax = max |x|
  // The same scratch and fixed-order finishers as the Hopper kernels.
  EXPECT_TRUE(has(s, "constexpr char kReductionAxes[] = \"cra\";")) << s;
  EXPECT_TRUE(has(s, "void finish_reductions(")) << s;
  // whose kernels the host part launches: its device pass reads the file (not skipped).
  EXPECT_FALSE(has(s, "EVTC_PART == 2 && defined(__CUDA_ARCH__)")) << s;
  EXPECT_TRUE(has(s, "constexpr int kEpilogueWarps = 8;")) << s;
}

TEST(Sm80Emitter, WarpTilesOfEachConfiguration) {
  EXPECT_EQ(sm80::warp_shape(KernelConfig::multistage_of(128, 256, 64, 3)).m, 64);
  EXPECT_EQ(sm80::warp_shape(KernelConfig::multistage_of(64, 128, 64, 4)).m, 32);
  EXPECT_EQ(sm80::warp_shape(KernelConfig::multistage_of(64, 128, 64, 4)).n, 64);
  EXPECT_EQ(sm80::warp_shape(KernelConfig::multistage_of(64, 64, 64, 4)).n, 32);
  const std::string s = emit("out D: f32 = acc", KernelConfig::multistage_of(64, 128, 64, 4));
  EXPECT_TRUE(has(s, "using WarpShape = cutlass::gemm::GemmShape<32, 64, 64>;")) << s;
  EXPECT_TRUE(has(s, "constexpr int kEpilogueWarps = 4;")) << s;
  EXPECT_TRUE(has(s, "using ElementLayoutC = float;")) << s;  // only f32 [m,n] tensors: 4-element accesses
}

TEST(Sm80Configs, NamesParseAndRoundTrip) {
  for (const char* name : {"ms_128x256x64_s3", "ms_64x128x64_s4", "ms_128x128x32_s5_precise"}) {
    const auto c = KernelConfig::parse(name);
    ASSERT_TRUE(c) << name;
    EXPECT_EQ(c->name(), name);
    EXPECT_EQ(c->schedule, MainloopSchedule::multistage);
  }
  for (const char* bad : {"ms_128x256x64_s7", "ms_96x256x64_s3", "ms_128x256x16_s3", "ms_128x256x64",
                          "ms_0128x256x64_s3"})
    EXPECT_FALSE(KernelConfig::parse(bad)) << bad;
  // Every default configuration is one the parser takes back (kernel lists, --config).
  const Graph g = parse_expression("out D: bf16 = acc");
  for (int arch : {80, 86, 89, 120})
    for (int64_t m : {0, 32, 4096}) {
      GemmDesc d = ampere(arch);
      d.m = m;
      d.n = d.k = 4096;
      const KernelConfig c = default_config(g, d);
      ASSERT_TRUE(KernelConfig::parse(c.name())) << c.name();
      EXPECT_EQ(*KernelConfig::parse(c.name()), c) << c.name();
    }
}

TEST(Sm80Configs, EachBackendTakesItsOwnKindAndSharedMemoryBounds) {
  const KernelConfig big = KernelConfig::multistage_of(128, 256, 64, 3);  // 144 KiB of A and B tiles
  EXPECT_EQ(config_refusal(big, ampere(80)), "");
  EXPECT_EQ(config_refusal(big, ampere(89)),
            "configuration ms_128x256x64_s3 stages 144 KiB of A and B tiles; sm_89 has 99 KiB of shared memory per "
            "block");
  EXPECT_EQ(config_refusal(KernelConfig::multistage_of(128, 256, 32, 3), ampere(89)), "");
  EXPECT_EQ(config_refusal(*KernelConfig::parse("coop_128x256x64_c2x1_persistent"), ampere(86)),
            "configuration coop_128x256x64_c2x1_persistent is a warp-specialized (sm_90a-style) one; sm_86 kernels "
            "take multistage configurations (e.g. ms_128x128x32_s4)");
  EXPECT_EQ(config_refusal(big, ampere(90)),
            "configuration ms_128x256x64_s3 is a multistage (sm_80 backend) one; sm_90a kernels take cooperative or "
            "ping-pong configurations");
}

}  // namespace
